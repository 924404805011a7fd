"""zarr stores whose reads are checked, capped and retried, for mixle's and zarr's own reads.

Every read from an fsspec store (``http://``, ``s3://``...) goes through
:class:`CheckedRangeStore`, whole objects too (asked as ``bytes=0-``): a response that is
not the bytes asked (a shifted ``Content-Range``, a body shorter than its headers say, a
text error page served with ``200``) is retried, then raised as
:class:`~mixle.reading.RemoteReadError`, never decoded. A binary ``200`` as long as its
``Content-Length`` is taken as the whole chunk; if it is not the chunk, decoding it raises
:class:`~mixle.reading.CorruptChunkError`. :func:`checked_store` wraps a store for zarr's
own reads; :class:`StoreGetter` runs mixle's concurrent reads on zarr's event loop.

A URL that :func:`~mixle.reading.object_client.choose_client` gives an obstore client is
opened over :func:`client_store`, a zarr store whose every ``get`` is one
:meth:`~mixle.reading.object_client.ObjectClient.fetch` (checked, capped, no ``HEAD``);
:class:`CheckedRangeStore`, :func:`checked_store` and :class:`StoreGetter` read it through
that client the same way, retried by the same policy.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Generator, Sequence
from typing import Any

from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.data.sources.arrays.zarr.local_files import ByteRange, local_dir, read_local_object
from mixle.reading import CorruptChunkError
from mixle.reading.cached_fetch import CachedObjects, reads_through
from mixle.reading.faults import RangeMismatchError, is_transient, retry_async
from mixle.reading.fetch import fetch_range
from mixle.reading.fs_options import widen_connection_pool
from mixle.reading.inflight import gather_bounded, stream_bounded
from mixle.reading.object_client import ObjectClient
from mixle.reading.ranges import ByteSpan, check_range

__all__ = [
    "CheckedRangeStore",
    "StoreGetter",
    "checked_async_array",
    "checked_store",
    "client_store",
    "is_metadata_key",
    "object_client_of",
]

#: Names of zarr's metadata documents (capped at :data:`ZARR_METADATA_LIMIT`).
_METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


class CheckedRangeStore:
    """A zarr store whose ``get`` answers are checked before they are returned (one try).

    On an fsspec store over async fsspec (HTTP, S3...) every read is fetched with
    :func:`~mixle.reading.fetch.fetch_range`: a range as asked, a whole object as
    ``bytes=0-`` (so s3fs sends no ``HEAD`` first); over HTTP and S3 the status,
    ``Content-Range`` and length are checked, elsewhere the length. On any other store
    (local, memory, zip, tifffile's) the length of zarr's answer to a range is checked, and a
    short one is accepted only when the object really ends there (``store.getsize``); whole
    objects there are zarr's plain full-object request (tifffile's store refuses ranges).
    On a :func:`client_store` every read is one
    :meth:`~mixle.reading.object_client.ObjectClient.fetch` (a whole object as ``bytes=0-``,
    the range and body length checked, no ``HEAD``).
    A mismatch raises :class:`~mixle.reading.faults.RangeMismatchError`, which the caller's
    retry retries; a missing key is ``None``, as zarr's stores answer it.

    ``limit`` is the most bytes one fsspec read may download (``None``: no cap; metadata
    keys are capped at :data:`ZARR_METADATA_LIMIT` whatever it is): a larger answer raises
    :class:`~mixle.reading.faults.CorruptChunkError` before its body is read, where the
    server declares its length.
    """

    def __init__(self, store: Any, limit: int | None = None) -> None:
        from zarr.storage import FsspecStore

        self.store = store
        self.limit = limit
        fs = getattr(store, "fs", None)
        async_fs = isinstance(store, FsspecStore) and getattr(fs, "async_impl", False)
        self._fs = fs if async_fs else None
        self.client = object_client_of(store)
        #: what :meth:`fetch_object` fetches through: the client, or for chunk reads
        #: (:class:`StoreGetter`) with the disk cache on the cache over it
        self.reads: ObjectClient | CachedObjects | None = self.client

    async def fetch_object(self, key: str, span: ByteSpan | None) -> bytes | None:
        """Bytes ``span`` (``None``: all) of stored key ``key`` through :attr:`client`; one try.

        ``None`` when the key does not exist. Only for a :func:`client_store`.
        """
        assert self.reads is not None
        try:
            return await self.reads.fetch(
                key,
                (0, None) if span is None else span,
                limit=ZARR_METADATA_LIMIT if is_metadata_key(key) else self.limit,
            )
        except FileNotFoundError as exc:
            if is_transient(exc):
                raise
            return None

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        """``store.get(key, prototype, byte_range)``, the answer checked first."""
        span = _span(byte_range)
        if self.client is not None:
            raw = await self.fetch_object(key, span)
            return None if raw is None else prototype.buffer.from_bytes(raw)
        if self._fs is not None:
            root = self.store.path.rstrip("/")
            try:
                raw = await fetch_range(
                    self._fs,
                    f"{root}/{key}" if root else key,
                    (0, None) if span is None else span,
                    limit=ZARR_METADATA_LIMIT if is_metadata_key(key) else self.limit,
                )
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                if is_transient(exc):  # fsspec's "not found" raised from a 503
                    raise
                return None  # as zarr's FsspecStore answers a missing key
            return prototype.buffer.from_bytes(raw)
        buf = await self.store.get(key, prototype, byte_range)
        if buf is None or span is None:
            return buf
        raw = buf.to_bytes()
        try:
            return prototype.buffer.from_bytes(check_range(raw, span))
        except RangeMismatchError:  # short: fine only where the object ends (truncated shard)
            size = await self.store.getsize(key)
            return prototype.buffer.from_bytes(check_range(raw, span, size=size))


def is_metadata_key(key: str) -> bool:
    """Whether stored key ``key`` is a zarr metadata document (capped at the metadata limit)."""
    return key.rsplit("/", 1)[-1] in _METADATA_NAMES


def _span(byte_range: Any) -> ByteSpan | None:
    """The :data:`~mixle.reading.fetch.ByteSpan` of a zarr byte request (``None``: whole)."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if isinstance(byte_range, RangeByteRequest):
        return (byte_range.start, byte_range.end)
    if isinstance(byte_range, SuffixByteRequest):
        return (-byte_range.suffix, None)
    if isinstance(byte_range, OffsetByteRequest):
        return (byte_range.offset, None)
    return None


