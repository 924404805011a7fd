"""What is in a zarr store, an HDF5 file or a ``.npy`` file, and how well it suits patch reads.

:func:`inspect_volumes` summarises a collection of volumes (a glob or a table of paths)
instead: a :class:`CollectionReport`.

:func:`inspect_store` reads metadata and the sizes of stored objects only (never chunk data)
and returns a :class:`StoreReport`: a tree of :class:`GroupReport` and :class:`ArrayReport`
nodes. Each array lists its chunking, sharding, codecs, fill value, stored and decoded bytes,
and :class:`LayoutFinding` s that say, with numbers, why its layout helps or hurts reading
random N-D patches. :func:`patch_cost` gives the exact expected number of chunks a uniformly
placed patch touches and the bytes it decodes. Every threshold is a named constant
(defined in :mod:`mixle.inspection.findings`, re-exported here), and so is every bound on
what hostile input may cost: :data:`MAX_METADATA_BYTES`, :data:`MAX_METADATA_DEPTH`,
:data:`MAX_NPY_HEADER_BYTES` (special files are refused before any read).
"""

from mixle.inspection.collections import (
    MAX_LISTED,
    SPATIAL_AXES,
    TABLE_SUFFIXES,
    ArraysSummary,
    CollectionReport,
    VolumeFacts,
    inspect_volumes,
    is_collection,
)
from mixle.inspection.findings import (
    HIGH_READ_AMPLIFICATION_PER_AXIS,
    LARGE_CHUNK_BYTES,
    POOR_COMPRESSION_RATIO,
    SLAB_ASPECT_RATIO,
    SMALL_CHUNK_BYTES,
)
from mixle.inspection.formatting import format_bytes
from mixle.inspection.limits import (
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    InvalidMetadataError,
    MetadataLimitError,
)
from mixle.inspection.npy_files import MAX_NPY_HEADER_BYTES, NpyHeaderTooLargeError
from mixle.inspection.patches import (
    DEFAULT_PATCH_EDGE,
    TARGET_CHUNK_BYTES,
    PatchLike,
    expected_chunks_along_axis,
    parse_patch,
    patch_cost,
    suggest_chunks,
)
from mixle.inspection.report import (
    ArrayReport,
    GroupReport,
    LayoutFinding,
    PatchCost,
    StoreReport,
    UnsupportedStoreError,
)
from mixle.inspection.store import inspect_store
from mixle.inspection.zarr_stores import MAX_PROBED_OBJECTS

__all__ = [
    "DEFAULT_PATCH_EDGE",
    "HIGH_READ_AMPLIFICATION_PER_AXIS",
    "LARGE_CHUNK_BYTES",
    "MAX_LISTED",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_DEPTH",
    "MAX_NPY_HEADER_BYTES",
    "MAX_PROBED_OBJECTS",
    "POOR_COMPRESSION_RATIO",
    "SLAB_ASPECT_RATIO",
    "SMALL_CHUNK_BYTES",
    "SPATIAL_AXES",
    "TABLE_SUFFIXES",
    "TARGET_CHUNK_BYTES",
    "ArrayReport",
    "ArraysSummary",
    "CollectionReport",
    "GroupReport",
    "LayoutFinding",
    "InvalidMetadataError",
    "MetadataLimitError",
    "NpyHeaderTooLargeError",
    "PatchCost",
    "PatchLike",
    "StoreReport",
    "UnsupportedStoreError",
    "VolumeFacts",
    "expected_chunks_along_axis",
    "format_bytes",
    "inspect_store",
    "inspect_volumes",
    "is_collection",
    "parse_patch",
    "patch_cost",
    "suggest_chunks",
]
