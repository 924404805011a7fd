"""Shared machinery of line-oriented text sources (CSV, JSON lines).

Opening reads a header and a sample of rows (for the column types) and nothing else. The
first random access (``len``, ``[i]``, ``get_batch``) loads the file's byte-offset row index
(:mod:`mixle.data.sources.records.text.row_index`): from the user cache when it is
current, else built in one pass. Rows are then read with ``os.pread`` (no shared file
position, so reads are safe from several threads), each contiguous run of rows in one read.
``iter_batches()`` and ``records()`` read the file sequentially and never need the index.

A file changed after it was opened is refused, never read through offsets of its old
content: the file's signature (device, inode, size, modification and status-change times;
:func:`~mixle.data.sources.arrays.memmap.check.file_signature`) is taken at open and compared, with
one ``stat``, when the index is loaded, after the bytes of every random read, and before
every block a stream yields. A file replaced, deleted, truncated, appended to or rewritten in
place raises :class:`~mixle.data.sources.arrays.memmap.check.FileChangedError` naming it. A rewrite
of the same size with the old modification time restored (``rsync --inplace -t``) is caught
too: writing moves the status-change time, which cannot be set back. Changes of permissions,
owner or links move it as well and raise the same error. Not seen: a rewrite of the same
size within the file system's timestamp granularity (milliseconds) of the open. A cached row
index is reused only for the same signature and content fingerprint
(:mod:`mixle.data.sources.records.text.row_index`).
"""

from __future__ import annotations

import abc
import itertools
import os
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.arrays.memmap.check import (
    FileSignature,
    check_file_unchanged,
    file_signature,
)
from mixle.data.sources.indexing import consecutive_runs
from mixle.data.sources.records.base import Batch, RecordSource, TableMeta
from mixle.data.sources.records.columns import LineOf
from mixle.data.sources.records.text.row_index import RowIndex, load_row_index
from mixle.data.sources.records.text.row_scan import line_number
from mixle.data.sources.records.text.text_file import (
    BOM,
    Descriptor,
    LineLookup,
    TextHandle,
    open_text_file,
)
from mixle.errors import MalformedRowError
from mixle.utils.files import open_regular_file
from mixle.utils.progress import parse_progress
from mixle.utils.redact import display_path

__all__ = ["HEADER_MAX_BYTES", "TextRecordSource", "consecutive_runs", "text_args"]

#: Most bytes (CSV: characters) of one row read while a file is opened: the header row and
#: each row of the type sample. A longer row at open is a :class:`MalformedRowError` naming
#: the file and line, after reading no more than this (a 1 GB line without a newline is
#: never read whole); the sample also ends, before ``infer_rows``, once this much has been
#: read in all, so opening reads at most about twice this. Rows read later (``[i]``,
#: streams) are not capped.
HEADER_MAX_BYTES = 64 * 2**20


def text_args(
    path: Any,
    columns: Sequence[str] | None,
    dtypes: Any,
    infer_rows: object,
    progress: bool | None,
    **options: Any,
) -> dict[str, Any]:
    """The constructor arguments a text source pickles, with the checks every format shares.

    Raises
    ------
    ValueError
        ``infer_rows`` is not an int >= 1.
    TypeError
        ``progress`` is not ``True``, ``False`` or ``None``.
    """
    if isinstance(infer_rows, bool) or not isinstance(infer_rows, int) or infer_rows < 1:
        raise ValueError(f"infer_rows={infer_rows!r} must be an int >= 1")
    return {
        "path": os.fspath(path) if isinstance(path, os.PathLike) else path,
        "columns": None if columns is None else list(columns),
        "dtypes": dtypes,
        "infer_rows": infer_rows,
        "progress": parse_progress(progress),
        **options,
    }


