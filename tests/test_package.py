"""The package face: cheap import, anchor import paths, the command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mixle
from mixle.cli import main
from mixle.cli.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]


def test_import_mixle_does_not_import_heavy_dependencies():
    code = (
        "import sys, json, mixle; "
        "heavy = ('zarr', 'h5py', 'fsspec', 'jax', 'numcodecs', 'dask', 'pyarrow', "
        "'sqlalchemy', 'pandas', 'torch', 'asyncio', 'matplotlib'); "
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
    with pytest.raises(ImportError, match=r'not installed: pip install "mixle\[tabular\]"'):
        mixle.utils.optional_deps.require("pyarrow_surely_missing", "tabular")


@pytest.mark.parametrize("backend", ["zarr", "memmap"])
def test_demo_runs_and_cleans_up(backend):
    out = io.StringIO()
    stats = run_demo(size=48, backend=backend, patch=8, num_patches=20, out=out)
    text = out.getvalue()
    assert f"{backend})" in text and "patches/s" in text and "peak RSS" in text
    assert stats["patches_per_s"] > 0 and stats["volume_mib"] == 48**3 * 4 / 2**20
    folder = text.split(" to ", 1)[1].split(" in ", 1)[0]
    assert not Path(folder).exists()


def test_demo_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend='tiff'"):
        run_demo(backend="tiff")


def test_cli_demo_in_process(capsys):
    assert main(["demo", "--size", "40", "--patch", "8", "--num-patches", "5"]) == 0
    assert "sampled 5 patches" in capsys.readouterr().out


def test_cli_rejects_bad_patch(capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--size", "16", "--patch", "32"])
    assert info.value.code == 2
    assert "--patch=32" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mixle.cli",
            "demo",
            "--size",
            "32",
            "--patch",
            "8",
            "--num-patches",
            "4",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "sampled 4 patches" in out.stdout
