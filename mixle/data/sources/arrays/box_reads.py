"""How an array source's batch and box reads check their arguments and read rows.

:func:`parse_indices` validates record indices, :func:`parse_boxes` and :func:`box_output`
the boxes and output of ``read_boxes``. Rows and keys are read chunk by chunk through the
read planner (:func:`read_by_chunks`, :func:`read_rows_by_chunks`) where the store has a
chunk reader, else one run of consecutive rows at a time (:func:`read_row_runs`,
:func:`take_rows`).
:func:`owned` makes sure a result never views a user's file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.indexing import ReadItem, RowsKey, consecutive_runs
from mixle.data.sources.key_plan import plan_key, read_extent
from mixle.reading import ChunkReader, read_chunked
from mixle.reading.executor import execute_plan

__all__ = [
    "RECORD_BLOCK_BYTES",
    "box_output",
    "int_list",
    "owned",
    "parse_boxes",
    "parse_indices",
    "read_by_chunks",
    "read_each_box",
    "read_row_runs",
    "read_rows_by_chunks",
    "rows_per_block",
    "take_rows",
]

#: How many bytes of rows ``records()`` reads at a time when the store has no chunking.
RECORD_BLOCK_BYTES = 16 * 1024 * 1024

#: Reads a region given as non-negative ints and positive-step slices.
RegionRead = Callable[[tuple[int | slice, ...]], np.ndarray]


def parse_indices(indices: ArrayLike, length: int, *, name: str = "indices") -> NDArray[np.int64]:
    """Validate record indices: a 1-D integer array in ``[-length, length)``, made non-negative."""
    idx = np.asarray(indices)
    if idx.dtype == np.bool_ or (idx.size and idx.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be integers, got dtype {idx.dtype}")
    if idx.dtype.kind == "u" and idx.size and int(idx.max()) >= length:
        # checked before the cast: 2**64 - 1 as int64 is -1, the last row
        raise IndexError(f"{name} contains {int(idx.max())}, out of range for length {length}")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -length or hi >= length:
            bad = lo if lo < -length else hi
            raise IndexError(f"{name} contains {bad}, out of range for length {length}")
        if lo < 0:
            idx = np.where(idx < 0, idx + length, idx)
    return idx


def parse_boxes(
    starts: ArrayLike, size: ArrayLike, shape: tuple[int, ...]
) -> tuple[list[list[int]], list[int]]:
    """Validate boxes of one ``size`` at each row of ``starts`` in an array of ``shape``.

    Returns the starts and the size as lists of Python ints.

    Raises
    ------
    TypeError
        Coordinates that are not integers.
    ValueError
        A start or the size without one entry per axis.
    IndexError
        A box outside the array.
    """
    rows: list[Any] = starts if _is_int_rows(starts) else _int_array(starts, "starts").tolist()
    ext = int_list(size, "size")
    bad_rows = [r for r in rows if not isinstance(r, list) or len(r) != len(shape)]
    if len(ext) != len(shape) or bad_rows:
        shown = f"start={bad_rows[0]}" if bad_rows else f"size={tuple(ext)}"
        raise ValueError(
            f"{shown}: every box needs {len(shape)} start and size entries for an array "
            f"of shape {shape} (starts is (B, {len(shape)}))"
        )
    for row in rows:
        if any(a < 0 or n < 0 or a + n > d for a, n, d in zip(row, ext, shape)):
            raise IndexError(
                f"box start={tuple(row)}, size={tuple(ext)} is outside the array of shape {shape}"
            )
    return rows, ext


def box_output(out: np.ndarray | None, want: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``out`` checked to have shape ``want`` and ``dtype``, or a new array of them."""
    if out is None:
        return np.empty(want, dtype=dtype)
    if out.shape != want or out.dtype != dtype:
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}; expected {want} {dtype}"
        )
    return out


def read_by_chunks(reader: ChunkReader, key: tuple[ReadItem, ...], dtype: np.dtype) -> np.ndarray:
    """Read a normalised ``key`` chunk by chunk through the read planner.

    ``key`` is a ``BasicKey.read`` (ints, positive-step slices) or a ``RowsKey.read``
    (sorted distinct rows on axis 0, then those). Only the chunks holding selected
    elements are read, each once (from the shared cache when it is there), straight into
    an output of the selection's shape.
    """
    extent = read_extent(key)
    out = np.empty([n for k, n in zip(key, extent) if not isinstance(k, int)], dtype)
    if all(extent):  # integer axes as length 1 in a view, so that ``out`` owns its memory
        execute_plan(reader, plan_key(key, reader.chunks), out.reshape(1, *extent))
    return out


