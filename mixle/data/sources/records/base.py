"""The shared surface of record (tabular) sources, and :class:`MemorySource`.

A record is one row: a dict of column name -> NumPy scalar (or array, for array columns).
A batch is a dict of column name -> NumPy column with the rows on axis 0. A backend says
how to open its store, describe its columns, count its rows, read a sorted set of rows and
stream blocks of rows; this base class gives every backend the same contract as the array
sources: ``len``, ``[i]``, ``get_batch``, ``records()``, ``element_spec()``, pickling by
reference, reopening after ``fork``, ``close()`` and a context manager.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.sources.lifetime import SourceLifetime
from mixle.data.sources.records.array_leaves import is_array_leaf, stack_leaves
from mixle.data.sources.records.columns import OBJECT, infer_value_spec, values_to_array
from mixle.data.spec import ArraySpec
from mixle.errors import ColumnNotFoundError
from mixle.utils.optional_deps import not_opened_note

__all__ = ["STREAM_ROWS", "Batch", "MemorySource", "Record", "RecordSource", "TableMeta"]

#: Rows per block when ``records()`` and ``iter_batches()`` stream a source.
STREAM_ROWS = 8192

#: One row: column name -> NumPy scalar (or array).
Record = dict[str, Any]
#: Rows stacked: column name -> NumPy column with the rows on axis 0.
Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class TableMeta:
    """Column names and per-record specs, read when a source opens."""

    columns: dict[str, ArraySpec]


class RecordSource(SourceLifetime, abc.ABC):
    """Base class of lazy, index-addressable record sources (CSV, JSON lines, Parquet, SQL).

    Notes
    -----
    - ``src[i]`` is a record, ``src[a:b:c]`` and ``src.get_batch(indices)`` a batch (dict of
      columns) with rows in the order asked for; repeated indices repeat rows.
    - Pickling stores the constructor arguments, never data (except :class:`MemorySource`,
      whose data is its argument); the copy reopens lazily. A source used in a forked child
      reopens its files and connections there.
    - Reads are safe from several threads, also with ``close()``: a read in flight
      finishes on the open handle (which the last such read then releases), a read or the
      next block of a stream asked for after ``close()`` raises :class:`SourceClosedError`.
    """

    #: The optional module a backend needs, named in its repr when missing.
    _library: str | None = None

    _args: dict[str, Any]
    _meta: TableMeta | None
    _length: int | None

    def _init_state(self, args: dict[str, Any]) -> None:
        """Store constructor arguments and reset handles; no I/O."""
        self._args = args
        self._length = None
        self._init_lifetime()

    # -- what a backend provides --------------------------------------------------------
    @abc.abstractmethod
    def _open(self) -> tuple[Any, TableMeta]:
        """Open the store: return the live handle and the column metadata."""

    @abc.abstractmethod
    def _location(self) -> str:
        """Where the data lives, safe to show (no credentials)."""

    @abc.abstractmethod
    def _count(self, handle: Any) -> int:
        """The number of rows (may build an index once; cached by the base class)."""

    @abc.abstractmethod
    def _read_rows(self, handle: Any, rows: NDArray[np.int64]) -> Batch:
        """Read rows given as sorted, unique, in-range indices."""

    @abc.abstractmethod
    def _stream(self, handle: Any, block_rows: int) -> Iterator[Batch]:
        """Read every row in order, ``block_rows`` at a time, without random access."""

    def _forget(self, handle: Any) -> None:
        """Drop ``handle`` in a forked child without closing what the parent still uses."""

    # -- handles ------------------------------------------------------------------------
    def _open_described(self) -> tuple[Any, TableMeta]:
        return self._open()

    def _forked(self, handle: Any) -> None:
        self._forget(handle)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise self._closed_error("pickle it")
        return (_reopen, (type(self), self._args))

    # -- metadata -----------------------------------------------------------------------
    def _table(self) -> TableMeta:
        self._live()
        assert self._meta is not None
        return self._meta

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names, in order."""
        return tuple(self._table().columns)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        """Column name -> NumPy dtype of that column."""
        return {name: spec.dtype for name, spec in self._table().columns.items()}

    def element_spec(self) -> dict[str, ArraySpec]:
        """Shape and dtype of each field of one record, from metadata."""
        return dict(self._table().columns)

    # -- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._length is None:
            handle = self._begin_read()
            try:
                with self._lock:
                    if self._length is None:
                        self._length = int(self._count(handle))
            finally:
                self._end_read()
        else:
            self._live()  # raises once closed
        return self._length

    def get_batch(self, indices: ArrayLike) -> Batch:
        """Rows ``indices`` (any order, repeats allowed, negative from the end) as columns.

        Each distinct row is read once; rows come back in the order asked for.
        """
        handle = self._begin_read()
        try:  # close() defers the release until _end_read
            n = self._length
            idx = parse_indices(indices, len(self) if n is None else n)
            unique = np.unique(idx)
            if not unique.size:
                return self._empty()
            block = self._read_rows(handle, unique)
        finally:
            self._end_read()
        if unique.size == idx.size and (unique == idx).all():
            return block
        position = np.searchsorted(unique, idx)
        return {name: column[position] for name, column in block.items()}

    def _empty(self) -> Batch:
        return {
            name: np.empty((0, *spec.shape), dtype=spec.dtype)
            for name, spec in self._table().columns.items()
        }

    def __getitem__(self, key: int | np.integer | slice | str) -> Any:
        """``src[i]``: a record; ``src[a:b:c]``: a batch; ``src["column"]``: a whole column.

        Reading a whole column reads every row of it (``columns=`` at open is cheaper).
        """
        if isinstance(key, str):
            if key not in self._table().columns:
                raise ColumnNotFoundError(
                    f"{key!r} is not a column of {self!r}; its columns: {', '.join(self.columns)}"
                )
            parts = [block[key] for block in self.iter_batches()]
            return np.concatenate(parts) if parts else self._empty()[key]
        if isinstance(key, slice):
            return self.get_batch(np.arange(*key.indices(len(self)), dtype=np.int64))
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            batch = self.get_batch([int(key)])
            return {name: column[0] for name, column in batch.items()}
        raise TypeError(
            f"{type(self).__name__} index must be an int, a slice or a column name, got "
            f"{type(key).__name__}; use get_batch(indices) for many rows"
        )

    def iter_batches(self, batch_rows: int = STREAM_ROWS) -> Iterator[Batch]:
        """Stream every row in order as batches of ``batch_rows`` rows, with bounded memory.

        Needs no row index: a CSV or JSON lines file is read sequentially once.
        """
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, (int, np.integer)):
            raise TypeError(f"batch_rows={batch_rows!r} must be an int >= 1")
        if batch_rows < 1:
            raise ValueError(f"batch_rows={batch_rows} must be an int >= 1")
        return self._open_stream(self._stream(self._live(), int(batch_rows)))

    def _open_stream(self, blocks: Iterator[Batch]) -> Iterator[Batch]:
        """``blocks`` until :meth:`close`: the next block asked for after it raises."""
        while not self._closed:
            block = next(blocks, None)
            if block is None:
                return
            yield block
        raise self._closed_error()

    def records(self) -> Iterator[Record]:
        """Yield every record in order, streaming a block of rows at a time."""
        for block in self.iter_batches():
            names = list(block)
            columns = [block[name] for name in names]
            for i in range(len(columns[0]) if columns else 0):
                yield {name: column[i] for name, column in zip(names, columns)}

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    # -- lifetime -----------------------------------------------------------------------
    def __repr__(self) -> str:
        name = type(self).__name__
        if self._closed:
            return f"<{name} {self._location()} (closed)>"
        if self._meta is None:
            return f"<{name} {self._location()} ({not_opened_note(self._library)})>"
        rows = "" if self._length is None else f", rows={self._length}"
        return f"{name}({self._location()}, columns={list(self._meta.columns)}{rows})"


