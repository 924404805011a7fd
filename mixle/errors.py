"""Exceptions raised by mixle; each subclasses the builtin a caller would catch."""

from __future__ import annotations

__all__ = [
    "UncheckpointedWALError",
    "LeafMismatchError",
    "FileChangedError",
    "FilterUnavailableError",
    "ArrayNotFoundError",
    "BrokenEncodedDataError",
    "ColumnNotFoundError",
    "EncodedDataClosedError",
    "MalformedRowError",
    "NotAnArrayError",
    "ReadsStopped",
    "SchemaMismatchError",
    "SourceClosedError",
    "SpecialFileError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerTimeoutError",
]


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


class FileChangedError(OSError):
    """A file was truncated, replaced, rewritten or deleted after the source opened it."""


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


class UncheckpointedWALError(OSError):
    """A WAL-mode SQLite file has a write-ahead log with content but no ``-shm`` file.

    SQLite can read such a database only by creating the ``-shm`` file beside it, and
    opening it ``immutable`` would ignore the log's transactions (stale rows).
    """


class SpecialFileError(OSError):
    """A path that must be a regular file is a FIFO, device, socket or directory."""


class FilterUnavailableError(ImportError):
    """An HDF5 dataset needs a filter plugin that HDF5 cannot load in this process."""


class ReadsStopped(RuntimeError):
    """A loop's reads were stopped from another thread (its loader was closed)."""
