"""``.npy`` files: one array, described from its header alone."""

from __future__ import annotations

import ast
import math
import os
import struct
from typing import Any

import numpy as np

from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes
from mixle.inspection.locations import is_remote, open_head, url_fs
from mixle.inspection.report import ArrayReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.redact import display_path

__all__ = ["inspect_npy"]


def inspect_npy(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> ArrayReport:
    """The array in the ``.npy`` file at ``location``, from its header and the file size."""
    if is_remote(location):
        fs, path = url_fs(location, storage_options)
        with open_head(fs, path) as fh:
            size = int(fh.size)
            header = _npy_header(fh, location)
    else:
        size = os.path.getsize(location)
        with open(location, "rb") as fh:
            header = _npy_header(fh, location)
    shape, fortran, dtype, offset = header
    itemsize = None if dtype.hasobject else dtype.itemsize
    nbytes = None if itemsize is None else math.prod(shape) * itemsize
    stored = size - offset
    notes: list[LayoutFinding] = []
    if nbytes is None:
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
        itemsize=itemsize,
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
        decoded_bytes=None if nbytes is None else min(stored, nbytes),
        data_bytes=None if nbytes is None else min(stored, nbytes),
    )
    return with_findings(report, patch, is_remote(location), notes)


def _npy_header(fh: Any, location: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` from a ``.npy`` header (format 1, 2 or 3)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        elif version == (3, 0):
            shape, fortran, dtype = _npy_header_3_0(fh)
        else:
            raise ValueError(f"format version {version} is not 1.0, 2.0 or 3.0")
    except (ValueError, SyntaxError, KeyError, struct.error) as exc:
        raise UnsupportedStoreError(
            f"{display_path(location)!r} has a broken .npy header: {exc}"
        ) from None
    return tuple(int(s) for s in shape), bool(fortran), np.dtype(dtype), int(fh.tell())


def _npy_header_3_0(fh: Any) -> tuple[Any, Any, np.dtype]:
    """A format 3.0 header: format 2.0 with UTF-8 text (numpy reads it as latin-1)."""
    (length,) = struct.unpack("<I", fh.read(4))
    header = ast.literal_eval(fh.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"the header is not a dict: {header!r}")
    return header["shape"], header["fortran_order"], np.lib.format.descr_to_dtype(header["descr"])
