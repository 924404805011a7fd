"""Members of a local zip file read by mixle itself: positioned reads, no lock, checked.

zarr's ``ZipStore`` reads every member under one lock, on zarr's event loop. A zarr store
in a zip file is mostly stored (``ZIP_STORED``) or deflated members: :class:`ZipMembers`
reads those with ``os.pread`` on its own descriptor, from any thread at once, inflates
deflated ones bounded by the chunk's size, and checks every member's CRC-32 and length
against the zip's central directory, so a damaged member raises
:class:`~mixle.reading.CorruptChunkError` naming the zip file and the member, never a
wrong value. Members of other compressions (bzip2, lzma) are read through ``zipfile``.
"""

from __future__ import annotations

import os
import struct
import weakref
import zipfile
import zlib
from typing import Any

from mixle.reading import CorruptChunkError

__all__ = ["ZipMembers", "zip_file_of"]

#: Bytes of a zip local file header before the member's name and extra field.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
#: ``flag_bits`` bit of an encrypted member.
_ENCRYPTED = 0x1


def zip_file_of(store: Any) -> zipfile.ZipFile:
    """The open ``zipfile.ZipFile`` of a zarr ``ZipStore`` (its central directory parsed)."""
    zf = getattr(store, "_zf", None)
    if not isinstance(zf, zipfile.ZipFile) and not getattr(store, "_is_open", True):
        opener = getattr(store, "_sync_open", None)
        if opener is not None:
            opener()
        zf = getattr(store, "_zf", None)
    if isinstance(zf, zipfile.ZipFile) and zf.fp is not None:
        return zf
    return zipfile.ZipFile(os.fspath(store.path), mode="r")  # zarr's internals changed


class ZipMembers:
    """Read members of a local zip file by name, from many threads at once.

    Parameters
    ----------
    zf
        The zip file, opened read-only (its central directory gives each member's place,
        sizes and CRC-32).
    path
        Its path: a descriptor of its own is opened for positioned reads (closed when this
        object is collected).
    """

    def __init__(self, zf: zipfile.ZipFile, path: str) -> None:
        self._zf = zf
        self._path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)
        self._starts: dict[str, int] = {}  # member -> offset of its data (after its header)

    def size(self, name: str) -> int | None:
        """Uncompressed size of member ``name`` as the zip records it (``None``: no member)."""
        try:
            return int(self._zf.getinfo(name).file_size)
        except KeyError:
            return None

    def read(self, name: str, limit: int, what: str) -> bytes | None:
        """Member ``name``'s bytes (``None`` if the zip has no such member).

        Parameters
        ----------
        name
            The member's name (the zarr store key).
        limit
            The most bytes it may hold uncompressed.
        what
            How errors name it ("chunk '0/1' of zarr array ...").

        Raises
        ------
        CorruptChunkError
            When the member is larger than ``limit``, is a folder, is encrypted, or its
            bytes do not match the zip's central directory (length, CRC-32, header).
        """
        try:
            info = self._zf.getinfo(name)
        except KeyError:
            return None
        where = f"{what}: member {name!r} of zip file {self._path!r}"
        if info.is_dir():
            raise CorruptChunkError(f"{where} is a folder, not a stored chunk")
        if info.flag_bits & _ENCRYPTED:
            raise CorruptChunkError(f"{where} is encrypted; mixle reads unencrypted zip files")
        if info.file_size > limit:
            raise CorruptChunkError(
                f"{where} has {info.file_size:,} bytes, more than the {limit:,} a stored chunk "
                "of this array can have"
            )
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            return self._read_by_zipfile(info, limit, where)
        raw = os.pread(self._fd, info.compress_size, self._data_start(info, where))
        if len(raw) != info.compress_size:
            raise CorruptChunkError(
                f"{where} is truncated: {len(raw):,} of its {info.compress_size:,} stored bytes "
                "are in the file"
            )
        if info.compress_type == zipfile.ZIP_DEFLATED:
            raw = _inflate(raw, limit, where)
        return _checked(raw, info, where)

    def _data_start(self, info: zipfile.ZipInfo, where: str) -> int:
        start = self._starts.get(info.filename)
        if start is not None:
            return start
        header = os.pread(self._fd, _LOCAL_HEADER.size, info.header_offset)
        if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
            raise CorruptChunkError(f"{where} has no valid local header (damaged zip file)")
        fields = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        self._starts[info.filename] = start
        return start

    def _read_by_zipfile(self, info: zipfile.ZipInfo, limit: int, where: str) -> bytes:
        try:
            with self._zf.open(info) as member:
                data = member.read(limit + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise CorruptChunkError(f"{where} cannot be read: {reason}") from None
        if len(data) > limit:
            raise CorruptChunkError(f"{where} inflates past {limit:,} bytes")
        return data


def _inflate(raw: bytes, limit: int, where: str) -> bytes:
    """A deflated member's bytes, at most ``limit + 1`` of them ever made."""
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise CorruptChunkError(f"{where} does not inflate: {exc}") from None
    if len(data) > limit:
        raise CorruptChunkError(f"{where} inflates past {limit:,} bytes")
    return data


def _checked(data: bytes, info: zipfile.ZipInfo, where: str) -> bytes:
    """``data`` if its length and CRC-32 are those the zip's central directory records."""
    if len(data) != info.file_size:
        raise CorruptChunkError(
            f"{where} is corrupt: {len(data):,} bytes where the zip records {info.file_size:,}"
        )
    if zlib.crc32(data) != info.CRC:
        raise CorruptChunkError(f"{where} is corrupt: its CRC-32 does not match the zip's")
    return data
