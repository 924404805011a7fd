"""PatchSampler over a VolumeCollection: ground truth per volume, every placement mode, errors."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sampling.volume_patches import VolumePatchSampler
from mixle.data.sources.arrays.adopt import ArrayLikeSource

#: 99.9% quantile of the chi-square distribution with 3 degrees of freedom.
CHI2_3_999 = 16.27


def _vol(shape: tuple[int, ...], seed: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=shape).astype(dtype)


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[list[str], list[np.ndarray]]:
    """A zarr, an HDF5 and a .npy volume of different shapes, with their writers' reads."""
    shapes = [(20, 17, 13), (11, 24, 9), (16, 16, 16)]
    data = [_vol(s, i) for i, s in enumerate(shapes)]
    zpath = str(tmp_path / "a.zarr")
    z = zarr.create_array(zpath, shape=shapes[0], chunks=(8, 8, 8), dtype="float32")
    z[:] = data[0]
    hpath = str(tmp_path / "b.h5")
    with h5py.File(hpath, "w") as f:
        f.create_dataset("img", data=data[1], chunks=(4, 8, 9), compression="gzip")
    npath = str(tmp_path / "c.npy")
    np.save(npath, data[2])
    truth = [
        zarr.open_array(zpath, mode="r")[...],
        h5py.File(hpath, "r")["img"][...],
        np.load(npath),
    ]
    return [zpath, hpath, npath], truth


def _check_patches(batch: dict[str, Any], truth: list[np.ndarray], size: tuple[int, ...]) -> None:
    for patch, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
        box = tuple(slice(c, c + p) for c, p in zip(corner.tolist(), size))
        np.testing.assert_array_equal(patch, truth[int(v)][box])


def test_every_patch_is_numpy_slicing_of_its_own_volume(mixed) -> None:
    paths, truth = mixed
    vols = mixle.read_volumes(paths, dataset="img")
    sampler = mixle.PatchSampler(vols, (5, 6, 4), 300, seed=3)
    assert isinstance(sampler, VolumePatchSampler) and isinstance(sampler, mixle.PatchSampler)
    batch = sampler.get_batch(np.arange(300))
    assert set(batch) == {"patch", "coords", "volume"}
    assert batch["patch"].shape == (300, 5, 6, 4) and batch["patch"].dtype == np.float32
    assert batch["coords"].dtype == np.int64 and batch["volume"].dtype == np.int64
    assert set(batch["volume"].tolist()) == {0, 1, 2}
    _check_patches(batch, truth, (5, 6, 4))
    np.testing.assert_array_equal(batch["volume"], sampler.volumes_array(np.arange(300)))
    np.testing.assert_array_equal(batch["coords"], sampler.coords_array(np.arange(300)))
    one = sampler[17]
    assert int(one["volume"]) == batch["volume"][17]
    np.testing.assert_array_equal(one["patch"], batch["patch"][17])
    np.testing.assert_array_equal(one["coords"], batch["coords"][17])


def test_an_index_means_the_same_patch_whatever_else_is_asked(mixed) -> None:
    paths, _ = mixed
    sampler = mixle.PatchSampler(mixle.read_volumes(paths, dataset="img"), 4, 60, seed=9)
    whole = sampler.get_batch(np.arange(60))
    order = np.random.default_rng(0).permutation(60)
    part = sampler.get_batch(order[:25])
    for k, v in part.items():
        np.testing.assert_array_equal(v, whole[k][order[:25]])


def test_golden_volumes_and_corners() -> None:
    """Pinned: the volume and corner of an index never change across releases."""
    arrays = [np.zeros(s, np.uint8) for s in [(10, 12), (30, 8), (9, 9), (40, 40)]]
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays), 4, 8, seed=5, epoch=1)
    assert sampler.volumes_array().tolist() == GOLDEN_VOLUMES
    assert sampler.coords_array().tolist() == GOLDEN_CORNERS


GOLDEN_VOLUMES = [2, 3, 2, 1, 1, 2, 2, 2]
GOLDEN_CORNERS = [[1, 0], [19, 11], [2, 5], [17, 4], [23, 4], [5, 1], [2, 2], [3, 4]]


