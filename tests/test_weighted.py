"""Weighted and label-driven placement: probabilities, zero weights, laziness, determinism."""

from __future__ import annotations

import gc
import math
import multiprocessing
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle import PatchSampler
from mixle.data.sampling import weight_index as weighted
from mixle.data.sources.arrays.adopt import ArrayLikeSource


def _chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def _bound(k: int) -> float:
    """Mean of chi-square with k - 1 degrees of freedom plus 6 standard deviations."""
    return (k - 1) + 6 * math.sqrt(2 * (k - 1))


class CountingSource(ArrayLikeSource):
    """An in-memory source that records the size of every box read."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array)
        self.reads: list[int] = []

    def read_boxes(self, starts, size, *, out=None):  # type: ignore[no-untyped-def]
        n = len(np.asarray(starts).reshape(-1, self.ndim))
        self.reads.append(n * int(np.prod(size)))
        return super().read_boxes(starts, size, out=out)


def _weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = np.zeros((12, 14, 10))
    voxels = np.array([[3, 3, 3], [3, 4, 3], [6, 7, 5], [8, 10, 6], [5, 9, 4], [7, 3, 6]])
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 0.5])
    w[tuple(voxels.T)] = values
    w[0, 0, 0] = 100.0  # a patch cannot be centred here: never drawn
    return w, voxels, values


def test_draws_follow_the_weights_and_skip_zero_weight() -> None:
    w, voxels, values = _weights()
    vol = np.zeros(w.shape, dtype=np.float32)
    n = 60_000
    s = PatchSampler(vol, (6, 6, 4), n, seed=2024, weights=w)
    centres = s.coords_array() + np.array([3, 3, 2])
    assert (w[tuple(centres.T)] > 0).all() and (centres != 0).any(axis=1).all()
    keys = {tuple(v): k for k, v in enumerate(voxels.tolist())}
    cells = np.array([keys[tuple(c)] for c in centres.tolist()])
    observed = np.bincount(cells, minlength=len(values)).astype(float)
    assert _chi_square(observed, n * values / values.sum()) < _bound(len(values))
    again = PatchSampler(vol, (6, 6, 4), n, seed=2024, weights=w).coords_array([5, 17, 99])
    np.testing.assert_array_equal(again, s.coords_array([5, 17, 99]))


def test_weights_at_lower_resolution_and_with_padding() -> None:
    coarse = np.zeros((4, 5))
    coarse[0, 0], coarse[3, 4], coarse[2, 1] = 1.0, 1.0, 2.0
    vol = np.zeros((16, 20))  # factor 4 on both axes
    s = PatchSampler(vol, 8, 8_000, seed=1, weights=coarse, padding="edge")
    centres = s.coords_array() + 4
    cells = centres // 4
    assert set(map(tuple, cells.tolist())) == {(0, 0), (3, 4), (2, 1)}
    assert ((centres % 4) == 0).all()
    counts = np.array([(cells == c).all(axis=1).sum() for c in ([0, 0], [3, 4], [2, 1])])
    assert _chi_square(counts.astype(float), 8_000 * np.array([0.25, 0.25, 0.5])) < _bound(3)
    patches, _ = s.get_batch(range(10))
    assert patches.shape == (10, 8, 8)
    inside = PatchSampler(vol, 8, 2_000, seed=1, weights=coarse).coords_array() + 4
    assert set(map(tuple, (inside // 4).tolist())) == {(3, 4), (2, 1)}  # (0, 0) can't centre
    with pytest.raises(ValueError, match="no voxel of weights can centre a patch of"):
        PatchSampler(np.zeros((12, 20)), (10, 8), 10, weights=coarse[:3])


def test_label_driven_patches_centre_on_the_requested_class() -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random((30, 28, 26)) < 0.03).astype(np.int32) + (rng.random((30, 28, 26)) < 0.01)
    image = rng.standard_normal(labels.shape).astype(np.float32)
    n = 20_000
    probs = {0: 0.2, 1: 0.5, 2: 0.3}
    s = PatchSampler({"image": image, "label": labels}, (8, 8, 8), n, seed=5, labels="label",
                     label_probabilities=probs)  # fmt: skip
    assert s.weighted is not None
    drawn = s.weighted.classes(5, np.arange(n))
    centres = s.coords_array() + 4
    got = labels[tuple(centres.T)]
    np.testing.assert_array_equal(got, np.array(list(probs))[drawn])
    observed = np.bincount(got, minlength=3).astype(float)
    assert _chi_square(observed, n * np.array(list(probs.values()))) < _bound(3)
    # within class 2, every voxel where a patch fits is equally likely
    inner = np.zeros(labels.shape, dtype=bool)
    inner[4:27, 4:25, 4:23] = True
    where = np.flatnonzero((labels == 2) & inner)
    hits = np.ravel_multi_index(tuple(centres[got == 2].T), labels.shape)
    per_voxel = np.searchsorted(where, hits)
    assert (where[per_voxel] == hits).all()
    k = where.size
    observed = np.bincount(per_voxel, minlength=k).astype(float)
    assert _chi_square(observed, np.full(k, hits.size / k)) < _bound(k)
    batch = s.get_batch(range(64))
    assert batch["image"].shape == (64, 8, 8, 8)


def test_index_is_built_block_by_block_and_cached(monkeypatch) -> None:
    monkeypatch.setattr(weighted, "INDEX_BLOCK_VOXELS", 512)
    labels = np.zeros((40, 36, 30), dtype=np.uint8)
    labels[10:14, 20:22, 5:9] = 1
    src = CountingSource(labels)
    s = PatchSampler(np.zeros(labels.shape), 6, 500, labels=src, label_probabilities={1: 1})
    assert max(src.reads) <= 512 and sum(src.reads) <= labels.size  # never the whole volume
    assert len(src.reads) > 20
    src.reads.clear()
    first = s.coords_array()
    blocks = len(src.reads)
    assert 0 < blocks < 10  # only the blocks holding the class are read
    np.testing.assert_array_equal(s.coords_array(), first)
    assert len(src.reads) == blocks  # their positions were cached
    assert s.weighted is not None and s.weighted.totals.sum() == 32


def _corners_in_child(s: PatchSampler) -> list:
    return s.coords_array().tolist()


def test_deterministic_after_pickling_in_another_process_and_per_epoch() -> None:
    w, _, _ = _weights()
    s = PatchSampler(np.zeros(w.shape), (6, 6, 4), 300, seed=-9, weights=w)
    want = s.coords_array()
    assert want[:4].tolist() == [[3, 4, 3], [5, 7, 4], [3, 4, 3], [5, 7, 4]]  # golden values
    lab = np.zeros((9, 8), dtype=np.uint8)
    lab[2:5, 3], lab[6, 6] = 1, 2
    by_label = PatchSampler(np.zeros((9, 8)), 3, 6, seed=7, labels=lab,
                            label_probabilities={1: 0.5, 2: 0.5})  # fmt: skip
    assert by_label.coords_array().tolist() == [[5, 5], [1, 2], [5, 5], [2, 2], [5, 5], [5, 5]]
    copy = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(copy.coords_array(), want)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        assert pool.submit(_corners_in_child, s).result() == want.tolist()
    s.set_epoch(2)
    other = s.coords_array()
    assert not np.array_equal(other, want)
    np.testing.assert_array_equal(
        PatchSampler(np.zeros(w.shape), (6, 6, 4), 300, seed=-9, weights=w, epoch=2)
        .coords_array(), other)  # fmt: skip


def test_bad_weights_and_labels() -> None:
    vol = np.zeros((10, 10))
    w = np.ones((10, 10))
    with pytest.raises(ValueError, match=r"weights has the value -0\.5 at \(4, 5\); weights must"):
        PatchSampler(vol, 2, 3, weights=np.where(np.arange(100).reshape(10, 10) == 45, -0.5, 1))
    with pytest.raises(ValueError, match="weights has the value nan"):
        PatchSampler(vol, 2, 3, weights=np.full((10, 10), np.nan))
    with pytest.raises(ValueError, match="weights are zero everywhere a patch can be centred"):
        PatchSampler(vol, 2, 3, weights=np.zeros((10, 10)))
    lab = np.zeros((10, 10), dtype=np.int8)
    with pytest.raises(ValueError, match="asks for class 1, but no voxel"):
        PatchSampler(vol, 2, 3, labels=lab, label_probabilities={0: 0.5, 1: 0.5})
    for bad in ({}, {0: -1}, {0: 0.0}, {0: float("inf")}, [0.5]):
        with pytest.raises(ValueError, match="label_probabilities"):
            PatchSampler(vol, 2, 3, labels=lab, label_probabilities=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="label_probabilities key='a' must be an int"):
        PatchSampler(vol, 2, 3, labels=lab, label_probabilities={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="labels= needs label_probabilities"):
        PatchSampler(vol, 2, 3, labels=lab)
    with pytest.raises(ValueError, match="label_probabilities needs labels="):
        PatchSampler(vol, 2, 3, label_probabilities={0: 1})
    with pytest.raises(ValueError, match="pass weights= or labels=, not both"):
        PatchSampler(vol, 2, 3, weights=w, labels=lab, label_probabilities={0: 1})
    with pytest.raises(ValueError, match="stride=2 cannot be combined with weights"):
        PatchSampler(vol, 2, 3, weights=w, stride=2)
    with pytest.raises(ValueError, match="replacement=False cannot be combined with weights"):
        PatchSampler(vol, 2, 3, weights=w, replacement=False)
    with pytest.raises(ValueError, match=r"weights has shape \(1, 10, 10\) but patches have 2"):
        PatchSampler(vol, 2, 3, weights=w[None])
    with pytest.raises(ValueError, match="is not the finest shape"):
        PatchSampler(vol, 2, 3, weights=np.ones((7, 10)))
    with pytest.raises(KeyError, match="labels='seg' names no array of this sampler"):
        PatchSampler({"img": vol}, 2, 3, labels="seg", label_probabilities={0: 1})
    with pytest.raises(ValueError, match="corners must be multiples of"):
        PatchSampler({"img": vol, "half": vol[::2, ::2]}, 4, 3, weights=w)


class BarrierSource(ArrayLikeSource):
    """Makes two threads read one box at the same time (a cache miss in both)."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array)
        self.barrier: threading.Barrier | None = None

    def read_box(self, start, size):  # type: ignore[no-untyped-def]
        if self.barrier is not None:
            self.barrier.wait(timeout=10)
        return super().read_box(start, size)


