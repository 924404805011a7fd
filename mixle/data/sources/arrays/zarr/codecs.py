"""Bounded decoding of zarr chunks with numcodecs: never more bytes than the chunk holds.

A :class:`ChunkDecoder` undoes a chain of numcodecs codecs (zarr format 2: a compressor
and filters; format 3: array-to-array codecs such as ``transpose``, the ``bytes`` codec,
then bytes-to-bytes codecs) and checks every stage against the size it must have, working
back from the chunk's own ``prod(chunks) * itemsize``:

- compressors (``zlib``, ``gzip``, ``bz2``, ``lzma``, ``zstd``, ``blosc``, ``lz4``) decode
  into at most the size their stage must have: a streaming decompressor asked for no more
  than that (``max_length``), or, where the stored header records the decoded size (zstd
  frames, blosc and lz4 headers), that size checked before anything is allocated
  (:mod:`mixle.data.sources.arrays.zarr.decompress`);
- checksums (``crc32c``, ``adler32``...) and the filters whose encoded size follows from
  the decoded one (``shuffle``, ``bitround``, ``delta``, ``fixedscaleoffset``,
  ``quantize``, ``astype``, ``packbits``) have an exact size at every stage;
- a codec mixle does not know has no size it can predict: the stage it feeds is bounded by
  :data:`UNKNOWN_CODEC_FACTOR` times its output, and its own output is checked after it
  ran (numcodecs allocates it; this is the one stage not bounded in advance).

A chunk that would decode to more (or fewer) bytes than its stage allows raises
``ValueError``, which the readers raise as :class:`~mixle.reading.CorruptChunkError`
naming the array and the chunk; memory never grows past a small multiple of one chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from mixle.data.sources.arrays.zarr.decompress import (
    BOUNDED_COMPRESSORS,
    StageLimitError,
    bounded_decompress,
)
from mixle.utils.optional_deps import require

__all__ = [
    "COMPRESSED_SLACK_BYTES",
    "ChunkDecoder",
    "PLAIN_KINDS",
    "UNKNOWN_CODEC_FACTOR",
    "bytes_steps",
    "numcodecs_decoder",
    "plain_dtype",
    "v3_decoder",
]

#: dtype kinds whose chunks are plain fixed-size bytes that mixle decodes itself: bool, ints,
#: floats, complex, times, fixed-width bytes (``S``), UTF-32 strings (``U``), structured and
#: raw (``V``) records.
PLAIN_KINDS = "biufcmMSUV"

#: A codec mixle cannot size may take at most this many times its output's bytes as input.
UNKNOWN_CODEC_FACTOR = 8
#: Bytes a compressor may add to incompressible data (plus 1/8 of it): headers, block framing.
COMPRESSED_SLACK_BYTES = 64 * 1024
#: Checksum codecs: the stored bytes are the data and a 4-byte checksum.
_CHECKSUMS = frozenset({"crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"})
#: Filters storing exactly as many bytes as they decode to.
_SAME_SIZE = frozenset({"shuffle", "bitround"})
#: Filters storing each element as ``astype`` (``(decoded dtype, encoded dtype)`` attributes).
_RETYPED = {
    "delta": ("dtype", "astype"),
    "fixedscaleoffset": ("dtype", "astype"),
    "quantize": ("dtype", "astype"),
    "astype": ("decode_dtype", "encode_dtype"),
}

#: An array-to-array step of a format 3 chain, undone on the decoded array.
ArrayStep = Callable[[np.ndarray], np.ndarray]


def _encoded_size(codec: Any, decoded: int) -> tuple[int, bool]:
    """``(bytes codec stores for decoded bytes, whether exact)``; an upper bound if not."""
    codec_id = getattr(codec, "codec_id", None)
    if codec_id in _CHECKSUMS:
        return decoded + 4, True
    if codec_id in _SAME_SIZE:
        return decoded, True
    if codec_id == "packbits":
        return 1 + -(-decoded // 8), True
    if codec_id in _RETYPED:
        inner, outer = (np.dtype(getattr(codec, a)) for a in _RETYPED[codec_id])
        if inner.itemsize and decoded % inner.itemsize == 0:
            return decoded // inner.itemsize * outer.itemsize, True
    if codec_id in BOUNDED_COMPRESSORS:
        return decoded + decoded // 8 + COMPRESSED_SLACK_BYTES, False
    return decoded * UNKNOWN_CODEC_FACTOR + COMPRESSED_SLACK_BYTES, False


class ChunkDecoder:
    """Stored bytes to one decoded chunk, through numcodecs codecs, every stage bounded.

    Parameters
    ----------
    codecs
        numcodecs codecs in the order they are undone (the last one applied first).
    stored
        dtype of the serialised elements (byte order included).
    shape
        Shape of the serialised array (the chunk, transposed for format 3 ``transpose``).
    order
        Memory order of the serialised array.
    array_steps
        Format 3 array-to-array steps, in the order they are undone.

    Attributes
    ----------
    nbytes
        Bytes of one decoded chunk.
    writes_into
        Whether the chunk :meth:`decode_into` returns is in the buffer it was given (no
        array-to-array filter makes a new array after it).
    stored_limit
        The most stored bytes a chunk can have: reads of more are refused unread.
    """

    def __init__(
        self,
        codecs: Sequence[Any],
        stored: np.dtype,
        shape: tuple[int, ...],
        order: Literal["C", "F"] = "C",
        array_steps: Sequence[ArrayStep] = (),
    ) -> None:
        self._codecs = list(codecs)
        self._stored = stored
        self._shape = shape
        self._order = order
        self._array_steps = list(array_steps)
        self._count = math.prod(shape)
        self.nbytes = self._count * stored.itemsize
        self.writes_into = all(getattr(s, "keeps_buffer", False) for s in self._array_steps)
        limits: list[tuple[int, bool]] = []
        size, exact = self.nbytes, True
        for codec in reversed(self._codecs):  # from the chunk back to the stored bytes
            limits.append((size, exact))
            size, known = _encoded_size(codec, size)
            exact = exact and known
        self._limits = limits[::-1]
        self.stored_limit = size

    def __call__(self, raw: bytes) -> np.ndarray:
        """The chunk that ``raw`` decodes to; ``ValueError`` if it is not exactly one chunk."""
        return self.decode_into(raw, None)

    def decode_into(self, raw: Any, out: Callable[[], np.ndarray] | None) -> np.ndarray:
        """The chunk ``raw`` decodes to, in the buffer ``out()`` gives (``nbytes`` of ``uint8``).

        ``out`` is called once, after the stored bytes were checked (a damaged chunk
        allocates nothing). The last stage decodes straight into it where its codec can
        (zstd, blosc, lz4), else its output is copied there; the chunk never views
        ``raw``, which its caller may reuse at once. A format 3 array-to-array step (a
        filter) may still return a chunk of its own. Without ``out`` (:meth:`__call__`)
        the chunk may view ``raw``.
        """
        given: list[np.ndarray] = []

        def take() -> np.ndarray:
            assert out is not None
            given.append(out())
            return given[0]

        buf: Any = raw
        last = len(self._codecs) - 1
        into = None if out is None else take
        for k, (codec, (limit, exact)) in enumerate(zip(self._codecs, self._limits)):
            buf = _decode_step(codec, buf, limit, exact, into if k == last else None)
        got = memoryview(buf).nbytes
        if got != self.nbytes:
            raise ValueError(f"decoded {got} bytes, a chunk has {self.nbytes}")
        if out is not None and not (given and buf is given[0]):  # copy (never view raw)
            dest = given[0] if given else take()
            dest[...] = np.frombuffer(buf, dtype=np.uint8, count=got)
            buf = dest
        flat = np.frombuffer(buf, dtype=self._stored, count=self._count)
        chunk = flat.reshape(self._shape, order=self._order)
        for step in self._array_steps:
            chunk = step(chunk)
        return chunk


def _decode_step(
    codec: Any, buf: Any, limit: int, exact: bool, into: Callable[[], np.ndarray] | None = None
) -> Any:
    """``codec.decode(buf)``, its output at most ``limit`` bytes (exactly, if ``exact``).

    ``into``: gives a buffer a compressor may decode straight into
    (:func:`bounded_decompress`).
    """
    codec_id = getattr(codec, "codec_id", None)
    if codec_id in BOUNDED_COMPRESSORS:
        out: Any = bounded_decompress(codec, buf, limit, exact, into)
    else:
        out = codec.decode(buf)
    got = memoryview(out).nbytes
    if got > limit or (exact and got != limit):
        bound = f"{limit}" if exact else f"at most {limit}"
        kind = ValueError if exact else StageLimitError
        raise kind(f"the {codec_id} codec decoded {got} bytes, its stage holds {bound}")
    return out


def numcodecs_decoder(
    compressor: Any,
    filters: Sequence[Any],
    stored: np.dtype,
    chunks: tuple[int, ...],
    order: Literal["C", "F"],
) -> ChunkDecoder:
    """A decoder for a zarr format 2 chain: ``compressor``, then ``filters`` last first."""
    codecs = ([] if compressor is None else [compressor]) + list(reversed(filters))
    return ChunkDecoder(codecs, stored, chunks, order)


def v3_decoder(
    codecs: Sequence[Any], dtype: np.dtype, chunks: tuple[int, ...]
) -> ChunkDecoder | None:
    """A decoder for a format 3 codec list, or ``None`` for codecs mixle does not decode.

    Decoded here: ``transpose``, numcodecs array-to-array codecs that keep the dtype and
    the retyping filters (``delta``/``fixedscaleoffset``/``quantize``/``astype`` with an
    integer or float ``astype``: their stored size is exact), then ``bytes``, then zstd, gzip,
    blosc, crc32c and the numcodecs bytes-to-bytes codecs.
    """
    from zarr.codecs import BytesCodec, TransposeCodec
    from zarr.codecs.numcodecs import _NumcodecsArrayArrayCodec

    shape = chunks
    array_steps: list[ArrayStep] = []
    current = dtype  # the dtype each array -> array codec sees (a retyping filter changes it)
    k = 0
    while k < len(codecs) and not isinstance(codecs[k], BytesCodec):
        codec = codecs[k]
        if isinstance(codec, TransposeCodec):
            order = tuple(int(i) for i in codec.order)
            shape = tuple(shape[i] for i in order)
            array_steps.append(_untranspose(order))
        elif isinstance(codec, _NumcodecsArrayArrayCodec) and _keeps_dtype(codec._codec, current):
            array_steps.append(_array_filter(codec._codec, shape))
        elif isinstance(codec, _NumcodecsArrayArrayCodec) and (
            (outer := _retypes(codec._codec, current)) is not None
        ):
            array_steps.append(_array_filter(codec._codec, shape, outer))
            current = outer
        else:
            return None  # an unknown array -> array codec
        k += 1
    if k == len(codecs):
        return None  # no bytes serializer (vlen strings, a numcodecs array -> bytes codec)
    endian = codecs[k].endian
    if endian is not None and current.fields is not None:
        return None  # zarr's byte order for a whole structured dtype: left to zarr
    if array_steps and current != dtype and current.byteorder not in "=|":
        return None  # a retyping filter over a non-native stored dtype: left to zarr
    stored = (
        current
        if endian is None
        else current.newbyteorder("<" if endian.value == "little" else ">")
    )
    steps = bytes_steps(codecs[k + 1 :])
    if steps is None:
        return None
    return ChunkDecoder(steps[::-1], stored, shape, "C", array_steps[::-1])


def bytes_steps(codecs: Sequence[Any]) -> list[Any] | None:
    """numcodecs codecs for format 3 bytes-to-bytes ``codecs`` (in order), or ``None``.

    zstd, gzip, blosc and crc32c become their numcodecs equivalents, numcodecs codecs stay;
    any other codec makes it ``None`` (left to zarr).
    """
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
    from zarr.codecs.numcodecs import _NumcodecsBytesBytesCodec

    numcodecs = require("numcodecs", "zarr", feature="ZarrArraySource")
    steps: list[Any] = []
    for codec in codecs:
        if isinstance(codec, ZstdCodec):
            steps.append(numcodecs.Zstd())
        elif isinstance(codec, GzipCodec):
            steps.append(numcodecs.GZip())
        elif isinstance(codec, BloscCodec):
            steps.append(numcodecs.Blosc())
        elif isinstance(codec, Crc32cCodec):
            steps.append(numcodecs.CRC32C())
        elif isinstance(codec, _NumcodecsBytesBytesCodec):
            steps.append(codec._codec)
        else:
            return None
    return steps


def _untranspose(order: tuple[int, ...]) -> ArrayStep:
    """An array step undoing ``transpose(order)`` (a view: ``keeps_buffer``)."""
    back = tuple(int(i) for i in np.argsort(order))

    def step(chunk: np.ndarray) -> np.ndarray:
        return chunk.transpose(back)

    step.keeps_buffer = True  # type: ignore[attr-defined]
    return step


def _keeps_dtype(codec: Any, dtype: np.dtype) -> bool:
    """Whether a numcodecs array-to-array codec stores elements as ``dtype`` itself."""
    names = _RETYPED.get(getattr(codec, "codec_id", None), ())
    if not names and getattr(codec, "codec_id", None) != "bitround":
        return False
    return all(np.dtype(getattr(codec, a)) == dtype for a in names)


def _retypes(codec: Any, dtype: np.dtype) -> np.dtype | None:
    """The dtype a numcodecs retyping filter stores ``dtype`` elements as, else ``None``.

    Covers the filters of :data:`_RETYPED` (``delta``, ``fixedscaleoffset``, ``quantize``,
    ``astype``) whose decoded dtype is ``dtype`` and whose stored dtype is an integer or a
    float (``float32`` stored as ``float16``, say): their stored size is known exactly.
    """
    names = _RETYPED.get(getattr(codec, "codec_id", None))
    if names is None:
        return None
    inner, outer = (np.dtype(getattr(codec, a)) for a in names)
    if inner != dtype or outer.kind not in "biuf":
        return None
    return outer


def _array_filter(codec: Any, shape: tuple[int, ...], stored: np.dtype | None = None) -> ArrayStep:
    """An array step undoing numcodecs ``codec``, the result back in ``shape``.

    ``stored``: the dtype the codec stored its elements as (a retyping filter); the decoded
    chunk is first brought to it in native byte order, as the codec reads its input.
    """
    if stored is None:
        return lambda chunk: np.asarray(codec.decode(chunk)).reshape(shape)
    native = stored.newbyteorder("=")
    return lambda chunk: np.asarray(codec.decode(chunk.astype(native, copy=False))).reshape(shape)


def plain_dtype(dtype: np.dtype) -> bool:
    """Whether chunks of ``dtype`` are fixed-size bytes mixle decodes (:data:`PLAIN_KINDS`)."""
    return dtype.kind in PLAIN_KINDS and not dtype.hasobject and dtype.itemsize > 0
