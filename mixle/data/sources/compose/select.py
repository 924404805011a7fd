"""``select``: records of a source by indices, by a mask, or where a column equals a value.

A :class:`SelectSource` holds its child and the selected child indices; every read maps
the select's indices to the child's and reads them from the child in one call. Records
keep their identity (``record_keys``, ``origins``) when selected.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.sources.compose.children import (
    child_fingerprint,
    child_spec,
    read_records,
    refuse_path,
)
from mixle.data.sources.compose.lineage import leaf_keys, leaf_origins, name_tag, visit_keys
from mixle.data.sources.custom import Source
from mixle.data.sources.origins import Origins
from mixle.data.sources.records.base import STREAM_ROWS, RecordSource
from mixle.data.spec import SpecTree
from mixle.errors import ColumnNotFoundError, SourceClosedError

__all__ = ["COLUMN_BLOCK_ROWS", "SelectSource", "select"]

#: Rows per block when ``select(column=..., equals=...)`` reads the column.
COLUMN_BLOCK_ROWS = STREAM_ROWS


class _Missing:
    """The default of ``equals``: no value given (``None`` is a value to compare with)."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _parse_selection(value: object, length: int) -> tuple[NDArray[np.int64], str]:
    """``indices_or_mask`` as child indices, and ``"indices"`` or ``"mask"``."""
    accepted = (
        f"a 1-D int array of indices (any order, repeats allowed, negative from the end) or "
        f"a 1-D bool mask of exactly len(source) = {length}"
    )
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(
            f"indices_or_mask has shape {arr.shape} and dtype {arr.dtype}; it must be {accepted}"
        )
    if arr.dtype == np.bool_:
        if arr.size != length:
            raise ValueError(
                f"indices_or_mask is a bool mask of length {arr.size}; a mask must have "
                f"exactly len(source) = {length} entries (or pass int indices)"
            )
        return np.flatnonzero(arr).astype(np.int64), "mask"
    if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
        return np.zeros(0, np.int64), "indices"
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"indices_or_mask has dtype {arr.dtype} and shape {arr.shape}; it must be {accepted}"
        )
    return parse_indices(arr, length, name="indices_or_mask"), "indices"


def _column_values(block: Any, column: str, source: Any) -> np.ndarray:
    """Column ``column`` of a batch of ``source``'s records."""
    if not isinstance(block, Mapping):
        raise TypeError(
            f"select(column={column!r}) needs records that are dicts of columns; "
            f"{type(source).__name__} gives batches of type {type(block).__name__}"
        )
    if column not in block:
        raise ColumnNotFoundError(
            f"column={column!r} is not a column of {source!r}; its columns: "
            f"{', '.join(map(str, block))}"
        )
    return np.asarray(block[column])


def _narrowed(source: RecordSource, column: str) -> RecordSource:
    """A copy of a record source that reads ``column`` alone, when its backend can
    (``columns=`` is among its constructor arguments), else ``source`` itself."""
    if source.columns == (column,):
        return source
    rebuild, args = source.__reduce__()[:2]
    if len(args) != 2 or not isinstance(args[1], dict) or "columns" not in args[1]:
        return source
    return rebuild(args[0], {**args[1], "columns": [column]})


def _column_blocks(source: Any, column: str, rows: int) -> Iterator[np.ndarray]:
    """Column ``column`` of ``source``, ``rows`` records at a time, in order."""
    if isinstance(source, RecordSource):
        narrow = _narrowed(source, column)
        try:
            for block in narrow.iter_batches(rows):
                yield _column_values(block, column, source)
        finally:
            if narrow is not source:
                narrow.close()
        return
    stream = getattr(source, "iter_batches", None)
    if callable(stream):
        for block in stream(rows):
            yield _column_values(block, column, source)
        return
    n = len(source)
    for lo in range(0, n, rows):
        block = read_records(source, np.arange(lo, min(n, lo + rows), dtype=np.int64))
        yield _column_values(block, column, source)


