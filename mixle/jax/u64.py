"""Wrapping uint64 arithmetic in JAX without ``jax_enable_x64``: pairs of uint32 words.

JAX keeps 32-bit types unless ``jax_enable_x64`` is on, and mixle never turns it on, yet
the counter-based hash (:mod:`mixle.data.index_math.hashing`) and the Feistel permutation
(:mod:`mixle.data.index_math.permutation`) are defined in uint64 arithmetic. Here a 64-bit
value is a :class:`U64` ``(hi, lo)`` of ``jnp.uint32`` arrays of one shape (a pytree, so it
passes through ``jax.jit``, ``jax.vmap`` and ``lax.scan``), ``value = hi * 2**32 + lo``:

- xor, and, or act on each word; shifts by a static amount move bits between the words;
- an add carries ``lo_a + lo_b < lo_a`` (a wrapped uint32 sum) into the high word;
- a multiply modulo 2**64 is ``lo_a * lo_b`` as a full 64-bit product plus
  ``(hi_a * lo_b + lo_a * hi_b) * 2**32`` (only its low word counts). The full product of
  two uint32 words is built from 16-bit halves, whose four partial products each fit in
  uint32 (XLA integer multiplies wrap modulo 2**32), with the carries summed explicitly.

Every function gives bit for bit what NumPy's uint64 arithmetic gives, whether or not x64
is on; golden tests compare them with Python ints modulo 2**64.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mixle.utils.optional_deps import require

jax = require("jax", feature="mixle.jax")
jnp = jax.numpy

__all__ = [
    "U64",
    "add",
    "and_const",
    "const",
    "eq",
    "from_int",
    "from_numpy",
    "ge_const",
    "lt",
    "lt_const",
    "mix",
    "mul",
    "mulhi32",
    "or_",
    "shl",
    "shr",
    "splitmix64",
    "to_int",
    "xor",
]

MASK64 = (1 << 64) - 1
_MASK32 = 0xFFFFFFFF
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


class U64(NamedTuple):
    """A uint64 array as its high and low uint32 words (``hi * 2**32 + lo``)."""

    hi: Any
    lo: Any


def _u32(value: int) -> Any:
    return jnp.asarray(np.uint32(value))


def const(value: int, shape: tuple[int, ...] = ()) -> U64:
    """The Python int ``value`` modulo 2**64 (negative ints in two's complement)."""
    value &= MASK64
    hi, lo = _u32(value >> 32), _u32(value & _MASK32)
    if shape:
        hi, lo = jnp.broadcast_to(hi, shape), jnp.broadcast_to(lo, shape)
    return U64(hi, lo)


def from_numpy(values: Any) -> U64:
    """A NumPy integer array as words, split on the host (int64 and uint64 stay whole)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"expected an integer array, got dtype {arr.dtype}")
    u = arr.astype(np.int64).view(np.uint64) if arr.dtype.kind == "i" else arr.astype(np.uint64)
    hi = (u >> np.uint64(32)).astype(np.uint32)
    lo = (u & np.uint64(_MASK32)).astype(np.uint32)
    return U64(jnp.asarray(hi), jnp.asarray(lo))


def from_int(x: Any) -> U64:
    """A JAX (or NumPy) integer array as words; signed values sign-extend (two's complement).

    This is ``w & MASK64`` of :func:`mixle.data.index_math.hashing.mix_int`: ``-1`` becomes
    ``2**64 - 1``. Works on tracers; int64/uint64 arrays need x64 on, as JAX itself does.
    """
    if isinstance(x, np.ndarray | np.integer):
        return from_numpy(x)
    x = jnp.asarray(x)
    dtype = np.dtype(x.dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"expected an integer array, got dtype {dtype}")
    if dtype.itemsize == 8:
        u = jax.lax.bitcast_convert_type(x, jnp.uint64) if dtype.kind == "i" else x
        return U64((u >> 32).astype(jnp.uint32), (u & _MASK32).astype(jnp.uint32))
    if dtype.kind == "u":
        return U64(jnp.zeros(x.shape, jnp.uint32), x.astype(jnp.uint32))
    s = x.astype(jnp.int32)
    lo = jax.lax.bitcast_convert_type(s, jnp.uint32)
    hi = jnp.where(s < 0, _u32(_MASK32), _u32(0))
    return U64(hi, lo)


def to_int(x: U64, dtype: Any) -> Any:
    """``x`` as a JAX array of integer ``dtype``: int32/uint32 take the low word only."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 8:
        u = (x.hi.astype(jnp.uint64) << 32) | x.lo.astype(jnp.uint64)
        return u.astype(dtype) if dtype.kind == "u" else jax.lax.bitcast_convert_type(u, dtype)
    if dtype == np.int32:
        return jax.lax.bitcast_convert_type(x.lo, jnp.int32)
    return x.lo.astype(dtype)


def xor(a: U64, b: U64) -> U64:
    """``a ^ b``."""
    return U64(a.hi ^ b.hi, a.lo ^ b.lo)


def or_(a: U64, b: U64) -> U64:
    """``a | b``."""
    return U64(a.hi | b.hi, a.lo | b.lo)


def and_const(a: U64, mask: int) -> U64:
    """``a & mask`` for a Python int ``mask`` (modulo 2**64)."""
    mask &= MASK64
    return U64(a.hi & _u32(mask >> 32), a.lo & _u32(mask & _MASK32))


def shr(a: U64, s: int) -> U64:
    """``a >> s`` (logical) for a static ``s`` in ``[0, 64)``."""
    _check_shift(s)
    if s == 0:
        return a
    if s >= 32:
        return U64(jnp.zeros_like(a.hi), a.hi >> (s - 32) if s > 32 else a.hi)
    return U64(a.hi >> s, (a.lo >> s) | (a.hi << (32 - s)))


def shl(a: U64, s: int) -> U64:
    """``(a << s) mod 2**64`` for a static ``s`` in ``[0, 64)``."""
    _check_shift(s)
    if s == 0:
        return a
    if s >= 32:
        return U64(a.lo << (s - 32) if s > 32 else a.lo, jnp.zeros_like(a.lo))
    return U64((a.hi << s) | (a.lo >> (32 - s)), a.lo << s)


def _check_shift(s: int) -> None:
    if not isinstance(s, int) or not 0 <= s < 64:
        raise ValueError(f"shift={s!r} must be a static int in [0, 64)")


def add(a: U64, b: U64) -> U64:
    """``(a + b) mod 2**64``."""
    lo = a.lo + b.lo
    carry = (lo < a.lo).astype(jnp.uint32)
    return U64(a.hi + b.hi + carry, lo)


def mulhi32(a: Any, b: Any) -> Any:
    """The high uint32 word of the full 64-bit product of uint32 arrays ``a`` and ``b``."""
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1  # each below 2**32
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)  # below 3 * 2**16
    return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)


