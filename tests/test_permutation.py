"""Feistel epoch permutations: true permutations for every n, golden values, uniformity."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math import permutation
from mixle.data.index_math.permutation import inverse_permute, permutation_key, permute

# n = 1, 2, 3 and 2**k - 1, 2**k, 2**k + 1 for k up to 20: a popular shuffle duplicates a
# record at n = 2**k + 1.
EDGE_SIZES = sorted({1, 2, 3} | {m for k in range(1, 21) for m in (2**k - 1, 2**k, 2**k + 1)})


@pytest.mark.parametrize("n", EDGE_SIZES)
def test_every_edge_size_is_a_permutation(n: int) -> None:
    order = permute(np.arange(n), n, seed=n, epoch=1)
    assert order.dtype == np.int64 and order.shape == (n,)
    assert np.array_equal(np.bincount(order, minlength=n), np.ones(n, dtype=np.int64))
    assert np.array_equal(inverse_permute(order, n, seed=n, epoch=1), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5000),
    seed=st.integers(-(2**70), 2**70),
    epoch=st.integers(0, 2**40),
)
def test_random_sizes_are_permutations(n: int, seed: int, epoch: int) -> None:
    order = permute(np.arange(n), n, seed=seed, epoch=epoch)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert np.array_equal(inverse_permute(order, n, seed=seed, epoch=epoch), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2**62),
    seed=st.integers(0, 2**64 - 1),
    positions=st.lists(st.integers(0, 2**62), min_size=1, max_size=50),
)
def test_random_access_round_trips_for_huge_n(n: int, seed: int, positions: list[int]) -> None:
    pos = np.array([p % n for p in positions], dtype=np.int64)
    out = permute(pos, n, seed=seed)
    assert ((out >= 0) & (out < n)).all()
    assert np.array_equal(inverse_permute(out, n, seed=seed), pos)
    # distinct positions give distinct records
    assert np.unique(out).size == np.unique(pos).size


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), data=st.data())
def test_any_slice_equals_the_full_order(n: int, data: st.DataObject) -> None:
    full = permute(np.arange(n), n, seed=5, epoch=2)
    pos = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
    assert np.array_equal(permute(pos, n, seed=5, epoch=2), full[pos])
    assert np.array_equal(permute(pos.reshape(-1, 1), n, seed=5, epoch=2), full[pos][:, None])


def test_blocks_do_not_change_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 3 * 1000 + 7
    whole = permute(np.arange(n), n, seed=9)
    monkeypatch.setattr(permutation, "_BLOCK", 64)
    assert np.array_equal(permute(np.arange(n), n, seed=9), whole)


# -- golden values: changing any of these changes every user's shuffles --------------------
def test_golden_values() -> None:
    assert permute(np.arange(10), 10).tolist() == [6, 3, 8, 0, 9, 1, 2, 7, 4, 5]
    assert permute(np.arange(10), 10, seed=1).tolist() == [1, 4, 0, 7, 5, 9, 2, 6, 8, 3]
    assert permute(np.arange(10), 10, epoch=1).tolist() == [6, 3, 0, 9, 2, 7, 1, 5, 4, 8]
    assert permute(np.arange(8), 2**16 + 1, seed=42, epoch=3).tolist() == [
        3751, 3820, 61293, 26864, 879, 57285, 31066, 9365,
    ]  # fmt: skip
    got = permute([0, 1, 2, 999_999, 123_456], 1_000_003, seed=-7, epoch=2)
    assert got.tolist() == [979003, 326892, 613651, 600229, 491310]
    got = permute([0, 1, 5], 2**40 + 1, seed=2**64 - 1, epoch=9)
    assert got.tolist() == [51014180756, 398445915668, 211671828445]


def test_seed_is_taken_modulo_2_64() -> None:
    assert permutation_key(-1, 3) == permutation_key(2**64 - 1, 3)
    assert np.array_equal(
        permute(np.arange(50), 50, seed=-1), permute(np.arange(50), 50, seed=2**64 - 1)
    )


def test_epochs_and_seeds_give_different_orders() -> None:
    n = 1000
    orders = {tuple(permute(np.arange(n), n, seed=s, epoch=e)) for s in range(3) for e in range(4)}
    assert len(orders) == 12
    assert tuple(range(n)) not in orders


def _chi_square_bound(dof: int) -> float:
    return dof + 6 * math.sqrt(2 * dof)


@pytest.mark.parametrize("n", [3, 4])
def test_small_orders_are_about_equally_likely(n: int) -> None:
    k, per = math.factorial(n), 100
    counts = Counter(tuple(permute(np.arange(n), n, seed=s)) for s in range(k * per))
    assert len(counts) == k
    chi = sum((c - per) ** 2 / per for c in counts.values())
    assert chi < _chi_square_bound(k - 1), chi


@pytest.mark.parametrize("n", [33, 1000])
def test_each_position_takes_each_record_about_equally_often(n: int) -> None:
    seeds = 300 if n == 33 else 60
    counts = np.zeros((n, n))
    for s in range(seeds):
        counts[np.arange(n), permute(np.arange(n), n, seed=s, epoch=s)] += 1
    expected = seeds / n
    chi = float(((counts - expected) ** 2 / expected).sum())
    assert chi < _chi_square_bound((n - 1) ** 2), chi


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"n=0 must be in \[1, 2\*\*62\]"):
        permute([0], 0)
    with pytest.raises(TypeError, match="n=True must be an int"):
        permute([0], True)
    with pytest.raises(IndexError, match=r"positions contains 5, outside \[0, n\) for n=5"):
        permute([0, 5], 5)
    with pytest.raises(IndexError, match="positions contains -1"):
        inverse_permute([-1], 5)
    with pytest.raises(TypeError, match="positions must be integers, got dtype float64"):
        permute([0.5], 5)
    with pytest.raises(TypeError, match=r"seed=1\.5 must be an int"):
        permute([0], 5, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="epoch='1' must be an int"):
        permute([0], 5, epoch="1")  # type: ignore[arg-type]


def test_empty_and_shaped_positions() -> None:
    assert permute(np.zeros(0, dtype=np.int64), 7).shape == (0,)
    assert permute(np.zeros((2, 0), dtype=np.int32), 7).shape == (2, 0)
    assert permute(np.array(3), 7).shape == ()
    assert permute([0, 0, 0], 1).tolist() == [0, 0, 0]
