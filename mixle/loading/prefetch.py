"""Run a function over a stream of work items in background threads, results in order.

:func:`ordered_map` keeps at most ``prefetch`` items in flight, yields results in the order
of the work items whatever the number of threads, and shuts its threads down when the
caller stops: the loop ends, ``break``, ``close()``, garbage collection or an exception.
An exception raised by ``fn`` is re-raised in the caller with its original traceback.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["THREAD_NAME_PREFIX", "ordered_map"]

T = TypeVar("T")
R = TypeVar("R")

#: Name prefix of the loader's reader threads (seen in ``threading.enumerate()``).
THREAD_NAME_PREFIX = "mixle-loader"


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, num_threads: int, prefetch: int
) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fn(item))`` for each item in order, computing ahead in threads.

    Parameters
    ----------
    fn
        Called once per item, from a worker thread (from the caller when ``num_threads``
        is 0).
    items
        Work items; may be endless. Drawn from the caller's thread, ``prefetch`` ahead.
    num_threads
        Worker threads; 0 runs ``fn`` in the caller's thread with no prefetch.
    prefetch
        Items in flight or finished but not yet yielded (``>= 1`` when threads are used).

    Notes
    -----
    Threads start on the first ``next()`` and are joined before the generator finishes or
    is closed, so no thread outlives it. Pending work is cancelled; an item already running
    finishes first.
    """
    if num_threads == 0:
        for item in items:
            yield item, fn(item)
        return
    stream = iter(items)
    pending: deque[tuple[T, Future[R]]] = deque()
    pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix=THREAD_NAME_PREFIX)
    try:
        for item in itertools.islice(stream, prefetch):
            pending.append((item, pool.submit(fn, item)))
        while pending:
            item, future = pending.popleft()
            result = future.result()  # re-raises fn's exception with its traceback
            for nxt in itertools.islice(stream, 1):
                pending.append((nxt, pool.submit(fn, nxt)))
            yield item, result
    finally:
        for _, future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
