"""What a composition asks of each child it wraps: its records, its spec, its fingerprint.

A child is any map-style source: a mixle source or sampler (``get_batch``), a NumPy array
(one fancy index), or any ``__getitem__`` container (read record by record and stacked).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.batches import stack_records
from mixle.data.spec import ArraySpec, SpecTree

__all__ = ["child_fingerprint", "child_spec", "read_records", "refuse_path"]


def refuse_path(value: Any, where: str) -> None:
    """Refuse a path (``str``, ``bytes``, ``os.PathLike``) given where a source belongs:
    a ``str`` has ``len`` and ``[i]``, so it would silently be a source of characters.

    Raises
    ------
    TypeError
        ``value`` is a path; the message names ``where`` and says to open it first.
    """
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(
            f"{where}={value!r} is a {type(value).__name__}, not a source; open the path "
            "first, e.g. mixle.read_npy(path), mixle.read_zarr(path) or mixle.read_parquet("
            "path), and pass the source"
        )


def child_spec(child: Any) -> SpecTree | None:
    """A child's declared element spec: ``element_spec()``, a NumPy array's row, or ``None``.

    A child whose ``element_spec()`` raises ``TypeError`` (a wrapper over a source with
    nothing to report, e.g. :func:`mixle.select` over a plain list-like) or
    ``NotImplementedError`` declares none, as for the Loader's spec check.
    """
    report = getattr(child, "element_spec", None)
    if callable(report):
        try:
            return report()
        except (TypeError, NotImplementedError):
            return None
    if isinstance(child, np.ndarray):
        return ArraySpec(child.shape[1:], child.dtype)
    return None


def read_records(child: Any, indices: NDArray[np.int64]) -> Any:
    """Records ``indices`` of ``child`` stacked: one ``get_batch`` call, a NumPy fancy read,
    or ``child[i]`` per record, stacked (lists the child declares as object leaves stay
    one value each, :func:`~mixle.data.batches.stack_records`).

    Raises
    ------
    ValueError
        No indices for a child read record by record: there is no record to give the
        empty batch its structure.
    """
    get = getattr(child, "get_batch", None)
    if callable(get):
        return get(indices)
    if isinstance(child, np.ndarray):
        return child[indices]
    if not indices.size:
        raise ValueError(
            f"{type(child).__name__} has no get_batch, so an empty batch of it has no "
            "structure to return"
        )
    return stack_records([child[i] for i in indices.tolist()], child_spec(child))


def child_fingerprint(child: Any) -> str:
    """What tells ``child`` apart for a Loader's resume check, without reading data: its
    own ``fingerprint()``, else its type, length and element spec."""
    custom = getattr(child, "fingerprint", None)
    if callable(custom):
        return f"custom:{custom()}"
    spec = child_spec(child)
    return json.dumps({"type": type(child).__qualname__, "len": len(child), "spec": repr(spec)})