def _reopen(cls: type[RecordSource], args: dict[str, Any]) -> RecordSource:
    """Rebuild a pickled source without opening it; it opens on first use."""
    obj = cls.__new__(cls)
    obj._init_state(args)
    return obj


#: Says where value ``i`` of column ``name`` came from in ``MemorySource`` data.
_Where = Callable[[str, int], str]


def _columns_of(data: object) -> tuple[dict[str, Any], _Where]:
    """Normalise ``MemorySource`` data to a dict of column name -> values, and their places."""
    if isinstance(data, Mapping):
        columns = {str(name): values for name, values in data.items()}
        return columns, lambda name, i: f"data[{name!r}][{i}]"
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        rows = list(data)
        if not rows:
            raise ValueError("data=[] has no records, so its columns are unknown; pass a dict")
        first = rows[0]
        if isinstance(first, Mapping):
            names = list(first)
            for i, row in enumerate(rows):
                if not isinstance(row, Mapping) or list(row) != names:
                    raise ValueError(f"data[{i}] has keys {list(row)}; data[0] has {names}")
            columns = {str(n): [row[n] for row in rows] for n in names}
            return columns, lambda name, i: f"data[{i}][{name!r}]"
        if isinstance(first, tuple):
            width = len(first)
            for i, row in enumerate(rows):
                if not isinstance(row, tuple) or len(row) != width:
                    raise ValueError(f"data[{i}] is not a tuple of {width} values like data[0]")
            return {str(k): [row[k] for row in rows] for k in range(width)}, _tuple_place
    raise TypeError(
        f"data={type(data).__name__} must be a dict of equal-length columns (arrays or "
        "lists) or a list of records (dicts or tuples)"
    )


