"""``mixle inspect`` tells the truth about stores as their writing libraries made them.

Each test writes data with zarr-python, numcodecs or h5py and checks the report against what
that library (or the bytes on disk) says: compression over real data bytes, virtual HDF5
datasets, stale consolidated metadata, legacy nested zarr v2 chunk files, non-finite fill
values, plugin filter names, netCDF-4 style dimension scales, and plural agreement.
"""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from mixle.cli import main
from mixle.cli._demo_report import layout_text, report_lines
from mixle.cli._demo_runs import RunStats
from mixle.cli.inspect import render_report
from mixle.data.sources.array_source import read_zarr
from mixle.inspection import ArrayReport, GroupReport, format_bytes, inspect_store
from mixle.inspection.formatting import count_text, fill_text, filter_label
from mixle.inspection.hdf5_files import _hdf5_filter

#: The name the Bitshuffle HDF5 plugin registers for filter 32008 (bshuf_h5filter.c, and
#: what hdf5plugin.Bitshuffle files report through h5py's get_filter).
BITSHUFFLE_REGISTERED_NAME = b"bitshuffle; see https://github.com/kiyo-masui/bitshuffle"


def stored_files(folder: Path) -> dict[str, int]:
    """Every object under a zarr array folder except metadata, and its size on disk."""
    meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
    return {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name not in meta
    }


def codes(node: ArrayReport | GroupReport) -> list[str]:
    return [f.code for f in node.findings]


def volume(shape: tuple[int, ...] = (50, 50, 50)) -> np.ndarray:
    """Compressible int16 data."""
    return (np.arange(math.prod(shape), dtype=np.int64).reshape(shape) % 61).astype("int16")


# -- compression ratio over the real data --------------------------------------------------
@pytest.mark.parametrize("edge", [16, 32, 64])
def test_zarr_ratio_is_array_bytes_over_stored_bytes_whatever_the_chunk_shape(tmp_path, edge):
    data = volume()
    path = tmp_path / f"v{edge}.zarr"
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=(edge,) * 3, dtype=data.dtype, compressors=ZstdCodec()
    )
    arr[:] = data
    stored = sum(stored_files(path).values())
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport)
    assert a.stored_bytes == stored
    assert a.data_bytes == zarr.open_array(str(path), mode="r").nbytes == data.nbytes
    assert a.compression_ratio == pytest.approx(data.nbytes / stored)
    grid = math.ceil(50 / edge) ** 3
    assert a.decoded_bytes == grid * edge**3 * 2  # decoding does pay the edge padding
    text = render_report(inspect_store(path))
    assert f"for {format_bytes(data.nbytes)} of data" in text and "= data / stored" in text


def test_zarr_ratio_counts_only_the_data_of_the_chunks_written(tmp_path):
    path = tmp_path / "part.zarr"
    arr = zarr.create_array(str(path), shape=(50, 50), chunks=(32, 32), dtype="int16")
    arr[:10, :] = 3  # the two chunks of the first row: 32x32 and a 32x18 edge chunk
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport) and a.chunks_stored == 2
    assert a.data_bytes == (32 * 32 + 32 * 18) * 2
    assert a.compression_ratio == pytest.approx(a.data_bytes / sum(stored_files(path).values()))


def test_sharded_zarr_ratio_counts_inner_chunk_data(tmp_path):
    path = tmp_path / "sh.zarr"
    arr = zarr.create_array(
        str(path), shape=(10, 10), chunks=(4, 4), shards=(8, 8), dtype="int16", fill_value=0
    )
    arr[8:, :] = 5  # the last row of shards: inner chunks (2, 0), (2, 1), (2, 2) of 2 rows
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport) and a.chunks_stored == 3
    assert a.data_bytes == 2 * (4 + 4 + 2) * 2
    assert a.compression_ratio == pytest.approx(a.data_bytes / sum(stored_files(path).values()))


@pytest.mark.parametrize("edge", [16, 32, 48])
def test_hdf5_ratio_is_data_bytes_over_storage_size(tmp_path, edge):
    data = volume()
    path = tmp_path / f"v{edge}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=data, chunks=(edge,) * 3, compression="gzip")
        f.create_dataset("part", shape=(50, 50), chunks=(32, 32), dtype="int16")[:10, :] = 1
    with h5py.File(path, "r") as f:
        whole, part = f["v"].id.get_storage_size(), f["part"].id.get_storage_size()
    report = inspect_store(path)
    v, p = report["/v"], report["/part"]
    assert isinstance(v, ArrayReport) and isinstance(p, ArrayReport)
    assert v.data_bytes == data.nbytes
    assert v.compression_ratio == pytest.approx(data.nbytes / whole)
    assert p.chunks_stored == 2 and p.data_bytes == (32 * 32 + 32 * 18) * 2
    assert p.compression_ratio == pytest.approx(p.data_bytes / part)


