"""Bounds on zarr's own codec pipeline, for the layouts mixle leaves to it.

:class:`~mixle.data.sources.arrays.zarr.pipeline.ZarrPipelineReader` hands a chunk to zarr-python
when mixle has no bounded decoder for its codecs: a codec mixle does not know (a numcodecs
array-to-bytes codec such as ``pcodec`` or ``zfpy``, an array-to-array codec whose dtypes
do not match), a shard behind other codecs (``transpose`` then ``sharding_indexed``), a
shard index mixle does not read (big-endian, compressed), ``VLenArray``. (A shard followed
by bytes-to-bytes codecs is decoded by mixle, bounded:
:mod:`mixle.data.sources.arrays.zarr.outer_shards`.) What mixle bounds there, after the fact:

- **stored bytes**: one stored object (a chunk, or a whole shard) may have at most
  :func:`pipeline_stored_limit` bytes:
  :data:`~mixle.data.sources.arrays.zarr.codecs.UNKNOWN_CODEC_FACTOR` times its decoded
  size plus slack (no sane codec stores more than that). A local file
  larger than that is refused (by ``stat``, before zarr reads it); a remote download
  (HTTP, S3, any async fsspec store) is refused by its ``Content-Length``, or once its body
  passes the limit. Both raise :class:`~mixle.reading.CorruptChunkError` naming the key.
- **decoded shape**: the region zarr returns must have the shape and dtype asked;
  anything else raises :class:`~mixle.reading.CorruptChunkError`, never a reshaped value.

Not bounded there: the memory zarr's codecs use while decoding. A decompression bomb that
fits in the stored limit (a small gzip stream inflating to gigabytes) is inflated by zarr
in full before its size can be checked. Memory and zip stores are not capped (their
objects are in memory or read by the store itself).
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import COMPRESSED_SLACK_BYTES, UNKNOWN_CODEC_FACTOR
from mixle.data.sources.arrays.zarr.vlen import vlen_stage_limit
from mixle.reading import CorruptChunkError

__all__ = ["ZARR_METADATA_LIMIT", "check_region", "pipeline_stored_limit", "refuse_oversized"]

#: Bytes of one zarr metadata document mixle lets zarr fetch and parse.
ZARR_METADATA_LIMIT = 16 * 1024 * 1024

#: Bytes of one shard index entry (offset and length, ``uint64`` each).
_INDEX_ENTRY_BYTES = 16


def pipeline_stored_limit(array: Any) -> int:
    """The most bytes one stored object of ``array`` may have on zarr's pipeline path.

    The object's decoded size (a chunk, or every inner chunk of a shard; for
    variable-length strings :func:`~mixle.data.sources.arrays.zarr.vlen.vlen_stage_limit` per
    chunk) times :data:`~mixle.data.sources.arrays.zarr.codecs.UNKNOWN_CODEC_FACTOR`, plus
    :data:`~mixle.data.sources.arrays.zarr.codecs.COMPRESSED_SLACK_BYTES` and, for a shard, its
    index.
    """
    chunks = tuple(int(c) for c in array.chunks)
    shards = getattr(array, "shards", None)
    per_object = 1 if shards is None else math.prod(s // c for s, c in zip(shards, chunks))
    dtype = np.dtype(array.dtype)
    count = math.prod(chunks)
    vlen = dtype.kind in "OT"
    decoded = vlen_stage_limit(count) if vlen else count * (dtype.itemsize or 8)
    index = 0 if shards is None else _INDEX_ENTRY_BYTES * per_object + 4
    return per_object * decoded * UNKNOWN_CODEC_FACTOR + COMPRESSED_SLACK_BYTES + index


def refuse_oversized(base: str, key: str, where: str, coords: tuple[int, ...], limit: int) -> None:
    """Refuse the local file of stored key ``key`` under ``base`` if it has over ``limit`` bytes.

    Raises
    ------
    CorruptChunkError
        Naming the key, the array, the file's size and the limit; found by ``stat``,
        before anything is read. A missing file (a chunk never written) passes.
    """
    path = os.path.join(base, *key.split("/"))
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISREG(info.st_mode) and info.st_size > limit:
        raise CorruptChunkError(
            f"stored object {key!r} of zarr array {where} (chunk grid coordinates {coords}) "
            f"is corrupt: its file {path!r} has {info.st_size:,} bytes, more than the "
            f"{limit:,} a stored object of this array can have (refused unread)"
        )


def check_region(
    out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, key: str, where: str
) -> np.ndarray:
    """``out`` if zarr decoded the region asked (``shape``, ``dtype`` in any byte order).

    Raises
    ------
    CorruptChunkError
        When zarr returned another shape or dtype (never reshaped or cast here).
    """
    if out.shape != shape or not np.can_cast(out.dtype, dtype, "equiv"):  # byte order aside
        raise CorruptChunkError(
            f"chunk {key!r} of zarr array {where} is corrupt: zarr decoded it to shape "
            f"{out.shape} and dtype {out.dtype}, the region asked has {shape} and {dtype}"
        )
    return out