def test_block_cache_counts_a_block_built_by_two_threads_once() -> None:
    # Regression: both threads added the block's bytes, so the byte count drifted up and
    # the cache evicted blocks it had room for.
    w = np.ones((8, 8))
    src = BarrierSource(w)
    index = weighted.BlockIndex(src, (0, 0), (8, 8), None, "weights")
    src.barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        details = list(pool.map(index._detail, [0, 0]))
    np.testing.assert_array_equal(details[0], details[1])
    shared = weighted._details
    mine = [d for (token, _), (d, _) in shared.entries.items() if token == index._token]
    assert len(mine) == 1 and mine[0].nbytes == w.nbytes
    assert shared.bytes == sum(d.nbytes for d, _ in shared.entries.values())


def test_block_details_of_many_maps_share_one_budget(monkeypatch) -> None:
    # A sampler over many volumes has one map each: their details must not each keep
    # BLOCK_CACHE_BYTES (that grew without bound with the number of volumes).
    monkeypatch.setattr(weighted, "_details", weighted._SharedDetails())
    monkeypatch.setattr(weighted, "BLOCK_CACHE_BYTES", 3 * 64 * 8)
    maps = [
        weighted.BlockIndex(ArrayLikeSource(np.full((8, 8), k + 1.0)), (0, 0), (8, 8), None, "w")
        for k in range(10)
    ]
    for k, index in enumerate(maps):
        np.testing.assert_array_equal(index._detail(0), np.cumsum(np.full(64, k + 1.0)))
    shared = weighted._details
    assert len(shared.entries) == 3 and shared.bytes == 3 * 64 * 8
    del maps, index
    gc.collect()
    shared.get((-1, 0))  # the next use drops what collected maps left
    assert not shared.entries and shared.bytes == 0 and not shared.by_token


