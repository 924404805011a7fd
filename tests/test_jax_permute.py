"""The Feistel permutation and its uint64 arithmetic in jax.numpy (``mixle.jax.permute``).

Every ``case_*`` function needs a live JAX backend, which must stay out of the main pytest
process (see ``tests/test_jax.py``): ``test_cases_pass_in_a_fresh_interpreter`` runs them
in a child ``pytest`` that collects ``case_*`` instead of ``test_*``. Each distinct ``n``
bit width and shape of positions compiles the network once, so the sizes come from short
fixed lists and the positions have one shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _jax_child import assert_child_passes
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
jnp = jax.numpy

from mixle.data.index_math import permutation as host  # noqa: E402
from mixle.data.index_math.hashing import MASK64, mix_int, splitmix64_int  # noqa: E402
from mixle.jax import u64  # noqa: E402
from mixle.jax.convert import x64_enabled  # noqa: E402
from mixle.jax.feistel import inverse_permute, permute, permute_blocks  # noqa: E402
from mixle.loading.plan import permute_blocks as host_permute_blocks  # noqa: E402

TIMEOUT_S = 300
WIDTH = 32  # values per U64 golden example: one shape, one compile
SHIFTS = (0, 1, 13, 31, 32, 33, 45, 63)
# 24 rounds up to 12 bits, 8 above: both sides of the switch, powers of two and their
# neighbours (a popular shuffle duplicates a record at n = 2**k + 1)
EDGE_SIZES = (1, 2, 3, 5, 2**12 - 1, 2**12, 2**12 + 1, 2**13 + 1, 2**20 + 1)
FULL = 1 << 13  # positions per check: every position of sizes up to this (a bijection)
SEEDS = st.integers(-(2**70), 2**70)
EPOCHS = st.integers(-(2**63), 2**64)


def test_cases_pass_in_a_fresh_interpreter() -> None:
    assert_child_passes(__file__, functions="case_*", timeout=TIMEOUT_S)


def enable_x64() -> Any:
    """A context with 64-bit types on, whichever spelling this jax has."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as legacy

    return legacy()


def ints(x: u64.U64) -> list[int]:
    """Words back to Python ints."""
    hi, lo = np.asarray(x.hi).reshape(-1), np.asarray(x.lo).reshape(-1)
    return [(int(h) << 32) | int(v) for h, v in zip(hi.tolist(), lo.tolist())]


def positions_for(n: int) -> np.ndarray:
    """``FULL`` positions: every one of a small domain (then again), a spread of a large one.

    The first ``n`` are ``arange(n)`` where ``n <= FULL``; the ends are always in.
    """
    if n <= FULL:
        return np.arange(FULL, dtype=np.int64) % n
    spread = np.random.default_rng(n).integers(0, n, FULL - 2)
    return np.concatenate([[0, n - 1], spread]).astype(np.int64)


# -- uint64 arithmetic on uint32 words ---------------------------------------------------
@jax.jit
def _ops(a: u64.U64, b: u64.U64) -> dict[str, Any]:
    out = {
        "mul": u64.mul(a, b),
        "add": u64.add(a, b),
        "xor": u64.xor(a, b),
        "or": u64.or_(a, b),
        "and": u64.and_const(a, 0xF0F0_0000_FFFF_1234),
        "splitmix64": u64.splitmix64(a),
        "mix": u64.mix(a, b, 7, -1),
        "lt": u64.lt_const(a, 1 << 63),
        "ge": u64.ge_const(a, (1 << 40) + 5),
        "eq": u64.eq(a, b),
    }
    for s in SHIFTS:
        out[f"shl{s}"], out[f"shr{s}"] = u64.shl(a, s), u64.shr(a, s)
    return out


WORDS64 = st.one_of(
    st.integers(0, MASK64),
    st.sampled_from([0, 1, MASK64, 1 << 63, (1 << 32) - 1, 1 << 32, 0xFFFF, 0x10000]),
)


