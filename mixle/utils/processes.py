"""Worker processes that never outlive their parent, and how to stop them and say why.

Shared by every process pool in mixle: the Loader's workers (:mod:`mixle.loading.workers`)
and the encoded-data workers (:mod:`mixle.utils.parallel.multiprocessing`).

A worker never outlives its parent, even while it runs user code: on Linux the kernel sends
it SIGKILL when the parent's starting thread exits (``PR_SET_PDEATHSIG``), and everywhere a
watchdog thread ends the process within :data:`WATCHDOG_INTERVAL_S` once its parent changes
or the parent's end of the pipe closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: ``import mixle`` loads no multiprocessing machinery
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

__all__ = [
    "WATCHDOG_INTERVAL_S",
    "describe_error",
    "describe_exit",
    "guard_against_orphaning",
    "orphan_guard_args",
    "stop_processes",
    "threads_named",
]

#: How often a worker's watchdog checks that its parent (the driver) is still there.
WATCHDOG_INTERVAL_S = 0.5
#: ``prctl`` option: the signal the kernel sends this process when its parent thread exits.
_PR_SET_PDEATHSIG = 1
#: Exit status of a worker that ended because its driver went away.
_ORPHANED_EXIT = 3


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        # the process's own symbols (libc among them): find_library("c") would run
        # ldconfig in a child process, in every worker, at every start
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no usable libc: the watchdog alone covers it
        pass


def _watch_parent(parent: int, fd: int) -> None:
    """End the process once the driver is gone: the parent changed (re-parented) or the
    driver's end of the pipe ``fd`` closed (a forkserver's child keeps its parent)."""
    poller = select.poll() if hasattr(select, "poll") else None
    if poller is not None:
        poller.register(fd, select.POLLHUP)  # never consumes what the main thread reads
    gone = select.POLLHUP | select.POLLERR | select.POLLNVAL if poller is not None else 0
    while True:
        if os.getppid() != parent:
            os._exit(_ORPHANED_EXIT)
        if poller is None:
            time.sleep(WATCHDOG_INTERVAL_S)
        elif any(events & gone for _, events in poller.poll(WATCHDOG_INTERVAL_S * 1000)):
            os._exit(_ORPHANED_EXIT)


def guard_against_orphaning(conn: Connection, parent: int | None, pdeathsig: bool) -> None:
    """Make this process exit when the driver dies: death signal plus a watchdog thread.

    Parameters
    ----------
    conn
        This worker's end of the pipe whose other end only the driver holds.
    parent
        The pid the parent must have; ``None``: the current parent.
    pdeathsig
        Also ask the kernel (Linux) to kill this process when its parent thread exits.
    """
    expected = os.getppid() if parent is None else parent
    if pdeathsig:
        _die_with_parent()
    if os.getppid() != expected:  # the parent died before the guard was in place
        os._exit(_ORPHANED_EXIT)
    threading.Thread(
        target=_watch_parent,
        args=(expected, conn.fileno()),
        name="mixle-worker-watchdog",
        daemon=True,
    ).start()


def orphan_guard_args(start_method: str) -> tuple[int | None, bool]:
    """``(parent, pdeathsig)`` for :func:`guard_against_orphaning` in a child started now.

    A forkserver's children have the server as parent (it outlives the caller while they
    run), so they watch only the pipe; the death signal follows the thread that forks, and
    only the main thread lives as long as the process.
    """
    parent = None if start_method == "forkserver" else os.getpid()
    main = threading.current_thread() is threading.main_thread()
    return parent, parent is not None and main


def describe_error(exc: BaseException) -> tuple[str, str, str]:
    """``(type name, message, traceback text)`` of ``exc``, for a worker's error reply.

    Never raises: an exception whose ``str()`` (or traceback) cannot be formatted gets a
    placeholder, so the reply still reaches the parent instead of killing the worker.
    """

    def text(make: Any, what: str) -> str:
        try:
            return str(make())
        except BaseException:
            return f"<{what} could not be formatted>"

    trace = text(
        lambda: "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "the traceback",
    )
    return type(exc).__name__, text(lambda: exc, f"str() of the {type(exc).__name__}"), trace


def describe_exit(proc: BaseProcess, wait_s: float = 1.0) -> str:
    """How ``proc`` ended, for an error message: ``"was killed by SIGKILL"``, ``"exited with
    code 1"``, or ``"stopped answering"`` when it is still running after ``wait_s``."""
    proc.join(timeout=wait_s)
    code = proc.exitcode
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def stop_processes(
    procs: Sequence[BaseProcess],
    conns: Sequence[Connection],
    *,
    close_message: bytes | None,
    grace: float,
    terminate: bool = True,
) -> None:
    """Stop ``procs`` and close ``conns``: ask, then terminate, then kill. Idempotent.

    With ``close_message``, each connection is sent it and the processes get ``grace``
    seconds (in all) to exit by themselves; then the ones still alive are terminated
    (SIGTERM), and killed (SIGKILL) if they are still there 2 s later (in all). With
    ``terminate=False`` they are killed at once instead: for processes with nothing to
    clean up, where a forked child that has not yet reset its signal handlers would run
    the parent's SIGTERM handler.
    """
    if close_message is not None:
        for conn in conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(close_message)
        deadline = time.monotonic() + grace
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
    if terminate:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 2.0  # one wait for all of them, not 2 s each
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=2.0)
    for conn in conns:
        conn.close()


def threads_named(prefixes: tuple[str, ...]) -> bool | None:
    """Whether a thread of this process has a name (``/proc/self/task/*/comm``, 15
    characters at most) starting with one of ``prefixes``; ``None`` where the threads
    cannot be listed (no ``/proc``, as on macOS).

    A tokio runtime (obstore's, icechunk's) names its threads so; they do not survive
    ``fork``, and a forked child calling into the runtime hangs.
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().strip().startswith(prefixes):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False
