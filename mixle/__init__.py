"""mixle: lazy, index-addressable sources and seeded N-D patches for data bigger than memory.

``import mixle`` imports NumPy only; zarr, h5py, fsspec and jax are imported by the
adapters that need them.
"""

from mixle.data.patch_sampler import PatchSampler
from mixle.data.schema import Schema
from mixle.data.sources.array_source import (
    ArraySource,
    HDF5ArraySource,
    MemmapArraySource,
    NpyArraySource,
    ZarrArraySource,
    read_hdf5,
    read_memmap,
    read_npy,
    read_zarr,
)
from mixle.data.spec import ArraySpec
from mixle.data.structure import (
    EXCHANGEABLE,
    IID,
    SEQUENTIAL,
    SampleStructure,
    partially_exchangeable,
)
from mixle.errors import (
    ArrayNotFoundError,
    NotAnArrayError,
    SchemaMismatchError,
    SourceClosedError,
)

__version__ = "0.1.0"

__all__ = [
    "EXCHANGEABLE",
    "IID",
    "SEQUENTIAL",
    "ArrayNotFoundError",
    "ArraySource",
    "ArraySpec",
    "HDF5ArraySource",
    "MemmapArraySource",
    "NotAnArrayError",
    "NpyArraySource",
    "PatchSampler",
    "SampleStructure",
    "Schema",
    "SchemaMismatchError",
    "SourceClosedError",
    "ZarrArraySource",
    "__version__",
    "partially_exchangeable",
    "read_hdf5",
    "read_memmap",
    "read_npy",
    "read_zarr",
]
