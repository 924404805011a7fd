"""``read_zarr``/``read_hdf5(..., mask_and_scale=True)`` equal xarray's decode on every read path.

Stores are written by xarray itself (``to_zarr`` format 2 and 3, ``to_netcdf`` with the
netCDF4 and h5netcdf engines; chunked, sharded and compressed, contiguous, big-endian), and every
read path of mixle (keys, boxes, batches, records, patches, pickle) is compared, values and
dtype, with ``xr.open_dataset(..., mask_and_scale=True, decode_times=False)``. With the
default ``mask_and_scale=False`` a source reads the stored values, as zarr and h5py do, and
warns once that they are packed.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.array_source import read_hdf5, read_zarr
from mixle.data.sources.arrays.cf import PackedVariableWarning
from mixle.data.sources.arrays.cf_reader import CFChunkReader
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.testing import assert_unchanged, check_array_source

xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")
pytest.importorskip("netCDF4")
pytest.importorskip("h5netcdf")

SHAPE = (7, 13, 5)
CHUNKS = (3, 4, 5)
#: Variables and how xarray packs them (the int16 one is the issue's own example).
ENCODINGS: dict[str, dict[str, Any]] = {
    "packed": {"dtype": "int16", "scale_factor": 0.1, "add_offset": 5, "_FillValue": -999},
    "unsigned": {"dtype": "i1", "_Unsigned": "true", "_FillValue": 255},
    "single": {
        "dtype": ">i2",
        "scale_factor": np.float32(0.25),
        "add_offset": np.float32(1),
        "_FillValue": 32767,
    },
    "masked": {"dtype": "int32", "_FillValue": -1},
    "missing": {"dtype": "uint16", "missing_value": 65535, "scale_factor": 0.5},
}
WRITERS = ["zarr2", "zarr3", "zarr3-sharded", "netcdf4", "h5netcdf", "contiguous"]
PATCH = (3, 5, 4)


def dataset() -> Any:
    rng = np.random.default_rng(21)
    data = rng.normal(10, 20, SHAPE).round(1)
    data[0, 0, 0] = np.nan
    data[3, 5, :] = np.nan
    counts = rng.integers(0, 250, SHAPE).astype("float64")
    counts[1, 2, 3] = counts[6, 12, 4] = np.nan
    dims = ("z", "y", "x")
    return xr.Dataset(
        {
            "packed": (dims, data),
            "unsigned": (dims, counts),
            "single": (dims, data.astype("float32")),
            "masked": (dims, counts),
            "missing": (dims, counts),
            "plain": (dims, data),
        }
    )


def write(root: Path, writer: str) -> Path:
    ds = dataset()
    if writer.startswith("zarr"):
        path = root / f"{writer}.zarr"
        shards = {"shards": (6, 8, 5)} if writer.endswith("sharded") else {}
        enc = {k: dict(v, chunks=CHUNKS, **shards) for k, v in ENCODINGS.items()}
        ds.to_zarr(path, encoding=enc, zarr_format=int(writer[4]), consolidated=False)
        return path
    path = root / f"{writer}.nc"
    if writer == "netcdf4":
        enc = {k: dict(v, chunksizes=CHUNKS, zlib=True, shuffle=True) for k, v in ENCODINGS.items()}
    elif writer == "h5netcdf":
        enc = {k: dict(v, chunksizes=CHUNKS, compression="gzip") for k, v in ENCODINGS.items()}
    else:
        enc = {k: dict(v, contiguous=True) for k, v in ENCODINGS.items()}
    ds.to_netcdf(path, engine="h5netcdf" if writer == "h5netcdf" else "netcdf4", encoding=enc)
    return path


@pytest.fixture(scope="module")
def cf_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray's notes on consolidated metadata
        return {writer: write(root, writer) for writer in WRITERS}


def xarray_values(path: Path, name: str) -> np.ndarray:
    zarr_store = path.suffix == ".zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_dataset(
            path,
            engine="zarr" if zarr_store else "netcdf4",
            mask_and_scale=True,
            decode_times=False,
            **({"consolidated": False} if zarr_store else {}),
        ) as ds:
            return np.asarray(ds[name].values)


def region(start: Any) -> tuple[slice, ...]:
    return tuple(slice(int(a), int(a) + n) for a, n in zip(start, PATCH))


def open_source(path: Path, name: str, **kw: Any) -> ZarrArraySource | HDF5ArraySource:
    if path.suffix == ".zarr":
        return read_zarr(str(path), name, **kw)
    return read_hdf5(str(path), name, **kw)


def stored_values(path: Path, name: str) -> np.ndarray:
    if path.suffix == ".zarr":
        return np.asarray(zarr.open_array(str(path), path=name, mode="r")[...])
    with h5py.File(path, "r") as f:
        return np.asarray(f[name][...])


@pytest.mark.parametrize("name", [*ENCODINGS, "plain"])
@pytest.mark.parametrize("writer", WRITERS)
def test_every_read_path_equals_xarrays_decode(cf_stores, writer: str, name: str) -> None:
    path = cf_stores[writer]
    want = xarray_values(path, name)
    with assert_unchanged(path):
        src = open_source(path, name, mask_and_scale=True)
        assert src.dtype == want.dtype and src.element_spec().dtype == want.dtype
        starts = [[0, 0, 0], [4, 8, 1], [2, 3, 0], [4, 8, 1]]
        boxes = src.read_boxes(starts, PATCH)
        for box, start in zip(boxes, starts):
            np.testing.assert_array_equal(
                box, want[tuple(slice(a, a + n) for a, n in zip(start, PATCH))]
            )
        out = np.empty((len(starts), *PATCH), dtype=want.dtype)
        assert src.read_boxes(starts, PATCH, out=out) is out
        np.testing.assert_array_equal(src.get_batch([6, 0, 3, 3]), want[[6, 0, 3, 3]])
        np.testing.assert_array_equal(np.stack(list(src.records())), want)
        np.testing.assert_array_equal(src[::-2, 3:11:3, -1], want[::-2, 3:11:3, -1])
        np.testing.assert_array_equal(src[[5, 1, 5]], want[[5, 1, 5]])
        assert np.array_equal(src[0, 0, 0], want[0, 0, 0], equal_nan=True)
        patches, coords = PatchSampler(src, PATCH, num_patches=8, seed=4).get_batch(range(8))
        for patch, corner in zip(patches, coords):
            np.testing.assert_array_equal(patch, want[region(corner)])
        check_array_source(src, want)  # keys, batches, boxes, records, pickle round trip


@pytest.mark.parametrize("writer", WRITERS)
def test_pickling_carries_mask_and_scale(cf_stores, writer: str) -> None:
    path = cf_stores[writer]
    want = xarray_values(path, "packed")
    src = open_source(path, "packed", mask_and_scale=True)
    copy = pickle.loads(pickle.dumps(src))
    assert copy.dtype == np.float64
    np.testing.assert_array_equal(copy[...], want)
    src.release_handle()  # reopened from its arguments: still decoded
    np.testing.assert_array_equal(src.read_box([0, 0, 0], SHAPE), want)


@pytest.mark.parametrize("writer", WRITERS)
def test_the_default_reads_the_stored_values_and_warns_once(cf_stores, writer: str) -> None:
    path = cf_stores[writer]
    with pytest.warns(PackedVariableWarning, match="mask_and_scale=True") as caught:
        src = open_source(path, "packed")
    message = str(caught[0].message)
    assert caught[0].filename == __file__  # it points at the caller, not inside mixle
    assert "scale_factor=0.1" in message and "add_offset=5" in message
    assert "_FillValue=-999" in message and "int16 -> float64" in message
    stored = stored_values(path, "packed")
    assert src.dtype == stored.dtype
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per location: not again, not in copies
        check_array_source(open_source(path, "packed"), stored)
        again = open_source(path, "packed", mask_and_scale=False)
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(again))[...], stored)
        open_source(path, "plain")  # not packed: no warning


def test_a_plain_zarr_v2_fill_value_does_not_warn_but_masks_as_xarray_does(tmp_path: Path) -> None:
    # xarray reads a format-2 fill_value as _FillValue: zeros of a plain uint8 array are NaN
    path = tmp_path / "plain.zarr"
    array = zarr.create_array(str(path), shape=(4, 6), chunks=(3, 4), dtype="uint8", zarr_format=2)
    array[...] = np.arange(24, dtype="uint8").reshape(4, 6) % 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raw = read_zarr(str(path))
        np.testing.assert_array_equal(raw[...], array[...])
    group = zarr.open_group(str(tmp_path / "wrapped.zarr"), mode="w", zarr_format=2)
    group.create_array("v", data=array[...], chunks=(3, 4), fill_value=0).attrs.update(
        {"_ARRAY_DIMENSIONS": ["y", "x"]}
    )
    want = xarray_values(tmp_path / "wrapped.zarr", "v")
    decoded = read_zarr(str(tmp_path / "wrapped.zarr"), "v", mask_and_scale=True)
    assert decoded.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(decoded[...], want)


def test_zarr_over_http_keeps_batched_fetches(cf_stores) -> None:
    from mixle.testing_servers import RangeHTTPServer

    path = cf_stores["zarr3"]
    want = xarray_values(path, "packed")
    with RangeHTTPServer(path.parent) as server:
        src = read_zarr(f"{server.url}/{path.name}", "packed", mask_and_scale=True)
        reader = src._reader_for(src.array)
        assert isinstance(reader, CFChunkReader)
        assert getattr(reader, "fetch_many", None) is not None
        assert getattr(reader, "fetch_each", None) is not None
        check_array_source(src, want)


def test_hdf5_over_http_keeps_batched_fetches(cf_stores) -> None:
    from mixle.testing_servers import RangeHTTPServer

    path = cf_stores["h5netcdf"]
    want = xarray_values(path, "single")
    with RangeHTTPServer(path.parent) as server:
        src = read_hdf5(f"{server.url}/{path.name}", "single", mask_and_scale=True)
        reader = src._reader_for(src.array)
        assert isinstance(reader, CFChunkReader)
        assert getattr(reader, "fetch_many", None) is not None
        assert src.dtype == want.dtype == np.float32
        check_array_source(src, want)


def test_from_array_and_from_dataset_decode_too(cf_stores) -> None:
    zpath = cf_stores["zarr2"]
    want = xarray_values(zpath, "unsigned")
    src = ZarrArraySource.from_array(
        zarr.open_array(str(zpath), path="unsigned", mode="r"), mask_and_scale=True
    )
    np.testing.assert_array_equal(src[...], want)
    hpath = cf_stores["netcdf4"]
    with h5py.File(hpath, "r") as f:
        src = HDF5ArraySource.from_dataset(f["unsigned"], mask_and_scale=True)
        assert src.dtype == np.float32
        np.testing.assert_array_equal(src[...], xarray_values(hpath, "unsigned"))
        src.close()


def test_a_file_like_hdf5_decodes(cf_stores) -> None:
    path = cf_stores["h5netcdf"]
    with open(path, "rb") as handle:
        src = read_hdf5(handle, "packed", mask_and_scale=True)  # type: ignore[arg-type]
        np.testing.assert_array_equal(src[2:5], xarray_values(path, "packed")[2:5])
        src.close()


def test_out_must_have_the_decoded_dtype(cf_stores) -> None:
    src = open_source(cf_stores["zarr3"], "packed", mask_and_scale=True)
    with pytest.raises(ValueError, match=r"expected .* float64"):
        src.read_boxes([[0, 0, 0]], PATCH, out=np.empty((1, *PATCH), dtype="int16"))


@pytest.mark.parametrize("bad", ["yes", 1, None])
@pytest.mark.parametrize("writer", ["zarr3", "netcdf4"])
def test_mask_and_scale_not_a_bool_is_a_type_error(cf_stores, writer: str, bad: object) -> None:
    with pytest.raises(TypeError, match="mask_and_scale="):
        open_source(cf_stores[writer], "packed", mask_and_scale=bad)


def test_a_bad_scale_factor_names_the_attribute_and_the_variable(tmp_path: Path) -> None:
    zpath = tmp_path / "bad.zarr"
    array = zarr.create_array(str(zpath), shape=(4,), dtype="int16", zarr_format=3)
    array.attrs.update({"scale_factor": "0.1"})
    with pytest.raises(ValueError, match=r"ZarrArraySource\(.*bad\.zarr.*scale_factor='0\.1'"):
        read_zarr(str(zpath), mask_and_scale=True)
    with pytest.warns(PackedVariableWarning, match="cannot decode"):
        np.testing.assert_array_equal(read_zarr(str(zpath))[...], np.zeros(4))
    hpath = tmp_path / "bad.h5"
    with h5py.File(hpath, "w") as f:
        f.create_dataset("v", data=np.arange(4, dtype="int16")).attrs["add_offset"] = [1.0, 2.0]
    with pytest.raises(ValueError, match=r"dataset='v'.*add_offset=.*holds 2 values") as info:
        read_hdf5(str(hpath), "v", mask_and_scale=True)
    # the error's traceback holds the half-made source: its file must be closed already
    # (HDF5 refuses r+ on a file this process still has open)
    with h5py.File(hpath, "r+"):
        assert info.value is not None


@pytest.mark.parametrize("layout", ["contiguous", "gzip", "lzf"])
def test_plain_hdf5_attributes_decode_like_h5netcdf(tmp_path: Path, layout: str) -> None:
    # h5py-written attributes (a one-element float32 array as scale_factor, several missing
    # values) decode as xarray's h5netcdf engine decodes them; lzf chunks are h5py's to
    # decode, contiguous data is memory-mapped, gzip chunks are mixle's
    path = tmp_path / "plain.h5"
    raw = np.arange(-6, 30, dtype="int16").reshape(6, 6)
    layouts: dict[str, dict[str, Any]] = {
        "contiguous": {},
        "gzip": {"chunks": (4, 4), "compression": "gzip"},
        "lzf": {"chunks": (4, 4), "compression": "lzf"},
    }
    with h5py.File(path, "w") as f:
        d = f.create_dataset("v", data=raw, **layouts[layout])
        d.attrs["scale_factor"] = np.array([0.5], dtype="float32")
        d.attrs["add_offset"] = np.array([2.0], dtype="float32")
        d.attrs["missing_value"] = np.array([-6, 7], dtype="int16")
        d.attrs["_FillValue"] = np.int16(29)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray: "multiple fill values", phony dimensions
        with xr.open_dataset(path, engine="h5netcdf", phony_dims="sort", decode_times=False) as ds:
            want = np.asarray(ds["v"].values)
    src = read_hdf5(str(path), "v", mask_and_scale=True)
    assert src.dtype == want.dtype == np.float32
    assert "dtype=float32, " in repr(src) and "mask_and_scale=True (stored int16)" in repr(src)
    check_array_source(src, want)


def test_non_numeric_arrays_with_a_fill_value_read_as_stored(tmp_path: Path) -> None:
    path = tmp_path / "text.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("s", data=np.array([b"ab", b"", b"c"])).attrs["_FillValue"] = b""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing numeric to unpack: no warning
        assert read_hdf5(str(path), "s")[1] == b""
    with pytest.raises(ValueError, match="decodes numbers only"):
        read_hdf5(str(path), "s", mask_and_scale=True)


@pytest.mark.parametrize("writer", ["zarr3", "netcdf4", "contiguous"])
def test_a_forked_child_reads_decoded_values(cf_stores, writer: str) -> None:
    from _fork_child import in_forked_child

    path = cf_stores[writer]
    want = xarray_values(path, "packed")
    src = open_source(path, "packed", mask_and_scale=True)
    np.testing.assert_array_equal(src[1:3], want[1:3])  # a handle and a chunk reader to inherit

    def body() -> list[str]:
        problems = []
        if src.dtype != np.float64:
            problems.append(f"dtype {src.dtype}")
        if not np.array_equal(src.read_box([0, 0, 0], SHAPE), want, equal_nan=True):
            problems.append("read_box differs")
        if not np.array_equal(src.get_batch([6, 2]), want[[6, 2]], equal_nan=True):
            problems.append("get_batch differs")
        return problems

    assert in_forked_child(body) == []
    np.testing.assert_array_equal(src[...], want)


@pytest.mark.parametrize("writer", ["zarr2", "netcdf4"])
def test_aligned_readers_pass_mask_and_scale_through(cf_stores, writer: str) -> None:
    from mixle.data.sampling.aligned import read_hdf5_arrays, read_zarr_arrays

    path = cf_stores[writer]
    read = read_zarr_arrays if path.suffix == ".zarr" else read_hdf5_arrays
    arrays = read(str(path), ["packed", "masked"], mask_and_scale=True)
    for name, src in arrays.items():
        np.testing.assert_array_equal(src[...], xarray_values(path, name))
