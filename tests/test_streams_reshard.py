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
    if drop is False and shards > 1 and states[0]["epoch"] >= 1:
        # past epoch 0 one shard's cursor does not say whether the others are there too
        with pytest.raises(LoaderStateError, match="may have read different numbers"):
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


@pytest.mark.parametrize("steps", [2, 3, 5])
def test_one_stream_shard_past_epoch_0_is_refused_with_drop_last_false(steps: int) -> None:
    # 5 records, global batch 4: shard 0 has 2 batches an epoch, shard 1 one, so after
    # epoch 0 shards in lock step stand at different batches (the end of the run included)
    shards = [stream_loader(5, 2, 2, s, num_epochs=3) for s in range(2)]
    for shard in shards:
        read_steps(shard, steps, {})
    state = shards[1].state_dict()
    assert state["epoch"] >= 1
    with pytest.raises(LoaderStateError, match="may have read different numbers of batches"):
        stream_loader(5, 4, 1, 0, num_epochs=3).load_state_dict(state, reshard=True)
    early = stream_loader(5, 2, 2, 0, num_epochs=3)
    read_steps(early, 1, {})
    stream_loader(5, 4, 1, 0, num_epochs=3).load_state_dict(early.state_dict(), reshard=True)


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
