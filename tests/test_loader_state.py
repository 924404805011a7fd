"""Loader state validation: a malformed state is a LoaderStateError naming key and value."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle import Loader, LoaderStateError
from mixle.loading.state import STATE_KEYS, show


class Rows:
    """Rows ``0..n`` as 1-element arrays."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i])


def make_loader() -> Loader:
    return Loader(Rows(30), 4, shuffle=True, seed=3, num_epochs=2, num_threads=0)


def saved_state() -> dict[str, Any]:
    loader = make_loader()
    for _ in zip(range(3), loader):
        pass
    return loader.state_dict()


def refusal(state: Any) -> str:
    with pytest.raises(LoaderStateError) as info:
        make_loader().load_state_dict(state)
    return str(info.value)


NOT_INTS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
NEGATIVE = st.integers(max_value=-1)
NOT_POSITIVE = st.integers(max_value=0)
#: Per key: values that must be refused whatever the loader.
BAD_VALUES = {
    "version": st.one_of(NOT_INTS, NOT_POSITIVE, st.just("2")),
    "source": st.one_of(
        st.integers(),
        st.binary(max_size=16),
        st.none(),
        st.text(max_size=20).filter(lambda t: len(t) != 16),
        st.just("ABCDEF0123456789"),  # uppercase: not what source_fingerprint writes
    ),
    "num_records": st.one_of(NOT_INTS, NEGATIVE),
    "batch_size": st.one_of(NOT_INTS, NOT_POSITIVE),
    "drop_last": st.one_of(
        st.integers(), st.none(), st.text(max_size=5).filter(lambda t: t != "pad")
    ),
    "shard_index": st.one_of(NOT_INTS, NEGATIVE),
    "num_shards": st.one_of(NOT_INTS, NOT_POSITIVE),
    "shard_layout": st.one_of(
        st.integers(),
        st.none(),
        st.text(max_size=12).filter(lambda t: t not in ("interleaved", "blocked")),
    ),
    "seed": st.one_of(st.booleans(), st.floats(), st.text(max_size=5), st.none()),
    "shuffle": st.one_of(st.integers(), st.none(), st.text(max_size=5)),
    "num_epochs": st.one_of(
        st.booleans(), st.floats(allow_nan=False), st.text(max_size=5), NOT_POSITIVE
    ),
    "epoch": st.one_of(NOT_INTS, NEGATIVE),
    "batch": st.one_of(NOT_INTS, NEGATIVE),
    "position": st.one_of(NOT_INTS, NEGATIVE),
    "global_position": st.one_of(NOT_INTS, NEGATIVE),
    "remainder": st.one_of(
        st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3)
    ),
}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STATE_KEYS).flatmap(lambda k: st.tuples(st.just(k), BAD_VALUES[k])))
def test_a_value_of_the_wrong_type_or_range_names_key_value_and_expectation(
    case: tuple[str, Any],
) -> None:
    key, value = case
    message = refusal({**saved_state(), key: value})
    assert f"state {key}={show(value)} ({type(value).__name__}) is not valid" in message
    assert f"{key} must be " in message and "Loader.state_dict()" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("epoch", True, "epoch must be an int >= 0"),
        ("batch", 7.0, "batch must be an int >= 0"),
        ("batch", -1, "batch must be an int >= 0"),
        ("position", -4, "position must be an int >= 0"),
        ("num_epochs", 0, "num_epochs must be an int >= 1 or None"),
        ("shuffle", 1, "shuffle must be True or False"),
        ("drop_last", 0, "drop_last must be False, True or 'pad'"),
        ("source", 123, "source must be a source fingerprint: a str of 16 lowercase hex"),
        ("source", b"0123456789abcdef", "source must be a source fingerprint"),
        ("version", "2", "version must be an int"),
    ],
)
def test_the_reported_cases(key: str, value: Any, expected: str) -> None:
    message = refusal({**saved_state(), key: value})
    assert f"state {key}={value!r}" in message and expected in message


def test_unknown_keys_are_refused_with_their_values() -> None:
    assert tuple(make_loader().state_dict()) == STATE_KEYS == tuple(BAD_VALUES)  # all checked
    message = refusal({**saved_state(), "epochs": 3, 7: "x"})
    assert "unknown keys {'epochs': 3, 7: 'x'}" in message
    assert "'epoch', 'batch', 'position', 'global_position', 'remainder']" in message


def test_missing_keys_are_named_with_the_keys_a_state_has() -> None:
    state = saved_state()
    del state["batch"], state["source"]
    message = refusal(state)
    assert "missing keys ['batch', 'source']" in message
    assert f"has the keys {list(STATE_KEYS)}" in message


def test_a_cursor_out_of_range_names_the_key_and_the_range() -> None:
    state = saved_state()
    nb = len(make_loader())
    message = refusal({**state, "batch": nb + 1, "position": 30})
    assert f"batch={nb + 1} is past the {nb} batches per epoch (0 to {nb})" in message
    assert "not a cursor of this loader" in message
    assert "epoch=3 is past num_epochs=2" in refusal({**state, "epoch": 3})
    message = refusal({**state, "position": 5})
    assert "position=5 does not match batch=3: expected position=12" in message
    # a finished run stands at (num_epochs, 0); no run passes through (num_epochs, 3)
    message = refusal({**state, "epoch": 2})
    assert "epoch=2 with batch=3: a run of num_epochs=2 ends at epoch=2, batch=0" in message
    finished = make_loader()
    finished.load_state_dict({**state, "epoch": 2, "batch": 0, "position": 0, "global_position": 0})
    assert list(finished) == []


