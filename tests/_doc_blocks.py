"""Find the code blocks of a markdown page and run them (used by tests/test_doc_examples.py).

The convention every page in README.md and docs/ follows:

- Every fenced block whose info string is ``python`` (or ``py``) is executed. The blocks of
  one page run in order, in one shared namespace whose ``__name__`` is ``"__main__"``, in
  one fresh interpreter per page, with a fresh temporary directory as the working directory.
- ``pycon`` blocks (``>>>`` sessions) run as doctests in the same namespace.
- A block is left out only when the line immediately before its opening fence is
  ``<!-- skip-example: <reason> -->`` with a non-empty reason.
- Hidden set-up code sits in an HTML comment that ends on the line immediately before a
  python block's opening fence and has no blank line inside (so GitHub and mkdocs render
  it as nothing)::

      <!-- example-setup
      import numpy as np
      -->
      ```python

  It runs just before that block.

Run as a script (``python _doc_blocks.py PAGE NAME``) it executes the page ``PAGE``, naming it
``NAME`` in tracebacks; the test runs it that way, in a subprocess, so a JAX backend never
starts in the pytest process. Each block is compiled with the page as its file name and its
real line numbers, so a traceback points into the markdown.
"""

from __future__ import annotations

import doctest
import linecache
import re
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

EXECUTED_LANGUAGES = frozenset({"python", "py"})
DOCTEST_LANGUAGES = frozenset({"pycon"})
SKIP_MARKER = "skip-example"
SETUP_MARKER = "example-setup"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip-example:(?P<reason>.*?)-->\s*$")
_SETUP_OPEN = re.compile(r"^\s*<!--\s*example-setup\s*$")
_COMMENT_CLOSE = re.compile(r"^\s*-->\s*$")


class DocMarkupError(ValueError):
    """A skip or set-up comment that does not follow the convention."""


@dataclass(frozen=True)
class Block:
    """One fenced code block.

    Parameters
    ----------
    language
        The first word of the fence's info string (``""`` when there is none).
    line
        The 1-based line number of the opening fence.
    code
        The block's text, dedented by the fence's indentation.
    skip_reason
        The reason from a ``skip-example`` comment just above the fence, else ``None``.
    setup
        Hidden set-up code from an ``example-setup`` comment just above the fence.
    setup_line
        The 1-based line number of the set-up code's first line (0 without set-up).
    """

    language: str
    line: int
    code: str
    skip_reason: str | None = None
    setup: str = ""
    setup_line: int = 0

    @property
    def code_line(self) -> int:
        """The 1-based line number of the block's first line of code."""
        return self.line + 1

    @property
    def executed(self) -> bool:
        """Whether the page runner executes this block (as code or as a doctest)."""
        runnable = self.language in EXECUTED_LANGUAGES | DOCTEST_LANGUAGES
        return runnable and self.skip_reason is None


@dataclass
class Page:
    """The code blocks of one markdown page, in order."""

    name: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def executed(self) -> list[Block]:
        """The blocks the runner executes."""
        return [b for b in self.blocks if b.executed]

    @property
    def skipped(self) -> list[Block]:
        """The python blocks left out by a ``skip-example`` comment."""
        return [b for b in self.blocks if b.skip_reason is not None]


def _dedent(lines: list[str], indent: str) -> list[str]:
    return [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines]


