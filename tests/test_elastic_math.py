"""Index math of elastic resume against brute force: remainders, lock-step and merged cursors."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.index_math.elastic import (
    Remainder,
    Resume,
    ShardCursor,
    lockstep_resume,
    merge_cursors,
    merge_ranges,
    span_of,
    uneven_shards,
)
from mixle.data.index_math.sharding import ShardLayout, plan_shards

DROP = st.sampled_from([False, True, "pad"])


@st.composite
def remainders(draw: st.DrawFn) -> tuple[Remainder, list[int]]:
    """A remainder and, by brute force, the real positions it keeps, in order."""
    n = draw(st.integers(0, 80))
    start = draw(st.integers(0, n))
    cuts = sorted(draw(st.lists(st.integers(start, n), max_size=8)))
    skip = list(zip(cuts[::2], cuts[1::2], strict=False))
    rem = Remainder(n, draw(st.integers(1, 9)), draw(DROP), start, tuple(skip))
    kept = [p for p in range(start, n) if not any(a <= p < b for a, b in skip)]
    return rem, kept


@settings(max_examples=300, deadline=None)
@given(remainders())
def test_a_remainder_reads_the_kept_positions_in_order_cut_or_padded(
    case: tuple[Remainder, list[int]],
) -> None:
    rem, kept = case
    g, n = rem.global_batch, rem.num_records
    assert rem.kept == len(kept)
    expected = {
        False: kept,
        True: kept[: len(kept) // g * g],
        "pad": kept + list(range(n, n + (-len(kept)) % g)),
    }[rem.drop_last]
    assert rem.positions(np.arange(rem.length)).tolist() == expected
    for rows in range(rem.length + 2):
        assert rem.cursor(rows) == (kept[rows] if rows < len(kept) else n)
        covered = {p for a, b in rem.prefix_ranges(rows) for p in range(a, b)}
        assert covered == set(kept[:rows])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=10))
def test_merge_ranges_covers_the_same_positions_sorted_and_apart(pairs) -> None:
    merged = merge_ranges(pairs)
    assert {p for a, b in merged for p in range(a, b)} == {p for a, b in pairs for p in range(a, b)}
    assert all(a < b for a, b in merged)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(merged))


@st.composite
def layouts(draw: st.DrawFn) -> ShardLayout:
    shards = draw(st.integers(1, 5))
    return ShardLayout(
        draw(st.integers(0, 70)),
        draw(st.integers(1, 6)),
        0,
        shards,
        draw(DROP),
        blocked=draw(st.booleans()),
    )


def member(layout: ShardLayout, s: int) -> ShardLayout:
    return ShardLayout(
        layout.num_records,
        layout.batch_size,
        s,
        layout.num_shards,
        layout.drop_last,
        blocked=layout.blocked,
    )


def read_by(layout: ShardLayout, resume: Resume | None, cursor: ShardCursor) -> set[tuple]:
    """Brute force: ``(epoch, position)`` of the real positions a shard at ``cursor`` read
    in the run ``resume`` started, walking its batches one by one."""
    shard = member(layout, cursor.shard_index)
    seen: set[tuple] = set()
    if resume is not None:  # what the run before the resume read
        seen |= {(e, p) for e in range(resume.epoch) for p in range(layout.num_records)}
        seen |= {(resume.epoch, p) for p in range(resume.start)}
        seen |= {(e, p) for e, a, b in resume.read for p in range(a, b)}
    epoch = resume.epoch if resume is not None else 0
    batch = resume.batch if resume is not None else 0
    while (epoch, batch) < (cursor.epoch, cursor.batch):
        rem, first, end = span_of(shard, resume, epoch)
        if batch >= end:
            epoch, batch = epoch + 1, span_of(shard, resume, epoch + 1)[1]
            continue
        if rem is None:
            positions = shard.positions(batch, batch + 1)
        else:
            positions = rem.shard_positions(shard, batch - first, batch - first + 1)
        seen |= {(epoch, int(p)) for p in positions if p < layout.num_records}
        batch += 1
    return seen


@st.composite
def stops(draw: st.DrawFn, layout: ShardLayout, resume: Resume | None) -> list[ShardCursor]:
    """Where each shard of ``layout`` stopped: any batch of epoch 0 to 2 of the run."""
    cursors = []
    for s in range(layout.num_shards):
        epoch = draw(st.integers(resume.epoch if resume else 0, 2))
        _, first, end = span_of(member(layout, s), resume, epoch)
        cursors.append(ShardCursor(s, epoch, draw(st.integers(first, max(first, end - 1)))))
    return cursors


def resume_state(layout: ShardLayout, resume: Resume) -> set[tuple]:
    """``(epoch, position)`` a ``Resume`` says are read, from its epoch on (the epochs
    before it are over, whatever ``drop_last`` left out of them)."""
    seen = {(resume.epoch, p) for p in range(resume.start)}
    return seen | {(e, p) for e, a, b in resume.read for p in range(a, b)}


def from_epoch(seen: set[tuple], epoch: int) -> set[tuple]:
    return {(e, p) for e, p in seen if e >= epoch}


@settings(max_examples=250, deadline=None)
@given(st.data())
def test_merged_cursors_say_exactly_what_every_shard_read(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    cursors = data.draw(stops(layout, None))
    merged = merge_cursors(layout, None, cursors)
    truth = from_epoch(set().union(*(read_by(layout, None, c) for c in cursors)), merged.epoch)
    assert resume_state(layout, merged) == truth
    assert merged.epoch == min(c.epoch for c in cursors)
    assert (merged.epoch, merged.start) not in truth  # the cursor is a position not read
    # merging again, after the new shards (same layout) read on from the merged state
    again = data.draw(stops(layout, merged))
    remerged = merge_cursors(layout, merged, again)
    truth = set().union(*(read_by(layout, merged, c) for c in again))
    assert resume_state(layout, remerged) == from_epoch(truth, remerged.epoch)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_lockstep_cursor_is_the_merge_of_every_shard_standing_there(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    epoch = data.draw(st.integers(0, 2))
    nb = max(member(layout, s).num_batches for s in range(layout.num_shards))
    batch = data.draw(st.integers(0, max(0, nb - 1)))
    if uneven_shards(layout, None):
        # the shards' counts differ, so one cursor cannot stand for all; nothing to check
        assert layout.drop_last is False
        return
    lockstep = lockstep_resume(layout, None, epoch, batch)
    everyone = [ShardCursor(s, epoch, batch) for s in range(layout.num_shards)]
    assert resume_state(layout, lockstep) == resume_state(
        layout, merge_cursors(layout, None, everyone)
    )
    assert lockstep.batch == batch


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200), st.integers(1, 9), st.integers(1, 9), st.integers(1, 4))
def test_encoded_data_shards_of_any_worker_count_cover_the_index_space_once(
    n: int, workers: int, other: int, sub_chunks: int
) -> None:
    """Worker-resident data rebuilt with another worker count holds the same records."""
    for count in (workers, other):
        plan = plan_shards(list(range(n)), n, count, sub_chunks)
        held = np.concatenate([plan.shard_indices(w) for w in range(count)])
        assert sorted(held.tolist()) == list(range(n))
