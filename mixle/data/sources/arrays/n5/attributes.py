"""N5 ``attributes.json``: read within a bound, parsed, validated; datasets found below a group.

An N5 container is a folder tree; every group and dataset folder may hold an
``attributes.json``. A dataset's holds ``dimensions``, ``blockSize``, ``dataType`` and
``compression`` (``{"type": ...}``; containers older than N5 2.0 write ``compressionType``
instead, and no compression at all means raw). Axes are kept in the order N5 lists them,
fastest-varying first, as tensorstore's ``n5`` driver presents them: ``shape ==
tuple(dimensions)``, and element ``[i, j, k]`` is the one tensorstore reads there.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.errors import InvalidMetadataError, MetadataLimitError, UnsupportedStoreError
from mixle.utils.files import read_regular_file

__all__ = [
    "ATTRIBUTES_FILE",
    "COMPRESSIONS",
    "MAX_WALKED_FOLDERS",
    "N5_MAX_BLOCK_BYTES",
    "N5_DTYPES",
    "N5_METADATA_LIMIT",
    "N5_VERSION_MAJOR",
    "N5Metadata",
    "check_version",
    "find_datasets",
    "is_dataset_attributes",
    "parse_attributes",
    "parse_metadata",
    "read_attributes",
    "too_large",
]

#: The metadata file of every N5 group and dataset folder.
ATTRIBUTES_FILE = "attributes.json"
#: Bytes of one ``attributes.json`` mixle reads (the zarr metadata bound, reused).
N5_METADATA_LIMIT = ZARR_METADATA_LIMIT
#: The newest major version of the N5 format mixle reads (the ``"n5"`` key of the root).
N5_VERSION_MAJOR = 4
#: Folders a search for the datasets below a group visits at most.
MAX_WALKED_FOLDERS = 10_000
#: Deepest folder a search for datasets descends to, below the group.
_MAX_WALK_DEPTH = 64
#: N5 ``dataType`` names and their big-endian NumPy dtypes (N5 stores data big-endian).
N5_DTYPES = {
    "uint8": np.dtype("u1"),
    "uint16": np.dtype(">u2"),
    "uint32": np.dtype(">u4"),
    "uint64": np.dtype(">u8"),
    "int8": np.dtype("i1"),
    "int16": np.dtype(">i2"),
    "int32": np.dtype(">i4"),
    "int64": np.dtype(">i8"),
    "float32": np.dtype(">f4"),
    "float64": np.dtype(">f8"),
}
#: Compression ``type`` names of the N5 specification and its common extensions.
COMPRESSIONS = ("raw", "gzip", "bzip2", "xz", "blosc", "zstd", "lz4")
#: Bytes one decoded block may hold: 2 GiB, tensorstore's limit ("exceeds maximum chunk
#: size of 2GB"; measured: a block of exactly 2**31 bytes opens, one element more does
#: not, whatever the dtype), so mixle opens the datasets tensorstore opens. A block is
#: decoded whole (a block file smaller than its place fills a corner of zeros), so
#: ``blockSize`` bounds the memory of a read however small the files are; zarr's reader
#: bounds a chunk only by what NumPy can address, which lets a 2x2x2 read of a hostile
#: dataset ask for petabytes.
N5_MAX_BLOCK_BYTES = 2**31
#: The largest extent (and bytes of one block) NumPy's ``intp`` indexing can address.
_MAX_EXTENT = 2**63 - 1


@dataclass(frozen=True)
class N5Metadata:
    """A parsed N5 dataset: shape and block shape in N5's axis order, dtype, compression.

    Attributes
    ----------
    shape
        ``dimensions``, fastest-varying axis first (tensorstore's order).
    blocks
        ``blockSize``, in the same order.
    stored_dtype
        The big-endian dtype of stored elements.
    compression
        The ``compression`` object, with ``type`` always present.
    attributes
        Every key of ``attributes.json``.
    """

    shape: tuple[int, ...]
    blocks: tuple[int, ...]
    stored_dtype: np.dtype
    compression: dict[str, Any]
    attributes: dict[str, Any]

    @property
    def dtype(self) -> np.dtype:
        """The native-endian dtype reads return."""
        return self.stored_dtype.newbyteorder("=")

    @property
    def grid(self) -> tuple[int, ...]:
        """Blocks per axis."""
        return tuple(-(-s // b) for s, b in zip(self.shape, self.blocks))

    @property
    def block_nbytes(self) -> int:
        """Decoded bytes of one whole block."""
        return math.prod(self.blocks) * self.stored_dtype.itemsize


def read_attributes(folder: str) -> dict[str, Any] | None:
    """The JSON object in ``folder/attributes.json``, or ``None`` when there is none.

    Raises
    ------
    SpecialFileError
        When it is a FIFO, device, socket or folder (nothing read).
    MetadataLimitError
        When it is longer than :data:`N5_METADATA_LIMIT` bytes (at most that many plus one
        are read) or nested too deeply to parse.
    InvalidMetadataError
        When it is not UTF-8 JSON holding an object.
    """
    path = os.path.join(folder, ATTRIBUTES_FILE)
    try:
        data = read_regular_file(path, "N5 attributes", limit=N5_METADATA_LIMIT)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        raise too_large(path) from None
    return parse_attributes(data, path)


def too_large(path: str) -> MetadataLimitError:
    """The error for an ``attributes.json`` past :data:`N5_METADATA_LIMIT` bytes."""
    return MetadataLimitError(
        f"N5 attributes {path!r} is larger than N5_METADATA_LIMIT={N5_METADATA_LIMIT:,} "
        "bytes: not read (N5 attributes are JSON of a few KiB)"
    )


def parse_attributes(data: bytes, path: str) -> dict[str, Any]:
    """The JSON object in ``data``, the bytes of the ``attributes.json`` at ``path``.

    Raises
    ------
    MetadataLimitError
        When it nests too deeply to parse.
    InvalidMetadataError
        When it is not UTF-8 JSON holding an object.
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidMetadataError(f"N5 attributes {path!r} is not UTF-8 text: damaged") from None
    except RecursionError:
        raise MetadataLimitError(
            f"N5 attributes {path!r} nests lists or objects too deeply to parse"
        ) from None
    except ValueError as exc:
        raise InvalidMetadataError(
            f"N5 attributes {path!r} is not valid JSON ({exc}): truncated or damaged"
        ) from None
    if not isinstance(value, dict):
        raise InvalidMetadataError(
            f"N5 attributes {path!r} holds a JSON {type(value).__name__}, not an object"
        )
    return value


def check_version(attrs: dict[str, Any] | None, where: str) -> None:
    """Refuse a container whose ``"n5"`` version is newer than :data:`N5_VERSION_MAJOR`.

    Its blocks may be laid out in a way this reader does not know (the N5 libraries refuse
    them too). A missing version passes; an unparseable one is refused.

    Raises
    ------
    UnsupportedStoreError
        Naming the container and its version.
    """
    version = None if attrs is None else attrs.get("n5")
    if version is None:
        return
    major = version.split(".")[0] if isinstance(version, str) else ""
    if not major.isascii() or not major.isdigit() or int(major) > N5_VERSION_MAJOR:
        raise UnsupportedStoreError(
            f"N5 container {where} has version n5={version!r}; mixle reads N5 format "
            f"versions up to {N5_VERSION_MAJOR}.x"
        )


def is_dataset_attributes(attrs: dict[str, Any] | None) -> bool:
    """Whether ``attrs`` describe a dataset (``dimensions``, ``blockSize``, ``dataType``)."""
    return attrs is not None and all(k in attrs for k in ("dimensions", "blockSize", "dataType"))


def _extents(attrs: dict[str, Any], name: str, low: int, where: str) -> tuple[int, ...]:
    values = attrs.get(name)
    ok = isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v <= _MAX_EXTENT for v in values
    )
    if not ok:
        raise InvalidMetadataError(
            f"N5 dataset {where}: {name}={values!r} must be a list of ints from {low} to "
            "2**63 - 1 (damaged attributes.json)"
        )
    return tuple(values)


