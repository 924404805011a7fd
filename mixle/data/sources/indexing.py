"""N-D indexing normalised once, so every backend only sees what it can read.

Backends (zarr, h5py) refuse negative steps and differ in how they treat out-of-range
integers. :func:`parse_key` turns a NumPy-style basic key into non-negative integers and
positive-step slices plus the output axes to reverse afterwards, with NumPy's errors; a
1-D integer array or boolean mask on axis 0 (``src[[3, 1], 2:5]``) becomes sorted distinct
rows plus the basic key of the other axes (:class:`RowsKey`).
:func:`mixle.data.sources.key_plan.plan_key` says which stored chunks such a normalised key
touches, for the read planner.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BasicKey",
    "KeyLike",
    "ReadItem",
    "RowsKey",
    "consecutive_runs",
    "parse_key",
]

KeyLike: TypeAlias = Any  # int | slice | Ellipsis | 1-D int array or mask on axis 0 | tuple
BasicItem: TypeAlias = int | slice
#: What a normalised key reads on one axis; an array (sorted, distinct rows) only on axis 0.
ReadItem: TypeAlias = int | slice | NDArray[np.int64]

#: The keys ``src[key]`` takes, for error messages.
VALID_KEYS = (
    "only integers, slices, '...' and one 1-D integer array or boolean mask on axis 0 "
    "are valid indices here"
)
#: What to use instead of an advanced key mixle does not read.
INSTEAD = (
    "read the rows with src[rows] or src.get_batch(rows), boxes with src.read_boxes, or read "
    "a slab with basic indices and index it in NumPy (np.asarray(src[a:b, c:d])[key])"
)


@dataclass(frozen=True)
class BasicKey:
    """A parsed key: what to read (ints and positive-step slices) and which axes to flip.

    ``scalar`` is true when NumPy would return a scalar rather than a 0-d array: every axis
    is indexed by an integer and the key has no ``...``.
    """

    read: tuple[BasicItem, ...]
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


@dataclass(frozen=True)
class RowsKey:
    """A parsed key with an integer array or boolean mask on axis 0.

    ``unique`` are the distinct rows to read, sorted and non-negative; ``take`` (or
    ``None`` when the rows asked for are ``unique`` itself) picks the rows asked for, in
    order and with repeats, from what was read. ``rest`` is the basic key of the other axes.
    """

    unique: NDArray[np.int64]
    take: NDArray[np.int64] | None
    rest: BasicKey

    @property
    def read(self) -> tuple[ReadItem, ...]:
        """What to read: ``unique`` on axis 0, then :attr:`BasicKey.read` of ``rest``."""
        return (self.unique, *self.rest.read)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the result: the rows asked for, then ``rest``'s shape."""
        n = self.unique.size if self.take is None else self.take.size
        return (n, *self.rest.shape)

    def finish(self, block: np.ndarray) -> np.ndarray:
        """Pick the rows asked for and apply ``rest``'s flips to a block read with :attr:`read`."""
        if self.take is not None:
            block = np.take(block, self.take, axis=0)
        if self.rest.flip:
            index = [slice(None)] * block.ndim
            for axis in self.rest.flip:
                index[axis + 1] = slice(None, None, -1)
            block = block[tuple(index)]
        return block


