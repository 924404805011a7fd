"""A byte-budgeted LRU cache of decoded chunks (:class:`ChunkCache`).

Decoding, not disk, is what random patches cost: a 32³ patch from 64³ zstd chunks decodes
about 3.4 chunks. The cache keeps decoded chunks under a byte budget so that chunks shared
by patches of consecutive batches are decoded once. It is a policy over whatever fetches
and decodes the chunk; it never does I/O itself. The one cache every source of a process
reads through, and its budget, are :mod:`mixle.reading.process_cache`'s.

Memory. Kept chunks of :data:`PAGE_BACKED_CHUNK_BYTES` or more are copied into pages of
their own (an anonymous ``mmap``) and the decoder's buffer is freed at once: long-lived
chunks then never pin the malloc heaps of the decode threads, whose free space glibc does
not give back (16 decode threads held 2x the budget that way), and an evicted chunk's pages
go back to the system, or to the next chunk of the same size. The default budget is one
job's (:func:`~mixle.reading.process_cache.default_chunk_cache_bytes`): a torch DataLoader
worker, and an ``MPEncodedData`` worker
(:func:`~mixle.reading.process_cache.share_default_chunk_cache`), gets its share.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_CHUNK_CACHE_BYTES",
    "PAGE_BACKED_CHUNK_BYTES",
    "RECYCLED_PAGES_BYTES",
    "RECYCLED_PAGES_FRACTION",
    "CacheStats",
    "ChunkCache",
]

#: Default budget of the decoded-chunk cache of one job: 256 decoded 1 MiB chunks (64³
#: float32), a few batches of random 32³ patches, small next to a training host's RAM.
#: Worker processes of a torch DataLoader share it
#: (:func:`~mixle.reading.process_cache.default_chunk_cache_bytes`).
DEFAULT_CHUNK_CACHE_BYTES = 256 * 1024 * 1024
#: Kept chunks at least this large live in pages of their own rather than the malloc heap.
PAGE_BACKED_CHUNK_BYTES = 64 * 1024
#: Pages of evicted chunks kept for reuse by the next chunks of the same size, at most.
RECYCLED_PAGES_BYTES = 16 * 1024 * 1024
#: ... and at most this fraction of the budget (``budget // 8``): spare pages are resident
#: memory the budget does not count, so a small budget (a DataLoader worker's) keeps few.
RECYCLED_PAGES_FRACTION = 8

_PAGE_FLAGS = (
    {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)}
    if hasattr(mmap, "MAP_ANONYMOUS")
    else {}
)


class _Pages(mmap.mmap):
    """Anonymous pages holding one cached chunk (the type marks the cache's own buffers)."""


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`ChunkCache` since it was created or last cleared."""

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    budget: int

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, 0.0 before any lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class ChunkCache:
    """Least-recently-used decoded chunks, at most ``budget`` bytes in all.

    Parameters
    ----------
    budget
        Byte budget; ``0`` disables caching (every lookup misses and nothing is kept).
    page_backed
        Copy kept chunks of :data:`PAGE_BACKED_CHUNK_BYTES` or more into pages of their own
        (the default; see the module notes). ``False`` keeps the decoder's array as it is:
        a put costs no copy (about 13 us per 128 KiB chunk with spare pages, 45 us with
        fresh ones), but with several decode threads their malloc heaps keep what evicted
        chunks freed (up to 2x the budget with 16 threads).

    Notes
    -----
    Thread-safe. Cached arrays are read-only; a chunk larger than the budget is returned
    but not kept. A kept chunk of :data:`PAGE_BACKED_CHUNK_BYTES` or more is returned as a
    read-only copy in pages of its own (see the module notes). Keys are ``(reader token,
    chunk coordinates)``: tokens are unique per open store handle, so a reopened store never
    sees another handle's chunks; :meth:`drop_token` drops one handle's chunks.
    """

    def __init__(
        self, budget: int = DEFAULT_CHUNK_CACHE_BYTES, *, page_backed: bool = True
    ) -> None:
        if not isinstance(page_backed, bool):
            raise TypeError(f"page_backed={page_backed!r} must be True or False")
        self._page_backed = page_backed
        # reentrant: a source collected by a garbage collection that runs inside this lock
        # drops its chunks (drop_token) from the same thread, there and then
        self._lock = threading.RLock()
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._by_token: dict[Hashable, set[Hashable]] = {}  # token -> keys ``(token, ...)``
        self._budget = _parse_budget(budget)
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        # pages of collected chunks, by size, under their own lock: a chunk's last reference
        # may go (and _return_pages run) anywhere, also while self._lock is held, or in a
        # garbage collection inside this lock (so it is reentrant)
        self._spare_lock = threading.RLock()
        self._spare: dict[int, list[_Pages]] = {}
        self._spare_bytes = 0

    @property
    def page_backed(self) -> bool:
        """Whether large kept chunks are copied into pages of their own (see the class notes)."""
        return self._page_backed

    @property
    def spare_bytes(self) -> int:
        """Bytes of evicted chunks' pages kept for reuse (at most :meth:`spare_limit`)."""
        return self._spare_bytes

    def spare_limit(self) -> int:
        """Most bytes of spare pages kept: ``min(RECYCLED_PAGES_BYTES, budget // 8)``."""
        return min(RECYCLED_PAGES_BYTES, self._budget // RECYCLED_PAGES_FRACTION)

    @property
    def budget(self) -> int:
        """The byte budget; assigning a smaller one evicts at once."""
        return self._budget

    @budget.setter
    def budget(self, value: int) -> None:
        budget = _parse_budget(value)
        with self._lock:
            self._budget = budget
            self._evict_to(budget)
        self._trim_spare()

    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached chunk for ``key`` (marked most recently used), or ``None``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return found

    def put(self, key: Hashable, chunk: np.ndarray) -> np.ndarray:
        """Keep ``chunk`` under ``key`` if it fits the budget; return it (or its copy) read-only."""
        size = chunk.nbytes
        if size > self._budget:
            chunk.flags.writeable = False
            return chunk
        if self._page_backed:
            chunk = self._own_pages(chunk)
        chunk.flags.writeable = False
        with self._lock:
            if size > self._budget:
                return chunk
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._evict_to(self._budget - size)
            self._entries[key] = chunk
            self._bytes += size
            token = _token_of(key)
            if token is not None:
                self._by_token.setdefault(token, set()).add(key)
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
                    dropped += 1
            return dropped

    def _own_pages(self, chunk: np.ndarray) -> np.ndarray:
        """``chunk`` copied into pages of its own (spare ones when there are), if it is large."""
        size = chunk.nbytes
        if size < PAGE_BACKED_CHUNK_BYTES or chunk.dtype.hasobject or type(chunk.base) is _Pages:
            return chunk
        with self._spare_lock:
            spare = self._spare.get(size)
            pages = spare.pop() if spare else None
            if pages is not None:
                self._spare_bytes -= size
        if pages is None:
            pages = _Pages(-1, size, **_PAGE_FLAGS)
        copy = np.ndarray(chunk.shape, chunk.dtype, buffer=pages)
        copy[...] = chunk
        # the pages are reused only once the copy, and every view of it, is garbage
        done = weakref.finalize(copy, self._return_pages, pages)
        done.atexit = False
        return copy

    def _return_pages(self, pages: _Pages) -> None:
        """Keep the pages of a collected chunk for the next chunk of that size, if there is room."""
        size = len(pages)
        with self._spare_lock:
            if self._spare_bytes + size <= self.spare_limit():
                self._spare.setdefault(size, []).append(pages)
                self._spare_bytes += size

    def _trim_spare(self) -> None:
        """Return spare pages beyond :meth:`spare_limit` to the system (after a smaller budget)."""
        with self._spare_lock:
            limit = self.spare_limit()
            for size, spare in self._spare.items():
                while spare and self._spare_bytes > limit:
                    spare.pop()
                    self._spare_bytes -= size

    def _evict_to(self, limit: int) -> None:
        while self._entries and self._bytes > limit:
            key, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes
            self._evictions += 1
            self._unindex(key)

    def _unindex(self, key: Hashable) -> None:
        token = _token_of(key)
        keys = self._by_token.get(token) if token is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_token[token]

    def clear(self) -> None:
        """Drop every chunk (and the spare pages) and reset the counters."""
        with self._spare_lock:
            self._spare.clear()
            self._spare_bytes = 0
        with self._lock:
            self._entries.clear()
            self._by_token.clear()
            self._bytes = 0
            self._hits = self._misses = self._evictions = 0

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
            )

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"ChunkCache({s.entries} chunks, {s.bytes} of {s.budget} bytes, "
            f"hits={s.hits}, misses={s.misses}, evictions={s.evictions})"
        )


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
