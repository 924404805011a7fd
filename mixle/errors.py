"""Exceptions raised by mixle, and its warning; each subclasses the builtin a caller catches.

Every layer's errors live here, so that any module may import them without importing
upward; the modules that raise them keep them under their old names too.
"""

from __future__ import annotations

__all__ = [
    "ArrayNotFoundError",
    "BrokenEncodedDataError",
    "ColumnNotFoundError",
    "CorruptChunkError",
    "DiskCacheWarning",
    "DeviceMemoryError",
    "DiskFullError",
    "DtypeOverflowError",
    "DtypePolicyError",
    "EncodedDataClosedError",
    "FileChangedError",
    "FilterUnavailableError",
    "InvalidMetadataError",
    "LeafMismatchError",
    "LoaderStateError",
    "MalformedRowError",
    "MetadataLimitError",
    "NiftiScalingWarning",
    "NotAnArrayError",
    "OmeTiffMetadataWarning",
    "OmeTiffMissingFilesWarning",
    "OmeZarrMetadataWarning",
    "PackedVariableWarning",
    "NothingToSampleError",
    "NpyHeaderTooLargeError",
    "ParquetReadError",
    "RangeMismatchError",
    "ReadsStopped",
    "RemoteReadError",
    "RemoteTimeoutError",
    "RowIndexCacheWarning",
    "SchemaMismatchError",
    "SourceClosedError",
    "SpecialFileError",
    "SplitNotFoundError",
    "UncheckpointedWALError",
    "UnsupportedStoreError",
    "VlenLimitError",
    "VolumeMismatchError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerTimeoutError",
]


# -- sources: opening, naming, parsing -----------------------------------------------------
class SourceClosedError(ValueError):
    """An operation was attempted on a source after ``close()``."""


class ArrayNotFoundError(KeyError):
    """A zarr component or HDF5 dataset does not exist; the message lists what does."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class NotAnArrayError(ValueError):
    """A path or component names a group rather than an array; the message lists its arrays."""


class ColumnNotFoundError(KeyError):
    """A record source has no column of that name; the message lists the columns it has."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class SplitNotFoundError(KeyError):
    """A Hugging Face ``DatasetDict`` has no split of that name; the message lists its splits."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class MalformedRowError(ValueError):
    """A row of a text file cannot be parsed or converted; the message names its line.

    Attributes
    ----------
    path
        The file, safe to show.
    line
        The 1-based line number where the row starts.
    """

    def __init__(self, message: str, *, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class SchemaMismatchError(ValueError):
    """A source or sampler does not match the ``schema`` it was given."""


class VolumeMismatchError(ValueError):
    """A volume of a collection differs from volume 0 in dtype or number of dimensions.

    Raised by :class:`mixle.VolumeCollection` when the volume is first opened; the message
    names the volume (position or table row, and key), both layouts, and ``dtype=``, which
    casts every volume to one dtype.
    """


class NothingToSampleError(ValueError):
    """A weight map or label volume leaves no voxel a patch can be centred on.

    The weights are zero wherever a patch fits, or a class of ``label_probabilities`` is
    absent there. A sampler over a collection skips such a volume with a warning.
    """


class LeafMismatchError(ValueError):
    """Array leaves of one column differ in shape or dtype, or mix with plain Python values.

    Attributes
    ----------
    column
        The column (record key).
    index
        The record whose leaf differs from the first one.
    """

    def __init__(self, message: str, *, column: str, index: int) -> None:
        super().__init__(message)
        self.column = column
        self.index = index


class ParquetReadError(ValueError, OSError):
    """pyarrow could not read a Parquet file's footer or decode one of its row groups.

    A ``ValueError`` and an ``OSError``, as pyarrow's own errors for a truncated file and for
    damaged pages are; the message names the file and the row group (number and rows).

    Attributes
    ----------
    path
        The file, safe to show.
    row_group
        The row group's number in that file, or ``None`` for the footer.
    """

    def __init__(self, message: str, *, path: str, row_group: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.row_group = row_group


class DiskCacheWarning(RuntimeWarning):
    """The on-disk chunk cache is on but cannot serve a store (or keep a chunk).

    The store cannot be listed (a plain HTTP server; a bucket policy without ``ListBucket``)
    or its objects carry no version (no ETag, no ``Last-Modified``), so cached bytes could
    not be told current: it is read without the cache. Or the disk was full when a fetched
    chunk was to be kept; the read itself succeeded.
    """


class NiftiScalingWarning(UserWarning):
    """A NIfTI image with a non-trivial ``scl_slope``/``scl_inter`` was opened unscaled.

    Its values are the stored integers; ``read_nifti(path, scale=True)`` applies the scaling
    as nibabel does.
    """


class OmeTiffMetadataWarning(UserWarning):
    """OME-XML of an OME-TIFF that mixle cannot tie to the series read; it has no spacing."""


class OmeTiffMissingFilesWarning(UserWarning):
    """A multi-file OME-TIFF whose OME-XML names files that do not exist.

    tifffile opens such a series anyway and reads the planes of the missing files as
    zeros (it only logs that it did); mixle reads them the same way and warns at open.
    """


class OmeZarrMetadataWarning(UserWarning):
    """OME-Zarr ``multiscales`` metadata mixle cannot apply; the array has no spacing."""


class PackedVariableWarning(UserWarning):
    """An array holds CF-packed values (``scale_factor``...) and is read as stored.

    ``read_zarr(..., mask_and_scale=True)`` / ``read_hdf5(..., mask_and_scale=True)``
    unpack them as xarray does.
    """


class RowIndexCacheWarning(RuntimeWarning):
    """A row index could not be written to the cache directory (disk full, quota...).

    The index is kept in memory instead; the message names the directory and the error.
    """


# -- files: what is on disk, and whether it changed ----------------------------------------
class FileChangedError(OSError):
    """A file was truncated, replaced, rewritten or deleted after the source opened it."""


class UncheckpointedWALError(OSError):
    """A WAL-mode SQLite file has a write-ahead log with content but no ``-shm`` file.

    SQLite can read such a database only by creating the ``-shm`` file beside it, and
    opening it ``immutable`` would ignore the log's transactions (stale rows).
    """


class SpecialFileError(OSError):
    """A path that must be a regular file is a FIFO, device, socket or directory."""


class FilterUnavailableError(ImportError):
    """An HDF5 dataset needs a filter plugin that HDF5 cannot load in this process."""


# -- reading and loading -------------------------------------------------------------------
class CorruptChunkError(ValueError):
    """Stored bytes of a chunk do not decode to a chunk (bad checksum, truncated, wrong size)."""


class VlenLimitError(CorruptChunkError):
    """A zarr chunk of variable-length strings or bytes decodes to more than mixle's cap.

    The chunk may be sound (strings longer on average than the cap) or a decompression
    bomb: ``mixle.set_vlen_limit`` raises the cap. It is a :class:`CorruptChunkError` so
    that code refusing bad chunks refuses it too.
    """


class RangeMismatchError(OSError):
    """A response to a byte-range request is not that range: retried, then a RemoteReadError.

    Raised for a status other than 206 (or a 200 carrying the whole object), a
    ``Content-Range`` whose start, end or total differs from the range asked, or a body
    whose length differs from it; the message says what was asked and what came back.
    """


class RemoteReadError(OSError):
    """A request kept failing after every retry; the message names the URL and the chunk."""


class RemoteTimeoutError(RemoteReadError):
    """A request kept stalling past the request timeout, or its batch passed its deadline.

    Not a :class:`TimeoutError`: fsspec's ``sync`` would turn one into its own
    ``FSTimeoutError`` and lose the message.
    """


class ReadsStopped(RuntimeError):
    """A loop's reads were stopped from another thread (its loader was closed)."""


