"""Decompression bombs and special files in zarr stores: refused, with bounded memory.

A chunk replaced by a small compressed blob of zeros that inflates to hundreds of MiB (or a
stored object larger than a chunk can be) must raise
:class:`~mixle.reading.CorruptChunkError` naming the array and the chunk, and the reading
process's peak RSS (``VmHWM``, measured in a fresh child) must barely move. A chunk that
is a FIFO, a link to ``/dev/zero`` or a socket must raise :class:`~mixle.SpecialFileError`
at once; children run under ``communicate(timeout=)``, so a regression fails, never hangs.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import socket
import subprocess
import sys
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs.numcodecs as zarr_numcodecs
from _special_files import SPECIAL_KINDS, make_special
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

import mixle
from mixle.data.sources.arrays.zarr.decompress import bounded_decompress

_NOT_IN_SPEC = "Numcodecs codecs are not in the Zarr version 3 specification"
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:{_NOT_IN_SPEC}"),
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

SHAPE = (1024, 512)
CHUNKS = (512, 256)  # one chunk: 512 KiB of int32, so a stored chunk may have 640 KiB
#: The most the reading process's peak RSS may grow while refusing one bomb (a few chunks,
#: and the allocator's slack); every bomb inflates to at least 128 MiB.
GROWTH_LIMIT = 48 * 2**20
#: Seconds a child may take (a hang fails the test instead of blocking CI).
CHILD_TIMEOUT = 60
_BLOCK = 64 * 2**20

#: The child reads each ``(name, url, warm)`` case of ``argv[1]`` (JSON) in turn: open,
#: warm up on a good chunk, then read chunk (0, 0); it reports each case's error and the
#: growth of its peak RSS. The peak is reset before each read (``/proc/self/clear_refs``);
#: where that is not allowed the growth is counted from the child's start (an upper bound).
#: Its address space is capped so that a regression fails with MemoryError rather than
#: exhausting the machine.
_CHILD = """
import json, resource, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
warnings.simplefilter("ignore")
import mixle

def hwm():
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

def reset():
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False

results, start = {}, hwm()
for name, url, warm in json.loads(sys.argv[1]):
    base = start
    try:
        src = mixle.read_zarr(url)
        if warm:
            src[-1:, -1:]  # a good chunk through the same codecs: imports, pools
        base = hwm() if reset() else start
        src[0:1, 0:1]
        error, message = None, ""
    except BaseException as exc:
        error, message = type(exc).__name__, str(exc)
    results[name] = {"error": error, "message": message, "growth": hwm() - base}
print(json.dumps(results))
"""


def _numcodecs_v3(codec: type, **config: Any) -> Any:
    """A numcodecs codec for format 3 (zarr warns that it is not in the v3 spec)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NOT_IN_SPEC)
        return codec(**config)


def _zlib_bomb(blocks: int) -> bytes:
    """One zlib stream of ``blocks`` x 64 MiB of zeros, built from one compressed block.

    After a full flush the compressor restarts byte-aligned with an empty window, so the
    compressed block repeats; an empty final block and the Adler-32 of the zeros
    (``A = 1``, ``B = length``) end the stream.
    """
    compress = zlib.compressobj(9)
    first = compress.compress(bytes(_BLOCK)) + compress.flush(zlib.Z_FULL_FLUSH)
    adler = ((blocks * _BLOCK % 65521) << 16) | 1
    return first[:2] + first[2:] * blocks + b"\x03\x00" + adler.to_bytes(4, "big")


