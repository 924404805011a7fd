"""Fetched chunk bytes served from the on-disk cache while the stored object is unchanged.

Off by default. :func:`use_disk_cache` (or ``MIXLE_DISK_CACHE=1``, or a folder) switches it
on for this process and the worker processes it starts; :func:`chunk_disk_cache` is this
process's :class:`~mixle.reading.disk_cache.ChunkDiskCache` then, ``None`` otherwise.

:class:`CachedObjects` reads the objects under one store root through an
:class:`~mixle.reading.object_client.ObjectClient` (the obstore path) and that cache. An
entry is keyed by the store URL, the key, the byte range and the object's *version* (its
ETag; :func:`~mixle.reading.object_client.object_version`), so bytes are served only for
the version they were fetched as:

- a zarr store's versions come from one listing of the store per process (one ``LIST``
  request per 1,000 objects), so a second run fetches no chunk it has cached, and a chunk
  rewritten since (a new ETag) misses and is fetched again;
- a single object (an HDF5 file) has its version from one ``HEAD`` when it is opened;
- what a fetch brings is stored under the version *its answer* carries, not the listed
  one: an object replaced between the listing and the request is stored as what it now is.

A store that cannot be listed (plain HTTP servers have no listing; a bucket policy may
deny it) or whose objects have no version is read without the cache, with one
:class:`~mixle.errors.DiskCacheWarning` per store and process.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any

from mixle.errors import DiskCacheWarning
from mixle.reading.disk_cache import CHUNK_CACHE_BYTES_ENV, ChunkDiskCache, ContentKey
from mixle.reading.faults import retry_async, retry_call
from mixle.reading.object_client import ObjectClient, object_version
from mixle.reading.ranges import ByteSpan
from mixle.utils.validation import parse_int

__all__ = [
    "DISK_CACHE_ENV",
    "CachedObjects",
    "chunk_disk_cache",
    "reads_through",
    "use_disk_cache",
]

#: Environment variable that switches the on-disk chunk cache on: ``1``/``true``/``on`` (the
#: default folder), a folder path, or ``0``/``false``/``off``/empty (off, the default).
#: Worker processes inherit it.
DISK_CACHE_ENV = "MIXLE_DISK_CACHE"
_ON = frozenset({"1", "true", "on", "yes"})
_OFF = frozenset({"", "0", "false", "off", "no"})

_instance: tuple[tuple[int, str, str], ChunkDiskCache] | None = None
_instance_lock = threading.Lock()


def use_disk_cache(
    directory: bool | str | os.PathLike[str] = True, *, budget_bytes: int | None = None
) -> None:
    """Switch the on-disk cache of fetched remote chunks on or off, here and in workers.

    Sets :data:`DISK_CACHE_ENV` (and ``MIXLE_CHUNK_CACHE_BYTES``) in ``os.environ``, so
    worker processes started afterwards use the same cache.

    Parameters
    ----------
    directory
        ``True``: on, in the default folder (``$MIXLE_CACHE_DIR/chunks``); a folder: on,
        there; ``False``: off.
    budget_bytes
        The most bytes the folder keeps (``None``: ``$MIXLE_CHUNK_CACHE_BYTES``, else
        :data:`~mixle.reading.disk_cache.CHUNK_CACHE_BYTES`).

    Raises
    ------
    TypeError, ValueError
        ``directory`` is not a bool or a path, ``budget_bytes`` not an int of 0 or more.
    NotADirectoryError, PermissionError
        The folder is a file or cannot be written (the cache checks it here).
    """
    global _instance
    if budget_bytes is not None:
        budget_bytes = parse_int(budget_bytes, "budget_bytes")
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes={budget_bytes} must be 0 or more")
    if isinstance(directory, bool):
        value = "1" if directory else "0"
    elif isinstance(directory, (str, os.PathLike)):
        value = os.fspath(directory)
        if not value or value.strip().lower() in _ON | _OFF:
            raise ValueError(f"directory={directory!r} is not a folder; pass True or False")
    else:
        raise TypeError(f"directory={directory!r} must be True, False or a folder path")
    if value != "0":  # check the folder now, not at the first fetch
        ChunkDiskCache(None if value == "1" else value, budget_bytes)
    os.environ[DISK_CACHE_ENV] = value
    if budget_bytes is not None:
        os.environ[CHUNK_CACHE_BYTES_ENV] = str(budget_bytes)
    with _instance_lock:
        _instance = None


def chunk_disk_cache() -> ChunkDiskCache | None:
    """This process's on-disk chunk cache, or ``None`` when it is off (the default).

    Raises
    ------
    ValueError
        ``MIXLE_DISK_CACHE`` or ``MIXLE_CHUNK_CACHE_BYTES`` holds a value that is none of
        those accepted (named in the message).
    """
    global _instance
    value = os.environ.get(DISK_CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    ident = (os.getpid(), value, os.environ.get(CHUNK_CACHE_BYTES_ENV, ""))
    with _instance_lock:
        if _instance is not None and _instance[0] == ident:
            return _instance[1]
        made = ChunkDiskCache(None if value.lower() in _ON else value)
        _instance = (ident, made)
        return made


class CachedObjects:
    """The objects under one store root, read through ``client`` and the disk ``cache``.

    Parameters
    ----------
    client
        The obstore client of the store root (keys are relative to it).
    cache
        Where fetched bytes are kept.
    single
        The key of the one object read (an HDF5 file): its version comes from a ``HEAD``
        instead of a listing of the whole store.
    prefix
        List only the objects under this key prefix (an array inside a group), not the
        whole store.
    """

    def __init__(
        self,
        client: ObjectClient,
        cache: ChunkDiskCache,
        single: str | None = None,
        prefix: str = "",
    ):
        self.client, self.cache, self.single = client, cache, single
        self.prefix = prefix.strip("/")
        self._versions: Mapping[str, str] | None = None
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._warned = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (CachedObjects, (self.client, self.cache, self.single, self.prefix))

    # -- versions ----------------------------------------------------------------------------
    def _list(self) -> dict[str, str]:
        """``key -> version`` of every object under the root (or of :attr:`single`); their
        sizes go to :attr:`_sizes`."""
        import obstore

        store = self.client.store()
        found: dict[str, str] = {}
        problem: BaseException | str | None = None
        try:
            if self.single is not None:
                batches: Any = [[obstore.head(store, self.single)]]
            else:  # a page (1,000 objects) at a time, not the whole listing at once
                batches = obstore.list(store, prefix=self.prefix or None, chunk_size=1000)
            for meta in (m for batch in batches for m in batch):
                version = object_version(meta)
                if version is not None:
                    key = self.single if self.single is not None else str(meta["path"])
                    found[key] = version
                    self._sizes[key] = int(meta["size"])
        except BaseException as exc:
            problem = self.client._translated(exc, self.single or "", (0, None))
        if problem is not None:  # raised out here: no obstore error on the chain
            raise self.client._error(problem, self.single or "", (0, None))
        return found

    def versions(self) -> Mapping[str, str]:
        """``key -> version``, asked once per process (retried); ``{}`` where it cannot be."""
        with self._lock:
            if self._versions is None:
                try:
                    self._versions = retry_call(
                        self._list,
                        url=self.client.url,
                        key="(listing)",
                        secrets=self.client.secrets,
                    )
                except (OSError, RuntimeError) as exc:
                    self._versions = {}
                    self._warn(f"it cannot be listed ({type(exc).__name__}: {exc})")
                else:
                    if not self._versions:
                        self._warn(
                            "no object under it has a version (an ETag, or a Last-Modified "
                            "at least 2 s old)"
                        )
            return self._versions

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.client.display}: read without the on-disk chunk cache, as {why}",
                DiskCacheWarning,
                stacklevel=4,
            )

    # -- reads -------------------------------------------------------------------------------
    def _fixed(self, key: str, span: ByteSpan) -> ByteSpan | None:
        """``span`` as bytes that do not move: a suffix ``(-n, None)`` resolved by the listed
        size (``None`` when it is unknown), an empty range ``None``."""
        start, end = span
        if start >= 0:
            return span if end is None or end > start else None
        size = self._sizes.get(key)
        return None if size is None else (max(0, size + start), size)

    def _hit(self, key: str, span: ByteSpan, limit: int | None) -> tuple[bytes | None, str | None]:
        version = self.versions().get(key)
        fixed = self._fixed(key, span)
        if version is None or fixed is None:
            return None, version
        hit = self.cache.get(ContentKey(self.client.cache_store, key, version, fixed))
        if hit is not None and limit is not None and len(hit) > limit:
            return None, version  # cached under a larger limit: fetch and check again
        return hit, version

    def _keep(self, key: str, span: ByteSpan, seen: list[str | None], body: bytes) -> None:
        version = seen[-1] if seen else None
        fixed = self._fixed(key, span)
        if version is None or fixed is None:
            return
        if span[0] < 0 and version != self.versions().get(key):
            return  # a suffix resolved by a listed size the answer may not have had
        try:
            self.cache.put(ContentKey(self.client.cache_store, key, version, fixed), body)
        except OSError as exc:  # a full disk: the read itself succeeded
            warnings.warn(
                f"{self.client.display}: a fetched chunk was not kept in the on-disk "
                f"cache ({type(exc).__name__}: {exc})",
                DiskCacheWarning,
                stacklevel=3,
            )

    async def fetch(
        self, key: str, span: ByteSpan, *, size: int | None = None, limit: int | None = None
    ) -> bytes:
        """:meth:`ObjectClient.fetch` (one try), served from the cache where it is current."""
        import asyncio  # not at import: ``import mixle`` stays without it

        hit, _ = await asyncio.to_thread(self._hit, key, span, limit)
        if hit is not None:
            return hit
        seen: list[str | None] = []
        body = await self.client.fetch(key, span, size=size, limit=limit, seen=seen)
        await asyncio.to_thread(self._keep, key, span, seen, body)
        return body

    async def fetch_retried(
        self, key: str, span: ByteSpan, *, url: str, name: str, limit: int | None = None
    ) -> bytes:
        """:meth:`fetch` under the retry policy (``url`` and ``name`` for its errors)."""
        return await retry_async(
            lambda: self.fetch(key, span, limit=limit),
            url=url,
            key=name,
            secrets=self.client.secrets,
        )

    def read(
        self, key: str, span: ByteSpan, *, url: str, name: str, limit: int | None = None
    ) -> bytes:
        """:meth:`ObjectClient.read` (blocking, retried), served from the cache where current."""
        hit, _ = self._hit(key, span, limit)
        if hit is not None:
            return hit
        seen: list[str | None] = []

        def call() -> bytes:
            seen.clear()
            return self.client.fetch_sync(key, span, limit=limit, seen=seen)

        body = retry_call(call, url=url, key=name, secrets=self.client.secrets)
        self._keep(key, span, seen, body)
        return body


def reads_through(
    client: ObjectClient, single: str | None = None, prefix: str = ""
) -> ObjectClient | CachedObjects:
    """What a source opened over ``client`` fetches through: ``client`` itself, or with the
    on-disk cache on (:func:`use_disk_cache`) a :class:`CachedObjects` over it (made anew
    at each open, so each open lists, or asks ``single``'s version, afresh).

    Both have ``async fetch(key, span, *, size=None, limit=None)``.
    """
    cache = chunk_disk_cache()
    return client if cache is None else CachedObjects(client, cache, single, prefix)
