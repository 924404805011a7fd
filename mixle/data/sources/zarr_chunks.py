"""Whole-chunk readers for zarr arrays, plugged into the read planner.

Ways to get a decoded chunk:

- :class:`ZarrCodecReader` reads the stored bytes of one chunk itself (a file read for
  local stores) and decodes them with numcodecs directly into a new array. It covers the
  common layouts: format 2 with any numcodecs compressor and filters, format 3 with the
  ``bytes`` codec followed by zstd, gzip, blosc or crc32c. Decoders release the GIL.
- :class:`ZarrStoreReader` decodes the same layouts from any other zarr store (fsspec URLs
  such as ``s3://`` and ``http://``, memory, zip): all the chunks a batch misses are
  fetched in one concurrent call, each request retried on its own.
- :class:`~mixle.data.sources.zarr_shards.ShardedZarrReader` does the same for sharded
  arrays, reading each shard index once and merging nearby inner chunks into few requests.
- :class:`ZarrPipelineReader` asks zarr for the chunk's region (``array[chunk]``), through
  zarr's own codec pipeline: every layout zarr handles, for codecs mixle does not know.

:func:`zarr_chunk_reader` picks the first that applies. Stored bytes that do not decode to
a whole chunk raise :class:`~mixle.reading.CorruptChunkError` naming the array and chunk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

import numpy as np

from mixle.reading import CorruptChunkError, new_token
from mixle.reading.faults import retry_async
from mixle.reading.fetch import gather_bounded, stream_bounded, widen_connection_pool
from mixle.utils.optional_deps import require

__all__ = [
    "ZarrCodecReader",
    "ZarrPipelineReader",
    "ZarrStoreReader",
    "codec_chain",
    "decode_checked",
    "fill_chunk",
    "local_chunk_dir",
    "zarr_chunk_reader",
]

#: dtype kinds whose chunks are plain fixed-size bytes (bool, ints, floats, complex, times).
_PLAIN_KINDS = "biufcmM"

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Decoder = Callable[[bytes], np.ndarray]


class ZarrPipelineReader:
    """Decoded chunks through zarr's own codec pipeline (``array[chunk region]``)."""

    def __init__(self, array: Any) -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._array = array
        self._shape = tuple(array.shape)

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        key = tuple(
            slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, self.chunks, self._shape)
        )
        return np.asarray(self._array[key])


def fill_chunk(array: Any, chunks: tuple[int, ...]) -> np.ndarray:
    """A read-only chunk of ``array``'s fill value (zeros when it has none), as zarr reads."""
    fill = array.fill_value
    chunk = np.full(chunks, 0 if fill is None else fill, dtype=np.dtype(array.dtype))
    chunk.flags.writeable = False
    return chunk


def decode_checked(decode: Decoder, raw: bytes, where: str, key: str) -> np.ndarray:
    """``decode(raw)``, any failure raised as :class:`CorruptChunkError` naming the chunk."""
    try:
        return decode(raw)
    except Exception as exc:
        raise CorruptChunkError(
            f"chunk {key!r} of zarr array {where} is corrupt ({len(raw)} stored bytes do not "
            f"decode to a chunk: {type(exc).__name__}: {exc})"
        ) from None


class _DecodedChunks:
    """What both numcodecs readers share: chunk shape, cache token, decoder, fill chunk."""

    def __init__(self, array: Any, decode: Decoder, where: str = "") -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._decode = decode
        self._where = where or repr(array.store)
        self._meta = array.metadata
        self._fill = fill_chunk(array, self.chunks)

    def decode(self, coords: tuple[int, ...], raw: bytes | None) -> np.ndarray:
        """Chunk ``coords`` from its stored bytes (``None``: never written, the fill value)."""
        if raw is None:
            return self._fill
        return decode_checked(self._decode, raw, self._where, self._meta.encode_chunk_key(coords))


