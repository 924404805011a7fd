"""Decompressed copies of gzipped NIfTI data (``.nii.gz``, ``.img.gz``), cached on disk.

gzip cannot seek, so a patch cannot be cut out of a ``.nii.gz`` without decompressing
everything before it. The first open decompresses the whole stream once into the mixle
cache directory (``$MIXLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixle``, else
``~/.cache/mixle``; folder ``nifti/``); later opens, in any process, find it with a
``stat`` and a few small reads and memory-map it. The user's file is only ever read.

Cost: the first open inflates and writes the whole volume once (nibabel instead streams
through the gzip up to every patch it cuts, on every read); later opens cost a ``stat``,
the fingerprint reads below, the header and a map, and a patch read then costs what it
costs in a ``.nii``. The copy takes the volume's size on disk. ``benchmarks/patch_read.py
--only nii.gz`` measures both against nibabel.

Cache key. An entry is named by the file's real path and a version key: its device,
inode, size, modification and status-change times, the size of the data expected from
the header, and a content fingerprint of the compressed file (eight evenly spaced 64 KiB
blocks, the first and the last included:
:func:`~mixle.data.sources.records.text.row_index.content_fingerprint`). The last
block holds the gzip trailer, the CRC-32 and length of the whole decompressed stream, so
the key follows the content, not just the file's dates. A SHA-256 of every compressed byte
would be paid on every open and grow with the file, where the fingerprint costs the same
few reads whatever the size; the fingerprint was chosen. A file
changed in any way gets a new entry and the old entries of that path are deleted.

An entry is served only when its size is exactly the data size the header gives and its
first bytes equal the header read from the compressed file; any other entry is rebuilt,
never read. Entries are written to a temporary file in the cache folder, checked there
(size and first bytes) and then published with ``os.link``, which never replaces a file:
of processes decompressing the same file at once, the first to publish wins and the
others open its copy, so a copy another process has mapped is never replaced, and a
reader never sees a partial one. A failed or interrupted decompression (a corrupt stream,
a full disk) deletes its temporary file; one left by a killed process is deleted by
eviction once it is an hour old. A copy is mapped from the descriptor on which it was
checked, never reopened by name, so eviction by another process between the check and the
map cannot make a valid file look changed.

Size bound. The folder keeps at most :data:`NIFTI_CACHE_BYTES` (32 GiB) of copies, or
``$MIXLE_NIFTI_CACHE_BYTES`` bytes when set. Every open that finds its copy marks it used
(sets its modification time); after a new copy is written, the least recently used other
copies are deleted until the folder fits. A copy mapped by an open source of this process
is never deleted; one mapped by another process may be: on Linux (and other POSIX
systems) unlinking a mapped file leaves the mapping and its data valid until it is
unmapped, and that process's next open simply decompresses again. The copy just made is
kept even when it alone is over the budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

from mixle.data.sources.arrays.memmap.check import FileSignature, file_signature
from mixle.data.sources.records.text.row_index import cache_dir, content_fingerprint
from mixle.errors import CorruptChunkError
from mixle.utils.files import env_byte_budget, open_regular_file, publish_file

__all__ = [
    "CACHE_BYTES_ENV",
    "CACHE_FOLDER",
    "NIFTI_CACHE_BYTES",
    "DECOMPRESS_BLOCK_BYTES",
    "INPUT_BLOCK_BYTES",
    "STALE_TEMP_SECONDS",
    "cache_budget",
    "entry_path",
    "find_cached",
    "mapped",
    "open_copy",
    "unmapped",
]

#: Sub-folder of :func:`cache_dir` holding decompressed NIfTI data.
CACHE_FOLDER = "nifti"
#: Default most bytes of decompressed copies kept in :data:`CACHE_FOLDER` (32 GiB).
NIFTI_CACHE_BYTES = 32 * 2**30
#: Environment variable overriding :data:`NIFTI_CACHE_BYTES` (a whole number of bytes).
CACHE_BYTES_ENV = "MIXLE_NIFTI_CACHE_BYTES"
#: Most bytes inflated per step while decompressing (bounds the memory it takes).
DECOMPRESS_BLOCK_BYTES = 4 * 2**20
#: Bytes of the compressed file read per step.
INPUT_BLOCK_BYTES = 2**20
#: zlib's window bits for one gzip member (header and CRC-32/length trailer checked).
_GZIP_WBITS = 16 + zlib.MAX_WBITS
#: The first two bytes of every gzip member.
_GZIP_MAGIC = b"\x1f\x8b"
#: Temporary files in the cache folder older than this (seconds) are deleted by eviction.
STALE_TEMP_SECONDS = 3600
#: Bumped when the entry format changes: older entries are then never served.
_FORMAT = "v1"


#: Cache entries mapped by open sources of this process (entry -> number of maps).
_MAPPED: Counter[Path] = Counter()
_MAPPED_LOCK = threading.Lock()


def mapped(entry: Path) -> None:
    """Record that a source of this process mapped ``entry``: eviction leaves it alone."""
    with _MAPPED_LOCK:
        _MAPPED[entry] += 1


def unmapped(entry: Path) -> None:
    """Record that a map of ``entry`` recorded by :func:`mapped` was closed."""
    with _MAPPED_LOCK:
        _MAPPED[entry] -= 1
        if _MAPPED[entry] <= 0:
            del _MAPPED[entry]


def cache_budget() -> int:
    """Most bytes of decompressed copies to keep: ``$MIXLE_NIFTI_CACHE_BYTES``, else 32 GiB.

    Raises
    ------
    ValueError
        When the variable is set but is not a whole number of bytes >= 0.
    """
    return env_byte_budget(CACHE_BYTES_ENV, NIFTI_CACHE_BYTES, "decompressed NIfTI copies to keep")


def _touch(entry: Path) -> None:
    """Mark ``entry`` used now (its modification time orders eviction)."""
    with contextlib.suppress(OSError):  # another user's entry in a shared cache
        os.utime(entry)


def _evict(folder: Path, keep: Path, budget: int) -> None:
    """Delete the least recently used copies until the folder holds at most ``budget`` bytes.

    Temporary files older than :data:`STALE_TEMP_SECONDS` (left by a process killed while
    decompressing) are deleted; younger ones (being written) count toward the budget.
    ``keep`` (the copy just made) and copies mapped by this process are never deleted. A
    copy another process has mapped may be: on POSIX systems unlinking a mapped file
    leaves the mapping valid (the data stays until it is unmapped) and that process's
    next open decompresses again.
    """
    entries: list[tuple[int, int, Path]] = []
    total = 0
    stale = time.time_ns() - STALE_TEMP_SECONDS * 10**9
    for tmp in folder.glob(".*.tmp"):  # copies being written, or left by a killed process
        try:
            st = tmp.stat()
        except OSError:  # published or deleted meanwhile
            continue
        if st.st_mtime_ns < stale:
            with contextlib.suppress(OSError):
                tmp.unlink()
                continue
        total += st.st_size
    for entry in folder.glob("*.raw"):
        try:
            st = entry.stat()
        except OSError:  # deleted meanwhile
            continue
        total += st.st_size
        entries.append((st.st_mtime_ns, st.st_size, entry))
    if total <= budget:
        return
    with _MAPPED_LOCK:
        busy = set(_MAPPED)
    for _, size, entry in sorted(entries):
        if total <= budget:
            return
        if entry == keep or entry in busy:
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
            total -= size


def _keys(real: str, signature: FileSignature, fingerprint: str, expected: int) -> tuple[str, str]:
    file_key = hashlib.sha256(real.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    parts = [*map(str, signature), fingerprint, str(expected), _FORMAT]
    version = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return file_key, version


def entry_path(path: str, expected: int) -> tuple[Path, FileSignature]:
    """Where the decompressed copy of the gzip file ``path`` lives, and ``path``'s signature.

    One ``fstat`` and :data:`~mixle.data.sources.records.text.row_index.FINGERPRINT_BLOCKS`
    small reads; nothing is decompressed.
    """
    real = os.path.realpath(path)
    with open_regular_file(path, "path") as fh:
        signature = file_signature(os.fstat(fh.fileno()))
        fingerprint = content_fingerprint(fh.fileno(), signature[2])
    file_key, version = _keys(real, signature, fingerprint, expected)
    return cache_dir() / CACHE_FOLDER / f"{file_key}-{version}.raw", signature


def _valid(entry: Path, expected: int, prefix: bytes) -> bool:
    """Whether ``entry`` is a complete copy: exactly ``expected`` bytes starting with ``prefix``."""
    try:
        with open_regular_file(entry, "cache file") as fh:
            if os.fstat(fh.fileno()).st_size != expected:
                return False
            return fh.read(len(prefix)) == prefix
    except OSError:
        return False


def find_cached(path: str, expected: int, prefix: bytes) -> Path | None:
    """The valid decompressed copy of ``path`` if the cache holds one, else ``None``.

    Decompresses nothing (one ``fstat``, the fingerprint reads and a check of the copy).
    """
    entry, _ = entry_path(path, expected)
    return entry if _valid(entry, expected, prefix) else None


def _open_valid(entry: Path, expected: int, prefix: bytes) -> BinaryIO | None:
    """``entry`` opened for reading when it is a complete copy, else ``None``.

    The checks are made on the opened descriptor, so a map made from it is of the file
    that was checked even when another process unlinks ``entry`` a moment later.
    """
    try:
        fh = open_regular_file(entry, "cache file")
    except OSError:  # absent, or evicted between the lookup and the open
        return None
    try:
        if os.fstat(fh.fileno()).st_size == expected and fh.read(len(prefix)) == prefix:
            fh.seek(0)
            return fh
    except OSError:
        pass
    fh.close()
    return None


def open_copy(path: str, expected: int, prefix: bytes) -> tuple[Path, FileSignature, BinaryIO]:
    """The decompressed copy of ``path``'s first ``expected`` bytes, opened; made if not cached.

    Parameters
    ----------
    path
        The gzip file (the user's; only read).
    expected
        Bytes of decompressed data the image needs (header, extensions and data block for a
        ``.nii.gz``; the data block and its offset for an ``.img.gz``). The rest of the
        gzip member holding the last of them is decompressed (to check its CRC) but not
        stored; later members and trailing bytes are not read (nibabel never reads them).
    prefix
        What the copy must start with (the header as read from ``path``), checked on every
        open of a cached copy.

    Returns
    -------
    tuple
        The cache entry, ``path``'s :func:`file_signature` when it was keyed, and the copy
        opened for reading (the caller closes it). The open file was checked (size and
        first bytes) on its own descriptor: map it, not the path, which another process's
        eviction may unlink at any moment (the open file and a map of it stay valid).

    Raises
    ------
    CorruptChunkError
        When the gzip stream does not decompress (bad data, bad CRC, cut short inside a
        block), naming the file, or when ``path`` changed while it was read; no cache
        entry is left behind.
    ValueError
        When the stream decompresses to fewer bytes than the header needs (a truncated
        image), naming the file and both sizes.
    OSError
        When the cache directory cannot be written (the message names it and
        ``MIXLE_CACHE_DIR``).
    """
    entry, signature = entry_path(path, expected)
    fh = _open_valid(entry, expected, prefix)
    if fh is not None:
        _touch(entry)
        return entry, signature, fh
    budget = cache_budget()  # a bad $MIXLE_NIFTI_CACHE_BYTES fails before any work
    folder = entry.parent
    file_key = entry.name.split("-", 1)[0]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{file_key}-", suffix=".tmp")
    except OSError as exc:
        raise _cache_error(path, folder, exc) from None
    try:
        with os.fdopen(handle, "wb") as out:
            written = _inflate(path, expected, out, folder)
            if written < expected:
                raise ValueError(
                    f"path={path!r} decompresses to {written} bytes, but its NIfTI header "
                    f"needs {expected} (data offset and data block): the image is truncated"
                )
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as exc:  # a full disk may only show here
                raise _cache_error(path, folder, exc) from None
        fh = _open_valid(Path(tmp), expected, prefix)  # checked before it is published
        if fh is None:
            raise _mismatch(path, expected, entry)
        try:
            os.chmod(tmp, 0o444)
            theirs: list[BinaryIO] = []

            def keep_theirs() -> bool:  # another process published a good copy first
                found = _open_valid(entry, expected, prefix)
                theirs.extend([] if found is None else [found])
                return found is not None

            if not publish_file(tmp, entry, keep_theirs):
                fh.close()
                fh = theirs[0]
        except OSError as exc:
            fh.close()
            raise _cache_error(path, folder, exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    for old in folder.glob(f"{file_key}-*.raw"):  # copies of earlier versions of this file
        if old != entry:
            with contextlib.suppress(OSError):
                old.unlink()
    _evict(folder, entry, budget)
    return entry, signature, fh


def _mismatch(path: str, expected: int, entry: Path) -> CorruptChunkError:
    """The error for a decompressed copy that does not start with the header read before.

    "Changed" only when ``path``'s version key (signature and content fingerprint) is no
    longer the one ``entry`` was named by.
    """
    try:
        now: Path | None = entry_path(path, expected)[0]
    except OSError:
        now = None
    if now != entry:
        return CorruptChunkError(
            f"path={path!r} decompressed to data that does not start with the header read "
            "from it a moment before: the file changed while it was read; open it again"
        )
    return CorruptChunkError(
        f"path={path!r} decompressed to data that does not start with the NIfTI header "
        "read from the same gzip stream: the file is corrupt; no cached copy was kept"
    )


def _inflate(path: str, expected: int, out: BinaryIO, folder: Path) -> int:
    """Decompress ``path`` into ``out``, keeping its first ``expected`` bytes; bytes written.

    Every gzip member is inflated with zlib, which checks each member's CRC-32 and length.
    Once the member holding the last needed byte has ended (its CRC checked), the rest of
    the file is not read, as nibabel, which reads only the bytes the image needs, does not
    read it either: further members, zero padding or trailing bytes that are not gzip at
    all never change the image. Before that, zero padding between members is skipped (as
    Python's ``gzip`` does) and anything else must be a gzip member.
    """
    written = 0
    inflater: Any = None  # None: between members
    with open_regular_file(path, "path") as fh:
        while True:
            data = fh.read(INPUT_BLOCK_BYTES)
            if not data:
                break
            while data:
                if inflater is None:
                    if written >= expected:  # every needed byte came from checked members
                        return written
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                    if written and not _GZIP_MAGIC.startswith(data[:2]):
                        raise _corrupt(
                            path,
                            written,
                            f"the bytes after its gzip stream, {data[:8]!r}..., are not another "
                            f"gzip member, and the image needs {expected} bytes",
                        )
                    inflater = zlib.decompressobj(_GZIP_WBITS)
                try:
                    block = inflater.decompress(data, DECOMPRESS_BLOCK_BYTES)
                except zlib.error as exc:
                    raise _corrupt(path, written, str(exc)) from None
                if block and written < expected:
                    keep = memoryview(block)[: expected - written]
                    try:
                        out.write(keep)
                    except OSError as exc:
                        raise _cache_error(path, folder, exc) from None
                    written += len(keep)
                if inflater.eof:
                    data, inflater = inflater.unused_data, None
                else:
                    data = inflater.unconsumed_tail
    if inflater is not None:
        raise _corrupt(path, written, "the file ends inside a gzip stream (cut short)")
    return written


def _corrupt(path: str, written: int, why: str) -> CorruptChunkError:
    return CorruptChunkError(
        f"path={path!r} is a corrupt gzip stream: decompressing it failed after {written} "
        f"bytes ({why}); no cached copy was kept"
    )


def _cache_error(path: str, folder: Path, exc: OSError) -> OSError:
    return OSError(
        exc.errno,
        f"path={path!r} is gzipped and must be decompressed once into mixle's cache "
        f"directory {str(folder)!r} to be read by patches, but writing there failed "
        f"({exc.strerror or exc}); free space there or set MIXLE_CACHE_DIR to a writable "
        "folder with room for the decompressed volume",
    )
