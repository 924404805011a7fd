"""mixle: lazy, index-addressable sources and seeded N-D patches for data bigger than memory.

``import mixle`` imports NumPy only; zarr, h5py, fsspec, dask and jax are imported by the
adapters that need them, and the parallel backends on first use.
"""

from typing import TYPE_CHECKING, Any

from mixle import _moved
from mixle.data.sampling.aligned import AlignedArrays, read_hdf5_arrays, read_zarr_arrays
from mixle.data.sampling.grid import GridSampler
from mixle.data.sampling.grid_volumes import VolumeGridSampler
from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sampling.stitch import GridAggregator, stitch
from mixle.data.sampling.volume_patches import VolumePatchSampler
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
from mixle.data.sources.arrays.b2nd import B2ndArraySource, read_b2nd
from mixle.data.sources.arrays.n5 import N5ArraySource, read_n5
from mixle.data.sources.arrays.nifti import NiftiArraySource, read_nifti
from mixle.data.sources.arrays.npz import NpzArraySource, read_npz
from mixle.data.sources.arrays.tiff import TiffArraySource, read_tiff
from mixle.data.sources.arrays.zarr.vlen import set_vlen_limit
from mixle.data.sources.collection import VolumeCollection, read_volumes
from mixle.data.sources.compose import concat, map, mix, select
from mixle.data.sources.custom import Source
from mixle.data.sources.origins import Origins
from mixle.data.sources.tabular import (
    MemorySource,
    read_array_record,
    read_csv,
    read_dataframe,
    read_hf,
    read_jsonl,
    read_parquet,
    read_sql,
)
from mixle.data.spec import ArraySpec, validate_batch
from mixle.data.structure import (
    EXCHANGEABLE,
    IID,
    SEQUENTIAL,
    SampleStructure,
    partially_exchangeable,
)
from mixle.errors import (
    ArrayNotFoundError,
    BrokenEncodedDataError,
    ColumnNotFoundError,
    CorruptChunkError,
    DiskCacheWarning,
    DiskFullError,
    EncodedDataClosedError,
    FileChangedError,
    FilterUnavailableError,
    InvalidMetadataError,
    LeafMismatchError,
    MalformedRowError,
    MetadataLimitError,
    NiftiScalingWarning,
    NotAnArrayError,
    NothingToSampleError,
    NpyHeaderTooLargeError,
    OmeTiffMetadataWarning,
    OmeTiffMissingFilesWarning,
    OmeZarrMetadataWarning,
    PackedVariableWarning,
    ParquetReadError,
    RangeMismatchError,
    ReadsStopped,
    RemoteReadError,
    RemoteTimeoutError,
    RowIndexCacheWarning,
    SchemaMismatchError,
    SourceClosedError,
    SpecialFileError,
    SplitNotFoundError,
    UncheckpointedWALError,
    UnsupportedStoreError,
    VlenLimitError,
    VolumeMismatchError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from mixle.loading import Loader, LoaderStateError, merge_states
from mixle.reading import chunk_cache, set_chunk_cache_bytes, set_decode_threads
from mixle.utils import parallel as _parallel
from mixle.utils.parallel.registry import encoded_data, register_encoded_data_backend
from mixle.utils.progress import set_progress

if TYPE_CHECKING:
    from mixle.utils.parallel.dask_backend import DaskEncodedData
    from mixle.utils.parallel.multiprocessing import MPEncodedData

__version__ = "0.1.0"

__all__ = [
    "EXCHANGEABLE",
    "IID",
    "SEQUENTIAL",
    "AlignedArrays",
    "ArrayNotFoundError",
    "ArraySource",
    "ArraySpec",
    "B2ndArraySource",
    "BrokenEncodedDataError",
    "ColumnNotFoundError",
    "CorruptChunkError",
    "DaskEncodedData",
    "DiskCacheWarning",
    "DiskFullError",
    "EncodedDataClosedError",
    "FileChangedError",
    "FilterUnavailableError",
    "GridAggregator",
    "GridSampler",
    "HDF5ArraySource",
    "InvalidMetadataError",
    "Loader",
    "LoaderStateError",
    "MPEncodedData",
    "LeafMismatchError",
    "MalformedRowError",
    "MemorySource",
    "MemmapArraySource",
    "MetadataLimitError",
    "N5ArraySource",
    "NiftiArraySource",
    "NiftiScalingWarning",
    "NotAnArrayError",
    "OmeTiffMetadataWarning",
    "OmeTiffMissingFilesWarning",
    "OmeZarrMetadataWarning",
    "PackedVariableWarning",
    "NothingToSampleError",
    "NpyHeaderTooLargeError",
    "ReadsStopped",
    "RemoteReadError",
    "RemoteTimeoutError",
    "RowIndexCacheWarning",
    "NpyArraySource",
    "NpzArraySource",
    "ParquetReadError",
    "RangeMismatchError",
    "PatchSampler",
    "VolumePatchSampler",
    "Origins",
    "SampleStructure",
    "Schema",
    "SchemaMismatchError",
    "Source",
    "SourceClosedError",
    "SpecialFileError",
    "SplitNotFoundError",
    "TiffArraySource",
    "UncheckpointedWALError",
    "UnsupportedStoreError",
    "VlenLimitError",
    "VolumeCollection",
    "VolumeGridSampler",
    "VolumeMismatchError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerTimeoutError",
    "ZarrArraySource",
    "__version__",
    "chunk_cache",
    "encoded_data",
    "partially_exchangeable",
    "concat",
    "map",
    "merge_states",
    "mix",
    "read_array_record",
    "read_csv",
    "read_dataframe",
    "read_hf",
    "select",
    "read_hdf5",
    "read_hdf5_arrays",
    "read_memmap",
    "read_b2nd",
    "read_n5",
    "read_nifti",
    "read_npz",
    "read_tiff",
    "read_jsonl",
    "read_npy",
    "read_parquet",
    "read_sql",
    "read_volumes",
    "read_zarr",
    "read_zarr_arrays",
    "register_encoded_data_backend",
    "set_chunk_cache_bytes",
    "set_decode_threads",
    "set_progress",
    "set_vlen_limit",
    "stitch",
    "validate_batch",
]


def __getattr__(name: str) -> Any:
    # the parallel backends import multiprocessing machinery or dask: mixle.utils.parallel
    # loads them on first use
    if name in ("MPEncodedData", "DaskEncodedData"):
        return getattr(_parallel, name)
    if name == "plot":  # mixle.plot imports matplotlib only when a plot is drawn
        import importlib

        return importlib.import_module("mixle.plot")
    raise AttributeError(f"module 'mixle' has no attribute {name!r}")


_moved.install()  # module paths from before the layered layout keep importing
