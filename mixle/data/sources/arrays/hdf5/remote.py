"""HDF5 files behind fsspec URLs (``http(s)://``, ``s3://``...) or in file-like objects.

h5py reads such files through a Python file object (the ``fileobj`` driver): metadata, the
chunk index and contiguous data come through a :class:`CheckedRangeFile`, a block cache
sized for patch reads whose every block is a checked, retried range request. Chunk bytes do
not: :class:`RemoteHDF5ChunkReader` looks up each chunk's byte range in HDF5's chunk index,
fetches all the chunks a batch misses concurrently with fsspec (each request checked and
retried on its own), and decodes them in the decode pool, like the local
:class:`~mixle.data.sources.arrays.hdf5.chunks.HDF5ChunkReader`.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from mixle.data.sources.arrays.hdf5.chunks import HDF5ChunkReader, decodable_filters
from mixle.reading.faults import CorruptChunkError, retry_async
from mixle.reading.fetch import fetch_range, object_size, read_range
from mixle.reading.fs_options import widen_connection_pool
from mixle.reading.inflight import gather_bounded
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = [
    "HDF5_REMOTE_BLOCK_BYTES",
    "HDF5_REMOTE_CACHE_BLOCKS",
    "CheckedRangeFile",
    "RemoteHDF5ChunkReader",
    "open_remote_file",
]

#: Block size of the fsspec file h5py reads metadata through: HDF5 metadata (object
#: headers, B-tree nodes) comes in small scattered pieces, so blocks stay small.
HDF5_REMOTE_BLOCK_BYTES = 512 * 1024
#: How many blocks that file keeps (an LRU block cache: 32 MiB in all by default).
HDF5_REMOTE_CACHE_BLOCKS = 64


def open_remote_file(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str, Any]:
    """``(filesystem, path, file object)`` for ``url``, the file a :class:`CheckedRangeFile`."""
    require("fsspec", "remote", feature="HDF5 over URLs")
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]

    # h5py holds its global lock while it reads through this file, waiting for fsspec's I/O
    # thread; a cycle collection run there that finalises an h5py object left in a cycle
    # (a caught error's traceback) waits for that lock: a deadlock (h5py issue 2019).
    # Collect such garbage now, in the caller's thread, before h5py starts reading; while
    # h5py reads through the file, automatic collection is paused (CheckedRangeFile.read).
    gc.collect()
    fs, path = url_to_fs(url, **(storage_options or {}))
    fs = widen_connection_pool(fs)  # s3fs: 64 chunk requests in flight, mixle's timeouts
    file = CheckedRangeFile(fs, path, url=display_path(url), secrets=storage_options)
    return fs, path, file


_pause_lock = threading.Lock()
_pausing = 0  # reads in flight that paused automatic collection
_resume = False  # whether collection was enabled when the first of them began


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """Pause automatic garbage collection while any thread reads through a remote file.

    h5py calls :meth:`CheckedRangeFile.read` holding its global lock and waits for fsspec's
    I/O thread; a collection triggered there that finalises an h5py object would wait for
    that lock for ever. Collection resumes (if it was enabled) when the last read ends.
    """
    global _pausing, _resume
    with _pause_lock:
        if _pausing == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pausing -= 1
            if _pausing == 0 and _resume:
                gc.enable()


def _reset_pause_after_fork() -> None:
    """A child forked during a read has no read in flight: collection resumes there."""
    global _pause_lock, _pausing
    _pause_lock = threading.Lock()
    if _pausing and _resume:
        gc.enable()
    _pausing = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pause_after_fork)


class CheckedRangeFile(io.RawIOBase):
    """A read-only remote object as a seekable binary file whose every byte is checked.

    h5py reads superblock, object headers, B-tree nodes, contiguous data and the chunks it
    decodes itself (lzf, other filters mixle lacks) through it. It keeps an LRU cache of
    ``block_size`` blocks; each missing block is one range request through
    :func:`~mixle.reading.fetch.read_range`, so its status, ``Content-Range`` and length
    are checked against the size the object had when it was opened, mismatches, stalls
    (the retry policy's request timeout) and transient failures are retried, each block
    within the policy's deadline, and a block that keeps failing raises
    :class:`~mixle.reading.faults.RemoteReadError` (no credentials in it or its chain)
    instead of reaching h5py short (which would zero-fill the rest) or wrong.

    Parameters
    ----------
    fs, path
        The fsspec file system and the object's path on it.
    url
        The object named in errors (display-safe).
    secrets
        Masked in error messages.
    block_size, blocks
        Bytes per cached block and how many blocks are kept (default
        :data:`HDF5_REMOTE_BLOCK_BYTES` and :data:`HDF5_REMOTE_CACHE_BLOCKS`, read when
        the file is opened).

    Raises
    ------
    FileNotFoundError
        When the object does not exist.
    OSError
        When the store does not report the object's size (random access needs it).
    """

    def __init__(
        self,
        fs: Any,
        path: str,
        *,
        url: str,
        secrets: Any = None,
        block_size: int | None = None,
        blocks: int | None = None,
    ) -> None:
        from fsspec.caching import BlockCache  # type: ignore[import-untyped]

        super().__init__()
        size = object_size(fs, path)
        if size is None:
            raise OSError(f"{url} does not report its size: HDF5 over URLs needs random access")
        self.size = int(size)
        self._fs, self._path, self._url, self._secrets = fs, path, url, secrets
        self._pos = 0
        self._cache = BlockCache(
            HDF5_REMOTE_BLOCK_BYTES if block_size is None else block_size,
            self._fetch,
            self.size,
            maxblocks=HDF5_REMOTE_CACHE_BLOCKS if blocks is None else blocks,
        )

    def _fetch(self, start: int, end: int) -> bytes:
        span = (start, min(end, self.size))
        return read_range(
            self._fs,
            self._path,
            span,
            url=self._url,
            key=f"(file bytes {span[0]}-{span[1] - 1})",
            size=self.size,
            secrets=self._secrets,
        )

    def readable(self) -> bool:
        """Always ``True``."""
        return True

    def seekable(self) -> bool:
        """Always ``True``: every byte can be asked for."""
        return True

    def tell(self) -> int:
        """The current position."""
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the current position or the end."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"offset={offset} with whence={whence} is before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        """Read up to ``len(buffer)`` bytes at the position into ``buffer``."""
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (all the rest for ``-1``/``None``)."""
        if self.closed:
            raise ValueError(f"I/O on the closed remote file {self._url}")
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        with _collection_paused():  # h5py holds its lock here: see open_remote_file
            data = self._cache._fetch(self._pos, end) if end > self._pos else b""
        self._pos += len(data)
        return bytes(data)

    def __repr__(self) -> str:
        return f"CheckedRangeFile({self._url!r}, size={self.size})"


class RemoteHDF5ChunkReader(HDF5ChunkReader):
    """Chunks of an HDF5 dataset in a remote file: byte ranges from HDF5, bytes via fsspec.

    Use :meth:`for_remote`, which returns ``None`` when the dataset needs h5py.
    """

    def __init__(
        self,
        dataset: Any,
        fs: Any,
        path: str,
        filters: list[tuple[int, tuple[int, ...]]],
        where: str,
        url: str,
        secrets: Any = None,
    ) -> None:
        self._setup(dataset, filters, where)
        self._fs, self._path, self._url, self._secrets = fs, path, url, secrets

    @classmethod
    def for_remote(
        cls, dataset: Any, fs: Any, path: str, where: str, url: str, secrets: Any = None
    ) -> RemoteHDF5ChunkReader | None:
        """A reader for ``dataset`` if mixle decodes its filters, else ``None``.

        ``where`` names the dataset and ``url`` the file in errors (both display-safe);
        ``secrets`` are masked in error messages.
        """
        filters = decodable_filters(dataset)
        if filters is None:
            return None
        return cls(dataset, fs, path, filters, where, url, secrets)

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[tuple[bytes, int] | None]:
        """``(stored bytes, filter mask)`` of each chunk; ``None`` for a chunk never written."""
        spots = [self._locate(c) for c in coords]
        wanted = [(k, s) for k, s in enumerate(spots) if s is not None]
        out: list[tuple[bytes, int] | None] = [None] * len(coords)
        if not wanted:
            return out
        fs, path = self._fs, self._path

        def call(c: tuple[int, ...], offset: int, size: int) -> Any:
            async def get() -> bytes:
                return await fetch_range(fs, path, (offset, offset + size))

            return lambda: retry_async(get, url=self._url, key=str(c), secrets=self._secrets)

        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync  # type: ignore[import-untyped]

            calls = [call(coords[k], s[0], s[1]) for k, s in wanted]
            blobs = sync(fs.loop, gather_bounded, calls, [s[1] for _, s in wanted])
        else:
            blobs = [
                read_range(
                    fs,
                    path,
                    (s[0], s[0] + s[1]),
                    url=self._url,
                    key=str(coords[k]),
                    secrets=self._secrets,
                )
                for k, s in wanted
            ]
        for (k, (_offset, _size, mask)), blob in zip(wanted, blobs):
            out[k] = (blob, mask)
        return out

    def decode(self, coords: tuple[int, ...], raw: tuple[bytes, int] | None) -> Any:
        """Chunk ``coords`` from its stored bytes (``None``: HDF5's fill value)."""
        if raw is None:
            return self._fill
        blob, mask = raw
        where = self._locate(coords)
        if where is not None and len(blob) != where[1]:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is truncated: got {len(blob)} "
                f"of its {where[1]} bytes"
            )
        return self.decode_stored(coords, blob, mask)

    def read_chunk(self, coords: tuple[int, ...]) -> Any:
        return self.decode(coords, self.fetch_many([coords])[0])
