"""What is left of an epoch after a resume onto another shard layout, and merging shards' cursors.

An epoch's global order is ``n`` positions (:mod:`mixle.data.index_math.sharding`). A run
resumed at global position ``C``, with some positions past ``C`` already read (shards that
stopped at different batches), reads the **remainder**: the positions of ``[C, n)`` not yet
read, in increasing order, cut to whole global batches of the new layout
(``drop_last=True``) or padded to them (``"pad"``: padding positions ``n, n + 1, ...``). The
new shards split those ``L`` positions like a fresh epoch of ``L`` positions. With no
position read past ``C`` and ``C`` a multiple of the global batch (shards in lock step),
the remainder is exactly the rest of the uninterrupted epoch.

A :class:`Resume` is where a resumed run started: its epoch, ``C``, the batch number it
counts from and the position ranges already read. :func:`lockstep_resume` gives the
``Resume`` of one shard's cursor standing for all shards; :func:`merge_cursors` the exact
one of every shard's cursor. Pure functions of integers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.sharding import DropLast, ShardLayout

__all__ = [
    "ReadRange",
    "Remainder",
    "Resume",
    "ShardCursor",
    "lockstep_resume",
    "merge_cursors",
    "merge_ranges",
    "span_of",
    "uneven_shards",
]

#: ``(epoch, start, stop)``: positions ``[start, stop)`` of ``epoch``'s global order.
ReadRange = tuple[int, int, int]


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` ranges sorted, with overlapping or touching ones joined
    and empty ones dropped."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _runs(positions: NDArray[np.int64]) -> list[tuple[int, int]]:
    """Sorted unique ``positions`` as half-open ranges of consecutive values."""
    if positions.size == 0:
        return []
    values = np.unique(positions)
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts = np.concatenate(([values[0]], values[breaks]))
    stops = np.concatenate((values[breaks - 1], [values[-1]])) + 1
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


@dataclass(frozen=True)
class Remainder:
    """The positions one epoch still reads, in order: ``[start, n)`` minus ``skip``, cut
    (``drop_last=True``) or padded (``"pad"``) to whole global batches of ``global_batch``.

    ``kept`` is the count of real positions left, ``length`` the count read (padding
    included). A fresh epoch is ``Remainder(n, G, drop_last)``: position ``j`` is ``j``.
    """

    num_records: int
    global_batch: int
    drop_last: DropLast
    start: int = 0
    skip: tuple[tuple[int, int], ...] = ()
    kept: int = field(init=False)
    length: int = field(init=False)
    _gaps_before: NDArray[np.int64] = field(init=False, repr=False, compare=False)
    _skipped: NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n, start = self.num_records, self.start
        skip = tuple(
            (max(a, start), min(b, n)) for a, b in merge_ranges(self.skip) if b > start and a < n
        )
        lengths = np.array([b - a for a, b in skip], dtype=np.int64)
        starts = np.array([a for a, _ in skip], dtype=np.int64)
        skipped = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        kept = max(0, n - start) - int(skipped[-1])
        g = self.global_batch
        length = {False: kept, True: kept // g * g, "pad": -(-kept // g) * g}[self.drop_last]
        for name, value in (
            ("skip", skip),
            ("kept", kept),
            ("length", length),
            ("_gaps_before", starts - start - skipped[:-1]),  # kept positions before each
            ("_skipped", skipped),
        ):
            object.__setattr__(self, name, value)

    def positions(self, rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """Global positions of remainder rows ``rows`` (``0 <= row < length``); rows past
        ``kept`` are padding, ``n, n + 1, ...``."""
        rows = np.asarray(rows, dtype=np.int64)
        before = np.searchsorted(self._gaps_before, rows, side="right")
        real = self.start + rows + self._skipped[before]
        return np.where(rows < self.kept, real, self.num_records + rows - self.kept)

    def cursor(self, rows: int) -> int:
        """The first real position not among the first ``rows`` rows (``n`` when all are)."""
        if rows >= self.kept:
            return self.num_records
        return int(self.positions(np.array([rows]))[0])

    def prefix_ranges(self, rows: int) -> list[tuple[int, int]]:
        """The real positions of the first ``rows`` rows, as ranges."""
        rows = min(rows, self.kept)
        if rows <= 0:
            return []
        out, lo = [], self.start
        for a, b in self.skip:
            if a - lo >= rows:
                break
            out.append((lo, a))
            rows -= a - lo
            lo = b
        out.append((lo, lo + rows))
        return merge_ranges(out)

    def shard_layout(self, layout: ShardLayout) -> ShardLayout:
        """``layout``'s shard of the remainder, as a layout of ``length`` positions (its
        positions index the remainder's rows)."""
        return ShardLayout(
            self.length,
            layout.batch_size,
            layout.shard_index,
            layout.num_shards,
            False,
            blocked=layout.blocked,
        )

    def shard_positions(self, layout: ShardLayout, start: int, stop: int) -> NDArray[np.int64]:
        """Global positions of ``layout``'s remainder batches ``[start, stop)``."""
        return self.positions(self.shard_layout(layout).positions(start, stop))


