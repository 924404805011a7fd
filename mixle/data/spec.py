"""Per-record shape and dtype, reported from metadata without reading data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.errors import SchemaMismatchError

__all__ = [
    "ArraySpec",
    "SpecTree",
    "batch_spec",
    "describe_kind",
    "spec_of",
    "validate_batch",
]


@dataclass(frozen=True)
class ArraySpec:
    """The shape and dtype of one array leaf of a record."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes of one leaf of this spec."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"ArraySpec(shape={self.shape}, dtype={self.dtype})"


SpecTree = Any
"""An :class:`ArraySpec`, or tuples, lists and dicts of spec trees (the shape of a record)."""


def _shape_dtype(value: Any) -> tuple[tuple[int, ...], np.dtype]:
    """A leaf's shape and dtype, from its attributes (NumPy, JAX...) or as a NumPy array."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        arr = np.asarray(value)
        shape, dtype = arr.shape, arr.dtype
    return tuple(shape), np.dtype(dtype)


def spec_of(value: Any) -> SpecTree:
    """The spec tree of a record or batch: tuples, lists and dicts kept, leaves described."""
    if isinstance(value, dict):
        return {key: spec_of(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(spec_of(item) for item in value)
    return ArraySpec(*_shape_dtype(value))


def batch_spec(record_spec: SpecTree, batch_size: int) -> SpecTree:
    """Every leaf of ``record_spec`` with a leading batch axis of ``batch_size``."""
    if isinstance(record_spec, dict):
        return {key: batch_spec(item, batch_size) for key, item in record_spec.items()}
    if isinstance(record_spec, (tuple, list)):
        return type(record_spec)(batch_spec(item, batch_size) for item in record_spec)
    if not isinstance(record_spec, ArraySpec):
        raise TypeError(f"spec leaves must be ArraySpec, got {type(record_spec).__name__}")
    return ArraySpec((batch_size, *record_spec.shape), record_spec.dtype)


def describe_kind(value: Any) -> str:
    """What a record, batch or spec tree node is, for an error message: ``"a dict with keys
    [...]"``, ``"a tuple of 2"`` (lists alike) or ``"an array"``."""
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "an array"


def _check(value: Any, spec: SpecTree, path: str, allow_short: bool) -> None:
    if isinstance(spec, dict):
        if not isinstance(value, dict) or value.keys() != spec.keys():
            raise SchemaMismatchError(
                f"{path} is {describe_kind(value)}; spec expects {describe_kind(spec)}"
            )
        for key, item in spec.items():
            _check(value[key], item, f"{path}[{key!r}]", allow_short)
        return
    if isinstance(spec, (tuple, list)):
        if type(value) is not type(spec) or len(value) != len(spec):
            raise SchemaMismatchError(
                f"{path} is {describe_kind(value)}; spec expects {describe_kind(spec)}"
            )
        for i, (item, sub) in enumerate(zip(value, spec)):
            _check(item, sub, f"{path}[{i}]", allow_short)
        return
    if isinstance(value, (dict, tuple, list)):
        raise SchemaMismatchError(f"{path} is {describe_kind(value)}; spec expects an array {spec}")
    shape, dtype = _shape_dtype(value)
    fits = shape == spec.shape or (
        allow_short
        and len(shape) == len(spec.shape) > 0
        and shape[1:] == spec.shape[1:]
        and shape[0] <= spec.shape[0]
    )
    if not fits or dtype != spec.dtype:
        raise SchemaMismatchError(
            f"{path} has shape {shape} and dtype {dtype}; spec expects shape "
            f"{spec.shape} and dtype {spec.dtype}"
        )


def validate_batch(batch: Any, spec: SpecTree, *, allow_short: bool = False) -> None:
    """Check that ``batch`` has the structure, shapes and dtypes of ``spec``; no data is read.

    Parameters
    ----------
    batch
        Arrays (anything with ``.shape`` and ``.dtype``: NumPy, JAX...) in tuples, lists and
        dicts.
    spec
        A spec tree, e.g. :meth:`mixle.Loader.element_spec`.
    allow_short
        Accept a leading axis shorter than the spec's (the last batch of an epoch read with
        ``drop_last=False``).

    Raises
    ------
    SchemaMismatchError
        (a ``ValueError``) naming the first field that differs, e.g. ``batch[0]`` or
        ``batch['image']``, with the expected and actual structure, shape and dtype.
    """
    _check(batch, spec, "batch", allow_short)