def checked_store(
    store: Any, url: str, secrets: Any = None, prefix: str = "", limit: int | None = None
) -> Any:
    """``store`` for zarr's own reads: on an fsspec store, each ``get`` checked and retried.

    Parameters
    ----------
    store
        A zarr store; any store but a ``zarr.storage.FsspecStore`` or a :func:`client_store`
        is returned as it is.
    url
        Display-safe location of the array, used in errors with the stored key.
    secrets
        Values masked in error messages (the ``storage_options``).
    prefix
        The array's path inside the store (``"group/array/"``), left out of keys in errors.
    limit
        The most bytes one download of a stored chunk or shard may bring (``None``: no cap;
        metadata keys are capped at :data:`ZARR_METADATA_LIMIT` whatever it is).

    Returns
    -------
    zarr.storage.WrapperStore or the store
        A wrapper whose ``get`` is :meth:`CheckedRangeStore.get` under
        :func:`~mixle.reading.faults.retry_async`: a response that keeps not matching the
        bytes asked raises :class:`~mixle.reading.RemoteReadError`.
    """
    from zarr.storage import FsspecStore

    if not isinstance(store, FsspecStore) and object_client_of(store) is None:
        return store
    return _retried_store_type()(store, url, secrets, prefix, limit)


def client_store(client: ObjectClient, limit: int | None = None) -> Any:
    """A read-only zarr store over ``client``'s root URL: each ``get`` a checked, retried fetch.

    Parameters
    ----------
    client
        The obstore client (:func:`~mixle.reading.object_client.choose_client`); keys are
        relative to its root URL.
    limit
        The most bytes one ``get`` of a chunk or shard may bring (``None``: no cap;
        metadata keys are capped at :data:`ZARR_METADATA_LIMIT` whatever it is).

    Returns
    -------
    zarr.storage.ObjectStore
        Its ``get`` is :meth:`CheckedRangeStore.get` under
        :func:`~mixle.reading.faults.retry_async` (a missing key is ``None``; a request
        that keeps failing raises :class:`~mixle.reading.RemoteReadError` naming the key,
        which is not retried again), so ``zarr.open`` reads metadata through the client,
        each document retried on its own: a flaky server cannot fail every try of an
        open that asks for three documents at once. Listing and ``getsize`` are zarr's
        over the same obstore store. It pickles by ``client`` and opens a store of its own
        in the process that unpickles it. :class:`CheckedRangeStore` and
        :class:`StoreGetter` read it through ``client`` directly (one try each, retried
        by their caller), not through this ``get``.

    Raises
    ------
    RuntimeError
        Where obstore cannot read (a process forked after obstore's runtime ran).
    """
    return _client_store_type()(client, limit)


