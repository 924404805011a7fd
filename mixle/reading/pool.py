"""The process-wide decode thread pool.

Chunk decoders that release the GIL (zstd, blosc, lz4, zlib) decode in parallel here;
NumPy copies into the output release it too. The pool starts on first use, is rebuilt in a
forked child, and is never entered twice by one thread: work submitted from inside a pool
thread runs inline, so nested reads cannot deadlock.

Its threads are daemon threads, unlike :class:`concurrent.futures.ThreadPoolExecutor`'s,
which the interpreter joins at exit: a decode thread stuck in a read (a stalled remote
store) never keeps the process alive after Ctrl-C or the end of the program.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait

from mixle.utils.validation import parse_int

__all__ = ["decode_threads", "default_decode_threads", "run_all", "set_decode_threads"]

#: Name prefix of the decode threads (``mixle-decode_0``, ...), as seen by ``threading``.
THREAD_NAME_PREFIX = "mixle-decode"
#: After Ctrl-C, :func:`run_all` waits at most this many seconds for running tasks to end.
INTERRUPT_GRACE_S = 1.0


def default_decode_threads() -> int:
    """Cores this process may run on (the default pool size)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


_Job = tuple[Future, Callable[[], None]]  # type: ignore[type-arg]


class _DaemonPool:
    """A fixed number of daemon threads taking ``(future, task)`` jobs from one queue."""

    def __init__(self, size: int) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._shut = False
        self._size = size
        self._threads: list[threading.Thread] = []

    def submit(self, task: Callable[[], None]) -> Future[None]:
        """Queue ``task``; raises ``RuntimeError`` once the pool is shut down."""
        future: Future[None] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("the decode pool was shut down (resized)")
            if len(self._threads) < self._size:  # threads start as work first needs them
                thread = threading.Thread(
                    target=self._work,
                    name=f"{THREAD_NAME_PREFIX}_{len(self._threads)}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)
            self._jobs.put((future, task))
        return future

    def shutdown(self) -> None:
        """Let every thread finish the job it has and the queued ones, then end."""
        with self._lock:
            self._shut = True
            for _ in self._threads:
                self._jobs.put(None)

    def _work(self) -> None:
        _inside.active = True
        while (job := self._jobs.get()) is not None:
            future, task = job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled by run_all before it started
            try:
                task()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(None)
            del job, future, task  # nothing of the task outlives it in an idle thread


_lock = threading.Lock()
_size = default_decode_threads()
_executor: _DaemonPool | None = None
_inside = threading.local()


def decode_threads() -> int:
    """How many threads decode chunks (``1`` means everything runs in the caller)."""
    return _size


def set_decode_threads(threads: int | None) -> None:
    """Set the decode pool size; ``None`` restores the default (one per core).

    The old pool finishes the work it has and is shut down; later reads use the new size.
    """
    global _size, _executor
    size = default_decode_threads() if threads is None else parse_int(threads, "threads")
    if size < 1:
        raise ValueError(f"threads={threads} must be >= 1 (1 decodes in the calling thread)")
    with _lock:
        old, _executor, _size = _executor, None, size
    if old is not None:
        old.shutdown()


def _pool() -> _DaemonPool:
    global _executor
    with _lock:
        if _executor is None:
            _executor = _DaemonPool(_size)
        return _executor


def run_all(
    tasks: Sequence[Callable[[], None]], *, on_interrupt: Callable[[], None] | None = None
) -> None:
    """Run every task, in parallel on the decode pool when that can help; wait for all.

    The caller runs one task itself while the pool runs the rest. The first exception
    raised by a task is re-raised here after every task has finished, so no task is still
    writing into an output when the caller sees the error.

    A ``KeyboardInterrupt`` (or another exception that is not an ``Exception``, such as
    ``SystemExit``) in the calling thread is re-raised at once: tasks not yet started are
    cancelled, ``on_interrupt()`` is called (tasks should then stop taking work), and
    running ones are waited for up to :data:`INTERRUPT_GRACE_S` seconds. A task still
    running after that may write into the output after the interrupt reached the caller
    (a user's ``out=`` array included), until it ends.
    """
    if len(tasks) <= 1 or _size <= 1 or getattr(_inside, "active", False):
        for task in tasks:
            task()
        return
    pool = _pool()
    futures: list[Future[None]] = []
    inline = [tasks[0]]
    try:
        for i, task in enumerate(tasks[1:], start=1):
            try:
                futures.append(pool.submit(task))
            except RuntimeError:  # the pool was resized under us: finish here
                inline.extend(tasks[i:])
                break
        error: BaseException | None = None
        for task in inline:
            try:
                task()
            except Exception as exc:
                error = error or exc
        for future in futures:
            try:
                future.result()
            except Exception as exc:
                error = error or exc
    except BaseException:  # Ctrl-C while waiting: stop what has not started, do not wait
        for future in futures:
            future.cancel()
        if on_interrupt is not None:
            on_interrupt()
        wait(futures, timeout=INTERRUPT_GRACE_S)  # a second Ctrl-C ends the wait
        raise
    if error is not None:
        raise error


def _reset_after_fork() -> None:
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
