"""``mixle inspect`` and :mod:`mixle.inspection`: facts, findings, patch costs, CLI, remote."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import h5py
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

from mixle.cli import main
from mixle.cli.inspect import parse_storage_option, render_report
from mixle.inspection import (
    DEFAULT_PATCH_EDGE,
    LARGE_CHUNK_BYTES,
    MAX_PROBED_OBJECTS,
    SMALL_CHUNK_BYTES,
    ArrayReport,
    GroupReport,
    UnsupportedStoreError,
    expected_chunks_along_axis,
    format_bytes,
    inspect_store,
    parse_patch,
    patch_cost,
    suggest_chunks,
)
from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

ROOT = Path(__file__).resolve().parents[1]


# -- helpers -------------------------------------------------------------------------------
def chunk_files(folder: Path) -> dict[str, int]:
    """Every stored object under an array folder (metadata excluded) and its size."""
    meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name not in meta
    }


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def codes(report: ArrayReport) -> set[str]:
    return {f.code for f in report.findings}


def smooth(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Compressible data: a ramp."""
    return np.arange(math.prod(shape), dtype="float64").reshape(shape).astype(dtype) % 97


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of small samples of every kind, written once for the module."""
    root = tmp_path_factory.mktemp("inspect")
    data = smooth((16, 24, 20))
    for name, codec in [("zstd", ZstdCodec(level=3)), ("gzip", GzipCodec(level=4))]:
        arr = zarr.create_array(
            str(root / f"{name}.zarr"), shape=data.shape, chunks=(8, 8, 10), dtype="float32",
            compressors=codec,
        )  # fmt: skip
        arr[:] = data
    blosc = zarr.create_array(
        str(root / "blosc.zarr"), shape=data.shape, chunks=(8, 8, 10), dtype="float32",
        compressors=BloscCodec(cname="zstd", clevel=5, shuffle="bitshuffle"),
    )  # fmt: skip
    blosc[:] = data
    sharded = zarr.create_array(
        str(root / "sharded.zarr"), shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="int16",
        compressors=ZstdCodec(), fill_value=-1,
    )  # fmt: skip
    sharded[:2, :4] = np.arange(8, dtype="int16").reshape(2, 4)  # shard (0, 0): 2 inner chunks
    for name, compressor in [("zlib", numcodecs.Zlib(level=5)), ("bl", numcodecs.Blosc())]:
        v2 = zarr.create_array(
            str(root / f"v2_{name}.zarr"), shape=(12, 10), chunks=(5, 5), dtype="float64",
            zarr_format=2, filters=[numcodecs.Delta(dtype="<f8")], compressors=compressor,
            order="F",
        )  # fmt: skip
        v2[:] = smooth((12, 10), "float64")
    group = zarr.open_group(str(root / "tree.zarr"), mode="w")
    group.attrs.update({"title": "scan", "owner": "lab"})
    raw = group.create_group("raw")
    raw.attrs["site"] = 3
    vol = raw.create_array("volume", shape=(10, 10), chunks=(5, 5), dtype="uint8")
    vol.attrs["unit"] = "HU"
    vol[:5] = 1  # two of four chunks written
    group.create_array("mask", shape=(4,), chunks=(2,), dtype="bool")
    with h5py.File(root / "scan.h5", "w") as f:
        f.attrs["about"] = "test"
        f.create_dataset("gzip", data=data, chunks=(8, 8, 10), compression="gzip",
                         compression_opts=6, shuffle=True)  # fmt: skip
        f.create_dataset("lzf", data=data, chunks=(8, 8, 10), compression="lzf")
        f.create_dataset("checked", data=data, chunks=(8, 8, 10), fletcher32=True)
        f.create_dataset("flat", data=data)
        inner = f.create_group("deep/er")
        sparse = inner.create_dataset("sparse", shape=(16, 16), chunks=(8, 8), dtype="i4",
                                      fillvalue=5, compression="gzip")  # fmt: skip
        sparse[:8, :8] = 1
        f["alias"] = h5py.SoftLink("/gzip")
    np.save(root / "c.npy", smooth((6, 5)))
    np.save(root / "f.npy", np.asfortranarray(smooth((6, 5), "int32")))
    (root / "notes.txt").write_text("not an array\n")
    (root / "empty").mkdir()
    return root


# -- zarr ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "spelled"),
    [
        ("zstd", "zstd(level=3, checksum=False)"),
        ("gzip", "gzip(level=4)"),
        ("blosc", "blosc(typesize=4, cname=zstd, clevel=5, shuffle=bitshuffle, blocksize=0)"),
    ],
)
def test_zarr_v3_facts_and_stored_bytes(samples, name, spelled):
    report = inspect_store(samples / f"{name}.zarr")
    a = report.root
    assert isinstance(a, ArrayReport) and report.kind == "zarr"
    assert (a.format, a.shape, a.dtype, a.chunks, a.shards) == (
        "zarr v3", (16, 24, 20), "float32", (8, 8, 10), None)  # fmt: skip
    assert a.codecs == ("bytes(endian=little)", spelled) and a.compressed
    assert (a.fill_value, a.order, a.layout, a.attributes) == (0.0, "C", "chunked", 0)
    files = chunk_files(samples / f"{name}.zarr")
    assert a.stored_bytes == sum(files.values()) and a.chunks_stored == len(files) == 12
    assert a.chunks_in_grid == 2 * 3 * 2 and a.chunks_missing == 0
    assert a.chunk_nbytes == 8 * 8 * 10 * 4 and a.nbytes == 16 * 24 * 20 * 4
    assert a.decoded_bytes == 12 * a.chunk_nbytes
    assert a.compression_ratio == pytest.approx(a.decoded_bytes / sum(files.values()))
    assert a.compression_ratio > 1


def test_sharded_zarr_counts_shards_and_inner_chunks(samples):
    a = inspect_store(samples / "sharded.zarr").root
    assert isinstance(a, ArrayReport)
    assert (a.layout, a.chunks, a.shards, a.fill_value) == ("sharded", (2, 2), (4, 4), -1)
    assert a.codecs == (
        "sharding_indexed(index_codecs=[bytes(endian=little) -> crc32c], index_location=end)",
    )
    assert a.inner_codecs == ("bytes(endian=little)", "zstd(level=0, checksum=False)")
    files = chunk_files(samples / "sharded.zarr")
    assert (a.shards_in_grid, a.shards_stored, a.stored_bytes) == (4, 1, sum(files.values()))
    assert (a.chunks_in_grid, a.chunks_stored, a.chunks_missing) == (16, 2, 14)
    assert a.decoded_bytes == 2 * 2 * 2 * 2  # two inner chunks of 2x2 int16
    assert "missing-chunks" in codes(a)
    assert "14 of 16 inner chunks never written" in render_report(
        inspect_store(samples / "sharded.zarr")
    )


@pytest.mark.parametrize(
    ("name", "compressor"),
    [("zlib", "zlib(level=5)"), ("bl", "blosc(cname=lz4, clevel=5, shuffle=shuffle, blocksize=0)")],
)
def test_zarr_v2_filters_compressor_and_order(samples, name, compressor):
    a = inspect_store(samples / f"v2_{name}.zarr").root
    assert isinstance(a, ArrayReport)
    assert a.format == "zarr v2" and a.order == "F"
    assert a.codecs == ("delta(dtype=<f8, astype=<f8)", compressor)
    files = chunk_files(samples / f"v2_{name}.zarr")
    assert a.stored_bytes == sum(files.values()) and a.chunks_stored == len(files) == 6
    # 12x10 float64 data in six 5x5 chunks: the edge chunks' padding is not data
    assert a.decoded_bytes == 6 * 5 * 5 * 8 and a.data_bytes == 12 * 10 * 8
    assert a.compression_ratio == pytest.approx(12 * 10 * 8 / sum(files.values()))


def test_nested_zarr_groups_form_a_tree(samples):
    report = inspect_store(samples / "tree.zarr")
    root = report.root
    assert isinstance(root, GroupReport) and root.attributes == 2
    assert [n.path for n in report.nodes()] == ["/", "/mask", "/raw", "/raw/volume"]
    raw, vol = report["raw"], report["/raw/volume"]
    assert isinstance(raw, GroupReport) and raw.attributes == 1
    assert isinstance(vol, ArrayReport) and vol.attributes == 1 and vol.name == "volume"
    assert (vol.chunks_stored, vol.chunks_in_grid, vol.chunks_missing) == (2, 4, 2)
    assert [a.path for a in report.arrays()] == ["/mask", "/raw/volume"]
    with pytest.raises(KeyError, match="'/nope' is not in the report"):
        report["/nope"]


def test_an_array_inside_a_store_is_inspected_directly(samples):
    report = inspect_store(samples / "tree.zarr" / "raw" / "volume")
    assert isinstance(report.root, ArrayReport)
    assert report.root.path == "/" and report.root.shape == (10, 10)
    assert report.root.stored_bytes == sum(chunk_files(samples / "tree.zarr/raw/volume").values())


def test_file_urls_are_local_paths(samples):
    report = inspect_store(f"file://{samples / 'gzip.zarr'}")
    assert report.root == inspect_store(samples / "gzip.zarr").root


# -- HDF5 ----------------------------------------------------------------------------------
def test_hdf5_filters_groups_and_storage(samples):
    report = inspect_store(samples / "scan.h5")
    assert report.kind == "hdf5"
    root = report.root
    assert isinstance(root, GroupReport) and root.attributes == 1
    paths = ["/", "/checked", "/deep", "/deep/er", "/deep/er/sparse", "/flat", "/gzip", "/lzf"]
    assert [n.path for n in report.nodes()] == paths
    assert [f.code for f in root.findings] == ["link-not-followed"]
    with h5py.File(samples / "scan.h5", "r") as f:
        for a in report.arrays():
            ds = f[a.path]
            assert a.stored_bytes == ds.id.get_storage_size()
            assert a.shape == ds.shape and a.dtype == str(ds.dtype) and a.format == "hdf5"
    gz, lzf, checked, flat = (report[p] for p in ("/gzip", "/lzf", "/checked", "/flat"))
    assert gz.codecs == ("shuffle", "gzip(level=6)") and gz.compressed
    assert gz.compression_ratio == pytest.approx(12 * 8 * 8 * 10 * 4 / gz.stored_bytes)
    assert "serial-decode" not in codes(gz)  # mixle decodes gzip + shuffle itself
    assert lzf.codecs == ("lzf",) and "serial-decode" in codes(lzf)
    assert checked.codecs == ("fletcher32",) and not checked.compressed
    assert "serial-decode" in codes(checked)
    assert (flat.layout, flat.chunks, flat.codecs, flat.compression_ratio) == (
        "contiguous", None, (), 1.0)  # fmt: skip
    sparse = report["/deep/er/sparse"]
    assert (sparse.fill_value, sparse.chunks_stored, sparse.chunks_in_grid) == (5, 1, 4)
    assert "missing-chunks" in codes(sparse)


def test_hdf5_szip_scaleoffset_and_unwritten_contiguous(tmp_path):
    path = tmp_path / "more.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("so", data=np.arange(400, dtype="i4").reshape(20, 20), chunks=(10, 10),
                         scaleoffset=0)  # fmt: skip
        f.create_dataset("never", shape=(30,), dtype="f8")
        if h5py.h5z.filter_avail(h5py.h5z.FILTER_SZIP):
            f.create_dataset("sz", data=np.arange(400, dtype="i4").reshape(20, 20),
                             chunks=(10, 10), compression="szip")  # fmt: skip
    report = inspect_store(path)
    assert report["/so"].codecs == ("scaleoffset(type=int, factor=0)",)
    never = report["/never"]
    assert never.stored_bytes == 0 and "missing-chunks" in codes(never)
    if "/sz" in [n.path for n in report.nodes()]:
        assert report["/sz"].codecs == ("szip(coding=nn, pixels_per_block=8)",)


# -- .npy ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "order", "dtype"), [("c", "C", "float32"), ("f", "F", "int32")])
def test_npy_header_only(samples, name, order, dtype):
    path = samples / f"{name}.npy"
    a = inspect_store(path, patch=(2, 3)).root
    assert isinstance(a, ArrayReport)
    assert (a.format, a.shape, a.dtype, a.order, a.chunks) == ("npy", (6, 5), dtype, order, None)
    assert a.stored_bytes == a.nbytes == 30 * 4 <= path.stat().st_size
    assert a.compression_ratio == 1.0 and a.findings == ()
    assert a.patch_cost is not None and a.patch_cost.read_amplification == 1.0


def test_truncated_npy_is_a_warning(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, np.zeros(100))
    path.write_bytes(path.read_bytes()[:-80])
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport) and [w.code for w in a.warnings] == ["truncated"]


# -- patch arithmetic ----------------------------------------------------------------------
def brute_chunks(extent: int, chunk: int, patch: int) -> float:
    starts = range(extent - patch + 1)
    return sum(len({i // chunk for i in range(s, s + patch)}) for s in starts) / len(starts)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(1, 70), st.data())
def test_expected_chunks_along_an_axis_equals_brute_force(extent, chunk, data):
    patch = data.draw(st.integers(1, extent))
    assert expected_chunks_along_axis(extent, chunk, patch) == pytest.approx(
        brute_chunks(extent, chunk, patch), rel=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_patch_cost_equals_enumerating_every_placement(data):
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 12)) for _ in range(ndim))
    chunks = tuple(data.draw(st.integers(1, 6)) for _ in range(ndim))
    patch = tuple(data.draw(st.integers(1, d)) for d in shape)
    counts = []
    for start in itertools.product(*(range(d - p + 1) for d, p in zip(shape, patch))):
        touched = itertools.product(
            *(range(s // c, (s + p - 1) // c + 1) for s, p, c in zip(start, patch, chunks))
        )
        counts.append(sum(1 for _ in touched))
    cost = patch_cost(shape, chunks, 4, patch)
    assert cost.chunks_touched == pytest.approx(np.mean(counts), rel=1e-12)
    assert cost.decoded_bytes == pytest.approx(np.mean(counts) * math.prod(chunks) * 4)
    assert cost.read_amplification == pytest.approx(cost.decoded_bytes / (math.prod(patch) * 4))


def test_huge_chunks_cost_nothing_to_cost():
    assert expected_chunks_along_axis(10**12, 10**12, 32) == 1.0
    chunk, patch = 10**11 + 7, 10**6
    whole_periods = 10 * chunk + patch - 1  # every start in 10 full periods: the closed form
    assert expected_chunks_along_axis(whole_periods, chunk, patch) == pytest.approx(
        (patch - 1) / chunk + 1, rel=1e-12
    )
    assert expected_chunks_along_axis(whole_periods + chunk // 2, chunk, patch) > 1


def test_patch_cost_far_from_edges_is_the_closed_form():
    cost = patch_cost((10_000, 10_000), (64, 128), 2, 32, shards=(256, 256))
    assert cost.patch == (32, 32)
    assert cost.chunks_touched == pytest.approx((31 / 64 + 1) * (31 / 128 + 1), rel=5e-3)
    assert cost.shards_touched == pytest.approx((31 / 256 + 1) ** 2, rel=5e-3)
    assert patch_cost((10, 10), None, 8, 3).read_amplification == 1.0


def test_patch_arguments_are_checked():
    assert parse_patch(4) == (4,) and parse_patch([2, 3]) == (2, 3) and parse_patch(None) is None
    with pytest.raises(ValueError, match=r"patch=\[2, 0\] must be one or more edges, each >= 1"):
        parse_patch([2, 0])
    with pytest.raises(TypeError, match="patch='4' must be an int or a sequence of ints"):
        parse_patch("4")
    with pytest.raises(ValueError, match=r"patch \(5, 5\) does not fit inside shape \(4, 9\)"):
        patch_cost((4, 9), (2, 2), 1, 5)
    with pytest.raises(ValueError, match="patch=7 must be between 1 and extent=6"):
        expected_chunks_along_axis(6, 2, 7)
    with pytest.raises(ValueError, match="chunk=0 must be >= 1"):
        expected_chunks_along_axis(6, 0, 2)


def test_patch_costs_in_the_report(samples):
    report = inspect_store(samples / "tree.zarr", patch=(3, 4))
    vol, mask = report["/raw/volume"], report["/mask"]
    assert vol.patch_cost == patch_cost((10, 10), (5, 5), 1, (3, 4))
    assert mask.patch_cost is None and "patch-not-costed" in codes(mask)
    note = next(f for f in mask.findings if f.code == "patch-not-costed")
    assert note.message == "no patch cost: patch (3, 4) has 2 axes, the array has 1"
    assert report.patch == (3, 4)


def test_suggested_chunks_are_power_of_two_cubes_capped_by_the_shape():
    assert suggest_chunks((512, 2048, 2048), 4) == (64, 64, 64)
    assert suggest_chunks((3, 4096, 4096), 4) == (3, 256, 256)
    assert suggest_chunks((10,), 8) == (10,)


# -- findings ------------------------------------------------------------------------------
def layout(tmp_path: Path, shape, chunks, dtype="float32", **kwargs) -> ArrayReport:
    """Report on a metadata-only zarr array (nothing written: no data cost)."""
    path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.zarr"
    patch = kwargs.pop("_patch", None)
    zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, **kwargs)
    root = inspect_store(path, patch=patch).root
    assert isinstance(root, ArrayReport)
    return root


def warning_codes(a: ArrayReport) -> set[str]:
    return {w.code for w in a.warnings}


def test_good_chunks_raise_no_warning(tmp_path):
    a = layout(tmp_path, (512, 512, 512), (64, 64, 64))
    assert a.warnings == () and codes(a) == {"missing-chunks"}
    assert layout(tmp_path, (3, 1024, 1024), (3, 128, 128)).warnings == ()  # channels whole


def test_small_chunks_warn_and_say_why(tmp_path):
    a = layout(tmp_path, (256, 256, 256), (8, 8, 8))
    assert warning_codes(a) == {"small-chunks"}
    message = a.warnings[0].message
    assert "2 KiB decoded (< 64 KiB)" in message and "one request and one decode call" in message
    assert f"{DEFAULT_PATCH_EDGE}^3 patch" in message and "rechunk to e.g. (64, 64, 64)" in message
    expected = patch_cost((256,) * 3, (8,) * 3, 4, DEFAULT_PATCH_EDGE).chunks_touched
    assert f"touches {expected:.3g} chunks" in message
    # a whole small array in one chunk is fine
    assert layout(tmp_path, (10, 10), (10, 10)).warnings == ()


def test_large_chunks_warn_with_the_cache_arithmetic(tmp_path):
    a = layout(tmp_path, (512, 512, 512), (256, 256, 256))
    assert warning_codes(a) == {"large-chunks"}
    message = a.warnings[0].message
    fits = DEFAULT_CHUNK_CACHE_BYTES // (256**3 * 4)
    assert f"64 MiB decoded (> {format_bytes(LARGE_CHUNK_BYTES)})" in message
    assert f"holds only {fits} such chunks" in message and fits == 4
    assert "DEFAULT_CHUNK_CACHE_BYTES" in message


def test_one_compressed_chunk_for_the_whole_array_warns(tmp_path):
    a = layout(tmp_path, (300, 300, 300), (300, 300, 300))
    assert warning_codes(a) == {"whole-array-chunk"}
    assert "every patch decodes all of it" in a.warnings[0].message


def test_slab_chunks_warn_for_3d_patches_not_for_2d_slices(tmp_path):
    a = layout(tmp_path, (512, 2048, 2048), (1, 2048, 2048))
    assert warning_codes(a) == {"slab-chunks"}
    message = a.warnings[0].message
    assert "touches 32 chunks along axis 0" in message
    assert "decoding 512 MiB for 128 KiB" in message and "rechunk to e.g. (64, 64, 64)" in message
    cost = patch_cost((512, 2048, 2048), (1, 2048, 2048), 4, 32)
    assert cost.chunks_per_axis == (32, 1, 1) and cost.read_amplification == 4096
    flat = layout(tmp_path, (512, 2048, 2048), (1, 2048, 2048), _patch=(1, 256, 256))
    assert "slab-chunks" not in warning_codes(flat)
    assert (
        layout(tmp_path, (64, 2048, 2048), (1, 2048, 2048), _patch=(1, 2048, 2048)).warnings == ()
    )


def test_read_amplification_warns_only_for_an_explicit_patch(tmp_path):
    a = layout(tmp_path, (512, 512, 512), (64, 64, 64), _patch=8)
    assert warning_codes(a) == {"read-amplification"}
    assert (
        "e.g. (32, 32, 32)" in a.warnings[0].message and "8.78x per axis" in a.warnings[0].message
    )
    for patch in (32, 48, 64):  # chunks up to about twice the patch edge are fine
        assert layout(tmp_path, (512, 512, 512), (64, 64, 64), _patch=patch).warnings == ()


def test_sharded_small_inner_chunks_mention_coalescing(tmp_path):
    a = layout(tmp_path, (256, 256, 256), (8, 8, 8), shards=(64, 64, 64))
    assert warning_codes(a) == {"small-chunks"}
    assert "merges neighbouring inner chunks" in a.warnings[0].message


def test_poor_compression_is_noted_and_good_compression_is_not(tmp_path):
    rng = np.random.default_rng(0)
    noise = zarr.create_array(str(tmp_path / "noise.zarr"), shape=(128, 256), chunks=(128, 128),
                              dtype="float32", compressors=ZstdCodec())  # fmt: skip
    noise[:] = rng.standard_normal((128, 256)).astype("float32")
    ramp = zarr.create_array(str(tmp_path / "ramp.zarr"), shape=(128, 256), chunks=(128, 128),
                             dtype="float32", compressors=ZstdCodec())  # fmt: skip
    ramp[:] = smooth((128, 256))
    assert "poor-compression" in codes(inspect_store(tmp_path / "noise.zarr").root)
    assert "poor-compression" not in codes(inspect_store(tmp_path / "ramp.zarr").root)


def test_thresholds_are_the_documented_constants():
    assert SMALL_CHUNK_BYTES == 64 * 1024 and LARGE_CHUNK_BYTES == 16 * 1024 * 1024
    assert DEFAULT_CHUNK_CACHE_BYTES == 256 * 1024 * 1024


# -- errors --------------------------------------------------------------------------------
def test_errors_name_the_path_and_what_was_expected(samples, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inspect_store(tmp_path / "missing.zarr")
    with pytest.raises(
        UnsupportedStoreError, match=r"is not a zarr store \(a folder or a \.zip\), an icechunk"
    ):
        inspect_store(samples / "notes.txt")
    with pytest.raises(UnsupportedStoreError, match=r"no zarr\.json, \.zarray, \.zgroup or N5"):
        inspect_store(samples / "empty")
    with pytest.raises(ValueError, match="storage_options only apply to URLs"):
        inspect_store(samples / "c.npy", storage_options={"anon": True})
    with pytest.raises(TypeError, match="path_or_url=3 must be a path or a URL string"):
        inspect_store(3)  # type: ignore[arg-type]
    broken = tmp_path / "broken.zarr"
    broken.mkdir()
    (broken / "zarr.json").write_text("{not json")
    with pytest.raises(UnsupportedStoreError, match=r"broken\.zarr/zarr\.json' is not valid JSON"):
        inspect_store(broken)


# -- CLI -----------------------------------------------------------------------------------
def test_cli_text_output_has_the_facts(samples, capsys):
    assert main(["inspect", str(samples / "tree.zarr"), "--patch", "2,5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{samples / 'tree.zarr'}  zarr v3 group, 2 attributes")
    assert "├── mask  zarr v3 array (4,) bool" in out
    assert "└── raw  zarr v3 group, 1 attribute" in out
    assert "    └── volume  zarr v3 array (10, 10) uint8" in out
    assert "chunks       (5, 5) = 25 B decoded; 4 in the grid, 2 stored, 2 missing" in out
    assert "patch        2x5: touches " in out and "read amplification" in out
    assert "info         2 of 4 chunks never written (50%)" in out


def test_cli_prints_warnings_and_still_succeeds(tmp_path, capsys):
    zarr.create_array(str(tmp_path / "slab.zarr"), shape=(64, 1024, 1024),
                      chunks=(1, 1024, 1024), dtype="float32")  # fmt: skip
    assert main(["inspect", str(tmp_path / "slab.zarr")]) == 0
    out = capsys.readouterr().out
    assert "warning      chunks (1, 1024, 1024) are slabs" in out


def test_cli_json_parses_and_has_the_facts(samples, capsys):
    assert main(["inspect", str(samples / "sharded.zarr"), "--json", "--patch", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "zarr" and data["patch"] == [3]
    root = data["root"]
    assert root["kind"] == "array" and root["shards"] == [4, 4] and root["chunks"] == [2, 2]
    assert root["chunks_stored"] == 2 and root["stored_bytes"] == sum(
        chunk_files(samples / "sharded.zarr").values()
    )
    assert root["patch_cost"]["patch"] == [3, 3]
    assert root["findings"][0]["code"] == "missing-chunks"


def test_cli_json_for_hdf5_tree(samples, capsys):
    assert main(["inspect", str(samples / "scan.h5"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in data["root"]["children"]]
    assert names == ["checked", "deep", "flat", "gzip", "lzf"]
    assert data["root"]["children"][3]["codecs"] == ["shuffle", "gzip(level=6)"]


def test_nan_fill_values_stay_valid_json(tmp_path, capsys):
    zarr.create_array(str(tmp_path / "nan.zarr"), shape=(4,), chunks=(2,), dtype="float32",
                      fill_value=float("nan"))  # fmt: skip
    assert main(["inspect", str(tmp_path / "nan.zarr"), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["root"]["fill_value"] == "NaN" and "NaN," not in out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing.zarr", "'{}' does not exist"),
        (
            "notes.txt",
            "'{}' is not a zarr store (a folder or a .zip), an icechunk repository, an N5 "
            "container, an HDF5 file, a TIFF, a NIfTI, a .b2nd, a .npz or a .npy file",
        ),
    ],
)
def test_cli_errors_exit_1_with_one_line(samples, capsys, target, message):
    path = str(samples / target)
    assert main(["inspect", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"mixle inspect: {message.format(path)}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect"],
        ["inspect", "x.zarr", "--patch", "0"],
        ["inspect", "x.zarr", "--patch", "a,b"],
        ["inspect", "x.zarr", "--storage-option", "novalue"],
    ],
)
def test_cli_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: mixle inspect" in capsys.readouterr().err


def test_storage_options_are_read_as_json_when_they_are_json():
    assert parse_storage_option("anon=true") == ("anon", True)
    assert parse_storage_option("block_size=1024") == ("block_size", 1024)
    assert parse_storage_option("profile=lab") == ("profile", "lab")
    assert parse_storage_option('client_kwargs={"endpoint_url": "http://x"}') == (
        "client_kwargs",
        {"endpoint_url": "http://x"},
    )
    with pytest.raises(ValueError, match="must look like KEY=VALUE"):
        parse_storage_option("=1")


def test_cli_in_a_subprocess(samples):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mixle.cli", "inspect", str(samples / "f.npy"), "--patch", "2"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "npy array (6, 5) int32" in done.stdout and "order F" in done.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "mixle.cli", "inspect", str(samples / "nope.h5")],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert failed.returncode == 1 and failed.stderr.startswith("mixle inspect: ")


def test_ascii_rendering_and_wrapping(samples):
    report = inspect_store(samples / "tree.zarr")
    plain = render_report(report, ascii=True)
    assert plain.isascii() and "`-- raw" in plain
    wrapped = render_report(report, width=60)
    lines = wrapped.splitlines()
    assert max(len(line) for line in lines[1:]) <= 60  # the title holds the whole path
    assert len(lines) > len(render_report(report).splitlines())
    assert all(line.startswith(("│", "├", "└")) for line in lines[1:8])  # the tree goes on


def test_inspect_never_changes_the_files(samples, tmp_path, capsys):
    before = snapshot(samples)
    for name in ["tree.zarr", "sharded.zarr", "v2_zlib.zarr", "scan.h5", "c.npy"]:
        inspect_store(samples / name, patch=2)
        assert main(["inspect", str(samples / name), "--json"]) == 0
    capsys.readouterr()
    assert snapshot(samples) == before


def test_importing_inspection_stays_cheap():
    code = (
        "import sys, json, mixle.inspection, mixle.cli.inspect; "
        "print(json.dumps([m for m in ('zarr', 'h5py', 'fsspec') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# -- remote --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http(samples) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(samples) as server:
        yield server


def local_facts(report) -> list[tuple]:
    return [
        (a.path, a.shape, a.chunks, a.shards, a.codecs, a.stored_bytes, a.chunks_stored)
        for a in report.arrays()
    ]


@pytest.mark.usefixtures("fast_retries")
@pytest.mark.parametrize("name", ["zstd.zarr", "sharded.zarr", "v2_bl.zarr", "scan.h5", "c.npy"])
def test_remote_over_http_equals_local(samples, http, name):
    remote = inspect_store(f"{http.url}/{name}")
    assert remote.location == f"{http.url}/{name}"
    assert local_facts(remote) == local_facts(inspect_store(samples / name))


@pytest.mark.usefixtures("fast_retries")
def test_remote_groups_need_consolidated_metadata_over_http(samples, http, tmp_path):
    report = inspect_store(f"{http.url}/tree.zarr")
    assert isinstance(report.root, GroupReport) and report.root.children == ()
    assert [f.code for f in report.root.findings] == ["members-unlisted"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated v3 metadata is not in the spec
        zarr.consolidate_metadata(str(samples / "tree.zarr"))
    try:
        report = inspect_store(f"{http.url}/tree.zarr")
        assert [a.path for a in report.arrays()] == ["/mask", "/raw/volume"]
        assert report["/raw/volume"].chunks_stored == 2
    finally:
        meta = json.loads((samples / "tree.zarr" / "zarr.json").read_text())
        meta.pop("consolidated_metadata", None)
        (samples / "tree.zarr" / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.usefixtures("fast_retries")
def test_remote_sizes_of_huge_unlistable_grids_are_unknown(http, samples, tmp_path):
    zarr.create_array(str(samples / "huge.zarr"), shape=(MAX_PROBED_OBJECTS + 1,), chunks=(1,),
                      dtype="uint8")  # fmt: skip
    a = inspect_store(f"{http.url}/huge.zarr").root
    assert isinstance(a, ArrayReport) and a.stored_bytes is None and a.compression_ratio is None
    assert "sizes-unknown" in codes(a)


@pytest.mark.usefixtures("fast_retries")
def test_remote_errors_over_http(http, capsys):
    assert main(["inspect", f"{http.url}/nope.zarr"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["inspect", f"{http.url}/notes.txt"]) == 1
    assert "is not a zarr store, an HDF5 file or a .npy file (the formats read over a URL)" in (
        capsys.readouterr().err
    )


@pytest.mark.usefixtures("fast_retries")
def test_a_failing_server_is_not_reported_as_a_missing_store(samples, capsys):
    # fsspec turns a 503 on its probes into False / FileNotFoundError: retried, then said
    with RangeHTTPServer(samples, FaultPlan(fail_every=1)) as server:
        assert main(["inspect", f"{server.url}/c.npy"]) == 1
        err = capsys.readouterr().err
        assert "does not exist" not in err and "failed after 5 tries" in err and "503" in err


@pytest.mark.usefixtures("fast_retries")
@pytest.mark.parametrize("name", ["c.npy", "scan.h5"])
def test_a_flaky_server_is_retried_while_probing_and_walking(samples, name):
    clean = FaultPlan()
    with RangeHTTPServer(samples, clean) as server:
        expected = local_facts(inspect_store(f"{server.url}/{name}"))
    flaky = FaultPlan(fail_every=4)  # a 503 in the probe, then in the metadata walk
    with RangeHTTPServer(samples, flaky) as server:
        assert local_facts(inspect_store(f"{server.url}/{name}")) == expected
    assert flaky.requests > clean.requests >= 4


@pytest.mark.usefixtures("fast_retries")
def test_s3_listing_sizes_and_storage_options_via_the_cli(samples, capsys):
    with MotoS3Server() as server:
        url = server.upload(samples / "tree.zarr", "mixle-inspect", "tree.zarr")
        argv = ["inspect", url, "--json"]
        for key, value in server.storage_options().items():
            argv += ["--storage-option", f"{key}={json.dumps(value)}"]
        assert main(argv) == 0
        data = json.loads(capsys.readouterr().out)
    volume = data["root"]["children"][1]["children"][0]
    assert volume["path"] == "/raw/volume" and volume["chunks_stored"] == 2
    assert volume["stored_bytes"] == sum(chunk_files(samples / "tree.zarr/raw/volume").values())
    assert MotoS3Server.SECRET not in json.dumps(data)


# -- unusual dtypes, shapes and headers ------------------------------------------------------
def test_structured_dtypes_are_reported_not_crashed_on(tmp_path):
    dt = np.dtype([("a", "<i4"), ("b", "<f8")])
    arr = zarr.create_array(str(tmp_path / "s.zarr"), shape=(4,), chunks=(2,), dtype=dt,
                            zarr_format=2)  # fmt: skip
    arr[:] = np.zeros(4, dtype=dt)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("compound", data=np.zeros(4, dtype=dt), chunks=(2,), compression="gzip")
    for report in (inspect_store(tmp_path / "s.zarr", patch=2), inspect_store(tmp_path / "c.h5")):
        a = report.arrays()[0]
        assert a.itemsize == 12 and a.nbytes == 48 and a.chunk_nbytes == 24
    cost = inspect_store(tmp_path / "s.zarr", patch=2).root.patch_cost
    assert cost is not None and cost.patch_bytes == 24


def test_arrays_with_an_empty_axis_have_no_patches(tmp_path, capsys):
    zarr.create_array(str(tmp_path / "e.zarr"), shape=(0, 10), chunks=(5, 5), dtype="f4")
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f.create_dataset("rows", shape=(0, 10), maxshape=(None, 10), chunks=(1, 10), dtype="f4")
    for path in (tmp_path / "e.zarr", tmp_path / "e.h5"):
        a = inspect_store(path, patch=2).arrays()[0]
        assert a.nbytes == 0 and a.chunks_in_grid == 0 and a.patch_cost is None
        empty = "no patch cost: shape (0, 10) is empty (an axis of length 0)"
        assert a.findings[0].message == empty
        assert main(["inspect", str(path)]) == 0
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"shape \(0, 10\) is empty"):
        patch_cost((0, 10), (5, 5), 4, 1)


def test_variable_length_dtypes_have_no_fixed_size(tmp_path, capsys):
    strings = zarr.create_array(str(tmp_path / "s.zarr"), shape=(4,), chunks=(2,), dtype=str)
    strings[:] = np.array(["a", "bb", "ccc", "d"])
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("names", data=["a", "bb"], dtype=h5py.string_dtype())
        f.create_dataset("unwritten", shape=(3,), dtype=h5py.vlen_dtype("i4"))
    np.save(tmp_path / "o.npy", np.array([1, "x"], dtype=object), allow_pickle=True)
    for path in (tmp_path / "s.zarr", tmp_path / "v.h5", tmp_path / "o.npy"):
        a = inspect_store(path, patch=1).arrays()[0]
        assert (a.itemsize, a.nbytes, a.decoded_bytes, a.patch_cost) == (None, None, None, None)
        assert "patch-not-costed" in codes(a)
        assert main(["inspect", str(path)]) == 0
        assert "whole array variable size" in capsys.readouterr().out
    unwritten = inspect_store(tmp_path / "v.h5")["/unwritten"]
    assert unwritten.stored_bytes == 0 and unwritten.decoded_bytes is None


def test_npy_format_3_headers_are_utf8(tmp_path):
    with open(tmp_path / "v3.npy", "wb") as fh:
        np.lib.format.write_array(fh, np.zeros(3, dtype=[("é", "<i4")]), version=(3, 0))
    with open(tmp_path / "v2.npy", "wb") as fh:
        np.lib.format.write_array(fh, np.zeros((2, 3), dtype=">f8"), version=(2, 0))
    v3 = inspect_store(tmp_path / "v3.npy").root
    assert v3.dtype == "[('é', '<i4')]" and v3.stored_bytes == 12
    v2 = inspect_store(tmp_path / "v2.npy").root
    assert (v2.dtype, v2.shape, v2.stored_bytes) == (">f8", (2, 3), 48)


@pytest.mark.usefixtures("fast_retries")
def test_remote_npy_reads_its_header_not_its_data(tmp_path):
    from mixle.inspection.locations import HEAD_READ_BYTES

    np.save(tmp_path / "big.npy", np.zeros((256, 1024), dtype="f4"))  # 1 MiB of data
    with RangeHTTPServer(tmp_path) as server:
        a = inspect_store(f"{server.url}/big.npy").root
        ranges = [r for method, _, r in server.faults.log if method == "GET" and r]
    assert a.shape == (256, 1024) and a.stored_bytes == 2**20
    ends = [int(r.split("-")[1]) for r in ranges]
    assert ends and max(ends) < HEAD_READ_BYTES + 16  # fsspec's default read-ahead: 5 MiB


def test_sharded_reader_counts_written_inner_chunks(samples):
    from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader

    reader = ShardedZarrReader.for_array(zarr.open_array(str(samples / "sharded.zarr"), mode="r"))
    assert reader is not None
    assert reader.inner_chunks_written([(0, 0), (0, 1), (1, 1)]) == 2
    index = reader.shard_indices([(0, 0)])[(0, 0)]
    assert index is not None and index.shape == (2, 2, 2)
    assert reader.shard_indices([(1, 1)]) == {(1, 1): None}


def test_slab_warning_only_when_the_suggested_chunks_read_less(tmp_path):
    # planar RGB: 3 one-channel chunks per patch, but the suggested (512, 512, 3) decodes more
    planar = layout(tmp_path, (2048, 2048, 3), (256, 256, 1), dtype="uint8")
    assert planar.warnings == ()
    slices = layout(tmp_path, (10000, 256, 256), (1, 256, 256))
    assert warning_codes(slices) == {"slab-chunks"}
    better = patch_cost((10000, 256, 256), (64, 64, 64), 4, 32)
    assert f"(read amplification {better.read_amplification:.3g}x)" in slices.warnings[0].message


# -- remote options ------------------------------------------------------------------------
def test_remote_file_systems_get_the_request_timeout_unless_the_user_set_one():
    import aiohttp

    from mixle.inspection.remote import child_url, timed_options
    from mixle.reading import retry_policy

    seconds = retry_policy().timeout
    given = {"client_kwargs": {"trust_env": True}}
    timed = timed_options("https://h/x.zarr", given)
    timeout = timed["client_kwargs"]["timeout"]
    assert isinstance(timeout, aiohttp.ClientTimeout)
    assert timeout.sock_connect == timeout.sock_read == seconds and timeout.total is None
    assert timed["client_kwargs"]["trust_env"] is True and given == {
        "client_kwargs": {"trust_env": True}
    }  # the user's dict is not changed
    own = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=3)}}
    assert timed_options("http://h/x.zarr", own) == own
    assert timed_options("http://h/x.zarr", {"timeout": 3}) == {"timeout": 3}
    s3 = timed_options("s3://b/x.zarr", {"config_kwargs": {"read_timeout": 7}})
    assert s3["config_kwargs"] == {"read_timeout": 7, "connect_timeout": seconds}
    assert timed_options("gs://b/x.zarr", None) == {}
    assert (
        child_url("http://u:p@h/v.h5?token=t", "zarr.json") == "http://u:p@h/v.h5/zarr.json?token=t"
    )
    assert child_url("http://h/v.zarr/", ".zarray") == "http://h/v.zarr/.zarray"
    assert child_url("bucket/v.zarr", "zarr.json") == "bucket/v.zarr/zarr.json"


def test_warnings_raised_while_inspecting_a_url_are_re_emitted_without_credentials(tmp_path):
    password = "PASS" + "W0RD"
    zarr.create_array(tmp_path / "v.zarr", shape=(4,), chunks=(2,), dtype="f4")[...] = 1
    zarr.create_array(tmp_path / "w.zarr", shape=(4,), chunks=(2,), dtype="f4", zarr_format=2)
    (tmp_path / "v.zarr" / ".zarray").write_text((tmp_path / "w.zarr" / ".zarray").read_text())
    with RangeHTTPServer(tmp_path) as server:
        url = server.url.replace("http://", f"http://user:{password}@") + "/v.zarr"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = inspect_store(url)
    assert report.root.shape == (4,)
    texts = [str(w.message) for w in caught]
    assert any("Zarr v3 will be used" in t for t in texts), texts
    assert not any(password in t for t in texts), texts
