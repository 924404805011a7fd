"""Layouts mixle now decodes itself, bounded, read exactly as zarr-python reads them.

Float retyping filters (``astype``/``delta``/``fixedscaleoffset``/``quantize`` storing a
float as a smaller float) have an exact stored size, so mixle decodes them itself (every
stage capped; bombs under them are in ``tests/test_decode_bombs.py``). Values are compared
with zarr-python's own read of the same store.
"""

from __future__ import annotations

import gzip
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from test_decode_bombs import BOMBS, GROWTH_LIMIT, _run_child, _shard
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.codecs import numcodecs as zarr_numcodecs
from zarr.core.dtype import VariableLengthBytes

import mixle
from mixle.data.sources.arrays.zarr.readers import zarr_chunk_reader
from mixle.reading import CorruptChunkError
from mixle.testing_servers import RangeHTTPServer

_NOT_IN_SPEC = "Numcodecs codecs are not in the Zarr version 3 specification"
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:{_NOT_IN_SPEC}"),
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
    # zarr warns on writing variable-length bytes to format 3 (no spec for the data type yet)
    pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification"),
]

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


# -- variable-length strings and bytes ---------------------------------------------------

VLEN_SHAPE = (128, 128)
VLEN_CHUNKS = (64, 32)  # 2,048 elements: a stored chunk may decode to about 9 MB
#: name -> create_array options
VLEN_LAYOUTS: dict[str, dict[str, Any]] = {
    "v3 vlen-utf8 zstd": {"dtype": str, "compressors": ZstdCodec()},
    "v3 vlen-utf8 gzip": {"dtype": str, "compressors": GzipCodec()},
    "v3 vlen-bytes gzip": {"dtype": VariableLengthBytes(), "compressors": GzipCodec()},
    "v3 vlen-utf8 raw": {"dtype": str, "compressors": None},
    "v3 sharded vlen-utf8 gzip": {"dtype": str, "shards": (64, 128), "compressors": GzipCodec()},
    "v3 one-chunk shards vlen-bytes zstd": {
        "dtype": VariableLengthBytes(),
        "shards": VLEN_CHUNKS,
        "compressors": ZstdCodec(),
    },
    "v3 one-chunk shards vlen-utf8 gzip": {
        "dtype": str,
        "shards": VLEN_CHUNKS,
        "compressors": GzipCodec(),
    },
    "v2 VLenUTF8 gzip": {"dtype": str, "zarr_format": 2, "compressors": numcodecs.GZip()},
    "v2 VLenUTF8 zlib": {"dtype": str, "zarr_format": 2, "compressors": numcodecs.Zlib()},
    "v2 VLenBytes zstd": {
        "dtype": VariableLengthBytes(),
        "zarr_format": 2,
        "compressors": numcodecs.Zstd(),
    },
}


def _vlen_values(layout: str) -> np.ndarray:
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 40, VLEN_SHAPE)
    words = ["é" * n + str(n) for n in lengths.ravel()]
    if "bytes" in layout.lower():
        return np.array([w.encode() for w in words], dtype=object).reshape(VLEN_SHAPE)
    return np.array(words, dtype=object).reshape(VLEN_SHAPE)


def _write_vlen(path: Path, layout: str) -> str:
    """Write ``layout`` (the last 28 rows never written); the stored key of chunk (0, 0)."""
    options = VLEN_LAYOUTS[layout]
    array = zarr.create_array(str(path), shape=VLEN_SHAPE, chunks=VLEN_CHUNKS, **options)
    array[:100] = _vlen_values(layout)[:100]
    return "0.0" if options.get("zarr_format") == 2 else "c/0/0"


@pytest.mark.parametrize("layout", list(VLEN_LAYOUTS))
def test_vlen_chunks_are_decoded_by_mixle_as_zarr_reads_them(tmp_path: Path, layout):
    path = tmp_path / "a.zarr"
    _write_vlen(path, layout)
    opened = zarr.open_array(str(path), mode="r")
    expected = np.asarray(opened[...])
    sharded = "shard" in layout
    want = "ShardedZarrReader" if sharded else "ZarrCodecReader"
    assert type(zarr_chunk_reader(opened)).__name__ == want
    src = mixle.read_zarr(str(path))
    got = src[...]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(src[60:70, 3:90], expected[60:70, 3:90])
    # the same chunks from a memory store (the concurrent, checked store reader)
    memory = zarr.storage.MemoryStore()
    copy = zarr.create_array(memory, shape=VLEN_SHAPE, chunks=VLEN_CHUNKS, **VLEN_LAYOUTS[layout])
    copy[...] = expected
    want = "ShardedZarrReader" if sharded else "ZarrStoreReader"
    assert type(zarr_chunk_reader(copy)).__name__ == want
    np.testing.assert_array_equal(mixle.read_zarr(copy)[...], np.asarray(copy[...]))


