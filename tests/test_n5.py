"""N5 datasets written by tensorstore: every read path of read_n5 equals tensorstore's read.

Datasets are written with tensorstore's ``n5`` driver (odd shapes, every N5 data type,
every compression tensorstore writes, blocks never written) and, for layouts tensorstore
does not write itself (clipped edge blocks as the Java library writes them, damaged
blocks), block files are written by hand and tensorstore's read of them is the answer.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _n5_writers import ts_create, ts_read, values, write_n5
from _special_files import SPECIAL_KINDS, make_special
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.schema import Schema
from mixle.data.sources.arrays.n5 import N5ArraySource, read_n5
from mixle.data.sources.arrays.n5.attributes import (
    N5_MAX_BLOCK_BYTES,
    N5_METADATA_LIMIT,
    find_datasets,
    parse_metadata,
)
from mixle.data.sources.arrays.n5.source import N5BlockReader
from mixle.errors import (
    ArrayNotFoundError,
    CorruptChunkError,
    InvalidMetadataError,
    MetadataLimitError,
    NotAnArrayError,
    SchemaMismatchError,
    SpecialFileError,
    UnsupportedStoreError,
)
from mixle.reading.process_cache import chunk_cache
from mixle.testing import assert_unchanged, check_array_source

SHAPE = (7, 10, 9)
BLOCKS = (3, 4, 4)  # edge blocks on every axis are partial
PATCH = (2, 3, 4)
STARTS = [(0, 0, 0), (5, 7, 5), (2, 3, 3), (1, 6, 0), (4, 0, 4)]
COMPRESSIONS: dict[str, dict[str, Any]] = {
    "raw": {"type": "raw"},
    "gzip": {"type": "gzip"},
    "zlib": {"type": "gzip", "useZlib": True},
    "bzip2": {"type": "bzip2"},
    "xz": {"type": "xz"},
    "blosc-lz4": {"type": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
    "blosc-zstd-bitshuffle": {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2},
    "zstd": {"type": "zstd"},
}
DTYPES = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
DTYPES += ["float32", "float64"]
KEYS: list[Any] = [
    (1,),
    (-1,),
    (slice(1, 5), 3),
    (Ellipsis, 2),
    (slice(0, 7, 2), slice(1, 9, 3), slice(None)),
    (4, slice(2, 7), -2),
    (slice(3, 7), slice(4, 10), slice(4, 9)),
    (slice(None, None, -2), slice(1, None, 3), slice(None, None, -1)),
    ([6, 0, 3, 3], slice(2, 9)),
]


def _box(corner: Any, size: Any) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(corner, size))


def assert_every_path_is_tensorstore(path: Path, dataset: str | None = None) -> None:
    """Every read path of ``read_n5(path, dataset)`` gives tensorstore's read."""
    where = path / dataset if dataset else path
    want = ts_read(where)
    with assert_unchanged(path):
        src = read_n5(path, dataset)
        assert src.shape == want.shape and src.dtype == want.dtype
        assert src.dtype.isnative
        np.testing.assert_array_equal(src[...], want)
        for key in KEYS:
            np.testing.assert_array_equal(src[key], want[key], err_msg=f"key={key!r}")
        boxes = src.read_boxes(STARTS, PATCH)
        for got, corner in zip(boxes, STARTS):
            np.testing.assert_array_equal(got, want[_box(corner, PATCH)], err_msg=f"{corner}")
        np.testing.assert_array_equal(src.read_box([1, 2, 3], [6, 8, 6]), want[1:7, 2:10, 3:9])
        rows = np.array([6, 0, 3, 3, -1, 2])
        np.testing.assert_array_equal(src.get_batch(rows), want[rows])
        for got_row, want_row in zip(src.records(), want):
            np.testing.assert_array_equal(got_row, want_row)
        sampler = mixle.PatchSampler(src, PATCH, num_patches=16, seed=3)
        patches, corners = sampler.get_batch(np.arange(16))
        for patch, corner in zip(patches, corners):
            np.testing.assert_array_equal(patch, want[_box(corner, PATCH)], err_msg=f"{corner}")
        check_array_source(src, want)


# -- every compression, every dtype ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMPRESSIONS))
def test_every_compression_reads_as_tensorstore_on_every_path(tmp_path, name):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), compression=COMPRESSIONS[name])
    assert_every_path_is_tensorstore(path)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_data_type_reads_as_tensorstore_big_endian_on_disk(tmp_path, dtype):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, dtype, seed=len(dtype)))
    src = read_n5(path)
    assert src.dtype == np.dtype(dtype) and src.dtype.isnative
    assert_every_path_is_tensorstore(path)


