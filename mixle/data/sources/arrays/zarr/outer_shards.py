"""Bounded decoding of shards compressed as a whole (``sharding_indexed`` then bytes codecs).

A format 3 array whose codecs are ``sharding_indexed`` followed by bytes-to-bytes codecs
(``gzip``, ``zstd``...) stores each chunk as a shard, compressed as one stream. zarr reads
such a shard whole. :class:`OuterShardDecoder` undoes the outer codecs into at most the
bytes a shard can have (its index plus every inner chunk's
:attr:`~mixle.data.sources.arrays.zarr.codecs.ChunkDecoder.stored_limit`; for variable-length
strings or bytes, the vlen cap over all the shard's elements:
:func:`~mixle.data.sources.arrays.zarr.vlen.vlen_shard_limit`), checks the index
(and its crc32c) and decodes each inner chunk with its own bounded decoder. A chunk that
would decode past any of those bounds raises ``ValueError`` (a
:class:`~mixle.reading.CorruptChunkError` from the readers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import (
    ChunkDecoder,
    _decode_step,
    _encoded_size,
    bytes_steps,
    plain_dtype,
    v3_decoder,
)
from mixle.data.sources.arrays.zarr.decompress import StageLimitError
from mixle.data.sources.arrays.zarr.vlen import (
    VlenChunkDecoder,
    VlenLimitError,
    v3_vlen_decoder,
    vlen_shard_limit,
)

__all__ = ["OuterShardDecoder", "outer_shard_decoder", "shard_layout"]

#: Marks an inner chunk never written (both offset and length).
_EMPTY = 2**64 - 1


class OuterShardDecoder:
    """Stored bytes of one shard compressed as a whole to its decoded chunk, bounded.

    Attributes
    ----------
    nbytes
        Bytes of one decoded chunk (the whole shard).
    stored_limit
        The most stored bytes a chunk can have: reads of more are refused unread.
    vlen
        The inner decoder when the elements are variable-length strings or bytes.
    """

    def __init__(
        self,
        codecs: Sequence[Any],
        inner: ChunkDecoder | VlenChunkDecoder,
        shape: tuple[int, ...],
        inner_shape: tuple[int, ...],
        checksum: bool,
        at_end: bool,
        fill: Any,
        dtype: np.dtype,
    ) -> None:
        self._codecs = list(codecs)
        self._inner = inner
        self._shape = shape
        self._inner_shape = inner_shape
        self._per = tuple(s // c for s, c in zip(shape, inner_shape))
        self._checksum = checksum
        self._at_end = at_end
        self._fill = 0 if fill is None else fill
        self._dtype = dtype
        count = math.prod(self._per)
        self._index_bytes = 16 * count + (4 if checksum else 0)
        vlen = isinstance(inner, VlenChunkDecoder)
        self.vlen = inner if vlen else None
        body = vlen_shard_limit(inner, count) if vlen else count * inner.stored_limit
        self._shard_limit = self._index_bytes + body
        self.nbytes = math.prod(shape) * dtype.itemsize
        limits: list[int] = []
        size = self._shard_limit
        for codec in reversed(self._codecs):
            limits.append(size)
            size, _ = _encoded_size(codec, size)
        self._limits = limits[::-1]
        self.stored_limit = size

    def oversized(self, stored: int) -> VlenLimitError | None:
        """For strings, the error for a shard stored in ``stored`` bytes (over the limit)."""
        if self.vlen is None:
            return None
        what = f"a shard of {math.prod(self._per):,} variable-length chunks"
        got = f"it is stored in {stored:,} bytes, more than the {self.stored_limit:,} it may have"
        return VlenLimitError(self.vlen.limit_message(got, what, self._shard_limit))

    def __call__(self, raw: bytes) -> np.ndarray:
        """The chunk ``raw`` decodes to; ``ValueError`` if it is not one shard within bounds."""
        buf: Any = raw
        for codec, limit in zip(self._codecs, self._limits):
            try:
                buf = _decode_step(codec, buf, limit, False)
            except StageLimitError as exc:
                if self.vlen is None:
                    raise
                what = f"a shard of {math.prod(self._per):,} variable-length chunks"
                message = self.vlen.limit_message(str(exc), what, self._shard_limit)
                raise VlenLimitError(message) from None
        data = memoryview(buf).cast("B")
        if len(data) < self._index_bytes:
            raise ValueError(f"the shard has {len(data)} bytes, less than its index")
        cut = len(data) - self._index_bytes if self._at_end else 0
        index = bytes(data[cut : cut + self._index_bytes])
        if self._checksum:
            import google_crc32c

            body, stored = index[:-4], int.from_bytes(index[-4:], "little")
            if google_crc32c.value(body) != stored:
                raise ValueError("the crc32c checksum of the shard index does not match")
            index = body
        entries = np.frombuffer(index, dtype="<u8").reshape(*self._per, 2)
        out = np.full(self._shape, self._fill, dtype=self._dtype)
        for at in np.ndindex(*self._per):
            offset, length = (int(v) for v in entries[at])
            if offset == _EMPTY and length == _EMPTY:
                continue
            fits = offset + length <= len(data)
            if self.vlen is not None and fits and length > self.vlen.stored_limit:
                raise VlenLimitError(f"inner chunk {at}: {self.vlen.oversized(length)}")
            if length > self._inner.stored_limit or not fits:
                raise ValueError(
                    f"the shard index gives inner chunk {at} offset {offset} and length "
                    f"{length}, past the {len(data)} bytes of the shard"
                )
            region = tuple(slice(i * n, (i + 1) * n) for i, n in zip(at, self._inner_shape))
            out[region] = self._inner(bytes(data[offset : offset + length]))
        return out


def outer_shard_decoder(array: Any) -> OuterShardDecoder | None:
    """A decoder for ``array`` if its codecs are a shard then bytes codecs, else ``None``."""
    from zarr.codecs import ShardingCodec

    codecs = list(array.metadata.codecs)
    if len(codecs) < 2 or not isinstance(codecs[0], ShardingCodec):
        return None
    sharding = codecs[0]
    shape = tuple(int(c) for c in array.chunks)
    inner_shape = tuple(int(c) for c in sharding.chunk_shape)
    if len(inner_shape) != len(shape) or any(s % c for s, c in zip(shape, inner_shape)):
        return None
    dtype = np.dtype(array.dtype)
    layout = shard_layout(sharding, dtype, inner_shape)
    outer = bytes_steps(codecs[1:])
    if layout is None or outer is None:
        return None
    inner, checksum, at_end = layout
    fill = array.fill_value
    return OuterShardDecoder(outer[::-1], inner, shape, inner_shape, checksum, at_end, fill, dtype)


def shard_layout(
    sharding: Any, dtype: np.dtype, inner_shape: tuple[int, ...]
) -> tuple[ChunkDecoder | VlenChunkDecoder, bool, bool] | None:
    """``(inner-chunk decoder, crc32c on the index, index at the end)`` of a sharding codec.

    ``None`` when mixle does not read the layout: inner codecs it does not decode, or an
    index other than little-endian ``bytes`` with an optional ``crc32c``.
    """
    from zarr.codecs import BytesCodec, Crc32cCodec

    inner: ChunkDecoder | VlenChunkDecoder | None
    if dtype.kind in "OT":  # variable-length strings or bytes
        inner = v3_vlen_decoder(sharding.codecs, dtype, inner_shape)
    elif plain_dtype(dtype):
        inner = v3_decoder(sharding.codecs, dtype, inner_shape)
    else:
        return None
    index = tuple(sharding.index_codecs)
    if inner is None or not index or not isinstance(index[0], BytesCodec):
        return None
    if index[0].endian is not None and index[0].endian.value != "little":
        return None
    if len(index) > 2 or (len(index) == 2 and not isinstance(index[1], Crc32cCodec)):
        return None
    return inner, len(index) == 2, sharding.index_location.value == "end"
