"""mkdocs hook: ``<!-- cli-help: demo -->`` becomes the output of ``mixle demo --help``.

The command line's reference is its own ``--help``, rendered when the site is built, so
the docs cannot drift from the parser. ``<!-- cli-help: -->`` (no command) renders
``mixle --help``. A command that does not exist fails the build.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any

MARKER = re.compile(r"^<!-- cli-help:(?P<command>[\w -]*)-->$", flags=re.MULTILINE)
#: Width of the rendered help, so the text does not depend on the terminal of the build.
HELP_COLUMNS = "88"


def command_help(command: str) -> str:
    """The ``--help`` text of ``mixle <command>``, as argparse prints it."""
    from mixle.cli import main

    out = io.StringIO()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*command.split(), "--help"])
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    text = out.getvalue().rstrip()
    if not text.startswith("usage:"):
        raise ValueError(f"cli-help: 'mixle {command} --help' printed no help: {text!r}")
    return text


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace every ``cli-help`` marker of a page by the command's help in a text block."""
    return MARKER.sub(
        lambda m: f"```text\n{command_help(m.group('command').strip())}\n```", markdown
    )
