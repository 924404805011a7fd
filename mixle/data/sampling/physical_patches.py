"""Patches in world units: ``patch_size_mm=`` in voxels, and the world position of a corner.

A source whose format records its geometry (:class:`~mixle.data.sources.arrays.physical.Physical`:
NIfTI, OME-Zarr, OME-TIFF...) has a spacing and a voxel-to-world affine per axis. A patch
size in millimetres becomes ``round(mm / spacing)`` voxels (at least 1) on each spatial
axis (:func:`patch_size_from_mm`), and a patch's corner voxel its world position
``affine @ [*corner, 1]`` (:func:`world_positions`, over the spatial part of the affine that
:func:`spatial_affine` takes).

Which axes are spatial comes from the axis names the format records
(:func:`spatial_axes`): NIfTI keeps time last (``i, j, k, t``), an RGB OME-TIFF its samples
(``z, y, x, s``), an OME-Zarr image its channels first (``c, z, y, x``). A sampler patches
its trailing axes and holds the leading ones whole, so both need the spatial axes to be
exactly the patched, trailing ones: anything else raises ``ValueError`` naming the axes,
never a world position of the wrong axes. The one exception is an axis that is not spatial
and has length 1, among or after the spatial ones (the single time point of a NIfTI
``(X, Y, Z, 1)``, the one sample of a ``z, y, x, s`` image): it is patched with extent 1,
``patch_size_mm=`` gives it 1 voxel, and ``world`` keeps one value per spatial axis (the
affine of :func:`spatial_affine` has a row per spatial axis, a column per patched one).
Arrays that record no axis names keep the trailing-axes rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.arrays.physical import Physical

__all__ = [
    "MM_PER_UNIT",
    "ROUND_TOLERANCE",
    "WORLD_KEY",
    "SizeMm",
    "check_spatial_axes",
    "describe_sizes",
    "finest_array",
    "parse_patch_size_mm",
    "patch_size_from_mm",
    "round_voxels",
    "spatial_affine",
    "spatial_axes",
    "world_positions",
]

#: Record key of a patch's world position in dict records (``world=True``).
WORLD_KEY = "world"

#: Millimetres per unit, for the length units formats write (NGFF's names, NIfTI's
#: ``xyzt_units`` spellings); spacing with no recorded unit is taken as millimetres.
MM_PER_UNIT: dict[str, float] = {
    "angstrom": 1e-7,
    "picometer": 1e-9,
    "nanometer": 1e-6,
    "nm": 1e-6,
    "micrometer": 1e-3,
    "micrometre": 1e-3,
    "micron": 1e-3,
    "um": 1e-3,
    "\u00b5m": 1e-3,  # micro sign
    "\u03bcm": 1e-3,  # Greek mu
    "millimeter": 1.0,
    "millimetre": 1.0,
    "mm": 1.0,
    "centimeter": 10.0,
    "centimetre": 10.0,
    "cm": 10.0,
    "decimeter": 100.0,
    "meter": 1000.0,
    "metre": 1000.0,
    "m": 1000.0,
    "inch": 25.4,
    "foot": 304.8,
}

#: A patch size in millimetres as given: one number for every axis, or one per spatial axis.
SizeMm = float | tuple[float, ...]

#: Axis names that are spatial wherever they appear (OME-TIFF, OME-Zarr, ImageJ, N5 writers).
SPATIAL_NAMES = frozenset({"x", "y", "z"})
#: NIfTI's voxel axes: spatial when no axis is named x, y or z (tifffile's ``I`` axis is a
#: sequence of images, not space).
VOXEL_NAMES = frozenset({"i", "j", "k"})
#: Relative tolerance of :func:`round_voxels`: a quotient this close below a half rounds up.
ROUND_TOLERANCE = 1e-6


def spatial_axes(physical: Physical | None) -> tuple[int, ...] | None:
    """The spatial axes of ``physical`` by their recorded names and units; ``None``: unknown.

    An axis is spatial when it is named ``x``, ``y`` or ``z`` (any case), when its unit is
    a length (:data:`MM_PER_UNIT`: an OME-Zarr ``"space"`` axis of another name), or, when
    no axis is named ``x``, ``y`` or ``z``, when it is named ``i``, ``j`` or ``k`` (NIfTI's
    voxel axes). Channels (``c``), samples (``s``), time (``t``, a time unit) and other
    names are not. ``None`` when ``physical`` is ``None``, records no axis names, or names
    no axis spatial (the callers then take the trailing axes as the spatial ones).
    """
    if physical is None or physical.axes is None:
        return None
    names = [n.strip().lower() for n in physical.axes]
    units = physical.units or (None,) * len(names)
    spatial = SPATIAL_NAMES if SPATIAL_NAMES & set(names) else SPATIAL_NAMES | VOXEL_NAMES
    found = tuple(
        a
        for a, (name, unit) in enumerate(zip(names, units))
        if name in spatial or (unit is not None and unit.strip().lower() in MM_PER_UNIT)
    )
    return found or None


def _span(axes: Sequence[int]) -> str:
    """``"axis 2"``, ``"axes 0-2"`` or ``"axes 0, 2"``."""
    if len(axes) == 1:
        return f"axis {axes[0]}"
    if list(axes) == list(range(axes[0], axes[0] + len(axes))):
        return f"axes {axes[0]}-{axes[-1]}"
    return f"axes {', '.join(str(a) for a in axes)}"


def _singletons(
    found: Sequence[int],
    patched: Sequence[int],
    shape: Sequence[int] | None,
    size: Sequence[int] | None,
) -> tuple[int, ...] | None:
    """The patched axes that are not spatial, when each has length 1 (and extent 1); else ``None``.

    ``None`` too when a spatial axis is not patched, or ``shape`` is unknown and a patched
    axis is not spatial.
    """
    if not set(found) <= set(patched):
        return None
    extra = tuple(a for a in patched if a not in found)
    if extra and shape is None:
        return None
    start = patched[0] if patched else 0
    for a in extra:
        if shape is None or shape[a] != 1 or (size is not None and size[a - start] != 1):
            return None
    return extra


def check_spatial_axes(
    physical: Physical | None,
    ndim: int,
    nd: int,
    argument: str,
    what: str,
    covers: str,
    *,
    shape: Sequence[int] | None = None,
    size: Sequence[int] | None = None,
) -> None:
    """Raise ``ValueError`` unless the trailing ``nd`` of ``ndim`` axes are the spatial ones.

    The spatial axes are :func:`spatial_axes`'s; nothing is checked when they are unknown.
    The patched axes may also hold axes that are not spatial where each has length 1 in
    ``shape`` (the array's shape) and extent 1 in ``size`` (the patch size of the ``nd``
    patched axes, when known): the ``t`` of a single-volume NIfTI ``(X, Y, Z, 1)``.
    ``argument`` (``"world=True"``, ``"patch_size_mm=..."``) leads the message, ``what``
    names the array, ``covers`` the argument that sets the patched axes (``"patch_size"``).
    """
    found = spatial_axes(physical)
    patched = tuple(range(ndim - nd, ndim))
    if found is None or physical is None or physical.axes is None:
        return
    if _singletons(found, patched, shape, size) is not None:
        return
    names = physical.axes

    def named(axes: Sequence[int]) -> str:
        return ", ".join(names[a] for a in axes)

    head = (
        f"{argument}: the spatial axes of {what} are {named(found)} ({_span(found)} of "
        f"{ndim}) but {covers} covers {_span(patched)} ({named(patched)}); world= and "
        "patch_size_mm= need the patch to cover exactly the spatial axes, and those last "
        "(a patch holds its leading axes whole; other axes of length 1 among or after them "
        "are patched with extent 1)"
    )
    tail = tuple(range(found[0], ndim))
    ones = _singletons(found, tail, shape, None)
    if ones is not None:
        if covers == "patch_size_mm":
            advice = (
                f"give {covers} {len(found)} entries, one per spatial axis ({named(found)}), "
                "or one number"
            )
        else:
            advice = f"give {covers} {len(tail)} entries, one per spatial axis ({named(found)})"
        if ones:
            advice += f" and 1 on each axis of length 1 ({named(ones)})"
            if size is not None:
                wrong = [a for a in ones if a in patched and size[a - patched[0]] != 1]
                if wrong:
                    advice = f"{covers} must be 1 on {named(wrong)} (length 1): {advice}"
    else:
        after = [a for a in tail if a not in found and (shape is None or shape[a] != 1)]
        where = "comes after" if after[0] > found[-1] else "lies between"
        advice = (
            f"here {named(after)} ({_span(after)}) {where} them, which a patch "
            "cannot hold whole: store the data with the spatial axes last (time, channels "
            "or samples first), or pass patch_size= in voxels and leave world= off (corners "
            "are then voxel indices of the patched axes)"
        )
    raise ValueError(f"{head}: {advice}")


def round_voxels(quotient: float) -> int:
    """``quotient`` rounded to the nearest int, halves up, at least 1.

    A quotient within a relative :data:`ROUND_TOLERANCE` (``1e-6``, at most a quarter
    voxel) of a half rounds up as the half does: a spacing recorded in float32 (NIfTI's
    ``pixdim``) is off by up to a relative ``6e-8``, so ``1.0 / float32(0.4)`` is
    ``2.49999996`` where ``2.5`` was meant, and gives 3 voxels.
    """
    whole = math.floor(quotient)
    near = min(0.25, ROUND_TOLERANCE * max(1.0, abs(quotient)))
    if abs(quotient - (whole + 0.5)) <= near:
        return max(1, whole + 1)
    return max(1, math.floor(quotient + 0.5))


def parse_patch_size_mm(patch_size_mm: object) -> SizeMm:
    """``patch_size_mm`` as a float or a tuple of floats, each finite and ``> 0``.

    Raises
    ------
    TypeError
        Not a number or a sequence of numbers.
    ValueError
        No entries, or an entry that is not finite or not ``> 0``.
    """
    one = isinstance(patch_size_mm, (int, float, np.integer, np.floating))
    if isinstance(patch_size_mm, (bool, np.bool_)) or not (
        one
        or (
            isinstance(patch_size_mm, (Sequence, np.ndarray)) and not isinstance(patch_size_mm, str)
        )
    ):
        raise TypeError(
            f"patch_size_mm={patch_size_mm!r} must be a number or one number per spatial axis"
        )
    items = [patch_size_mm] if one else list(patch_size_mm)  # type: ignore[call-overload]
    values = []
    for x in items:
        if isinstance(x, (bool, np.bool_)) or not isinstance(
            x, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"patch_size_mm={patch_size_mm!r} must hold numbers")
        values.append(float(x))
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"patch_size_mm={patch_size_mm!r} must be finite and > 0 on every axis")
    return values[0] if one else tuple(values)


def patch_size_from_mm(
    patch_size_mm: SizeMm,
    physical: Physical | None,
    ndim: int,
    what: str,
    *,
    default_nd: int | None = None,
    shape: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """The voxel patch size of ``patch_size_mm`` on an array of ``ndim`` axes and ``physical``.

    A tuple names the spatial axes (:func:`spatial_axes`), which must be the trailing ones
    (leading axes are channels, held whole), except that axes of length 1 in ``shape``
    (the array's shape, when given) may lie among or after them: those get extent 1, so a
    NIfTI ``(X, Y, Z, 1)`` (``i, j, k, t``) gives 4 extents, the last 1. One number covers
    the spatial axes the same way; where the array records no axis names (or none mixle
    knows as spatial), a tuple names the trailing axes and one number covers every axis,
    as an int ``patch_size`` does (or the trailing ``default_nd``, for a dict of arrays).
    Each spatial extent is :func:`round_voxels` of ``mm / spacing`` (halves up, at least
    1), with the spacing converted to millimetres by its unit (:data:`MM_PER_UNIT`; no unit
    recorded: millimetres).

    Raises
    ------
    ValueError
        ``physical`` is ``None`` (the array records no spacing), more entries than axes,
        entries that are not the spatial axes (by the recorded names; an axis that is not
        spatial and longer than 1 among or after them), or a spatial axis whose unit is not
        a length (naming ``what``).
    """
    one = isinstance(patch_size_mm, float)
    known = spatial_axes(physical)
    if one:
        m = len(known) if known is not None else ndim if default_nd is None else default_nd
    else:
        m = len(patch_size_mm)  # type: ignore[arg-type]
    if not 1 <= m <= ndim:
        raise ValueError(
            f"patch_size_mm={patch_size_mm!r} has {m} entries; {what} has {ndim} axes "
            f"(give 1 to {ndim}: the trailing, spatial axes)"
        )
    if physical is None:
        raise ValueError(
            f"patch_size_mm={patch_size_mm!r}: {what} records no voxel spacing (its format "
            "stores none, or mixle does not read it); pass patch_size= in voxels instead"
        )
    argument = f"patch_size_mm={patch_size_mm!r}"
    nd = m if known is None or m != len(known) else ndim - known[0]
    check_spatial_axes(physical, ndim, nd, argument, what, "patch_size_mm", shape=shape)
    if known is not None and m != len(known):  # spatial axes and length-1 axes, by count
        names = physical.axes or ()
        raise ValueError(
            f"{argument}: {what} has {len(known)} spatial axes "
            f"({', '.join(names[a] for a in known)}); give patch_size_mm one entry per "
            "spatial axis, or one number (axes of length 1 among or after them get 1 voxel)"
        )
    spatial = set(range(ndim - nd, ndim)) if known is None else set(known)
    mm = iter((patch_size_mm,) * m if one else patch_size_mm)  # type: ignore[arg-type]
    units = (None,) * ndim if physical.units is None else physical.units
    out = []
    for a in range(ndim - nd, ndim):
        if a not in spatial:
            out.append(1)
            continue
        size, step, unit = next(mm), physical.spacing[a], units[a]
        factor = 1.0 if unit is None else MM_PER_UNIT.get(unit.strip().lower())
        if factor is None:
            raise ValueError(
                f"{argument}: {what} has unit {unit!r} on spatial axis {a}, not a length "
                f"mixle converts to millimetres (it knows {', '.join(sorted(MM_PER_UNIT))}); "
                "pass patch_size= in voxels instead"
            )
        out.append(round_voxels(size / (step * factor)))
    return tuple(out)


def spatial_affine(
    physical: Physical | None,
    nd: int,
    what: str,
    *,
    shape: Sequence[int] | None = None,
    size: Sequence[int] | None = None,
) -> NDArray[np.float64]:
    """The ``(ns + 1, nd + 1)`` voxel-to-world affine of the trailing ``nd`` (patched) axes.

    Rows are the ``ns`` spatial axes, columns the patched ones: ``affine @ [*corner, 1]``
    is a corner's world position. The patched axes must be the spatial ones where the
    array records axis names (:func:`spatial_axes`: ``i, j, k`` of a NIfTI ``i, j, k, t``,
    not ``j, k, t``), except for axes of length 1 in ``shape`` with extent 1 in ``size``
    among or after them (the ``t`` of a NIfTI ``(X, Y, Z, 1)``): those have no row and a
    column of zeros (their corner is always 0). Arrays without names take the trailing
    ``nd`` axes as the spatial ones (a square affine).

    Raises
    ------
    ValueError
        ``physical`` is ``None``; the patched axes are not the spatial ones; or the affine
        mixes a leading (channel) axis into the world position of a spatial one (naming
        ``what``).
    """
    if physical is None:
        raise ValueError(
            f"world=True: {what} records no voxel-to-world geometry (physical=None: its "
            "format stores none, or mixle does not read it); pass world=False, or read it "
            "from a format that records its affine (NIfTI, OME-Zarr, OME-TIFF)"
        )
    n = physical.ndim
    check_spatial_axes(physical, n, nd, "world=True", what, "patch_size", shape=shape, size=size)
    a = physical.affine
    lead = n - nd
    known = spatial_axes(physical)
    rows = [r for r in range(lead, n) if known is None or r in known]
    if lead and np.any(a[rows, :lead]):
        raise ValueError(
            f"world=True: the affine of {what} moves spatial world coordinates along its "
            f"leading (channel) axes {tuple(range(lead))}; a patch's world position would "
            "depend on the channel"
        )
    out = np.zeros((len(rows) + 1, nd + 1))
    out[-1, -1] = 1.0
    for i, r in enumerate(rows):
        for c in rows:
            out[i, c - lead] = a[r, c]
        out[i, nd] = a[r, n]
    out.flags.writeable = False
    return out


def world_positions(affine: NDArray[np.float64], corners: NDArray[np.int64]) -> NDArray[np.float64]:
    """World coordinates ``(B, ns)`` float64 of voxel corners ``(B, nd)`` under ``affine``.

    ``affine`` is ``(ns + 1, nd + 1)`` (:func:`spatial_affine`). Element by element in a
    fixed order (no matrix product, whose rounding depends on the batch's size): a corner
    has the same world position in every batch it is read in.
    """
    v = np.asarray(corners, dtype=np.float64)
    ns, nd = affine.shape[0] - 1, affine.shape[1] - 1
    out = np.empty((v.shape[0], ns), dtype=np.float64)
    for i in range(ns):
        acc = v[:, 0] * affine[i, 0] if nd else np.zeros(v.shape[0])
        for j in range(1, nd):
            acc = acc + v[:, j] * affine[i, j]
        out[:, i] = acc + affine[i, nd]
    return out


def finest_array(shapes: Mapping[str, Sequence[int]], nd: int) -> str:
    """The name of the first array whose trailing ``nd`` axes are the finest grid.

    The corners of a dict of aligned arrays are voxels of that grid (the largest extent
    of every array on each spatial axis).
    """
    fine = [max(s[len(s) - nd + a] for s in shapes.values()) for a in range(nd)]
    for name, s in shapes.items():
        if list(s[len(s) - nd :]) == fine:
            return name
    raise ValueError(
        f"no array of {dict(shapes)} spans the finest grid {tuple(fine)} on every axis"
    )


def describe_sizes(rows: list[tuple[str, Any, tuple[int, ...]]]) -> str:
    """``"volume 0 ('a') spacing (1.0, ...) -> (20, ...); ..."``, one example per size."""
    seen: dict[tuple[int, ...], list[tuple[str, Any]]] = {}
    for where, spacing, size in rows:
        seen.setdefault(size, []).append((where, spacing))
    parts = []
    for size, items in seen.items():
        where, spacing = items[0]
        more = f" (and {len(items) - 1} more volumes)" if len(items) > 1 else ""
        parts.append(f"{where} spacing {spacing} -> {size} voxels{more}")
    return "; ".join(parts)
