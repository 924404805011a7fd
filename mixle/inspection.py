"""What is in a zarr store, an HDF5 file or a ``.npy`` file, and how well it suits patch reads.

:func:`inspect_store` reads metadata and the sizes of stored objects only (never chunk data)
and returns a :class:`StoreReport`: a tree of :class:`GroupReport` and :class:`ArrayReport`
nodes. Each array lists its chunking, sharding, codecs, fill value, stored and decoded bytes,
and :class:`LayoutFinding` s that say, with numbers, why its layout helps or hurts reading
random N-D patches. :func:`patch_cost` gives the exact expected number of chunks a uniformly
placed patch touches and the bytes it decodes. Every threshold is a named constant below.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES
from mixle.utils.redact import display_path
from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_PATCH_EDGE",
    "HIGH_READ_AMPLIFICATION_PER_AXIS",
    "LARGE_CHUNK_BYTES",
    "MAX_PROBED_OBJECTS",
    "POOR_COMPRESSION_RATIO",
    "SLAB_ASPECT_RATIO",
    "SMALL_CHUNK_BYTES",
    "TARGET_CHUNK_BYTES",
    "ArrayReport",
    "GroupReport",
    "LayoutFinding",
    "PatchCost",
    "StoreReport",
    "UnsupportedStoreError",
    "expected_chunks_along_axis",
    "format_bytes",
    "inspect_store",
    "parse_patch",
    "patch_cost",
    "suggest_chunks",
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
#: Decoded size the suggested rechunking aims at (64³ float32).
TARGET_CHUNK_BYTES = 1024 * 1024
#: Patch edge the warnings use for their numbers when no ``patch`` is given.
DEFAULT_PATCH_EDGE = 32
#: Most stored objects whose size is asked for one by one (stores that cannot list, such as
#: plain HTTP) or whose shard index is read to count inner chunks.
MAX_PROBED_OBJECTS = 4096
#: Size requests in flight at once when probing objects one by one.
_PROBE_CONCURRENCY = 32

#: Metadata objects of zarr stores (everything else in an array's folder is a chunk or shard).
_ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})
_NPY_MAGIC = b"\x93NUMPY"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
#: HDF5 filter ids that only check or rearrange bytes (everything else compresses).
_HDF5_NOT_COMPRESSING = frozenset({2, 3})  # shuffle, fletcher32
#: zarr v3 codecs that do not compress.
_ZARR_NOT_COMPRESSING = frozenset({"bytes", "transpose", "crc32c", "sharding_indexed", "vlen-utf8"})
_BLOSC_SHUFFLE = {-1: "auto", 0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}

Severity = Literal["warning", "info"]
PatchLike = int | Sequence[int]


class UnsupportedStoreError(ValueError):
    """A path exists but is not a zarr store, an HDF5 file or a ``.npy`` file."""


# -- the report ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutFinding:
    """One thing worth knowing about an array's layout, with the reason in numbers.

    Attributes
    ----------
    code
        Stable identifier for scripts: ``"small-chunks"``, ``"large-chunks"``,
        ``"whole-array-chunk"``, ``"slab-chunks"``, ``"read-amplification"``,
        ``"missing-chunks"``, ``"poor-compression"``, ``"serial-decode"``,
        ``"sizes-unknown"``, ``"truncated"``, ``"patch-not-costed"`` or (groups)
        ``"members-unlisted"``,
        ``"link-not-followed"``, ``"no-dataspace"``.
    severity
        ``"warning"`` (patch reads are slower than they need to be) or ``"info"``.
    message
        What was found, why it matters, and how to fix it.
    """

    code: str
    severity: Severity
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-able dict."""
        return {"code": self.code, "severity": self.severity, "message": self.message}


@dataclass(frozen=True)
class PatchCost:
    """Expected cost of reading one uniformly placed patch that lies inside the array.

    Attributes
    ----------
    patch
        Patch shape, one entry per array axis.
    chunks_per_axis
        Expected chunks overlapped along each axis (empty for contiguous arrays).
    chunks_touched
        Expected chunks overlapped in all (their product); ``None`` for contiguous arrays.
    shards_touched
        Expected shards overlapped (sharded arrays; roughly the remote requests per patch).
    patch_bytes
        Bytes of the patch itself.
    decoded_bytes
        Expected bytes decoded to cut it out (every touched chunk is decoded whole).
    read_amplification
        ``decoded_bytes / patch_bytes``.
    """

    patch: tuple[int, ...]
    chunks_per_axis: tuple[float, ...]
    chunks_touched: float | None
    shards_touched: float | None
    patch_bytes: int
    decoded_bytes: float
    read_amplification: float

    def to_dict(self) -> dict[str, Any]:
        """The cost as a JSON-able dict."""
        return {
            "patch": list(self.patch),
            "chunks_per_axis": list(self.chunks_per_axis),
            "chunks_touched": self.chunks_touched,
            "shards_touched": self.shards_touched,
            "patch_bytes": self.patch_bytes,
            "decoded_bytes": self.decoded_bytes,
            "read_amplification": self.read_amplification,
        }


