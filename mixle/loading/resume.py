"""Elastic resume: the cursor keys of a Loader state, resharding a state, merging shards' states.

A Loader state says where its shard stands (``epoch``, ``batch``, ``position``) and, in
``global_position``, the first position of the epoch's global order no shard has read if
every shard stands there too. ``remainder`` is ``None`` for a run that started at the
beginning, else where the resumed run started (:class:`~mixle.data.index_math.elastic.
Resume`): its epoch, global position, first batch number and the ranges read past it.
``load_state_dict(state, reshard=True)`` continues a state on another batch size or shard
layout from that global cursor; :func:`merge_states` makes one exact state of every
shard's, for shards that stopped at different batches.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from mixle.data.index_math.elastic import (
    Remainder,
    Resume,
    ShardCursor,
    lockstep_resume,
    merge_cursors,
    span_of,
    uneven_shards,
)
from mixle.data.index_math.sharding import ShardLayout
from mixle.errors import LoaderStateError
from mixle.loading.state import (
    OPTIONAL_STATE_KEYS,
    STATE_KEYS,
    STATE_VERSION,
    check_cursor,
    check_mapping,
    check_state,
    int_at_least,
    show,
)

__all__ = [
    "CURSOR_KEYS",
    "MERGE_MAX_EPOCHS_APART",
    "ResumedRun",
    "merge_states",
    "normalize_cursor",
    "resharded",
    "resume_of",
    "saved_layout",
]

#: How many epochs apart the shards given to :func:`merge_states` may stand.
MERGE_MAX_EPOCHS_APART = 16
#: State keys that say where a shard stands; the others say which run it belongs to.
CURSOR_KEYS = ("shard_index", "epoch", "batch", "position", "global_position", "remainder")
_REMAINDER_KEYS = ("epoch", "start", "batch", "read")
_FIX = "pass the dict Loader.state_dict() or mixle.merge_states() returned"
_is_int = int_at_least(0)


def saved_layout(state: Mapping[str, Any]) -> ShardLayout:
    """The shard layout a checked ``state`` was saved with.

    Raises
    ------
    LoaderStateError
        Its ``shard_index`` is not below its ``num_shards``.
    """
    if operator.index(state["shard_index"]) >= operator.index(state["num_shards"]):
        raise LoaderStateError(
            f"state shard_index={state['shard_index']!r} is not valid for its "
            f"num_shards={state['num_shards']!r}: shard_index must be below num_shards; {_FIX}"
        )
    return ShardLayout(
        operator.index(state["num_records"]),
        operator.index(state["batch_size"]),
        operator.index(state["shard_index"]),
        operator.index(state["num_shards"]),
        state["drop_last"],
        blocked=state["shard_layout"] == "blocked",
    )


def _bad(value: object, why: str) -> LoaderStateError:
    return LoaderStateError(f"state remainder={show(value)} is not valid: {why}; {_FIX}")


def resume_of(state: Mapping[str, Any], num_epochs: int | None) -> Resume | None:
    """The :class:`Resume` in a checked ``state``'s ``remainder`` (``None`` when it has none).

    Raises
    ------
    LoaderStateError
        The remainder is not a dict of the keys ``epoch``, ``start``, ``batch`` and
        ``read``, an int is out of range, a read range is not ``[epoch, start, stop]``
        inside the epoch and past ``start``, or the ranges are not sorted and disjoint.
    """
    value = state.get("remainder")
    if value is None:
        return None
    if set(value) != set(_REMAINDER_KEYS):
        raise _bad(value, f"it must have exactly the keys {list(_REMAINDER_KEYS)}")
    n = operator.index(state["num_records"])
    for key in ("epoch", "start", "batch"):
        if not _is_int(value[key]):
            raise _bad(value, f"{key}={show(value[key])} must be an int >= 0")
    epoch, start = operator.index(value["epoch"]), operator.index(value["start"])
    if start > n:
        raise _bad(value, f"start={start} is past num_records={n}")
    if epoch > operator.index(state["epoch"]):
        raise _bad(value, f"epoch={epoch} is after the state's epoch={state['epoch']}")
    read = value["read"]
    if not isinstance(read, (list, tuple)):
        raise _bad(value, f"read={show(read)} must be a list of [epoch, start, stop]")
    ranges: list[tuple[int, int, int]] = []
    for item in read:
        if not (
            isinstance(item, (list, tuple)) and len(item) == 3 and all(_is_int(v) for v in item)
        ):
            raise _bad(value, f"read range {show(item)} must be [epoch, start, stop] of ints >= 0")
        e, a, b = (operator.index(v) for v in item)
        if not (a < b <= n and e >= epoch and (e > epoch or a >= start)):
            raise _bad(
                value,
                f"read range {show(item)} must have start < stop <= num_records={n}, in "
                f"epoch {epoch} at or past start={start} or in a later epoch",
            )
        if num_epochs is not None and e >= num_epochs:
            raise _bad(value, f"read range {show(item)} is past num_epochs={num_epochs}")
        if e > epoch + MERGE_MAX_EPOCHS_APART:  # no merge or reshard writes one farther
            raise _bad(
                value,
                f"read range {show(item)} is more than {MERGE_MAX_EPOCHS_APART} epochs "
                f"after epoch={epoch}",
            )
        if ranges and (e, a) < ranges[-1][:2]:
            raise _bad(value, "the read ranges must be sorted by epoch and start")
        if ranges and e == ranges[-1][0] and a < ranges[-1][2]:
            raise _bad(value, f"read range {show(item)} overlaps the one before it")
        ranges.append((e, a, b))
    return Resume(epoch, start, operator.index(value["batch"]), tuple(ranges))


def remainder_dict(resume: Resume | None) -> dict[str, Any] | None:
    """``resume`` as a state's ``remainder`` (JSON-able: lists, ints)."""
    if resume is None:
        return None
    return {
        "epoch": resume.epoch,
        "start": resume.start,
        "batch": resume.batch,
        "read": [list(r) for r in resume.read],
    }


