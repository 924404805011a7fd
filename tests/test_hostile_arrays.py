"""Hostile array metadata and files: clear, typed errors naming the array, never a crash.

Zarr metadata with a chunk shape of 0, negative, fractional or gigantic extents; shard
indices whose offsets overflow or claim a terabyte; metadata files too large or nested too
deeply to parse; ``.npy`` headers claiming hundreds of megabytes; special files given as
``.npy`` or raw volumes. Each raises a mixle error or the matching builtin whose message
names the file (and the value), never ``ZeroDivisionError``, ``OverflowError``,
``MemoryError`` or ``RecursionError``; a grid of ``2**62`` voxels per axis reads.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
from _special_files import SPECIAL_KINDS, make_special

import mixle
from mixle.data.sources.arrays.zarr.source import ZARR_METADATA_LIMIT
from mixle.reading import CorruptChunkError

SHAPE = (8, 8)
CHUNKS = (4, 4)


def _array(path: Path, zarr_format: int, **options: Any) -> Path:
    """A small uint8 array (chunks 4 x 4, fill value 5) written at ``path``; its metadata."""
    array = zarr.create_array(
        str(path),
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="uint8",
        fill_value=5,
        zarr_format=zarr_format,
        **options,
    )
    array[:4, :4] = 1
    return path / (".zarray" if zarr_format == 2 else "zarr.json")


def _edit(meta_file: Path, **fields: Any) -> None:
    """Set metadata ``fields`` (``chunks`` in the format's own place)."""
    meta = json.loads(meta_file.read_text())
    for name, value in fields.items():
        if name == "chunks" and "chunk_grid" in meta:
            meta["chunk_grid"]["configuration"]["chunk_shape"] = value
        else:
            meta[name] = value
    meta_file.write_text(json.dumps(meta))


def _read(path: Path) -> np.ndarray:
    """Open and read, through both read paths (a region and a batch of boxes)."""
    src = mixle.read_zarr(path)
    src[0:2, 0:2]
    return src.read_boxes(np.array([[0, 0]]), (2, 2))


# -- chunk grids ------------------------------------------------------------------------

GRIDS = {
    "chunk shape 0": ({"chunks": [0, 4]}, ValueError, r"chunks=\(0, 4\)"),
    "negative chunks": ({"chunks": [-1, 4]}, ValueError, r"-1"),
    "fractional chunks": ({"chunks": [1.5, 4]}, TypeError, r"1\.5"),
    "negative shape": ({"shape": [-8, 8]}, ValueError, r"-8"),
    "fractional shape": ({"shape": [8.5, 8]}, TypeError, r"8\.5"),
    "shape 2**64": ({"shape": [2**64, 8]}, ValueError, str(2**64)),
    "chunks of 2**124 bytes": ({"chunks": [2**62, 2**62]}, ValueError, "more than NumPy"),
}


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("case", list(GRIDS))
def test_a_hostile_chunk_grid_raises_a_clear_error(tmp_path, case, zarr_format):
    fields, error, value = GRIDS[case]
    path = tmp_path / "a.zarr"
    _edit(_array(path, zarr_format), **fields)
    with pytest.raises(error, match=value) as caught:
        _read(path)
    assert type(caught.value) not in (ZeroDivisionError, OverflowError, MemoryError)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_grid_of_2_62_voxels_per_axis_reads(tmp_path, zarr_format):
    path = tmp_path / "a.zarr"
    _edit(_array(path, zarr_format), shape=[2**62, 2**62])
    src = mixle.read_zarr(path)
    assert src.shape == (2**62, 2**62)
    np.testing.assert_array_equal(src[0:2, 3:5], [[1, 5], [1, 5]])
    np.testing.assert_array_equal(src[2**62 - 2 :, 2**62 - 3 :], np.full((2, 3), 5))
    boxes = src.read_boxes(np.array([[2**62 - 4, 2**62 - 4], [2, 2]]), (4, 4))
    np.testing.assert_array_equal(boxes[0], np.full((4, 4), 5))
    np.testing.assert_array_equal(boxes[1], [[1, 1, 5, 5], [1, 1, 5, 5], [5] * 4, [5] * 4])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_chunks_of_a_terabyte_on_a_small_array_cost_no_terabyte(tmp_path, zarr_format):
    path = tmp_path / "a.zarr"
    meta_file = _array(path, zarr_format)
    _edit(meta_file, chunks=[2**20, 2**20])
    stored = path / ("0.0" if zarr_format == 2 else "c/0/0")
    with pytest.raises(CorruptChunkError, match="header says"):  # 16 bytes, not 1 TiB
        mixle.read_zarr(path)[...]
    stored.unlink()  # never written: the fill value, clipped to the array
    np.testing.assert_array_equal(mixle.read_zarr(path)[...], np.full(SHAPE, 5))


# -- shard indices -----------------------------------------------------------------------


def _shard_with_index(path: Path, entries: list[tuple[int, int]]) -> Path:
    """A sharded array (one 8 x 8 shard of four raw 4 x 4 chunks) with its index replaced."""
    zarr.create_array(
        str(path), shape=SHAPE, chunks=CHUNKS, shards=SHAPE, dtype="uint8", compressors=None
    )[...] = 3
    shard = path / "c" / "0" / "0"
    raw = shard.read_bytes()
    index = np.array(entries, dtype="<u8").tobytes()
    crc = google_crc32c.value(index).to_bytes(4, "little")
    shard.write_bytes(raw[: len(raw) - len(index) - 4] + index + crc)
    return shard


GOOD = [(16, 16), (32, 16), (48, 16)]
SHARD_INDICES = {
    "an offset whose end overflows 64 bits": [(2**64 - 2, 10), *GOOD],
    "a length of 1 TiB": [(0, 2**40), *GOOD],
    "an offset past 2**63": [(2**63 + 5, 16), *GOOD],
    "half of a never-written mark": [(2**64 - 1, 16), *GOOD],
}


@pytest.mark.parametrize("case", list(SHARD_INDICES))
def test_a_damaged_local_shard_index_raises_corrupt_chunk_naming_the_file(tmp_path, case):
    path = tmp_path / "a.zarr"
    shard = _shard_with_index(path, SHARD_INDICES[case])
    with pytest.raises(CorruptChunkError, match="index") as caught:
        _read(path)
    message = str(caught.value)
    assert "'c/0/0'" in message and str(shard) in message, message


def test_a_shard_index_pointing_past_the_file_end_is_a_truncated_shard(tmp_path):
    path = tmp_path / "a.zarr"
    _shard_with_index(path, [(4000, 16), *GOOD])
    with pytest.raises(CorruptChunkError, match="truncated shard"):
        _read(path)


# -- metadata files ----------------------------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_metadata_larger_than_the_cap_is_refused_unparsed(tmp_path, zarr_format):
    path = tmp_path / "a.zarr"
    meta_file = _array(path, zarr_format)
    attrs = path / ".zattrs" if zarr_format == 2 else meta_file
    if zarr_format == 2:
        attrs.write_text(json.dumps({"pad": "x" * (ZARR_METADATA_LIMIT + 1)}))
    else:
        _edit(meta_file, attributes={"pad": "x" * (ZARR_METADATA_LIMIT + 1)})
    with pytest.raises(ValueError, match="ZARR_METADATA_LIMIT") as caught:
        mixle.read_zarr(path)
    assert str(attrs) in str(caught.value)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_deeply_nested_attributes_raise_value_error_not_recursion_error(tmp_path, zarr_format):
    path = tmp_path / "a.zarr"
    meta_file = _array(path, zarr_format)
    deep = "[" * 100_000 + "]" * 100_000
    if zarr_format == 2:
        (path / ".zattrs").write_text(f'{{"x": {deep}}}')
    else:
        text = meta_file.read_text().replace('"attributes": {}', f'"attributes": {{"x": {deep}}}')
        meta_file.write_text(text)
    with pytest.raises(ValueError, match="nested too deeply") as caught:
        mixle.read_zarr(path)
    assert str(path) in str(caught.value)


# -- .npy headers and special files ------------------------------------------------------

#: A child that opens a .npy file and reports the error and the growth of its peak RSS.
_NPY_CHILD = """
import json, sys
import mixle

def hwm():
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

base = hwm()
try:
    mixle.read_npy(sys.argv[1])
    error, message = None, ""
except BaseException as exc:
    error, message = type(exc).__name__, str(exc)
print(json.dumps({"error": error, "message": message, "growth": hwm() - base}))
"""


def test_a_npy_header_claiming_100_mb_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "big_header.npy"
    header = "{'descr': '<u1', 'fortran_order': False, 'shape': (4,), }" + " " * 100 * 2**20
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x03\x00" + len(header).to_bytes(4, "little"))
        fh.write(header.encode() + b"\n" + bytes(4))
    child = subprocess.run(
        [sys.executable, "-c", _NPY_CHILD, str(path)], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert got["error"] == "ValueError" and str(path) in got["message"], got
    assert "header" in got["message"], got
    assert got["growth"] < 16 * 2**20, f"peak RSS grew {got['growth'] / 2**20:.0f} MiB"


OPENERS = {
    "npy": mixle.read_npy,
    "memmap": lambda path: mixle.read_memmap(path, dtype="uint8", shape=(4,)),
}


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("reader", ["npy", "memmap"])
def test_a_special_file_given_as_a_volume_is_refused(tmp_path, reader, kind):
    path = tmp_path / f"volume.{reader}"
    held: list[socket.socket] = []
    try:
        make_special(path, kind, held)
        with pytest.raises(mixle.SpecialFileError, match="not a regular file") as caught:
            OPENERS[reader](path)
    finally:
        for sock in held:
            sock.close()
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("shape", [(2**62, 4), (2**32, 2**32), (0, 2**64)])
def test_a_raw_volume_shape_past_numpy_raises_a_clear_value_error(tmp_path, shape):
    path = tmp_path / "empty.raw"
    path.write_bytes(b"")  # a wrapped-around size of 0 bytes would match it
    with pytest.raises(ValueError, match=r"shape=\(") as caught:
        mixle.read_memmap(path, dtype="uint8", shape=shape)
    assert "NumPy" in str(caught.value)


def test_a_missing_volume_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        mixle.read_npy(tmp_path / "missing.npy")
    with pytest.raises(FileNotFoundError, match="no such file"):
        mixle.read_memmap(tmp_path / "missing.raw", dtype="uint8", shape=(4,))