@dataclass(frozen=True)
class ArrayReport:
    """Metadata and stored sizes of one array (zarr array, HDF5 dataset or ``.npy`` file).

    Attributes
    ----------
    path
        Where the array sits below the inspected root (``"/"`` for the root itself,
        ``"/raw/volume"`` below it).
    format
        ``"zarr v2"``, ``"zarr v3"``, ``"hdf5"`` or ``"npy"``.
    shape, dtype
        Array shape and dtype (``str(numpy dtype)``).
    layout
        ``"chunked"``, ``"sharded"``, ``"contiguous"``, ``"compact"``, ``"virtual"`` or
        ``"external"``.
    chunks
        Chunk shape, the unit of decoding (a shard's inner chunk); ``None`` when unchunked.
    shards
        Shard shape (zarr v3 ``sharding_indexed``), the unit of storage; else ``None``.
    codecs
        The stored encoding spelled out in order: zarr v2 filters then compressor, the zarr v3
        codec chain, the HDF5 filter pipeline; ``()`` for raw bytes.
    inner_codecs
        The codec chain of each inner chunk of a shard (sharded arrays), else ``()``.
    compressed
        Whether any codec or filter compresses.
    fill_value
        What chunks never written read as (JSON-able: NaN/infinities as strings).
    order
        Memory order of decoded chunks: ``"C"``, ``"F"`` or a zarr transpose permutation.
    attributes
        Number of user attributes.
    nbytes
        Decoded size of the whole array.
    chunk_nbytes
        Decoded size of one chunk; ``None`` when unchunked or for variable-size dtypes.
    chunks_in_grid, chunks_stored
        Chunks in the grid and chunks actually stored (missing ones read as ``fill_value``);
        for sharded arrays inner chunks (counted from the shard indices).
    shards_in_grid, shards_stored
        The same for shards (sharded arrays), else ``None``.
    stored_bytes
        Bytes the array occupies in storage (chunk or shard objects; HDF5's storage size;
        the data part of a ``.npy``); ``None`` when the store could not tell.
    decoded_bytes
        Bytes the stored chunks decode to (``chunks_stored * chunk_nbytes``).
    findings
        Warnings and notes about the layout, each saying why.
    patch_cost
        Expected cost of a patch of the size asked for, when one was asked for and fits.
    """

    path: str
    format: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    chunks: tuple[int, ...] | None
    shards: tuple[int, ...] | None
    codecs: tuple[str, ...]
    inner_codecs: tuple[str, ...]
    compressed: bool
    fill_value: Any
    order: str
    attributes: int
    nbytes: int
    chunk_nbytes: int | None
    chunks_in_grid: int | None
    chunks_stored: int | None
    shards_in_grid: int | None
    shards_stored: int | None
    stored_bytes: int | None
    decoded_bytes: int | None
    findings: tuple[LayoutFinding, ...] = ()
    patch_cost: PatchCost | None = None

    @property
    def name(self) -> str:
        """Last component of :attr:`path` (``"/"`` for the root)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] or "/"

    @property
    def compression_ratio(self) -> float | None:
        """``decoded_bytes / stored_bytes``: how many times smaller the stored chunks are."""
        if not self.stored_bytes or self.decoded_bytes is None:
            return None
        return self.decoded_bytes / self.stored_bytes

    @property
    def chunks_missing(self) -> int | None:
        """Chunks of the grid never written (they read as the fill value)."""
        if self.chunks_in_grid is None or self.chunks_stored is None:
            return None
        return self.chunks_in_grid - self.chunks_stored

    @property
    def warnings(self) -> tuple[LayoutFinding, ...]:
        """The findings of severity ``"warning"``."""
        return tuple(f for f in self.findings if f.severity == "warning")

    def to_dict(self) -> dict[str, Any]:
        """The array as a JSON-able dict (``"kind": "array"``)."""
        return {
            "kind": "array",
            "path": self.path,
            "name": self.name,
            "format": self.format,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "chunks": None if self.chunks is None else list(self.chunks),
            "shards": None if self.shards is None else list(self.shards),
            "codecs": list(self.codecs),
            "inner_codecs": list(self.inner_codecs),
            "compressed": self.compressed,
            "fill_value": self.fill_value,
            "order": self.order,
            "attributes": self.attributes,
            "nbytes": self.nbytes,
            "chunk_nbytes": self.chunk_nbytes,
            "chunks_in_grid": self.chunks_in_grid,
            "chunks_stored": self.chunks_stored,
            "chunks_missing": self.chunks_missing,
            "shards_in_grid": self.shards_in_grid,
            "shards_stored": self.shards_stored,
            "stored_bytes": self.stored_bytes,
            "decoded_bytes": self.decoded_bytes,
            "compression_ratio": self.compression_ratio,
            "findings": [f.to_dict() for f in self.findings],
            "patch_cost": None if self.patch_cost is None else self.patch_cost.to_dict(),
        }


@dataclass(frozen=True)
class GroupReport:
    """A zarr group or HDF5 group and what it holds.

    Attributes
    ----------
    path
        Where the group sits below the inspected root (``"/"`` for the root).
    format
        ``"zarr v2"``, ``"zarr v3"`` or ``"hdf5"``.
    attributes
        Number of user attributes.
    children
        Member groups and arrays, sorted by name.
    findings
        Notes about members that could not be shown (links, unlistable stores).
    """

    path: str
    format: str
    attributes: int
    children: tuple[GroupReport | ArrayReport, ...] = ()
    findings: tuple[LayoutFinding, ...] = ()

    @property
    def name(self) -> str:
        """Last component of :attr:`path` (``"/"`` for the root)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] or "/"

    def to_dict(self) -> dict[str, Any]:
        """The group and everything below it as a JSON-able dict (``"kind": "group"``)."""
        return {
            "kind": "group",
            "path": self.path,
            "name": self.name,
            "format": self.format,
            "attributes": self.attributes,
            "findings": [f.to_dict() for f in self.findings],
            "children": [c.to_dict() for c in self.children],
        }


