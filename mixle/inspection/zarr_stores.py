"""zarr stores (format 2 and 3, sharded or not): metadata, codecs, and the report of each array.

Stored object sizes and nested chunk files come from :mod:`mixle.inspection.zarr_object_sizes`.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from mixle.data.sources.arrays.cf import zarr_cf_attributes
from mixle.inspection.findings import cf_packed_finding, with_findings
from mixle.inspection.formatting import (
    BLOSC_SHUFFLE,
    plain_value,
    shape_text,
    spell_codec,
    spell_value,
)
from mixle.inspection.limits import (
    MAX_TREE_DEPTH,
    MetadataLimitError,
    check_local_zarr_store,
    depth_of,
    too_deep_finding,
)
from mixle.inspection.locations import is_remote
from mixle.inspection.patches import chunk_data_elements
from mixle.inspection.remote import check_remote_metadata, give_up_if_late
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.inspection.zarr_object_sizes import (
    cannot_list,
    nested_finding,
    separator_spelled,
    zarr_object_sizes,
)
from mixle.inspection.zarr_shard_indices import (
    MAX_PROBED_OBJECTS,
    count_inner_chunks,
    damaged_finding,
)
from mixle.reading.fs_options import query_as_params
from mixle.utils.redact import display_path, redact_text

__all__ = ["MAX_PROBED_OBJECTS", "inspect_zarr"]

#: Metadata files at the root of a zarr store, named when zarr cannot open it.
_ROOT_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
#: Longest axis any reader can index (NumPy's int64 indices).
_MAX_EXTENT = 2**63 - 1
#: zarr v3 codecs that do not compress.
_ZARR_NOT_COMPRESSING = frozenset({"bytes", "transpose", "crc32c", "sharding_indexed", "vlen-utf8"})


def inspect_zarr(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport | ArrayReport:
    """The root node (group or array) of the zarr store at ``location``, opened read-only."""
    from mixle.reading.faults import retry_call
    from mixle.utils.optional_deps import require

    zarr = require("zarr", "zarr", feature="mixle inspect")
    kwargs: dict[str, Any] = {"mode": "r"}
    # a presigned URL's query goes with every request, after each key (as read_zarr does)
    store_url, options = query_as_params(location, dict(storage_options or {}))
    if options:
        kwargs["storage_options"] = options
    if not is_remote(location):
        check_local_zarr_store(location)  # special files, huge or too deep metadata
    shown = display_path(location)

    def open_store() -> Any:
        give_up_if_late(shown)
        return zarr.open(store=store_url, **kwargs)

    try:
        node = retry_call(open_store, url=shown, key="(metadata)", secrets=storage_options)
    except RecursionError:
        raise MetadataLimitError(
            f"{shown!r} holds zarr metadata nested too deep to parse "
            f"(more than Python's recursion limit of {sys.getrecursionlimit()})"
        ) from None
    except (FileNotFoundError, ValueError, TypeError, AttributeError) as exc:
        # zarr fails on metadata that is not a JSON object with AttributeError or TypeError:
        # hostile input, named by the file at fault where one of the store's root files is
        if is_remote(location) and not isinstance(exc, FileNotFoundError):
            check_remote_metadata(location, storage_options)
        reason = redact_text(f"{type(exc).__name__}: {exc}", storage_options)
        raise UnsupportedStoreError(
            f"{shown!r} holds zarr metadata{_root_metadata(location)} but zarr cannot open it: "
            f"{reason}"
        ) from None
    remote = is_remote(location)
    where = display_path(location)
    return _zarr_node(zarr, node, "/", patch, remote, where, storage_options, False)


def _root_metadata(location: str) -> str:
    """`` (zarr.json)``: the metadata files at the root of a local store, for messages."""
    if is_remote(location) or not os.path.isdir(location):
        return ""
    names = [n for n in _ROOT_METADATA if os.path.lexists(os.path.join(location, n))]
    return f" ({', '.join(names)})" if names else ""


def _zarr_node(
    zarr: Any,
    node: Any,
    path: str,
    patch: tuple[int, ...] | None,
    remote: bool,
    where: str,
    secrets: Any,
    from_consolidated: bool,
) -> GroupReport | ArrayReport:
    fmt = f"zarr v{node.metadata.zarr_format}"
    if isinstance(node, zarr.Array):
        stale: list[LayoutFinding] = []
        if from_consolidated:
            node, stale = _own_metadata(zarr, node)
        return _zarr_array(node, path, fmt, patch, remote, where, secrets, stale)
    consolidated = getattr(node.metadata, "consolidated_metadata", None) is not None
    members = sorted(node.members(), key=lambda m: m[0])
    unlisted: list[tuple[str, Any]] = []
    if from_consolidated or consolidated:
        unlisted = _unconsolidated_members(zarr, node, {name for name, _ in members})
    everything = sorted(
        [(n, c, False) for n, c in members] + [(n, c, True) for n, c in unlisted],
        key=lambda m: m[0],
    )
    deep = depth_of(path) >= MAX_TREE_DEPTH
    too_deep = [n for n, c, _ in everything if deep and isinstance(c, zarr.Group)]
    children = tuple(
        _zarr_node(
            zarr,
            child,
            f"{path.rstrip('/')}/{name}",
            patch,
            remote,
            where,
            secrets,
            (from_consolidated or consolidated) and not own,
        )
        for name, child, own in everything
        if name not in too_deep
    )
    notes: list[LayoutFinding] = [too_deep_finding(too_deep)] if too_deep else []
    if unlisted:
        notes.append(_unlisted_finding([name for name, _ in unlisted]))
    if not members and not consolidated and cannot_list(node.store):
        notes.append(
            LayoutFinding(
                "members-unlisted",
                "info",
                "this store cannot list folders (plain HTTP), so members of a group without "
                "consolidated metadata are not shown: inspect an array URL directly, or run "
                "zarr.consolidate_metadata on the store",
            )
        )
    return GroupReport(path, fmt, len(node.attrs), children, tuple(notes))


def _unconsolidated_members(zarr: Any, group: Any, known: set[str]) -> list[tuple[str, Any]]:
    """Members of ``group`` stored in the store but not in its consolidated metadata.

    Only for stores that can list (local folders, fsspec stores other than plain HTTP); the
    members come from their own metadata, as ``zarr.open_group(..., use_consolidated=False)``
    sees them.
    """
    from zarr.storage import FsspecStore, LocalStore

    store = group.store
    if not isinstance(store, (LocalStore, FsspecStore)) or cannot_list(store):
        return []
    try:
        listed = zarr.open_group(store=store, path=group.path, mode="r", use_consolidated=False)
        found = listed.members()
    except (FileNotFoundError, KeyError, ValueError):
        return []
    return sorted(((n, c) for n, c in found if n not in known), key=lambda m: m[0])


def _unlisted_finding(names: list[str]) -> LayoutFinding:
    """The warning for members stored after the group's metadata was consolidated."""
    return LayoutFinding(
        "stale-consolidated-metadata",
        "warning",
        "the store's consolidated metadata is stale for this group, "
        f"not in the consolidated metadata: {', '.join(names)} (shown from their own "
        "metadata, which read_zarr and zarr.open_array read, while zarr.open_group and "
        "zarr.open on the store do not see them); fix: run zarr.consolidate_metadata on "
        "the store",
    )


