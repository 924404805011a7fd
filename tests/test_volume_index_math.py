"""Which volume an index means: golden values, exact coverage, and the drawn probabilities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math.volumes import (
    MAX_VOLUME_REDRAWS,
    cumulative_weights,
    group_by_volume,
    permuted_positions,
    uniform_valid_volumes,
    uniform_volumes,
    weighted_volumes,
)

#: 99.9% quantiles of the chi-square distribution by degrees of freedom (scipy-free).
CHI2_999 = {3: 16.27, 4: 18.47, 9: 27.88, 19: 43.82}


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def test_golden_values() -> None:
    """The draws are pinned: changing them changes every user's sampled volumes."""
    assert uniform_volumes(7, np.arange(8), 10, 2, epoch=1).tolist() == [4, 4, 7, 7, 1, 1, 9, 9]
    cum = cumulative_weights([1, 0, 2, 5])
    assert weighted_volumes(7, np.arange(8), cum).tolist() == [0, 2, 3, 0, 3, 3, 3, 3]
    vols, pos = permuted_positions(3, np.arange(8), np.cumsum([3, 0, 5]), epoch=2)
    assert vols.tolist() == [0, 2, 2, 0, 0, 2, 2, 2]
    assert pos.tolist() == [0, 0, 1, 2, 1, 3, 2, 4]


@given(
    seed=st.integers(0, 2**64 - 1),
    count=st.integers(1, 50),
    per=st.integers(1, 9),
    start=st.integers(0, 2**40),
    epoch=st.integers(0, 5),
)
def test_uniform_blocks_share_a_volume_and_stay_in_range(seed, count, per, start, epoch) -> None:
    idx = np.arange(start, start + 40, dtype=np.int64)
    vols = uniform_volumes(seed, idx, count, per, epoch=epoch)
    assert vols.min() >= 0 and vols.max() < count
    for block in np.unique(idx // per):
        assert np.unique(vols[idx // per == block]).size == 1
    # a pure function of the index: asked one at a time, in any order, the same
    one = [int(uniform_volumes(seed, [i], count, per, epoch=epoch)[0]) for i in idx[::-1]]
    assert one[::-1] == vols.tolist()


def test_uniform_is_uniform() -> None:
    vols = uniform_volumes(11, np.arange(200_000), 10)
    counts = np.bincount(vols, minlength=10)
    assert _chi2(counts, np.full(10, 0.1)) < CHI2_999[9]


def test_weighted_matches_its_probabilities_and_never_draws_zero_weight() -> None:
    weights = np.array([3.0, 0.0, 1.0, 6.0, 0.5])
    vols = weighted_volumes(5, np.arange(200_000), cumulative_weights(weights))
    counts = np.bincount(vols, minlength=5)
    assert counts[1] == 0
    probs = weights / weights.sum()
    assert _chi2(counts[probs > 0], probs[probs > 0]) < CHI2_999[3]


@given(
    weights=st.lists(st.integers(0, 5), min_size=1, max_size=12).filter(any),
    seed=st.integers(0, 2**64 - 1),
    per=st.integers(1, 4),
)
def test_weighted_blocks_share_a_positive_weight_volume(weights, seed, per) -> None:
    idx = np.arange(60, dtype=np.int64)
    vols = weighted_volumes(seed, idx, cumulative_weights(weights), per)
    assert all(weights[v] > 0 for v in vols.tolist())
    for block in np.unique(idx // per):
        assert np.unique(vols[idx // per == block]).size == 1


def test_valid_volumes_only_and_equally_likely() -> None:
    valid_set = np.array([1, 4, 5, 8])
    mask = np.zeros(10, dtype=bool)
    mask[valid_set] = True
    asked: list[int] = []

    def valid(vs: np.ndarray) -> np.ndarray:
        asked.extend(vs.tolist())
        return mask[vs]

    vols = uniform_valid_volumes(3, np.arange(100_000), 10, valid)
    assert set(vols.tolist()) == set(valid_set.tolist())
    counts = np.bincount(vols, minlength=10)[valid_set]
    assert _chi2(counts, np.full(4, 0.25)) < CHI2_999[3]
    # where every volume is valid it is exactly the plain uniform draw
    same = uniform_valid_volumes(3, np.arange(500), 10, lambda vs: np.ones(vs.size, bool))
    assert same.tolist() == uniform_volumes(3, np.arange(500), 10).tolist()


def test_valid_volumes_fall_back_to_the_valid_list_when_redraws_run_out() -> None:
    n = 10_000  # one valid volume in 10,000: 64 redraws almost never find it
    only = 1234

    def valid(vs: np.ndarray) -> np.ndarray:
        return vs == only

    calls = []

    def all_valid() -> np.ndarray:
        calls.append(1)
        return np.array([only])

    vols = uniform_valid_volumes(9, np.arange(50), n, valid, all_valid=all_valid)
    assert set(vols.tolist()) == {only} and calls
    again = uniform_valid_volumes(9, np.arange(50), n, valid, all_valid=all_valid)
    assert again.tolist() == vols.tolist()
    with pytest.raises(ValueError, match="no volume of the collection can hold a patch"):
        uniform_valid_volumes(9, [0], n, lambda vs: np.zeros(vs.size, bool))
    assert MAX_VOLUME_REDRAWS >= 16


@settings(max_examples=60)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=10).filter(any),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 3),
    passes=st.integers(1, 3),
)
def test_without_replacement_every_position_of_every_volume_once_per_pass(
    counts, seed, epoch, passes
) -> None:
    cum = np.cumsum(counts, dtype=np.int64)
    total = int(cum[-1])
    vols, pos = permuted_positions(seed, np.arange(passes * total), cum, epoch=epoch)
    for k in range(passes):
        v, p = vols[k * total : (k + 1) * total], pos[k * total : (k + 1) * total]
        assert all(0 <= q < counts[w] for w, q in zip(v.tolist(), p.tolist()))
        assert len(set(zip(v.tolist(), p.tolist()))) == total
    if passes > 1 and total > 3:  # each pass has its own order
        assert (
            vols[:total].tolist() + pos[:total].tolist()
            != (vols[total : 2 * total].tolist() + pos[total : 2 * total].tolist())
            or math.factorial(total) < 50
        )


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1.0, -1.0], "volume 1 has -1.0"),
        ([1.0, float("nan")], "volume 1 has nan"),
        ([0, 0], "all zero"),
        ([], "all zero"),
    ],
)
def test_bad_weights(weights, match) -> None:
    with pytest.raises(ValueError, match=match):
        cumulative_weights(weights)


def test_no_positions_is_an_error() -> None:
    with pytest.raises(ValueError, match="no volume of the collection has a corner position"):
        permuted_positions(0, [0], np.array([0, 0], dtype=np.int64))


@given(vols=st.lists(st.integers(0, 6), max_size=60))
def test_group_by_volume_partitions_positions_largest_first(vols) -> None:
    groups = group_by_volume(vols)
    assert sorted(np.concatenate(groups).tolist() if groups else []) == list(range(len(vols)))
    for g in groups:
        assert len({vols[i] for i in g.tolist()}) == 1 and g.tolist() == sorted(g.tolist())
    sizes = [len(g) for g in groups]
    assert sizes == sorted(sizes, reverse=True)
    assert len(groups) == len(set(vols))
