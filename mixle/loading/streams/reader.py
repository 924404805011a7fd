"""The sequential pull of a stream and what reading one batch of it does.

:class:`StreamCursor` owns one iterator over the stream and pulls it in order: asked for
positions it has passed it re-creates the iterator (a new pass) and skips forward.
:class:`StreamReader` reads one :class:`~mixle.loading.streams.plan.StreamPlan`: it pulls
the plan's global batch, in plan order (a ticket makes reader threads pull one after the
other), then runs ``record_transform``, stacking and ``transform`` outside the lock, so
transforms of several batches run side by side in threads. It is picklable (the stream and
its options travel; the iterator does not): each worker process gets its own and pulls the
whole stream itself, keeping only its batches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from mixle.data.spec import SpecTree
from mixle.loading.batching import attach_mask, stack_records
from mixle.loading.plan import batch_rng, record_rng
from mixle.loading.spec_check import check_source_batch
from mixle.loading.streams.detect import ONE_SHOT_FIX, PassLog, StreamKind, open_pass
from mixle.loading.streams.plan import EpochEnds, StreamLayout, StreamPlan, shard_rows
from mixle.loading.streams.shuffle_buffer import shuffle_buffer

__all__ = ["StreamCursor", "StreamRead", "StreamReader"]


class StreamRead(NamedTuple):
    """What reading one plan gives: the batch (``None``: the shard has no such batch), the
    stream positions of its rows, and whether the epoch's stream ended in it."""

    batch: Any
    indices: NDArray[np.int64] | None
    last: bool


class StreamCursor:
    """One pass over a stream at a time, pulled in order; hold :attr:`lock` to use it.

    Records come as ``(position, record)``, ``position`` being the record's place in the
    unshuffled pass; with ``shuffle_buffer`` they come in the buffer's order. The first
    ``keep_head`` of each pass are kept (the padding rows of ``drop_last="pad"`` repeat
    them).
    """

    def __init__(
        self,
        stream: Any,
        kind: StreamKind,
        *,
        buffer: int | None,
        seed: int,
        keep_head: int,
        passes: PassLog | None = None,
    ) -> None:
        self.stream, self.kind, self.buffer, self.seed = stream, kind, buffer, seed
        self.passes = PassLog() if passes is None else passes
        self.keep_head = keep_head
        self._it: Iterator[tuple[int, Any]] | None = None
        self._epoch = -1
        self._pos = 0  # the next position of the (shuffled) pass
        self._done = False  # the pass ended
        self._head: list[tuple[int, Any]] = []
        self._opened = 0  # passes opened (a one-shot iterator has one)
        #: Held around each use: the reader's tickets order the pulls of one run, and the
        #: lock keeps a thread of an earlier run that still finishes its pull off the pass.
        self.lock = threading.Lock()

    def _open(self, epoch: int) -> None:
        if self.kind == "one-shot" and self._opened:
            raise ValueError(
                f"the stream is a one-shot iterator ({type(self.stream).__name__}) that was "
                f"already read up to record {self._pos} of epoch {self._epoch}, and cannot "
                f"start again for epoch {epoch}: {ONE_SHOT_FIX}"
            )
        self._opened += 1
        raw = open_pass(self.stream, self.kind, epoch)
        if self.kind != "one-shot":
            self.passes.check(self.stream, self.kind, raw)
        pairs: Iterator[tuple[int, Any]] = enumerate(raw)
        if self.buffer is not None:
            pairs = shuffle_buffer(pairs, self.buffer, seed=self.seed, epoch=epoch)
        self._it, self._epoch, self._pos, self._done = pairs, epoch, 0, False
        self._head = []

    def take(self, epoch: int, start: int, count: int) -> list[tuple[int, Any]]:
        """Positions ``[start, start + count)`` of ``epoch``'s pass (fewer where it ends).

        Skipping costs one pull per record skipped; a position already passed starts a
        new pass (O(start) pulls).
        """
        if epoch != self._epoch or start < self._pos or self._it is None:
            self._open(epoch)
        it = self._it
        assert it is not None
        out: list[tuple[int, Any]] = []
        while not self._done and self._pos < start + count:
            try:
                pair = next(it)
            except StopIteration:
                self._done = True
                break
            except BaseException:  # the stream failed: the next take starts a new pass
                self._it = None  # (a failed generator is finished, not at its end)
                raise
            if self._pos < self.keep_head:
                self._head.append(pair)
            if self._pos >= start:
                out.append(pair)
            self._pos += 1
        return out

    def head(self, position: int) -> tuple[int, Any]:
        """The record at ``position < keep_head`` of the current pass (already pulled)."""
        return self._head[position]


def _reader_state(reader: StreamReader) -> dict[str, Any]:
    return {name: getattr(reader, name) for name in StreamReader.__dataclass_fields__}


