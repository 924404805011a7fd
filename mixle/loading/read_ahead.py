"""Tell the decoded-chunk cache which chunks a run's next batches touch (a read plan).

The Loader knows every batch it will read. :class:`ReadAheadPlans` draws the run's batch
plans :data:`READ_AHEAD_BATCHES` ahead, asks the source which cache keys each one reads
(``source.chunk_keys(indices)``, :class:`~mixle.data.sources.protocols.SupportsChunkKeys`)
and, as each batch starts to be read, hands the cache the keys of the batches not yet
started, nearest first (:meth:`mixle.reading.ChunkCache.read_ahead`). The cache then keeps
the chunks those batches need and drops the ones none of them do, instead of evicting the
least recently used: a pass of random patches larger than the budget decodes each chunk
once where its reuse falls within the window, where LRU decodes some of them twice. At most
about :data:`READ_AHEAD_KEYS` keys are planned. Planning changes which chunks stay cached,
never what a batch holds.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from mixle.loading.plan import BatchPlan
from mixle.reading.cache import ChunkCache, ReadAhead

__all__ = ["READ_AHEAD_BATCHES", "READ_AHEAD_KEYS", "ReadAheadPlans", "chunk_keys_of"]

#: Batches beyond the one being read whose chunks the cache is told about.
READ_AHEAD_BATCHES = 8
#: ... and at most about this many chunk keys in all (at least one batch's): a plan longer
#: than the cache can hold only costs time (it is made under the cache's lock) and memory.
READ_AHEAD_KEYS = 8192

#: ``indices -> cache keys`` of the chunks ``get_batch(indices)`` reads.
KeysOf = Callable[[Any], list[Hashable]]


def chunk_keys_of(source: Any) -> KeysOf | None:
    """The source's ``chunk_keys``, or ``None`` when it cannot say what a batch reads."""
    keys = getattr(source, "chunk_keys", None)
    return keys if callable(keys) else None


class ReadAheadPlans:
    """A run's batch plans, drawn ahead, whose chunks the cache learns before they are read.

    Iterate it for the plans (in order, each once); wrap the batch reader with
    :meth:`reading` so that each read first tells the cache what is left to read;
    :meth:`close` withdraws the plan. Thread-safe: reads may start in several threads.

    Parameters
    ----------
    plans
        The run's batch plans.
    keys_of
        The source's ``chunk_keys``.
    cache
        The cache the source reads through.
    window
        Batches planned ahead.
    """

    def __init__(
        self,
        plans: Iterable[BatchPlan],
        keys_of: KeysOf,
        cache: ChunkCache,
        window: int = READ_AHEAD_BATCHES,
    ) -> None:
        self._plans = iter(plans)
        self._keys_of = keys_of
        self._window = window
        self._ahead: ReadAhead = cache.read_ahead()
        self._lock = threading.Lock()
        self._drawn: deque[tuple[int, BatchPlan]] = deque()  # peeked, not yet handed out
        self._pending: OrderedDict[int, list[Hashable]] = OrderedDict()  # not yet started
        self._started: dict[int, int] = {}  # id of a handed-out plan -> its number
        self._count = itertools.count()
        self._error: BaseException | None = None  # raised by the plans, held for its turn
        # off once the first batch reads nothing through the cache (a memory map): then no
        # batch does, and asking costs a fast source's batch a tenth of its time
        self._planning = True

    def __iter__(self) -> Iterator[BatchPlan]:
        while True:
            self._peek(self._window + 1)
            with self._lock:
                if not self._drawn:
                    break
                number, plan = self._drawn.popleft()
                self._started[id(plan)] = number
            yield plan
        if self._error is not None:  # after the plans drawn before it, as without a plan
            error, self._error = self._error, None
            raise error

    def _peek(self, depth: int) -> None:
        """Draw plans until ``depth`` are waiting (or the run ends); learn their keys."""
        while len(self._drawn) < depth and self._error is None:
            try:
                plan = next(self._plans, None)
            except Exception as exc:
                self._error = exc
                return
            if plan is None:
                return
            number = next(self._count)
            keys = self._keys(plan)
            with self._lock:
                self._drawn.append((number, plan))
                self._pending[number] = keys

    def _keys(self, plan: BatchPlan) -> list[Hashable]:
        """The plan's keys, each once (``[]`` when the source cannot say)."""
        if not self._planning:
            return []
        try:
            keys = list(dict.fromkeys(self._keys_of(plan.indices)))
        except Exception:  # an unhashable key, or what the read of this batch raises there
            keys = []
        if not keys and plan.indices.size:
            self._planning = False
        return keys

    def starting(self, plan: BatchPlan) -> None:
        """``plan`` is about to be read: plan the cache for the batches after it."""
        with self._lock:
            number = self._started.pop(id(plan), None)
            if number is None or not self._planning:
                return
            self._pending.pop(number, None)
            upcoming, total = [], 0
            for keys in self._pending.values():
                if upcoming and total + len(keys) > READ_AHEAD_KEYS:
                    break
                upcoming.append(keys)
                total += len(keys)
        self._ahead.update(upcoming)

    def reading(self, reader: Callable[[BatchPlan], Any]) -> Callable[[BatchPlan], Any]:
        """``reader`` that first tells the cache the read is starting (:meth:`starting`)."""

        def read(plan: BatchPlan) -> Any:
            self.starting(plan)
            return reader(plan)

        return read

    def close(self) -> None:
        """Withdraw the plan from the cache."""
        self._ahead.close()