# -- virtual HDF5 datasets -----------------------------------------------------------------
def test_virtual_hdf5_dataset_is_reported_with_its_sources_not_as_missing(tmp_path):
    for k in range(2):
        with h5py.File(tmp_path / f"part{k}.h5", "w") as f:
            f["data"] = np.full((4, 6), k + 1, dtype="float32")
    layout = h5py.VirtualLayout(shape=(8, 6), dtype="float32")
    for k in range(2):
        layout[4 * k : 4 * k + 4] = h5py.VirtualSource(
            str(tmp_path / f"part{k}.h5"), "data", (4, 6)
        )
    with h5py.File(tmp_path / "vds.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    with h5py.File(tmp_path / "vds.h5", "r") as f:
        expected = tuple(f"{m.file_name}:{m.dset_name}" for m in f["v"].virtual_sources())
        assert f["v"].is_virtual and f["v"][:].min() == 1  # h5py reads it from the parts
    report = inspect_store(tmp_path / "vds.h5")
    v = report["/v"]
    assert isinstance(v, ArrayReport) and v.layout == "virtual"
    assert v.virtual_sources == expected and len(expected) == 2
    assert "missing-chunks" not in codes(v) and "virtual" in codes(v)
    assert v.stored_bytes is None and v.compression_ratio is None
    text = render_report(report)
    assert "never written" not in text and "virtual" in text
    assert all(source in text for source in expected)
    assert json.loads(json.dumps(report.to_dict()))["root"]["children"][0]["virtual_sources"]


# -- stale consolidated zarr metadata ------------------------------------------------------
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stale_consolidated_metadata_shows_the_real_shape_and_warns(tmp_path, zarr_format):
    path = tmp_path / "g.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    group.create_array("a", shape=(10,), chunks=(4,), dtype="float32")[:] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that v2/v3 consolidation is not in spec
        zarr.consolidate_metadata(str(path))
    zarr.open_array(str(path / "a"), mode="a").resize((20,))  # without reconsolidating
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert zarr.open_group(str(path), mode="r")["a"].shape == (10,)  # zarr: the stale one
    real = zarr.open_array(str(path / "a"), mode="r").shape
    assert real == (20,) and read_zarr(path, "a").shape == real
    report = inspect_store(path)
    a = report["/a"]
    assert isinstance(a, ArrayReport) and a.shape == real and a.chunks_in_grid == 5
    (stale,) = [f for f in a.findings if f.code == "stale-consolidated-metadata"]
    assert stale.severity == "warning"
    assert "zarr.consolidate_metadata" in stale.message and "(10,)" in stale.message
    assert "(20,)" in stale.message
    assert "zarr.consolidate_metadata" in render_report(report)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(path))  # the fix it names
    assert "stale-consolidated-metadata" not in codes(inspect_store(path)["/a"])


# -- legacy nested zarr v2 chunk files -----------------------------------------------------
def _legacy_nested(path: Path) -> None:
    """A zarr v2 array with nested chunk files and no dimension_separator (zarr 2.x style)."""
    arr = zarr.create_array(
        str(path),
        shape=(4, 4),
        chunks=(2, 2),
        dtype="int32",
        fill_value=0,
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    arr[:] = 7
    meta = json.loads((path / ".zarray").read_text())
    del meta["dimension_separator"]  # as zarr 2's NestedDirectoryStore left it
    (path / ".zarray").write_text(json.dumps(meta))


def test_nested_v2_chunk_files_without_dimension_separator_are_warned_with_the_fix(tmp_path):
    path = tmp_path / "nested.zarr"
    _legacy_nested(path)
    assert sorted(stored_files(path)) == ["0/0", "0/1", "1/0", "1/1"]
    assert not zarr.open_array(str(path), mode="r")[:].any()  # zarr reads only fill values
    before = (path / ".zarray").read_bytes()
    report = inspect_store(path)
    a = report.root
    assert isinstance(a, ArrayReport) and a.chunks_stored == 0
    (nested,) = [f for f in a.findings if f.code == "nested-chunks-ignored"]
    assert nested.severity == "warning" and "4 of 4 chunks" in nested.message
    assert '"dimension_separator": "/"' in nested.message and ".zarray" in nested.message
    assert "missing-chunks" not in codes(a)
    assert "never written" not in render_report(report)
    assert (path / ".zarray").read_bytes() == before  # inspect never writes
    meta = json.loads(before)
    meta["dimension_separator"] = "/"  # the fix it names
    (path / ".zarray").write_text(json.dumps(meta))
    assert (zarr.open_array(str(path), mode="r")[:] == 7).all()
    fixed = inspect_store(path).root
    assert isinstance(fixed, ArrayReport) and fixed.chunks_stored == 4
    assert "nested-chunks-ignored" not in codes(fixed)


def test_flat_v2_chunk_files_are_not_mistaken_for_nested(tmp_path):
    path = tmp_path / "flat.zarr"
    zarr.create_array(str(path), shape=(4, 4), chunks=(2, 2), dtype="int32", zarr_format=2)[:] = 1
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport) and a.chunks_stored == 4 and a.findings == ()


