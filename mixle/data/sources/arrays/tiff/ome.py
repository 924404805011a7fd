"""Physical pixel sizes of an OME-TIFF series, from the file's OME-XML.

OME-XML gives ``PhysicalSizeX/Y/Z`` (with ``PhysicalSize*Unit``, micrometres by default)
per ``Image``; tifffile makes one series per ``Image`` that has data, so a series is tied
to its ``Image`` by its key page (the ``Image`` whose ``TiffData`` name that
IFD of that file), not by its index or name. The spacing of the stored array is
that size on its ``x``, ``y`` and ``z`` axes and 1.0 on every other axis (time, channel,
samples...). A pyramid level's spacing grows by the factor its extent shrank on that axis.
"""

from __future__ import annotations

import math
import os
import warnings
import xml.etree.ElementTree as ET
from typing import Any

from mixle.data.sources.arrays.physical import Physical, physical_from_spacing
from mixle.data.sources.arrays.tiff.opening import page_file
from mixle.errors import OmeTiffMetadataWarning, OmeTiffMissingFilesWarning

__all__ = [
    "OME_DEFAULT_UNIT",
    "OmeTiffMetadataWarning",
    "OmeTiffMissingFilesWarning",
    "ome_missing_files",
    "ome_physical",
    "ome_pixel_sizes",
    "warn_missing_planes",
]


#: The unit OME-XML's schema gives ``PhysicalSize*`` when ``PhysicalSize*Unit`` is absent.
OME_DEFAULT_UNIT = "µm"
#: Longest OME-XML text parsed (a hostile file may hold gigabytes of description).
MAX_OME_XML_CHARS = 64 * 1024 * 1024


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _same_path(a: str, b: str) -> bool:
    return os.path.normcase(os.path.normpath(a)) == os.path.normcase(os.path.normpath(b))


def _tiffdata_file(data: ET.Element, root_uuid: str | None, root: str) -> str | None:
    """Path of the file a ``TiffData`` names, resolved as tifffile does; ``None``: unnamed.

    No ``UUID``, or the document's own: this file (``root``); no document ``UUID`` and a
    ``FileName`` that is this file's name: this file; else ``FileName`` beside this file.
    """
    uuid = next((c for c in data if _local(c.tag) == "UUID"), None)
    if uuid is None:
        return root
    text, filename = (uuid.text or "").strip(), uuid.get("FileName")
    if root_uuid is not None and text == root_uuid:
        return root
    if filename is None:
        return None
    if root_uuid is None and filename.lower() == os.path.basename(root).lower():
        return root
    return os.path.join(os.path.dirname(root), filename)


def _image_holds(
    image: ET.Element, index: int, path: str, root: str, root_uuid: str | None
) -> bool:
    """Whether a ``TiffData`` of ``image`` names IFD ``index`` of the file ``path``.

    A ``TiffData``'s IFDs are ``IFD`` (default 0) and the ``PlaneCount`` (or
    ``NumPlanes``; else 1 when ``IFD`` is given, else all) after it, as tifffile reads them.
    """
    for pixels in image:
        if _local(pixels.tag) != "Pixels":
            continue
        for data in pixels:
            if _local(data.tag) != "TiffData":
                continue
            named = _tiffdata_file(data, root_uuid, root)
            if named is None or not _same_path(named, path):
                continue
            try:
                first = int(data.get("IFD", 0))
                count = int(data.get("NumPlanes", 1 if "IFD" in data.attrib else 0))
                count = int(data.get("PlaneCount", count))
            except ValueError:
                continue
            if first <= index and (count <= 0 or index < first + count):
                return True
    return False


def _sizes(image: ET.Element) -> dict[str, tuple[float, str]]:
    """``{"x": (size, unit), ...}`` of an ``Image``'s ``Pixels``; bad sizes left out."""
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


