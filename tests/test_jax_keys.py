"""Per-record JAX PRNG keys (``mixle.jax.record_keys``) and ``JaxLoader.last_indices``.

The ``test_*`` functions check the key bits with :func:`record_key_data` (NumPy only: no
JAX backend starts, so they run in the main pytest process). The ``case_*`` functions need
a live backend, which must stay out of the main process (see ``tests/test_jax.py``):
``test_backend_cases_pass_in_a_fresh_interpreter`` runs them in a child ``pytest`` that
collects ``case_*`` instead of ``test_*``.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import mixle  # noqa: E402
from mixle import Loader, PatchSampler  # noqa: E402
from mixle.data.index_math.hashing import hash_words  # noqa: E402
from mixle.jax import JaxLoader, record_key_data, record_keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300
_KEY_STREAM = 0x4A4B4559  # the documented stream of mixle.jax.keys ("JKEY")


def keys_by_record(loader: Loader, seed: int) -> dict[tuple[int, int], tuple[int, ...]]:
    """``{(epoch, record): key bits}`` over a Loader run, from each batch's last_indices."""
    seen: dict[tuple[int, int], tuple[int, ...]] = {}
    it = iter(loader)
    while True:
        epoch = loader.epoch  # the epoch of the batch next() returns
        try:
            batch = next(it)
        except StopIteration:
            return seen
        values = batch[0] if isinstance(batch, tuple) else batch  # (values, mask) with "pad"
        indices = loader.last_indices
        assert indices is not None
        np.testing.assert_array_equal(values, indices)  # the source holds its own indices
        for i, key in zip(indices.tolist(), record_key_data(seed, epoch, indices).tolist()):
            assert seen.setdefault((epoch, i), tuple(key)) == tuple(key)  # padding repeats


# -- the key bits (NumPy only) ---------------------------------------------------------
def test_golden_key_bits() -> None:
    """Pins the algorithm: changing it changes every user's augmentations."""
    got = record_key_data(0, 0, [0, 1, 2**31, 2**32, 2**63 - 1])
    assert got.dtype == np.uint32
    assert got.tolist() == [
        [4095144982, 3406951641],
        [3718964876, 426503034],
        [325694651, 4276433737],
        [4078997222, 2159051359],
        [2317136427, 1843022863],
    ]
    assert record_key_data(-7, 3, [5]).tolist() == [[2747963700, 3459831004]]
    assert record_key_data(2**70 + 1, 3, [5]).tolist() == [[1830911079, 508638538]]
    assert record_key_data(1, 2, [10, 2**40], impl="rbg").tolist() == [
        [2947260142, 3727049684, 460881908, 468477350],
        [3384031142, 460496822, 2644166906, 349263736],
    ]


def test_key_bits_are_the_halves_of_the_documented_hash() -> None:
    indices = np.array([0, 3, 2**33 + 5, 2**62], dtype=np.int64)
    for seed, epoch in [(0, 0), (11, 4), (-(2**40), 2**40)]:
        h = hash_words(seed, _KEY_STREAM, epoch, indices)
        want = np.stack([h >> np.uint64(32), h & np.uint64(0xFFFFFFFF)], axis=-1)
        np.testing.assert_array_equal(record_key_data(seed, epoch, indices), want)
        # longer keys start with the same two words
        np.testing.assert_array_equal(
            record_key_data(seed, epoch, indices, impl="rbg")[:, :2], want
        )


def test_keys_differ_across_seed_epoch_and_index_without_int32_truncation() -> None:
    base = np.arange(20_000, dtype=np.int64)
    # indices an int32 (or uint32) truncation would fold onto base
    indices = np.concatenate([base, base + 2**32, base + 2**31, 2**63 - 1 - base])
    rows = {
        (seed, epoch): record_key_data(seed, epoch, indices) for seed in (0, 1) for epoch in (0, 1)
    }
    packed = [data.view(np.uint64).ravel() for data in rows.values()]
    for one in packed:
        assert np.unique(one).size == indices.size  # no two records of an epoch share a key
    together = np.concatenate(packed)
    assert np.unique(together).size == together.size  # nor across seeds and epochs


def test_a_record_gets_its_key_whatever_batch_shard_or_row_it_lands_in() -> None:
    n, seed = 53, 5
    records = np.arange(n, dtype=np.int64)  # record i holds i
    one = keys_by_record(Loader(records, 7, shuffle=True, seed=seed, num_epochs=2), seed)
    sharded: dict[tuple[int, int], tuple[int, ...]] = {}
    for shard in range(3):
        loader = Loader(
            records,
            4,
            shuffle=True,
            seed=seed,
            num_epochs=2,
            num_shards=3,
            shard_index=shard,
            drop_last="pad",
            num_threads=2,
        )
        sharded.update(keys_by_record(loader, seed))
    assert len(one) == 2 * n
    assert sharded == one
    # the rows of a call are independent: any order, any shape, any subset
    indices = np.random.default_rng(0).permutation(n)
    flat = record_key_data(seed, 1, indices)
    np.testing.assert_array_equal(record_key_data(seed, 1, indices[::-1]), flat[::-1])
    np.testing.assert_array_equal(record_key_data(seed, 1, indices[10:11]), flat[10:11])
    np.testing.assert_array_equal(
        record_key_data(seed, 1, indices[:50].reshape(5, 10)), flat[:50].reshape(5, 10, 2)
    )


