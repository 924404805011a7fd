"""``mixle inspect`` says when an array's values are CF-packed and how to unpack them."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from mixle.inspection import inspect_store
from mixle.testing import assert_unchanged

xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")
pytest.importorskip("netCDF4")

ENCODING = {"dtype": "int16", "scale_factor": 0.1, "add_offset": 5, "_FillValue": -999}


def write(tmp_path: Path, kind: str) -> Path:
    data = np.array([[1.0, 2.5, np.nan], [7.3, -3.0, 100.0]])
    ds = xr.Dataset({"v": (("y", "x"), data), "w": (("y", "x"), data)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "netcdf":
            path = tmp_path / "packed.nc"
            ds.to_netcdf(path, engine="netcdf4", encoding={"v": ENCODING})
        else:
            path = tmp_path / f"packed{kind[-1]}.zarr"
            ds.to_zarr(
                path, encoding={"v": ENCODING}, zarr_format=int(kind[-1]), consolidated=False
            )
    return path


@pytest.mark.parametrize("kind", ["zarr2", "zarr3", "netcdf"])
def test_a_packed_array_gets_a_cf_packed_finding(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, kind)
    with assert_unchanged(path):
        report = inspect_store(path)
    found = {
        a.path.strip("/"): [f for f in a.findings if f.code == "cf-packed"] for a in report.arrays()
    }
    assert found["w"] == []  # float64 with a NaN fill: nothing packed
    (finding,) = found["v"]
    reader = "read_hdf5" if kind == "netcdf" else "read_zarr"
    assert finding.severity == "info"
    assert f"{reader}(..., mask_and_scale=True)" in finding.message
    assert "scale_factor=0.1" in finding.message and "add_offset=5" in finding.message
    assert "_FillValue=-999" in finding.message and "int16 -> float64" in finding.message


def test_undecodable_attributes_are_named(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=np.arange(4, dtype="int16")).attrs["scale_factor"] = "big"
    (array,) = inspect_store(path).arrays()
    (finding,) = [f for f in array.findings if f.code == "cf-packed"]
    assert "cannot decode" in finding.message and "scale_factor='big'" in finding.message
