"""HDF5 files behind URLs (``http(s)://``, ``s3://``...) or in file-like objects.

h5py reads such files through a Python file object (the ``fileobj`` driver): metadata, the
chunk index and contiguous data come through a :class:`CheckedRangeFile`, a block cache
sized for patch reads whose every block is a checked, retried range request. Chunk bytes do
not: :class:`RemoteHDF5ChunkReader` looks up each chunk's byte range in HDF5's chunk index,
fetches all the chunks a batch misses concurrently (each request checked and retried on its
own), and decodes them in the decode pool, like the local
:class:`~mixle.data.sources.arrays.hdf5.chunks.HDF5ChunkReader`.

The bytes come through obstore (:class:`~mixle.reading.object_client.ObjectClient`) where
:func:`~mixle.reading.object_client.choose_client` gives a client for the file's folder
(``backend="auto"`` with obstore installed, an ``s3://``, ``gs://``, ``az://`` or
``http(s)://`` URL without a query string, ``storage_options`` obstore understands), else
through fsspec. On obstore, every batch of requests runs on an event loop of the calling
thread (:func:`run_batch`): no Python thread of another kind waits while h5py holds its lock.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mixle.data.sources.arrays.hdf5.chunks import HDF5ChunkReader, decodable_filters
from mixle.reading.cached_fetch import CachedObjects, reads_through
from mixle.reading.faults import (
    CorruptChunkError,
    retry_async,
)
from mixle.reading.fetch import fetch_range, object_size, read_range
from mixle.reading.fs_options import widen_connection_pool
from mixle.reading.inflight import gather_bounded
from mixle.reading.object_client import (
    ObjectClient,
    ObstoreUnsupported,
    choose_client,
    run_batch,
)
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = [
    "HDF5_REMOTE_BLOCK_BYTES",
    "HDF5_REMOTE_CACHE_BLOCKS",
    "CheckedRangeFile",
    "RemoteFile",
    "RemoteHDF5ChunkReader",
    "choose_file_client",
    "file_key",
    "open_remote_file",
    "open_remote_object",
]

T = TypeVar("T")

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


def file_key(url: str) -> tuple[str, str] | None:
    """``(folder URL, key)`` of the file at ``url`` for an obstore client, or ``None``.

    ``s3://bucket/a/f.h5`` is key ``f.h5`` under ``s3://bucket/a``. An HTTP(S) path is
    percent-encoded: its key is decoded (obstore encodes keys again), an object store's key
    is the path as written, as fsspec takes it. A query string stays on the folder URL
    (:func:`~mixle.reading.object_client.choose_client` leaves presigned URLs to fsspec);
    ``None`` for a URL without a file name or with a ``#fragment``.
    """
    parts = urllib.parse.urlsplit(url)
    head, _, name = parts.path.rpartition("/")
    if not name or parts.fragment:
        return None
    if parts.scheme.lower() in ("http", "https"):
        name = urllib.parse.unquote(name)
    return urllib.parse.urlunsplit(parts._replace(path=head)), name


def choose_file_client(
    url: str, storage_options: dict[str, Any] | None, backend: str
) -> tuple[ObjectClient, str] | None:
    """``(client, key)`` reading the file at ``url`` through obstore, or ``None`` for fsspec.

    ``backend`` as for :func:`~mixle.reading.object_client.choose_client`.

    Raises
    ------
    ValueError
        ``backend`` is not ``"auto"``, ``"obstore"`` or ``"fsspec"``.
    ObstoreUnsupported
        ``backend="obstore"`` where obstore cannot read ``url``; says why.
    """
    split = file_key(url)
    try:
        client = choose_client(url if split is None else split[0], storage_options, backend)
        if split is None and client is not None:
            raise ObstoreUnsupported(
                f"backend='obstore' cannot read {display_path(url)!r}: the URL names no "
                "file (or has a #fragment); use backend='auto' or 'fsspec'"
            )
    except ObstoreUnsupported as exc:
        if backend == "auto":
            return None
        message = str(exc)
        if split is not None:  # the message names the folder: name the file
            message = message.replace(repr(display_path(split[0])), repr(display_path(url)))
        raise ObstoreUnsupported(message) from None
    if client is None or split is None:
        return None
    return client, split[1]


@dataclass(frozen=True, eq=False)
class RemoteFile:
    """A remote HDF5 file open for reading: the file h5py reads and where its bytes come from.

    Attributes
    ----------
    file
        The :class:`CheckedRangeFile` h5py reads through.
    fs, path
        The fsspec file system and the file's path on it; ``fs`` is ``None`` on obstore.
    client, key
        The obstore client and the file's key under its root (``None`` and ``""`` on fsspec).
    """

    file: CheckedRangeFile
    fs: Any = None
    path: str = ""
    client: ObjectClient | None = None
    key: str = ""

    @property
    def backend(self) -> str:
        """``"obstore"`` or ``"fsspec"``: which library fetches the bytes."""
        return "fsspec" if self.client is None else "obstore"

    def close(self) -> None:
        """Close the file object (its cached blocks are dropped)."""
        self.file.close()


def open_remote_object(
    url: str, storage_options: dict[str, Any] | None, chosen: tuple[ObjectClient, str] | None
) -> RemoteFile:
    """Open the file at ``url``: through obstore with ``chosen`` (``(client, key)``), else fsspec.

    Its size is asked once (one ``HEAD``); ``FileNotFoundError`` when it does not exist.
    """
    if chosen is None:
        fs, path, file = open_remote_file(url, storage_options)
        return RemoteFile(file, fs=fs, path=path)
    gc.collect()  # see open_remote_file: h5py reads through this file holding its lock
    client, key = chosen
    file = CheckedRangeFile(
        None, key, url=display_path(url), secrets=storage_options, client=client
    )
    return RemoteFile(file, client=client, key=key)


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
        The fsspec file system and the object's path on it; with ``client``, ``fs`` is not
        used and ``path`` is the object's key under the client's root.
    url
        The object named in errors (display-safe).
    secrets
        Masked in error messages.
    block_size, blocks
        Bytes per cached block and how many blocks are kept (default
        :data:`HDF5_REMOTE_BLOCK_BYTES` and :data:`HDF5_REMOTE_CACHE_BLOCKS`, read when
        the file is opened).
    client
        An obstore client: the size is one ``HEAD`` through it and each block one checked
        range request (:meth:`~mixle.reading.object_client.ObjectClient.fetch`) retried by
        :func:`~mixle.reading.faults.retry_async` on an event loop of the calling thread
        (:func:`run_batch`), so a block has the deadline and stop checks of a batch.

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
        client: ObjectClient | None = None,
    ) -> None:
        from fsspec.caching import BlockCache  # type: ignore[import-untyped]

        super().__init__()
        size = object_size(fs, path) if client is None else client.size_sync(path)
        if size is None:
            raise OSError(f"{url} does not report its size: HDF5 over URLs needs random access")
        self.size = int(size)
        self._fs, self._path, self._url, self._secrets = fs, path, url, secrets
        self._client = client
        #: what blocks are fetched through: the client, or the on-disk cache over it
        self.reads = None if client is None else reads_through(client, single=path)
        self._pos = 0
        self._cache = BlockCache(
            HDF5_REMOTE_BLOCK_BYTES if block_size is None else block_size,
            self._fetch,
            self.size,
            maxblocks=HDF5_REMOTE_CACHE_BLOCKS if blocks is None else blocks,
        )

    def _fetch(self, start: int, end: int) -> bytes:
        span = (start, min(end, self.size))
        reads = self.reads
        if reads is not None:
            key, size = self._path, self.size

            async def get() -> bytes:
                return await reads.fetch(key, span, size=size)

            name = f"(file bytes {span[0]}-{span[1] - 1})"
            return run_batch(
                lambda: retry_async(get, url=self._url, key=name, secrets=self._secrets)
            )
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
    """Chunks of an HDF5 dataset in a remote file: byte ranges from HDF5, bytes fetched here.

    Use :meth:`for_remote`, which returns ``None`` when the dataset needs h5py. The bytes
    come through fsspec (``fs``, ``path``) or, with ``client``, through obstore (``path``
    is then the file's key under the client's root): one ranged request per chunk either
    way, all of a batch's in flight at once, each checked and retried on its own.
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
        *,
        client: ObjectClient | CachedObjects | None = None,
        size: int | None = None,
    ) -> None:
        self._setup(dataset, filters, where)
        self.decoded_nbytes = self._count * self._dtype.itemsize
        self._fs, self._path, self._url, self._secrets = fs, path, url, secrets
        self._client, self._size = client, size

    @classmethod
    def for_remote(
        cls,
        dataset: Any,
        fs: Any,
        path: str,
        where: str,
        url: str,
        secrets: Any = None,
        *,
        client: ObjectClient | CachedObjects | None = None,
        size: int | None = None,
    ) -> RemoteHDF5ChunkReader | None:
        """A reader for ``dataset`` if mixle decodes its filters, else ``None``.

        ``where`` names the dataset and ``url`` the file in errors (both display-safe);
        ``secrets`` are masked in error messages. With ``client`` (obstore), ``path`` is
        the file's key and ``size`` its size (a server that ignores ``Range`` then costs
        no ``HEAD``).
        """
        filters = decodable_filters(dataset)
        if filters is None:
            return None
        return cls(dataset, fs, path, filters, where, url, secrets, client=client, size=size)

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[tuple[bytes, int] | None]:
        """``(stored bytes, filter mask)`` of each chunk; ``None`` for a chunk never written."""
        spots = [self._locate(c) for c in coords]
        wanted = [(k, s) for k, s in enumerate(spots) if s is not None]
        out: list[tuple[bytes, int] | None] = [None] * len(coords)
        if not wanted:
            return out
        if self._client is not None:
            blobs = self._fetch_obstore([(coords[k], s[0], s[1]) for k, s in wanted])
        else:
            blobs = self._fetch_fsspec([(coords[k], s[0], s[1]) for k, s in wanted])
        for (k, (_offset, _size, mask)), blob in zip(wanted, blobs):
            out[k] = (blob, mask)
        return out

    def _fetch_obstore(self, spans: list[tuple[tuple[int, ...], int, int]]) -> list[bytes]:
        client, key, total = self._client, self._path, self._size
        assert client is not None

        def call(c: tuple[int, ...], offset: int, size: int) -> Any:
            async def get() -> bytes:
                span = (offset, offset + size)
                return await client.fetch(key, span, size=total, limit=size)

            return lambda: retry_async(get, url=self._url, key=str(c), secrets=self._secrets)

        calls = [call(c, offset, size) for c, offset, size in spans]
        sizes = [size for _c, _offset, size in spans]
        return run_batch(lambda: gather_bounded(calls, sizes))

    def _fetch_fsspec(self, spans: list[tuple[tuple[int, ...], int, int]]) -> list[bytes]:
        fs, path = self._fs, self._path

        def call(c: tuple[int, ...], offset: int, size: int) -> Any:
            async def get() -> bytes:
                return await fetch_range(fs, path, (offset, offset + size))

            return lambda: retry_async(get, url=self._url, key=str(c), secrets=self._secrets)

        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync  # type: ignore[import-untyped]

            calls = [call(c, offset, size) for c, offset, size in spans]
            sizes = [size for _c, _offset, size in spans]
            return list(sync(fs.loop, gather_bounded, calls, sizes))
        return [
            read_range(
                fs,
                path,
                (offset, offset + size),
                url=self._url,
                key=str(c),
                secrets=self._secrets,
            )
            for c, offset, size in spans
        ]

    def decode(self, coords: tuple[int, ...], raw: tuple[bytes, int] | None) -> Any:
        """Chunk ``coords`` from its stored bytes (``None``: HDF5's fill value)."""
        return self.decode_into(coords, raw, None)

    def decode_into(  # type: ignore[override]
        self,
        coords: tuple[int, ...],
        raw: tuple[bytes, int] | None,
        out: Callable[[], np.ndarray] | None,
    ) -> Any:
        """:meth:`decode`, into the buffer ``out()`` gives (``decoded_nbytes`` of ``uint8``,
        asked for once the stored bytes decoded to one chunk) if given."""
        if raw is None:
            return self._fill
        blob, mask = raw
        where = self._locate(coords)
        if where is not None and len(blob) != where[1]:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is truncated: got {len(blob)} "
                f"of its {where[1]} bytes"
            )
        return self._undo_filters(coords, blob, mask, out)

    def read_chunk(self, coords: tuple[int, ...]) -> Any:
        return self.decode(coords, self.fetch_many([coords])[0])
