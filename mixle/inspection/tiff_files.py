"""TIFF, BigTIFF and OME-TIFF files: series, pyramid levels, tiles or strips, compression.

Everything comes from the TIFF structure (IFDs and tags, through tifffile); no image data
is read or decoded.
"""

from __future__ import annotations

import math
import os
from typing import Any

from mixle.data.sources.arrays.tiff.chunks import SegmentLayout
from mixle.data.sources.arrays.tiff.opening import level_files, open_tiff
from mixle.inspection.findings import LARGE_CHUNK_BYTES, SMALL_CHUNK_BYTES, with_findings
from mixle.inspection.formatting import format_bytes, plain_value, shape_text
from mixle.inspection.locations import is_remote
from mixle.inspection.patches import DEFAULT_PATCH_EDGE
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.redact import display_path

__all__ = ["MAX_COUNTED_PAGES", "TIFF_MAGICS", "inspect_tiff", "is_tiff"]

#: The first four bytes of a TIFF (``II*\0``, ``MM\0*``) or BigTIFF (``II+\0``, ``MM\0+``).
TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
#: Series with more pages than this are not walked page by page to count stored tiles
#: (each page's IFD is parsed to count them): their stored sizes are reported unknown.
MAX_COUNTED_PAGES = 10_000
#: Tile edge suggested when re-tiling a stripped image (a power of two, as TIFF requires
#: multiples of 16).
SUGGESTED_TILE_EDGE = 256


def is_tiff(head: bytes) -> bool:
    """Whether ``head`` (the first bytes of a file) starts like a TIFF or BigTIFF file."""
    return bytes(head[:4]) in TIFF_MAGICS


def inspect_tiff(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> ArrayReport | GroupReport:
    """The series and pyramid levels of the local TIFF file at ``location``.

    One series of one level is an :class:`ArrayReport` at ``"/"``; otherwise a
    :class:`GroupReport` with a group ``"/series<s>"`` per series holding one array
    ``"/series<s>/level<l>"`` per pyramid level.

    Raises
    ------
    UnsupportedStoreError
        When ``location`` is a URL (TIFF is inspected locally only) or tifffile cannot
        parse the file.
    """
    shown = display_path(location)
    if is_remote(location):
        raise UnsupportedStoreError(
            f"{shown!r}: TIFF files are inspected from local paths only for now"
        )
    try:
        tif = open_tiff(location)
    except ValueError as exc:
        raise UnsupportedStoreError(str(exc)) from None
    with tif:
        try:
            found = tif.series
        except Exception as exc:
            raise UnsupportedStoreError(
                f"{shown!r} looks like a TIFF file but tifffile cannot read its series: {exc}"
            ) from None
        if not found:
            raise UnsupportedStoreError(
                f"{shown!r} starts like a TIFF file but holds no image series tifffile reads"
            )
        kind = "ome-tiff" if tif.is_ome else "bigtiff" if tif.is_bigtiff else "tiff"
        if len(found) == 1 and len(found[0].levels) == 1:
            return _level_report(tif, found[0], "/", kind, patch)
        groups = []
        for s, series in enumerate(found):
            arrays = tuple(
                _level_report(tif, level, f"/series{s}/level{k}", kind, patch)
                for k, level in enumerate(series.levels)
            )
            groups.append(GroupReport(f"/series{s}", kind, 0, arrays))
        return GroupReport("/", kind, 0, tuple(groups))


def _codecs(keyframe: Any) -> tuple[str, ...]:
    """The stored encoding: the compression, then the predictor if any."""
    codecs: list[str] = []
    compression = int(keyframe.compression)
    if compression != 1:
        codecs.append(_enum_name(keyframe.compression))
    if int(keyframe.predictor) != 1:
        codecs.append(f"predictor({_enum_name(keyframe.predictor)})")
    if int(keyframe.fillorder) != 1:
        codecs.append("fillorder(lsb2msb)")
    return tuple(codecs)


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name).lower() if name else str(int(value))


