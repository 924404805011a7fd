"""Which stream positions each batch of each shard holds, and the plans a stream run walks.

A stream's length is unknown until it ends, so the positions are cut from the front: batch
``k`` of every shard together is the global batch of stream positions ``[k G, (k + 1) G)``,
``G = batch_size * num_shards``, split between the shards as the map-style Loader splits
one (:mod:`mixle.data.index_math.sharding`): ``"interleaved"`` gives shard ``s`` the rows
``s, s + S, ...`` of it, ``"blocked"`` its ``s``-th block of ``batch_size`` rows. Only the
last global batch, the one the stream ends in with ``r < G`` records, is special:

- ``drop_last=False``: each shard takes its rows below ``r`` (a shard may get a short batch,
  or none: shards then differ by one batch, as with map-style sources);
- ``drop_last=True``: the global batch is dropped on every shard;
- ``drop_last="pad"``: every shard gets a full batch; a row at position ``p >= n`` (``n =
  k G + r`` records in the epoch) repeats the record at ``p mod n`` (one of the epoch's
  first ``G``) and is marked not real in the mask.

These are exactly the batches a map-style Loader with ``shuffle=False`` reads from the same
records, whatever the shard layout and ``drop_last``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.sharding import DropLast, ShardLayout

__all__ = ["EpochEnds", "StreamLayout", "StreamPlan", "shard_rows", "stream_plans"]


@dataclass(frozen=True)
class StreamLayout:
    """How one shard cuts its batches out of a stream of unknown length.

    Checked like :class:`~mixle.data.index_math.sharding.ShardLayout` (the same errors for a
    bad ``batch_size``, ``shard_index``, ``num_shards`` or ``drop_last``).
    """

    batch_size: int
    shard_index: int = 0
    num_shards: int = 1
    drop_last: DropLast = False
    blocked: bool = False

    def __post_init__(self) -> None:
        checked = ShardLayout(
            0, self.batch_size, self.shard_index, self.num_shards, self.drop_last, self.blocked
        )
        for name in ("batch_size", "shard_index", "num_shards", "drop_last", "blocked"):
            object.__setattr__(self, name, getattr(checked, name))

    @property
    def global_batch_size(self) -> int:
        """Stream records per step over all shards: ``batch_size * num_shards``."""
        return self.batch_size * self.num_shards


def shard_rows(
    layout: StreamLayout, batch: int, real: int
) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None] | None:
    """Stream positions of this shard's batch ``batch``, when its global batch holds ``real``
    records (``0 <= real <= G``), and the padding mask (``drop_last="pad"`` only).

    ``None`` when the shard has no such batch: the global batch is empty, dropped
    (``drop_last=True`` and ``real < G``), or holds none of this shard's rows
    (``drop_last=False``). Padding positions are already wrapped to ``p mod n``.
    """
    b, s, g = layout.batch_size, layout.shard_index, layout.global_batch_size
    if real == 0 or (layout.drop_last is True and real < g):
        return None
    rows = np.arange(b, dtype=np.int64)
    offsets = s * b + rows if layout.blocked else s + layout.num_shards * rows
    start = batch * g
    if layout.drop_last == "pad":
        mask = offsets < real
        return (start + offsets) % (start + real), mask
    offsets = offsets[offsets < real]
    if not offsets.size:
        return None
    return start + offsets, None


@dataclass(frozen=True)
class StreamPlan:
    """One batch of a stream run: its epoch, its number on the shard, and its place in the run.

    ``seq`` counts the run's plans from 0; the reader that gets plan ``seq`` pulls the stream
    after the one that got ``seq - stride`` (its previous plan: ``stride`` is the number of
    worker processes, 1 without them). ``check`` asks for the ``check_spec`` check.
    """

    epoch: int
    batch: int
    seq: int
    stride: int
    check: bool


class EpochEnds:
    """What the run has learned about where each epoch ends: ``{epoch: batches}``.

    Thread-safe: reader threads report ends as they pull, the plans read them.
    """

    def __init__(self) -> None:
        self._ends: dict[int, int] = {}
        self._lock = threading.Lock()

    def end(self, epoch: int, batches: int) -> None:
        """Epoch ``epoch`` has at most ``batches`` batches on this shard."""
        with self._lock:
            known = self._ends.get(epoch)
            self._ends[epoch] = batches if known is None else min(known, batches)

    def batches(self, epoch: int) -> int | None:
        """The batches of ``epoch``, once known."""
        with self._lock:
            return self._ends.get(epoch)

    def forget(self, before: int) -> None:
        """Drop what is known of epochs before ``before`` (an endless run keeps O(1))."""
        with self._lock:
            for epoch in [e for e in self._ends if e < before]:
                del self._ends[epoch]


def stream_plans(
    epoch: int,
    batch: int,
    *,
    num_epochs: int | None,
    ends: EpochEnds,
    stride: int,
    check: str,
) -> Iterator[StreamPlan]:
    """Plans from batch ``batch`` of ``epoch`` to the end of ``num_epochs`` (``None``: endless).

    An epoch's length is learned while reading: plans of an epoch are made until ``ends``
    says where it stops (plans made ahead past its end read nothing and are skipped).
    ``check`` is the ``check_spec`` policy: ``"every"`` checks each batch, ``"first"`` the
    first of the run and batch 0 of each epoch.
    """
    seq = 0
    while num_epochs is None or epoch < num_epochs:
        known = ends.batches(epoch)
        if known is not None and batch >= known:
            ends.forget(epoch)
            epoch, batch = epoch + 1, 0
            continue
        first = check == "every" or (check == "first" and (seq == 0 or batch == 0))
        yield StreamPlan(epoch, batch, seq, stride, first)
        seq += 1
        batch += 1
