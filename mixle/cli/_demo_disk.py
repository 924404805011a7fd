"""``mixle demo`` on a disk that fills up: every backend stops cleanly, with one clear error.

A full disk (``ENOSPC``), a full quota (``EDQUOT``) and a file-size limit (``EFBIG``) are the
same thing to the demo: its volume cannot be written. Each backend needs its own care so
that the temporary folder can then be removed and the process exits normally:

- zarr writes chunks on its own event-loop thread, several at once; when one fails, the
  others are still writing (and recreate their folders), so :func:`settle_zarr_writes`
  waits for them before the folder is removed.
- HDF5 (the C library) cannot close a file whose writes failed: the close fails, the file
  stays open and the process crashes at exit. :class:`WriteGuard` is the file object h5py
  writes through: after the first failed write it records the error and drops every later
  write, so the library closes the (discarded) file normally; the error is raised after.
- Raw writes (memmap) fail in Python and need nothing more.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
from typing import BinaryIO

from mixle.errors import DiskFullError

__all__ = [
    "FULL_DISK_ERRNOS",
    "SETTLE_TIMEOUT_S",
    "DiskFullError",
    "WriteGuard",
    "disk_full_error",
    "is_disk_full",
    "settle_zarr_writes",
]

#: What a file's ``write`` and ``readinto`` take.
Buffer = bytes | bytearray | memoryview
#: ``errno`` values that mean "the volume does not fit": no space, no quota, file too large.
FULL_DISK_ERRNOS = frozenset(
    code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EFBIG) if code
)
#: Longest wait for zarr's writes still in flight after one failed.
SETTLE_TIMEOUT_S = 30.0


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` meaning the disk (or quota, or size limit) is full."""
    return isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS


def disk_full_error(path: str | os.PathLike[str], exc: OSError) -> DiskFullError:
    """The error ``mixle demo`` raises when writing ``path`` failed with ``exc``."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    error = DiskFullError(
        f"{os.fspath(path)!r}: no space left on device while writing the demo volume "
        f"({why}); the temporary folder is removed: free some space, pass a smaller --size "
        "or point TMPDIR at a bigger disk"
    )
    error.errno = exc.errno  # set afterwards: the message stays free of "[Errno N]"
    return error


def settle_zarr_writes(timeout: float = SETTLE_TIMEOUT_S) -> None:
    """Wait (up to ``timeout`` seconds) for every task still running on zarr's event loop.

    After one chunk write fails, ``arr[...] = x`` raises at once while the other chunk
    writes of the call go on in zarr's threads; removing the folder under them would let
    them create it again.
    """
    from zarr.core.sync import sync

    async def settle() -> None:
        me = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not me]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    sync(settle())


class WriteGuard(io.RawIOBase):
    """A file h5py writes through that turns a full disk into :attr:`error`, not a crash.

    The first write (or truncate, or flush) that fails with a full-disk error is kept in
    :attr:`error`; it and every later write then report success without writing, so the
    HDF5 library can finish and close the file, which is thrown away. Other errors are
    raised as usual. Check :attr:`error` after each write and after closing.
    """

    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self._file = file
        self.error: OSError | None = None

    def _failed(self, exc: OSError) -> None:
        if not is_disk_full(exc):
            raise exc
        if self.error is None:
            self.error = exc

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Buffer) -> int:
        return self._file.readinto(buffer)  # type: ignore[attr-defined, no-any-return]

    def write(self, data: Buffer) -> int:
        size = memoryview(data).nbytes
        if self.error is None:
            try:
                return self._file.write(data)
            except OSError as exc:
                self._failed(exc)
        self._file.seek(size, io.SEEK_CUR)  # dropped: the file is discarded anyway
        return size

    def truncate(self, size: int | None = None) -> int:
        try:
            return self._file.truncate(size)
        except OSError as exc:
            self._failed(exc)
            return self.tell() if size is None else size

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            self._failed(exc)