# -- fill values as NumPy prints them ------------------------------------------------------
@pytest.mark.parametrize(("fill", "shown"), [(np.nan, "nan"), (-np.inf, "-inf"), (np.inf, "inf")])
def test_non_finite_fill_values_print_like_numpy(tmp_path, fill, shown):
    zarr.create_array(
        str(tmp_path / "v3.zarr"), shape=(4,), chunks=(2,), dtype="f4", fill_value=fill
    )
    zarr.create_array(
        str(tmp_path / "v2.zarr"),
        shape=(4,),
        chunks=(2,),
        dtype="f8",
        fill_value=fill,
        zarr_format=2,
    )
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("x", shape=(4,), chunks=(2,), dtype="f4", fillvalue=fill)
    assert str(np.float32(fill)) == shown
    for name in ("v3.zarr", "v2.zarr", "f.h5"):
        report = inspect_store(tmp_path / name)
        text = render_report(report)
        assert f"fill         {shown};" in text and "'NaN'" not in text and "Infinity" not in text
        assert f"fill value {shown} without any I/O" in text
        json.dumps(report.to_dict(), allow_nan=False)  # the JSON stays strict


def test_fill_text_keeps_strings_and_spells_complex_like_numpy():
    assert fill_text("NaN", "<U3") == "'NaN'"  # a string array's fill is a string
    assert fill_text(["NaN", 1.0], "complex64") == str(np.complex64(complex(np.nan, 1)))
    assert fill_text(0, "int16") == "0" and fill_text(None, "float32") == "none"


# -- plugin filter names -------------------------------------------------------------------
def test_bitshuffle_filter_is_named_without_its_url(tmp_path):
    path = tmp_path / "bs.h5"
    with h5py.File(path, "w") as f:  # Bitshuffle (lz4) as hdf5plugin.Bitshuffle() sets it
        f.create_dataset(
            "x",
            data=np.arange(1000, dtype="int16").reshape(10, 100),
            chunks=(5, 50),
            compression=32008,
            compression_opts=(0, 0, 0, 0, 2),
            allow_unknown_filter=True,
        )
    with h5py.File(path, "r") as f:
        code, _flags, values, _name = f["x"].id.get_create_plist().get_filter(0)
    a = inspect_store(path)["/x"]
    assert isinstance(a, ArrayReport) and a.codecs == ("bitshuffle(block_size=0, compression=lz4)",)
    assert a.compressed
    spelled = _hdf5_filter(code, values, BITSHUFFLE_REGISTERED_NAME)
    assert spelled == "bitshuffle(block_size=0, compression=lz4)" and "http" not in spelled
    assert _hdf5_filter(32008, (0, 3, 2, 0, 0), b"") == "bitshuffle(block_size=0, compression=none)"
    assert (
        _hdf5_filter(32999, (1,), BITSHUFFLE_REGISTERED_NAME) == "bitshuffle(id=32999, values=[1])"
    )


@pytest.mark.parametrize(
    ("registered", "shown"),
    [
        (BITSHUFFLE_REGISTERED_NAME, "bitshuffle"),
        (
            b"HDF5 lz4 filter; see http://www.hdfgroup.org/services/contributions.html",
            "HDF5 lz4 filter",
        ),
        (b"Zstandard compression: http://www.zstd.net", "Zstandard compression"),
        (b"blosc", "blosc"),
        (b"", "filter"),
    ],
)
def test_filter_label_drops_the_url(registered, shown):
    assert filter_label(registered) == shown


