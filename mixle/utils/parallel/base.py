"""The contract every encoded-data backend keeps, and the logic they share.

A backend shards ``data`` by index (:mod:`mixle.data.index_math.sharding`), has each worker
build and keep its encoded shard, and runs ``fn(encoded_shard, *args)`` where the shards
live. Backends implement :meth:`EncodedData._map` and :meth:`EncodedData._shutdown`.
"""

from __future__ import annotations

import abc
import functools
import operator
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.sharding import ShardPlan
from mixle.errors import BrokenEncodedDataError, EncodedDataClosedError
from mixle.utils.parallel.encoding import pickled_size, read_piece, tree_nbytes
from mixle.utils.validation import parse_choice, parse_timeout

__all__ = [
    "WORKER_READ_MAX_PICKLE_BYTES",
    "EncodedData",
    "ReadIn",
    "parse_read_in",
    "parse_timeout",
]

ReadIn = Literal["auto", "workers", "driver"]
_READ_IN: tuple[str, ...] = ("auto", "workers", "driver")

#: ``read_in="auto"`` lets workers read when ``data`` pickles to at most this many bytes.
WORKER_READ_MAX_PICKLE_BYTES = 64 * 1024

#: Marks "use the handle's own timeout" in per-call ``timeout=`` arguments.
_HANDLE_TIMEOUT: Any = object()


def parse_read_in(read_in: object, data: Any) -> Literal["workers", "driver"]:
    """Resolve ``read_in=``: ``"auto"`` picks ``"workers"`` when ``data`` pickles small.

    Raises
    ------
    ValueError
        For an unknown value.
    TypeError
        For ``"workers"`` when ``data`` cannot be pickled.
    """
    parse_choice(read_in, "read_in", _READ_IN)
    if read_in == "driver":
        return "driver"
    small = pickled_size(data, WORKER_READ_MAX_PICKLE_BYTES) is not None
    if read_in == "auto":
        return "workers" if small else "driver"
    if pickled_size(data, 2**62) is None:
        raise TypeError(
            f"read_in='workers' needs data that pickles, but {type(data).__name__} does not; "
            "open it with a mixle read_* function (pickled by reference) or use "
            "read_in='driver'"
        )
    return "workers"


class EncodedData(abc.ABC):
    """Worker-resident encoded shards of an indexable ``data`` object; map/reduce over them.

    Notes
    -----
    Worker ``i`` holds ``data[j]`` for ``j in shard_indices(i)``. ``map`` may be called from
    several threads: MPEncodedData runs one call at a time per handle (the others wait),
    DaskEncodedData lets them overlap. After a worker dies, a call times out or a call is
    interrupted (Ctrl-C) the handle is broken, the work in flight is stopped, and every
    later call raises :class:`~mixle.errors.BrokenEncodedDataError` at once; after
    :meth:`close` they raise :class:`~mixle.errors.EncodedDataClosedError`.
    """

    _plan: ShardPlan
    _read_in: Literal["workers", "driver"]
    _timeout: float | None
    _closed: bool = False
    _broken: str | None = None
    _driver_bytes_read: int = 0
    _bytes_sent: int = 0

    # -- description --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._plan.length

    @property
    def num_workers(self) -> int:
        """Number of shards (one per worker)."""
        return self._plan.num_workers

    @property
    def read_in(self) -> Literal["workers", "driver"]:
        """Who read the records: ``"workers"`` or ``"driver"`` (``"auto"`` resolved)."""
        return self._read_in

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @property
    def broken(self) -> bool:
        """Whether a lost worker, a timeout or an interrupted call left the handle unusable."""
        return self._broken is not None

    @property
    def stats(self) -> dict[str, int | str]:
        """``read_in``, ``driver_bytes_read`` (array bytes the driver read from ``data``)
        and ``bytes_sent`` (pickled bytes the driver sent to build the shards)."""
        return {
            "read_in": self._read_in,
            "driver_bytes_read": self._driver_bytes_read,
            "bytes_sent": self._bytes_sent,
        }

    def shard_indices(self, worker: int) -> NDArray[np.int64]:
        """The indices of ``data`` that worker ``worker`` holds, in shard order."""
        return self._plan.shard_indices(worker)

    # -- calls --------------------------------------------------------------------------
    def map(self, fn: Callable[..., Any], *args: Any, timeout: Any = _HANDLE_TIMEOUT) -> list[Any]:
        """Run ``fn(encoded_shard, *args)`` in every worker; one result per worker, in order.

        Parameters
        ----------
        fn
            A picklable function (defined at module level); it runs where the shard lives.
        *args
            Extra arguments, pickled and sent to every worker.
        timeout
            Seconds this call may take; defaults to the handle's ``timeout``.

        Raises
        ------
        WorkerError
            When ``fn`` raised in a worker; carries the worker index and its traceback. The
            handle stays usable.
        WorkerDiedError, WorkerTimeoutError
            When a worker was lost or the call ran out of time; the handle is broken.
        KeyboardInterrupt
            Re-raised when the call is interrupted; the handle is broken.
        """
        self._check_usable()
        limit = self._timeout if timeout is _HANDLE_TIMEOUT else parse_timeout(timeout)
        if not callable(fn):
            raise TypeError(f"fn={fn!r} must be callable as fn(encoded_shard, *args)")
        return self._map(fn, args, limit)

    def map_reduce(
        self,
        fn: Callable[..., Any],
        *args: Any,
        reduce: Callable[[Any, Any], Any] = operator.add,
        timeout: Any = _HANDLE_TIMEOUT,
    ) -> Any:
        """``functools.reduce(reduce, self.map(fn, *args))``, folded in worker order."""
        return functools.reduce(reduce, self.map(fn, *args, timeout=timeout))

    # -- lifetime -----------------------------------------------------------------------
    def _check_usable(self) -> None:
        name = type(self).__name__
        if self._closed:
            raise EncodedDataClosedError(
                f"{name} is closed; build a new {name}(data, ...) to run more calls"
            )
        if self._broken is not None:
            raise BrokenEncodedDataError(
                f"{name} is broken ({self._broken}); close it and build a new one"
            )

    def _abandon(self) -> None:
        """Release what a constructor that failed half-way started."""
        self._closed = True
        self._shutdown(graceful=False)

    def _read_here(self, data: Any, pieces: Any, batched: bool) -> list[Any]:
        """Read one worker's sub-chunks in the driver (``read_in="driver"``), counting bytes."""
        raw = [read_piece(data, p, batched) for p in pieces]
        self._driver_bytes_read += tree_nbytes(raw)
        return raw

    def _break(self, reason: str) -> None:
        """Mark the handle broken and stop its workers."""
        self._broken = reason
        self._shutdown(graceful=False)

    def close(self) -> None:
        """Stop the workers and free their shards; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._shutdown(graceful=self._broken is None)

    def __enter__(self) -> EncodedData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "broken" if self._broken else "ready"
        return (
            f"<{type(self).__name__} {len(self)} records on {self.num_workers} workers, "
            f"read_in={self._read_in!r}, {state}>"
        )

    @abc.abstractmethod
    def _map(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> list:
        """Run ``fn(shard, *args)`` on every shard; results in worker order."""

    @abc.abstractmethod
    def _shutdown(self, graceful: bool) -> None:
        """Release workers and shards (idempotent)."""
