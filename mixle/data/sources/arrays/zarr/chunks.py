"""zarr chunks that mixle reads and decodes itself, every decoding stage bounded.

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
- :class:`ZipChunkReader` does the same for a zarr store in a local zip file (zarr's
  ``ZipStore``): each chunk's member read by position from many threads at once and
  checked against the zip's central directory
  (:class:`~mixle.data.sources.arrays.zarr.zip_members.ZipMembers`).
- :class:`ZarrStoreReader` decodes the same layouts from any other zarr store (URLs such as
  ``s3://`` and ``http://`` through obstore or fsspec, memory, zip): all the chunks a batch
  misses are fetched in one concurrent call, each request retried on its own and checked
  (:mod:`mixle.data.sources.arrays.zarr.stores`).

:func:`~mixle.data.sources.arrays.zarr.readers.zarr_chunk_reader` picks the reader of an
array. Stored bytes that do not decode to a whole chunk, or a directory where a chunk's
object should be, raise :class:`~mixle.reading.CorruptChunkError` naming the array and the
chunk; a chunk never written reads as the fill value, as zarr reads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

import numpy as np

from mixle.data.sources.arrays.zarr.codecs import ChunkDecoder
from mixle.data.sources.arrays.zarr.local_files import (
    directory_message,
    local_chunk_dir,
    read_local_object,
)
from mixle.data.sources.arrays.zarr.outer_shards import OuterShardDecoder
from mixle.data.sources.arrays.zarr.stores import StoreGetter
from mixle.data.sources.arrays.zarr.vlen import VlenChunkDecoder, VlenLimitError
from mixle.data.sources.arrays.zarr.zip_members import ZipMembers, zip_file_of
from mixle.reading import CorruptChunkError, new_token

__all__ = [
    "Decoder",
    "ZarrCodecReader",
    "ZarrStoreReader",
    "ZipChunkReader",
    "decode_checked",
    "fill_chunk",
    "fill_value",
]

#: A ``bytes -> chunk`` decoder (every stage bounded by the chunk's size).
Decoder = ChunkDecoder | VlenChunkDecoder | OuterShardDecoder


def fill_value(array: Any) -> Any:
    """The value a chunk of ``array`` never written reads as, as zarr reads it.

    A format 2 array may have no fill value (``null``): zarr then reads its dtype's default
    (``0``, ``False``, ``''``, ``b''``, ``NaT``...), and so does this.
    """
    fill = array.fill_value
    if fill is None:
        default = getattr(array.metadata.dtype, "default_scalar", None)
        return 0 if default is None else default()
    return fill


def fill_chunk(array: Any, chunks: tuple[int, ...]) -> np.ndarray:
    """A read-only chunk of ``array``'s fill value (:func:`fill_value`), as zarr reads.

    It is clipped to the array's shape: every region a read takes from a chunk lies inside
    the array, so a chunk far larger than the array (a damaged ``chunks``) costs no more
    than the array itself.
    """
    shape = tuple(min(c, s) for c, s in zip(chunks, array.shape))
    one = np.full((), fill_value(array), dtype=np.dtype(array.dtype))
    return np.broadcast_to(one, shape)  # read-only, one element of memory


def decode_checked(
    decode: Decoder,
    raw: bytes,
    where: str,
    key: str,
    coords: tuple[int, ...] | None = None,
    inner: tuple[int, ...] | None = None,
) -> np.ndarray:
    """``decode(raw)``, any failure raised as :class:`CorruptChunkError` naming the chunk.

    A :class:`~mixle.data.sources.arrays.zarr.vlen.VlenLimitError` (a size limit) stays one.

    ``key`` is the chunk's stored key; ``coords``, if given, its chunk grid coordinates.
    ``inner``, if given, names an inner chunk (its chunk grid coordinates) of shard ``key``.
    """
    try:
        return decode(raw)
    except Exception as exc:
        at = "" if coords is None else f" (chunk grid coordinates {coords})"
        what = f"chunk {key!r}" if inner is None else f"inner chunk {inner} of shard {key!r}"
        if isinstance(exc, VlenLimitError):  # a size limit, not (necessarily) damage
            raise VlenLimitError(
                f"{what} of zarr array {where}{at} ({len(raw):,} stored bytes): {exc}"
            ) from None
        raise CorruptChunkError(
            f"{what} of zarr array {where}{at} is corrupt ({len(raw)} stored bytes do "
            f"not decode to a chunk: {type(exc).__name__}: {exc})"
        ) from None


class _DecodedChunks:
    """What the numcodecs readers share: chunk shape, cache token, decoder, fill chunk.

    ``decoded_nbytes`` is set (the bytes of one decoded chunk) when the decoder can write
    a chunk into a buffer of the read planner's (:meth:`decode_into`).
    """

    def __init__(self, array: Any, decode: Decoder, where: str = "") -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._decode = decode
        self._where = where or repr(array.store)
        self._meta = array.metadata
        self._fill = fill_chunk(array, self.chunks)
        if isinstance(decode, ChunkDecoder) and decode.writes_into:
            self.decoded_nbytes = decode.nbytes

    def decode(self, coords: tuple[int, ...], raw: bytes | None) -> np.ndarray:
        """Chunk ``coords`` from its stored bytes (``None``: never written, the fill value)."""
        if raw is None:
            return self._fill
        key = self._meta.encode_chunk_key(coords)
        return decode_checked(self._decode, raw, self._where, key, coords)

    def decode_into(
        self, coords: tuple[int, ...], raw: Any, out: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """:meth:`decode` into the buffer ``out()`` gives (``decoded_nbytes`` of ``uint8``,
        asked for once the stored bytes were checked); never a view of ``raw``."""
        if raw is None:
            return self._fill
        assert isinstance(self._decode, ChunkDecoder)
        key = self._meta.encode_chunk_key(coords)
        into = partial(self._decode.decode_into, out=out)
        return decode_checked(into, raw, self._where, key, coords)


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
        return self.decode(coords, self._read(coords, reuse=False))  # type: ignore[arg-type]

    def read_stored(self, coords: tuple[int, ...]) -> memoryview | bytes | None:
        """The stored bytes of chunk ``coords`` (``None``: never written) for :meth:`decode_into`.

        In this thread's reusable buffer when the decoder writes into buffers: valid until
        this thread's next read.
        """
        return self._read(coords, reuse=hasattr(self, "decoded_nbytes"))

    def _read(self, coords: tuple[int, ...], *, reuse: bool) -> memoryview | bytes | None:
        key = self._meta.encode_chunk_key(coords)
        path = os.path.join(self._base, *key.split("/"))
        what = f"chunk {key!r} of zarr array {self._where} (chunk grid coordinates {coords}):"
        try:
            # never written (None): the fill value, as zarr reads it
            return read_local_object(path, f"{what} file", self._decode.stored_limit, reuse=reuse)
        except CorruptChunkError:
            if os.path.isdir(path):
                raise CorruptChunkError(directory_message(key, self._where, coords, path)) from None
            limit = _stored_over_vlen_limit(self._decode, path)
            if limit is not None:  # strings longer than the vlen cap: say it is that limit
                raise VlenLimitError(f"{what} {limit}") from None
            raise


def _stored_over_vlen_limit(decode: Decoder, path: str) -> VlenLimitError | None:
    """The vlen limit error if ``path`` is larger than a vlen ``decode`` lets it be."""
    oversized = getattr(decode, "oversized", None)
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if oversized is None or size <= decode.stored_limit:
        return None
    return oversized(size)


class ZipChunkReader(_DecodedChunks):
    """Decoded chunks of an array in a local zip file (zarr's ``ZipStore``), with numcodecs.

    Parameters
    ----------
    array, decode, where
        As for :class:`ZarrCodecReader`; ``array.store`` is a ``zarr.storage.ZipStore``.
    """

    def __init__(self, array: Any, decode: Decoder, where: str = "") -> None:
        super().__init__(array, decode, where)
        store = array.store
        self._members = ZipMembers(zip_file_of(store), os.fspath(store.path))
        path = array.path.strip("/")
        self._prefix = f"{path}/" if path else ""

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        key = self._meta.encode_chunk_key(coords)
        what = f"chunk {key!r} of zarr array {self._where} (chunk grid coordinates {coords})"
        name = self._prefix + key
        size = self._members.size(name)
        oversized = getattr(self._decode, "oversized", None)
        if oversized is not None and size is not None and size > self._decode.stored_limit:
            raise VlenLimitError(f"{what}: {oversized(size)}")  # strings past the vlen cap
        return self.decode(coords, self._members.read(name, self._decode.stored_limit, what))


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
