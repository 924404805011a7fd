"""Stack records into batches and split batches back into records.

A batch has the structure of one record with every leaf stacked on a new leading axis:
tuples stay tuples, lists stay lists, dicts stay dicts. The sources (compositions such as
:func:`mixle.map`) and the Loader share these two functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["stack_records", "unstack_batch"]


def stack_records(records: Sequence[Any]) -> Any:
    """Stack records of one structure: each leaf becomes an array with a new leading axis.

    Raises
    ------
    ValueError
        The records do not share one structure (keys, lengths) or leaf shape.
    """
    if not records:
        raise ValueError("stack_records needs at least one record")
    first = records[0]
    if isinstance(first, dict):
        keys = first.keys()
        for record in records:
            if not isinstance(record, dict) or record.keys() != keys:
                raise ValueError(
                    f"records differ in structure: {_describe(first)} and {_describe(record)}"
                )
        return {key: stack_records([record[key] for record in records]) for key in keys}
    if isinstance(first, (tuple, list)):
        for record in records:
            if type(record) is not type(first) or len(record) != len(first):
                raise ValueError(
                    f"records differ in structure: {_describe(first)} and {_describe(record)}"
                )
        return type(first)(stack_records([r[i] for r in records]) for i in range(len(first)))
    try:
        return np.stack([np.asarray(leaf) for leaf in records])
    except ValueError as exc:
        shapes = sorted({np.shape(leaf) for leaf in records})
        raise ValueError(f"records have leaves of different shapes {shapes}: {exc}") from None


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