class ZarrCodecReader(_DecodedChunks):
    """Decoded chunks of an array in a local directory store, decoded with numcodecs.

    Parameters
    ----------
    array
        An open ``zarr.Array`` in a ``LocalStore`` whose layout :func:`codec_chain`
        understands.
    decode
        Turns stored bytes into a decoded chunk array of shape ``array.chunks``.
    where
        How error messages name the array (never credentials).
    """

    def __init__(self, array: Any, decode: Decoder, where: str = "") -> None:
        super().__init__(array, decode, where)
        self._base = local_chunk_dir(array)

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        try:
            path = os.path.join(self._base, *self._meta.encode_chunk_key(coords).split("/"))
            with open(path, "rb") as fh:
                raw: bytes | None = fh.read()
        except FileNotFoundError:
            raw = None  # never written: the fill value, as zarr reads it
        return self.decode(coords, raw)


class ZarrStoreReader(_DecodedChunks):
    """Decoded chunks from any other zarr store: a batch's chunks fetched concurrently.

    Parameters
    ----------
    array, decode, where
        As for :class:`ZarrCodecReader` (any store).
    url
        Display-safe location of the array, used in errors with the chunk key.
    secrets
        Values masked in error messages (the ``storage_options``).
    """

    def __init__(
        self, array: Any, decode: Decoder, where: str = "", url: str = "", secrets: Any = None
    ) -> None:
        super().__init__(array, decode, where)
        self._get = StoreGetter(array, url or self._where, secrets)
        self._nbytes = int(np.prod(self.chunks, dtype=np.int64)) * np.dtype(array.dtype).itemsize

    def fetch_each(
        self, coords: Sequence[tuple[int, ...]]
    ) -> Generator[list[tuple[int, Any]], None, None]:
        """Request every chunk now; ``(k, stored bytes or None)`` groups as they arrive."""
        keys = [self._meta.encode_chunk_key(c) for c in coords]
        return self._get.stream([(k, None) for k in keys], [self._nbytes] * len(keys))

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[bytes | None]:
        keys = [self._meta.encode_chunk_key(c) for c in coords]
        return self._get.many([(k, None) for k in keys], [self._nbytes] * len(keys))

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        return self.decode(coords, self.fetch_many([coords])[0])


#: A byte range request: ``None`` (whole object), ``(start, end)`` or ``(-n, None)`` (suffix).
ByteRange = tuple[int, int | None] | None


class StoreGetter:
    """Concurrent, retried ``get`` calls on a zarr store, run on zarr's event loop.

    An s3fs store whose ``storage_options`` leave the connection pool at aiobotocore's
    default of 10 is read through a copy with a wider pool
    (:func:`~mixle.reading.fetch.widen_connection_pool`).
    """

    def __init__(self, array: Any, url: str, secrets: Any = None) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.storage import FsspecStore

        self._store = array.store
        if isinstance(self._store, FsspecStore):
            wide = widen_connection_pool(self._store.fs)
            if wide is not self._store.fs:
                self._store = FsspecStore(wide, read_only=True, path=self._store.path)
        path = array.path.strip("/")
        self._prefix = f"{path}/" if path else ""
        self._prototype = default_buffer_prototype()
        self._url = url.rstrip("/")
        self._secrets = secrets

    async def get(self, key: str, byte_range: ByteRange) -> bytes | None:
        """One retried request; ``None`` when the key does not exist."""
        from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

        # a whole object is asked for as "bytes from 0": s3fs sends a HEAD before a plain GET
        request: Any = OffsetByteRequest(0)
        if byte_range is not None:
            start, end = byte_range
            request = SuffixByteRequest(-start) if end is None else RangeByteRequest(start, end)

        async def call() -> bytes | None:
            buf = await self._store.get(self._prefix + key, self._prototype, request)
            return None if buf is None else buf.to_bytes()

        return await retry_async(call, url=f"{self._url}/{key}", key=key, secrets=self._secrets)

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


def zarr_chunk_reader(
    array: Any, where: str = "", url: str = "", secrets: Any = None
) -> ZarrCodecReader | ZarrPipelineReader | Any:
    """The fastest chunk reader for ``array``: direct numcodecs decoding when it applies.

    ``where``/``url`` name the array in errors; ``secrets`` are masked in them.
    """
    from zarr.storage import LocalStore

    from mixle.data.sources.zarr_shards import ShardedZarrReader

    if getattr(array, "shards", None) is not None:
        sharded = ShardedZarrReader.for_array(array, where, url, secrets)
        return ZarrPipelineReader(array) if sharded is None else sharded
    decode = codec_chain(array)
    if decode is None:
        return ZarrPipelineReader(array)
    if isinstance(array.store, LocalStore):
        return ZarrCodecReader(array, decode, where)
    return ZarrStoreReader(array, decode, where, url, secrets)


