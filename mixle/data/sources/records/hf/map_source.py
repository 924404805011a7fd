"""A map-style Hugging Face ``datasets.Dataset`` as a lazy, index-addressable record source.

A ``Dataset`` is an Arrow table (memory-mapped cache files, in memory, or both) and maybe an
indices mapping (after ``select``, ``shuffle``, ``filter``...): row ``i`` of the dataset is
row ``mapping[i]`` of the table. A batch maps its rows, then gathers them from the table's
record batches: a record batch holding many of them is read with one Arrow ``take``, a run of
consecutive rows with one zero-copy slice. Arrow's own ``take`` on a table of many record
batches would first join each column into one array, a copy of the whole column per batch.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.records.base import Batch, RecordSource, TableMeta
from mixle.data.sources.records.columns import check_columns
from mixle.data.sources.records.hf.columns import column_spec, column_to_numpy, has_nulls
from mixle.data.sources.records.hf.opening import check_format, load_saved
from mixle.utils import optional_deps
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = ["TAKE_RUNS", "HFSource"]

#: A record batch that holds more than this many runs of consecutive asked rows is read
#: with one ``take`` (else one slice a run).
TAKE_RUNS = 8


class _Pickled:
    """A ``datasets`` table, pickled by ``datasets``' own rules and unpickled on first use.

    A memory-mapped table pickles as its file path and the operations replayed on it, an
    in-memory one as its data.
    """

    __slots__ = ("_blob", "_table")

    def __init__(self, table: Any) -> None:
        self._table = table
        self._blob: bytes | None = None

    def get(self) -> Any:
        if self._table is None:
            assert self._blob is not None
            self._table = pickle.loads(self._blob)
        return self._table

    def __getstate__(self) -> bytes:
        if self._table is None:
            assert self._blob is not None
            return self._blob
        return pickle.dumps(self._table)

    def __setstate__(self, blob: bytes) -> None:
        self._table = None
        self._blob = blob


@dataclass
class _HFHandle:
    table: Any  # pyarrow.Table of the selected columns
    batches: list[Any] | None  # its record batches; None when it has at most one
    starts: NDArray[np.int64]  # first row of every record batch, then the total
    mapping: NDArray[np.int64] | None  # dataset row -> table row; None: the identity
    rows: int


def _memory_parts(table: Any) -> bool:
    """Whether a ``datasets`` table holds in-memory data (not only memory-mapped files)."""
    datasets = require("datasets", feature="read_hf")
    blocks = getattr(table, "blocks", None)  # a ConcatenationTable
    if blocks is not None:
        return any(_memory_parts(block) for row in blocks for block in row)
    return isinstance(table, datasets.table.InMemoryTable)


def _describe(dataset: Any) -> str:
    """Where a ``Dataset``'s rows live, for the repr."""
    files = [display_path(f["filename"]) for f in dataset.cache_files]
    mapped = "" if dataset._indices is None else ", rows through an indices mapping"
    if not files:
        return "in memory" + mapped
    shown = repr(files[0]) + (f" and {len(files) - 1} more files" if len(files) > 1 else "")
    memory = " and in-memory parts" if _memory_parts(dataset.data) else ""
    return f"files {shown}{memory}{mapped}"


def _mapping(indices: Any) -> NDArray[np.int64] | None:
    """The indices mapping as NumPy (zero-copy when it is one Arrow array)."""
    if indices is None:
        return None
    chunks = indices.table.column(0).chunks
    parts = [c.to_numpy(zero_copy_only=False) for c in chunks]
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts or [np.empty(0, np.uint64)])
    return flat.view(np.int64) if flat.dtype == np.uint64 else flat.astype(np.int64)