def object_client_of(store: Any) -> ObjectClient | None:
    """The obstore client a :func:`client_store` reads through, else ``None``."""
    client = getattr(store, "mixle_client", None)
    return client if isinstance(client, ObjectClient) else None


@functools.cache
def _client_store_type() -> type:
    """The :func:`client_store` class (built once, when zarr is imported anyway)."""
    from zarr.storage import ObjectStore

    class ClientObjectStore(ObjectStore):  # type: ignore[type-arg,misc]
        """zarr's obstore store whose reads are :class:`CheckedRangeStore` reads, retried."""

        def __init__(
            self, client: ObjectClient, limit: int | None = None, *, read_only: bool = True
        ) -> None:
            super().__init__(client.store(), read_only=read_only)
            self.mixle_client = client
            self._checked = CheckedRangeStore(self, limit)

        def __reduce__(self) -> tuple[Any, ...]:
            return (client_store, (self.mixle_client, self._checked.limit))

        def __eq__(self, other: object) -> bool:
            return (
                isinstance(other, ClientObjectStore)
                and other.mixle_client is self.mixle_client
                and other.read_only == self.read_only
            )

        __hash__ = None  # type: ignore[assignment]

        def __str__(self) -> str:
            return f"object_store://{self.mixle_client.display}"

        def with_read_only(self, read_only: bool = False) -> Any:
            return type(self)(self.mixle_client, self._checked.limit, read_only=read_only)

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            client = self.mixle_client
            return await retry_async(
                lambda: self._checked.get(key, prototype, byte_range),
                url=f"{client.display.rstrip('/')}/{key}",
                key=key,
                secrets=client.secrets,
            )

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            import asyncio

            return list(
                await asyncio.gather(
                    *(self.get(key, prototype, request) for key, request in key_ranges)
                )
            )

    return ClientObjectStore


@functools.cache
def _retried_store_type() -> type:
    """The :func:`checked_store` wrapper class (built once, when zarr is imported anyway)."""
    from zarr.storage import WrapperStore

    class RetriedCheckedStore(WrapperStore):  # type: ignore[type-arg,misc]
        """A zarr store whose reads are :class:`CheckedRangeStore` reads, retried."""

        def __init__(
            self,
            store: Any,
            url: str,
            secrets: Any = None,
            prefix: str = "",
            limit: int | None = None,
        ) -> None:
            super().__init__(store)
            self._checked = CheckedRangeStore(store, limit)
            self._url, self._secrets, self._prefix = url.rstrip("/"), secrets, prefix

        def _with_store(self, store: Any) -> Any:
            limit = self._checked.limit
            return type(self)(store, self._url, self._secrets, self._prefix, limit)

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            name = key.removeprefix(self._prefix)
            return await retry_async(
                lambda: self._checked.get(key, prototype, byte_range),
                url=f"{self._url}/{name}",
                key=name,
                secrets=self._secrets,
            )

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            return [await self.get(key, prototype, request) for key, request in key_ranges]

    return RetriedCheckedStore


def checked_async_array(array: Any, url: str, secrets: Any, limit: int | None = None) -> Any:
    """``array.async_array``, over :func:`checked_store` where its store is an fsspec one."""
    path = array.path.strip("/")
    store = checked_store(array.store, url, secrets, f"{path}/" if path else "", limit)
    if store is array.store:
        return array.async_array
    from zarr.core.array import AsyncArray
    from zarr.storage import StorePath

    reads = array.async_array
    return AsyncArray(
        metadata=reads.metadata, store_path=StorePath(store, path), config=reads.config
    )


