"""Whole-chunk readers for zarr arrays, plugged into the read planner.

Two ways to get a decoded chunk:

- :class:`ZarrCodecReader` reads the stored bytes itself (a file read for local stores,
  ``store.get`` otherwise) and decodes them with numcodecs directly into a new array. It
  covers the common layouts: format 2 with any numcodecs compressor and filters, format 3
  with the ``bytes`` codec followed by zstd, gzip or blosc. Decoders release the GIL.
- :class:`ZarrPipelineReader` asks zarr for the chunk's region (``array[chunk]``), through
  zarr's own codec pipeline. It handles every layout zarr does (sharding, transposes,
  variable-length strings, codecs mixle does not know).

:func:`zarr_chunk_reader` picks the first when it applies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from mixle.reading import new_token
from mixle.utils.optional_deps import require

__all__ = ["ZarrCodecReader", "ZarrPipelineReader", "zarr_chunk_reader"]

#: dtype kinds whose chunks are plain fixed-size bytes (bool, ints, floats, complex, times).
_PLAIN_KINDS = "biufcmM"


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


class ZarrCodecReader:
    """Decoded chunks from stored bytes, decoded with numcodecs (no zarr in the hot path).

    Parameters
    ----------
    array
        An open ``zarr.Array`` whose layout :func:`codec_chain` understands.
    decode
        Turns stored bytes into a decoded chunk array of shape ``array.chunks``.
    """

    def __init__(self, array: Any, decode: Callable[[bytes], np.ndarray]) -> None:
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.token = new_token()
        self._array = array
        self._decode = decode
        self._meta = array.metadata
        self._fetch = _local_fetch(array) or _store_fetch(array)
        fill = array.fill_value
        dtype = np.dtype(array.dtype)
        self._fill = np.full(self.chunks, 0 if fill is None else fill, dtype=dtype)
        self._fill.flags.writeable = False

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        raw = self._fetch(self._meta.encode_chunk_key(coords))
        if raw is None:  # never written: the fill value, as zarr reads it
            return self._fill
        return self._decode(raw)


def zarr_chunk_reader(array: Any) -> ZarrCodecReader | ZarrPipelineReader:
    """The fastest chunk reader for ``array``: direct numcodecs decoding when it applies."""
    decode = codec_chain(array)
    if decode is None:
        return ZarrPipelineReader(array)
    return ZarrCodecReader(array, decode)


def codec_chain(array: Any) -> Callable[[bytes], np.ndarray] | None:
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
    return _v3_decoder(meta.codecs, dtype, chunks)


def _v3_decoder(
    codecs: tuple[Any, ...], dtype: np.dtype, chunks: tuple[int, ...]
) -> Callable[[bytes], np.ndarray] | None:
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec

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
) -> Callable[[bytes], np.ndarray]:
    """Decode ``compressor`` then ``filters`` (last first), as zarr format 2 does."""
    count = int(np.prod(chunks, dtype=np.int64))

    def decode(raw: bytes) -> np.ndarray:
        if compressor is not None and not filters:
            flat = np.empty(count, dtype=stored)
            compressor.decode(raw, out=flat)
        else:
            buf: Any = raw if compressor is None else compressor.decode(raw)
            for f in reversed(filters):
                buf = f.decode(buf)
            flat = np.frombuffer(buf, dtype=stored, count=count)
        return flat.reshape(chunks, order=order)

    return decode


def _local_fetch(array: Any) -> Callable[[str], bytes | None] | None:
    """Plain file reads for arrays in a local directory store, else ``None``."""
    from zarr.storage import LocalStore

    store = array.store
    if not isinstance(store, LocalStore):
        return None
    base = os.path.join(os.fspath(store.root), *filter(None, array.path.split("/")))

    def fetch(key: str) -> bytes | None:
        try:
            with open(os.path.join(base, *key.split("/")), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    return fetch


def _store_fetch(array: Any) -> Callable[[str], bytes | None]:
    """Reads through the zarr store's own ``get`` (memory, fsspec, zip...)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = array.store
    prefix = f"{array.path.strip('/')}/" if array.path.strip("/") else ""
    prototype = default_buffer_prototype()

    def fetch(key: str) -> bytes | None:
        buf = sync(store.get(prefix + key, prototype=prototype))
        return None if buf is None else buf.to_bytes()

    return fetch