def _own_metadata(zarr: Any, array: Any) -> tuple[Any, list[LayoutFinding]]:
    """``array`` reopened from its own metadata, and a warning if consolidated metadata differs.

    zarr opens a group's members from its consolidated metadata (``.zmetadata``, or
    ``consolidated_metadata`` in ``zarr.json``), which nothing updates when an array is
    changed later (resized, say); :func:`~mixle.data.sources.array_source.read_zarr` and
    ``zarr.open_array`` read the array's own metadata.
    """
    shown = f"{array.path!r}"
    try:
        own = zarr.open_array(store=array.store, path=array.path, mode="r")
    except (FileNotFoundError, KeyError, ValueError) as exc:
        return array, [
            LayoutFinding(
                "stale-consolidated-metadata",
                "warning",
                f"the consolidated metadata lists array {shown}, but its own metadata cannot "
                f"be read ({type(exc).__name__}: {exc}); shown as the consolidated metadata "
                "describes it; rerun zarr.consolidate_metadata on the store",
            )
        ]
    said, real = array.metadata.to_dict(), own.metadata.to_dict()
    differ = [k for k in sorted(set(said) | set(real)) if said.get(k) != real.get(k)]
    if not differ:
        return own, []
    what = "; ".join(
        f"{k} {_short(said.get(k))} there, {_short(real.get(k))} in its own metadata"
        for k in differ
    )
    return own, [
        LayoutFinding(
            "stale-consolidated-metadata",
            "warning",
            f"the store's consolidated metadata is stale for this array ({what}): shown is "
            "the array's own metadata, which read_zarr and zarr.open_array read, while "
            "zarr.open_group and zarr.open on the store still see the old one; fix: run "
            "zarr.consolidate_metadata on the store",
        )
    ]


