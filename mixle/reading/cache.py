"""A byte-budgeted cache of decoded chunks (:class:`ChunkCache`), LRU or led by a read plan.

Decoding, not disk, is what random patches cost: a 32³ patch from 64³ zstd chunks decodes
about 3.4 chunks. The cache keeps decoded chunks under a byte budget so that chunks shared
by patches of several batches are decoded once. It is a policy over whatever fetches and
decodes the chunk; it never does I/O itself. The one cache every source of a process reads
through, and its budget, are :mod:`mixle.reading.process_cache`'s.

Eviction. Without a plan it is least recently used. A reader that knows which chunks its
next batches touch (the Loader does, :class:`ReadAhead`) says so with :meth:`ChunkCache.read_ahead`:
chunks no planned batch touches go first (least recently used first), then planned ones,
those needed last first; a chunk no planned batch needs is not kept at the cost of one
that is. A pass that outgrows the budget then decodes each chunk once where its reuse falls
within the plan (plain LRU decodes some of them twice). A plan not updated for
:data:`PLAN_LAPSE_S` stops counting.

Memory. Kept chunks of :data:`PAGE_BACKED_CHUNK_BYTES` or more live in pages of their own
(an anonymous ``mmap``), never the malloc heaps of the decode threads, whose free space
glibc does not give back (16 decode threads held 2x the budget that way). Decoders write
straight into them (:meth:`ChunkCache.lease`), and an evicted chunk's pages are the next
chunk's of that size: no fresh allocation (and its page faults), no copy. A chunk starts
:data:`PAGE_OFFSET` bytes into its pages (its pages hold one page more than its bytes,
uncounted), so copies from it into batch arrays do not stall on 4K aliasing. Kept chunks,
spare pages and the buffers being decoded into count against the budget together. The
default budget is one job's
(:func:`~mixle.reading.process_cache.default_chunk_cache_bytes`): a torch DataLoader
worker, and an ``MPEncodedData`` worker
(:func:`~mixle.reading.process_cache.share_default_chunk_cache`), gets its share.
"""

from __future__ import annotations

import mmap
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_CHUNK_CACHE_BYTES",
    "PAGE_BACKED_CHUNK_BYTES",
    "PLAN_LAPSE_S",
    "CacheStats",
    "ChunkCache",
    "ReadAhead",
]

#: Default budget of the decoded-chunk cache of one job: 256 decoded 1 MiB chunks (64³
#: float32), a few batches of random 32³ patches, small next to a training host's RAM.
#: Worker processes of a torch DataLoader share it
#: (:func:`~mixle.reading.process_cache.default_chunk_cache_bytes`).
DEFAULT_CHUNK_CACHE_BYTES = 256 * 1024 * 1024
#: Kept chunks at least this large live in pages of their own rather than the malloc heap.
PAGE_BACKED_CHUNK_BYTES = 64 * 1024
#: A read plan not updated for this long stops counting: a reader that paused (a training
#: loop in its validation pass, an iterator left alive) no longer holds the cache's room.
PLAN_LAPSE_S = 5.0

_PAGE_FLAGS = (
    {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)}
    if hasattr(mmap, "MAP_ANONYMOUS")
    else {}
)


#: Where a chunk starts in its pages: half a page in. A batch array's data starts a few
#: bytes past a page boundary (the allocator's header), and a copy between two buffers at
#: the same offset within a page stalls on the CPU's load/store address checks (4K
#: aliasing): whole chunks scattered from page-aligned pages ran 2.7x slower
#: (benchmarks/chunk_scatter.py).
PAGE_OFFSET = 2048


class _Pages(mmap.mmap):
    """Anonymous pages holding one cached chunk (the type marks the cache's own buffers).

    ``size`` is the chunk's bytes, from :data:`PAGE_OFFSET` on. ``owner`` is the cache that
    made them; ``leased``: handed out by :meth:`ChunkCache.lease` and not yet put (their
    bytes are reserved in the budget).
    """

    size: int = 0
    owner: ChunkCache | None = None
    leased: bool = False


