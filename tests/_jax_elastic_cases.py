"""``JaxLoader.load_state_dict(state, reshard=True)``: it continues as the Loader does.

Run by ``tests/test_loader_elastic.py`` in a fresh interpreter (a live JAX backend must stay
out of the main pytest process; see ``tests/_jax_child.py``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from mixle import Loader, LoaderStateError, MemorySource, merge_states  # noqa: E402
from mixle.jax import JaxLoader  # noqa: E402

N = 43
OPTIONS: dict[str, Any] = {"shuffle": True, "seed": 11, "num_epochs": 2, "num_threads": 0}


def source() -> MemorySource:
    return MemorySource({"id": np.arange(N, dtype=np.int32)})


def old_states(drop_last: Any, steps: list[int]) -> list[dict[str, Any]]:
    """States of 2 blocked shards of 4 rows after ``steps`` batches each, JSON round-tripped."""
    states = []
    for s, k in enumerate(steps):
        loader = Loader(
            source(),
            4,
            drop_last=drop_last,
            shard_index=s,
            num_shards=2,
            shard_layout="blocked",
            **OPTIONS,
        )
        for _ in itertools.islice(loader, k):
            pass
        states.append(json.loads(json.dumps(loader.state_dict())))
    return states


def new_options(drop_last: Any, shard: int) -> dict[str, Any]:
    return {
        "drop_last": drop_last,
        "shard_index": shard,
        "num_shards": 3,
        "shard_layout": "interleaved",
        **OPTIONS,
    }


def host(batch: Any) -> dict[str, list[Any]]:
    return {key: np.asarray(value).tolist() for key, value in batch.items()}


@pytest.mark.parametrize(
    ("drop_last", "steps"),
    [(True, [3, 3]), ("pad", [4, 4]), (False, [2, 7])],
    ids=["drop-lockstep", "pad-lockstep", "false-merged"],
)
@pytest.mark.parametrize("prefetch", [0, 2])
def test_jax_loader_reshards_like_the_loader(
    drop_last: Any, steps: list[int], prefetch: int
) -> None:
    states = old_states(drop_last, steps)
    state = merge_states(states) if drop_last is False else states[1]
    for shard in range(3):
        loader = Loader(source(), 3, **new_options(drop_last, shard))
        loader.load_state_dict(state, reshard=True)
        want = [host(b) for b in loader]
        assert want  # the new shard reads something after the cut

        jl = JaxLoader(source(), 3, prefetch=prefetch, **new_options(drop_last, shard))
        jl.load_state_dict(state, reshard=True)
        got = []
        for batch in jl:  # a break, then a new iter(): it reloads its own state exactly
            got.append(host(batch))
            if len(got) == 2:
                break
        middle = jl.state_dict()
        got += [host(b) for b in jl]
        assert got == want

        again = JaxLoader(source(), 3, prefetch=prefetch, **new_options(drop_last, shard))
        again.load_state_dict(middle)  # reshard=False: exact
        assert [host(b) for b in again] == want[2:]


def test_jax_loader_refuses_as_the_loader_does() -> None:
    states = old_states(False, [2, 7])
    same = {**new_options(False, 0), "num_shards": 2, "shard_layout": "blocked"}
    with pytest.raises(LoaderStateError, match=r"merged.*reshard=True"):
        JaxLoader(source(), 4, **same).load_state_dict(merge_states(states))
    jl = JaxLoader(source(), 3, **new_options(False, 0))
    with pytest.raises(LoaderStateError, match="merge_states"):
        jl.load_state_dict(
            states[0], reshard=True
        )  # 43 rows over 2 blocked shards of 4: 6 and 5 batches
    other = JaxLoader(source(), 3, **{**new_options(False, 0), "seed": 12})
    with pytest.raises(LoaderStateError, match="seed"):
        other.load_state_dict(merge_states(states), reshard=True)


def test_changing_a_jax_loaders_state_changes_nothing_in_it() -> None:
    jl = JaxLoader(source(), 3, **new_options(False, 0))
    jl.load_state_dict(merge_states(old_states(False, [2, 7])), reshard=True)
    state = jl.state_dict()
    kept = json.loads(json.dumps(state))
    state["remainder"]["start"] = 0
    state["remainder"]["read"].clear()
    assert jl.state_dict() == kept