def test_axes_are_in_n5_order_as_tensorstore_presents_them(tmp_path):
    data = values((5, 3), "int32")
    path = write_n5(tmp_path / "a.n5", data, blocks=(2, 2), compression={"type": "raw"})
    attrs = json.loads((path / "attributes.json").read_text())
    src = read_n5(path)
    assert src.shape == tuple(attrs["dimensions"]) == (5, 3)
    assert src.chunks == tuple(attrs["blockSize"])
    np.testing.assert_array_equal(src[...], ts_read(path))
    np.testing.assert_array_equal(src[...], data)


# -- blocks never written, blocks smaller than blockSize ------------------------------------


def test_blocks_never_written_read_as_zero_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    store = ts_create(path, SHAPE, BLOCKS, "int16", {"type": "gzip"})
    store[1:5, 2:6, :3] = values((4, 4, 3), "int16", seed=4)
    store[6, 9, 8] = -7
    assert not (path / "2" / "0" / "1").exists()  # a block never written
    assert_every_path_is_tensorstore(path)


def _block_file(dims: tuple[int, ...], payload: bytes, mode: int = 0) -> bytes:
    head = struct.pack(f">HH{len(dims)}I", mode, len(dims), *dims)
    if mode == 1:
        head += struct.pack(">I", int(np.prod(dims)))
    return head + payload


def _fortran_bytes(block: np.ndarray) -> bytes:
    return block.astype(block.dtype.newbyteorder(">")).tobytes(order="F")


def test_clipped_edge_blocks_as_the_java_library_writes_read_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    ts_create(path, (5, 7), (2, 3), "uint16", {"type": "raw"})
    data = values((5, 7), "uint16", seed=9)
    for i in range(3):
        for j in range(3):
            block = data[2 * i : 2 * i + 2, 3 * j : 3 * j + 3]  # clipped at the edges
            (path / str(i)).mkdir(exist_ok=True)
            (path / str(i) / str(j)).write_bytes(_block_file(block.shape, _fortran_bytes(block)))
    np.testing.assert_array_equal(ts_read(path), data)
    src = read_n5(path)
    np.testing.assert_array_equal(src[...], ts_read(path))
    check_array_source(src, ts_read(path))


def test_a_block_smaller_than_its_place_fills_its_corner_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    ts_create(path, (5, 7), (2, 3), "uint16", {"type": "raw"})
    (path / "0").mkdir()
    (path / "0" / "0").write_bytes(_block_file((1, 2), struct.pack(">2H", 5, 6)))
    (path / "2").mkdir()
    (path / "2" / "1").write_bytes(_block_file((1, 2), struct.pack(">2H", 8, 9)))
    want = ts_read(path)
    assert want[0, 0] == 5 and want[0, 1] == 6 and want[1, 0] == 0
    np.testing.assert_array_equal(read_n5(path)[...], want)


def test_a_varlength_block_of_the_blocks_element_count_reads_as_a_default_block(tmp_path):
    path = tmp_path / "a.n5"
    data = values((5, 7), "uint16", seed=2)
    write_n5(path, data, blocks=(2, 3), compression={"type": "raw"})
    block = data[2:4, 3:6]
    (path / "1" / "1").write_bytes(_block_file(block.shape, _fortran_bytes(block), mode=1))
    np.testing.assert_array_equal(read_n5(path)[...], data)  # tensorstore refuses mode 1


def _zstd_frame_without_size(data: bytes) -> bytes:
    """One zstd frame of one raw block, no content size (as streaming writers make them)."""
    block_header = (1 | (len(data) << 3)).to_bytes(3, "little")  # last block, raw
    return b"\x28\xb5\x2f\xfd" + b"\x00\x00" + block_header + data


def test_zstd_frames_without_a_content_size_read_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    ts_create(path, (5, 7), (2, 3), "int16", {"type": "zstd"})
    data = values((5, 7), "int16", seed=5)
    block = data[2:4, 3:6]
    (path / "1").mkdir()
    frame = _zstd_frame_without_size(_fortran_bytes(block))
    (path / "1" / "1").write_bytes(_block_file(block.shape, frame))
    want = ts_read(path)
    np.testing.assert_array_equal(want[2:4, 3:6], block)
    np.testing.assert_array_equal(read_n5(path)[...], want)
    short = _zstd_frame_without_size(_fortran_bytes(block)[:-2])  # one element short
    (path / "1" / "1").write_bytes(_block_file(block.shape, short))
    with pytest.raises(CorruptChunkError, match="block '1/1'"):
        read_n5(path)[...]


