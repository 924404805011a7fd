"""``read_volumes`` over the formats told by suffix: TIFF, NIfTI, N5, blosc2, npz; spacing.

Each volume is written by its format's own library and compared with that library's read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import blosc2
import fsspec
import nibabel as nib
import numpy as np
import pytest
import tensorstore as ts
import tifffile

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.collection import read_volumes
from mixle.data.sources.collection.openers import VOLUME_SUFFIXES, suffix_format
from mixle.errors import UnsupportedStoreError
from mixle.testing import assert_unchanged

SHAPE = (9, 12, 10)


def _data(seed: int, dtype: str = "uint16") -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4000, SHAPE).astype(dtype)


def _n5(path: Path, data: np.ndarray) -> np.ndarray:
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(path)}}
    store = ts.open(
        spec,
        create=True,
        dtype=str(data.dtype),
        shape=data.shape,
        chunk_layout=ts.ChunkLayout(read_chunk_shape=(4, 5, 4)),
    ).result()
    store[...].write(data).result()
    return np.asarray(ts.open(spec).result().read().result())


@pytest.fixture
def every_format(tmp_path: Path) -> tuple[list[str], list[np.ndarray], dict[str, Any]]:
    """One volume of each new format, with its writer's own read (and NIfTI's affine)."""
    paths, truth = [], []
    tifffile.imwrite(tmp_path / "a.tif", _data(0))
    paths.append(str(tmp_path / "a.tif"))
    truth.append(tifffile.imread(tmp_path / "a.tif"))
    tifffile.imwrite(tmp_path / "b.ome.tiff", _data(1), ome=True, tile=(16, 16))
    paths.append(str(tmp_path / "b.ome.tiff"))
    truth.append(tifffile.imread(tmp_path / "b.ome.tiff"))
    affine = np.diag([0.7, 0.9, 1.5, 1.0])
    affine[:3, 3] = [-3.0, 4.0, 5.5]
    nib.save(nib.Nifti1Image(_data(2).astype(np.uint16), affine), str(tmp_path / "c.nii.gz"))
    paths.append(str(tmp_path / "c.nii.gz"))
    truth.append(np.asarray(nib.load(str(tmp_path / "c.nii.gz")).dataobj))
    nib.save(nib.Nifti1Image(_data(3).astype(np.uint16), np.eye(4)), str(tmp_path / "d.nii"))
    paths.append(str(tmp_path / "d.nii"))
    truth.append(np.asarray(nib.load(str(tmp_path / "d.nii")).dataobj))
    truth.append(_n5(tmp_path / "e.n5", _data(4)))
    paths.append(str(tmp_path / "e.n5"))
    blosc2.asarray(_data(5), urlpath=str(tmp_path / "f.b2nd"), mode="w", chunks=(4, 6, 5))
    paths.append(str(tmp_path / "f.b2nd"))
    truth.append(blosc2.open(str(tmp_path / "f.b2nd"), mode="r")[...])
    np.savez(tmp_path / "g.npz", _data(6))
    paths.append(str(tmp_path / "g.npz"))
    with np.load(tmp_path / "g.npz") as f:
        truth.append(f["arr_0"])
    return paths, truth, {"affine": nib.load(str(tmp_path / "c.nii.gz")).affine}


def test_every_format_is_told_by_its_suffix(every_format, tmp_path: Path) -> None:
    paths, truth, _ = every_format
    with assert_unchanged(tmp_path):
        vols = read_volumes(paths)
        kinds = [type(vols[i]).__name__ for i in range(len(paths))]
        assert kinds == [
            "TiffArraySource",
            "TiffArraySource",
            "NiftiArraySource",
            "NiftiArraySource",
            "N5ArraySource",
            "B2ndArraySource",
            "NpzArraySource",
        ]
        for i, want in enumerate(truth):
            np.testing.assert_array_equal(vols[i][...], want)
        sampler = PatchSampler(vols, (4, 5, 3), 200, seed=2, patches_per_volume=4)
        batch = sampler.get_batch(np.arange(200))
        assert set(batch["volume"].tolist()) == set(range(7))
        for patch, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
            box = tuple(slice(c, c + p) for c, p in zip(corner.tolist(), (4, 5, 3)))
            np.testing.assert_array_equal(patch, truth[int(v)][box])


def test_a_glob_of_nifti_files(every_format, tmp_path: Path) -> None:
    _, truth, extra = every_format
    vols = read_volumes(str(tmp_path / "*.nii.gz"))
    assert len(vols) == 1
    assert vols.spacing(0) == pytest.approx((0.7, 0.9, 1.5))
    np.testing.assert_allclose(vols.physical(0).affine, extra["affine"], atol=1e-6)
    np.testing.assert_array_equal(vols[0][...], truth[2])


def test_spacing_is_metadata_per_volume(every_format) -> None:
    paths, _, _ = every_format
    vols = read_volumes(paths)
    assert vols.spacing(2) == pytest.approx((0.7, 0.9, 1.5))
    assert vols.spacing(3) == (1.0, 1.0, 1.0)
    assert vols.spacing(6) is None  # .npz records no geometry
    assert vols.spacing(-1) is None
    with pytest.raises(IndexError, match="out of range"):
        vols.spacing(7)


def test_dict_volumes_give_spacing_per_array(every_format, tmp_path: Path) -> None:
    paths, _, _ = every_format
    vols = read_volumes([{"image": paths[2], "label": paths[6], "site": "A"}])
    assert vols.names == ("image", "label")
    spacing = vols.spacing(0)
    assert spacing["image"] == pytest.approx((0.7, 0.9, 1.5)) and spacing["label"] is None
    assert vols.metadata(0) == {"site": "A"}


def test_n5_and_npz_take_dataset_for_the_array_inside(tmp_path: Path) -> None:
    raw = _n5(tmp_path / "c.n5" / "raw", _data(7))
    np.savez(tmp_path / "m.npz", image=_data(8), label=_data(9, "uint8"))
    with np.load(tmp_path / "m.npz") as f:
        image, label = f["image"], f["label"]
    n5 = read_volumes([str(tmp_path / "c.n5")], dataset="raw")
    np.testing.assert_array_equal(n5[0][...], raw)
    npz = read_volumes([str(tmp_path / "m.npz")], dataset="label")
    np.testing.assert_array_equal(npz[0][...], label)
    both = read_volumes(
        [{"image": str(tmp_path / "m.npz"), "label": str(tmp_path / "m.npz")}],
        dataset={"image": "image", "label": "label"},
    )
    np.testing.assert_array_equal(both[0]["image"][...], image)
    np.testing.assert_array_equal(both[0]["label"][...], label)
    with pytest.raises(ValueError, match=r"volumes\[0\].*m\.npz"):
        read_volumes([str(tmp_path / "m.npz")])[0]  # two members, none named


def test_suffixes_and_the_accepted_list() -> None:
    for name, fmt in [
        ("x.nii.gz", "nifti"),
        ("X.NII", "nifti"),
        ("x.ome.tif", "tiff"),
        ("x.ome.tiff", "tiff"),
        ("x.TIF", "tiff"),
        ("x.n5/", "n5"),
        ("x.b2nd", "b2nd"),
        ("x.npz", "npz"),
        ("x.zarr", "zarr"),
        ("x.h5", "hdf5"),
        ("x.gz", None),
    ]:
        assert suffix_format(name) == fmt, name
    assert ".nii.gz" in VOLUME_SUFFIXES


def test_unknown_names_list_every_format(tmp_path: Path) -> None:
    odd = tmp_path / "scan.mha"
    odd.write_bytes(b"ObjectType = Image\n")
    with pytest.raises(UnsupportedStoreError) as info:
        read_volumes([str(odd)])
    for what in (".nii.gz", ".ome.tiff", ".n5", ".b2nd", ".npz", ".h5", ".npy", "zarr"):
        assert what in str(info.value)


def test_remote_files_of_local_only_formats_are_refused_early() -> None:
    with pytest.raises(UnsupportedStoreError, match=r"is a nifti file: .*local paths only"):
        read_volumes(["s3://bucket/scan.nii.gz"])


def test_an_n5_container_behind_a_url(tmp_path: Path) -> None:
    raw = _n5(tmp_path / "u.n5" / "raw", _data(10))
    fs = fsspec.filesystem("memory")
    fs.put(str(tmp_path / "u.n5"), "/mixle-test/u.n5", recursive=True)
    try:
        vols = read_volumes(["memory://mixle-test/u.n5"], dataset="raw")
        assert type(vols[0]).__name__ == "N5ArraySource"
        np.testing.assert_array_equal(vols[0][...], raw)
    finally:
        fs.rm("/mixle-test", recursive=True)


def test_dict_entries_of_the_new_formats_are_arrays_not_metadata(
    every_format, tmp_path: Path
) -> None:
    paths, truth, _ = every_format
    vols = read_volumes([{"image": paths[0], "label": paths[2], "age": 3}])
    assert vols.names == ("image", "label") and vols.columns == ("age",)
    np.testing.assert_array_equal(vols[0]["label"][...], truth[2])
    with pytest.raises(UnsupportedStoreError, match="format mixle does not open"):
        read_volumes([{"image": paths[0], "label": "seg.nrrd"}])
