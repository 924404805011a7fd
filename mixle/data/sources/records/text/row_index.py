"""Byte-offset row index of a text file (CSV, JSON lines), built in one pass and cached.

The index is the start offset of every non-blank row, plus the file size at the end: row
``i`` is the bytes ``[starts[i], starts[i + 1])`` (its line end and any blank lines after it
included); where rows end is :mod:`mixle.data.sources.records.text.row_scan`.

Indexes are written to a user cache directory, never next to the data: ``$MIXLE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/mixle``, else ``~/.cache/mixle``; the file name is keyed by the real
path, device, inode, size, modification and status-change times of the data file, a
:func:`content_fingerprint` of it and the format options, so a changed file gets a new index
(and the old one is deleted) even when it was rewritten in place at the same size with its
old modification time restored (``rsync --inplace -t``). When the cache directory cannot be
written the index lives in memory only; when writing it fails midway (a full disk, a quota)
the partial file is deleted, a :class:`RowIndexCacheWarning` names the directory, and the
index lives in memory too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.arrays.memmap.check import (
    FileSignature,
    check_file_unchanged,
    file_signature,
)
from mixle.data.sources.records.text.row_scan import scan_row_starts
from mixle.errors import RowIndexCacheWarning
from mixle.utils.files import cache_dir
from mixle.utils.progress import progress_bar

__all__ = [
    "FINGERPRINT_BLOCKS",
    "FINGERPRINT_BLOCK_BYTES",
    "RowIndex",
    "RowIndexCacheWarning",
    "cache_dir",
    "content_fingerprint",
    "load_row_index",
]

#: Bytes hashed at each place sampled for a file's content fingerprint.
FINGERPRINT_BLOCK_BYTES = 64 * 2**10
#: Places sampled for the fingerprint: the first and last blocks and evenly spaced ones.
FINGERPRINT_BLOCKS = 8


class RowIndex:
    """Row start offsets of one file, memory-mapped from the cache (or held in memory).

    Attributes
    ----------
    starts
        ``int64`` offsets: one per row, then the file size.
    origin
        ``"built"`` when this process scanned the file, ``"cached"`` when it was read from
        the cache directory.
    path
        The cache file, or ``None`` when the index is held in memory only.
    """

    def __init__(self, starts: NDArray[np.int64], origin: str, path: Path | None) -> None:
        self.starts = starts
        self.origin = origin
        self.path = path

    def __len__(self) -> int:
        return len(self.starts) - 1


def content_fingerprint(fd: int, size: int) -> str:
    """A hash of the size and of :data:`FINGERPRINT_BLOCKS` evenly spaced blocks of a file.

    The blocks include the first and the last; a file of at most ``FINGERPRINT_BLOCKS *
    FINGERPRINT_BLOCK_BYTES`` bytes is hashed whole. The cost does not grow with the size.
    """
    digest = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    span = FINGERPRINT_BLOCK_BYTES
    if size <= span * FINGERPRINT_BLOCKS:
        places = range(0, size, span)
    else:
        places = np.linspace(0, size - span, FINGERPRINT_BLOCKS).astype(np.int64).tolist()
    for place in places:
        digest.update(os.pread(fd, span, place))
    return digest.hexdigest()


def _keys(real: str, signature: FileSignature, options: str, fingerprint: str) -> tuple[str, str]:
    file_key = hashlib.sha256(real.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    version = "\0".join([*map(str, signature), options, fingerprint, "v3"])
    return file_key, hashlib.sha256(version.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _read_cached(path: Path, size: int) -> NDArray[np.int64] | None:
    try:
        nbytes = path.stat().st_size
        if nbytes < 8 or nbytes % 8:
            return None
        starts = np.memmap(path, dtype="<i8", mode="r")
    except (OSError, ValueError):
        return None
    if int(starts[-1]) != size:  # truncated or foreign file: rebuild
        return None
    return starts  # type: ignore[return-value]


def load_row_index(
    fd: int,
    real_path: str,
    start: int,
    quote: int | None,
    options: str,
    progress: bool | None,
    *,
    delimiter: int | None = None,
    blank_whitespace: bool = False,
    lone_cr: bool = False,
    expected: FileSignature | None = None,
) -> RowIndex:
    """The row index of the open file ``fd``: from the cache when it is current, else built.

    Parameters
    ----------
    fd
        An open file descriptor of the data file (read with ``os.pread``).
    real_path
        The file's real path (part of the cache key).
    start
        Offset of the first row to index (after a byte-order mark).
    quote
        The CSV quote byte, or ``None`` for JSON lines.
    options
        Format options that change row boundaries (part of the cache key).
    progress
        Show a progress bar (bytes scanned) while building: ``True``, ``False`` or ``None``
        (see :mod:`mixle.utils.progress`).
    delimiter, blank_whitespace, lone_cr
        As for :func:`scan_row_starts` (``options`` must name them).
    expected
        The file's :func:`~mixle.data.sources.arrays.memmap.check.file_signature` when the caller
        read its header; by default not checked.

    Raises
    ------
    FileChangedError
        The file differs from ``expected``, or changed while it was scanned (then no index
        is stored).

    Notes
    -----
    A cached index is used only for the same path, device, inode, size, modification and
    status-change times, content fingerprint and options; any other index of the same path
    is deleted when a new one is stored.
    """
    signature = file_signature(os.fstat(fd))
    if expected is not None:
        check_file_unchanged(real_path, expected, signature)
    size = signature[2]
    fingerprint = content_fingerprint(fd, size)
    file_key, version = _keys(real_path, signature, options, fingerprint)
    folder = cache_dir() / "row-index"
    target = folder / f"{file_key}-{version}.i64"
    cached = _read_cached(target, size)
    if cached is not None:
        return RowIndex(cached, "cached", target)
    desc = f"indexing {os.path.basename(real_path)}"
    with progress_bar(total=size, desc=desc, unit="B", enabled=progress) as bar:
        bar.update(start)  # a byte-order mark, skipped

        def scan(advance: Callable[[int], None] | None) -> Iterator[NDArray[np.int64]]:
            return scan_row_starts(
                fd,
                start,
                size,
                quote,
                delimiter=delimiter,
                blank_whitespace=blank_whitespace,
                lone_cr=lone_cr,
                advance=advance,
            )

        def unchanged() -> None:  # the file did not change while it was scanned
            check_file_unchanged(real_path, signature, file_signature(os.fstat(fd)))

        return _store(scan, bar.update, size, folder, target, file_key, unchanged)


def _in_memory(parts: Iterator[NDArray[np.int64]], size: int) -> NDArray[np.int64]:
    starts = np.concatenate([*parts, np.array([size], dtype=np.int64)])
    return starts.astype(np.int64)


def _write_index(handle: int, parts: Iterator[NDArray[np.int64]], size: int) -> OSError | None:
    """Write the row starts to the open temporary file ``handle``; the write error, if any.

    Only errors of writing the cache file are returned (``ENOSPC``, ``EDQUOT``...); an error
    reading the data file, raised by ``parts``, propagates.
    """
    out = os.fdopen(handle, "wb")
    try:
        for part in parts:
            try:
                out.write(part.astype("<i8").tobytes())
            except OSError as exc:
                return exc
        try:
            out.write(np.array([size], dtype="<i8").tobytes())
            out.close()  # flushes: a full disk may only show here
        except OSError as exc:
            return exc
        return None
    finally:
        with contextlib.suppress(OSError):
            out.close()


def _store(
    scan: Callable[[Callable[[int], None] | None], Iterator[NDArray[np.int64]]],
    advance: Callable[[int], None],
    size: int,
    folder: Path,
    target: Path,
    file_key: str,
    unchanged: Callable[[], None],
) -> RowIndex:
    """Write the row starts ``scan(advance)`` yields to ``target`` (atomically), or keep them
    in memory.

    When the cache directory cannot be written (created, or a file made in it) the index is
    kept in memory, silently. When writing the file fails midway (a full disk) the partial
    file is deleted, a :class:`RowIndexCacheWarning` naming the directory is issued (Python
    shows it once per directory and error) and the file is scanned again into memory.
    ``unchanged()`` runs after the scan, before the index is published (it raises if the
    file changed meanwhile).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{file_key}-", suffix=".tmp")
    except OSError:  # no writable cache: keep the index in memory
        starts = _in_memory(scan(advance), size)
        unchanged()
        return RowIndex(starts, "built", None)
    try:
        failed = _write_index(handle, scan(advance), size)
        if failed is None:
            unchanged()
            try:
                os.replace(tmp, target)
            except OSError as exc:
                failed = exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if failed is not None:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        warnings.warn(
            f"mixle could not write a row index to the cache directory {str(folder)!r} "
            f"({failed.strerror or failed}); indexes are kept in memory instead. Free space "
            "there, or set MIXLE_CACHE_DIR to a folder that has it",
            RowIndexCacheWarning,
            stacklevel=2,
        )
        starts = _in_memory(scan(None), size)
        unchanged()
        return RowIndex(starts, "built", None)
    for old in folder.glob(f"{file_key}-*.i64"):  # indexes of earlier versions of this file
        if old != target:
            with contextlib.suppress(OSError):
                old.unlink()
    return RowIndex(np.memmap(target, dtype="<i8", mode="r"), "built", target)  # type: ignore[arg-type]