def consecutive_runs(values: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Runs of consecutive integers in sorted, unique, non-empty ``values``.

    Returns
    -------
    tuple
        The first value of each run and the value after its last: ``[3, 4, 5, 9]`` gives
        ``([3, 9], [6, 10])``.
    """
    if values.size == 1:  # one row: skip NumPy's per-call costs (the common single read)
        return values, values + 1
    cut = np.flatnonzero(np.diff(values) != 1)
    firsts = np.concatenate((values[:1], values[cut + 1]))
    return firsts, np.concatenate((values[cut], values[-1:])) + 1


#: How many characters of a key an error message shows (a long list of rows is cut).
SHOWN_KEY_CHARS = 200


def _shown(key: KeyLike) -> str:
    """``repr(key)`` for an error message, cut after :data:`SHOWN_KEY_CHARS` characters."""
    text = repr(key)
    return text if len(text) <= SHOWN_KEY_CHARS else f"{text[:SHOWN_KEY_CHARS]}..."


def _as_int(item: object) -> int | None:
    if isinstance(item, (bool, np.bool_)):
        return None
    try:
        return operator.index(item)  # type: ignore[arg-type]
    except TypeError:
        return None


def parse_key(key: KeyLike, shape: Sequence[int]) -> BasicKey | RowsKey:
    """Normalise an index ``key`` for an array of ``shape``.

    Parameters
    ----------
    key
        Ints (negative counted from the end), slices with any step, ``...`` and tuples of
        those, plus at most one 1-D integer array (or list) or boolean mask on axis 0.
    shape
        Shape of the indexed array.

    Returns
    -------
    BasicKey or RowsKey
        :class:`RowsKey` when axis 0 has an integer array or mask, else :class:`BasicKey`.

    Raises
    ------
    IndexError
        Out-of-range integers, too many indices, a mask whose length is not ``shape[0]``, an
        array that is neither integer nor boolean (NumPy's errors).
    TypeError
        Anything NumPy takes but mixle does not read: ``None``/``np.newaxis``, an array or
        mask on another axis than 0, several arrays, arrays with more than one dimension.

    Notes
    -----
    With the one array on axis 0 NumPy keeps the axis order whatever the other keys are:
    the result is ``(len(rows), *shape of the basic key on the other axes)``.
    """
    items = key if isinstance(key, tuple) else (key,)
    other = [item for item in items if type(item) not in _PLAIN]  # usually none: fast path
    if not other:
        return _parse_basic(key, _expand(key, items, len(shape)), shape, 0, True)
    if any(item is None for item in other):
        raise TypeError(
            f"key={_shown(key)}: None (np.newaxis) is not supported; {VALID_KEYS}. Read without it "
            "and add the axis in NumPy: src[...][np.newaxis] or np.expand_dims(src[...], axis)"
        )
    scalar = not any(item is Ellipsis for item in other)
    items = _expand(key, items, len(shape))
    arrays = [i for i, item in enumerate(items) if type(item) not in _PLAIN and _is_array(item)]
    if not arrays:
        return _parse_basic(key, items, shape, 0, scalar)
    if len(arrays) > 1 or arrays[0] != 0:
        where = f"axes {arrays}" if len(arrays) > 1 else f"axis {arrays[0]}"
        raise TypeError(
            f"key={_shown(key)}: an integer array or boolean mask on {where} is not supported; "
            f"{VALID_KEYS}. Instead, {INSTEAD}"
        )
    rows = _parse_rows(key, items[0], shape[0])
    rest = _parse_basic(key, items[1:], shape[1:], 1, False)
    unique = np.unique(rows)
    same = unique.size == rows.size and bool(np.all(unique == rows))
    return RowsKey(unique, None if same else np.searchsorted(unique, rows), rest)


def _expand(key: KeyLike, items: tuple[Any, ...], ndim: int) -> tuple[Any, ...]:
    """``items`` with ``...`` replaced by full slices and the missing trailing axes added."""
    n_ellipsis = sum(item is Ellipsis for item in items)
    if n_ellipsis > 1:
        raise IndexError(f"key={_shown(key)}: an index can only have a single ellipsis ('...')")
    n_real = len(items) - n_ellipsis
    if n_real > ndim:
        raise IndexError(f"key={_shown(key)}: too many indices for an array of {ndim} dimension(s)")
    if n_ellipsis:
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        items = items[:at] + (slice(None),) * (ndim - n_real) + items[at + 1 :]
    return items + (slice(None),) * (ndim - len(items))


#: Key items that are never an array, ``None`` or ``...``.
_PLAIN = (int, slice)


def _is_array(item: object) -> bool:
    """Whether ``item`` is an array index (list, nested tuple, range, N-D array-like)."""
    if isinstance(item, (list, tuple, range)):
        return True
    return hasattr(item, "__array__") and not isinstance(item, np.generic) and np.ndim(item) > 0


def _parse_rows(key: KeyLike, item: Any, dim: int) -> NDArray[np.int64]:
    """Axis-0 rows of an integer array or boolean mask ``item``, made non-negative."""
    try:
        arr = np.asarray(item)
    except (TypeError, ValueError) as exc:  # ragged lists
        raise IndexError(
            f"key={_shown(key)}: the index on axis 0 is not an array ({exc})"
        ) from None
    if arr.size == 0 and isinstance(item, (list, tuple, range)):
        arr = arr.astype(np.int64)  # NumPy reads an empty list as no rows
    if arr.ndim != 1:
        if arr.dtype == np.bool_:
            kind, fix = "boolean masks", INSTEAD
        else:
            kind = "integer index arrays"
            fix = (
                "read them flat and reshape: "
                "r = src[idx.ravel()]; r.reshape(*idx.shape, *r.shape[1:])"
            )
        raise TypeError(
            f"key={_shown(key)}: {kind} must be 1-D over axis 0 here, got shape {arr.shape}; "
            f"{VALID_KEYS}. Instead, {fix}"
        )
    if arr.dtype == np.bool_:
        if arr.size != dim:
            raise IndexError(
                f"key={_shown(key)}: boolean index did not match indexed array along axis 0; size "
                f"of axis is {dim} but size of corresponding boolean axis is {arr.size}"
            )
        return np.flatnonzero(arr).astype(np.int64, copy=False)
    if arr.dtype.kind not in "iu":
        raise IndexError(
            f"key={_shown(key)}: arrays used as indices must be of integer (or boolean) type, "
            f"got dtype {arr.dtype}"
        )
    if arr.size:
        lo, hi = arr.min(), arr.max()  # in the array's own dtype: no uint64 wrap-around
        if hi >= dim or lo < -dim:
            bad = int(hi) if hi >= dim else int(lo)
            raise IndexError(
                f"key={_shown(key)}: index {bad} is out of bounds for axis 0 with size {dim}"
            )
    rows = arr.astype(np.int64)
    if rows.size and rows.min() < 0:
        rows[rows < 0] += dim
    return rows


def _parse_basic(
    key: KeyLike, items: tuple[Any, ...], shape: Sequence[int], first_axis: int, scalar: bool
) -> BasicKey:
    """Parse ``items`` (one per axis of ``shape``, the first being ``first_axis``)."""
    read: list[BasicItem] = []
    flip: list[int] = []
    out_shape: list[int] = []
    for axis, (item, dim) in enumerate(zip(items, shape), start=first_axis):
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
                f"key={_shown(key)}: {VALID_KEYS} (got {type(item).__name__} on axis {axis})"
            )
        if not -dim <= index < dim:
            raise IndexError(
                f"key={_shown(key)}: index {index} is out of bounds for axis {axis} with size {dim}"
            )
        read.append(index + dim if index < 0 else index)
    return BasicKey(tuple(read), tuple(flip), tuple(out_shape), scalar and not out_shape)
