"""Bounds on what ``mixle inspect`` reads from a local store before anything parses it.

A zarr store is a folder a user (or a hostile archive) made: its metadata files may be
FIFOs (a read blocks for ever), links to ``/dev/zero`` (a read never ends), gigabytes
long, JSON nested so deep that the parser raises ``RecursionError``, or not a JSON object
at all (``null``, a list, a truncated file). Before zarr opens
a local store, :func:`check_local_zarr_store` walks it once: every entry must be a regular
file (checked with ``stat``, before any read), and every metadata file must be at most
:data:`MAX_METADATA_BYTES` long, nested at most :data:`MAX_METADATA_DEPTH` deep, and a
JSON object (:func:`parse_metadata`).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from mixle.errors import InvalidMetadataError, MetadataLimitError
from mixle.inspection.locations import ZARR_METADATA
from mixle.inspection.report import LayoutFinding
from mixle.utils.files import read_regular_file, require_regular_file

__all__ = [
    "MAX_METADATA_BYTES",
    "MAX_METADATA_DEPTH",
    "MAX_TREE_DEPTH",
    "InvalidMetadataError",
    "MetadataLimitError",
    "check_local_zarr_store",
    "check_metadata_file",
    "depth_of",
    "json_depth",
    "parse_metadata",
    "too_deep_finding",
]

#: Largest zarr metadata file (``zarr.json``, ``.zarray``, ``.zattrs``, ``.zmetadata``, ...)
#: inspect reads; consolidated metadata of stores with thousands of arrays stays well below.
MAX_METADATA_BYTES = 64 * 1024 * 1024
#: Deepest nesting of lists and objects allowed in a zarr metadata file (Python's JSON
#: parser recurses once per level and fails near 1,000; real attributes nest a few deep).
MAX_METADATA_DEPTH = 128
#: Deepest group shown in a report: groups nested deeper are named in a finding, not walked
#: (the walk, the text and the JSON of the report all recurse once per level).
MAX_TREE_DEPTH = 256
#: Bytes of metadata scanned at once when measuring its nesting depth.
_DEPTH_BLOCK_BYTES = 1 << 20
#: A JSON string, escapes included (its brackets are not nesting).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


#: How the JSON values that are not objects are named in an :class:`InvalidMetadataError`.
_JSON_KINDS = {
    type(None): "null",
    bool: "boolean",
    int: "number",
    float: "number",
    str: "string",
    list: "list",
}


def parse_metadata(data: bytes, name: str) -> dict:
    """The JSON object in the zarr metadata file ``name`` (shown in errors) holding ``data``.

    Raises
    ------
    InvalidMetadataError
        When ``data`` is empty, not UTF-8, not valid JSON (such as a truncated file) or
        JSON other than an object (``null``, a list, ...); the message names ``name``.
    """
    what = f"zarr metadata {name!r}"
    if not data.strip():
        raise InvalidMetadataError(f"{what} is empty (truncated?): rewrite it from a good copy")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMetadataError(
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): "
            "damaged, or not zarr metadata"
        ) from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        where = (
            f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else str(exc)
        )
        raise InvalidMetadataError(
            f"{what} is not valid JSON ({where}): truncated or damaged; rewrite it from a good copy"
        ) from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        raise InvalidMetadataError(
            f"{what} holds a JSON {kind}, not an object: damaged, or not zarr metadata"
        )
    return value


def json_depth(data: bytes) -> int:
    """How deep lists and objects nest in the JSON text ``data``, without recursing.

    Brackets inside strings do not count. Works on any bytes (not only valid JSON), in
    blocks of :data:`_DEPTH_BLOCK_BYTES`, so memory stays a small multiple of ``data``.
    """
    text = _JSON_STRING.sub(b'""', data)
    deepest = depth = 0
    for start in range(0, len(text), _DEPTH_BLOCK_BYTES):
        block = np.frombuffer(text, np.uint8, min(_DEPTH_BLOCK_BYTES, len(text) - start), start)
        steps = np.zeros(block.shape, np.int32)
        steps[(block == ord("[")) | (block == ord("{"))] = 1
        steps[(block == ord("]")) | (block == ord("}"))] = -1
        running = np.cumsum(steps, dtype=np.int64)
        if running.size:
            deepest = max(deepest, depth + int(running.max()))
            depth += int(running[-1])
    return deepest


def depth_of(path: str) -> int:
    """How deep the group or array at ``path`` (``"/"``, ``"/a"``, ``"/a/b"``) sits."""
    return len([p for p in path.split("/") if p])


def too_deep_finding(names: list[str]) -> LayoutFinding:
    """The finding for a group whose member groups are nested past :data:`MAX_TREE_DEPTH`."""
    return LayoutFinding(
        "too-deep",
        "warning",
        f"groups nested more than MAX_TREE_DEPTH={MAX_TREE_DEPTH} deep are not shown: "
        f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''} (inspect one of them "
        "directly, by its path)",
    )


def check_metadata_file(path: str) -> None:
    """Refuse the zarr metadata file ``path`` if it is special, too large or too deep.

    Raises
    ------
    SpecialFileError
        It is a FIFO, a device, a socket or a directory (found by ``stat``, nothing read).
    MetadataLimitError
        It is longer than :data:`MAX_METADATA_BYTES` or nests deeper than
        :data:`MAX_METADATA_DEPTH` (at most that many bytes, plus one, are read).
    InvalidMetadataError
        It is not a JSON object (:func:`parse_metadata`).
    """
    try:
        data = read_regular_file(path, "zarr metadata", limit=MAX_METADATA_BYTES)
    except ValueError:
        raise MetadataLimitError(
            f"zarr metadata {path!r} is larger than MAX_METADATA_BYTES="
            f"{MAX_METADATA_BYTES:,} bytes: not read (zarr metadata is JSON of a few KiB)"
        ) from None
    depth = json_depth(data)
    if depth > MAX_METADATA_DEPTH:
        raise MetadataLimitError(
            f"zarr metadata {path!r} nests lists or objects {depth:,} deep, deeper than "
            f"MAX_METADATA_DEPTH={MAX_METADATA_DEPTH}: not parsed (flatten its attributes)"
        )
    parse_metadata(data, path)


def check_local_zarr_store(root: str) -> None:
    """Walk the local zarr store at ``root`` and refuse it if any entry is hostile.

    Every entry below ``root`` must be a folder or a regular file (a chunk that is a
    FIFO, a socket or a link to ``/dev/zero`` is refused by ``stat`` before anything reads
    it), and every metadata file passes :func:`check_metadata_file`. Folders are not
    followed through symlinks (as zarr's listing does not), and each is visited once.

    Raises
    ------
    SpecialFileError, MetadataLimitError
        Naming the entry.
    """
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and entry.name not in ZARR_METADATA:
                    pending.append(entry.path)
                    continue
                what = "zarr metadata" if entry.name in ZARR_METADATA else "zarr chunk"
                if entry.is_symlink():
                    if entry.is_dir():  # a linked folder: zarr does not list it either
                        continue
                    try:
                        require_regular_file(entry.path, what)
                    except FileNotFoundError:  # a dangling link: zarr reads it as missing
                        continue
                elif not entry.is_file(follow_symlinks=False):
                    require_regular_file(entry.path, what)  # raises: not a regular file
                # a folder named like metadata (.zarray/) was refused above, as a directory
                if entry.name in ZARR_METADATA:
                    check_metadata_file(entry.path)
