"""Elastic resume at its edges: runs whose resumed epoch splits unevenly, hostile states that
must fail fast with a LoaderStateError, and a resumed run's per-batch state cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mixle
from mixle import Loader, LoaderStateError
from mixle.loading import resume as resume_module


def loaders(n: int, batch: int, shards: int, **options: Any) -> list[Loader]:
    return [
        Loader(np.arange(n), batch, shard_index=s, num_shards=shards, num_threads=0, **options)
        for s in range(shards)
    ]


def test_one_state_of_a_run_whose_resumed_epoch_split_unevenly_is_refused_later_too() -> None:
    # 12 records: a fresh epoch on 4 shards of 1 is even (3 batches each), but the rest of
    # epoch 0 after global position 6 is not (2, 2, 1, 1), so lock-step shards stand a batch
    # apart in every later epoch and no single state of them says where the others are
    first = loaders(12, 3, 2, num_epochs=3)
    for shard in first:
        for _ in zip(range(1), shard):
            pass
    new = loaders(12, 1, 4, num_epochs=3)
    for shard in new:
        shard.load_state_dict(first[0].state_dict(), reshard=True)
        for _ in zip(range(4), shard):  # every host takes 4 steps: past the resumed epoch
            pass
    states = [shard.state_dict() for shard in new]
    assert {(s["epoch"], s["batch"]) for s in states} == {(1, 2), (2, 0)}
    assert all(s["remainder"] is not None for s in states)  # kept after the resumed epoch
    for state in states:
        with pytest.raises(LoaderStateError, match="merge_states"):
            loaders(12, 4, 1, num_epochs=3)[0].load_state_dict(state, reshard=True)
    merged = mixle.merge_states(states)
    rest = loaders(12, 4, 1, num_epochs=3)[0]
    rest.load_state_dict(merged, reshard=True)
    seen: dict[int, list[int]] = {0: list(range(12))}
    for shard, state in zip(new, states, strict=True):
        epoch, batch = state["epoch"], state["batch"]
        seen.setdefault(1, [])
        if epoch == 2:
            seen[1] += [int(i) for b in range(len(shard)) for i in shard.batch_indices(b, 1)]
        else:
            seen[1] += [int(i) for b in range(batch) for i in shard.batch_indices(b, 1)]
    for batch in rest:
        seen.setdefault(rest.last_epoch, []).extend(batch.tolist())
    assert {e: sorted(v) for e, v in seen.items()} == {e: list(range(12)) for e in range(3)}


def test_a_state_with_a_huge_shard_count_is_answered_at_once() -> None:
    state = loaders(20, 2, 2, drop_last=False)[0].state_dict()
    state |= {"num_shards": 10**30, "global_position": 0}
    with pytest.raises(LoaderStateError, match="merge_states"):  # O(1), not a loop per shard
        loaders(20, 2, 1)[0].load_state_dict(state, reshard=True)


def test_read_ranges_reach_at_most_the_merge_limit_past_the_resumed_epoch() -> None:
    # no merge or reshard writes a range farther ahead, and a state listing one epoch after
    # another would make every check walk them all
    shards = loaders(20, 3, 2, drop_last=True, num_epochs=None)
    for _ in zip(range(1), shards[0]):
        pass
    state = shards[0].state_dict()
    state["position"] = 0  # the resumed epoch's first batch
    limit = resume_module.MERGE_MAX_EPOCHS_APART
    for far in (limit + 1, 10**7):
        state["remainder"] = {"epoch": 0, "start": 6, "batch": 1, "read": [[far, 0, 1]]}
        loader = loaders(20, 3, 2, drop_last=True, num_epochs=None)[0]
        with pytest.raises(LoaderStateError, match=f"more than {limit} epochs after epoch=0"):
            loader.load_state_dict(state, reshard=True)
    state["remainder"] = {"epoch": 0, "start": 6, "batch": 1, "read": [[limit, 0, 1]]}
    loader = loaders(20, 3, 2, drop_last=True, num_epochs=None)[0]
    loader.load_state_dict(state, reshard=True)
    assert loader.state_dict()["remainder"]["read"] == [[limit, 0, 1]]


def test_shards_too_many_epochs_apart_are_not_merged() -> None:
    shards = loaders(6, 3, 2, num_epochs=None)
    for _ in zip(range(2 * (resume_module.MERGE_MAX_EPOCHS_APART + 1)), shards[1]):
        pass
    with pytest.raises(LoaderStateError, match="epochs apart"):
        mixle.merge_states([shard.state_dict() for shard in shards])


@pytest.mark.parametrize("reshard", [False, True])
def test_a_shard_index_past_the_shard_count_is_a_state_error(reshard: bool) -> None:
    state = {**loaders(20, 2, 2)[0].state_dict(), "shard_index": 2}
    with pytest.raises(LoaderStateError, match="shard_index=2"):
        loaders(20, 2, 2)[0].load_state_dict(state, reshard=reshard)
    with pytest.raises(LoaderStateError, match="shard_index=2 is not valid for its num_shards"):
        mixle.merge_states([loaders(20, 2, 2)[0].state_dict(), state])


def test_a_version_2_state_with_version_3_keys_is_refused() -> None:
    state = {**loaders(20, 2, 1)[0].state_dict(), "version": 2}
    with pytest.raises(LoaderStateError, match=r"version=2 has the keys \['global_position'"):
        loaders(20, 2, 1)[0].load_state_dict(state)


def test_merge_states_names_stream_states_and_strings() -> None:
    stream = Loader(lambda: iter(range(10)), 2, num_threads=0)
    with pytest.raises(LoaderStateError, match="states\\[0\\] is a stream Loader's state"):
        mixle.merge_states([stream.state_dict()])
    with pytest.raises(LoaderStateError, match="got 'abc'"):
        mixle.merge_states("abc")


def test_a_resumed_run_works_out_each_epochs_span_once(monkeypatch) -> None:
    """JaxLoader asks for the state every batch: its remainder math runs once an epoch."""
    shards = loaders(4000, 2, 2, num_epochs=2)
    for steps, shard in zip((3, 900), shards, strict=True):
        for _ in zip(range(steps), shard):
            pass
    merged = mixle.merge_states([shard.state_dict() for shard in shards])
    assert len(merged["remainder"]["read"]) > 800  # interleaved: a range per record ahead
    calls = []
    span_of = resume_module.span_of
    monkeypatch.setattr(resume_module, "span_of", lambda *a: calls.append(a[2]) or span_of(*a))
    loader = loaders(4000, 4, 1, num_epochs=2)[0]
    loader.load_state_dict(merged, reshard=True)
    calls.clear()
    for _ in zip(range(300), loader):
        loader.state_dict()
    assert calls == [0]


def test_changing_a_returned_state_changes_no_later_state() -> None:
    shards = loaders(40, 2, 2, num_epochs=2)
    for steps, shard in zip((1, 4), shards, strict=True):
        for _ in zip(range(steps), shard):
            pass
    loader = loaders(40, 4, 1, num_epochs=2)[0]
    loader.load_state_dict(mixle.merge_states([s.state_dict() for s in shards]), reshard=True)
    first = loader.state_dict()
    before = [list(r) for r in first["remainder"]["read"]]
    assert before
    first["remainder"]["start"] = 0
    first["remainder"]["read"][0][1] = 0
    first["remainder"]["read"].clear()
    later = loader.state_dict()
    assert later["remainder"]["start"] != 0
    assert [list(r) for r in later["remainder"]["read"]] == before


def test_a_shards_own_state_resharded_onto_its_own_layout_goes_on_exactly() -> None:
    # shards that stopped apart each reload their own state with reshard=True: each goes
    # on as with reshard=False, keeping the run's remainder, so they can still be merged
    first = loaders(24, 2, 2, num_epochs=3)
    for steps, shard in zip((1, 3), first, strict=True):
        for _ in zip(range(steps), shard):
            pass
    merged = mixle.merge_states([s.state_dict() for s in first])
    middle = loaders(24, 3, 2, num_epochs=3)
    for shard, steps in zip(middle, (2, 5), strict=True):
        shard.load_state_dict(merged, reshard=True)
        for _ in zip(range(steps), shard):
            pass
    states = [shard.state_dict() for shard in middle]
    again = loaders(24, 3, 2, num_epochs=3)
    for shard, state in zip(again, states, strict=True):
        exact = loaders(24, 3, 2, num_epochs=3)[shard.layout.shard_index]
        exact.load_state_dict(state)
        shard.load_state_dict(state, reshard=True)
        assert shard.state_dict() == exact.state_dict()
        assert [b.tolist() for b in shard] == [b.tolist() for b in exact]
    assert mixle.merge_states(states)["merged"] is True  # one run: the remainders agree


def test_one_state_resharded_onto_its_own_layout_gives_every_shard_the_same_remainder() -> None:
    # every shard of the layout that saved it loads one shard's state with reshard=True:
    # they go on in that state's run, so their later states still merge
    first = loaders(30, 3, 3, drop_last="pad", num_epochs=None)
    for steps, shard in zip((1, 5, 2), first, strict=True):
        for _ in zip(range(steps), shard):
            pass
    merged = mixle.merge_states([s.state_dict() for s in first])
    middle = loaders(30, 3, 3, drop_last="pad", num_epochs=None)
    for shard in middle:
        shard.load_state_dict(merged, reshard=True)
        for _ in zip(range(2), shard):
            pass
    lockstep = middle[1].state_dict()
    last = loaders(30, 3, 3, drop_last="pad", num_epochs=None)
    for shard in last:
        shard.load_state_dict(lockstep, reshard=True)
        for _ in zip(range(3), shard):
            pass
    states = [shard.state_dict() for shard in last]
    assert all(s["remainder"] == lockstep["remainder"] for s in states)
    assert mixle.merge_states(states)["merged"] is True
