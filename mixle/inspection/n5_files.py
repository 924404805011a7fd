"""N5 containers on local disk: groups, datasets, their blocks and stored sizes.

Only metadata (``attributes.json``, read within
:data:`~mixle.data.sources.arrays.n5.attributes.N5_METADATA_LIMIT`) and the sizes of block
files (``stat``) are read; no block is opened.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Any

from mixle.data.sources.arrays.n5.attributes import (
    MAX_WALKED_FOLDERS,
    N5Metadata,
    check_version,
    is_dataset_attributes,
    parse_metadata,
    read_attributes,
)
from mixle.data.sources.arrays.n5.blocks import decompressor
from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import spell_codec
from mixle.inspection.limits import MAX_TREE_DEPTH, depth_of, too_deep_finding
from mixle.inspection.locations import is_remote
from mixle.inspection.patches import chunk_data_elements
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.redact import display_path

__all__ = ["MAX_PROBED_DEPTH", "MAX_PROBED_FOLDERS", "inspect_n5", "is_n5"]

#: A block's grid index as N5 names its folders and files (no sign, no leading zeros).
_GRID_INDEX = re.compile(r"0|[1-9][0-9]*")
#: Keys of a dataset's ``attributes.json`` that are N5's own, not user attributes.
_N5_KEYS = frozenset(
    {"dimensions", "blockSize", "dataType", "compression", "compressionType", "n5"}
)


#: Folders below one without ``attributes.json`` that :func:`is_n5` looks into, in all.
MAX_PROBED_FOLDERS = 32
#: How many levels below such a folder :func:`is_n5` looks for a dataset.
MAX_PROBED_DEPTH = 4


def is_n5(location: str) -> bool:
    """Whether ``location`` is a local N5 container, group or dataset folder.

    True for a folder whose ``attributes.json`` (read within the N5 metadata bound) holds
    an ``"n5"`` version or a dataset's ``dimensions``, ``blockSize`` and ``dataType``, and
    for a folder without ``attributes.json`` with a dataset below it, within
    :data:`MAX_PROBED_DEPTH` levels and the first :data:`MAX_PROBED_FOLDERS` folders
    (level by level, by name): tensorstore writes no ``attributes.json`` at the root or in
    the folders above a dataset when it is given the dataset's ``path``
    (``volumes/raw``). A URL, a file, a folder
    whose ``attributes.json`` cannot be read or parsed (a FIFO, too large, not JSON)
    answers ``False``; nothing else is read.
    """
    if is_remote(location) or not os.path.isdir(location):
        return False
    try:
        attrs = read_attributes(location)
    except (OSError, ValueError):
        return False
    if attrs is None:
        return _holds_a_dataset(location)
    return "n5" in attrs or is_dataset_attributes(attrs)


def _holds_a_dataset(folder: str) -> bool:
    """Whether an N5 dataset lies below ``folder``, within the probe's bounds.

    Breadth first, by name, down to :data:`MAX_PROBED_DEPTH` levels, reading at most
    :data:`MAX_PROBED_FOLDERS` folders' ``attributes.json``; a dataset's own folders (its
    blocks) are not entered.
    """
    level, probed = [folder], 0
    for _ in range(MAX_PROBED_DEPTH):
        below: list[str] = []
        for parent in level:
            try:
                with os.scandir(parent) as entries:
                    names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
            for name in names:
                if probed == MAX_PROBED_FOLDERS:
                    return False
                probed += 1
                sub = os.path.join(parent, name)
                try:
                    if is_dataset_attributes(read_attributes(sub)):
                        return True
                except (OSError, ValueError):
                    continue
                below.append(sub)
        level = below
    return False


def inspect_n5(
    location: str, storage_options: dict[str, Any] | None, edges: tuple[int, ...] | None
) -> GroupReport | ArrayReport:
    """The N5 group or dataset at the local folder ``location``, with findings.

    Raises
    ------
    UnsupportedStoreError
        ``location`` is a URL (mixle reads N5 from local folders only), or holds no
        ``attributes.json`` and no dataset below it within :data:`MAX_PROBED_DEPTH`
        levels and :data:`MAX_PROBED_FOLDERS` folders (a container tensorstore wrote with
        a dataset ``path`` has no ``attributes.json`` above the dataset: it is reported as
        a group).
    InvalidMetadataError, MetadataLimitError, SpecialFileError
        An ``attributes.json`` is damaged, too large or not a regular file (named).
    """
    shown = display_path(location)
    if is_remote(location) or storage_options:
        raise UnsupportedStoreError(
            f"{shown!r}: mixle inspects N5 containers in local folders only (copy it locally)"
        )
    attrs = read_attributes(location)
    if attrs is None and not _holds_a_dataset(location):
        raise UnsupportedStoreError(
            f"{shown!r} is not an N5 container: no attributes.json, and no N5 dataset "
            f"below it (MAX_PROBED_DEPTH={MAX_PROBED_DEPTH} levels, "
            f"MAX_PROBED_FOLDERS={MAX_PROBED_FOLDERS} folders looked into)"
        )
    report: GroupReport | ArrayReport
    if is_dataset_attributes(attrs):
        report = _dataset(location, "/", attrs, edges)
    else:
        report = _group(location, "/", attrs, edges, [MAX_WALKED_FOLDERS])
    try:
        check_version(attrs, repr(shown))
    except UnsupportedStoreError as exc:
        newer = LayoutFinding("unsupported-version", "warning", str(exc))
        report = replace(report, findings=(newer, *report.findings))
    return report


def _group(
    folder: str,
    path: str,
    attrs: dict[str, Any] | None,
    edges: tuple[int, ...] | None,
    budget: list[int],
) -> GroupReport:
    """The group at ``folder`` and every group and dataset below it, within ``budget``."""
    children: list[GroupReport | ArrayReport] = []
    found: list[LayoutFinding] = []
    deep: list[str] = []
    unlisted: list[str] = []
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    for name in names:
        child = f"{path.rstrip('/')}/{name}"
        sub = os.path.join(folder, name)
        budget[0] -= 1
        if budget[0] < 0:
            unlisted.append(child)
            continue
        sub_attrs = read_attributes(sub)
        if is_dataset_attributes(sub_attrs):
            assert sub_attrs is not None
            children.append(_dataset(sub, child, sub_attrs, edges))
        elif depth_of(child) > MAX_TREE_DEPTH:
            deep.append(child)
        else:
            group = _group(sub, child, sub_attrs, edges, budget)
            if sub_attrs is not None or group.children or group.findings:
                children.append(group)
    if deep:
        found.append(too_deep_finding(deep))
    if unlisted:
        found.append(
            LayoutFinding(
                "members-unlisted",
                "warning",
                f"{len(unlisted)} folders not shown: the walk stops after "
                f"MAX_WALKED_FOLDERS={MAX_WALKED_FOLDERS:,} folders ({', '.join(unlisted[:5])}"
                f"{', ...' if len(unlisted) > 5 else ''}); inspect one of them by its path",
            )
        )
    user = 0 if attrs is None else len(set(attrs) - _N5_KEYS)
    return GroupReport(path, "n5", user, tuple(children), tuple(found))


def _stored_blocks(folder: str, meta: N5Metadata) -> tuple[dict[tuple[int, ...], int], int]:
    """``({grid coords: file size}, files that are not blocks of the grid)`` under ``folder``."""
    ndim, grid = len(meta.shape), meta.grid
    sizes: dict[tuple[int, ...], int] = {}
    strays = 0
    if ndim == 0:  # the one block is the file "0"
        only = os.path.join(folder, "0")
        return ({(): os.path.getsize(only)} if os.path.isfile(only) else {}), 0
    pending: list[tuple[str, tuple[int, ...]]] = [(folder, ())]
    while pending:
        where, prefix = pending.pop()
        with os.scandir(where) as entries:
            for entry in entries:
                if not _GRID_INDEX.fullmatch(entry.name) or (
                    len(prefix) < ndim and int(entry.name) >= grid[len(prefix)]
                ):
                    strays += entry.name != "attributes.json"
                    continue
                coords = (*prefix, int(entry.name))
                if len(coords) < ndim and entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, coords))
                elif len(coords) == ndim and entry.is_file(follow_symlinks=False):
                    sizes[coords] = entry.stat(follow_symlinks=False).st_size
                else:
                    strays += 1
    return sizes, strays


def _codecs(meta: N5Metadata) -> tuple[str, ...]:
    config = dict(meta.compression)
    kind = config.pop("type")
    return () if kind == "raw" else (spell_codec(kind, config),)


def _dataset(
    folder: str, path: str, attrs: dict[str, Any], edges: tuple[int, ...] | None
) -> ArrayReport:
    """The dataset at ``folder``: its metadata and the sizes of its block files."""
    meta = parse_metadata(attrs, repr(folder))
    notes: list[LayoutFinding] = []
    kind = meta.compression["type"]
    try:
        decompressor(meta.compression, repr(path))
    except (ValueError, ImportError) as exc:
        notes.append(LayoutFinding("unsupported-compression", "warning", str(exc)))
    sizes, strays = _stored_blocks(folder, meta)
    if strays:
        notes.append(
            LayoutFinding(
                "stray-files",
                "info",
                f"{strays} entries in the dataset's folder are not blocks of its grid "
                f"{meta.grid} (N5 readers ignore them)",
            )
        )
    itemsize = meta.stored_dtype.itemsize
    chunk_nbytes = meta.block_nbytes
    report = ArrayReport(
        path=path,
        format="n5",
        shape=meta.shape,
        dtype=str(meta.dtype),
        itemsize=itemsize,
        layout="chunked",
        chunks=meta.blocks,
        shards=None,
        codecs=_codecs(meta),
        inner_codecs=(),
        compressed=kind != "raw",
        fill_value=0,
        order="F",
        attributes=len(set(attrs) - _N5_KEYS),
        nbytes=math.prod(meta.shape) * itemsize,
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=math.prod(meta.grid),
        chunks_stored=len(sizes),
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=sum(sizes.values()),
        decoded_bytes=len(sizes) * chunk_nbytes,
        data_bytes=chunk_data_elements(meta.shape, meta.blocks, sorted(sizes)) * itemsize,
    )
    return with_findings(report, edges, False, notes)
