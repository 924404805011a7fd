"""Patch placement and PatchSampler: golden corners, properties, uniformity, pickling."""

from __future__ import annotations

import math
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle import PatchSampler
from mixle.data.sampling.placement import grid_counts, patch_corners


def _chi_square_over_cells(cells: np.ndarray, k: int) -> float:
    observed = np.bincount(cells, minlength=k).astype(np.float64)
    assert observed.size == k
    expected = cells.size / k
    return float(((observed - expected) ** 2 / expected).sum())


def _chi_square_bound(k: int) -> float:
    """Mean of chi-square with k - 1 degrees of freedom plus 6 standard deviations."""
    return (k - 1) + 6 * math.sqrt(2 * (k - 1))


def _box(corner: tuple[int, ...] | np.ndarray, size: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(int(c), int(c) + p) for c, p in zip(corner, size))


# -- golden values: changing any of these changes every user's sampled patches ------------
def test_patch_corners_golden() -> None:
    got = patch_corners(7, np.arange(6), (10, 4, 3), (1, 2, 5))
    assert got.dtype == np.int64
    assert got.tolist() == [
        [5, 0, 0], [3, 2, 10], [4, 4, 10], [9, 0, 0], [7, 4, 0], [5, 0, 0],
    ]  # fmt: skip
    got = patch_corners(7, np.arange(4), (10, 4, 3), (1, 2, 5), epoch=3)
    assert got.tolist() == [[6, 6, 5], [8, 6, 0], [7, 4, 10], [5, 0, 0]]


def test_patch_sampler_coords_golden_2d() -> None:
    s = PatchSampler(np.zeros((20, 30)), (4, 5), 8, seed=123, stride=(1, 3))
    assert s.coords_array().tolist() == [
        [2, 3], [14, 6], [10, 3], [14, 6], [3, 0], [6, 12], [3, 18], [7, 9],
    ]  # fmt: skip


def test_patch_sampler_coords_golden_3d() -> None:
    s = PatchSampler(np.zeros((9, 10, 11)), 3, 6, seed=-7, stride=2)
    assert s.coords_array().tolist() == [
        [4, 0, 6], [2, 6, 8], [6, 4, 0], [2, 0, 0], [4, 0, 4], [0, 6, 4],
    ]  # fmt: skip
    s = PatchSampler(np.zeros((16, 16, 16)), (4, 8, 2), 5, seed=2**63 + 12345)
    assert s.coords_array().tolist() == [
        [6, 8, 8], [3, 4, 10], [10, 4, 5], [10, 3, 6], [12, 5, 5],
    ]  # fmt: skip
    assert s.coords() == [(6, 8, 8), (3, 4, 10), (10, 4, 5), (10, 3, 6), (12, 5, 5)]


# -- property tests -------------------------------------------------------------------
@st.composite
def sampler_configs(draw: st.DrawFn) -> dict:
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 12)) for _ in range(ndim))
    patch = tuple(draw(st.integers(1, s)) for s in shape)
    stride = tuple(draw(st.integers(1, 15)) for _ in range(ndim))
    seed = draw(
        st.one_of(
            st.integers(-(2**70), 2**70),
            st.integers(2**63, 2**64 - 1),
            st.integers(-(2**63), -1),
        )
    )
    num = draw(st.integers(0, 40))
    return {"shape": shape, "patch": patch, "stride": stride, "seed": seed, "num": num}


def _make(cfg: dict) -> PatchSampler:
    return PatchSampler(
        np.zeros(cfg["shape"], dtype=np.uint8),
        cfg["patch"],
        cfg["num"],
        seed=cfg["seed"],
        stride=cfg["stride"],
    )