def _new_pages(size: int) -> _Pages:
    """Pages for a chunk of ``size`` bytes (at :data:`PAGE_OFFSET`)."""
    pages = _Pages(-1, size + PAGE_OFFSET, **_PAGE_FLAGS)
    pages.size = size
    return pages


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`ChunkCache` since it was created or last cleared.

    ``read_seconds``, ``decode_seconds`` and ``scatter_seconds`` are the time the read
    planner spent, summed over its threads, reading stored chunks, decoding them and
    copying their pieces into batches (a reader that reads and decodes in one step counts
    both as decoding); ``decodes``: chunks the read planner read and decoded (a miss that
    another thread was already decoding waits for it instead, so misses may exceed it).
    ``skipped``: decoded chunks not kept, because a read plan needs every kept chunk
    sooner or decoders hold the rest of the budget.
    """

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    budget: int
    skipped: int = 0
    decodes: int = 0
    read_seconds: float = 0.0
    decode_seconds: float = 0.0
    scatter_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, 0.0 before any lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class ReadAhead:
    """The chunks a reader's next batches touch, for :class:`ChunkCache`'s eviction.

    Made by :meth:`ChunkCache.read_ahead`. :meth:`update` replaces the plan; :meth:`close`
    (or garbage collection) withdraws it. Thread-safe.
    """

    def __init__(self, cache: ChunkCache) -> None:
        self._cache = cache
        self._id = object()
        cache._open_plan(self._id)
        self._done = weakref.finalize(self, cache._withdraw, self._id)
        self._done.atexit = False

    def update(self, batches: Sequence[Iterable[Hashable]]) -> None:
        """``batches[d]``: the cache keys of the batch ``d`` batches from now (0: being read)."""
        plan: dict[Hashable, int] = {}
        for distance, keys in enumerate(batches):
            for key in keys:
                plan.setdefault(key, distance)
        self._cache._plan(self._id, plan)  # ignored once closed

    def close(self) -> None:
        """Withdraw the plan: the cache is plain LRU again for these chunks."""
        self._done()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChunkCache:
    """Decoded chunks, at most ``budget`` bytes in all, evicted LRU or as a plan says.

    Parameters
    ----------
    budget
        Byte budget; ``0`` disables caching (every lookup misses and nothing is kept).
    page_backed
        Keep chunks of :data:`PAGE_BACKED_CHUNK_BYTES` or more in pages of their own (the
        default; see the module notes). ``False`` keeps the decoder's array as it is (a
        put of an array not decoded into a :meth:`lease` buffer costs no copy), but with
        several decode threads their malloc heaps keep what evicted chunks freed (up to 2x
        the budget with 16 threads).

    Notes
    -----
    Thread-safe. Cached arrays are read-only; a chunk larger than the budget is returned
    but not kept. Keys are ``(reader token, chunk coordinates)``: tokens are unique per
    open store handle, so a reopened store never sees another handle's chunks;
    :meth:`drop_token` drops one handle's chunks. Eviction is least recently used until a
    :meth:`read_ahead` plan says which chunks are needed next (see the module notes).
    """

    def __init__(
        self, budget: int = DEFAULT_CHUNK_CACHE_BYTES, *, page_backed: bool = True
    ) -> None:
        if not isinstance(page_backed, bool):
            raise TypeError(f"page_backed={page_backed!r} must be True or False")
        self._page_backed = page_backed
        # reentrant: a source collected by a garbage collection that runs inside this lock
        # drops its chunks (drop_token) from the same thread, there and then; the pages of
        # a chunk collected inside it come back (_return_pages) under it too
        self._lock = threading.RLock()
        self._entries: dict[Hashable, np.ndarray] = {}
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # kept keys no plan needs
        self._lru_bytes = 0
        self._by_token: dict[Hashable, set[Hashable]] = {}  # token -> keys ``(token, ...)``
        self._plans: dict[object, dict[Hashable, int]] = {}  # ReadAhead id -> key -> distance
        self._open: set[object] = set()  # ids of ReadAheads not closed
        self._updated: dict[object, float] = {}  # plan id -> when it was last updated
        self._next: dict[Hashable, int] = {}  # key -> nearest distance of any plan
        # kept planned keys by distance, and their bytes: every kept key is in exactly one
        # of _lru and these
        self._planned: dict[int, dict[Hashable, None]] = {}
        self._planned_bytes: dict[int, int] = {}
        self._budget = _parse_budget(budget)
        self._bytes = 0
        self._reserved = 0  # leased buffers not yet put
        self._hits = self._misses = self._evictions = self._skipped = 0
        self._seconds = [0.0, 0.0, 0.0]  # read, decode, scatter
        self._decodes = 0
        # keys a thread is decoding now: the event others wait on, made when one first does
        self._loading: dict[Hashable, threading.Event | None] = {}
        self._spare: dict[int, list[_Pages]] = {}
        self._spare_bytes = 0

    @property
    def page_backed(self) -> bool:
        """Whether large kept chunks are copied into pages of their own (see the class notes)."""
        return self._page_backed

    @property
    def spare_bytes(self) -> int:
        """Bytes of free pages (of evicted or dropped chunks) kept for the next chunks.

        They count against the budget with the kept chunks: the next chunk of their size
        is decoded into them instead of fresh memory.
        """
        return self._spare_bytes

    @property
    def budget(self) -> int:
        """The byte budget; assigning a smaller one evicts at once."""
        return self._budget

    @budget.setter
    def budget(self, value: int) -> None:
        budget = _parse_budget(value)
        with self._lock:
            self._budget = budget
            self._trim_spare(max(0, budget - self._bytes))
            self._evict_to(budget)
            self._trim_spare(max(0, budget - self._bytes))

    # -- lookups ------------------------------------------------------------------------
    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached chunk for ``key`` (marked most recently used), or ``None``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self._misses += 1
                return None
            if key in self._lru:
                self._lru.move_to_end(key)
            self._hits += 1
            return found

    def lease(self, key: Hashable, nbytes: int) -> np.ndarray | None:
        """A writable ``uint8`` buffer of ``nbytes`` to decode chunk ``key`` into, if it is kept.

        ``None`` when the cache would not keep the chunk (larger than the budget, the
        cache off, or a read plan needs every kept chunk sooner): decode it elsewhere.
        A large chunk's buffer is in pages of the cache's own, the pages of an evicted chunk
        when one of that size is free (room is made now), and :meth:`put` keeps an array
        decoded into it without a copy; a buffer never put is reused once collected.
        """
        with self._lock:
            if not self._admits(key, nbytes):
                return None
            if not self._page_backed or nbytes < PAGE_BACKED_CHUNK_BYTES:
                return np.empty(nbytes, dtype=np.uint8)
            pages = self._make_room(nbytes, key, take=True)
            if pages is False:
                return None
            self._reserved += nbytes
        try:
            if pages is None:
                pages = _new_pages(nbytes)
            return self._track(pages, reserved=True)
        except BaseException:  # no pages (out of memory, an address-space limit)
            with self._lock:
                self._reserved -= nbytes
            raise

    def put(self, key: Hashable, chunk: np.ndarray, *, borrowed: bool = False) -> np.ndarray:
        """Keep ``chunk`` under ``key`` if it fits; return it (or its copy) read-only.

        ``borrowed``: ``chunk`` views memory its caller reuses (a decode scratch buffer),
        so it is copied if it is kept; if it is not, it is returned as it is (still the
        caller's memory). A chunk in a :meth:`lease` buffer is kept as it is.
        """
        size = chunk.nbytes
        pages = _pages_of(chunk)
        # this cache's pages, all of them (else: another cache's, or part of a buffer: copied)
        own = pages is not None and pages.owner is self and pages.size == size
        if (
            not own
            and not chunk.dtype.hasobject
            and (borrowed or (self._page_backed and size >= PAGE_BACKED_CHUNK_BYTES))
        ):
            buffer = self.lease(key, size)
            if buffer is None:  # not kept
                return self._refused(chunk, borrowed)
            view = buffer.view(chunk.dtype).reshape(chunk.shape)
            view[...] = chunk
            chunk, pages, own = view, _pages_of(view), True
        elif borrowed and self._admits(key, size):
            chunk, borrowed = chunk.copy(), False
        with self._lock:
            if own and pages is not None:
                self._release(pages)
            old = self._entries.pop(key, None)  # replaced: its room is the new chunk's
            if old is not None:
                self._bytes -= old.nbytes
                self._deindex(key, old)
                self._unindex(key)
            if not self._admits(key, size) or self._make_room(size, key, take=False) is False:
                return self._refused(chunk, borrowed and not own)
            chunk.flags.writeable = False
            self._entries[key] = chunk
            self._bytes += size
            self._index(key, chunk)
            token = _token_of(key)
            if token is not None:
                self._by_token.setdefault(token, set()).add(key)
        return chunk

    def _refused(self, chunk: np.ndarray, borrowed: bool = False) -> np.ndarray:
        """``chunk`` not kept (counted as skipped when a plan refused it), read-only unless
        ``borrowed`` (the caller's own buffer, handed back as it is)."""
        if 0 < chunk.nbytes <= self._budget:
            with self._lock:
                self._skipped += 1
        if not borrowed:
            chunk.flags.writeable = False
        return chunk

    def get_or_load(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached chunk for ``key``, or ``load()`` kept for next time.

        ``load`` runs outside the lock, so loads of different chunks run in parallel; two
        threads missing the same key both load it and the second result is kept.
        """
        found = self.get(key)
        if found is not None:
            return found
        return self.put(key, load())

    def add_seconds(self, read: float, decode: float, scatter: float, decodes: int = 0) -> None:
        """Add time spent reading, decoding and scattering chunks, and chunks decoded."""
        with self._lock:
            self._seconds[0] += read
            self._seconds[1] += decode
            self._seconds[2] += scatter
            self._decodes += decodes

    def claim(self, key: Hashable) -> np.ndarray | threading.Event | None:
        """The chunk if cached; else an event set once another thread's load of it ends;
        else ``None``: the caller loads it, and must call :meth:`unclaim` after its put.

        Lets threads reading batches that share chunks decode each chunk once: a thread
        that gets an event reads other chunks first, then waits. Neither a hit nor a miss
        is counted.
        """
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                if key in self._lru:
                    self._lru.move_to_end(key)
                return found
            if key in self._loading:
                loading = self._loading[key]
                if loading is None:  # the first thread to wait for this load makes its event
                    loading = self._loading[key] = threading.Event()
                return loading
            self._loading[key] = None
            return None

    def unclaim(self, key: Hashable) -> None:
        """The load of a :meth:`claim` ``key`` ended (kept or not, or failed)."""
        with self._lock:
            loading = self._loading.pop(key, None)
        if loading is not None:
            loading.set()

    # -- read plans ---------------------------------------------------------------------
    def read_ahead(self) -> ReadAhead:
        """A plan of the chunks the caller's next batches touch (empty until updated)."""
        return ReadAhead(self)

    def _open_plan(self, owner: object) -> None:
        with self._lock:
            self._open.add(owner)

    def _plan(self, owner: object, plan: dict[Hashable, int]) -> None:
        with self._lock:
            if owner not in self._open:
                return  # closed (perhaps while this update was on its way)
            if plan:
                self._plans[owner] = plan
                self._updated[owner] = time.monotonic()
            else:
                self._plans.pop(owner, None)
                self._updated.pop(owner, None)
            self._replan()

    def _lapse(self) -> None:
        """Drop plans not updated for :data:`PLAN_LAPSE_S` (under the lock)."""
        if not self._updated:
            return
        stale = time.monotonic() - PLAN_LAPSE_S
        old = [owner for owner, t in self._updated.items() if t < stale]
        if old:
            for owner in old:
                self._plans.pop(owner, None)
                del self._updated[owner]
            self._replan()

    def _withdraw(self, owner: object) -> None:
        with self._lock:
            self._open.discard(owner)
            self._updated.pop(owner, None)
            if self._plans.pop(owner, None) is not None:
                self._replan()

    def _replan(self) -> None:
        """Recompute every key's nearest planned distance; re-index the kept keys it moves."""
        nearest: dict[Hashable, int] = {}
        for plan in self._plans.values():
            for key, distance in plan.items():
                if nearest.get(key, distance) >= distance:
                    nearest[key] = distance
        old = self._next
        moved = [
            (key, chunk)
            for key in old.keys() | nearest.keys()
            if old.get(key) != nearest.get(key) and (chunk := self._entries.get(key)) is not None
        ]
        for key, chunk in moved:
            self._deindex(key, chunk)
        self._next = nearest
        for key, chunk in moved:  # no longer planned: evictable, as the most recently used
            self._index(key, chunk)

    def _index(self, key: Hashable, chunk: np.ndarray) -> None:
        """File a kept chunk under LRU (unplanned) or its planned distance."""
        distance = self._next.get(key)
        if distance is None:
            self._lru[key] = None
            self._lru_bytes += chunk.nbytes
        else:
            self._planned.setdefault(distance, {})[key] = None
            self._planned_bytes[distance] = self._planned_bytes.get(distance, 0) + chunk.nbytes

    def _deindex(self, key: Hashable, chunk: np.ndarray) -> None:
        """Undo :meth:`_index` (the chunk is already out of ``_entries``)."""
        if self._lru.pop(key, False) is None:
            self._lru_bytes -= chunk.nbytes
            return
        distance = self._next.get(key)
        keys = None if distance is None else self._planned.get(distance)
        if keys is not None and keys.pop(key, False) is None:
            self._planned_bytes[distance] -= chunk.nbytes  # type: ignore[index]
            if not keys:
                del self._planned[distance]  # type: ignore[arg-type]
                del self._planned_bytes[distance]  # type: ignore[arg-type]

    def _admits(self, key: Hashable, size: int) -> bool:
        """Whether a chunk of ``size`` under ``key`` would be kept now."""
        if size > self._budget:
            return False
        self._lapse()
        if key in self._next or not self._next:
            return True
        # an unplanned chunk may only take the room of unplanned ones (and free space)
        return self._bytes - self._lru_bytes + self._reserved + size <= self._budget

    def _make_room(self, size: int, key: Hashable, *, take: bool) -> _Pages | bool | None:
        """Evict until ``size`` more bytes fit; ``False`` if they cannot (what is left is
        planned sooner, or is being decoded into).

        ``take``: return spare pages of ``size`` (taken out of the spare pool) when there
        are, else ``None``.
        """
        found: _Pages | None = None
        distance = self._next.get(key)
        # what no eviction can free: buffers being decoded into, chunks planned as soon
        fixed = self._reserved + sum(
            n for d, n in self._planned_bytes.items() if distance is None or d <= distance
        )
        if fixed + size > self._budget:
            return False  # give up before evicting anything
        while True:
            if take and found is None:
                spare = self._spare.get(size)
                if spare:
                    found = spare.pop()
                    self._spare_bytes -= size
            used = self._bytes + self._reserved + self._spare_bytes
            if used + size <= self._budget:
                return found
            if self._spare_bytes:
                self._drop_spare(None if found is not None or not take else size)
            elif not self._evict_one(distance):
                if found is not None:
                    self._give_back(found)
                return False

    def _evict_one(self, distance: int | None) -> bool:
        """Evict the least recently used unplanned chunk, else the planned one needed last.

        A planned chunk is evicted only for a chunk needed sooner (``distance`` is the new
        chunk's, ``-1`` for any; ``None``: unplanned, which never evicts a planned one).
        """
        if self._lru:
            victim = next(iter(self._lru))
        else:
            farthest = max(self._planned, default=None)
            if farthest is None or distance is None or farthest <= distance:
                return False
            victim = next(iter(self._planned[farthest]))
        # out of _entries first (one step): a source collected meanwhile (drop_token) then
        # skips it; it may also drop the victim before, which is progress too
        dropped = self._entries.pop(victim, None)
        if dropped is None:
            return True
        self._deindex(victim, dropped)
        self._bytes -= dropped.nbytes
        self._evictions += 1
        self._unindex(victim)
        del dropped  # its pages come back now, unless a batch still holds the chunk
        return True

    def _evict_to(self, limit: int) -> None:
        while self._entries and self._bytes > limit:
            self._evict_one(-1)

    def drop_token(self, token: Hashable) -> int:
        """Drop every chunk kept under a key ``(token, ...)``; return how many were dropped.

        Sources call this when they close or are collected: chunks of a store handle that
        is gone can never be asked for again, and would only evict live ones. Dropped
        chunks are not counted as evictions.
        """
        with self._lock:
            keys = self._by_token.pop(token, ())
            dropped = 0
            for key in keys:
                chunk = self._entries.pop(key, None)  # None: being evicted by this thread
                if chunk is not None:
                    self._bytes -= chunk.nbytes
                    self._deindex(key, chunk)
                    dropped += 1
            return dropped

    # -- pages --------------------------------------------------------------------------
    def _track(self, pages: _Pages, *, reserved: bool) -> np.ndarray:
        """A ``uint8`` array over ``pages``; the pages come back once it and its views are gone."""
        buffer = np.ndarray(pages.size, dtype=np.uint8, buffer=pages, offset=PAGE_OFFSET)
        pages.owner, pages.leased = self, reserved
        done = weakref.finalize(buffer, self._return_pages, pages)
        done.atexit = False
        return buffer

    def _release(self, pages: _Pages) -> None:
        """A leased buffer is being put: its reservation ends (under the lock)."""
        if pages.leased:
            pages.leased = False
            self._reserved -= pages.size

    def _return_pages(self, pages: _Pages) -> None:
        """Keep a collected buffer's pages for the next chunk of that size, if there is room."""
        with self._lock:
            self._release(pages)  # leased and never put
            pages.owner = None
            self._give_back(pages)

    def _give_back(self, pages: _Pages) -> None:
        size = pages.size
        used = self._bytes + self._reserved + self._spare_bytes
        if used + size <= self._budget:
            self._spare.setdefault(size, []).append(pages)
            self._spare_bytes += size

    def _drop_spare(self, keep: int | None) -> None:
        """Free one spare page (of another size than ``keep`` when there is one)."""
        sizes = [s for s, spare in self._spare.items() if spare and s != keep] or [
            s for s, spare in self._spare.items() if spare
        ]
        size = sizes[0]
        self._spare[size].pop()
        self._spare_bytes -= size

    def _trim_spare(self, limit: int) -> None:
        """Return spare pages beyond ``limit`` bytes to the system."""
        for size, spare in self._spare.items():
            while spare and self._spare_bytes > limit:
                spare.pop()
                self._spare_bytes -= size

    def _unindex(self, key: Hashable) -> None:
        token = _token_of(key)
        keys = self._by_token.get(token) if token is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_token[token]

    def clear(self, *, keep_pages: bool = False) -> None:
        """Drop every chunk and reset the counters; plans stay.

        ``keep_pages``: keep the dropped chunks' pages (those no batch still holds) as
        free pages for the next chunks, as eviction does in a long run, instead of giving
        them back to the system: what a pass after ``clear`` then costs is a pass of a
        running job, without the fresh memory a new process faults in.
        """
        with self._lock:
            entries, self._entries = self._entries, {}
            self._bytes = 0
            self._lru.clear()
            self._lru_bytes = 0
            self._planned.clear()
            self._planned_bytes.clear()
            self._by_token.clear()
            del entries  # their pages come back here (kept, or dropped just below)
            if not keep_pages:
                self._spare.clear()
                self._spare_bytes = 0
            self._hits = self._misses = self._evictions = self._skipped = 0
            self._seconds = [0.0, 0.0, 0.0]
            self._decodes = 0

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=len(self._entries),
                bytes=self._bytes,
                budget=self._budget,
                skipped=self._skipped,
                decodes=self._decodes,
                read_seconds=self._seconds[0],
                decode_seconds=self._seconds[1],
                scatter_seconds=self._seconds[2],
            )

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"ChunkCache({s.entries} chunks, {s.bytes} of {s.budget} bytes, "
            f"hits={s.hits}, misses={s.misses}, evictions={s.evictions})"
        )


def _pages_of(chunk: np.ndarray) -> _Pages | None:
    """The cache pages ``chunk`` views, or ``None``."""
    base: object = chunk
    while isinstance(base, np.ndarray):
        base = base.base
    return base if type(base) is _Pages else None


def _token_of(key: Hashable) -> Hashable | None:
    """The token of a ``(token, coords)`` key, ``None`` for keys of another form."""
    if type(key) is tuple and len(key) == 2:
        return key[0]  # type: ignore[no-any-return]
    return None


def _parse_budget(value: object) -> int:
    budget = parse_int(value, "budget")
    if budget < 0:
        raise ValueError(f"budget={budget} must be >= 0 bytes (0 disables the cache)")
    return budget
