"""The ``mixle`` command line: ``mixle demo`` and ``mixle inspect``.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``run``: a callable taking the parsed arguments and the parser, returning
the exit status.
"""

from __future__ import annotations

import argparse
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
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    return int(args.run(args, parser))
