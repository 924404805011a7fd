"""The chunk reader of a zarr array, plugged into the read planner: mixle's own where it can.

:func:`zarr_chunk_reader` picks the first reader that applies:

- :class:`~mixle.data.sources.arrays.zarr.shards.ShardedZarrReader` for sharded arrays whose
  inner chunks mixle decodes: each shard index read once, nearby inner chunks merged into
  few requests;
- :class:`~mixle.data.sources.arrays.zarr.chunks.ZarrCodecReader` (local stores),
  :class:`~mixle.data.sources.arrays.zarr.chunks.ZipChunkReader` (local zip files) or
  :class:`~mixle.data.sources.arrays.zarr.chunks.ZarrStoreReader` (fsspec URLs, memory,
  icechunk)
  for the layouts :func:`codec_chain` decodes with numcodecs, every stage bounded by the
  chunk's size (:mod:`mixle.data.sources.arrays.zarr.codecs`);
- :class:`~mixle.data.sources.arrays.zarr.pipeline.ZarrPipelineReader` otherwise: zarr's own
  codec pipeline, bounded only after the fact (:mod:`mixle.data.sources.arrays.zarr.limits`).

Every reader answers alike: stored bytes that do not decode to a whole chunk, or a
directory where a chunk's object should be, raise :class:`~mixle.reading.CorruptChunkError`
naming the array and the chunk; a chunk never written reads as the fill value, as zarr
reads it. In a local store a chunk or shard that is a FIFO, a device (a link to
``/dev/zero``) or a socket raises :class:`~mixle.SpecialFileError` before anything is read,
and one larger than its stored form can be
(:attr:`~mixle.data.sources.arrays.zarr.codecs.ChunkDecoder.stored_limit`) raises
:class:`~mixle.reading.CorruptChunkError` unread. Every read from an fsspec store or through
obstore is checked and retried (:mod:`mixle.data.sources.arrays.zarr.stores`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.chunks import (
    Decoder,
    ZarrCodecReader,
    ZarrStoreReader,
    ZipChunkReader,
)
from mixle.data.sources.arrays.zarr.codecs import numcodecs_decoder, plain_dtype, v3_decoder
from mixle.data.sources.arrays.zarr.outer_shards import outer_shard_decoder
from mixle.data.sources.arrays.zarr.pipeline import ZarrPipelineReader
from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader
from mixle.data.sources.arrays.zarr.vlen import vlen_decoder

__all__ = ["codec_chain", "zarr_chunk_reader"]


def zarr_chunk_reader(
    array: Any, where: str = "", url: str = "", secrets: Any = None
) -> ZarrCodecReader | ZarrPipelineReader | Any:
    """The fastest chunk reader for ``array``: direct numcodecs decoding when it applies.

    ``where``/``url`` name the array in errors; ``secrets`` are masked in them.
    """
    from zarr.storage import LocalStore, ZipStore

    if getattr(array, "shards", None) is not None:
        sharded = ShardedZarrReader.for_array(array, where, url, secrets)
        return ZarrPipelineReader(array, where, url, secrets) if sharded is None else sharded
    decode = codec_chain(array)
    if decode is None:
        return ZarrPipelineReader(array, where, url, secrets)
    if isinstance(array.store, LocalStore):
        return ZarrCodecReader(array, decode, where)
    if isinstance(array.store, ZipStore) and array.store.read_only:
        return ZipChunkReader(array, decode, where)
    return ZarrStoreReader(array, decode, where, url, secrets)


def codec_chain(array: Any) -> Decoder | None:
    """A ``bytes -> chunk`` decoder for ``array``'s codecs, or ``None`` if mixle lacks one."""
    meta = array.metadata
    dtype = np.dtype(array.dtype)
    if dtype.kind in "OT":  # variable-length strings or bytes, in chunks or whole shards
        return vlen_decoder(array) or (
            None if meta.zarr_format == 2 else outer_shard_decoder(array)
        )
    if not plain_dtype(dtype) or getattr(array, "shards", None) is not None:
        return None
    chunks = tuple(array.chunks)
    if meta.zarr_format == 2:
        stored = meta.dtype.to_native_dtype()
        compressor = meta.compressor
        filters = list(meta.filters or ())
        return numcodecs_decoder(compressor, filters, stored, chunks, meta.order)
    return v3_decoder(meta.codecs, dtype, chunks) or outer_shard_decoder(array)
