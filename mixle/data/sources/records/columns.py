"""Column types of record sources: inference from a sample, conversion to NumPy, missing values.

Text values (CSV fields) and Python values (JSON, SQL rows, in-memory records) become one
NumPy array per column. Missing values are ``NaN`` in float columns, ``NaT`` in datetime
columns and ``None`` in object columns (strings, mixed values); an integer or boolean column
with a missing value is inferred as ``float64`` or ``object`` instead, and an explicit
integer ``dtypes`` override that meets a missing value raises, naming the line. Values that
carry their own dtype (NumPy scalars and arrays, JAX arrays) keep it:
:func:`~mixle.data.sources.records.array_leaves.stack_leaves`.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.base import listing
from mixle.errors import ColumnNotFoundError, MalformedRowError

__all__ = [
    "DEFAULT_NA_VALUES",
    "INFER_ROWS",
    "OBJECT",
    "PARSE_BLOCK_BYTES",
    "LineOf",
    "check_columns",
    "infer_text_dtype",
    "infer_value_spec",
    "parse_dtypes",
    "text_to_array",
    "values_to_array",
]

#: Rows read at open to infer each column's dtype (pass ``dtypes=`` to override).
INFER_ROWS = 1000
#: Field texts that mean "missing" in CSV files unless ``na_values=`` says otherwise.
DEFAULT_NA_VALUES: tuple[str, ...] = ("",)
#: The dtype of string and mixed columns.
OBJECT = np.dtype(object)
#: Most bytes of the fixed-width text array NumPy builds to parse one piece of a CSV column
#: (4 bytes a character of its longest text): one long field among short ones cannot make
#: parsing allocate rows x longest.
PARSE_BLOCK_BYTES = 16 * 2**20
#: Maps a position in a list of values to the 1-based line of the file it came from.
LineOf = Callable[[int], int]

_TRUE = frozenset({"true", "True", "TRUE"})
_FALSE = frozenset({"false", "False", "FALSE"})
_KINDS = "biufOM"
#: Which kinds of Python values a column of each NumPy kind accepts (no silent casts).
_ALLOWED_KINDS = {"b": "b", "i": "ib", "u": "ib", "f": "ibf", "M": "M"}


def check_columns(wanted: Sequence[str] | None, names: Sequence[str], what: str) -> list[str]:
    """Validate ``columns=`` against the names a source has; ``None`` selects them all."""
    if wanted is None:
        return list(names)
    if isinstance(wanted, str) or not isinstance(wanted, Sequence):
        raise TypeError(f"columns={wanted!r} must be a list of column names or None")
    missing = [c for c in wanted if c not in names]
    if missing:
        raise ColumnNotFoundError(
            f"columns={list(wanted)!r}: {what} has no column {missing[0]!r}; "
            f"{listing(list(names), 'its columns')}"
        )
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"columns={list(wanted)!r} names a column twice")
    return list(wanted)


def parse_dtypes(dtypes: Mapping[str, Any] | None, names: Sequence[str], what: str) -> dict:
    """Validate a ``dtypes=`` override: known column names, NumPy dtypes of supported kinds.

    ``str`` and ``"str"`` mean an object column of Python strings.
    """
    if dtypes is None:
        return {}
    if not isinstance(dtypes, Mapping):
        raise TypeError(f"dtypes={dtypes!r} must be a dict of column name -> dtype, or None")
    out: dict[str, np.dtype] = {}
    for name, value in dtypes.items():
        if name not in names:
            raise ColumnNotFoundError(
                f"dtypes={{{name!r}: ...}}: {what} has no column {name!r}; "
                f"{listing(list(names), 'its columns')}"
            )
        try:
            dtype = OBJECT if value in (str, "str", "string") else np.dtype(value)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in _KINDS + "U":
            raise TypeError(
                f"dtypes[{name!r}]={value!r} is not a supported dtype; use one of 'int64', "
                "'float64', 'bool', 'str', 'datetime64[s]' (or another NumPy int, float, "
                "bool or datetime64 dtype)"
            )
        out[name] = OBJECT if dtype.kind == "U" else dtype
    return out


def _parse_texts(values: Sequence[str], dtype: Any) -> np.ndarray:
    """``values`` parsed by NumPy as ``dtype``, in pieces of at most :data:`PARSE_BLOCK_BYTES`.

    Raises
    ------
    ValueError, OverflowError
        A text is not a ``dtype`` value.
    """
    longest = max(map(len, values), default=0)
    step = max(1, PARSE_BLOCK_BYTES // (4 * max(longest, 1)))
    if step >= len(values):
        return np.asarray(values, dtype=str).astype(dtype)
    out = np.empty(len(values), dtype=dtype)
    for lo in range(0, len(values), step):
        out[lo : lo + step] = np.asarray(values[lo : lo + step], dtype=str).astype(dtype)
    return out


def _all_parse(values: list[str], dtype: type) -> bool:
    try:
        _parse_texts(values, dtype)
    except (ValueError, OverflowError):
        return False
    return True


def infer_text_dtype(values: Sequence[str | None], na: frozenset[str]) -> np.dtype:
    """The dtype of a CSV column from a sample of its field texts."""
    present = [v for v in values if v is not None and v not in na]
    missing = len(present) < len(values)
    if not present:
        return np.dtype(np.float64)
    if _all_parse(present, np.int64):
        return np.dtype(np.float64 if missing else np.int64)
    if _all_parse(present, np.float64):
        return np.dtype(np.float64)
    if all(v in _TRUE or v in _FALSE for v in present):
        return OBJECT if missing else np.dtype(np.bool_)
    return OBJECT


def _conversion_error(
    column: str, dtype: np.dtype, value: object, line: int, path: str, unit: str = "line"
) -> MalformedRowError:
    shown = "a missing value" if value is None else f"{value!r}"
    numeric = value is None or _value_kind(value) in "if" or _all_parse([str(value)], float)
    fix = "float64" if dtype.kind in "iu" and numeric else "str"
    return MalformedRowError(
        f"{path}, {unit} {line}: column {column!r} ({dtype}) cannot hold {shown}; pass "
        f"dtypes={{{column!r}: {fix!r}}} (or fix the data)",
        path=path,
        line=line,
    )


def _first_bad(values: Sequence[Any], ok: Callable[[Any], bool]) -> int:
    return next(i for i, v in enumerate(values) if not ok(v))


def text_to_array(
    values: list[str], dtype: np.dtype, na: frozenset[str], column: str, line_of: LineOf, path: str
) -> np.ndarray:
    """Convert field texts to a NumPy column; raises :class:`MalformedRowError` with the line."""
    n = len(values)
    missing = np.fromiter((v in na for v in values), dtype=bool, count=n)
    if dtype.kind == "O":
        out = np.empty(n, dtype=OBJECT)
        out[:] = values
        out[missing] = None
        return out
    if missing.any() and dtype.kind in "iub":
        bad = int(np.flatnonzero(missing)[0])
        raise _conversion_error(column, dtype, None, line_of(bad), path)
    present = [v for v, m in zip(values, missing) if not m] if missing.any() else values
    try:
        if dtype.kind == "b":
            if not all(v in _TRUE or v in _FALSE for v in present):
                raise ValueError
            parsed = np.fromiter((v in _TRUE for v in present), dtype=bool, count=len(present))
        else:
            parsed = _parse_texts(present, dtype)
    except (ValueError, OverflowError, TypeError):
        where = [i for i in range(n) if not missing[i]]
        if dtype.kind == "b":
            j = _first_bad(present, lambda v: v in _TRUE or v in _FALSE)
        else:
            j = _first_bad(present, lambda v: _all_parse([v], dtype.type))
        raise _conversion_error(column, dtype, present[j], line_of(where[j]), path) from None
    if not missing.any():
        return parsed
    fill = np.datetime64("NaT") if dtype.kind == "M" else np.nan
    out = np.full(n, fill, dtype=dtype)
    out[~missing] = parsed
    return out


def _is_missing(value: object) -> bool:
    return value is None


def _value_kind(value: object) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "b"
    if isinstance(value, (int, np.integer)):
        return "i"
    if isinstance(value, (float, decimal.Decimal, np.floating)):
        return "f"
    if isinstance(value, (str, np.str_)):
        return "U"
    if isinstance(value, (datetime.datetime, datetime.date, np.datetime64)):
        return "M"
    if isinstance(value, (list, tuple, np.ndarray)):
        return "A"
    return "O"


def infer_value_spec(values: Sequence[Any]) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and per-record shape of a column of Python values (JSON, SQL, records).

    Numbers become ``int64``/``float64`` (``float64`` when a value is missing), booleans
    ``bool``, dates ``datetime64[us]``, equal-shape numeric lists an array column of that
    shape, and everything else (strings, mixed values) an ``object`` column.
    """
    present = [v for v in values if not _is_missing(v)]
    missing = len(present) < len(values)
    kinds = {_value_kind(v) for v in present}
    if not kinds:
        return np.dtype(np.float64), ()
    if kinds == {"b"}:
        return (OBJECT if missing else np.dtype(np.bool_)), ()
    if kinds == {"i"}:
        return np.dtype(np.float64 if missing else np.int64), ()
    if kinds <= {"i", "f"}:
        return np.dtype(np.float64), ()
    if kinds == {"M"}:
        return np.dtype("datetime64[us]"), ()
    if kinds == {"A"}:
        try:
            arrays = [np.asarray(v) for v in present]
        except ValueError:  # ragged nested lists
            return OBJECT, ()
        shapes = {a.shape for a in arrays}
        kinds_in = {a.dtype.kind for a in arrays}
        if len(shapes) == 1 and kinds_in <= {"i", "u", "f", "b"} and not missing:
            dtype = np.result_type(*[a.dtype for a in arrays[:INFER_ROWS]])
            if dtype.kind in "iu":
                dtype = np.dtype(np.int64)
            elif dtype.kind == "f":
                dtype = np.dtype(np.float64)
            return dtype, shapes.pop()
    return OBJECT, ()


