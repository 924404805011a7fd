"""Array leaves of record columns: NumPy scalars and arrays, JAX arrays, stacked as they are.

A column whose values carry their own dtype and shape (:func:`is_array_leaf`) is stacked
into one NumPy array of that dtype and per-record shape (:func:`stack_leaves`), never an
upcast or an ``object`` column; leaves that disagree raise
:class:`~mixle.errors.LeafMismatchError` naming both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mixle.errors import LeafMismatchError

__all__ = ["LeafMismatchError", "is_array_leaf", "stack_leaves"]


def is_array_leaf(value: object) -> bool:
    """Whether ``value`` carries its own dtype and shape (NumPy scalar or array, JAX array...).

    Duck-typed (``__array__``, ``shape`` and ``dtype``), so no array library is imported;
    strings (``np.str_`` included) are plain values.
    """
    return (
        not isinstance(value, (str, bytes))
        and hasattr(value, "__array__")
        and hasattr(value, "shape")
        and hasattr(value, "dtype")
    )


def _as_leaf(value: object) -> np.ndarray | None:
    """``value`` as NumPy reads it; ``None`` for strings and what NumPy cannot convert."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError):  # ragged nested lists, odd objects
        return None


def _leaf_text(value: object) -> str:
    array = _as_leaf(value)
    spec = "" if array is None else f"of shape {array.shape} and dtype {array.dtype}"
    if is_array_leaf(value):
        return f"{type(value).__name__} {spec}"
    return f"a Python {type(value).__name__}" + (f" ({spec} in NumPy)" if spec else "")


def stack_leaves(values: Sequence[Any], column: str, where: Callable[[int], str]) -> np.ndarray:
    """Stack array leaves of one column into a NumPy column of their own dtype and shape.

    Each leaf (a NumPy scalar or array, a JAX array, anything with ``__array__``, ``shape``
    and ``dtype``) becomes one row: ``n`` leaves of shape ``s`` and dtype ``d`` give an
    array of shape ``(n, *s)`` and dtype ``d`` (in native byte order, as ``np.stack``
    gives it), never an upcast or an ``object`` column. A plain Python value among them
    must be what NumPy makes of it: ``2`` fits an ``int64`` column, not an ``int32`` one.
    ``None`` is ``NaN`` (``NaT``) in a column of float (datetime) scalars.

    Parameters
    ----------
    values
        The leaves, one per record; at least one is an array leaf (:func:`is_array_leaf`).
    column
        The column's name, for error messages.
    where
        ``where(i)`` says where leaf ``i`` came from in error messages (``"data[3]['x']"``).

    Raises
    ------
    LeafMismatchError
        A leaf has another shape or dtype than the first array leaf, or is ``None`` where
        the column cannot hold a missing value; the message names both leaves.
    """
    first = next(i for i, v in enumerate(values) if is_array_leaf(v))
    model = np.asarray(values[first])
    dtype = _native(model.dtype)
    out = np.empty((len(values), *model.shape), dtype=dtype)
    for i, value in enumerate(values):
        if value is None and not model.shape and dtype.kind in "fcMm":
            out[i] = np.datetime64("NaT") if dtype.kind in "Mm" else math.nan
            continue
        array = None if value is None else _as_leaf(value)
        if array is None or array.shape != model.shape or _native(array.dtype) != dtype:
            raise _mismatch(values, i, first, column, where, array)
        out[i] = array
    return out


def _native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in this machine's byte order, as ``np.stack`` gives it."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def _mismatch(
    values: Sequence[Any],
    i: int,
    first: int,
    column: str,
    where: Callable[[int], str],
    array: np.ndarray | None,
) -> LeafMismatchError:
    model = np.asarray(values[first])
    shown = "None (missing)" if values[i] is None else _leaf_text(values[i])
    if array is not None and array.shape != model.shape:
        fix = (
            "to keep arrays of different shapes, give MemorySource that column as a NumPy "
            "object array (column = np.empty(n, object); column[:] = leaves)"
        )
    else:
        fix = f"convert them first, e.g. np.asarray(leaf, dtype={str(_native(model.dtype))!r})"
    return LeafMismatchError(
        f"{where(i)} is {shown}, but {where(first)} is {_leaf_text(values[first])}; the "
        f"leaves of column {column!r} must share one shape and dtype ({fix})",
        column=column,
        index=i,
    )
