"""Review fixes: spatial axes by name, single-number sizes, float32 rounding, zarr groups.

``world=True`` and ``patch_size_mm=`` take the spatial axes from the names the format
records (NIfTI keeps time last, an RGB OME-TIFF its samples, OME images their channels
first), never silently the trailing axes. Files are written by nibabel, tifffile,
ome-zarr-py, zarr, ``zip -r``, icechunk and netCDF4; expected values come from the
geometry written and from those libraries' own reads.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import tifffile
import zarr
from _ome_zarr_writer import write_ome_zarr

from mixle.data.sampling import physical_patches
from mixle.data.sampling.aligned import read_zarr_arrays
from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.arrays.nifti import read_nifti
from mixle.data.sources.arrays.physical import physical_from_spacing
from mixle.data.sources.arrays.tiff import read_tiff
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.data.sources.collection import read_volumes
from mixle.data.sources.collection.openers import VOLUME_SUFFIXES, suffix_format
from mixle.errors import UnsupportedStoreError
from mixle.testing import assert_unchanged


# -- files written by the formats' own writers -----------------------------------------
def _nifti_4d(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A 4-D NIfTI (x, y, z, t) written by nibabel: its data and affine as nibabel reads."""
    affine = np.diag([2.0, 3.0, 5.0, 1.0])
    affine[:3, 3] = [100.0, 200.0, 300.0]
    data = np.random.default_rng(0).integers(0, 100, (10, 12, 8, 6)).astype(np.int16)
    nib.save(nib.Nifti1Image(data, affine), str(path))
    ref = nib.load(str(path))
    return np.asarray(ref.dataobj), ref.affine


