"""Layouts mixle now decodes itself, bounded, read exactly as zarr-python reads them.

Float retyping filters (``astype``/``delta``/``fixedscaleoffset``/``quantize`` storing a
float as a smaller float) have an exact stored size, so mixle decodes them itself (every
stage capped; bombs under them are in ``tests/test_decode_bombs.py``). Values are compared
with zarr-python's own read of the same store.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import GzipCodec, ZstdCodec
from zarr.codecs import numcodecs as zarr_numcodecs

import mixle
from mixle.data.sources.zarr_chunks import zarr_chunk_reader
from mixle.reading import CorruptChunkError

_NOT_IN_SPEC = "Numcodecs codecs are not in the Zarr version 3 specification"
pytestmark = pytest.mark.filterwarnings(f"ignore:{_NOT_IN_SPEC}")

SHAPE = (20, 30)
CHUNKS = (7, 11)


def _v3(codec: type, **config: Any) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NOT_IN_SPEC)
        return codec(**config)


#: name -> (dtype, filter, shards or None)
FLOAT_RETYPES: dict[str, tuple[str, Any, tuple[int, int] | None]] = {
    "delta float32 as float16": (
        "float32",
        _v3(zarr_numcodecs.Delta, dtype="float32", astype="float16"),
        None,
    ),
    "astype float64 as float32": (
        "float64",
        _v3(zarr_numcodecs.AsType, decode_dtype="float64", encode_dtype="float32"),
        None,
    ),
    "fixedscaleoffset float32 as float16": (
        "float32",
        _v3(zarr_numcodecs.FixedScaleOffset, offset=1, scale=100, dtype="float32", astype="f2"),
        None,
    ),
    "astype float32 as float16": (
        "float32",
        _v3(zarr_numcodecs.AsType, decode_dtype="float32", encode_dtype="float16"),
        None,
    ),
    "sharded delta float32 as float16": (
        "float32",
        _v3(zarr_numcodecs.Delta, dtype="float32", astype="float16"),
        (14, 22),
    ),
}


@pytest.mark.parametrize("name", list(FLOAT_RETYPES))
def test_float_retyping_filters_are_decoded_by_mixle_as_zarr_reads_them(tmp_path: Path, name):
    dtype, codec, shards = FLOAT_RETYPES[name]
    path = str(tmp_path / "a.zarr")
    array = zarr.create_array(
        path,
        shape=SHAPE,
        chunks=CHUNKS,
        shards=shards,
        dtype=dtype,
        filters=[codec],
        compressors=GzipCodec() if shards else ZstdCodec(),
        fill_value=3.5,
    )
    array[:14] = np.random.default_rng(1).standard_normal((14, SHAPE[1])).astype(dtype)
    opened = zarr.open_array(path, mode="r")
    expected = np.asarray(opened[...])
    want = "ShardedZarrReader" if shards else "ZarrCodecReader"
    assert type(zarr_chunk_reader(opened)).__name__ == want
    got = mixle.read_zarr(path)[...]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_a_corrupt_inner_chunk_is_named_as_an_inner_chunk_of_its_shard(tmp_path: Path):
    path = tmp_path / "a.zarr"
    array = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, shards=(14, 22), dtype="int32")
    array[...] = 1
    shard = path / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[:16] = b"not a zstd frame"  # the index (at the end) stays intact
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError) as err:
        mixle.read_zarr(str(path))[0, 0]
    message = str(err.value)
    assert f"inner chunk (0, 0) of shard 'c/0/0' of zarr array '{path}'" in message, message
