"""The ``mixle`` command line: ``mixle demo``, ``mixle inspect`` and ``mixle --version``.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``run``: a callable taking the parsed arguments and the command's own
parser (for :meth:`~argparse.ArgumentParser.error`), returning the exit status.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import mixle
from mixle.cli import demo, inspect

__all__ = ["main"]

COMMANDS = (demo, inspect)
#: Exit status after SIGTERM (128 + the signal number, as a shell reports a killed command).
TERMINATED_STATUS = 128 + signal.SIGTERM


class _Terminated(BaseException):
    """Raised in the main thread by SIGTERM while a command runs, so that it cleans up.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`, so ``except Exception``
    blocks on the way out do not swallow it.
    """


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="mixle", description="Lazy patches and batches from data that does not fit in memory."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"mixle {mixle.__version__}",
        help="print the version",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser, dict(sub.choices)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


@contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """Turn SIGTERM into :class:`_Terminated` while the block runs (main thread only).

    By default SIGTERM ends the process at once, leaving behind what a command was about to
    remove (``mixle demo``'s temporary volume); raised as an exception, it runs the
    ``finally`` blocks first. The previous handler is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    A closed stdout pipe (``mixle demo | head``) ends the command quietly with status 0,
    Ctrl-C with status 130 and SIGTERM with status 143, each with one line on stderr;
    commands clean up on the way out.
    """
    parser, commands = _parser()
    args = parser.parse_args(argv)
    try:
        with _terminate_cleanly():
            status = int(args.run(args, commands[args.command]))
            sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(f"mixle {args.command}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"mixle {args.command}: terminated", file=sys.stderr)
        return TERMINATED_STATUS
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
