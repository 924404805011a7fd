"""The seeded Feistel permutation in jax.numpy: traceable, and bit-exact with the NumPy one.

:func:`permute`, :func:`inverse_permute` and :func:`permute_blocks` give exactly the
records of :func:`mixle.data.index_math.permutation.permute`,
:func:`~mixle.data.index_math.permutation.inverse_permute` and
:func:`mixle.loading.plan.permute_blocks`, but as JAX computations: they run under
``jax.jit``, ``jax.vmap`` and ``lax.scan``, and ``seed`` and ``epoch`` may be traced
scalars, so an epoch loop compiles once. The uint64 arithmetic runs on uint32 word pairs
(:mod:`mixle.jax.u64`), so nothing needs ``jax_enable_x64`` (which mixle never changes).

With x64 off the records are int32 and ``n`` is at most ``2**31``; inside a
``jax.enable_x64(True)`` block (or with x64 on globally) they are int64 and ``n`` goes up
to ``2**62``, as for the NumPy version.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from mixle.data.index_math.permutation import (
    _PERMUTATION_STREAM,
    FEISTEL_ROUNDS,
    SMALL_DOMAIN_BITS,
    SMALL_DOMAIN_ROUNDS,
    _parse_n,
    permutation_key,
)
from mixle.jax import u64
from mixle.jax.convert import x64_enabled
from mixle.jax.u64 import U64
from mixle.utils.validation import parse_int

jax = u64.jax
jnp = jax.numpy

__all__ = ["MAX_X32_PERMUTATION_SIZE", "inverse_permute", "permute", "permute_blocks"]

#: Largest ``n`` while ``jax_enable_x64`` is off: the records are int32.
MAX_X32_PERMUTATION_SIZE = 1 << 31
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _is_traced(value: Any) -> bool:
    return isinstance(value, jax.core.Tracer)


def _parse_word(value: Any, name: str) -> int | Any:
    """A Python int, or a JAX integer scalar kept as is (traced or not)."""
    if isinstance(value, jax.Array):
        dtype = np.dtype(value.dtype)
        if dtype.kind not in "iu":
            raise TypeError(f"{name} must be an int or a JAX integer scalar, got dtype {dtype}")
        if value.shape != ():
            raise ValueError(f"{name} must be a scalar, got shape {value.shape}")
        return value
    return parse_int(value, name)


def _key(seed: Any, epoch: Any) -> U64:
    """The permutation key of ``(seed, epoch)``: on the host for ints, else on the device."""
    seed, epoch = _parse_word(seed, "seed"), _parse_word(epoch, "epoch")
    if isinstance(seed, int) and isinstance(epoch, int):
        return u64.const(permutation_key(seed, epoch))
    s = u64.const(seed) if isinstance(seed, int) else u64.from_int(seed)
    e = u64.const(epoch) if isinstance(epoch, int) else u64.from_int(epoch)
    return u64.mix(u64.splitmix64(s), _PERMUTATION_STREAM, e)


def _round_keys(key: U64, rounds: int) -> U64:
    """``mix(key, r)`` for each round ``r``, as ``(rounds,)`` words."""
    r = U64(jnp.zeros(rounds, jnp.uint32), jnp.arange(rounds, dtype=jnp.uint32))
    k = U64(jnp.broadcast_to(key.hi, (rounds,)), jnp.broadcast_to(key.lo, (rounds,)))
    return u64.mix(k, r)


def _feistel(x: U64, b: int, a: int, rk: U64, inverse: bool) -> U64:
    """One round (or its inverse): ``(hi, lo) -> (lo, hi ^ F(lo))``, as ``_rounds`` does."""
    if inverse:  # y = (lo << a) | (hi ^ F(lo))  ->  x = (hi << b) | lo
        lo, rest = u64.shr(x, a), u64.and_const(x, (1 << a) - 1)
    else:  # x = (hi << b) | lo  ->  y = (lo << a) | (hi ^ F(lo))
        lo, rest = u64.and_const(x, (1 << b) - 1), u64.shr(x, b)
    f = u64.mul(u64.xor(lo, rk), u64.const(_MIX1))
    f = u64.mul(u64.xor(f, u64.shr(f, 32)), u64.const(_MIX2))
    rest = u64.xor(rest, u64.shr(f, 64 - a))
    return u64.or_(u64.shl(rest, b), lo) if inverse else u64.or_(u64.shl(lo, a), rest)


def _network(x: U64, k: int, keys: U64, inverse: bool) -> U64:
    """Every round over ``[0, 2**k)``, a loop over pairs of rounds (widths swap each round).

    Round ``2i`` splits ``k`` bits into ``a = k // 2`` high and ``b = k - a`` low bits,
    round ``2i + 1`` the other way round; a round with no high bits is the identity.
    """
    a, b = k // 2, k - k // 2
    pairs = keys.lo.shape[0] // 2

    def pair(i: Any, y: U64) -> U64:
        j = pairs - 1 - i if inverse else i
        even = U64(keys.hi[2 * j], keys.lo[2 * j])
        odd = U64(keys.hi[2 * j + 1], keys.lo[2 * j + 1])
        if inverse:
            y = _feistel(y, a, b, odd, True)
            return _feistel(y, b, a, even, True) if a else y
        y = _feistel(y, b, a, even, False) if a else y
        return _feistel(y, a, b, odd, False)

    return jax.lax.fori_loop(0, pairs, pair, x)


def _walk(x: U64, key: U64, *, n: int, inverse: bool, dtype: Any) -> Any:
    """The network on ``x``, cycle-walking values at or above ``n``; records as ``dtype``."""
    return _walk_bits(x, key, u64.const(n), bits=(n - 1).bit_length(), inverse=inverse, dtype=dtype)


@partial(jax.jit, static_argnames=("bits", "inverse", "dtype"))
def _walk_bits(x: U64, key: U64, n: U64, *, bits: int, inverse: bool, dtype: Any) -> Any:
    """:func:`_walk` for any ``n`` in ``(2**(bits-1), 2**bits]``: one compile for them all."""
    if bits == 0:  # n == 1
        return jnp.zeros(jnp.shape(x.lo), dtype)
    keys = _round_keys(key, SMALL_DOMAIN_ROUNDS if bits <= SMALL_DOMAIN_BITS else FEISTEL_ROUNDS)
    x = u64.and_const(x, (1 << bits) - 1)  # out-of-range traced positions still end the loop

    # one network pass for every value, then again for those at or above n: each value's
    # cycle comes back into [0, n), so the loop ends (after one pass if n == 2**bits)
    def outside(state: tuple[U64, Any]) -> Any:
        return jnp.any(state[1])

    def again(state: tuple[U64, Any]) -> tuple[U64, Any]:
        y, redo = state
        z = _network(y, bits, keys, inverse)
        y = U64(jnp.where(redo, z.hi, y.hi), jnp.where(redo, z.lo, y.lo))
        return y, ~u64.lt(y, n)

    x, _ = jax.lax.while_loop(outside, again, (x, jnp.ones(jnp.shape(x.lo), bool)))
    return u64.to_int(x, dtype)


def _limits() -> tuple[int, Any]:
    if x64_enabled():
        return 1 << 62, np.dtype(np.int64)
    return MAX_X32_PERMUTATION_SIZE, np.dtype(np.int32)


def _parse_size(n: Any) -> tuple[int, Any]:
    """``n`` as the NumPy version checks it, then against int32 records while x64 is off."""
    n = _parse_n(n)
    limit, dtype = _limits()
    if n > limit:
        raise ValueError(
            f"n={n} needs int64 records: with jax_enable_x64 off, n must be at most 2**31; "
            "call inside a `with jax.enable_x64(True):` block (mixle never flips the flag)"
        )
    return n, dtype


def _parse_positions(positions: Any, n: int, name: str) -> U64:
    """Integer positions as words; concrete ones must lie in ``[0, n)`` (IndexError)."""
    if isinstance(positions, jax.Array):
        dtype = np.dtype(positions.dtype)
        if dtype.kind not in "iu" and not (positions.size == 0 and dtype.kind == "f"):
            raise TypeError(f"{name} must be integers, got dtype {dtype}")
        if dtype.kind == "f":
            positions = positions.astype(jnp.int32)
        if not _is_traced(positions):
            _check_range(np.asarray(positions), n, name)
        return u64.from_int(positions)
    idx = np.asarray(positions)
    if idx.dtype == np.bool_ or (idx.size and idx.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be integers, got dtype {idx.dtype}")
    if idx.dtype.kind not in "iu":
        idx = idx.astype(np.int64)
    _check_range(idx, n, name)
    return u64.from_numpy(idx)


def _check_range(idx: np.ndarray, n: int, name: str) -> None:
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{name} contains {bad}, outside [0, n) for n={n}")


def permute(positions: Any, n: int, *, seed: Any = 0, epoch: Any = 0) -> Any:
    """The records at ``positions`` of the seeded permutation of ``[0, n)`` for ``epoch``.

    The same records as :func:`mixle.data.index_math.permutation.permute`, as a JAX
    computation that runs under ``jax.jit``, ``jax.vmap`` and ``lax.scan``.

    Parameters
    ----------
    positions
        Integers in ``[0, n)``, any shape: a JAX array (traced or not) or anything NumPy
        takes.
    n
        Size of the permuted range, a static Python int: ``1 <= n <= 2**31`` while
        ``jax_enable_x64`` is off, ``1 <= n <= 2**62`` with it on.
    seed, epoch
        Python ints (the seed is taken modulo 2**64, negative epochs in two's complement as
        in the NumPy version) or JAX integer scalars, traced or not: a jitted function that
        takes the epoch as an argument compiles once for every epoch.

    Returns
    -------
    jax.Array
        Of the shape of ``positions``: int32 while x64 is off, int64 with it on.

    Raises
    ------
    TypeError
        ``positions`` are not integers, ``n`` is not an int, or ``seed``/``epoch`` is
        neither an int nor a JAX integer scalar.
    ValueError
        ``n`` outside ``[1, 2**62]``, or above ``2**31`` while x64 is off (use a
        ``jax.enable_x64(True)`` block); ``seed``/``epoch`` arrays that are not scalars.
    IndexError
        A concrete position outside ``[0, n)``.

    Notes
    -----
    Traced positions cannot be checked: positions outside ``[0, n)`` give unspecified
    values (but the call still ends). The round keys are hashed on the host when ``seed``
    and ``epoch`` are ints, on the device otherwise; both give the same bits. Concrete
    positions are checked on the host, which waits for them.
    """
    n, dtype = _parse_size(n)
    key = _key(seed, epoch)
    return _walk(_parse_positions(positions, n, "positions"), key, n=n, inverse=False, dtype=dtype)


def inverse_permute(records: Any, n: int, *, seed: Any = 0, epoch: Any = 0) -> Any:
    """The positions at which ``records`` appear in :func:`permute`'s order.

    ``inverse_permute(permute(p, n, seed=s, epoch=e), n, seed=s, epoch=e) == p``, and equal
    to :func:`mixle.data.index_math.permutation.inverse_permute`. Parameters, errors and
    notes are those of :func:`permute`.
    """
    n, dtype = _parse_size(n)
    key = _key(seed, epoch)
    return _walk(_parse_positions(records, n, "records"), key, n=n, inverse=True, dtype=dtype)


def permute_blocks(positions: Any, n: int, block: int, *, seed: Any, epoch: Any) -> Any:
    """The records at ``positions`` of epoch ``epoch``'s order of ``[0, n)`` in blocks.

    The same records as :func:`mixle.loading.plan.permute_blocks`: blocks of ``block``
    consecutive records come in :func:`permute`'s order of their count, the short last block
    (when ``block`` does not divide ``n``) moving like the others; ``block == 1`` is
    :func:`permute`, ``block >= n`` the identity.

    Parameters
    ----------
    positions, n, seed, epoch
        As for :func:`permute`.
    block
        Records per block, a static Python int ``>= 1``.

    Returns
    -------
    jax.Array
        Of the shape of ``positions``: int32 while x64 is off, int64 with it on.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for :func:`permute`; ``ValueError`` also for ``block < 1``.
    """
    n, dtype = _parse_size(n)
    block = parse_int(block, "block")
    if block < 1:
        raise ValueError(f"block={block} must be >= 1: records per block")
    key = _key(seed, epoch)
    x = _parse_positions(positions, n, "positions")
    return _blocks(x, key, n=n, block=block, dtype=dtype)


@partial(jax.jit, static_argnames=("n", "block", "dtype"))
def _blocks(x: U64, key: U64, *, n: int, block: int, dtype: Any) -> Any:
    if block == 1:
        return _walk(x, key, n=n, inverse=False, dtype=dtype)
    if block >= n:
        return u64.to_int(x, dtype)
    # unsigned work type: (full + 1) * block < n + block <= 2**32 while x64 is off
    work = np.dtype(np.uint64 if dtype.itemsize == 8 else np.uint32)
    p = u64.to_int(x, work)
    full, tail = divmod(n, block)
    if not tail:
        slots = u64.from_int(p // block)
        return (_walk(slots, key, n=full, inverse=False, dtype=work) * block + p % block).astype(
            dtype
        )
    last = u64.const(full)
    start = _walk(last, key, n=full + 1, inverse=True, dtype=work) * block
    end = start + tail
    short = (p >= start) & (p < end)
    gapless = jnp.where(p >= end, p + (block - tail), p)
    slots = u64.from_int(gapless // block)
    records = _walk(slots, key, n=full + 1, inverse=False, dtype=work) * block + gapless % block
    return jnp.where(short, full * block + (p - start), records).astype(dtype)