def _rgb_ome_tiff(path: Path) -> np.ndarray:
    data = np.random.default_rng(1).integers(0, 255, (10, 20, 30, 3)).astype(np.uint8)
    metadata = {"axes": "ZYXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.25}
    tifffile.imwrite(str(path), data, photometric="rgb", ome=True, metadata=metadata)
    return tifffile.imread(str(path))


def _czyx_ome_tiff(path: Path) -> np.ndarray:
    data = np.random.default_rng(2).integers(0, 4000, (3, 10, 20, 30)).astype(np.uint16)
    metadata = {
        "axes": "CZYX",
        "PhysicalSizeX": 0.5,
        "PhysicalSizeY": 0.25,
        "PhysicalSizeZ": 2.0,
        "PhysicalSizeXUnit": "µm",
        "PhysicalSizeYUnit": "µm",
        "PhysicalSizeZUnit": "µm",
    }
    tifffile.imwrite(str(path), data, ome=True, metadata=metadata)
    return tifffile.imread(str(path))


def _czyx_ome_zarr(path: Path) -> np.ndarray:
    """A c, z, y, x OME-Zarr image written by ome-zarr-py (0.5, um), as zarr reads it."""
    data = np.random.default_rng(3).integers(0, 900, (2, 6, 16, 20)).astype(np.uint16)
    units = dict.fromkeys("zyx", "micrometer")
    scale = {"c": 1.0, "z": 2.0, "y": 0.5, "x": 0.25}
    write_ome_zarr(path, data, version="0.5", axes="czyx", scale=scale, axes_units=units)
    return np.asarray(zarr.open_array(str(path / "s0"), mode="r")[...])


# -- 1. world=True and patch_size_mm= take the spatial axes by name --------------------
def test_world_refuses_a_nifti_whose_time_axis_is_last(tmp_path: Path) -> None:
    path = tmp_path / "t4.nii.gz"
    _nifti_4d(path)
    src = read_nifti(path)
    assert src.physical is not None and src.physical.axes == ("i", "j", "k", "t")
    assert physical_patches.spatial_axes(src.physical) == (0, 1, 2)
    # the trailing three axes are j, k, t: their "world" would be [y, z, t], silently wrong
    with pytest.raises(ValueError, match=r"world=True: the spatial axes of .* are i, j, k") as e:
        PatchSampler(src, (4, 4, 4), 2, world=True)
    text = str(e.value)
    assert "axes 0-2 of 4" in text and "axes 1-3 (j, k, t)" in text
    assert "t (axis 3) comes after them" in text and "spatial axes last" in text
    with pytest.raises(ValueError, match=r"are i, j, k .* covers axes 0-3 \(i, j, k, t\)"):
        PatchSampler(src, (4, 4, 4, 2), 2, world=True)
    with pytest.raises(ValueError, match=r"patch_size_mm=\(8.0, 8.0, 8.0\): the spatial axes"):
        PatchSampler(src, num_patches=2, patch_size_mm=(8.0, 8.0, 8.0))
    with pytest.raises(ValueError, match=r"patch_size_mm=10.0: the spatial axes .* i, j, k"):
        PatchSampler(src, num_patches=2, patch_size_mm=10.0)
    PatchSampler(src, (4, 4, 4), 2)  # voxels without world positions: still fine


def test_world_of_a_3d_nifti_is_nibabels_affine(tmp_path: Path) -> None:
    affine = np.array([[0, 0, 2.0, -7.0], [0, 1.5, 0, 3.0], [0.5, 0, 0, 11.0], [0, 0, 0, 1]])
    data = np.arange(9 * 8 * 7, dtype=np.int16).reshape(9, 8, 7)
    nib.save(nib.Nifti1Image(data, affine), str(tmp_path / "a.nii"))
    ref = nib.load(str(tmp_path / "a.nii"))
    sampler = PatchSampler(read_nifti(tmp_path / "a.nii"), (3, 4, 2), 8, seed=1, world=True)
    patches, coords, world = sampler.get_batch(np.arange(8))
    np.testing.assert_allclose(world, nib.affines.apply_affine(ref.affine, coords), atol=1e-9)
    for patch, (i, j, k) in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(
            patch, np.asarray(ref.dataobj)[i : i + 3, j : j + 4, k : k + 2]
        )


def test_world_refuses_rgb_samples_after_space(tmp_path: Path) -> None:
    path = tmp_path / "rgb.ome.tif"
    _rgb_ome_tiff(path)
    src = read_tiff(path)
    assert src.physical is not None and src.physical.axes == ("z", "y", "x", "s")
    with pytest.raises(ValueError, match=r"are z, y, x \(axes 0-2 of 4\) .* s \(axis 3\)"):
        PatchSampler(src, (4, 4, 3), 2, world=True)
    with pytest.raises(ValueError, match=r"patch_size_mm=0.004: the spatial axes .* z, y, x"):
        PatchSampler(src, num_patches=2, patch_size_mm=0.004)


def test_world_with_channels_first_is_the_spatial_affine(tmp_path: Path) -> None:
    path = tmp_path / "c.ome.tif"
    truth = _czyx_ome_tiff(path)
    src = read_tiff(path)
    assert physical_patches.spatial_axes(src.physical) == (1, 2, 3)
    sampler = PatchSampler(src, (2, 5, 4), 6, seed=3, world=True)
    patches, coords, world = sampler.get_batch(np.arange(6))
    np.testing.assert_allclose(world, coords * [2.0, 0.25, 0.5], rtol=0, atol=1e-12)  # um
    for patch, (z, y, x) in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(patch, truth[:, z : z + 2, y : y + 5, x : x + 4])
    with pytest.raises(ValueError, match=r"covers axes 0-3 \(c, z, y, x\).*give patch_size 3"):
        PatchSampler(src, (1, 2, 5, 4), 6, world=True)


# -- 2. one number covers the spatial axes only ----------------------------------------
def test_one_patch_size_mm_skips_the_channel_axis_of_an_ome_tiff(tmp_path: Path) -> None:
    path = tmp_path / "c.ome.tif"
    truth = _czyx_ome_tiff(path)
    src = read_tiff(path)
    with assert_unchanged(path):
        sampler = PatchSampler(src, num_patches=4, patch_size_mm=0.004, seed=0)
        assert sampler.patch_size == (2, 16, 8)  # 4 um over 2, 0.25 and 0.5 um
        assert sampler.channel_shape == (3,)
        patches, coords = sampler.get_batch(np.arange(4))
    assert patches.shape == (4, 3, 2, 16, 8)
    for patch, (z, y, x) in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(patch, truth[:, z : z + 2, y : y + 16, x : x + 8])
    per_axis = PatchSampler(src, num_patches=4, patch_size_mm=(0.004,) * 3, seed=0)
    assert per_axis.patch_size == sampler.patch_size


def test_one_patch_size_mm_skips_the_channel_axis_of_an_ome_zarr(tmp_path: Path) -> None:
    path = tmp_path / "img.ome.zarr"
    truth = _czyx_ome_zarr(path)
    src = ZarrArraySource(path, "s0")
    sampler = PatchSampler(src, num_patches=5, patch_size_mm=0.004, seed=2, world=True)
    assert sampler.patch_size == (2, 8, 16) and sampler.channel_shape == (2,)
    patches, coords, world = sampler.get_batch(np.arange(5))
    np.testing.assert_allclose(world, coords * [2.0, 0.5, 0.25], rtol=0, atol=1e-12)
    for patch, (z, y, x) in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(patch, truth[:, z : z + 2, y : y + 8, x : x + 16])


def test_a_space_axis_of_another_name_counts_by_its_length_unit(tmp_path: Path) -> None:
    path = tmp_path / "named.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    data = np.arange(3 * 12 * 10, dtype=np.int32).reshape(3, 12, 10)
    group.create_array("0", data=data, chunks=(1, 5, 5))
    axes = [
        {"name": "band", "type": "channel"},
        {"name": "row", "type": "space", "unit": "millimeter"},
        {"name": "col", "type": "space", "unit": "millimeter"},
    ]
    transforms = [{"type": "scale", "scale": [1.0, 0.5, 2.0]}]
    datasets = [{"path": "0", "coordinateTransformations": transforms}]
    ms = {"version": "0.4", "axes": axes, "datasets": datasets}
    group.attrs.update({"multiscales": [ms]})
    src = ZarrArraySource(path, "0")
    assert physical_patches.spatial_axes(src.physical) == (1, 2)
    sampler = PatchSampler(src, num_patches=2, patch_size_mm=4.0)
    assert sampler.patch_size == (8, 2) and sampler.channel_shape == (3,)


def test_arrays_without_axis_names_keep_the_trailing_rule() -> None:
    physical = physical_from_spacing((1.0, 0.5, 2.0))
    assert physical_patches.spatial_axes(physical) is None
    assert physical_patches.patch_size_from_mm(4.0, physical, 3, "the array") == (4, 8, 2)
    assert physical_patches.patch_size_from_mm((4.0, 4.0), physical, 3, "the array") == (8, 2)
    unknown = physical_from_spacing((1.0, 0.5), axes=("a", "b"))
    assert (
        physical_patches.spatial_axes(unknown) is None
    )  # no name mixle knows: the trailing rule too
    assert physical_patches.patch_size_from_mm(2.0, unknown, 2, "the array") == (2, 4)


def test_tifffile_image_sequence_axis_is_not_nifti_i() -> None:
    physical = physical_from_spacing((1.0, 0.5, 0.5), axes=("i", "y", "x"))
    assert physical_patches.spatial_axes(physical) == (1, 2)
    assert physical_patches.spatial_axes(
        physical_from_spacing((1.0,) * 3, axes=("I", "J", "K"))
    ) == (0, 1, 2)
    timed = physical_from_spacing((1.0, 2.0, 2.0), axes=("t", "y", "x"), units=("s", "mm", "mm"))
    assert physical_patches.spatial_axes(timed) == (1, 2)


def test_a_collection_names_the_volume_whose_axes_do_not_fit(tmp_path: Path) -> None:
    _nifti_4d(tmp_path / "a.nii.gz")
    vols = read_volumes([str(tmp_path / "a.nii.gz")])
    sampler = PatchSampler(vols, (4, 4, 4), 3, world=True)
    with pytest.raises(ValueError, match=r"volume 0 \('.*a\.nii\.gz'\) are i, j, k"):
        sampler.get_batch([0])
    with pytest.raises(ValueError, match=r"patch_size_mm=8.0: the spatial axes of volume 0"):
        PatchSampler(vols, num_patches=3, patch_size_mm=8.0)


def test_a_dict_with_one_number_uses_the_finest_arrays_spatial_axes(tmp_path: Path) -> None:
    path = tmp_path / "c.ome.tif"
    truth = _czyx_ome_tiff(path)
    image = read_tiff(path)
    label = np.zeros((10, 20, 30), dtype=np.uint8)
    sampler = PatchSampler({"image": image, "label": label}, num_patches=3, patch_size_mm=0.004)
    assert sampler.patch_size == (2, 16, 8)
    batch = sampler.get_batch([0, 1, 2])
    assert batch["image"].shape == (3, 3, 2, 16, 8) and batch["label"].shape == (3, 2, 16, 8)
    z, y, x = batch["coords"][1].tolist()
    np.testing.assert_array_equal(batch["image"][1], truth[:, z : z + 2, y : y + 16, x : x + 8])


# -- 5. rounding with float32 spacings --------------------------------------------------
def test_float32_spacings_round_halves_up(tmp_path: Path) -> None:
    affine = np.diag([0.4, 0.4, 0.4, 1.0])
    nib.save(nib.Nifti1Image(np.zeros((12, 12, 12), np.int16), affine), str(tmp_path / "s.nii"))
    zooms = nib.load(str(tmp_path / "s.nii")).header.get_zooms()
    assert 1.0 / float(zooms[0]) < 2.5  # float32(0.4) is a little above 0.4
    src = read_nifti(tmp_path / "s.nii")
    assert PatchSampler(src, num_patches=1, patch_size_mm=1.0).patch_size == (3, 3, 3)
    assert (
        physical_patches.round_voxels(2.4999999627) == 3 and physical_patches.round_voxels(2.5) == 3
    )
    assert (
        physical_patches.round_voxels(2.4999) == 2
        and physical_patches.round_voxels(0.2) == 1
        and physical_patches.round_voxels(3.4999999) == 4
    )
    assert (
        physical_patches.round_voxels(1000.4999) == 1001
        and physical_patches.round_voxels(1000.498) == 1000
    )  # relative
    assert physical_patches.round_voxels(2_500_000.0) == 2_500_000  # at most a quarter voxel


# -- 6. axes of length 1 among or after the spatial ones -------------------------------
def _rotated_single_volume_nifti(path: Path, t: int = 1) -> nib.Nifti1Image:
    """An (X, Y, Z, t) NIfTI with a rotated, scaled, shifted affine, as nibabel reads it."""
    c, s = np.cos(np.pi / 6), np.sin(np.pi / 6)
    rotation = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    affine = nib.affines.from_matvec(rotation @ np.diag([2.0, 1.5, 0.5]), [-20.0, 7.5, 31.0])
    data = np.random.default_rng(7).integers(-500, 500, (9, 10, 16, t)).astype(">i2")
    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm", "sec")
    nib.save(img, str(path))
    return nib.load(str(path))


def _world_by_nibabel(affine: np.ndarray, coords: np.ndarray) -> np.ndarray:
    return np.array([(affine @ [i, j, k, 1.0])[:3] for i, j, k, *_ in coords.tolist()])


def test_world_of_a_single_volume_4d_nifti_is_nibabels_affine(tmp_path: Path) -> None:
    path = tmp_path / "x_1t.nii.gz"
    ref = _rotated_single_volume_nifti(path)
    truth = np.asarray(ref.dataobj)
    assert truth.shape == (9, 10, 16, 1)
    with assert_unchanged(path):
        src = read_nifti(path)
        assert src.physical is not None and src.physical.axes == ("i", "j", "k", "t")
        sampler = PatchSampler(src, (3, 4, 5, 1), 12, seed=3, world=True)
        patches, coords, world = sampler.get_batch(np.arange(12))
        assert coords.shape == (12, 4) and not coords[:, 3].any()
        assert world.shape == (12, 3) and sampler.element_spec()[2].shape == (3,)
        np.testing.assert_allclose(world, _world_by_nibabel(ref.affine, coords), atol=1e-9)
        np.testing.assert_array_equal(sampler.world_array(np.arange(12)), world)
        assert sampler.world_affine is not None and sampler.world_affine.shape == (4, 5)
        for patch, (i, j, k, _) in zip(patches, coords.tolist()):
            np.testing.assert_array_equal(patch, truth[i : i + 3, j : j + 4, k : k + 5, :1])
        patch, corner, one = sampler[5]
        assert corner == tuple(coords[5].tolist())
        np.testing.assert_array_equal(one, world[5])
        np.testing.assert_array_equal(patch, patches[5])
        back = pickle.loads(pickle.dumps(sampler))
        np.testing.assert_array_equal(back.get_batch([0, 5])[2], world[[0, 5]])


def test_patch_size_mm_on_a_single_volume_4d_nifti(tmp_path: Path) -> None:
    path = tmp_path / "x_1t.nii.gz"
    ref = _rotated_single_volume_nifti(path)
    zooms = [float(z) for z in ref.header.get_zooms()[:3]]  # 2.0, 1.5, 0.5 (rotation kept)
    expected = tuple(max(1, int(np.floor(m / z + 0.5))) for m, z in zip((4, 6, 4), zooms))
    assert expected == (2, 4, 8)
    src = read_nifti(path)
    sampler = PatchSampler(src, num_patches=4, patch_size_mm=(4, 6, 4), world=True)
    assert sampler.patch_size == (*expected, 1)
    patches, coords, world = sampler.get_batch(np.arange(4))
    assert patches.shape == (4, 2, 4, 8, 1)
    np.testing.assert_allclose(world, _world_by_nibabel(ref.affine, coords), atol=1e-9)
    truth = np.asarray(ref.dataobj)
    for patch, (i, j, k, _) in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(patch, truth[i : i + 2, j : j + 4, k : k + 8])
    assert PatchSampler(src, num_patches=1, patch_size_mm=4.0).patch_size == (2, 3, 8, 1)
    with pytest.raises(ValueError, match=r"patch_size_mm=\(4.0, 6.0, 4.0, 1.0\): .* 3 spatial"):
        PatchSampler(src, num_patches=1, patch_size_mm=(4, 6, 4, 1))


def test_a_dict_with_a_single_volume_4d_nifti(tmp_path: Path) -> None:
    path = tmp_path / "x_1t.nii.gz"
    ref = _rotated_single_volume_nifti(path)
    truth = np.asarray(ref.dataobj)
    label = (truth > 0).astype(np.uint8)
    arrays = {"image": read_nifti(path), "label": label}
    sampler = PatchSampler(arrays, num_patches=4, patch_size_mm=4.0, world=True, seed=1)
    assert sampler.patch_size == (2, 3, 8, 1)
    batch = sampler.get_batch(np.arange(4))
    assert batch["coords"].shape == (4, 4) and batch["world"].shape == (4, 3)
    np.testing.assert_allclose(
        batch["world"], _world_by_nibabel(ref.affine, batch["coords"]), atol=1e-9
    )
    i, j, k, _ = batch["coords"][2].tolist()
    np.testing.assert_array_equal(batch["image"][2], truth[i : i + 2, j : j + 3, k : k + 8])
    np.testing.assert_array_equal(batch["label"][2], label[i : i + 2, j : j + 3, k : k + 8])


def test_a_length_1_axis_must_have_extent_1(tmp_path: Path) -> None:
    path = tmp_path / "x_1t.nii.gz"
    _rotated_single_volume_nifti(path)
    src = read_nifti(path)
    with pytest.raises(ValueError, match=r"world=True: .* patch_size must be 1 on t") as e:
        PatchSampler(src, (3, 4, 5, 2), 2, padding="constant", world=True)
    assert "give patch_size 4 entries, one per spatial axis (i, j, k) and 1 on" in str(e.value)
    with pytest.raises(ValueError, match=r"covers axes 1-3 \(j, k, t\).* give patch_size 4"):
        PatchSampler(src, (3, 4, 5), 2, padding="constant", world=True)


def test_a_nifti_with_two_time_points_is_still_refused_naming_t(tmp_path: Path) -> None:
    path = tmp_path / "x_2t.nii.gz"
    _rotated_single_volume_nifti(path, t=2)
    src = read_nifti(path)
    with pytest.raises(ValueError, match=r"are i, j, k .* covers axes 0-3") as e:
        PatchSampler(src, (3, 4, 5, 1), 2, world=True)
    assert "t (axis 3) comes after them" in str(e.value)
    with pytest.raises(ValueError, match=r"patch_size_mm=\(4.0, 6.0, 4.0\): .* t \(axis 3\)"):
        PatchSampler(src, num_patches=2, patch_size_mm=(4, 6, 4))
    with pytest.raises(ValueError, match=r"patch_size_mm=4.0: .* t \(axis 3\) comes after"):
        PatchSampler(src, num_patches=2, patch_size_mm=4.0)
    PatchSampler(src, (3, 4, 5, 1), 2)  # voxels without world positions: still fine


def test_a_collection_of_single_volume_4d_niftis(tmp_path: Path) -> None:
    refs = [_rotated_single_volume_nifti(tmp_path / f"v{n}.nii.gz") for n in range(2)]
    vols = read_volumes([str(tmp_path / f"v{n}.nii.gz") for n in range(2)])
    sampler = PatchSampler(vols, num_patches=6, patch_size_mm=(4, 6, 4), world=True, seed=2)
    assert sampler.patch_size == (2, 4, 8, 1)
    assert sampler.element_spec()["world"].shape == (3,)
    batch = sampler.get_batch(np.arange(6))
    assert batch["world"].shape == (6, 3)
    for v, corner, world in zip(batch["volume"], batch["coords"], batch["world"]):
        expected = _world_by_nibabel(refs[int(v)].affine, corner[None])[0]
        np.testing.assert_allclose(world, expected, atol=1e-9)
    np.testing.assert_array_equal(sampler.world_array(np.arange(6)), batch["world"])
    assert sampler.world_affine_of(1).shape == (4, 5)
    _rotated_single_volume_nifti(tmp_path / "w.nii.gz", t=3)
    longer = read_volumes([str(tmp_path / "v0.nii.gz"), str(tmp_path / "w.nii.gz")])
    with pytest.raises(ValueError, match=r"volume 1 .* t \(axis 3\) comes after"):
        PatchSampler(longer, num_patches=1, patch_size_mm=4.0)


def test_one_sample_after_z_y_x() -> None:
    # tifffile cannot write an OME-TIFF of shape (Z, Y, X, 1) with an S axis ("shape does
    # not match stored shape"; a shaped TIFF keeps ZYXS but records no geometry), so the
    # geometry such a file would give is built directly
    physical = physical_from_spacing(
        (2.0, 0.5, 0.25, 1.0), (10.0, 20.0, 30.0, 0.0), axes=("z", "y", "x", "s")
    )
    shape = (6, 16, 20, 1)
    size = physical_patches.patch_size_from_mm(2.0, physical, 4, "the image", shape=shape)
    assert size == (1, 4, 8, 1)
    affine = physical_patches.spatial_affine(physical, 4, "the image", shape=shape, size=size)
    corners = np.array([[3, 5, 7, 0]])
    np.testing.assert_array_equal(
        physical_patches.world_positions(affine, corners), [[16.0, 22.5, 31.75]]
    )
    with pytest.raises(ValueError, match=r"s \(axis 3\) comes after"):
        physical_patches.patch_size_from_mm(2.0, physical, 4, "the image", shape=(6, 16, 20, 3))


# -- 3. read_zarr_arrays opens zipped stores and icechunk repositories ----------------
def _group(path: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(path), mode="w")
    rng = np.random.default_rng(5)
    image = rng.integers(0, 1000, (12, 10)).astype(">i4")
    label = rng.integers(0, 3, (6, 5)).astype(np.uint8)
    group.create_array("image", data=image, chunks=(5, 4))
    group.create_group("seg").create_array("label", data=label, chunks=(3, 3))
    return {"image": image, "seg/label": label}


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs the zip command")
def test_read_zarr_arrays_opens_a_zipped_store(tmp_path: Path) -> None:
    _group(tmp_path / "s.zarr")
    zipped = tmp_path / "s.zarr.zip"
    subprocess.run(["zip", "-q", "-r", str(zipped), "."], cwd=tmp_path / "s.zarr", check=True)
    with zarr.storage.ZipStore(str(zipped), mode="r") as store:
        reference = {n: a[...] for n, a in zarr.open_group(store, mode="r").arrays()}
        reference["seg/label"] = zarr.open_array(store, path="seg/label", mode="r")[...]
    with assert_unchanged(zipped):
        arrays = read_zarr_arrays(zipped)
        assert sorted(arrays) == ["image", "seg/label"]
        for name, src in arrays.items():
            np.testing.assert_array_equal(src[...], reference[name])
            assert src.dtype == reference[name].dtype
        picked = read_zarr_arrays(zipped, {"label": "seg/label"})
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(picked["label"]))[...],
                                      reference["seg/label"])  # fmt: skip
        sampler = PatchSampler(read_zarr_arrays(zipped), (4, 4), 3, seed=1)
        batch = sampler.get_batch([0, 1, 2])
        for corner, patch in zip(batch["coords"], batch["image"]):
            y, x = corner.tolist()
            np.testing.assert_array_equal(patch, reference["image"][y : y + 4, x : x + 4])