def test_each_block_is_read_once_per_batch_and_then_cached(tmp_path, monkeypatch):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"))
    reads: list[tuple[int, ...]] = []
    real = N5BlockReader.read_chunk

    def counted(self: N5BlockReader, coords: tuple[int, ...]) -> np.ndarray:
        reads.append(coords)
        return real(self, coords)

    monkeypatch.setattr(N5BlockReader, "read_chunk", counted)
    chunk_cache().clear()
    src = read_n5(path)
    want = ts_read(path)
    starts = [(0, 0, 0), (1, 1, 1), (0, 2, 1), (1, 0, 2)]  # all inside block (0, 0, 0)
    boxes = src.read_boxes(starts, (2, 2, 2))
    for got, corner in zip(boxes, starts):
        np.testing.assert_array_equal(got, want[_box(corner, (2, 2, 2))])
    assert reads == [(0, 0, 0)]
    src.read_boxes(starts, (2, 2, 2))
    assert reads == [(0, 0, 0)]  # from the cache


# -- 0-d, empty, groups and datasets --------------------------------------------------------


def test_a_zero_dimensional_dataset_reads_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    store = ts_create(path, (), (), "int32", {"type": "raw"})
    store[...] = -12
    src = read_n5(path)
    assert src.shape == () and src[()] == ts_read(path)[()] == -12


def test_an_empty_axis_reads_as_tensorstore(tmp_path):
    path = tmp_path / "a.n5"
    ts_create(path, (4, 0), (2, 2), "uint8")
    src = read_n5(path)
    assert src.shape == (4, 0)
    np.testing.assert_array_equal(src[...], ts_read(path))
    assert src.read_boxes([(1, 0)], (2, 0)).shape == (1, 2, 0)


def _container(tmp_path: Path) -> Path:
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    write_n5(root / "volumes" / "raw", values(SHAPE, "uint8"))
    write_n5(root / "volumes" / "labels", values((4, 5), "uint64"), blocks=(3, 3))
    (root / "empty_group").mkdir()
    (root / "empty_group" / "attributes.json").write_text("{}")
    return root


def test_a_dataset_inside_a_container_reads_as_tensorstore(tmp_path):
    root = _container(tmp_path)
    assert_every_path_is_tensorstore(root, "volumes/raw")
    assert read_n5(root / "volumes", "labels").shape == (4, 5)
    assert read_n5(root, "/volumes/labels/").shape == (4, 5)


def test_a_group_lists_the_datasets_below_it(tmp_path):
    root = _container(tmp_path)
    with pytest.raises(NotAnArrayError, match="is an N5 group") as info:
        read_n5(root)
    message = str(info.value)
    assert "volumes/raw (7, 10, 9) uint8" in message and "volumes/labels (4, 5) uint64" in message
    with pytest.raises(NotAnArrayError, match="raw"):
        read_n5(root, "volumes")


@pytest.mark.parametrize("version", ["5.0.0", "x", 4])
def test_a_container_of_a_newer_n5_version_is_refused(tmp_path, version):
    root = _container(tmp_path)
    (root / "attributes.json").write_text(json.dumps({"n5": version}))
    with pytest.raises(UnsupportedStoreError, match=f"version n5={version!r}"):
        read_n5(root, "volumes/raw")
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    assert read_n5(root, "volumes/raw").shape == (7, 10, 9)


def test_schema_is_checked_at_open(tmp_path):
    root = _container(tmp_path)
    with pytest.raises(SchemaMismatchError):
        read_n5(root, "volumes/raw", schema=Schema(dtype="float32"))
    assert read_n5(root, "volumes/raw", schema=Schema(dtype="uint8")).dtype == np.uint8


def test_the_search_for_datasets_is_bounded(tmp_path):
    root = _container(tmp_path)
    names, stopped = find_datasets(str(root), limit=2)
    assert stopped and len(names) <= 1
    names, stopped = find_datasets(str(root))
    assert not stopped and len(names) == 2


