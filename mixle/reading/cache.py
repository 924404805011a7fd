"""A byte-budgeted LRU cache of decoded chunks, shared by every source in a process.

Decoding, not disk, is what random patches cost: a 32³ patch from 64³ zstd chunks decodes
about 3.4 chunks. The cache keeps decoded chunks under a byte budget so that chunks shared
by patches of consecutive batches are decoded once. It is a policy over whatever fetches
and decodes the chunk; it never does I/O itself.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_CHUNK_CACHE_BYTES",
    "CacheStats",
    "ChunkCache",
    "chunk_cache",
    "drop_cached_chunks",
    "drop_chunks_when_collected",
    "set_chunk_cache_bytes",
]

#: Default budget of the process-wide decoded-chunk cache: 256 decoded 1 MiB chunks
#: (64³ float32), a few batches of random 32³ patches, small next to a training host's RAM.
DEFAULT_CHUNK_CACHE_BYTES = 256 * 1024 * 1024


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

    Notes
    -----
    Thread-safe. Cached arrays are read-only; a chunk larger than the budget is returned
    but not kept. Keys are ``(reader token, chunk coordinates)``: tokens are unique per
    open store handle, so a reopened store never sees another handle's chunks.
    """

    def __init__(self, budget: int = DEFAULT_CHUNK_CACHE_BYTES) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._by_token: dict[Hashable, set[Hashable]] = {}  # token -> keys ``(token, ...)``
        self._budget = _parse_budget(budget)
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0

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
        """Keep ``chunk`` under ``key`` if it fits the budget; return it read-only."""
        chunk.flags.writeable = False
        size = chunk.nbytes
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
            for key in keys:
                self._bytes -= self._entries.pop(key).nbytes
            return len(keys)

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
        """Drop every chunk and reset the counters."""
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


_cache = ChunkCache()


def chunk_cache() -> ChunkCache:
    """The process-wide decoded-chunk cache that every source reads through.

    Read its counters with ``chunk_cache().stats()``; empty it with ``.clear()``. A forked
    child starts with an empty cache of the same budget.
    """
    return _cache


def set_chunk_cache_bytes(budget: int) -> None:
    """Set the process-wide cache budget in bytes (``0`` disables caching)."""
    _cache.budget = budget


def drop_cached_chunks(token: Hashable) -> None:
    """Drop the chunks of store handle ``token`` from this process's cache (see ``drop_token``)."""
    _cache.drop_token(token)


def drop_chunks_when_collected(reader: object) -> None:
    """Drop a chunk reader's chunks from the process-wide cache once it is garbage.

    ``reader`` is anything with a ``token`` (a :class:`~mixle.reading.ChunkReader`). The
    chunks go when the last reference to the reader goes, so a read still in flight (which
    holds the reader) cannot leave chunks behind. In a forked child the child's own cache is
    the one cleaned.
    """
    done = weakref.finalize(reader, drop_cached_chunks, reader.token)  # type: ignore[attr-defined]
    done.atexit = False  # nothing to clean at exit: the cache goes with the process


def _reset_after_fork() -> None:
    global _cache
    _cache = ChunkCache(_cache.budget)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
