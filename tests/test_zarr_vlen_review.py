"""Variable-length strings and bytes in zarr: read as zarr-python reads them, bounded.

F-order and transposed chunks come back in their order, a format 2 array with no fill
value reads its dtype's default where nothing was written, shards compressed as a whole are
decoded by mixle with a cap (a bomb there costs a few MiB, not its inflated size), and a
chunk over the vlen cap raises :class:`~mixle.data.sources.arrays.zarr.VlenLimitError`
saying it is a limit and naming :func:`~mixle.data.sources.arrays.zarr.set_vlen_limit`.
Values are compared with zarr-python's own read of the same store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from test_decode_bombs import BOMBS, CHILD_TIMEOUT, GROWTH_LIMIT, _run_child
from zarr.codecs import (
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    VLenBytesCodec,
    VLenUTF8Codec,
    ZstdCodec,
)
from zarr.core.dtype import VariableLengthBytes

import mixle
from mixle.data.sources.arrays.zarr import VlenLimitError, set_vlen_limit, vlen_limit
from mixle.data.sources.arrays.zarr.readers import zarr_chunk_reader
from mixle.reading import CorruptChunkError

pytestmark = [
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
    pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification"),
]


def _words(shape: tuple[int, ...], as_bytes: bool = False, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = [f"{'é' * int(n)}{k}" for k, n in enumerate(rng.integers(0, 30, int(np.prod(shape))))]
    values = [w.encode() for w in words] if as_bytes else words
    return np.array(values, dtype=object).reshape(shape)


def _read_both(path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(mixle's read, zarr's read, mixle's reader class) of the array at ``path``."""
    opened = zarr.open_array(str(path), mode="r")
    expected = np.asarray(opened[...])
    got = np.asarray(mixle.read_zarr(str(path))[...])
    assert got.dtype == expected.dtype
    return got, expected, type(zarr_chunk_reader(opened)).__name__


# -- order --------------------------------------------------------------------------------


@pytest.mark.parametrize("as_bytes", [False, True], ids=["VLenUTF8", "VLenBytes"])
@pytest.mark.parametrize(("shape", "chunks"), [((4, 6), (4, 6)), ((5, 6, 7), (2, 4, 3))])
def test_v2_f_order_vlen_chunks_read_as_zarr_reads_them(tmp_path, as_bytes, shape, chunks):
    path = tmp_path / "f.zarr"
    codec = numcodecs.VLenBytes() if as_bytes else numcodecs.VLenUTF8()
    array = zarr.create_array(
        str(path),
        shape=shape,
        chunks=chunks,
        dtype=VariableLengthBytes() if as_bytes else str,
        zarr_format=2,
        order="F",
        filters=[codec],
        compressors=numcodecs.Zstd(),
    )
    array[...] = _words(shape, as_bytes)
    got, expected, reader = _read_both(path)
    assert reader == "ZarrCodecReader"
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(mixle.read_zarr(str(path))[1:3, 2:5], expected[1:3, 2:5])


#: name -> create_array options for format 3 strings behind ``transpose`` codecs
TRANSPOSED: dict[str, dict[str, Any]] = {
    "one transpose": {"filters": [TransposeCodec(order=(2, 0, 1))], "chunks": (2, 4, 3)},
    "two transposes": {
        "filters": [TransposeCodec(order=(1, 2, 0)), TransposeCodec(order=(1, 0, 2))],
        "chunks": (2, 4, 3),
        "compressors": GzipCodec(),
    },
    "inside shards": {
        "chunks": (2, 4, 3),
        "shards": (4, 4, 6),
        "serializer": ShardingCodec(
            chunk_shape=(2, 4, 3), codecs=[TransposeCodec(order=(2, 0, 1)), VLenUTF8Codec()]
        ),
        "compressors": None,
    },
}


@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_v3_transposed_vlen_chunks_are_decoded_by_mixle_as_zarr_reads_them(tmp_path, name):
    path = tmp_path / "t.zarr"
    options = dict(TRANSPOSED[name])
    if "serializer" in options:
        options.pop("shards")
    array = zarr.create_array(str(path), shape=(5, 6, 7), dtype=str, **options)
    array[...] = _words((5, 6, 7))
    got, expected, reader = _read_both(path)
    assert reader in ("ZarrCodecReader", "ShardedZarrReader"), reader  # mixle's, bounded
    np.testing.assert_array_equal(got, expected)


