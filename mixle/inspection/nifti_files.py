"""NIfTI images (``.nii``, ``.nii.gz``, ``.hdr``/``.img``): one array, described from its header.

Only the header is read (a gzipped one by decompressing its first bytes); the data block
is never read or decompressed.
"""

from __future__ import annotations

import gzip
import os
from typing import Any

import numpy as np

from mixle.data.sources.arrays.nifti.files import GZIP_MAGIC, locate, read_head
from mixle.data.sources.arrays.nifti.gz_cache import CACHE_FOLDER, find_cached
from mixle.data.sources.arrays.nifti.header import NiftiHeader, physical_of
from mixle.data.sources.arrays.nifti.scaling import scaling_of
from mixle.data.sources.records.text.row_index import cache_dir
from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes, shape_text
from mixle.inspection.locations import is_remote
from mixle.inspection.report import ArrayReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.files import open_regular_file
from mixle.utils.redact import display_path

__all__ = ["inspect_nifti", "is_nifti"]

#: Bytes of a header is_nifti decompresses or reads: enough for either version's magic.
_SNIFF_BYTES = 348
#: What the header's transform codes mean for the affine nibabel picks.
_TRANSFORM = {"sform": "the sform", "qform": "the qform", "base": "pixdim only (no transform)"}


def _looks_like_nifti(head: bytes) -> bool:
    """Whether ``head`` starts with a NIfTI-1 or NIfTI-2 header (either byte order)."""
    if len(head) < 8:
        return False
    size_le, size_be = int.from_bytes(head[:4], "little"), int.from_bytes(head[:4], "big")
    if 540 in (size_le, size_be):
        return head[4:8] in (b"n+2\0", b"ni2\0")
    if 348 in (size_le, size_be):
        return len(head) >= 348 and head[344:348] in (b"n+1\0", b"ni1\0")
    return False


def _sniff(path: str) -> bytes:
    with open_regular_file(path, "path") as fh:
        if fh.read(2) != GZIP_MAGIC:
            fh.seek(0)
            return fh.read(_SNIFF_BYTES)
        fh.seek(0)
        with gzip.GzipFile(fileobj=fh, mode="rb") as stream:
            return stream.read(_SNIFF_BYTES)


def is_nifti(location: str) -> bool:
    """Whether the local file ``location`` is a NIfTI image (by its header bytes, not its name).

    A ``.img`` is looked at through its ``.hdr``. Reads at most a few hundred bytes
    (decompressed, for gzip); answers ``False`` for URLs, folders, missing or unreadable
    files and anything whose header is not NIfTI-1/NIfTI-2. Needs no nibabel.
    """
    if not isinstance(location, (str, os.PathLike)):
        return False
    location = os.fspath(location)
    if is_remote(location) or not os.path.isfile(location):
        return False
    try:
        header = locate(location).header
        return _looks_like_nifti(_sniff(header))
    except (OSError, EOFError, ValueError):
        return False


def _transform(header: Any) -> str:
    if int(header["sform_code"]) != 0:
        return "sform"
    if int(header["qform_code"]) != 0:
        return "qform"
    return "base"


