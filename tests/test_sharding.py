"""Shard layouts: disjoint shards that cover the epoch, equal lengths, worker slices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math.sharding import ShardLayout, parse_drop_last, worker_batches

policies = st.sampled_from([False, True, "pad"])
#: Every (records, batch size, shards, remainder policy) a layout test draws.
any_layout = given(
    n=st.integers(0, 300),
    batch=st.integers(1, 17),
    shards=st.integers(1, 9),
    drop_last=policies,
)


def _layouts(n: int, batch: int, shards: int, drop_last: object) -> list[ShardLayout]:
    return [ShardLayout(n, batch, s, shards, drop_last) for s in range(shards)]  # type: ignore[arg-type]


def _all_positions(layout: ShardLayout) -> np.ndarray:
    return layout.positions(0, layout.num_batches)


@settings(max_examples=200, deadline=None)
@any_layout
def test_shards_are_disjoint_and_cover_the_epoch(
    n: int, batch: int, shards: int, drop_last: object
) -> None:
    layouts = _layouts(n, batch, shards, drop_last)
    every = np.concatenate([_all_positions(lay) for lay in layouts])
    assert np.unique(every).size == every.size  # each position read by one shard, once
    real = np.sort(every[every < n])
    g = batch * shards
    if drop_last is True:
        assert np.array_equal(real, np.arange(n // g * g))
    else:
        assert np.array_equal(real, np.arange(n))
    if drop_last is False:
        assert every.size == n
    else:  # every shard reads the same number of full batches
        assert {lay.num_batches for lay in layouts} == {layouts[0].num_batches}
        for lay in layouts:
            assert all(lay.batch_rows(b) == batch for b in range(lay.num_batches))
        assert every.size == layouts[0].epoch_positions
        assert every.size % g == 0
        assert n - g < every.size <= n if drop_last is True else n <= every.size < n + g
    for lay in layouts:
        sizes = [lay.batch_rows(b) for b in range(lay.num_batches)]
        assert sum(sizes) == lay.shard_length == _all_positions(lay).size
        assert all(s >= 1 for s in sizes)
        assert lay.num_batches * batch >= lay.shard_length


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 9), shards=st.integers(1, 6))
def test_step_t_of_all_shards_is_one_block_of_the_global_order(
    n: int, batch: int, shards: int
) -> None:
    layouts = _layouts(n, batch, shards, "pad")
    g = batch * shards
    for t in range(layouts[0].num_batches):
        step = np.concatenate([lay.positions(t, t + 1) for lay in layouts])
        assert np.array_equal(np.sort(step), np.arange(t * g, (t + 1) * g))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), workers=st.integers(1, 7))
def test_workers_take_every_batch_once(n: int, workers: int) -> None:
    got = sorted(b for w in range(workers) for b in worker_batches(n, w, workers))
    assert got == list(range(n))


def test_padding_layout_by_hand() -> None:
    # 10 records, 2 shards of batches of 3: global steps of 6, padded to 12
    first, second = _layouts(10, 3, 2, "pad")
    assert first.positions(0, 2).tolist() == [0, 2, 4, 6, 8, 10]
    assert second.positions(0, 2).tolist() == [1, 3, 5, 7, 9, 11]
    dropped = ShardLayout(10, 3, 1, 2, drop_last=True)
    assert dropped.num_batches == 1 and dropped.positions(0, 1).tolist() == [1, 3, 5]
    ragged = ShardLayout(10, 3, 1, 2)
    assert ragged.num_batches == 2 and [ragged.batch_rows(b) for b in range(2)] == [3, 2]
    tiny = ShardLayout(2, 1, 3, 4, drop_last="pad")  # more shards than records
    assert tiny.num_batches == 1 and tiny.positions(0, 1).tolist() == [3]
    assert ShardLayout(2, 1, 3, 4).num_batches == 0


def test_errors_name_the_argument_and_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        ShardLayout(10, 0)
    with pytest.raises(TypeError, match=r"batch_size=2\.0 must be an int"):
        ShardLayout(10, 2.0)  # type: ignore[arg-type]
    with pytest.raises(
        IndexError, match=r"shard_index=4 is out of range for num_shards=4: .*\[0, 3\]"
    ):
        ShardLayout(10, 2, shard_index=4, num_shards=4)
    with pytest.raises(IndexError, match="shard_index=-1"):
        ShardLayout(10, 2, shard_index=-1, num_shards=4)
    with pytest.raises(ValueError, match="num_shards=0 must be an int >= 1"):
        ShardLayout(10, 2, num_shards=0)
    with pytest.raises(ValueError, match="num_records=-1 must be >= 0"):
        ShardLayout(-1, 2)
    with pytest.raises(ValueError, match=r"drop_last='yes' must be False, True or 'pad'"):
        parse_drop_last("yes")
    with pytest.raises(IndexError, match="batches"):
        ShardLayout(10, 2).positions(0, 6)
    with pytest.raises(IndexError, match="worker_index=3 is out of range for num_workers=3"):
        worker_batches(5, 3, 3)
    with pytest.raises(ValueError, match="num_workers=0"):
        worker_batches(5, 0, 0)


@settings(max_examples=200, deadline=None)
@any_layout
def test_blocked_shards_stack_into_the_single_process_batches(
    n: int, batch: int, shards: int, drop_last: object
) -> None:
    blocked = [
        ShardLayout(n, batch, s, shards, drop_last, blocked=True)  # type: ignore[arg-type]
        for s in range(shards)
    ]
    single = ShardLayout(n, batch * shards, 0, 1, drop_last)  # type: ignore[arg-type]
    assert max(lay.num_batches for lay in blocked) == single.num_batches
    for t in range(single.num_batches):
        stacked = [lay.positions(t, t + 1) for lay in blocked if t < lay.num_batches]
        np.testing.assert_array_equal(np.concatenate(stacked), single.positions(t, t + 1))
    # the same positions as the interleaved shards, only split differently
    interleaved = np.concatenate(
        [_all_positions(lay) for lay in _layouts(n, batch, shards, drop_last)]
    )
    every = np.concatenate([_all_positions(lay) for lay in blocked])
    np.testing.assert_array_equal(np.sort(every), np.sort(interleaved))


def test_blocked_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="blocked='yes'"):
        ShardLayout(10, 2, blocked="yes")  # type: ignore[arg-type]