@settings(max_examples=150, deadline=None)
@given(sampler_configs())
def test_corners_in_bounds_on_grid_and_deterministic(cfg: dict) -> None:
    s = _make(cfg)
    shape, patch, stride = (np.array(cfg[k]) for k in ("shape", "patch", "stride"))
    counts = tuple((a - p) // t + 1 for a, p, t in zip(cfg["shape"], cfg["patch"], cfg["stride"]))
    assert s.grid_shape == counts
    assert grid_counts(cfg["shape"], cfg["patch"], cfg["stride"]) == counts
    corners = s.coords_array()
    assert corners.dtype == np.int64
    assert corners.shape == (cfg["num"], len(cfg["shape"]))
    assert (corners >= 0).all()
    assert (corners + patch <= shape).all()
    assert (corners % stride == 0).all()
    assert (corners // stride < np.array(counts)).all()
    # determinism: a fresh sampler with the same arguments gives the same corners
    assert _make(cfg).coords_array().tolist() == corners.tolist()
    # and so does the pure placement function
    direct = patch_corners(cfg["seed"], np.arange(cfg["num"]), counts, cfg["stride"])
    assert direct.tolist() == corners.tolist()


@settings(max_examples=100, deadline=None)
@given(sampler_configs().filter(lambda c: c["num"] > 0), st.data())
def test_corner_of_index_does_not_depend_on_other_indices(cfg: dict, data: st.DataObject) -> None:
    s = _make(cfg)
    n = cfg["num"]
    everything = s.coords_array()
    i = data.draw(st.integers(0, n - 1), label="i")
    assert s.coords_array([i]).tolist() == [everything[i].tolist()]
    assert s.coords_array([i - n]).tolist() == [everything[i].tolist()]  # negative index
    picked = data.draw(st.lists(st.integers(-n, n - 1), max_size=10), label="picked")
    got = s.coords_array(np.array(picked, dtype=np.int64))
    assert got.shape == (len(picked), len(cfg["shape"]))
    assert got.tolist() == everything[np.array(picked, dtype=np.int64)].tolist()
    # a sampler with more patches shares the first n corners
    longer = _make({**cfg, "num": n + 7})
    assert longer.coords_array()[:n].tolist() == everything.tolist()


@pytest.mark.parametrize("seed", [0, -1, 2**63 + 3])
def test_patch_corners_same_for_any_batch_size(seed: int) -> None:
    """Few and many indices (scalar and vectorised code paths alike) give the same corners."""
    idx = np.array([5, -3, 0, 2**40, -(2**63), 2**63 - 1, 7, 7, *range(100, 130)], dtype=np.int64)
    counts, stride = (3, 2**40 + 1, 1, 2**62 + 1), (2, 1, 5, 1)
    everything = patch_corners(seed, idx, counts, stride, epoch=2)
    assert everything.shape == (idx.size, 4)
    for k in range(idx.size + 1):
        assert patch_corners(seed, idx[:k], counts, stride, epoch=2).tolist() == (
            everything[:k].tolist()
        )
    for i in range(idx.size):
        assert patch_corners(seed, [idx[i]], counts, stride, epoch=2).tolist() == [
            everything[i].tolist()
        ]
        assert patch_corners(seed, idx[i], counts, stride, epoch=2).tolist() == [
            everything[i].tolist()
        ]


@settings(max_examples=40, deadline=None)
@given(sampler_configs().filter(lambda c: c["num"] > 0), st.data())
def test_patch_equals_numpy_slice(cfg: dict, data: st.DataObject) -> None:
    arr = np.arange(math.prod(cfg["shape"]), dtype=np.int32).reshape(cfg["shape"])
    s = PatchSampler(arr, cfg["patch"], cfg["num"], seed=cfg["seed"], stride=cfg["stride"])
    i = data.draw(st.integers(-cfg["num"], cfg["num"] - 1), label="i")
    patch, coords = s[i]
    assert coords == tuple(s.coords_array([i])[0].tolist())
    assert all(type(c) is int for c in coords)
    np.testing.assert_array_equal(patch, arr[_box(coords, cfg["patch"])])
    assert patch.shape == cfg["patch"]
    assert not np.shares_memory(patch, arr)


@pytest.mark.parametrize("stride", [None, 1, (1,), np.array([1])])
def test_default_stride_is_every_position(stride: object) -> None:
    s = PatchSampler(np.zeros(10), 3, 2000, seed=4, stride=stride)
    assert s.stride == (1,)
    assert s.grid_shape == (8,)
    assert sorted(set(s.coords_array()[:, 0].tolist())) == list(range(8))


@pytest.mark.parametrize(
    ("shape", "patch", "stride", "expected"),
    [
        ((10,), (3,), (1,), (8,)),
        ((10,), (10,), (1,), (1,)),
        ((10,), (3,), (7,), (2,)),
        ((10,), (3,), (8,), (1,)),
        ((50,), (8,), (3,), (15,)),
        ((20, 17), (5, 4), (4, 3), (4, 5)),
        ((21, 17), (5, 4), (4, 3), (5, 5)),
        ((5, 6, 7, 8), (5, 1, 2, 8), (2, 2, 2, 100), (1, 3, 3, 1)),
    ],
)
def test_grid_counts_values(
    shape: tuple[int, ...], patch: tuple[int, ...], stride: tuple[int, ...], expected: tuple
) -> None:
    assert grid_counts(shape, patch, stride) == expected


def test_epoch_changes_corners_deterministically() -> None:
    a = patch_corners(1, np.arange(200), (50, 50), (1, 1), epoch=0)
    b = patch_corners(1, np.arange(200), (50, 50), (1, 1), epoch=1)
    assert not np.array_equal(a, b)
    assert np.array_equal(b, patch_corners(1, np.arange(200), (50, 50), (1, 1), epoch=1))


# -- uniformity over the stride grid ----------------------------------------------------
def test_uniform_over_stride_grid_1d() -> None:
    s = PatchSampler(np.zeros(50), 8, 15 * 2000, seed=31, stride=3)
    assert s.grid_shape == (15,)
    corners = s.coords_array()[:, 0]
    assert (corners % 3 == 0).all()
    assert corners.max() == 42  # the last grid position is reachable
    cells = corners // 3
    assert _chi_square_over_cells(cells, 15) < _chi_square_bound(15)
    # the last position is hit about as often as the average one (1/15 of the draws)
    assert int((corners == 42).sum()) > 0.8 * corners.size / 15


def test_uniform_over_stride_grid_2d() -> None:
    s = PatchSampler(np.zeros((21, 17)), (5, 4), 25 * 1200, seed=-9, stride=(4, 3))
    assert s.grid_shape == (5, 5)
    corners = s.coords_array()
    cells = (corners[:, 0] // 4) * 5 + corners[:, 1] // 3
    assert _chi_square_over_cells(cells, 25) < _chi_square_bound(25)
    last = (corners[:, 0] == 16) & (corners[:, 1] == 12)
    assert last.any()
    # each axis on its own is uniform too
    for axis, (step, k) in enumerate([(4, 5), (3, 5)]):
        axis_cells = corners[:, axis] // step
        assert _chi_square_over_cells(axis_cells, k) < _chi_square_bound(k)


# -- pickling and spawned processes ----------------------------------------------------
def _corners_and_patches_in_child(payload: bytes) -> tuple[list, np.ndarray]:
    """Run in a spawned process: unpickle a sampler and report its corners and patches."""
    sampler = pickle.loads(payload)
    patches, _ = sampler.get_batch(np.arange(min(len(sampler), 5)))
    return sampler.coords_array().tolist(), patches


def _samplers(tmp_path: Path) -> list[PatchSampler]:
    arr = np.arange(30 * 40, dtype=np.float32).reshape(30, 40)
    path = tmp_path / "vol.npy"
    np.save(path, arr)
    return [
        PatchSampler(arr, (6, 7), 25, seed=2**63 + 99, stride=(2, 3)),
        PatchSampler(mixle.read_npy(path), (6, 7), 25, seed=-5),
    ]


def test_pickle_round_trip_keeps_corners_and_patches(tmp_path: Path) -> None:
    for s in _samplers(tmp_path):
        clone = pickle.loads(pickle.dumps(s))
        assert clone.coords_array().tolist() == s.coords_array().tolist()
        assert (clone.patch_size, clone.stride, clone.seed, len(clone)) == (
            s.patch_size,
            s.stride,
            s.seed,
            len(s),
        )
        np.testing.assert_array_equal(clone.get_batch([0, 3, 24])[0], s.get_batch([0, 3, 24])[0])
        np.testing.assert_array_equal(clone[-1][0], s[-1][0])


def test_npy_sampler_pickles_by_reference(tmp_path: Path) -> None:
    arr = np.zeros((200, 300), dtype=np.float64)
    path = tmp_path / "big.npy"
    np.save(path, arr)
    s = PatchSampler(mixle.read_npy(path), 8, 10, seed=1)
    assert len(pickle.dumps(s)) < arr.nbytes // 100


@pytest.mark.slow
def test_corners_same_in_spawned_process(tmp_path: Path) -> None:
    samplers = _samplers(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        futures = [pool.submit(_corners_and_patches_in_child, pickle.dumps(s)) for s in samplers]
        results = [f.result(timeout=120) for f in futures]
    for s, (corners, patches) in zip(samplers, results):
        assert corners == s.coords_array().tolist()
        np.testing.assert_array_equal(patches, s.get_batch(np.arange(5))[0])


# -- validation ---------------------------------------------------------------------------
_ARR = np.zeros((10, 12))


@pytest.mark.parametrize("patch_size", [2.5, (2, 2.5), "3", None, True, (2, True)])
def test_patch_size_non_integer(patch_size: object) -> None:
    with pytest.raises(TypeError, match="patch_size"):
        PatchSampler(_ARR, patch_size, 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("patch_size", [0, -1, (0, 2), (2, -3)])
def test_patch_size_not_positive(patch_size: object) -> None:
    with pytest.raises(ValueError, match="patch_size"):
        PatchSampler(_ARR, patch_size, 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("patch_size", [(2, 2, 2), ()])  # (2,): axis 0 is a channel axis
def test_patch_size_wrong_rank(patch_size: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="patch_size"):
        PatchSampler(_ARR, patch_size, 5)


@pytest.mark.parametrize("patch_size", [(11, 2), (2, 13), 11])
def test_patch_size_larger_than_volume(patch_size: object) -> None:
    with pytest.raises(ValueError, match="patch_size"):
        PatchSampler(_ARR, patch_size, 5)  # type: ignore[arg-type]


def test_patch_size_equal_to_volume_is_allowed() -> None:
    s = PatchSampler(_ARR, (10, 12), 3, seed=5)
    assert s.grid_shape == (1, 1)
    assert s.coords() == [(0, 0)] * 3


def test_num_patches_negative() -> None:
    with pytest.raises(ValueError, match="num_patches"):
        PatchSampler(_ARR, 2, -1)


@pytest.mark.parametrize("num_patches", [1.5, 2.0, "3", None, True])
def test_num_patches_not_int(num_patches: object) -> None:
    with pytest.raises(TypeError, match="num_patches"):
        PatchSampler(_ARR, 2, num_patches)  # type: ignore[arg-type]


def test_num_patches_zero() -> None:
    s = PatchSampler(_ARR, 2, 0)
    assert len(s) == 0
    assert s.coords_array().shape == (0, 2)
    assert s.coords() == []
    with pytest.raises(IndexError, match="index"):
        s[0]


@pytest.mark.parametrize("stride", [0, -1, (1, 0), (0, 1)])
def test_stride_not_positive(stride: object) -> None:
    with pytest.raises(ValueError, match="stride"):
        PatchSampler(_ARR, 2, 5, stride=stride)  # type: ignore[arg-type]


@pytest.mark.parametrize("stride", [1.5, (1, 2.0), "2"])
def test_stride_not_int(stride: object) -> None:
    with pytest.raises(TypeError, match="stride"):
        PatchSampler(_ARR, 2, 5, stride=stride)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", ["1", 1.5, True, None])
def test_seed_not_int(seed: object) -> None:
    with pytest.raises(TypeError, match="seed"):
        PatchSampler(_ARR, 2, 5, seed=seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [np.int64(3), np.uint64(2**64 - 1), 2**70, -(2**70)])
def test_seed_large_and_numpy_ints_accepted(seed: object) -> None:
    s = PatchSampler(_ARR, 2, 5, seed=seed)  # type: ignore[arg-type]
    assert s.seed == int(seed)  # type: ignore[call-overload]
    assert type(s.seed) is int


def test_zero_dimensional_array_rejected() -> None:
    with pytest.raises(ValueError, match="0-dimensional"):
        PatchSampler(np.zeros(()), 1, 1)


def test_index_out_of_range_and_negative() -> None:
    arr = np.arange(120.0).reshape(10, 12)
    s = PatchSampler(arr, (3, 4), 5, seed=8)
    for bad in (5, 6, -6, 10**20):
        with pytest.raises(IndexError, match="index"):
            s[bad]
    for bad in (1.0, "0", True, None):
        with pytest.raises(TypeError, match="index"):
            s[bad]  # type: ignore[index]
    with pytest.raises(IndexError):
        s.coords_array([5])
    with pytest.raises(IndexError):
        s.coords_array([-6])
    for i in range(-5, 0):
        patch, coords = s[i]
        same_patch, same_coords = s[i + 5]
        assert coords == same_coords
        np.testing.assert_array_equal(patch, same_patch)
    assert s[np.int64(-1)][1] == s[4][1]


def test_patches_match_numpy_and_are_new_arrays() -> None:
    arr = np.arange(9 * 10 * 11, dtype=np.int64).reshape(9, 10, 11)
    before = arr.copy()
    s = PatchSampler(arr, (3, 4, 5), 12, seed=77, stride=(1, 2, 3))
    batch, corners = s.get_batch(np.arange(12))
    assert corners.dtype == np.int64
    assert batch.shape == (12, 3, 4, 5)
    assert batch.dtype == arr.dtype
    for i in range(12):
        patch, coords = s[i]
        expected = arr[_box(coords, (3, 4, 5))]
        np.testing.assert_array_equal(patch, expected)
        np.testing.assert_array_equal(batch[i], expected)
        assert tuple(corners[i].tolist()) == coords
        assert not np.shares_memory(patch, arr)
        patch[...] = -1  # writing into the returned patch must not touch the source
    assert not np.shares_memory(batch, arr)
    batch[...] = -1
    np.testing.assert_array_equal(arr, before)


def test_npy_patches_match_numpy_and_leave_file_alone(tmp_path: Path) -> None:
    arr = np.random.default_rng(0).standard_normal((17, 19, 5)).astype(np.float32)
    path = tmp_path / "vol.npy"
    np.save(path, arr)
    s = PatchSampler(mixle.read_npy(path), (4, 5, 5), 8, seed=3, stride=2)
    for i in range(8):
        patch, coords = s[i]
        np.testing.assert_array_equal(patch, arr[_box(coords, (4, 5, 5))])
        patch[...] = 0
    np.testing.assert_array_equal(np.load(path), arr)
