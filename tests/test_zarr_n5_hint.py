"""read_zarr on an N5 container or a file of another format names the mixle reader to use.

N5 containers are written by tensorstore (no root ``attributes.json``) and as n5-java
writes them (``{"n5": ...}`` at the root); HDF5, TIFF, NIfTI and ``.npy`` files by their
own libraries. zarr alone would say "no zarr array or group found there".
"""

from __future__ import annotations

import json

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from mixle.data.sources.array_source import read_zarr  # noqa: E402
from mixle.errors import UnsupportedStoreError  # noqa: E402
from mixle.testing import assert_unchanged  # noqa: E402


def _n5_by_tensorstore(path):
    ts = pytest.importorskip("tensorstore")
    spec = {
        "driver": "n5",
        "kvstore": {"driver": "file", "path": str(path / "vol")},
        "metadata": {
            "dimensions": [5, 6],
            "blockSize": [2, 3],
            "dataType": "uint16",
            "compression": {"type": "gzip"},
        },
        "create": True,
    }
    ts.open(spec).result()[...] = np.arange(30, dtype="uint16").reshape(5, 6)


def test_an_n5_container_names_read_n5(tmp_path):
    container = tmp_path / "c.n5"
    _n5_by_tensorstore(container)
    with assert_unchanged(container):
        with pytest.raises(
            UnsupportedStoreError, match=r"N5 container.*mixle\.read_n5\(.*dataset='vol'"
        ):
            read_zarr(container, "vol")
        with pytest.raises(UnsupportedStoreError, match=r"c\.n5' is an N5 container"):
            read_zarr(container)  # no root attributes.json: named *.n5
        with pytest.raises(UnsupportedStoreError, match=r"N5 container.*read_n5"):
            read_zarr(container / "vol")  # the dataset folder itself


def test_an_n5_root_attributes_file_names_read_n5(tmp_path):
    root = tmp_path / "data"  # not named .n5: found by its attributes.json
    (root / "raw").mkdir(parents=True)
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    with pytest.raises(UnsupportedStoreError, match=r"use mixle\.read_n5\(.*dataset='raw'\)"):
        read_zarr(root, "raw")


def test_a_zarr_store_with_an_attributes_json_opens_as_zarr(tmp_path):
    store = tmp_path / "mixed.n5"  # named .n5, but zarr metadata wins
    zarr.create_array(store, shape=(3,), dtype="i2")[...] = [1, 2, 3]
    (store / "attributes.json").write_text(json.dumps({"n5": "2.0.0"}))
    np.testing.assert_array_equal(read_zarr(store)[...], [1, 2, 3])


def test_a_plain_folder_still_says_no_zarr_array(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no zarr array or group"):
        read_zarr(tmp_path / "empty")


def test_hdf5_tiff_nifti_and_npy_files_name_their_readers(tmp_path):
    h5py = pytest.importorskip("h5py")
    tifffile = pytest.importorskip("tifffile")
    nibabel = pytest.importorskip("nibabel")
    data = np.arange(24, dtype="int16").reshape(2, 3, 4)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = data
    tifffile.imwrite(tmp_path / "a.tif", data, photometric="minisblack")
    image = nibabel.Nifti1Image(data, np.eye(4))
    nibabel.save(image, tmp_path / "a.nii")
    nibabel.save(image, tmp_path / "a.nii.gz")
    np.save(tmp_path / "a.npy", data)
    expected = {
        "a.h5": r"an HDF5 file, not a zarr store; use mixle\.read_hdf5\(.*dataset=",
        "a.tif": r"a TIFF file, not a zarr store; use mixle\.read_tiff\(",
        "a.nii": r"a NIfTI file, not a zarr store; use mixle\.read_nifti\(",
        "a.nii.gz": r"a gzipped NIfTI file, not a zarr store; use mixle\.read_nifti\(",
        "a.npy": r"a \.npy file, not a zarr store; use mixle\.read_npy\(",
    }
    with assert_unchanged(tmp_path):
        for name, message in expected.items():
            with pytest.raises(UnsupportedStoreError, match=message):
                read_zarr(tmp_path / name)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(FileNotFoundError, match="no zarr array or group"):
        read_zarr(other)  # unknown files keep zarr's answer