def test_patches_per_volume_keeps_runs_in_one_volume_and_sets_the_shuffle_block() -> None:
    arrays = [_vol((12, 12), i) for i in range(20)]
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays), 3, 200, seed=1, patches_per_volume=8)
    vols = sampler.volumes_array()
    for b in range(0, 200, 8):
        assert np.unique(vols[b : b + 8]).size == 1
    assert sampler.shuffle_block == sampler.patches_per_volume == 8
    loader = mixle.Loader(sampler, 16, shuffle=True, seed=4)
    for batch in loader:
        assert np.unique(batch["volume"]).size <= 2  # two runs of 8 per batch of 16
        _check_patches(batch, arrays, (3, 3))


def test_voxel_weights_follow_the_volume_sizes() -> None:
    shapes = [(10, 10), (20, 10), (10, 40), (30, 30)]
    arrays = [np.zeros(s, np.uint8) for s in shapes]
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays), 2, 40_000, volume_weights="voxels")
    counts = np.bincount(sampler.volumes_array(), minlength=4)
    sizes = np.array([np.prod(s) for s in shapes], dtype=float)
    expected = sizes / sizes.sum() * counts.sum()
    assert (((counts - expected) ** 2) / expected).sum() < CHI2_3_999


def test_column_and_array_weights(tmp_path: Path) -> None:
    arrays = [_vol((8, 8), i) for i in range(4)]
    paths = []
    for i, a in enumerate(arrays):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], a)
    rows = [
        {"image": p, "weight": w, "site": "abcd"[i]}
        for i, (p, w) in enumerate(zip(paths, [1.0, 0.0, 3.0, 0.0]))
    ]
    vols = mixle.read_volumes(rows)
    by_column = mixle.PatchSampler(vols, 2, 500, volume_weights="weight")
    assert set(by_column.volumes_array().tolist()) == {0, 2}
    by_array = mixle.PatchSampler(vols, 2, 500, volume_weights=[1.0, 0.0, 3.0, 0.0])
    np.testing.assert_array_equal(by_array.volumes_array(), by_column.volumes_array())
    for bad, err, match in [
        ([1.0, 2.0], ValueError, "has 2 entries but the collection has 4 volumes"),
        ([1.0, -1.0, 0, 0], ValueError, "volume 1 has -1.0"),
        ([0, 0, 0, 0], ValueError, "all zero"),
        ("nope", KeyError, "not 'uniform', 'voxels' or a metadata column"),
        ("site", TypeError, "the column must be numeric"),
    ]:
        with pytest.raises(err, match=match):
            mixle.PatchSampler(vols, 2, 10, volume_weights=bad)


def test_without_replacement_every_position_of_every_volume_once() -> None:
    shapes = [(6, 5), (4, 9), (7, 7)]
    arrays = [_vol(s, i) for i, s in enumerate(shapes)]
    sampler = mixle.PatchSampler(
        mixle.read_volumes(arrays), 3, replacement=False, stride=(2, 1), seed=2
    )
    grids = [((s[0] - 3) // 2 + 1) * (s[1] - 3 + 1) for s in shapes]
    assert len(sampler) == sum(grids)
    batch = sampler.get_batch(np.arange(len(sampler)))
    seen = {(int(v), tuple(c)) for v, c in zip(batch["volume"], batch["coords"].tolist())}
    assert len(seen) == len(sampler)
    for v, s in enumerate(shapes):
        want = {(v, (z, y)) for z in range(0, s[0] - 2, 2) for y in range(s[1] - 2)}
        assert {x for x in seen if x[0] == v} == want
    _check_patches(batch, arrays, (3, 3))
    with pytest.raises(ValueError, match="patches_per_volume=2 cannot be combined"):
        mixle.PatchSampler(mixle.read_volumes(arrays), 3, replacement=False, patches_per_volume=2)
    with pytest.raises(ValueError, match="cannot be combined with replacement=False"):
        mixle.PatchSampler(
            mixle.read_volumes(arrays), 3, replacement=False, volume_weights="voxels"
        )


@pytest.mark.parametrize("mode", ["uniform", "voxels", "no-replacement"])
def test_volumes_smaller_than_the_patch_are_skipped_with_a_warning(mode) -> None:
    arrays = [_vol((10, 10), 0), _vol((3, 10), 1), _vol((12, 8), 2)]
    kwargs: dict[str, Any] = {"seed": 1}
    if mode == "voxels":
        kwargs["volume_weights"] = "voxels"

    def make() -> Any:
        if mode == "no-replacement":
            return mixle.PatchSampler(mixle.read_volumes(arrays), 5, replacement=False)
        made = mixle.PatchSampler(mixle.read_volumes(arrays), 5, 400, **kwargs)
        made.get_batch(np.arange(400))
        return made

    with pytest.warns(UserWarning, match=r"volume 1 .* smaller than patch_size=5; it is skipped"):
        sampler = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not per batch
        batch = sampler.get_batch(np.arange(len(sampler)))
    assert 1 not in batch["volume"].tolist()
    _check_patches(batch, arrays, (5, 5))


def test_small_volumes_are_padded_when_padding_is_asked() -> None:
    arrays = [_vol((10, 10), 0), _vol((3, 10), 1)]
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays), 5, 300, padding="constant", seed=2)
    batch = sampler.get_batch(np.arange(300))
    assert 1 in batch["volume"].tolist()
    for patch, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
        padded = np.pad(arrays[int(v)], 10)
        box = tuple(slice(c + 10, c + 15) for c in corner.tolist())
        np.testing.assert_array_equal(patch, padded[box])


