"""Counter-based hashing: random-looking uint64 values as pure functions of integers.

Everything random in mixle is ``hash_words(seed, stream, ...)`` — splitmix64 finalisation
folded over the words in NumPy uint64 arithmetic. There is no generator state: any value
can be computed for any index in any process, in O(1) memory, and the results do not
depend on the NumPy release or on how work is split between workers. Golden-value tests
pin the algorithm; changing it changes every user's sampled patches.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.utils.validation import parse_int

__all__ = [
    "MASK64",
    "below",
    "below_each",
    "below_int",
    "hash_int",
    "hash_words",
    "mix",
    "mix_int",
    "parse_seed",
    "splitmix64",
    "splitmix64_int",
    "uniform01",
    "uniform_below",
]

MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_TWO53 = 2.0**-53


def splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The splitmix64 output function applied elementwise (wrapping uint64 arithmetic)."""
    z = np.add(x, _GOLDEN_GAMMA, dtype=np.uint64)
    z = np.multiply(z ^ (z >> _S30), _MIX1, dtype=np.uint64)
    z = np.multiply(z ^ (z >> _S27), _MIX2, dtype=np.uint64)
    return z ^ (z >> _S31)


def _as_words(value: ArrayLike) -> NDArray[np.uint64]:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"hash words must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        return arr.astype(np.int64).view(np.uint64)  # two's complement, like & MASK64
    return arr.astype(np.uint64)


def splitmix64_int(x: int) -> int:
    """:func:`splitmix64` on one Python int; identical results, no array overhead."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix(state: ArrayLike, *words: ArrayLike) -> NDArray[np.uint64]:
    """Fold integer ``words`` into hash ``state``: ``state = splitmix64(state ^ w)`` each."""
    h = _as_words(state)
    for w in words:
        h = splitmix64(h ^ _as_words(w))
    return np.atleast_1d(h)


def mix_int(state: int, *words: int) -> int:
    """:func:`mix` on Python ints (negative words taken modulo 2**64)."""
    for w in words:
        state = splitmix64_int(state ^ (w & MASK64))
    return state


def hash_words(seed: int, *words: ArrayLike) -> NDArray[np.uint64]:
    """Hash ``seed`` and integer ``words`` (broadcast together) to uint64 values.

    ``h = splitmix64(seed)``, then ``h = splitmix64(h ^ w)`` for each word in order. The
    result has the broadcast shape of the words, at least 1-D.
    """
    shape = np.broadcast_shapes(*(np.shape(w) for w in words)) if words else ()
    h = splitmix64(np.full(shape or (1,), seed & MASK64, dtype=np.uint64))
    return mix(h, *words)


def hash_int(seed: int, *words: int) -> int:
    """:func:`hash_words` for Python ints: the same value as ``hash_words(seed, *words)[0]``."""
    return mix_int(splitmix64_int(seed & MASK64), *words)


def _bound(n: int) -> tuple[int, int]:
    """``n`` as an int, and the rejection limit: draws at or above it would bias ``% n``."""
    n = operator.index(n)
    if not 1 <= n <= 1 << 63:
        raise ValueError(f"n={n} must be in [1, 2**63] (results are int64)")
    return n, (1 << 64) - ((1 << 64) % n)


def below(n: int, state: NDArray[np.uint64]) -> NDArray[np.int64]:
    """Exactly uniform integers in ``[0, n)``, one per hash ``state``.

    Draw ``mix(state, attempt)`` for ``attempt = 0, 1, ...`` until it falls below the
    largest multiple of ``n`` that fits in 64 bits, then reduce it modulo ``n``: every value
    is exactly equally likely (a redraw happens with probability below ``n / 2**64``).
    """
    n, limit = _bound(n)
    h = mix(state, 0)
    if limit < (1 << 64):
        flat = h.reshape(-1)
        bad = np.flatnonzero(flat >= np.uint64(limit))
        attempt = 1
        while bad.size:
            redo = mix(state.reshape(-1)[bad], attempt)
            flat[bad] = redo
            bad = bad[redo >= np.uint64(limit)]
            attempt += 1
    return (h % np.uint64(n)).astype(np.int64)


def below_each(n: ArrayLike, state: NDArray[np.uint64]) -> NDArray[np.int64]:
    """:func:`below` with its own bound per element: ``out[k]`` is uniform in ``[0, n[k])``.

    For equal bounds the values are exactly those of :func:`below`.
    """
    bound = np.asarray(n, dtype=np.int64)
    if bound.size and int(bound.min()) < 1:
        raise ValueError(f"n must be >= 1 everywhere, got {int(bound.min())}")
    ubound = np.broadcast_to(bound, np.shape(state)).astype(np.uint64).reshape(-1)
    rem = (np.uint64(0) - ubound) % ubound  # 2**64 % n, in wrapping uint64 arithmetic
    limit = np.uint64(0) - rem  # 2**64 - rem; unused where rem == 0 (every draw is fine)
    h = mix(state, 0).reshape(-1)
    bad = np.flatnonzero((rem != 0) & (h >= limit))
    attempt = 1
    flat_state = np.asarray(state).reshape(-1)
    while bad.size:
        redo = mix(flat_state[bad], attempt)
        h[bad] = redo
        bad = bad[redo >= limit[bad]]
        attempt += 1
    return (h % ubound).astype(np.int64).reshape(np.shape(state))


def below_int(n: int, state: int) -> int:
    """:func:`below` for one Python int state."""
    n, limit = _bound(n)
    attempt = 0
    while True:
        h = mix_int(state, attempt)
        if h < limit:
            return h % n
        attempt += 1


def uniform_below(n: int, seed: int, *words: ArrayLike) -> NDArray[np.int64]:
    """Exactly uniform integers in ``[0, n)``, one per broadcast element of ``words``.

    The same as ``below(n, hash_words(seed, *words))``: the hash of ``(seed, *words,
    attempt)`` reduced modulo ``n`` with rejection of the biased top range.
    """
    return below(n, hash_words(seed, *words))


def uniform01(state: NDArray[np.uint64]) -> NDArray[np.float64]:
    """Uniform floats in ``[0, 1)`` from the top 53 bits of hash ``state``."""
    return (state >> np.uint64(11)).astype(np.float64) * _TWO53


def parse_seed(seed: object, name: str = "seed") -> int:
    """Validate an integer seed (NumPy integers accepted, bools and floats refused)."""
    return parse_int(seed, name)