def test_key_bits_shapes_and_index_dtypes() -> None:
    assert record_key_data(0, 0, 7).shape == (2,)
    assert record_key_data(0, 0, np.zeros((2, 3), np.int64)).shape == (2, 3, 2)
    assert record_key_data(0, 0, np.zeros((4,), np.int64), impl="rbg").shape == (4, 4)
    assert record_key_data(0, 0, []).shape == (0, 2)
    assert record_key_data(0, 0, np.zeros(0, np.uint16)).shape == (0, 2)
    want = record_key_data(0, 0, np.array([3, 9], np.int64))
    for dtype in (np.int8, np.int32, np.uint32, np.uint64):
        np.testing.assert_array_equal(record_key_data(0, 0, np.array([3, 9], dtype)), want)
    np.testing.assert_array_equal(record_key_data(np.int64(0), np.uint8(0), [3, 9]), want)
    assert record_key_data(0, 0, [2**64 - 1]).shape == (1, 2)  # uint64 indices are whole


@pytest.mark.parametrize(
    ("seed", "epoch", "indices", "impl", "error", "match"),
    [
        (1.5, 0, [0], None, TypeError, r"seed=1\.5 must be an int"),
        (True, 0, [0], None, TypeError, r"seed=True must be an int, not a bool"),
        (0, 0.0, [0], None, TypeError, r"epoch=0\.0 must be an int"),
        (0, -1, [0], None, ValueError, r"epoch=-1 must be in \[0, 2\*\*63\)"),
        (0, 2**63, [0], None, ValueError, r"epoch=9223372036854775808 must be in"),
        (0, 0, [0.5], None, TypeError, r"indices must be an array of integer .* float64"),
        (0, 0, np.array([True]), None, TypeError, r"indices must be .* got dtype bool"),
        (0, 0, ["a"], None, TypeError, r"indices must be .* got dtype <U1"),
        (0, 0, [3, -1], None, ValueError, r"indices must be record indices >= 0, got -1"),
        (0, 0, [0], "nope", ValueError, r"impl='nope' is not a JAX PRNG implementation"),
        (0, 0, [0], ["rbg"], TypeError, r"impl=\['rbg'\] must be a JAX PRNG implementation"),
    ],
)
def test_bad_arguments_are_named(
    seed: Any, epoch: Any, indices: Any, impl: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        record_key_data(seed, epoch, indices, impl=impl)


# -- with a JAX backend, in a child interpreter ----------------------------------------
def test_backend_cases_pass_in_a_fresh_interpreter() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-o", "python_functions=case_*", __file__]
    env = {**os.environ, "MIXLE_TEST_JAX_CHILD": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert " passed" in done.stdout and "skipped" not in done.stdout, report


class Records:
    """Dict records that hold their index (``i`` int64, ``x`` float32), with ``get_batch``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.get_batch(np.array([i]))

    def get_batch(self, indices: Any) -> dict[str, Any]:
        idx = np.asarray(indices, dtype=np.int64)
        return {"i": idx.copy(), "x": np.stack([idx, -idx], axis=1).astype(np.float32)}


def augment(key: Any, x: Any) -> Any:
    """A record's augmentation: noise and a random flip, from its own key."""
    noise_key, flip_key = jax.random.split(key)
    x = x + 0.1 * jax.random.normal(noise_key, x.shape, x.dtype)
    return jax.numpy.where(jax.random.bernoulli(flip_key), x[::-1], x)


def received(loader: JaxLoader) -> Iterator[tuple[int, int, Any]]:
    """``(epoch, batch number, batch)`` of each batch the loop receives."""
    for batch in loader:
        epoch, after = loader.last_epoch, loader.state_dict()["batch"]
        assert epoch is not None
        yield epoch, (after or len(loader)) - 1, batch


def case_record_keys_wrap_the_key_bits_as_typed_keys() -> None:
    indices = np.array([[0, 1], [2**40, 2**63 - 1]], dtype=np.int64)
    assert not jax.config.jax_enable_x64
    keys = record_keys(3, 1, indices)
    assert keys.shape == (2, 2) and jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(keys) == jax.random.key_impl(jax.random.key(0, impl="threefry2x32"))
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(keys)), record_key_data(3, 1, indices)
    )
    with jax.enable_x64(True):  # the same keys with 64-bit types on
        np.testing.assert_array_equal(
            np.asarray(jax.random.key_data(record_keys(3, 1, indices))),
            record_key_data(3, 1, indices),
        )
    rbg = record_keys(3, 1, indices[0], impl="rbg")
    assert rbg.shape == (2,) and "rbg" in str(rbg.dtype)
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(rbg)), record_key_data(3, 1, indices[0], impl="rbg")
    )
    assert record_keys(0, 0, []).shape == (0,)
    with pytest.raises(TypeError, match="indices must be"):
        record_keys(0, 0, jax.numpy.zeros(2))


