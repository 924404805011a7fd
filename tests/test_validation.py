"""Bad input gets an early, clear error naming the argument and value; files stay intact."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import pytest
import zarr

import mixle
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.structure import SampleStructure, parse_structure
from mixle.errors import ArrayNotFoundError, NotAnArrayError, SchemaMismatchError
from mixle.testing import assert_unchanged

# -- zarr ---------------------------------------------------------------------------------


def test_zarr_group_lists_its_arrays(stores):
    with pytest.raises(NotAnArrayError, match="is a zarr group") as info:
        mixle.read_zarr(stores.path("group.zarr"))
    message = str(info.value)
    assert "image (10, 11, 12) uint8" in message
    assert "labels/mask (10, 11, 12) int32" in message
    assert "component=" in message


def test_zarr_component_that_is_a_group(stores):
    with pytest.raises(NotAnArrayError, match=r"component='labels'.*labels/mask"):
        mixle.read_zarr(stores.path("group.zarr"), "labels")


def test_zarr_missing_component_lists_what_exists(stores):
    with pytest.raises(ArrayNotFoundError, match=r"component='nope'.*image.*labels/mask"):
        mixle.read_zarr(stores.path("group.zarr"), "nope")
    with pytest.raises(KeyError):  # the builtin a caller would catch
        mixle.read_zarr(stores.path("group.zarr"), "nope")


def test_zarr_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        mixle.read_zarr(tmp_path / "absent.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no zarr array or group"):
        mixle.read_zarr(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no zarr array or group"):
        mixle.read_zarr("memory://mixle-test/absent.zarr")


def test_zarr_argument_types(stores):
    with pytest.raises(TypeError, match="path=3"):
        mixle.read_zarr(3)
    with pytest.raises(TypeError, match="component=5"):
        mixle.read_zarr(stores.path("group.zarr"), 5)
    with pytest.raises(ValueError, match="storage_options only apply to fsspec URLs"):
        mixle.read_zarr(stores.path("v3.zarr"), storage_options={"anon": True})
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        mixle.read_zarr("memory://x.zarr", storage_options=["anon"])


def test_zarr_is_opened_read_only(stores):
    src = mixle.read_zarr(stores.path("v3.zarr"))
    with pytest.raises(ValueError, match=r"read-only|read only"):
        src.array[0, 0, 0] = 1.0


# -- HDF5 ---------------------------------------------------------------------------------


def test_hdf5_missing_dataset_lists_what_exists(stores):
    with pytest.raises(ArrayNotFoundError, match=r"dataset='nope'.*/gzip.*/scans/ct"):
        mixle.read_hdf5(stores.path("volumes.h5"), "nope")


def test_hdf5_group_lists_its_datasets(stores):
    with pytest.raises(NotAnArrayError, match=r"dataset='scans'.*is a group.*/scans/ct"):
        mixle.read_hdf5(stores.path("volumes.h5"), "scans")


def test_hdf5_missing_file_and_not_hdf5(tmp_path, stores):
    with pytest.raises(FileNotFoundError, match=r"absent\.h5"):
        mixle.read_hdf5(tmp_path / "absent.h5", "x")
    with pytest.raises(OSError, match="could not be opened as an HDF5 file"):
        mixle.read_hdf5(stores.path("c.npy"), "x")


@pytest.mark.parametrize("mode", ["w", "w-", "x", "a"])
def test_hdf5_refuses_modes_that_create_or_truncate(stores, mode):
    with assert_unchanged(stores.root), pytest.raises(ValueError, match=f"mode='{mode}'"):
        mixle.read_hdf5(stores.path("volumes.h5"), "gzip", mode=mode)


def test_hdf5_argument_types(stores):
    with pytest.raises(TypeError, match="dataset=3"):
        mixle.read_hdf5(stores.path("volumes.h5"), 3)
    with pytest.raises(TypeError, match="path=None"):
        mixle.read_hdf5(None, "x")


def test_hdf5_read_only_by_default(stores):
    src = mixle.read_hdf5(stores.path("volumes.h5"), "lzf")
    assert src.array.file.mode == "r"
    with pytest.raises((OSError, ValueError)):
        src.array[0, 0] = 1


# -- memmap and npy -----------------------------------------------------------------------


def test_memmap_size_mismatch_either_way(stores):
    path = stores.path("header.raw")  # 64-byte header + 12*10*8 uint16
    with pytest.raises(ValueError, match=r"has 1984 bytes but offset=0.*needs 1920"):
        mixle.read_memmap(path, "uint16", (12, 10, 8))
    with pytest.raises(ValueError, match=r"has 1984 bytes.*needs 2144"):
        mixle.read_memmap(path, "uint16", (13, 10, 8), offset=64)
    with pytest.raises(ValueError, match="needs 3904"):
        mixle.read_memmap(path, "float32", (12, 10, 8), offset=64)


@pytest.mark.parametrize("mode", ["w+", "write"])
def test_memmap_refuses_truncating_mode(stores, mode):
    with assert_unchanged(stores.root), pytest.raises(ValueError, match="would truncate"):
        mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64, mode=mode)
    with assert_unchanged(stores.root), pytest.raises(ValueError, match="would truncate"):
        mixle.read_npy(stores.path("c.npy"), mode=mode)


def test_memmap_argument_errors(stores, tmp_path):
    path = stores.path("header.raw")
    with pytest.raises(FileNotFoundError, match=r"absent\.raw"):
        mixle.read_memmap(tmp_path / "absent.raw", "uint8", 3)
    with pytest.raises(ValueError, match="mode='x'"):
        mixle.read_memmap(path, "uint16", (12, 10, 8), mode="x")
    with pytest.raises(ValueError, match="offset=-1"):
        mixle.read_memmap(path, "uint16", (12, 10, 8), offset=-1)
    with pytest.raises(ValueError, match="order='K'"):
        mixle.read_memmap(path, "uint16", (12, 10, 8), order="K")
    with pytest.raises(ValueError, match=r"shape=\(12, -10\)"):
        mixle.read_memmap(path, "uint16", (12, -10))
    with pytest.raises(TypeError, match="shape='12'"):
        mixle.read_memmap(path, "uint16", "12")
    with pytest.raises(ValueError, match="Python objects"):
        mixle.read_memmap(path, object, 3)
    with pytest.raises(TypeError, match="data type"):
        mixle.read_memmap(path, "not-a-dtype", 3)


def test_npy_errors(stores, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.npy"):
        mixle.read_npy(tmp_path / "absent.npy")
    with pytest.raises(ValueError, match=r"not a \.npy file"):
        mixle.read_npy(stores.path("header.raw"))
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with assert_unchanged(tmp_path), pytest.raises(ValueError, match="cannot be memory-mapped"):
        mixle.read_npy(objects)


# -- schema, structure, optional dependencies ---------------------------------------------


def test_schema_is_checked(stores):
    path = stores.path("c.npy")  # float32 (17, 6, 5)
    assert mixle.read_npy(path, schema=mixle.Schema("float32", (None, 6, 5))).shape
    with pytest.raises(SchemaMismatchError, match=r"dtype is float32, schema expects int16"):
        mixle.read_npy(path, schema=mixle.Schema("int16"))
    with pytest.raises(SchemaMismatchError, match=r"shape is \(17, 6, 5\).*\(None, 7, 5\)"):
        mixle.read_npy(path, schema=mixle.Schema(shape=(None, 7, 5)))
    with pytest.raises(SchemaMismatchError, match="shape"):
        mixle.read_npy(path, schema=mixle.Schema(shape=(17, 6)))
    with pytest.raises(TypeError, match="schema="):
        mixle.read_npy(path, schema={"dtype": "float32"})
    with pytest.raises(TypeError, match="shape="):
        mixle.Schema(shape=(3, -1))


def test_sampler_schema_checks_one_patch(stores):
    src = mixle.read_npy(stores.path("c.npy"))
    mixle.PatchSampler(src, (4, 6, 5), 3, schema=mixle.Schema("float32", (4, None, 5)))
    with pytest.raises(SchemaMismatchError, match=r"PatchSampler patch.*\(4, 6, 5\)"):
        mixle.PatchSampler(src, (4, 6, 5), 3, schema=mixle.Schema(shape=(4, 4, 4)))


def test_structure_validation():
    assert parse_structure(mixle.IID).shuffleable
    assert not mixle.SEQUENTIAL.shuffleable
    grouped = mixle.partially_exchangeable("patient")
    assert grouped.grouped and not grouped.shuffleable
    assert repr(grouped) == "partially_exchangeable(by='patient')"
    with pytest.raises(TypeError, match="structure='iid'"):
        mixle.read_zarr("unused", structure="iid")
    with pytest.raises(TypeError, match="by=3"):
        mixle.partially_exchangeable(3)
    with pytest.raises(ValueError, match="kind='random'"):
        SampleStructure("random")
    with pytest.raises(ValueError, match="only meaningful"):
        SampleStructure("iid", by="x")


def test_missing_optional_dependency_names_the_extra(stores, monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[zarr\]" in a clone of the mixle'):
        mixle.read_zarr(stores.path("v3.zarr"))
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[hdf5\]" in a clone of the mixle'):
        mixle.read_hdf5(stores.path("volumes.h5"), "gzip")


# -- sampler and reads --------------------------------------------------------------------


def test_sampler_rejects_non_arrays():
    with pytest.raises(TypeError, match="array=list is not an array"):
        mixle.PatchSampler([[1, 2], [3, 4]], 1, 1)
    with pytest.raises(ValueError, match="0-dimensional"):
        mixle.PatchSampler(np.float32(1.0).reshape(()), 1, 1)


def test_source_read_errors(stores):
    src = mixle.read_npy(stores.path("c.npy"))
    with pytest.raises(IndexError, match="index 17 is out of bounds for axis 0"):
        src[17]
    with pytest.raises(IndexError, match="too many indices"):
        src[0, 0, 0, 0]
    with pytest.raises(TypeError, match="only integers, slices"):
        src[:, [0, 1]]
    with pytest.raises(TypeError, match="only integers, slices"):
        src[None]
    with pytest.raises(IndexError, match="indices contains 17"):
        src.get_batch([0, 17])
    with pytest.raises(TypeError, match="indices must be integers"):
        src.get_batch([0.5])
    with pytest.raises(IndexError, match="indices contains 18446744073709551615"):
        src.get_batch(np.array([2**64 - 1], dtype=np.uint64))  # as int64 it is -1: the last row
    with pytest.raises(IndexError, match="outside the array"):
        src.read_box((15, 0, 0), (4, 6, 5))
    with pytest.raises(
        ValueError, match=r"start=\[0, 0\]: every box needs 3 start and size entries"
    ):
        src.read_box((0, 0), (1, 1))
    with pytest.raises(IndexError, match=r"box start=\(0, 3, 0\), size=\(2, 4, 5\) is outside"):
        src.read_boxes([(0, 0, 0), (0, 3, 0)], (2, 4, 5))
    with pytest.raises(
        ValueError, match=r"size=\(2, 4\): every box needs 3 start and size entries"
    ):
        src.read_boxes([(0, 0, 0)], (2, 4))
    with pytest.raises(ValueError, match=r"out has shape \(1, 2, 2, 2\) and dtype float64"):
        src.read_boxes([(0, 0, 0)], (2, 2, 2), out=np.empty((1, 2, 2, 2)))
    out = np.empty((1, 2, 2, 2), dtype=np.float32)
    assert src.read_boxes([(1, 1, 1)], (2, 2, 2), out=out) is out


def test_use_after_close_on_sampler(stores):
    src = mixle.read_hdf5(stores.path("volumes.h5"), "gzip")
    sampler = mixle.PatchSampler(src, 4, 2)
    src.close()
    with pytest.raises(mixle.SourceClosedError, match="is closed"):
        sampler[0]
    with pytest.raises(ValueError, match="is closed"):  # SourceClosedError is a ValueError
        sampler.get_batch([0])


def test_array_like_without_dtype_is_wrapped():
    class Weird:
        shape = (3,)

        def __getitem__(self, key):
            return np.zeros(3)[key]

    src = as_array_source(Weird())
    np.testing.assert_array_equal(src[1:], np.zeros(2))


def test_errors_leave_zarr_and_hdf5_untouched(stores):
    with assert_unchanged(stores.root):
        for bad in ("nope", "labels"):
            with pytest.raises((KeyError, ValueError)):
                mixle.read_zarr(stores.path("group.zarr"), bad)
        with pytest.raises(KeyError):
            mixle.read_hdf5(stores.path("volumes.h5"), "nope")
    # the files are still readable by their own libraries
    assert zarr.open_array(stores.path("v3.zarr"), mode="r").shape == (21, 34, 17)
    with h5py.File(stores.path("volumes.h5"), "r") as f:
        assert f["gzip"].shape == (19, 23, 16)
