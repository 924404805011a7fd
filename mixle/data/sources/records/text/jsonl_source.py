"""JSON lines files as lazy, index-addressable record sources (:func:`read_jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.memmap.check import FileSignature
from mixle.data.sources.records.base import Batch, TableMeta
from mixle.data.sources.records.columns import (
    INFER_ROWS,
    LineOf,
    check_columns,
    infer_value_spec,
    parse_dtypes,
    values_to_array,
)
from mixle.data.sources.records.text.text_file import TextHandle
from mixle.data.sources.records.text.text_source import (
    HEADER_MAX_BYTES,
    TextRecordSource,
    text_args,
)
from mixle.data.spec import ArraySpec
from mixle.errors import MalformedRowError

__all__ = ["JSONLSource", "read_jsonl"]

#: What ``bytes.strip()`` removes: the streaming reader and the row index skip lines of these.
_BLANK = " \t\n\r\x0b\x0c"
#: What a row nested deeper than Python's recursion limit is, in messages.
_TOO_DEEP = (
    "it is nested too deeply for Python's JSON parser (RecursionError); flatten it, or store "
    "deep structures as a JSON string"
)


class JSONLSource(TextRecordSource):
    """A JSON lines file (one JSON object per line); see :func:`read_jsonl`."""

    _format = "JSON lines"
    _quote = None  # JSON escapes newlines inside strings: every newline ends a row
    _blank_whitespace = True  # like the streaming reader, which skips such lines

    def __init__(
        self,
        path: str | os.PathLike[str],
        columns: Sequence[str] | None = None,
        *,
        dtypes: Mapping[str, Any] | None = None,
        infer_rows: int = INFER_ROWS,
        progress: bool | None = None,
    ) -> None:
        self._init_state(text_args(path, columns, dtypes, infer_rows, progress))
        self._live()  # fail early: missing file, unknown column, bad dtype override

    def _options_key(self) -> str:
        return "jsonl"

    def _open_fd(self, fd: int, real: str, start: int) -> tuple[TextHandle, TableMeta]:
        where = self._location()
        sample: list[dict[str, Any]] = []
        lines: list[int] = []
        for row, line in self._rows_from(real, start, limit=HEADER_MAX_BYTES):
            sample.append(row)
            lines.append(line)
            if len(sample) >= self._args["infer_rows"]:
                break
        names = list(dict.fromkeys(key for row in sample for key in row))
        handle = TextHandle(fd, real, start, 0, names, [])
        handle.selected = check_columns(self._args["columns"], names, where)
        overrides = parse_dtypes(self._args["dtypes"], names, where)
        specs: dict[str, ArraySpec] = {}
        for name in handle.selected:
            values = [row.get(name) for row in sample]
            dtype, shape = infer_value_spec(values)
            if name in overrides:
                dtype = overrides[name]
                shape = shape if dtype.kind in "biuf" else ()
            values_to_array(values, dtype, shape, name, lines.__getitem__, where)
            specs[name] = ArraySpec(shape, dtype)
        return handle, TableMeta(specs)

    def _rows_from(
        self,
        path: str,
        start: int,
        signature: FileSignature | None = None,
        limit: int | None = None,
    ) -> Iterator[tuple[dict[str, Any], int]]:
        """Parsed objects from byte ``start`` on, each with its line number.

        With ``limit`` (at open), a line of more than ``limit`` bytes raises
        :class:`MalformedRowError`, and no line is begun once ``limit`` bytes in all have
        been read.
        """
        with self._open_file(path, signature) as raw:
            raw.seek(start)
            lines = iter(raw) if limit is None else iter(lambda: raw.readline(limit + 1), b"")
            total = 0
            for line, data in enumerate(lines, start=1):
                if limit is not None:
                    if total >= limit:  # the sample ends here
                        return
                    if len(data) > limit:
                        raise self._too_long(line, limit)
                    total += len(data)
                if not data.strip():
                    continue
                try:
                    row = json.loads(data)
                except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                    raise self._malformed(line, f"is not valid JSON: {exc}") from None
                except RecursionError:
                    raise self._malformed(line, f"cannot be parsed: {_TOO_DEEP}") from None
                if not isinstance(row, dict):
                    raise self._malformed(line, f"is a JSON {type(row).__name__}, not an object")
                yield row, line

    def _parse_run(self, handle: TextHandle, text: str) -> list[Any]:
        try:
            return [json.loads(line) for line in text.split("\n") if line.strip(_BLANK)]
        except ValueError as exc:
            raise MalformedRowError(str(exc)) from None
        except RecursionError:
            raise MalformedRowError(_TOO_DEEP) from None

    def _row_problem(self, handle: TextHandle, row: Any) -> str | None:
        if not isinstance(row, dict):
            return f"is a JSON {type(row).__name__}, not an object"
        return None

    def _to_columns(self, handle: TextHandle, rows: list[Any], lines: LineOf) -> Batch:
        meta = self._meta
        assert meta is not None
        if not rows:
            return {n: np.empty((0, *s.shape), s.dtype) for n, s in meta.columns.items()}
        where = self._location()
        out: Batch = {}
        for name in handle.selected:
            spec = meta.columns[name]
            values = [row.get(name) for row in rows]
            out[name] = values_to_array(values, spec.dtype, spec.shape, name, lines, where)
        return out


def read_jsonl(
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
    *,
    dtypes: Mapping[str, Any] | None = None,
    infer_rows: int = INFER_ROWS,
    progress: bool | None = None,
) -> JSONLSource:
    """Open a JSON lines file (one object per line) as a lazy, index-addressable source.

    Parameters
    ----------
    path
        The file (UTF-8). Blank lines are skipped.
    columns
        Keys to read (default: every key seen in the first ``infer_rows`` objects).
    dtypes
        ``{"key": dtype}`` overrides of the inferred types.
    infer_rows
        Objects read at open to find the keys and infer their types (fewer when they hold
        more than :data:`~mixle.data.sources.records.text.text_source.HEADER_MAX_BYTES` in all).
    progress
        Show a progress bar while the row index is built: ``True``, ``False``, or ``None``
        (automatic: on a terminal, when building takes a while; see
        :mod:`mixle.utils.progress`).

    Returns
    -------
    JSONLSource
        The same interface as :func:`mixle.read_csv`'s source.

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
        A name in ``columns`` or ``dtypes`` is not a key of the sampled objects.
    MalformedRowError
        A line is not a JSON object, or holds a value its column's dtype cannot hold; the
        message names the line. Also when a line is nested too deeply for Python's JSON
        parser, or a line read at open (the type sample) is longer than
        :data:`~mixle.data.sources.records.text.text_source.HEADER_MAX_BYTES` bytes.

    Notes
    -----
    Numbers become ``int64``/``float64``, booleans ``bool``, lists of numbers of one shape an
    array column of that shape, strings and anything else ``object``. A missing key or
    ``null`` is a missing value: ``NaN`` in float columns, ``None`` in object columns (an
    integer column with a missing value in the sample is ``float64``).
    """
    return JSONLSource(path, columns, dtypes=dtypes, infer_rows=infer_rows, progress=progress)