class StoreGetter:
    """Concurrent, retried, checked ``get`` calls on a zarr store, run on zarr's event loop.

    Every answer comes through a :class:`CheckedRangeStore`. An s3fs store whose
    ``storage_options`` leave the connection pool at aiobotocore's default of 10 is read
    through a copy with a wider pool (:func:`~mixle.reading.fetch.widen_connection_pool`).

    Parameters
    ----------
    array
        The open ``zarr.Array`` whose store is read.
    url
        Display-safe location of the array, used in errors with the stored key.
    secrets
        Values masked in error messages (the ``storage_options``).
    limit
        The most bytes one stored object (or one range of it) may have. When set, objects
        of a local store are read by mixle itself, refusing special files and larger
        objects before reading them (``0``: through the store, unchecked).
    """

    def __init__(self, array: Any, url: str, secrets: Any = None, limit: int = 0) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.storage import FsspecStore

        store = array.store
        if isinstance(store, FsspecStore):
            wide = widen_connection_pool(store.fs)
            if wide is not store.fs:
                store = FsspecStore(wide, read_only=True, path=store.path)
        self._store = CheckedRangeStore(store, limit or None)
        path = array.path.strip("/")
        self._prefix = f"{path}/" if path else ""
        if self._store.client is not None:  # chunks through the disk cache, when it is on
            self._store.reads = reads_through(self._store.client, prefix=path)
        self._local = local_dir(array)
        self._prototype = default_buffer_prototype()
        self._url = url.rstrip("/")
        self._secrets = secrets
        self._limit = limit

    def local_path(self, key: str) -> str | None:
        """The file of stored key ``key`` in a local store, else ``None``."""
        return None if self._local is None else os.path.join(self._local, *key.split("/"))

    async def get(self, key: str, byte_range: ByteRange) -> bytes | None:
        """One retried request; ``None`` when the key does not exist.

        In a local store the file is read here (:func:`read_local_object`): a directory at
        ``key`` (which zarr's stores answer as a missing key) or a stored object larger
        than ``limit`` raises :class:`CorruptChunkError`, a FIFO, device or socket
        :class:`~mixle.SpecialFileError`, all before anything is read.
        """
        import asyncio  # loaded with zarr already; ``import mixle`` stays without it

        from zarr.abc.store import RangeByteRequest, SuffixByteRequest

        path = self.local_path(key)
        if path is not None and self._limit:
            what = f"stored object {key!r} of zarr array {self._url!r}:"
            return await asyncio.to_thread(
                read_local_object, path, f"{what} file", self._limit, byte_range
            )

        if self._store.client is not None:  # one fetch through obstore, retried
            return await retry_async(
                lambda: self._store.fetch_object(self._prefix + key, byte_range),
                url=f"{self._url}/{key}",
                key=key,
                secrets=self._secrets,
            )
        request: Any = None  # a whole object (fsspec stores: bytes=0-, see CheckedRangeStore)
        if byte_range is not None:
            start, end = byte_range
            request = SuffixByteRequest(-start) if end is None else RangeByteRequest(start, end)

        async def call() -> bytes | None:
            buf = await self._store.get(self._prefix + key, self._prototype, request)
            return None if buf is None else buf.to_bytes()

        url = f"{self._url}/{key}"
        raw = await retry_async(call, url=url, key=key, secrets=self._secrets)
        if raw is None and self._local is not None:
            path = os.path.join(self._local, *key.split("/"))
            if os.path.isdir(path):
                raise CorruptChunkError(
                    f"stored object {key!r} of zarr array {self._url!r} cannot be read: "
                    f"{path!r} is a directory, not a stored chunk or shard"
                )
        return raw

    def many(self, requests: Sequence[tuple[str, ByteRange]], sizes: Sequence[int]) -> list[Any]:
        """Every request at once (bounded in-flight bytes), results in order."""
        from zarr.core.sync import sync

        calls = [(lambda k=k, r=r: self.get(k, r)) for k, r in requests]
        return list(sync(gather_bounded(calls, sizes)))

    def stream(
        self, requests: Sequence[tuple[str, ByteRange]], sizes: Sequence[int]
    ) -> Generator[list[tuple[int, Any]], None, None]:
        """Every request at once, as :meth:`many`; ``(k, result)`` groups as they arrive.

        The requests start before this returns (see :func:`~mixle.reading.fetch.stream_bounded`).
        """
        from zarr.core.sync import _get_loop  # zarr's I/O loop, which owns the store's session

        calls = [(lambda k=k, r=r: self.get(k, r)) for k, r in requests]
        return stream_bounded(_get_loop(), calls, sizes)