def test_a_good_state_still_resumes_after_json_and_with_numpy_ints() -> None:
    state = saved_state()
    rest = [b[:, 0].tolist() for b in Loader(Rows(30), 4, shuffle=True, seed=3, num_epochs=2)]
    for same in (
        json.loads(json.dumps(state)),
        {**state, "epoch": np.int64(state["epoch"]), "batch": np.int32(state["batch"])},
        {**state, "shuffle": np.bool_(True)},
    ):
        loader = make_loader()
        loader.load_state_dict(same)
        assert [b[:, 0].tolist() for b in loader] == rest[3:]


def test_a_long_bad_value_is_abridged_in_the_message() -> None:
    message = refusal({**saved_state(), "source": "f" * 10_000})
    assert "source='fff" in message and len(message) < 600


def remainder_refusal(remainder: Any) -> str:
    """The refusal of a state whose ``remainder`` is ``remainder`` (a run resumed at
    epoch 0, position 8, batch 2 of ``make_loader``'s 30 records)."""
    return refusal({**saved_state(), "remainder": remainder})


@pytest.mark.parametrize(
    ("remainder", "expected"),
    [
        ({"epoch": 0, "start": 8}, "exactly the keys ['epoch', 'start', 'batch', 'read']"),
        ({"epoch": 0, "start": -1, "batch": 2, "read": []}, "start=-1 must be an int >= 0"),
        ({"epoch": True, "start": 8, "batch": 2, "read": []}, "epoch=True must be an int"),
        ({"epoch": 0, "start": 31, "batch": 2, "read": []}, "start=31 is past num_records=30"),
        ({"epoch": 1, "start": 8, "batch": 2, "read": []}, "epoch=1 is after the state's"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": 5}, "read=5 must be a list of"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": [[0, 9]]}, "must be [epoch, start, stop]"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": [[0, 9, 9]]}, "must have start < stop"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": [[0, 4, 6]]}, "at or past start=8"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": [[0, 9, 31]]}, "stop <= num_records=30"),
        ({"epoch": 0, "start": 8, "batch": 2, "read": [[2, 9, 12]]}, "past num_epochs=2"),
        (
            {"epoch": 0, "start": 8, "batch": 2, "read": [[0, 20, 22], [0, 9, 12]]},
            "sorted by epoch and start",
        ),
        (
            {"epoch": 0, "start": 8, "batch": 2, "read": [[0, 9, 12], [0, 11, 14]]},
            "overlaps the one before it",
        ),
    ],
)
def test_a_bad_remainder_is_refused_naming_what_is_wrong(remainder: Any, expected: str) -> None:
    message = remainder_refusal(remainder)
    assert "state remainder=" in message and expected in message


def test_a_global_position_that_disagrees_with_the_batch_is_refused() -> None:
    state = saved_state()
    assert state["global_position"] == state["batch"] * 4 == 12
    message = refusal({**state, "global_position": 13})
    assert "global_position=13 does not match epoch=0, batch=3" in message
    assert "expected global_position=12" in message


def test_a_state_saved_before_the_global_cursor_keys_existed_still_resumes() -> None:
    state = saved_state()
    old = {k: v for k, v in state.items() if k not in ("global_position", "remainder")}
    old["version"] = 2
    loader = make_loader()
    loader.load_state_dict(old)
    assert loader.state_dict() == state
    with pytest.raises(LoaderStateError, match=r"missing keys \['global_position', 'remainder'\]"):
        make_loader().load_state_dict({**old, "version": 3})


def test_a_merged_state_whose_remainder_was_changed_is_refused() -> None:
    shards = [
        Loader(Rows(30), 4, shard_index=s, num_shards=2, num_epochs=2, num_threads=0)
        for s in range(2)
    ]
    for shard, steps in zip(shards, (1, 3), strict=True):
        for _ in zip(range(steps), shard):
            pass
    merged = mixle.merge_states([shard.state_dict() for shard in shards])
    assert merged["merged"] is True and merged["remainder"]["start"] == 8
    loader = Loader(Rows(30), 5, num_epochs=2, num_threads=0)
    with pytest.raises(LoaderStateError, match="does not start at its epoch=0, batch=3"):
        loader.load_state_dict({**shards[1].state_dict(), "merged": True}, reshard=True)
    with pytest.raises(
        LoaderStateError, match=r"load it with load_state_dict\(state, reshard=True\)"
    ):
        Loader(Rows(30), 4, num_shards=2, num_epochs=2).load_state_dict(merged)
    loader.load_state_dict(merged, reshard=True)
    assert loader.state_dict()["remainder"] == merged["remainder"] | {"batch": 8 // 5}


@pytest.mark.parametrize("states", [5, None, {"version": 3}])
def test_merge_states_of_something_not_a_list_of_states_names_it(states: Any) -> None:
    with pytest.raises(LoaderStateError, match="takes a list of every shard's state, got"):
        mixle.merge_states(states)
