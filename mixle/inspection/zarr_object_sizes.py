"""Stored sizes of a zarr array's chunk (or shard) objects, and chunk files zarr never reads.

:func:`zarr_object_sizes` lists the objects of a local store by walking its folders, of an
fsspec store with ``find``, and asks a store that cannot list (plain HTTP) for each
object's size, at most :data:`~mixle.inspection.zarr_shard_indices.MAX_PROBED_OBJECTS` of
them. Listing also finds chunk files stored nested (``0/0``) that a ``"."``-separated
zarr v2 array never reads; :func:`nested_finding` is the warning that says so.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from mixle.inspection.locations import ZARR_METADATA
from mixle.inspection.report import LayoutFinding
from mixle.inspection.zarr_shard_indices import MAX_PROBED_OBJECTS

__all__ = ["cannot_list", "nested_finding", "separator_spelled", "zarr_object_sizes"]

#: Size requests in flight at once when probing objects one by one.
_PROBE_CONCURRENCY = 32


def nested_finding(nested: int, grid: int, ndim: int, separator_set: bool) -> LayoutFinding:
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


def separator_spelled(array: Any) -> bool:
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


def zarr_object_sizes(
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
    elif isinstance(store, FsspecStore) and not cannot_list(store):
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


def cannot_list(store: Any) -> bool:
    """Whether ``store`` is a plain HTTP(S) store, whose folders cannot be listed reliably."""
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", ())
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return any(p in ("http", "https") for p in protocols)