def ome_pixel_sizes(
    xml: str, index: int, path: str, root: str, where: str = "the OME-TIFF"
) -> dict[str, tuple[float, str]]:
    """``{"x": (size, unit), ...}`` of the ``Image`` holding IFD ``index`` of file ``path``.

    Parameters
    ----------
    xml
        The OME-XML document (the first page's description).
    index, path
        Where the series' key page is stored: its IFD index and the path of its file.
    root
        Path of the file the document is in.
    where
        How a warning names the series.

    Returns
    -------
    dict
        The sizes of the one ``Image`` whose ``TiffData`` name that IFD, as tifffile maps
        an ``Image`` to a series (tifffile skips an ``Image`` without data, so the series
        index is not the ``Image`` index, and names such as ``"default"`` repeat). Sizes
        that are missing, not numbers, not finite or not positive are left out. ``{}``
        (with an :class:`OmeTiffMetadataWarning`) when no ``Image`` or several with
        different sizes name it.
    """
    if not xml or len(xml) > MAX_OME_XML_CHARS:
        return {}
    try:
        doc = ET.fromstring(xml)
    except ET.ParseError:
        return {}
    root_uuid = doc.get("UUID")
    images = [e for e in doc if _local(e.tag) == "Image"]
    found = [e for e in images if _image_holds(e, index, path, root, root_uuid)]
    sizes = [_sizes(e) for e in found]
    if len(found) == 1 or (found and all(s == sizes[0] for s in sizes)):
        return sizes[0]
    name = os.path.basename(path)
    if not found:
        problem = f"no <Image> of its OME-XML names IFD {index} of {name!r}"
    else:
        ids = ", ".join(repr(e.get("ID")) for e in found)
        problem = f"the <Image>s {ids} of its OME-XML all name IFD {index} of {name!r}"
    warnings.warn(
        f"{where}: {problem}, the series' first page, so mixle cannot tell which physical "
        "sizes are the series'; it has no spacing (physical is None)",
        OmeTiffMetadataWarning,
        stacklevel=2,
    )
    return {}


def ome_missing_files(xml: str | None, root: str) -> tuple[str, ...]:
    """The files the OME-XML in ``root`` names (``TiffData`` ``UUID FileName``) that are absent.

    Paths are resolved as tifffile resolves them (beside ``root``); each is named once,
    in document order. ``()`` when there is no (parsable) OME-XML.
    """
    if not xml or len(xml) > MAX_OME_XML_CHARS:
        return ()
    try:
        doc = ET.fromstring(xml)
    except ET.ParseError:
        return ()
    root_uuid = doc.get("UUID")
    missing: dict[str, None] = {}
    for data in doc.iter():
        if _local(data.tag) != "TiffData":
            continue
        named = _tiffdata_file(data, root_uuid, root)
        if named is not None and named not in missing and not os.path.isfile(named):
            missing[named] = None
    return tuple(missing)


def warn_missing_planes(xml: str | None, level: Any, root: str, where: str) -> None:
    """Warn (:class:`OmeTiffMissingFilesWarning`) when planes of ``level`` are absent.

    tifffile leaves a plane of a multi-file series it could not open as ``None`` and
    reads it as zeros; mixle does the same, so a missing file is named here, at open,
    rather than shown only as zeros later.
    """
    pages = getattr(level, "_pages", None) or ()
    absent = sum(1 for page in pages if page is None)
    if not absent:
        return
    missing = ome_missing_files(xml, root)
    named = ", ".join(repr(m) for m in missing) if missing else "(none named is absent)"
    warnings.warn(
        f"{where}: {absent} of its {len(pages)} planes are stored in files that could not "
        f"be opened; missing files: {named}. Those planes read as zeros (as tifffile reads "
        "them); restore the files and open the source again to read them",
        OmeTiffMissingFilesWarning,
        stacklevel=3,
    )


def ome_physical(xml: str | None, series: Any, level: Any, where: str) -> Physical | None:
    """:class:`Physical` of pyramid level ``level`` of OME series ``series``, or ``None``.

    ``None`` when the file has no OME-XML or the ``Image`` records no physical size. Axis
    names are tifffile's axes of the level, lowercased.
    """
    if xml is None:
        return None
    keyframe = series.keyframe
    index = keyframe.index if isinstance(keyframe.index, int) else keyframe.index[0]
    root = series.parent if series.parent is not None else keyframe.parent
    path, root_path = page_file(keyframe), str(root.filehandle.path)
    sizes = ome_pixel_sizes(xml, int(index), path, root_path, where)
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
