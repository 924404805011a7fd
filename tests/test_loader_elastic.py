"""Elastic resume: ``load_state_dict(state, reshard=True)`` and ``merge_states``.

A run of ``S`` shards is cut, its state (one shard's, in lock-step, or every shard's merged)
is loaded into ``S'`` shards of another batch size and layout, and they run to the end.
The source's batches are the record indices they read, so every check is about which
records were read, and in which order: per epoch, the records read before and after the
cut are each record once (``drop_last=False``), and the records read after it, laid out in
global order (global batch by global batch, shards within a batch by the new layout), are
the epoch's global order with the positions read before the cut removed (cut to whole
global batches for ``drop_last=True``, padded for ``"pad"``).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _jax_child import assert_child_passes
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mixle
from mixle import Loader, LoaderStateError, merge_states
from mixle.data.index_math.sharding import DropLast, ShardLayout
from mixle.loading.plan import batch_rng
from mixle.utils.optional_deps import HAS_JAX

TAG_HIGH = 2**62


class Ids:
    """Records ``0..n-1``: record ``i`` is ``[i]``, a batch of indices is those indices."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i], dtype=np.int64)

    def get_batch(self, indices: np.ndarray) -> np.ndarray:
        return np.asarray(indices, dtype=np.int64).reshape(-1, 1)


class OtherIds(Ids):
    """The same records under another type (so another source fingerprint)."""


