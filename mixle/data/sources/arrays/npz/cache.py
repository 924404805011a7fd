"""Compressed ``.npz`` members decompressed once into mixle's cache, as ``.npy`` files.

A member's cache file is named by the SHA-256 of its stored (compressed) bytes, its
CRC-32, sizes and method, so the same content in any file, under any name, shares one
cache file, and a changed member never reads a stale one. The file is written to a
temporary name in the cache folder and moved into place with ``os.replace`` (atomic), so a
crash or a concurrent writer never leaves a partial cache file under the final name.
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

from mixle.data.sources.arrays.npz.members import NpzMember
from mixle.data.sources.records.text.row_index import cache_dir
from mixle.errors import CorruptChunkError

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


def decompressed_member(path: str, fh: BinaryIO, member: NpzMember, start: int) -> Path:
    """The cache file holding ``member`` decompressed (a ``.npy`` file), made if missing.

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
    if target.is_file() and target.stat().st_size == member.file_size:
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
        # zipfile checks the CRC-32 at the end
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(fh) as zf, zf.open(member.name) as src:
            while piece := src.read(_PIECE):
                out.write(piece)
        if os.path.getsize(temp) != member.file_size:
            raise zipfile.BadZipFile(
                f"decompressed to {os.path.getsize(temp):,} bytes, not {member.file_size:,}"
            )
        os.replace(temp, target)
    except (
        zipfile.BadZipFile,
        EOFError,
        ValueError,
        NotImplementedError,
        RuntimeError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        _remove(temp)
        raise CorruptChunkError(
            f"member {member.shown!r} of {path!r} does not decompress ({member.method}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    except BaseException:
        _remove(temp)
        raise
    return target


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
