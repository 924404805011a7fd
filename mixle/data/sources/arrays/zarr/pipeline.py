"""zarr chunks read through zarr's own codec pipeline, for layouts mixle does not decode.

:class:`ZarrPipelineReader` asks zarr for the chunk's region (``array[chunk]``): every
layout zarr handles, for codecs mixle does not know. Bounded only after the fact
(:mod:`mixle.data.sources.arrays.zarr.limits`): stored objects are capped and decoded regions
checked, but zarr's decoding itself is not bounded.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.limits import (
    check_region,
    pipeline_stored_limit,
    refuse_oversized,
)
from mixle.data.sources.arrays.zarr.local_files import local_dir, refuse_special
from mixle.data.sources.arrays.zarr.stores import checked_async_array
from mixle.reading import CorruptChunkError, new_token
from mixle.reading.inflight import gather_bounded, stream_bounded

__all__ = ["ZarrPipelineReader"]


class ZarrPipelineReader:
    """Decoded chunks through zarr's own codec pipeline (``array[chunk region]``).

    The chunks a batch misses are all asked of zarr at once, on its event loop
    (:meth:`fetch_each`), so zarr fetches and decodes them concurrently. zarr's failure to
    decode a chunk is raised as :class:`CorruptChunkError` naming the array and chunk; in a
    local directory store, a directory where the chunk's object should be (which zarr reads
    as the fill value) raises it too. On an fsspec or obstore store zarr reads through
    :func:`checked_store`: each request checked and retried, a request that keeps failing
    raised as :class:`~mixle.reading.RemoteReadError` naming ``url`` and the stored key.

    zarr's decoding is bounded only after the fact (:mod:`mixle.data.sources.arrays.zarr.limits`):
    a stored object over :func:`~mixle.data.sources.arrays.zarr.limits.pipeline_stored_limit`
    bytes is refused (a local file by ``stat``, a download by its length) and the region
    zarr returns must have the shape and dtype asked; the memory zarr's codecs take while
    decoding is not bounded.

    Parameters
    ----------
    array
        An open ``zarr.Array``.
    where
        How error messages name the array (never credentials).
    url
        Display-safe location of the array, used in errors with the stored key.
    secrets
        Values masked in error messages (the ``storage_options``).
    """

    def __init__(self, array: Any, where: str = "", url: str = "", secrets: Any = None) -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._array = array
        self._stored_limit = pipeline_stored_limit(array)
        shown = url or where or repr(array.store)
        self._reads = checked_async_array(array, shown, secrets, self._stored_limit)
        self._shape = tuple(array.shape)
        self._where = where or repr(array.store)
        shards = getattr(array, "shards", None)
        self._per_object = (
            (1,) * len(self.chunks)
            if shards is None
            else tuple(s // c for s, c in zip(shards, self.chunks))
        )
        self._base = local_dir(array)
        itemsize = getattr(np.dtype(array.dtype), "itemsize", 0) or 8
        self._nbytes = math.prod(self.chunks) * itemsize

    async def _read(self, coords: tuple[int, ...]) -> np.ndarray:
        """Chunk ``coords`` (clipped to the array), read and decoded by zarr."""
        stored = tuple(c // n for c, n in zip(coords, self._per_object))
        key = self._array.metadata.encode_chunk_key(stored)
        if self._base is not None:
            refuse_special(self._base, key, self._where, coords)
            refuse_oversized(self._base, key, self._where, coords, self._stored_limit)
        region = tuple(
            slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, self.chunks, self._shape)
        )
        try:
            out = np.asarray(await self._reads.getitem(region))
        except Exception as exc:
            if isinstance(exc, (OSError, CorruptChunkError)) or _from_network_client(exc):
                raise  # I/O failures (missing files, remote errors) are not corruption
            sharded = self._per_object != (1,) * len(coords)
            what, inner = ("shard", "its inner chunk at ") if sharded else ("chunk", "")
            raise CorruptChunkError(
                f"{what} {key!r} of zarr array {self._where} ({inner}chunk grid coordinates "
                f"{coords}) is corrupt (zarr could not decode it: {type(exc).__name__}: {exc})"
            ) from exc
        shape = tuple(r.stop - r.start for r in region)
        return check_region(out, shape, np.dtype(self._array.dtype), key, self._where)

    def fetch_each(
        self, coords: Sequence[tuple[int, ...]]
    ) -> Generator[list[tuple[int, Any]], None, None]:
        """Ask zarr for every chunk now; ``(k, decoded chunk)`` groups as they arrive."""
        from zarr.core.sync import _get_loop  # zarr's I/O loop, which owns the store

        calls = [(lambda c=c: self._read(c)) for c in coords]
        return stream_bounded(_get_loop(), calls, [self._nbytes] * len(coords))

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        """Chunks ``coords``, read and decoded by zarr concurrently, in order."""
        from zarr.core.sync import sync

        calls = [(lambda c=c: self._read(c)) for c in coords]
        return list(sync(gather_bounded(calls, [self._nbytes] * len(coords))))

    def decode(self, coords: tuple[int, ...], raw: np.ndarray) -> np.ndarray:
        """The chunk as :meth:`fetch_each` gave it (zarr decoded it already)."""
        return raw

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        return self.fetch_many([coords])[0]


#: Top-level packages of network clients, whose errors are failed requests, not bad data.
_NETWORK_CLIENTS = frozenset({"aiohttp", "aiobotocore", "botocore", "urllib3", "requests", "httpx"})


def _from_network_client(exc: BaseException) -> bool:
    """Whether ``exc`` is an error class of a network client (a request failed)."""
    return any(cls.__module__.split(".")[0] in _NETWORK_CLIENTS for cls in type(exc).__mro__)