# -- netCDF-4 dimension-only variables -----------------------------------------------------
def test_dimension_scales_without_values_are_listed_as_dimensions(tmp_path):
    path = tmp_path / "nc4.h5"
    with h5py.File(path, "w") as f:  # what netCDF-4 writes for dimensions x (no values), t
        x = f.create_dataset("x", shape=(6,), dtype="float32")
        # netCDF-C: H5DSset_scale(id, "%s%10d" % (DIM_WITHOUT_VARIABLE, len)) sets this NAME
        x.make_scale("This is a netCDF dimension but not a netCDF variable.         6")
        t = f.create_dataset("t", data=np.arange(3, dtype="float64"))
        t.make_scale("t")  # a coordinate variable: it has values
        temp = f.create_dataset("temp", data=np.ones((3, 6), dtype="float32"))
        temp.dims[0].attach_scale(t)
        temp.dims[1].attach_scale(x)
    with h5py.File(path, "r") as f:
        assert h5py.h5ds.is_scale(f["x"].id) and f["x"].id.get_storage_size() == 0
    report = inspect_store(path)
    assert [a.path for a in report.arrays()] == ["/t", "/temp"]
    assert isinstance(report.root, GroupReport)
    (dims,) = [f for f in report.root.findings if f.code == "dimension-scales"]
    assert "1 dimension without values" in dims.message and "x (6)" in dims.message
    text = render_report(report)
    assert "never written" not in text and "x (6)" in text


# -- the demo and plural agreement ---------------------------------------------------------
def test_memmap_demo_says_unchunked_raw(tmp_path, monkeypatch, capsys):
    assert layout_text("memmap", (64, 64, 64)) == "unchunked (raw)"
    assert layout_text("zarr", (64, 64, 64)) == "chunks (64, 64, 64)"
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(tmp_path)
    argv = ["demo", "--backend", "memmap", "--size", "48", "--patch", "8", "--batch-size", "8"]
    assert main([*argv, "--num-patches", "16", "--no-jax", "--no-png"]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if "on disk" in s)
    assert "unchunked (raw)" in line and "chunks (" not in line


def test_counts_agree_with_their_nouns(tmp_path):
    assert [count_text(n, "chunk") for n in (0, 1, 1.0, 2, 4.08)] == [
        "0 chunks", "1 chunk", "1 chunk", "2 chunks", "4.08 chunks"]  # fmt: skip
    path = tmp_path / "one.zarr"
    zarr.create_array(str(path), shape=(8, 8), chunks=(8, 8), dtype="uint8", fill_value=0)
    text = render_report(inspect_store(path, patch=4))
    assert "touches 1 chunk," in text and "1 of 1 chunk never written (100%): it reads" in text
    assert "1 chunks" not in text
    runs = [RunStats("grid", 8, 1, 8, 1.0, 1, 1, 100.0, {"tiles": 1, "checksum_ok": True})]
    lines = " ".join(report_lines(runs, volume_mib=1, cache_mib=64, backend="zarr"))
    assert "1 tile covers the volume; its voxel checksum" in lines and "1 tiles" not in lines


# -- arrays stored after the metadata was consolidated -------------------------------------
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_arrays_added_after_consolidation_are_reported_and_warned(tmp_path, zarr_format):
    path = tmp_path / "g.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    group.create_array("a", shape=(4,), chunks=(4,), dtype="int8")[:] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that v2/v3 consolidation is not in spec
        zarr.consolidate_metadata(str(path))
        later = zarr.open_group(str(path), mode="a", use_consolidated=False)
        later.create_array("b", shape=(6,), chunks=(3,), dtype="int8")[:] = 2
        assert "b" not in zarr.open_group(str(path), mode="r")  # zarr: the stale listing
    truth = zarr.open_array(str(path / "b"), mode="r")
    assert (truth[:] == 2).all()
    report = inspect_store(path)
    assert [a.path for a in report.arrays()] == ["/a", "/b"]
    b = report["/b"]
    assert isinstance(b, ArrayReport) and b.shape == truth.shape and b.chunks == truth.chunks
    assert b.chunks_stored == 2 and b.dtype == str(truth.dtype)
    assert isinstance(report.root, GroupReport)
    (stale,) = [f for f in report.root.findings if f.code == "stale-consolidated-metadata"]
    assert stale.severity == "warning"
    assert "not in the consolidated metadata: b" in stale.message
    assert "zarr.consolidate_metadata" in stale.message
    assert "not in the consolidated metadata: b" in render_report(report)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(path))  # the fix it names
    fixed = inspect_store(path)
    assert [a.path for a in fixed.arrays()] == ["/a", "/b"]
    assert isinstance(fixed.root, GroupReport) and fixed.root.findings == ()