def test_a_missing_dataset_names_it_and_lists_those_that_exist(tmp_path):
    root = _container(tmp_path)
    with pytest.raises(ArrayNotFoundError, match=r"dataset='volumes/nope'.*volumes/raw"):
        read_n5(root, "volumes/nope")


def test_a_folder_without_n5_metadata_is_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no attributes\.json"):
        read_n5(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        read_n5(tmp_path / "missing.n5")
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        read_n5(tmp_path / "f")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"path": 3}, TypeError, "path=3 must be a local path or a URL"),
        ({"path": b"x.n5"}, TypeError, "path=b'x.n5'"),
        ({"path": ".", "storage_options": {"anon": True}}, ValueError, "storage_options only"),
        ({"path": ".", "storage_options": 3}, TypeError, "storage_options must be a dict"),
        ({"path": ".", "dataset": 5}, TypeError, "dataset=5 must be a str"),
        ({"path": ".", "dataset": "../x"}, ValueError, "dataset='../x'"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(kwargs, error, match):
    with pytest.raises(error, match=match):
        read_n5(**kwargs)


# -- metadata -------------------------------------------------------------------------------


def _rewrite_attributes(path: Path, **changes: Any) -> None:
    attrs = json.loads((path / "attributes.json").read_text())
    for key, value in changes.items():
        if value is None:
            attrs.pop(key, None)
        else:
            attrs[key] = value
    (path / "attributes.json").write_text(json.dumps(attrs))


def test_old_style_compression_type_reads_as_tensorstore_read_before_the_rewrite(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "int64"), compression={"type": "gzip"})
    want = ts_read(path)
    _rewrite_attributes(path, compression=None, compressionType="gzip")
    np.testing.assert_array_equal(read_n5(path)[...], want)
    raw = write_n5(tmp_path / "r.n5", values(SHAPE, "int8"), compression={"type": "raw"})
    want = ts_read(raw)
    _rewrite_attributes(raw, compression=None)  # no compression at all: raw (N5's default)
    np.testing.assert_array_equal(read_n5(raw)[...], want)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"dataType": "complex64"}, "dataType='complex64' is not one mixle reads"),
        ({"dataType": "object"}, "dataType='object'"),
        ({"dimensions": [7, -1, 9]}, r"dimensions=\[7, -1, 9\] must be a list of ints"),
        ({"dimensions": [7, 10.5, 9]}, "dimensions="),
        ({"blockSize": [3, 0, 4]}, r"blockSize=\[3, 0, 4\] must be a list of ints from 1"),
        ({"blockSize": [3, 4]}, "blockSize=.*has 2 entries but dimensions"),
        ({"compression": "gzip"}, "compression='gzip' must be an object"),
        ({"compression": None, "compressionType": 3}, "compressionType=3"),
        ({"blockSize": [2**40, 2**40, 2**40]}, "more elements than NumPy"),
    ],
)
def test_damaged_attributes_name_the_key_and_value(tmp_path, changes, match):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint8"))
    _rewrite_attributes(path, **changes)
    with pytest.raises(InvalidMetadataError, match=match):
        read_n5(path)


def test_a_huge_block_size_is_refused_at_open_not_allocated_at_read(tmp_path):
    # a tiny block file in a dataset whose blockSize is petabytes: a 2x2x2 read decoded it
    # into np.zeros(blockSize) and asked for petabytes of memory
    path = tmp_path / "hostile.n5"
    (path / "0" / "0").mkdir(parents=True)
    attrs = {
        "dimensions": [2**20, 2**20, 2**20],
        "blockSize": [2**20, 2**20, 2**14],
        "dataType": "uint8",
        "compression": {"type": "raw"},
    }
    (path / "attributes.json").write_text(json.dumps(attrs))
    (path / "0" / "0" / "0").write_bytes(struct.pack(">HH3I", 0, 3, 1, 1, 1) + b"\x07")
    with pytest.raises(
        InvalidMetadataError, match=r"blockSize=\[1048576, 1048576, 16384\].*N5_MAX_BLOCK_BYTES"
    ):
        read_n5(path)


