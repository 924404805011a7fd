"""Which files hold a NIfTI image: a single ``.nii`` / ``.nii.gz``, or a ``.hdr``/``.img`` pair.

Compression is told by the gzip magic bytes, not the name, so a ``.nii`` that is really
gzipped (or the reverse) is still read right. Only the header's own bytes are read
(``sizeof_hdr`` first, then the 348 or 540 header bytes and the extension flag; a gzipped
header by decompressing only that much): no byte of the data block.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from mixle.data.sources.arrays.nifti.header import NiftiHeader, header_size, parse_header
from mixle.errors import CorruptChunkError
from mixle.utils.files import open_regular_file, require_regular_file

__all__ = ["GZIP_MAGIC", "NiftiFiles", "is_gzipped", "locate", "read_head"]

#: The first two bytes of every gzip stream.
GZIP_MAGIC = b"\x1f\x8b"
#: Extensions of the two files of a pair (each may end in ``.gz`` too).
_PAIR = (".hdr", ".img")


@dataclass(frozen=True)
class NiftiFiles:
    """The header file and the data file of one image (the same file for ``.nii``)."""

    header: str
    data: str
    header_gz: bool
    data_gz: bool


def is_gzipped(path: str) -> bool:
    """Whether the regular file ``path`` starts with the gzip magic bytes."""
    with open_regular_file(path, "path") as fh:
        return fh.read(2) == GZIP_MAGIC


def _existing(path: str) -> str:
    try:
        require_regular_file(path, "path")
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"path={path!r}: no such file") from None
    return path


def _partner(path: str, stem: str, ext: str) -> str:
    """The other file of a pair: ``stem + ext`` or ``stem + ext + '.gz'``, whichever exists."""
    for candidate in (
        stem + ext,
        stem + ext + ".gz",
        stem + ext.upper(),
        stem + ext.upper() + ".GZ",
    ):
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"path={path!r} is one file of a NIfTI .hdr/.img pair, but its partner {stem + ext!r} "
        f"(or {stem + ext + '.gz'!r}) does not exist"
    )


def locate(path: str) -> NiftiFiles:
    """The files of the image at ``path`` (a ``.nii``, ``.nii.gz``, ``.hdr`` or ``.img``)."""
    _existing(path)
    lower = path.lower()
    base = lower[:-3] if lower.endswith(".gz") else lower
    stem = path[: len(base) - 4]
    if base.endswith(_PAIR):
        ext = base[-4:]
        other = _partner(path, stem, ".img" if ext == ".hdr" else ".hdr")
        header, data = (path, other) if ext == ".hdr" else (other, path)
        return NiftiFiles(header, data, is_gzipped(header), is_gzipped(data))
    gz = is_gzipped(path)
    return NiftiFiles(path, path, gz, gz)


def _bounded(path: str, gz: bool) -> Callable[[int], bytes]:
    """``read(n)``: the first ``n`` bytes of ``path`` (decompressed when ``gz``)."""

    def read(n: int) -> bytes:
        with open_regular_file(path, "path") as fh:
            if not gz:
                return fh.read(n)
            try:
                with gzip.GzipFile(fileobj=fh, mode="rb") as stream:
                    return stream.read(n)
            except (OSError, EOFError, zlib.error) as exc:
                raise CorruptChunkError(
                    f"path={path!r} is not a gzip stream that decompresses "
                    f"({type(exc).__name__}: {exc}): the file is corrupt or not gzip"
                ) from None

    return read


def read_head(files: NiftiFiles) -> NiftiHeader:
    """Parse the header of ``files``, reading only the header bytes (and extensions)."""
    read = _bounded(files.header, files.header_gz)
    what = f"path={files.header!r}"
    head = read(header_size(read(4), what))  # never a byte of the data block
    # single file or pair from the files found, as nibabel decides from the name
    return parse_header(head, what, more=read, single=files.header == files.data)