def test_read_zarr_arrays_opens_an_icechunk_repository(tmp_path: Path) -> None:
    icechunk = pytest.importorskip("icechunk")
    folder = tmp_path / "repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(folder)))
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    group.create_array("a", shape=(6, 4), dtype="i4", chunks=(4, 4))[:] = np.arange(24).reshape(
        6, 4
    )
    group.create_array("b", shape=(6, 4), dtype="f8", chunks=(3, 4))[:] = 0.5
    first = session.commit("first")
    repo.create_tag("v1", first)
    session = repo.writable_session("main")
    zarr.open_array(session.store, path="a", mode="r+")[:] = -1
    session.commit("second")

    def own(**version: Any) -> dict[str, np.ndarray]:
        store = repo.readonly_session(**version).store
        return {n: a[...] for n, a in zarr.open_group(store, mode="r").arrays()}

    head = read_zarr_arrays(folder)
    assert sorted(head) == ["a", "b"]
    for name, want in own(branch="main").items():
        np.testing.assert_array_equal(head[name][...], want)
    tagged = read_zarr_arrays(folder, ["a"], tag="v1")
    np.testing.assert_array_equal(tagged["a"][...], own(tag="v1")["a"])
    by_id = read_zarr_arrays(folder, {"x": "a"}, snapshot=first)
    np.testing.assert_array_equal(by_id["x"][...], own(snapshot_id=first)["a"])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(by_id["x"]))[...], by_id["x"][...])
    with pytest.raises(ValueError, match=r"tag='nope' cannot be opened"):
        read_zarr_arrays(folder, tag="nope")
    with pytest.raises(ValueError, match="at most one of branch=, tag= and snapshot="):
        read_zarr_arrays(folder, branch="main", tag="v1")