class ResumedRun:
    """A Loader's :class:`Resume` (``None``: a run from the beginning) and the cursor keys
    of its states, each epoch's span worked out once (``JaxLoader`` asks for the state
    every batch)."""

    def __init__(self, layout: ShardLayout, resume: Resume | None) -> None:
        self.layout, self.resume = layout, resume
        self._spans: dict[int, tuple[Remainder | None, int, int]] = {}
        self._shared = remainder_dict(resume)  # for states nobody outside mixle sees

    def span(self, epoch: int) -> tuple[Remainder | None, int, int]:
        """:func:`~mixle.data.index_math.elastic.span_of` of this shard in ``epoch``."""
        if self.resume is None:
            return None, 0, self.layout.num_batches
        if epoch not in self._spans:
            if len(self._spans) > 8:
                self._spans.clear()
            self._spans[epoch] = span_of(self.layout, self.resume, epoch)
        return self._spans[epoch]

    def cursor_state(self, epoch: int, batch: int, *, copy: bool = True) -> dict[str, Any]:
        """The ``position``, ``global_position`` and ``remainder`` keys at ``(epoch,
        batch)``. With ``copy`` the remainder's lists are the state's own (a caller may
        change them; the cost grows with the read ranges); without,
        they are shared by every such state of the run, for mixle's own bookkeeping
        (``JaxLoader`` keeps a state per batch)."""
        layout = self.layout
        rem, first, _ = self.span(epoch)
        shard = layout if rem is None else rem.shard_layout(layout)
        rows = (batch - first) * layout.global_batch_size
        if copy or self._shared is None:
            remainder = remainder_dict(self.resume)
        else:
            remainder = dict(self._shared)
        return {
            "position": min((batch - first) * layout.batch_size, shard.shard_length),
            "global_position": min(rows, layout.num_records) if rem is None else rem.cursor(rows),
            "remainder": remainder,
        }


def check_cursor_keys(
    state: Mapping[str, Any], num_epochs: int | None
) -> tuple[ShardLayout, Resume | None, int, int]:
    """The saved layout, resume and ``(epoch, batch)`` of a checked ``state``, after
    checking its cursor keys against each other (:func:`~mixle.loading.state.check_cursor`,
    and ``global_position`` where the state has it)."""
    layout = saved_layout(state)
    resume = resume_of(state, num_epochs)
    epoch = operator.index(state["epoch"])
    rem, first, end = span_of(layout, resume, epoch)
    shard = layout if rem is None else rem.shard_layout(layout)
    epoch, batch = check_cursor(
        state, end, num_epochs, layout.batch_size, shard.shard_length, first
    )
    if "global_position" in state:
        expected = lockstep_resume(layout, resume, epoch, batch).start
        if operator.index(state["global_position"]) != expected:
            raise LoaderStateError(
                f"state global_position={state['global_position']!r} does not match "
                f"epoch={epoch}, batch={batch}: expected global_position={expected}; {_FIX}"
            )
    return layout, resume, epoch, batch


