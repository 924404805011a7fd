"""N5 blocks: the header parsed and checked, the payload decompressed within a bound.

A block file is a big-endian header — ``mode`` (uint16: 0 default, 1 varlength, 2
object), ``ndim`` (uint16), ``ndim`` block extents (uint32, fastest axis first), for mode
1 an element count (uint32) — then the compressed elements, big-endian, fastest axis
first. Edge blocks may be smaller than ``blockSize`` (tensorstore writes them whole, the
Java library clipped); a block smaller than its place in the grid fills the corner at its
origin and the rest reads as 0, as tensorstore reads it.

:func:`decompressor` turns a ``compression`` object into a function that decodes a payload
to exactly the bytes the header says, never more (``zlib``/``gzip``, ``bz2`` and ``lzma``
streamed with a cap; ``blosc`` and ``zstd`` through numcodecs after their headers'
recorded size is checked). Where imagecodecs is installed, ``gzip`` and ``zlib`` payloads
are inflated by its libdeflate decoder into a buffer of exactly the header's size (about
twice as fast as zlib's; a stream that does not fit raises) and fall back to the streamed
decoder, which names the fault, when libdeflate refuses them or decodes fewer bytes, and
for a gzip payload whose first member is followed by anything but zeros (libdeflate
decodes the first member and ignores the rest; see :func:`_one_member`): both paths
accept and refuse the same payloads.
"""

from __future__ import annotations

import lzma
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.arrays.n5.attributes import COMPRESSIONS, N5Metadata
from mixle.data.sources.arrays.zarr.decompress import bounded_decompress
from mixle.errors import UnsupportedStoreError
from mixle.reading import CorruptChunkError
from mixle.utils import optional_deps
from mixle.utils.optional_deps import require

__all__ = [
    "Decompressor",
    "decode_block",
    "decompressor",
    "parse_header",
    "stored_limit",
]

#: ``(payload, decoded bytes) -> decoded bytes``; raises ``ValueError`` on bad input.
Decompressor = Callable[[memoryview, int], Any]
#: Compressions decoded by numcodecs (the ``n5`` extra installs it).
_NUMCODECS = {"blosc": "Blosc", "zstd": "Zstd"}
#: Stored bytes a block may have beyond its decoded size (headers, incompressible data).
_STORED_SLACK = 64 * 1024
#: No compressor mixle reads stores more than this many times the decoded bytes.
_STORED_FACTOR = 2
#: Bytes of a blosc frame's header (the compressed size is at bytes 12-15).
_BLOSC_HEADER = 16
#: The gzip magic number (a payload without it is a zlib stream: ``useZlib``).
_GZIP_MAGIC = b"\x1f\x8b"
#: Last bytes of a gzip payload looked at for its zero padding before the whole is scanned.
_TAIL = 64


@dataclass(frozen=True)
class _Codec:
    """What :func:`bounded_decompress` asks of a codec: its id (and lzma's options)."""

    codec_id: str
    format: int = lzma.FORMAT_XZ
    filters: Any = None
    numcodecs: Any = None

    def decode(self, data: Any, out: Any = None) -> Any:
        return self.numcodecs.decode(data, out=out)


def stored_limit(meta: N5Metadata) -> int:
    """The most bytes one block file may have: a whole block's header and payload, bounded."""
    header = 4 + 4 * len(meta.shape) + 4
    return header + _STORED_FACTOR * meta.block_nbytes + _STORED_SLACK


def decompressor(compression: dict[str, Any], where: str) -> Decompressor:
    """The bounded decoder of ``compression`` (an N5 ``compression`` object).

    Raises
    ------
    UnsupportedStoreError
        A ``ValueError``: the compression ``type`` is one mixle does not decode (named, with
        those it does).
    ImportError
        numcodecs is needed (``blosc``, ``zstd``) but not installed:
        ``pip install -e ".[n5]"`` in the mixle checkout.
    """
    kind = compression["type"]
    if kind == "raw":
        return _raw
    if kind == "gzip":
        return _inflater()
    if kind == "bzip2":
        bz2 = _Codec("bz2")
        return lambda raw, n: bounded_decompress(bz2, raw, n, exact=True)
    if kind == "xz":
        xz = _Codec("lzma", format=lzma.FORMAT_XZ)
        return lambda raw, n: bounded_decompress(xz, raw, n, exact=True)
    if kind in _NUMCODECS:
        numcodecs = require("numcodecs", "n5", feature=f"N5 {kind} compression of {where}")
        codec = _Codec(kind, numcodecs=getattr(numcodecs, _NUMCODECS[kind])())
        if kind == "blosc":
            return lambda raw, n: bounded_decompress(codec, _whole_blosc(raw), n, exact=True)
        return lambda raw, n: bounded_decompress(codec, raw, n, exact=True)
    known = ", ".join(c for c in COMPRESSIONS if c != "lz4")
    note = (
        " (N5's lz4 is the lz4-java block stream, which mixle does not decode; rewrite the "
        "dataset with blosc/lz4 or zstd)"
        if kind == "lz4"
        else ""
    )
    raise UnsupportedStoreError(
        f"N5 dataset {where}: compression type {kind!r} is not one mixle decodes{note}; it "
        f"decodes {known}"
    )


