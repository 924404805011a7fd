"""HDF5 files behind fsspec URLs (``http(s)://``, ``s3://``...) or in file-like objects.

h5py reads such files through a Python file object (the ``fileobj`` driver): metadata and
the chunk index come through an fsspec file with a block cache sized for patch reads.
Chunk bytes do not: :class:`RemoteHDF5ChunkReader` looks up each chunk's byte range in
HDF5's chunk index, fetches all the chunks a batch misses concurrently with fsspec (each
request retried on its own), and decodes them in the decode pool, like the local
:class:`~mixle.data.sources.hdf5_chunks.HDF5ChunkReader`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mixle.data.sources.hdf5_chunks import HDF5ChunkReader, decodable_filters
from mixle.reading.faults import CorruptChunkError, retry_async
from mixle.reading.fetch import gather_bounded, widen_connection_pool
from mixle.utils.optional_deps import require

__all__ = [
    "HDF5_REMOTE_BLOCK_BYTES",
    "HDF5_REMOTE_CACHE_BLOCKS",
    "RemoteHDF5ChunkReader",
    "open_remote_file",
]

#: Block size of the fsspec file h5py reads metadata through: HDF5 metadata (object
#: headers, B-tree nodes) comes in small scattered pieces, so blocks stay small.
HDF5_REMOTE_BLOCK_BYTES = 512 * 1024
#: How many blocks that file keeps (an LRU block cache: 32 MiB in all by default).
HDF5_REMOTE_CACHE_BLOCKS = 64


def open_remote_file(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str, Any]:
    """``(filesystem, path, file object)`` for ``url``, the file read through a block cache."""
    require("fsspec", "remote", feature="HDF5 over URLs")
    from fsspec.core import url_to_fs  # type: ignore[import-untyped]

    fs, path = url_to_fs(url, **(storage_options or {}))
    fs = widen_connection_pool(fs)  # s3fs would keep only 10 chunk requests in flight
    file = fs.open(
        path,
        "rb",
        block_size=HDF5_REMOTE_BLOCK_BYTES,
        cache_type="blockcache",
        cache_options={"maxblocks": HDF5_REMOTE_CACHE_BLOCKS},
    )
    return fs, path, file


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
                return bytes(await fs._cat_file(path, start=offset, end=offset + size))

            return lambda: retry_async(get, url=self._url, key=str(c), secrets=self._secrets)

        calls = [call(coords[k], s[0], s[1]) for k, s in wanted]
        sizes = [s[1] for _, s in wanted]
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync  # type: ignore[import-untyped]

            blobs = sync(fs.loop, gather_bounded, calls, sizes)
        else:
            blobs = [fs.cat_file(path, start=s[0], end=s[0] + s[1]) for _, s in wanted]
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
