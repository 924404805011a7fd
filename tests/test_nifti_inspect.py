"""inspect_nifti / is_nifti on files nibabel wrote: the header's facts and the advice given."""

from __future__ import annotations

import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from mixle.data.sources.arrays.nifti import read_nifti
from mixle.inspection.nifti_files import inspect_nifti, is_nifti
from mixle.inspection.report import UnsupportedStoreError
from mixle.testing import assert_unchanged

DATA = np.arange(8 * 6 * 5, dtype=np.int16).reshape(8, 6, 5)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(folder))
    return folder


def _save(path: Path, *, slope_inter: tuple[float, float] | None = None) -> Path:
    img = nib.Nifti1Image(DATA, np.diag([0.5, 0.75, 2.0, 1.0]))
    img.header.set_xyzt_units("mm", "sec")
    if slope_inter is not None:
        img.header.set_slope_inter(*slope_inter)
    nib.save(img, str(path))
    return path


def _codes(report: object) -> dict[str, str]:
    return {f.code: f.message for f in report.findings}  # type: ignore[attr-defined]


def test_a_nii_report_has_the_header_facts_and_the_spacing(tmp_path: Path) -> None:
    path = _save(tmp_path / "v.nii")
    with assert_unchanged(path):
        report = inspect_nifti(str(path), None, (4, 4, 4))
    ref = nib.load(str(path))
    assert report.format == "nifti-1" and report.shape == DATA.shape
    assert report.dtype == str(ref.get_data_dtype()) and report.order == "F"
    assert report.layout == "contiguous" and not report.compressed and report.codecs == ()
    assert report.nbytes == DATA.nbytes == report.stored_bytes
    assert report.patch_cost is not None and report.patch_cost.patch_bytes == 4 * 4 * 4 * 2
    codes = _codes(report)
    assert "gzip-whole-file" not in codes and "scaled-values" not in codes
    assert "(0.5, 0.75, 2) mm" in codes["physical-space"] and "sform" in codes["physical-space"]


def test_a_nii_gz_report_says_it_is_decompressed_once_into_the_cache(
    tmp_path: Path, cache: Path
) -> None:
    path = _save(tmp_path / "v.nii.gz")
    with assert_unchanged(path):
        report = inspect_nifti(str(path), None, None)
    assert not cache.exists()  # inspecting decompresses nothing
    assert report.compressed and report.codecs == ("gzip",)
    assert report.stored_bytes == path.stat().st_size and report.nbytes == DATA.nbytes
    message = _codes(report)["gzip-whole-file"]
    assert "decompresses the whole file" in message and "MIXLE_CACHE_DIR" in message
    assert str(cache / "nifti") in message and "none is cached yet" in message
    read_nifti(path).close()
    again = _codes(inspect_nifti(str(path), None, None))["gzip-whole-file"]
    assert "already cached" in again


def test_scaled_values_are_reported_with_the_factors_and_the_way_to_get_them(
    tmp_path: Path,
) -> None:
    path = _save(tmp_path / "s.nii", slope_inter=(0.25, -3.0))
    message = _codes(inspect_nifti(str(path), None, None))["scaled-values"]
    assert "0.25" in message and "-3" in message and "scale=True" in message
    assert "float64" in message


def test_a_truncated_nii_is_reported(tmp_path: Path) -> None:
    path = _save(tmp_path / "v.nii")
    path.write_bytes(path.read_bytes()[:-100])
    report = inspect_nifti(str(path), None, None)
    assert "truncated" in _codes(report) and report.warnings


def test_is_nifti_looks_at_the_bytes(tmp_path: Path) -> None:
    nii, gz = _save(tmp_path / "a.nii"), _save(tmp_path / "b.nii.gz")
    nib.save(nib.Nifti2Image(DATA, np.eye(4)), str(tmp_path / "c.nii"))
    nib.save(nib.Nifti1Pair(DATA, np.eye(4)), str(tmp_path / "d.img"))
    renamed = tmp_path / "plain.bin"
    renamed.write_bytes(nii.read_bytes())
    for yes in (nii, gz, tmp_path / "c.nii", tmp_path / "d.img", tmp_path / "d.hdr", renamed):
        assert is_nifti(str(yes)), yes
    (tmp_path / "x.nii").write_bytes(b"not nifti" * 100)
    (tmp_path / "y.nii.gz").write_bytes(gzip.compress(b"not nifti" * 100))
    np.save(tmp_path / "z.npy", DATA)
    for no in ("x.nii", "y.nii.gz", "z.npy", "missing.nii", ""):
        assert not is_nifti(str(tmp_path / no)), no
    assert not is_nifti("s3://bucket/x.nii")


def test_inspecting_what_is_not_nifti_or_remote_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.nii").write_bytes(b"not nifti" * 100)
    with pytest.raises(UnsupportedStoreError, match=r"x\.nii.*not a NIfTI file"):
        inspect_nifti(str(tmp_path / "x.nii"), None, None)
    with pytest.raises(UnsupportedStoreError, match=r"locally only"):
        inspect_nifti("https://example.invalid/x.nii", None, None)


def test_an_oblique_2d_image_says_its_affine_is_in_plane(tmp_path: Path) -> None:
    rot = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
    affine = np.eye(4)
    affine[:3, :3] = rot @ np.diag([0.7, 1.3, 2.1])
    nib.save(nib.Nifti1Image(DATA[:, :, 0].copy(), affine), str(tmp_path / "o.nii"))
    message = _codes(inspect_nifti(str(tmp_path / "o.nii"), None, None))["physical-space"]
    zooms = nib.load(str(tmp_path / "o.nii")).header.get_zooms()
    assert f"voxel spacing ({zooms[0]:.6g}, {zooms[1]:.6g})" in message
    assert "oblique 2-D plane" in message and "src.nifti_affine" in message
    nib.save(nib.Nifti1Image(DATA[:, :, 0].copy(), np.eye(4)), str(tmp_path / "a.nii"))
    assert (
        "oblique"
        not in _codes(inspect_nifti(str(tmp_path / "a.nii"), None, None))["physical-space"]
    )


def test_the_advice_on_axes_after_i_j_k(tmp_path: Path) -> None:
    single = DATA.reshape(8, 6, 5, 1)
    nib.save(nib.Nifti1Image(single, np.diag([0.5, 0.75, 2.0, 1.0])), str(tmp_path / "one.nii"))
    message = _codes(inspect_nifti(str(tmp_path / "one.nii"), None, None))["physical-space"]
    assert "axis t has length 1" in message and "(patch_size_mm=)" in message
    assert "world=True" in message and "refused" not in message
    timed = np.stack([DATA, DATA], axis=-1)
    nib.save(nib.Nifti1Image(timed, np.diag([0.5, 0.75, 2.0, 1.0])), str(tmp_path / "two.nii"))
    message = _codes(inspect_nifti(str(tmp_path / "two.nii"), None, None))["physical-space"]
    assert "world=True and patch_size_mm= are refused for this image" in message
    assert "axis t (2 values) after i, j, k" in message and "spatial axes last" in message
    assert "patch sizes can be asked" not in message
    plain = _codes(inspect_nifti(str(_save(tmp_path / "a.nii")), None, None))["physical-space"]
    assert "patch sizes can be asked in world units (patch_size_mm)" in plain
    assert "refused" not in plain and "length 1" not in plain