def test_a_map_collected_inside_the_cache_does_not_deadlock(monkeypatch) -> None:
    # A garbage collection can start while put() holds the cache's lock; a map collected
    # then must not ask for that lock again on the same thread (it hung).
    monkeypatch.setattr(weighted, "_details", weighted._SharedDetails())
    index = weighted.BlockIndex(ArrayLikeSource(np.ones((4, 4))), (0, 0), (4, 4), None, "w")
    token = index._token
    cycle: list[Any] = [index]
    cycle.append(cycle)  # collected only by the cycle collector
    del index
    real = weighted._nbytes

    def collect_inside(detail: Any) -> int:
        gc.collect()  # what an allocation under the lock may trigger
        return real(detail)

    monkeypatch.setattr(weighted, "_nbytes", collect_inside)
    done = threading.Event()

    def put() -> None:
        weighted._details.put((token + 1, 0), np.zeros(3))
        with weighted._details.lock:  # the lock is free again
            pass
        done.set()

    del cycle
    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    thread.join(timeout=30)  # only catches the hang
    assert done.is_set()


def test_an_absent_class_with_probability_zero_is_allowed() -> None:
    # Regression: the error for an absent class told users to give it probability 0, but
    # probability 0 raised the same error.
    lab = np.zeros((10, 10), dtype=np.int8)
    lab[4:6, 4:6] = 1
    probs = {0: 0.4, 2: 0.0, 1: 0.6}
    s = PatchSampler(np.zeros((10, 10)), 2, 500, seed=3, labels=lab, label_probabilities=probs)
    assert s.weighted is not None
    drawn = s.weighted.classes(3, np.arange(500))
    assert set(drawn.tolist()) == {0, 2}  # positions of classes 0 and 1; never class 2
    got = lab[tuple((s.coords_array() + 1).T)]
    np.testing.assert_array_equal(got, np.array([0, 2, 1])[drawn])
    with pytest.raises(ValueError, match="asks for class 2, but no voxel"):
        PatchSampler(np.zeros((10, 10)), 2, 3, labels=lab, label_probabilities={1: 0.5, 2: 0.5})


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 14), min_size=1, max_size=3),
    st.integers(0, 2**32),
    st.sampled_from([4, 16, 64]),
    st.booleans(),
    st.booleans(),
)
def test_draws_land_on_positive_weights_or_the_drawn_class(shape, seed, block, padded, by_label):
    # Many small index blocks, some with zero total: the inverse-CDF draws must skip them.
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    patch = tuple(int(rng.integers(1, d + 1)) for d in shape)
    half = np.array(patch) // 2
    mode = "edge" if padded else "none"
    lo = np.zeros(len(shape), dtype=int) if padded else half
    hi = np.array(shape) if padded else np.array(shape) - np.array(patch) + half + 1
    inner = np.zeros(shape, dtype=bool)
    inner[tuple(slice(a, b) for a, b in zip(lo, hi))] = True
    labels = (rng.random(shape) < 0.1).astype(np.uint8) * 2 + (rng.random(shape) < 0.2)
    labels[tuple(int(rng.integers(a, b)) for a, b in zip(lo, hi))] = 1  # class 1 can centre
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(weighted, "INDEX_BLOCK_VOXELS", block)
        if by_label:
            probs = {1: 0.7, 3: 0.0, 2: 0.3 if (labels[inner] == 2).any() else 0.0}
            s = PatchSampler(np.zeros(shape), patch, 200, seed=seed, padding=mode,
                             labels=labels, label_probabilities=probs)  # fmt: skip
        else:
            w = np.where(labels == 1, rng.random(shape) + 0.01, 0.0)
            s = PatchSampler(np.zeros(shape), patch, 200, seed=seed, padding=mode, weights=w)
    centres = s.coords_array() + half
    assert inner[tuple(centres.T)].all()
    if by_label:
        assert s.weighted is not None
        want = np.array([1, 3, 2])[s.weighted.classes(seed, np.arange(200))]
        np.testing.assert_array_equal(labels[tuple(centres.T)], want)
    else:
        assert (w[tuple(centres.T)] > 0).all()