@settings(max_examples=40, deadline=None)
@given(
    a=st.lists(WORDS64, min_size=WIDTH, max_size=WIDTH),
    b=st.lists(WORDS64, min_size=WIDTH, max_size=WIDTH),
)
def case_u64_ops_equal_python_int_arithmetic_modulo_2_64(a: list[int], b: list[int]) -> None:
    b[0] = a[0]  # one equal pair
    got = _ops(u64.from_numpy(np.array(a, np.uint64)), u64.from_numpy(np.array(b, np.uint64)))
    assert ints(got["mul"]) == [(x * y) & MASK64 for x, y in zip(a, b)]
    assert ints(got["add"]) == [(x + y) & MASK64 for x, y in zip(a, b)]
    assert ints(got["xor"]) == [x ^ y for x, y in zip(a, b)]
    assert ints(got["or"]) == [x | y for x, y in zip(a, b)]
    assert ints(got["and"]) == [x & 0xF0F0_0000_FFFF_1234 for x in a]
    assert ints(got["splitmix64"]) == [splitmix64_int(x) for x in a]
    assert ints(got["mix"]) == [mix_int(x, y, 7, -1) for x, y in zip(a, b)]
    assert np.asarray(got["lt"]).tolist() == [x < 1 << 63 for x in a]
    assert np.asarray(got["ge"]).tolist() == [x >= (1 << 40) + 5 for x in a]
    assert np.asarray(got["eq"]).tolist() == [x == y for x, y in zip(a, b)]
    for s in SHIFTS:
        assert ints(got[f"shl{s}"]) == [(x << s) & MASK64 for x in a]
        assert ints(got[f"shr{s}"]) == [x >> s for x in a]


def case_u64_conversions_sign_extend_like_mask64() -> None:
    signed = np.array([0, 1, -1, -(2**31), 2**31 - 1, -12345], np.int32)
    want = [v & MASK64 for v in signed.tolist()]
    assert ints(u64.from_int(jnp.asarray(signed))) == want
    assert ints(jax.jit(u64.from_int)(jnp.asarray(signed))) == want
    assert ints(u64.from_int(jnp.asarray(signed.astype(np.int8)))) == [
        v & MASK64 for v in signed.astype(np.int8).tolist()
    ]
    assert ints(u64.from_int(jnp.asarray(np.array([2**32 - 1, 7], np.uint32)))) == [2**32 - 1, 7]
    assert ints(u64.from_numpy(np.array([-1, 2**62], np.int64))) == [MASK64, 2**62]
    assert ints(u64.const(-3)) == [MASK64 - 2] and ints(u64.const(2**64 + 9)) == [9]
    with enable_x64():
        wide = np.array([-1, 2**63 - 1, -(2**63), 2**40 + 3], np.int64)
        assert ints(jax.jit(u64.from_int)(jnp.asarray(wide))) == [v & MASK64 for v in wide.tolist()]
        back = jax.jit(lambda x: u64.to_int(x, np.int64))(u64.from_numpy(wide))
        assert back.dtype == np.int64 and np.asarray(back).tolist() == wide.tolist()
        top = np.array([MASK64, 2**63], np.uint64)
        assert ints(u64.from_int(jnp.asarray(top))) == top.tolist()
    with pytest.raises(ValueError, match="shift=64"):
        u64.shr(u64.const(1), 64)
    with pytest.raises(TypeError, match="integer array"):
        u64.from_int(jnp.zeros(2))


# -- permute and inverse_permute equal the NumPy ones ------------------------------------
@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from(EDGE_SIZES), seed=SEEDS, epoch=EPOCHS)
def case_permute_equals_numpy_at_edge_sizes(n: int, seed: int, epoch: int) -> None:
    pos = positions_for(n)
    got = permute(pos, n, seed=seed, epoch=epoch)
    assert got.dtype == np.int32 and got.shape == pos.shape
    want = host.permute(pos, n, seed=seed, epoch=epoch)
    np.testing.assert_array_equal(np.asarray(got), want)
    back = inverse_permute(want, n, seed=seed, epoch=epoch)
    np.testing.assert_array_equal(np.asarray(back), pos)
    np.testing.assert_array_equal(
        np.asarray(back), host.inverse_permute(want, n, seed=seed, epoch=epoch)
    )
    if n <= FULL:  # a bijection of [0, n)
        np.testing.assert_array_equal(np.sort(np.asarray(got)[:n]), np.arange(n))


@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 2**31), seed=SEEDS, epoch=st.integers(0, 2**40))
def case_permute_equals_numpy_at_random_sizes(n: int, seed: int, epoch: int) -> None:
    pos = np.random.default_rng(seed & 0xFFFF).integers(0, n, 64)
    want = host.permute(pos, n, seed=seed, epoch=epoch)
    np.testing.assert_array_equal(np.asarray(permute(pos, n, seed=seed, epoch=epoch)), want)


def case_the_largest_x32_size_and_shapes() -> None:
    n = 2**31
    pos = np.array([[0, 1], [2**30, n - 1]], np.int64)
    got = permute(pos, n, seed=5, epoch=2)
    assert got.dtype == np.int32 and got.shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(got), host.permute(pos, n, seed=5, epoch=2))
    assert permute(np.zeros((0, 3), np.int64), 10).shape == (0, 3)
    assert permute([], 10).shape == (0,)
    np.testing.assert_array_equal(np.asarray(permute(7, 10, seed=1)), host.permute(7, 10, seed=1))
    for dtype in (np.int8, np.uint16, np.int32, np.uint32, np.uint64):
        np.testing.assert_array_equal(
            np.asarray(permute(np.arange(10, dtype=dtype), 10, seed=3)),
            host.permute(np.arange(10), 10, seed=3),
        )


