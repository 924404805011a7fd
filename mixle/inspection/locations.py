"""Telling local paths from URLs, and what kind of file starts with which bytes."""

from __future__ import annotations

from typing import Any

__all__ = [
    "HDF5_MAGIC",
    "HEAD_READ_BYTES",
    "NPY_MAGIC",
    "ZARR_METADATA",
    "is_remote",
    "open_head",
    "url_fs",
]

#: Metadata objects of zarr stores (everything else in an array's folder is a chunk or shard).
ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})
NPY_MAGIC = b"\x93NUMPY"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
#: Bytes one request fetches when reading the start of a remote file (magic numbers, a
#: ``.npy`` header); fsspec's default read-ahead would fetch megabytes of array data.
HEAD_READ_BYTES = 64 * 1024


def url_fs(location: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """``(filesystem, path)`` for an fsspec URL."""
    from mixle.utils.optional_deps import require

    require("fsspec", "remote", feature="mixle inspect on URLs")
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]

    return url_to_fs(location, **(storage_options or {}))


def open_head(fs: Any, path: str) -> Any:
    """``path`` opened for reading its first bytes, in requests of :data:`HEAD_READ_BYTES`."""
    return fs.open(path, "rb", block_size=HEAD_READ_BYTES, cache_type="readahead")


def is_remote(location: str) -> bool:
    """Whether ``location`` is a URL other than ``file://``."""
    return "://" in location and not location.startswith("file://")