def test_a_different_dtype_is_an_error_naming_the_volume_unless_cast() -> None:
    arrays = [_vol((8, 8), 0, "float32"), _vol((8, 8), 1, "int16")]
    mixed = mixle.PatchSampler(mixle.read_volumes(arrays), 4, 50, seed=0)
    with pytest.raises(ValueError, match=r"volumes\[1\] .*has dtype int16"):
        mixed.get_batch(np.arange(50))
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays, dtype="float64"), 4, 50, seed=0)
    batch = sampler.get_batch(np.arange(50))
    assert batch["patch"].dtype == np.float64
    _check_patches(batch, arrays, (4, 4))


def test_channels_first_volumes() -> None:
    arrays = [_vol((2, 9, 10), 0), _vol((2, 12, 7), 1)]
    sampler = mixle.PatchSampler(mixle.read_volumes(arrays), (4, 5), 80, seed=6)
    batch = sampler.get_batch(np.arange(80))
    assert batch["patch"].shape == (80, 2, 4, 5) and batch["coords"].shape == (80, 2)
    for patch, (z, y), v in zip(batch["patch"], batch["coords"].tolist(), batch["volume"]):
        np.testing.assert_array_equal(patch, arrays[int(v)][:, z : z + 4, y : y + 5])
    other = [_vol((2, 9, 10), 0), _vol((3, 12, 7), 1)]
    with pytest.raises(ValueError, match=r"volume 1 .*channels"):
        mixle.PatchSampler(mixle.read_volumes(other), (4, 5), 80).get_batch(np.arange(80))


