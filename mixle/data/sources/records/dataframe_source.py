"""In-memory data frames (pandas, polars, Arrow) as record sources (:func:`read_dataframe`).

Duck-typed: nothing here imports pandas, polars or pyarrow. Each column becomes one NumPy
array once, zero-copy where the library allows (numeric columns without missing values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.sources.records.array_leaves import is_array_leaf, stack_leaves
from mixle.data.sources.records.base import MemorySource
from mixle.data.sources.records.columns import OBJECT, check_columns
from mixle.data.sources.records.parquet_source import arrow_spec, arrow_to_numpy
from mixle.utils.optional_deps import require

__all__ = ["dataframe_columns", "read_dataframe"]


def _module(obj: object) -> str:
    return type(obj).__module__.split(".")[0]


def _arrow_column(table: Any, name: str) -> np.ndarray:
    column = table.column(name)
    spec = arrow_spec(column.type, column.null_count > 0)
    stacked = _arrow_equal_lists(column) if spec.dtype == OBJECT else None
    return stacked if stacked is not None else arrow_to_numpy(column, spec)


def _arrow_equal_lists(column: Any) -> np.ndarray | None:
    """A list column whose lists have one length at every level, stacked; else ``None``.

    ``None`` (the column stays ``object``, as :func:`read_parquet` reads it) for lists of
    different lengths, missing lists and non-numeric items.
    """
    pa = require("pyarrow", feature="read_dataframe")
    compute = require("pyarrow.compute", feature="read_dataframe")
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows, shape = len(values), []
    while _is_list(pa, values.type):
        if not rows or values.null_count:
            return None
        lengths = compute.list_value_length(values).to_numpy(zero_copy_only=False)
        if (lengths != lengths[0]).any():
            return None
        shape.append(int(lengths[0]))
        values = values.flatten()
    leaf = arrow_spec(values.type, values.null_count > 0)
    if not shape or leaf.shape or leaf.dtype == OBJECT:
        return None
    return arrow_to_numpy(values, leaf).reshape(rows, *shape)


def _is_list(pa: Any, arrow_type: Any) -> bool:
    types = pa.types
    return bool(
        types.is_list(arrow_type)
        or types.is_large_list(arrow_type)
        or types.is_fixed_size_list(arrow_type)
    )


def _is_na(value: object) -> bool:
    return value is None or value != value or type(value).__name__ in ("NAType", "NaTType")


def _pandas_column(name: str, series: Any) -> np.ndarray:
    dtype = series.dtype
    kind = getattr(dtype, "kind", "O")
    numpy_dtype = getattr(dtype, "numpy_dtype", dtype)
    if kind in "iuf" and series.hasnans:  # nullable Int64/Float64 with <NA>, or NaN
        return np.asarray(series.to_numpy(dtype="float64", na_value=np.nan))
    if kind in "iufbM" and not series.hasnans:
        return np.asarray(series.to_numpy(dtype=numpy_dtype))
    if kind == "M":
        return np.asarray(series.to_numpy())
    values = [v if is_array_leaf(v) or not _is_na(v) else None for v in series.tolist()]
    if any(is_array_leaf(v) for v in values):
        return stack_leaves(values, name, lambda i: f"df[{name!r}].iloc[{i}]")
    out = np.empty(len(series), dtype=OBJECT)
    out[:] = values
    return out


def _polars_column(series: Any) -> np.ndarray:
    values = series.to_numpy()
    if values.dtype.kind in "US":
        out = np.empty(len(values), dtype=OBJECT)
        out[:] = series.to_list()
        return out
    if values.dtype.kind == "O" and series.dtype.is_numeric():
        return np.asarray(series.cast(float).to_numpy(), dtype=np.float64)
    return np.asarray(values)


def dataframe_columns(df: Any, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The columns of a pandas/polars data frame or an Arrow table as NumPy arrays.

    Raises
    ------
    TypeError
        ``df`` is none of these.
    ColumnNotFoundError
        A name in ``columns`` is not a column.
    """
    module = _module(df)
    if module == "pyarrow" and hasattr(df, "column_names"):
        names = check_columns(columns, list(df.column_names), "the Arrow table")
        return {name: _arrow_column(df, name) for name in names}
    if module == "polars" and hasattr(df, "get_column"):
        names = check_columns(columns, list(df.columns), "the polars data frame")
        return {name: _polars_column(df.get_column(name)) for name in names}
    if module == "pandas" and hasattr(df, "iloc") and hasattr(df, "columns"):
        labels = {str(c): c for c in df.columns}
        if len(labels) != len(df.columns):
            raise ValueError("the pandas data frame has column labels that repeat as strings")
        names = check_columns(columns, list(labels), "the pandas data frame")
        return {name: _pandas_column(name, df[labels[name]]) for name in names}
    raise TypeError(
        f"df={type(df).__module__}.{type(df).__name__} must be a pandas or polars DataFrame "
        "or a pyarrow Table"
    )


def read_dataframe(df: Any, columns: Sequence[str] | None = None) -> MemorySource:
    """A pandas or polars ``DataFrame`` or a pyarrow ``Table`` as a record source.

    Parameters
    ----------
    df
        The frame; its columns are converted to NumPy once (no hard dependency on any of
        these libraries: the object is duck-typed by its module).
    columns
        Column names to keep (default: all); pandas labels are matched as strings.

    Returns
    -------
    MemorySource
        ``len``, ``[i]``, ``get_batch``, ``records()``, ``element_spec()``... like every
        record source. Integer columns with missing values become ``float64`` with ``NaN``;
        strings and other objects are ``object`` columns with ``None`` for missing values.
        A column of arrays (a pandas column of NumPy arrays, an Arrow list or fixed-size
        list column whose lists all have one length) becomes an array column of shape
        ``(rows, *shape)`` with the items' dtype; Arrow lists of different lengths stay an
        ``object`` column, as :func:`read_parquet` reads them.

    Raises
    ------
    LeafMismatchError
        (a ``ValueError``) The arrays of a pandas column differ in shape or dtype, or mix
        with values NumPy reads otherwise; the message names the column and both rows.
    """
    return MemorySource(dataframe_columns(df, columns))
