"""Aligned multi-array sampling: image + label patches from the same physical place."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import h5py
import numpy as np
import pytest

import mixle
from mixle import AlignedArrays, Loader, PatchSampler, read_hdf5_arrays, read_zarr_arrays
from mixle.errors import ArrayNotFoundError

RNG = np.random.default_rng(5)
IMAGE = RNG.standard_normal((3, 24, 20, 18)).astype(np.float32)  # channels first
LABEL = RNG.integers(0, 4, (12, 10, 6)).astype(np.uint8)  # factors (2, 2, 3)
MASK = RNG.random((24, 20, 18)) < 0.5


def _check(batch: dict, patch: tuple[int, ...]) -> None:
    for i, c in enumerate(batch["coords"].tolist()):
        box = tuple(slice(a, a + p) for a, p in zip(c, patch))
        np.testing.assert_array_equal(batch["image"][i], IMAGE[(slice(None), *box)])
        if "mask" in batch:
            np.testing.assert_array_equal(batch["mask"][i], MASK[box])
        low = tuple(slice(a // f, (a + p) // f) for a, p, f in zip(c, patch, (2, 2, 3)))
        np.testing.assert_array_equal(batch["label"][i], LABEL[low])


@pytest.mark.parametrize("patch", [(6, 4, 6), (2, 10, 12), (24, 20, 18)])
def test_patches_equal_numpy_on_every_array_and_scale(patch: tuple[int, ...]) -> None:
    arrays = {"image": IMAGE, "label": LABEL, "mask": MASK}
    s = PatchSampler(arrays, patch, 40, seed=11)
    assert s.arrays is not None
    assert s.arrays.factors == {"image": (1, 1, 1), "label": (2, 2, 3), "mask": (1, 1, 1)}
    assert s.arrays.channels["image"] == (3,) and s.stride == (2, 2, 3)
    batch = s.get_batch(range(40))
    assert sorted(batch) == ["coords", "image", "label", "mask"]
    assert batch["image"].shape == (40, 3, *patch)
    assert batch["label"].shape == (40, patch[0] // 2, patch[1] // 2, patch[2] // 3)
    _check(batch, patch)
    record = s[7]
    assert record["coords"] == tuple(batch["coords"][7].tolist())
    np.testing.assert_array_equal(record["label"], batch["label"][7])
    spec = s.element_spec()
    assert spec["label"].shape == batch["label"].shape[1:] and spec["coords"].shape == (3,)


def test_padding_and_floor_shapes() -> None:
    odd = RNG.standard_normal((13, 9)).astype(np.float32)
    half = odd[::2, ::2][:6, :4]  # 13 // 2 = 6 and 9 // 2 = 4 (rounded down)
    s = PatchSampler({"img": odd, "half": half}, (4, 4), 100, seed=2, padding="constant",
                     pad_value={"img": -1.0, "half": 9.0})  # fmt: skip
    batch = s.get_batch(range(100))
    big = np.pad(odd, 8, constant_values=-1)
    small = np.pad(half, 4, constant_values=9)
    assert (batch["coords"] % 2 == 0).all() and (batch["coords"] < 0).any()
    for c, a, b in zip(batch["coords"].tolist(), batch["img"], batch["half"]):
        np.testing.assert_array_equal(a, big[c[0] + 8 : c[0] + 12, c[1] + 8 : c[1] + 12])
        lo = [x // 2 + 4 for x in c]
        np.testing.assert_array_equal(b, small[lo[0] : lo[0] + 2, lo[1] : lo[1] + 2])


def test_zarr_group_helper_and_loader(stores) -> None:
    arrays = read_zarr_arrays(stores.path("group.zarr"), {"image": "image", "label": "labels/mask"})
    s = PatchSampler(arrays, (4, 5, 6), 12, seed=0)
    batches = list(Loader(s, 4, shuffle=True, seed=3))
    assert len(batches) == 3 and batches[0]["image"].shape == (4, 4, 5, 6)
    image, mask = stores.truth["group.zarr/image"], stores.truth["group.zarr/labels/mask"]
    for b in batches:
        for c, im, lb in zip(b["coords"].tolist(), b["image"], b["label"]):
            box = tuple(slice(a, a + p) for a, p in zip(c, (4, 5, 6)))
            np.testing.assert_array_equal(im, image[box])
            np.testing.assert_array_equal(lb, mask[box])
    assert sorted(read_zarr_arrays(stores.path("group.zarr"))) == ["image", "labels/mask"]
    with pytest.raises(ArrayNotFoundError, match="'seg' -> 'labels/seg' is not an array"):
        read_zarr_arrays(stores.path("group.zarr"), {"seg": "labels/seg"})


def _hdf5(tmp_path) -> str:
    path = str(tmp_path / "pair.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=IMAGE, chunks=(3, 8, 8, 6), compression="gzip")
        f.create_group("seg").create_dataset("label", data=LABEL, chunks=(4, 5, 6))
    return path


def _coords_in_child(sampler: PatchSampler) -> list:
    return sampler.get_batch(range(len(sampler)))["coords"].tolist()


def test_hdf5_helper_pickles_and_matches_in_another_process(tmp_path) -> None:
    path = _hdf5(tmp_path)
    arrays = read_hdf5_arrays(path, {"image": "raw", "label": "/seg/label"})
    s = PatchSampler(arrays, (4, 6, 6), 16, seed=-3, labels="label",
                     label_probabilities={1: 0.5, 2: 0.5})  # fmt: skip
    batch = s.get_batch(range(16))
    s2 = PatchSampler(arrays, (4, 6, 6), 16, seed=-3)
    _check(s2.get_batch(range(16)), (4, 6, 6))
    centres = batch["coords"] + np.array([2, 3, 3])
    assert np.isin(LABEL[centres[:, 0] // 2, centres[:, 1] // 2, centres[:, 2] // 3], [1, 2]).all()
    blob = pickle.dumps(s)
    assert len(blob) < 20_000  # sources by reference; the small block index travels along
    copy = pickle.loads(blob)
    np.testing.assert_array_equal(copy.get_batch(range(16))["label"], batch["label"])
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        assert pool.submit(_coords_in_child, s).result() == batch["coords"].tolist()
    assert sorted(read_hdf5_arrays(path)) == ["raw", "seg/label"]


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match=r"is not the finest shape .* divided by an integer"):
        PatchSampler({"a": np.zeros((10, 10)), "b": np.zeros((6, 10))}, 2, 3)
    with pytest.raises(ValueError, match=r"does not divide by the scale factor 2 of "
                                         r"arrays\['b'\] on axis 0"):  # fmt: skip
        PatchSampler({"a": np.zeros((10, 10)), "b": np.zeros((5, 10))}, (3, 2), 3)
    with pytest.raises(ValueError, match=r"stride=\(3, 1\) must be a multiple of \(2, 1\)"):
        PatchSampler({"a": np.zeros((10, 10)), "b": np.zeros((5, 10))}, 2, 3, stride=(3, 1))
    with pytest.raises(ValueError, match="array name 'coords' is not allowed"):
        PatchSampler({"coords": np.zeros((4, 4))}, 2, 3)
    with pytest.raises(ValueError, match="must be a non-empty dict"):
        AlignedArrays({})
    with pytest.raises(ValueError, match="the given scale on axis 0"):
        PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((4, 8))}, 2, 3, scales={"b": 3})
    with pytest.raises(KeyError, match="scales names 'c', which is not one of"):
        PatchSampler({"a": np.zeros((8, 8))}, 2, 3, scales={"c": 2})
    with pytest.raises(ValueError, match="schema= applies to a single array"):
        PatchSampler({"a": np.zeros((8, 8))}, 2, 3, schema=mixle.Schema(dtype="f8"))
    with pytest.raises(ValueError, match="spatial_ndim=3 must be >= 1 and at most"):
        PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((2, 8, 8))}, (2, 2, 2), 3)
    with pytest.raises(TypeError, match=r"arrays\['b'\]=int is not an array"):
        PatchSampler({"a": np.zeros((8, 8)), "b": 3}, 2, 3)
    explicit = PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((4, 8))}, 2, 3,
                            scales={"b": (2, 1)})  # fmt: skip
    assert explicit.arrays is not None and explicit.arrays.factors["b"] == (2, 1)
    assert "AlignedArrays" in repr(explicit)
    # regression: an ndarray patch_size did not set the spatial axes of a dict (tuples did)
    stacked = {"img": np.zeros((2, 8, 8)), "lab": np.zeros((2, 8, 8))}
    nd_patch = PatchSampler(stacked, np.array([4, 4]), 3).get_batch([0])
    assert nd_patch["img"].shape == (1, 2, 4, 4) and nd_patch["coords"].shape == (1, 2)
    as_array = PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((4, 8))}, 2, 3,
                            scales={"b": np.array([2, 1])})  # fmt: skip
    assert as_array.arrays is not None and as_array.arrays.factors["b"] == (2, 1)
    # regression: a per-axis scale of the wrong length raised a bare IndexError
    with pytest.raises(ValueError, match=r"scales\['b'\]=\(2,\) has 1 entries"):
        PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((4, 8))}, 2, 3, scales={"b": (2,)})
    with pytest.raises(TypeError, match=r"scales\['b'\]='2' must be an int"):
        PatchSampler({"a": np.zeros((8, 8)), "b": np.zeros((4, 8))}, 2, 3, scales={"b": "2"})