def test_read_zarr_arrays_refuses_versions_outside_icechunk(tmp_path: Path) -> None:
    _group(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match=r"branch='main' only applies to a local icechunk"):
        read_zarr_arrays(tmp_path / "s.zarr", branch="main")
    arrays = read_zarr_arrays(tmp_path / "s.zarr")
    assert sorted(arrays) == ["image", "seg/label"]
    assert os.path.isdir(tmp_path / "s.zarr")


# -- 4. read_volumes: zipped zarr stores, netCDF-4, mask_and_scale= --------------------
@pytest.mark.skipif(shutil.which("zip") is None, reason="needs the zip command")
def test_read_volumes_opens_zipped_zarr_stores(tmp_path: Path) -> None:
    truth, paths = [], []
    for i in range(2):
        store = tmp_path / f"v{i}.zarr"
        group = zarr.open_group(str(store), mode="w")
        data = np.random.default_rng(i).integers(0, 99, (8 + i, 6, 5)).astype("<u2")
        group.create_array("raw", data=data, chunks=(3, 3, 5))
        zipped = tmp_path / f"v{i}.zarr.zip"
        subprocess.run(["zip", "-q", "-r", str(zipped), "."], cwd=store, check=True)
        with zarr.storage.ZipStore(str(zipped), mode="r") as zs:
            truth.append(zarr.open_array(zs, path="raw", mode="r")[...])
        paths.append(str(zipped))
    assert suffix_format("a/B.ZARR.ZIP") == "zarr" and suffix_format("x.zip") is None
    with assert_unchanged(tmp_path / "v0.zarr.zip"):
        vols = read_volumes(paths, component="raw")
        for i, want in enumerate(truth):
            np.testing.assert_array_equal(vols[i][...], want)
        copy = pickle.loads(pickle.dumps(vols))
        np.testing.assert_array_equal(copy[1][...], truth[1])
        sampler = PatchSampler(vols, (3, 3, 3), 4, seed=0)
        batch = sampler.get_batch(np.arange(4))
        for patch, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
            z, y, x = corner.tolist()
            np.testing.assert_array_equal(patch, truth[int(v)][z : z + 3, y : y + 3, x : x + 3])
    dicts = read_volumes([{"image": paths[0], "age": 3}], component="raw")
    assert dicts.names == ("image",) and dicts.columns == ("age",)
    with pytest.raises(UnsupportedStoreError, match=r"zipped zarr store: .*local paths only"):
        read_volumes(["s3://bucket/v0.zarr.zip"])


