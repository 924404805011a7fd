"""blosc2 ``.b2nd`` files: one array, described from the frame's metadata alone."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mixle.data.sources.arrays.b2nd.blocks import (
    MIN_BLOCK_BYTES,
    WHOLE_CHUNK_BYTES,
    blocks_decode_alone,
    blocks_tile_chunks,
    reads_by_block,
)
from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes, shape_text
from mixle.inspection.locations import is_remote
from mixle.inspection.report import ArrayReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.files import open_regular_file, require_regular_file
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = ["B2FRAME_MAGIC", "inspect_b2nd", "is_b2nd"]

#: The first bytes of every blosc2 contiguous frame (msgpack: a 14-item array, "b2frame\0").
B2FRAME_MAGIC = b"\x9e\xa8b2frame\x00"
#: The name of the N-D metalayer as msgpack writes it (a 4-character string).
_B2ND_LAYER = b"\xa4b2nd"
#: Bytes of the frame header searched for the ``b2nd`` metalayer.
_HEAD_BYTES = 4096


def is_b2nd(location: str) -> bool:
    """Whether ``location`` is a local blosc2 frame holding an N-D array (``.b2nd``).

    Reads at most the first few KiB; a FIFO or device is refused before anything is read.
    """
    if is_remote(location):
        return False
    try:
        require_regular_file(location, "path")
        with open_regular_file(location, "path") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return False
    return head.startswith(B2FRAME_MAGIC) and _B2ND_LAYER in head


def _codec_names(cparams: Any) -> tuple[tuple[str, ...], bool]:
    """``(codecs in words, compressed?)`` from blosc2's compression parameters."""
    names = [
        f.name.lower() for f in cparams.filters if getattr(f, "name", "NOFILTER") != "NOFILTER"
    ]
    codec = cparams.codec.name.lower()
    compressed = cparams.clevel > 0
    names.append(f"{codec}(clevel={cparams.clevel})" if compressed else "uncompressed")
    return tuple(names), compressed


def _why_whole_chunks(array: Any) -> str:
    """Why blocks that tile the chunks are still not decoded alone (see reads_by_block)."""
    itemsize = np.dtype(array.dtype).itemsize
    if int(array.schunk.typesize) != itemsize:
        return (
            f"the frame stores items of {int(array.schunk.typesize)} bytes, not the "
            f"dtype's {itemsize}"
        )
    if not blocks_decode_alone(array.schunk.cparams.filters):
        names = [getattr(f, "name", str(f)) for f in array.schunk.cparams.filters]
        return f"its filters {names} make a block's decoding depend on other blocks (DELTA)"
    block = math.prod(int(b) for b in array.blocks) * itemsize
    return (
        f"its blocks decode to {format_bytes(block)}, under {format_bytes(MIN_BLOCK_BYTES)}, "
        f"and a chunk of at most {format_bytes(WHOLE_CHUNK_BYTES)} decodes faster whole"
    )


def inspect_b2nd(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> ArrayReport:
    """The array in the ``.b2nd`` file at ``location`` (a local path), from its metadata.

    When the blocks tile the chunks, ``chunks`` reports the block (what mixle decodes per
    read) and ``shards`` the blosc2 chunk (the unit stored), so patch costs count what a
    read decodes.

    Raises
    ------
    UnsupportedStoreError
        For a URL, or a file blosc2 does not open as an N-D array.
    ImportError
        When python-blosc2 is not installed: ``pip install -e ".[blosc2]"``.
    """
    shown = display_path(location)
    if is_remote(location):
        raise UnsupportedStoreError(f"{shown!r}: mixle inspects local .b2nd files only")
    blosc2 = require("blosc2", "blosc2", feature="inspecting .b2nd files")
    require_regular_file(location, "path")
    try:
        array = blosc2.open(location, mode="r")
    except (RuntimeError, ValueError, OSError, TypeError) as exc:
        raise UnsupportedStoreError(f"{shown!r} is not a file blosc2 opens ({exc})") from None
    if not isinstance(array, blosc2.NDArray):
        raise UnsupportedStoreError(
            f"{shown!r} holds a blosc2 {type(array).__name__}, not an N-D array"
        )
    shape = tuple(int(s) for s in array.shape)
    dtype = np.dtype(array.dtype)
    chunks = tuple(int(c) for c in array.chunks)
    blocks = tuple(int(b) for b in array.blocks)
    codecs, compressed = _codec_names(array.cparams)
    itemsize = dtype.itemsize
    nchunks = int(array.schunk.nchunks)
    padded = math.prod(math.ceil(c / b) * b for c, b in zip(chunks, blocks))
    by_block = reads_by_block(array)
    notes: list[LayoutFinding] = []
    if by_block:
        notes.append(
            LayoutFinding(
                "block-reads",
                "info",
                f"blosc2 chunks {shape_text(chunks)} are stored as blocks {shape_text(blocks)} "
                f"({format_bytes(math.prod(blocks) * itemsize)} decoded); mixle decodes only "
                "the blocks a patch touches, so 'chunks' shows the blocks and 'shards' the "
                "blosc2 chunks",
            )
        )
    elif shape and blocks != chunks and blocks_tile_chunks(chunks, blocks):
        notes.append(
            LayoutFinding(
                "whole-chunk-reads",
                "info",
                f"blocks {shape_text(blocks)} tile the chunks {shape_text(chunks)}, but "
                f"{_why_whole_chunks(array)}, so every read decodes whole chunks",
            )
        )
    elif shape and blocks != chunks:
        notes.append(
            LayoutFinding(
                "blocks-untiled",
                "warning",
                f"blocks {shape_text(blocks)} do not tile the chunks {shape_text(chunks)}, "
                "so every read decodes whole chunks; re-save with chunks a multiple of the "
                "blocks on every axis (blosc2.asarray(..., chunks=, blocks=)) to decode only "
                "the blocks a patch touches",
            )
        )
    notes.append(
        LayoutFinding(
            "no-checksum",
            "info",
            "blosc2 frames carry no checksum: damaged bytes that still decode read as what "
            "they decode to",
        )
    )
    report = ArrayReport(
        path="/",
        format="b2nd",
        shape=shape,
        dtype=str(dtype),
        itemsize=itemsize,
        layout="chunked" if shape else "contiguous",
        chunks=(blocks if by_block else chunks) if shape else None,
        shards=chunks if by_block else None,
        codecs=codecs,
        inner_codecs=(),
        compressed=compressed,
        fill_value=None,
        order="C",
        attributes=len(array.vlmeta),
        nbytes=math.prod(shape) * itemsize,
        chunk_nbytes=math.prod(blocks if by_block else chunks) * itemsize if shape else None,
        chunks_in_grid=(nchunks * math.prod(c // b for c, b in zip(chunks, blocks)))
        if by_block
        else nchunks,
        chunks_stored=(nchunks * math.prod(c // b for c, b in zip(chunks, blocks)))
        if by_block
        else nchunks,
        shards_in_grid=nchunks if by_block else None,
        shards_stored=nchunks if by_block else None,
        stored_bytes=int(array.schunk.cbytes),
        decoded_bytes=nchunks * padded * itemsize,
        data_bytes=math.prod(shape) * itemsize,
    )
    return with_findings(report, patch, False, notes)
