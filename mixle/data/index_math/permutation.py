"""Seeded index permutations of ``[0, n)`` in O(1) memory: a keyed Feistel network.

``permute(positions, n, seed=s, epoch=e)`` answers "which record comes at position ``p`` of
epoch ``e``?" for any positions, in any process, without building the permutation. The
bijection is an unbalanced Feistel network over the ``k``-bit integers, ``2**k >= n``, made
into a bijection of ``[0, n)`` by cycle-walking: a value that lands at or above ``n`` is
encrypted again until it falls inside. Round keys come from the counter-based hash of
``(seed, epoch)`` (:mod:`mixle.data.index_math.hashing`), so the order is the same on every NumPy
release and whatever the number of workers. Golden-value tests pin the algorithm; changing
it changes every user's shuffles.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import hash_int, mix_int, parse_seed
from mixle.utils.validation import parse_int

__all__ = [
    "FEISTEL_ROUNDS",
    "MAX_PERMUTATION_SIZE",
    "SMALL_DOMAIN_BITS",
    "SMALL_DOMAIN_ROUNDS",
    "inverse_permute",
    "permutation_key",
    "permute",
    "permute_in_passes",
]

#: Rounds of the Feistel network for domains above :data:`SMALL_DOMAIN_BITS` bits.
FEISTEL_ROUNDS = 8
#: Domains of at most this many bits get :data:`SMALL_DOMAIN_ROUNDS` rounds: tiny halves
#: need many rounds before every order is about equally likely, and cost nothing there.
SMALL_DOMAIN_BITS = 12
SMALL_DOMAIN_ROUNDS = 24
#: Largest ``n`` a permutation accepts (record indices are int64).
MAX_PERMUTATION_SIZE = 1 << 62
#: Hash stream that keeps permutation keys apart from placement and transform keys.
_PERMUTATION_STREAM = 0x5045524D  # "PERM"
#: Positions evaluated together: small enough that every pass stays in the CPU cache.
_BLOCK = 1 << 15
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S32 = np.uint64(32)


def permutation_key(seed: int, epoch: int) -> int:
    """The 64-bit key of the permutation of epoch ``epoch`` under ``seed``."""
    return hash_int(parse_seed(seed), _PERMUTATION_STREAM, parse_int(epoch, "epoch"))


def _parse_n(n: object) -> int:
    n = parse_int(n, "n")
    if not 1 <= n <= MAX_PERMUTATION_SIZE:
        raise ValueError(f"n={n} must be in [1, 2**62]: the number of indices to permute")
    return n


def _round_plan(n: int, key: int) -> tuple[int, list[tuple[int, int, np.uint64]]]:
    """Bits ``k`` and per-round ``(low bits in, high bits in, round key)`` for ``[0, 2**k)``.

    A value is split into a high part of ``a`` bits and a low part of ``b`` bits,
    ``a + b = k``. A round maps ``(hi, lo)`` to ``(lo, hi ^ F(lo))``: the low part moves up
    unchanged and the old high part, masked with a keyed hash of the low part, moves down.
    That is a bijection of ``[0, 2**k)`` whatever ``a`` and ``b``; the widths swap each round.
    A round with ``a == 0`` is the identity and is left out.
    """
    k = max(0, (n - 1).bit_length())
    a, b = k // 2, k - k // 2
    plan = []
    for r in range(SMALL_DOMAIN_ROUNDS if k <= SMALL_DOMAIN_BITS else FEISTEL_ROUNDS):
        if a:
            plan.append((b, a, np.uint64(mix_int(key, r))))
        a, b = b, a
    return k, plan


def _rounds(x: NDArray[np.uint64], plan: list[tuple[int, int, np.uint64]], inverse: bool) -> None:
    """Apply the network (or its inverse) to ``x`` in place, in three scratch buffers."""
    lo, f, t = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    for b, a, rk in reversed(plan) if inverse else plan:
        if inverse:  # y = (lo << a) | (hi ^ F(lo))  ->  x = (hi << b) | lo
            np.right_shift(x, np.uint64(a), out=lo)
            np.bitwise_and(x, np.uint64((1 << a) - 1), out=x)
        else:  # x = (hi << b) | lo  ->  y = (lo << a) | (hi ^ F(lo))
            np.bitwise_and(x, np.uint64((1 << b) - 1), out=lo)
            np.right_shift(x, np.uint64(b), out=x)
        # F(lo): the top ``a`` bits of a keyed multiply-xorshift-multiply hash of lo
        np.bitwise_xor(lo, rk, out=f)
        np.multiply(f, _M1, out=f)
        np.right_shift(f, _S32, out=t)
        np.bitwise_xor(f, t, out=f)
        np.multiply(f, _M2, out=f)
        np.right_shift(f, np.uint64(64 - a), out=f)
        np.bitwise_xor(x, f, out=x)  # the masked part, now with F(lo) removed or added
        if inverse:
            np.left_shift(x, np.uint64(b), out=x)
        else:
            np.left_shift(lo, np.uint64(a), out=lo)
        np.bitwise_or(x, lo, out=x)


def _walk_block(x: NDArray[np.uint64], n: int, k: int, plan: list, inverse: bool) -> None:
    _rounds(x, plan, inverse)
    if n < (1 << k):  # cycle-walk the values that left [0, n); each cycle returns inside
        todo = np.flatnonzero(x >= np.uint64(n))
        while todo.size:
            walked = x[todo]
            _rounds(walked, plan, inverse)
            x[todo] = walked
            todo = todo[walked >= np.uint64(n)]


def _walk(values: ArrayLike, n: int, key: int, *, inverse: bool) -> NDArray[np.int64]:
    idx = np.asarray(values)
    if idx.dtype == np.bool_ or (idx.size and idx.dtype.kind not in "iu"):
        raise TypeError(f"positions must be integers, got dtype {idx.dtype}")
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise IndexError(f"positions contains {bad}, outside [0, n) for n={n}")
    if n == 1:
        return np.zeros(idx.shape, dtype=np.int64)
    k, plan = _round_plan(n, key)
    x = idx.astype(np.uint64).reshape(-1)
    for start in range(0, x.size, _BLOCK):  # blocks that stay in cache through every pass
        _walk_block(x[start : start + _BLOCK], n, k, plan, inverse)
    return x.view(np.int64).reshape(idx.shape)


def permute(positions: ArrayLike, n: int, *, seed: int = 0, epoch: int = 0) -> NDArray[np.int64]:
    """The records at ``positions`` of the seeded permutation of ``[0, n)`` for ``epoch``.

    Parameters
    ----------
    positions
        Integers in ``[0, n)``, any shape.
    n
        Size of the permuted range, ``1 <= n <= 2**62``.
    seed, epoch
        Any ints (the seed is taken modulo 2**64); each ``(seed, epoch)`` gives its own order.

    Returns
    -------
    numpy.ndarray
        int64 of the shape of ``positions``: ``permute(arange(n), n)`` holds every index in
        ``[0, n)`` exactly once.

    Raises
    ------
    TypeError
        ``positions`` are not integers, or ``n``, ``seed`` or ``epoch`` is not an int.
    ValueError
        ``n`` is outside ``[1, 2**62]``.
    IndexError
        A position is outside ``[0, n)``.

    Notes
    -----
    O(1) memory beyond the output and a pure function of ``(seed, epoch, n, position)``:
    any slice of the order can be computed anywhere. Cycle-walking costs fewer than two
    network evaluations per position on average (``2**k < 2 n``).
    """
    n = _parse_n(n)
    return _walk(positions, n, permutation_key(seed, epoch), inverse=False)


def inverse_permute(
    records: ArrayLike, n: int, *, seed: int = 0, epoch: int = 0
) -> NDArray[np.int64]:
    """The positions at which ``records`` appear in :func:`permute`'s order.

    ``inverse_permute(permute(p, n, seed=s, epoch=e), n, seed=s, epoch=e) == p``. Parameters
    and errors are those of :func:`permute`.
    """
    n = _parse_n(n)
    return _walk(records, n, permutation_key(seed, epoch), inverse=True)


def permute_in_passes(
    indices: ArrayLike, total: int, seed: int, stream: int, epoch: int
) -> NDArray[np.int64]:
    """Indices ``[k*total, (k+1)*total)`` (pass ``k``) permuted within their pass.

    Pass ``k`` is :func:`permute` of ``range(total)`` keyed by the hash of ``(seed, stream,
    epoch, k)``: every value of ``range(total)`` once per pass, a new order each pass. The
    callers (placement without replacement, over one volume or many) check ``total``.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    passes, positions = np.divmod(idx, total)
    flat = np.empty(idx.size, dtype=np.int64)
    for k in np.unique(passes).tolist():
        sel = np.flatnonzero(passes == k)
        flat[sel] = permute(positions[sel], total, seed=hash_int(seed, stream, epoch, k))
    return flat
