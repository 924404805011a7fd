"""Physical pixel sizes of an ImageJ hyperstack: resolution tags and ``spacing``.

ImageJ stores the pixel width and height as the TIFF ``XResolution``/``YResolution`` tags
(pixels per unit, a rational), the slice distance as ``spacing`` and the unit as ``unit``
in its description; ``yunit=`` and ``zunit=`` give the units of ``y`` and ``z`` when they
differ from ``x``'s (ImageJ's calibration has one unit per axis). The spacing of the stored
array is the pixel size on ``x``/``y``, the slice distance on ``z`` and 1.0 on every other
axis, each in its own axis's unit.
"""

from __future__ import annotations

import math
from typing import Any

from mixle.data.sources.arrays.physical import Physical, physical_from_spacing

__all__ = ["imagej_physical", "imagej_unit"]

#: ImageJ's spellings of micrometres (its description escapes the micro sign).
_MICRONS = frozenset({"um", "micron", "microns", "\\u00b5m", "\u00b5m", "\u03bcm"})
#: Units that say the axis is not calibrated (sizes in pixels).
_PIXELS = frozenset({"pixel", "pixels"})


def imagej_unit(value: object) -> str | None:
    """The unit ImageJ recorded for one axis, or ``None`` when there is none.

    ImageJ's spellings of micrometres become ``"µm"``, ``pixels`` becomes ``"pixel"``; an
    empty or non-string value gives ``None``. Any other unit is kept as written, so that a
    unit mixle does not know (``patch_size_mm`` refuses an axis in it, naming it) is never
    taken for another.
    """
    if not isinstance(value, str) or not value.strip():
        return None
    unit = value.strip()
    if unit.lower() in _PIXELS:
        return "pixel"
    return "\u00b5m" if unit.lower() in _MICRONS else unit


def _pixel_size(tag: Any) -> float | None:
    """``1 / resolution`` of a TIFF resolution tag (a ``(numerator, denominator)``)."""
    value = None if tag is None else tag.value
    try:
        num, den = (float(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None
    if not (num > 0 and den > 0 and math.isfinite(num) and math.isfinite(den)):
        return None
    return den / num


def imagej_physical(metadata: dict[str, Any] | None, level: Any) -> Physical | None:
    """:class:`Physical` of an ImageJ hyperstack's series ``level``, or ``None``.

    ``None`` when ``metadata`` (tifffile's ``imagej_metadata``) is ``None`` or records no
    unit but pixels: ImageJ writes resolution tags of 1 pixel per inch by default, which
    are not a physical size. Units are per axis: ``unit=`` for ``x``, ``yunit=`` and
    ``zunit=`` for ``y`` and ``z`` where given, else ``unit=`` (see :func:`imagej_unit`).
    Axis names are tifffile's axes, lowercased.
    """
    if not metadata:
        return None
    unit = imagej_unit(metadata.get("unit"))
    axis_units = {
        "x": unit,
        # yunit=/zunit= only when they differ from unit= (an empty one: the same)
        "y": imagej_unit(metadata.get("yunit")) if _given(metadata, "yunit") else unit,
        "z": imagej_unit(metadata.get("zunit")) if _given(metadata, "zunit") else unit,
    }
    tags = level.keyframe.tags
    sizes: dict[str, float | None] = {
        "x": _pixel_size(tags.get("XResolution")),
        "y": _pixel_size(tags.get("YResolution")),
    }
    spacing_z = metadata.get("spacing")
    if isinstance(spacing_z, (int, float)) and math.isfinite(spacing_z) and spacing_z > 0:
        sizes["z"] = float(spacing_z)
    else:  # ImageJ's default voxel depth: 1 of the stack's unit (not 1 of an unknown unit)
        sizes["z"] = 1.0
    axes = level.axes.lower()
    spacing: list[float] = []
    units: list[str | None] = []
    for axis in axes:
        size, axis_unit = sizes.get(axis), axis_units.get(axis)
        if size is None or axis_unit is None:  # no size recorded
            spacing.append(1.0)
            units.append(None)
        else:
            spacing.append(size)
            units.append(axis_unit)
    if all(u in (None, "pixel") for u in units):  # not calibrated (ImageJ's default)
        return None
    # an axis in pixels among calibrated ones keeps the unit "pixel": patch_size_mm
    # refuses it (not a length) rather than taking its pixel counts for millimetres
    return physical_from_spacing(spacing, axes=tuple(axes), units=units)


def _given(metadata: dict[str, Any], key: str) -> bool:
    """Whether the description sets ``key`` to a non-empty value."""
    value = metadata.get(key)
    return isinstance(value, str) and bool(value.strip())
