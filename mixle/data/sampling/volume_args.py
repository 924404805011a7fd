"""Arguments of the samplers over a collection of volumes, checked against the collection.

The patch size as given (one int or one per spatial axis), the metadata ``columns=`` a
sampler adds to its records, and the ``volume_weights=`` table; shared by
:mod:`~mixle.data.sampling.volume_patches` and :mod:`~mixle.data.sampling.grid_volumes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.volumes import cumulative_weights
from mixle.data.sampling.aligned import COORDS_KEY, PATCH_KEY, VOLUME_KEY
from mixle.data.sampling.patch_args import patch_entries
from mixle.data.sources.collection import VolumeCollection
from mixle.utils.validation import parse_int

__all__ = [
    "Size",
    "full_size",
    "parse_columns",
    "parse_size",
    "parse_volume_weights",
    "spatial_shape",
]

#: A patch size as given: one int for every spatial axis, or one int per spatial axis.
Size = int | tuple[int, ...]


def parse_size(patch_size: object) -> Size:
    """``patch_size`` as an int or a tuple of ints, each ``>= 1`` (checked per volume later)."""
    n = patch_entries(patch_size)
    items = [patch_size] if n is None else list(patch_size)  # type: ignore[call-overload]
    sizes = [parse_int(p, "patch_size") for p in items]
    if not sizes or any(p < 1 for p in sizes):
        raise ValueError(f"patch_size={patch_size!r} must be >= 1 on every axis")
    return sizes[0] if n is None else tuple(sizes)


def full_size(size: Size, ndim: int) -> tuple[int, ...]:
    """One extent per spatial axis: an int size repeated ``ndim`` times, a tuple as it is."""
    return (size,) * ndim if isinstance(size, int) else size


def spatial_shape(shape: Any, size: Size) -> tuple[int, ...]:
    """The finest spatial shape of one volume (``shape`` or ``{name: shape}``)."""
    shapes = list(shape.values()) if isinstance(shape, Mapping) else [shape]
    nd = min(len(s) for s in shapes) if isinstance(size, int) else len(size)
    return tuple(max(s[len(s) - nd + a] for s in shapes) for a in range(nd))


def parse_columns(vols: VolumeCollection, columns: Sequence[str] | None) -> tuple[str, ...]:
    """Metadata ``columns`` for every record, checked against the collection.

    Raises
    ------
    KeyError
        A column the collection does not have.
    ValueError
        A column named like a record key (``patch``, ``coords``, ``volume``, an array).
    """
    if columns is None:
        return ()
    wanted = [columns] if isinstance(columns, str) else list(columns)
    for c in wanted:
        if c not in vols.columns:
            raise KeyError(
                f"columns={wanted!r}: {c!r} is not a metadata column of the collection (it "
                f"has {list(vols.columns)!r})"
            )
        if c in (PATCH_KEY, COORDS_KEY, VOLUME_KEY) or c in (vols.names or ()):
            raise ValueError(f"columns={wanted!r}: {c!r} is already a record key")
    return tuple(str(c) for c in wanted)


def parse_volume_weights(
    vols: VolumeCollection,
    value: Any,
    size: Size,
    valid: Callable[[], NDArray[np.int64]],
) -> tuple[Any, NDArray[np.float64] | None]:
    """``(what the weights are, their cumulative table)`` for ``volume_weights=value``.

    ``"uniform"`` gives no table. ``"voxels"`` weighs each volume by its spatial voxels,
    a metadata column or one weight per volume as given; volumes not in ``valid()`` (the
    ones that cannot hold a patch) get weight 0.

    Raises
    ------
    KeyError, TypeError, ValueError
        An unknown column, a non-numeric one, the wrong number of weights, or weights
        that are negative, not finite or all zero.
    """
    n = len(vols)
    if isinstance(value, str) and value == "uniform":
        return "uniform", None
    if isinstance(value, str) and value == "voxels":
        keep = set(valid().tolist())
        voxels = [
            math.prod(spatial_shape(vols.shape(v), size)) if v in keep else 0 for v in range(n)
        ]
        return "voxels", cumulative_weights(voxels)
    if isinstance(value, str):
        if value not in vols.columns:
            raise KeyError(
                f"volume_weights={value!r} is not 'uniform', 'voxels' or a metadata column of "
                f"the collection (it has {list(vols.columns)!r})"
            )
        raw = [vols.metadata(v)[value] for v in range(n)]
        try:
            weights = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                f"volume_weights={value!r}: the column must be numeric, got {raw[:3]!r}..."
            ) from None
        name = value
    else:
        weights = np.asarray(value, dtype=np.float64).reshape(-1)
        if weights.size != n:
            raise ValueError(
                f"volume_weights has {weights.size} entries but the collection has {n} volumes"
            )
        name = "array"
    weights = weights.copy()
    weights[np.setdiff1d(np.flatnonzero(weights > 0), valid())] = 0
    return (name, weights.tolist()), cumulative_weights(weights)
