"""The one decoded-chunk cache of this process, and the rule that sets its budget.

Every source reads through :func:`chunk_cache`. Its default budget is one job's
(:data:`~mixle.reading.cache.DEFAULT_CHUNK_CACHE_BYTES`), shared out among the worker
processes of a torch ``DataLoader`` and of an ``MPEncodedData``
(:func:`share_default_chunk_cache`): each gets :func:`default_chunk_cache_bytes`, at least
:data:`MIN_WORKER_CHUNK_CACHE_BYTES`. A budget set with :func:`set_chunk_cache_bytes` wins.
A forked child starts with an empty cache; a chunk reader's chunks go when it is collected
(:func:`drop_chunks_when_collected`).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Hashable

from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES, ChunkCache
from mixle.utils.validation import parse_int

__all__ = [
    "MIN_WORKER_CHUNK_CACHE_BYTES",
    "chunk_cache",
    "default_chunk_cache_bytes",
    "drop_cached_chunks",
    "drop_chunks_when_collected",
    "set_chunk_cache_bytes",
    "share_default_chunk_cache",
    "user_chunk_cache_bytes",
]

#: The smallest default budget of one worker process, however many workers there are.
MIN_WORKER_CHUNK_CACHE_BYTES = 32 * 1024 * 1024


def default_chunk_cache_bytes() -> int:
    """The budget the process-wide cache has until :func:`set_chunk_cache_bytes` sets one.

    :data:`DEFAULT_CHUNK_CACHE_BYTES` is one job's budget. In a worker process of a torch
    ``DataLoader`` with ``num_workers=N``, or of an ``MPEncodedData`` with N workers
    (:func:`share_default_chunk_cache`), it is split: ``DEFAULT_CHUNK_CACHE_BYTES // N``,
    at least :data:`MIN_WORKER_CHUNK_CACHE_BYTES`, so that N workers together hold about
    what one process would. A DataLoader worker is recognised by the worker information
    torch sets in the worker (``torch.utils.data.get_worker_info()``), read without
    importing torch.
    """
    sharing = _sharing()
    if sharing <= 1:
        return DEFAULT_CHUNK_CACHE_BYTES
    return max(MIN_WORKER_CHUNK_CACHE_BYTES, DEFAULT_CHUNK_CACHE_BYTES // sharing)


def _dataloader_workers() -> int:
    """``num_workers`` of the torch DataLoader this process is a worker of, else 0."""
    worker = sys.modules.get("torch.utils.data._utils.worker")  # imported only by torch
    info = getattr(worker, "_worker_info", None)
    workers = getattr(info, "num_workers", 0)
    return workers if isinstance(workers, int) else 0


def _sharing() -> int:
    """How many processes share one job's default budget with this one (1: none)."""
    return max(1, _dataloader_workers()) * _pool_workers


_pool_workers = 1  # workers of the MPEncodedData this process is one of (1: none)
_cache = ChunkCache(default_chunk_cache_bytes())
_user_budget: int | None = None  # what set_chunk_cache_bytes set; None: the default rule
_default_for = _sharing()  # the number of sharers the default budget was made for


def chunk_cache() -> ChunkCache:
    """The process-wide decoded-chunk cache that every source reads through.

    Read its counters with ``chunk_cache().stats()``; empty it with ``.clear()``. A forked
    child starts with an empty cache of the same budget; until a budget is set with
    :func:`set_chunk_cache_bytes`, a DataLoader or ``MPEncodedData`` worker's is its share
    of the default (:func:`default_chunk_cache_bytes`).
    """
    global _default_for
    if _user_budget is None:
        sharing = _sharing()
        if sharing != _default_for:  # this process became a DataLoader worker
            _default_for = sharing
            _cache.budget = default_chunk_cache_bytes()
    return _cache


def set_chunk_cache_bytes(budget: int | None) -> None:
    """Set the process-wide cache budget in bytes (``0`` disables caching).

    ``None`` restores the default rule (:func:`default_chunk_cache_bytes`). A budget set
    here holds in this process and in processes forked from it, DataLoader workers
    included, and in the workers an ``MPEncodedData`` starts later (any start method).
    """
    global _user_budget, _default_for
    if budget is None:
        _user_budget, _default_for = None, _sharing()
        _cache.budget = default_chunk_cache_bytes()
        return
    _cache.budget = budget
    _user_budget = _cache.budget


def user_chunk_cache_bytes() -> int | None:
    """The budget :func:`set_chunk_cache_bytes` set in this process; ``None``: the default rule."""
    return _user_budget


def share_default_chunk_cache(workers: int) -> None:
    """Make this process one of ``workers`` worker processes that share one job's default.

    Worker pools call this in each worker they start (``MPEncodedData`` does): the default
    budget becomes this process's share (:func:`default_chunk_cache_bytes`). A budget set
    with :func:`set_chunk_cache_bytes` still wins. ``workers=1`` ends the sharing.

    Raises
    ------
    TypeError, ValueError
        ``workers`` is not an integer >= 1.
    """
    global _pool_workers, _default_for
    count = parse_int(workers, "workers")
    if count < 1:
        raise ValueError(f"workers={count} must be >= 1")
    _pool_workers = count
    if _user_budget is None:
        _default_for = _sharing()
        _cache.budget = default_chunk_cache_bytes()


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
    try:
        done = weakref.finalize(reader, drop_cached_chunks, reader.token)  # type: ignore[attr-defined]
    except TypeError:  # a reader with __slots__ and no __weakref__: dropped on close() only
        return
    done.atexit = False  # nothing to clean at exit: the cache goes with the process


def _reset_after_fork() -> None:
    global _cache
    _cache = ChunkCache(_cache.budget)  # the default rule is applied again on first use


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
