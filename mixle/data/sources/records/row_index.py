"""Byte-offset row index of a text file (CSV, JSON lines), built in one pass and cached.

The index is the start offset of every non-blank row, plus the file size at the end: row
``i`` is the bytes ``[starts[i], starts[i + 1])`` (its line end and any blank lines after it
included). CSV rows end where Python's ``csv`` module ends them: at ``\\n``, ``\\r\\n`` or a
lone ``\\r`` (mixed in one file too); a line of nothing else is blank. JSON lines rows end at
``\\n`` only (a ``\\r`` before it is JSON whitespace); a line of whitespace only is blank, as
it is for the streaming reader. A line end inside a quoted CSV field does not end a row: it
ends one only when an even number of field quotes precede it, which holds for RFC 4180
quoting (a quote inside a quoted field is doubled). As in Python's ``csv`` module, a quote
inside an unquoted field (``5'11"``) is a literal character, not a field quote.

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
from mixle.errors import RowIndexCacheWarning
from mixle.utils.progress import progress_bar

__all__ = [
    "FINGERPRINT_BLOCKS",
    "FINGERPRINT_BLOCK_BYTES",
    "INDEX_BLOCK_BYTES",
    "RowIndex",
    "RowIndexCacheWarning",
    "cache_dir",
    "content_fingerprint",
    "line_number",
    "load_row_index",
    "scan_row_starts",
]

#: Bytes read per step while scanning a file for row boundaries.
INDEX_BLOCK_BYTES = 8 * 2**20
#: Bytes hashed at each place sampled for a file's content fingerprint.
FINGERPRINT_BLOCK_BYTES = 64 * 2**10
#: Places sampled for the fingerprint: the first and last blocks and evenly spaced ones.
FINGERPRINT_BLOCKS = 8
_NEWLINE, _CR = 10, 13
#: Bytes that ``bytes.strip()`` removes: a JSON line of only these is blank.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
# what the byte before a block is to the CSV field scanner
_FIELD_START, _CLOSING_QUOTE, _OTHER = -1, -2, -3


def cache_dir() -> Path:
    """Where mixle caches row indexes: ``$MIXLE_CACHE_DIR``, ``$XDG_CACHE_HOME/mixle`` or
    ``~/.cache/mixle``."""
    explicit = os.environ.get("MIXLE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mixle"


def _field_quotes(
    a: NDArray[np.uint8],
    quote: int,
    delimiter: int,
    in_quotes: int,
    before: int,
    line_ends: tuple[int, ...] = (_NEWLINE,),
) -> NDArray[np.bool_]:
    """The quotes of ``a`` that open or close quoted fields (the csv module's reading).

    A quote outside a quoted field opens one only at the start of a field (after a delimiter
    or a byte of ``line_ends``) or right after a closing quote (a doubled quote); anywhere
    else it is a literal character. ``before`` describes the byte before ``a``:
    ``_FIELD_START``, ``_CLOSING_QUOTE`` or any other value.
    """
    quotes = a == quote
    at = np.flatnonzero(quotes)
    if not at.size:
        return quotes
    # fast path: if every quote is a field quote, the ones at even parity open fields (or
    # follow a closing quote); any of them elsewhere is a literal quote, found below
    opening = at[in_quotes::2]
    starts_field = np.zeros(256, dtype=bool)
    starts_field[[delimiter, *line_ends]] = True
    prev = a[np.maximum(opening - 1, 0)]
    literal = ~starts_field[prev] & (prev != quote)
    if opening.size and opening[0] == 0:
        literal[0] = before == _OTHER
    if not literal.any():
        return quotes
    field_start = starts_field[a[np.maximum(at - 1, 0)]]
    if at[0] == 0:
        field_start[0] = before == _FIELD_START
    keep = np.ones(at.size, dtype=bool)
    inside, last = in_quotes, (-1 if before == _CLOSING_QUOTE else -2)
    for j, (q, starts_field) in enumerate(zip(at.tolist(), field_start.tolist())):
        if inside:
            inside, last = 0, q
        elif starts_field or last == q - 1:
            inside, last = 1, q
        else:
            keep[j] = False
    quotes[at[~keep]] = False
    return quotes


def _whitespace_rows(
    a: NDArray[np.uint8],
    newlines: NDArray[np.intp],
    starts: NDArray[np.int64],
    length: NDArray[np.int64],
    before_end: NDArray[np.int64],
    content: bool,
) -> NDArray[np.bool_]:
    """Which rows ending at ``newlines`` of block ``a`` hold only whitespace.

    ``starts`` are block-local (negative for a row begun in an earlier block, which had
    non-whitespace bytes there when ``content``). A row whose last byte is not whitespace
    is decided at once; only the others are counted.
    """
    blank = length == 0
    unsure = ~blank & _WHITESPACE[before_end.astype(np.uint8)]
    if unsure.any():
        solid = np.concatenate([[0], np.cumsum(~_WHITESPACE[a], dtype=np.int64)])
        filled = solid[newlines] - solid[np.maximum(starts, 0)]
        filled[0] += int(content and starts[0] < 0)
        blank |= unsure & (filled == 0)
    return blank


def _row_ends(a: NDArray[np.uint8], after: int, lone_cr: bool) -> NDArray[np.bool_]:
    """Which bytes of ``a`` end a line: ``\\n``, and with ``lone_cr`` a ``\\r`` not before one.

    ``after`` is the byte after ``a`` (``-1`` at the end of the file).
    """
    ends = a == _NEWLINE
    if lone_cr:
        before_lf = np.empty(a.size, dtype=bool)
        before_lf[:-1] = ends[1:]
        before_lf[-1] = after == _NEWLINE
        ends |= (a == _CR) & ~before_lf
    return ends


def _read_block(fd: int, pos: int, size: int, lookahead: bool) -> tuple[bytes, int]:
    """Up to :data:`INDEX_BLOCK_BYTES` bytes at ``pos`` (not past ``size``), and the byte
    after them (``-1`` at ``size``, or without ``lookahead``)."""
    n = min(INDEX_BLOCK_BYTES, size - pos)
    extra = int(lookahead and pos + n < size)
    data = os.pread(fd, n + extra, pos)
    if len(data) > n:
        return data[:n], data[n]
    return data, -1


def scan_row_starts(
    fd: int,
    start: int,
    size: int,
    quote: int | None,
    *,
    delimiter: int | None = None,
    blank_whitespace: bool = False,
    lone_cr: bool = False,
    advance: Callable[[int], None] | None = None,
) -> Iterator[NDArray[np.int64]]:
    """Yield the start offsets of non-blank rows in ``[start, size)``, block by block.

    ``quote`` is the quote byte (CSV) or ``None`` (JSON lines: every newline ends a row).
    With ``delimiter`` (CSV), quotes inside unquoted fields are literal characters.
    ``blank_whitespace`` (JSON lines): rows of whitespace only are blank, not just empty ones.
    ``lone_cr`` (CSV): a ``\\r`` not followed by ``\\n`` ends a row too, as it does for
    Python's ``csv`` module (``\\n``, ``\\r\\n`` and ``\\r`` all end lines).
    ``advance(nbytes)`` is called after each block of :data:`INDEX_BLOCK_BYTES` is scanned.
    """
    in_quotes = 0
    row_start = start  # where the row being scanned begins
    last_byte = -1  # the byte before the current block
    before = _FIELD_START  # what that byte is to the CSV field scanner
    content = False  # whether the current row has non-whitespace bytes in earlier blocks
    pos = start
    field_starts = (_NEWLINE, _CR) if lone_cr else (_NEWLINE,)
    while pos < size:
        block, after = _read_block(fd, pos, size, lone_cr)
        if not block:
            break
        a = np.frombuffer(block, dtype=np.uint8)
        newlines = np.flatnonzero(_row_ends(a, after, lone_cr))
        if quote is not None:
            if delimiter is not None:
                quotes = _field_quotes(a, quote, delimiter, in_quotes, before, field_starts)
            else:
                quotes = a == quote
            if in_quotes or quotes.any():
                parity = (np.cumsum(quotes, dtype=np.int64)[newlines] + in_quotes) & 1
                newlines = newlines[parity == 0]
                in_quotes = (in_quotes + int(np.count_nonzero(quotes))) & 1
            if quotes[-1] and not in_quotes:
                before = _CLOSING_QUOTE
            elif a[-1] == delimiter or a[-1] in field_starts:
                before = _FIELD_START
            else:
                before = _OTHER
        if newlines.size:
            ends = newlines.astype(np.int64) + pos
            starts = np.concatenate([[row_start], ends[:-1] + 1])
            before_end = np.where(newlines > 0, a[np.maximum(newlines - 1, 0)], last_byte)
            length = ends - starts
            if blank_whitespace:
                blank = _whitespace_rows(a, newlines, starts - pos, length, before_end, content)
            else:  # only a line end: LF, CR (a lone CR ends a row) or CR LF
                blank = (length == 0) | ((length == 1) & (before_end == _CR))
            yield starts[~blank]
            row_start = int(ends[-1]) + 1
        if blank_whitespace:  # whether the row still open has more than whitespace so far
            local = row_start - pos
            content = (content and local < 0) or bool((~_WHITESPACE[a[max(local, 0) :]]).any())
        last_byte = int(a[-1])
        pos += len(block)
        if advance is not None:
            advance(len(block))
    tail = size - row_start
    if blank_whitespace:
        if content:
            yield np.array([row_start], dtype=np.int64)
    elif tail > 1 or (tail == 1 and last_byte != _CR):
        yield np.array([row_start], dtype=np.int64)


def line_number(fd: int, offset: int, *, lone_cr: bool = False) -> int:
    """The 1-based line of the byte at ``offset`` (counts line ends before it; error paths).

    Line ends are ``\\n``, and with ``lone_cr`` (CSV) also ``\\r`` not followed by ``\\n``.
    """
    count, pos = 0, 0
    while pos < offset:
        block, after = _read_block(fd, pos, offset, lone_cr)
        if not block:
            break
        count += int(np.count_nonzero(_row_ends(np.frombuffer(block, np.uint8), after, lone_cr)))
        pos += len(block)
    return count + 1


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