@pytest.mark.parametrize(
    ("block", "dtype", "opens"),
    [
        (2**31, "int8", True),  # 2**31 elements (past a Java array) in 2 GiB
        (2**31 + 1, "uint8", False),
        (2**28, "uint64", True),  # 2 GiB
        (2**28 + 1, "uint64", False),  # fewer elements than a Java array, past 2 GiB
        (2**31 - 1, "uint64", False),
        (2**30, "uint16", True),
    ],
)
def test_the_block_limit_is_tensorstores_bytes_per_block(tmp_path, block, dtype, opens):
    import tensorstore as ts

    attrs = {
        "dimensions": [10, 10],
        "blockSize": [block, 1],
        "dataType": dtype,
        "compression": {"type": "raw"},
    }
    (tmp_path / "attributes.json").write_text(json.dumps(attrs))
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path)}}
    if opens:
        ts.open(spec).result()
        assert parse_metadata(attrs, "'a'").blocks == (block, 1)
    else:
        with pytest.raises(ValueError, match="maximum chunk size"):
            ts.open(spec).result()
        with pytest.raises(
            InvalidMetadataError, match=f"N5_MAX_BLOCK_BYTES={N5_MAX_BLOCK_BYTES:,}"
        ):
            parse_metadata(attrs, "'a'")


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ("", InvalidMetadataError, "not valid JSON"),
        ("[1, 2]", InvalidMetadataError, "holds a JSON list"),
        ('{"dimensions": [1', InvalidMetadataError, "not valid JSON"),
        ("\udcff", InvalidMetadataError, "not UTF-8"),
        ("[" * 100_000, MetadataLimitError, "too deeply"),
    ],
)
def test_unreadable_attributes_json_is_refused(tmp_path, text, error, match):
    path = tmp_path / "a.n5"
    path.mkdir()
    (path / "attributes.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(error, match=match):
        read_n5(path)


def test_attributes_json_larger_than_the_limit_is_refused_unparsed(tmp_path):
    path = tmp_path / "a.n5"
    path.mkdir()
    with open(path / "attributes.json", "wb") as f:
        f.truncate(N5_METADATA_LIMIT + 1)
    with pytest.raises(MetadataLimitError, match="N5_METADATA_LIMIT"):
        read_n5(path)


@pytest.mark.parametrize("kind", ["lz4", "snappy", "jpeg"])
def test_an_unknown_compression_is_named_with_those_mixle_decodes(tmp_path, kind):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint8"))
    _rewrite_attributes(path, compression={"type": kind})
    with pytest.raises(UnsupportedStoreError, match=f"compression type '{kind}'.*gzip, bzip2"):
        read_n5(path)


@pytest.mark.parametrize("kind", ["blosc-lz4", "zstd"])
def test_numcodecs_compressions_without_numcodecs_name_the_extra(tmp_path, monkeypatch, kind):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint8"), compression=COMPRESSIONS[kind])
    monkeypatch.setitem(sys.modules, "numcodecs", None)  # import numcodecs fails
    codec = kind.split("-")[0]
    with pytest.raises(ImportError, match=rf'N5 {codec} compression.*pip install -e "\.\[n5\]"'):
        read_n5(path)


def test_resolution_is_reported_as_spacing(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint8"))
    _rewrite_attributes(
        path, resolution=[4.0, 4, 40.0], axes=["x", "y", "z"], units=["nm", "nm", "nm"]
    )
    src = read_n5(path)
    assert src.spacing == (4.0, 4.0, 40.0)
    assert src.physical is not None and src.physical.axes == ("x", "y", "z")
    assert src.physical.units == ("nm", "nm", "nm")
    _rewrite_attributes(path, axes=["x"], units=[1, 2, 3])  # not one name per axis: left out
    physical = read_n5(path).physical
    assert physical is not None and physical.axes is None and physical.units is None
    _rewrite_attributes(path, resolution=[4.0, 0, 40.0])
    assert read_n5(path).spacing is None  # not a spacing: not reported


# -- damaged blocks -------------------------------------------------------------------------


def _damage(path: Path, block: str, content: bytes) -> Path:
    target = path.joinpath(*block.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    return target


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("header cut short", b"\x00\x00\x00", "fewer than a block header"),
        ("ndim wrong", _block_file((3, 4), b""), "header has 2 axes, the dataset 3"),
        ("over blockSize", _block_file((3, 5, 4), b"\0" * 120), r"exceed blockSize=\[3, 4, 4\]"),
        ("object mode", _block_file((3, 4, 4), b"", mode=2), "object block"),
        ("unknown mode", struct.pack(">HH", 7, 3), "mode is 7"),
        ("payload short", _block_file((3, 4, 4), b"\0" * 40), "raw payload has 40 bytes"),
        ("payload long", _block_file((3, 4, 4), b"\0" * 100), "raw payload has 100 bytes"),
    ],
)
def test_a_damaged_raw_block_raises_corrupt_chunk_naming_file_and_block(
    tmp_path, name, content, match
):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), compression={"type": "raw"})
    target = _damage(path, "1/0/1", content)
    src = read_n5(path)
    for read in (
        lambda: src[...],
        lambda: src.read_boxes([(3, 0, 4)], (1, 1, 1)),
        lambda: src.get_batch([4]),
    ):
        with pytest.raises(CorruptChunkError, match=match) as info:
            read()
        assert str(target) in str(info.value) and "(1, 0, 1)" in str(info.value), name
    np.testing.assert_array_equal(src[:3], ts_read(path, np.s_[:3]))  # other blocks read


