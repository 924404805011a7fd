"""zarr stores (format 2 and 3, sharded or not): metadata, codecs and stored object sizes."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from mixle.inspection.findings import with_findings
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
from mixle.inspection.locations import ZARR_METADATA, is_remote
from mixle.inspection.patches import chunk_data_elements
from mixle.inspection.remote import check_remote_metadata, give_up_if_late
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.inspection.zarr_shard_indices import (
    MAX_PROBED_OBJECTS,
    count_inner_chunks,
    damaged_finding,
)
from mixle.utils.redact import display_path, redact_text

__all__ = ["MAX_PROBED_OBJECTS", "inspect_zarr"]

#: Metadata files at the root of a zarr store, named when zarr cannot open it.
_ROOT_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
#: Longest axis any reader can index (NumPy's int64 indices).
_MAX_EXTENT = 2**63 - 1
#: Size requests in flight at once when probing objects one by one.
_PROBE_CONCURRENCY = 32
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
    if storage_options:
        kwargs["storage_options"] = storage_options
    if not is_remote(location):
        check_local_zarr_store(location)  # special files, huge or too deep metadata
    shown = display_path(location)

    def open_store() -> Any:
        give_up_if_late(shown)
        return zarr.open(store=location, **kwargs)

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
    if not members and not consolidated and _cannot_list(node.store):
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
    if not isinstance(store, (LocalStore, FsspecStore)) or _cannot_list(store):
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
    sizes, why, nested = _zarr_object_sizes(array, grid, remote)
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
            _nested_finding(nested, math.prod(inner_grid), len(shape), _separator_spelled(array))
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


def _nested_finding(nested: int, grid: int, ndim: int, separator_set: bool) -> LayoutFinding:
    """The warning for chunk files stored nested (``0/0/0``) that the metadata does not name.

    ``separator_set`` says whether ``.zarray`` spells ``"dimension_separator": "."`` (zarr 3
    writes it) rather than leaving it out (zarr 2's ``NestedDirectoryStore``).
    """
    nested_key, flat_key = "/".join("0" * ndim), ".".join("0" * ndim)
    said = (
        'says "dimension_separator": "."' if separator_set else 'has no "dimension_separator": "/"'
    )
    fix = (
        'set "dimension_separator" to "/" in .zarray'
        if separator_set
        else 'add "dimension_separator": "/" to .zarray'
    )
    return LayoutFinding(
        "nested-chunks-ignored",
        "warning",
        f"{nested} of {grid} chunks are stored as nested files (such as {nested_key}, written "
        f"by zarr 2's NestedDirectoryStore) but .zarray {said}, so zarr looks for {flat_key} "
        f"and reads every one of them as the fill value (so does read_zarr); fix: {fix}",
    )


def _separator_spelled(array: Any) -> bool:
    """Whether the array's own ``.zarray`` names a ``dimension_separator`` at all."""
    import json

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    key = "/".join(p for p in (array.path.strip("/"), ".zarray") if p)
    try:
        raw = sync(array.store.get(key, prototype=default_buffer_prototype()))
        return raw is not None and "dimension_separator" in json.loads(raw.to_bytes())
    except (OSError, ValueError):
        return False


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


def _key_parser(meta: Any, ndim: int) -> Any:
    """A function from a stored key (relative to the array) to grid coords, or ``None``."""
    if meta.zarr_format == 2:
        sep, prefix = meta.dimension_separator or ".", ""
    else:
        encoding = meta.chunk_key_encoding
        sep = encoding.separator
        prefix = "c" if getattr(encoding, "name", "default") == "default" else ""

    def parse(key: str) -> tuple[int, ...] | None:
        if prefix:
            if key == prefix and ndim == 0:
                return ()
            if not key.startswith(prefix + sep):
                return None
            key = key[len(prefix) + 1 :]
        parts = key.split(sep)
        if ndim == 0:
            return () if parts == ["0"] else None
        if len(parts) != ndim or not all(p.isdigit() for p in parts):
            return None
        return tuple(int(p) for p in parts)

    return parse


def _zarr_object_sizes(
    array: Any, grid: tuple[int, ...], remote: bool
) -> tuple[dict[tuple[int, ...], int] | None, str, int]:
    """Size of each stored chunk (or shard) object by grid coords; ``None`` and why if unknown.

    The third value counts chunk files stored nested (``0/0``) that a zarr v2 array whose
    metadata says ``dimension_separator`` ``"."`` (or nothing) never reads.
    """
    from zarr.storage import FsspecStore, LocalStore

    from mixle.data.sources.arrays.zarr.local_files import local_chunk_dir

    parse = _key_parser(array.metadata, len(grid))
    store = array.store
    listed: dict[str, int] | None = None
    if isinstance(store, LocalStore):
        listed = _walk_sizes(local_chunk_dir(array))
    elif isinstance(store, FsspecStore) and not _cannot_list(store):
        listed = _fsspec_sizes(store, array.path)
    if listed is not None:
        sizes: dict[tuple[int, ...], int] = {}
        for key, size in listed.items():
            coords = parse(key)
            if coords is not None and all(c < g for c, g in zip(coords, grid)):
                sizes[coords] = size
        return sizes, "", _nested_unread(array.metadata, listed, grid)
    count = math.prod(grid)
    if count > MAX_PROBED_OBJECTS:
        return (
            None,
            (
                f"the store cannot list its objects and the grid has {count} of them, more than "
                f"MAX_PROBED_OBJECTS={MAX_PROBED_OBJECTS} to ask for one by one"
            ),
            0,
        )
    return _probe_sizes(array, grid), "", 0


def _nested_unread(meta: Any, listed: dict[str, int], grid: tuple[int, ...]) -> int:
    """Stored keys of a ``"."``-separated zarr v2 array that are nested chunk keys (``0/0``)."""
    if meta.zarr_format != 2 or (meta.dimension_separator or ".") != "." or len(grid) < 2:
        return 0
    found = 0
    for key in listed:
        parts = key.split("/")
        if len(parts) == len(grid) and all(p.isdigit() for p in parts):
            found += all(int(p) < g for p, g in zip(parts, grid))
    return found


def _walk_sizes(base: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for folder, _dirs, files in os.walk(base):
        rel = os.path.relpath(folder, base)
        for name in files:
            if name in ZARR_METADATA:
                continue
            key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            sizes[key] = os.stat(os.path.join(folder, name)).st_size
    return sizes


def _fsspec_sizes(store: Any, array_path: str) -> dict[str, int]:
    fs = store.fs
    root = "/".join(p for p in (store.path.rstrip("/"), array_path.strip("/")) if p)
    root = fs._strip_protocol(root).rstrip("/")
    if getattr(fs, "async_impl", False):
        from zarr.core.sync import sync

        found = sync(fs._find(root, detail=True))
    else:
        found = fs.find(root, detail=True)
    sizes: dict[str, int] = {}
    for name, info in found.items():
        name = fs._strip_protocol(name)
        if not name.startswith(root + "/") or name.rsplit("/", 1)[-1] in ZARR_METADATA:
            continue
        sizes[name[len(root) + 1 :]] = int(info.get("size") or 0)
    return sizes


def _probe_sizes(array: Any, grid: tuple[int, ...]) -> dict[tuple[int, ...], int]:
    """Ask the store for the size of every object in the grid, a few requests at a time."""
    import asyncio

    from zarr.core.sync import sync

    from mixle.reading.faults import retry_async

    store, meta = array.store, array.metadata
    prefix = f"{array.path.strip('/')}/" if array.path.strip("/") else ""
    coords = [tuple(int(i) for i in c) for c in np.ndindex(*grid)]

    async def all_sizes() -> list[int | None]:
        gate = asyncio.Semaphore(_PROBE_CONCURRENCY)

        async def one(c: tuple[int, ...]) -> int | None:
            key = prefix + meta.encode_chunk_key(c)
            async with gate:
                try:
                    return int(
                        await retry_async(lambda: store.getsize(key), url=f"{store}/{key}", key=key)
                    )
                except FileNotFoundError:
                    return None

        return await asyncio.gather(*(one(c) for c in coords))

    found = sync(all_sizes())
    return {c: s for c, s in zip(coords, found) if s is not None}


def _cannot_list(store: Any) -> bool:
    """Whether ``store`` is a plain HTTP(S) store, whose folders cannot be listed reliably."""
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", ())
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return any(p in ("http", "https") for p in protocols)