class LoaderStateError(ValueError):
    """A state dict cannot resume this loader: other source, shard layout or order."""


# -- the JAX adapter -----------------------------------------------------------------------
class DtypePolicyError(TypeError):
    """A batch leaf has a dtype its ``dtype_policy`` refuses (e.g. float64 while x64 is off)."""


class DtypeOverflowError(DtypePolicyError, OverflowError):
    """Under ``dtype_policy="safe"``, 64-bit integers hold values that do not fit 32 bits."""


class DeviceMemoryError(MemoryError):
    """Data put on a device would not fit in the memory free there (checked before copying)."""


# -- worker-resident data (MPEncodedData, DaskEncodedData) ---------------------------------
class WorkerError(RuntimeError):
    """A worker of an encoded-data handle raised; the message carries the worker's traceback.

    Attributes
    ----------
    worker
        Index of the worker that failed (``0 <= worker < num_workers``).
    remote_traceback
        The traceback text formatted in the worker process.
    exc_type
        Name of the exception type raised in the worker, e.g. ``"ValueError"``.
    """

    def __init__(
        self, message: str, *, worker: int, remote_traceback: str = "", exc_type: str = ""
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type


class WorkerDiedError(WorkerError):
    """A worker process exited or was lost mid-call; the handle is broken from then on."""


class WorkerTimeoutError(TimeoutError):
    """A call on an encoded-data handle ran past its ``timeout``; the handle is broken."""

    def __init__(self, message: str, *, workers: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.workers = workers


class EncodedDataClosedError(ValueError):
    """An encoded-data handle was used after ``close()``."""


class BrokenEncodedDataError(RuntimeError):
    """An encoded-data handle lost a worker or timed out earlier and cannot be used again."""


# -- mixle inspect and mixle demo ----------------------------------------------------------
class UnsupportedStoreError(ValueError):
    """A path exists but is not a store this reader opens (the message names the one that does)."""


class MetadataLimitError(ValueError):
    """A metadata file is larger or nested deeper than inspect parses."""


class InvalidMetadataError(UnsupportedStoreError):
    """A zarr metadata file is not a JSON object (not UTF-8, truncated, ``null``, a list)."""


class NpyHeaderTooLargeError(UnsupportedStoreError):
    """A ``.npy`` file claims a header longer than inspect reads.

    The limit is :data:`mixle.inspection.npy_files.MAX_NPY_HEADER_BYTES` (NumPy's own).
    """


class DiskFullError(OSError):
    """The demo volume did not fit on the disk (``errno`` is that of the failed write)."""