def case_jitted_vmapped_augmentation_is_the_same_per_record_whatever_the_batch() -> None:
    seed, n = 7, 30
    runs = []
    for batch_size, prefetch in [(4, 2), (6, 0), (4, 2)]:
        loader = JaxLoader(
            Records(n), batch_size, shuffle=True, seed=seed, num_epochs=2, prefetch=prefetch
        )
        step = jax.jit(jax.vmap(augment))
        out: dict[tuple[int, int], np.ndarray] = {}
        for epoch, _, batch in received(loader):
            indices = loader.last_indices
            assert indices is not None
            np.testing.assert_array_equal(np.asarray(batch["i"]), indices)
            augmented = np.asarray(step(record_keys(seed, epoch, indices), batch["x"]))
            out.update(((epoch, i), row) for i, row in zip(indices.tolist(), augmented))
        assert len(out) == 2 * n
        runs.append(out)
    assert runs[0].keys() == runs[1].keys() == runs[2].keys()
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key])  # another batch size
        np.testing.assert_array_equal(runs[0][key], runs[2][key])  # the same run again
    # the epochs draw apart; the augmentation did something
    assert not np.array_equal(runs[0][(0, 3)], runs[0][(1, 3)])
    assert not np.allclose(runs[0][(0, 3)], [3.0, -3.0])


def case_last_indices_are_the_received_batch_while_the_loader_reads_ahead() -> None:
    n, batch_size = 50, 4
    options = dict(shuffle=True, seed=2, num_epochs=2, drop_last="pad", num_threads=1)
    loader = JaxLoader(Records(n), batch_size, prefetch=3, **options)
    inner = loader.loader
    assert loader.last_indices is None and loader.last_epoch is None
    ahead = 0
    count = 0
    for epoch, t, batch in received(loader):
        want = inner.batch_indices(t, epoch)
        np.testing.assert_array_equal(loader.last_indices, want)
        np.testing.assert_array_equal(np.asarray(batch["i"]), want)
        assert batch["mask"].shape == (batch_size,)
        if count == 0:  # the prefetch thread reads on: give it time to (bounded, not timed)
            deadline = time.monotonic() + 60
            while np.array_equal(inner.last_indices, want) and time.monotonic() < deadline:
                time.sleep(0.01)
        # the Loader's own last_indices belong to a batch read ahead of the loop
        ahead += not np.array_equal(inner.last_indices, want)
        count += 1
    assert count == 2 * len(loader) and loader.last_epoch == 1
    assert ahead > 0
    np.testing.assert_array_equal(loader.last_indices, inner.batch_indices(len(loader) - 1, 1))
    # without prefetch they agree; after a resume they still follow the batches received
    plain = JaxLoader(Records(n), batch_size, prefetch=0, **options)
    for epoch, t, _ in received(plain):
        np.testing.assert_array_equal(plain.last_indices, plain.loader.last_indices)
        np.testing.assert_array_equal(plain.last_indices, plain.loader.batch_indices(t, epoch))
        if (epoch, t) == (0, 5):
            state = plain.state_dict()
            break
    again = JaxLoader(Records(n), batch_size, prefetch=2, **options)
    again.load_state_dict(state)
    first = next(iter(again))
    np.testing.assert_array_equal(np.asarray(first["i"]), again.last_indices)
    np.testing.assert_array_equal(again.last_indices, again.loader.batch_indices(6, 0))
    assert again.last_epoch == 0
    again.close()


def case_last_epoch_stays_the_batch_epoch_at_an_epoch_end() -> None:
    loader = JaxLoader(Records(8), 4, num_epochs=2, prefetch=1)
    seen = []
    for _ in loader:
        seen.append((loader.last_epoch, loader.epoch))
    assert seen == [(0, 0), (0, 1), (1, 1), (1, 2)]


