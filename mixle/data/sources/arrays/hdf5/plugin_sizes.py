"""Checks of the decoded size HDF5 plugin-filtered chunks state, before h5py decodes them.

HDF5's zstd, blosc, lz4, bitshuffle and blosc2 plugins allocate what a stored chunk says it
decodes to, and bzip2's grows its buffer until the stream ends: a tiny chunk could allocate
gigabytes. :class:`PluginSizeCheck` reads each chunk's stored bytes once and refuses a chunk
whose stated size is more than its chunk could legitimately decode to, or whose header it
cannot read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle.reading import CorruptChunkError

__all__ = ["PluginSizeCheck"]

#: Plugin filters whose stored chunks state their decoded size: zstd (the frame's content
#: size), blosc (its header's ``nbytes``), hdf5plugin's lz4 (an 8-byte big-endian total),
#: bitshuffle with lz4 or zstd (an 8-byte big-endian total, then the block size), blosc2 (the
#: sizes of its contiguous frame, of its chunk and of its b2nd chunk). bzip2 states none: its
#: stream is decoded (in bounded memory, the output dropped) to learn the size.
FILTER_ZSTD, FILTER_BLOSC, FILTER_LZ4 = 32015, 32001, 32004
FILTER_BZIP2, FILTER_BITSHUFFLE, FILTER_BLOSC2 = 307, 32008, 32026
_CHECKED_FILTERS = {
    FILTER_ZSTD: "zstd",
    FILTER_BLOSC: "blosc",
    FILTER_LZ4: "lz4",
    FILTER_BZIP2: "bzip2",
    FILTER_BITSHUFFLE: "bitshuffle",
    FILTER_BLOSC2: "blosc2",
}
_BITSHUFFLE_COMPRESSED = (2, 3)  # cd_values[4]: lz4, zstd (0: bitshuffle alone, no header)
_SHUFFLE = 2  # keeps the size: the decoded size of the stage below is the chunk's
_FLETCHER32 = 3  # appends a 4-byte checksum after the filtered bytes
#: What a filter below the checked one may add to the bytes it is given, beyond an eighth of
#: them: deflate, zstd, lz4, blosc, blosc2 and bzip2 grow incompressible data by less.
GROWTH_BYTES = 1024


class _Unreadable(ValueError):
    """The stored bytes are not the header their filter writes (the reason is the message)."""


class PluginSizeCheck:
    """Refuse plugin-filtered chunks that would decode to more than their chunk could.

    Each chunk a read touches is checked once, from its stored bytes (``read_direct_chunk``),
    before h5py reads it (bzip2's stream is decoded once more for it, its output dropped).
    When only size-keeping filters (shuffle) sit below the checked one, the stated size must
    be the chunk's (a blosc2 b2nd frame: the chunk rounded up per axis to its block shape);
    when a filter below may grow its bytes, up to an eighth more plus :data:`GROWTH_BYTES`
    per such filter. A header that cannot be read is refused too. Use :meth:`for_dataset`.
    """

    def __init__(
        self,
        dataset: Any,
        codes: list[int],
        where: str,
        values: list[tuple[int, ...]] | None = None,
    ) -> None:
        self._dsid = dataset.id
        self._chunks = tuple(int(n) for n in dataset.chunks)
        self._itemsize = int(dataset.id.get_type().get_size())
        self._nbytes = int(np.prod(self._chunks, dtype=np.int64)) * self._itemsize
        self._codes = codes
        self._values = values if values is not None else [() for _ in codes]
        self._where = where
        self._checked: set[tuple[int, ...]] = set()

    @classmethod
    def for_dataset(cls, dataset: Any, where: str) -> PluginSizeCheck | None:
        """A check for a chunked ``dataset`` with a filter it checks (see above), else ``None``."""
        if dataset.chunks is None or dataset.is_virtual:
            return None
        dcpl = dataset.id.get_create_plist()
        found = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
        codes = [int(f[0]) for f in found]
        if not set(codes) & set(_CHECKED_FILTERS):
            return None
        return cls(dataset, codes, where, [tuple(int(v) for v in f[2]) for f in found])

    def check(self, coords_list: list[tuple[int, ...]]) -> None:
        """Check each chunk of ``coords_list`` (grid coordinates) not checked before.

        Raises
        ------
        CorruptChunkError
            When a chunk states more decoded bytes than its chunk could hold (naming both),
            or its filter's header cannot be read.
        """
        for coords in coords_list:
            if coords in self._checked:
                continue
            offset = tuple(c * n for c, n in zip(coords, self._chunks))
            if self._dsid.get_chunk_info_by_coord(offset).byte_offset is not None:
                mask, raw = self._dsid.read_direct_chunk(offset)
                self._check_stored(coords, bytes(raw), mask)
            self._checked.add(coords)

    def _check_stored(self, coords: tuple[int, ...], raw: bytes, mask: int) -> None:
        active = [
            (c, v) for i, (c, v) in enumerate(zip(self._codes, self._values)) if not mask & (1 << i)
        ]
        while active and active[-1][0] == _FLETCHER32:  # outermost: the checksum is at the end
            active.pop()
            raw = raw[:-4]
        if not active or active[-1][0] not in _CHECKED_FILTERS:
            return
        code, values = active.pop()
        if code == FILTER_BITSHUFFLE and not _bitshuffle_compresses(values):
            return  # bitshuffle alone keeps the size and writes no header
        growing = [(c, v) for c, v in active if not _keeps_size(c, v)]
        limit = self._nbytes
        for _ in growing:
            limit += limit // 8 + GROWTH_BYTES
        name = _CHECKED_FILTERS[code]
        try:
            if code == FILTER_BZIP2:
                stated = _bzip2_size(raw, limit)
            elif code == FILTER_BLOSC2:
                stated, blocks = _blosc2_frame(raw)
                limit = max(limit, self._padded(blocks))
            else:
                stated = _stated_size(code, raw)
        except _Unreadable as exc:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._where} is corrupt: its {name} data "
                f"({len(raw)} stored bytes) {exc}, so the size HDF5's plugin would allocate "
                "for it is unknown"
            ) from None
        if stated is None or (stated <= limit and (growing or stated >= self._nbytes)):
            return
        over = code == FILTER_BZIP2 and stated > limit  # its decoding stopped one byte past
        states = "decodes to" + (" more than" if over else "") if code == FILTER_BZIP2 else "states"
        shown = limit if over else stated
        allowed = f" (up to {limit} with b2nd padding and the filters below)"
        bound = "" if limit == self._nbytes else allowed
        raise CorruptChunkError(
            f"chunk {coords} of HDF5 dataset {self._where} is corrupt: its {name} data "
            f"({len(raw)} stored bytes) {states} {shown} decoded bytes, a chunk has "
            f"{self._nbytes}{bound}; HDF5's plugin would allocate all of them"
        )

    def _padded(self, blocks: tuple[int, ...] | None) -> int:
        """The chunk's bytes rounded up per axis to the b2nd block shape ``blocks``."""
        if blocks is None or len(blocks) != len(self._chunks):
            return self._nbytes
        total = self._itemsize
        for n, b in zip(self._chunks, blocks):
            b = min(max(b, 1), n)
            total *= -(-n // b) * b
        return total


def _bitshuffle_compresses(values: tuple[int, ...]) -> bool:
    return len(values) >= 5 and values[4] in _BITSHUFFLE_COMPRESSED


def _keeps_size(code: int, values: tuple[int, ...]) -> bool:
    """Whether filter ``code`` gives back as many bytes as it was given (shuffles)."""
    return code == _SHUFFLE or (code == FILTER_BITSHUFFLE and not _bitshuffle_compresses(values))


def _stated_size(code: int, raw: bytes) -> int | None:
    """The decoded size the stored bytes of filter ``code`` state; ``None``: it states none.

    Raises ``_Unreadable`` when the bytes are too short for the header or not a zstd frame.
    """
    if code in (FILTER_LZ4, FILTER_BITSHUFFLE):  # 8-byte big-endian total, 4-byte block
        if len(raw) < 12:
            raise _Unreadable("is shorter than the 12-byte header that states its size")
        return int.from_bytes(raw[:8], "big")
    if code == FILTER_BLOSC:
        if len(raw) < 16:
            raise _Unreadable("is shorter than the 16-byte blosc header")
        return int.from_bytes(raw[4:8], "little")
    if len(raw) < 6 or raw[:4] != b"\x28\xb5\x2f\xfd":
        raise _Unreadable("is not a zstd frame")
    descriptor = raw[4]
    single = (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (single, 2, 4, 8)[descriptor >> 6]
    if size == 0:
        return None  # no content size: the plugin sizes its buffer from it, so allocates none
    if len(raw) < at + size:
        raise _Unreadable("is cut short inside its frame header")
    value = int.from_bytes(raw[at : at + size], "little")
    return value + 256 if size == 2 else value


# Offsets in a blosc2 contiguous frame's header, as c-blosc2's frame.c reads them (it reads
# the values at fixed places and checks none of the msgpack markers before them).
_HEADER_LEN, _FRAME_LEN, _FRAME_TYPE, _NBYTES, _CBYTES = 11, 16, 26, 30, 39
_TYPESIZE, _CHUNKSIZE, _METALAYERS, _HEADER_MINLEN = 48, 58, 91, 87
_CHUNK_HEADER = 32  # a blosc2 chunk's extended header
_MAX_METALAYERS, _B2ND_MAX_DIM = 16, 8


def _blosc2_frame(raw: bytes) -> tuple[int, tuple[int, ...] | None]:
    """The largest decoded size a blosc2 frame states, and its b2nd block shape if it has one.

    hdf5plugin's blosc2 filter stores each chunk as a contiguous frame holding one blosc2
    chunk; a chunk of two or more dimensions also carries a ``b2nd`` metalayer (shape, chunk
    and block shape), and its frame's sizes are the chunk rounded up to whole blocks. The
    plugin allocates the inner chunk's ``nbytes`` (a frame without b2nd) or the b2nd chunk
    (``extchunkshape`` times ``typesize``): the largest of those and of the frame's own
    ``uncompressed_size`` and ``chunksize`` is returned. Raises ``_Unreadable`` for bytes
    c-blosc2 would not read as a one-chunk frame.
    """
    if len(raw) < _METALAYERS + 3:
        raise _Unreadable(f"is shorter than a blosc2 frame header ({_METALAYERS + 3} bytes)")
    header_len = int.from_bytes(raw[_HEADER_LEN : _HEADER_LEN + 4], "big", signed=True)
    frame_len = int.from_bytes(raw[_FRAME_LEN : _FRAME_LEN + 8], "big", signed=True)
    if raw[_FRAME_TYPE] != 0 or not _HEADER_MINLEN <= header_len <= min(frame_len, len(raw)):
        raise _Unreadable("is not a blosc2 contiguous frame (type or header length)")
    nbytes = int.from_bytes(raw[_NBYTES : _NBYTES + 8], "big", signed=True)
    cbytes = int.from_bytes(raw[_CBYTES : _CBYTES + 8], "big", signed=True)
    typesize = int.from_bytes(raw[_TYPESIZE : _TYPESIZE + 4], "big", signed=True)
    chunksize = int.from_bytes(raw[_CHUNKSIZE : _CHUNKSIZE + 4], "big", signed=True)
    if nbytes < 0 or cbytes < 0 or typesize <= 0:
        raise _Unreadable("states a negative size or a typesize that is not positive")
    sizes = [nbytes, chunksize]
    blocks, ext = _b2nd_blocks(raw[:header_len], typesize)
    if ext is not None:
        sizes.append(ext)
    if nbytes > 0 and chunksize > 0:
        sizes.append(_first_chunk_nbytes(raw, header_len, cbytes))
    return max(sizes), blocks


def _first_chunk_nbytes(raw: bytes, header_len: int, cbytes: int) -> int:
    """The ``nbytes`` of the frame's first chunk (0 for a special chunk: the frame's sizes)."""
    at = header_len + cbytes  # the chunk offsets, a blosc2 chunk of int64
    if at + _CHUNK_HEADER > len(raw):
        raise _Unreadable("has no chunk offsets inside the frame")
    offsets = raw[at : at + _CHUNK_HEADER]
    special = (offsets[31] >> 4) & 7
    if special == 1:  # all zeros
        offset = 0
    elif offsets[2] & 0x02 or special == 3:  # stored as is, or one repeated value
        first = at + (_CHUNK_HEADER if offsets[2] & 0x05 == 0x05 else 16)  # extended header
        if first + 8 > len(raw):
            raise _Unreadable("is cut short inside its chunk offsets")
        offset = int.from_bytes(raw[first : first + 8], "little", signed=True)
    else:
        raise _Unreadable("has chunk offsets mixle does not decode (compressed or special)")
    if offset < 0:
        return 0  # a special chunk (zeros, NaNs): c-blosc2 makes it of the frame's chunksize
    start = header_len + offset
    if start + 16 > len(raw):
        raise _Unreadable("has a chunk offset outside the frame")
    return int.from_bytes(raw[start + 4 : start + 8], "little", signed=True)


def _b2nd_blocks(header: bytes, typesize: int) -> tuple[tuple[int, ...] | None, int | None]:
    """The b2nd block shape of a frame ``header`` and the b2nd chunk's bytes (or ``None``s).

    The metalayers are read as c-blosc2 reads them (``get_meta_from_header``,
    ``b2nd_deserialize_meta``), their marker bytes checked where it checks them.
    """
    if len(header) < _METALAYERS + 3 or header[_METALAYERS] != 0xDE:
        raise _Unreadable("has no metalayer index where a blosc2 frame has one")
    count = int.from_bytes(header[_METALAYERS + 1 : _METALAYERS + 3], "big")
    if count > _MAX_METALAYERS:
        raise _Unreadable(f"states {count} metalayers, more than blosc2's {_MAX_METALAYERS}")
    at = _METALAYERS + 3
    for _ in range(count):
        if at >= len(header) or header[at] & 0xE0 != 0xA0:
            raise _Unreadable("has a metalayer index blosc2 would not read")
        name = header[at + 1 : at + 1 + (header[at] & 0x1F)]
        at += 1 + len(name)
        if at + 5 > len(header) or header[at] != 0xD2:
            raise _Unreadable("has a metalayer index blosc2 would not read")
        content = int.from_bytes(header[at + 1 : at + 5], "big", signed=True)
        at += 5
        if name not in (b"b2nd", b"caterva"):
            continue
        if not 0 <= content <= len(header) - 5 or header[content] != 0xC6:
            raise _Unreadable("has a b2nd metalayer blosc2 would not read")
        size = int.from_bytes(header[content + 1 : content + 5], "big", signed=True)
        return _b2nd_shape(header[content + 5 : content + 5 + max(size, 0)], typesize)
    return None, None


def _b2nd_shape(meta: bytes, typesize: int) -> tuple[tuple[int, ...], int]:
    """The block shape in b2nd metadata ``meta`` and the bytes of its padded chunk."""
    ndim = meta[2] if len(meta) > 2 else 0
    if not 1 <= ndim <= _B2ND_MAX_DIM or len(meta) < 4 + ndim * 9 + 2 + ndim * 10:
        raise _Unreadable("has b2nd metadata blosc2 would not read")
    at = 4
    shape = [
        int.from_bytes(meta[at + 9 * i + 1 : at + 9 * i + 9], "big", signed=True)
        for i in range(ndim)
    ]
    at += 9 * ndim + 1
    chunks = [
        int.from_bytes(meta[at + 5 * i + 1 : at + 5 * i + 5], "big", signed=True)
        for i in range(ndim)
    ]
    at += 5 * ndim + 1
    blocks = [
        int.from_bytes(meta[at + 5 * i + 1 : at + 5 * i + 5], "big", signed=True)
        for i in range(ndim)
    ]
    if min(chunks) <= 0 or min(blocks) <= 0:
        raise _Unreadable("has a b2nd chunk or block shape that is not positive")
    ext = typesize
    for n, c, b in zip(shape, chunks, blocks):
        ext *= c if n == 0 or c % b == 0 else c + b - c % b
    return tuple(blocks), ext


def _bzip2_size(raw: bytes, limit: int) -> int:
    """The size ``raw``'s bzip2 stream decodes to, up to ``limit + 1``.

    Decoded in steps of at most 1 MiB whose output is dropped, so checking a chunk holds
    about 1 MiB however much its stream would decode to. Raises ``_Unreadable`` for a
    stream that is not bzip2 or is cut short.
    """
    import bz2

    decoder = bz2.BZ2Decompressor()
    step = 1 << 20
    try:
        total = len(decoder.decompress(raw, max_length=min(step, limit + 1)))
        while not decoder.eof and total <= limit:
            part = decoder.decompress(b"", max_length=min(step, limit + 1 - total))
            if not part and not decoder.eof:
                raise _Unreadable("is a bzip2 stream cut short")
            total += len(part)
    except (OSError, ValueError, EOFError) as exc:
        if isinstance(exc, _Unreadable):
            raise
        raise _Unreadable("is not a valid bzip2 stream") from None
    return total
