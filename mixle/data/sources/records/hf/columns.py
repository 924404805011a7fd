"""Hugging Face ``datasets`` columns in NumPy: per-record specs from Arrow types, conversion.

The rules are :func:`~mixle.data.sources.records.parquet_source.read_parquet`'s, plus the
``ArrayXD`` extension types of ``datasets``: numbers keep their dtype, an integer column with
a null anywhere is ``float64`` with ``NaN``, a boolean one ``object``; fixed-size lists
(``List(..., length=k)``) and fixed-shape ``Array2D``..``Array5D`` columns without nulls are
array columns of that shape; strings, variable-length lists, structs (``dict`` features) and
everything else are ``object`` columns of the Python values Arrow gives (``str``, ``list``,
``dict``, ``None`` for a null).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle.data.sources.records.columns import OBJECT
from mixle.data.sources.records.parquet_source import arrow_spec, arrow_to_numpy
from mixle.data.spec import ArraySpec
from mixle.utils.optional_deps import require

__all__ = ["column_spec", "column_to_numpy", "has_nulls"]


def _is_array_xd(arrow_type: Any) -> bool:
    """Whether ``arrow_type`` is one of ``datasets``' ``Array2D``..``Array5D`` extension types."""
    return all(hasattr(arrow_type, a) for a in ("storage_type", "shape", "value_type"))


def has_nulls(column: Any) -> bool:
    """Whether an Arrow column has a null, at its top level or in the lists below it.

    Reads null counts only (metadata of Arrow IPC files), never the values.
    """
    pa = require("pyarrow", "hf", feature="read_hf")
    types = pa.types
    for chunk in column.chunks:
        array = chunk
        while True:
            if isinstance(array, pa.ExtensionArray):
                array = array.storage
            if array.null_count:
                return True
            kind = array.type
            nested = types.is_list(kind) or types.is_large_list(kind)
            if not (nested or types.is_fixed_size_list(kind)):
                break
            array = array.values
    return False


def column_spec(arrow_type: Any, nulls: bool) -> ArraySpec:
    """The per-record spec of a column of ``arrow_type`` (``nulls``: it has a null somewhere)."""
    if _is_array_xd(arrow_type):
        shape = tuple(arrow_type.shape)
        if nulls or any(d is None for d in shape):
            return ArraySpec((), OBJECT)
        try:
            dtype = np.dtype(arrow_type.value_type)
        except TypeError:
            return ArraySpec((), OBJECT)
        return ArraySpec(shape, dtype) if dtype.kind in "biuf" else ArraySpec((), OBJECT)
    return arrow_spec(arrow_type, nulls)


def column_to_numpy(column: Any, spec: ArraySpec) -> np.ndarray:
    """A NumPy column of ``spec`` from an Arrow (chunked) array of one ``datasets`` column."""
    pa = require("pyarrow", "hf", feature="read_hf")
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if isinstance(column, pa.ExtensionArray) and spec.shape:
        column = column.storage  # nested lists; their values flatten to the shape
    return arrow_to_numpy(column, spec)
