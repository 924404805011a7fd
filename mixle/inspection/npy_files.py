"""``.npy`` files: one array, described from its header alone."""

from __future__ import annotations

import ast
import math
import os
import struct
from typing import Any

import numpy as np

from mixle.errors import NpyHeaderTooLargeError
from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes
from mixle.inspection.locations import NPY_MAGIC, is_remote, open_head, url_fs
from mixle.inspection.report import ArrayReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.files import open_regular_file
from mixle.utils.redact import display_path

__all__ = ["MAX_NPY_HEADER_BYTES", "NpyHeaderTooLargeError", "inspect_npy"]

#: Longest ``.npy`` header read (NumPy's ``max_header_size`` default: ``np.load`` refuses
#: longer ones too). A hostile file can claim up to 4 GiB.
MAX_NPY_HEADER_BYTES = 10_000
#: ``struct`` format of the header length, by format version.
_LENGTH_FORMATS = {(1, 0): "<H", (2, 0): "<I", (3, 0): "<I"}


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
        with open_regular_file(location, "path") as fh:
            size = os.fstat(fh.fileno()).st_size
            header = _npy_header(fh, location)
    report, notes = npy_report(header, size - header[3], holder="the file")
    return with_findings(report, patch, is_remote(location), notes)


def npy_report(
    header: tuple[tuple[int, ...], bool, np.dtype, int],
    data: int,
    *,
    holder: str,
    path: str = "/",
    format: str = "npy",
    stored: int | None = None,
    codecs: tuple[str, ...] = (),
) -> tuple[ArrayReport, list[LayoutFinding]]:
    """The report of one ``.npy`` array (a file, or a ``.npz`` member) and its findings.

    ``header`` is :func:`_npy_header`'s; ``data`` the bytes after the header (decoded);
    ``stored`` the bytes it takes in storage (default ``data``); ``codecs`` what compresses
    it; ``holder`` names it in messages (``"the file"``, ``"the member"``).
    """
    shape, fortran, dtype, _ = header
    itemsize = None if dtype.hasobject else dtype.itemsize
    nbytes = None if itemsize is None else math.prod(shape) * itemsize
    notes: list[LayoutFinding] = []
    if nbytes is None:
        notes.append(
            LayoutFinding("sizes-unknown", "info", "holds pickled Python objects: not mappable")
        )
    elif data < nbytes:
        notes.append(
            LayoutFinding(
                "truncated",
                "warning",
                f"{holder} holds {format_bytes(data)} of data, its header promises "
                f"{format_bytes(nbytes)}: it is truncated and cannot be read whole",
            )
        )
    held = None if nbytes is None else min(data, nbytes)
    report = ArrayReport(
        path=path,
        format=format,
        shape=shape,
        dtype=str(dtype),
        itemsize=itemsize,
        layout="contiguous",
        chunks=None,
        shards=None,
        codecs=codecs,
        inner_codecs=(),
        compressed=bool(codecs),
        fill_value=None,
        order="F" if fortran else "C",
        attributes=0,
        nbytes=nbytes,
        chunk_nbytes=None,
        chunks_in_grid=None,
        chunks_stored=None,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=data if stored is None else stored,
        decoded_bytes=held,
        data_bytes=held,
    )
    return report, notes


def _npy_header(fh: Any, location: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` from a ``.npy`` header (format 1, 2 or 3).

    The header's length is checked against :data:`MAX_NPY_HEADER_BYTES` before it is read,
    so a file that claims a huge header costs no memory.
    """
    shown = display_path(location)
    try:
        magic = fh.read(len(NPY_MAGIC) + 2)
        if len(magic) < len(NPY_MAGIC) + 2 or not magic.startswith(NPY_MAGIC):
            raise ValueError("the file ends inside the magic string")
        version = (magic[-2], magic[-1])
        if version not in _LENGTH_FORMATS:
            raise ValueError(f"format version {version} is not 1.0, 2.0 or 3.0")
        length_format = _LENGTH_FORMATS[version]
        raw_length = fh.read(struct.calcsize(length_format))
        (length,) = struct.unpack(length_format, raw_length)
        if length > MAX_NPY_HEADER_BYTES:
            raise NpyHeaderTooLargeError(
                f"{shown!r} claims a .npy header of {length:,} bytes, more than "
                f"MAX_NPY_HEADER_BYTES={MAX_NPY_HEADER_BYTES:,} (NumPy's own limit): not read"
            )
        text = fh.read(length)
        if len(text) < length:
            raise ValueError(f"the file ends inside the {length:,}-byte header")
        encoding = "utf-8" if version == (3, 0) else "latin-1"
        header = ast.literal_eval(text.decode(encoding))
        if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
            raise ValueError("the header is not a dict of descr, fortran_order and shape")
        shape, fortran = header["shape"], header["fortran_order"]
        if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError(f"shape {shape!r} is not a tuple of ints >= 0")
        if not isinstance(fortran, bool):
            raise ValueError(f"fortran_order {fortran!r} is not a bool")
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except NpyHeaderTooLargeError:
        raise
    except (
        ValueError,
        SyntaxError,
        KeyError,
        TypeError,
        struct.error,
        RecursionError,
        MemoryError,
    ) as exc:
        raise UnsupportedStoreError(f"{shown!r} has a broken .npy header: {exc}") from None
    return (
        tuple(int(s) for s in shape),
        bool(fortran),
        np.dtype(dtype),
        len(magic) + len(raw_length) + length,
    )
