"""Warnings and notes about an array's layout, each saying why, with numbers.

Every threshold is one named constant here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from mixle.data.sources.arrays.cf import CFAttributes, CFDecoding
from mixle.inspection.formatting import (
    count_text,
    fill_text,
    format_bytes,
    patch_text,
    shape_text,
    times_text,
)
from mixle.inspection.patches import fit_patch, patch_cost, suggest_chunks
from mixle.inspection.report import ArrayReport, LayoutFinding, PatchCost
from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES

__all__ = [
    "HIGH_READ_AMPLIFICATION_PER_AXIS",
    "LARGE_CHUNK_BYTES",
    "POOR_COMPRESSION_RATIO",
    "SLAB_ASPECT_RATIO",
    "SMALL_CHUNK_BYTES",
    "cf_packed_finding",
    "with_findings",
]

#: Decoded chunks smaller than this are "too small": a patch touches many of them, and each
#: costs one decode call (and, remotely, one request) whatever its size.
SMALL_CHUNK_BYTES = 64 * 1024
#: Decoded chunks larger than this are "too large": a small patch decodes far more bytes than
#: it uses, and the decoded-chunk cache holds only a few of them.
LARGE_CHUNK_BYTES = 16 * 1024 * 1024
#: Chunks whose longest edge is this many times their shortest (over the axes the chunking
#: splits) are slabs: an N-D patch crosses many chunks along the short axis.
SLAB_ASPECT_RATIO = 16
#: Read amplification per axis (the geometric mean over the array's axes longer than 1)
#: above which an explicit ``patch`` gets a warning. A random patch of the chunk's own edge
#: already costs about 2x per axis (it straddles two chunks), so 3x means chunks over
#: about twice the patch edge.
HIGH_READ_AMPLIFICATION_PER_AXIS = 3.0
#: A compressed array whose decoded/stored ratio is below this gains little from its codec.
POOR_COMPRESSION_RATIO = 1.1


def with_findings(
    report: ArrayReport,
    patch: tuple[int, ...] | None,
    remote: bool,
    extra: Sequence[LayoutFinding] = (),
) -> ArrayReport:
    """``report`` with its layout findings and (when ``patch`` was asked) its patch cost."""
    found: list[LayoutFinding] = []
    cost: PatchCost | None = None
    itemsize = report.itemsize
    fitted = fit_patch(report.shape, patch)
    if isinstance(fitted, str) or itemsize is None:
        if patch is not None:
            why = fitted if isinstance(fitted, str) else f"dtype {report.dtype} has no fixed size"
            found.append(LayoutFinding("patch-not-costed", "info", f"no patch cost: {why}"))
    elif report.chunks is not None:
        default = patch_cost(report.shape, report.chunks, itemsize, fitted, report.shards)
        found.extend(_chunk_findings(report, default, patch is not None, remote))
        if patch is not None:
            cost = default
    elif patch is not None and report.layout != "virtual":
        cost = patch_cost(report.shape, None, itemsize, fitted)
    ignored = any(f.code == "nested-chunks-ignored" for f in extra)
    found.extend(_storage_findings(report, ignored))
    found.extend(extra)
    return replace(report, findings=tuple(found), patch_cost=cost)


def cf_packed_finding(attrs: CFAttributes, dtype: Any, reader: str) -> LayoutFinding | None:
    """``"cf-packed"``: the array holds CF-packed values that ``reader`` reads raw by default.

    ``None`` when no CF attribute is declared or decoding would change nothing. ``reader``
    is the function that opens the array (``"read_zarr"``, ``"read_hdf5"``).
    """
    if not attrs.declared:
        return None
    named = ", ".join(f"{k}={_attribute_text(attrs.values.get(k))}" for k in attrs.declared)
    try:
        decoding = CFDecoding.from_attributes(attrs.values, dtype, where="this array")
    except ValueError as exc:
        return LayoutFinding(
            "cf-packed",
            "info",
            f"CF packing attributes ({named}) that mixle cannot decode: {exc}",
        )
    if decoding is None:
        return None
    return LayoutFinding(
        "cf-packed",
        "info",
        f"stored values are CF-packed ({named}): {reader}() reads the stored "
        f"{decoding.stored} values by default; {reader}(..., mask_and_scale=True) unpacks "
        f"them as xarray does: {decoding.describe()}",
    )


def _attribute_text(value: Any) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _chunk_findings(
    a: ArrayReport, cost: PatchCost, explicit: bool, remote: bool
) -> list[LayoutFinding]:
    assert a.chunks is not None and a.chunk_nbytes is not None and cost.chunks_touched is not None
    assert a.itemsize is not None and a.nbytes is not None
    found: list[LayoutFinding] = []
    shape, chunks, size, itemsize = a.shape, a.chunks, a.chunk_nbytes, a.itemsize
    one = "inner chunk" if a.shards is not None else "chunk"
    unit = f"{one}s"
    what = f"{unit} {shape_text(chunks)} {a.dtype} = {format_bytes(size)} decoded"
    which = "a" if explicit else "e.g. a"
    costs = (
        f"{which} {patch_text(cost.patch)} patch ({format_bytes(cost.patch_bytes)}) touches "
        f"{count_text(cost.chunks_touched, one)} and decodes {format_bytes(cost.decoded_bytes)} "
        f"(read amplification {times_text(cost.read_amplification)})"
    )
    better = suggest_chunks(shape, itemsize)
    fix = (
        f"rechunk to e.g. {shape_text(better)} "
        f"({format_bytes(math.prod(better) * itemsize)} decoded)"
    )
    better_cost = patch_cost(shape, better, itemsize, cost.patch)
    whole = all(c >= d for c, d in zip(chunks, shape))
    split = [k for k, (c, d) in enumerate(zip(chunks, shape)) if c < d]
    warned = False
    if size < SMALL_CHUNK_BYTES and not whole and a.nbytes > SMALL_CHUNK_BYTES:
        if a.shards is not None:
            why = (
                "each inner chunk one decode call (mixle merges neighbouring inner chunks of "
                "a shard into few requests), so per-chunk overhead dominates"
            )
        else:
            why = "each one request and one decode call, so per-chunk overhead dominates"
            if remote:
                why += "; this remote store pays one round trip per chunk"
        found.append(
            LayoutFinding(
                "small-chunks",
                "warning",
                f"{what} (< {format_bytes(SMALL_CHUNK_BYTES)}): {costs}, {why}; {fix}",
            )
        )
        warned = True
    if size > LARGE_CHUNK_BYTES:
        fits = DEFAULT_CHUNK_CACHE_BYTES // size
        cache = (
            f"the default decoded-chunk cache ({format_bytes(DEFAULT_CHUNK_CACHE_BYTES)}, "
            f"mixle.reading.cache.DEFAULT_CHUNK_CACHE_BYTES) holds only {fits} such "
            f"chunk{'s' if fits != 1 else ''}"
        )
        if whole and a.compressed:
            found.append(
                LayoutFinding(
                    "whole-array-chunk",
                    "warning",
                    f"one compressed chunk holds the whole array ({format_bytes(size)} "
                    f"decoded): every patch decodes all of it; {cache}; {fix}",
                )
            )
        else:
            found.append(
                LayoutFinding(
                    "large-chunks",
                    "warning",
                    f"{what} (> {format_bytes(LARGE_CHUNK_BYTES)}): {costs}, far more than "
                    f"the patch uses; {cache}; {fix}",
                )
            )
        warned = True
    if len(split) >= 1 and len(shape) >= 2:
        edges = [min(c, d) for c, d in zip(chunks, shape) if d > 1]
        thin = min(split, key=lambda k: chunks[k])
        longest = max(edges) if edges else chunks[thin]
        helps = better_cost.read_amplification < cost.read_amplification
        if (
            longest >= SLAB_ASPECT_RATIO * chunks[thin]
            and cost.patch[thin] > chunks[thin]
            and helps
        ):
            found.append(
                LayoutFinding(
                    "slab-chunks",
                    "warning",
                    f"{unit} {shape_text(chunks)} are slabs (edge {chunks[thin]} along axis "
                    f"{thin} vs {longest}): {which} {patch_text(cost.patch)} patch touches "
                    f"{count_text(cost.chunks_per_axis[thin], one)} along axis {thin} alone and "
                    f"{cost.chunks_touched:.3g} in all, decoding "
                    f"{format_bytes(cost.decoded_bytes)} for "
                    f"{format_bytes(cost.patch_bytes)} (read amplification "
                    f"{times_text(cost.read_amplification)}); {fix}, where it would decode "
                    f"{format_bytes(better_cost.decoded_bytes)} (read amplification "
                    f"{times_text(better_cost.read_amplification)})",
                )
            )
            warned = True
    long_axes = sum(1 for d in shape if d > 1) or 1
    per_axis = cost.read_amplification ** (1 / long_axes)
    if (
        explicit
        and not warned
        and size >= SMALL_CHUNK_BYTES
        and per_axis > HIGH_READ_AMPLIFICATION_PER_AXIS
    ):
        smaller = suggest_chunks(shape, itemsize, 2 * max(SMALL_CHUNK_BYTES, cost.patch_bytes))
        found.append(
            LayoutFinding(
                "read-amplification",
                "warning",
                f"{what} are large for this patch: {costs}, {per_axis:.3g}x per axis (over "
                f"{HIGH_READ_AMPLIFICATION_PER_AXIS:g}x); if patches this small are the main "
                "workload, "
                f"smaller chunks decode less, e.g. {shape_text(smaller)} "
                f"({format_bytes(math.prod(smaller) * itemsize)}; below "
                f"{format_bytes(SMALL_CHUNK_BYTES)} per-chunk overhead takes over)",
            )
        )
    return found


def _storage_findings(a: ArrayReport, nested_ignored: bool = False) -> list[LayoutFinding]:
    """Missing chunks and poor compression; ``nested_ignored``: chunk files exist unread."""
    found: list[LayoutFinding] = []
    missing = a.chunks_missing
    fill = fill_text(a.fill_value, a.dtype)
    if missing and a.chunks_in_grid and not nested_ignored:
        one = "inner chunk" if a.shards is not None else "chunk"
        found.append(
            LayoutFinding(
                "missing-chunks",
                "info",
                f"{missing} of {count_text(a.chunks_in_grid, one)} never written "
                f"({100 * missing / a.chunks_in_grid:.0f}%): "
                f"{'it reads' if missing == 1 else 'they read'} as the fill value "
                f"{fill} without any I/O",
            )
        )
    if a.chunks is None and a.stored_bytes == 0 and a.nbytes and a.layout != "virtual":
        found.append(
            LayoutFinding(
                "missing-chunks",
                "info",
                f"never written (no storage allocated): reads as the fill value {fill}",
            )
        )
    ratio = a.compression_ratio
    big = (a.chunk_nbytes or a.nbytes or 0) >= SMALL_CHUNK_BYTES  # tiny chunks: codec headers
    if a.compressed and big and ratio is not None and ratio < POOR_COMPRESSION_RATIO:
        found.append(
            LayoutFinding(
                "poor-compression",
                "info",
                f"compression saves little (ratio {ratio:.3g}x of data bytes to stored bytes "
                f"< {POOR_COMPRESSION_RATIO:g}x): "
                "every chunk pays a decode for almost no space; store it uncompressed or try "
                "a shuffle filter before the compressor",
            )
        )
    return found