#: name -> (layout, the stored bytes of chunk (0, 0))
VLEN_BOMBS: dict[str, tuple[str, Callable[[], bytes]]] = {
    "v3 vlen-utf8 gzip bomb": ("v3 vlen-utf8 gzip", BOMBS["gzip"]),
    "v3 vlen-utf8 zstd bomb": ("v3 vlen-utf8 zstd", BOMBS["zstd"]),
    "v2 VLenUTF8 zlib bomb": ("v2 VLenUTF8 zlib", BOMBS["zlib"]),
    "v2 VLenBytes zstd bomb": ("v2 VLenBytes zstd", BOMBS["zstd"]),
    "v3 vlen-bytes zstd bomb in a shard": (
        "v3 one-chunk shards vlen-bytes zstd",
        lambda: _shard(BOMBS["zstd"]()),
    ),
    "v3 vlen-utf8 gzip bomb in a shard": (
        "v3 one-chunk shards vlen-utf8 gzip",
        lambda: _shard(BOMBS["gzip"]()),
    ),
    # an item count of 2**31 - 1 (numcodecs would allocate 16 GiB of object pointers)
    "v3 vlen-utf8 raw huge count": ("v3 vlen-utf8 raw", lambda: b"\xff\xff\xff\x7f" + bytes(8)),
    "v3 vlen-utf8 gzip huge count": (
        "v3 vlen-utf8 gzip",
        lambda: gzip.compress(b"\xff\xff\xff\x7f" + bytes(8), mtime=0),
    ),
}


@pytest.fixture(scope="module")
def vlen_bomb_reads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vlen-bombs")
    cases, facts = [], {}
    for k, (name, (layout, blob)) in enumerate(VLEN_BOMBS.items()):
        path = root / f"{k}.zarr"
        key = _write_vlen(path, layout)
        path.joinpath(*key.split("/")).write_bytes(blob())
        cases.append((name, str(path), True))
        facts[name] = (str(path), key)
    return {name: (result, *facts[name]) for name, result in _run_child(cases).items()}


@pytest.mark.parametrize("name", list(VLEN_BOMBS))
def test_a_vlen_bomb_chunk_raises_with_bounded_memory(vlen_bomb_reads, name):
    got, path, key = vlen_bomb_reads[name]
    # a bomb past the vlen cap is refused as that limit (a CorruptChunkError subclass)
    limit = "bomb" in name
    assert got["error"] == ("VlenLimitError" if limit else "CorruptChunkError"), got
    assert limit == ("set_vlen_limit(bytes_per_element)" in got["message"]), got["message"]
    assert path in got["message"] and key in got["message"], got["message"]
    # the child's address space is capped: an attempt at a huge allocation is a MemoryError
    assert "MemoryError" not in got["message"], got["message"]
    assert got["growth"] < GROWTH_LIMIT, f"{name}: peak RSS grew {got['growth'] / 2**20:.0f} MiB"


# -- zarr's own pipeline: stored objects capped, decoded regions checked -------------------

PIPE_SHAPE = (64, 64)
PIPE_CHUNKS = (32, 32)  # 4 KiB of float32 per chunk: a stored object may have ~96 KiB
#: Layouts mixle leaves to zarr's pipeline: name -> create_array options
PIPELINE_LAYOUTS: dict[str, dict[str, Any]] = {
    "shard behind a transpose": {
        "filters": [TransposeCodec(order=(1, 0))],
        "serializer": ShardingCodec(chunk_shape=(16, 16)),
        "compressors": None,
    },
    "big-endian shard index": {
        "serializer": ShardingCodec(
            chunk_shape=(16, 16), index_codecs=[BytesCodec(endian="big"), Crc32cCodec()]
        ),
        "compressors": None,
    },
}