@pytest.mark.parametrize("name", ["gzip", "zlib", "bzip2", "xz", "blosc-lz4", "zstd"])
def test_a_damaged_compressed_payload_raises_corrupt_chunk(tmp_path, name):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), compression=COMPRESSIONS[name])
    target = path / "0" / "1" / "0"
    stored = target.read_bytes()
    header = 4 + 4 * 3
    for broken in (stored[: header + (len(stored) - header) // 2], stored[:header] + b"junk" * 9):
        target.write_bytes(broken)
        chunk_cache().clear()
        with pytest.raises(CorruptChunkError, match="block '0/1/0'") as info:
            read_n5(path)[...]
        assert str(target) in str(info.value)


@pytest.mark.parametrize("name", ["gzip", "zlib", "bzip2", "xz", "zstd"])
def test_a_payload_that_decodes_to_more_than_its_header_says_is_refused(tmp_path, name):
    big = write_n5(tmp_path / "big.n5", values(SHAPE, "uint16"), compression=COMPRESSIONS[name])
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), compression=COMPRESSIONS[name])
    header = 4 + 4 * 3
    # a whole block's payload under a header that claims one element
    payload = (big / "0" / "0" / "0").read_bytes()[header:]
    _damage(path, "0/0/0", _block_file((1, 1, 1), payload))
    with pytest.raises(CorruptChunkError, match="block '0/0/0'"):
        read_n5(path)[0, 0, 0]


def test_a_folder_where_a_block_file_should_be_raises_corrupt_chunk(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"))
    target = path / "1" / "1" / "1"
    target.unlink()
    target.mkdir()
    with pytest.raises(CorruptChunkError, match="is a directory"):
        read_n5(path)[...]


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_a_block_or_attributes_that_is_a_special_file_is_refused_without_reading(tmp_path, kind):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"))
    held: list[Any] = []
    try:
        make_special(path / "1" / "1" / "1", kind, held)
        src = read_n5(path)
        with pytest.raises(SpecialFileError):
            src[...]
        np.testing.assert_array_equal(src[:3], ts_read(path, np.s_[:3]))
        make_special(path / "attributes.json", kind, held)
        with pytest.raises(SpecialFileError):
            read_n5(path)
    finally:
        for sock in held:
            sock.close()


def test_a_block_file_larger_than_any_block_is_refused_unread(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"))
    with open(path / "1" / "1" / "1", "wb") as f:
        f.truncate(10 * 1024 * 1024)
    with pytest.raises(CorruptChunkError, match="more than the"):
        read_n5(path)[...]


# -- pickling, fork, lifetime ---------------------------------------------------------------


def test_pickles_by_reference_and_reopens_lazily(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "float32"))
    src = read_n5(path, None)
    blob = pickle.dumps(src)
    assert len(blob) < 1024 and b"attributes" not in blob
    clone = pickle.loads(blob)
    assert isinstance(clone, N5ArraySource) and "not opened yet" in repr(clone)
    np.testing.assert_array_equal(clone[2:5], ts_read(path)[2:5])


def _read_in_child(src: N5ArraySource, queue: Any) -> None:
    queue.put(src.read_boxes([(1, 2, 3)], (3, 3, 3))[0].tolist())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_the_same_values(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "int32"))
    src = read_n5(path)
    src[...]  # the parent has a live handle, reader and cached blocks
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(src, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(np.array(got), ts_read(path)[1:4, 2:5, 3:6])


# -- property test --------------------------------------------------------------------------


@st.composite
def _layouts(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, ...]], Any]:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    blocks = tuple(draw(st.integers(1, s + 2)) for s in shape)
    size = tuple(draw(st.integers(1, s)) for s in shape)
    starts = draw(
        st.lists(
            st.tuples(*(st.integers(0, s - n) for s, n in zip(shape, size))),
            min_size=1,
            max_size=5,
        )
    )
    written = draw(st.tuples(*(st.integers(0, s) for s in shape)))  # a corner written
    return shape, blocks, starts, (size, written)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(layout=_layouts(), dtype=st.sampled_from(["uint8", "int16", "float64", "uint32"]))