@dataclass(frozen=True)
class StoreReport:
    """Everything :func:`inspect_store` found at one location.

    Attributes
    ----------
    location
        The path or URL inspected, safe to show (no credentials, no query string).
    kind
        ``"zarr"``, ``"hdf5"`` or ``"npy"``.
    root
        The root node: a group, or an array when the location is one.
    patch
        The patch shape the costs were asked for (``None``: not asked).
    """

    location: str
    kind: str
    root: GroupReport | ArrayReport
    patch: tuple[int, ...] | None = None

    def nodes(self) -> Iterator[GroupReport | ArrayReport]:
        """Every node, depth first, parents before their children."""
        stack: list[GroupReport | ArrayReport] = [self.root]
        while stack:
            node = stack.pop()
            yield node
            if isinstance(node, GroupReport):
                stack.extend(reversed(node.children))

    def arrays(self) -> list[ArrayReport]:
        """Every array in the tree, depth first."""
        return [n for n in self.nodes() if isinstance(n, ArrayReport)]

    def __getitem__(self, path: str) -> GroupReport | ArrayReport:
        """The node at ``path`` (``"/"``, ``"/raw/volume"``; the leading slash is optional)."""
        want = "/" + path.strip("/")
        for node in self.nodes():
            if node.path == want:
                return node
        known = ", ".join(n.path for n in self.nodes())
        raise KeyError(f"path={path!r} is not in the report; it holds {known}")

    @property
    def warnings(self) -> list[tuple[str, LayoutFinding]]:
        """``(array path, warning)`` for every warning in the tree."""
        return [(a.path, w) for a in self.arrays() for w in a.warnings]

    def to_dict(self) -> dict[str, Any]:
        """The whole report as a JSON-able dict."""
        return {
            "location": self.location,
            "kind": self.kind,
            "patch": None if self.patch is None else list(self.patch),
            "root": self.root.to_dict(),
        }


# -- patch arithmetic ----------------------------------------------------------------------
def parse_patch(patch: PatchLike | None, name: str = "patch") -> tuple[int, ...] | None:
    """Return ``patch`` as a tuple of positive ints (one int stands for every axis).

    Raises
    ------
    TypeError
        When ``patch`` is not an int or a sequence of ints.
    ValueError
        When it is empty or has an entry below 1.
    """
    if patch is None:
        return None
    if isinstance(patch, (str, bytes)):
        raise TypeError(f"{name}={patch!r} must be an int or a sequence of ints")
    values = (patch,) if not isinstance(patch, Sequence) else tuple(patch)
    edges = tuple(parse_int(v, name) for v in values)
    if not edges or min(edges) < 1:
        raise ValueError(f"{name}={patch!r} must be one or more edges, each >= 1")
    return edges


def expected_chunks_along_axis(extent: int, chunk: int, patch: int) -> float:
    """Expected chunks a patch overlaps along one axis, over all placements inside the axis.

    The patch starts at ``s`` uniform in ``0 .. extent - patch`` and overlaps chunks
    ``s // chunk`` to ``(s + patch - 1) // chunk``. The count is periodic in ``s`` with
    period ``chunk`` and sums to ``patch - 1 + chunk`` over one period, so away from the
    edges the expectation is ``(patch - 1) / chunk + 1``; the partial period at the end is
    summed exactly.

    Raises
    ------
    ValueError
        When ``chunk < 1`` or ``patch`` is not between 1 and ``extent``.
    """
    extent, chunk, patch = (
        parse_int(v, n) for v, n in ((extent, "extent"), (chunk, "chunk"), (patch, "patch"))
    )
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    if not 1 <= patch <= extent:
        raise ValueError(f"patch={patch} must be between 1 and extent={extent}")
    placements = extent - patch + 1
    periods, rest = divmod(placements, chunk)
    # the partial period: starts s < rest < chunk, so s // chunk == 0 and the count is
    # 1 + (s + patch - 1) // chunk; integer sums keep it O(1) for any chunk size
    partial = rest + _floor_sum(rest + patch - 1, chunk) - _floor_sum(patch - 1, chunk)
    return (periods * (patch - 1 + chunk) + partial) / placements


def _floor_sum(m: int, c: int) -> int:
    """``sum(t // c for t in range(m))`` in closed form."""
    q, r = divmod(m, c)
    return c * q * (q - 1) // 2 + q * r


def patch_cost(
    shape: Sequence[int],
    chunks: Sequence[int] | None,
    itemsize: int,
    patch: PatchLike,
    shards: Sequence[int] | None = None,
) -> PatchCost:
    """Expected chunks touched and bytes decoded by one uniformly placed patch.

    Placements are independent per axis, so the expected number of chunks is the product of
    :func:`expected_chunks_along_axis` over the axes. Contiguous arrays (``chunks=None``)
    are read directly: nothing is decoded beyond the patch itself.

    Parameters
    ----------
    shape
        Array shape.
    chunks
        Chunk shape (the unit of decoding), or ``None`` for an unchunked array.
    itemsize
        Bytes per element.
    patch
        Patch shape (one int for every axis); must fit inside ``shape``.
    shards
        Shard shape, to count the shards touched as well.

    Raises
    ------
    ValueError
        When ``patch`` does not match or fit ``shape``.
    """
    dims = tuple(parse_int(d, "shape") for d in shape)
    edges = _fit_patch(dims, parse_patch(patch))
    if isinstance(edges, str):
        raise ValueError(edges)
    patch_bytes = math.prod(edges) * itemsize
    if chunks is None:
        return PatchCost(edges, (), None, None, patch_bytes, float(patch_bytes), 1.0)
    per_axis = tuple(expected_chunks_along_axis(d, c, p) for d, c, p in zip(dims, chunks, edges))
    touched = math.prod(per_axis)
    decoded = touched * math.prod(chunks) * itemsize
    shards_touched = None
    if shards is not None:
        shards_touched = math.prod(
            expected_chunks_along_axis(d, s, p) for d, s, p in zip(dims, shards, edges)
        )
    amplification = decoded / patch_bytes if patch_bytes else 1.0
    return PatchCost(edges, per_axis, touched, shards_touched, patch_bytes, decoded, amplification)


