"""Basic N-D indexing normalised once, so every backend only sees what it can read.

Backends (zarr, h5py) refuse negative steps and differ in how they treat out-of-range
integers. :func:`parse_key` turns a NumPy-style basic key into non-negative integers and
positive-step slices plus the output axes to reverse afterwards, with NumPy's errors.
:func:`plan_key` says which stored chunks such a normalised key touches, and where each
piece of them goes, for the read planner.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, TypeAlias

import numpy as np

from mixle.reading.plan import ChunkPlan

__all__ = ["BasicKey", "KeyLike", "parse_key", "plan_key", "read_extent"]

KeyLike: TypeAlias = Any  # int | slice | Ellipsis | tuple of those
ReadItem: TypeAlias = int | slice


@dataclass(frozen=True)
class BasicKey:
    """A parsed key: what to read (ints and positive-step slices) and which axes to flip.

    ``scalar`` is true when NumPy would return a scalar rather than a 0-d array: every axis
    is indexed by an integer and the key has no ``...``.
    """

    read: tuple[ReadItem, ...]
    flip: tuple[int, ...]
    shape: tuple[int, ...]
    scalar: bool = False

    def finish(self, block: np.ndarray) -> np.ndarray:
        """Apply the flips to a block read with :attr:`read`."""
        if self.flip:
            index = [slice(None)] * block.ndim
            for axis in self.flip:
                index[axis] = slice(None, None, -1)
            block = block[tuple(index)]
        return block


def _as_int(item: object) -> int | None:
    if isinstance(item, (bool, np.bool_)):
        return None
    try:
        return operator.index(item)  # type: ignore[arg-type]
    except TypeError:
        return None


def parse_key(key: KeyLike, shape: Sequence[int]) -> BasicKey:
    """Normalise a basic index ``key`` for an array of ``shape``.

    Accepts ints (negative counted from the end), slices with any step, ``...`` and tuples
    of those. Raises ``IndexError`` for out-of-range integers or too many indices and
    ``TypeError`` for anything else (fancy, boolean or ``None`` indices).
    """
    items = key if isinstance(key, tuple) else (key,)
    n_ellipsis = sum(item is Ellipsis for item in items)
    if n_ellipsis > 1:
        raise IndexError(f"key={key!r}: an index can only have a single ellipsis ('...')")
    n_real = len(items) - n_ellipsis
    if n_real > len(shape):
        raise IndexError(f"key={key!r}: too many indices for an array of {len(shape)} dimension(s)")
    if n_ellipsis:
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        fill = (slice(None),) * (len(shape) - n_real)
        items = items[:at] + fill + items[at + 1 :]
    items = items + (slice(None),) * (len(shape) - len(items))

    read: list[ReadItem] = []
    flip: list[int] = []
    out_shape: list[int] = []
    for axis, (item, dim) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            start, stop, step = item.indices(dim)
            count = len(range(start, stop, step))
            if count == 0:
                read.append(slice(0, 0, 1))
            elif step > 0:
                read.append(slice(start, stop, step))
            else:
                last = start + (count - 1) * step
                read.append(slice(last, start + 1, -step))
                flip.append(len(out_shape))
            out_shape.append(count)
            continue
        index = _as_int(item)
        if index is None:
            raise TypeError(
                f"key={key!r}: only integers, slices and '...' are valid indices here "
                f"(got {type(item).__name__} on axis {axis})"
            )
        if not -dim <= index < dim:
            raise IndexError(
                f"key={key!r}: index {index} is out of bounds for axis {axis} with size {dim}"
            )
        read.append(index + dim if index < 0 else index)
    scalar = not n_ellipsis and not out_shape
    return BasicKey(tuple(read), tuple(flip), tuple(out_shape), scalar)


def read_extent(read: Sequence[ReadItem]) -> tuple[int, ...]:
    """Shape of what ``read`` (from :attr:`BasicKey.read`) selects, integer axes kept as 1."""
    return tuple(1 if isinstance(k, int) else len(range(k.start, k.stop, k.step)) for k in read)


def plan_key(read: Sequence[ReadItem], chunks: Sequence[int]) -> ChunkPlan:
    """The chunks a normalised key touches and what each gives, as one box of a read plan.

    Parameters
    ----------
    read
        Non-negative integers and positive-step slices inside the array
        (:attr:`BasicKey.read`).
    chunks
        Chunk extent per axis, each >= 1.

    Returns
    -------
    ChunkPlan
        Every chunk holding a selected element, once, in C order of the chunk grid; its one
        piece ``(0, region, inner)`` puts ``chunk[inner]`` (stepped like the key) at
        ``out[region]`` of an output of shape :func:`read_extent` (integer axes kept as 1).
        Chunks between strided selections that hold no selected element are left out.
    """
    per_axis = [_axis_pieces(k, n) for k, n in zip(read, chunks)]
    coords: list[tuple[int, ...]] = []
    pieces: list[list[tuple[int, tuple[slice, ...], tuple[slice, ...]]]] = []
    for combo in product(*per_axis):
        coords.append(tuple(c for c, _, _ in combo))
        pieces.append([(0, tuple(r for _, r, _ in combo), tuple(i for _, _, i in combo))])
    return ChunkPlan(coords, pieces)


def _axis_pieces(item: ReadItem, chunk: int) -> list[tuple[int, slice, slice]]:
    """``(chunk index, region in the output, region in the chunk)`` along one axis."""
    if isinstance(item, int):
        return [(item // chunk, slice(0, 1), slice(item % chunk, item % chunk + 1))]
    selected = np.arange(item.start, item.stop, item.step, dtype=np.int64)
    if not selected.size:
        return []
    which = selected // chunk
    heads = np.flatnonzero(np.diff(which, prepend=-1)).tolist()
    tails = [*heads[1:], selected.size]
    out: list[tuple[int, slice, slice]] = []
    for head, tail in zip(heads, tails):
        k = int(which[head])
        lo, hi = int(selected[head]) - k * chunk, int(selected[tail - 1]) - k * chunk + 1
        out.append((k, slice(head, tail), slice(lo, hi, item.step)))
    return out