def _packed_netcdf(path: Path, fmt: str = "NETCDF4") -> None:
    import netCDF4

    with netCDF4.Dataset(str(path), "w", format=fmt) as ds:
        for name, size in (("z", 5), ("y", 6), ("x", 7)):
            ds.createDimension(name, size)
        var = ds.createVariable("t", "i2", ("z", "y", "x"), fill_value=-999)
        var.scale_factor = 0.5
        var.add_offset = 10.0
        var.set_auto_maskandscale(False)
        packed = np.arange(5 * 6 * 7, dtype=np.int16).reshape(5, 6, 7)
        packed[0, 0, :3] = -999
        var[:] = packed


def test_read_volumes_opens_netcdf4_files_as_hdf5(tmp_path: Path) -> None:
    import netCDF4

    from mixle.data.sources.arrays.cf import PackedVariableWarning

    path = tmp_path / "a.nc"
    _packed_netcdf(path)
    with netCDF4.Dataset(str(path)) as ds:
        ds.set_auto_maskandscale(False)
        stored = ds["t"][...]
        ds.set_auto_maskandscale(True)
        decoded = np.ma.filled(ds["t"][...].astype(np.float64), np.nan)
    assert suffix_format("x.nc") == "hdf5" and suffix_format("x.NC4") == "hdf5"
    with pytest.warns(PackedVariableWarning):
        raw = read_volumes([str(path)], dataset="t")[0][...]
    np.testing.assert_array_equal(raw, stored)
    with assert_unchanged(path):
        vols = read_volumes([str(path)], dataset="t", mask_and_scale=True)
        got = vols[0][...]
        np.testing.assert_allclose(got, decoded, rtol=1e-6, equal_nan=True)
        assert np.isnan(got[0, 0, :3]).all() and not np.isnan(got[1]).any()
        copy = pickle.loads(pickle.dumps(vols))
        np.testing.assert_array_equal(copy[0][...], got)
    plain = read_volumes([str(path)], dataset="t")
    assert vols.fingerprint() != plain.fingerprint()
    with pytest.raises(ValueError, match=r"is a netCDF-4 file: pass dataset="):
        read_volumes([str(path)])
    with pytest.raises(TypeError, match=r"mask_and_scale='yes' must be True or False"):
        read_volumes([str(path)], dataset="t", mask_and_scale="yes")