def test_dict_volumes_with_a_label_at_half_resolution() -> None:
    images = [_vol((16, 12), 0), _vol((10, 20), 1)]
    labels = [(im[::2, ::2] > 500).astype(np.uint8) for im in images]
    rows = [{"image": im, "label": lab} for im, lab in zip(images, labels)]
    sampler = mixle.PatchSampler(mixle.read_volumes(rows), 4, 100, seed=3)
    batch = sampler.get_batch(np.arange(100))
    assert set(batch) == {"image", "label", "coords", "volume"}
    assert batch["label"].shape == (100, 2, 2)
    for k in range(100):
        z, y = batch["coords"][k].tolist()
        v = int(batch["volume"][k])
        assert z % 2 == 0 and y % 2 == 0
        np.testing.assert_array_equal(batch["image"][k], images[v][z : z + 4, y : y + 4])
        np.testing.assert_array_equal(
            batch["label"][k], labels[v][z // 2 : z // 2 + 2, y // 2 : y // 2 + 2]
        )


def test_label_sampling_per_volume_centres_patches_on_the_class() -> None:
    images, labels = [], []
    for i, shape in enumerate([(20, 20), (15, 25)]):
        images.append(_vol(shape, i))
        lab = np.zeros(shape, np.uint8)
        lab[5 + i, 7] = 1  # one foreground voxel per volume
        labels.append(lab)
    rows = [{"image": im, "label": lab} for im, lab in zip(images, labels)]
    sampler = mixle.PatchSampler(
        mixle.read_volumes(rows), 5, 200, labels="label", label_probabilities={1: 1.0}, seed=1
    )
    batch = sampler.get_batch(np.arange(200))
    for corner, v in zip(batch["coords"].tolist(), batch["volume"].tolist()):
        assert (corner[0] + 2, corner[1] + 2) == (5 + v, 7)
    with pytest.raises(TypeError, match="names an array of the volumes' dicts"):
        mixle.PatchSampler(mixle.read_volumes(rows), 5, 10, labels=labels[0])


def test_locality_regions_inside_each_volume() -> None:
    arrays = [_vol((64, 64), i) for i in range(5)]
    sampler = mixle.PatchSampler(
        mixle.read_volumes(arrays),
        4,
        160,
        seed=2,
        patches_per_volume=16,
        patches_per_chunk=8,
        region=16,
    )
    batch = sampler.get_batch(np.arange(160))
    for b in range(0, 160, 8):
        corners = batch["coords"][b : b + 8]
        assert np.unique(batch["volume"][b : b + 8]).size == 1
        tiles = {tuple(t) for t in (np.minimum(corners, 48) // 16).tolist()}
        assert len(tiles) == 1
    _check_patches(batch, arrays, (4, 4))


def test_metadata_columns_in_records_and_batches(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], _vol((8, 8), i))
    rows = [{"image": p, "age": 30 + i, "site": f"s{i}"} for i, p in enumerate(paths)]
    sampler = mixle.PatchSampler(mixle.read_volumes(rows), 4, 40, columns=["age", "site"])
    batch = sampler.get_batch(np.arange(40))
    np.testing.assert_array_equal(batch["age"], 30 + batch["volume"])
    assert [f"s{v}" for v in batch["volume"].tolist()] == batch["site"].tolist()
    assert sampler[3]["age"] == 30 + sampler[3]["volume"]
    assert "age" in sampler.element_spec()
    with pytest.raises(KeyError, match="'weight' is not a metadata column"):
        mixle.PatchSampler(mixle.read_volumes(rows), 4, 40, columns=["weight"])


def test_arguments_of_collections_are_refused_for_one_array() -> None:
    for kwargs in ({"volume_weights": "voxels"}, {"patches_per_volume": 4}, {"columns": ["a"]}):
        with pytest.raises(TypeError, match="applies to a collection of volumes"):
            mixle.PatchSampler(np.zeros((8, 8)), 2, 4, **kwargs)


def test_pickles_small_and_gives_the_same_batches(tmp_path: Path) -> None:
    paths = []
    for i in range(40):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], _vol((10, 10), i))
    sampler = mixle.PatchSampler(mixle.read_volumes(paths), 4, 30, seed=8)
    sampler.get_batch([0])
    few = len(pickle.dumps(sampler))
    first = sampler.get_batch(np.arange(30))
    assert len(set(first["volume"].tolist())) > 10
    assert len(pickle.dumps(sampler)) == few  # opening more volumes adds nothing
    assert few < 20_000
    again = pickle.loads(pickle.dumps(sampler)).get_batch(np.arange(30))
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])


def test_fingerprint_covers_the_collection_and_the_new_arguments(tmp_path: Path) -> None:
    arrays = [_vol((10, 10), i) for i in range(3)]
    vols = mixle.read_volumes(arrays)
    base = mixle.PatchSampler(vols, 4, 20).fingerprint()
    assert mixle.PatchSampler(mixle.read_volumes(arrays), 4, 20).fingerprint() == base
    for kwargs in (
        {"patches_per_volume": 2},
        {"volume_weights": "voxels"},
        {"volume_weights": [1, 2, 3]},
        {"seed": 1},
        {"num_patches": 21},
    ):
        args = {"num_patches": 20, **kwargs}
        assert mixle.PatchSampler(vols, 4, **args).fingerprint() != base, kwargs
    fewer = mixle.read_volumes(arrays[:2])
    assert mixle.PatchSampler(fewer, 4, 20).fingerprint() != base
    assert mixle.PatchSampler(vols, 4, 20, columns=()).fingerprint() == base


