"""The read layer: plan batches of boxes by chunk, decode each chunk once, in parallel.

Storage adapters plug in a :class:`ChunkReader`; sources call :func:`read_chunked` (chunked
stores) or :func:`read_strided` (memory maps). Decoded chunks live in one process-wide,
byte-budgeted cache (:func:`chunk_cache`, its default budget shared among DataLoader
workers); decoding runs on one process-wide thread pool
(:func:`set_decode_threads`).
"""

from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES, CacheStats, ChunkCache, ReadAhead
from mixle.reading.cached_fetch import DISK_CACHE_ENV, chunk_disk_cache, use_disk_cache
from mixle.reading.disk_cache import ChunkDiskCache, ContentKey
from mixle.reading.executor import (
    ChunkReader,
    SupportsDecodeInto,
    SupportsFetchMany,
    new_token,
    read_chunked,
    read_strided,
)
from mixle.reading.faults import (
    CorruptChunkError,
    RangeMismatchError,
    RemoteReadError,
    RemoteTimeoutError,
)
from mixle.reading.plan import ChunkPlan, order_by_offset, plan_chunks, touched_chunks
from mixle.reading.policy import (
    DEFAULT_BATCH_DEADLINE,
    DEFAULT_REQUEST_TIMEOUT,
    RetryPolicy,
    retry_policy,
    set_retry_policy,
)
from mixle.reading.pool import decode_threads, default_decode_threads, set_decode_threads
from mixle.reading.process_cache import (
    MIN_WORKER_CHUNK_CACHE_BYTES,
    chunk_cache,
    default_chunk_cache_bytes,
    set_chunk_cache_bytes,
)

__all__ = [
    "DEFAULT_BATCH_DEADLINE",
    "DEFAULT_CHUNK_CACHE_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DISK_CACHE_ENV",
    "MIN_WORKER_CHUNK_CACHE_BYTES",
    "CacheStats",
    "ChunkCache",
    "ChunkDiskCache",
    "ChunkPlan",
    "ChunkReader",
    "ContentKey",
    "CorruptChunkError",
    "RangeMismatchError",
    "ReadAhead",
    "RemoteReadError",
    "RemoteTimeoutError",
    "RetryPolicy",
    "SupportsDecodeInto",
    "SupportsFetchMany",
    "chunk_cache",
    "decode_threads",
    "default_chunk_cache_bytes",
    "chunk_disk_cache",
    "default_decode_threads",
    "new_token",
    "order_by_offset",
    "plan_chunks",
    "read_chunked",
    "read_strided",
    "retry_policy",
    "set_chunk_cache_bytes",
    "set_decode_threads",
    "set_retry_policy",
    "touched_chunks",
    "use_disk_cache",
]