def _short(value: Any) -> str:
    """A metadata value for a message: shapes as ``(20,)``, long values cut."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return shape_text(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _zarr_array(
    array: Any,
    path: str,
    fmt: str,
    patch: tuple[int, ...] | None,
    remote: bool,
    where: str,
    secrets: Any,
    found: list[LayoutFinding],
) -> ArrayReport:
    from mixle.data.sources.arrays.zarr.readers import codec_chain

    meta = array.metadata
    dtype = np.dtype(array.dtype) if isinstance(array.dtype, np.dtype) else None
    shape = tuple(int(s) for s in array.shape)
    chunks = tuple(int(c) for c in array.chunks)
    shards = None if array.shards is None else tuple(int(s) for s in array.shards)
    itemsize = None if dtype is None or dtype.kind in "OT" else dtype.itemsize
    if any(s > _MAX_EXTENT for s in shape):
        raise UnsupportedStoreError(
            f"{where!r}: array {path!r} has shape {shape_text(shape)}, an axis longer than "
            f"2**63 - 1: no reader can index it (damaged metadata? fix its shape)"
        )
    for name, edges in (("chunk", chunks), ("shard", shards or ())):
        if any(e < 1 for e in edges):
            raise UnsupportedStoreError(
                f"{where!r}: array {path!r} has {name} shape {shape_text(edges)}, with an "
                f"axis of length < 1: no reader can split it into {name}s (fix its metadata)"
            )
    codecs, inner, order, compressed = _zarr_codecs(meta)
    grid = tuple(math.ceil(d / c) for d, c in zip(shape, shards or chunks))
    inner_grid = tuple(math.ceil(d / c) for d, c in zip(shape, chunks))
    notes = list(found)
    sizes, why, nested = zarr_object_sizes(array, grid, remote)
    stored_bytes = None if sizes is None else sum(sizes.values())
    objects_stored = None if sizes is None else len(sizes)
    chunks_stored: int | None = objects_stored
    elements: int | None = None
    if sizes is None:
        notes.append(LayoutFinding("sizes-unknown", "info", f"stored sizes unknown: {why}"))
    elif shards is not None:
        counted = count_inner_chunks(array, sorted(sizes), where, secrets)
        chunks_stored, elements, why, damaged = counted
        if damaged:
            notes.append(damaged_finding(damaged))
        if chunks_stored is None:
            notes.append(LayoutFinding("sizes-unknown", "info", f"inner chunks not counted: {why}"))
    else:
        elements = chunk_data_elements(shape, chunks, sorted(sizes))
    if nested:
        notes.append(
            nested_finding(nested, math.prod(inner_grid), len(shape), separator_spelled(array))
        )
    chunk_nbytes = None if itemsize is None else math.prod(chunks) * itemsize
    decoded = None
    if chunk_nbytes is not None and chunks_stored is not None:
        decoded = chunks_stored * chunk_nbytes
    if dtype is not None and chunks and codec_chain(array) is None and shards is None:
        notes.append(
            LayoutFinding(
                "serial-decode",
                "info",
                "mixle has no direct decoder for these codecs, so zarr's own codec pipeline "
                "decodes each chunk (slower for many small patches)",
            )
        )
    attributes = zarr_cf_attributes(array)
    packed = None if dtype is None else cf_packed_finding(attributes, dtype, "read_zarr")
    if packed is not None:
        notes.append(packed)
    report = ArrayReport(
        path=path,
        format=fmt,
        shape=shape,
        dtype=str(array.dtype),
        itemsize=itemsize,
        layout="sharded" if shards is not None else "chunked",
        chunks=chunks,
        shards=shards,
        codecs=codecs,
        inner_codecs=inner,
        compressed=compressed,
        fill_value=plain_value(array.fill_value),
        order=order,
        attributes=len(array.attrs),
        nbytes=None if itemsize is None else math.prod(shape) * itemsize,
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=math.prod(inner_grid),
        chunks_stored=chunks_stored,
        shards_in_grid=None if shards is None else math.prod(grid),
        shards_stored=None if shards is None else objects_stored,
        stored_bytes=stored_bytes,
        decoded_bytes=decoded,
        data_bytes=None if itemsize is None or elements is None else elements * itemsize,
    )
    return with_findings(report, patch, remote, notes)


def _zarr_codecs(meta: Any) -> tuple[tuple[str, ...], tuple[str, ...], str, bool]:
    """``(codecs, inner codecs, memory order, compressed)`` spelled from zarr metadata."""
    if meta.zarr_format == 2:
        steps = [*(meta.filters or ()), *([meta.compressor] if meta.compressor else [])]
        return tuple(_numcodec(c) for c in steps), (), str(meta.order), meta.compressor is not None
    outer = [c.to_dict() for c in meta.codecs]
    inner: list[dict[str, Any]] = []
    order = "C"
    spelled: list[str] = []
    for codec in outer:
        config = dict(codec.get("configuration") or {})
        if codec["name"] == "sharding_indexed":
            inner = list(config.pop("codecs", ()))
            config.pop("chunk_shape", None)
        spelled.append(spell_codec(codec["name"], config))
    for codec in [*outer, *inner]:
        if codec["name"] == "transpose":
            perm = tuple(codec["configuration"]["order"])
            order = (
                "C"
                if perm == tuple(sorted(perm))
                else "F"
                if perm == tuple(sorted(perm, reverse=True))
                else f"transpose{shape_text(perm)}"
            )
    compressed = any(c["name"] not in _ZARR_NOT_COMPRESSING for c in [*outer, *inner])
    return tuple(spelled), tuple(spell_value(c) for c in inner), order, compressed


def _numcodec(codec: Any) -> str:
    config = dict(codec.get_config())
    name = config.pop("id")
    if name == "blosc" and config.get("shuffle") in BLOSC_SHUFFLE:
        config["shuffle"] = BLOSC_SHUFFLE[config["shuffle"]]
    return spell_codec(name, config)