def parse_page(text: str, name: str) -> Page:
    """Split a markdown page into its fenced code blocks.

    Parameters
    ----------
    text
        The page's markdown.
    name
        The page's name in error messages (e.g. ``"docs/loader.md"``).

    Returns
    -------
    Page
        Every fenced block, with its language, line number, skip reason and set-up code.

    Raises
    ------
    DocMarkupError
        A fence that is never closed; a ``pycon`` block without a ``>>>`` example; a
        ``skip-example`` comment with an empty reason, in
        another form than ``<!-- skip-example: reason -->``, or not immediately followed by
        a python block; an ``example-setup`` comment that is never closed, contains a blank
        line, or is not immediately followed by a python block.
    """
    lines = text.splitlines()
    page = Page(name)
    pending_skip: tuple[int, str] | None = None  # (line, reason)
    pending_setup: tuple[int, str] | None = None  # (first code line, code)
    i = 0
    while i < len(lines):
        line = lines[i]
        number = i + 1
        fence = _FENCE.match(line)
        if fence:
            indent, marker = fence["indent"], fence["fence"]
            info = fence["info"].strip()
            language = info.split()[0].lower().strip("{}.") if info else ""
            closing = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}\s*$")
            end = i + 1
            while end < len(lines) and not closing.match(lines[end]):
                end += 1
            if end == len(lines):
                raise DocMarkupError(f"{name}:{number}: the {marker} fence is never closed")
            is_python = language in EXECUTED_LANGUAGES
            code = "\n".join(_dedent(lines[i + 1 : end], indent)) + "\n"
            if language in DOCTEST_LANGUAGES and not doctest.DocTestParser().get_examples(code):
                raise DocMarkupError(
                    f"{name}:{number}: the {language} block has no '>>> ' example to run"
                )
            for what, pending in (("skip-example", pending_skip), ("example-setup", pending_setup)):
                if pending is not None and not is_python:
                    raise DocMarkupError(
                        f"{name}:{pending[0]}: the {what} comment must be immediately "
                        f"followed by a ```python block, not a ```{language} block"
                    )
            if pending_skip is not None and pending_setup is not None:
                raise DocMarkupError(
                    f"{name}:{pending_skip[0]}: a block is either skipped or has set-up code"
                )
            page.blocks.append(
                Block(
                    language=language,
                    line=number,
                    code=code,
                    skip_reason=pending_skip[1] if pending_skip else None,
                    setup=pending_setup[1] if pending_setup else "",
                    setup_line=pending_setup[0] if pending_setup else 0,
                )
            )
            pending_skip = pending_setup = None
            i = end + 1
            continue
        for what, pending in (("skip-example", pending_skip), ("example-setup", pending_setup)):
            if pending is not None:
                raise DocMarkupError(
                    f"{name}:{pending[0]}: the {what} comment must be on the line immediately "
                    f"before a ```python fence (line {number} comes between)"
                )
        comment = line.lstrip().startswith("<!--")
        if comment and SKIP_MARKER in line:
            skip = _SKIP.match(line)
            if skip is None:
                raise DocMarkupError(
                    f"{name}:{number}: write a skip as '<!-- skip-example: <reason> -->' on "
                    f"one line, got {line.strip()!r}"
                )
            reason = skip["reason"].strip()
            if not reason:
                raise DocMarkupError(f"{name}:{number}: the skip-example comment needs a reason")
            pending_skip = (number, reason)
        elif comment and SETUP_MARKER in line:
            if not _SETUP_OPEN.match(line):
                raise DocMarkupError(
                    f"{name}:{number}: hidden set-up starts with a line '<!-- example-setup' "
                    f"alone, got {line.strip()!r}"
                )
            end = i + 1
            while end < len(lines) and not _COMMENT_CLOSE.match(lines[end]):
                if not lines[end].strip():
                    raise DocMarkupError(
                        f"{name}:{end + 1}: no blank lines inside an example-setup comment "
                        "(markdown would end the comment there)"
                    )
                end += 1
            if end == len(lines):
                raise DocMarkupError(f"{name}:{number}: the example-setup comment is never closed")
            pending_setup = (number + 1, "\n".join(lines[i + 1 : end]) + "\n")
            i = end
        i += 1
    for what, pending in (("skip-example", pending_skip), ("example-setup", pending_setup)):
        if pending is not None:
            raise DocMarkupError(
                f"{name}:{pending[0]}: the {what} comment is not followed by a ```python block"
            )
    return page