def _equal_rows(values: np.ndarray, equals: Any, column: str) -> NDArray[np.bool_]:
    """Per row of ``values``, whether its value equals ``equals`` (all of it, for arrays)."""
    target = np.asarray(equals)
    if target.ndim and target.shape != values.shape[1:]:
        raise ValueError(
            f"equals has shape {target.shape}, but one value of column {column!r} has shape "
            f"{values.shape[1:]}"
        )
    same = np.asarray(values == target)
    if same.shape != values.shape:
        raise TypeError(
            f"equals={equals!r} cannot be compared with the values of column {column!r} "
            f"(dtype {values.dtype}) row by row"
        )
    return same.reshape(len(values), -1).all(axis=1) if same.ndim > 1 else same


def evaluate_column(source: Any, column: str, equals: Any) -> NDArray[np.bool_]:
    """Per record of ``source``, whether its ``column`` equals ``equals``; the column is
    read :data:`COLUMN_BLOCK_ROWS` rows at a time (alone where the source can)."""
    parts = [
        _equal_rows(v, equals, column) for v in _column_blocks(source, column, COLUMN_BLOCK_ROWS)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.bool_)


class SelectSource(Source):
    """The records of ``source`` at a fixed list of its indices (see :func:`select`)."""

    def __init__(
        self,
        source: Any,
        rows: NDArray[np.int64] | None,
        how: str,
        *,
        column: str | None = None,
        equals: Any = _MISSING,
        child_length: int | None = None,
    ) -> None:
        self._source = source
        self._rows = rows
        self._how = how
        self._column = column
        self._equals = equals
        self._child_length = child_length
        self._visits: NDArray[np.int64] | None = None  # occurrence numbers, when repeated
        self._repeats: bool | None = None  # whether the selection repeats an index
        self._lock = threading.Lock()

    # -- the selection ------------------------------------------------------------------
    @property
    def source(self) -> Any:
        """The source the records are selected from."""
        return self._source

    def child_indices(self) -> NDArray[np.int64]:
        """The selected indices of :attr:`source`, in the select's order (a copy).

        For ``column=``/``equals=`` the first call reads the column (once; see :func:`select`).
        """
        return self._selected().copy()

    def _live(self) -> None:
        if self._closed:
            raise SourceClosedError(f"{self!r} is closed")

    def _selected(self) -> NDArray[np.int64]:
        self._live()
        rows = self._rows
        if rows is None:
            with self._lock:  # two threads asking at once evaluate once
                rows = self._rows
                if rows is None:
                    assert self._column is not None
                    mask = evaluate_column(self._source, self._column, self._equals)
                    self._child_length = int(mask.size)
                    rows = self._rows = np.flatnonzero(mask).astype(np.int64)
        return rows

    def _mapped(self, indices: ArrayLike) -> NDArray[np.int64]:
        rows = self._selected()
        return rows[parse_indices(indices, rows.size)]

    def _occurrences(self) -> NDArray[np.int64] | None:
        """Per selected position, how many earlier positions select the same index (0:
        the first); ``None`` when no index repeats. Computed once, on first use."""
        if self._repeats is None:
            rows = self._selected()
            with self._lock:
                if self._repeats is None:
                    order = np.argsort(rows, kind="stable")
                    ranked = rows[order]
                    new = np.ones(rows.size, dtype=np.bool_)
                    new[1:] = ranked[1:] != ranked[:-1]
                    if not new.all():
                        starts = np.flatnonzero(new)
                        group = np.cumsum(new) - 1
                        visits = np.empty(rows.size, dtype=np.int64)
                        visits[order] = np.arange(rows.size) - starts[group]
                        self._visits = visits
                    self._repeats = not new.all()
        return self._visits

    # -- the source contract ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._selected().size)

    def get_batch(self, indices: ArrayLike) -> Any:
        """Records ``indices`` (any order, repeats allowed, negative from the end), stacked:
        one ``get_batch`` call of the child at the mapped indices."""
        return read_records(self._source, self._mapped(indices))

    def element_spec(self) -> SpecTree:
        """The child's element spec (``element_spec()``, or a NumPy array's row): selecting
        records does not change them.

        Raises
        ------
        TypeError
            The child declares none (no ``element_spec``, or one that raises
            ``TypeError`` or ``NotImplementedError``, or reports ``None``).
        """
        self._live()
        spec = child_spec(self._source)
        if spec is None:
            raise TypeError(f"{type(self._source).__name__} declares no element_spec() to report")
        return spec

    def record_keys(self, indices: ArrayLike) -> NDArray[np.uint64]:
        """The child's record keys at the mapped indices: a record keeps its identity.

        Record keys identify a visit of a record: the ``k``-th repeat (``k >= 1``) of an
        index the selection holds more than once gets its key hash-mixed with ``k``
        (:func:`~mixle.data.sources.compose.lineage.visit_keys`), so each repeat draws
        fresh randomness (an oversampled record is augmented anew).
        """
        rows = self._selected()
        positions = parse_indices(indices, rows.size)
        keys = leaf_keys(self._source, rows[positions])
        visits = self._occurrences()
        if visits is None:
            return keys
        salt = getattr(self, "_salt", None)
        if salt is None:  # once: the selection's digest tells this select's repeats apart
            salt = self._salt = name_tag(hashlib.blake2b(rows.tobytes()).hexdigest())
        return visit_keys(keys, visits[positions], salt)

    def origins(self, indices: ArrayLike) -> Origins:
        """The child's origins at the mapped indices (a plain child: its own indices)."""
        return leaf_origins(self._source, self._mapped(indices))

    @property
    def structure(self) -> Any:
        """The child's ``structure`` (``None`` when it has none)."""
        return getattr(self._source, "structure", None)

    def fingerprint(self) -> str:
        """A digest of the child's fingerprint and the selected indices (the Loader's resume
        check: another selection of the same length is another source)."""
        rows = self._selected()
        parts = {
            "type": type(self).__qualname__,
            "child": child_fingerprint(self._source),
            "rows": hashlib.sha256(rows.tobytes()).hexdigest(),
        }
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close the select *and its child*: the select owns the source it was given.

        Selects that share one child (a train/validation split) should be closed once,
        through the child, when all of them are done.
        """
        self._closed = True
        close = getattr(self._source, "close", None)
        if callable(close):
            close()

    def _how_chosen(self) -> str:
        if self._column is not None:
            return f"where {self._column!r} == {self._equals!r}"
        return f"by {self._how}"

    def __repr__(self) -> str:
        rows = self._rows
        if rows is None:
            kept = "not evaluated yet"
        else:
            of = "" if self._child_length is None else f" of {self._child_length}"
            kept = f"{rows.size}{of} rows"
        closed = ", closed" if self._closed else ""
        return f"SelectSource({self._source!r}, {kept} {self._how_chosen()}{closed})"

    # -- pickling -----------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        rows = self._selected()  # evaluated once here, not again in every worker
        return (
            _rebuild,
            (
                self._source,
                _pack(rows, self._child_length),
                self._how,
                self._column,
                self._equals,
                self._child_length,
            ),
        )


def _pack(rows: NDArray[np.int64], length: int | None) -> tuple[str, np.ndarray]:
    """The selection in its smallest form: a bit mask (increasing rows) or small ints."""
    if length is None:
        length = int(rows.max()) + 1 if rows.size else 0
    dtype = np.min_scalar_type(max(length - 1, 0))
    increasing = rows.size < 2 or bool((np.diff(rows) > 0).all())
    if increasing and (length + 7) // 8 < rows.size * dtype.itemsize:
        mask = np.zeros(length, dtype=np.bool_)
        mask[rows] = True
        return "bits", np.packbits(mask)
    return "rows", rows.astype(dtype)


def _unpack(packed: tuple[str, np.ndarray], length: int | None) -> NDArray[np.int64]:
    form, data = packed
    if form == "bits":
        return np.flatnonzero(np.unpackbits(data, count=length)).astype(np.int64)
    return data.astype(np.int64)


def _rebuild(
    source: Any,
    packed: tuple[str, np.ndarray],
    how: str,
    column: str | None,
    equals: Any,
    length: int | None,
) -> SelectSource:
    """A pickled select: its child and the selection, already evaluated."""
    if length is None and packed[0] == "bits":
        raise ValueError("a select pickled as a bit mask records its child's length")
    rows = _unpack(packed, length)
    return SelectSource(source, rows, how, column=column, equals=equals, child_length=length)


def select(
    source: Any,
    indices_or_mask: ArrayLike | None = None,
    *,
    column: str | None = None,
    equals: Any = _MISSING,
) -> SelectSource:
    """The records of ``source`` at some indices, by a mask, or where a column equals a value.

    Parameters
    ----------
    source
        Any mixle source (``len`` and ``get_batch``, or ``len`` and ``source[i]``), or
        another composition.
    indices_or_mask
        A 1-D int array of ``source``'s indices (any order, repeats allowed, negative from
        the end), or a 1-D bool mask of exactly ``len(source)`` entries. Give this or
        ``column``/``equals``, not both.
    column, equals
        For sources of dict records (record sources: Parquet, CSV, JSON lines,
        :class:`~mixle.MemorySource`...): the records whose ``column`` equals ``equals``
        (an array column: the whole value equals it). ``None`` is a value like any other;
        ``NaN`` equals nothing.

    Returns
    -------
    SelectSource
        A mixle source: ``len``, ``[i]``, slices, ``get_batch`` (one ``get_batch`` call of
        ``source``), ``records()``, ``element_spec()`` (``source``'s), ``record_keys`` and
        ``origins`` (``source``'s at the selected indices; record keys identify a visit
        of a record, so the ``k``-th repeat of an index, ``k >= 1``, gets its own key),
        ``close()`` (which closes ``source`` too), a context manager.

    Raises
    ------
    TypeError
        ``source`` is a path (``str``, ``bytes``, ``PathLike``: open it first, e.g.
        ``mixle.read_npy(path)``); both or neither of ``indices_or_mask`` and
        ``column``; ``column`` without ``equals`` or ``equals`` without ``column``;
        ``indices_or_mask`` of a dtype that is neither int nor bool; at the first read,
        ``column=`` on a source whose records are not dicts.
    ValueError
        ``indices_or_mask`` that is not 1-D, or a bool mask of another length.
    IndexError
        An index out of range.
    ColumnNotFoundError
        (a ``KeyError``) ``column`` is not a column of ``source`` (the message lists them);
        for a record source at once, for another source at the first read.

    Notes
    -----
    ``column``/``equals`` is evaluated once, lazily (at the first ``len()`` or read, never
    at construction), reading only that column where the source can (record sources with
    ``columns=``), :data:`COLUMN_BLOCK_ROWS` rows at a time; the result is cached, and two
    threads asking at once evaluate it once. Pickling stores ``source`` (by reference, as
    it pickles itself) and the selected indices, compactly (a bit mask when they increase):
    a select is evaluated before it is pickled, so worker processes never re-read the column.
    Repeats: ``origins`` give every repeat of an index the record's true origin, while
    ``record_keys`` give the ``k``-th repeat (``k >= 1``) the record's key hash-mixed with
    ``k``, so the Loader's ``record_transform`` and a ``map(..., fn(record, rng))`` above
    draw fresh randomness for each repeat (oversampling augments anew). The occurrence
    numbers are computed once, on the first ``record_keys`` call of a selection with
    repeats, and are not pickled.
    """
    refuse_path(source, "source")
    if not isinstance(column, (str, type(None))):
        raise TypeError(f"column={column!r} must be a column name (a str)")
    if column is not None and equals is _MISSING:
        raise TypeError(f"select(column={column!r}) needs equals=<value>: the value to keep")
    if column is None and equals is not _MISSING:
        raise TypeError(f"select(equals={equals!r}) needs column=<name>: the column to compare")
    if (indices_or_mask is None) == (column is None):
        given = "both" if column is not None else "neither"
        raise TypeError(
            f"select got {given} of indices_or_mask and column=/equals=; pass exactly one: "
            "select(source, indices_or_mask) or select(source, column=name, equals=value)"
        )
    if column is not None:
        if isinstance(source, RecordSource) and column not in source.columns:
            raise ColumnNotFoundError(
                f"column={column!r} is not a column of {source!r}; its columns: "
                f"{', '.join(source.columns)}"
            )
        return SelectSource(source, None, "column", column=column, equals=equals)
    n = len(source)
    rows, how = _parse_selection(indices_or_mask, n)
    return SelectSource(source, rows, how, child_length=n)