def test_loader_resume_over_a_collection(mixed) -> None:
    paths, truth = mixed
    sampler = mixle.PatchSampler(
        mixle.read_volumes(paths, dataset="img"), 4, 48, seed=1, patches_per_volume=4
    )
    loader = mixle.Loader(sampler, 8, shuffle=True, seed=3, num_epochs=2)
    it = iter(loader)
    seen = [next(it) for _ in range(5)]
    state = loader.state_dict()
    rest = list(it)
    resumed = mixle.Loader(
        pickle.loads(pickle.dumps(sampler)), 8, shuffle=True, seed=3, num_epochs=2
    )
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(rest) and len(seen) + len(rest) == 12
    for a, b in zip(rest, again):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    for batch in seen + rest:
        _check_patches(batch, truth, (4, 4, 4))


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=6),
    patch=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padded=st.booleans(),
    per_volume=st.integers(1, 4),
    seed=st.integers(0, 2**64 - 1),
)
def test_every_index_maps_to_a_valid_corner_of_its_volume(
    shapes, patch, stride, padded, per_volume, seed
) -> None:
    fits = [all(p <= d for p, d in zip(patch, s)) for s in shapes]
    assume(padded or any(fits))
    arrays = [np.zeros(s, np.uint8) for s in shapes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # volumes too small are skipped
        sampler = mixle.PatchSampler(
            mixle.read_volumes(arrays),
            patch,
            50,
            seed=seed,
            stride=stride,
            padding="constant" if padded else "none",
            patches_per_volume=per_volume,
        )
        vols = sampler.volumes_array()
        corners = sampler.coords_array()
    for i, (v, corner) in enumerate(zip(vols.tolist(), corners.tolist())):
        assert vols[i - i % per_volume] == v  # blocks share a volume
        for c, p, st_, d in zip(corner, patch, stride, shapes[v]):
            if padded:
                assert 0 <= c + p // 2 < d + st_  # the centre lies in (or next to) the volume
            else:
                assert fits[v] and 0 <= c <= d - p and c % st_ == 0


def test_a_volume_without_a_class_draws_the_others_or_is_skipped() -> None:
    images, labels = [], []
    for i in range(3):
        images.append(_vol((12, 12), i))
        lab = np.zeros((12, 12), np.uint8)
        if i != 1:  # volume 1 has no foreground (a scan without a lesion)
            lab[4 + i, 6] = 1
        labels.append(lab)
    rows = [{"image": im, "label": lab} for im, lab in zip(images, labels)]
    both = mixle.PatchSampler(
        mixle.read_volumes(rows), 3, 300, labels="label", label_probabilities={0: 1, 1: 1}
    )
    with pytest.warns(UserWarning, match=r"volume 1 .*no voxel of classes \[1\].*renormalised"):
        batch = both.get_batch(np.arange(300))
    assert both.layout(1).weighted.label_probabilities == {0: 1.0, 1: 0.0}
    centres = batch["coords"] + 1
    for (z, y), v in zip(centres.tolist(), batch["volume"].tolist()):
        if v == 1:
            assert labels[1][z, y] == 0
    assert 1 in batch["volume"].tolist()
    only = mixle.PatchSampler(
        mixle.read_volumes(rows), 3, 300, labels="label", label_probabilities={1: 1}
    )
    with pytest.warns(UserWarning, match=r"volume 1 .*asks for classes \[1\].*it is skipped"):
        batch = only.get_batch(np.arange(300))
    assert set(batch["volume"].tolist()) == {0, 2}
    for (z, y), v in zip((batch["coords"] + 1).tolist(), batch["volume"].tolist()):
        assert labels[v][z, y] == 1
    weights = [{"image": im, "w": lab.astype(np.float32)} for im, lab in zip(images, labels)]
    by_weight = mixle.PatchSampler(mixle.read_volumes(weights), 3, 50, weights="w")
    with pytest.warns(UserWarning, match=r"volume 1 .*weights are zero.*it is skipped"):
        assert 1 not in by_weight.get_batch(np.arange(50))["volume"].tolist()


@pytest.mark.parametrize("volume_weights", ["uniform", "voxels"])
def test_volumes_skipped_for_their_maps_are_never_drawn(volume_weights) -> None:
    # 40 volumes, only volume 7 has foreground: uniform redraws run out and fall back to
    # the list of valid volumes, which must know about maps as well as shapes
    rows = []
    for i in range(40):
        lab = np.zeros((6, 6), np.uint8)
        if i == 7:
            lab[2, 3] = 1
        rows.append({"image": _vol((6, 6), i), "label": lab})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sampler = mixle.PatchSampler(
            mixle.read_volumes(rows),
            3,
            64,
            labels="label",
            label_probabilities={1: 1},
            volume_weights=volume_weights,
        )
        batch = sampler.get_batch(np.arange(64))
    assert set(batch["volume"].tolist()) == {7}
    assert {tuple(c) for c in batch["coords"].tolist()} == {(1, 2)}


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"patch_size": 0}, ValueError, "patch_size=0 must be >= 1"),
        ({"patch_size": (4, -1)}, ValueError, r"patch_size=\(4, -1\) must be >= 1"),
        ({"patch_size": 2.5}, TypeError, "patch_size"),
        ({"stride": 0}, ValueError, "stride"),
        ({"region": 1, "patches_per_chunk": 2}, ValueError, "region"),
        ({"padding": "wrap"}, ValueError, "padding"),
        ({"patches_per_volume": 0}, ValueError, "patches_per_volume=0 must be >= 1"),
        ({"labels": "label"}, ValueError, "label_probabilities"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, err, match) -> None:
    rows = [{"image": _vol((8, 8), i), "label": np.zeros((8, 8), np.uint8)} for i in range(3)]
    args = {"patch_size": 4, **kwargs}
    with pytest.raises(err, match=match):
        mixle.PatchSampler(mixle.read_volumes(rows), num_patches=10, **args)