def _fit_patch(shape: tuple[int, ...], patch: tuple[int, ...] | None) -> tuple[int, ...] | str:
    """``patch`` broadcast to ``shape``'s axes, or a sentence saying why it does not fit."""
    if patch is None:
        return tuple(min(DEFAULT_PATCH_EDGE, d) for d in shape)
    if len(patch) == 1:
        patch = patch * len(shape)
    if len(patch) != len(shape):
        return f"patch {_shape_text(patch)} has {len(patch)} axes, the array has {len(shape)}"
    if any(p > d for p, d in zip(patch, shape)):
        return f"patch {_shape_text(patch)} does not fit inside shape {_shape_text(shape)}"
    return patch


def suggest_chunks(
    shape: Sequence[int], itemsize: int, target: int = TARGET_CHUNK_BYTES
) -> tuple[int, ...]:
    """A cubic chunk shape (power-of-two edge, capped by each axis) of at most ``target`` bytes.

    Falls back to edge 1 when even that is larger than ``target``.
    """
    edge = 1
    while edge < max(shape, default=1):
        bigger = tuple(min(2 * edge, d) for d in shape)
        if math.prod(bigger) * itemsize > target:
            break
        edge *= 2
    return tuple(min(edge, d) for d in shape)


# -- findings ------------------------------------------------------------------------------
def _findings(
    report: ArrayReport,
    patch: tuple[int, ...] | None,
    remote: bool,
    extra: Sequence[LayoutFinding] = (),
) -> ArrayReport:
    """``report`` with its layout findings and (when ``patch`` was asked) its patch cost."""
    found: list[LayoutFinding] = []
    cost: PatchCost | None = None
    itemsize = np.dtype(report.dtype).itemsize if report.chunk_nbytes is not None else 0
    fitted = _fit_patch(report.shape, patch) if report.shape else "a 0-d array has no patches"
    if isinstance(fitted, str):
        if patch is not None:
            found.append(LayoutFinding("patch-not-costed", "info", f"no patch cost: {fitted}"))
    elif report.chunks is not None and report.chunk_nbytes is not None:
        default = patch_cost(report.shape, report.chunks, itemsize, fitted, report.shards)
        found.extend(_chunk_findings(report, default, patch is not None, remote))
        if patch is not None:
            cost = default
    elif patch is not None and report.chunks is None and report.layout != "virtual":
        cost = patch_cost(report.shape, None, np.dtype(report.dtype).itemsize, fitted)
    found.extend(_storage_findings(report))
    found.extend(extra)
    return replace(report, findings=tuple(found), patch_cost=cost)