def _zeros(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


#: codec -> a blob of zeros, stored in less than a chunk may take, inflating to 128-640 MiB
#: (concatenated streams where the codec decodes them, so that it builds quickly).
BOMBS: dict[str, Callable[[], bytes]] = {
    "gzip": lambda: gzip.compress(bytes(_BLOCK), 9, mtime=0) * 5,
    "zlib": lambda: _zlib_bomb(5),
    "bz2": lambda: bz2.compress(bytes(8 * 2**20), 1) * 80,
    "lzma": lambda: lzma.compress(bytes(_BLOCK), preset=0) * 10,
    "zstd": lambda: bytes(numcodecs.Zstd(level=1).encode(bytes(_BLOCK))) * 10,
    "blosc": lambda: bytes(numcodecs.Blosc("zstd", 1, 0).encode(_zeros(5 * _BLOCK))),
    "lz4": lambda: bytes(numcodecs.LZ4().encode(_zeros(2 * _BLOCK))),
    # 4.5 MB of gzip members (4.6 GB of zeros): refused by its stored size, unread
    "gzip, 4.5 MB stored": lambda: gzip.compress(bytes(_BLOCK), 9, mtime=0) * 70,
}

V2, V3 = {"zarr_format": 2}, {"zarr_format": 3}
DELTA = numcodecs.Delta(dtype="int32")
#: name -> (create_array options, the bomb's codec); "file://" layouts are opened by URL
LAYOUTS: dict[str, tuple[dict[str, Any], str]] = {
    "v2 gzip": ({**V2, "compressors": numcodecs.GZip()}, "gzip"),
    "v2 zlib": ({**V2, "compressors": numcodecs.Zlib()}, "zlib"),
    "v2 bz2": ({**V2, "compressors": numcodecs.BZ2()}, "bz2"),
    "v2 lzma": ({**V2, "compressors": numcodecs.LZMA()}, "lzma"),
    "v2 lz4": ({**V2, "compressors": numcodecs.LZ4()}, "lz4"),
    "v2 zstd behind delta": ({**V2, "filters": [DELTA], "compressors": numcodecs.Zstd()}, "zstd"),
    "v2 blosc behind shuffle": (
        {**V2, "filters": [numcodecs.Shuffle(elementsize=4)], "compressors": numcodecs.Blosc()},
        "blosc",
    ),
    "v2 blosc behind delta": (
        {**V2, "filters": [DELTA], "compressors": numcodecs.Blosc()},
        "blosc",
    ),
    "v2 zlib as a filter": ({**V2, "filters": [numcodecs.Zlib()], "compressors": None}, "zlib"),
    "v3 gzip": ({**V3, "compressors": GzipCodec()}, "gzip"),
    "v3 bz2": ({**V3, "compressors": _numcodecs_v3(zarr_numcodecs.BZ2)}, "bz2"),
    "v3 lzma": ({**V3, "compressors": _numcodecs_v3(zarr_numcodecs.LZMA)}, "lzma"),
    "v3 zlib": ({**V3, "compressors": _numcodecs_v3(zarr_numcodecs.Zlib)}, "zlib"),
    "v3 lz4": ({**V3, "compressors": _numcodecs_v3(zarr_numcodecs.LZ4)}, "lz4"),
    "v3 zstd behind delta": (
        {
            **V3,
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32")],
            "compressors": ZstdCodec(),
        },
        "zstd",
    ),
    "v3 blosc behind shuffle": (
        {
            **V3,
            "compressors": [_numcodecs_v3(zarr_numcodecs.Shuffle, elementsize=4), BloscCodec()],
        },
        "blosc",
    ),
    "v3 gzip behind transpose": (
        {**V3, "filters": [TransposeCodec(order=(1, 0))], "compressors": GzipCodec()},
        "gzip",
    ),
    "v3 sharded gzip": ({**V3, "shards": CHUNKS, "compressors": GzipCodec()}, "gzip"),
    # layouts zarr decoded itself before (fixed-width bytes, UTF-32, a dtype-changing filter)
    "v2 gzip S4": ({**V2, "dtype": "S4", "compressors": numcodecs.GZip()}, "gzip"),
    "v2 gzip U1": ({**V2, "dtype": "<U1", "compressors": numcodecs.GZip()}, "gzip"),
    "v3 zstd behind delta to int16": (
        {
            **V3,
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32", astype="int16")],
            "compressors": ZstdCodec(),
        },
        "zstd",
    ),
    "v3 sharded gzip behind delta to int16": (
        {
            **V3,
            "shards": CHUNKS,
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32", astype="int16")],
            "compressors": GzipCodec(),
        },
        "gzip",
    ),
    "v3 zstd behind delta float32 to float16": (
        {
            **V3,
            "dtype": "float32",
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="float32", astype="float16")],
            "compressors": ZstdCodec(),
        },
        "zstd",
    ),
    "v3 sharded gzip behind astype float64 to float32": (
        {
            **V3,
            "dtype": "float64",
            "shards": CHUNKS,
            "filters": [
                _numcodecs_v3(zarr_numcodecs.AsType, decode_dtype="float64", encode_dtype="float32")
            ],
            "compressors": GzipCodec(),
        },
        "gzip",
    ),
    "v3 shard compressed whole by gzip": (
        {**V3, "serializer": ShardingCodec(chunk_shape=(256, 128)), "compressors": GzipCodec()},
        "gzip",
    ),
    "v3 shard compressed whole by zstd": (
        {**V3, "serializer": ShardingCodec(chunk_shape=(256, 128)), "compressors": ZstdCodec()},
        "zstd",
    ),
    "v2 gzip, 4.5 MB stored": ({**V2, "compressors": numcodecs.GZip()}, "gzip, 4.5 MB stored"),
    "file:// v2 bz2": ({**V2, "compressors": numcodecs.BZ2()}, "bz2"),
    "file:// v3 gzip": ({**V3, "compressors": GzipCodec()}, "gzip"),
}


