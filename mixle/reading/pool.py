"""The process-wide decode thread pool.

Chunk decoders that release the GIL (zstd, blosc, lz4, zlib) decode in parallel here;
NumPy copies into the output release it too. The pool starts on first use, is rebuilt in a
forked child, and is never entered twice by one thread: work submitted from inside a pool
thread runs inline, so nested reads cannot deadlock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from mixle.utils.validation import parse_int

__all__ = ["decode_threads", "default_decode_threads", "run_all", "set_decode_threads"]


def default_decode_threads() -> int:
    """Cores this process may run on (the default pool size)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


_lock = threading.Lock()
_size = default_decode_threads()
_executor: ThreadPoolExecutor | None = None
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
        old.shutdown(wait=False)


def _mark_inside() -> None:
    _inside.active = True


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=_size, thread_name_prefix="mixle-decode", initializer=_mark_inside
            )
        return _executor


def run_all(tasks: Sequence[Callable[[], None]]) -> None:
    """Run every task, in parallel on the decode pool when that can help; wait for all.

    The caller runs one task itself while the pool runs the rest. The first exception
    raised by a task is re-raised here after every task has finished, so no task is still
    writing into an output when the caller sees the error.
    """
    if len(tasks) <= 1 or _size <= 1 or getattr(_inside, "active", False):
        for task in tasks:
            task()
        return
    pool = _pool()
    futures: list[Future[None]] = []
    inline = [tasks[0]]
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
        except BaseException as exc:
            error = error or exc
    for future in futures:
        try:
            future.result()
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error


def _reset_after_fork() -> None:
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
