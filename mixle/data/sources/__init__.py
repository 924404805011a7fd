"""Storage adapters: lazy, index-addressable sources (one module per storage family)."""

from mixle.data.sources.arrays.adopt import ArrayLikeSource, as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.memmap.source import MemmapArraySource, NpyArraySource
from mixle.data.sources.arrays.zarr.source import ZarrArraySource

__all__ = [
    "ArrayLikeSource",
    "ArraySource",
    "HDF5ArraySource",
    "MemmapArraySource",
    "NpyArraySource",
    "ZarrArraySource",
    "as_array_source",
]
