"""Many requests at once: bounded bytes and requests in flight, nearby ranges coalesced.

Object stores answer a request in tens of milliseconds whatever its size, so a batch that
needs a hundred chunks must not ask for them one by one. :func:`gather_bounded` runs every
request of a batch concurrently while at most :data:`MAX_INFLIGHT_BYTES` and
:data:`MAX_INFLIGHT_REQUESTS` are in flight, under the batch's deadline
(:func:`~mixle.reading.policy.batch_deadline`); :func:`stream_bounded` hands their results
to blocking code as they arrive; :func:`coalesce_ranges` merges byte ranges of one object
that lie close together (the inner chunks of a shard) into a few larger requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mixle.reading.policy import batch_deadline, keep_deadline

__all__ = [
    "COALESCE_GAP_BYTES",
    "MAX_COALESCED_BYTES",
    "MAX_INFLIGHT_BYTES",
    "MAX_INFLIGHT_REQUESTS",
    "Coalesced",
    "coalesce_ranges",
    "gather_bounded",
    "stream_bounded",
]

#: Most bytes of requests one batch keeps in flight at once (more wait for a slot).
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
#: Most requests one batch keeps in flight at once, and the connection pool size mixle gives
#: s3fs when ``storage_options`` do not choose one (aiobotocore's own default is 10).
MAX_INFLIGHT_REQUESTS = 64
#: Two byte ranges of one object closer than this are fetched in one request: reading a
#: gap this size costs less than the round trip of a second request.
COALESCE_GAP_BYTES = 1024 * 1024
#: A coalesced request never grows past this many bytes (unless one range alone is larger),
#: so big batches still spread over several concurrent requests.
MAX_COALESCED_BYTES = 16 * 1024 * 1024

T = TypeVar("T")


class _ByteBudget:
    """An asyncio semaphore counted in bytes; a request larger than the budget takes it all."""

    def __init__(self, budget: int) -> None:
        import asyncio  # built inside a running loop; ``import mixle`` stays asyncio-free

        self._free = budget
        self._budget = budget
        self._changed = asyncio.Condition()

    async def acquire(self, nbytes: int) -> int:
        take = max(1, min(nbytes, self._budget))
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= take)
            self._free -= take
        return take

    async def release(self, taken: int) -> None:
        async with self._changed:
            self._free += taken
            self._changed.notify_all()


async def gather_bounded(
    calls: Sequence[Callable[[], Awaitable[T]]],
    sizes: Sequence[int],
    *,
    max_inflight: int | None = None,
    max_requests: int | None = None,
    on_ready: Callable[[int, T], None] | None = None,
) -> list[T]:
    """Await every ``calls[k]()`` concurrently, holding ``sizes[k]`` bytes of budget each.

    Parameters
    ----------
    calls
        Coroutine factories; each is called once.
    sizes
        Expected bytes of each result (an estimate is fine).
    max_inflight
        Byte budget; default :data:`MAX_INFLIGHT_BYTES`.
    max_requests
        Most calls awaited at once; default :data:`MAX_INFLIGHT_REQUESTS`.
    on_ready
        Called as ``on_ready(k, result)`` on the event loop as soon as call ``k`` finishes
        (so a consumer can start on it while the others are still in flight).

    Returns
    -------
    list
        Results in the order of ``calls``.

    Raises
    ------
    Exception
        The first failure, after the other requests were cancelled.

    Notes
    -----
    The whole batch has one deadline (:func:`~mixle.reading.policy.batch_deadline`): a
    request (retried through :func:`~mixle.reading.faults.retry_async`) still unfinished
    when the policy's deadline passes raises
    :class:`~mixle.reading.faults.RemoteTimeoutError`.
    """
    import asyncio  # only ever awaited inside a running event loop

    end = batch_deadline()

    budget = _ByteBudget(MAX_INFLIGHT_BYTES if max_inflight is None else max_inflight)
    slots = asyncio.Semaphore(
        max(1, MAX_INFLIGHT_REQUESTS if max_requests is None else max_requests)
    )

    async def one(k: int, call: Callable[[], Awaitable[T]], size: int) -> T:
        keep_deadline(end)  # this task's own context: its retries end by the batch's deadline
        async with slots:
            taken = await budget.acquire(size)
            try:
                result = await call()
            finally:
                await budget.release(taken)
        if on_ready is not None:
            on_ready(k, result)
        return result

    tasks = [asyncio.ensure_future(one(k, c, s)) for k, (c, s) in enumerate(zip(calls, sizes))]
    try:
        return list(await asyncio.gather(*tasks))
    except GeneratorExit:  # closed unfinished (its loop is gone): nothing may be awaited
        for task in tasks:
            with contextlib.suppress(RuntimeError):  # a closed loop cannot cancel
                task.cancel()
        raise
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(frozen=True)
class Coalesced:
    """One request ``[start, end)`` covering the input ranges ``members`` (their indices)."""

    start: int
    end: int
    members: tuple[int, ...]


def coalesce_ranges(
    starts: Sequence[int],
    ends: Sequence[int],
    *,
    gap: int = COALESCE_GAP_BYTES,
    max_bytes: int = MAX_COALESCED_BYTES,
) -> list[Coalesced]:
    """Merge byte ranges ``[starts[k], ends[k])`` of one object into few requests.

    Ranges are sorted by start; a range joins the current request when it begins at most
    ``gap`` bytes after the request's end and the request stays within ``max_bytes``.
    O(n log n) in the number of ranges.
    """
    lo = np.asarray(starts, dtype=np.int64)
    hi = np.asarray(ends, dtype=np.int64)
    order = np.argsort(lo, kind="stable").tolist()
    out: list[Coalesced] = []
    cur_start = cur_end = 0
    members: list[int] = []
    for k in order:
        a, b = int(lo[k]), int(hi[k])
        if members and a - cur_end <= gap and max(cur_end, b) - cur_start <= max_bytes:
            cur_end = max(cur_end, b)
            members.append(k)
            continue
        if members:
            out.append(Coalesced(cur_start, cur_end, tuple(members)))
        cur_start, cur_end, members = a, b, [k]
    if members:
        out.append(Coalesced(cur_start, cur_end, tuple(members)))
    return out


_END = object()


def stream_bounded(
    loop: Any, calls: Sequence[Callable[[], Awaitable[T]]], sizes: Sequence[int]
) -> Generator[list[tuple[int, T]], None, None]:
    """Start :func:`gather_bounded` on ``loop`` now; yield results in groups as they arrive.

    Each group is every ``(k, result)`` that arrived since the last one (at least one), so
    a consumer that falls behind gets larger groups to share out. Every ``k`` is yielded
    once; the first failure is raised after the results that arrived before it.

    Parameters
    ----------
    loop
        The running event loop (in another thread) that owns the store's connections.
    calls, sizes
        As for :func:`gather_bounded`.

    Notes
    -----
    The requests are in flight as soon as this returns. Closing the iterator early (or
    dropping it) cancels the requests still running.
    """
    import asyncio
    import queue

    ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
    future = asyncio.run_coroutine_threadsafe(
        gather_bounded(calls, sizes, on_ready=lambda k, r: ready.put((k, r))), loop
    )
    future.add_done_callback(lambda _: ready.put(_END))
    return _arrivals(ready, future)


def _arrivals(ready: Any, future: Any) -> Generator[list[tuple[int, Any]], None, None]:
    try:
        while True:
            group = [ready.get()]
            while not ready.empty():
                group.append(ready.get_nowait())
            items = [item for item in group if item is not _END]
            if items:
                yield items
            if len(items) != len(group):  # the end marker came: nothing more will arrive
                future.result()  # raises the first failure, if any
                return
    finally:
        future.cancel()
