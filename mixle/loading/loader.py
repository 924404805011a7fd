"""The Loader: batches of any map-style source, shuffled by epoch, sharded, resumable."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.sharding import SHARD_LAYOUTS, DropLast, ShardLayout
from mixle.data.sources.compose.lineage import leaf_origins
from mixle.data.sources.origins import Origins
from mixle.data.sources.protocols import SupportsBatchRead, SupportsOrigins
from mixle.data.spec import SpecTree, spec_of
from mixle.errors import LoaderStateError
from mixle.loading.arguments import (
    DEFAULT_NUM_THREADS,
    PREFETCH_PER_THREAD,
    adopt_source,
    check_source,
    parse_shuffle_block,
)
from mixle.loading.base import LoaderBase
from mixle.loading.element_spec import widen_leading
from mixle.loading.plan import INDEX_WINDOW_ROWS, BatchPlan, batch_plans, record_rng, window
from mixle.loading.prefetch import StopSignal
from mixle.loading.read_ahead import ReadAheadPlans, chunk_keys_of
from mixle.loading.reader import BatchReader, takes_rng
from mixle.loading.resume import ResumedRun, check_cursor_keys, normalize_cursor, resharded
from mixle.loading.state import STATE_VERSION, check_state, layout_state, source_fingerprint
from mixle.loading.streams import StreamLoader, is_stream
from mixle.reading.process_cache import chunk_cache
from mixle.utils.validation import parse_choice, parse_int

__all__ = [
    "DEFAULT_NUM_THREADS",
    "INDEX_WINDOW_ROWS",
    "PREFETCH_PER_THREAD",
    "BatchPlan",
    "Loader",
    "record_rng",
]


class Loader(LoaderBase):
    """Batches of a source, shuffled per epoch, sharded across processes, resumable.

    Parameters
    ----------
    source
        Any map-style object with ``__len__`` and ``__getitem__(int)``: a mixle source or
        sampler, a composition (:func:`mixle.concat`, :func:`mixle.mix`...), a NumPy
        array, a list. When it has ``get_batch(indices)`` (mixle sources and samplers do),
        each batch is one such call. A *stream* instead (an iterable with no length: a
        generator factory, a ``datasets.IterableDataset``) makes ``Loader(...)`` return a
        :class:`~mixle.loading.streams.StreamLoader`, which reads it in arrival order
        (see there). A Hugging Face ``datasets`` dataset without a format set is read
        through :func:`mixle.read_hf` (a batch at a time from Arrow).
    batch_size
        Rows per batch (``>= 1``).
    shuffle
        Read each epoch in its own seeded order (:func:`mixle.data.index_math.permutation.permute`).
    shuffle_block
        With ``shuffle=True``, move blocks of this many consecutive records as units:
        records ``[b k, (b + 1) k)`` stay together and in order, only the blocks' order is
        shuffled (the short last block too), so a sampler whose consecutive records share
        a volume keeps reading one volume at a time
        (:func:`mixle.loading.plan.permute_blocks`). ``None`` (default) takes the source's
        ``shuffle_block`` attribute, or ``1`` (every record on its own) when it has none.
    shuffle_buffer
        Streams only (a seeded shuffle buffer of that many records); ``None`` here.
    seed
        Any int; with ``epoch`` and the record index it keys every shuffle and
        ``record_transform``'s randomness. The default ``0`` is fixed on purpose: every run
        shuffles alike (reproducible runs, resumable state). For a new order per run pass
        a fresh seed and record it, e.g. ``seed=int.from_bytes(os.urandom(8), "little")``
        or a hash of the run's id.
    num_epochs
        Epochs to run (``>= 1``), or ``None`` for an endless stream.
    drop_last
        ``False`` (last batch may be short), ``True`` (drop the remainder) or ``"pad"``
        (pad it to full batches and add a mask of real rows); see
        :mod:`mixle.data.index_math.sharding`.
    shard_index, num_shards
        This process's shard of the epoch; the shards together read each record once.
    shard_layout
        How shards split each global batch of ``batch_size * num_shards`` rows:
        ``"interleaved"`` (default; shard ``s`` takes rows ``s, s + num_shards, ...``) or
        ``"blocked"`` (shard ``s`` takes the ``s``-th block of ``batch_size`` rows, so the
        shards' batches stacked in shard order equal one process's batch of the global
        size); see :mod:`mixle.data.index_math.sharding`.
    transform
        ``transform(batch) -> batch``, run where the batch is read (a reader thread or a
        worker process). A transform with two required positional parameters (or a
        second one named ``rng``) is called ``transform(batch, rng)``, ``rng`` being
        :func:`~mixle.loading.plan.batch_rng` of ``(seed, epoch, batch number,
        shard_index)``.
    record_transform
        ``record_transform(record, rng) -> record`` per record before stacking; ``rng`` is
        :func:`record_rng` of ``(seed, epoch, key)``, the key being the record's index, or
        the source's ``record_keys`` when it has them (a composition: a visit of the record,
        its origin on a first visit and a fresh key for each repeat, so its randomness
        follows it whatever the composition; see :attr:`last_record_keys`).
    num_threads
        Reader threads (default ``min(4, os.cpu_count())``); 0 reads in the caller's
        thread. With ``num_workers``, the reader threads inside each worker process.
    prefetch
        Batches read ahead (default ``2 * num_threads``; ``>= 1``). With ``num_workers``,
        batches in flight per worker (default ``max(2, num_threads)``).
    num_workers
        Worker processes that read the batches and run the transforms (default 0: read in
        this process, in threads). Use them when the transforms are Python-heavy (they
        hold the GIL, so threads add nothing): batch ``k`` of the run goes to worker
        ``k % num_workers``, and the batches come back in order through shared memory,
        as views without a copy (see ``docs/loader.md``).
    worker_start_method
        ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``. Except with ``"fork"``, the
        source and transforms are pickled to each worker (mixle sources by reference, a
        few hundred bytes) and must be importable there.
    timeout
        Seconds a worker process may take to read one batch (``None``: no limit); past it
        the loop raises :class:`~mixle.WorkerTimeoutError`. Only with ``num_workers``.
    check_spec
        Check the batches the source returns against its ``element_spec()`` (with a
        leading axis of the batch's rows), before the transforms: ``"first"`` (default)
        the first batch of each epoch and of each run, ``True`` every batch, ``False``
        never. A batch that breaks the declaration raises
        :class:`~mixle.SchemaMismatchError` naming the field (``batch['image']``), its
        shape and dtype and the declared ones. A source that declares no spec is not
        checked.

    Raises
    ------
    TypeError
        ``source`` is neither map-style nor a stream (or is a path), or an argument has
        the wrong type; with
        ``num_workers`` and a start method other than ``"fork"``, the source or a
        transform cannot be pickled (the message names which).
    ValueError
        ``batch_size``, ``num_epochs``, ``num_shards``, ``num_threads``, ``prefetch``,
        ``num_workers``, ``timeout`` or ``shuffle_block`` (or the source's
        ``shuffle_block``) is out of range, ``check_spec`` is not ``True``, ``"first"`` or
        ``False``, ``worker_start_method`` is not available,
        ``drop_last`` is not ``False``/``True``/``"pad"``, or ``shuffle=True`` for a source
        whose structure forbids reordering.
    IndexError
        ``shard_index`` is outside ``[0, num_shards)``.

    Notes
    -----
    - Iterating yields the remaining batches of the run, from the cursor to the end of
      ``num_epochs``; ``state_dict()`` taken inside the loop body resumes at the next batch.
      A new ``iter()`` stops the previous iterator and continues from the cursor.
    - Batch ``t`` of epoch ``e`` is a pure function of ``(seed, e, t)``, the source and the
      shard layout: the same whatever ``num_threads``, ``prefetch``, ``num_workers`` and
      the start method. After ``load_state_dict(state, reshard=True)`` the epochs the
      state left unfinished read only what no shard had read (so they have fewer batches
      than ``len(loader)``); ``batch_indices`` and ``record_indices`` still describe whole
      epochs.
    - With ``drop_last="pad"`` the mask of real rows is ``batch["mask"]`` for dict records,
      the last element for tuple and list records, and ``(batch, mask)`` for array records.
      It is attached after ``transform``. Padding rows repeat real records (see
      :mod:`mixle.data.index_math.sharding`).
    - Reader threads stop when the loop ends, on ``break`` (the iterator is collected),
      ``close()``, ``with`` exit or an exception, which is re-raised with its traceback.
      The source is not closed: it belongs to the caller.
    - Ctrl-C (``KeyboardInterrupt``) reaches the loop at once, whatever the reader threads
      do. They are daemon threads: stopping waits at most
      :data:`~mixle.loading.prefetch.STOP_GRACE_S` for a read in flight, then leaves a
      thread stuck in it to end by itself (its batch is dropped); it never keeps the
      process from exiting. ``close()`` from another thread stops a loop in progress,
      which raises :class:`~mixle.ReadsStopped`.
    - Worker processes start when a run starts (the first ``next()``) and stop when it
      ends, breaks, fails, is collected or closed, and on Ctrl-C; they exit by themselves
      if this process dies. An exception in a worker is re-raised at its batch, with the
      worker's traceback as its cause; a worker that dies raises
      :class:`~mixle.WorkerDiedError` naming it.
    """

    def __new__(cls, source: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A :class:`~mixle.loading.streams.StreamLoader` when ``source`` is a stream (an
        iterable with no length: :func:`~mixle.loading.streams.is_stream`), else a Loader.

        Raises
        ------
        ValueError
            ``shuffle_buffer`` given for a map-style source.
        """
        source = adopt_source(source)
        if cls is Loader and is_stream(source):
            return StreamLoader(source, *args, **kwargs)
        if kwargs.get("shuffle_buffer") is not None:
            raise ValueError(
                f"shuffle_buffer={kwargs['shuffle_buffer']!r} is for streams, but the source "
                f"({type(source).__name__}) has a length; use shuffle=True"
            )
        return super().__new__(cls)

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        shuffle_block: int | None = None,
        shuffle_buffer: None = None,
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
        source = adopt_source(source)
        check_source(source, shuffle)
        self._source = source
        parse_choice(shard_layout, "shard_layout", SHARD_LAYOUTS)
        self._layout = ShardLayout(
            len(source),
            batch_size,
            shard_index,
            num_shards,
            drop_last,
            blocked=shard_layout == "blocked",
        )
        self._shuffle = shuffle
        self._shuffle_block = parse_shuffle_block(shuffle_block, source)
        check = self._parse_run_options(
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
        fn = self._transform
        self._reader = BatchReader(
            source,
            isinstance(source, SupportsBatchRead),
            self._seed,
            self._layout.shard_index,
            self._record_transform,
            fn,
            fn is not None and takes_rng(fn),
            check,
        )
        self._start_cursor()
        self._resumed = ResumedRun(self._layout, None)  # where a resharded run started

    # -- description --------------------------------------------------------------------
    @property
    def layout(self) -> ShardLayout:
        """Which positions of each epoch this shard reads."""
        return self._layout

    @property
    def shuffle_block(self) -> int:
        """Consecutive records a shuffle moves as one block (1: each record on its own)."""
        return self._shuffle_block

    @property
    def last_origins(self) -> Origins | None:
        """Per row of the batch yielded last, the underlying source and index it came from
        (:class:`~mixle.data.sources.origins.Origins`), for a composed source
        (:func:`mixle.concat`, :func:`mixle.mix`, :func:`mixle.select`, :func:`mixle.map`);
        ``None`` before the first batch or for a source without ``origins``."""
        indices = self._last_indices
        if indices is None or not isinstance(self._source, SupportsOrigins):
            return None
        return leaf_origins(self._source, indices)

    @property
    def last_record_keys(self) -> NDArray[np.uint64] | None:
        """What the batch yielded last keys per-record randomness on: the source's
        ``record_keys`` (a composed source: each record's visit, its origin on a first
        visit, stable however it is composed, and a fresh key for each repeat), else its
        indices. Pass them to :func:`mixle.jax.record_keys` with
        :attr:`last_epoch` for per-record JAX keys that follow the record."""
        indices = self._last_indices
        return None if indices is None else self._reader.record_keys(indices)

    def __len__(self) -> int:
        """Batches per epoch on this shard."""
        return self._layout.num_batches

    def __repr__(self) -> str:
        block = f"shuffle_block={self._shuffle_block}, " if self._shuffle_block != 1 else ""
        return self._describe(
            f"{type(self._source).__name__} of {self._layout.num_records}",
            f"shuffle={self._shuffle}, {block}",
        )

    # -- index math (no I/O) ------------------------------------------------------------
    def _window(
        self, epoch: int, start: int, stop: int
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None]:
        """Record indices and padding mask of batches ``[start, stop)`` of ``epoch``."""
        return window(
            self._layout,
            epoch,
            start,
            stop,
            shuffle=self._shuffle,
            seed=self._seed,
            shuffle_block=self._shuffle_block,
        )

    def _epoch_arg(self, epoch: int | None) -> int:
        epoch = self._epoch if epoch is None else parse_int(epoch, "epoch")
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        return epoch

    def batch_indices(self, batch: int, epoch: int | None = None) -> NDArray[np.int64]:
        """Record indices of batch ``batch`` of ``epoch`` (default: the current epoch)."""
        batch, nb = parse_int(batch, "batch"), self._layout.num_batches
        if not 0 <= batch < nb:
            raise IndexError(f"batch={batch} is out of range for {nb} batches per epoch")
        return self._window(self._epoch_arg(epoch), batch, batch + 1)[0]

    def record_indices(self, epoch: int | None = None) -> NDArray[np.int64]:
        """Real records this shard reads in ``epoch`` (default: the current), in order."""
        indices, mask = self._window(self._epoch_arg(epoch), 0, self._layout.num_batches)
        return indices if mask is None else indices[mask]

    # -- reading ------------------------------------------------------------------------
    def _run(self, signal: StopSignal) -> Iterator[Any]:
        plans = batch_plans(
            self._layout,
            self._epoch,
            self._batch,
            shuffle=self._shuffle,
            seed=self._seed,
            num_epochs=self._num_epochs,
            shuffle_block=self._shuffle_block,
            resume=self._resumed.resume,
        )
        first = list(itertools.islice(plans, 1))  # no batch left: no worker to start
        pooled = bool(self._num_workers and first)
        reader: Callable[[BatchPlan], Any] = self._reader
        ordered: Iterable[BatchPlan] = itertools.chain(first, plans)
        keys_of = chunk_keys_of(self._reader.source) if self._reader.batched else None
        ahead = None
        if keys_of is not None and not pooled:  # the cache keeps what the next batches read
            ahead = ReadAheadPlans(ordered, keys_of, chunk_cache())
            reader, ordered = ahead.reading(reader), ahead
        try:
            yield from self._read_run(reader, ordered, signal, pooled)
        finally:
            if ahead is not None:
                ahead.close()

    def _read_run(
        self,
        reader: Callable[[BatchPlan], Any],
        ordered: Iterable[BatchPlan],
        signal: StopSignal,
        pooled: bool,
    ) -> Iterator[Any]:
        """:meth:`_run`'s reads: the batches in order, moving the cursor."""
        with self._reading(reader, ordered, signal, pooled=pooled) as stream:
            for plan, batch in stream:
                self._epoch, self._batch = (
                    (plan.epoch + 1, 0) if plan.last else (plan.epoch, plan.batch + 1)
                )
                self._last_indices, self._last_epoch = plan.indices, plan.epoch
                yield batch
                del batch  # the caller holds it; do not keep it alive while reading the next
            if self._num_epochs is not None:  # also a shard with no batches ends its run
                self._epoch, self._batch = self._num_epochs, 0

    # -- element spec -------------------------------------------------------------------
    def _spec_from_batch(self) -> SpecTree:
        if self._layout.num_batches == 0:
            raise ValueError(f"{self!r} has no batches to read an element spec from")
        indices, mask = self._window(0, 0, 1)
        rows = indices.size
        spec = spec_of(self._reader(BatchPlan(0, 0, indices, mask)))
        return widen_leading(spec, rows, self.batch_size)

    # -- resume -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor and what it is valid for, as a small JSON-serialisable dict.

        Keys: ``version``, ``source`` (a fingerprint, see
        :func:`mixle.loading.state.source_fingerprint`), ``num_records``, ``batch_size``,
        ``drop_last``, ``shard_index``, ``num_shards``, ``shard_layout``, ``seed``,
        ``shuffle``, ``shuffle_block`` (only when it is not 1: a state without it means 1,
        so states of runs without blocks stay as they were), ``num_epochs``, ``epoch``,
        ``batch`` (the next batch), ``position`` (rows of the epoch read on this shard),
        ``global_position`` (the first position of the epoch's global order no shard has
        read, if every shard stands at this ``epoch`` and ``batch``: ``batch * batch_size
        * num_shards`` in a run from the beginning) and ``remainder`` (``None``, or where a
        run resumed with ``reshard=True`` started; see :mod:`mixle.loading.resume`).
        """
        return self._state(copy=True)

    def _shared_state(self) -> dict[str, Any]:
        """:meth:`state_dict` whose remainder lists are shared with the run's other such
        states: O(1) however many ranges it lists (``JaxLoader`` keeps one per batch and
        copies it when asked for its state)."""
        return self._state(copy=False)

    def _state(self, *, copy: bool) -> dict[str, Any]:
        lay = self._layout
        block = {"shuffle_block": self._shuffle_block} if self._shuffle_block != 1 else {}
        return {
            "version": STATE_VERSION,
            "source": source_fingerprint(self._source),  # now: a sampler's epoch may change
            "num_records": lay.num_records,
            **layout_state(lay),
            "seed": self._seed,
            "shuffle": self._shuffle,
            **block,
            "num_epochs": self._num_epochs,
            "epoch": self._epoch,
            "batch": self._batch,
            **self._resumed.cursor_state(self._epoch, self._batch, copy=copy),
        }

    def load_state_dict(self, state: dict[str, Any], *, reshard: bool = False) -> None:
        """Resume at the batch after the one ``state`` was taken at.

        Parameters
        ----------
        state
            A dict :meth:`state_dict` returned (a JSON round trip keeps it), or one
            :func:`mixle.merge_states` made of every shard's.
        reshard
            ``False`` (default): ``state`` was saved by this shard of this layout, and the
            run goes on exactly as it would have. ``True``: ``state`` may come from another
            ``batch_size``, ``num_shards``, ``shard_index`` or ``shard_layout`` (and any
            ``num_workers``); the run continues at the state's global cursor, this shard
            reading its part of the records of each epoch no shard has read yet, then
            whole epochs as usual. A single state stands for every shard at its epoch and
            batch (lock-step training); for shards that stopped apart, pass
            :func:`mixle.merge_states` of them all. See ``docs/loader.md``.

        Raises
        ------
        LoaderStateError
            (a ``ValueError``) ``state`` was saved for another source, seed, ``shuffle``,
            ``shuffle_block``, number of epochs or ``drop_last``, or (without ``reshard``)
            another batch size or shard layout, or is a merged state; its cursor is out
            of range or its keys disagree; with ``reshard``, it is one shard's state of a
            layout whose shards read different numbers of batches per epoch; or it is not
            a state dict: a key is missing or unknown, or a value has the wrong type or
            range (e.g. ``epoch=True``, ``batch=7.0``, a negative count, a fingerprint
            that is not a string). The message names the key, the value and what was
            expected.
        TypeError
            ``reshard`` is not ``True`` or ``False``.
        """
        if not isinstance(reshard, bool):
            raise TypeError(f"reshard={reshard!r} must be True or False")
        check_state(state, self.state_dict(), reshard=reshard)
        saved, resume, epoch, batch = check_cursor_keys(state, self._num_epochs)
        merged = state.get("merged", False)
        if reshard:
            resume, epoch, batch = resharded(state, saved, resume, (epoch, batch), self._layout)
        elif merged:
            raise LoaderStateError(
                "state was made by mixle.merge_states() (it has 'merged': True): it stands "
                "for every shard, so load it with load_state_dict(state, reshard=True)"
            )
        self.close()
        self._resumed = ResumedRun(self._layout, resume)
        self._epoch, self._batch = normalize_cursor(
            self._layout, resume, epoch, batch, self._num_epochs
        )
