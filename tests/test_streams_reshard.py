"""A stream Loader's state continued on another batch size and shard count (reshard=True)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _stream_sources import Counting
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.errors import LoaderStateError


def stream_loader(n: int, batch: int, shards: int, shard: int, **options: Any) -> Any:
    return mixle.Loader(
        Counting(n),
        batch,
        shard_index=shard,
        num_shards=shards,
        num_threads=0,
        **{"num_epochs": 2, **options},
    )


def real_ids(batch: Any) -> list[int]:
    ids = [int(i) for i in batch["i"]]
    mask = batch.get("mask")
    return ids if mask is None else [i for i, real in zip(ids, mask, strict=True) if real]


def read_steps(loader: Any, steps: int, seen: dict[int, list[int]]) -> None:
    for _, batch in zip(range(steps), loader, strict=False):
        seen.setdefault(loader.last_epoch, []).extend(real_ids(batch))


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, int, int, int, int, Any]:
    """n, old shards, old batch, new shards, steps, drop_last, with the global batch kept."""
    global_batch = draw(st.sampled_from([2, 4, 6, 12]))
    shards = draw(st.sampled_from([s for s in (1, 2, 3, 4, 6) if global_batch % s == 0]))
    new = draw(st.sampled_from([s for s in (1, 2, 3, 4, 6, 12) if global_batch % s == 0]))
    n = draw(st.integers(0, 60))
    drop = draw(st.sampled_from([False, True, "pad"]))
    if drop is False and shards > 1:  # else shards differ by a batch per epoch: not lock step
        n = n // global_batch * global_batch
    steps = draw(st.integers(0, 12))
    return n, shards, global_batch // shards, new, steps, drop


@settings(max_examples=60, deadline=None)
@given(cases())
def test_lockstep_stream_shards_go_on_with_another_count_reading_each_record_once(case) -> None:
    n, shards, batch, new, steps, drop = case
    seen: dict[int, list[int]] = {}
    states = []
    for s in range(shards):
        old = stream_loader(n, batch, shards, s, drop_last=drop)
        read_steps(old, steps, seen)
        states.append(json.loads(json.dumps(old.state_dict())))
    epoch, at = states[0]["epoch"], states[0]["batch"]
    if drop is False and shards > 1 and at == 0 and epoch == 1:
        # one shard at the start of epoch 1 does not say whether the others are there too
        with pytest.raises(LoaderStateError, match="may have had no rows"):
            stream_loader(n, batch, shards, 0).load_state_dict(states[0], reshard=True)
        return
    assert len({(state["epoch"], state["batch"]) for state in states}) == 1  # lock step
    new_batch = batch * shards // new
    for s in range(new):
        resumed = stream_loader(n, new_batch, new, s, drop_last=drop)
        resumed.load_state_dict(states[0], reshard=True)
        read_steps(resumed, 10**6, seen)
    whole = stream_loader(n, batch * shards, 1, 0, drop_last=drop)
    expected: dict[int, list[int]] = {}
    read_steps(whole, 10**6, expected)
    assert {e: sorted(v) for e, v in seen.items()} == {e: sorted(v) for e, v in expected.items()}


def test_a_stream_position_off_the_new_global_batch_is_refused() -> None:
    old = stream_loader(40, 4, 1, 0)
    read_steps(old, 3, {})
    state = old.state_dict()
    assert state["position"] == 12
    with pytest.raises(LoaderStateError, match=r"position=12 .* not a multiple .* = 8"):
        stream_loader(40, 4, 2, 1).load_state_dict(state, reshard=True)
    stream_loader(40, 2, 3, 2).load_state_dict(state, reshard=True)  # 12 = 2 global batches of 6


def test_one_stream_shard_at_an_epoch_start_is_refused_with_drop_last_false() -> None:
    old = stream_loader(10, 2, 2, 1)
    read_steps(old, 3, {})  # 10 records, global batch 4: shard 1 has 2 batches, shard 0 has 3
    state = old.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 0)
    with pytest.raises(LoaderStateError, match="may have had no rows in the stream's last"):
        stream_loader(10, 4, 1, 0).load_state_dict(state, reshard=True)


def test_without_reshard_another_layout_is_refused_and_the_message_says_reshard() -> None:
    state = stream_loader(40, 4, 1, 0).state_dict()
    with pytest.raises(LoaderStateError, match="or pass reshard=True"):
        stream_loader(40, 2, 2, 0).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="seed=0 but this loader has seed=1"):
        stream_loader(40, 2, 2, 0, seed=1).load_state_dict(state, reshard=True)
    with pytest.raises(LoaderStateError, match="reshard keeps drop_last"):
        stream_loader(40, 2, 2, 0, drop_last=True).load_state_dict(state, reshard=True)
    with pytest.raises(TypeError, match="reshard=1 must be True or False"):
        stream_loader(40, 4, 1, 0).load_state_dict(state, reshard=1)