def script_text(page: Page, total_lines: int) -> str:
    """The page's executed python code at its own line numbers, blank lines elsewhere.

    Running this text as a script runs the page; worker processes started with "spawn"
    re-import it as their ``__main__``, like a script a user copied the page into.
    """
    out = [""] * total_lines
    for block in page.executed:
        if block.language not in EXECUTED_LANGUAGES:
            continue
        for start, code in ((block.setup_line, block.setup), (block.code_line, block.code)):
            for k, text in enumerate(code.splitlines()):
                out[start - 1 + k] = text
    return "\n".join(out) + "\n"


def _fail(page: Page, block: Block, what: str) -> int:
    print(f"{page.name}: the {block.language} block at line {block.line} {what}", file=sys.stderr)
    return 1


def _catch_background_errors() -> list[str]:
    """Record exceptions that would only be printed: in threads, and unraisable ones.

    Python prints an exception raised in a thread the page started (or in ``__del__``) and
    carries on; the test suite makes them errors, and so does the page runner.
    """
    errors: list[str] = []
    show_thread, show_unraisable = threading.excepthook, sys.unraisablehook

    def thread_error(args: threading.ExceptHookArgs) -> None:
        show_thread(args)
        where = args.thread.name if args.thread is not None else "a thread"
        errors.append(f"{args.exc_type.__name__} in thread {where}")

    def unraisable(args: sys.UnraisableHookArgs) -> None:
        show_unraisable(args)
        errors.append(f"unraisable {args.exc_type.__name__} ({args.err_msg or 'no message'})")

    threading.excepthook, sys.unraisablehook = thread_error, unraisable
    return errors


def run_page(path: Path, name: str) -> int:
    """Execute the blocks of the page at ``path`` in order; returns an exit status.

    The namespace is a fresh ``__main__`` module whose file is a script holding the page's
    code (see :func:`script_text`), written to the working directory. A failing block
    prints the page name, the block's line and the traceback to stderr and stops the run;
    so does an exception raised in a thread the page started, or an unraisable one. After
    the last block it prints ``ran N blocks`` to stdout, so a caller can tell a complete
    run from a process that ended early with status 0.
    """
    text = path.read_text(encoding="utf-8")
    page = parse_page(text, name)
    total = len(text.splitlines())
    script = Path.cwd() / "_doc_page.py"
    source = script_text(page, total)
    script.write_text(source, encoding="utf-8")
    # tracebacks show the markdown's own lines
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    namespace = main.__dict__
    background = _catch_background_errors()
    for block in page.executed:
        if block.language in DOCTEST_LANGUAGES:
            test = doctest.DocTestParser().get_doctest(
                block.code, namespace, name, name, block.code_line - 1
            )
            flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
            runner = doctest.DocTestRunner(optionflags=flags)
            runner.run(test, clear_globs=False, out=sys.stderr.write)
            if runner.failures:
                return _fail(page, block, "failed (the doctest report is above)")
            if background:
                return _fail(page, block, f"raised in the background: {'; '.join(background)}")
            continue
        for start, code in ((block.setup_line, block.setup), (block.code_line, block.code)):
            if not code:
                continue
            try:
                exec(compile("\n" * (start - 1) + code, name, "exec"), namespace)
            except BaseException:  # reported with its traceback, then the run stops
                setup = start == block.setup_line
                _fail(page, block, "failed in its hidden set-up:" if setup else "failed:")
                kind, value, tb = sys.exc_info()
                # drop this runner's own frame: the traceback starts in the markdown
                traceback.print_exception(kind, value, tb.tb_next if tb else None)
                return 1
        if background:
            return _fail(page, block, f"raised in the background: {'; '.join(background)}")
    print(f"{name}: ran {len(page.executed)} blocks")
    return 0


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # the page sees the installed mixle, not the tests folder
    sys.exit(run_page(Path(sys.argv[1]), sys.argv[2]))