def test_mask_and_scale_reaches_zarr_volumes(tmp_path: Path) -> None:
    path = tmp_path / "p.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    arr = group.create_array("v", shape=(4, 5), dtype="i2", chunks=(2, 5), fill_value=None)
    arr[:] = np.arange(20, dtype=np.int16).reshape(4, 5)
    arr.attrs.update({"scale_factor": 0.25, "add_offset": -1.0})
    vols = read_volumes([str(path)], component="v", mask_and_scale=True)
    want = np.arange(20).reshape(4, 5) * 0.25 - 1.0
    np.testing.assert_allclose(vols[0][...], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pickle.loads(pickle.dumps(vols))[0][...], want, atol=1e-12)


def test_a_netcdf3_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "classic.nc"
    _packed_netcdf(path, "NETCDF3_CLASSIC")
    with pytest.raises(UnsupportedStoreError, match=r"netCDF-3 \(classic\) file.*nccopy -k nc4"):
        read_volumes([str(path)], dataset="t")[0]


def test_the_accepted_formats_name_the_new_suffixes(tmp_path: Path) -> None:
    odd = tmp_path / "scan.mha"
    odd.write_bytes(b"ObjectType = Image\n")
    with pytest.raises(UnsupportedStoreError) as info:
        read_volumes([str(odd)])
    for what in (".zarr.zip", ".nc", ".nc4", "netCDF-4", ".h5"):
        assert what in str(info.value)
    assert {".zarr.zip", ".nc", ".nc4"} <= set(VOLUME_SUFFIXES)
