"""A Hugging Face ``datasets.IterableDataset`` as a stream of records (no length, no index).

Each ``iter(src)`` iterates the dataset afresh (``datasets`` shuffles, shards and resumes it
by its own rules) and converts every example to NumPy with the column rules of
:func:`~mixle.read_hf`'s map-style source, the column specs coming from the dataset's
``features``.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.records.base import Record
from mixle.data.sources.records.columns import OBJECT, check_columns
from mixle.data.sources.records.hf.columns import column_spec
from mixle.data.spec import ArraySpec
from mixle.errors import ColumnNotFoundError, SourceClosedError

__all__ = ["HFStreamSource", "at_epoch"]


def _infer(value: Any) -> Any:
    """A value of a dataset without ``features``: Python numbers as NumPy scalars."""
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    return value


def at_epoch(dataset: Any, epoch: int) -> Any:
    """A shallow copy of the ``IterableDataset`` ``dataset`` at ``epoch``, the epoch its own.

    With torch installed, ``datasets`` keeps an ``IterableDataset``'s epoch in a torch tensor
    in shared memory (for torch's persistent DataLoader workers) that ``set_epoch`` changes
    in place: every process forked from the one that made the dataset sees the change, so
    worker processes reading different epochs at once changed each other's epoch between
    ``set_epoch`` and the pass (a pass in another epoch's order, or a negative epoch that
    failed). The copy holds a plain int; the caller's dataset is not changed.
    """
    clone = copy.copy(dataset)
    # copy.copy shares the dataset's __dict__ (its __getstate__ returns it): give the copy
    # its own, whose epoch (read by epoch and by set_epoch) is an int
    clone.__dict__ = dict(vars(dataset))
    if "_epoch" in vars(clone):
        clone.__dict__["_epoch"] = int(epoch)
    else:
        clone.set_epoch(epoch)
    return clone


class HFStreamSource:
    """An ``IterableDataset`` as a stream of records; see :func:`~mixle.read_hf`.

    Has no ``len`` and no ``[i]``: ``iter(src)`` is the only read, a fresh pass over the
    dataset each call. Pickling pickles the ``IterableDataset`` (as ``datasets`` does).
    """

    def __init__(self, dataset: Any, columns: Sequence[str] | None = None) -> None:
        if columns is not None and (isinstance(columns, str) or not isinstance(columns, Sequence)):
            raise TypeError(f"columns={columns!r} must be a list of column names or None")
        dataset = dataset.with_format(None)  # a format is ignored, as in the map-style source
        features = dataset.features
        self._columns: list[str] | None = None if columns is None else list(columns)
        self._specs: dict[str, ArraySpec] | None = None
        if features is not None:
            names = check_columns(self._columns, list(features), self._location_of(dataset))
            schema = features.arrow_schema
            self._specs = {c: column_spec(schema.field(c).type, False) for c in names}
            if columns is not None:
                dataset = dataset.select_columns(names)
            self._columns = names
            decode = getattr(dataset, "decode", None)  # datasets >= 3
            if decode is not None:
                dataset = decode(False)  # media stay as stored, as in the map-style source
        elif self._columns is not None and len(set(self._columns)) != len(self._columns):
            raise ValueError(f"columns={self._columns!r} names a column twice")
        self._dataset = dataset
        self._closed = False

    @staticmethod
    def _location_of(dataset: Any) -> str:
        shards = getattr(dataset, "num_shards", None)
        return "IterableDataset" + ("" if shards is None else f" of {shards} shards")

    def element_spec(self) -> dict[str, ArraySpec] | None:
        """Shape and dtype of each field of one record, from ``features``; ``None`` without.

        Without ``features`` (an ``IterableDataset.from_generator`` given none) the values
        are converted one by one: Python ``bool``/``int``/``float`` become NumPy ``bool_``/
        ``int64``/``float64`` scalars, everything else stays as the dataset gives it.
        """
        self._check_open()
        return None if self._specs is None else dict(self._specs)

    @property
    def columns(self) -> tuple[str, ...] | None:
        """Column names, in order; ``None`` when the dataset's ``features`` are unknown."""
        return None if self._columns is None else tuple(self._columns)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _check_open(self, doing: str = "read it") -> None:
        if self._closed:
            raise SourceClosedError(
                f"{type(self).__name__}({self._location_of(self._dataset)}) is closed; open "
                f"it again to {doing}"
            )

    def set_epoch(self, epoch: int) -> None:
        """Tell the dataset the epoch (the Loader does, before each pass), so that its own
        ``shuffle()`` gives a new order each epoch.

        This source then reads a copy of the dataset at that epoch (:func:`at_epoch`): the
        dataset it was given is not changed, and processes forked from this one each keep
        their own epoch."""
        self._dataset = at_epoch(self._dataset, epoch)

    def __iter__(self) -> Iterator[Record]:
        """A fresh pass over the dataset: one record (dict of NumPy values) per example."""
        self._check_open()
        return self._records()

    def _records(self) -> Iterator[Record]:
        specs, names = self._specs, self._columns
        for index, example in enumerate(self._dataset):
            self._check_open()
            if specs is not None:
                yield {c: _convert(example[c], s, c, index) for c, s in specs.items()}
                continue
            if names is None:
                yield {c: _infer(v) for c, v in example.items()}
                continue
            missing = [c for c in names if c not in example]
            if missing:
                raise ColumnNotFoundError(
                    f"columns={names!r}: example {index} of the IterableDataset has no column "
                    f"{missing[0]!r}; its columns: {', '.join(example)}"
                )
            yield {c: _infer(example[c]) for c in names}

    def close(self) -> None:
        """Stop reading: later ``iter()`` calls and the next record of a pass raise."""
        self._closed = True

    def __enter__(self) -> HFStreamSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        self._check_open("pickle it")
        return (_rebuild, (self._dataset, self._columns, self._specs))

    def __repr__(self) -> str:
        where = self._location_of(self._dataset)
        if self._closed:
            return f"<{type(self).__name__} {where} (closed)>"
        shown = "unknown (no features)" if self._columns is None else self._columns
        return f"{type(self).__name__}({where}, columns={shown})"


def _rebuild(
    dataset: Any, columns: list[str] | None, specs: dict[str, ArraySpec] | None
) -> HFStreamSource:
    obj = HFStreamSource.__new__(HFStreamSource)
    obj._dataset, obj._columns, obj._specs, obj._closed = dataset, columns, specs, False
    return obj


def _convert(value: Any, spec: ArraySpec, column: str, index: int) -> Any:
    """One value of a column with a known spec, as the map-style source gives it."""
    dtype = spec.dtype
    if dtype == OBJECT:
        return value
    if value is None:
        if not spec.shape and dtype.kind == "f":
            return dtype.type(np.nan)
        if not spec.shape and dtype.kind in "Mm":
            return np.datetime64("NaT") if dtype.kind == "M" else np.timedelta64("NaT")
        raise ValueError(
            f"example {index} of the IterableDataset: column {column!r} ({dtype}, shape "
            f"{spec.shape}) is missing (None), which that dtype cannot hold; cast the column "
            f"first, e.g. ds.cast_column({column!r}, datasets.Value('float64'))"
        )
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError):  # a None inside a list, a ragged list
        array = None
    if array is None or array.shape != spec.shape:
        shape = "values NumPy cannot read" if array is None else f"shape {array.shape}"
        raise ValueError(
            f"example {index} of the IterableDataset: column {column!r} has {shape} as "
            f"{dtype}, but its features say shape {spec.shape}; cast the column to a "
            "variable-length feature, e.g. datasets.List(...) without length"
        )
    return array if spec.shape else array[()]
