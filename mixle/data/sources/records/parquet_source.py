"""Parquet files and directories as lazy, index-addressable record sources (:func:`read_parquet`).

Opening reads the footers only. Row ``i`` lives in the row group found by a binary search of
the cumulative row counts; a batch decodes each row group it touches once (only the selected
columns) and takes its rows. Decoded row groups are kept in a small byte-budgeted LRU cache,
so reading a row group batch by batch decodes it once. Streaming uses pyarrow's own batch
iterator, one file at a time.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.records.base import Batch, RecordSource, TableMeta
from mixle.data.sources.records.columns import OBJECT, check_columns
from mixle.data.spec import ArraySpec
from mixle.errors import ParquetReadError
from mixle.utils import optional_deps
from mixle.utils.files import require_regular_file
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path, redact_text

__all__ = [
    "ROW_GROUP_CACHE_BYTES",
    "ParquetReadError",
    "STREAM_BUFFER_BYTES",
    "ParquetSource",
    "arrow_spec",
    "arrow_to_numpy",
    "read_parquet",
]

#: Bytes of decoded row groups a Parquet source keeps (least recently used dropped first).
ROW_GROUP_CACHE_BYTES = 64 * 2**20
#: Read buffer of a streaming Parquet reader.
STREAM_BUFFER_BYTES = 2**20


#: Errors that pass through as they are: the file is gone or not readable by this user.
_PASS_THROUGH = (FileNotFoundError, PermissionError)


def _raise_read_error(exc: Exception, name: str, doing: str, group: int | None = None) -> NoReturn:
    """Raise pyarrow's ``exc`` (met while ``doing`` on file ``name``) as a ParquetReadError.

    Any other error, and a missing or unreadable file, is raised as it is. For a URL the
    chained pyarrow error is dropped (its text, redacted, is in the message).
    """
    pa = require("pyarrow", feature="read_parquet")
    if isinstance(exc, _PASS_THROUGH) or not isinstance(exc, (pa.ArrowException, OSError)):
        raise exc
    path = display_path(name)
    where = path if group is None else f"{path}, row group {group}"
    reason = redact_text(str(exc)).split("\n")[0]
    raise ParquetReadError(
        f"{where}: pyarrow cannot {doing} ({type(exc).__name__}: {reason}); the file is "
        "damaged, truncated or not a Parquet file, or could not be read. Rewrite it, or "
        "leave it out",
        path=path,
        row_group=group,
    ) from (None if "://" in name else exc)


def _parquet_file(name: str, fs: Any, **options: Any) -> Any:
    """``pq.ParquetFile(name)`` (its footer read), or :class:`ParquetReadError` naming it."""
    pq = require("pyarrow.parquet", "tabular", feature="read_parquet")
    try:
        return pq.ParquetFile(name, filesystem=fs, **options)
    except Exception as exc:
        _raise_read_error(exc, name, "read its footer")


def arrow_spec(arrow_type: Any, nullable_values: bool) -> ArraySpec:
    """The NumPy spec of an Arrow column type (``nullable_values``: the column has nulls)."""
    pa = require("pyarrow", feature="read_parquet")
    types = pa.types
    if types.is_integer(arrow_type):
        dtype = np.dtype(np.float64) if nullable_values else np.dtype(arrow_type.to_pandas_dtype())
        return ArraySpec((), dtype)
    if types.is_floating(arrow_type):
        return ArraySpec((), np.dtype(arrow_type.to_pandas_dtype()))
    if types.is_boolean(arrow_type):
        return ArraySpec((), OBJECT if nullable_values else np.dtype(np.bool_))
    if types.is_timestamp(arrow_type):
        return ArraySpec((), np.dtype(f"datetime64[{arrow_type.unit}]"))
    if types.is_date32(arrow_type):
        return ArraySpec((), np.dtype("datetime64[D]"))
    if types.is_fixed_size_list(arrow_type) and not nullable_values:
        inner = arrow_spec(arrow_type.value_type, False)
        if inner.dtype != OBJECT:
            return ArraySpec((arrow_type.list_size, *inner.shape), inner.dtype)
    return ArraySpec((), OBJECT)


def arrow_to_numpy(column: Any, spec: ArraySpec) -> np.ndarray:
    """A NumPy column of ``spec`` from an Arrow array (zero-copy where Arrow allows)."""
    pa = require("pyarrow", feature="read_parquet")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if spec.shape:
        flat = column.flatten()
        for _ in spec.shape[1:]:
            flat = flat.flatten()
        values = flat.to_numpy(zero_copy_only=False).reshape(len(column), *spec.shape)
    elif spec.dtype == OBJECT:
        values = np.empty(len(column), dtype=OBJECT)
        values[:] = column.to_pylist()
    else:
        values = column.to_numpy(zero_copy_only=False)
    return values if values.dtype == spec.dtype else values.astype(spec.dtype)


@dataclass
class _ParquetHandle:
    fs: Any
    files: list[str]
    group_starts: NDArray[np.int64]  # first row of every row group, then the total
    group_file: NDArray[np.int64]
    group_local: NDArray[np.int64]
    selected: list[str]
    opened: dict[int, Any]
    cache: OrderedDict[int, Any]
    cached_bytes: int
    lock: threading.Lock


def _list_files(fs: Any, path: str, pafs: Any) -> list[str]:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(
            f"path_or_url={path!r} does not exist; pass a Parquet file or a directory of them"
        )
    if info.type != pafs.FileType.Directory:
        if isinstance(fs, pafs.LocalFileSystem):  # a FIFO would block pyarrow's open for ever
            require_regular_file(path, "Parquet path")
        return [path]
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted(
        f.path
        for f in found
        if f.type == pafs.FileType.File
        and not any(part.startswith((".", "_")) for part in f.path[len(path) :].split("/"))
    )
    if not files:
        raise FileNotFoundError(f"path_or_url={path!r} is a directory with no Parquet files")
    return files


def _close_files(opened: dict[int, Any]) -> None:
    """Close the Parquet files in ``opened`` (a handle's finalizer and ``close()``)."""
    for pf in opened.values():
        pf.close()
    opened.clear()


class ParquetSource(RecordSource):
    """A Parquet file or a directory of Parquet files; see :func:`read_parquet`."""

    _library = "pyarrow"  # the module it needs (repr says when it is missing)

    def __init__(
        self, path_or_url: str | os.PathLike[str], columns: Sequence[str] | None = None
    ) -> None:
        if not isinstance(path_or_url, (str, os.PathLike)):
            raise TypeError(f"path_or_url={path_or_url!r} must be a path or URL string")
        self._init_state(
            {
                "path": os.fspath(path_or_url),
                "columns": None if columns is None else list(columns),
            }
        )
        if optional_deps.HAS_PYARROW:  # fail early: missing file, unknown column
            self._live()  # (without pyarrow: at first use, where pyarrow is installed)

    def _location(self) -> str:
        return display_path(self._args["path"])

    def _open(self) -> tuple[_ParquetHandle, TableMeta]:
        pafs = require("pyarrow.fs", "tabular", feature="read_parquet")
        path = self._args["path"]
        if "://" in path:
            fs, inner = pafs.FileSystem.from_uri(path)
        else:
            fs, inner = pafs.LocalFileSystem(), os.path.abspath(path)
        files = _list_files(fs, inner, pafs)
        first = _parquet_file(files[0], fs)
        schema = first.schema_arrow
        selected = check_columns(self._args["columns"], schema.names, self._location())
        counts, owners, locals_, nulls = [], [], [], dict.fromkeys(selected, False)
        opened = {0: first}
        for k, name in enumerate(files):
            pf = first if k == 0 else _parquet_file(name, fs)
            meta = pf.metadata
            missing = [c for c in selected if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(
                    f"{display_path(name)} has no column {missing[0]!r}, unlike "
                    f"{display_path(files[0])}; pass columns= present in every file"
                )
            where = {meta.schema.column(i).path.split(".")[0]: i for i in range(meta.num_columns)}
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                counts.append(group.num_rows)
                owners.append(k)
                locals_.append(g)
                for c in selected:
                    stats = group.column(where[c]).statistics
                    if stats is None or not stats.has_null_count or stats.null_count > 0:
                        nulls[c] = nulls[c] or group.num_rows > 0
            if k:
                pf.close()
        specs = {c: arrow_spec(schema.field(c).type, nulls[c]) for c in selected}
        starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        handle = _ParquetHandle(
            fs,
            files,
            starts,
            np.asarray(owners, dtype=np.int64),
            np.asarray(locals_, dtype=np.int64),
            selected,
            opened,
            OrderedDict(),
            0,
            threading.Lock(),
        )
        # the open files are closed when the handle is collected (the finalizer holds the
        # dict of files, never the handle or the source)
        weakref.finalize(handle, _close_files, opened)
        return handle, TableMeta(specs)

    @property
    def num_row_groups(self) -> int:
        """Row groups over all files."""
        return len(self._live().group_file)

    def _count(self, handle: _ParquetHandle) -> int:
        return int(handle.group_starts[-1])

    def _file(self, handle: _ParquetHandle, k: int) -> Any:
        pf = handle.opened.get(k)
        if pf is None:
            pf = _parquet_file(handle.files[k], handle.fs)
            handle.opened[k] = pf
        return pf

    def _group(self, handle: _ParquetHandle, g: int) -> Any:
        """Row group ``g`` (selected columns) as an Arrow table, decoded once while cached."""
        with handle.lock:
            table = handle.cache.get(g)
            if table is not None:
                handle.cache.move_to_end(g)
                return table
            k, local = int(handle.group_file[g]), int(handle.group_local[g])
            pf = self._file(handle, k)
            try:
                table = pf.read_row_group(local, columns=handle.selected)
            except Exception as exc:
                first, end = int(handle.group_starts[g]), int(handle.group_starts[g + 1])
                doing = f"decode it (rows {first}..{end - 1} of the source)"
                _raise_read_error(exc, handle.files[k], doing, local)
            handle.cache[g] = table
            handle.cached_bytes += table.nbytes
            while handle.cached_bytes > ROW_GROUP_CACHE_BYTES and len(handle.cache) > 1:
                _, old = handle.cache.popitem(last=False)
                handle.cached_bytes -= old.nbytes
            return table

    def _read_rows(self, handle: _ParquetHandle, rows: NDArray[np.int64]) -> Batch:
        pa = require("pyarrow", feature="read_parquet")
        groups = np.searchsorted(handle.group_starts, rows, side="right") - 1
        breaks = np.flatnonzero(np.diff(groups)) + 1
        pieces = []
        for part in np.split(np.arange(rows.size), breaks):
            g = int(groups[part[0]])
            local = rows[part] - handle.group_starts[g]
            table = self._group(handle, g)
            pieces.append(table.take(pa.array(local)))
        joined = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        meta = self._meta
        assert meta is not None
        return {c: arrow_to_numpy(joined.column(c), meta.columns[c]) for c in handle.selected}

    def _stream(self, handle: _ParquetHandle, block_rows: int) -> Iterator[Batch]:
        meta = self._meta
        assert meta is not None
        for k, name in enumerate(handle.files):
            # no pre-buffering: pyarrow would otherwise keep every column chunk it read
            options = {"pre_buffer": False, "buffer_size": STREAM_BUFFER_BYTES}
            with _parquet_file(name, handle.fs, **options) as pf:
                # one row group decoded at a time (threads would read several ahead)
                batches = pf.iter_batches(
                    batch_size=block_rows, columns=handle.selected, use_threads=False
                )
                done = 0  # rows of this file yielded
                while True:
                    try:
                        batch = next(batches, None)
                    except Exception as exc:
                        group = _group_of_row(handle, k, done)
                        _raise_read_error(exc, name, f"decode it (row {done} of the file)", group)
                    if batch is None:
                        break
                    done += batch.num_rows
                    yield {
                        c: arrow_to_numpy(batch.column(i), meta.columns[c])
                        for i, c in enumerate(handle.selected)
                    }

    def _release(self, handle: _ParquetHandle) -> None:
        _close_files(handle.opened)
        handle.cache.clear()

    def _forget(self, handle: _ParquetHandle) -> None:
        handle.opened.clear()
        handle.cache.clear()


def _group_of_row(handle: _ParquetHandle, k: int, row: int) -> int:
    """The row group of file ``k`` (its number in that file) that holds its row ``row``."""
    groups = np.flatnonzero(handle.group_file == k)
    starts = handle.group_starts[groups] - handle.group_starts[groups[0]]
    return int(np.searchsorted(starts, row, side="right") - 1)


def read_parquet(
    path_or_url: str | os.PathLike[str], columns: Sequence[str] | None = None
) -> ParquetSource:
    """Open a Parquet file, or a directory of them, as a lazy, index-addressable source.

    Parameters
    ----------
    path_or_url
        A local path or a URL pyarrow can open (``s3://``, ``gs://``, ``file://``...). A
        directory is read as the sorted list of its files, recursively (names starting
        with ``.`` or ``_`` are skipped), which must share the selected columns.
    columns
        Columns to read (default: all); the others are never decoded.

    Returns
    -------
    ParquetSource
        The same interface as :func:`mixle.read_csv`'s source.

    Raises
    ------
    TypeError
        ``path_or_url`` is not a path or URL string (always at construction).
    ImportError
        At first use (``len``, a read, ``columns``, ``element_spec``...) when pyarrow is not
        installed here (``pip install -e ".[tabular]"``). Construction itself succeeds
        without I/O, so a process without pyarrow can build a source and pickle it to
        workers that have it.
    FileNotFoundError
        Nothing at ``path_or_url``, or a directory without Parquet files.
    SpecialFileError
        A local ``path_or_url`` is a FIFO, device or socket.
    ParquetReadError
        A footer cannot be read (a truncated or non-Parquet file), here or when a file of a
        directory is first read; later, a row group that does not decode. The message names
        the file and the row group.
    ColumnNotFoundError
        A name in ``columns`` is not a column (the message lists them).

    Notes
    -----
    ``FileNotFoundError`` and ``ColumnNotFoundError`` are raised here when pyarrow is
    installed (the footers are read eagerly), at first use when it is not (the repr then
    says so).

    Column dtypes come from the Arrow schema; integer columns whose row-group statistics
    report nulls (or none) are ``float64`` with ``NaN``, strings and nested lists ``object``,
    fixed-size lists of numbers array columns. Streaming holds about one decoded row group
    (of the selected columns) at a time; random access keeps up to
    :data:`ROW_GROUP_CACHE_BYTES` of decoded row groups.
    """
    return ParquetSource(path_or_url, columns)
