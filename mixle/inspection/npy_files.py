"""``.npy`` files: one array, described from its header alone."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes
from mixle.inspection.locations import is_remote, url_fs
from mixle.inspection.report import ArrayReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.redact import display_path

__all__ = ["inspect_npy"]


def inspect_npy(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> ArrayReport:
    """The array in the ``.npy`` file at ``location``, from its header and the file size."""
    if is_remote(location):
        fs, path = url_fs(location, storage_options)
        size = int(fs.size(path))
        with fs.open(path, "rb") as fh:
            header = _npy_header(fh, location)
    else:
        size = os.path.getsize(location)
        with open(location, "rb") as fh:
            header = _npy_header(fh, location)
    shape, fortran, dtype, offset = header
    nbytes = math.prod(shape) * dtype.itemsize
    stored = size - offset
    notes: list[LayoutFinding] = []
    if dtype.hasobject:
        notes.append(
            LayoutFinding("sizes-unknown", "info", "holds pickled Python objects: not mappable")
        )
    elif stored < nbytes:
        notes.append(
            LayoutFinding(
                "truncated",
                "warning",
                f"the file holds {format_bytes(stored)} of data, the header promises "
                f"{format_bytes(nbytes)}: it is truncated and cannot be read whole",
            )
        )
    report = ArrayReport(
        path="/",
        format="npy",
        shape=shape,
        dtype=str(dtype),
        layout="contiguous",
        chunks=None,
        shards=None,
        codecs=(),
        inner_codecs=(),
        compressed=False,
        fill_value=None,
        order="F" if fortran else "C",
        attributes=0,
        nbytes=nbytes,
        chunk_nbytes=None,
        chunks_in_grid=None,
        chunks_stored=None,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=None if dtype.hasobject else min(stored, nbytes),
    )
    return with_findings(report, patch, is_remote(location), notes)


def _npy_header(fh: Any, location: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` from a ``.npy`` header."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(fh)
    except ValueError as exc:
        raise UnsupportedStoreError(
            f"{display_path(location)!r} has a broken .npy header: {exc}"
        ) from None
    return tuple(int(s) for s in shape), bool(fortran), np.dtype(dtype), int(fh.tell())
