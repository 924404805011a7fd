"""HDF5 types NumPy has no exact match for, and fill times: every read path equals h5py.

The files are written with h5py's low-level API (12-bit integers, bit offsets, odd float
layouts, fill times, an undefined fill value) and read back through every path of a mixle
source; the answer is always h5py's own read of the same file.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from h5py import h5d, h5p, h5s, h5t
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.arrays.hdf5.chunks import (
    HDF5ChunkReader,
    contiguous_memmap,
    decodable_filters,
    stores_numpy_bits,
)
from mixle.data.sources.arrays.hdf5.remote import RemoteHDF5ChunkReader
from mixle.inspection import inspect_store
from mixle.testing import check_array_source
from mixle.testing_servers import RangeHTTPServer

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

SHAPE = (6, 10, 9)
CHUNKS = (3, 4, 4)  # edge chunks on the last two axes are partial
PATCH = (2, 3, 4)
LAYOUTS = ("plain", "gzip", "shuffle-gzip", "contiguous")
#: (base type, precision, bit offset): the reduced-precision integers of the issue
REDUCED = {
    "i12": (h5t.STD_I16LE, 12, 0),
    "i12at4": (h5t.STD_I16LE, 12, 4),
    "u12": (h5t.STD_U16LE, 12, 0),
    "u12at4": (h5t.STD_U16LE, 12, 4),
}
#: keys h5py itself accepts, read through h5py and through the source
H5PY_KEYS: list[Any] = [
    (1,),
    (-1,),
    (slice(1, 5), 3),
    (Ellipsis, 2),
    (slice(0, 6, 2), slice(1, 9, 3), slice(None)),
    (4, slice(2, 7), -2),
    (slice(3, 6), slice(4, 10), slice(4, 9)),
]
#: box corners for read_boxes of size PATCH: chunk edges, the far corner, unwritten chunks
STARTS = [[0, 0, 0], [2, 3, 3], [4, 7, 5], [1, 6, 0], [3, 4, 4], [4, 0, 5]]


def _dcpl(layout: str, fill: Any = None, fill_time: int | None = None, dtype: Any = None) -> Any:
    dcpl = h5p.create(h5p.DATASET_CREATE)
    if layout != "contiguous":
        dcpl.set_chunk(CHUNKS)
        if "shuffle" in layout:
            dcpl.set_shuffle()
        if "gzip" in layout:
            dcpl.set_deflate(4)
    if fill is not None:
        dcpl.set_fill_value(np.array(fill, dtype=dtype))
    if fill_time is not None:
        dcpl.set_fill_time(fill_time)
    return dcpl


def _create(path: Path, htype: Any, dcpl: Any, name: str = "x") -> tuple[Any, Any]:
    file = h5py.File(path, "w")
    dsid = h5d.create(file.id, name.encode(), htype, h5s.create_simple(SHAPE), dcpl=dcpl)
    return file, h5py.Dataset(dsid)


def _reduced_type(kind: str) -> Any:
    base, precision, offset = REDUCED[kind]
    htype = base.copy()
    htype.set_precision(precision)
    htype.set_offset(offset)
    return htype


def _reduced_values(kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    signed = kind.startswith("i")
    lo, hi = (-2048, 2048) if signed else (0, 4096)
    data = rng.integers(lo, hi, size=SHAPE).astype("<i2" if signed else "<u2")
    data.flat[:3] = (-943, -1, 2047) if signed else (4095, 1, 2048)
    return data


def _write_reduced(path: Path, kind: str, layout: str) -> Path:
    file, ds = _create(path, _reduced_type(kind), _dcpl(layout))
    with file:
        ds[...] = _reduced_values(kind)
    return path


def _h5py_reads(path: Path | str, name: str = "x") -> tuple[np.ndarray, list[np.ndarray]]:
    with h5py.File(path, "r") as f:
        ds = f[name]
        return ds[...], [ds[key] for key in H5PY_KEYS]


def _box(corner: Any, size: Any) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(corner, size))


def assert_every_path_is_h5py(location: Path | str, local: Path, name: str = "x") -> None:
    """Every read path of ``read_hdf5(location, name)`` gives h5py's read of ``local``."""
    want, by_key = _h5py_reads(local, name)
    src = mixle.read_hdf5(location, name)
    assert src.dtype == want.dtype
    np.testing.assert_array_equal(src[...], want)
    for key, expected in zip(H5PY_KEYS, by_key):
        np.testing.assert_array_equal(src[key], expected, err_msg=f"key={key!r}")
    np.testing.assert_array_equal(src[::-2, 1::3, ::-1], want[::-2, 1::3, ::-1])
    boxes = src.read_boxes(STARTS, PATCH)
    for got, corner in zip(boxes, STARTS):
        np.testing.assert_array_equal(got, want[_box(corner, PATCH)], err_msg=f"box {corner}")
    np.testing.assert_array_equal(src.read_box([1, 2, 3], [5, 8, 6]), want[1:6, 2:10, 3:9])
    rows = np.array([5, 0, 3, 3, -1, 2])
    np.testing.assert_array_equal(src.get_batch(rows), want[rows])
    sampler = mixle.PatchSampler(src, PATCH, num_patches=16, seed=3)
    patches, corners = sampler.get_batch(np.arange(16))
    for patch, corner in zip(patches, corners):
        np.testing.assert_array_equal(patch, want[_box(corner, PATCH)], err_msg=f"{corner}")
    patch, corner = sampler[5]
    np.testing.assert_array_equal(patch, want[_box(corner, PATCH)])
    check_array_source(src, want)


