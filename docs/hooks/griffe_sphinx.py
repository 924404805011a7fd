"""Griffe extension for the docs site: read mixle's Sphinx conventions as Markdown.

mixle's numpydoc docstrings follow two Sphinx habits that Markdown does not know:

- roles that refer to other objects (``:func:`to_jax```, ``:class:`~mixle.Loader```):
  each becomes an optional autorefs link, a link when the target is rendered somewhere on
  the site and plain code otherwise. Names resolve in the scope of the object whose
  docstring holds them, as Sphinx resolves them;
- ``#:`` comments just above a module or class attribute, which document it: they become
  its docstring, so constants such as ``mixle.IID`` are documented on the site too.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(~?)([\w.]+)(\(\))?`")
DOC_COMMENT = re.compile(r"^\s*#:\s?(.*)$")


def resolve(obj: griffe.Object, target: str) -> str | None:
    """Full path of ``target`` as seen from ``obj``, or ``None`` when it is unknown."""
    if target.startswith("mixle."):
        return target
    head, _, rest = target.partition(".")
    try:
        path = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError):
        return None
    return f"{path}.{rest}" if rest else path


def rewrite_roles(obj: griffe.Object, text: str) -> str:
    """Replace every Sphinx role in ``text`` by an optional autorefs reference."""

    def link(match: re.Match[str]) -> str:
        short, target, call = match.group(1), match.group(2), match.group(3) or ""
        title = (target.rsplit(".", 1)[-1] if short else target) + call
        path = resolve(obj, target)
        if path is None:
            return f"`{title}`"
        return f'<autoref identifier="{path}" optional><code>{title}</code></autoref>'

    return ROLE.sub(link, text)


def comment_docstring(attr: griffe.Object) -> str | None:
    """The ``#:`` comment lines just above an attribute's assignment, joined, if any."""
    if not attr.lineno or isinstance(attr.filepath, list):
        return None
    lines = attr.lines_collection[attr.filepath]
    found: list[str] = []
    row = attr.lineno - 2  # 0-based index of the line above the assignment
    while row >= 0 and (match := DOC_COMMENT.match(lines[row])):
        found.append(match.group(1))
        row -= 1
    return "\n".join(reversed(found)) or None


class SphinxConventions(griffe.Extension):
    """Apply both conventions to every object of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Walk the package once it is loaded and fix its docstrings."""
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.is_attribute and obj.docstring is None:
                text = comment_docstring(obj)
                if text is not None:
                    obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = rewrite_roles(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