def _tuple_place(name: str, i: int) -> str:
    return f"data[{i}][{name}]"


def _as_column(name: str, values: Any, where: _Where) -> np.ndarray:
    """One ``MemorySource`` column: NumPy arrays as given, array leaves stacked, else inferred."""
    if isinstance(values, np.ndarray):
        return values
    if is_array_leaf(values):  # a JAX array, a pandas Series... holding the whole column
        array = np.asarray(values)
        if array.ndim == 0:
            raise TypeError(
                f"data[{name!r}] is a 0-d {type(values).__name__}; a column holds one value "
                "per record"
            )
        if array.dtype != OBJECT:
            return array
    values = list(values)
    if any(is_array_leaf(v) for v in values):
        return stack_leaves(values, name, lambda i: where(name, i))
    dtype, shape = infer_value_spec(values)
    return values_to_array(values, dtype, shape, name, lambda i: i, "data")


class MemorySource(RecordSource):
    """Records held in memory: a dict of equal-length columns or a list of records.

    Parameters
    ----------
    data
        ``{"name": array_or_list, ...}`` or ``[{"name": value, ...}, ...]`` or a list of
        tuples (columns named ``"0"``, ``"1"``...). A NumPy array column is kept as given
        (an ``object`` array is the way to hold arrays of different shapes); another array
        (JAX, a pandas ``Series``...) is converted with ``np.asarray``. Array leaves (NumPy
        scalars and arrays, JAX arrays: anything with ``__array__``, ``shape`` and
        ``dtype``) keep their dtype and stack on a new leading axis, so
        ``[{"image": jnp.ones((28, 28)), "label": i}, ...]`` gives ``image`` batches
        ``(B, 28, 28)`` float32. Plain Python values become NumPy columns as JSON values do:
        ints ``int64``, floats ``float64``, missing values (``None``) ``NaN`` in number
        columns, strings ``object``.

    Raises
    ------
    ValueError
        Columns of different lengths (the message lists every column's length), or records
        with different keys.
    LeafMismatchError
        (a ``ValueError``) Array leaves of one key differ in shape or dtype (a plain Python
        value among them counts as what NumPy makes of it); the message names the key, both
        records, their shapes and dtypes.

    Notes
    -----
    Pickling copies the columns (there is no file to refer to).
    """

    def __init__(self, data: Mapping[str, Any] | Sequence[Any]) -> None:
        named, where = _columns_of(data)
        columns = {name: _as_column(name, values, where) for name, values in named.items()}
        lengths = {name: len(column) for name, column in columns.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
            raise ValueError(f"data columns must have equal lengths, got {shown}")
        self._init_state({"data": columns})

    def _open(self) -> tuple[dict[str, np.ndarray], TableMeta]:
        data: dict[str, np.ndarray] = self._args["data"]
        specs = {name: ArraySpec(col.shape[1:], col.dtype) for name, col in data.items()}
        return data, TableMeta(specs)

    def _location(self) -> str:
        return "in memory"

    def _count(self, handle: dict[str, np.ndarray]) -> int:
        return len(next(iter(handle.values()))) if handle else 0

    def _read_rows(self, handle: dict[str, np.ndarray], rows: NDArray[np.int64]) -> Batch:
        return {name: column[rows] for name, column in handle.items()}

    def _stream(self, handle: dict[str, np.ndarray], block_rows: int) -> Iterator[Batch]:
        n = self._count(handle)
        for lo in range(0, n, block_rows):
            yield {name: column[lo : lo + block_rows].copy() for name, column in handle.items()}