def resharded(
    state: Mapping[str, Any],
    saved: ShardLayout,
    resume: Resume | None,
    cursor: tuple[int, int],
    layout: ShardLayout,
) -> tuple[Resume | None, int, int]:
    """Where ``layout`` continues a checked ``state`` (saved with ``saved``, at ``cursor``)
    with ``reshard=True``: its resume and ``(epoch, batch)``.

    A merged state gives its own remainder. A single state stands for every shard at its
    cursor: on a layout with the state's batch size, shard count and shard layout, each
    shard goes on from there in the state's run (the shard that saved it exactly as with
    ``reshard=False``), so every shard carries the same remainder; on another, the run
    continues at the state's global cursor, its batches numbered from
    ``global_position // (batch_size * num_shards)``.

    Raises
    ------
    LoaderStateError
        A single shard's state, for another shard, of a run whose shards read different
        numbers of batches in some epoch (``drop_last=False``): it does not say where the
        other shards stand; a merged state whose remainder does not start at its cursor.
    """
    epoch, batch = cursor
    same = (saved.batch_size, saved.num_shards, saved.blocked) == (
        layout.batch_size,
        layout.num_shards,
        layout.blocked,
    )
    if state.get("merged", False):
        if resume is None or (resume.epoch, resume.batch) != cursor:
            raise LoaderStateError(
                f"state has 'merged': True but remainder={show(state.get('remainder'))} "
                f"does not start at its epoch={epoch}, batch={batch}, as merge_states() "
                f"writes; {_FIX}"
            )
        origin = resume
    elif saved == layout:
        return resume, epoch, batch  # the shard that saved it: exactly as without reshard
    else:
        if saved.num_shards > 1 and uneven_shards(saved, resume):
            raise LoaderStateError(
                f"cannot reshard one shard's state: with drop_last=False the "
                f"{saved.num_shards} shards of batch_size={saved.batch_size} over "
                f"num_records={saved.num_records} read different numbers of batches in an "
                "epoch (a whole one, or one a resharded run resumed or a merged state "
                "lists), so shards in lock step stand at different cursors and state "
                f"shard_index={saved.shard_index} (epoch={epoch}, batch={batch}) does not "
                "say where the others are; pass mixle.merge_states([...]) of every shard's "
                "state instead (or, on the same layout, load each shard's own state)"
            )
        if same:  # the same global batches: every shard goes on in the state's run
            return resume, epoch, batch
        origin = lockstep_resume(saved, resume, epoch, batch)
    first = origin.batch if same else origin.start // layout.global_batch_size
    if origin.start == 0 and not origin.read and first == 0:
        return None, origin.epoch, 0  # the epoch from its beginning: an ordinary run
    return Resume(origin.epoch, origin.start, first, origin.read), origin.epoch, first


def normalize_cursor(
    layout: ShardLayout, resume: Resume | None, epoch: int, batch: int, num_epochs: int | None
) -> tuple[int, int]:
    """``(epoch, batch)``, moved to the next epoch's start while it is at an epoch's end."""
    while layout.num_batches and (num_epochs is None or epoch < num_epochs):
        _, _, end = span_of(layout, resume, epoch)
        if batch < end:
            break
        epoch += 1
        batch = span_of(layout, resume, epoch)[1]
    return epoch, batch


