"""``Loader(shuffle_block=k)``: shuffles that move blocks of ``k`` consecutive records as units.

Through the public API (``Loader.record_indices``, iteration, ``state_dict``): every order is a
permutation of ``[0, n)``; the records of a block stay together and in order; the shards read
each record once; resume gives the rest of the run; ``k=1`` is the order of ``permute`` (the
order of every run before blocks existed); a source's ``shuffle_block`` is the default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mixle import Loader, LoaderStateError
from mixle.data.index_math.permutation import permute
from mixle.loading.plan import INDEX_WINDOW_ROWS
from mixle.utils.optional_deps import HAS_JAX

ROOT = Path(__file__).resolve().parents[1]
policies = st.sampled_from([False, True, "pad"])


class Rows:
    """Records ``{"i": i}`` read in batches: each batch says which records it read."""

    def __init__(self, n: int, shuffle_block: Any = None) -> None:
        self.n = n
        if shuffle_block is not None:
            self.shuffle_block = shuffle_block

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.int64]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"i": np.int64(i)}

    def get_batch(self, indices: Any) -> dict[str, np.ndarray]:
        return {"i": np.asarray(indices, dtype=np.int64).copy()}


def order(n: int, k: int | None, *, seed: int = 0, epoch: int = 0, source: Any = None) -> list[int]:
    """The records of ``epoch`` in the order one shuffled loader reads them."""
    loader = Loader(
        Rows(n) if source is None else source, 1, shuffle=True, seed=seed, shuffle_block=k
    )
    return loader.record_indices(epoch).tolist()


def blocks_of(n: int, k: int) -> list[list[int]]:
    """The blocks of ``[0, n)``: ``[b k, (b + 1) k)``, the last one short when ``k`` ∤ ``n``."""
    return [list(range(s, min(s + k, n))) for s in range(0, n, k)]


def split_into_blocks(got: list[int], k: int) -> list[list[int]]:
    """``got`` cut where a block starts (a record that is a multiple of ``k``)."""
    runs: list[list[int]] = []
    for r in got:
        if r % k == 0:
            runs.append([])
        runs[-1].append(r)
    return runs


# -- the order ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 300),
    k=st.integers(1, 320),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 1000),
)
@example(n=1, k=1, seed=0, epoch=0)
@example(n=1, k=5, seed=0, epoch=0)  # k > n
@example(n=64, k=8, seed=1, epoch=0)  # 2**j records, k divides n
@example(n=65, k=8, seed=1, epoch=0)  # 2**j + 1: a short block of one record
@example(n=65, k=64, seed=1, epoch=0)  # two blocks: one full, one of one record
@example(n=256, k=256, seed=2, epoch=3)  # k == n
@example(n=257, k=2, seed=2, epoch=3)
@example(n=10, k=11, seed=2, epoch=3)
def test_every_order_is_a_permutation_of_whole_blocks_each_in_its_own_order(
    n: int, k: int, seed: int, epoch: int
) -> None:
    got = order(n, k, seed=seed, epoch=epoch)
    assert sorted(got) == list(range(n))  # a permutation: each record once
    # cut where a block starts, the order is exactly the blocks, each whole and in order
    assert sorted(split_into_blocks(got, k)) == blocks_of(n, k)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 2000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 100))
@example(n=1, seed=0, epoch=0)
@example(n=1024, seed=0, epoch=0)
@example(n=1025, seed=0, epoch=0)
def test_block_of_one_is_the_order_of_permute_as_before(n: int, seed: int, epoch: int) -> None:
    want = permute(np.arange(n), n, seed=seed, epoch=epoch).tolist()
    assert order(n, 1, seed=seed, epoch=epoch) == want
    assert order(n, None, seed=seed, epoch=epoch) == want  # a source without shuffle_block


def test_golden_block_orders() -> None:
    # pins the algorithm: changing it changes every blocked run's order
    assert order(10, 3, seed=7, epoch=0) == [9, 3, 4, 5, 6, 7, 8, 0, 1, 2]
    assert order(10, 3, seed=7, epoch=1) == [3, 4, 5, 0, 1, 2, 9, 6, 7, 8]
    assert order(12, 4, seed=7, epoch=1) == [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(2, 40), seed=st.integers(0, 2**64 - 1))
@example(n=65, k=8, seed=0)
@example(n=64, k=8, seed=0)
def test_the_blocks_come_in_the_order_permute_gives_for_their_count(
    n: int, k: int, seed: int
) -> None:
    # the short block (when k does not divide n) is the last block, moved like the others
    blocks = blocks_of(n, k)
    slots = permute(np.arange(len(blocks)), len(blocks), seed=seed, epoch=2).tolist()
    assert order(n, k, seed=seed, epoch=2) == [r for b in slots for r in blocks[b]]


def test_blocks_and_the_short_block_move_from_epoch_to_epoch() -> None:
    n, k = 23, 4  # five full blocks and a short block of three
    firsts = {order(n, k, seed=5, epoch=e)[0] for e in range(40)}
    assert len(firsts) > 3  # the block read first varies
    short_at = {order(n, k, seed=5, epoch=e).index(20) for e in range(40)}
    assert len(short_at) > 3  # the short block is not pinned to one place (e.g. the end)


def test_drop_last_drops_different_blocks_and_reaches_the_short_block() -> None:
    # n % (batch_size) == 3 == the short block: were it always last, records 20..22 would
    # never be read; moving like the others, every record is read in some epoch
    loader = Loader(Rows(23), 5, shuffle=True, shuffle_block=4, drop_last=True, seed=1)
    seen: set[int] = set()
    for e in range(30):
        got = loader.record_indices(e).tolist()
        assert len(got) == 20 and len(set(got)) == 20
        seen.update(got)
    assert seen == set(range(23))


def test_without_shuffle_the_order_is_the_records_order() -> None:
    loader = Loader(Rows(17), 4, shuffle=False, shuffle_block=5, seed=9)
    assert loader.record_indices(0).tolist() == list(range(17))
    assert loader.record_indices(3).tolist() == list(range(17))


@pytest.mark.parametrize("num_threads", [0, 3])
def test_batches_read_are_the_blocked_order(num_threads: int) -> None:
    # the stream (read in windows of INDEX_WINDOW_ROWS rows) agrees with record_indices
    n, k = INDEX_WINDOW_ROWS * 2 + 37, 7
    loader = Loader(
        Rows(n), 100, shuffle=True, shuffle_block=k, seed=3, num_epochs=2, num_threads=num_threads
    )
    want = np.concatenate([loader.record_indices(0), loader.record_indices(1)])
    got = np.concatenate([batch["i"] for batch in loader])
    np.testing.assert_array_equal(got, want)
    assert sorted(split_into_blocks(got[:n].tolist(), k)) == blocks_of(n, k)
    assert not np.array_equal(want[:n], want[n:])  # each epoch its own order


# -- shards ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 200),
    k=st.integers(1, 30),
    batch_size=st.integers(1, 9),
    num_shards=st.integers(1, 5),
    layout=st.sampled_from(["interleaved", "blocked"]),
    drop_last=policies,
    epoch=st.integers(0, 50),
)
@example(n=64, k=8, batch_size=4, num_shards=4, layout="blocked", drop_last=False, epoch=0)
@example(n=65, k=8, batch_size=4, num_shards=4, layout="interleaved", drop_last="pad", epoch=1)
def test_across_shards_every_record_is_read_once_per_epoch(
    n: int, k: int, batch_size: int, num_shards: int, layout: str, drop_last: Any, epoch: int
) -> None:
    shards = [
        Loader(
            Rows(n),
            batch_size,
            shuffle=True,
            shuffle_block=k,
            seed=11,
            drop_last=drop_last,
            shard_index=s,
            num_shards=num_shards,
            shard_layout=layout,
        )
        for s in range(num_shards)
    ]
    read = np.concatenate([loader.record_indices(epoch) for loader in shards]).tolist()
    assert len(read) == len(set(read))  # nobody reads a record twice
    if drop_last is True:
        dropped = n % (batch_size * num_shards)
        assert len(read) == n - dropped
        # what is dropped is the end of the one-process blocked order
        whole = order(n, k, seed=11, epoch=epoch)
        assert set(read) == set(whole[: n - dropped])
    else:
        assert sorted(read) == list(range(n))


# -- resume ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 120),
    k=st.integers(1, 15),
    batch_size=st.integers(1, 8),
    drop_last=policies,
    stop_after=st.integers(0, 40),
)
def test_resume_mid_run_gives_the_same_remaining_batches(
    n: int, k: int, batch_size: int, drop_last: Any, stop_after: int
) -> None:
    def make() -> Loader:
        return Loader(
            Rows(n),
            batch_size,
            shuffle=True,
            shuffle_block=k,
            seed=4,
            num_epochs=2,
            drop_last=drop_last,
            num_threads=0,
        )

    whole = [batch["i"].tolist() for batch in make()]
    first = make()
    head = []
    for batch in first:
        head.append(batch["i"].tolist())
        if len(head) >= stop_after:
            break
    state = json.loads(json.dumps(first.state_dict()))
    assert state.get("shuffle_block", 1) == k
    again = make()
    again.load_state_dict(state)
    assert head + [batch["i"].tolist() for batch in again] == whole


def test_the_state_carries_shuffle_block_and_refuses_another() -> None:
    blocked = Loader(Rows(30), 4, shuffle=True, shuffle_block=5, seed=3, num_threads=0)
    plain = Loader(Rows(30), 4, shuffle=True, shuffle_block=1, seed=3, num_threads=0)
    state = blocked.state_dict()
    assert state["shuffle_block"] == 5
    keys = list(state)
    assert keys[keys.index("shuffle") + 1] == "shuffle_block"
    with pytest.raises(LoaderStateError) as info:
        plain.load_state_dict(state)
    message = str(info.value)
    assert "state shuffle_block=5 but this loader has shuffle_block=1" in message
    assert "another order" in message
    with pytest.raises(
        LoaderStateError, match="state shuffle_block=1 but this loader has shuffle_block=5"
    ):
        blocked.load_state_dict(plain.state_dict())
    blocked.load_state_dict(json.loads(json.dumps(state)))  # its own state loads


def test_a_state_without_shuffle_block_means_one() -> None:
    # what every state saved before shuffle_block existed looks like (no key)
    plain = Loader(Rows(30), 4, shuffle=True, seed=3, num_threads=0)
    state = plain.state_dict()
    assert "shuffle_block" not in state  # runs without blocks save what they saved before
    # (nor the global cursor keys, which came later)
    del state["global_position"], state["remainder"]
    state["version"] = 2
    old = {**state, "batch": 2, "position": 8}
    resumed = Loader(Rows(30), 4, shuffle=True, seed=3, num_threads=0, shuffle_block=1)
    resumed.load_state_dict(old)
    assert [b["i"].tolist() for b in resumed] == [b["i"].tolist() for b in plain][2:]
    explicit = Loader(Rows(30), 4, shuffle=True, seed=3, num_threads=0)
    explicit.load_state_dict({**old, "shuffle_block": 1})  # the key written out, 1, also loads


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "5", None, [5]])
def test_a_bad_shuffle_block_in_a_state_is_named(value: Any) -> None:
    loader = Loader(Rows(30), 4, shuffle=True, shuffle_block=5, seed=3, num_threads=0)
    state = {**loader.state_dict(), "shuffle_block": value}
    with pytest.raises(LoaderStateError) as info:
        loader.load_state_dict(state)
    message = str(info.value)
    assert f"state shuffle_block={value!r} ({type(value).__name__}) is not valid" in message
    assert "shuffle_block must be an int >= 1" in message


# -- the source's shuffle_block ----------------------------------------------------------


def test_a_source_shuffle_block_is_the_default() -> None:
    source = Rows(50, shuffle_block=6)
    loader = Loader(source, 5, shuffle=True, seed=2)
    assert loader.shuffle_block == 6
    got = loader.record_indices(0).tolist()
    assert got == order(50, 6, seed=2)
    assert sorted(split_into_blocks(got, 6)) == blocks_of(50, 6)
    assert got != order(50, 1, seed=2)
    assert loader.state_dict()["shuffle_block"] == 6
    assert "shuffle_block=6" in repr(loader)
    np_default = Loader(Rows(50, shuffle_block=np.int64(6)), 5, shuffle=True, seed=2)
    assert np_default.record_indices(0).tolist() == got


def test_an_explicit_shuffle_block_overrides_the_source() -> None:
    source = Rows(50, shuffle_block=6)
    assert Loader(source, 5, shuffle=True, seed=2, shuffle_block=1).record_indices(0).tolist() == (
        permute(np.arange(50), 50, seed=2, epoch=0).tolist()
    )
    assert order(50, 3, seed=2, source=source) == order(50, 3, seed=2)


def test_repr_shows_shuffle_block_only_when_it_is_not_one() -> None:
    assert "shuffle_block" not in repr(Loader(Rows(10), 2, shuffle=True))
    assert "shuffle_block" not in repr(Loader(Rows(10), 2, shuffle=True, shuffle_block=1))
    assert "shuffle=True, shuffle_block=4, seed=0" in repr(
        Loader(Rows(10), 2, shuffle=True, shuffle_block=4)
    )


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (0, ValueError, "shuffle_block=0 must be an int >= 1"),
        (-3, ValueError, "shuffle_block=-3 must be an int >= 1"),
        (True, TypeError, "shuffle_block=True must be an int >= 1"),
        (np.bool_(False), TypeError, f"shuffle_block={np.bool_(False)!r} must be an int >= 1"),
        (2.0, TypeError, "shuffle_block=2.0 (float) must be an int >= 1"),
        ("4", TypeError, "shuffle_block='4' (str) must be an int >= 1"),
    ],
)
def test_a_bad_shuffle_block_names_the_argument_and_value(
    value: Any, error: type[Exception], shown: str
) -> None:
    with pytest.raises(error) as info:
        Loader(Rows(10), 2, shuffle=True, shuffle_block=value)
    assert shown in str(info.value)
    assert "or None (the source's own)" in str(info.value)


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (0, ValueError, "the source's Rows.shuffle_block=0 must be an int >= 1"),
        (2.5, TypeError, "the source's Rows.shuffle_block=2.5 (float) must be an int >= 1"),
        ("4", TypeError, "the source's Rows.shuffle_block='4' (str) must be an int >= 1"),
        (True, TypeError, "the source's Rows.shuffle_block=True must be an int >= 1"),
    ],
)
def test_a_bad_source_shuffle_block_names_the_source_and_the_override(
    value: Any, error: type[Exception], shown: str
) -> None:
    source = Rows(10, shuffle_block=value)
    with pytest.raises(error) as info:
        Loader(source, 2, shuffle=True)
    assert shown in str(info.value)
    assert "pass Loader(..., shuffle_block=<int>) to override it" in str(info.value)
    Loader(source, 2, shuffle=True, shuffle_block=2)  # the override is the fix


def test_accepted_shuffle_blocks() -> None:
    assert Loader(Rows(10), 2, shuffle_block=np.int32(3)).shuffle_block == 3
    assert Loader(Rows(10), 2, shuffle_block=10**9).shuffle_block == 10**9  # one block: as is
    assert Loader(Rows(10), 2, shuffle=True, shuffle_block=10**9).record_indices(0).tolist() == (
        list(range(10))
    )
    assert Loader(Rows(0), 2, shuffle=True, shuffle_block=3).record_indices(0).tolist() == []


# -- JAX ---------------------------------------------------------------------------------

_JAX_CHILD = textwrap.dedent(
    """
    import numpy as np
    from mixle import Loader
    from mixle.jax import JaxLoader

    class Rows:
        shuffle_block = 4

        def __len__(self):
            return 30

        def __getitem__(self, i):
            return {"i": np.int64(i)}

    want = [b["i"].tolist() for b in Loader(Rows(), 4, shuffle=True, seed=6, num_epochs=2)]
    jl = JaxLoader(Rows(), 4, shuffle=True, seed=6, num_epochs=2)
    assert jl.loader.shuffle_block == 4
    got = [np.asarray(b["i"]).tolist() for b in jl]
    assert got == want, (got, want)
    head = JaxLoader(Rows(), 4, shuffle=True, seed=6, num_epochs=2, shuffle_block=4)
    for n, _ in zip(range(3), head):
        pass
    state = head.state_dict()
    assert state["shuffle_block"] == 4
    rest = JaxLoader(Rows(), 4, shuffle=True, seed=6, num_epochs=2)
    rest.load_state_dict(state)
    assert [np.asarray(b["i"]).tolist() for b in rest] == want[3:]
    print("ok")
    """
)


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_jax_loader_reads_the_blocked_order_and_resumes() -> None:
    # in a child: a live JAX backend warns on the fork-based tests of this process
    done = subprocess.run(
        [sys.executable, "-c", _JAX_CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