# -- fill_value null ----------------------------------------------------------------------

#: name -> (dtype, format 2 filters)
NULL_FILL: dict[str, tuple[Any, list[Any]]] = {
    "VLenUTF8": (str, [numcodecs.VLenUTF8()]),
    "VLenBytes": (VariableLengthBytes(), [numcodecs.VLenBytes()]),
    "S5": ("S5", []),
    "U5": ("U5", []),
    "datetime64[s]": ("M8[s]", []),
    "timedelta64[s]": ("m8[s]", []),
    "int32": ("int32", []),
    "complex128": ("complex128", []),
}


@pytest.mark.parametrize("name", list(NULL_FILL))
def test_v2_chunks_never_written_with_fill_value_null_read_as_zarr_reads_them(tmp_path, name):
    dtype, filters = NULL_FILL[name]
    path = tmp_path / "n.zarr"
    array = zarr.create_array(
        str(path),
        shape=(6,),
        chunks=(2,),
        dtype=dtype,
        zarr_format=2,
        fill_value=None,
        filters=filters or None,
    )
    assert json.loads((path / ".zarray").read_text())["fill_value"] is None
    array[0:2] = np.asarray(array[0:2])  # chunk 0 written, chunks 1 and 2 never
    got, expected, _ = _read_both(path)
    np.testing.assert_array_equal(got, expected)
    assert got[2:].tolist() == expected[2:].tolist()


# -- shards of strings compressed as a whole ----------------------------------------------

#: name -> create_array options (chunks (6, 10): one shard per chunk, inner chunks (3, 5))
OUTER: dict[str, dict[str, Any]] = {
    "vlen-utf8 then zstd": {
        "dtype": str,
        "serializer": ShardingCodec(chunk_shape=(3, 5), codecs=[VLenUTF8Codec()]),
        "compressors": ZstdCodec(),
    },
    "vlen-utf8 gzip then zstd": {
        "dtype": str,
        "serializer": ShardingCodec(chunk_shape=(3, 5), codecs=[VLenUTF8Codec(), GzipCodec()]),
        "compressors": ZstdCodec(),
    },
    "vlen-bytes then gzip": {
        "dtype": VariableLengthBytes(),
        "serializer": ShardingCodec(chunk_shape=(3, 5), codecs=[VLenBytesCodec()]),
        "compressors": GzipCodec(),
    },
}


@pytest.mark.parametrize("name", list(OUTER))
def test_shards_of_strings_compressed_as_a_whole_are_decoded_by_mixle(tmp_path, name):
    options = OUTER[name]
    as_bytes = "bytes" in name
    path = tmp_path / "o.zarr"
    array = zarr.create_array(str(path), shape=(12, 20), chunks=(6, 10), **options)
    values = _words((12, 20), as_bytes)
    array[:9] = values[:9]  # inner chunks of the last rows never written
    got, expected, reader = _read_both(path)
    assert reader == "ZarrCodecReader"
    np.testing.assert_array_equal(got, expected)
    memory = zarr.storage.MemoryStore()
    copy = zarr.create_array(memory, shape=(12, 20), chunks=(6, 10), **options)
    copy[:9] = values[:9]
    assert type(zarr_chunk_reader(copy)).__name__ == "ZarrStoreReader"
    np.testing.assert_array_equal(mixle.read_zarr(copy)[...], np.asarray(copy[...]))


def test_a_bomb_as_a_shard_of_strings_compressed_as_a_whole_is_refused_bounded(tmp_path):
    path = tmp_path / "bomb.zarr"
    array = zarr.create_array(
        str(path), shape=(12, 20), chunks=(6, 10), **OUTER["vlen-utf8 then zstd"]
    )
    array[...] = _words((12, 20))
    (path / "c" / "0" / "0").write_bytes(BOMBS["zstd"]())  # inflates to hundreds of MiB
    got = _run_child([("bomb", str(path), True)])["bomb"]
    assert got["error"] == "VlenLimitError", got
    assert "'c/0/0'" in got["message"] and str(path) in got["message"], got["message"]
    assert "set_vlen_limit" in got["message"], got["message"]
    assert got["growth"] < GROWTH_LIMIT, f"peak RSS grew {got['growth'] / 2**20:.0f} MiB"