def test_random_layouts_and_boxes_read_as_tensorstore(tmp_path_factory, layout, dtype):
    shape, blocks, starts, (size, written) = layout
    path = tmp_path_factory.mktemp("n5") / "a.n5"
    store = ts_create(path, shape, blocks, dtype, {"type": "gzip"})
    region = tuple(slice(0, w) for w in written)
    store[region] = values(shape, dtype)[region]
    want = ts_read(path)
    src = read_n5(path)
    boxes = src.read_boxes(starts, size)
    for got, corner in zip(boxes, starts):
        np.testing.assert_array_equal(got, want[_box(corner, size)])
    np.testing.assert_array_equal(src[...], want)
    np.testing.assert_array_equal(src[::-1], want[::-1])


def test_read_volumes_opens_n5_containers_by_suffix(tmp_path):
    root = _container(tmp_path)
    other = tmp_path / "d.n5"
    write_n5(other / "volumes" / "raw", values(SHAPE, "uint8", seed=3))
    volumes = mixle.read_volumes([other, root], dataset="volumes/raw")
    want = ts_read(root / "volumes" / "raw")
    assert isinstance(volumes[1], N5ArraySource)
    np.testing.assert_array_equal(volumes[1][...], want)
    sampler = mixle.VolumePatchSampler(volumes, PATCH, 6, seed=2)
    wants = [ts_read(other / "volumes" / "raw"), want]
    for k in range(6):
        record = sampler[k]
        truth = wants[int(record["volume"])]
        np.testing.assert_array_equal(record["patch"], truth[_box(record["coords"], PATCH)])


# -- gzip and zlib payloads: libdeflate (imagecodecs) and the streamed zlib decoder ----------


@pytest.fixture(params=["libdeflate", "zlib"])
def inflater(request, monkeypatch):
    """Which decoder inflates gzip/zlib blocks; yields the calls made to libdeflate."""
    from mixle.utils import optional_deps

    calls: list[str] = []
    if request.param == "libdeflate":
        imagecodecs = pytest.importorskip("imagecodecs")
        for name in ("gzip_decode", "deflate_decode"):
            real = getattr(imagecodecs, name)

            def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                calls.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(imagecodecs, name, spy)
    else:
        monkeypatch.setattr(optional_deps, "HAS_IMAGECODECS", False)
    return request.param, calls


@pytest.mark.parametrize("name", ["gzip", "zlib"])
@pytest.mark.parametrize("dtype", ["uint16", "float32", "int64"])
def test_gzip_and_zlib_blocks_read_as_tensorstore_with_either_inflater(
    tmp_path, inflater, name, dtype
):
    kind, calls = inflater
    path = write_n5(tmp_path / "a.n5", values(SHAPE, dtype), compression=COMPRESSIONS[name])
    assert_every_path_is_tensorstore(path)
    want = {"gzip": "gzip_decode", "zlib": "deflate_decode"}[name]
    assert calls if kind == "libdeflate" else not calls
    assert set(calls) <= {want}


def _gzip_block(path: Path, name: str, block: str = "0/1/0") -> tuple[Path, bytes, bytes]:
    """``(block file, header, payload)`` of a block of a fresh uint16 dataset."""
    path = write_n5(path, values(SHAPE, "uint16"), compression=COMPRESSIONS[name])
    target = path.joinpath(*block.split("/"))
    stored = target.read_bytes()
    header = 4 + 4 * len(SHAPE)
    return target, stored[:header], stored[header:]