def test_dict_volumes_whose_arrays_differ_in_axes_need_a_size_per_spatial_axis() -> None:
    rows = [
        {"image": _vol((2, 12, 12, 12), i), "label": _vol((12, 12, 12), 10 + i, "uint8")}
        for i in range(2)
    ]
    # one int is ambiguous: channels, or a 4x4 affine beside a 3-D image (which was sampled
    # as a 2-D image of 16 channels without an error)
    with pytest.raises(ValueError, match=r"different numbers of axes \{'image': 4, 'label': 3\}"):
        mixle.PatchSampler(mixle.read_volumes(rows), 4, 20, seed=1)
    affine = [{"image": _vol((16, 16, 16), 0), "affine": np.eye(4)}]
    with pytest.raises(ValueError, match="'affine': 2"):
        mixle.PatchSampler(mixle.read_volumes(affine), 4, 20, seed=1)
    sampler = mixle.PatchSampler(mixle.read_volumes(rows), (4, 4, 4), 20, seed=1)
    assert sampler.patch_size == (4, 4, 4)
    batch = sampler.get_batch(np.arange(20))
    assert batch["image"].shape == (20, 2, 4, 4, 4) and batch["coords"].shape == (20, 3)
    for k in range(20):
        z, y, x = batch["coords"][k].tolist()
        row = rows[int(batch["volume"][k])]
        box = (slice(z, z + 4), slice(y, y + 4), slice(x, x + 4))
        np.testing.assert_array_equal(batch["image"][k], row["image"][(slice(None), *box)])
        np.testing.assert_array_equal(batch["label"][k], row["label"][box])


def test_a_cast_collection_pads_with_a_value_only_the_cast_dtype_holds() -> None:
    arrays = [_vol((6, 6), 0, "float32"), _vol((5, 7), 1, "uint8")]
    vols = mixle.read_volumes(arrays, dtype="float32")
    sampler = mixle.PatchSampler(vols, 4, 60, padding="constant", pad_value=-1.5, seed=3)
    batch = sampler.get_batch(np.arange(60))
    assert 1 in batch["volume"].tolist()
    for patch, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
        padded = np.pad(arrays[int(v)].astype(np.float32), 8, constant_values=-1.5)
        box = tuple(slice(c + 8, c + 12) for c in corner.tolist())
        np.testing.assert_array_equal(patch, padded[box])
    other = mixle.PatchSampler(vols, 4, 60, padding="constant", pad_value=-2.5, seed=3)
    assert other.fingerprint() != sampler.fingerprint()
    with pytest.raises(ValueError, match=r"pad_value=0\.5 does not fit"):
        mixle.PatchSampler(
            mixle.read_volumes(arrays, dtype="int16"), 4, 6, padding="constant", pad_value=0.5
        )


