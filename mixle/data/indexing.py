"""Basic N-D indexing normalised once, so every backend only sees what it can read.

Backends (zarr, h5py) refuse negative steps and differ in how they treat out-of-range
integers. :func:`parse_key` turns a NumPy-style basic key into non-negative integers and
positive-step slices plus the output axes to reverse afterwards, with NumPy's errors.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

__all__ = ["BasicKey", "KeyLike", "parse_key"]

KeyLike: TypeAlias = Any  # int | slice | Ellipsis | tuple of those
ReadItem: TypeAlias = int | slice


@dataclass(frozen=True)
class BasicKey:
    """A parsed key: what to read (ints and positive-step slices) and which axes to flip."""

    read: tuple[ReadItem, ...]
    flip: tuple[int, ...]
    shape: tuple[int, ...]

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
    return BasicKey(tuple(read), tuple(flip), tuple(out_shape))
