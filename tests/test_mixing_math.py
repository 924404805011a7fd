"""Index math of concat and mix: offsets, the split-tree interleaving and its window bound."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math.mixing import MixPlan, locate_concat, visit_records
from mixle.data.index_math.permutation import permute

# ---------------------------------------------------------------- concat


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=6), st.data())
def test_locate_concat_matches_concatenated_lists(lengths: list[int], data: st.DataObject) -> None:
    reference = [(k, j) for k, n in enumerate(lengths) for j in range(n)]
    if not reference:
        child, local = locate_concat(np.zeros(0, np.int64), lengths)
        assert child.size == local.size == 0
        return
    idx = data.draw(st.lists(st.integers(0, len(reference) - 1), max_size=30))
    child, local = locate_concat(np.asarray(idx, np.int64), lengths)
    assert child.dtype == local.dtype == np.int64
    assert list(zip(child.tolist(), local.tolist())) == [reference[i] for i in idx]


# ---------------------------------------------------------------- mix: a slow reference


def reference_assign(plan: MixPlan, position: int) -> tuple[int, int]:
    """The construction written out in exact rationals, one position at a time."""
    code, r = plan.root, position
    while code < 0:
        node = plan.nodes[-1 - code]
        p, phi = Fraction(node.a, node.b), Fraction(node.c, node.b)
        before, after = math.floor(r * p + phi), math.floor((r + 1) * p + phi)
        assert after - before in (0, 1)
        code, r = (node.heavy, before) if after - before == 1 else (node.light, r - before)
    return code, r


weights_st = st.lists(
    st.one_of(
        st.integers(0, 9),
        st.integers(0, 2**70),
        st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False),
        st.fractions(0, 5, max_denominator=50),
    ),
    min_size=1,
    max_size=6,
).filter(lambda ws: any(w > 0 for w in ws))


def make_plan(weights: list, seed: int = 0) -> MixPlan:
    tags = [1000 + 7919 * k for k in range(len(weights))]
    return MixPlan([Fraction(w) for w in weights], tags, seed)


@settings(max_examples=60, deadline=None)
@given(weights_st, st.integers(0, 2**64 - 1), st.integers(1, 300))
def test_assign_equals_the_slow_reference(weights: list, seed: int, n: int) -> None:
    plan = make_plan(weights, seed)
    source, visit = plan.assign(np.arange(n))
    assert list(zip(source.tolist(), visit.tolist())) == [
        reference_assign(plan, i) for i in range(n)
    ]


@settings(max_examples=40, deadline=None)
@given(
    weights_st, st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**62), min_size=1, max_size=20)
)
def test_far_positions_are_exact(weights: list, seed: int, positions: list[int]) -> None:
    """Positions near 2**62 overflow int64 products: the Python-int path gives the same."""
    plan = make_plan(weights, seed)
    source, visit = plan.assign(np.asarray(positions, np.int64))
    assert list(zip(source.tolist(), visit.tolist())) == [
        reference_assign(plan, p) for p in positions
    ]


@settings(max_examples=60, deadline=None)
@given(weights_st, st.integers(0, 2**64 - 1), st.integers(1, 400), st.data())
def test_every_window_is_within_the_bound(
    weights: list, seed: int, n: int, data: st.DataObject
) -> None:
    """Exact rational check against the weights as given (a float weight is its stored value)."""
    plan = make_plan(weights, seed)
    total = sum(Fraction(w) for w in weights)
    source, _ = plan.assign(np.arange(n))
    for k, w in enumerate(weights):
        share = Fraction(w) / total
        assert plan.shares[k] == share
        bound = plan.bounds[k]
        depth = plan.depths[k]
        assert bound < depth or bound == depth <= 1
        hits = np.concatenate([[0], np.cumsum(source == k)])
        sizes = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=4), label="w")
        for size in sizes:
            got = (hits[size:] - hits[:-size]).astype(object)  # every window of this size
            # |got - size * share| < bound, in exact integers: scaled by the denominators
            num, den = share.numerator, share.denominator
            err = np.abs(got * den - size * num) * bound.denominator
            assert (err < bound.numerator * den).all() or (bound == 0 and not err.any())


def test_two_sources_are_balanced_words() -> None:
    """Two sources: every window holds floor or ceil of w * share of each."""
    plan = make_plan([0.3, 0.7], seed=5)
    source, _ = plan.assign(np.arange(1000))
    hits = np.concatenate([[0], np.cumsum(source == 0)])
    share = Fraction(0.3) / (Fraction(0.3) + Fraction(0.7))
    for size in (1, 2, 3, 7, 10, 33, 100, 999):
        counts = hits[size:] - hits[:-size]
        assert set(counts.tolist()) <= {math.floor(size * share), math.ceil(size * share)}


@settings(max_examples=60, deadline=None)
@given(weights_st, st.integers(0, 2**64 - 1), st.integers(0, 500))
def test_counts_and_visit_numbers(weights: list, seed: int, n: int) -> None:
    plan = make_plan(weights, seed)
    source, visit = plan.assign(np.arange(n))
    assert plan.counts(n) == tuple(np.bincount(source, minlength=len(weights)).tolist())
    for k, w in enumerate(weights):
        assert visit[source == k].tolist() == list(range(int((source == k).sum())))
        if w == 0:
            assert not (source == k).any()


@settings(max_examples=60, deadline=None)
@given(weights_st, st.integers(0, 2**64 - 1), st.data())
def test_natural_length_is_the_last_length_without_a_repeat(
    weights: list, seed: int, data: st.DataObject
) -> None:
    plan = make_plan(weights, seed)
    lengths = [data.draw(st.integers(1, 40)) for _ in weights]
    n = plan.natural_length(lengths)
    assert all(c <= m for c, m, w in zip(plan.counts(n), lengths, weights) if w > 0)
    assert any(c > m for c, m, w in zip(plan.counts(n + 1), lengths, weights) if w > 0)


def test_order_of_the_sources_does_not_matter() -> None:
    weights, tags = [Fraction(3), Fraction(1), Fraction(2), Fraction(2)], [11, 22, 33, 44]
    plan = MixPlan(weights, tags, seed=9)
    order = [2, 0, 3, 1]
    other = MixPlan([weights[k] for k in order], [tags[k] for k in order], seed=9)
    a_src, a_visit = plan.assign(np.arange(200))
    b_src, b_visit = other.assign(np.arange(200))
    assert np.array_equal(np.asarray(order)[b_src], a_src)
    assert np.array_equal(a_visit, b_visit)
    assert [other.visit_seed(order.index(k)) for k in range(4)] == [
        plan.visit_seed(k) for k in range(4)
    ]


def test_seed_changes_the_phase_and_is_deterministic() -> None:
    weights = [Fraction(1), Fraction(1), Fraction(1)]
    one = make_plan(weights, seed=1).assign(np.arange(64))[0]
    again = make_plan(weights, seed=1).assign(np.arange(64))[0]
    assert np.array_equal(one, again)
    assert any(
        not np.array_equal(one, make_plan(weights, seed=s).assign(np.arange(64))[0])
        for s in range(2, 6)
    )


def test_assign_does_not_depend_on_how_positions_are_split() -> None:
    plan = make_plan([0.1, 0.25, 1, 2.5, 0.05], seed=3)
    whole = plan.assign(np.arange(1000))
    rng = np.random.default_rng(0)
    picks = rng.integers(0, 1000, size=300)
    parts = plan.assign(picks)
    assert np.array_equal(parts[0], whole[0][picks]) and np.array_equal(parts[1], whole[1][picks])


def test_golden_values() -> None:
    """Pins the construction: changing it changes every user's mix."""
    plan = MixPlan([Fraction(1), Fraction(2), Fraction(3)], [11, 22, 33], seed=0)
    source, visit = plan.assign(np.arange(12))
    assert source.tolist() == [2, 1, 2, 1, 2, 0, 2, 1, 2, 1, 2, 0]
    assert visit.tolist() == [0, 0, 1, 1, 2, 0, 3, 2, 4, 3, 5, 1]
    assert plan.bounds == (Fraction(4, 3), Fraction(5, 3), Fraction(1))
    assert plan.depths == (2, 2, 1)


