"""The package face: cheap import, anchor import paths (the command line: test_cli_*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mixle

ROOT = Path(__file__).resolve().parents[1]


def test_import_mixle_does_not_import_heavy_dependencies():
    code = (
        "import sys, json, mixle; "
        "heavy = ('zarr', 'h5py', 'fsspec', 'jax', 'numcodecs', 'dask', 'pyarrow', "
        "'sqlalchemy', 'pandas', 'torch', 'asyncio', 'matplotlib', 'tifffile', "
        "'imagecodecs', 'nibabel', 'blosc2', 'icechunk', 'xarray', 'tensorstore', 'obstore'); "
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_anchor_import_paths():
    from mixle.data.sources.array_source import (
        HDF5ArraySource,
        MemmapArraySource,
        PatchSampler,
        ZarrArraySource,
        read_hdf5,
        read_memmap,
        read_npy,
        read_zarr,
    )
    from mixle.utils.optional_deps import HAS_H5PY, HAS_ZARR, require

    assert HAS_ZARR and HAS_H5PY
    assert require("numpy").__name__ == "numpy"
    assert PatchSampler is mixle.PatchSampler and read_zarr is mixle.read_zarr
    assert mixle.ZarrArraySource is ZarrArraySource and mixle.HDF5ArraySource is HDF5ArraySource
    assert mixle.MemmapArraySource is MemmapArraySource
    assert read_hdf5 and read_memmap and read_npy
    assert (ROOT / "mixle" / "py.typed").exists()


def test_require_names_the_extra_for_a_missing_module():
    with pytest.raises(
        ImportError, match=r'not installed: pip install -e "\.\[tabular\]" in a clone'
    ):
        mixle.utils.optional_deps.require("pyarrow_surely_missing", "tabular")