def _write(path: Path, layout: str) -> str:
    """Write a small array in ``layout``; the stored key of chunk (0, 0)."""
    options = dict(LAYOUTS[layout][0])
    dtype = options.pop("dtype", "int32")
    array = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, dtype=dtype, **options)
    values = np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE)
    if dtype != "int32" or "to int16" in layout:
        values = values % 10
    array[...] = values.astype(dtype)
    return "0.0" if options["zarr_format"] == 2 else "c/0/0"


def _url(path: Path, layout: str) -> str:
    return f"file://{path}" if layout.startswith("file://") else str(path)


def _shard(inner: bytes) -> bytes:
    """A one-chunk shard holding ``inner``, its index (and crc32c) at the end."""
    index = np.array([0, len(inner)], dtype="<u8").tobytes()
    return inner + index + google_crc32c.value(index).to_bytes(4, "little")


def _run_child(cases: list[tuple[str, str, bool]]) -> dict[str, dict[str, Any]]:
    """Run :data:`_CHILD` on ``cases``; a child still running after the timeout fails."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(cases)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bomb_reads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every layout with chunk (0, 0) a bomb, all read by one child: name -> result."""
    root = tmp_path_factory.mktemp("bombs")
    blobs = {codec: BOMBS[codec]() for codec in {c for _, c in LAYOUTS.values()}}
    cases, facts = [], {}
    for k, (layout, (options, codec)) in enumerate(LAYOUTS.items()):
        path = root / f"{k}.zarr"
        key = _write(path, layout)
        blob = blobs[codec]
        path.joinpath(*key.split("/")).write_bytes(_shard(blob) if "shards" in options else blob)
        cases.append((layout, _url(path, layout), True))
        facts[layout] = (str(path), key, len(blob))
    return {name: (result, *facts[name]) for name, result in _run_child(cases).items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_bomb_chunk_raises_with_bounded_memory(bomb_reads, layout):
    got, path, key, stored = bomb_reads[layout]
    assert got["error"] == "CorruptChunkError", got
    assert path in got["message"] and key in got["message"], got["message"]
    assert got["growth"] < GROWTH_LIMIT, (
        f"{layout}: peak RSS grew {got['growth'] / 2**20:.0f} MiB refusing a chunk of "
        f"{stored:,} stored bytes"
    )


def test_good_chunks_still_read_as_zarr_reads_them(tmp_path):
    for layout in LAYOUTS:
        path = tmp_path / f"{len(os.listdir(tmp_path))}.zarr"
        _write(path, layout)
        expected = np.asarray(zarr.open_array(str(path), mode="r")[...])
        np.testing.assert_array_equal(
            mixle.read_zarr(_url(path, layout))[...], expected, err_msg=layout
        )


# -- special files ---------------------------------------------------------------------

#: Layouts whose chunk reads go through different code: mixle's local chunk reads, its
#: local shard reads, a ``file://`` store, and zarr's own pipeline (``delta`` to ``int16``).
SPECIAL_LAYOUTS = ["v2 zlib", "v3 sharded gzip", "file:// v2 bz2", "v3 zarr decodes"]
METADATA_FILES = {".zarray": "v2 zlib", "zarr.json": "v3 gzip"}


def _write_special_layout(path: Path, layout: str) -> str:
    if layout != "v3 zarr decodes":
        return _write(path, layout)
    delta = _numcodecs_v3(zarr_numcodecs.Delta, dtype="int32", astype="int16")
    array = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, dtype="int32", filters=[delta])
    array[...] = 1
    return "c/0/0"


