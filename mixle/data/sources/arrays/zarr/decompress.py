"""Bounded decompression of one compressed stream: never more bytes than its stage holds.

:func:`bounded_decompress` undoes one compressor of :data:`BOUNDED_COMPRESSORS` into at
most the bytes its stage of a chunk's decoding may have: a streaming decompressor asked for
no more than that (``zlib``, ``gzip``, ``bz2``, ``lzma``), or, where the stored header
records the decoded size (zstd frames, blosc and lz4 headers), that size checked before
anything is allocated. A stream that would decode to more raises ``ValueError``.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BOUNDED_COMPRESSORS", "StageLimitError", "bounded_decompress"]

#: Compressors whose output mixle caps while decoding.
BOUNDED_COMPRESSORS = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd", "blosc", "lz4"})
#: The magic number of a zstd frame.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Bytes 1-3 of a skippable zstd frame's magic number (byte 0 is 0x50 to 0x5F).
_SKIPPABLE_MAGIC_TAIL = b"\x2a\x4d\x18"
#: Bytes of a blosc header (version, flags, type size, then three uint32 sizes).
_BLOSC_HEADER = 16


class StageLimitError(ValueError):
    """A stream would decode to more bytes than its stage allows (not a damaged stream)."""


def bounded_decompress(
    codec: Any,
    raw: Any,
    limit: int,
    exact: bool = False,
    out: Callable[[], np.ndarray] | None = None,
) -> Any:
    """``codec.decode(raw)`` for a compressor, never producing more than ``limit`` bytes.

    Parameters
    ----------
    codec
        A numcodecs compressor whose ``codec_id`` is in :data:`BOUNDED_COMPRESSORS`.
    raw
        Its stored bytes.
    limit
        The most decoded bytes allowed.
    exact
        Whether the decoded bytes must be exactly ``limit``.
    out
        Gives a writable ``uint8`` buffer of ``limit`` bytes that zstd, blosc and lz4
        decode straight into, when ``exact`` and the header says ``limit`` bytes: called
        only then, after the header was checked (others ignore it).

    Returns
    -------
    bytes-like
        The decoded bytes (``out`` itself when they were decoded into it).

    Raises
    ------
    StageLimitError
        (a ``ValueError``) When the stream would decode to more than ``limit`` bytes (found
        before more than ``limit + 1`` bytes are produced, or from the header before any
        allocation).
    ValueError
        When it is truncated or damaged, or does not decode to exactly ``limit`` bytes when
        ``exact``.
    """
    codec_id = codec.codec_id
    data = memoryview(raw).cast("B")
    if codec_id in ("zstd", "blosc", "lz4"):
        if codec_id == "blosc" and len(data) >= _BLOSC_HEADER:
            # blosc trusts the stored size in its header and reads that many bytes: a cut
            # stream would decode past its end into whatever follows (wrong values, no error)
            stored = int.from_bytes(data[12:16], "little")
            if stored > len(data):
                raise ValueError(
                    f"the blosc stream is truncated: its header says {stored} stored bytes, "
                    f"it has {len(data)}"
                )
        declared = _declared_size(codec_id, bytes(data[:16]) if codec_id != "zstd" else data)
        if declared is None:
            if not exact:
                raise ValueError(
                    f"the {codec_id} stream does not record its decoded size and its stage "
                    "has no exact size, so it cannot be decoded within a bound"
                )
            declared = limit
        if declared > limit or (exact and declared != limit):
            bound = f"{limit}" if exact else f"at most {limit}"
            raise (ValueError if exact else StageLimitError)(
                f"the stored {codec_id} header says {declared} bytes, its stage holds {bound}"
            )
        into = out() if out is not None and exact else np.empty(declared, dtype=np.uint8)
        codec.decode(data, out=into)
        return into
    if codec_id == "zlib":
        return _stream(lambda: zlib.decompressobj(), data, limit, codec_id, members=False)
    if codec_id == "gzip":
        return _stream(lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), data, limit, codec_id)
    if codec_id == "bz2":
        return _stream(bz2.BZ2Decompressor, data, limit, codec_id)
    fmt, filters = codec.format, codec.filters
    return _stream(lambda: lzma.LZMADecompressor(format=fmt, filters=filters), data, limit, "lzma")


def _stream(
    new: Callable[[], Any], data: memoryview, limit: int, codec_id: str, members: bool = True
) -> bytes:
    """Decode ``data`` (one stream, or concatenated ones if ``members``) into <= ``limit``."""
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    while True:
        dec = new()
        part = dec.decompress(rest, limit - total + 1)
        total += len(part)
        parts.append(part)
        if total > limit:
            raise StageLimitError(f"the {codec_id} stream decodes to more than {limit} bytes")
        if not dec.eof:
            raise ValueError(f"the {codec_id} stream is truncated (no end-of-stream marker)")
        rest = dec.unused_data
        if codec_id == "gzip":
            rest = rest.lstrip(b"\0")  # gzip members may be padded with zeros
        if not members or not rest:
            return b"".join(parts)


def _declared_size(codec_id: str, raw: bytes | memoryview) -> int | None:
    """The decoded size the stored header(s) record, or ``None`` where they do not say.

    Blosc: its header. lz4 (numcodecs): the 4-byte size before the block. Zstd: the sum
    over every frame (numcodecs decodes concatenated frames, and so does zarr); ``None``
    when a frame omits its content size, or when the frames cannot be walked.
    """
    if codec_id == "blosc":
        return int.from_bytes(raw[4:8], "little") if len(raw) >= 16 else None
    if codec_id == "lz4":
        return int.from_bytes(raw[:4], "little") if len(raw) >= 4 else None
    total, pos = 0, 0
    while pos < len(raw):
        frame = _zstd_frame(raw, pos)
        if frame is None:
            return None
        content, pos = frame
        if content is None:
            return None
        total += content
    return total if len(raw) else None


def _zstd_frame(raw: bytes | memoryview, pos: int) -> tuple[int | None, int] | None:
    """``(content size or None, end)`` of the zstd frame at ``raw[pos:]``; ``None``: not one.

    Walks the frame header and block headers (RFC 8878), as ``ZSTD_findFrameCompressedSize``
    does; skippable frames hold no content.
    """
    magic = bytes(raw[pos : pos + 4])
    if len(magic) == 4 and magic[1:] == _SKIPPABLE_MAGIC_TAIL and magic[0] & 0xF0 == 0x50:
        end = pos + 8 + int.from_bytes(raw[pos + 4 : pos + 8], "little")
        return (0, end) if pos + 8 <= end <= len(raw) else None
    if magic != _ZSTD_MAGIC or len(raw) < pos + 6:
        return None
    descriptor = raw[pos + 4]
    single_segment = (descriptor >> 5) & 1
    at = pos + 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if len(raw) < at + width:
        return None
    content: int | None = None
    if width:
        content = int.from_bytes(raw[at : at + width], "little") + (256 if width == 2 else 0)
    at += width
    while True:  # blocks: a 3-byte header (last flag, type, size) and its payload
        if len(raw) < at + 3:
            return None
        header = int.from_bytes(raw[at : at + 3], "little")
        kind, size = (header >> 1) & 3, header >> 3
        at += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        if kind == 3 or at > len(raw):
            return None
        if header & 1:
            break
    at += 4 if descriptor & 4 else 0  # the content checksum
    return (content, at) if at <= len(raw) else None
