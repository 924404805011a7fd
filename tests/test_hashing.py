"""Counter-based hashing: golden values, a pure-Python reference, range and uniformity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math.hashing import MASK64, hash_words, parse_seed, splitmix64, uniform_below

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

uint64s = st.integers(min_value=0, max_value=MASK64)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
any_seed = st.integers(min_value=-(2**70), max_value=2**70)


# -- pure-Python references (Python ints, reduced mod 2**64 by hand) ----------------------
def _splitmix64_ref(x: int) -> int:
    z = (x + _GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & MASK64
    return z ^ (z >> 31)


def _hash_words_ref(seed: int, *words: int) -> int:
    h = _splitmix64_ref(seed & MASK64)
    for w in words:
        h = _splitmix64_ref(h ^ (w & MASK64))
    return h


def _uniform_below_ref(n: int, seed: int, *words: int) -> int:
    limit = (1 << 64) - ((1 << 64) % n)
    attempt = 0
    while True:
        h = _hash_words_ref(seed, *words, attempt)
        if h < limit:
            return h % n
        attempt += 1


def _chi_square(values: np.ndarray, k: int) -> float:
    observed = np.bincount(values.reshape(-1), minlength=k).astype(np.float64)
    assert observed.size == k
    expected = values.size / k
    return float(((observed - expected) ** 2 / expected).sum())


def _chi_square_bound(k: int) -> float:
    """Mean of chi-square with k - 1 degrees of freedom plus 6 standard deviations."""
    return (k - 1) + 6 * math.sqrt(2 * (k - 1))


# -- golden values: changing any of these changes every user's sampled patches ------------
def test_splitmix64_golden() -> None:
    x = np.array([0, 1, 2, 0x9E3779B97F4A7C15, 2**63, MASK64, 0x123456789ABCDEF0], dtype=np.uint64)
    assert splitmix64(x).tolist() == [
        16294208416658607535,
        10451216379200822465,
        10905525725756348110,
        7960286522194355700,
        5196802822362493915,
        16490336266968443936,
        1592342178222199016,
    ]
    assert splitmix64(x).dtype == np.uint64


def test_hash_words_golden() -> None:
    assert hash_words(0).tolist() == [16294208416658607535]
    assert hash_words(1).tolist() == [10451216379200822465]
    assert hash_words(-1).tolist() == [16490336266968443936]
    assert hash_words(2024, np.arange(4)).tolist() == [
        10408667759918069152,
        324017778577197285,
        2031779356768601065,
        12583285171555650004,
    ]
    got = hash_words(7, np.array([-3, 5]), 11, np.array([[0], [2**62]]))
    assert got.tolist() == [
        [4311561321756254609, 13737060575850521890],
        [13880580967555955928, 4333976556854481265],
    ]


def test_uniform_below_golden() -> None:
    assert uniform_below(10, 2024, np.arange(12)).tolist() == [
        4, 0, 6, 6, 0, 9, 6, 2, 4, 8, 2, 2,
    ]  # fmt: skip
    assert uniform_below(1_000_003, -5, 3, np.arange(6)).tolist() == [
        603855, 823631, 738426, 128975, 188899, 225846,
    ]  # fmt: skip
    assert uniform_below(3 * 2**61, 123, np.arange(6)).tolist() == [
        1828532159072386161,
        6302760795220041440,
        1909204357118889139,
        693507942352330389,
        6022798129726951088,
        2425951289025355693,
    ]


# -- the NumPy code equals the pure-Python reference ----------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(uint64s, min_size=1, max_size=20))
def test_splitmix64_matches_python_reference(values: list[int]) -> None:
    got = splitmix64(np.array(values, dtype=np.uint64))
    assert got.dtype == np.uint64
    assert got.tolist() == [_splitmix64_ref(v) for v in values]


@settings(max_examples=100, deadline=None)
@given(any_seed, st.lists(st.one_of(int64s, uint64s), max_size=4))
def test_hash_words_matches_python_reference(seed: int, words: list[int]) -> None:
    arrays = [np.array([w], dtype=np.int64 if w < 0 else np.uint64) for w in words]
    assert hash_words(seed, *arrays).tolist() == [_hash_words_ref(seed, *words)]


@settings(max_examples=50, deadline=None)
@given(any_seed, st.lists(int64s, min_size=1, max_size=10))
def test_hash_words_negative_int64_words_are_twos_complement(seed: int, words: list[int]) -> None:
    signed = np.array(words, dtype=np.int64)
    unsigned = signed.view(np.uint64)
    assert hash_words(seed, signed).tolist() == hash_words(seed, unsigned).tolist()
    assert hash_words(seed, signed).tolist() == [_hash_words_ref(seed, w) for w in words]


def test_hash_words_ignores_integer_dtype() -> None:
    expected = hash_words(3, np.array([5], dtype=np.uint64))
    for word in (5, np.int8(5), np.int32(5), np.uint16(5), np.array([5], dtype=np.int64)):
        assert hash_words(3, word).tolist() == expected.tolist()
    assert hash_words(3, np.int8(-1)).tolist() == hash_words(3, np.uint64(MASK64)).tolist()


def test_hash_words_seed_is_reduced_mod_2_64() -> None:
    assert hash_words(-1, 7).tolist() == hash_words(MASK64, 7).tolist()
    assert hash_words(2**64 + 5, 7).tolist() == hash_words(5, 7).tolist()


def test_hash_words_rejects_non_integer_words() -> None:
    with pytest.raises(TypeError, match="integers"):
        hash_words(0, np.array([1.5]))
    with pytest.raises(TypeError, match="integers"):
        hash_words(0, np.array([True]))


def test_hash_words_broadcasts() -> None:
    got = hash_words(1, np.arange(3)[:, None], np.arange(4)[None, :])
    assert got.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            assert int(got[i, j]) == _hash_words_ref(1, i, j)


# -- uniform_below: range, determinism, rejection -------------------------------------
_SMALL_NS = sorted(
    {1, 2, 3} | {n for k in range(1, 63) for n in (2**k - 1, 2**k, 2**k + 1)} | {2**63 - 1}
)


@pytest.mark.parametrize("n", _SMALL_NS)
def test_uniform_below_in_range(n: int) -> None:
    got = uniform_below(n, 99, np.arange(256))
    assert got.dtype == np.int64
    assert got.shape == (256,)
    assert got.min() >= 0
    assert got.max() < n
    assert got.tolist() == uniform_below(n, 99, np.arange(256)).tolist()
    assert got[:5].tolist() == [_uniform_below_ref(n, 99, i) for i in range(5)]


def test_uniform_below_n_1_is_always_zero() -> None:
    assert uniform_below(1, 5, np.arange(100)).tolist() == [0] * 100


def test_uniform_below_rejection_path() -> None:
    """n = 3 * 2**61 accepts only h < 2 * n = 2**64 - 2**62, so a quarter of draws are redrawn."""
    n = 3 * 2**61
    limit = (1 << 64) - ((1 << 64) % n)
    idx = np.arange(2000)
    first = hash_words(11, idx, 0)
    rejected = int((first >= np.uint64(limit)).sum())
    assert 400 < rejected < 600  # rejection really happens here
    got = uniform_below(n, 11, idx)
    assert got.min() >= 0
    assert all(0 <= v < n for v in got.tolist())
    assert got.tolist() == uniform_below(n, 11, idx).tolist()
    assert got[:64].tolist() == [_uniform_below_ref(n, 11, i) for i in range(64)]
    # each element is a function of its own words: asking for a subset changes nothing
    subset = np.array([1999, 3, 3, 500, 0])
    assert uniform_below(n, 11, subset).tolist() == got[subset].tolist()
    for i in (0, 7, 1234):
        assert uniform_below(n, 11, i).tolist() == [got[i]]


def test_uniform_below_accepts_numpy_integer_n() -> None:
    assert (
        uniform_below(np.int64(7), 0, np.arange(9)).tolist()
        == uniform_below(7, 0, np.arange(9)).tolist()
    )


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=2**63),
    any_seed,
    st.lists(int64s, min_size=1, max_size=8),
)
def test_uniform_below_matches_reference(n: int, seed: int, words: list[int]) -> None:
    got = uniform_below(n, seed, np.array(words, dtype=np.int64), 4)
    assert got.tolist() == [_uniform_below_ref(n, seed, w, 4) for w in words]
    assert all(0 <= v < n for v in got.tolist())


def test_uniform_below_negative_words_are_deterministic() -> None:
    words = np.array([-1, -2, -(2**63), 5], dtype=np.int64)
    first = uniform_below(1000, 8, words)
    assert first.tolist() == uniform_below(1000, 8, words).tolist()
    assert first.tolist() == [_uniform_below_ref(1000, 8, int(w)) for w in words]
    assert uniform_below(1000, 8, -1).tolist() == [first[0]]
    assert uniform_below(1000, 8, words.view(np.uint64)).tolist() == first.tolist()


def test_uniform_below_shape() -> None:
    assert uniform_below(5, 0).shape == (1,)
    assert uniform_below(5, 0, 1, 2).shape == (1,)
    assert uniform_below(5, 0, np.arange(6).reshape(2, 3)).shape == (2, 3)
    assert uniform_below(5, 0, np.arange(3)[:, None], np.arange(4)).shape == (3, 4)


@pytest.mark.parametrize("n", [0, -1, 2**63 + 1, 2**64 - 1, 2**64, 2**65])
def test_uniform_below_rejects_bad_n(n: int) -> None:
    with pytest.raises(ValueError, match="n="):
        uniform_below(n, 0, np.arange(3))


# -- uniformity --------------------------------------------------------------------------
@pytest.mark.parametrize("n", [7, 10, 64])
@pytest.mark.parametrize("seed", [0, -3, 2**63 + 7])
def test_uniform_below_chi_square(n: int, seed: int) -> None:
    draws = uniform_below(n, seed, 17, np.arange(40_000))
    assert _chi_square(draws, n) < _chi_square_bound(n)


def test_uniform_below_chi_square_over_second_word() -> None:
    # varying a later word (not the first) must also spread values evenly
    draws = uniform_below(10, 5, np.arange(200)[:, None], np.arange(200)[None, :])
    assert _chi_square(draws, 10) < _chi_square_bound(10)


# -- parse_seed --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "seed",
    [0, 1, -1, 2**63, 2**80, -(2**80), np.int8(-3), np.int64(7), np.uint64(MASK64), np.uint8(4)],
)
def test_parse_seed_accepts_ints(seed: object) -> None:
    got = parse_seed(seed)
    assert type(got) is int
    assert got == int(seed)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "seed", [True, False, np.True_, 1.0, 1.5, np.float64(2.0), "1", None, [1], 1 + 0j]
)
def test_parse_seed_rejects_non_ints(seed: object) -> None:
    with pytest.raises(TypeError, match="seed="):
        parse_seed(seed)


def test_parse_seed_names_the_argument() -> None:
    with pytest.raises(TypeError, match="base_seed="):
        parse_seed(1.5, name="base_seed")
    with pytest.raises(TypeError, match="base_seed="):
        parse_seed(True, name="base_seed")