def case_workers_give_the_same_jax_batches_and_keys(tmp_path: Path) -> None:
    volume = np.random.default_rng(1).standard_normal((20, 24, 16), dtype=np.float32)
    np.save(tmp_path / "v.npy", volume)
    sampler = PatchSampler(mixle.read_npy(tmp_path / "v.npy"), (4, 5, 6), 37, seed=3)
    seed = 9

    def run(**workers: Any) -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray]]:
        loader = JaxLoader(
            sampler, 8, shuffle=True, seed=seed, num_epochs=2, drop_last="pad", **workers
        )
        assert loader.loader.num_workers == workers.get("num_workers", 0)
        out = []
        for epoch, _, batch in received(loader):
            indices = loader.last_indices
            assert indices is not None
            keys = jax.random.key_data(record_keys(seed, epoch, indices))
            leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(batch)]
            out.append((leaves, np.asarray(keys), indices.copy()))
        loader.close()
        return out

    threads = run(num_threads=1)
    workers = run(num_workers=2, worker_start_method="spawn", num_threads=1)
    assert len(threads) == len(workers) == 2 * 5  # ceil(37 / 8) batches per epoch
    for (leaves, keys, indices), (w_leaves, w_keys, w_indices) in zip(threads, workers):
        assert len(leaves) == len(w_leaves) == 3  # patches, coords, mask
        for a, b in zip(leaves, w_leaves):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(indices, w_indices)
        np.testing.assert_array_equal(keys, w_keys)
    assert not multiprocessing.active_children()  # the workers are gone


TRACED_KEY_CALLS = {"count": 0}


def _traced_key_data(seed: Any, epoch: Any, indices: Any, impl: Any) -> Any:
    TRACED_KEY_CALLS["count"] += 1  # runs once per compile
    return record_key_data(seed, epoch, indices, impl=impl)


def case_key_bits_hashed_on_the_device_under_jit_equal_the_host_bits() -> None:
    indices = np.array([[0, 1, 7], [2**20, 2**31 - 1, 12345]], np.int64)
    for impl in (None, "rbg"):
        f = jax.jit(lambda s, e, i, impl=impl: _traced_key_data(s, e, i, impl))
        TRACED_KEY_CALLS["count"] = 0
        for seed, epoch in [(0, 0), (0, 1), (-7, 3), (2**31 - 1, 2**31 - 1)]:
            got = f(jax.numpy.int32(seed), jax.numpy.int32(epoch), jax.numpy.asarray(indices))
            words = 2 if impl is None else 4
            assert got.dtype == np.uint32 and got.shape == (*indices.shape, words)
            np.testing.assert_array_equal(
                np.asarray(got), record_key_data(seed, epoch, indices, impl=impl)
            )
        assert TRACED_KEY_CALLS["count"] == 1  # one compile for every seed and epoch
    # NumPy int64 indices stay whole beside a traced epoch, x64 off
    wide = np.array([5, 2**32 + 5, 2**63 - 1], np.int64)
    got = jax.jit(lambda e: record_key_data(2**70 + 1, e, wide, impl="rbg"))(jax.numpy.int32(3))
    np.testing.assert_array_equal(np.asarray(got), record_key_data(2**70 + 1, 3, wide, impl="rbg"))
    # typed keys from a jitted step, and unsigned 32-bit seeds taken whole
    keys = jax.jit(lambda s, e: record_keys(s, e, jax.numpy.arange(4)))(
        jax.numpy.uint32(2**32 - 1), jax.numpy.int32(2)
    )
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(keys)), record_key_data(2**32 - 1, 2, np.arange(4))
    )
    with jax.enable_x64(True):  # 64-bit traced seeds, epochs and indices
        f = jax.jit(lambda s, e, i: record_key_data(s, e, i))
        got = f(jax.numpy.uint64(2**64 - 7), jax.numpy.int64(2**40), jax.numpy.asarray(wide[1:]))
        np.testing.assert_array_equal(np.asarray(got), record_key_data(-7, 2**40, wide[1:]))
    assert not jax.config.jax_enable_x64


def case_concrete_device_inputs_are_checked_and_traced_ones_are_not() -> None:
    with pytest.raises(ValueError, match="indices must be record indices >= 0, got -1"):
        record_key_data(0, 0, jax.numpy.array([3, -1]))
    with pytest.raises(ValueError, match=r"epoch=-2 must be in \[0, 2\*\*63\)"):
        record_key_data(0, jax.numpy.int32(-2), [3])
    with pytest.raises(TypeError, match="seed must be an int or a JAX integer scalar"):
        record_key_data(jax.numpy.float32(1), 0, [3])
    with pytest.raises(ValueError, match="epoch must be a scalar"):
        record_key_data(0, jax.numpy.arange(2), [3])
    with pytest.raises(ValueError, match=r"epoch=-1 must be in"):  # host ints beside arrays
        record_key_data(0, -1, jax.numpy.arange(2))
    # traced values cannot be checked: a negative index hashes as its two's complement
    got = jax.jit(lambda i: record_key_data(0, 0, i))(jax.numpy.array([-1], jax.numpy.int32))
    np.testing.assert_array_equal(np.asarray(got), record_key_data(0, 0, [2**64 - 1]))
