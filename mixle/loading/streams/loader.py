"""``StreamLoader``: the Loader over a stream, an iterable with no length.

``mixle.Loader(stream, batch_size, ...)`` returns one (see :func:`is_stream`); the batches,
shards, padding and resume mean what they mean for map-style sources, cut from the front
of the stream (:mod:`mixle.loading.streams.plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.hashing import parse_seed
from mixle.data.index_math.sharding import SHARD_LAYOUTS, DropLast
from mixle.data.spec import SpecTree, spec_of
from mixle.loading.adapters import adapt
from mixle.loading.arguments import parse_callable, parse_count, parse_threads, parse_workers
from mixle.loading.element_spec import spec_from_metadata, widen_leading
from mixle.loading.prefetch import StopSignal, ordered_map
from mixle.loading.reader import takes_rng
from mixle.loading.runs import ActiveRun, workers_module
from mixle.loading.spec_check import parse_check_spec, record_spec_of
from mixle.loading.state import STATE_VERSION
from mixle.loading.streams.detect import ONE_SHOT_FIX, stream_kind
from mixle.loading.streams.plan import EpochEnds, StreamLayout, StreamPlan, stream_plans
from mixle.loading.streams.reader import StreamRead, StreamReader
from mixle.loading.streams.state import check_stream_state, stream_fingerprint
from mixle.utils.validation import parse_choice

if TYPE_CHECKING:
    from mixle.jax import JaxLoader
    from mixle.loading.workers import WorkerPool

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


class StreamLoader(ActiveRun):
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
        self._buffer = _parse_buffer(shuffle_buffer)
        parse_choice(shard_layout, "shard_layout", SHARD_LAYOUTS)
        self._layout = StreamLayout(
            batch_size, shard_index, num_shards, drop_last, blocked=shard_layout == "blocked"
        )
        self._seed = parse_seed(seed)
        self._num_epochs = None if num_epochs is None else parse_count(num_epochs, "num_epochs", 1)
        self._transform = parse_callable(transform, "transform")
        self._record_transform = parse_callable(record_transform, "record_transform")
        self._num_workers, self._start_method, self._timeout = parse_workers(
            num_workers, worker_start_method, timeout
        )
        self._num_threads, self._prefetch = parse_threads(num_threads, prefetch, self._num_workers)
        self._check = parse_check_spec(check_spec)
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
        if self._num_workers:
            workers_module().reader_payload(self._reader, self._start_method, check_only=True)
        self._spec: SpecTree | None = None
        self._epoch = 0
        self._batch = 0
        self._last_indices: NDArray[np.int64] | None = None
        self._last_epoch: int | None = None
        self._pool: WorkerPool | None = None

    # -- description --------------------------------------------------------------------
    @property
    def source(self) -> Any:
        """The stream batches are read from."""
        return self._source

    @property
    def layout(self) -> StreamLayout:
        """How this shard cuts its batches out of the stream."""
        return self._layout

    @property
    def batch_size(self) -> int:
        """Rows per batch."""
        return self._layout.batch_size

    @property
    def shuffle_buffer(self) -> int | None:
        """Records the shuffle buffer holds (``None``: the stream's order)."""
        return self._buffer

    @property
    def num_workers(self) -> int:
        """Worker processes that read the batches (0: read in this process)."""
        return self._num_workers

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the running worker processes (empty when none run)."""
        pool = self._pool
        return () if pool is None else pool.pids

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._epoch

    @property
    def last_indices(self) -> NDArray[np.int64] | None:
        """Stream positions (in the epoch's unshuffled pass) of the last batch's rows."""
        return self._last_indices

    @property
    def last_record_keys(self) -> NDArray[np.uint64] | None:
        """What the last batch's per-record randomness is keyed on: its stream positions
        (:attr:`last_indices`) as uint64, for :func:`mixle.jax.record_keys` with
        :attr:`last_epoch`."""
        indices = self._last_indices
        return None if indices is None else indices.astype(np.uint64)

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the batch yielded last."""
        return self._last_epoch

    def __len__(self) -> int:
        raise TypeError(
            f"a stream has no length: {type(self._source).__name__} is read until it ends, "
            "so the batches per epoch are not known in advance"
        )

    def __repr__(self) -> str:
        lay = self._layout
        extra = f"shuffle_buffer={self._buffer}, " if self._buffer is not None else ""
        if self._num_workers:
            extra += f"num_workers={self._num_workers}, "
        return (
            f"Loader({self._kind} stream {type(self._source).__name__}, "
            f"batch_size={lay.batch_size}, {extra}seed={self._seed}, "
            f"num_epochs={self._num_epochs}, drop_last={lay.drop_last!r}, "
            f"shard {lay.shard_index}/{lay.num_shards}, epoch={self._epoch}, batch={self._batch})"
        )

    # -- reading ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self._iterate(StopSignal())

    def _iterate(self, signal: StopSignal) -> Iterator[Any]:
        """A new run from the cursor that ``signal`` stops from any thread (see ``close``)."""
        self.close()
        return self._start_run(self._run(signal), signal)

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
        pool = None
        if workers:
            pool_module = workers_module()
            reader = self._reader.fresh()
            pool = pool_module.WorkerPool(
                reader,
                num_workers=workers,
                start_method=self._start_method,
                num_threads=self._num_threads,
                prefetch=self._prefetch,
                timeout=self._timeout,
                pickled=pool_module.reader_payload(reader, self._start_method),
            )
            self._pool = pool
            stream = pool.batches(plans, signal)
        else:
            stream = ordered_map(
                self._reader.for_run(ends),
                plans,
                num_threads=self._num_threads,
                prefetch=self._prefetch,
                signal=signal,
            )
        finished = False
        try:
            for plan, read in stream:
                if self._take(plan, read, ends):
                    yield read.batch
                del read
                if self._stop_endless(plan, ends):
                    break
            else:
                if self._num_epochs is not None:
                    self._epoch, self._batch = self._num_epochs, 0
            finished = True
        finally:
            stream.close()  # type: ignore[attr-defined]
            if pool is not None:
                pool.stop(graceful=finished)
                if self._pool is pool:
                    self._pool = None

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

    def to_jax(self, **options: Any) -> JaxLoader:
        """This loader's batches as ``jax.Array`` pytrees on devices (needs ``mixle[jax]``);
        ``options`` are :meth:`mixle.jax.JaxLoader.from_loader`'s."""
        return adapt("jax", self, **options)  # type: ignore[no-any-return]

    # -- element spec -------------------------------------------------------------------
    def element_spec(self) -> SpecTree:
        """Shapes and dtypes of one batch: the record's with a leading ``batch_size`` axis.

        From the stream's ``element_spec()`` when there is no transform; otherwise (or when
        the stream reports none) from reading the first batch of a fresh pass of epoch 0
        (a one-shot iterator cannot: ``ValueError``). With ``drop_last="pad"`` the mask
        is ``ArraySpec((batch_size,), bool)``; with ``drop_last=False`` the last batch
        may be shorter.
        """
        if self._spec is None:
            transformed = self._transform is not None or self._record_transform is not None
            padded = self._layout.drop_last == "pad"
            self._spec = (
                spec_from_metadata(
                    self._source, self.batch_size, transformed=transformed, padded=padded
                )
                or self._spec_from_batch()
            )
        return self._spec

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
        return {
            "version": STATE_VERSION,
            "stream": True,
            "source": stream_fingerprint(self._source),
            "batch_size": lay.batch_size,
            "drop_last": lay.drop_last,
            "shard_index": lay.shard_index,
            "num_shards": lay.num_shards,
            "shard_layout": "blocked" if lay.blocked else "interleaved",
            "seed": self._seed,
            "shuffle_buffer": self._buffer,
            "num_epochs": self._num_epochs,
            "epoch": self._epoch,
            "batch": self._batch,
            "position": self._batch * lay.global_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the batch after the one ``state`` was taken at.

        The next run re-creates the stream's iterator and pulls and discards the
        ``position`` records before that batch (O(records skipped)).

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
        epoch, batch = check_stream_state(state, self.state_dict())
        if self._kind == "one-shot" and (epoch, batch) != (self._epoch, self._batch):
            raise ValueError(
                "load_state_dict() needs to read the stream again from its start, but it is "
                f"a one-shot iterator ({type(self._source).__name__}): {ONE_SHOT_FIX}"
            )
        self.close()
        self._epoch, self._batch = epoch, batch
