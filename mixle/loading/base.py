"""What the Loader over a map-style source and the Loader over a stream share.

:class:`LoaderBase` holds the arguments both parse the same way, the cursor and the
properties on it, the run around the reader threads or the worker pool, ``to_jax`` and
the cached element spec. What a batch is (the plans, the reads, the state) stays in
:class:`mixle.Loader` and :class:`~mixle.loading.streams.StreamLoader`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.hashing import parse_seed
from mixle.data.index_math.sharding import DropLast
from mixle.data.spec import SpecTree
from mixle.loading.adapters import adapt
from mixle.loading.arguments import parse_callable, parse_count, parse_threads, parse_workers
from mixle.loading.element_spec import spec_from_metadata
from mixle.loading.prefetch import StopSignal, ordered_map
from mixle.loading.runs import ActiveRun, workers_module
from mixle.loading.spec_check import parse_check_spec

if TYPE_CHECKING:
    from mixle.jax import JaxLoader
    from mixle.loading.workers import WorkerPool

__all__ = ["LoaderBase", "ShardLayoutLike"]


class ShardLayoutLike(Protocol):
    """What both loaders' layouts say about a shard's batches (``ShardLayout``,
    ``StreamLayout``)."""

    @property
    def batch_size(self) -> int: ...
    @property
    def shard_index(self) -> int: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def drop_last(self) -> DropLast: ...
    @property
    def blocked(self) -> bool: ...


class LoaderBase(ActiveRun, ABC):
    """The base of :class:`mixle.Loader` and :class:`~mixle.loading.streams.StreamLoader`.

    ``mixle.Loader(source, ...)`` returns a ``Loader`` for a map-style source and a
    ``StreamLoader`` for a stream; ``isinstance(obj, LoaderBase)`` is true for both, so it
    is the check for "anything ``mixle.Loader(...)`` returns" (``isinstance(obj,
    mixle.Loader)`` is false for a ``StreamLoader``: it has no ``len()``,
    ``batch_indices()`` or shuffle). Both have the properties and methods here, plus
    ``layout``, ``last_record_keys``, ``state_dict()`` and ``load_state_dict()``, which
    each defines for its kind of source.

    Notes
    -----
    Not made directly: a subclass parses its own arguments, calls
    :meth:`_parse_run_options` and, once ``_reader`` is set, :meth:`_start_cursor`, and
    defines ``_run`` (one run from the cursor) and ``_spec_from_batch``.
    """

    _source: Any
    _layout: ShardLayoutLike
    _reader: Callable[[Any], Any]
    _seed: int
    _num_epochs: int | None
    _transform: Callable[..., Any] | None
    _record_transform: Callable[..., Any] | None
    _num_workers: int
    _start_method: str
    _timeout: float | None
    _num_threads: int
    _prefetch: int
    _spec: SpecTree | None
    _epoch: int
    _batch: int
    _last_indices: NDArray[np.int64] | None
    _last_epoch: int | None
    _pool: WorkerPool | None

    # -- construction -------------------------------------------------------------------
    def _parse_run_options(
        self,
        seed: object,
        num_epochs: object,
        transform: object,
        record_transform: object,
        num_threads: object,
        prefetch: object,
        num_workers: object,
        worker_start_method: object,
        timeout: object,
        check_spec: object,
    ) -> str:
        """Check and keep the arguments both loaders share (in this order, so the first
        bad one is the one named); return ``check_spec``'s policy
        (:func:`~mixle.loading.spec_check.parse_check_spec`)."""
        self._seed = parse_seed(seed)
        self._num_epochs = None if num_epochs is None else parse_count(num_epochs, "num_epochs", 1)
        self._transform = parse_callable(transform, "transform")
        self._record_transform = parse_callable(record_transform, "record_transform")
        self._num_workers, self._start_method, self._timeout = parse_workers(
            num_workers, worker_start_method, timeout
        )
        self._num_threads, self._prefetch = parse_threads(num_threads, prefetch, self._num_workers)
        return parse_check_spec(check_spec)

    def _start_cursor(self) -> None:
        """Put the cursor at the start of the run; with workers, first check that the reader
        pickles (the error names what does not)."""
        if self._num_workers:
            workers_module().reader_payload(self._reader, self._start_method, check_only=True)
        self._spec = None
        self._epoch = 0
        self._batch = 0
        self._last_indices = None
        self._last_epoch = None
        self._pool = None

    # -- description --------------------------------------------------------------------
    @property
    def source(self) -> Any:
        """The source (or stream) batches are read from."""
        return self._source

    @property
    def batch_size(self) -> int:
        """Rows per batch."""
        return self._layout.batch_size

    @property
    def num_workers(self) -> int:
        """Worker processes that read the batches (0: read in this process)."""
        return self._num_workers

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the running worker processes, in worker order (empty when no run
        with workers is in progress)."""
        pool = self._pool
        return () if pool is None else pool.pids

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._epoch

    @property
    def last_indices(self) -> NDArray[np.int64] | None:
        """Where the rows of the batch yielded last come from: record indices of a map-style
        source (padding rows repeat real records), or stream positions in the epoch's
        unshuffled pass of a stream."""
        return self._last_indices

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the batch yielded last (``epoch`` is the next batch's, one more
        after an epoch's last batch); with :attr:`last_indices` it keys per-record
        randomness such as :func:`mixle.jax.record_keys`."""
        return self._last_epoch

    def _describe(self, what: str, options: str) -> str:
        """The ``repr``: ``Loader(<what>, batch_size=..., <options>seed=..., ...)``."""
        lay = self._layout
        if self._num_workers:
            options += f"num_workers={self._num_workers}, "
        return (
            f"Loader({what}, batch_size={lay.batch_size}, {options}seed={self._seed}, "
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

    @abstractmethod
    def _run(self, signal: StopSignal) -> Iterator[Any]:
        """The batches from the cursor to the end of the run, moving the cursor."""

    @contextmanager
    def _reading(
        self,
        reader: Callable[[Any], Any],
        plans: Iterable[Any],
        signal: StopSignal,
        *,
        pooled: bool,
    ) -> Iterator[Iterator[tuple[Any, Any]]]:
        """``(plan, reader(plan))`` in plan order: read in worker processes when ``pooled``
        (``reader`` pickled to each), else in this process's reader threads.

        On leaving, the reads stop; the pool stops gracefully when the body ended without
        an exception (a ``break`` included), and at once otherwise.
        """
        pool = None
        if pooled:
            workers = workers_module()
            pool = workers.WorkerPool(
                reader,
                num_workers=self._num_workers,
                start_method=self._start_method,
                num_threads=self._num_threads,
                prefetch=self._prefetch,
                timeout=self._timeout,
                pickled=workers.reader_payload(reader, self._start_method),
            )
            self._pool = pool
            stream = pool.batches(plans, signal)
        else:
            stream = ordered_map(
                reader,
                plans,
                num_threads=self._num_threads,
                prefetch=self._prefetch,
                signal=signal,
            )
        finished = False
        try:
            yield stream
            finished = True
        finally:
            stream.close()  # type: ignore[attr-defined]
            if pool is not None:
                pool.stop(graceful=finished)
                if self._pool is pool:
                    self._pool = None

    def _shared_state(self) -> dict[str, Any]:
        """The state for mixle's own bookkeeping (``JaxLoader`` keeps one per batch): the
        Loader over a map-style source shares its remainder lists between such states."""
        return self.state_dict()  # type: ignore[attr-defined,no-any-return]

    def to_jax(self, **options: Any) -> JaxLoader:
        """This loader's batches as ``jax.Array`` pytrees on devices (needs ``mixle[jax]``).

        ``options`` are :meth:`mixle.jax.JaxLoader.from_loader`'s: ``sharding``, ``device``,
        ``prefetch``, ``dtype_policy``.
        """
        return adapt("jax", self, **options)  # type: ignore[no-any-return]

    # -- element spec -------------------------------------------------------------------
    def element_spec(self) -> SpecTree:
        """Shapes and dtypes of one batch: the record's with a leading ``batch_size`` axis.

        From the source's ``element_spec()`` when there is no transform; otherwise (or when
        the source reports none) from reading the first batch once: batch 0 of epoch 0 of
        a map-style source, the first batch of a fresh pass of epoch 0 of a stream (a
        one-shot iterator cannot: ``ValueError``). The mask, with ``drop_last="pad"``, is
        ``ArraySpec((batch_size,), bool)``. With ``drop_last=False`` the last batch of an
        epoch may be shorter.
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

    @abstractmethod
    def _spec_from_batch(self) -> SpecTree:
        """The batch spec from reading the first batch (see :meth:`element_spec`)."""