TRACES = {"count": 0}
N_JIT = 2**12 + 1


@jax.jit
def _jit_permute(pos: Any, seed: Any, epoch: Any) -> tuple[Any, Any]:
    TRACES["count"] += 1  # runs once per compile
    return permute(pos, N_JIT, seed=seed, epoch=epoch), inverse_permute(
        pos, N_JIT, seed=seed, epoch=epoch
    )


def case_jit_with_traced_seed_and_epoch_compiles_once_and_equals_numpy() -> None:
    pos = jnp.arange(N_JIT)
    TRACES["count"] = 0
    for seed, epoch in [(0, 0), (0, 1), (-5, 2), (2**31 - 1, 3), (-(2**31), 2**31 - 1), (9, -4)]:
        got, back = _jit_permute(pos, jnp.int32(seed), jnp.int32(epoch))
        np.testing.assert_array_equal(
            np.asarray(got), host.permute(np.arange(N_JIT), N_JIT, seed=seed, epoch=epoch)
        )
        np.testing.assert_array_equal(
            np.asarray(back),
            host.inverse_permute(np.arange(N_JIT), N_JIT, seed=seed, epoch=epoch),
        )
    assert TRACES["count"] == 1
    # unsigned seeds are whole 32-bit values, not sign-extended
    got, _ = _jit_permute(pos, jnp.uint32(2**32 - 3), jnp.uint32(7))
    np.testing.assert_array_equal(
        np.asarray(got), host.permute(np.arange(N_JIT), N_JIT, seed=2**32 - 3, epoch=7)
    )
    # a Python seed with a traced epoch, and a traced seed with a Python epoch
    mixed = jax.jit(lambda e: permute(pos, N_JIT, seed=2**64 + 11, epoch=e))(jnp.int32(3))
    np.testing.assert_array_equal(
        np.asarray(mixed), host.permute(np.arange(N_JIT), N_JIT, seed=11, epoch=3)
    )
    mixed = jax.jit(lambda s: permute(pos, N_JIT, seed=s, epoch=-2))(jnp.int32(-8))
    np.testing.assert_array_equal(
        np.asarray(mixed), host.permute(np.arange(N_JIT), N_JIT, seed=-8, epoch=-2)
    )


def case_vmap_and_scan_over_epochs_equal_numpy() -> None:
    n, seed = 1000, 77
    pos = np.arange(n)
    epochs = jnp.arange(4, dtype=jnp.int32)
    want = np.stack([host.permute(pos, n, seed=seed, epoch=e) for e in range(4)])
    by_epoch = jax.vmap(lambda e: permute(pos, n, seed=seed, epoch=e))(epochs)
    np.testing.assert_array_equal(np.asarray(by_epoch), want)
    seeds = jnp.array([seed, -1, 2**31 - 1, 0], jnp.int32)
    by_seed = jax.jit(jax.vmap(lambda s, e: permute(pos, n, seed=s, epoch=e)))(seeds, epochs)
    np.testing.assert_array_equal(
        np.asarray(by_seed),
        np.stack(
            [
                host.permute(pos, n, seed=s, epoch=e)
                for s, e in zip([seed, -1, 2**31 - 1, 0], range(4))
            ]
        ),
    )
    by_position = jax.vmap(lambda p: permute(p, n, seed=seed, epoch=1))(jnp.asarray(pos))
    np.testing.assert_array_equal(np.asarray(by_position), want[1])

    def step(carry: Any, epoch: Any) -> tuple[Any, Any]:
        return carry + 1, permute(pos[:10], n, seed=seed, epoch=epoch)

    count, scanned = jax.lax.scan(step, 0, epochs)
    assert int(count) == 4
    np.testing.assert_array_equal(np.asarray(scanned), want[:, :10])


def case_traced_positions_outside_the_range_still_end() -> None:
    n = 1000  # 2**10 > n: cycle-walking runs
    got = jax.jit(lambda p: permute(p, n, seed=1))(jnp.array([-1, n, n + 5, 2**31 - 1, 3]))
    assert got.shape == (5,) and got.dtype == np.int32  # values unspecified, but it ends
    assert int(got[-1]) == int(host.permute(3, n, seed=1))


# -- permute_blocks equals the loader's --------------------------------------------------
BLOCK_CASES = ((100, 10), (100, 7), (100, 1), (100, 99), (100, 100), (100, 250), (7, 3), (1, 4))


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(BLOCK_CASES), seed=SEEDS, epoch=st.integers(0, 2**40))
def case_permute_blocks_equals_the_loader(case: tuple[int, int], seed: int, epoch: int) -> None:
    n, block = case
    pos = np.arange(n, dtype=np.int64)
    want = host_permute_blocks(pos, n, block, seed=seed, epoch=epoch)
    got = permute_blocks(pos, n, block, seed=seed, epoch=epoch)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.sort(want), pos)