def _level_report(
    tif: Any, level: Any, path: str, kind: str, patch: tuple[int, ...] | None
) -> ArrayReport:
    keyframe = level.keyframe
    shape = tuple(int(n) for n in level.shape)
    dtype = level.dtype
    itemsize = int(dtype.itemsize)
    nbytes = math.prod(shape) * itemsize
    notes: list[LayoutFinding] = []
    files = level_files(tif, level)
    mapped = level.dataoffset is not None and level.transform is None and len(files) == 1
    chunks: tuple[int, ...] | None = None
    layout = "contiguous"
    chunk_nbytes = grid = stored_chunks = None
    stored: int | None = nbytes if mapped else None
    decoded: int | None = nbytes if mapped else None
    if not mapped and math.prod(shape):
        try:
            segments = SegmentLayout(shape, keyframe, len(level))
        except (NotImplementedError, ValueError) as exc:
            notes.append(LayoutFinding("sizes-unknown", "info", f"not read by mixle: {exc}"))
        else:
            layout = "chunked"
            chunks = segments.chunks
            chunk_nbytes = math.prod(chunks) * itemsize
            grid = len(level) * math.prod(segments.grid)
            counted = _stored_segments(level)
            if counted is None:
                notes.append(
                    LayoutFinding(
                        "sizes-unknown",
                        "info",
                        f"{len(level):,} pages (> MAX_COUNTED_PAGES={MAX_COUNTED_PAGES:,}): "
                        "stored tiles not counted",
                    )
                )
            else:
                stored_chunks, stored = counted
                # a tile decodes whole: the slices of a volumetric tile past a one-slice
                # image too, which its chunk leaves out
                decoded = stored_chunks * segments.segment_size * itemsize
        notes.extend(_tile_findings(keyframe, shape, itemsize, patch))
    if len(files) > 1:
        names = ", ".join(repr(os.path.basename(f)) for f in files[:4])
        more = f" and {len(files) - 4:,} more" if len(files) > 4 else ""
        notes.append(
            LayoutFinding(
                "multi-file",
                "info",
                f"its pages are stored in {len(files):,} files ({names}{more}), which "
                "must stay beside this one; stored sizes count them all",
            )
        )
    if mapped:
        notes.append(
            LayoutFinding(
                "memory-mapped",
                "info",
                "uncompressed and contiguous in the file: mixle memory-maps it (no decoding)",
            )
        )
    report = ArrayReport(
        path=path,
        format=kind,
        shape=shape,
        dtype=str(dtype),
        itemsize=itemsize,
        layout=layout,
        chunks=chunks,
        shards=None,
        codecs=_codecs(keyframe),
        inner_codecs=(),
        compressed=int(keyframe.compression) != 1,
        fill_value=plain_value(keyframe.nodata),
        order="C",
        attributes=0,
        nbytes=nbytes,
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=grid,
        chunks_stored=stored_chunks,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=decoded,
        data_bytes=nbytes if stored_chunks is None or stored_chunks == grid else None,
    )
    return with_findings(report, patch, False, notes)


def _stored_segments(level: Any) -> tuple[int, int] | None:
    """``(segments stored, bytes stored)`` over every page of ``level``; ``None``: too many."""
    if len(level) > MAX_COUNTED_PAGES:
        return None
    count = total = 0
    for page in level:
        if page is None:
            continue
        for offset, size in zip(page.dataoffsets, page.databytecounts):
            if offset and size:
                count += 1
                total += int(size)
    return count, total


def _tile_findings(
    keyframe: Any, shape: tuple[int, ...], itemsize: int, patch: tuple[int, ...] | None
) -> list[LayoutFinding]:
    """What the tile or strip layout means for patch reads, and how to re-tile."""
    found: list[LayoutFinding] = []
    width, length = int(keyframe.imagewidth), int(keyframe.imagelength)
    samples = int(keyframe.samplesperpixel) if int(keyframe.planarconfig) == 1 else 1
    tile = tuple(min(SUGGESTED_TILE_EDGE, -(-n // 16) * 16) for n in (length, width))
    fix = f"re-tile it, e.g. tifffile.imwrite(..., tile={tile}) (tile edges are multiples of 16)"
    edge = DEFAULT_PATCH_EDGE if patch is None else max(patch[-2:], default=DEFAULT_PATCH_EDGE)
    if not keyframe.is_tiled:
        rows = min(int(keyframe.rowsperstrip), length)
        strip = rows * width * samples * itemsize
        if width <= edge:
            return found
        severity = "warning" if width >= 2 * edge else "info"
        found.append(
            LayoutFinding(
                "whole-row-strips",
                severity,
                f"stored in strips of {rows} whole rows ({width} pixels wide, "
                f"{format_bytes(strip)} decoded each): a {edge}-pixel-wide patch decodes "
                f"{width / min(edge, width):.3g}x the columns it uses; {fix}",
            )
        )
        return found
    tile_shape = (int(keyframe.tilelength), int(keyframe.tilewidth))
    nbytes = math.prod(tile_shape) * int(keyframe.tiledepth) * samples * itemsize
    small = nbytes < SMALL_CHUNK_BYTES and (length > tile_shape[0] or width > tile_shape[1])
    if small or nbytes > LARGE_CHUNK_BYTES:
        found.append(
            LayoutFinding(
                "tile-size",
                "info",
                f"tiles of {shape_text(tile_shape)} ({format_bytes(nbytes)} decoded) are "
                f"outside {format_bytes(SMALL_CHUNK_BYTES)}-{format_bytes(LARGE_CHUNK_BYTES)}"
                f"; {fix}",
            )
        )
    return found
