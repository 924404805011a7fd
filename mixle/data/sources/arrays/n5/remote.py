"""N5 datasets behind URLs (``http(s)://``, ``s3://``...): checked, retried requests.

``attributes.json`` and every block are fetched whole, through obstore
(:class:`~mixle.reading.object_client.ObjectClient`, where
:func:`~mixle.reading.object_client.choose_client` gives one for the container's URL) or
with :func:`~mixle.reading.fetch.fetch_range` (status, ``Content-Range`` and length checked;
downloads capped at :data:`~mixle.data.sources.arrays.n5.attributes.N5_METADATA_LIMIT` or a
block's :func:`~mixle.data.sources.arrays.n5.blocks.stored_limit`), each request retried
on its own by the process-wide retry policy. :class:`RemoteN5BlockReader` fetches all the
blocks a batch misses concurrently (a
:class:`~mixle.reading.executor.SupportsFetchMany`); a block the store does not have (a
``404``) reads as 0, as tensorstore reads it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.n5.attributes import (
    ATTRIBUTES_FILE,
    N5_METADATA_LIMIT,
    N5Metadata,
    parse_attributes,
    too_large,
)
from mixle.data.sources.arrays.n5.blocks import Decompressor, decode_block, stored_limit
from mixle.reading import CorruptChunkError, new_token
from mixle.reading.faults import retry_async
from mixle.reading.fetch import fetch_range, read_range
from mixle.reading.fs_options import timed_storage_options, widen_connection_pool
from mixle.reading.inflight import gather_bounded
from mixle.reading.object_client import ObjectClient, run_batch
from mixle.utils.optional_deps import require

__all__ = [
    "RemoteN5BlockReader",
    "fetch_whole",
    "object_key",
    "open_remote",
    "read_remote_attributes",
    "url_secrets",
]


def url_secrets(url: str, storage_options: dict[str, Any] | None) -> list[Any]:
    """What error messages mask: ``storage_options``, a URL's query and its values."""
    query = urllib.parse.urlsplit(url).query
    values = [v for _, v in urllib.parse.parse_qsl(query, keep_blank_values=True)]
    return [storage_options, *([query] if query else []), *values]


def open_remote(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """``(file system, root path)`` of the container at ``url``, with mixle's timeouts.

    Raises
    ------
    ImportError
        fsspec is not installed: ``pip install -e ".[remote]"``.
    """
    require("fsspec", "remote", feature="read_n5 over URLs")
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]

    fs, path = url_to_fs(url, **timed_storage_options(url, storage_options))
    return widen_connection_pool(fs), path.rstrip("/")


def object_key(folder: str, name: str) -> str:
    """The key of ``name`` in ``folder`` (``""``: the client's root) under an obstore client."""
    return f"{folder}/{name}" if folder else name


def fetch_whole(
    client: ObjectClient, key: str, *, url: str, name: str, secrets: Any, limit: int
) -> bytes:
    """Object ``key`` of ``client`` as ``bytes=0-``, checked, capped at ``limit``, retried.

    Raises
    ------
    FileNotFoundError
        No such object (its text redacted).
    RemoteReadError
        The requests kept failing.
    """

    async def get() -> bytes:
        return await client.fetch(key, (0, None), limit=limit)

    return run_batch(lambda: retry_async(get, url=url, key=name, secrets=secrets))


def read_remote_attributes(
    fs: Any, folder: str, url: str, secrets: Any, client: ObjectClient | None = None
) -> dict[str, Any] | None:
    """The ``attributes.json`` object of ``folder`` on ``fs`` (``None``: there is none).

    ``url`` is the display-safe URL of ``folder``. With ``client`` (obstore), ``fs`` is not
    used and ``folder`` is a key prefix under the client's root (``""``: the root). Raises
    as :func:`~mixle.data.sources.arrays.n5.attributes.read_attributes` does, and
    :class:`~mixle.errors.RemoteReadError` when the requests keep failing.
    """
    where = f"{url.rstrip('/')}/{ATTRIBUTES_FILE}"
    try:
        if client is not None:
            data = fetch_whole(
                client,
                object_key(folder, ATTRIBUTES_FILE),
                url=where,
                name=ATTRIBUTES_FILE,
                secrets=secrets,
                limit=N5_METADATA_LIMIT,
            )
        else:
            data = read_range(
                fs,
                f"{folder}/{ATTRIBUTES_FILE}",
                (0, None),
                url=where,
                key=ATTRIBUTES_FILE,
                secrets=secrets,
                limit=N5_METADATA_LIMIT,
            )
    except FileNotFoundError:
        return None
    except CorruptChunkError:  # past the limit
        raise too_large(where) from None
    return parse_attributes(data, where)


