"""Run a function over a stream of work items in background threads, results in order.

:func:`ordered_map` keeps at most ``prefetch`` items in flight, yields results in the order
of the work items whatever the number of threads, and stops its threads when the caller
stops: the loop ends, ``break``, ``close()``, garbage collection or an exception (Ctrl-C
included). An exception raised by ``fn`` is re-raised in the caller with its original
traceback.

The threads are daemon threads managed here (not a ``ThreadPoolExecutor``, whose threads
the interpreter joins at exit): a thread stuck in a read that never returns can neither
hold up the caller for more than :data:`STOP_GRACE_S` nor keep the process alive.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from mixle.errors import ReadsStopped
from mixle.reading.stopping import stop_when

__all__ = [
    "STOP_GRACE_S",
    "THREAD_NAME_PREFIX",
    "ReaderThreads",
    "StopSignal",
    "ordered_map",
]

T = TypeVar("T")
R = TypeVar("R")

#: Name prefix of the loader's reader threads (seen in ``threading.enumerate()``).
THREAD_NAME_PREFIX = "mixle-loader"
#: Seconds a stopping loop waits for reader threads to finish the item they are running;
#: a thread still busy after that (a read that does not return) is left to end by itself.
STOP_GRACE_S = 1.0
_STOPPED = (
    "the loader was closed (from another thread) while this loop {doing} a batch; the "
    "cursor stays at that batch: iterate the loader again to continue from it"
)


class StopSignal:
    """A thread-safe "stop reading" flag that also wakes a loop waiting for a result.

    Notes
    -----
    :meth:`set` may be called from any thread, any number of times. The reader threads
    and the loop waiting on them share its condition.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._set = False

    def set(self) -> None:
        """Ask every thread using this signal to stop, and wake the ones that wait."""
        self._set = True  # first, so the flag is up even if the lock below is interrupted
        with self.cond:
            self.cond.notify_all()

    def is_set(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._set


class _Job(Generic[T, R]):
    """One work item and, once ``done``, its result or the exception it raised."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class ReaderThreads(Generic[T, R]):
    """``num_threads`` daemon threads running ``fn`` on submitted items, stoppable at once.

    Parameters
    ----------
    fn
        Called once per submitted item, in one of the threads.
    num_threads
        Threads to start (``>= 1``).
    signal
        The stop signal they obey (default: a new one); :meth:`stop` sets it.
    """

    def __init__(
        self, fn: Callable[[T], R], num_threads: int, signal: StopSignal | None = None
    ) -> None:
        self._fn = fn
        self.signal = StopSignal() if signal is None else signal
        self._todo: deque[_Job[T, R]] = deque()
        self._threads = [
            threading.Thread(target=self._work, name=f"{THREAD_NAME_PREFIX}_{k}", daemon=True)
            for k in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        # the reading layer sees the signal: once set, a read stuck on a stalled server
        # starts no further retry and its request in flight is cancelled
        with stop_when(self.signal.is_set):
            self._work_items()

    def _work_items(self) -> None:
        signal, cond = self.signal, self.signal.cond
        while True:
            with cond:
                while not self._todo and not signal.is_set():
                    cond.wait()
                if signal.is_set():
                    return
                job = self._todo.popleft()
            try:
                job.result = self._fn(job.item)
            except BaseException as exc:  # re-raised in the caller's thread
                job.error = exc
            with cond:
                job.done = True
                cond.notify_all()
            del job  # hold no result while waiting for the next item

    def submit(self, item: T) -> _Job[T, R]:
        """Queue ``item``; the returned job is passed to :meth:`result`."""
        job: _Job[T, R] = _Job(item)
        with self.signal.cond:
            self._todo.append(job)
            self.signal.cond.notify_all()
        return job

    def result(self, job: _Job[T, R]) -> R:
        """Wait for ``job``; its result, or its exception re-raised with its traceback.

        Raises
        ------
        ReadsStopped
            The signal was set (from another thread) before the job was done.
        """
        signal, cond = self.signal, self.signal.cond
        with cond:
            while not job.done and not signal.is_set():
                cond.wait()
        if not job.done:
            raise ReadsStopped(_STOPPED.format(doing="waited for"))
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        return job.result  # type: ignore[return-value]

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop the threads: queued items are dropped, and a thread still running an item
        after ``grace`` seconds (in all) is left to finish it and exit by itself."""
        self.signal.set()
        with self.signal.cond:
            self._todo.clear()  # drop the items' references; no thread takes one now
        deadline = time.monotonic() + grace
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    num_threads: int,
    prefetch: int,
    signal: StopSignal | None = None,
) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fn(item))`` for each item in order, computing ahead in threads.

    Parameters
    ----------
    fn
        Called once per item, from a reader thread (from the caller when ``num_threads``
        is 0).
    items
        Work items; may be endless. Drawn from the caller's thread, ``prefetch`` ahead.
    num_threads
        Reader threads; 0 runs ``fn`` in the caller's thread with no prefetch.
    prefetch
        Items in flight or finished but not yet yielded (``>= 1`` when threads are used).
    signal
        Lets another thread stop the loop: once it is set, the loop raises
        :class:`ReadsStopped` instead of yielding (at once if it waits for a thread, after
        the running ``fn`` when ``num_threads`` is 0).

    Notes
    -----
    Threads start on the first ``next()`` and are stopped when the generator finishes, is
    closed or collected, or an exception (KeyboardInterrupt too) passes through it: queued
    items are dropped, and threads are joined for up to :data:`STOP_GRACE_S` seconds. A
    thread still running an item then (a read that does not return) is a daemon thread
    that exits once its item ends, with its result dropped; it does not keep the process
    alive.
    """
    if num_threads == 0:
        for item in items:
            result = fn(item)
            if signal is not None and signal.is_set():
                raise ReadsStopped(_STOPPED.format(doing="read"))
            yield item, result
        return
    stream = iter(items)
    pending: deque[_Job[T, R]] = deque()
    readers: ReaderThreads[T, R] = ReaderThreads(fn, num_threads, signal)
    try:
        for item in itertools.islice(stream, prefetch):
            pending.append(readers.submit(item))
        while pending:
            job = pending.popleft()
            result = readers.result(job)
            for nxt in itertools.islice(stream, 1):
                pending.append(readers.submit(nxt))
            yield job.item, result
    finally:
        pending.clear()
        readers.stop()
