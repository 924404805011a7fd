"""Fetch many byte ranges at once: bounded in-flight bytes, and nearby ranges coalesced.

Object stores answer a request in tens of milliseconds whatever its size, so a batch that
needs a hundred chunks must not ask for them one by one. :func:`gather_bounded` runs every
request of a batch concurrently while at most :data:`MAX_INFLIGHT_BYTES` are in flight;
:func:`coalesce_ranges` merges byte ranges of one object that lie close together (the inner
chunks of a shard) into a few larger requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

__all__ = [
    "COALESCE_GAP_BYTES",
    "MAX_COALESCED_BYTES",
    "MAX_INFLIGHT_BYTES",
    "Coalesced",
    "coalesce_ranges",
    "gather_bounded",
]

#: Most bytes of requests one batch keeps in flight at once (more wait for a slot).
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
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

    Returns
    -------
    list
        Results in the order of ``calls``.

    Raises
    ------
    Exception
        The first failure, after the other requests were cancelled.
    """
    import asyncio  # only ever awaited inside a running event loop

    budget = _ByteBudget(MAX_INFLIGHT_BYTES if max_inflight is None else max_inflight)

    async def one(call: Callable[[], Awaitable[T]], size: int) -> T:
        taken = await budget.acquire(size)
        try:
            return await call()
        finally:
            await budget.release(taken)

    tasks = [asyncio.ensure_future(one(c, s)) for c, s in zip(calls, sizes)]
    try:
        return list(await asyncio.gather(*tasks))
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