@pytest.fixture(scope="module")
def special_reads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Chunks and metadata files that are special files, all read by one child."""
    root = tmp_path_factory.mktemp("special")
    held: list[socket.socket] = []
    cases, keys = [], {}
    try:
        for layout in SPECIAL_LAYOUTS:
            for kind in SPECIAL_KINDS:
                path = root / f"{len(cases)}.zarr"
                key = _write_special_layout(path, layout)
                make_special(path.joinpath(*key.split("/")), kind, held)
                cases.append((f"{layout} {kind}", _url(path, layout), False))
                keys[f"{layout} {kind}"] = key
        for name, layout in METADATA_FILES.items():
            for kind in SPECIAL_KINDS[:2]:
                path = root / f"{len(cases)}.zarr"
                _write(path, layout)
                make_special(path / name, kind, held)
                cases.append((f"{name} {kind}", str(path), False))
                keys[f"{name} {kind}"] = name
        results = _run_child(cases)
    finally:
        for sock in held:
            sock.close()
    return {name: (result, keys[name]) for name, result in results.items()}


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("layout", SPECIAL_LAYOUTS)
def test_a_special_chunk_file_is_refused_at_once(special_reads, layout, kind):
    got, key = special_reads[f"{layout} {kind}"]
    assert got["error"] == "SpecialFileError", got
    assert key in got["message"] and "not a regular file" in got["message"], got["message"]


@pytest.mark.parametrize("kind", SPECIAL_KINDS[:2])
@pytest.mark.parametrize("name", list(METADATA_FILES))
def test_a_special_metadata_file_is_refused_at_open(special_reads, name, kind):
    got, _ = special_reads[f"{name} {kind}"]
    assert got["error"] == "SpecialFileError", got
    assert name in got["message"] and "not a regular file" in got["message"], got["message"]


# -- the bounded decompressors against numcodecs -----------------------------------------

COMPRESSORS = {
    "zlib": numcodecs.Zlib(1),
    "gzip": numcodecs.GZip(1),
    "bz2": numcodecs.BZ2(1),
    "lzma": numcodecs.LZMA(preset=0),
    "zstd": numcodecs.Zstd(1),
    "blosc": numcodecs.Blosc("lz4", 1, 1),
    "lz4": numcodecs.LZ4(),
}


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(COMPRESSORS)),
    st.binary(min_size=1, max_size=4096),
    st.integers(1, 3),
    st.integers(0, 64),
)
def test_bounded_decompress_equals_numcodecs_within_its_limit(codec_id, data, repeat, spare):
    codec, data = COMPRESSORS[codec_id], data * repeat
    stored = bytes(codec.encode(data))
    assert bytes(bounded_decompress(codec, stored, len(data), exact=True)) == data
    assert bytes(bounded_decompress(codec, stored, len(data) + spare)) == data
    assert bytes(codec.decode(stored)) == data
    with pytest.raises(ValueError, match=r"more than|header says"):
        bounded_decompress(codec, stored, len(data) - 1)