# -- the vlen cap: a limit, said so, and a setting that raises it ---------------------------


@pytest.fixture
def restore_vlen_limit() -> Iterator[None]:
    before = vlen_limit()
    yield
    set_vlen_limit(before)


#: name -> create_array options for 8 documents of 600,000 characters in one chunk (or shard)
LONG: dict[str, dict[str, Any]] = {
    "v2 zstd": {
        "zarr_format": 2,
        "filters": [numcodecs.VLenUTF8()],
        "compressors": numcodecs.Zstd(),
    },
    "v3 zstd": {"compressors": ZstdCodec()},
    "v3 uncompressed": {"compressors": None},
    "v3 shard compressed as a whole": {
        "serializer": ShardingCodec(chunk_shape=(8,), codecs=[VLenUTF8Codec()]),
        "compressors": GzipCodec(),
    },
    "v3 inner chunks of a shard compressed as a whole": {
        "serializer": ShardingCodec(chunk_shape=(2,), codecs=[VLenUTF8Codec()]),
        "compressors": ZstdCodec(),
    },
    "v3 sharded": {"shards": (8,), "chunks": (2,), "compressors": None},
}


@pytest.mark.parametrize("name", list(LONG))
def test_long_valid_text_is_refused_as_a_limit_that_set_vlen_limit_raises(
    tmp_path, name, restore_vlen_limit
):
    path = tmp_path / "t.zarr"
    options = {"chunks": (8,), **LONG[name]}
    array = zarr.create_array(str(path), shape=(8,), dtype=str, **options)
    rng = np.random.default_rng(3)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype="S1")
    array[...] = np.array([rng.choice(letters, 600_000).tobytes().decode() for _ in range(8)])
    with pytest.raises(VlenLimitError) as err:
        mixle.read_zarr(str(path))[...]
    assert isinstance(err.value, CorruptChunkError)  # refusing bad chunks refuses it too
    message = str(err.value)
    assert str(path) in message and "limit" in message and "corrupt" not in message, message
    assert "4,096 bytes per element" in message and "set_vlen_limit" in message, message
    previous = set_vlen_limit(1 << 20)
    assert previous == 4096
    got, expected, _ = _read_both(path)  # the setting applies to arrays opened after it
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4096", True, None])
def test_set_vlen_limit_refuses_what_is_not_a_positive_int(bad, restore_vlen_limit):
    with pytest.raises((TypeError, ValueError), match="bytes_per_element"):
        set_vlen_limit(bad)
    assert vlen_limit() == 4096


# -- memory -------------------------------------------------------------------------------

_RSS_CHILD = r"""
import sys, warnings
warnings.simplefilter("ignore")
import mixle, numpy as np
def hwm():
    with open("/proc/self/status") as status:
        return int(next(l for l in status if l.startswith("VmHWM:")).split()[1]) * 1024
base = hwm()
got = np.asarray(mixle.read_zarr(sys.argv[1])[0:2])
assert got.tolist() == ["a" * 4000] * 2, got[:2]
print(hwm() - base)
"""


def test_a_chunk_of_long_strings_peaks_near_two_copies_not_three(tmp_path):
    count, item = 16_384, b"a" * 4000  # 64 MiB of items, just under the cap
    path = tmp_path / "v.zarr"
    zarr.create_array(
        str(path),
        shape=(count,),
        chunks=(count,),
        dtype=str,
        zarr_format=2,
        filters=[numcodecs.VLenUTF8()],
        compressors=numcodecs.Zstd(),
    )
    stream = count.to_bytes(4, "little") + (len(item).to_bytes(4, "little") + item) * count
    (path / "0").write_bytes(numcodecs.Zstd(level=3).encode(stream))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.asarray(zarr.open_array(str(path), mode="r")[0:2])
    assert expected.tolist() == ["a" * 4000] * 2
    child = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env={**os.environ},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    growth = int(child.stdout.strip().splitlines()[-1])
    # the decoded stream, the Python strings and the string array were all whole at once
    # (about 3.2x the stream); now the stream is freed and the strings converted in steps
    assert growth < 2.7 * len(stream), f"peak RSS grew {growth / len(stream):.2f}x the stream"