@dataclass(frozen=True)
class Resume:
    """Where a resumed run started: ``epoch`` from global position ``start``, its batches
    numbered from ``batch``, with the position ranges ``read`` (``(epoch, start, stop)``, in
    ``epoch`` at or past ``start``, or in a later epoch) already read."""

    epoch: int
    start: int
    batch: int
    read: tuple[ReadRange, ...] = ()

    def covers(self, epoch: int) -> bool:
        """Whether ``epoch`` is not a fresh epoch: the resumed one, or one with ranges read."""
        return epoch == self.epoch or any(r[0] == epoch for r in self.read)

    @property
    def epochs(self) -> list[int]:
        """The epochs this resume changes, in order: its own and those with ranges read."""
        return sorted({self.epoch, *(r[0] for r in self.read)})

    def read_in(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """The ranges read in ``epoch``."""
        return tuple((a, b) for e, a, b in self.read if e == epoch)

    def consumed(self, epoch: int) -> list[tuple[int, int]]:
        """Real positions of ``epoch`` read before the resume."""
        head = [(0, self.start)] if epoch == self.epoch else []
        return merge_ranges([*head, *self.read_in(epoch)])


def span_of(
    layout: ShardLayout, resume: Resume | None, epoch: int
) -> tuple[Remainder | None, int, int]:
    """``(remainder, first batch, batches)`` of ``layout``'s shard in ``epoch``: the
    remainder is ``None`` for a fresh epoch (first batch 0, ``layout.num_batches``)."""
    if resume is None or not resume.covers(epoch):
        return None, 0, layout.num_batches
    rem = Remainder(
        layout.num_records,
        layout.global_batch_size,
        layout.drop_last,
        resume.start if epoch == resume.epoch else 0,
        resume.read_in(epoch),
    )
    first = resume.batch if epoch == resume.epoch else 0
    return rem, first, first + rem.shard_layout(layout).num_batches


def _fresh(layout: ShardLayout) -> Remainder:
    return Remainder(layout.num_records, layout.global_batch_size, layout.drop_last)


def uneven_shards(layout: ShardLayout, resume: Resume | None) -> bool:
    """Whether the shards of ``layout`` read different numbers of batches in some epoch: a
    fresh one or one ``resume`` covers (only possible with ``drop_last=False``). Then
    shards in lock step stand at different cursors after it, so one shard's cursor does
    not say where the others are."""
    spans = [_fresh(layout)]
    if resume is not None:
        spans += [span_of(layout, resume, e)[0] for e in resume.epochs]  # type: ignore[misc]
    first, last = _member(layout, 0), _member(layout, layout.num_shards - 1)
    # a shard's batch count never grows with its index: the first and last shards differ
    # exactly when any two do
    return any(
        span.shard_layout(first).num_batches != span.shard_layout(last).num_batches
        for span in spans
    )


def lockstep_resume(layout: ShardLayout, resume: Resume | None, epoch: int, batch: int) -> Resume:
    """The ``Resume`` at a shard's cursor ``(epoch, batch)`` when every shard of ``layout``
    stands there too: the first position no shard has read, and the ranges read past it."""
    rem, first, _ = span_of(layout, resume, epoch)
    rem = rem or _fresh(layout)
    start = rem.cursor((batch - first) * layout.global_batch_size)
    read = () if resume is None else resume.read
    later = tuple(r for r in read if (r[0] == epoch and r[1] >= start) or r[0] > epoch)
    return Resume(epoch, start, batch, later)


@dataclass(frozen=True)
class ShardCursor:
    """One shard's cursor for :func:`merge_cursors`: the next ``(epoch, batch)``."""

    shard_index: int
    epoch: int
    batch: int


def _read_in_epoch(
    layout: ShardLayout, resume: Resume | None, cursors: Sequence[ShardCursor], epoch: int
) -> tuple[list[tuple[int, int]], int, int]:
    """Real positions of ``epoch`` the shards at ``cursors`` have read, as ranges, and the
    batches every shard has read in it (``(ranges, common batches, its first batch)``)."""
    rem, first, _ = span_of(layout, resume, epoch)
    rem = rem or _fresh(layout)
    done = []
    for c in cursors:
        shard = rem.shard_layout(_member(layout, c.shard_index))
        if c.epoch > epoch:
            done.append(shard.num_batches)
        else:
            done.append(max(0, c.batch - first) if c.epoch == epoch else 0)
    common = min(done)
    ranges = rem.prefix_ranges(common * layout.global_batch_size)
    ahead = [
        rem.shard_layout(_member(layout, c.shard_index)).positions(common, d)
        for c, d in zip(cursors, done, strict=True)
        if d > common
    ]
    if ahead:
        rows = np.concatenate(ahead)
        positions = rem.positions(rows)
        ranges += _runs(positions[positions < layout.num_records])
    prior = resume.consumed(epoch) if resume is not None else []
    return merge_ranges([*ranges, *prior]), common, first


def _member(layout: ShardLayout, shard_index: int) -> ShardLayout:
    return ShardLayout(
        layout.num_records,
        layout.batch_size,
        shard_index,
        layout.num_shards,
        layout.drop_last,
        blocked=layout.blocked,
    )


def merge_cursors(
    layout: ShardLayout, resume: Resume | None, cursors: Sequence[ShardCursor]
) -> Resume:
    """The exact ``Resume`` of shards that stopped at ``cursors`` (one per shard of
    ``layout``, any epochs and batches, all in the run that ``resume`` started, or a fresh
    one): the first position of the earliest unfinished epoch no shard has read, and every
    range read past it.

    The work is proportional to the rows read past the slowest shard, so the caller bounds
    how many epochs apart the cursors may be.
    """
    epoch = min(c.epoch for c in cursors)
    epochs = set(range(epoch + 1, max(c.epoch for c in cursors) + 1))
    if resume is not None:
        epochs |= {e for e in resume.epochs if e > epoch}
    read: list[ReadRange] = []
    ranges, common, first = _read_in_epoch(layout, resume, cursors, epoch)
    start = ranges[0][1] if ranges and ranges[0][0] == 0 else 0
    read += [(epoch, a, b) for a, b in ranges if b > start]
    for later in sorted(epochs):
        read += [(later, a, b) for a, b in _read_in_epoch(layout, resume, cursors, later)[0]]
    return Resume(epoch, start, first + common, tuple(read))
