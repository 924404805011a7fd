"""Row boundaries of a text file (CSV, JSON lines), found in one vectorised pass.

:func:`scan_row_starts` yields the start offset of every non-blank row. CSV rows end where
Python's ``csv`` module ends them: at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (mixed in one file
too); a line of nothing else is blank. JSON lines rows end at ``\\n`` only (a ``\\r`` before it
is JSON whitespace); a line of whitespace only is blank, as it is for the streaming reader. A
line end inside a quoted CSV field does not end a row: it ends one only when an even number
of field quotes precede it, which holds for RFC 4180 quoting (a quote inside a quoted field
is doubled). As in Python's ``csv`` module, a quote inside an unquoted field (``5'11"``) is a
literal character, not a field quote. The index built from it, and its cache, are
:mod:`mixle.data.sources.records.text.row_index`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
from numpy.typing import NDArray

__all__ = ["INDEX_BLOCK_BYTES", "line_number", "scan_row_starts"]

#: Bytes read per step while scanning a file for row boundaries.
INDEX_BLOCK_BYTES = 8 * 2**20
_NEWLINE, _CR = 10, 13
#: Bytes that ``bytes.strip()`` removes: a JSON line of only these is blank.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
# what the byte before a block is to the CSV field scanner
_FIELD_START, _CLOSING_QUOTE, _OTHER = -1, -2, -3


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