# -- item 1: reduced precision and bit offsets ----------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", sorted(REDUCED))
def test_reduced_precision_integers_read_as_h5py_on_every_path(tmp_path, kind, layout):
    path = _write_reduced(tmp_path / "r.h5", kind, layout)
    want, _ = _h5py_reads(path)
    assert want.flat[0] == (-943 if kind.startswith("i") else 4095)  # h5py converts
    assert_every_path_is_h5py(path, path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reduced_precision_takes_no_fast_path(tmp_path, layout):
    path = _write_reduced(tmp_path / "r.h5", "i12at4", layout)
    with h5py.File(path, "r") as f:
        ds = f["x"]
        assert not stores_numpy_bits(ds)
        assert HDF5ChunkReader.for_dataset(ds) is None
        assert contiguous_memmap(ds) is None
        assert decodable_filters(ds) is None  # the gate the remote reader goes through
        assert RemoteHDF5ChunkReader.for_remote(ds, None, "x.h5", "x", "http://h/x.h5") is None


def test_a_reader_made_directly_refuses_a_reduced_precision_type(tmp_path):
    path = _write_reduced(tmp_path / "r.h5", "u12at4", "gzip")
    wrong = r"'/x'.*12-bit values at bit offset 4 in 2 bytes"
    with h5py.File(path, "r") as f, pytest.raises(TypeError, match=wrong):
        HDF5ChunkReader(f["x"], str(path), [(1, (4,))])


def _odd_float() -> Any:
    htype = h5t.IEEE_F32LE.copy()
    htype.set_ebias(100)  # IEEE layout, another exponent bias: h5py reads it as float64
    return htype


def _pad_one_int() -> Any:
    htype = h5t.STD_I32LE.copy()
    htype.set_pad(h5t.PAD_ONE, h5t.PAD_ONE)
    return htype


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["odd-float", "pad-one-int"])
def test_other_types_without_a_numpy_match_read_as_h5py(tmp_path, case, layout):
    htype = _odd_float() if case == "odd-float" else _pad_one_int()
    file, ds = _create(tmp_path / "t.h5", htype, _dcpl(layout))
    with file:
        ds[...] = np.random.default_rng(1).integers(-50, 50, size=SHAPE)
        assert HDF5ChunkReader.for_dataset(ds) is None
    assert_every_path_is_h5py(tmp_path / "t.h5", tmp_path / "t.h5")


def _enum_dtype() -> np.dtype:
    return h5py.enum_dtype({"a": -3, "b": 0, "c": 5, "d": 100}, basetype="i1")