def _inflater() -> Decompressor:
    """The decoder of N5 ``gzip`` payloads (gzip streams, or zlib streams: ``useZlib``)."""
    gzip, zlib = _Codec("gzip"), _Codec("zlib")

    def streamed(raw: memoryview, n: int) -> Any:
        codec = gzip if bytes(raw[:2]) == _GZIP_MAGIC else zlib
        return bounded_decompress(codec, raw, n, exact=True)

    libdeflate = _libdeflate()
    if libdeflate is None:
        return streamed
    gzip_decode, zlib_decode = libdeflate.gzip_decode, libdeflate.deflate_decode
    crc32 = libdeflate.deflate_crc32

    def inflate(raw: memoryview, n: int) -> Any:
        if bytes(raw[:2]) != _GZIP_MAGIC:
            decode, end = zlib_decode, None  # bytes after a zlib stream: both ignore them
        else:
            # libdeflate decodes the first member and ignores the rest; the streamed decoder
            # reads on (more members, zero padding) or refuses it: libdeflate's answer is
            # taken only where the payload is one member, then zeros (_one_member)
            decode, end = gzip_decode, _content_end(raw)
            if not _may_be_one_member(raw, end, n):
                return streamed(raw, n)
        try:
            out = decode(raw, out=n)  # never writes past n bytes: a longer stream raises
        except (RuntimeError, ValueError):  # corrupt, truncated or too long
            return streamed(raw, n)  # raises, naming what is wrong
        if len(out) != n or (end is not None and not _one_member(raw, end, crc32(out), n)):
            return streamed(raw, n)  # reads or refuses what follows the first member
        return out

    return inflate


def _may_be_one_member(data: bytes, n: int) -> bool:
    """Whether the gzip payload ``data`` may be one member of ``n`` bytes, then zeros.

    Its last bytes other than zeros must be those of the size trailer (``n`` modulo
    2**32, little-endian); ``False`` sends the payload to the streamed decoder without
    decoding it with libdeflate first.
    """
    size = (n & 0xFFFFFFFF).to_bytes(4, "little").rstrip(b"\0")
    return not size or data.endswith(size, 0, len(data.rstrip(b"\0")))


def _content_end(raw: memoryview) -> int:
    """The end of ``raw`` without its trailing zero bytes (a look at its last bytes)."""
    window = bytes(raw[-_TAIL:])
    kept = len(window.rstrip(b"\0"))
    if kept or len(raw) <= _TAIL:
        return len(raw) - len(window) + kept
    nonzero = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8))  # long zero padding: rare
    return int(nonzero[-1]) + 1 if nonzero.size else 0


def _may_be_one_member(raw: memoryview, end: int, n: int) -> bool:
    """Whether the gzip payload ``raw`` may be one member of ``n`` bytes, then zeros.

    Its bytes up to ``end`` (:func:`_content_end`) must end in those of the size trailer
    (``n`` modulo 2**32, little-endian) other than its trailing zeros; ``False`` sends the
    payload to the streamed decoder without decoding it with libdeflate first.
    """
    size = (n & 0xFFFFFFFF).to_bytes(4, "little").rstrip(b"\0")
    return not size or (end >= len(size) and bytes(raw[end - len(size) : end]) == size)


def _one_member(raw: memoryview, end: int, crc: int, n: int) -> bool:
    """Whether the gzip payload ``raw`` is one member (of ``crc`` and ``n`` bytes), then zeros.

    The two decoders agree on such a payload. ``crc`` and ``n`` are those of the first
    member as libdeflate decoded (and checked) it; that member ends in its trailer
    (``crc``, ``n``), so when the trailer ends where the payload's zero padding begins
    (``end``, :func:`_content_end`) and occurs nowhere before, the member ends there.
    Compressed bytes that happen to hold the trailer only send the payload to the streamed
    decoder (slower, same answer). The search for it is the cost: measured 15-20% of the
    libdeflate decode's time (still about half of zlib's).
    """
    trailer = struct.pack("<II", crc & 0xFFFFFFFF, n & 0xFFFFFFFF)
    tail = trailer.rstrip(b"\0")
    if not tail:  # an empty member of CRC 0: where it ends is not told by the bytes
        return False
    at = end - len(tail)
    if at < 0 or bytes(raw[at : at + 8]) != trailer:
        return False
    first = re.search(re.escape(trailer), raw)  # searches the view: no copy of the payload
    return first is not None and first.start() == at


