"""CSV files as lazy, index-addressable record sources (:func:`read_csv`)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mixle.data.sources.arrays.memmap.check import FileSignature
from mixle.data.sources.records.base import Batch, TableMeta
from mixle.data.sources.records.columns import (
    DEFAULT_NA_VALUES,
    INFER_ROWS,
    LineOf,
    check_columns,
    infer_text_dtype,
    parse_dtypes,
    text_to_array,
)
from mixle.data.sources.records.text.text_file import TextHandle
from mixle.data.sources.records.text.text_source import (
    HEADER_MAX_BYTES,
    TextRecordSource,
    text_args,
)
from mixle.data.spec import ArraySpec
from mixle.errors import MalformedRowError

__all__ = ["CSVSource", "read_csv"]

HeaderLike = bool | Sequence[str]


def _header_names(row: list[str]) -> list[str]:
    """Column names from a header row, made unique the way pandas does (``a``, ``a.1``).

    Linear in the number of columns (a header may hold millions of them).
    """
    names: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(row):
        name = raw or f"Unnamed: {i}"
        base, k = name, 0
        while name in seen:
            k += 1
            name = f"{base}.{k}"
        names.append(name)
        seen.add(name)
    return names


class CSVSource(TextRecordSource):
    """A CSV file: records are rows, fields are NumPy columns; see :func:`read_csv`."""

    _format = "CSV"
    _lone_cr = True  # "\n", "\r\n" and a lone "\r" end lines, as for Python's csv module

    def __init__(
        self,
        path: str | os.PathLike[str],
        columns: Sequence[str] | None = None,
        *,
        delimiter: str = ",",
        quotechar: str = '"',
        dtypes: Mapping[str, Any] | None = None,
        header: HeaderLike = True,
        na_values: Sequence[str] = DEFAULT_NA_VALUES,
        infer_rows: int = INFER_ROWS,
        progress: bool | None = None,
    ) -> None:
        for name, value in (("delimiter", delimiter), ("quotechar", quotechar)):
            if not isinstance(value, str) or len(value) != 1 or value in "\r\n":
                raise ValueError(f"{name}={value!r} must be one character other than a newline")
        if delimiter == quotechar:
            raise ValueError(f"delimiter={delimiter!r} and quotechar={quotechar!r} must differ")
        if not (isinstance(header, bool) or _is_names(header)):
            raise TypeError(f"header={header!r} must be True, False or a list of column names")
        self._init_state(
            text_args(
                path,
                columns,
                dtypes,
                infer_rows,
                progress,
                delimiter=delimiter,
                quotechar=quotechar,
                header=header if isinstance(header, bool) else list(header),
                na_values=tuple(na_values),
            )
        )
        self._live()  # fail early: missing file, unknown column, bad dtype override

    @property
    def _quote(self) -> int:  # type: ignore[override]
        return ord(self._args["quotechar"])

    @property
    def _delimiter(self) -> int:  # type: ignore[override]
        return ord(self._args["delimiter"])

    def _options_key(self) -> str:
        return f"csv\0{self._args['quotechar']}\0{self._args['delimiter']}"

    def _reader(self, stream: Any) -> Any:
        return csv.reader(
            stream,
            delimiter=self._args["delimiter"],
            quotechar=self._args["quotechar"],
            doublequote=True,
            strict=True,
        )

    # -- open: header and a sample ------------------------------------------------------
    def _open_fd(self, fd: int, real: str, start: int) -> tuple[TextHandle, TableMeta]:
        where = self._location()
        header = self._args["header"]
        sample: list[list[str]] = []
        lines: list[int] = []
        names: list[str] | None = None if isinstance(header, bool) else list(header)
        for row, line in self._rows_from(real, start, limit=HEADER_MAX_BYTES):
            if header is True and names is None:
                names = _header_names(row)
                continue
            sample.append(row)
            lines.append(line)
            if len(sample) >= self._args["infer_rows"]:
                break
        if names is None:
            if header is True:
                raise ValueError(f"{where} is empty: header=True needs a header row")
            names = [str(i) for i in range(len(sample[0]) if sample else 0)]
        handle = TextHandle(fd, real, start, 1 if header is True else 0, names, [])
        handle.selected = check_columns(self._args["columns"], names, where)
        overrides = parse_dtypes(self._args["dtypes"], names, where)
        for row, line in zip(sample, lines):
            problem = self._row_problem(handle, row)
            if problem is not None:
                raise self._malformed(line, problem)
        na = frozenset(self._args["na_values"])
        position = {name: k for k, name in enumerate(names)}
        specs: dict[str, ArraySpec] = {}
        for name in handle.selected:
            k = position[name]
            values = [row[k] for row in sample]
            dtype = overrides.get(name) or infer_text_dtype(values, na)
            text_to_array(values, dtype, na, name, lines.__getitem__, where)  # check overrides
            specs[name] = ArraySpec((), dtype)
        handle.extra = {"na": na, "positions": [position[n] for n in handle.selected]}
        return handle, TableMeta(specs)

    def _rows_from(
        self,
        path: str,
        start: int,
        signature: FileSignature | None = None,
        limit: int | None = None,
    ) -> Iterator[tuple[list[str], int]]:
        """Parsed rows from byte ``start`` on, each with the line it starts on.

        Opens its own file object, so streams never share a file position. With ``limit``
        (at open), a row of more than ``limit`` characters raises :class:`MalformedRowError`,
        and no row is begun once ``limit`` characters in all have been read.
        """
        with self._open_file(path, signature) as raw:
            raw.seek(start)
            stream = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            lines = stream if limit is None else _CappedLines(stream, limit)
            reader = self._reader(lines)
            line = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    raise self._malformed(line, f"cannot be parsed: {exc}") from None
                except UnicodeDecodeError as exc:  # decoded ahead: find the line in the bytes
                    bad = _first_bad_utf8_line(raw, start)
                    raise self._malformed(bad, f"is not UTF-8: {exc.reason}") from None
                except _RowTooLong:
                    raise self._too_long(line, limit or 0) from None
                if row:
                    yield row, line
                line = reader.line_num + 1
                if isinstance(lines, _CappedLines):
                    if lines.total >= lines.limit:  # the sample ends here
                        return
                    lines.used = 0  # the cap is per row

    # -- rows ---------------------------------------------------------------------------
    def _parse_run(self, handle: TextHandle, text: str) -> list[Any]:
        try:
            return [row for row in self._reader(io.StringIO(text, newline="")) if row]
        except csv.Error as exc:
            raise MalformedRowError(str(exc)) from None

    def _row_problem(self, handle: TextHandle, row: Any) -> str | None:
        if len(row) != len(handle.names):
            return f"has {len(row)} fields; the header has {len(handle.names)}"
        return None

    def _to_columns(self, handle: TextHandle, rows: list[Any], lines: LineOf) -> Batch:
        meta = self._meta
        assert meta is not None
        na, where = handle.extra["na"], self._location()
        out: Batch = {}
        for name, k in zip(handle.selected, handle.extra["positions"]):
            values = [row[k] for row in rows]
            out[name] = text_to_array(values, meta.columns[name].dtype, na, name, lines, where)
        return out


class _RowTooLong(Exception):
    """A row read at open ran past its cap (turned into a MalformedRowError with its line)."""


class _CappedLines:
    """The lines of a text stream for ``csv.reader``, at most ``limit`` characters per row.

    ``used`` counts the characters of the row being read (reset by the caller after each
    row), ``total`` those of every row; each ``readline`` asks for no more than the rest of
    the row's budget, so a line without a line end is never read whole.
    """

    def __init__(self, stream: io.TextIOWrapper, limit: int) -> None:
        self._stream = stream
        self.limit = limit
        self.used = 0
        self.total = 0

    def __iter__(self) -> _CappedLines:
        return self

    def __next__(self) -> str:
        text = self._stream.readline(self.limit - self.used + 1)
        if not text:
            raise StopIteration
        self.used += len(text)
        self.total += len(text)
        if self.used > self.limit:
            raise _RowTooLong
        return text


def _is_names(value: object) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(v, str) for v in value)
    )


def read_csv(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    delimiter: str = ",",
    quotechar: str = '"',
    dtypes: Mapping[str, Any] | None = None,
    header: HeaderLike = True,
    na_values: Sequence[str] = DEFAULT_NA_VALUES,
    infer_rows: int = INFER_ROWS,
    progress: bool | None = None,
) -> CSVSource:
    """Open a CSV file as a lazy, index-addressable source of records.

    Parameters
    ----------
    path
        The CSV file (UTF-8, optional byte-order mark; ``\\n``, ``\\r\\n`` or ``\\r`` line
        ends, mixed too, as Python's ``csv`` module reads them; blank lines are skipped).
    columns
        Column names to read (default: all), in the order given.
    delimiter, quotechar
        One character each. Quoting follows RFC 4180: fields holding the delimiter, a quote
        or a newline are quoted, and quotes inside them doubled.
    dtypes
        ``{"column": dtype}`` overrides of the inferred types (``"int64"``, ``"float64"``,
        ``"bool"``, ``"str"``, ``"datetime64[s]"``...).
    header
        ``True``: the first row names the columns; ``False``: no header, columns are named
        ``"0"``, ``"1"``...; a list of names: no header row, these names.
    na_values
        Field texts that mean "missing" (default: the empty field).
    infer_rows
        Rows read at open to infer the column types (fewer when they hold more than
        :data:`~mixle.data.sources.records.text.text_source.HEADER_MAX_BYTES` in all).
    progress
        Show a progress bar while the row index is built: ``True``, ``False``, or ``None``
        (automatic: on a terminal, when building takes a while; see
        :mod:`mixle.utils.progress`).

    Returns
    -------
    CSVSource
        ``len``, ``src[i]`` (a dict of NumPy scalars), ``get_batch(indices)`` (a dict of
        NumPy columns), ``iter_batches()``/``records()`` (streaming), ``element_spec()``.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    SpecialFileError
        ``path`` is a FIFO, device, socket or directory (refused before any read).
    TypeError
        ``progress`` is not ``True``, ``False`` or ``None``.
    FileChangedError
        Later, on a read: the file was replaced, deleted or written after it was opened
        (:class:`mixle.data.sources.arrays.memmap.check.FileChangedError`; what is detected is in
        :mod:`mixle.data.sources.records.text.text_source`). Open it again to read the new content.
    ColumnNotFoundError
        A name in ``columns`` or ``dtypes`` is not a column (the message lists them).
    MalformedRowError
        A row (in the sample at open, or later when read) has the wrong number of fields,
        broken quoting, or a value its column's dtype cannot hold; the message names the
        line. Also when a row read at open (the header, a row of the type sample) is
        longer than
        :data:`~mixle.data.sources.records.text.text_source.HEADER_MAX_BYTES`
        characters.

    Notes
    -----
    Types are inferred from the first ``infer_rows`` rows: integers (``float64`` when a
    value is missing), floats, ``True``/``False`` and strings (``object``). Missing values
    are ``NaN`` in float columns and ``None`` in string columns. Opening reads the header
    and the sample only. The first ``len`` or random access loads the row index (built in
    one pass and cached, see :mod:`mixle.data.sources.records.text.row_index`); streaming
    needs none.
    """
    return CSVSource(
        path,
        columns,
        delimiter=delimiter,
        quotechar=quotechar,
        dtypes=dtypes,
        header=header,
        na_values=na_values,
        infer_rows=infer_rows,
        progress=progress,
    )


def _first_bad_utf8_line(raw: Any, start: int) -> int:
    """The 1-based line, counted from byte ``start``, of the first bytes that are not UTF-8.

    The text wrapper decodes several KiB ahead of the CSV reader, so its position says
    nothing about the row: the raw lines are decoded again, one at a time.
    """
    raw.seek(start)
    for number, chunk in enumerate(iter(raw.readline, b""), start=1):
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            return number
    return 1