def _findings(
    info: NiftiHeader, gz_path: str | None, cached: bool, location: str
) -> list[LayoutFinding]:
    found: list[LayoutFinding] = []
    if gz_path is not None:
        folder = cache_dir() / CACHE_FOLDER
        where = (
            "a decompressed copy is already cached: opens map it"
            if cached
            else "none is cached yet"
        )
        found.append(
            LayoutFinding(
                "gzip-whole-file",
                "info",
                f"gzipped: gzip cannot seek, so read_nifti's first open decompresses the whole "
                f"file ({format_bytes(info.end)}) once into the mixle cache {str(folder)!r} "
                f"(MIXLE_CACHE_DIR), using that much disk; later opens, in any process, map "
                f"the copy (a stat and a few small reads); {where}. Store it as .nii (or "
                "chunked zarr) to read patches with no copy",
            )
        )
    try:
        scaling = scaling_of(info.header, info.dtype, f"{location!r}")
    except ValueError as exc:  # nibabel refuses these scale factors: reads do too
        found.append(LayoutFinding("scaled-values", "warning", f"{exc}; read_nifti refuses it"))
        scaling = None
    if scaling is not None and not scaling.trivial:
        found.append(
            LayoutFinding(
                "scaled-values",
                "info",
                f"the header scales values: real = stored * {scaling.slope:g} + "
                f"{scaling.inter:g} (scl_slope, scl_inter); read_nifti returns the raw stored "
                f"{info.dtype} values unless scale=True (then {scaling.dtype}, as nibabel's "
                "img.dataobj)",
            )
        )
    physical = physical_of(info.header, info.shape)
    if physical is None:
        found.append(
            LayoutFinding(
                "no-physical-space",
                "warning",
                "the header's voxel-to-world affine is singular or not finite: read_nifti "
                "gives no spacing or affine, and patch_size_mm cannot be used",
            )
        )
    else:
        best = info.header.get_best_affine()
        k = len(info.shape)
        oblique = (
            f"; the image is an oblique {k}-D plane of the 3-D world: src.affine gives its "
            "in-plane coordinates (true distances), src.nifti_affine nibabel's 4x4 for "
            "world positions"
            if k < 3 and np.any(best[k:3, :k])
            else ""
        )
        names = physical.axes or ()
        extra = [names[a] if a < len(names) else str(a) for a in range(3, len(info.shape))]
        long = [
            f"{n} ({info.shape[3 + i]} values)"
            for i, n in enumerate(extra)
            if info.shape[3 + i] != 1
        ]
        axes = f"axis {extra[0]} has" if len(extra) == 1 else f"axes {', '.join(extra)} have"
        if long:
            world = (
                f"; world=True and patch_size_mm= are refused for this image: its "
                f"ax{'is' if len(long) == 1 else 'es'} {', '.join(long)} after i, j, k "
                f"hold{'s' if len(long) == 1 else ''} more than one value, and they need "
                "the spatial axes last (a patch holds leading axes whole); pass patch_size= "
                "in voxels, or store it with those axes first"
            )
        elif extra:
            world = (
                f", and patch sizes can be asked in world units (patch_size_mm=) with world "
                f"positions (world=True) of i, j, k: {axes} length 1, which patches cover "
                "with extent 1"
            )
        else:
            world = ", and patch sizes can be asked in world units (patch_size_mm)"
        spacing = ", ".join(f"{s:.6g}" for s in physical.spacing)
        units = sorted({u for u in physical.units or () if u is not None})
        unit = f" {'/'.join(units)}" if units else " (units unknown)"
        found.append(
            LayoutFinding(
                "physical-space",
                "info",
                f"voxel spacing ({spacing}){unit} along axes {', '.join(physical.axes or ())}; "
                f"the affine comes from {_TRANSFORM[_transform(info.header)]} (as nibabel's "
                f"img.affine): src.spacing/src.affine give it{world}{oblique}",
            )
        )
    return found


def inspect_nifti(
    location: str, storage_options: dict[str, Any] | None, edges: tuple[int, ...] | None
) -> ArrayReport:
    """The image in the NIfTI file at ``location``, from its header and the file sizes.

    Raises
    ------
    UnsupportedStoreError
        For a URL (NIfTI is inspected on local files only) or a file that is not NIfTI.
    """
    if is_remote(location):
        raise UnsupportedStoreError(
            f"{display_path(location)!r}: NIfTI files are inspected locally only; copy it to "
            "a local disk first"
        )
    try:
        files = locate(location)
        info = read_head(files)
    except ValueError as exc:
        raise UnsupportedStoreError(str(exc)) from None
    size = os.path.getsize(files.data)
    notes: list[LayoutFinding] = []
    if files.data_gz:
        prefix = info.head if files.data == files.header else b""
        cached = find_cached(files.data, info.end, prefix) is not None
        notes += _findings(info, files.data, cached, location)
        stored, data = size, info.nbytes
    else:
        notes += _findings(info, None, False, location)
        stored = max(0, size - info.offset)
        data = min(stored, info.nbytes)
        if stored < info.nbytes:
            notes.append(
                LayoutFinding(
                    "truncated",
                    "warning",
                    f"the file holds {format_bytes(stored)} of data after vox_offset "
                    f"{info.offset}, the header promises {format_bytes(info.nbytes)} "
                    f"({shape_text(info.shape)} {info.dtype}): it is truncated and cannot be "
                    "read",
                )
            )
    report = ArrayReport(
        path="/",
        format=f"nifti-{info.version}",
        shape=info.shape,
        dtype=str(info.dtype),
        itemsize=info.dtype.itemsize,
        layout="contiguous",
        chunks=None,
        shards=None,
        codecs=("gzip",) if files.data_gz else (),
        inner_codecs=(),
        compressed=files.data_gz,
        fill_value=None,
        order="F",
        attributes=len(getattr(info.header, "extensions", ())),
        nbytes=info.nbytes,
        chunk_nbytes=None,
        chunks_in_grid=None,
        chunks_stored=None,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=data,
        data_bytes=data,
    )
    return with_findings(report, edges, False, notes)