# -- dimension scales that do hold values --------------------------------------------------
def test_scales_without_the_netcdf_marker_are_listed_as_arrays(tmp_path):
    path = tmp_path / "scales.h5"
    with h5py.File(path, "w") as f:
        lat = f.create_dataset("lat", shape=(3,), dtype="float32", fillvalue=7.5)
        lat.make_scale("lat")  # never written: reads as its fill value
        time = f.create_dataset("time", shape=(0,), maxshape=(None,), dtype="float64")
        time.make_scale("time")  # a real coordinate variable, empty for now
        v = f.create_dataset("v", data=np.zeros((0, 3), dtype="float32"), maxshape=(None, 3))
        v.dims[0].attach_scale(time)
        v.dims[1].attach_scale(lat)
    with h5py.File(path, "r") as f:
        assert (f["lat"][...] == 7.5).all() and f["lat"].id.get_storage_size() == 0
        assert f["time"].shape == (0,) and h5py.h5ds.is_scale(f["time"].id)
    report = inspect_store(path)
    assert [a.path for a in report.arrays()] == ["/lat", "/time", "/v"]
    lat_report = report["/lat"]
    assert isinstance(lat_report, ArrayReport) and lat_report.shape == (3,)
    assert lat_report.fill_value == 7.5
    time_report = report["/time"]
    assert isinstance(time_report, ArrayReport) and time_report.shape == (0,)
    assert isinstance(report.root, GroupReport)
    assert "dimension-scales" not in codes(report.root)
    assert "without values" not in render_report(report)


@pytest.mark.parametrize("spelled", [False, True])
def test_nested_chunk_warning_names_keys_of_the_arrays_rank_and_the_right_fix(tmp_path, spelled):
    path = tmp_path / "nested.zarr"
    _legacy_nested(path)  # 2-D: chunk files 0/0 ... 1/1
    if spelled:  # zarr 3 writes the separator out: "dimension_separator": "."
        meta = json.loads((path / ".zarray").read_text())
        meta["dimension_separator"] = "."
        (path / ".zarray").write_text(json.dumps(meta))
    assert not zarr.open_array(str(path), mode="r")[:].any()  # zarr reads only fill values
    a = inspect_store(path).root
    assert isinstance(a, ArrayReport)
    (nested,) = [f for f in a.findings if f.code == "nested-chunks-ignored"]
    assert "such as 0/0," in nested.message and "looks for 0.0 " in nested.message
    assert "0/0/0" not in nested.message and "0.0.0" not in nested.message
    if spelled:
        assert 'says "dimension_separator": "."' in nested.message
        assert 'set "dimension_separator" to "/"' in nested.message
        assert "has no" not in nested.message and "add " not in nested.message
    else:
        assert 'add "dimension_separator": "/" to .zarray' in nested.message
    meta = json.loads((path / ".zarray").read_text())
    meta["dimension_separator"] = "/"  # the fix it names, either way
    (path / ".zarray").write_text(json.dumps(meta))
    assert (zarr.open_array(str(path), mode="r")[:] == 7).all()


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_members_added_after_consolidation_are_found_in_subgroups_too(tmp_path, zarr_format):
    path = tmp_path / "g.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    group.create_group("s").create_array("a", shape=(2,), dtype="int8")[:] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that v2/v3 consolidation is not in spec
        zarr.consolidate_metadata(str(path))
        later = zarr.open_group(str(path), mode="a", use_consolidated=False)
        later["s"].create_array("b", shape=(3,), dtype="int8")[:] = 2
        later.create_group("t").create_array("c", shape=(5,), dtype="int8")[:] = 3
    assert zarr.open_array(str(path / "t" / "c"), mode="r").shape == (5,)
    report = inspect_store(path)
    assert [a.path for a in report.arrays()] == ["/s/a", "/s/b", "/t/c"]
    c = report["/t/c"]
    assert isinstance(c, ArrayReport) and c.shape == (5,) and c.chunks_stored == 1
    for where, name in (("/", "t"), ("/s", "b")):
        node = report[where] if where != "/" else report.root
        assert isinstance(node, GroupReport)
        (stale,) = [f for f in node.findings if f.code == "stale-consolidated-metadata"]
        assert f"not in the consolidated metadata: {name} " in stale.message
