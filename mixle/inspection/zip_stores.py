"""zarr stores in a local zip file: the report of :mod:`~mixle.inspection.zarr_stores`, with
what the zip itself adds (members compressed by the zip on top of zarr's codecs).

Only the zip's central directory and its metadata members are read; chunk members never
are (their sizes come from the central directory), and the zip is opened read-only.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import zipfile
from collections import Counter
from typing import Any

from mixle.data.sources.arrays.zarr.by_path import check_zip_holds_zarr, zip_store_folder
from mixle.data.sources.arrays.zarr.zip_members import zip_file_of
from mixle.inspection.limits import (
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    MetadataLimitError,
    json_depth,
    parse_metadata,
)
from mixle.inspection.locations import ZARR_METADATA, is_remote
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.inspection.zarr_stores import _zarr_node
from mixle.utils.files import open_regular_file, require_regular_file
from mixle.utils.redact import display_path

__all__ = ["inspect_zarr_zip", "is_zarr_zip", "map_arrays"]

#: Zip compressions mixle reads by position from many threads at once (others: zipfile's).
_READ_BY_POSITION = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
#: Metadata members that make a folder a zarr node (``.zattrs`` alone does not).
_NODE_FILES = frozenset({"zarr.json", ".zarray", ".zgroup"})
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_COMPRESSION_NAMES = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}


def is_zarr_zip(location: str) -> bool:
    """Whether ``location`` is a local zip file with zarr metadata among its members.

    Reads the first bytes and the central directory, never a member. A ``.npz`` archive
    (``.npy`` members, no zarr metadata) is not one.
    """
    if is_remote(location):
        return False
    try:
        require_regular_file(location, "path")
        with open_regular_file(location, "path") as fh:
            if not fh.read(4).startswith(_ZIP_MAGICS):
                return False
        with zipfile.ZipFile(location) as zf:
            names = zf.namelist()
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return any(n.rsplit("/", 1)[-1] in ZARR_METADATA for n in names)


def inspect_zarr_zip(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport | ArrayReport:
    """The root node (group or array) of the zarr store zipped at ``location``, read-only.

    A store zipped with its folder is reported from that folder: its root node's path is
    ``/<folder>`` and every path below is the ``component=`` :func:`~mixle.read_zarr` takes.

    Parameters
    ----------
    location
        A local path of a zip file.
    storage_options
        Must be ``None`` (local files only).
    patch
        As for :func:`~mixle.inspection.inspect_store`.

    Raises
    ------
    UnsupportedStoreError
        The zip holds no zarr store at its root nor in the one folder all its members sit
        in (a store zipped with its folder, ``zip -r x.zip x.zarr``: reported from that
        folder, with a ``zip-folder`` finding), or zarr cannot open it. The message lists
        members and, where a store sits deeper, the ``read_zarr`` call that reads it.
    MetadataLimitError
        A metadata member is larger than :data:`MAX_METADATA_BYTES` or nests deeper than
        :data:`MAX_METADATA_DEPTH` (refused from its size in the central directory, or
        before zarr parses it).
    InvalidMetadataError
        A metadata member is not a JSON object.
    """
    from mixle.utils.optional_deps import require

    zarr = require("zarr", "zarr", feature="mixle inspect")
    if storage_options:
        raise ValueError("storage_options only apply to URLs; a zipped zarr store is local")
    shown = display_path(location)
    store = _sized_zip_store_type()(location, mode="r")
    try:
        zf = zip_file_of(store)
        names = zf.namelist()
        folder = None if _root_metadata_in(names) else zip_store_folder(names)
        if folder is None:
            check_zip_holds_zarr(names, shown, None, zf, for_inspect=True)
        _check_metadata_members(zf, shown)
        try:
            node = zarr.open(store=store, path=folder or "", mode="r")
        except RecursionError:
            raise MetadataLimitError(
                f"{shown!r} holds zarr metadata nested too deep to parse "
                f"(more than Python's recursion limit of {sys.getrecursionlimit()})"
            ) from None
        except (FileNotFoundError, ValueError, TypeError, AttributeError) as exc:
            raise UnsupportedStoreError(
                f"{shown!r} holds zarr metadata but zarr cannot open it: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        root = _zarr_node(zarr, node, f"/{folder or ''}", patch, False, shown, None, False)
        infos = zf.infolist()
        root = map_arrays(root, lambda array: _with_zip_findings(array, infos))
        if folder is None:
            return root
        note = LayoutFinding(
            "zip-folder",
            "info",
            f"the store was zipped with its folder: every member sits in {folder!r}, which "
            f"holds the store's root, so paths here start with /{folder} and read_zarr "
            f"takes component='{folder}/<array>'; zipping the folder's contents instead "
            f"(cd {folder} && zip -0 -r ../store.zip .) puts the store at the zip's root",
        )
        return dataclasses.replace(root, findings=(note, *root.findings))
    finally:
        store.close()


def _root_metadata_in(names: list[str]) -> bool:
    """Whether a zip's members include zarr metadata at the zip's root."""
    return any(name in _NODE_FILES for name in names)


def map_arrays(node: GroupReport | ArrayReport, change: Any) -> GroupReport | ArrayReport:
    """``node`` with ``change(array)`` in place of every array report below it."""
    if isinstance(node, ArrayReport):
        return change(node)  # type: ignore[no-any-return]
    children = tuple(map_arrays(child, change) for child in node.children)
    return dataclasses.replace(node, children=children)


def _check_metadata_members(zf: zipfile.ZipFile, shown: str) -> None:
    """Refuse metadata members too large or too deep before zarr parses them."""
    for info in zf.infolist():
        if info.filename.rsplit("/", 1)[-1] not in ZARR_METADATA or info.is_dir():
            continue
        name = f"{shown}/{info.filename}"
        if info.file_size > MAX_METADATA_BYTES:
            raise MetadataLimitError(
                f"zarr metadata {name!r} is larger than MAX_METADATA_BYTES="
                f"{MAX_METADATA_BYTES:,} bytes: not read (zarr metadata is JSON of a few KiB)"
            )
        with zf.open(info) as member:
            data = member.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            raise MetadataLimitError(
                f"zarr metadata {name!r} inflates past MAX_METADATA_BYTES="
                f"{MAX_METADATA_BYTES:,} bytes: not parsed"
            )
        depth = json_depth(data)
        if depth > MAX_METADATA_DEPTH:
            raise MetadataLimitError(
                f"zarr metadata {name!r} nests lists or objects {depth:,} deep, deeper than "
                f"MAX_METADATA_DEPTH={MAX_METADATA_DEPTH}: not parsed (flatten its attributes)"
            )
        parse_metadata(data, name)


def _with_zip_findings(array: ArrayReport, infos: list[zipfile.ZipInfo]) -> ArrayReport:
    """``array`` with a finding on how the zip itself compresses its chunk members."""
    prefix = array.path.strip("/")
    prefix = f"{prefix}/" if prefix else ""
    kinds = Counter(
        i.compress_type
        for i in infos
        if i.filename.startswith(prefix)
        and not i.is_dir()
        and i.filename.rsplit("/", 1)[-1] not in ZARR_METADATA
    )
    found: list[LayoutFinding] = []
    others = {k: n for k, n in kinds.items() if k not in _READ_BY_POSITION}
    if others:
        names = ", ".join(
            f"{n} {_COMPRESSION_NAMES.get(k, f'method {k}')}" for k, n in others.items()
        )
        found.append(
            LayoutFinding(
                "zip-compression",
                "warning",
                f"chunk members compressed by the zip itself ({names}) are read through "
                "Python's zipfile one at a time; rezip the store with no compression "
                "(zip -0 -r, or zipfile.ZIP_STORED) so chunks are read by position in parallel",
            )
        )
    deflated = kinds.get(zipfile.ZIP_DEFLATED, 0)
    if deflated:
        twice = array.compressed
        found.append(
            LayoutFinding(
                "zip-deflated",
                "warning" if twice else "info",
                f"{deflated} chunk members are deflated by the zip"
                + (
                    " on top of zarr's own compression: every chunk read inflates it first, "
                    "for little gain; rezip the store with no compression (zip -0 -r)"
                    if twice
                    else " (zarr's codecs do not compress): every chunk read inflates it; "
                    "a zarr compressor (zstd, blosc) in the array instead decodes faster"
                ),
            )
        )
    if not found:
        return array
    return dataclasses.replace(array, findings=(*array.findings, *found))


@functools.cache
def _sized_zip_store_type() -> type:
    """zarr's ``ZipStore`` whose ``getsize`` answers from the central directory (unread)."""
    from zarr.storage import ZipStore

    class SizedZipStore(ZipStore):  # type: ignore[misc]
        """A read-only ``ZipStore``; ``getsize`` never reads the member (zarr's does)."""

        async def getsize(self, key: str) -> int:
            try:
                return int(zip_file_of(self).getinfo(key).file_size)
            except KeyError:
                raise FileNotFoundError(key) from None

    return SizedZipStore