def test_metadata_columns_keep_one_dtype_in_every_batch() -> None:
    rows = [{"image": _vol((6, 6), i), "site": s, "age": i} for i, s in enumerate(["a", "bbbb"])]
    sampler = mixle.PatchSampler(mixle.read_volumes(rows), 3, 10, columns=["site", "age"])
    spec = sampler.element_spec()
    for idx in ([], [0], np.arange(10)):
        batch = sampler.get_batch(idx)
        assert batch["site"].dtype == spec["site"].dtype and batch["age"].dtype == np.int64


class _BlockedMap(ArrayLikeSource):
    """A label map whose reads wait, in the process that made it, until ``release`` is set."""

    release = threading.Event()
    blocking = threading.Event()
    owner = os.getpid()

    def read_box(self, start, size):  # type: ignore[no-untyped-def]
        if self.blocking.is_set() and os.getpid() == self.owner:
            self.release.wait(timeout=60)
        return super().read_box(start, size)


def _build_layout_or_fail(sampler: Any, v: int) -> None:
    os._exit(0 if sampler.layout(v) is not None else 3)


def test_layouts_of_different_volumes_build_in_parallel_and_after_a_fork() -> None:
    """One volume's slow map must not hold up another's, nor leave a forked child stuck."""
    rows = []
    for i in range(3):
        lab = np.zeros((8, 8), np.uint8)
        lab[3, 3] = 1
        rows.append({"image": _vol((8, 8), i), "label": _BlockedMap(lab) if i == 1 else lab})
    sampler = mixle.PatchSampler(
        mixle.read_volumes(rows), 3, 30, labels="label", label_probabilities={1: 1}
    )  # volume 0's layout is built here
    _BlockedMap.owner = os.getpid()
    _BlockedMap.release.clear()
    _BlockedMap.blocking.set()
    try:
        stuck = threading.Thread(target=sampler.layout, args=(1,), daemon=True)
        stuck.start()  # volume 1's map waits for release: its build is in progress
        other = threading.Thread(target=sampler.layout, args=(2,), daemon=True)
        other.start()
        other.join(timeout=30)  # only catches a hang: it needs no lock volume 1 holds
        assert not other.is_alive()
        child = multiprocessing.get_context("fork").Process(
            target=_build_layout_or_fail, args=(sampler, 1)
        )
        child.start()  # forked (not pickled) while volume 1's build holds its lock
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0
    finally:
        _BlockedMap.release.set()
        _BlockedMap.blocking.clear()
    stuck.join(timeout=60)
    assert sampler.layout(1) is not None


@pytest.mark.parametrize("kwargs", [{"volume_weights": "voxels"}, {"replacement": False}, {}])
def test_fingerprint_sees_volumes_rewritten_with_other_shapes(tmp_path: Path, kwargs) -> None:
    paths = [str(tmp_path / f"v{i}.npy") for i in range(3)]
    for i, p in enumerate(paths):
        np.save(p, _vol((8, 8), i))
    args = {"num_patches": None if kwargs.get("replacement") is False else 10, **kwargs}
    before = mixle.PatchSampler(mixle.read_volumes(paths), 4, **args).fingerprint()
    changed = 0 if not kwargs else 2  # uniform sampling reads only volume 0's shape up front
    np.save(paths[changed], _vol((12, 8), 9))
    after = mixle.PatchSampler(mixle.read_volumes(paths), 4, **args).fingerprint()
    assert after != before


def test_vector_metadata_columns_have_their_shape_in_the_spec() -> None:
    rows = [{"image": _vol((6, 6), i), "spacing": np.array([1.0, 2.0, 0.5 + i])} for i in range(2)]
    vols = mixle.read_volumes(rows)
    for sampler in (
        mixle.PatchSampler(vols, 3, 4, columns=["spacing"]),
        mixle.GridSampler(vols, 3, columns=["spacing"]),
    ):
        spec, batch = sampler.element_spec()["spacing"], sampler.get_batch([0, 1])["spacing"]
        assert spec.shape == (3,) and batch.shape == (2, 3) and spec.dtype == batch.dtype
