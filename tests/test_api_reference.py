"""Every public name is in the API reference (docs/api/*.md), and the reference is in the nav.

Cheap: parses the markdown and the packages' ``__all__`` (``OPTIONAL_PACKAGES`` with ``ast``,
so jax and matplotlib are never imported); the mkdocs build itself runs in CI (.ci/run,
``mkdocs build --strict``) and checks that every target exists and renders.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import mixle

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^:::\s+(?P<target>[\w.]+)\s*$")
OPTION = re.compile(r"^\s+(?P<key>\w+):\s*(?P<value>.*)$")
LIST_ITEM = re.compile(r"^\s+-\s+(?P<item>\w+)\s*$")
#: Public subpackages whose names the reference covers too (read with ``ast``, never imported).
OPTIONAL_PACKAGES = ("mixle.jax", "mixle.plot", "mixle.inspection")


@dataclass
class Directive:
    """One ``::: target`` block: its target, and the members it renders (None: all)."""

    target: str
    members: list[str] | None = None
    no_members: bool = False
    page: str = ""


@dataclass
class Reference:
    """The directives of every page of the API reference."""

    directives: list[Directive] = field(default_factory=list)

    def covers(self, package: str, name: str) -> bool:
        """Whether ``package.name`` is rendered: by itself, or as a member of a module."""
        for d in self.directives:
            if d.target == f"{package}.{name}":
                return True
            # documented under its defining module's path, e.g. mixle.data.sampling.grid.GridSampler
            if d.target.startswith("mixle.") and d.target.rsplit(".", 1)[-1] == name:
                return True
            if name in module_members(d):
                return True
        return False


def module_file(target: str) -> Path | None:
    """The source file of module ``target`` inside the repository, if it is one."""
    base = ROOT.joinpath(*target.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def module_members(directive: Directive) -> list[str]:
    """Names a module directive renders: its ``members`` option, else the module's ``__all__``."""
    if directive.no_members:
        return []
    path = module_file(directive.target)
    if path is None:
        return []
    return directive.members if directive.members is not None else static_all(path)


def parse_directives(text: str, page: str = "") -> list[Directive]:
    """The ``:::`` directives of one markdown page, with their ``members`` option."""
    found: list[Directive] = []
    in_members = False
    for line in text.splitlines():
        if match := DIRECTIVE.match(line):
            found.append(Directive(match["target"], page=page))
            in_members = False
        elif found and line.startswith((" ", "\t")) and line.strip():
            current = found[-1]
            if option := OPTION.match(line):
                key, value = option["key"], option["value"].strip()
                in_members = key == "members"
                if in_members and value.lower() == "false":
                    current.no_members, in_members = True, False
                elif in_members and value.startswith("["):
                    current.members = re.findall(r"\w+", value)
                    in_members = False
                elif in_members:
                    current.members = []
            elif in_members and (item := LIST_ITEM.match(line)):
                assert current.members is not None
                current.members.append(item["item"])
        elif not line.strip():
            continue
        else:
            in_members = False
    return found


def load_reference() -> Reference:
    ref = Reference()
    for page in sorted(API.glob("*.md")):
        ref.directives += parse_directives(page.read_text(encoding="utf-8"), page.name)
    return ref


def static_all(path: Path) -> list[str]:
    """``__all__`` of a module file, or its public top-level functions and classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    ]


def public_names() -> list[tuple[str, str]]:
    """(package, name) for every name the reference must document."""
    names = [("mixle", n) for n in mixle.__all__ if n != "__version__"]
    for package in OPTIONAL_PACKAGES:
        path = module_file(package)
        if path is not None:
            names += [(package, n) for n in static_all(path)]
    return names


REFERENCE = load_reference()


@pytest.mark.parametrize(("package", "name"), public_names())
def test_public_name_is_in_the_api_reference(package: str, name: str) -> None:
    assert REFERENCE.covers(package, name), (
        f"{package}.{name} is public but no page of docs/api/ documents it: add "
        f"'::: {package}.{name}' to the page of its layer (or document its module)"
    )


def test_every_api_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:") :]
    missing = [p.name for p in API.glob("*.md") if f"api/{p.name}" not in nav]
    assert not missing, f"docs/api pages missing from mkdocs.yml's nav: {missing}"


def test_no_object_is_documented_twice() -> None:
    # two renderings of one object give two anchors for one identifier: links become ambiguous
    targets = [d.target for d in REFERENCE.directives]
    assert sorted({t for t in targets if targets.count(t) > 1}) == []


def test_parse_directives_reads_members_options() -> None:
    text = """# Page

::: mixle.a

::: mixle.b
    options:
      heading_level: 3
      members:
        - one
        - two

::: mixle.c
    options:
      members: false

::: mixle.d
    options:
      members: [x, y]
"""
    got = {d.target: (d.members, d.no_members) for d in parse_directives(text)}
    assert got == {
        "mixle.a": (None, False),
        "mixle.b": (["one", "two"], False),
        "mixle.c": (None, True),
        "mixle.d": (["x", "y"], False),
    }


def test_coverage_rules() -> None:
    ref = Reference(
        [
            Directive("mixle.read_zarr"),
            Directive("mixle.data.sampling.grid.GridSampler"),
            Directive("mixle.jax", members=["to_jax"]),
            Directive("mixle.errors"),
            Directive("mixle.testing", no_members=True),
            Directive("mixle.data.index_math.permutation", members=["permute"]),
        ]
    )
    assert ref.covers("mixle", "read_zarr")
    assert ref.covers("mixle", "GridSampler")  # under its defining module
    assert ref.covers("mixle.jax", "to_jax")
    assert not ref.covers("mixle.jax", "JaxLoader")  # not in the members list
    assert ref.covers("mixle.errors", "WorkerError")  # module with all its members
    assert not ref.covers("mixle.testing", "check_array_source")  # members: false
    assert not ref.covers("mixle", "read_hdf5")
    assert ref.covers("mixle.data.index_math.permutation", "permute")
    assert not ref.covers("mixle.data.index_math.permutation", "inverse_permute")


COMMAND_LINE = re.compile(r"\bmixle (?P<command>[a-z]+)\b(?P<rest>[^`\n#|]*)")


def documented_options(text: str) -> list[tuple[str, str]]:
    """``(command, option)`` for every ``--option`` after ``mixle <command>`` on a line."""
    return [
        (m["command"], option)
        for m in COMMAND_LINE.finditer(text)
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", m["rest"])
    ]


def test_documented_command_lines_use_real_options() -> None:
    from mixle.cli import _parser

    _, commands = _parser()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = []
    for page in pages:
        for command, option in documented_options(page.read_text(encoding="utf-8")):
            known = commands.get(command)
            if known is not None and option not in known._option_string_actions:
                wrong.append(f"{page.relative_to(ROOT)}: mixle {command} {option}")
    assert not wrong, f"options the command line does not have: {wrong}"


def test_documented_options_reads_code_spans_and_shell_lines() -> None:
    text = (
        "`mixle demo --size 64 --no-jax` then (`--png`) and\n"
        "mixle inspect s3://b/x.zarr --storage-option anon=true  # --not-this\n"
        "| `plot` | `mixle inspect --plot` |\n"
    )
    assert documented_options(text) == [
        ("demo", "--size"),
        ("demo", "--no-jax"),
        ("inspect", "--storage-option"),
        ("inspect", "--plot"),
    ]
