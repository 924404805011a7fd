"""`inspect_store` and `mixle inspect` tell every format apart and describe it."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import blosc2
import nibabel as nib
import numpy as np
import pytest
import tensorstore as ts
import tifffile
import zarr

from mixle.cli import main
from mixle.inspection import ArrayReport, GroupReport, inspect_store

DATA = np.arange(16 * 20 * 24, dtype=np.uint16).reshape(16, 20, 24)


def _tiff(path: Path) -> Path:
    tifffile.imwrite(path / "scan.tif", DATA, tile=(16, 16), compression="zlib")
    return path / "scan.tif"


def _nifti(path: Path) -> Path:
    nib.save(nib.Nifti1Image(DATA.astype(np.int16), np.eye(4)), path / "scan.nii.gz")
    return path / "scan.nii.gz"


def _n5(path: Path) -> Path:
    spec = {
        "driver": "n5",
        "kvstore": {"driver": "file", "path": str(path / "scan.n5" / "raw")},
        "metadata": {
            "dimensions": list(DATA.shape),
            "blockSize": [8, 8, 8],
            "dataType": "uint16",
            "compression": {"type": "gzip"},
        },
        "create": True,
    }
    ts.open(spec).result().write(DATA).result()
    return path / "scan.n5" / "raw"


def _b2nd(path: Path) -> Path:
    blosc2.asarray(DATA, chunks=(8, 10, 12), blocks=(4, 5, 6), urlpath=str(path / "scan.b2nd"))
    return path / "scan.b2nd"


def _npz(path: Path) -> Path:
    np.savez(path / "scan.npz", image=DATA, label=DATA > 10)
    return path / "scan.npz"


def _zarr_zip(path: Path) -> Path:
    store = zarr.storage.ZipStore(path / "scan.zarr.zip", mode="w")
    zarr.create_array(store, name="ct", data=DATA, chunks=(8, 10, 12))
    store.close()
    return path / "scan.zarr.zip"


WRITERS = {
    "tiff": _tiff,
    "nifti": _nifti,
    "n5": _n5,
    "b2nd": _b2nd,
    "npz": _npz,
    "zarr-zip": _zarr_zip,
}


@pytest.mark.parametrize("kind", WRITERS)
def test_each_format_is_recognised_and_described(tmp_path: Path, kind: str) -> None:
    path = WRITERS[kind](tmp_path)
    report = inspect_store(path)
    assert report.kind == kind
    arrays = report.arrays() if isinstance(report.root, GroupReport) else [report.root]
    assert arrays and all(isinstance(a, ArrayReport) for a in arrays)
    assert any(a.shape == DATA.shape for a in arrays)


@pytest.mark.parametrize("kind", WRITERS)
def test_the_command_line_inspects_each_format(tmp_path: Path, kind: str, capsys) -> None:
    path = WRITERS[kind](tmp_path)
    assert main(["inspect", str(path)]) == 0
    assert "16" in capsys.readouterr().out


def test_a_plain_zip_or_gzip_is_no_format_and_says_what_is_read(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as zf:
        zf.writestr("notes.txt", "hello")
    (tmp_path / "notes.gz").write_bytes(gzip.compress(b"hello"))
    for name in ("notes.zip", "notes.gz"):
        with pytest.raises(ValueError, match=r"a TIFF, a NIfTI, a \.b2nd, a \.npz or a \.npy"):
            inspect_store(tmp_path / name)


def test_b2nd_small_blocks_say_why_whole_chunks_are_read(tmp_path: Path) -> None:
    path = tmp_path / "small.b2nd"
    blosc2.asarray(
        np.zeros((64, 64, 64), "f4"), chunks=(32,) * 3, blocks=(8,) * 3, urlpath=str(path)
    )
    messages = [f.message for f in inspect_store(path).root.findings]
    assert any("under 64 KiB" in m and "decodes faster whole" in m for m in messages)
    assert not any("DELTA" in m for m in messages)
