"""Physical pixel sizes of an OME-TIFF series, from the file's OME-XML.

OME-XML gives ``PhysicalSizeX/Y/Z`` (with ``PhysicalSize*Unit``, micrometres by default)
per ``Image``; tifffile makes one series per ``Image``. The spacing of the stored array is
that size on its ``x``, ``y`` and ``z`` axes and 1.0 on every other axis (time, channel,
samples...). A pyramid level's spacing grows by the factor its extent shrank on that axis.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

from mixle.data.sources.arrays.physical import Physical, physical_from_spacing

__all__ = ["OME_DEFAULT_UNIT", "ome_physical", "ome_pixel_sizes"]

#: The unit OME-XML's schema gives ``PhysicalSize*`` when ``PhysicalSize*Unit`` is absent.
OME_DEFAULT_UNIT = "µm"
#: Longest OME-XML text parsed (a hostile file may hold gigabytes of description).
MAX_OME_XML_CHARS = 64 * 1024 * 1024


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def ome_pixel_sizes(xml: str, series: int, name: str) -> dict[str, tuple[float, str]]:
    """``{"x": (size, unit), ...}`` of the ``Image`` of series ``series``; ``{}`` if none.

    The ``Image`` is the ``series``-th of the document when its ``Name`` is ``name`` or it
    has no name; else the first ``Image`` named ``name``. Sizes that are missing, not
    numbers, not finite or not positive are left out.
    """
    if not xml or len(xml) > MAX_OME_XML_CHARS:
        return {}
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    images = [e for e in root if _local(e.tag) == "Image"]
    image = None
    if series < len(images) and images[series].get("Name") in (None, "", name):
        image = images[series]
    else:
        image = next((e for e in images if name and e.get("Name") == name), None)
    if image is None:
        return {}
    pixels = next((e for e in image if _local(e.tag) == "Pixels"), None)
    if pixels is None:
        return {}
    sizes: dict[str, tuple[float, str]] = {}
    for axis in "XYZ":
        text = pixels.get(f"PhysicalSize{axis}")
        try:
            value = float(text) if text is not None else math.nan
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            unit = pixels.get(f"PhysicalSize{axis}Unit") or OME_DEFAULT_UNIT
            sizes[axis.lower()] = (value, unit)
    return sizes


def ome_physical(xml: str | None, series: Any, level: Any, index: int) -> Physical | None:
    """:class:`Physical` of pyramid level ``level`` of OME series ``series``, or ``None``.

    ``None`` when the file has no OME-XML or the ``Image`` records no physical size. Axis
    names are tifffile's axes of the level, lowercased.
    """
    if xml is None:
        return None
    sizes = ome_pixel_sizes(xml, index, getattr(series, "name", "") or "")
    if not sizes:
        return None
    axes = level.axes.lower()
    base = dict(zip(series.axes.lower(), series.shape))
    spacing: list[float] = []
    units: list[str | None] = []
    for axis, extent in zip(axes, level.shape):
        if axis in sizes:
            value, unit = sizes[axis]
            full = base.get(axis, extent)
            spacing.append(value * (full / extent) if extent and full != extent else value)
            units.append(unit)
        else:
            spacing.append(1.0)
            units.append(None)
    return physical_from_spacing(spacing, axes=tuple(axes), units=units)