def test_a_lone_source_is_every_position() -> None:
    plan = make_plan([0, 2.5, 0])
    source, visit = plan.assign(np.arange(10))
    assert source.tolist() == [1] * 10 and visit.tolist() == list(range(10))
    assert plan.bounds[1] == 0 and plan.natural_length([0, 7, 0]) == 7


def test_the_documented_bounds_two_sources_and_zero() -> None:
    """Two sources: both bounds exactly 1, every window's deviation below 1; a weight-0
    source and a lone source: bound 0 and deviation exactly 0 (at most, not less than)."""
    plan = make_plan([3, 0, 5])
    assert plan.bounds == (Fraction(1), Fraction(0), Fraction(1))
    source, _ = plan.assign(np.arange(400))
    for w in (1, 2, 3, 7, 50):
        for start in range(0, 400 - w, 9):
            window = source[start : start + w]
            for k in (0, 2):
                assert abs((window == k).sum() - w * plan.shares[k]) < 1
            assert (window == 1).sum() == 0 == w * plan.shares[1]


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="one > 0"):
        MixPlan([Fraction(0)], [1], 0)
    with pytest.raises(ValueError, match="distinct"):
        MixPlan([Fraction(1), Fraction(1)], [1, 1], 0)
    with pytest.raises(IndexError, match="positions"):
        make_plan([1, 1]).assign([-1])


# ---------------------------------------------------------------- visits


@pytest.mark.parametrize("n", [1, 2, 16, 17, 64, 65])
def test_visit_records_are_a_fresh_permutation_each_pass(n: int) -> None:
    out = visit_records(np.arange(3 * n), n, seed=12)
    passes = out.reshape(3, n)
    for k, row in enumerate(passes):
        assert sorted(row.tolist()) == list(range(n))
        assert np.array_equal(row, permute(np.arange(n), n, seed=12, epoch=k))
    if n >= 16:
        assert not np.array_equal(passes[0], passes[1])
    shuffled = np.random.default_rng(n).permutation(3 * n)
    assert np.array_equal(visit_records(shuffled, n, seed=12), out[shuffled])


def test_a_denominator_past_int64_at_the_first_positions() -> None:
    """Share (2**62 + 1) / 2**63: position 0's products fit int64 but the denominator does
    not; the integer path must not be taken (it overflowed)."""
    plan = MixPlan([Fraction(2**62 + 1), Fraction(2**62 - 1)], [1, 2], seed=1)
    node = plan.nodes[0]
    assert node.b == 2**63 and node.a + node.c < 2**63
    source, visit = plan.assign(np.zeros(3, np.int64))
    assert [(s, v) for s, v in zip(source.tolist(), visit.tolist())] == [
        reference_assign(plan, 0)
    ] * 3