def _write_pipeline(path: Path, layout: str) -> str:
    """Write ``layout`` in full; the stored key of object (0, 0)."""
    array = zarr.create_array(
        str(path), shape=PIPE_SHAPE, chunks=PIPE_CHUNKS, dtype="float32", **PIPELINE_LAYOUTS[layout]
    )
    array[...] = np.arange(np.prod(PIPE_SHAPE), dtype="float32").reshape(PIPE_SHAPE)
    return "c/0/0"


@pytest.mark.parametrize("layout", list(PIPELINE_LAYOUTS))
def test_pipeline_layouts_still_read_as_zarr_reads_them(tmp_path: Path, layout):
    path = tmp_path / "a.zarr"
    _write_pipeline(path, layout)
    opened = zarr.open_array(str(path), mode="r")
    assert type(zarr_chunk_reader(opened)).__name__ == "ZarrPipelineReader"
    np.testing.assert_array_equal(mixle.read_zarr(str(path))[...], np.asarray(opened[...]))


@pytest.fixture(scope="module")
def oversized_reads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each pipeline layout with object (0, 0) a sparse 1 TiB file, read by one child."""
    root = tmp_path_factory.mktemp("oversized")
    cases, facts = [], {}
    for k, layout in enumerate(PIPELINE_LAYOUTS):
        path = root / f"{k}.zarr"
        key = _write_pipeline(path, layout)
        os.truncate(path.joinpath(*key.split("/")), 2**40)
        cases.append((layout, str(path), True))
        facts[layout] = (str(path), key)
    return {name: (result, *facts[name]) for name, result in _run_child(cases).items()}


@pytest.mark.parametrize("layout", list(PIPELINE_LAYOUTS))
def test_an_oversized_local_object_is_refused_unread_on_the_pipeline_path(oversized_reads, layout):
    got, path, key = oversized_reads[layout]
    assert got["error"] == "CorruptChunkError", got
    assert path in got["message"] and repr(key) in got["message"], got["message"]
    assert "refused unread" in got["message"] and "MemoryError" not in got["message"], got
    assert got["growth"] < GROWTH_LIMIT, f"{layout}: peak RSS grew {got['growth'] / 2**20:.0f} MiB"


def test_an_oversized_download_is_refused_on_the_pipeline_path(tmp_path: Path):
    path = tmp_path / "a.zarr"
    key = _write_pipeline(path, "shard behind a transpose")  # read by zarr as whole objects
    expected = np.asarray(zarr.open_array(str(path), mode="r")[32:, 32:])
    # 1 MiB: far more than a stored object of 4 KiB chunks can have (about 96 KiB)
    path.joinpath(*key.split("/")).write_bytes(os.urandom(2**20))
    with RangeHTTPServer(tmp_path) as server:
        # the fsspec path's message (obstore's says "refused without reading it":
        # tests/test_zarr_obstore_faults.py)
        src = mixle.read_zarr(f"{server.url}/a.zarr", backend="fsspec")
        np.testing.assert_array_equal(src[32:, 32:], expected)
        with pytest.raises(CorruptChunkError) as err:
            src[0, 0]
    message = str(err.value)
    assert f"a.zarr/{key}" in message and "refused without reading the rest" in message, message


# -- shards compressed as a whole (sharding_indexed, then bytes-to-bytes codecs) -----------

#: name -> create_array options (``chunks`` is the shard)
OUTER_SHARDS: dict[str, dict[str, Any]] = {
    "shard then gzip": {
        "serializer": ShardingCodec(chunk_shape=(16, 16)),
        "compressors": GzipCodec(),
    },
    "shard of zstd chunks then zstd and crc32c, index first": {
        "serializer": ShardingCodec(
            chunk_shape=(16, 8), codecs=[BytesCodec(), ZstdCodec()], index_location="start"
        ),
        "compressors": [ZstdCodec(), Crc32cCodec()],
    },
    "shard of transposed big-endian chunks, index without crc32c, then gzip": {
        "serializer": ShardingCodec(
            chunk_shape=(16, 16),
            codecs=[TransposeCodec(order=(1, 0)), BytesCodec(endian="big")],
            index_codecs=[BytesCodec()],
        ),
        "compressors": GzipCodec(),
    },
}


@pytest.mark.parametrize("layout", list(OUTER_SHARDS))
def test_shards_compressed_whole_are_decoded_by_mixle_as_zarr_reads_them(tmp_path: Path, layout):
    path = tmp_path / "a.zarr"
    array = zarr.create_array(
        str(path),
        shape=PIPE_SHAPE,
        chunks=PIPE_CHUNKS,
        dtype="float32",
        fill_value=2.5,
        **OUTER_SHARDS[layout],
    )
    values = np.random.default_rng(3).standard_normal(PIPE_SHAPE).astype("float32")
    array[:40] = values[:40]  # rows 40.. hold inner chunks never written, and a whole shard
    array[50:, 40:48] = values[50:, 40:48]
    opened = zarr.open_array(str(path), mode="r")
    expected = np.asarray(opened[...])
    assert type(zarr_chunk_reader(opened)).__name__ == "ZarrCodecReader"
    src = mixle.read_zarr(str(path))
    np.testing.assert_array_equal(src[...], expected)
    np.testing.assert_array_equal(src[7:51, 13:45], expected[7:51, 13:45])
    memory = zarr.storage.MemoryStore()
    copy = zarr.create_array(
        memory, shape=PIPE_SHAPE, chunks=PIPE_CHUNKS, dtype="float32", **OUTER_SHARDS[layout]
    )
    copy[...] = expected
    assert type(zarr_chunk_reader(copy)).__name__ == "ZarrStoreReader"
    np.testing.assert_array_equal(mixle.read_zarr(copy)[...], np.asarray(copy[...]))


def test_a_damaged_index_in_a_shard_compressed_whole_raises_naming_the_chunk(tmp_path: Path):
    path = tmp_path / "a.zarr"
    array = zarr.create_array(
        str(path),
        shape=PIPE_SHAPE,
        chunks=PIPE_CHUNKS,
        dtype="float32",
        serializer=ShardingCodec(chunk_shape=(16, 16), index_codecs=[BytesCodec()]),
        compressors=GzipCodec(),
    )
    array[...] = 1
    shard = path / "c" / "0" / "0"
    inner = gzip.decompress(shard.read_bytes())
    index = np.frombuffer(inner[-64:], dtype="<u8").copy()
    index[1] = 2**40  # inner chunk (0, 0): a terabyte long
    shard.write_bytes(gzip.compress(inner[:-64] + index.tobytes(), mtime=0))
    with pytest.raises(CorruptChunkError, match=r"chunk 'c/0/0' of zarr array .*a\.zarr"):
        mixle.read_zarr(str(path))[0, 0]


def test_a_pipeline_region_of_the_wrong_shape_or_dtype_is_corrupt_never_reshaped():
    from mixle.data.sources.arrays.zarr.limits import check_region

    good = np.zeros((2, 3), dtype=">i4")
    assert check_region(good, (2, 3), np.dtype("<i4"), "c/0/0", "'a.zarr'") is good
    with pytest.raises(CorruptChunkError, match=r"chunk 'c/0/0' of zarr array 'a\.zarr'.*\(3, 2\)"):
        check_region(np.zeros((3, 2), dtype="i4"), (2, 3), np.dtype("i4"), "c/0/0", "'a.zarr'")
    with pytest.raises(CorruptChunkError, match="float64"):
        check_region(np.zeros((2, 3)), (2, 3), np.dtype("i4"), "c/0/0", "'a.zarr'")


@pytest.mark.parametrize("cname", ["lz4", "zstd", "blosclz"])
def test_a_truncated_blosc_chunk_raises_corrupt_chunk(tmp_path: Path, cname: str) -> None:
    # blosc reads as many bytes as its header says it stored: half a chunk read on into
    # whatever followed it and came back as wrong values, with no error
    data = np.random.default_rng(0).integers(0, 2**16, size=(64, 64), dtype=np.uint16)
    path = tmp_path / "b.zarr"
    arr = zarr.create_array(
        path,
        shape=data.shape,
        chunks=(64, 64),
        dtype=data.dtype,
        zarr_format=2,
        compressors=numcodecs.Blosc(cname=cname, shuffle=1),
    )
    arr[...] = data
    chunk = path / "0.0"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    with pytest.raises(CorruptChunkError, match="truncated"):
        mixle.read_zarr(path)[...]
