"""Bounded decoding of variable-length string and bytes chunks (``vlen-utf8``, ``vlen-bytes``).

A vlen chunk is stored as a 4-byte little-endian item count, then per item a 4-byte length
and its bytes, usually under a compressor. Its decoded size is not fixed by the array's
metadata, so :class:`VlenChunkDecoder` caps the bytes the compressor (and every other
bytes-to-bytes stage) may produce at :func:`vlen_stage_limit`: ``VLEN_BYTES_PER_ELEMENT``
bytes per element on average plus ``VLEN_SLACK_BYTES``. A chunk that would decode to more
(a decompression bomb, or strings longer on average than that) raises ``ValueError``, which
the readers raise as :class:`~mixle.reading.CorruptChunkError` naming the chunk. The item
count is checked against the chunk's element count before anything is allocated for it,
and every item length against the bytes left, so the decoded strings take no more than the
capped buffer.

Layouts: format 2 with a ``VLenUTF8`` or ``VLenBytes`` filter (the first one; any filters
after it and the compressor are bytes-to-bytes), format 3 with ``vlen-utf8`` or
``vlen-bytes`` then bytes-to-bytes codecs, sharded or not (the inner chunks of a shard).
``VLenArray`` (arrays of arrays) is left to zarr's pipeline. Values equal zarr-python's
read: strings as the array's native string dtype, bytes as ``object``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import _decode_step, _encoded_size, bytes_steps

__all__ = [
    "VLEN_BYTES_PER_ELEMENT",
    "VLEN_SLACK_BYTES",
    "VlenChunkDecoder",
    "vlen_decoder",
    "v3_vlen_decoder",
    "vlen_stage_limit",
]

#: Average stored bytes per element (length prefix excluded) a vlen chunk may decode to.
VLEN_BYTES_PER_ELEMENT = 4096
#: Bytes a vlen chunk may decode to beyond ``VLEN_BYTES_PER_ELEMENT`` per element.
VLEN_SLACK_BYTES = 1024 * 1024
#: numcodecs ids of the vlen codecs mixle decodes.
_VLEN_IDS = frozenset({"vlen-utf8", "vlen-bytes"})


def vlen_stage_limit(count: int) -> int:
    """The most bytes a vlen chunk of ``count`` elements may decode to before its items."""
    return 4 + count * (4 + VLEN_BYTES_PER_ELEMENT) + VLEN_SLACK_BYTES


class VlenChunkDecoder:
    """Stored bytes to one vlen chunk: bytes-to-bytes stages capped, then the items.

    Parameters
    ----------
    codecs
        numcodecs bytes-to-bytes codecs in the order they are undone.
    utf8
        Whether the items are UTF-8 strings (else raw bytes).
    shape
        The chunk's shape.
    dtype
        The dtype of the decoded chunk (the array's native dtype).

    Attributes
    ----------
    nbytes
        The most bytes the item stream of one chunk may have (:func:`vlen_stage_limit`).
    stored_limit
        The most stored bytes a chunk can have: reads of more are refused unread.
    """

    def __init__(
        self, codecs: Sequence[Any], utf8: bool, shape: tuple[int, ...], dtype: np.dtype
    ) -> None:
        import numcodecs

        self._codecs = list(codecs)
        self._item = numcodecs.VLenUTF8() if utf8 else numcodecs.VLenBytes()
        self._shape = shape
        self._dtype = dtype
        self._count = math.prod(shape)
        self.nbytes = vlen_stage_limit(self._count)
        limits: list[int] = []
        size = self.nbytes
        for codec in reversed(self._codecs):
            limits.append(size)
            size, _ = _encoded_size(codec, size)
        self._limits = limits[::-1]
        self.stored_limit = size

    def __call__(self, raw: bytes) -> np.ndarray:
        """The chunk ``raw`` decodes to; ``ValueError`` if it is not one chunk within bounds."""
        buf: Any = raw
        for codec, limit in zip(self._codecs, self._limits):
            try:
                buf = _decode_step(codec, buf, limit, False)
            except ValueError as exc:
                raise ValueError(
                    f"{exc} (a vlen chunk of {self._count} elements may decode to at most "
                    f"{self.nbytes:,} bytes: mixle.data.sources.arrays.zarr.vlen."
                    "VLEN_BYTES_PER_ELEMENT per element)"
                ) from None
        data = memoryview(buf).cast("B")
        if len(data) < 4:
            raise ValueError(f"a vlen chunk has {len(data)} bytes, no item count")
        count = int.from_bytes(data[:4], "little")
        if count != self._count:
            raise ValueError(f"the vlen header says {count} items, a chunk has {self._count}")
        items = np.asarray(self._item.decode(data))
        if items.size != self._count:
            raise ValueError(f"decoded {items.size} vlen items, a chunk has {self._count}")
        return items.reshape(self._shape).astype(self._dtype, copy=False)


def vlen_decoder(array: Any) -> VlenChunkDecoder | None:
    """A decoder for ``array``'s vlen string/bytes layout, or ``None`` if it is not one."""
    meta = array.metadata
    if getattr(array, "shards", None) is not None:
        return None
    dtype = np.dtype(array.dtype)
    chunks = tuple(array.chunks)
    if meta.zarr_format == 2:
        filters = list(meta.filters or ())
        if not filters or getattr(filters[0], "codec_id", None) not in _VLEN_IDS:
            return None
        rest = filters[1:]
        if any(getattr(f, "codec_id", None) in _VLEN_IDS for f in rest):
            return None
        codecs = ([] if meta.compressor is None else [meta.compressor]) + rest[::-1]
        return VlenChunkDecoder(codecs, filters[0].codec_id == "vlen-utf8", chunks, dtype)
    return v3_vlen_decoder(meta.codecs, dtype, chunks)


def v3_vlen_decoder(
    codecs: Sequence[Any], dtype: np.dtype, chunks: tuple[int, ...]
) -> VlenChunkDecoder | None:
    """A decoder for a format 3 codec list ``vlen-utf8``/``vlen-bytes`` then bytes codecs.

    ``None`` for any other codec list (the inner codecs of a shard count as one).
    """
    from zarr.codecs import VLenBytesCodec, VLenUTF8Codec

    codecs = list(codecs)
    if not codecs or not isinstance(codecs[0], (VLenUTF8Codec, VLenBytesCodec)):
        return None
    steps = bytes_steps(codecs[1:])
    if steps is None:
        return None
    return VlenChunkDecoder(steps[::-1], isinstance(codecs[0], VLenUTF8Codec), chunks, dtype)
