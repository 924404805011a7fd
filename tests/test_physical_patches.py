"""Patches in world units: ``world=True`` positions and ``patch_size_mm=`` sizes.

World positions are checked against the affine applied by hand (``affine @ [*corner, 1]``),
for single arrays, channels, dicts of arrays, collections (each volume's own affine, NIfTI
files written by nibabel) and through the Loader.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sampling.physical_patches import patch_size_from_mm
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.physical import (
    Physical,
    physical_from_affine,
    physical_from_spacing,
)
from mixle.data.sources.collection import read_volumes
from mixle.data.structure import EXCHANGEABLE
from mixle.loading.loader import Loader
from mixle.testing import check_array_source


class PhysicalArray(ArraySource):
    """An in-memory array with the geometry a format would record (pickles with it)."""

    def __init__(self, data: np.ndarray, physical: Physical | None) -> None:
        self._init_state({"data": data, "physical": physical}, EXCHANGEABLE, None)

    def _open(self) -> Any:
        assert self._args is not None
        return self._args["data"]

    def _describe(self, handle: Any) -> ArrayMeta:
        assert self._args is not None
        return ArrayMeta(tuple(handle.shape), handle.dtype, physical=self._args["physical"])

    def _location(self) -> str:
        return "<in memory>"


def _by_hand(affine: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """``affine @ [*corner, 1]``, first ``nd`` entries, one corner at a time."""
    nd = affine.shape[0] - 1
    return np.array([(affine @ np.append(c, 1.0))[:nd] for c in np.asarray(corners, float)])


def _vol(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, shape).astype(np.float32)


def _affine(nd: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.eye(nd + 1)
    a[:nd, :nd] = np.diag(rng.uniform(0.2, 3.0, nd)) + rng.uniform(-0.3, 0.3, (nd, nd))
    a[:nd, nd] = rng.uniform(-100, 100, nd)
    return a


def test_the_test_source_keeps_the_source_contract() -> None:
    src = PhysicalArray(_vol((6, 5, 4)), physical_from_spacing((1.0, 2.0, 3.0)))
    assert pickle.loads(pickle.dumps(src)).spacing == (1.0, 2.0, 3.0)
    check_array_source(src, _vol((6, 5, 4)))  # closes it


PLACEMENTS = [
    {},
    {"padding": "constant"},
    {"padding": "reflect", "stride": 2},
    {"replacement": False},
    {"patches_per_chunk": 3},
]


@settings(max_examples=40, deadline=None)
@given(
    nd=st.integers(1, 3),
    channels=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
    placement=st.sampled_from(PLACEMENTS),
)
def test_world_is_the_affine_applied_to_each_corner(
    nd: int, channels: int, seed: int, placement: dict[str, Any]
) -> None:
    rng = np.random.default_rng(seed)
    spatial = tuple(int(x) for x in rng.integers(3, 9, nd))
    lead = (2,) * channels
    full = _affine(nd + channels, seed)
    full[channels:-1, :channels] = 0  # space does not move along channels
    src = PhysicalArray(_vol((*lead, *spatial), seed), physical_from_affine(full))
    size = tuple(int(rng.integers(1, s + 1)) for s in spatial)
    n = None if placement.get("replacement") is False else 9
    sampler = PatchSampler(src, size, n, seed=seed, world=True, **placement)
    spatial_affine = np.eye(nd + 1)
    spatial_affine[:nd, :nd] = full[channels:-1, channels:-1]
    spatial_affine[:nd, nd] = full[channels:-1, -1]
    every = np.arange(len(sampler))
    patches, coords, world = sampler.get_batch(every)
    assert coords.dtype == np.int64 and world.dtype == np.float64
    assert world.shape == (len(sampler), nd) and patches.shape == (len(sampler), *lead, *size)
    np.testing.assert_allclose(world, _by_hand(spatial_affine, coords), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(sampler.world_array(), world)
    np.testing.assert_array_equal(sampler.get_batch(every[::-2])[2], world[::-2])
    for i, (patch, corner, w) in enumerate(sampler.records()):
        assert corner == tuple(coords[i].tolist())
        np.testing.assert_array_equal(w, world[i])  # bit for bit: the same in any batch
        np.testing.assert_array_equal(patch, patches[i])


def test_element_spec_and_batches_agree() -> None:
    src = PhysicalArray(_vol((2, 10, 12)), physical_from_spacing((1.0, 0.5, 0.25)))
    sampler = PatchSampler(src, (4, 5), 6, world=True)
    patch, coords, world = sampler.element_spec()
    assert (patch.shape, coords.shape, world.shape) == ((2, 4, 5), (2,), (2,))
    assert (coords.dtype, world.dtype) == (np.int64, np.float64)
    batch = sampler.get_batch([0, 3])
    assert [b.shape[1:] for b in batch] == [patch.shape, coords.shape, world.shape]
    assert [b.dtype for b in batch] == [patch.dtype, coords.dtype, world.dtype]
    assert sampler.world and "world=True" in repr(sampler)
    plain = PatchSampler(src, (4, 5), 6)
    assert len(plain.element_spec()) == 2 and len(plain.get_batch([0])) == 2
    assert not plain.world and plain.world_affine is None
    with pytest.raises(ValueError, match="world=True"):
        plain.world_array()


def test_world_with_a_dict_uses_the_finest_array() -> None:
    a = _affine(2, 4)
    image = PhysicalArray(_vol((12, 10)), physical_from_affine(a))
    coarse = physical_from_spacing((9.0, 9.0))  # a label's own geometry: not used
    label = PhysicalArray(_vol((6, 5)), coarse)
    sampler = PatchSampler({"label": label, "image": image}, (4, 4), 7, world=True, seed=2)
    batch = sampler.get_batch(np.arange(7))
    np.testing.assert_allclose(batch["world"], _by_hand(a, batch["coords"]), atol=1e-9)
    assert sampler.element_spec()["world"].dtype == np.float64
    record = sampler[3]
    np.testing.assert_array_equal(record["world"], batch["world"][3])


def test_world_without_geometry_is_an_error_not_an_identity() -> None:
    with pytest.raises(ValueError, match=r"world=True: .*records no voxel-to-world"):
        PatchSampler(_vol((8, 8)), 4, 3, world=True)
    with pytest.raises(ValueError, match=r"array 'b'.*records no voxel-to-world"):
        PatchSampler({"b": _vol((8, 8)), "a": _vol((4, 4))}, 4, 3, world=True)
    with pytest.raises(TypeError, match=r"world='yes' must be True or False"):
        PatchSampler(_vol((8, 8)), 4, 3, world="yes")


def test_an_affine_mixing_channels_into_space_is_refused() -> None:
    a = np.eye(4)
    a[1, 0] = 0.5  # world y moves with the channel index
    src = PhysicalArray(_vol((2, 8, 8)), physical_from_affine(a))
    with pytest.raises(ValueError, match="leading \\(channel\\) axes"):
        PatchSampler(src, (4, 4), 3, world=True)


def test_a_dict_array_named_world_is_refused_with_world() -> None:
    src = PhysicalArray(_vol((8, 8)), physical_from_spacing((1.0, 1.0)))
    with pytest.raises(ValueError, match="named 'world'"):
        PatchSampler({"world": src, "b": src}, 4, 3, world=True)


def test_loader_batches_carry_the_samplers_world_values() -> None:
    src = PhysicalArray(_vol((16, 14, 12)), physical_from_affine(_affine(3, 9)))
    sampler = PatchSampler(src, (4, 5, 6), 10, seed=5, world=True)
    batches = list(Loader(sampler, 4, num_threads=2))
    assert [len(b) for b in batches] == [3, 3, 3]
    world = np.concatenate([b[2] for b in batches])
    np.testing.assert_array_equal(world, sampler.world_array())
    shuffled = list(Loader(sampler, 3, shuffle=True, seed=1, num_threads=0))
    for _, coords, w in shuffled:
        np.testing.assert_allclose(w, _by_hand(sampler.world_affine, coords), atol=1e-9)
    spec = Loader(sampler, 4).element_spec()
    assert spec[2].shape == (4, 3) and spec[2].dtype == np.float64


def test_sampler_pickles_with_world_and_patch_size_mm() -> None:
    src = PhysicalArray(_vol((16, 14, 12)), physical_from_spacing((0.5, 1.0, 2.0), (1, 2, 3)))
    sampler = PatchSampler(src, num_patches=8, patch_size_mm=4.0, world=True, seed=3)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.patch_size == sampler.patch_size == (8, 4, 2)
    assert copy.patch_size_mm == 4.0
    for got, want in zip(copy.get_batch(range(8)), sampler.get_batch(range(8))):
        np.testing.assert_array_equal(got, want)
    assert copy.fingerprint() == sampler.fingerprint()


def test_world_is_in_the_fingerprint() -> None:
    src = PhysicalArray(_vol((16, 14)), physical_from_spacing((0.5, 1.0)))
    other = PhysicalArray(_vol((16, 14)), physical_from_spacing((0.5, 1.0), (3.0, 0.0)))
    plain = PatchSampler(src, 4, 5).fingerprint()
    world = PatchSampler(src, 4, 5, world=True).fingerprint()
    moved = PatchSampler(other, 4, 5, world=True).fingerprint()
    assert len({plain, world, moved}) == 3
    assert PatchSampler(src, 4, 5, world=True).fingerprint() == world


# -- patch_size_mm ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    spacing=st.lists(st.floats(0.05, 5.0), min_size=1, max_size=3),
    mm=st.floats(0.01, 40.0),
)
def test_patch_size_mm_is_rounded_voxels_at_least_one(spacing: list[float], mm: float) -> None:
    physical = physical_from_spacing(spacing)
    size = patch_size_from_mm(mm, physical, len(spacing), "the array")
    for voxels, step in zip(size, spacing):
        q = mm / step
        assert voxels >= 1
        if abs(q - (np.floor(q) + 0.5)) > 1e-6 * max(1.0, q):  # not a half (float32-near)
            assert voxels == max(1, int(np.floor(q + 0.5)))
        else:
            assert voxels == max(1, int(np.floor(q)) + 1)  # halves up
        if voxels > 1:  # the nearest voxel count: within half a voxel of the size asked
            assert abs(voxels * step - mm) <= step / 2 + 1e-6 * mm + 1e-9


def test_patch_size_mm_per_axis_and_channels() -> None:
    src = PhysicalArray(_vol((3, 40, 30, 20)), physical_from_spacing((1.0, 0.5, 1.5, 2.0)))
    sampler = PatchSampler(src, num_patches=4, patch_size_mm=(10, 15, 9))
    assert sampler.patch_size == (20, 10, 5)  # 9 / 2 = 4.5 rounds up
    assert sampler.channel_shape == (3,)
    assert sampler.get_batch([0, 1])[0].shape == (2, 3, 20, 10, 5)
    assert sampler.patch_size_mm == (10.0, 15.0, 9.0)
    assert "patch_size_mm=(10.0, 15.0, 9.0)" in repr(sampler)
    tiny = PatchSampler(src, num_patches=1, patch_size_mm=(0.1, 0.1, 0.1))
    assert tiny.patch_size == (1, 1, 1)


def test_patch_size_mm_converts_recorded_units() -> None:
    um = physical_from_spacing((0.5, 0.25), units=("micrometer", "micrometer"))
    src = PhysicalArray(_vol((40, 40)), um)
    assert PatchSampler(src, num_patches=1, patch_size_mm=0.005).patch_size == (10, 20)
    seconds = physical_from_spacing((1.0, 1.0), units=("second", "mm"))
    with pytest.raises(ValueError, match=r"unit 'second' on spatial axis 0"):
        PatchSampler(PhysicalArray(_vol((40, 40)), seconds), num_patches=1, patch_size_mm=2)


def test_patch_size_mm_errors() -> None:
    src = PhysicalArray(_vol((10, 10)), physical_from_spacing((1.0, 1.0)))
    with pytest.raises(TypeError, match="pass patch_size= \\(voxels\\) or patch_size_mm="):
        PatchSampler(src, num_patches=3)
    with pytest.raises(TypeError, match="both given"):
        PatchSampler(src, 4, 3, patch_size_mm=4.0)
    with pytest.raises(ValueError, match=r"records no voxel spacing.*patch_size= in voxels"):
        PatchSampler(_vol((10, 10)), num_patches=3, patch_size_mm=4.0)
    with pytest.raises(ValueError, match=r"must be finite and > 0"):
        PatchSampler(src, num_patches=3, patch_size_mm=(4.0, -1.0))
    with pytest.raises(TypeError, match=r"must be a number"):
        PatchSampler(src, num_patches=3, patch_size_mm="4")
    with pytest.raises(ValueError, match=r"has 3 entries; .* has 2 axes"):
        PatchSampler(src, num_patches=3, patch_size_mm=(1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"patch_size_mm=30.0 is patch_size=\(30, 30\) voxels"):
        PatchSampler(src, num_patches=3, patch_size_mm=30.0)


def test_patch_size_mm_of_a_dict_uses_the_finest_array() -> None:
    image = PhysicalArray(_vol((20, 20)), physical_from_spacing((0.5, 0.5)))
    label = PhysicalArray(_vol((10, 10)), physical_from_spacing((1.0, 1.0)))
    sampler = PatchSampler({"label": label, "image": image}, num_patches=2, patch_size_mm=4.0)
    assert sampler.patch_size == (8, 8)
    batch = sampler.get_batch([0, 1])
    assert batch["image"].shape == (2, 8, 8) and batch["label"].shape == (2, 4, 4)


# -- collections ------------------------------------------------------------------------
def _nifti(path: Path, shape: tuple[int, ...], affine: np.ndarray, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 500, shape).astype(np.int16)
    nib.save(nib.Nifti1Image(data, affine), str(path))
    return np.asarray(nib.load(str(path)).dataobj)


@pytest.fixture
def niftis(tmp_path: Path) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    """Three NIfTI volumes (nibabel-written), one spacing, each with its own affine."""
    affines, truth = [], []
    for i, shape in enumerate([(20, 18, 16), (16, 22, 18), (18, 18, 20)]):
        a = np.diag([0.8, 0.8, 1.6, 1.0])
        a[:3, 3] = [10.0 * i, -5.0 * i, 2.0]
        truth.append(_nifti(tmp_path / f"case{i}.nii.gz", shape, a, i))
        affines.append(nib.load(str(tmp_path / f"case{i}.nii.gz")).affine)
    return str(tmp_path / "*.nii.gz"), affines, truth


def test_a_collection_uses_each_volumes_own_affine(niftis) -> None:
    pattern, affines, truth = niftis
    vols = read_volumes(pattern)
    sampler = PatchSampler(vols, (6, 5, 4), 30, seed=4, world=True, patches_per_volume=2)
    batch = sampler.get_batch(np.arange(30))
    assert set(batch["volume"].tolist()) == {0, 1, 2}
    for patch, corner, v, w in zip(
        batch["patch"], batch["coords"], batch["volume"], batch["world"]
    ):
        np.testing.assert_allclose(w, _by_hand(affines[int(v)], corner[None])[0], atol=1e-9)
        box = tuple(slice(c, c + p) for c, p in zip(corner.tolist(), (6, 5, 4)))
        np.testing.assert_array_equal(patch, truth[int(v)][box])
    np.testing.assert_array_equal(sampler.world_array(np.arange(30)), batch["world"])
    np.testing.assert_array_equal(sampler.field_values("world", np.arange(30)), batch["world"])
    assert sampler.element_spec()["world"].shape == (3,)
    assert sampler.world and "world=True" in repr(sampler)
    np.testing.assert_allclose(sampler.world_affine_of(1), affines[1], atol=1e-6)
    record = sampler[7]
    np.testing.assert_array_equal(record["world"], batch["world"][7])
    copy = pickle.loads(pickle.dumps(sampler))
    np.testing.assert_array_equal(copy.get_batch(np.arange(30))["world"], batch["world"])
    loaded = np.concatenate([b["world"] for b in Loader(sampler, 8, num_threads=2)])
    np.testing.assert_array_equal(loaded, batch["world"])


def test_a_collection_converts_patch_size_mm_with_the_volumes_spacing(niftis) -> None:
    pattern, _, _ = niftis
    vols = read_volumes(pattern)
    assert vols.spacing(2) == pytest.approx((0.8, 0.8, 1.6))
    sampler = PatchSampler(vols, num_patches=6, patch_size_mm=(8.0, 4.0, 8.0))
    assert sampler.patch_size == (10, 5, 5)
    assert sampler.patch_size_mm == (8.0, 4.0, 8.0)
    assert sampler.get_batch(np.arange(6))["patch"].shape == (6, 10, 5, 5)
    assert "patch_size_mm=(8.0, 4.0, 8.0)" in repr(sampler)


def test_a_collection_of_different_spacings_refuses_patch_size_mm(tmp_path: Path) -> None:
    for i, step in enumerate([1.0, 1.0, 0.5]):
        _nifti(tmp_path / f"s{i}.nii", (24, 24, 24), np.diag([step, step, 2.0, 1.0]), i)
    vols = read_volumes(str(tmp_path / "*.nii"))
    with pytest.raises(ValueError, match="different voxel patch sizes") as info:
        PatchSampler(vols, num_patches=4, patch_size_mm=8.0)
    text = str(info.value)
    assert "different voxel patch sizes" in text and "Resample" in text
    assert "volume 0 ('" in text and "(8, 8, 4) voxels (and 1 more volumes)" in text
    assert "volume 2 ('" in text and "spacing (0.5, 0.5, 2.0) -> (16, 16, 4) voxels" in text
    # the same voxels everywhere is what a caller can ask instead
    assert PatchSampler(vols, (8, 8, 4), 4).patch_size == (8, 8, 4)


def test_a_collection_volume_without_geometry_is_named(tmp_path: Path) -> None:
    _nifti(tmp_path / "a.nii", (10, 10, 10), np.eye(4), 0)
    np.save(tmp_path / "b.npy", _vol((10, 10, 10)).astype(np.int16))
    vols = read_volumes([str(tmp_path / "a.nii"), str(tmp_path / "b.npy")])
    assert vols.spacing(1) is None and vols.physical(1) is None
    with pytest.raises(ValueError, match=r"volume 1 \('.*b\.npy'\).*records no voxel spacing"):
        PatchSampler(vols, num_patches=4, patch_size_mm=4.0)
    sampler = PatchSampler(vols, 4, 20, world=True, seed=1)
    with pytest.raises(ValueError, match=r"volume 1 \('.*b\.npy'\).*no voxel-to-world"):
        sampler.get_batch(np.arange(20))


def test_a_collection_checks_size_arguments_and_world_names(niftis) -> None:
    pattern, _, _ = niftis
    vols = read_volumes(pattern)
    with pytest.raises(TypeError, match="both given"):
        PatchSampler(vols, 4, 3, patch_size_mm=4.0)
    with pytest.raises(TypeError, match="needs a patch size"):
        PatchSampler(vols, num_patches=3)
    with pytest.raises(TypeError, match="must be True or False"):
        PatchSampler(vols, 4, 3, world=1)