def mul(a: U64, b: U64) -> U64:
    """``(a * b) mod 2**64``."""
    hi = mulhi32(a.lo, b.lo) + a.hi * b.lo + a.lo * b.hi
    return U64(hi, a.lo * b.lo)


def eq(a: U64, b: U64) -> Any:
    """``a == b`` elementwise (bool)."""
    return (a.hi == b.hi) & (a.lo == b.lo)


def lt(a: U64, b: U64) -> Any:
    """``a < b`` elementwise (bool)."""
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo < b.lo))


def lt_const(a: U64, c: int) -> Any:
    """``a < c`` for a static Python int ``c >= 0`` (bool array)."""
    if c <= 0:
        return jnp.zeros(jnp.shape(a.lo), bool)
    if c > MASK64:
        return jnp.ones(jnp.shape(a.lo), bool)
    chi, clo = _u32(c >> 32), _u32(c & _MASK32)
    return (a.hi < chi) | ((a.hi == chi) & (a.lo < clo))


def ge_const(a: U64, c: int) -> Any:
    """``a >= c`` for a static Python int ``c >= 0`` (bool array)."""
    return ~lt_const(a, c)


def _xorshr(z: U64, s: int) -> U64:
    return xor(z, shr(z, s))


def splitmix64(x: U64) -> U64:
    """The splitmix64 output function, as :func:`mixle.data.index_math.hashing.splitmix64`."""
    z = add(x, const(_GOLDEN_GAMMA))
    z = mul(_xorshr(z, 30), const(_MIX1))
    z = mul(_xorshr(z, 27), const(_MIX2))
    return _xorshr(z, 31)


def mix(state: U64, *words: U64 | int) -> U64:
    """Fold ``words`` into ``state``: ``state = splitmix64(state ^ w)`` for each, in order.

    Python int words are taken modulo 2**64, as :func:`~mixle.data.index_math.hashing.mix_int`
    does; the result has the broadcast shape of the state and the words.
    """
    for w in words:
        state = splitmix64(xor(state, const(w) if isinstance(w, int) else w))
    return state
