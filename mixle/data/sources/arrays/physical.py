"""Where an array's voxels sit in the world: spacing, origin, affine and axis names.

Formats that record it (NIfTI, OME-TIFF, OME-Zarr) fill a :class:`Physical` when a source
opens; :attr:`ArraySource.spacing`, :attr:`~ArraySource.origin` and
:attr:`~ArraySource.affine` read it. Everything is per axis of the stored array, in the
array's own axis order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Physical", "physical_from_affine", "physical_from_spacing"]


@dataclass(frozen=True, eq=False)
class Physical:
    """Voxel-to-world geometry of an array, per axis of the stored array.

    Attributes
    ----------
    spacing
        World distance between neighbouring voxels along each axis (all > 0). For an
        affine with rotation or shear, the length of each column of its linear part.
    origin
        World coordinates of voxel ``(0, ..., 0)``, one per axis.
    affine
        ``(ndim + 1, ndim + 1)`` float64 matrix mapping a voxel index ``v`` (as the
        homogeneous ``[*v, 1]``) to world coordinates: ``world = affine @ [*v, 1]``. A
        read-only array.
    axes
        Axis names as the format gives them (``("z", "y", "x")``, ``("i", "j", "k")``), or
        ``None`` when it gives none.
    units
        Unit of each axis (``"micrometer"``, ``"mm"``...), ``None`` where unknown, or
        ``None`` for all.
    """

    spacing: tuple[float, ...]
    origin: tuple[float, ...]
    affine: NDArray[np.float64]
    axes: tuple[str, ...] | None = None
    units: tuple[str | None, ...] | None = None

    @property
    def ndim(self) -> int:
        """Number of axes described."""
        return len(self.spacing)

    def world(self, voxels: ArrayLike) -> NDArray[np.float64]:
        """World coordinates of voxel indices ``voxels`` (``(..., ndim)``), as float64."""
        v = np.asarray(voxels, dtype=np.float64)
        if v.shape[-1:] != (self.ndim,):
            raise ValueError(
                f"voxels with shape {v.shape} must end in an axis of {self.ndim} coordinates"
            )
        a = self.affine
        return v @ a[:-1, :-1].T + a[:-1, -1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Physical):
            return NotImplemented
        return (
            self.spacing == other.spacing
            and self.origin == other.origin
            and np.array_equal(self.affine, other.affine)
            and self.axes == other.axes
            and self.units == other.units
        )

    def __hash__(self) -> int:
        return hash((self.spacing, self.origin, self.axes, self.units))

    def __repr__(self) -> str:
        parts = [f"spacing={self.spacing}", f"origin={self.origin}"]
        if self.axes is not None:
            parts.append(f"axes={self.axes}")
        if self.units is not None:
            parts.append(f"units={self.units}")
        return f"Physical({', '.join(parts)})"


def _floats(values: object, name: str, ndim: int | None) -> tuple[float, ...]:
    if not isinstance(values, (Sequence, np.ndarray)) or isinstance(values, str):
        raise TypeError(f"{name}={values!r} must be a sequence of numbers")
    out = []
    for x in values:
        if isinstance(x, (bool, np.bool_)):
            raise TypeError(f"{name}={values!r} must hold numbers, not booleans")
        try:
            out.append(float(x))
        except (TypeError, ValueError):
            raise TypeError(f"{name}={values!r} must hold numbers") from None
    if ndim is not None and len(out) != ndim:
        raise ValueError(f"{name}={values!r} has {len(out)} values for {ndim} axes")
    if not all(math.isfinite(x) for x in out):
        raise ValueError(f"{name}={values!r} must be finite")
    return tuple(out)


def _names(values: object, name: str, ndim: int) -> tuple[str, ...] | None:
    if values is None:
        return None
    names = tuple(values)  # type: ignore[call-overload]
    if len(names) != ndim or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{name}={values!r} must be {ndim} strings")
    return names


def _units(values: object, ndim: int) -> tuple[str | None, ...] | None:
    if values is None:
        return None
    units = tuple(values)  # type: ignore[call-overload]
    if len(units) != ndim or not all(u is None or isinstance(u, str) for u in units):
        raise ValueError(f"units={values!r} must be {ndim} strings or None")
    return None if all(u is None for u in units) else units


def physical_from_spacing(
    spacing: Sequence[float],
    origin: Sequence[float] | None = None,
    *,
    axes: Sequence[str] | None = None,
    units: Sequence[str | None] | None = None,
) -> Physical:
    """A :class:`Physical` of an axis-aligned grid: ``world = origin + spacing * voxel``."""
    sp = _floats(spacing, "spacing", None)
    if any(s <= 0 for s in sp):
        raise ValueError(f"spacing={spacing!r} must be > 0 on every axis")
    org = (0.0,) * len(sp) if origin is None else _floats(origin, "origin", len(sp))
    affine = np.eye(len(sp) + 1)
    affine[:-1, :-1] = np.diag(sp)
    affine[:-1, -1] = org
    affine.flags.writeable = False
    return Physical(sp, org, affine, _names(axes, "axes", len(sp)), _units(units, len(sp)))


def physical_from_affine(
    affine: ArrayLike,
    *,
    axes: Sequence[str] | None = None,
    units: Sequence[str | None] | None = None,
) -> Physical:
    """A :class:`Physical` from a homogeneous ``(ndim + 1, ndim + 1)`` voxel-to-world matrix."""
    a = np.array(affine, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 2:
        raise ValueError(f"affine with shape {a.shape} must be a square (ndim + 1) matrix")
    if not np.isfinite(a).all():
        raise ValueError("affine must be finite")
    n = a.shape[0] - 1
    if not np.array_equal(a[-1], np.eye(n + 1)[-1]):
        raise ValueError(f"affine's last row {a[-1].tolist()} must be [0, ..., 0, 1]")
    spacing = tuple(float(x) for x in np.linalg.norm(a[:-1, :-1], axis=0))
    if any(s <= 0 for s in spacing):
        raise ValueError("affine maps some axis to a zero length: it is singular")
    a.flags.writeable = False
    origin = tuple(float(x) for x in a[:-1, -1])
    return Physical(spacing, origin, a, _names(axes, "axes", n), _units(units, n))
