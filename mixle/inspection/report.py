"""The report :func:`~mixle.inspection.inspect_store` returns: frozen dataclasses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from mixle.errors import UnsupportedStoreError

__all__ = [
    "ArrayReport",
    "GroupReport",
    "LayoutFinding",
    "PatchCost",
    "Severity",
    "StoreReport",
    "UnsupportedStoreError",
]

Severity = Literal["warning", "info"]


# -- the report ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutFinding:
    """One thing worth knowing about an array's layout, with the reason in numbers.

    Attributes
    ----------
    code
        Stable identifier for scripts: ``"small-chunks"``, ``"large-chunks"``,
        ``"whole-array-chunk"``, ``"slab-chunks"``, ``"read-amplification"``,
        ``"missing-chunks"``, ``"poor-compression"``, ``"serial-decode"``, ``"virtual"``,
        ``"stale-consolidated-metadata"``, ``"nested-chunks-ignored"``,
        ``"sizes-unknown"``, ``"truncated"``, ``"patch-not-costed"`` or (groups)
        ``"members-unlisted"``,
        ``"link-not-followed"``, ``"no-dataspace"``, ``"dimension-scales"``,
        ``"hard-link-cycle"``, ``"hard-link-repeat"``, ``"too-deep"``; ``"corrupt-shard"`` (a
        stored shard whose index cannot be read); ``"cf-packed"`` (CF-packed values read
        as stored by default). Other formats add their own: TIFF ``"whole-row-strips"``,
        ``"tile-size"``, ``"memory-mapped"``; NIfTI ``"gzip-whole-file"``,
        ``"scaled-values"``, ``"physical-space"``, ``"no-physical-space"``; N5
        ``"unsupported-compression"``, ``"stray-files"``, ``"unsupported-version"``;
        blosc2 ``"block-reads"``, ``"blocks-untiled"``, ``"whole-chunk-reads"``,
        ``"no-checksum"``; ``.npz``
        ``"compressed-member"``; zipped zarr ``"zip-deflated"``, ``"zip-compression"``;
        icechunk ``"icechunk"``.
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
        ``"zarr v2"``, ``"zarr v3"``, ``"hdf5"``, ``"npy"``, or another format's name
        (``"tiff"``, ``"bigtiff"``, ``"ome-tiff"``, ``"nifti-1"``, ``"nifti-2"``, ``"n5"``,
        ``"b2nd"``, ``"npz"``).
    shape, dtype
        Array shape and dtype (``str(numpy dtype)``).
    itemsize
        Bytes per element; ``None`` for variable-length dtypes (strings, Python objects).
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
        Decoded size of the whole array; ``None`` for variable-length dtypes.
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
        Bytes the stored chunks decode to (``chunks_stored * chunk_nbytes``; edge chunks
        count whole, padding included, as that is what decoding them costs).
    data_bytes
        Bytes of array data the stored chunks hold: :attr:`decoded_bytes` without the
        padding of edge chunks that hang over the array's end (``nbytes`` when every chunk
        is stored); ``None`` when unknown.
    virtual_sources
        For an HDF5 virtual dataset, its sources as ``"file:dataset"`` (``"."`` is the
        file itself); else ``()``.
    findings
        Warnings and notes about the layout, each saying why.
    patch_cost
        Expected cost of a patch of the size asked for, when one was asked for and fits.
    """

    path: str
    format: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int | None
    layout: str
    chunks: tuple[int, ...] | None
    shards: tuple[int, ...] | None
    codecs: tuple[str, ...]
    inner_codecs: tuple[str, ...]
    compressed: bool
    fill_value: Any
    order: str
    attributes: int
    nbytes: int | None
    chunk_nbytes: int | None
    chunks_in_grid: int | None
    chunks_stored: int | None
    shards_in_grid: int | None
    shards_stored: int | None
    stored_bytes: int | None
    decoded_bytes: int | None
    data_bytes: int | None = None
    virtual_sources: tuple[str, ...] = ()
    findings: tuple[LayoutFinding, ...] = ()
    patch_cost: PatchCost | None = None

    @property
    def name(self) -> str:
        """Last component of :attr:`path` (``"/"`` for the root)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] or "/"

    @property
    def compression_ratio(self) -> float | None:
        """``data_bytes / stored_bytes``: the array data the stored chunks hold per stored byte.

        Counted over the real data (edge chunks without their padding), so the same data
        gives about the same ratio whatever its chunk shape; ``None`` when either is unknown.
        """
        if not self.stored_bytes or self.data_bytes is None:
            return None
        return self.data_bytes / self.stored_bytes

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
            "itemsize": self.itemsize,
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
            "data_bytes": self.data_bytes,
            "virtual_sources": list(self.virtual_sources),
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
        ``"zarr"``, ``"hdf5"``, ``"npy"``, ``"tiff"``, ``"nifti"``, ``"n5"``, ``"b2nd"``,
        ``"npz"``, ``"zarr-zip"`` or ``"icechunk"``.
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
