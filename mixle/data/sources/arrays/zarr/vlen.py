"""Bounded decoding of variable-length string and bytes chunks (``vlen-utf8``, ``vlen-bytes``).

A vlen chunk is stored as a 4-byte little-endian item count, then per item a 4-byte length
and its bytes, usually under a compressor. Its decoded size is not fixed by the array's
metadata, so :class:`VlenChunkDecoder` caps the bytes the compressor (and every other
bytes-to-bytes stage) may produce at :func:`vlen_stage_limit`: ``VLEN_BYTES_PER_ELEMENT``
bytes per element on average plus ``VLEN_SLACK_BYTES``. A chunk that would decode to more
(a decompression bomb, or valid strings longer on average than that) raises
:class:`VlenLimitError`, whose message gives both sizes and names
:func:`set_vlen_limit`, the setting that raises the cap. The setting is read when an
array's chunk reader is built: at a source's first read in a process (each worker process
reads its own). The item count is checked against the chunk's element count before anything
is allocated for it, and every item length against the bytes left, so the decoded strings
take no more than the capped buffer.

Layouts: format 2 with a ``VLenUTF8`` or ``VLenBytes`` filter (the first one; any filters
after it and the compressor are bytes-to-bytes), in C or F order; format 3 with
``transpose`` codecs, then ``vlen-utf8`` or ``vlen-bytes``, then bytes-to-bytes codecs,
sharded or not (the inner chunks of a shard, and shards compressed as a whole:
:mod:`mixle.data.sources.arrays.zarr.outer_shards`). ``VLenArray`` (arrays of arrays) is left
to zarr's pipeline. Values equal zarr-python's read: strings as the array's native string
dtype, bytes as ``object``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import _decode_step, _encoded_size, bytes_steps
from mixle.data.sources.arrays.zarr.decompress import StageLimitError
from mixle.errors import VlenLimitError

__all__ = [
    "VLEN_BYTES_PER_ELEMENT",
    "VLEN_SLACK_BYTES",
    "VlenChunkDecoder",
    "VlenLimitError",
    "set_vlen_limit",
    "v3_vlen_decoder",
    "vlen_decoder",
    "vlen_limit",
    "vlen_stage_limit",
]

#: Average stored bytes per element (length prefix excluded) a vlen chunk may decode to by
#: default; :func:`set_vlen_limit` changes the value in use (:func:`vlen_limit`).
VLEN_BYTES_PER_ELEMENT = 4096
#: Bytes a vlen chunk may decode to beyond its per-element allowance.
VLEN_SLACK_BYTES = 1024 * 1024
#: numcodecs ids of the vlen codecs mixle decodes.
_VLEN_IDS = frozenset({"vlen-utf8", "vlen-bytes"})
#: Decoded items converted to the array's dtype per step (their Python objects freed after).
_CONVERT_STEP = 1 << 16

_limit = VLEN_BYTES_PER_ELEMENT


def set_vlen_limit(bytes_per_element: int) -> int:
    """Let a variable-length string/bytes chunk decode to ``bytes_per_element`` per element.

    The cap is an average over the chunk's elements (plus ``VLEN_SLACK_BYTES``); it bounds
    the memory a decompression bomb can take. It applies to arrays whose chunk reader is
    built afterwards: sources read for the first time after the call, in this process
    (call it in each worker process too). Returns the previous value.

    Raises
    ------
    TypeError, ValueError
        When ``bytes_per_element`` is not a positive integer.
    """
    global _limit
    if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, int):
        raise TypeError(f"bytes_per_element={bytes_per_element!r}: expected a positive int (bytes)")
    if bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element={bytes_per_element!r}: expected a positive int")
    previous, _limit = _limit, bytes_per_element
    return previous


def vlen_limit() -> int:
    """The bytes per element a vlen chunk may decode to now (:func:`set_vlen_limit`)."""
    return _limit


def vlen_stage_limit(count: int, bytes_per_element: int | None = None) -> int:
    """The most bytes a vlen chunk of ``count`` elements may decode to before its items."""
    per = _limit if bytes_per_element is None else bytes_per_element
    return 4 + count * (4 + per) + VLEN_SLACK_BYTES


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
    order
        The order the items are stored in (format 2 ``order``).
    transpose
        Format 3 ``transpose`` codecs before the vlen codec, their orders in the order
        they were applied (the items are stored in C order of the transposed chunk).

    Attributes
    ----------
    nbytes
        The most bytes the item stream of one chunk may have (:func:`vlen_stage_limit`,
        with the :func:`vlen_limit` in use when the decoder was made).
    stored_limit
        The most stored bytes a chunk can have: reads of more are refused unread.
    """

    def __init__(
        self,
        codecs: Sequence[Any],
        utf8: bool,
        shape: tuple[int, ...],
        dtype: np.dtype,
        order: Literal["C", "F"] = "C",
        transpose: Sequence[tuple[int, ...]] = (),
    ) -> None:
        import numcodecs

        self._codecs = list(codecs)
        self._item = numcodecs.VLenUTF8() if utf8 else numcodecs.VLenBytes()
        self._shape = shape
        self._dtype = dtype
        self._order = order
        self._transpose = [tuple(int(i) for i in t) for t in transpose]
        self._stored_shape = shape
        for perm in self._transpose:
            self._stored_shape = tuple(self._stored_shape[i] for i in perm)
        self._count = math.prod(shape)
        self.bytes_per_element = _limit
        self.nbytes = vlen_stage_limit(self._count, self.bytes_per_element)
        limits: list[int] = []
        size = self.nbytes
        for codec in reversed(self._codecs):
            limits.append(size)
            size, _ = _encoded_size(codec, size)
        self._limits = limits[::-1]
        self.stored_limit = size

    @property
    def codecs(self) -> list[Any]:
        """The bytes-to-bytes codecs, in the order they are undone."""
        return list(self._codecs)

    @property
    def count(self) -> int:
        """Elements of one chunk."""
        return self._count

    def limit_message(self, got: str, what: str = "", nbytes: int = 0) -> str:
        """Why a chunk is refused: ``got`` against the cap (``nbytes`` for ``what``)."""
        per = self.bytes_per_element
        what = what or f"a variable-length chunk of {self._count:,} elements"
        return (
            f"{got}: over mixle's size limit for {what}, {nbytes or self.nbytes:,} bytes "
            f"({per:,} bytes per element on average plus {VLEN_SLACK_BYTES:,}). This is a "
            "limit, not necessarily damage: if the strings are that long, raise it with "
            "mixle.set_vlen_limit(bytes_per_element) (now "
            f"{per:,}) before the first read"
        )

    def oversized(self, stored: int) -> VlenLimitError:
        """The error for a chunk stored in ``stored`` bytes, over :attr:`stored_limit`."""
        got = f"it is stored in {stored:,} bytes, more than the {self.stored_limit:,} it may have"
        return VlenLimitError(self.limit_message(got))

    def __call__(self, raw: bytes) -> np.ndarray:
        """The chunk ``raw`` decodes to.

        Raises
        ------
        VlenLimitError
            When it would decode to more than :attr:`nbytes` bytes.
        ValueError
            When it is not one chunk (damaged stream, wrong item count).
        """
        buf: Any = raw
        for codec, limit in zip(self._codecs, self._limits):
            try:
                buf = _decode_step(codec, buf, limit, False)
            except StageLimitError as exc:
                raise VlenLimitError(self.limit_message(str(exc))) from None
        data = memoryview(buf).cast("B")
        if len(data) < 4:
            raise ValueError(f"a vlen chunk has {len(data)} bytes, no item count")
        if len(data) > self.nbytes:  # no codecs: the stored bytes are the items
            raise VlenLimitError(self.limit_message(f"the chunk holds {len(data):,} bytes"))
        count = int.from_bytes(data[:4], "little")
        if count != self._count:
            raise ValueError(f"the vlen header says {count} items, a chunk has {self._count}")
        items = np.asarray(self._item.decode(data))
        del data, buf  # the decoded stream: the items hold their own copies
        if items.size != self._count:
            raise ValueError(f"decoded {items.size} vlen items, a chunk has {self._count}")
        flat = _converted(items.reshape(-1), self._dtype)
        if self._transpose:
            chunk = flat.reshape(self._stored_shape)
            for perm in reversed(self._transpose):
                chunk = chunk.transpose(tuple(int(i) for i in np.argsort(perm)))
            return chunk
        return flat.reshape(self._shape, order=self._order)