def read_rows_by_chunks(
    reader: ChunkReader, idx: NDArray[np.int64], shape: tuple[int, ...], out: np.ndarray
) -> np.ndarray:
    """Fill ``out`` with rows ``idx`` (validated, non-negative) through the read planner."""
    starts = np.zeros((idx.size, len(shape)), dtype=np.int64)
    starts[:, 0] = idx
    read_chunked(reader, starts.tolist(), (1, *shape[1:]), shape, out[:, np.newaxis])
    return out


def read_row_runs(read: RegionRead, key: RowsKey, dtype: np.dtype) -> np.ndarray:
    """The distinct rows of ``key`` with its basic key on the other axes, unflipped.

    Each run of consecutive rows is one ``read``.
    """
    extent = read_extent(key.read)
    out = np.empty([n for k, n in zip(key.read, extent) if not isinstance(k, int)], dtype)
    if not all(extent):
        return out
    firsts, ends = consecutive_runs(key.unique)
    at = 0
    for lo, hi in zip(firsts.tolist(), ends.tolist()):
        out[at : at + hi - lo] = read((slice(lo, hi), *key.rest.read))
        at += hi - lo
    return out


def take_rows(
    read: RegionRead, idx: NDArray[np.int64], shape: tuple[int, ...], out: np.ndarray
) -> np.ndarray:
    """Fill ``out`` with rows ``idx`` (validated, non-negative) of an array of ``shape``.

    Each distinct row is read once, each run of consecutive rows in one ``read``; rows
    asked for in increasing order, each once, are read straight into ``out``.
    """
    unique = np.unique(idx)
    breaks = np.flatnonzero(np.diff(unique) != 1) + 1
    in_order = unique.size == idx.size and bool(np.array_equal(unique, idx))
    rows = out if in_order else np.empty((unique.size, *shape[1:]), dtype=out.dtype)
    for run in np.split(np.arange(unique.size), breaks):
        lo, hi = int(unique[run[0]]), int(unique[run[-1]]) + 1
        rows[run[0] : run[-1] + 1] = read((slice(lo, hi),))
    if not in_order:
        np.take(rows, np.searchsorted(unique, idx), axis=0, out=out)
    return out


def read_each_box(
    read_into: Callable[[tuple[slice, ...], np.ndarray], None],
    starts: list[list[int]],
    size: list[int],
    out: np.ndarray,
) -> None:
    """Fill ``out[i]`` with the box at ``starts[i]``, one ``read_into(key, view)`` per box."""
    for i, row in enumerate(starts):
        key = tuple(slice(a, a + n) for a, n in zip(row, size))
        read_into(key, out[i, ...])  # a view, also of a 0-d box


def rows_per_block(shape: tuple[int, ...], chunks: tuple[int, ...] | None, dtype: np.dtype) -> int:
    """How many rows ``records()`` reads at a time: a chunk's, or :data:`RECORD_BLOCK_BYTES`."""
    if chunks:
        return max(1, chunks[0])
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
    return max(1, RECORD_BLOCK_BYTES // row_bytes)


def _is_int_rows(starts: object) -> TypeGuard[list[Any]]:
    """Whether ``starts`` is already a list of lists of Python ints (the per-index path)."""
    return isinstance(starts, list) and all(
        isinstance(row, list) and all(type(v) is int for v in row) for row in starts
    )


def _int_array(values: ArrayLike, name: str) -> np.ndarray:
    """Box coordinates as int64; floats and bools are refused, never truncated."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype} ({values!r:.80})")
    return arr.astype(np.int64, copy=False)


def int_list(values: ArrayLike, name: str) -> list[int]:
    """Box coordinates as Python ints (tuples of ints pass straight through)."""
    if isinstance(values, tuple) and all(type(v) is int for v in values):
        return list(values)
    return _int_array(values, name).reshape(-1).tolist()


def owned(block: np.ndarray) -> np.ndarray:
    """A plain ndarray that owns its memory (no memmap subclass, no view into a file)."""
    if type(block) is np.ndarray and block.base is None:
        return block
    return np.array(block, copy=True, subok=False)