def _alone(state: object, number: int) -> Mapping[str, Any]:
    """``state`` checked on its own (keys, values, version), for :func:`merge_states`."""
    state = check_mapping(state, "Loader.state_dict()")
    if state.get("stream") is True:
        raise LoaderStateError(
            f"states[{number}] is a stream Loader's state (it has 'stream': True); "
            "merge_states() merges states of Loaders over map-style sources (a stream "
            "Loader reshards from one state taken in lock step)"
        )
    expected: dict[str, Any] = {key: state.get(key) for key in STATE_KEYS}
    expected |= {key: state[key] for key in OPTIONAL_STATE_KEYS if key in state}
    expected["version"] = STATE_VERSION
    try:
        check_state(state, expected)
    except LoaderStateError as exc:
        raise LoaderStateError(f"states[{number}]: {exc}") from None
    try:
        saved_layout(state)
    except LoaderStateError as exc:
        raise LoaderStateError(f"states[{number}]: {exc}") from None
    if state.get("merged", False):
        raise LoaderStateError(
            f"states[{number}] was made by merge_states() already; pass the states "
            "Loader.state_dict() returned on each shard"
        )
    return state


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One exact state of every shard's state of a run, for ``load_state_dict(merged,
    reshard=True)`` on any number of new shards.

    Parameters
    ----------
    states
        ``Loader.state_dict()`` (or ``JaxLoader.state_dict()``) of each shard ``0`` to
        ``num_shards - 1`` of one run, in any order, taken wherever each shard stopped:
        shards may stand at different batches, even different epochs.

    Returns
    -------
    dict
        A state (with ``"merged": True``) whose ``remainder`` is the first position of the
        earliest unfinished epoch no shard has read and every position range read past it.
        Loaded with ``reshard=True``, every new shard reads exactly the records no old
        shard read (see ``docs/loader.md``). Its size grows with how far apart the shards
        stopped (with interleaved shards, a range per record read past the slowest shard).

    Raises
    ------
    LoaderStateError
        ``states`` is empty, a state is not a Loader state or was merged already, a shard
        index is missing or given twice, or the states are of different runs (another
        source, order, batch or shard layout); the message names the states and the key.
    """
    if isinstance(states, (Mapping, str, bytes)) or not isinstance(states, Iterable):
        got = "one state" if isinstance(states, Mapping) else show(states)
        raise LoaderStateError(
            f"merge_states() takes a list of every shard's state, got {got}; pass "
            "[state_of_shard_0, state_of_shard_1, ...]"
        )
    listed = [_alone(state, i) for i, state in enumerate(states)]
    if not listed:
        raise LoaderStateError("merge_states() got no states; pass every shard's state")
    first = listed[0]
    run_keys = [k for k in first if k not in CURSOR_KEYS and k != "version"]
    for i, state in enumerate(listed[1:], start=1):
        for key in run_keys + [k for k in state if k not in first]:
            if state.get(key) != first.get(key):
                raise LoaderStateError(
                    f"states[{i}] {key}={show(state.get(key))} but states[0] "
                    f"{key}={show(first.get(key))}: the states are of different runs; pass "
                    "the states of the shards of one run"
                )
    shards = operator.index(first["num_shards"])
    indices = [operator.index(s["shard_index"]) for s in listed]
    missing = sorted(set(range(shards)) - set(indices))
    twice = sorted(i for i, count in Counter(indices).items() if count > 1)
    if missing or twice:
        raise LoaderStateError(
            f"merge_states() needs the state of each of the num_shards={shards} shards once: "
            + (f"shard_index {missing} missing" if missing else "")
            + ("; " if missing and twice else "")
            + (f"shard_index {twice} given more than once" if twice else "")
        )
    num_epochs = first["num_epochs"]
    checked = [check_cursor_keys(s, num_epochs) for s in listed]
    resumes = {r for _, r, _, _ in checked}  # Resume is a frozen dataclass: hashable
    if len(resumes) > 1:
        raise LoaderStateError(
            "the states' remainders differ (shards resumed from different states, or some "
            "resumed and some not): the states are of different runs; pass the states of "
            "the shards of one run"
        )
    resume = checked[0][1]
    epochs = [epoch for _, _, epoch, _ in checked]
    if max(epochs) - min(epochs) > MERGE_MAX_EPOCHS_APART:
        raise LoaderStateError(
            f"the shards stand {max(epochs) - min(epochs)} epochs apart (epochs "
            f"{min(epochs)} and {max(epochs)}); merge_states() takes shards at most "
            f"{MERGE_MAX_EPOCHS_APART} epochs apart (a merged state lists every range read "
            "past the slowest shard)"
        )
    base = saved_layout({**first, "shard_index": 0})
    cursors = [ShardCursor(s.shard_index, e, b) for s, _, e, b in checked]
    merged = merge_cursors(base, resume, cursors)
    out = {key: first[key] for key in first if key not in CURSOR_KEYS}
    out |= {
        "version": STATE_VERSION,
        "shard_index": 0,
        "epoch": merged.epoch,
        "batch": merged.batch,
    }
    out |= ResumedRun(base, merged).cursor_state(merged.epoch, merged.batch)
    out["remainder"] = remainder_dict(merged)
    out["merged"] = True
    return {key: out[key] for key in (*STATE_KEYS, "shuffle_block", "merged") if key in out}