def _converted(items: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``items`` (a flat ``object`` array) as ``dtype``, each step's objects freed as it goes.

    Converting in steps keeps the Python objects and the converted array from both being
    whole at once (peak about one copy of the strings, not two).
    """
    if items.dtype == dtype:
        return items
    out = np.empty(items.size, dtype=dtype)
    for start in range(0, items.size, _CONVERT_STEP):
        stop = start + _CONVERT_STEP
        out[start:stop] = items[start:stop]
        items[start:stop] = None
    return out


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
        utf8 = filters[0].codec_id == "vlen-utf8"
        return VlenChunkDecoder(codecs, utf8, chunks, dtype, meta.order)
    return v3_vlen_decoder(meta.codecs, dtype, chunks)


def v3_vlen_decoder(
    codecs: Sequence[Any], dtype: np.dtype, chunks: tuple[int, ...]
) -> VlenChunkDecoder | None:
    """A decoder for format 3 codecs: ``transpose``s, ``vlen-utf8``/``-bytes``, bytes codecs.

    ``None`` for any other codec list (the inner codecs of a shard count as one).
    """
    from zarr.codecs import TransposeCodec, VLenBytesCodec, VLenUTF8Codec

    codecs = list(codecs)
    transpose: list[tuple[int, ...]] = []
    while codecs and isinstance(codecs[0], TransposeCodec):
        transpose.append(tuple(int(i) for i in codecs.pop(0).order))
    if not codecs or not isinstance(codecs[0], (VLenUTF8Codec, VLenBytesCodec)):
        return None
    steps = bytes_steps(codecs[1:])
    if steps is None:
        return None
    utf8 = isinstance(codecs[0], VLenUTF8Codec)
    return VlenChunkDecoder(steps[::-1], utf8, chunks, dtype, "C", transpose)


def vlen_shard_limit(inner: VlenChunkDecoder, inner_chunks: int) -> int:
    """The most bytes ``inner_chunks`` stored vlen chunks of one shard may have together.

    Their items together get the per-element cap once (one ``VLEN_SLACK_BYTES``, not one
    per inner chunk); each inner chunk's codecs add their own fixed overhead.
    """
    size = 4 * inner_chunks + vlen_stage_limit(inner.count * inner_chunks, inner.bytes_per_element)
    for codec in reversed(inner.codecs):
        grown, _ = _encoded_size(codec, size)
        overhead, _ = _encoded_size(codec, 0)
        size = grown + (inner_chunks - 1) * overhead
    return size
