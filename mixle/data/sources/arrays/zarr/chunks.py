"""Whole-chunk readers for zarr arrays, plugged into the read planner.

Ways to get a decoded chunk:

- :class:`ZarrCodecReader` reads the stored bytes of one chunk itself (a file read for
  local stores) and decodes them with numcodecs directly into a new array. It covers the
  common layouts: format 2 with any numcodecs compressor and filters, format 3 with
  ``transpose``, numcodecs array codecs that keep the dtype or store it as a smaller
  integer or float, the ``bytes`` codec, then zstd, gzip, blosc, crc32c or numcodecs bytes
  codecs; variable-length strings and bytes too (:mod:`mixle.data.sources.arrays.zarr.vlen`), and
  shards compressed as a whole (:mod:`mixle.data.sources.arrays.zarr.outer_shards`).
  Decoding is bounded by the chunk's size at every stage
  (:mod:`mixle.data.sources.arrays.zarr.codecs`): a decompression bomb raises
  :class:`~mixle.reading.CorruptChunkError` having produced at most about one chunk.
  Decoders release the GIL.
- :class:`ZarrStoreReader` decodes the same layouts from any other zarr store (fsspec URLs
  such as ``s3://`` and ``http://``, memory, zip): all the chunks a batch misses are
  fetched in one concurrent call, each request retried on its own.
- :class:`~mixle.data.sources.arrays.zarr.shards.ShardedZarrReader` does the same for sharded
  arrays, reading each shard index once and merging nearby inner chunks into few requests.
- :class:`ZarrPipelineReader` asks zarr for the chunk's region (``array[chunk]``), through
  zarr's own codec pipeline: every layout zarr handles, for codecs mixle does not know.
  Bounded only after the fact (:mod:`mixle.data.sources.arrays.zarr.limits`): stored objects are
  capped and decoded regions checked, but zarr's decoding itself is not bounded.

Every read from an fsspec store (``http://``, ``s3://``...) goes through
:class:`CheckedRangeStore`, whole objects too (asked as ``bytes=0-``): a response that is
not the bytes asked (a shifted ``Content-Range``, a body shorter than its headers say, a
text error page served with ``200``) is retried, then raised as
:class:`~mixle.reading.RemoteReadError`, never decoded. A binary ``200`` as long as its
``Content-Length`` is taken as the whole chunk; if it is not the chunk, decoding it raises
:class:`~mixle.reading.CorruptChunkError`.

:func:`zarr_chunk_reader` picks the first that applies. Every reader answers alike: stored
bytes that do not decode to a whole chunk, or a directory where a chunk's object should be,
raise :class:`~mixle.reading.CorruptChunkError` naming the array and the chunk; a chunk
never written reads as the fill value, as zarr reads it. In a local store a chunk or shard
that is a FIFO, a device (a link to ``/dev/zero``) or a socket raises
:class:`~mixle.SpecialFileError` before anything is read, and one larger than its stored
form can be (:attr:`~mixle.data.sources.arrays.zarr.codecs.ChunkDecoder.stored_limit`) raises
:class:`~mixle.reading.CorruptChunkError` unread.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import stat
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import ChunkDecoder, numcodecs_decoder, v3_decoder
from mixle.data.sources.arrays.zarr.limits import (
    check_region,
    pipeline_stored_limit,
    refuse_oversized,
)
from mixle.data.sources.arrays.zarr.outer_shards import OuterShardDecoder, outer_shard_decoder
from mixle.data.sources.arrays.zarr.vlen import VlenChunkDecoder, vlen_decoder
from mixle.errors import SpecialFileError
from mixle.reading import CorruptChunkError, new_token
from mixle.reading.faults import RangeMismatchError, is_transient, retry_async
from mixle.reading.fetch import (
    ByteSpan,
    check_range,
    fetch_range,
    gather_bounded,
    stream_bounded,
    widen_connection_pool,
)
from mixle.utils.files import open_regular_file, require_regular_file

__all__ = [
    "CheckedRangeStore",
    "ZarrCodecReader",
    "ZarrPipelineReader",
    "PLAIN_KINDS",
    "ZarrStoreReader",
    "checked_store",
    "codec_chain",
    "decode_checked",
    "fill_chunk",
    "local_chunk_dir",
    "plain_dtype",
    "read_local_object",
    "refuse_special",
    "v3_decoder",
    "zarr_chunk_reader",
]

#: dtype kinds whose chunks are plain fixed-size bytes that mixle decodes itself: bool, ints,
#: floats, complex, times, fixed-width bytes (``S``), UTF-32 strings (``U``), structured and
#: raw (``V``) records.
PLAIN_KINDS = "biufcmMSUV"

#: Bytes of one zarr metadata document mixle lets zarr fetch and parse.
ZARR_METADATA_LIMIT = 16 * 1024 * 1024

#: Names of zarr's metadata documents (capped at :data:`ZARR_METADATA_LIMIT`).
_METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})

#: A ``bytes -> chunk`` decoder (every stage bounded by the chunk's size).
Decoder = ChunkDecoder | VlenChunkDecoder | OuterShardDecoder


class ZarrPipelineReader:
    """Decoded chunks through zarr's own codec pipeline (``array[chunk region]``).

    The chunks a batch misses are all asked of zarr at once, on its event loop
    (:meth:`fetch_each`), so zarr fetches and decodes them concurrently. zarr's failure to
    decode a chunk is raised as :class:`CorruptChunkError` naming the array and chunk; in a
    local directory store, a directory where the chunk's object should be (which zarr reads
    as the fill value) raises it too. On an fsspec store zarr reads through
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
        self._reads = _checked_async_array(array, shown, secrets, self._stored_limit)
        self._shape = tuple(array.shape)
        self._where = where or repr(array.store)
        shards = getattr(array, "shards", None)
        self._per_object = (
            (1,) * len(self.chunks)
            if shards is None
            else tuple(s // c for s, c in zip(shards, self.chunks))
        )
        self._base = _local_dir(array)
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


def fill_chunk(array: Any, chunks: tuple[int, ...]) -> np.ndarray:
    """A read-only chunk of ``array``'s fill value (zeros when it has none), as zarr reads.

    It is clipped to the array's shape: every region a read takes from a chunk lies inside
    the array, so a chunk far larger than the array (a damaged ``chunks``) costs no more
    than the array itself.
    """
    fill = array.fill_value
    shape = tuple(min(c, s) for c, s in zip(chunks, array.shape))
    chunk = np.full(shape, 0 if fill is None else fill, dtype=np.dtype(array.dtype))
    chunk.flags.writeable = False
    return chunk


def decode_checked(
    decode: Decoder,
    raw: bytes,
    where: str,
    key: str,
    coords: tuple[int, ...] | None = None,
    inner: tuple[int, ...] | None = None,
) -> np.ndarray:
    """``decode(raw)``, any failure raised as :class:`CorruptChunkError` naming the chunk.

    ``key`` is the chunk's stored key; ``coords``, if given, its chunk grid coordinates.
    ``inner``, if given, names an inner chunk (its chunk grid coordinates) of shard ``key``.
    """
    try:
        return decode(raw)
    except Exception as exc:
        at = "" if coords is None else f" (chunk grid coordinates {coords})"
        what = f"chunk {key!r}" if inner is None else f"inner chunk {inner} of shard {key!r}"
        raise CorruptChunkError(
            f"{what} of zarr array {where}{at} is corrupt ({len(raw)} stored bytes do "
            f"not decode to a chunk: {type(exc).__name__}: {exc})"
        ) from None


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
        raise CorruptChunkError(_directory_message(key, where, coords, path))
    require_regular_file(path, f"chunk {key!r} of zarr array {where}: file")


def read_local_object(
    path: str, what: str, limit: int, byte_range: ByteRange = None
) -> bytes | None:
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
            with open_regular_file(path, what) as file:
                size = os.fstat(file.fileno()).st_size
                if size > limit:  # refused unread
                    raise ValueError(
                        f"{what} {path!r} has {size:,} bytes, more than the {limit:,} a stored "
                        "chunk of this array can have"
                    )
                data = file.read(size + 1)  # one buffer of the file's size (a cap of it, too)
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


def _directory_message(key: str, where: str, coords: tuple[int, ...], path: str) -> str:
    return (
        f"chunk {key!r} of zarr array {where} (chunk grid coordinates {coords}) cannot be "
        f"read: {path!r} is a directory, not a stored chunk (a chunk never written has no file)"
    )


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
        key = self._meta.encode_chunk_key(coords)
        return decode_checked(self._decode, raw, self._where, key, coords)


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
        key = self._meta.encode_chunk_key(coords)
        path = os.path.join(self._base, *key.split("/"))
        what = f"chunk {key!r} of zarr array {self._where} (chunk grid coordinates {coords}):"
        try:
            # never written (None): the fill value, as zarr reads it
            raw = read_local_object(path, f"{what} file", self._decode.stored_limit)
        except CorruptChunkError:
            if os.path.isdir(path):
                raise CorruptChunkError(
                    _directory_message(key, self._where, coords, path)
                ) from None
            raise
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
        self._get = StoreGetter(array, url or self._where, secrets, decode.stored_limit)
        self._nbytes = math.prod(self.chunks) * np.dtype(array.dtype).itemsize

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


class CheckedRangeStore:
    """A zarr store whose ``get`` answers are checked before they are returned (one try).

    On an fsspec store over async fsspec (HTTP, S3...) every read is fetched with
    :func:`~mixle.reading.fetch.fetch_range`: a range as asked, a whole object as
    ``bytes=0-`` (so s3fs sends no ``HEAD`` first); over HTTP and S3 the status,
    ``Content-Range`` and length are checked, elsewhere the length. On any other store
    (local, memory, zip, tifffile's) the length of zarr's answer to a range is checked, and a
    short one is accepted only when the object really ends there (``store.getsize``); whole
    objects there are zarr's plain full-object request (tifffile's store refuses ranges).
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

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        """``store.get(key, prototype, byte_range)``, the answer checked first."""
        span = _span(byte_range)
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
        A zarr store; any store but a ``zarr.storage.FsspecStore`` is returned as it is.
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

    if not isinstance(store, FsspecStore):
        return store
    return _retried_store_type()(store, url, secrets, prefix, limit)


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


def _checked_async_array(array: Any, url: str, secrets: Any, limit: int | None = None) -> Any:
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
        self._local = _local_dir(array)
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


def zarr_chunk_reader(
    array: Any, where: str = "", url: str = "", secrets: Any = None
) -> ZarrCodecReader | ZarrPipelineReader | Any:
    """The fastest chunk reader for ``array``: direct numcodecs decoding when it applies.

    ``where``/``url`` name the array in errors; ``secrets`` are masked in them.
    """
    from zarr.storage import LocalStore

    from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader

    if getattr(array, "shards", None) is not None:
        sharded = ShardedZarrReader.for_array(array, where, url, secrets)
        return ZarrPipelineReader(array, where, url, secrets) if sharded is None else sharded
    decode = codec_chain(array)
    if decode is None:
        return ZarrPipelineReader(array, where, url, secrets)
    if isinstance(array.store, LocalStore):
        return ZarrCodecReader(array, decode, where)
    return ZarrStoreReader(array, decode, where, url, secrets)


def codec_chain(array: Any) -> Decoder | None:
    """A ``bytes -> chunk`` decoder for ``array``'s codecs, or ``None`` if mixle lacks one."""
    meta = array.metadata
    dtype = np.dtype(array.dtype)
    if dtype.kind in "OT":  # variable-length strings or bytes
        return vlen_decoder(array)
    if not plain_dtype(dtype) or getattr(array, "shards", None) is not None:
        return None
    chunks = tuple(array.chunks)
    if meta.zarr_format == 2:
        stored = meta.dtype.to_native_dtype()
        compressor = meta.compressor
        filters = list(meta.filters or ())
        return numcodecs_decoder(compressor, filters, stored, chunks, meta.order)
    return v3_decoder(meta.codecs, dtype, chunks) or outer_shard_decoder(array)


def plain_dtype(dtype: np.dtype) -> bool:
    """Whether chunks of ``dtype`` are fixed-size bytes mixle decodes (:data:`PLAIN_KINDS`)."""
    return dtype.kind in PLAIN_KINDS and not dtype.hasobject and dtype.itemsize > 0


def _local_dir(array: Any) -> str | None:
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
