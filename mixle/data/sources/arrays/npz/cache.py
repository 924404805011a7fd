"""Compressed ``.npz`` members decompressed once into mixle's cache, as ``.npy`` files.

A member's cache file is named by the SHA-256 of its stored (compressed) bytes, its
CRC-32, sizes and method, so the same content in any file, under any name, shares one
cache file, and a changed member never reads a stale one. The bytes hashed are the very
entry decompressed (opened by its directory entry, not by name: a zip can hold one name
twice), and the CRC-32 of what is written is checked against the entry's.

The file is written to a temporary name in the cache folder and published with
``os.link`` (atomic, and never over an existing file): of several processes decompressing
the same member at once, the first to publish wins and the others use its copy, so a copy
another process has mapped is never replaced (which would make its next read raise
:class:`~mixle.errors.FileChangedError`). A cached copy is used only when its size and
``.npy`` header are the member's (the header is decompressed from the member to compare).
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from mixle.data.sources.arrays.memmap.source import NPY_HEADER_LIMIT
from mixle.data.sources.arrays.npz.members import NpzMember, zip_entry
from mixle.data.sources.records.text.row_index import cache_dir
from mixle.errors import CorruptChunkError
from mixle.utils.files import publish_file

__all__ = ["NPZ_CACHE_FOLDER", "decompressed_member", "member_digest"]

#: Sub-folder of :func:`~mixle.data.sources.records.text.row_index.cache_dir` for members.
NPZ_CACHE_FOLDER = "npz"
#: Bytes read (hashed, or decompressed) at a time.
_PIECE = 4 * 1024 * 1024


def member_digest(fh: BinaryIO, member: NpzMember, start: int) -> str:
    """Hex SHA-256 of ``member``'s stored bytes at ``start`` and its directory entry."""
    digest = hashlib.sha256(
        f"{member.crc}:{member.file_size}:{member.compress_size}:{member.compress_type}:".encode()
    )
    fh.seek(start)
    left = member.compress_size
    while left:
        piece = fh.read(min(left, _PIECE))
        if not piece:
            raise ValueError(f"member {member.shown!r} ends early: the file is cut short")
        digest.update(piece)
        left -= len(piece)
    return digest.hexdigest()


def _npy_head(stream: BinaryIO) -> bytes:
    """The ``.npy`` magic, version, length field and header text at the start of ``stream``.

    At most ``NPY_HEADER_LIMIT`` bytes of header text are read; what is not a ``.npy``
    header returns the bytes read so far (compared, they then differ).
    """
    magic = stream.read(8)  # b"\x93NUMPY", major and minor version
    if len(magic) < 8 or not magic.startswith(b"\x93NUMPY"):
        return magic
    length = stream.read(2 if magic[6] == 1 else 4)
    text_len = int.from_bytes(length, "little")
    return magic + length + stream.read(min(text_len, NPY_HEADER_LIMIT))


def _cached_copy_is_the_members(target: Path, fh: BinaryIO, member: NpzMember) -> bool:
    """Whether the cache file ``target`` has ``member``'s size and ``.npy`` header."""
    try:
        if target.stat().st_size != member.file_size:
            return False
        with open(target, "rb") as cached:
            head = _npy_head(cached)
        with zipfile.ZipFile(fh) as zf, zf.open(zip_entry(zf, member)) as src:
            return _npy_head(src) == head
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, zlib.error, lzma.LZMAError):
        return False  # decompressed in full below, which says what is wrong


def decompressed_member(path: str, fh: BinaryIO, member: NpzMember, start: int) -> Path:
    """The cache file holding ``member`` decompressed (a ``.npy`` file), made if missing.

    ``start`` is where ``member``'s stored bytes begin in ``fh``
    (:func:`~mixle.data.sources.arrays.npz.members.member_data_start`).

    Raises
    ------
    CorruptChunkError
        When the member does not decompress, or its CRC-32 does not match (the file is
        damaged); nothing is left in the cache.
    OSError
        When the cache folder cannot be written (``MIXLE_CACHE_DIR`` picks another).
    """
    folder = cache_dir() / NPZ_CACHE_FOLDER
    target = folder / f"{member_digest(fh, member, start)}.npy"
    if target.is_file() and _cached_copy_is_the_members(target, fh, member):
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".partial-", suffix=".npy")
    except OSError as exc:
        raise OSError(
            f"member {member.shown!r} of {path!r} cannot be decompressed into the cache "
            f"folder {str(folder)!r} ({exc}); set MIXLE_CACHE_DIR to a writable folder"
        ) from exc
    try:
        crc = 0
        with (
            os.fdopen(fd, "wb") as out,
            zipfile.ZipFile(fh) as zf,
            zf.open(zip_entry(zf, member)) as src,  # zipfile checks the CRC-32 too
        ):
            while piece := src.read(_PIECE):
                crc = zlib.crc32(piece, crc)
                out.write(piece)
        written = os.path.getsize(temp)
        if written != member.file_size:
            raise zipfile.BadZipFile(f"decompressed to {written:,} bytes, not {member.file_size:,}")
        if crc != member.crc:
            raise zipfile.BadZipFile(
                f"the decompressed bytes have CRC-32 {crc:08x}, the entry says {member.crc:08x}"
            )
        publish_file(temp, target, lambda: _cached_copy_is_the_members(target, fh, member))
    except (
        zipfile.BadZipFile,
        EOFError,
        ValueError,
        NotImplementedError,
        RuntimeError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        raise CorruptChunkError(
            f"member {member.shown!r} of {path!r} does not decompress ({member.method}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    finally:
        _remove(temp)
    return target


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
