"""Stack records into batches and split batches back into records.

A batch has the structure of one record with every leaf stacked on a new leading axis:
tuples stay tuples, lists stay lists, dicts stay dicts. The sources (compositions such as
:func:`mixle.map`) and the Loader share these two functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.spec import ArraySpec

__all__ = ["stack_records", "sub_spec", "unstack_batch"]


#: Kinds of NumPy leaves that must agree in dtype across records (Python scalars, strings
#: and objects stack as NumPy promotes them: a JSON row's 1 and 0.5 make a float64 column).
_NUMERIC = "biufc"
#: Values an object leaf holds as one value each (never as structure or fixed-width text).
_OBJECT_VALUES = (str, bytes, list, tuple, dict, type(None))


def _object_leaf(spec: Any) -> bool:
    return isinstance(spec, ArraySpec) and spec.dtype == np.dtype(object) and spec.shape == ()


def sub_spec(spec: Any, key: Any) -> Any:
    """The spec of field ``key`` of a record of spec ``spec``, or ``None``."""
    if isinstance(spec, dict):
        return spec.get(key)
    if isinstance(spec, (tuple, list)) and isinstance(key, int) and key < len(spec):
        return spec[key]
    return None


def stack_records(records: Sequence[Any], spec: Any = None) -> Any:
    """Stack records of one structure: each leaf becomes an array with a new leading axis.

    Parameters
    ----------
    records
        Records of one structure (dicts, tuples and lists of leaves).
    spec
        The records' declared spec (a tree of :class:`~mixle.data.spec.ArraySpec`), if
        known. Where it declares an object leaf of shape ``()`` (a record source's string,
        variable-length list or struct column), strings, bytes, ``None`` and lists, tuples
        or dicts there are one value each, stacked into an object array of shape
        ``(len(records),)``, instead of a fixed-width string array or being taken as
        structure.

    Raises
    ------
    ValueError
        The records do not share one structure (keys, lengths) or leaf shape, or hold
        NumPy numeric leaves of different dtypes (NumPy would promote an ``int32`` and a
        ``float64`` leaf silently, so one batch could differ in dtype from the next); the
        message names the field. Python numbers (a JSON row's ``1`` and ``0.5``), strings
        and objects stack as NumPy promotes them; strings of different lengths stack to
        the longest.
    """
    if not records:
        raise ValueError("stack_records needs at least one record")
    return _stack(records, spec, "record")


def _stack(records: Sequence[Any], spec: Any, path: str) -> Any:
    first = records[0]
    if _object_leaf(spec) and any(isinstance(r, _OBJECT_VALUES) for r in records):
        out = np.empty(len(records), dtype=object)
        for i, value in enumerate(records):
            out[i] = value
        return out
    if isinstance(first, dict):
        keys = first.keys()
        for record in records:
            if not isinstance(record, dict) or record.keys() != keys:
                raise ValueError(
                    f"records differ in structure at {path}: {_describe(first)} and "
                    f"{_describe(record)}"
                )
        return {
            key: _stack([r[key] for r in records], sub_spec(spec, key), f"{path}[{key!r}]")
            for key in keys
        }
    if isinstance(first, (tuple, list)):
        for record in records:
            if type(record) is not type(first) or len(record) != len(first):
                raise ValueError(
                    f"records differ in structure at {path}: {_describe(first)} and "
                    f"{_describe(record)}"
                )
        return type(first)(
            _stack([r[i] for r in records], sub_spec(spec, i), f"{path}[{i}]")
            for i in range(len(first))
        )
    leaves = [np.asarray(leaf) for leaf in records]
    typed = {
        leaf.dtype
        for leaf, record in zip(leaves, records)
        if isinstance(record, (np.ndarray, np.generic)) and leaf.dtype.kind in _NUMERIC
    }
    if len(typed) > 1:
        shown = sorted(map(str, typed))
        raise ValueError(
            f"records have leaves of different dtypes {shown} at {path}; NumPy would "
            "promote them silently, so batches could differ in dtype: return one dtype for "
            "every record (e.g. .astype in the transform)"
        )
    try:
        return np.stack(leaves)
    except ValueError as exc:
        shapes = sorted({leaf.shape for leaf in leaves})
        raise ValueError(
            f"records have leaves of different shapes {shapes} at {path}: {exc}"
        ) from None


def unstack_batch(batch: Any, rows: int) -> list[Any]:
    """The ``rows`` records of a stacked batch (leaves are views into the batch)."""
    if isinstance(batch, dict):
        columns = {key: unstack_batch(item, rows) for key, item in batch.items()}
        return [{key: columns[key][i] for key in batch} for i in range(rows)]
    if isinstance(batch, (tuple, list)):
        parts = [unstack_batch(item, rows) for item in batch]
        return [type(batch)(part[i] for part in parts) for i in range(rows)]
    arr = np.asarray(batch)
    if arr.ndim == 0 or arr.shape[0] != rows:
        raise ValueError(f"a batch leaf of shape {arr.shape} does not have {rows} rows")
    return list(arr)


def _describe(record: Any) -> str:
    if isinstance(record, dict):
        return f"dict with keys {sorted(map(str, record))}"
    if isinstance(record, (tuple, list)):
        return f"{type(record).__name__} of {len(record)}"
    return type(record).__name__
