"""Opening a TIFF file with tifffile: arguments, the series and pyramid level, the memmap.

Opening parses the TIFF header, the first page's IFD and the series metadata only; no
image data is read. How many IFDs tifffile parses to find the series depends on the file:

- files tifffile wrote (``shaped``) and ImageJ hyperstacks are described from the first
  page; a further page's IFD is parsed when a chunk of that page is first read;
- OME-TIFF and other multi-page files (tifffile's ``uniform`` and ``generic`` series) make
  tifffile walk every IFD of the file at open (a cost that grows with the page count),
  still without reading any image data.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.reading import CorruptChunkError
from mixle.utils.files import require_regular_file
from mixle.utils.optional_deps import require

__all__ = [
    "contiguous_memmap",
    "level_files",
    "open_tiff",
    "page_file",
    "pick_level",
    "tiff_args",
    "tifffile_module",
]


def tifffile_module() -> Any:
    """``tifffile``, or an ``ImportError`` naming the ``tiff`` extra."""
    return require("tifffile", "tiff", feature="reading TIFF files")


def _index(value: object, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an int (0 is the first)")
    if value < 0:
        raise ValueError(f"{name}={value!r} must be >= 0 (0 is the first)")
    return int(value)


def tiff_args(path: object, series: object, level: object) -> dict[str, Any]:
    """The constructor arguments of a TIFF source, checked; no I/O."""
    if isinstance(path, str) and "://" in path and not path.startswith("file://"):
        raise ValueError(
            f"path={path!r} is a URL: TIFF files are read from local paths only for now; "
            "download the file first"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a path to a TIFF file (str or os.PathLike)")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"path={path!r} must be a str path, not bytes")
    if text.startswith("file://"):
        text = text[len("file://") :]
    return {"path": text, "series": _index(series, "series"), "level": _index(level, "level")}


def open_tiff(path: str) -> Any:
    """A ``tifffile.TiffFile`` of ``path``, read-only; only metadata is parsed."""
    tifffile = tifffile_module()
    try:
        require_regular_file(path, "TIFF file")
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"path={path!r}: no such file") from None
    try:
        return tifffile.TiffFile(path, mode="rb")
    except tifffile.TiffFileError as exc:
        raise ValueError(f"path={path!r} is not a TIFF file tifffile reads: {exc}") from None


def pick_level(tif: Any, series: int, level: int, path: str) -> tuple[Any, Any]:
    """``(series, level)`` tifffile ``TiffPageSeries`` of ``tif``; bad indices name the range."""
    try:
        found = tif.series
    except Exception as exc:  # tifffile's own checks of a damaged file
        raise ValueError(
            f"path={path!r} is a TIFF file whose image series tifffile cannot read: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not found:
        raise ValueError(f"path={path!r} holds no image series tifffile can read")
    if series >= len(found):
        raise ValueError(
            f"series={series} is out of range: {path!r} holds {len(found)} series "
            f"(0 to {len(found) - 1})"
        )
    base = found[series]
    levels = base.levels
    if level >= len(levels):
        raise ValueError(
            f"level={level} is out of range: series {series} of {path!r} has "
            f"{len(levels)} pyramid level{'s' if len(levels) != 1 else ''} "
            f"(0 to {len(levels) - 1})"
        )
    return base, levels[level]


def page_file(page: Any) -> str:
    """Absolute path of the file holding ``page`` (a multi-file OME-TIFF's other files)."""
    return str(page.parent.filehandle.path)


def level_files(tif: Any, level: Any) -> tuple[str, ...]:
    """Absolute paths of the files holding the pages of ``level``; ``tif``'s own first.

    tifffile lists every page of a series it parsed from OME-XML, Micro-Manager or ImageJ
    metadata, or by walking the IFDs (the only series whose pages can lie in other files);
    a series it lists by its first page only has its pages in that page's file.
    """
    files = {str(tif.filehandle.path): None}
    listed = getattr(level, "_pages", None)
    if isinstance(listed, list) and (len(listed) > 1 or len(level) <= 1):
        pages = [p for p in listed if p is not None]
    else:  # described by the first page: the others follow it in the same file
        pages = [level.keyframe]
    for page in pages:
        files.setdefault(page_file(page), None)
    return tuple(files)


def contiguous_memmap(
    path: str, level: Any, byteorder: str, files: tuple[str, ...]
) -> np.memmap | None:
    """A read-only memmap of a level stored uncompressed and contiguous, else ``None``.

    Uses tifffile's ``dataoffset`` (every page uncompressed, no predictor, fill order 1, one
    after the other in the file). ``files`` are :func:`level_files`: a level with pages in
    other files is never mapped. The array keeps the file's byte order.

    Raises
    ------
    CorruptChunkError
        When the file is shorter than the data the tags describe (cut short).
    """
    offset = level.dataoffset
    if offset is None or level.size == 0 or level.transform is not None:
        return None
    if len(files) > 1:  # pages in other files (tifffile's offset does not say which)
        return None
    dtype = np.dtype(level.dtype)
    if dtype.itemsize > 1:
        dtype = dtype.newbyteorder(byteorder)
    needed = int(offset) + level.size * dtype.itemsize
    size = os.path.getsize(path)
    if size < needed:
        raise CorruptChunkError(
            f"path={path!r} holds {size} bytes, but its uncompressed image data needs "
            f"{needed} (offset {offset} + {level.size * dtype.itemsize}): the file is cut short"
        )
    return np.memmap(path, dtype=dtype, mode="r", offset=int(offset), shape=level.shape)