def values_to_array(
    values: Sequence[Any],
    dtype: np.dtype,
    shape: tuple[int, ...],
    column: str,
    line_of: LineOf,
    path: str,
    unit: str = "line",
) -> np.ndarray:
    """Convert Python values to a NumPy column of ``dtype`` and per-record ``shape``.

    ``line_of(j)`` and ``unit`` say where value ``j`` came from in error messages (``"line"``
    of a file, ``"row"`` of a query).
    """
    n = len(values)
    if dtype.kind == "O":
        out = np.empty(n, dtype=OBJECT)
        out[:] = list(values) if not isinstance(values, list) else values
        return out
    missing = [i for i, v in enumerate(values) if _is_missing(v)]
    if missing and (dtype.kind in "iub" or shape):
        raise _conversion_error(column, dtype, None, line_of(missing[0]), path, unit)
    if missing:
        fill: Any = np.datetime64("NaT") if dtype.kind == "M" else math.nan
        values = [fill if v is None else v for v in values]
    allowed = _ALLOWED_KINDS.get(dtype.kind)
    if allowed is not None and not shape:
        bad = [i for i, v in enumerate(values) if _value_kind(v) not in allowed]
        if bad:
            raise _conversion_error(column, dtype, values[bad[0]], line_of(bad[0]), path, unit)
    try:
        out = np.asarray(values, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        j = _first_bad(values, lambda v: _converts(v, dtype, shape))
        raise _conversion_error(column, dtype, values[j], line_of(j), path, unit) from None
    if out.shape != (n, *shape):
        j = _first_bad(values, lambda v: np.shape(v) == shape)
        raise MalformedRowError(
            f"{path}, {unit} {line_of(j)}: column {column!r} holds arrays of shape {shape}, "
            f"got {np.shape(values[j])}; pass dtypes={{{column!r}: 'str'}} to keep the values "
            "as objects",
            path=path,
            line=line_of(j),
        )
    return out


def _converts(value: object, dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    try:
        return np.asarray(value, dtype=dtype).shape == shape
    except (ValueError, TypeError, OverflowError):
        return False