@dataclass
class StreamReader:
    """Read one plan of a stream run: pull, then transform and stack (picklable).

    Attributes
    ----------
    source, kind
        The stream and what kind it is (:func:`~mixle.loading.streams.detect.stream_kind`).
    layout
        Which rows of each global batch this shard takes.
    buffer, seed
        ``shuffle_buffer`` (``None``: none) and the Loader's seed.
    record_transform, transform, transform_rng
        The Loader's transforms; ``transform`` gets ``(batch, rng)`` when ``transform_rng``.
    record_spec
        The stream's ``element_spec()``, or ``None``: plans with ``check`` are checked
        against it, and records are stacked by it
        (:func:`~mixle.loading.batching.stack_records`: strings, lists and dicts in a
        leaf it declares ``object`` are one value each).
    """

    source: Any
    kind: StreamKind
    layout: StreamLayout
    buffer: int | None
    seed: int
    record_transform: Callable[[Any, np.random.Generator], Any] | None
    transform: Callable[..., Any] | None
    transform_rng: bool
    record_spec: SpecTree | None
    cursor: StreamCursor | None = field(default=None, repr=False)
    ends: EpochEnds | None = field(default=None, repr=False)
    passes: PassLog | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.passes is None:  # shared by this process's copies (runs, the spec read)
            self.passes = PassLog()
        if self.cursor is None:
            self.cursor = self.new_cursor()
        self._cond = threading.Condition()
        self._pulled = -1  # seq of the last plan whose pull finished
        self._failed: int | None = None  # seq of a plan whose pull raised

    def new_cursor(self) -> StreamCursor:
        """A cursor over this reader's stream that has not started a pass."""
        lay = self.layout
        head = lay.global_batch_size if lay.drop_last == "pad" else 0
        return StreamCursor(
            self.source,
            self.kind,
            buffer=self.buffer,
            seed=self.seed,
            keep_head=head,
            passes=self.passes,
        )

    def for_run(self, ends: EpochEnds | None = None) -> StreamReader:
        """A reader for a new run (its tickets start again) over the same cursor; it tells
        ``ends`` where each epoch ends as soon as it pulls that far (in this process, the
        plans ahead then go on with the next epoch instead of past this one's end)."""
        return StreamReader(**{**_reader_state(self), "cursor": self.cursor, "ends": ends})

    def fresh(self) -> StreamReader:
        """A reader with a cursor of its own (a worker process, a spec read)."""
        return StreamReader(**{**_reader_state(self), "cursor": None, "ends": None})

    def __reduce__(self) -> tuple[Any, ...]:
        state = _reader_state(self) | {"cursor": None, "ends": None, "passes": None}
        return (_rebuild, (state,))

    # -- reading ------------------------------------------------------------------------
    def _pull(self, plan: StreamPlan) -> tuple[list[Any], NDArray[np.int64], Any, bool] | None:
        lay, cursor = self.layout, self.cursor
        assert cursor is not None
        g = lay.global_batch_size
        start = plan.batch * g
        with cursor.lock:
            got = cursor.take(plan.epoch, start, g)
            rows = shard_rows(lay, plan.batch, len(got))
            if rows is None:  # only where the epoch's stream ended (see shard_rows)
                return None
            positions, mask = rows
            picked = [got[p - start] if p >= start else cursor.head(p) for p in positions.tolist()]
        last = len(got) < g
        indices = np.fromiter((i for i, _ in picked), dtype=np.int64, count=len(picked))
        return [r for _, r in picked], indices, mask, last

    def _ticketed_pull(self, plan: StreamPlan) -> Any:
        cond, after = self._cond, plan.seq - plan.stride
        with cond:
            while self._pulled < after:
                cond.wait()
        try:
            if self._failed is not None:  # the loop raises that batch's error first
                raise RuntimeError(f"not read: the pull of plan {self._failed} failed")
            try:
                return self._pull(plan)
            except BaseException:
                self._failed = plan.seq  # later plans of this run wait for no new pass
                raise
        finally:
            with cond:
                self._pulled = max(self._pulled, plan.seq)
                cond.notify_all()

    def __call__(self, plan: StreamPlan) -> StreamRead:
        pulled = self._ticketed_pull(plan)
        ends = self.ends
        if pulled is None:
            if ends is not None:
                ends.end(plan.epoch, plan.batch)
            return StreamRead(None, None, True)
        records, indices, mask, last = pulled
        if last and ends is not None:
            ends.end(plan.epoch, plan.batch + 1)
        fn = self.record_transform
        spec = self.record_spec
        batch = stack_records(records, spec) if fn is None else None
        if self.record_spec is not None and plan.check:
            check_source_batch(
                stack_records(records, spec) if batch is None else batch,
                self.record_spec,
                len(records),
                source=self.source,
                where=f"batch {plan.batch} of epoch {plan.epoch}",
            )
        if fn is not None:
            seed, epoch = self.seed, plan.epoch
            records = [
                fn(record, record_rng(seed, epoch, i))
                for record, i in zip(records, indices.tolist())
            ]
            batch = stack_records(records, spec)
        if self.transform is not None:
            if self.transform_rng:
                rng = batch_rng(self.seed, plan.epoch, plan.batch, self.layout.shard_index)
                batch = self.transform(batch, rng)
            else:
                batch = self.transform(batch)
        if mask is not None:
            batch = attach_mask(batch, mask)
        return StreamRead(batch, indices, last)


def _rebuild(state: dict[str, Any]) -> StreamReader:
    return StreamReader(**state)