class RemoteN5BlockReader:
    """Decoded blocks of an N5 dataset behind a URL, fetched concurrently, decoded on the pool.

    Parameters
    ----------
    fs, folder
        The fsspec file system and the dataset's path on it; with ``client``, ``fs`` is not
        used and ``folder`` is the dataset's key prefix under the client's root.
    metadata, decode
        The dataset's parsed metadata and its bounded decompressor.
    where, url
        How errors name the dataset and its URL (display-safe).
    secrets
        Values masked in error messages.
    client
        The obstore client reading the container (``None``: fsspec reads).
    """

    def __init__(
        self,
        fs: Any,
        folder: str,
        metadata: N5Metadata,
        decode: Decompressor,
        where: str,
        url: str,
        secrets: Any = None,
        client: ObjectClient | None = None,
    ) -> None:
        self.chunks: tuple[int, ...] = metadata.blocks
        self.token = new_token()
        self._fs, self._folder, self._meta, self._decode = fs, folder, metadata, decode
        self._where, self._url, self._secrets = where, url.rstrip("/"), secrets
        self._limit = stored_limit(metadata)
        self._client = client

    @staticmethod
    def _key(coords: tuple[int, ...]) -> str:
        return "/".join(map(str, coords)) if coords else "0"

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[bytes | None]:
        """Stored bytes of blocks ``coords`` in order; ``None`` for a block not stored."""
        fs, limit, secrets = self._fs, self._limit, self._secrets
        keys = [self._key(c) for c in coords]
        sizes = [self._meta.block_nbytes] * len(keys)
        client = self._client
        if client is not None:

            def fetch(key: str) -> Any:
                name, url = object_key(self._folder, key), f"{self._url}/{key}"

                async def get() -> bytes:
                    return await client.fetch(name, (0, None), limit=limit)

                async def attempt() -> bytes | None:
                    try:
                        return await retry_async(get, url=url, key=key, secrets=secrets)
                    except FileNotFoundError:
                        return None

                return attempt

            calls = [fetch(k) for k in keys]
            return run_batch(lambda: gather_bounded(calls, sizes))
        if not getattr(fs, "async_impl", False):
            return [self._read_one(k) for k in keys]
        from fsspec.asyn import sync  # type: ignore[import-untyped]

        def call(key: str) -> Any:
            path, url = f"{self._folder}/{key}", f"{self._url}/{key}"

            async def get() -> bytes:
                return await fetch_range(fs, path, (0, None), limit=limit)

            async def attempt() -> bytes | None:
                try:
                    return await retry_async(get, url=url, key=key, secrets=secrets)
                except FileNotFoundError:
                    return None

            return attempt

        return list(sync(fs.loop, gather_bounded, [call(k) for k in keys], sizes))

    def _read_one(self, key: str) -> bytes | None:
        """Block ``key`` through a synchronous fsspec file system (``None``: not stored)."""
        try:
            return read_range(
                self._fs,
                f"{self._folder}/{key}",
                (0, None),
                url=f"{self._url}/{key}",
                key=key,
                secrets=self._secrets,
                limit=self._limit,
            )
        except FileNotFoundError:
            return None

    def decode(self, coords: tuple[int, ...], raw: bytes | None) -> np.ndarray:
        """Block ``coords`` from its stored bytes (``None``: never written, zeros)."""
        shape = self._meta.shape
        extent = tuple(min(b, s - c * b) for c, b, s in zip(coords, self.chunks, shape))
        if raw is None:
            return np.broadcast_to(np.zeros((), dtype=self._meta.dtype), extent)
        key = self._key(coords)
        what = f"block {key!r} (grid coordinates {coords}) of N5 dataset {self._where}"
        if len(raw) > self._limit:
            raise CorruptChunkError(
                f"{what} is corrupt: {len(raw):,} stored bytes, more than the {self._limit:,} "
                f"a block can have"
            )
        return decode_block(raw, self._meta, self._decode, extent, f"{what} ({self._url}/{key})")

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        return self.decode(coords, self.fetch_many([coords])[0])