def _compression(attrs: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``compression`` object, from the old ``compressionType`` key too (none: raw)."""
    comp = attrs.get("compression")
    if comp is None:
        old = attrs.get("compressionType", "raw")
        if not isinstance(old, str):
            raise InvalidMetadataError(
                f"N5 dataset {where}: compressionType={old!r} must be a string"
            )
        return {"type": old}
    if not isinstance(comp, dict) or not isinstance(comp.get("type"), str):
        raise InvalidMetadataError(
            f"N5 dataset {where}: compression={comp!r} must be an object with a string 'type'"
        )
    return dict(comp)


def parse_metadata(attrs: dict[str, Any], where: str) -> N5Metadata:
    """Validate the attributes of a dataset (:func:`is_dataset_attributes`).

    Raises
    ------
    InvalidMetadataError
        When an extent is not an int (or out of range), ``blockSize`` has not one entry per
        dimension or blocks of more than :data:`N5_MAX_BLOCK_BYTES` bytes, ``dataType`` is not
        an N5 numeric type, or ``compression`` is malformed; the message names the
        dataset, the key and the value.
    """
    shape = _extents(attrs, "dimensions", 0, where)
    blocks = _extents(attrs, "blockSize", 1, where)
    if len(blocks) != len(shape):
        raise InvalidMetadataError(
            f"N5 dataset {where}: blockSize={list(blocks)} has {len(blocks)} entries but "
            f"dimensions={list(shape)} has {len(shape)}"
        )
    name = attrs.get("dataType")
    stored = N5_DTYPES.get(name) if isinstance(name, str) else None
    if stored is None:
        raise InvalidMetadataError(
            f"N5 dataset {where}: dataType={name!r} is not one mixle reads; it reads "
            f"{', '.join(N5_DTYPES)}"
        )
    if math.prod(blocks) * stored.itemsize > _MAX_EXTENT or math.prod(shape) > _MAX_EXTENT:
        raise InvalidMetadataError(
            f"N5 dataset {where}: dimensions={list(shape)}, blockSize={list(blocks)} hold "
            "more elements than NumPy can address (damaged attributes.json)"
        )
    if math.prod(blocks) * stored.itemsize > N5_MAX_BLOCK_BYTES:
        raise InvalidMetadataError(
            f"N5 dataset {where}: blockSize={list(blocks)} of dataType={name!r} makes "
            f"blocks of {math.prod(blocks) * stored.itemsize:,} bytes, more than "
            f"N5_MAX_BLOCK_BYTES={N5_MAX_BLOCK_BYTES:,} (2 GiB, tensorstore's limit too); "
            "every read decodes whole blocks, so it is not opened (damaged attributes.json?)"
        )
    return N5Metadata(shape, blocks, stored, _compression(attrs, where), attrs)


def find_datasets(root: str, limit: int = MAX_WALKED_FOLDERS) -> tuple[list[str], bool]:
    """``"name shape dtype"`` of every dataset below the group folder ``root``, and whether
    the search stopped early (more than ``limit`` folders, or deeper than 64).

    Dataset folders are not descended into (their subfolders are blocks); folders are not
    followed through symlinks; a folder whose ``attributes.json`` cannot be read is skipped.
    """
    found: list[str] = []
    pending: list[tuple[str, int]] = [("", 0)]
    visited, stopped = 0, False
    while pending:
        rel, depth = pending.pop()
        visited += 1
        if visited > limit or depth > _MAX_WALK_DEPTH:
            stopped = True
            break
        folder = os.path.join(root, rel) if rel else root
        if rel:
            try:
                attrs = read_attributes(folder)
            except (OSError, ValueError):
                continue
            if is_dataset_attributes(attrs):
                assert attrs is not None
                try:
                    meta = parse_metadata(attrs, repr(rel))
                    found.append(f"{rel} {meta.shape} {meta.dtype}")
                except InvalidMetadataError:
                    found.append(f"{rel} (unreadable attributes.json)")
                continue
        try:
            with os.scandir(folder) as entries:
                names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
        for name in reversed(names):
            pending.append((f"{rel}/{name}" if rel else name, depth + 1))
    return sorted(found), stopped
