"""Local files of a zarr store, checked before they are read: chunks, shards, metadata.

zarr reads a directory where a chunk's file should be as a chunk never written, and a FIFO
or a device as if it were data. The functions here refuse those (and stored objects or
metadata documents larger than they can be) by ``stat`` or on the opened descriptor,
before anything is read.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.errors import SpecialFileError
from mixle.reading import CorruptChunkError
from mixle.utils.files import (
    open_regular_fd,
    open_regular_file,
    read_fd,
    read_fd_into,
    require_regular_file,
    thread_read_buffer,
)
from mixle.utils.optional_deps import imported

__all__ = [
    "ByteRange",
    "bad_metadata_file",
    "check_local_metadata",
    "directory_message",
    "local_chunk_dir",
    "local_dir",
    "local_root",
    "read_local_object",
    "refuse_special",
]

#: Metadata files zarr reads from a local array's (or group's) directory.
_METADATA_FILES = (".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json")

#: A byte range request: ``None`` (whole object), ``(start, end)`` or ``(-n, None)`` (suffix).
ByteRange = tuple[int, int | None] | None


def refuse_special(base: str, key: str, where: str, coords: tuple[int, ...]) -> None:
    """Refuse stored key ``key`` under ``base`` unless it is a regular file or missing.

    zarr reads a directory where a chunk's file should be as a chunk never written (the
    fill value): mixle raises :class:`CorruptChunkError` for it, on every read path. A
    FIFO, device or socket (which would block a read or never end) raises
    :class:`~mixle.SpecialFileError`, found by ``stat`` before anything is read.
    """
    path = os.path.join(base, *key.split("/"))
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISDIR(info.st_mode):
        raise CorruptChunkError(directory_message(key, where, coords, path))
    require_regular_file(path, f"chunk {key!r} of zarr array {where}: file")


def read_local_object(
    path: str, what: str, limit: int, byte_range: ByteRange = None, *, reuse: bool = False
) -> bytes | memoryview | None:
    """The bytes of a local stored object (``None`` when it does not exist), at most ``limit``.

    Parameters
    ----------
    path
        The object's file.
    what
        How messages name it (array, key).
    limit
        The most bytes it may have (a whole object) or a range may ask.
    byte_range
        ``None`` (the whole object), ``(start, end)`` or ``(-n, None)`` (the last ``n``
        bytes); a range past the end of the file returns what the file holds.
    reuse
        Read a whole object into this thread's reusable buffer and return a view of it (no
        fresh allocation per read): valid only until this thread's next ``reuse`` read.

    Raises
    ------
    SpecialFileError
        When the path is a FIFO, device or socket (checked on the opened descriptor).
    CorruptChunkError
        When the object (or the range asked) is larger than ``limit`` bytes, or the path is
        a directory.
    """
    try:
        if byte_range is None:
            # a bare descriptor: open, fstat, one read, close (a file object costs more
            # calls, each a hand-off of the GIL between decode threads)
            fd, info = open_regular_fd(path, what)
            try:
                size = info.st_size
                if size > limit:  # refused unread
                    raise ValueError(
                        f"{what} {path!r} has {size:,} bytes, more than the {limit:,} a stored "
                        "chunk of this array can have"
                    )
                # one byte over the file's size (a cap of it, too) shows a file that grew
                if reuse:
                    view = thread_read_buffer(size + 1)
                    data: bytes | memoryview = view[: read_fd_into(fd, view, size)]
                else:
                    data = read_fd(fd, size + 1, size)
            finally:
                os.close(fd)
            if len(data) > limit:
                raise ValueError(f"{what} {path!r} grew past {limit:,} bytes while read")
            return data
        start, end = byte_range
        length = -start if end is None else end - start
        if length > limit:
            raise ValueError(
                f"{what} {path!r}: a read of {length} bytes asked, more than {limit:,}"
            )
        with open_regular_file(path, what) as file:
            size = os.fstat(file.fileno()).st_size
            first = max(size + start, 0) if end is None else min(start, size)
            file.seek(first)
            return file.read(size - first if end is None else max(min(end, size) - first, 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except SpecialFileError:
        if os.path.isdir(path):
            raise CorruptChunkError(
                f"{what} {path!r} is a directory, not a stored chunk or shard"
            ) from None
        raise
    except ValueError as exc:
        raise CorruptChunkError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket cannot be opened: say what it is
            require_regular_file(path, what)
        raise


def directory_message(key: str, where: str, coords: tuple[int, ...], path: str) -> str:
    return (
        f"chunk {key!r} of zarr array {where} (chunk grid coordinates {coords}) cannot be "
        f"read: {path!r} is a directory, not a stored chunk (a chunk never written has no file)"
    )


def local_dir(array: Any) -> str | None:
    """The local directory holding ``array``'s stored objects, or ``None`` for other stores.

    Covers ``LocalStore`` and fsspec's local filesystem (``file://`` URLs).
    """
    from zarr.storage import FsspecStore, LocalStore

    store = array.store
    if isinstance(store, LocalStore):
        return local_chunk_dir(array)
    if isinstance(store, FsspecStore):
        protocol = store.fs.protocol
        if set((protocol,) if isinstance(protocol, str) else protocol) & {"file", "local"}:
            return os.path.join(store.path, *filter(None, array.path.split("/")))
    return None


def local_chunk_dir(array: Any) -> str:
    """The directory of ``array``'s chunk files in its ``LocalStore``.

    Parameters
    ----------
    array
        A zarr array whose store is a ``zarr.storage.LocalStore``.

    Returns
    -------
    str
        The store's root joined with the array's path inside the store.
    """
    return os.path.join(os.fspath(array.store.root), *filter(None, array.path.split("/")))


def bad_metadata_file(root: str, component: str) -> str | None:
    """The first local zarr metadata file on the way to ``component`` that is not a JSON object.

    Files were checked by :func:`check_local_metadata` (regular, within the limit) first.
    """
    parts = [p for p in component.split("/") if p]
    for depth in range(len(parts) + 1):
        for name in _METADATA_FILES:
            path = os.path.join(root, *parts[:depth], name)
            try:
                with open(path, "rb") as f:
                    doc = json.loads(f.read().decode("utf-8"))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except (ValueError, RecursionError):  # JSON, UTF-8 or nesting
                return path
            if not isinstance(doc, dict):
                return path
    return None


def local_root(path: Any) -> str | None:
    """The local directory of a store path (a local path or a ``LocalStore``), else ``None``."""
    if isinstance(path, str):
        if "://" in path:
            return path.removeprefix("file://") if path.startswith("file://") else None
        return path
    root = getattr(path, "root", None)
    zarr = imported("zarr")
    if zarr is not None and isinstance(path, zarr.storage.LocalStore) and root is not None:
        return os.fspath(root)
    return None


def check_local_metadata(root: str, component: str) -> None:
    """Refuse local zarr metadata files that are not regular files or are too large.

    Every metadata file zarr may read on the way from ``root`` to ``component`` is checked
    by ``stat`` before zarr opens it: a FIFO would block zarr's read for ever and
    ``/dev/zero`` never ends (:class:`~mixle.SpecialFileError`); a file larger than
    :data:`ZARR_METADATA_LIMIT` raises ``ValueError`` naming it.
    """
    if not os.path.isdir(root):
        return  # a zip file or another kind of store: zarr opens it
    parts = [p for p in component.split("/") if p]
    for depth in range(len(parts) + 1):
        folder = os.path.join(root, *parts[:depth])
        for name in _METADATA_FILES:
            path = os.path.join(folder, name)
            try:
                info = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not stat.S_ISREG(info.st_mode):
                require_regular_file(path, "zarr metadata file")  # raises SpecialFileError
            if info.st_size > ZARR_METADATA_LIMIT:
                raise ValueError(
                    f"zarr metadata file {path!r} has {info.st_size:,} bytes, more than the "
                    f"{ZARR_METADATA_LIMIT:,} mixle lets zarr parse (ZARR_METADATA_LIMIT): it "
                    "is not zarr metadata"
                )