def tag(batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A two-argument transform: adds a column holding one draw of the batch's rng."""
    draw = np.full((len(batch), 1), rng.integers(TAG_HIGH), dtype=np.int64)
    return np.concatenate([batch, draw], axis=1)


def expected_tag(seed: int, epoch: int, number: int, shard: int) -> int:
    return int(batch_rng(seed, epoch, number, shard).integers(TAG_HIGH))


# -- the model -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """What a state must match to resume, with or without reshard."""

    n: int
    shuffle: bool = False
    shuffle_block: int = 1
    seed: int = 0
    num_epochs: int = 1
    drop_last: DropLast = False

    @functools.cached_property
    def _orders(self) -> dict[int, np.ndarray]:
        return {}

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global order: the record read at each position ``0..n-1``.

        From one shard's ``record_indices`` of a batch of the whole epoch, behaviour that
        reshard does not change.
        """
        if epoch not in self._orders:
            one = Loader(
                Ids(self.n),
                max(1, self.n),
                shuffle=self.shuffle,
                shuffle_block=self.shuffle_block,
                seed=self.seed,
                num_epochs=self.num_epochs,
                num_threads=0,
            )
            self._orders[epoch] = one.record_indices(epoch)
            assert sorted(self._orders[epoch].tolist()) == list(range(self.n))
        return self._orders[epoch]

    def position_of(self, epoch: int) -> np.ndarray:
        inverse = np.empty(self.n, dtype=np.int64)
        inverse[self.order(epoch)] = np.arange(self.n)
        return inverse


@dataclass(frozen=True)
class Grid:
    """A shard layout: per-shard batch size, shards, interleaved or blocked."""

    batch_size: int
    num_shards: int
    blocked: bool = False

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_shards

    @property
    def name(self) -> str:
        return "blocked" if self.blocked else "interleaved"

    def layout(self, n: int, shard: int, drop_last: DropLast) -> ShardLayout:
        return ShardLayout(n, self.batch_size, shard, self.num_shards, drop_last, self.blocked)

    def row_position(self, batch: int, shard: int, row: int) -> int:
        """Position in the epoch of row ``row`` of batch ``batch`` of shard ``shard``."""
        start = batch * self.global_batch
        if self.blocked:
            return start + shard * self.batch_size + row
        return start + shard + self.num_shards * row

    def loaders(self, run: Run, source: Any = None, **options: Any) -> list[Loader]:
        options.setdefault("num_threads", 0)
        return [
            Loader(
                Ids(run.n) if source is None else source,
                self.batch_size,
                shuffle=run.shuffle,
                shuffle_block=run.shuffle_block,
                seed=run.seed,
                num_epochs=run.num_epochs,
                drop_last=run.drop_last,
                shard_index=s,
                num_shards=self.num_shards,
                shard_layout=self.name,
                **options,
            )
            for s in range(self.num_shards)
        ]

    def uneven(self, run: Run) -> bool:
        """Whether a single state of this layout is refused for reshard (see the spec)."""
        counts = {self.layout(run.n, s, False).num_batches for s in range(self.num_shards)}
        return run.drop_last is False and self.num_shards > 1 and len(counts) > 1


@dataclass(frozen=True)
class Read:
    """One batch a loader yielded: its epoch, its number among the batches of that epoch
    this read saw (from 0), its records, which rows are real, and its tags (or None)."""

    epoch: int
    number: int
    records: np.ndarray
    real: np.ndarray
    tags: np.ndarray | None


def read(loader: Loader, steps: int | None = None) -> list[Read]:
    """The next ``steps`` batches of ``loader`` (all that are left when ``None``)."""
    out: list[Read] = []
    seen: dict[int, int] = defaultdict(int)
    for batch in itertools.islice(loader, steps):
        data, mask = batch if isinstance(batch, tuple) else (batch, None)
        data = np.asarray(data)
        records = data[:, 0].copy()
        real = np.ones(len(records), bool) if mask is None else np.asarray(mask, bool).copy()
        assert (loader.layout.drop_last == "pad") == (mask is not None)
        np.testing.assert_array_equal(loader.last_indices, records)
        epoch = loader.last_epoch
        assert epoch is not None
        tags = data[:, 1].copy() if data.shape[1] > 1 else None
        out.append(Read(epoch, seen[epoch], records, real, tags))
        seen[epoch] += 1
    loader.close()
    return out


def read_from_start(run: Run, grid: Grid, shard: int, loader: Loader, steps: int) -> list[Read]:
    """:func:`read` of a loader of an uninterrupted run, checked against the global order
    (the Loader's behaviour before reshard existed: a check of this file's model)."""
    reads = read(loader, steps)
    for r in reads:
        positions = grid.layout(run.n, shard, run.drop_last).positions(r.number, r.number + 1)
        want = run.order(r.epoch)[positions % run.n] if run.n else positions
        np.testing.assert_array_equal(r.records, want)
        np.testing.assert_array_equal(r.real, positions < run.n)
    return reads


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def read_positions(run: Run, *phases: list[list[Read]]) -> dict[int, set[int]]:
    """Per epoch, the positions whose record was read (real rows only)."""
    done: dict[int, set[int]] = defaultdict(set)
    for phase in phases:
        for reads in phase:
            for r in reads:
                where = run.position_of(r.epoch)
                done[r.epoch].update(where[r.records[r.real]].tolist())
    return done


def expected_after(
    run: Run, grid: Grid, done: dict[int, set[int]], first_epoch: int
) -> dict[int, list[tuple[int, bool]]]:
    """Per epoch from ``first_epoch``: ``(record, real)`` of the positions not read yet, in
    position order; cut to whole global batches of ``grid`` (``True``) or padded with
    positions ``n, n + 1, ...`` reading the record at ``p mod n`` (``"pad"``)."""
    out: dict[int, list[tuple[int, bool]]] = {}
    g = grid.global_batch
    for e in range(first_epoch, run.num_epochs):
        todo = [p for p in range(run.n) if p not in done.get(e, set())]
        if run.drop_last is True:
            todo = todo[: len(todo) // g * g]
        elif run.drop_last == "pad":
            todo += range(run.n, run.n + (-len(todo)) % g)
        if todo:
            order = run.order(e)
            out[e] = [(int(order[p % run.n]), p < run.n) for p in todo]
    return out


def global_sequence(grid: Grid, shards: list[list[Read]]) -> dict[int, list[tuple[int, bool]]]:
    """Per epoch, ``(record, real)`` of the shards' rows laid out in global order: global
    batch ``t`` is batch ``t`` of every shard, its rows placed by ``grid``'s layout."""
    rows: dict[int, list[tuple[int, int, bool]]] = defaultdict(list)
    for s, reads in enumerate(shards):
        for r in reads:
            for j, (record, real) in enumerate(zip(r.records.tolist(), r.real.tolist())):
                rows[r.epoch].append((grid.row_position(r.number, s, j), record, real))
    out: dict[int, list[tuple[int, bool]]] = {}
    for e, placed in rows.items():
        placed.sort()
        positions = [p for p, _, _ in placed]
        assert positions == list(range(len(placed))), (
            f"epoch {e}: the new shards' rows do not tile a fresh epoch of {len(placed)} "
            f"positions split by {grid}: {positions}"
        )
        out[e] = [(record, real) for _, record, real in placed]
    return out


def check_after(
    run: Run,
    grid: Grid,
    before: list[list[list[Read]]],
    after: list[list[Read]],
    first_epoch: int,
) -> None:
    """The new shards' reads are the model's, and no real record is read twice in an
    epoch (exactly once with ``drop_last=False``)."""
    done = read_positions(run, *before)
    got = global_sequence(grid, after)
    want = expected_after(run, grid, done, first_epoch)
    for e in range(run.num_epochs):
        assert got.get(e, []) == want.get(e, []), (
            f"epoch {e} after the cut (first epoch {first_epoch}): got {got.get(e, [])}, "
            f"want {want.get(e, [])}"
        )
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for phase in [*before, after]:
        for reads in phase:
            for r in reads:
                per_epoch[r.epoch] += r.records[r.real].tolist()
    for e in range(run.num_epochs):
        records = sorted(per_epoch[e])
        if run.drop_last is False:
            assert records == list(range(run.n)), f"epoch {e}: not each record once"
        else:
            assert len(records) == len(set(records)), f"epoch {e}: a record read twice"


def check_merged(run: Run, merged: dict[str, Any], done: dict[int, set[int]]) -> None:
    """A merged state's remainder is the exact cursor of what was read: the first position
    of the first unfinished epoch no shard read, and the ranges read past it."""
    assert merged["merged"] is True
    remainder = merged["remainder"]
    if remainder is None:  # every shard finished the run
        assert merged["epoch"] == run.num_epochs
        return
    assert set(remainder) == {"epoch", "start", "batch", "read"}
    e0, start = remainder["epoch"], remainder["start"]
    flat = [tuple(r) for r in remainder["read"]]
    assert flat == sorted(flat) and all(a < b for _, a, b in flat)
    assert all(e > e0 or a >= start for e, a, _ in flat)
    for (e1, _, b1), (e2, a2, _) in itertools.pairwise(flat):
        assert e1 < e2 or b1 <= a2  # disjoint
    got: dict[int, set[int]] = defaultdict(set)
    got[e0].update(range(start))
    for e, a, b in flat:
        got[e].update(range(a, min(b, run.n)))
    for e in range(e0, run.num_epochs):
        assert got[e] == done.get(e, set()), f"epoch {e}: the merged state's reads differ"
    assert start == min(set(range(run.n + 1)) - done.get(e0, set()))


# -- strategies ----------------------------------------------------------------------------
RUNS = st.builds(
    Run,
    n=st.integers(0, 300),
    shuffle=st.booleans(),
    shuffle_block=st.sampled_from([1, 1, 2, 3, 7]),
    seed=st.integers(0, 2**40),
    num_epochs=st.integers(1, 3),
    drop_last=st.sampled_from([False, True, "pad"]),
)
GRIDS = st.builds(
    Grid, batch_size=st.integers(1, 12), num_shards=st.integers(1, 8), blocked=st.booleans()
)


@dataclass(frozen=True)
class Case:
    run: Run
    old: Grid
    new: Grid
    steps: tuple[int, ...]  # batches each old shard reads before the cut
    saved: int = 0  # lock-step: the shard whose state is loaded
    merge_order: tuple[int, ...] = ()  # the order of the states given to merge_states


def batches_per_shard(run: Run, grid: Grid) -> list[int]:
    return [grid.layout(run.n, s, run.drop_last).num_batches for s in range(grid.num_shards)]


@st.composite
def lockstep_cases(draw: st.DrawFn) -> Case:
    run, old, new = draw(RUNS), draw(GRIDS), draw(GRIDS)
    total = max(batches_per_shard(run, old)) * run.num_epochs
    inside = st.integers(min(1, total), max(min(1, total), total - 1))  # a cut mid-run
    steps = draw(st.one_of(inside, st.integers(0, total + 1)))
    saved = draw(st.integers(0, old.num_shards - 1))
    return Case(run, old, new, (steps,) * old.num_shards, saved)


@st.composite
def scattered_cases(draw: st.DrawFn) -> Case:
    run, old, new = draw(RUNS), draw(GRIDS), draw(GRIDS)
    steps = tuple(
        draw(st.one_of(st.integers(0, nb * run.num_epochs), st.integers(0, nb + 1)))
        for nb in batches_per_shard(run, old)
    )
    merge_order = tuple(draw(st.permutations(range(old.num_shards))))
    return Case(run, old, new, steps, merge_order=merge_order)


def cut(case: Case) -> tuple[list[list[Read]], list[dict[str, Any]]]:
    """The old shards' reads up to the cut, and their states (JSON round-tripped)."""
    shards = case.old.loaders(case.run)
    reads = [
        read_from_start(case.run, case.old, s, loader, k)
        for s, (loader, k) in enumerate(zip(shards, case.steps))
    ]
    return reads, [roundtrip(loader.state_dict()) for loader in shards]


def resume(case: Case, grid: Grid, state: dict[str, Any], **options: Any) -> list[Loader]:
    shards = grid.loaders(case.run, **options)
    for loader in shards:
        loader.load_state_dict(state, reshard=True)
    return shards


# -- 1. lock-step ------------------------------------------------------------------------
ONE_TO_EIGHT = Case(
    Run(101, shuffle=True, seed=5, num_epochs=2), Grid(4, 1), Grid(3, 8), (9,), saved=0
)
EIGHT_TO_THREE = Case(
    Run(96, shuffle=True, seed=7, num_epochs=2), Grid(2, 8), Grid(5, 3, True), (4,) * 8, saved=5
)
EIGHT_TO_THREE_PAD = replace(
    EIGHT_TO_THREE, run=replace(EIGHT_TO_THREE.run, n=101, drop_last="pad")
)
EIGHT_TO_THREE_DROP = replace(
    EIGHT_TO_THREE, run=replace(EIGHT_TO_THREE.run, n=101, drop_last=True)
)


@settings(max_examples=150, deadline=None)
@given(lockstep_cases())
@example(ONE_TO_EIGHT)
@example(EIGHT_TO_THREE)
@example(EIGHT_TO_THREE_PAD)
@example(EIGHT_TO_THREE_DROP)
@example(replace(ONE_TO_EIGHT, run=replace(ONE_TO_EIGHT.run, drop_last=True)))
def test_lockstep_reshard_reads_the_rest_of_the_global_order(case: Case) -> None:
    run, old, new = case.run, case.old, case.new
    before, states = cut(case)
    cursors = {(s["epoch"], s["batch"]) for s in states}
    assert len(cursors) == 1 or old.uneven(run)  # lock-step shards stand at one cursor
    state = states[case.saved]
    assert state["version"] == 3
    assert state["global_position"] == state["batch"] * old.global_batch
    assert state["remainder"] is None
    assert "merged" not in state
    if old.uneven(run):
        # a shard other than the one that saved it (or another layout): refused; its own
        # shard on its own layout goes on exactly, as with reshard=False
        other = (case.saved + 1) % new.num_shards if new == old else 0
        with pytest.raises(LoaderStateError, match="merge_states"):
            new.loaders(run)[other].load_state_dict(state, reshard=True)
        return
    shards = resume(case, new, state)
    fresh = new.loaders(run)
    for loader, other in zip(shards, fresh):  # full epochs are described as before
        assert len(loader) == len(other)
        for e in range(run.num_epochs):
            np.testing.assert_array_equal(loader.record_indices(e), other.record_indices(e))
    after = [read(loader) for loader in shards]
    check_after(run, new, [before], after, state["epoch"])
    if run.drop_last is not False and new.global_batch == old.global_batch:
        # the same global batch: each epoch's records are the uninterrupted run's
        for e in range(run.num_epochs):
            got = sorted(
                record
                for phase in (before, after)
                for reads in phase
                for r in reads
                if r.epoch == e
                for record in r.records[r.real].tolist()
            )
            whole = sorted(
                x for loader in old.loaders(run) for x in loader.record_indices(e).tolist()
            )
            assert got == whole, f"epoch {e}"


def test_one_to_eight_and_eight_to_three_in_detail() -> None:
    """The 1 -> 8 and 8 -> 3 cases spelled out: the rest of epoch 0 continues the global
    order where the cut left it, split among the new shards."""
    run, new = ONE_TO_EIGHT.run, ONE_TO_EIGHT.new
    before, (state,) = cut(ONE_TO_EIGHT)
    assert state["global_position"] == 36
    after = [read(loader) for loader in resume(ONE_TO_EIGHT, new, state)]
    order = run.order(0)
    first = [r.records.tolist() for r in (after[s][0] for s in range(8))]
    # interleaved over 8 shards of 3: shard s reads positions 36 + s, 36 + s + 8, 36 + s + 16
    assert first == [[int(order[36 + s + 8 * j]) for j in range(3)] for s in range(8)]
    epoch0 = sorted(
        record
        for reads in [*before, *after]
        for r in reads
        if r.epoch == 0
        for record in r.records.tolist()
    )
    assert epoch0 == list(range(101))

    case = EIGHT_TO_THREE
    before, states = cut(case)
    state = states[case.saved]
    assert state["global_position"] == 4 * 16
    after = [read(loader) for loader in resume(case, case.new, state)]
    order = case.run.order(0)
    # blocked over 3 shards of 5: shard s reads positions 64 + 5 s ... 64 + 5 s + 4
    assert [after[s][0].records.tolist() for s in range(3)] == [
        order[64 + 5 * s : 69 + 5 * s].tolist() for s in range(3)
    ]
    # 32 positions left: two global batches of 15, then 2 rows for shard 0
    assert [[len(r.records) for r in after[s] if r.epoch == 0] for s in range(3)] == [
        [5, 5, 2],
        [5, 5],
        [5, 5],
    ]


# -- 2. shards cut at different points, merged -------------------------------------------
@settings(max_examples=150, deadline=None)
@given(scattered_cases())
@example(
    Case(
        Run(23, shuffle=True, seed=1, num_epochs=3),
        Grid(3, 2),
        Grid(2, 3, True),
        (5, 1),
        merge_order=(1, 0),
    )
)
def test_merged_states_of_shards_cut_anywhere_read_each_record_once(case: Case) -> None:
    run, new = case.run, case.new
    before, states = cut(case)
    merged = roundtrip(merge_states([states[s] for s in case.merge_order]))
    first_epoch = min(s["epoch"] for s in states)
    if first_epoch < run.num_epochs:
        assert merged["remainder"]["epoch"] == first_epoch
    check_merged(run, merged, read_positions(run, before))
    after = [read(loader) for loader in resume(case, new, merged)]
    check_after(run, new, [before], after, first_epoch)


# -- 3. chains ----------------------------------------------------------------------------
@st.composite
def chains(draw: st.DrawFn) -> tuple[Case, Grid, tuple[int, ...], Grid]:
    case = draw(scattered_cases())
    mid_steps = tuple(
        draw(st.integers(0, 2 * case.run.n // case.new.batch_size + 2))
        for _ in range(case.new.num_shards)
    )
    return case, case.new, mid_steps, draw(GRIDS)


@settings(max_examples=100, deadline=None)
@given(chains())
def test_chains_of_reshards_read_each_record_once(
    chain: tuple[Case, Grid, tuple[int, ...], Grid],
) -> None:
    case, mid, mid_steps, last = chain
    run = case.run
    before, states = cut(case)
    merged = roundtrip(merge_states([states[s] for s in case.merge_order]))
    middle = resume(case, mid, merged)
    mid_reads = [read(loader, k) for loader, k in zip(middle, mid_steps)]
    mid_states = [roundtrip(loader.state_dict()) for loader in middle]
    # each middle shard's reads so far are a prefix of what it would read uninterrupted
    for loader, reads in zip(resume(case, mid, merged), mid_reads):
        rest = read(loader, len(reads))
        assert [(r.epoch, r.records.tolist()) for r in rest] == [
            (r.epoch, r.records.tolist()) for r in reads
        ]
    again = roundtrip(merge_states(mid_states[::-1]))
    first_epoch = min(s["epoch"] for s in mid_states)
    check_merged(run, again, read_positions(run, before, mid_reads))
    after = [read(loader) for loader in resume(case, last, again)]
    check_after(run, last, [before, mid_reads], after, first_epoch)


@settings(max_examples=60, deadline=None)
@given(lockstep_cases(), GRIDS, st.integers(0, 30), st.data())
def test_chains_of_lockstep_single_states(
    case: Case, mid: Grid, mid_steps: int, data: st.DataObject
) -> None:
    """A resharded loader's single state stands for all its shards at its cursor, like an
    ordinary one (whole global batches: ``drop_last=True`` or ``"pad"``)."""
    case = replace(case, run=replace(case.run, drop_last=data.draw(st.sampled_from([True, "pad"]))))
    run = case.run
    before, states = cut(case)
    middle = resume(case, mid, states[case.saved])
    mid_reads = [read(loader, mid_steps) for loader in middle]
    mid_states = [roundtrip(loader.state_dict()) for loader in middle]
    assert len({(s["epoch"], s["batch"]) for s in mid_states}) == 1
    state = mid_states[data.draw(st.integers(0, mid.num_shards - 1))]
    after = [read(loader) for loader in resume(case, case.new, state)]
    check_after(run, case.new, [before, mid_reads], after, state["epoch"])


@settings(max_examples=60, deadline=None)
@given(lockstep_cases(), GRIDS, st.integers(0, 30), st.data())
def test_single_states_of_resharded_runs_without_drop_last(
    case: Case, mid: Grid, mid_steps: int, data: st.DataObject
) -> None:
    """``drop_last=False``: a resharded loader's single state is refused when the epoch it
    resumed splits into different numbers of batches per shard, and read exactly once
    from where it stands otherwise (always for one shard)."""
    run = replace(case.run, drop_last=False)
    case = replace(case, run=run, old=replace(case.old, num_shards=1), saved=0)
    before, (state,) = cut(case)
    middle = resume(case, mid, state)
    mid_reads = [read(loader, mid_steps) for loader in middle]
    mid_states = [roundtrip(loader.state_dict()) for loader in middle]
    e0 = state["epoch"]
    todo = len(expected_after(run, mid, read_positions(run, before), e0).get(e0, []))
    resumed = {mid.layout(todo, s, False).num_batches for s in range(mid.num_shards)}
    uneven = mid.uneven(run) or len(resumed) > 1
    saved = mid_states[data.draw(st.integers(0, mid.num_shards - 1))]
    target = case.new.loaders(run)[0]
    if case.new == mid and saved["shard_index"] == 0:  # its own shard and layout: exact
        target.load_state_dict(saved, reshard=True)
        assert target.state_dict() == saved
        return
    if mid.num_shards > 1 and uneven and saved["epoch"] == e0 < run.num_epochs:
        message = refusal(target, saved, reshard=True)
        assert "merge_states" in message, message
        return
    refused = ""
    try:
        target.load_state_dict(saved, reshard=True)
    except LoaderStateError as error:  # a resumed uneven epoch behind it: refused too
        refused = str(error)
    if refused:
        assert mid.num_shards > 1 and uneven and "merge_states" in refused, refused
        return
    # the state stands for every middle shard at its cursor: read each up to there
    cursor = (saved["epoch"], saved["batch"])
    mid_reads = []
    for loader in resume(case, mid, state):
        reads: list[Read] = []
        while (loader.state_dict()["epoch"], loader.state_dict()["batch"]) < cursor:
            reads += read(loader, 1)
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == cursor
        mid_reads.append(reads)
    after = [read(loader) for loader in resume(case, case.new, saved)]
    check_after(run, case.new, [before, mid_reads], after, saved["epoch"])


@pytest.mark.parametrize("merged", [False, True])
def test_endless_runs_reshard_too(merged: bool) -> None:
    """``num_epochs=None``: the epochs after the cut are read once each all the same."""
    n, epochs = 23, 4
    run = Run(n, shuffle=True, seed=4, num_epochs=epochs)  # for its order only
    old, new = Grid(3, 2), Grid(4, 3, True)
    options = {"shuffle": True, "seed": 4, "num_epochs": None, "num_threads": 0}
    before_shards = [Loader(Ids(n), 3, shard_index=s, num_shards=2, **options) for s in range(2)]
    steps = (2, 9) if merged else (5, 5)
    before = [read(loader, k) for loader, k in zip(before_shards, steps)]
    states = [roundtrip(loader.state_dict()) for loader in before_shards]
    state = merge_states(states) if merged else states[1]
    after_shards = [
        Loader(Ids(n), 4, shard_index=s, num_shards=3, shard_layout="blocked", **options)
        for s in range(3)
    ]
    for loader in after_shards:
        loader.load_state_dict(state, reshard=True)
    after = [[r for r in read(loader, 3 * epochs) if r.epoch < epochs] for loader in after_shards]
    seq = global_sequence(new, after)
    want = expected_after(run, new, read_positions(run, before), min(s["epoch"] for s in states))
    for e in range(epochs):  # 12 batches of 4 rows on each shard: past epoch 3
        assert seq.get(e, []) == want.get(e, [])
        got = [x for reads in [*before, *after] for r in reads if r.epoch == e for x in r.records]
        assert sorted(got) == list(range(n))
    assert old.global_batch != new.global_batch


# -- 4. reshard=False stays exact ---------------------------------------------------------
def rows_of(reads: list[Read]) -> list[tuple[int, list[int], list[bool], list[int] | None]]:
    return [
        (r.epoch, r.records.tolist(), r.real.tolist(), None if r.tags is None else r.tags.tolist())
        for r in reads
    ]


@settings(max_examples=60, deadline=None)
@given(scattered_cases(), st.integers(0, 40), st.data())
def test_a_resharded_loaders_own_state_resumes_it_exactly(
    case: Case, steps: int, data: st.DataObject
) -> None:
    _, states = cut(case)
    merged = roundtrip(merge_states(states))
    shard = data.draw(st.integers(0, case.new.num_shards - 1))
    loader = resume(case, case.new, merged, transform=tag)[shard]
    read(loader, steps)
    state = roundtrip(loader.state_dict())
    rest = read(loader)
    again = case.new.loaders(case.run, transform=tag)[shard]
    again.load_state_dict(state)  # reshard=False: exact
    assert rows_of(read(again)) == rows_of(rest)


@settings(max_examples=60, deadline=None)
@given(lockstep_cases())
def test_ordinary_and_version_2_states_resume_exactly_as_before(case: Case) -> None:
    run, old = case.run, case.old
    k = case.steps[0]
    whole = read(old.loaders(run, transform=tag)[case.saved])
    loader = old.loaders(run, transform=tag)[case.saved]
    read(loader, k)
    state = roundtrip(loader.state_dict())
    assert state["version"] == 3
    assert state["global_position"] == state["batch"] * old.global_batch
    assert state["remainder"] is None
    old_style = {
        key: value for key, value in state.items() if key not in ("global_position", "remainder")
    }
    version_2 = {**old_style, "version": 2}
    for saved in (state, version_2):
        again = old.loaders(run, transform=tag)[case.saved]
        again.load_state_dict(saved)
        assert rows_of(read(again)) == rows_of(whole[min(k, len(whole)) :])
    if not old.uneven(run):  # a version-2 state reshards as the same state of version 3
        for s in range(case.new.num_shards):
            shards = [case.new.loaders(run, transform=tag)[s] for _ in range(2)]
            for loader, saved in zip(shards, (state, version_2)):
                loader.load_state_dict(saved, reshard=True)
            assert rows_of(read(shards[0])) == rows_of(read(shards[1]))


# -- 5. refusals ----------------------------------------------------------------------------
BASE = Run(30, shuffle=True, seed=3, num_epochs=2, drop_last=True)
BASE_GRID = Grid(4, 2)


def base_states(run: Run = BASE, grid: Grid = BASE_GRID, steps: int = 2) -> list[dict[str, Any]]:
    shards = grid.loaders(run)
    for loader in shards:
        read(loader, steps)
    return [roundtrip(loader.state_dict()) for loader in shards]


def refusal(loader: Loader, state: Any, **options: Any) -> str:
    with pytest.raises(LoaderStateError) as info:
        loader.load_state_dict(state, **options)
    assert isinstance(info.value, ValueError)
    return str(info.value)


@pytest.mark.parametrize(
    ("key", "changed", "names"),
    [
        ("seed", {"seed": 4}, ["seed", "3", "4"]),
        ("shuffle", {"shuffle": False}, ["shuffle", "True", "False"]),
        ("num_epochs", {"num_epochs": 3}, ["num_epochs", "2", "3"]),
        ("drop_last", {"drop_last": "pad"}, ["drop_last", "True", "'pad'"]),
        ("shuffle_block", {"shuffle_block": 2}, ["shuffle_block", "2"]),
    ],
)
def test_reshard_refuses_another_order(key: str, changed: dict[str, Any], names: list[str]) -> None:
    (state, _) = base_states()
    other = replace(BASE, **changed)
    for grid in (BASE_GRID, Grid(3, 5, True)):
        message = refusal(grid.loaders(other)[0], state, reshard=True)
        assert all(name in message for name in names), message
        assert f"{key}=" in message, message


@pytest.mark.parametrize("source", [Ids(31), OtherIds(30)], ids=["length", "type"])
def test_reshard_refuses_another_source(source: Ids) -> None:
    (state, _) = base_states()
    message = refusal(Grid(3, 5).loaders(BASE, source=source)[1], state, reshard=True)
    assert "source=" in message or "num_records=" in message, message


def test_reshard_accepts_another_layout_but_reshard_false_does_not() -> None:
    (state, _) = base_states()
    for grid, key in ((Grid(3, 2), "batch_size"), (Grid(4, 3), "num_shards")):
        message = refusal(grid.loaders(BASE)[0], state)
        assert f"{key}=" in message, message
        grid.loaders(BASE)[0].load_state_dict(state, reshard=True)  # no error
    message = refusal(Grid(4, 2, True).loaders(BASE)[0], state)
    assert "shard_layout=" in message, message


def test_a_merged_state_needs_reshard() -> None:
    merged = merge_states(base_states())
    message = refusal(BASE_GRID.loaders(BASE)[0], merged)
    assert "merged" in message and "reshard=True" in message, message
    # on another layout the layout is what differs first; the message still says the fix
    message = refusal(Grid(3, 5).loaders(BASE)[2], merged)
    assert "batch_size=" in message and "reshard=True" in message, message


def test_merge_states_refuses_what_is_not_all_shards_of_one_run() -> None:
    run = replace(BASE, drop_last=False, n=31)
    grid = Grid(4, 3)
    states = base_states(run, grid)
    with pytest.raises(LoaderStateError) as info:
        merge_states([])
    assert any(word in str(info.value) for word in ("no states", "empty", "[]")), info.value
    with pytest.raises(LoaderStateError, match="shard_index") as info:
        merge_states([states[0], states[2]])
    assert "1" in str(info.value), info.value  # the missing shard
    with pytest.raises(LoaderStateError, match="shard_index") as info:
        merge_states([states[0], states[1], states[2], states[1]])
    assert "1" in str(info.value), info.value  # the shard given twice
    other = base_states(replace(run, seed=9), grid)
    with pytest.raises(LoaderStateError, match="seed") as info:
        merge_states([states[0], other[1], states[2]])
    assert "9" in str(info.value) and "3" in str(info.value), info.value
    blocked = base_states(run, Grid(4, 3, True))
    with pytest.raises(LoaderStateError, match="shard_layout"):
        merge_states([states[0], blocked[1], states[2]])
    wider = base_states(run, Grid(5, 3))
    with pytest.raises(LoaderStateError, match="batch_size"):
        merge_states([states[0], wider[1], states[2]])
    fewer = base_states(run, Grid(4, 2))
    with pytest.raises(LoaderStateError, match="num_shards"):
        merge_states([fewer[0], fewer[1], states[2]])
    longer = base_states(replace(run, n=32), grid)
    with pytest.raises(LoaderStateError, match=r"source|num_records"):
        merge_states([states[0], longer[1], states[2]])
    with pytest.raises(LoaderStateError, match=r"states\[0\] was made by merge_states"):
        merge_states([merge_states(states), *states[1:]])
    with pytest.raises(LoaderStateError, match="int"):
        merge_states([states[0], 5, states[2]])
    broken = {k: v for k, v in states[1].items() if k != "batch"}
    with pytest.raises(LoaderStateError, match="batch"):
        merge_states([states[0], broken, states[2]])


def _scattered_merged() -> dict[str, Any]:
    shards = BASE_GRID.loaders(replace(BASE, drop_last=False))
    read(shards[0], 5)  # into epoch 1
    read(shards[1], 1)
    return merge_states([roundtrip(loader.state_dict()) for loader in shards])


REMAINDER_EDITS = {
    "ranges overlap": lambda r: r["read"].append(list(r["read"][-1])),
    "ranges unsorted": lambda r: r["read"].insert(0, [1, 5, 6]),
    "range past n": lambda r: r["read"].append([1, 28, 40]),
    "empty range": lambda r: r["read"].append([1, 9, 9]),
    "negative range": lambda r: r["read"].append([1, -3, 2]),
    "range of an epoch past the run": lambda r: r["read"].append([5, 1, 2]),
    "range before the start": lambda r: r["read"].insert(0, [0, 0, 1]),
    "range of two numbers": lambda r: r["read"].append([1, 2]),
    "read not a list": lambda r: r.__setitem__("read", "x"),
    "start past n": lambda r: r.__setitem__("start", 31),
    "start negative": lambda r: r.__setitem__("start", -1),
    "start a float": lambda r: r.__setitem__("start", 3.0),
    "epoch past the run": lambda r: r.__setitem__("epoch", 3),
    "epoch a bool": lambda r: r.__setitem__("epoch", True),
    "batch negative": lambda r: r.__setitem__("batch", -1),
    "a key missing": lambda r: r.pop("batch"),
    "a key unknown": lambda r: r.__setitem__("x", 1),
}


@pytest.mark.parametrize("edit", list(REMAINDER_EDITS), ids=list(REMAINDER_EDITS))
def test_a_broken_remainder_is_refused_naming_it(edit: str) -> None:
    merged = _scattered_merged()
    assert merged["remainder"]["epoch"] == 0 and merged["remainder"]["read"][-1][0] == 1
    REMAINDER_EDITS[edit](merged["remainder"])
    message = refusal(Grid(3, 3).loaders(replace(BASE, drop_last=False))[0], merged, reshard=True)
    assert "remainder" in message, message


def test_a_global_position_that_does_not_match_the_cursor_is_refused() -> None:
    (state, _) = base_states()
    for position in (7, state["global_position"] + 1, 10**6):
        for reshard, grid in ((False, BASE_GRID), (True, Grid(3, 3))):
            bad = {**state, "global_position": position}
            message = refusal(grid.loaders(BASE)[0], bad, reshard=reshard)
            assert f"global_position={position}" in message, message


def test_a_single_state_of_uneven_shards_is_refused() -> None:
    run = Run(25, shuffle=True, seed=3, num_epochs=2)  # 25 rows over 2 shards of 4: 4 and 3
    grid = Grid(4, 2)
    assert grid.uneven(run)
    (state, _) = base_states(run, grid)
    for loader in (Grid(3, 3).loaders(run)[0], grid.loaders(run)[1]):
        message = refusal(loader, state, reshard=True)
        assert "merge_states" in message, message
    own = grid.loaders(run)[0]  # its own shard and layout: exact, as with reshard=False
    own.load_state_dict(state, reshard=True)
    assert own.state_dict() == state
    # the same state still resumes its own shard with reshard=False, and merged it reshards
    grid.loaders(run)[0].load_state_dict(state)
    Grid(3, 3).loaders(run)[0].load_state_dict(merge_states(base_states(run, grid)), reshard=True)
    # one shard is never uneven
    (single,) = base_states(run, Grid(4, 1))
    Grid(3, 3).loaders(run)[0].load_state_dict(single, reshard=True)


def test_the_public_names() -> None:
    assert mixle.merge_states is merge_states is mixle.loading.merge_states
    assert issubclass(LoaderStateError, ValueError)


# -- 6. transforms' batch numbers ----------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(lockstep_cases())
def test_transform_batch_numbers(case: Case) -> None:
    run, old, new = case.run, case.old, case.new
    if old.uneven(run):
        return
    _, states = cut(case)
    state = states[case.saved]
    # the same layout: reshard=True is reshard=False, rng included
    shard = case.saved
    same = old.loaders(run, transform=tag)[shard]
    same.load_state_dict(state, reshard=True)
    exact = old.loaders(run, transform=tag)[shard]
    exact.load_state_dict(state)
    assert rows_of(read(same)) == rows_of(read(exact))
    # another layout: epoch e0 counts from global_position // G', later epochs from 0
    b0 = state["global_position"] // new.global_batch
    for s, loader in enumerate(resume(case, new, state, transform=tag)):
        for r in read(loader):
            number = r.number + (b0 if r.epoch == state["epoch"] else 0)
            want = expected_tag(run.seed, r.epoch, number, s)
            assert r.tags is not None and set(r.tags.tolist()) == {want}, (r, number)


@settings(max_examples=60, deadline=None)
@given(scattered_cases())
def test_transform_batch_numbers_of_merged_states(case: Case) -> None:
    run, new = case.run, case.new
    _, states = cut(case)
    merged = merge_states(states)
    if merged["remainder"] is None:  # every shard finished: nothing left to number
        assert all(s["epoch"] == run.num_epochs for s in states)
        return
    e0 = merged["remainder"]["epoch"]
    same = (merged["batch_size"], merged["num_shards"], merged["shard_layout"]) == (
        new.batch_size,
        new.num_shards,
        new.name,
    )
    b0 = merged["batch"] if same else merged["global_position"] // new.global_batch
    for s, loader in enumerate(resume(case, new, merged, transform=tag)):
        for r in read(loader):
            number = r.number + (b0 if r.epoch == e0 else 0)
            want = expected_tag(run.seed, r.epoch, number, s)
            assert r.tags is not None and set(r.tags.tolist()) == {want}, (r, number)


# -- 7. worker processes ------------------------------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        Case(
            Run(57, shuffle=True, shuffle_block=3, seed=4, num_epochs=2, drop_last="pad"),
            Grid(3, 2),
            Grid(4, 3, True),
            (7, 7),
        ),
        Case(
            Run(61, shuffle=True, seed=8, num_epochs=2),
            Grid(4, 3),
            Grid(5, 2),
            (3, 9, 16),
            merge_order=(2, 0, 1),
        ),
    ],
    ids=["lockstep-pad", "merged"],
)
def test_worker_processes_on_both_sides_read_the_same_batches(case: Case) -> None:
    workers = {"num_workers": 2, "worker_start_method": "fork", "transform": tag, "timeout": 60}
    results = []
    for options in ({"transform": tag}, workers):
        shards = case.old.loaders(case.run, **options)
        before = [rows_of(read(loader, k)) for loader, k in zip(shards, case.steps)]
        states = [roundtrip(loader.state_dict()) for loader in shards]
        state = merge_states(states) if case.merge_order else states[0]
        after = [rows_of(read(loader)) for loader in resume(case, case.new, state, **options)]
        results.append((before, after))
    assert results[0] == results[1]
    assert any(results[0][1])  # something was read after the cut


# -- 8. JaxLoader ----------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_jax_loader_reshards_like_the_loader() -> None:
    assert_child_passes(Path(__file__).with_name("_jax_elastic_cases.py"), timeout=300)
