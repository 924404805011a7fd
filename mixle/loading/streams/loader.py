"""``StreamLoader``: the Loader over a stream, an iterable with no length.

``mixle.Loader(stream, batch_size, ...)`` returns one (see :func:`is_stream`); the batches,
shards, padding and resume mean what they mean for map-style sources, cut from the front
of the stream (:mod:`mixle.loading.streams.plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.sharding import SHARD_LAYOUTS, DropLast
from mixle.data.spec import SpecTree, spec_of
from mixle.loading.arguments import parse_count
from mixle.loading.base import LoaderBase
from mixle.loading.element_spec import widen_leading
from mixle.loading.prefetch import StopSignal
from mixle.loading.reader import takes_rng
from mixle.loading.spec_check import record_spec_of
from mixle.loading.state import STREAM_STATE_VERSION, layout_state
from mixle.loading.streams.detect import ONE_SHOT_FIX, stream_kind
from mixle.loading.streams.plan import EpochEnds, StreamLayout, StreamPlan, stream_plans
from mixle.loading.streams.reader import StreamRead, StreamReader
from mixle.loading.streams.state import check_stream_state, stream_fingerprint
from mixle.utils.validation import parse_choice

__all__ = ["StreamLoader"]


def _parse_buffer(shuffle_buffer: object) -> int | None:
    if shuffle_buffer is None:
        return None
    if isinstance(shuffle_buffer, (bool, np.bool_)):
        raise TypeError(
            f"shuffle_buffer={shuffle_buffer!r} must be an int >= 1 (records the shuffle "
            "buffer holds) or None, not a bool"
        )
    return parse_count(shuffle_buffer, "shuffle_buffer", 1)


class StreamLoader(LoaderBase):
    """Batches of a stream (an iterable with no length), sharded, resumable.

    Made by ``mixle.Loader(stream, batch_size, ...)``; takes the Loader's arguments, with
    these differences.

    Parameters
    ----------
    source
        A stream: a re-iterable (each ``iter()`` starts a new pass, e.g. a
        ``datasets.IterableDataset``), a zero-argument factory returning an iterator (a
        generator function), or a one-shot iterator (a generator object: only with
        ``num_epochs=1``, ``num_workers=0`` and no resume). Records are whatever it yields
        (dicts, tuples, arrays), stacked as map-style records are. A stream with
        ``set_epoch(epoch)`` is told the epoch before each pass.
    batch_size, seed, num_epochs, drop_last, shard_index, num_shards, shard_layout
        As for the Loader; each epoch is a new pass over the stream. Batch ``k`` of every
        shard together holds the stream records ``[k G, (k + 1) G)``, ``G = batch_size *
        num_shards``, split by ``shard_layout``. At the end of the stream, ``drop_last=True``
        drops a short global batch on every shard and ``"pad"`` pads every shard's batch
        (padding rows repeat the epoch's first records, masked), so all shards run the
        same number of batches; with ``drop_last=False`` each shard gets its rows of the
        short global batch, so a shard may get a short batch or none.
    shuffle
        Must be ``False``: a stream cannot be read in a random order; see ``shuffle_buffer``.
    shuffle_buffer
        ``None`` (default): batches in the stream's order. ``N``: a seeded shuffle buffer
        of ``N`` records over the whole stream, before sharding
        (:func:`~mixle.loading.streams.shuffle_buffer.shuffle_buffer`), a new order each
        epoch, a pure function of ``(seed, epoch)`` and the stream's order.
    transform, record_transform
        As for the Loader; ``record_transform``'s ``rng`` is :func:`~mixle.record_rng` of
        ``(seed, epoch, stream position)``, the record's position in the unshuffled pass.
    num_threads, prefetch
        As for the Loader: the stream is pulled in order, one batch after the other, in
        the reader threads, and the transforms and stacking of several batches run side
        by side.
    num_workers, worker_start_method, timeout
        As for the Loader. Every worker iterates the whole stream itself and keeps only
        its own batches (batch ``k`` of the run goes to worker ``k % num_workers``), so
        the stream is pulled ``num_workers`` times: worth it when the transforms cost
        more than pulling. The batches equal those of ``num_workers=0``.
    check_spec
        As for the Loader: ``"first"`` (default) checks the first batch of each epoch and of
        each run against the stream's ``element_spec()``, before the transforms; ``True``
        every batch; ``False`` never.

    Raises
    ------
    TypeError
        An argument of the wrong type.
    ValueError
        ``shuffle=True``, ``shuffle_block`` given, a one-shot iterator with ``num_epochs``
        other than 1 or with workers, or any value error of the Loader's arguments.

    Notes
    -----
    - A stream has no length: ``len(loader)`` raises ``TypeError``. An epoch ends where the
      stream does; an endless run (``num_epochs=None``) stops at an epoch that gives this
      shard no batch at all (so an empty stream never spins).
    - Resuming (``load_state_dict``) re-creates the iterator and pulls and discards the
      records before the next batch: O(records skipped). So does a new ``iter()`` after a
      ``break`` unless the iterator stands exactly at the cursor.
    - Where an epoch ends is learned by pulling that far. In this process the reads
      ahead then go on with the next epoch; with ``num_workers`` the end is learned when
      the loop reaches it, so the workers' reads ahead stop at each epoch's end (the
      plans past it read nothing) and the next epoch starts after it.
    - Every shard pulls the whole stream and keeps its rows; to avoid that, split the
      stream upstream (e.g. ``datasets.distributed.split_dataset_by_node``) and use one
      shard per split.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        shuffle_block: int | None = None,
        shuffle_buffer: int | None = None,
        seed: int = 0,
        num_epochs: int | None = 1,
        drop_last: DropLast = False,
        shard_index: int = 0,
        num_shards: int = 1,
        shard_layout: str = "interleaved",
        transform: Callable[[Any], Any] | None = None,
        record_transform: Callable[[Any, np.random.Generator], Any] | None = None,
        num_threads: int | None = None,
        prefetch: int | None = None,
        num_workers: int = 0,
        worker_start_method: str = "spawn",
        timeout: float | None = None,
        check_spec: bool | str = "first",
    ) -> None:
        kind = stream_kind(source)
        if kind is None:
            raise TypeError(
                f"source={type(source).__name__} is not a stream: pass an iterable, a "
                "zero-argument factory returning an iterator, or an iterator"
            )
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle={shuffle!r} must be True or False")
        if shuffle:
            raise ValueError(
                f"shuffle=True, but the source ({type(source).__name__}) is a stream with no "
                "length, which cannot be read in a random order; use shuffle_buffer=N for a "
                "seeded shuffle buffer of N records"
            )
        if shuffle_block is not None:
            raise ValueError(
                f"shuffle_block={shuffle_block!r} moves blocks of a map-style source's "
                "shuffle; a stream is read in order: leave it None (use shuffle_buffer=N)"
            )
        self._source, self._kind = source, kind
        self._fingerprint: str | None = None  # the stream's, asked once (see state_dict)
        self._buffer = _parse_buffer(shuffle_buffer)
        parse_choice(shard_layout, "shard_layout", SHARD_LAYOUTS)
        self._layout = StreamLayout(
            batch_size, shard_index, num_shards, drop_last, blocked=shard_layout == "blocked"
        )
        self._check = self._parse_run_options(
            seed,
            num_epochs,
            transform,
            record_transform,
            num_threads,
            prefetch,
            num_workers,
            worker_start_method,
            timeout,
            check_spec,
        )
        if kind == "one-shot" and self._num_epochs != 1:
            raise ValueError(
                f"num_epochs={self._num_epochs}, but the source is a one-shot iterator "
                f"({type(source).__name__}) that can be read once: use num_epochs=1, or "
                f"{ONE_SHOT_FIX}"
            )
        if kind == "one-shot" and self._num_workers:
            raise ValueError(
                f"num_workers={self._num_workers}, but the source is a one-shot iterator "
                f"({type(source).__name__}) that each worker process would have to read "
                f"from the start: use num_workers=0, or {ONE_SHOT_FIX}"
            )
        fn = self._transform
        record_spec = record_spec_of(source)
        self._reader = StreamReader(
            source,
            kind,
            self._layout,
            self._buffer,
            self._seed,
            self._record_transform,
            fn,
            fn is not None and takes_rng(fn),
            record_spec,
        )
        self._start_cursor()

    # -- description --------------------------------------------------------------------
    @property
    def layout(self) -> StreamLayout:
        """How this shard cuts its batches out of the stream."""
        return self._layout

    @property
    def shuffle_buffer(self) -> int | None:
        """Records the shuffle buffer holds (``None``: the stream's order)."""
        return self._buffer

    @property
    def last_record_keys(self) -> NDArray[np.uint64] | None:
        """What the last batch's per-record randomness is keyed on: its stream positions
        (:attr:`last_indices`) as uint64, for :func:`mixle.jax.record_keys` with
        :attr:`last_epoch`."""
        indices = self._last_indices
        return None if indices is None else indices.astype(np.uint64)

    def __len__(self) -> int:
        raise TypeError(
            f"a stream has no length: {type(self._source).__name__} is read until it ends, "
            "so the batches per epoch are not known in advance"
        )

    def __repr__(self) -> str:
        extra = f"shuffle_buffer={self._buffer}, " if self._buffer is not None else ""
        return self._describe(f"{self._kind} stream {type(self._source).__name__}", extra)

    # -- reading ------------------------------------------------------------------------
    def _run(self, signal: StopSignal) -> Iterator[Any]:
        if self._num_epochs is not None and self._epoch >= self._num_epochs:
            return  # the run is over: no worker to start
        ends = EpochEnds()
        workers = self._num_workers
        plans = stream_plans(
            self._epoch,
            self._batch,
            num_epochs=self._num_epochs,
            ends=ends,
            stride=max(1, workers),
            check=self._check,
        )
        # a worker reads a fresh pass of its own; in this process the run's pull learns ends
        reader = self._reader.fresh() if workers else self._reader.for_run(ends)
        with self._reading(reader, plans, signal, pooled=workers > 0) as stream:
            for plan, read in stream:
                if self._take(plan, read, ends):
                    yield read.batch
                del read
                if self._stop_endless(plan, ends):
                    break
            else:
                if self._num_epochs is not None:
                    self._epoch, self._batch = self._num_epochs, 0

    def _take(self, plan: StreamPlan, read: StreamRead, ends: EpochEnds) -> bool:
        """Move the cursor past ``plan``; whether ``read`` is a batch to yield."""
        if read.batch is None:  # the epoch ended before this batch: a plan made ahead
            ends.end(plan.epoch, plan.batch)
            if (self._epoch, self._batch) == (plan.epoch, plan.batch):
                self._epoch, self._batch = plan.epoch + 1, 0
            return False
        if read.last:
            ends.end(plan.epoch, plan.batch + 1)
            self._epoch, self._batch = plan.epoch + 1, 0
        else:
            self._epoch, self._batch = plan.epoch, plan.batch + 1
        self._last_indices, self._last_epoch = read.indices, plan.epoch
        return True

    def _stop_endless(self, plan: StreamPlan, ends: EpochEnds) -> bool:
        """An endless run stops at an epoch that gave this shard no batch."""
        return self._num_epochs is None and ends.batches(plan.epoch) == 0

    # -- element spec -------------------------------------------------------------------
    def _spec_from_batch(self) -> SpecTree:
        if self._kind == "one-shot":
            raise ValueError(
                "element_spec() of a one-shot iterator with a transform (or without an "
                "element_spec() of its own) would have to read its first batch, which the "
                f"run then could not read again: {ONE_SHOT_FIX}"
            )
        read = self._reader.fresh()(StreamPlan(0, 0, 0, 1, False))
        if read.batch is None:
            raise ValueError(f"{self!r} has no batches to read an element spec from")
        spec = spec_of(read.batch)
        assert read.indices is not None
        return widen_leading(spec, read.indices.size, self.batch_size)

    # -- resume -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor and what it is valid for, as a small JSON-serialisable dict.

        Keys: ``version``, ``stream`` (``True``), ``source`` (a fingerprint,
        :func:`~mixle.loading.streams.state.stream_fingerprint`), ``batch_size``,
        ``drop_last``, ``shard_index``, ``num_shards``, ``shard_layout``, ``seed``,
        ``shuffle_buffer``, ``num_epochs``, ``epoch``, ``batch`` (the next batch) and
        ``position`` (stream records of the epoch before it: ``batch * batch_size *
        num_shards``).
        """
        lay = self._layout
        if self._fingerprint is None:  # once: a JaxLoader asks for the state every batch
            self._fingerprint = stream_fingerprint(self._source)
        return {
            "version": STREAM_STATE_VERSION,
            "stream": True,
            "source": self._fingerprint,
            **layout_state(lay),
            "seed": self._seed,
            "shuffle_buffer": self._buffer,
            "num_epochs": self._num_epochs,
            "epoch": self._epoch,
            "batch": self._batch,
            "position": self._batch * lay.global_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any], *, reshard: bool = False) -> None:
        """Resume at the batch after the one ``state`` was taken at.

        The next run re-creates the stream's iterator and pulls and discards the
        ``position`` records before that batch (O(records skipped)). With
        ``reshard=True`` ``state`` may come from another ``batch_size``, ``num_shards``,
        ``shard_index`` or ``shard_layout``: the run goes on at the state's stream
        position, which must fall on a global batch of this loader (it does when the
        global batch size ``batch_size * num_shards`` is kept), every shard standing
        there (lock-step); see :func:`~mixle.loading.streams.state.check_stream_state`.

        Raises
        ------
        LoaderStateError
            (a ``ValueError``) ``state`` was saved for another stream, batch or shard
            layout, seed, ``shuffle_buffer`` or number of epochs, by a Loader over a
            map-style source, or is not a state dict; the message names the key.
        ValueError
            The stream is a one-shot iterator, which cannot be rewound (a state of its
            own current cursor is accepted: nothing to rewind).
        """
        if not isinstance(reshard, bool):
            raise TypeError(f"reshard={reshard!r} must be True or False")
        epoch, batch = check_stream_state(state, self.state_dict(), reshard=reshard)
        if self._kind == "one-shot" and (epoch, batch) != (self._epoch, self._batch):
            raise ValueError(
                "load_state_dict() needs to read the stream again from its start, but it is "
                f"a one-shot iterator ({type(self._source).__name__}): {ONE_SHOT_FIX}"
            )
        self.close()
        self._epoch, self._batch = epoch, batch