def _chunk_findings(
    a: ArrayReport, cost: PatchCost, explicit: bool, remote: bool
) -> list[LayoutFinding]:
    assert a.chunks is not None and a.chunk_nbytes is not None and cost.chunks_touched is not None
    found: list[LayoutFinding] = []
    shape, chunks, size = a.shape, a.chunks, a.chunk_nbytes
    itemsize = np.dtype(a.dtype).itemsize
    unit = "inner chunks" if a.shards is not None else "chunks"
    what = f"{unit} {_shape_text(chunks)} {a.dtype} = {format_bytes(size)} decoded"
    which = "a" if explicit else "e.g. a"
    costs = (
        f"{which} {_patch_text(cost.patch)} patch ({format_bytes(cost.patch_bytes)}) touches "
        f"{cost.chunks_touched:.3g} {unit} and decodes {format_bytes(cost.decoded_bytes)} "
        f"(read amplification {_times(cost.read_amplification)})"
    )
    better = suggest_chunks(shape, itemsize)
    fix = (
        f"rechunk to e.g. {_shape_text(better)} "
        f"({format_bytes(math.prod(better) * itemsize)} decoded)"
    )
    whole = all(c >= d for c, d in zip(chunks, shape))
    split = [k for k, (c, d) in enumerate(zip(chunks, shape)) if c < d]
    warned = False
    if size < SMALL_CHUNK_BYTES and not whole and a.nbytes > SMALL_CHUNK_BYTES:
        if a.shards is not None:
            why = (
                "mixle merges neighbouring inner chunks of a shard into few requests, but "
                "each inner chunk is still one decode call, so per-chunk overhead dominates"
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
        if longest >= SLAB_ASPECT_RATIO * chunks[thin] and cost.patch[thin] > chunks[thin]:
            found.append(
                LayoutFinding(
                    "slab-chunks",
                    "warning",
                    f"{unit} {_shape_text(chunks)} are slabs (edge {chunks[thin]} along axis "
                    f"{thin} vs {longest}): {which} {_patch_text(cost.patch)} patch touches "
                    f"{cost.chunks_per_axis[thin]:.3g} {unit} along axis {thin} alone and "
                    f"{cost.chunks_touched:.3g} in all, decoding "
                    f"{format_bytes(cost.decoded_bytes)} for "
                    f"{format_bytes(cost.patch_bytes)} (read amplification "
                    f"{_times(cost.read_amplification)}); {fix}",
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
                f"smaller chunks decode less, e.g. {_shape_text(smaller)} "
                f"({format_bytes(math.prod(smaller) * itemsize)}; below "
                f"{format_bytes(SMALL_CHUNK_BYTES)} per-chunk overhead takes over)",
            )
        )
    return found


def _storage_findings(a: ArrayReport) -> list[LayoutFinding]:
    found: list[LayoutFinding] = []
    missing = a.chunks_missing
    if missing and a.chunks_in_grid:
        unit = "inner chunks" if a.shards is not None else "chunks"
        found.append(
            LayoutFinding(
                "missing-chunks",
                "info",
                f"{missing} of {a.chunks_in_grid} {unit} never written "
                f"({100 * missing / a.chunks_in_grid:.0f}%): they read as the fill value "
                f"{a.fill_value!r} without any I/O",
            )
        )
    if a.chunks is None and a.stored_bytes == 0 and a.nbytes > 0:
        found.append(
            LayoutFinding(
                "missing-chunks",
                "info",
                f"never written (no storage allocated): reads as the fill value {a.fill_value!r}",
            )
        )
    ratio = a.compression_ratio
    big = (a.chunk_nbytes or a.nbytes) >= SMALL_CHUNK_BYTES  # tiny chunks: codec headers
    if a.compressed and big and ratio is not None and ratio < POOR_COMPRESSION_RATIO:
        found.append(
            LayoutFinding(
                "poor-compression",
                "info",
                f"compression saves little (ratio {ratio:.3g}x < {POOR_COMPRESSION_RATIO:g}x): "
                "every chunk pays a decode for almost no space; store it uncompressed or try "
                "a shuffle filter before the compressor",
            )
        )
    return found


# -- formatting helpers --------------------------------------------------------------------
def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"64 KiB"``, ``"1.5 GiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.0f}" if unit == "B" or value == int(value) else f"{value:.3g}"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _times(x: float) -> str:
    return f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x"


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _patch_text(patch: Sequence[int]) -> str:
    if len(set(patch)) == 1 and len(patch) > 1:
        return f"{patch[0]}^{len(patch)}"
    return "x".join(str(p) for p in patch)


def _plain(value: Any) -> Any:
    """A fill value as JSON-able data (non-finite floats as ``"NaN"``/``"Infinity"``)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, complex):
        return [_plain(value.real), _plain(value.imag)]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _spell(name: str, config: dict[str, Any]) -> str:
    """``name(key=value, ...)``; nested codec lists spelled the same way."""
    parts = [f"{k}={_spell_value(v)}" for k, v in config.items()]
    return f"{name}({', '.join(parts)})" if parts else name


def _spell_value(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return _spell(value["name"], dict(value.get("configuration") or {}))
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) and "name" in v for v in value):
            return "[" + " -> ".join(_spell_value(v) for v in value) + "]"
        return _shape_text(value) if all(isinstance(v, int) for v in value) else str(list(value))
    return str(getattr(value, "value", value))


# -- zarr ----------------------------------------------------------------------------------
def _inspect_zarr(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport | ArrayReport:
    from mixle.reading.faults import retry_call
    from mixle.utils.optional_deps import require

    zarr = require("zarr", "zarr", feature="mixle inspect")
    kwargs: dict[str, Any] = {"mode": "r"}
    if storage_options:
        kwargs["storage_options"] = storage_options
    try:
        node = retry_call(
            lambda: zarr.open(store=location, **kwargs),
            url=display_path(location),
            key="(metadata)",
            secrets=storage_options,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise UnsupportedStoreError(
            f"{display_path(location)!r} holds zarr metadata but zarr cannot open it: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    remote = _is_remote(location)
    where = display_path(location)
    return _zarr_node(zarr, node, "/", patch, remote, where, storage_options)


def _zarr_node(
    zarr: Any,
    node: Any,
    path: str,
    patch: tuple[int, ...] | None,
    remote: bool,
    where: str,
    secrets: Any,
) -> GroupReport | ArrayReport:
    fmt = f"zarr v{node.metadata.zarr_format}"
    if isinstance(node, zarr.Array):
        return _zarr_array(node, path, fmt, patch, remote, where, secrets)
    members = sorted(node.members(), key=lambda m: m[0])
    children = tuple(
        _zarr_node(zarr, child, f"{path.rstrip('/')}/{name}", patch, remote, where, secrets)
        for name, child in members
    )
    notes: list[LayoutFinding] = []
    consolidated = getattr(node.metadata, "consolidated_metadata", None) is not None
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


def _zarr_array(
    array: Any,
    path: str,
    fmt: str,
    patch: tuple[int, ...] | None,
    remote: bool,
    where: str,
    secrets: Any,
) -> ArrayReport:
    from mixle.data.sources.zarr_chunks import codec_chain

    meta = array.metadata
    dtype = np.dtype(array.dtype) if isinstance(array.dtype, np.dtype) else None
    shape = tuple(int(s) for s in array.shape)
    chunks = tuple(int(c) for c in array.chunks)
    shards = None if array.shards is None else tuple(int(s) for s in array.shards)
    itemsize = None if dtype is None or dtype.kind in "OT" else dtype.itemsize
    codecs, inner, order, compressed = _zarr_codecs(meta)
    grid = tuple(math.ceil(d / c) for d, c in zip(shape, shards or chunks))
    inner_grid = tuple(math.ceil(d / c) for d, c in zip(shape, chunks))
    notes: list[LayoutFinding] = []
    sizes, why = _zarr_object_sizes(array, grid, remote)
    stored_bytes = None if sizes is None else sum(sizes.values())
    objects_stored = None if sizes is None else len(sizes)
    chunks_stored: int | None = objects_stored
    if sizes is None:
        notes.append(LayoutFinding("sizes-unknown", "info", f"stored sizes unknown: {why}"))
    elif shards is not None:
        chunks_stored, why = _count_inner_chunks(array, sorted(sizes), where, secrets)
        if chunks_stored is None:
            notes.append(LayoutFinding("sizes-unknown", "info", f"inner chunks not counted: {why}"))
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
        layout="sharded" if shards is not None else "chunked",
        chunks=chunks,
        shards=shards,
        codecs=codecs,
        inner_codecs=inner,
        compressed=compressed,
        fill_value=_plain(array.fill_value),
        order=order,
        attributes=len(array.attrs),
        nbytes=math.prod(shape) * (itemsize or 0),
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=math.prod(inner_grid),
        chunks_stored=chunks_stored,
        shards_in_grid=None if shards is None else math.prod(grid),
        shards_stored=None if shards is None else objects_stored,
        stored_bytes=stored_bytes,
        decoded_bytes=decoded,
    )
    return _findings(report, patch, remote, notes)


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
        spelled.append(_spell(codec["name"], config))
    for codec in [*outer, *inner]:
        if codec["name"] == "transpose":
            perm = tuple(codec["configuration"]["order"])
            order = (
                "C"
                if perm == tuple(sorted(perm))
                else "F"
                if perm == tuple(sorted(perm, reverse=True))
                else f"transpose{_shape_text(perm)}"
            )
    compressed = any(c["name"] not in _ZARR_NOT_COMPRESSING for c in [*outer, *inner])
    return tuple(spelled), tuple(_spell_value(c) for c in inner), order, compressed


def _numcodec(codec: Any) -> str:
    config = dict(codec.get_config())
    name = config.pop("id")
    if name == "blosc" and config.get("shuffle") in _BLOSC_SHUFFLE:
        config["shuffle"] = _BLOSC_SHUFFLE[config["shuffle"]]
    return _spell(name, config)


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
) -> tuple[dict[tuple[int, ...], int] | None, str]:
    """Size of each stored chunk (or shard) object by grid coords; ``None`` and why if unknown."""
    from zarr.storage import FsspecStore, LocalStore

    parse = _key_parser(array.metadata, len(grid))
    store = array.store
    listed: dict[str, int] | None = None
    if isinstance(store, LocalStore):
        base = os.path.join(os.fspath(store.root), *filter(None, array.path.split("/")))
        listed = _walk_sizes(base)
    elif isinstance(store, FsspecStore) and not _cannot_list(store):
        listed = _fsspec_sizes(store, array.path)
    if listed is not None:
        sizes: dict[tuple[int, ...], int] = {}
        for key, size in listed.items():
            coords = parse(key)
            if coords is not None and all(c < g for c, g in zip(coords, grid)):
                sizes[coords] = size
        return sizes, ""
    count = math.prod(grid)
    if count > MAX_PROBED_OBJECTS:
        return None, (
            f"the store cannot list its objects and the grid has {count} of them, more than "
            f"MAX_PROBED_OBJECTS={MAX_PROBED_OBJECTS} to ask for one by one"
        )
    return _probe_sizes(array, grid), ""


def _walk_sizes(base: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for folder, _dirs, files in os.walk(base):
        rel = os.path.relpath(folder, base)
        for name in files:
            if name in _ZARR_METADATA:
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
        if not name.startswith(root + "/") or name.rsplit("/", 1)[-1] in _ZARR_METADATA:
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


def _count_inner_chunks(
    array: Any, shards: list[tuple[int, ...]], where: str, secrets: Any
) -> tuple[int | None, str]:
    """Inner chunks written in the stored ``shards``, counted from their shard indices."""
    from mixle.data.sources.zarr_shards import ShardedZarrReader

    reader = ShardedZarrReader.for_array(array, where, where, secrets)
    if reader is None:
        return None, "codecs around the shards that mixle does not read itself"
    if len(shards) > MAX_PROBED_OBJECTS:
        return None, (
            f"{len(shards)} shards stored, more than MAX_PROBED_OBJECTS={MAX_PROBED_OBJECTS} "
            "indices to read"
        )
    empty = np.uint64(2**64 - 1)
    total = 0
    for index in reader._shard_indices(shards).values():
        if index is not None:
            total += int(np.count_nonzero((index[..., 0] != empty) | (index[..., 1] != empty)))
    return total, ""


def _cannot_list(store: Any) -> bool:
    """Whether ``store`` is a plain HTTP(S) store, whose folders cannot be listed reliably."""
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", ())
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return any(p in ("http", "https") for p in protocols)


# -- HDF5 ----------------------------------------------------------------------------------
def _inspect_hdf5(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport:
    from mixle.utils.optional_deps import require

    h5py = require("h5py", "hdf5", feature="mixle inspect")
    remote = _is_remote(location)
    handle = None
    if remote:
        from mixle.data.sources.hdf5_remote import open_remote_file
        from mixle.reading.faults import retry_call

        _fs, _path, handle = retry_call(
            lambda: open_remote_file(location, storage_options),
            url=display_path(location),
            key="(file)",
            secrets=storage_options,
        )
    try:
        try:
            file = h5py.File(handle if handle is not None else location, "r")
        except OSError as exc:
            raise UnsupportedStoreError(
                f"{display_path(location)!r} looks like an HDF5 file but h5py cannot open it: {exc}"
            ) from None
        with file:
            return _hdf5_group(h5py, file, "/", patch, remote)
    finally:
        if handle is not None:
            handle.close()


def _hdf5_group(
    h5py: Any, group: Any, path: str, patch: tuple[int, ...] | None, remote: bool
) -> GroupReport:
    children: list[GroupReport | ArrayReport] = []
    notes: list[LayoutFinding] = []
    for name in group:
        link = group.get(name, getlink=True)
        child_path = f"{path.rstrip('/')}/{name}"
        if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
            target = (
                link.path if isinstance(link, h5py.SoftLink) else f"{link.filename}:{link.path}"
            )
            notes.append(
                LayoutFinding(
                    "link-not-followed", "info", f"link {name!r} -> {target!r} not followed"
                )
            )
            continue
        node = group.get(name)
        if isinstance(node, h5py.Group):
            children.append(_hdf5_group(h5py, node, child_path, patch, remote))
        elif isinstance(node, h5py.Dataset):
            if node.shape is None:
                notes.append(
                    LayoutFinding(
                        "no-dataspace", "info", f"dataset {name!r} is empty (no dataspace)"
                    )
                )
            else:
                children.append(_hdf5_dataset(h5py, node, child_path, patch, remote))
    return GroupReport(path, "hdf5", len(group.attrs), tuple(children), tuple(notes))


def _hdf5_dataset(
    h5py: Any, dataset: Any, path: str, patch: tuple[int, ...] | None, remote: bool
) -> ArrayReport:
    from mixle.data.sources.hdf5_chunks import decodable_filters

    dcpl = dataset.id.get_create_plist()
    layout = {
        h5py.h5d.CONTIGUOUS: "contiguous",
        h5py.h5d.CHUNKED: "chunked",
        h5py.h5d.COMPACT: "compact",
        h5py.h5d.VIRTUAL: "virtual",
    }.get(dcpl.get_layout(), "unknown")
    if dataset.external:
        layout = "external"
    filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    codecs = tuple(_hdf5_filter(code, values, name) for code, _flags, values, name in filters)
    compressed = any(code not in _HDF5_NOT_COMPRESSING for code, *_ in filters)
    dtype = dataset.dtype
    shape = tuple(int(s) for s in dataset.shape)
    chunks = None if dataset.chunks is None else tuple(int(c) for c in dataset.chunks)
    itemsize = None if dtype.hasobject else dtype.itemsize  # variable-length: no fixed size
    nbytes = math.prod(shape) * dtype.itemsize
    stored = int(dataset.id.get_storage_size())
    if chunks is not None:
        grid = math.prod(math.ceil(d / c) for d, c in zip(shape, chunks))
        n_stored = int(dataset.id.get_num_chunks())
        chunk_nbytes = None if itemsize is None else math.prod(chunks) * itemsize
        decoded = None if chunk_nbytes is None else n_stored * chunk_nbytes
    else:
        grid = n_stored = None  # type: ignore[assignment]
        chunk_nbytes = None
        decoded = nbytes if stored else 0
    notes: list[LayoutFinding] = []
    if chunks is not None and filters and decodable_filters(dataset) is None:
        names = ", ".join(c.split("(")[0] for c in codecs)
        notes.append(
            LayoutFinding(
                "serial-decode",
                "info",
                f"h5py decodes these chunks ({names}) under its process-wide lock, so threads "
                "cannot decode them in parallel; mixle decodes gzip and shuffle itself, in "
                "parallel",
            )
        )
    report = ArrayReport(
        path=path,
        format="hdf5",
        shape=shape,
        dtype=str(dtype),
        layout=layout,
        chunks=chunks,
        shards=None,
        codecs=codecs,
        inner_codecs=(),
        compressed=compressed,
        fill_value=_plain(dataset.fillvalue),
        order="C",
        attributes=len(dataset.attrs),
        nbytes=nbytes,
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=grid,
        chunks_stored=n_stored,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=decoded,
    )
    return _findings(report, patch, remote, notes)


def _hdf5_filter(code: int, values: tuple[int, ...], name: bytes) -> str:
    """One HDF5 filter spelled out from its id and client values."""
    if code == 1:
        return f"gzip(level={values[0] if values else 6})"
    if code == 2:
        return "shuffle"
    if code == 3:
        return "fletcher32"
    if code == 4 and len(values) >= 2:
        coding = "nn" if values[0] & 32 else "ec" if values[0] & 4 else f"mask={values[0]}"
        return f"szip(coding={coding}, pixels_per_block={values[1]})"
    if code == 5:
        return "nbit"
    if code == 6 and len(values) >= 2:
        kind = {0: "float_dscale", 1: "float_escale", 2: "int"}.get(values[0], str(values[0]))
        return f"scaleoffset(type={kind}, factor={values[1]})"
    if code == 32000:
        return "lzf"
    if code == 32001 and len(values) >= 7:
        cname = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}
        shuffle = _BLOSC_SHUFFLE.get(values[5], str(values[5]))
        return (
            f"blosc(cname={cname.get(values[6], values[6])}, clevel={values[4]}, shuffle={shuffle})"
        )
    if code == 32015:
        return f"zstd(level={values[0] if values else 3})"
    label = name.decode("ascii", "replace") if name else "filter"
    return f"{label}(id={code}, values={list(values)})"


# -- .npy ----------------------------------------------------------------------------------
def _inspect_npy(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> ArrayReport:
    if _is_remote(location):
        fs, path = _url_fs(location, storage_options)
        size = int(fs.size(path))
        with fs.open(path, "rb") as fh:
            header = _npy_header(fh, location)
    else:
        size = os.path.getsize(location)
        with open(location, "rb") as fh:
            header = _npy_header(fh, location)
    shape, fortran, dtype, offset = header
    nbytes = math.prod(shape) * dtype.itemsize
    stored = size - offset
    notes: list[LayoutFinding] = []
    if dtype.hasobject:
        notes.append(
            LayoutFinding("sizes-unknown", "info", "holds pickled Python objects: not mappable")
        )
    elif stored < nbytes:
        notes.append(
            LayoutFinding(
                "truncated",
                "warning",
                f"the file holds {format_bytes(stored)} of data, the header promises "
                f"{format_bytes(nbytes)}: it is truncated and cannot be read whole",
            )
        )
    report = ArrayReport(
        path="/",
        format="npy",
        shape=shape,
        dtype=str(dtype),
        layout="contiguous",
        chunks=None,
        shards=None,
        codecs=(),
        inner_codecs=(),
        compressed=False,
        fill_value=None,
        order="F" if fortran else "C",
        attributes=0,
        nbytes=nbytes,
        chunk_nbytes=None,
        chunks_in_grid=None,
        chunks_stored=None,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=None if dtype.hasobject else min(stored, nbytes),
    )
    return _findings(report, patch, _is_remote(location), notes)


def _npy_header(fh: Any, location: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` from a ``.npy`` header."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(fh)
    except ValueError as exc:
        raise UnsupportedStoreError(
            f"{display_path(location)!r} has a broken .npy header: {exc}"
        ) from None
    return tuple(int(s) for s in shape), bool(fortran), np.dtype(dtype), int(fh.tell())


# -- dispatch ------------------------------------------------------------------------------
def inspect_store(
    path_or_url: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    patch: PatchLike | None = None,
) -> StoreReport:
    """Describe the arrays in a zarr store, an HDF5 file or a ``.npy`` file.

    Reads metadata and stored object sizes only; chunk data is never read or decoded, and
    everything is opened read-only.

    Parameters
    ----------
    path_or_url
        A local path (zarr group or array folder, HDF5 file, ``.npy`` file) or a URL
        (``file://``, ``http(s)://``, ``s3://``, ... through fsspec).
    storage_options
        Passed to fsspec for URLs (credentials, endpoints); never shown in the report.
    patch
        A patch shape (one int for every axis) to cost for every array it fits: expected
        chunks touched and bytes decoded (:class:`PatchCost`). The warnings use it for their
        numbers too (else a cube of edge :data:`DEFAULT_PATCH_EDGE`).

    Returns
    -------
    StoreReport
        The tree of groups and arrays with their findings.

    Raises
    ------
    FileNotFoundError
        When nothing exists at ``path_or_url``.
    UnsupportedStoreError
        When it exists but is not a zarr store, an HDF5 file or a ``.npy`` file.
    TypeError, ValueError
        For a bad ``path_or_url``, ``storage_options`` or ``patch``.
    ImportError
        When the library the store needs (zarr, h5py, fsspec) is missing.
    """
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url={path_or_url!r} must be a path or a URL string")
    location = os.fspath(path_or_url)
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options={storage_options!r} must be a dict of fsspec options")
    edges = parse_patch(patch)
    if location.startswith("file://"):
        location = location[len("file://") :]
    if storage_options and not _is_remote(location):
        raise ValueError(
            f"storage_options only apply to URLs (such as s3://bucket/x.zarr); "
            f"{display_path(location)!r} is not one"
        )
    kind = _detect(location, storage_options)
    inspect = {"zarr": _inspect_zarr, "hdf5": _inspect_hdf5, "npy": _inspect_npy}[kind]
    root = inspect(location, storage_options, edges)
    return StoreReport(display_path(path_or_url), kind, root, edges)


def _detect(location: str, storage_options: dict[str, Any] | None) -> str:
    """``"zarr"``, ``"hdf5"`` or ``"npy"``: what lives at ``location``."""
    shown = display_path(location)
    expected = "is not a zarr store, an HDF5 file or a .npy file"
    if not _is_remote(location):
        if not os.path.exists(location):
            raise FileNotFoundError(f"{shown!r} does not exist")
        if os.path.isdir(location):
            if any(os.path.isfile(os.path.join(location, m)) for m in _ZARR_METADATA):
                return "zarr"
            raise UnsupportedStoreError(
                f"{shown!r} {expected} (a folder with no zarr.json, .zarray or .zgroup)"
            )
        with open(location, "rb") as fh:
            head = fh.read(8)
        if head.startswith(_NPY_MAGIC):
            return "npy"
        from mixle.utils.optional_deps import HAS_H5PY

        if head == _HDF5_MAGIC or (HAS_H5PY and _is_hdf5_local(location)):
            return "hdf5"
        raise UnsupportedStoreError(f"{shown!r} {expected}")
    fs, path = _url_fs(location, storage_options)
    base = path.rstrip("/")
    for name in ("zarr.json", ".zarray", ".zgroup"):
        if fs.exists(f"{base}/{name}"):
            return "zarr"
    try:
        with fs.open(path, "rb") as fh:
            head = fh.read(8)
    except (FileNotFoundError, IsADirectoryError):
        raise FileNotFoundError(
            f"{shown!r} does not exist (no file there, and no zarr.json, .zarray or .zgroup "
            "below it)"
        ) from None
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if head == _HDF5_MAGIC:
        return "hdf5"
    raise UnsupportedStoreError(f"{shown!r} {expected}")


def _is_hdf5_local(path: str) -> bool:
    import h5py

    return bool(h5py.is_hdf5(path))  # also finds the signature after a user block


def _url_fs(location: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    from mixle.utils.optional_deps import require

    require("fsspec", "remote", feature="mixle inspect on URLs")
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]

    return url_to_fs(location, **(storage_options or {}))


def _is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")