class HFSource(RecordSource):
    """A ``datasets.Dataset`` or a ``save_to_disk`` folder as records; see :func:`read_hf`.

    Notes
    -----
    Opened from a path, it pickles the path, ``split`` and ``columns``. Opened from a
    ``Dataset``, it pickles the dataset's Arrow tables by ``datasets``' own rules, unpickled
    only when the copy is first read: memory-mapped cache files as their paths (and the
    renames, casts, slices replayed on them), in-memory tables (``Dataset.from_dict``...)
    as their data, so the pickle of an in-memory dataset holds its rows; an indices
    mapping in memory (``select``, ``shuffle(keep_in_memory=True)``...) as its 8 bytes a
    row. The dataset's ``features`` travel in the Arrow schema (a few KiB at most).
    """

    _library = "datasets"  # the module it needs (repr says when it is missing)

    def __init__(
        self,
        dataset_or_path: Any,
        split: str | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        if columns is not None and (isinstance(columns, str) or not isinstance(columns, Sequence)):
            raise TypeError(f"columns={columns!r} must be a list of column names or None")
        if split is not None and not isinstance(split, str):
            raise TypeError(f"split={split!r} must be a split name (a string) or None")
        wanted = None if columns is None else list(columns)
        if isinstance(dataset_or_path, (str, os.PathLike)):
            args = {"path": os.fspath(dataset_or_path), "split": split, "columns": wanted}
        else:
            dataset = dataset_or_path
            if split is not None:
                raise ValueError(
                    f"split={split!r}, but dataset_or_path is a Dataset (one split), not a "
                    "DatasetDict; leave split out"
                )
            check_format(dataset)
            indices = dataset._indices
            args = {
                "table": _Pickled(dataset.data),
                "indices": None if indices is None else _Pickled(indices),
                "columns": wanted,
                "where": _describe(dataset),
            }
        self._init_state(args)
        if optional_deps.HAS_DATASETS:  # fail early: missing folder, split or column
            len(self)  # (without datasets: at first use, where it is installed)

    def _location(self) -> str:
        args = self._args
        if "path" not in args:
            return str(args["where"])
        split = args["split"]
        return repr(display_path(args["path"])) + ("" if split is None else f", split={split!r}")

    def _open(self) -> tuple[_HFHandle, TableMeta]:
        args = self._args
        if "path" in args:
            dataset = load_saved(args["path"], args["split"])
            table, indices = dataset.data, dataset._indices
        else:
            table = args["table"].get()
            indices = None if args["indices"] is None else args["indices"].get()
        arrow = table.table  # the pyarrow.Table inside the datasets table
        selected = check_columns(args["columns"], arrow.column_names, self._location())
        arrow = arrow.select(selected)
        specs = {
            c: column_spec(arrow.schema.field(c).type, has_nulls(arrow.column(c))) for c in selected
        }
        batches = arrow.to_batches()
        counts = [b.num_rows for b in batches]
        starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        mapping = _mapping(indices)
        rows = arrow.num_rows if mapping is None else len(mapping)
        many = batches if len(batches) > 1 else None
        return _HFHandle(arrow, many, starts, mapping, rows), TableMeta(specs)

    def _count(self, handle: _HFHandle) -> int:
        return handle.rows

    def _convert(self, table: Any) -> Batch:
        meta = self._meta
        assert meta is not None
        return {c: column_to_numpy(table.column(c), spec) for c, spec in meta.columns.items()}

    def _read_rows(self, handle: _HFHandle, rows: NDArray[np.int64]) -> Batch:
        pa = require("pyarrow", "hf", feature="read_hf")
        wanted = rows if handle.mapping is None else handle.mapping[rows]
        if handle.batches is None:  # one record batch: Arrow's take copies nothing else
            return self._convert(handle.table.take(pa.array(wanted)))
        if handle.mapping is None:
            return self._convert(_gather(handle, wanted))
        order = np.argsort(wanted, kind="stable")
        block = self._convert(_gather(handle, wanted[order]))
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return {name: column[inverse] for name, column in block.items()}

    def _stream(self, handle: _HFHandle, block_rows: int) -> Iterator[Batch]:
        for lo in range(0, handle.rows, block_rows):
            hi = min(handle.rows, lo + block_rows)
            if handle.mapping is None:
                yield self._convert(handle.table.slice(lo, hi - lo))
            else:
                yield self._read_rows(handle, np.arange(lo, hi, dtype=np.int64))


def _gather(handle: _HFHandle, rows: NDArray[np.int64]) -> Any:
    """Sorted table rows ``rows`` as one Arrow table, one take or slice per record batch run."""
    pa = require("pyarrow", "hf", feature="read_hf")
    assert handle.batches is not None
    n = rows.size
    chunk = np.searchsorted(handle.starts, rows, side="right") - 1
    local = rows - handle.starts[chunk]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (chunk[1:] != chunk[:-1]) | (local[1:] != local[:-1] + 1)
    run_starts = np.flatnonzero(new_run)
    run_ends = np.append(run_starts[1:], n)
    run_chunks = chunk[run_starts]
    chunks, first_run, run_counts = np.unique(run_chunks, return_index=True, return_counts=True)
    batches = handle.batches
    lengths = (run_ends - run_starts).tolist()
    locals_ = local[run_starts].tolist()
    if not (run_counts > TAKE_RUNS).any():  # the usual case: few rows of each record batch
        parts = [batches[c].slice(a, m) for c, a, m in zip(run_chunks.tolist(), locals_, lengths)]
    else:
        starts, ends = run_starts.tolist(), run_ends.tolist()
        parts = []
        for c, r0, m in zip(chunks.tolist(), first_run.tolist(), run_counts.tolist()):
            if m > TAKE_RUNS:
                parts.append(batches[c].take(pa.array(local[starts[r0] : ends[r0 + m - 1]])))
            else:
                parts += [batches[c].slice(locals_[r], lengths[r]) for r in range(r0, r0 + m)]
    concat = getattr(pa, "concat_batches", None)  # pyarrow >= 19: one copy of each column
    if concat is not None:
        return concat(parts)
    return pa.Table.from_batches(parts, schema=handle.table.schema).combine_chunks()
