"""Storage adapters: lazy, index-addressable sources (one module per storage family)."""

from mixle.data.sources.adopt import ArrayLikeSource, as_array_source
from mixle.data.sources.base import ArraySource
from mixle.data.sources.hdf5_source import HDF5ArraySource
from mixle.data.sources.memmap_source import MemmapArraySource, NpyArraySource
from mixle.data.sources.zarr_source import ZarrArraySource

__all__ = [
    "ArrayLikeSource",
    "ArraySource",
    "HDF5ArraySource",
    "MemmapArraySource",
    "NpyArraySource",
    "ZarrArraySource",
    "as_array_source",
]
