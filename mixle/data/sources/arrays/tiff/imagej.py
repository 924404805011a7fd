"""Physical pixel sizes of an ImageJ hyperstack: resolution tags and ``spacing``.

ImageJ stores the pixel width and height as the TIFF ``XResolution``/``YResolution`` tags
(pixels per unit, a rational), the slice distance as ``spacing`` and the unit as ``unit``
in its description. The spacing of the stored array is the pixel size on ``x``/``y``, the
slice distance on ``z`` and 1.0 on every other axis.
"""

from __future__ import annotations

import math
from typing import Any

from mixle.data.sources.arrays.physical import Physical, physical_from_spacing

__all__ = ["imagej_physical"]


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
    unit: ImageJ writes resolution tags of 1 pixel per inch by default, which are not a
    physical size. Axis names are tifffile's axes, lowercased.
    """
    if not metadata:
        return None
    unit = metadata.get("unit")
    if not isinstance(unit, str) or not unit or unit in ("pixel", "pixels"):
        return None
    unit = "µm" if unit in ("um", "micron", "\\u00B5m") else unit
    tags = level.keyframe.tags
    sizes: dict[str, float | None] = {
        "x": _pixel_size(tags.get("XResolution")),
        "y": _pixel_size(tags.get("YResolution")),
    }
    spacing_z = metadata.get("spacing")
    if isinstance(spacing_z, (int, float)) and math.isfinite(spacing_z) and spacing_z > 0:
        sizes["z"] = float(spacing_z)
    axes = level.axes.lower()
    spacing: list[float] = []
    units: list[str | None] = []
    for axis in axes:
        size = sizes.get(axis)
        spacing.append(1.0 if size is None else size)
        units.append(None if size is None else unit)
    if all(u is None for u in units):
        return None
    return physical_from_spacing(spacing, axes=tuple(axes), units=units)
