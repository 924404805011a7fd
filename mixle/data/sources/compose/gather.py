"""One batch out of several children's batches: each child's rows scattered to their places.

A composed source reads each child it touches once, with that child's rows of the request;
:func:`gather` puts those rows back in request order, leaf by leaf, into one preallocated
output (tuples, lists and dicts kept). A child whose batch has another structure, leaf
shape or dtype than the first child's fails here, naming the child and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.spec import (
    ArraySpec,
    SpecTree,
    batch_spec,
    describe_kind,
    spec_of,
    validate_batch,
)
from mixle.errors import SchemaMismatchError

__all__ = ["Part", "check_part", "empty_batch", "gather", "record_spec"]

#: One child's share of a request: its name, the request rows it fills, its batch.
Part = tuple[str, NDArray[np.int64], Any]


def _leaf(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def _allocate(batch: Any, n: int) -> Any:
    if isinstance(batch, dict):
        return {key: _allocate(value, n) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_allocate(value, n) for value in batch)
    leaf = _leaf(batch)
    return np.empty((n, *leaf.shape[1:]), dtype=leaf.dtype)


def _scatter(
    out: Any, batch: Any, rows: NDArray[np.int64], name: str, first: str, path: str
) -> None:
    def mismatch(detail: str) -> SchemaMismatchError:
        return SchemaMismatchError(
            f"source {name!r} returned a batch whose {path} {detail}; source {first!r} "
            "returned the first batch, and every source must match it (declare "
            "element_spec() on the sources to catch this when the composition is built)"
        )

    if isinstance(out, dict):
        if not isinstance(batch, dict) or batch.keys() != out.keys():
            raise mismatch(f"is {describe_kind(batch)}, not {describe_kind(out)}")
        for key in out:
            _scatter(out[key], batch[key], rows, name, first, f"{path}[{key!r}]")
        return
    if isinstance(out, (tuple, list)):
        if type(batch) is not type(out) or len(batch) != len(out):
            raise mismatch(f"is {describe_kind(batch)}, not {describe_kind(out)}")
        for i, (sub, part) in enumerate(zip(out, batch)):
            _scatter(sub, part, rows, name, first, f"{path}[{i}]")
        return
    if isinstance(batch, (dict, tuple, list)):
        raise mismatch(f"is {describe_kind(batch)}, not an array")
    leaf = _leaf(batch)
    if leaf.shape[1:] != out.shape[1:] or leaf.dtype != out.dtype:
        raise mismatch(
            f"has records of shape {leaf.shape[1:]} and dtype {leaf.dtype}, not shape "
            f"{out.shape[1:]} and dtype {out.dtype}"
        )
    if leaf.shape[:1] != rows.shape:
        raise mismatch(f"has {leaf.shape[0] if leaf.ndim else 0} rows for {rows.size} indices")
    out[rows] = leaf


def gather(parts: Sequence[Part], n: int) -> Any:
    """The batch of ``n`` rows whose rows ``part[1]`` are the rows of ``part[2]``, per part.

    Parameters
    ----------
    parts
        ``(name, rows, batch)`` per child read: the child's name (for errors), the request
        rows it fills (together the parts fill ``range(n)``), its batch (one row per entry
        of ``rows``).
    n
        Rows of the request.

    Returns
    -------
    Any
        The first part's structure with every leaf preallocated to ``n`` rows and filled;
        a single part that fills every row in order is returned as it is.

    Raises
    ------
    SchemaMismatchError
        A part's batch differs from the first in structure, record shape, dtype or row
        count; the message names its child and the field.
    """
    first_name, first_rows, first_batch = parts[0]
    if len(parts) == 1 and first_rows.size == n and np.array_equal(first_rows, np.arange(n)):
        return first_batch
    out = _allocate(first_batch, n)
    for name, rows, batch in parts:
        _scatter(out, batch, rows, name, first_name, "batch")
    return out


def empty_batch(spec: SpecTree) -> Any:
    """A batch of 0 records of ``spec``: the same tuples, lists and dicts, empty leaves."""
    if isinstance(spec, dict):
        return {key: empty_batch(value) for key, value in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(empty_batch(value) for value in spec)
    if not isinstance(spec, ArraySpec):
        raise TypeError(f"spec leaves must be ArraySpec, got {type(spec).__name__}")
    return np.empty((0, *spec.shape), dtype=spec.dtype)


def record_spec(batch: Any) -> SpecTree:
    """The spec of one record of a stacked batch: :func:`~mixle.data.spec.spec_of` of the
    batch without its leading axis."""
    return _drop_leading(spec_of(batch))


def _drop_leading(spec: SpecTree) -> SpecTree:
    if isinstance(spec, dict):
        return {key: _drop_leading(item) for key, item in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(_drop_leading(item) for item in spec)
    return ArraySpec(spec.shape[1:], spec.dtype)


def check_part(name: str, batch: Any, rows: int, spec: SpecTree, whose: str) -> None:
    """Check child ``name``'s batch of ``rows`` records against the composition's ``spec``
    (``whose`` says where that spec comes from, for the message); no data is read.

    Raises
    ------
    SchemaMismatchError
        The batch differs from ``spec`` in structure, record shape, dtype or row count;
        the message names the child and the field.
    """
    try:
        validate_batch(batch, batch_spec(spec, rows))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(
            f"source {name!r} returned a batch that breaks the composition's spec: {exc} "
            f"(the spec is {whose}); every source of a composition must give records of "
            "one structure, shape and dtype (check the source's reads and its element_spec())"
        ) from None