def codec_chain(array: Any) -> Decoder | None:
    """A ``bytes -> chunk`` decoder for ``array``'s codecs, or ``None`` if mixle lacks one."""
    meta = array.metadata
    dtype = np.dtype(array.dtype)
    if dtype.kind not in _PLAIN_KINDS or getattr(array, "shards", None) is not None:
        return None
    chunks = tuple(array.chunks)
    if meta.zarr_format == 2:
        stored = meta.dtype.to_native_dtype()
        compressor = meta.compressor
        filters = list(meta.filters or ())
        return _numcodecs_decoder(compressor, filters, stored, chunks, meta.order)
    return v3_decoder(meta.codecs, dtype, chunks)


def v3_decoder(codecs: Sequence[Any], dtype: np.dtype, chunks: tuple[int, ...]) -> Decoder | None:
    """A decoder for a format 3 codec list (``bytes`` then bytes codecs), else ``None``."""
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

    numcodecs = require("numcodecs", "zarr", feature="ZarrArraySource")

    if not codecs or not isinstance(codecs[0], BytesCodec):
        return None  # array -> array codecs (transpose) or an unknown serializer
    endian = codecs[0].endian
    stored = (
        dtype if endian is None else dtype.newbyteorder("<" if endian.value == "little" else ">")
    )
    steps: list[Any] = []
    for codec in codecs[1:]:
        if isinstance(codec, ZstdCodec):
            steps.append(numcodecs.Zstd())
        elif isinstance(codec, GzipCodec):
            steps.append(numcodecs.GZip())
        elif isinstance(codec, BloscCodec):
            steps.append(numcodecs.Blosc())
        elif isinstance(codec, Crc32cCodec):
            steps.append(numcodecs.CRC32C())
        else:
            return None
    compressor = steps.pop() if steps else None  # the last codec applied is undone first
    return _numcodecs_decoder(compressor, steps, stored, chunks, "C")


def _numcodecs_decoder(
    compressor: Any,
    filters: list[Any],
    stored: np.dtype,
    chunks: tuple[int, ...],
    order: Literal["C", "F"],
) -> Decoder:
    """Decode ``compressor`` then ``filters`` (last first), as zarr format 2 does.

    The decoded bytes must be exactly one chunk: a short or long result raises.
    """
    count = int(np.prod(chunks, dtype=np.int64))
    nbytes = count * stored.itemsize
    direct = compressor is not None and not filters and compressor.codec_id in ("zstd", "blosc")

    def decode(raw: bytes) -> np.ndarray:
        if direct:  # decompress straight into the chunk; a size mismatch raises
            flat = np.empty(count, dtype=stored)
            declared = _declared_size(compressor.codec_id, raw)
            if declared not in (None, nbytes):
                raise ValueError(f"the stored header says {declared} bytes, a chunk has {nbytes}")
            compressor.decode(raw, out=flat)
        else:
            buf: Any = raw if compressor is None else compressor.decode(raw)
            for f in reversed(filters):
                buf = f.decode(buf)
            got = memoryview(buf).nbytes
            if got != nbytes:
                raise ValueError(f"decoded {got} bytes, a chunk has {nbytes}")
            flat = np.frombuffer(buf, dtype=stored, count=count)
        return flat.reshape(chunks, order=order)

    return decode


def _declared_size(codec_id: str, raw: bytes) -> int | None:
    """The decoded size a zstd frame or blosc header records, if it records one."""
    if codec_id == "blosc":
        return int.from_bytes(raw[4:8], "little") if len(raw) >= 16 else None
    if len(raw) < 6 or raw[:4] != _ZSTD_MAGIC:
        return None
    descriptor = raw[4]
    single_segment = (descriptor >> 5) & 1
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if not width or len(raw) < pos + width:
        return None
    size = int.from_bytes(raw[pos : pos + width], "little")
    return size + 256 if width == 2 else size


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