#: types whose stored bits are their NumPy dtype's: these keep the fast paths
MATCHING = {
    "<i2": lambda: np.dtype("<i2"),
    ">i2": lambda: np.dtype(">i2"),
    ">f4": lambda: np.dtype(">f4"),
    "<f8": lambda: np.dtype("<f8"),
    "bool": lambda: np.dtype(bool),
    "enum": _enum_dtype,
    "<c8": lambda: np.dtype("<c8"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(MATCHING))
def test_matching_types_keep_the_fast_paths(tmp_path, name, layout):
    dtype = MATCHING[name]()
    rng = np.random.default_rng(2)
    if name == "enum":
        data = rng.choice(np.array([-3, 0, 5, 100], dtype="i1"), size=SHAPE)
    elif name == "bool":
        data = rng.random(SHAPE) > 0.5
    else:
        data = (rng.random(SHAPE) * 200 - 100).astype(dtype)
    chunks = None if layout == "contiguous" else CHUNKS
    shuffle = "shuffle" in layout
    compression = "gzip" if "gzip" in layout else None
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f.create_dataset(
            "x", data=data, dtype=dtype, chunks=chunks, compression=compression, shuffle=shuffle
        )
    with h5py.File(tmp_path / "m.h5", "r") as f:
        ds = f["x"]
        assert stores_numpy_bits(ds)
        if layout == "contiguous":
            assert contiguous_memmap(ds) is not None
        else:
            assert HDF5ChunkReader.for_dataset(ds) is not None
            assert RemoteHDF5ChunkReader.for_remote(ds, None, "m.h5", "x", "http://h/m.h5")
    src = mixle.read_hdf5(tmp_path / "m.h5", "x")
    fast = src._memmap_for(src.array) if layout == "contiguous" else src._reader_for(src.array)
    assert fast is not None
    src.close()
    assert_every_path_is_h5py(tmp_path / "m.h5", tmp_path / "m.h5")


# -- item 2: fill values and fill times ----------------------------------------------------

#: name: (fill time or None for HDF5's default, fill value or None for none set)
FILLS = {
    "never": (h5d.FILL_TIME_NEVER, 7),
    "never-no-value": (h5d.FILL_TIME_NEVER, None),
    "alloc": (h5d.FILL_TIME_ALLOC, 7),
    "alloc-no-value": (h5d.FILL_TIME_ALLOC, None),
    "ifset": (h5d.FILL_TIME_IFSET, 7),
    "ifset-no-value": (h5d.FILL_TIME_IFSET, None),
    "default": (None, None),
}


def _write_partly(path: Path, layout: str, fill_time: Any, fill: Any, dtype: str) -> Path:
    """Write two regions (one a partial chunk); the other chunks are never written."""
    file, ds = _create(path, h5t.py_create(np.dtype(dtype)), _dcpl(layout, fill, fill_time, dtype))
    with file:
        ds[0:3, 0:4, 0:4] = np.arange(48).reshape(3, 4, 4) + 100
        ds[3:5, 5:9, 6:9] = -np.arange(24).reshape(2, 4, 3) - 1
    return path


@pytest.mark.parametrize("dtype", ["<i2", "<f4"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fill", sorted(FILLS))
def test_unwritten_chunks_read_as_h5py_on_every_path(tmp_path, fill, layout, dtype):
    fill_time, value = FILLS[fill]
    path = _write_partly(tmp_path / "f.h5", layout, fill_time, value, dtype)
    want, _ = _h5py_reads(path)
    # h5py: the fill value, except with FILL_TIME_NEVER (HDF5 leaves its zeroed buffer)
    expected = 0 if fill_time == h5d.FILL_TIME_NEVER or value is None else value
    if layout != "contiguous":
        assert np.all(want[:3, 4:, :] == expected)
    assert_every_path_is_h5py(path, path)
    if layout != "contiguous":
        with h5py.File(path, "r") as f:
            assert HDF5ChunkReader.for_dataset(f["x"]) is not None


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fill", ["never", "alloc", "ifset", "default"])
def test_datasets_never_written_read_as_h5py(tmp_path, fill, layout):
    fill_time, value = FILLS[fill]
    file, _ds = _create(tmp_path / "e.h5", h5t.STD_I16LE, _dcpl(layout, value, fill_time, "<i2"))
    file.close()
    assert_every_path_is_h5py(tmp_path / "e.h5", tmp_path / "e.h5")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_early_allocation_with_fill_time_never_reads_as_h5py(tmp_path, layout):
    dcpl = _dcpl(layout, 7, h5d.FILL_TIME_NEVER, "<i2")
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    file, _ds = _create(tmp_path / "a.h5", h5t.STD_I16LE, dcpl)
    with file:
        file["after"] = np.arange(5)  # something stored behind the allocated space
    assert_every_path_is_h5py(tmp_path / "a.h5", tmp_path / "a.h5")


def _set_undefined_fill(dcpl: Any) -> None:
    """``H5Pset_fill_value(dcpl, type, NULL)``: h5py has no call for an undefined fill value."""
    hdf5 = ctypes.CDLL(h5py.defs.__file__)  # the HDF5 library h5py is linked against
    hdf5.H5Pset_fill_value.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    assert hdf5.H5Pset_fill_value(dcpl.id, h5t.STD_I16LE.id, None) >= 0
    assert dcpl.fill_value_defined() == h5d.FILL_VALUE_UNDEFINED


@pytest.mark.parametrize("layout", ["plain", "gzip"])
@pytest.mark.parametrize("fill_time", [h5d.FILL_TIME_IFSET, h5d.FILL_TIME_NEVER])
def test_undefined_fill_value_reads_as_h5py(tmp_path, fill_time, layout):
    dcpl = _dcpl(layout, fill_time=fill_time)
    _set_undefined_fill(dcpl)
    file, ds = _create(tmp_path / "u.h5", h5t.STD_I16LE, dcpl)
    with file:
        ds[0:3, 0:4, 0:4] = 9
    with h5py.File(tmp_path / "u.h5", "r") as f:
        assert HDF5ChunkReader.for_dataset(f["x"]) is None
        with pytest.raises(ValueError, match=r"'/x'.* undefined fill value"):
            HDF5ChunkReader(f["x"], str(tmp_path / "u.h5"), [])
    assert_every_path_is_h5py(tmp_path / "u.h5", tmp_path / "u.h5")


def test_undefined_fill_value_never_written_fails_like_h5py(tmp_path):
    dcpl = _dcpl("gzip", fill_time=h5d.FILL_TIME_IFSET)
    _set_undefined_fill(dcpl)
    file, _ds = _create(tmp_path / "u.h5", h5t.STD_I16LE, dcpl)
    file.close()
    with h5py.File(tmp_path / "u.h5", "r") as f, pytest.raises(OSError, match="no data"):
        f["x"][...]
    src = mixle.read_hdf5(tmp_path / "u.h5", "x")
    for read in (
        lambda: src[...],
        lambda: src.read_boxes(STARTS, PATCH),
        lambda: src.get_batch([0, 1]),
        lambda: mixle.PatchSampler(src, PATCH, num_patches=4).get_batch([0, 1]),
    ):
        with pytest.raises(OSError, match="no data"):
            read()


@pytest.mark.parametrize("fill", ["never", "alloc", "default"])
def test_inspect_reports_what_unwritten_chunks_read_as(tmp_path, fill):
    fill_time, value = FILLS[fill]
    path = _write_partly(tmp_path / "f.h5", "gzip", fill_time, value, "<i2")
    want, _ = _h5py_reads(path)
    (report,) = inspect_store(path).arrays()
    assert report.fill_value == want[0, 9, 8]  # a chunk never written, read by h5py
    assert f"read as the fill value {want[0, 9, 8].item()!r} " in report.findings[0].message


def test_inspect_reports_an_undefined_fill_value(tmp_path):
    dcpl = _dcpl("gzip", fill_time=h5d.FILL_TIME_IFSET)
    _set_undefined_fill(dcpl)
    file, _ds = _create(tmp_path / "u.h5", h5t.STD_I16LE, dcpl)
    file.close()
    (report,) = inspect_store(tmp_path / "u.h5").arrays()
    assert report.fill_value is None


# -- the same over HTTP (RemoteHDF5ChunkReader) --------------------------------------------


def test_remote_reads_equal_h5py_for_reduced_types_and_fill_times(tmp_path):
    _write_reduced(tmp_path / "r.h5", "i12at4", "gzip")
    _write_partly(tmp_path / "f.h5", "shuffle-gzip", h5d.FILL_TIME_NEVER, 7, "<i2")
    with RangeHTTPServer(tmp_path) as server:
        for name, remote in (("r.h5", False), ("f.h5", True)):
            src = mixle.read_hdf5(f"{server.url}/{name}", "x")
            assert isinstance(src._reader_for(src.array), RemoteHDF5ChunkReader) == remote
            src.close()
            assert_every_path_is_h5py(f"{server.url}/{name}", tmp_path / name)


# -- random boxes and keys -----------------------------------------------------------------


@pytest.fixture(scope="module")
def exact_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("exact")
    paths = {
        "i12at4-gzip": _write_reduced(root / "a.h5", "i12at4", "gzip"),
        "u12at4-contiguous": _write_reduced(root / "b.h5", "u12at4", "contiguous"),
        "u12-plain": _write_reduced(root / "c.h5", "u12", "plain"),
        "never-shuffle-gzip": _write_partly(
            root / "d.h5", "shuffle-gzip", h5d.FILL_TIME_NEVER, 7, "<i2"
        ),
    }
    # standard types, decoded by mixle: src[key] goes through the read planner
    values = np.random.default_rng(3).standard_normal(SHAPE).astype("<f4")
    with h5py.File(root / "e.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(4, 3, 5), compression="gzip", shuffle=True)
    with h5py.File(root / "f.h5", "w") as f:
        f.create_dataset("x", data=values.astype(">i8"), chunks=(5, 7, 2))
    paths["f4-shuffle-gzip"], paths["i8be-chunked"] = root / "e.h5", root / "f.h5"
    return {k: (p, _h5py_reads(p)[0]) for k, p in paths.items()}


@st.composite
def boxes(draw: Any) -> tuple[list[list[int]], list[int]]:
    size = [draw(st.integers(1, d)) for d in SHAPE]
    corner = st.tuples(*(st.integers(0, d - n) for d, n in zip(SHAPE, size)))
    starts = draw(st.lists(corner, min_size=1, max_size=6))
    return [list(s) for s in starts], size


def _slices(draw: Any, d: int) -> slice:
    start = draw(st.none() | st.integers(-d - 2, d + 2))
    stop = draw(st.none() | st.integers(-d - 2, d + 2))
    return slice(start, stop, draw(st.none() | st.sampled_from([1, 2, 3, -1, -2])))


@st.composite
def keys(draw: Any) -> tuple[Any, ...]:
    return tuple(
        draw(st.integers(-d, d - 1)) if draw(st.booleans()) else _slices(draw, d) for d in SHAPE
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.sampled_from(
        [
            "i12at4-gzip",
            "u12at4-contiguous",
            "u12-plain",
            "never-shuffle-gzip",
            "f4-shuffle-gzip",
            "i8be-chunked",
        ]
    ),
    box=boxes(),
    key=keys(),
)
def test_random_boxes_and_keys_equal_h5py(exact_files, which, box, key):
    path, want = exact_files[which]
    starts, size = box
    with mixle.read_hdf5(path, "x") as src:
        got = src.read_boxes(starts, size)
        for row, corner in zip(got, starts):
            np.testing.assert_array_equal(row, want[_box(corner, size)])
        np.testing.assert_array_equal(src[key], want[key])
        rows = [c[0] for c in starts]
        np.testing.assert_array_equal(src.get_batch(rows), want[rows])


# -- src[key] reads what read_boxes reads: one bounded path -----------------------------

BOMB = """
import json, sys
import mixle

def hwm():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1])

out = {}
with mixle.read_hdf5(sys.argv[1], "x") as src:
    src[-1:, -1:]
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    base = hwm()
    for how in ("getitem", "boxes"):
        try:
            src[0:1, 0:1] if how == "getitem" else src.read_boxes([[0, 0]], [1, 1])
        except Exception as exc:
            out[how] = [type(exc).__name__, str(exc)]
out["growth_kib"] = hwm() - base
print(json.dumps(out))
"""


def test_getitem_on_a_deflate_bomb_is_refused_like_read_boxes_in_bounded_memory(tmp_path):
    path = tmp_path / "bomb.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "x", shape=(1024, 512), chunks=(512, 256), dtype="<i4", compression="gzip"
        )
        ds[...] = 1
        ds.id.write_direct_chunk((0, 0), zlib.compress(bytes(256 << 20), 9))  # 256 MiB
    done = subprocess.run(
        [sys.executable, "-c", BOMB, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["getitem"] == out["boxes"]
    name, message = out["getitem"]
    assert name == "CorruptChunkError"
    assert "chunk (0, 0)" in message and "'/x'" in message
    assert "inflates past 524288 bytes" in message  # not "ends early"
    assert out["growth_kib"] < 64 * 1024  # a 256 MiB inflate was never made