@pytest.mark.parametrize("name", ["gzip", "zlib"])
def test_damaged_gzip_and_zlib_payloads_raise_corrupt_chunk_with_either_inflater(
    tmp_path, inflater, name
):
    target, header, payload = _gzip_block(tmp_path / "a.n5", name)
    flipped = bytearray(payload)
    flipped[len(payload) // 2] ^= 0xFF
    checksum = bytearray(payload)
    checksum[-5 if name == "gzip" else -1] ^= 0x01  # gzip: CRC-32; zlib: Adler-32
    for broken, match in [
        (payload[: len(payload) // 2], "block '0/1/0'"),
        (payload[:-1], "block '0/1/0'"),
        (b"junk" * 9, "block '0/1/0'"),
        (bytes(flipped), "block '0/1/0'"),
        (bytes(checksum), "block '0/1/0'"),
    ]:
        target.write_bytes(header + broken)
        chunk_cache().clear()
        with pytest.raises(CorruptChunkError, match=match) as info:
            read_n5(target.parents[2])[...]
        assert str(target) in str(info.value)


@pytest.mark.parametrize("name", ["gzip", "zlib"])
def test_a_gzip_or_zlib_payload_of_another_size_than_its_header_is_refused(
    tmp_path, inflater, name
):
    import gzip
    import zlib

    compress = gzip.compress if name == "gzip" else zlib.compress
    target, _, _ = _gzip_block(tmp_path / "a.n5", name)
    dims = (3, 4, 4)  # the block's extents: 48 uint16, 96 bytes
    for count in (47, 49, 1):  # one element short, one over, far short
        target.write_bytes(_block_file(dims, compress(b"\x01\x02" * count)))
        chunk_cache().clear()
        with pytest.raises(CorruptChunkError, match="block '0/1/0'"):
            read_n5(target.parents[2])[...]


def test_a_gzip_payload_of_several_members_reads_whole_with_either_inflater(tmp_path, inflater):
    import gzip

    _, calls = inflater
    path = tmp_path / "a.n5"
    ts_create(path, (3, 4, 4), (3, 4, 4), "uint16", {"type": "gzip"})
    data = values((3, 4, 4), "uint16", seed=5)
    stored = _fortran_bytes(data)
    members = gzip.compress(stored[:30]) + gzip.compress(stored[30:]) + b"\0" * 3
    (path / "0" / "0").mkdir(parents=True, exist_ok=True)
    (path / "0" / "0" / "0").write_bytes(_block_file((3, 4, 4), members))
    assert gzip.decompress(members) == stored  # tensorstore refuses a second member
    np.testing.assert_array_equal(read_n5(path)[...], data)
    assert not calls  # its last bytes are no size trailer of the whole: the streamed decoder


def test_bytes_after_a_gzip_payload_are_refused_with_either_inflater(tmp_path, inflater):
    target, header, payload = _gzip_block(tmp_path / "a.n5", "gzip")
    want = ts_read(target.parents[2])
    target.write_bytes(header + payload + b"junk")
    with pytest.raises(CorruptChunkError, match="block '0/1/0'"):
        read_n5(target.parents[2])[...]
    target.write_bytes(header + payload + b"\0" * 5)  # zero padding after a member
    chunk_cache().clear()
    np.testing.assert_array_equal(read_n5(target.parents[2])[...], want)


@pytest.mark.parametrize(
    ("case", "reads"),
    [
        ("one member", True),
        ("zero padding", True),
        ("long zero padding", True),
        ("a second member", False),
        ("the same member twice", False),
        ("padding ending in the size", False),
        ("padding ending in the trailer", False),
        ("cut short", False),
    ],
)
def test_either_inflater_accepts_and_refuses_the_same_gzip_payloads(
    tmp_path, inflater, case, reads
):
    # libdeflate decodes a payload's first member and ignores what follows: a first member
    # of exactly the block's bytes followed by more bytes read with imagecodecs installed
    # and failed without it (and in tensorstore)
    import gzip

    kind, calls = inflater
    target, header, payload = _gzip_block(tmp_path / "a.n5", "gzip")
    want = ts_read(target.parents[2])
    size = payload[-4:]  # the member's size trailer: the block's 96 bytes
    stored = {
        "one member": payload,
        "zero padding": payload + b"\0" * 6,
        "long zero padding": payload + b"\0" * 100,
        "a second member": payload + gzip.compress(b"\x07" * 96),
        "the same member twice": payload + payload,
        "padding ending in the size": payload + b"\0" * 4 + size,
        "padding ending in the trailer": payload + b"\0" * 3 + payload[-8:],
        "cut short": payload[:-2],
    }[case]
    target.write_bytes(header + stored)
    chunk_cache().clear()
    if reads:
        np.testing.assert_array_equal(read_n5(target.parents[2])[...], want)
        assert calls if kind == "libdeflate" else not calls  # libdeflate's fast path kept
    else:
        with pytest.raises(CorruptChunkError, match="block '0/1/0'"):
            read_n5(target.parents[2])[...]
