"""The ``mixle`` command line: ``mixle demo`` and ``mixle inspect``.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``run``: a callable taking the parsed arguments and the parser, returning
the exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mixle.cli import demo, inspect

__all__ = ["main"]

COMMANDS = (demo, inspect)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixle", description="Lazy patches and batches from data that does not fit in memory."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    A closed stdout pipe (``mixle demo | head``) ends the command quietly with status 0,
    and Ctrl-C with status 130 and one line on stderr; commands clean up on the way out.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        status = int(args.run(args, parser))
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(f"mixle {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (tests capturing output): nothing is left to flush
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
