"""The ``mixle`` command line: ``mixle demo``, ``mixle inspect`` and ``mixle --version``.

Each command lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``run``: a callable taking the parsed arguments and the command's own
parser (for :meth:`~argparse.ArgumentParser.error`), returning the exit status.

An error a command raises ends it with status 1 and one line on stderr (see
:func:`error_line`); ``mixle --traceback ...`` or ``MIXLE_TRACEBACK=1`` shows the full
traceback instead, for bug reports.
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
from mixle.utils.redact import display_path, redact_text

__all__ = ["TRACEBACK_ENV", "error_line", "main"]

COMMANDS = (demo, inspect)
#: Exit status after SIGTERM (128 + the signal number, as a shell reports a killed command).
TERMINATED_STATUS = 128 + signal.SIGTERM
#: Environment variable that, set to ``1``, shows the traceback of an error (as ``--traceback``).
TRACEBACK_ENV = "MIXLE_TRACEBACK"
#: Longest error message printed; the rest is cut (a hostile file can make messages huge).
MAX_ERROR_CHARS = 1000
#: Errors whose message is meant for the user as it is; others also show their type.
_PLAIN_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError, LookupError)


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
    parser.add_argument(
        "--traceback",
        action="store_true",
        help=f"on an error, show the full traceback (for bug reports; or set {TRACEBACK_ENV}=1)",
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
    commands clean up on the way out. Any other error ends it with status 1 and one line
    on stderr (:func:`error_line`), or its traceback with ``--traceback`` or
    ``MIXLE_TRACEBACK=1``.
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
    except Exception as exc:
        if args.traceback or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        print(error_line(args, exc), file=sys.stderr, flush=True)
        return 1
    return status


def error_line(args: argparse.Namespace, exc: BaseException) -> str:
    """The one line ``mixle`` prints for ``exc``: ``mixle COMMAND: [PATH: ]MESSAGE``.

    ``PATH`` is the command's ``path`` argument when it has one and the message does not
    already name it quoted (credentials removed). The
    message is put on one line, credentials in ``--storage-option`` values and URLs are
    masked, and it is cut at :data:`MAX_ERROR_CHARS`. Errors that are not meant for a user
    as they are (``ZeroDivisionError``, ``RecursionError``, ...) also show their type and
    point at ``--traceback``.
    """
    secrets = dict(getattr(args, "storage_options", None) or ()) or None
    if isinstance(exc, KeyError) and exc.args:
        message = str(exc.args[0])
    elif isinstance(exc, RecursionError):
        message = "the input is nested too deeply to process (RecursionError)"
    elif isinstance(exc, MemoryError):
        message = f"ran out of memory (MemoryError{': ' + str(exc) if str(exc) else ''})"
    else:
        message = str(exc) or type(exc).__name__
        if not isinstance(exc, _PLAIN_ERRORS):
            message = f"{type(exc).__name__}: {message} (a bug? rerun with --traceback)"
    message = " ".join(redact_text(message, secrets).split())
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 3] + "..."
    path = getattr(args, "path", None)
    shown = None if path is None else redact_text(display_path(path), secrets)
    where = "" if shown is None or repr(shown) in message else f"{shown}: "
    return f"mixle {args.command}: {where}{message}"


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