def _libdeflate() -> Any:
    """imagecodecs where it is installed with its libdeflate codec, else ``None``."""
    if not optional_deps.HAS_IMAGECODECS:
        return None
    try:
        imagecodecs = require("imagecodecs")
        available = bool(imagecodecs.DEFLATE.available)
    except (ImportError, AttributeError):  # a broken or stripped-down build: zlib then
        return None
    return imagecodecs if available else None


def _whole_blosc(raw: memoryview) -> memoryview:
    """``raw`` if it is exactly one blosc frame, as long as its header says.

    Blosc's decoder trusts the compressed size in the header and reads that many bytes: a
    truncated frame would be read past its end.
    """
    if len(raw) < _BLOSC_HEADER:
        raise ValueError(f"the blosc payload has {len(raw)} bytes, fewer than its header's 16")
    cbytes = int.from_bytes(raw[12:16], "little")
    if cbytes != len(raw):
        raise ValueError(
            f"the blosc header says {cbytes:,} stored bytes, the payload has {len(raw):,}"
        )
    return raw


def _raw(raw: memoryview, n: int) -> memoryview:
    if len(raw) != n:
        raise ValueError(f"the raw payload has {len(raw)} bytes, the header needs {n}")
    return raw


def parse_header(raw: memoryview, ndim: int) -> tuple[tuple[int, ...], int]:
    """``(block extents, payload offset)`` of the block file ``raw``.

    Raises
    ------
    ValueError
        A truncated header, a mode other than 0 (default) and 1 (varlength, when its
        element count is the extents' product), or a number of axes other than ``ndim``.
    """
    if len(raw) < 4:
        raise ValueError(f"the file has {len(raw)} bytes, fewer than a block header's 4")
    mode, axes = struct.unpack_from(">HH", raw, 0)
    if mode == 2:
        raise ValueError("it is an object block (mode 2), which holds no numeric array")
    if mode not in (0, 1):
        raise ValueError(f"its header's mode is {mode}, not 0 (default) or 1 (varlength)")
    if axes != ndim:
        raise ValueError(f"its header has {axes} axes, the dataset {ndim}")
    end = 4 + 4 * axes + (4 if mode == 1 else 0)
    if len(raw) < end:
        raise ValueError(f"the file has {len(raw)} bytes, fewer than its header's {end}")
    dims = struct.unpack_from(f">{axes}I", raw, 4)
    if mode == 1:
        (count,) = struct.unpack_from(">I", raw, 4 + 4 * axes)
        if count != math.prod(dims):
            raise ValueError(
                f"it is a varlength block (mode 1) of {count} elements in a {dims} block, "
                "which mixle does not read as an array"
            )
    return tuple(dims), end


def decode_block(
    raw: bytes,
    meta: N5Metadata,
    decode: Decompressor,
    extent: tuple[int, ...],
    what: str,
) -> np.ndarray:
    """Block file ``raw`` as a native-endian array of shape ``extent``.

    A whole block keeps its stored element order (Fortran order: a view ``.T`` of a
    C-ordered array), so decoding it is one byte-swapping copy.

    ``extent`` is the block's part of the array (``blockSize`` clipped at the edges). A
    stored block larger than that (tensorstore writes edge blocks whole) is cut to it; a
    smaller one fills its corner and the rest is 0.

    Raises
    ------
    CorruptChunkError
        Naming ``what`` (the file and block): a bad header, extents past ``blockSize``, or a
        payload that does not decode to exactly the header's bytes.
    """
    data = memoryview(raw)
    try:
        dims, start = parse_header(data, len(meta.shape))
        if any(d > b for d, b in zip(dims, meta.blocks)):
            raise ValueError(
                f"its header's extents {list(dims)} exceed blockSize={list(meta.blocks)}"
            )
        nbytes = math.prod(dims) * meta.stored_dtype.itemsize
        payload = decode(data[start:], nbytes)
        decoded = memoryview(payload).nbytes
        if decoded != nbytes:
            raise ValueError(
                f"the payload decodes to {decoded:,} bytes, the header needs {nbytes:,}"
            )
        stored = np.frombuffer(payload, dtype=meta.stored_dtype, count=math.prod(dims))
    except Exception as exc:
        raise CorruptChunkError(
            f"{what} is corrupt ({len(raw):,} stored bytes): {type(exc).__name__}: {exc}"
        ) from None
    block = stored.reshape(dims[::-1]).T  # fastest axis first: Fortran order
    if dims == extent:
        # the one copy: the byte swap, in stored order (the scatter reorders only the
        # part a read needs; measured faster end to end than a C-order copy per block)
        out = block.astype(meta.dtype, order="K")
    else:
        out = np.zeros(extent, dtype=meta.dtype)
        part = tuple(slice(0, min(d, e)) for d, e in zip(dims, extent))
        out[part] = block[part]
    out.flags.writeable = False
    return out