def case_permute_blocks_with_traced_seed_and_epoch() -> None:
    for n, block in [(1000, 7), (1000, 8), (2**31, 3)]:
        pos = np.array([0, 1, 2, 500, n - 3, n - 2, n - 1], np.int64)
        f = jax.jit(lambda p, s, e, n=n, block=block: permute_blocks(p, n, block, seed=s, epoch=e))
        for seed, epoch in [(3, 0), (-4, 9)]:
            got = f(jnp.asarray(pos, jnp.int32), jnp.int32(seed), jnp.int32(epoch))
            want = host_permute_blocks(pos, n, block, seed=seed, epoch=epoch)
            np.testing.assert_array_equal(np.asarray(got), want)


# -- 64-bit records with x64 on ----------------------------------------------------------
def case_x64_sizes_above_2_32_equal_numpy_and_leave_the_config_alone() -> None:
    assert not x64_enabled()
    with enable_x64():
        for n in (2**32 + 1, 2**62):
            pos = np.array([0, 1, 2**31, 2**32, n // 3, n - 1], np.int64)
            for seed, epoch in [(0, 0), (2**63 + 9, 4), (-(2**40), 2**33)]:
                got = permute(pos, n, seed=seed, epoch=epoch)
                assert got.dtype == np.int64
                want = host.permute(pos, n, seed=seed, epoch=epoch)
                np.testing.assert_array_equal(np.asarray(got), want)
                np.testing.assert_array_equal(
                    np.asarray(inverse_permute(want, n, seed=seed, epoch=epoch)), pos
                )
        n = 2**40 + 3
        pos = np.array([5, 2**39, n - 1], np.int64)
        f = jax.jit(lambda p, s, e: permute(p, n, seed=s, epoch=e))
        for seed, epoch in [(2**63 + 9, 2**35), (2**64 - 1, 0)]:
            got = f(jnp.asarray(pos), jnp.uint64(seed), jnp.int64(epoch))
            np.testing.assert_array_equal(
                np.asarray(got), host.permute(pos, n, seed=seed, epoch=epoch)
            )
        blocks = permute_blocks(pos, n, 1000, seed=3, epoch=1)
        assert blocks.dtype == np.int64
        np.testing.assert_array_equal(
            np.asarray(blocks), host_permute_blocks(pos, n, 1000, seed=3, epoch=1)
        )
    assert not x64_enabled() and not jax.config.jax_enable_x64
    assert permute(np.arange(3), 3).dtype == np.int32


# -- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: permute([0], 0), ValueError, r"n=0 must be in \[1, 2\*\*62\]"),
        (lambda: permute([0], 2**62 + 1), ValueError, r"must be in \[1, 2\*\*62\]"),
        (lambda: permute([0], 1.5), TypeError, r"n=1\.5 must be an int"),
        (lambda: permute([0], 2**31 + 1), ValueError, r"n=2147483649 .*jax\.enable_x64"),
        (lambda: inverse_permute([0], 2**40), ValueError, r"jax_enable_x64 off"),
        (lambda: permute([0.5], 4), TypeError, r"positions must be integers, got dtype float64"),
        (lambda: permute([True], 4), TypeError, r"positions must be integers, got dtype bool"),
        (lambda: permute(jnp.zeros(2), 4), TypeError, r"positions must be integers"),
        (lambda: permute([0, 4], 4), IndexError, r"positions contains 4, outside \[0, n\)"),
        (lambda: permute([-1, 2], 4), IndexError, r"positions contains -1"),
        (lambda: permute(jnp.array([0, 9]), 4), IndexError, r"positions contains 9"),
        (lambda: inverse_permute([5], 4), IndexError, r"records contains 5"),
        (lambda: permute([0], 4, seed=1.5), TypeError, r"seed=1\.5 must be an int"),
        (lambda: permute([0], 4, epoch=True), TypeError, r"epoch=True must be an int"),
        (lambda: permute([0], 4, seed=jnp.float32(1)), TypeError, r"seed must be an int or"),
        (lambda: permute([0], 4, epoch=jnp.arange(2)), ValueError, r"epoch must be a scalar"),
        (lambda: permute_blocks([0], 4, 0, seed=0, epoch=0), ValueError, r"block=0 must be"),
        (lambda: permute_blocks([7], 4, 2, seed=0, epoch=0), IndexError, r"contains 7"),
    ],
)
def case_bad_arguments_are_named(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