class TextRecordSource(RecordSource):
    """Base class of CSV and JSON lines sources (see the module notes)."""

    #: The quote byte (CSV) or ``None`` (every newline ends a row).
    _quote: int | None = None
    #: The field delimiter byte (CSV: quotes inside unquoted fields are literal) or ``None``.
    _delimiter: int | None = None
    #: Whether a line of only whitespace is blank (JSON lines) rather than a row.
    _blank_whitespace: bool = False
    #: Whether a ``\r`` not followed by ``\n`` ends a line (CSV, as for Python's csv module).
    _lone_cr: bool = False

    #: What the file is, in messages (``"CSV"``, ``"JSON lines"``).
    _format: str

    @abc.abstractmethod
    def _open_fd(self, fd: int, real: str, start: int) -> tuple[TextHandle, TableMeta]:
        """Read the header and a sample from ``fd`` (rows begin at byte ``start``)."""

    @abc.abstractmethod
    def _rows_from(
        self,
        path: str,
        start: int,
        signature: FileSignature | None = None,
        limit: int | None = None,
    ) -> Iterator[tuple[Any, int]]:
        """Parsed rows from byte ``start`` on, each with its line.

        Opens its own file with :meth:`_open_file` (checked against ``signature``, if given).
        With ``limit``, a row longer than that is a :class:`MalformedRowError` (see
        :meth:`_too_long`), raised after reading at most about ``limit`` bytes of it.
        """

    @abc.abstractmethod
    def _options_key(self) -> str:
        """Format options that change where rows end (part of the row index cache key)."""

    @abc.abstractmethod
    def _parse_run(self, handle: TextHandle, text: str) -> list[Any]:
        """Parse the text of a run of whole rows into one parsed row per non-blank row."""

    @abc.abstractmethod
    def _to_columns(self, handle: TextHandle, rows: list[Any], lines: LineOf) -> Batch:
        """Convert parsed rows to NumPy columns; ``lines(j)`` is the line of ``rows[j]``."""

    @abc.abstractmethod
    def _row_problem(self, handle: TextHandle, row: Any) -> str | None:
        """What is wrong with a parsed row (e.g. ``"has 3 fields, not 4"``), or ``None``."""

    def _location(self) -> str:
        return display_path(self._args["path"])

    def _open(self) -> tuple[TextHandle, TableMeta]:
        fd, real = open_text_file(self._args["path"], self._format)
        owner = Descriptor(fd)
        try:
            signature = file_signature(os.fstat(fd))
            start = len(BOM) if os.pread(fd, len(BOM), 0) == BOM else 0
            handle, meta = self._open_fd(fd, real, start)
            handle.signature = signature
            handle.owner = owner
            check_file_unchanged(real, signature)  # the header and sample are of this version
            return handle, meta
        except BaseException:
            owner.close()
            raise

    @staticmethod
    def _open_file(path: str, signature: FileSignature | None) -> BinaryIO:
        """``path`` opened for reading; with ``signature``, checked to be that version of it.

        Raises
        ------
        FileChangedError
            The opened file does not have ``signature``.
        """
        try:
            raw = open_regular_file(path, "path")  # the caller closes it (a with block)
        except FileNotFoundError:
            if signature is not None:
                check_file_unchanged(path, signature)  # deleted since it was opened: say so
            raise
        if signature is not None:
            try:
                check_file_unchanged(path, signature, file_signature(os.fstat(raw.fileno())))
            except BaseException:
                raw.close()
                raise
        return raw

    def _check_unchanged(self, handle: TextHandle) -> None:
        """Raise :class:`FileChangedError` if the file changed since it was opened."""
        check_file_unchanged(handle.real_path, handle.signature)

    def _stream(self, handle: TextHandle, block_rows: int) -> Iterator[Batch]:
        try:
            yield from self._stream_rows(handle, block_rows)
        except MalformedRowError:  # a file changed meanwhile is the cause, not the row
            self._check_unchanged(handle)
            raise

    def _stream_rows(self, handle: TextHandle, block_rows: int) -> Iterator[Batch]:
        rows: list[Any] = []
        lines: list[int] = []
        parsed = self._rows_from(handle.real_path, handle.data_start, handle.signature)
        for row, line in itertools.islice(parsed, handle.skip_rows, None):
            problem = self._row_problem(handle, row)
            if problem is not None:
                raise self._malformed(line, problem)
            rows.append(row)
            lines.append(line)
            if len(rows) == block_rows:
                self._check_unchanged(handle)  # the rows read are of the version opened
                yield self._to_columns(handle, rows, lines.__getitem__)
                rows, lines = [], []
        self._check_unchanged(handle)  # and the stream did not end early on a truncation
        if rows:
            yield self._to_columns(handle, rows, lines.__getitem__)

    @property
    def row_index_origin(self) -> str | None:
        """``"built"``/``"cached"`` once the row index is loaded, ``None`` before."""
        handle = self._handle
        return None if handle is None or handle.index is None else handle.index.origin

    def _index(self, handle: TextHandle) -> RowIndex:
        if handle.index is None:
            with self._lock:
                if handle.index is None:
                    index = load_row_index(
                        handle.fd,
                        handle.real_path,
                        handle.data_start,
                        self._quote,
                        self._options_key(),
                        self._args.get("progress"),
                        delimiter=self._delimiter,
                        blank_whitespace=self._blank_whitespace,
                        lone_cr=self._lone_cr,
                        expected=handle.signature,
                    )
                    self._check_unchanged(handle)  # not replaced since it was opened
                    handle.index = index
        return handle.index

    def _count(self, handle: TextHandle) -> int:
        return max(0, len(self._index(handle)) - handle.skip_rows)

    def _read_rows(self, handle: TextHandle, rows: NDArray[np.int64]) -> Batch:
        # a plain view: indexing a np.memmap goes through Python-level __getitem__
        starts = self._index(handle).starts.view(np.ndarray)
        at = rows + handle.skip_rows
        firsts, ends = consecutive_runs(at)
        spans = [
            os.pread(handle.fd, end - begin, begin)
            for begin, end in zip(starts[firsts].tolist(), starts[ends].tolist())
        ]
        self._check_unchanged(handle)  # the bytes read are those the index describes
        parsed: list[Any] = []
        for lo, hi, data in zip(firsts.tolist(), ends.tolist(), spans):
            got = self._parse_span(handle, data)
            if len(got) != hi - lo:
                self._raise_bad_row(handle, lo, hi)
            parsed.extend(got)
        lines = LineLookup(handle.fd, starts[at], self._lone_cr)
        for j, row in enumerate(parsed):
            problem = self._row_problem(handle, row)
            if problem is not None:
                raise self._malformed(lines(j), problem)
        return self._to_columns(handle, parsed, lines)

    def _parse_span(self, handle: TextHandle, data: bytes) -> list[Any]:
        try:
            return self._parse_run(handle, data.decode("utf-8"))
        except (ValueError, MalformedRowError):  # decode or parse error: find the row
            return []

    def _raise_bad_row(self, handle: TextHandle, lo: int, hi: int) -> None:
        """Parse rows ``lo..hi`` one by one and raise for the first that fails."""
        error = self._bad_row(handle, lo, hi)
        self._check_unchanged(handle)  # a file changed meanwhile is the cause, not the row
        raise error

    def _bad_row(self, handle: TextHandle, lo: int, hi: int) -> MalformedRowError:
        """The error of the first of rows ``lo..hi`` that does not parse as one row."""
        starts = self._index(handle).starts
        for r in range(lo, hi):
            begin, end = int(starts[r]), int(starts[r + 1])
            data = os.pread(handle.fd, end - begin, begin)
            line = line_number(handle.fd, begin, lone_cr=self._lone_cr)
            try:
                got = self._parse_run(handle, data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                return self._malformed(line, f"is not valid UTF-8 ({exc.reason})")
            except (ValueError, MalformedRowError) as exc:
                return self._malformed(line, f"cannot be parsed: {exc}")
            if len(got) != 1:
                return self._malformed(line, "does not hold exactly one row")
        line = line_number(handle.fd, int(starts[lo]), lone_cr=self._lone_cr)
        return self._malformed(line, "cannot be parsed")

    def _too_long(self, line: int, limit: int) -> MalformedRowError:
        """The error of a row longer than ``limit`` read while the file is opened."""
        return self._malformed(
            line,
            f"is longer than {limit:,} bytes, the most mixle reads of one row when it opens a "
            f"file (HEADER_MAX_BYTES); is this a {self._format} file with line ends?",
        )

    def _malformed(self, line: int, problem: str) -> MalformedRowError:
        """A :class:`MalformedRowError` naming this file and ``line``."""
        path = self._location()
        return MalformedRowError(f"{path}, line {line}: the row {problem}", path=path, line=line)

    def _release(self, handle: TextHandle) -> None:
        handle.index = None
        if handle.owner is not None:
            handle.owner.close()  # once: the finalizer never closes the number again

    def _forget(self, handle: TextHandle) -> None:
        # The child opens its own descriptor. Closing the inherited copy leaves the parent's
        # descriptor open (each process has its own table) and leaks nothing per fork.
        self._release(handle)
