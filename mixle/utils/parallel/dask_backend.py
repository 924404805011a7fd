"""DaskEncodedData: worker-resident encoded shards on a Dask cluster; each worker reads its own.

Each shard is a task pinned to one Dask worker that reads and encodes it there; the
resulting future stays held, so the shard stays in that worker's memory. ``map`` submits
``fn(shard, *args)`` pinned to the same worker, so it runs where the shard lives.

Chunk cache: the Dask worker processes on one host share one job's default budget, as
``MPEncodedData`` workers do (:func:`~mixle.reading.process_cache.share_default_chunk_cache` with
the number of Dask workers on that host), unless the driver's user set a budget
(``set_chunk_cache_bytes``), which each worker then keeps. Workers running inside the
driver's own process (``processes=False``) are left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import traceback
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from mixle.data.index_math.sharding import parse_count, plan_shards
from mixle.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from mixle.reading.process_cache import (
    set_chunk_cache_bytes,
    share_default_chunk_cache,
    user_chunk_cache_bytes,
)
from mixle.utils.optional_deps import require
from mixle.utils.parallel.base import EncodedData, ReadIn, parse_read_in, parse_timeout
from mixle.utils.parallel.encoding import (
    EncoderLike,
    build_shard,
    dumps_for_workers,
    parse_encoder,
    reads_batches,
)
from mixle.utils.progress import ProgressBar, parse_progress, progress_bar

__all__ = [
    "KILL_GRACE_S",
    "POLL_INTERVAL_S",
    "QUIET_SCHEDULER",
    "DaskEncodedData",
    "scheduler_workers",
]

#: The scheduler's HTTP routes bind a free port instead of 8787 (which warns when taken).
QUIET_SCHEDULER = {"dashboard": False, "dashboard_address": ":0"}
#: How often a waiting call checks that the shards it needs still exist.
POLL_INTERVAL_S = 0.2
#: Seconds a broken handle's own cluster gives busy workers before killing them.
KILL_GRACE_S = 0.5


#: ``(num_workers_on_host, driver_budget, driver)``: the chunk-cache rule a shard's build applies.
CacheRule = tuple[int, int | None, tuple[str, int]]


def _driver() -> tuple[str, int]:
    """This process's ``(host name, pid)``: a build running in it is not a worker's."""
    return socket.gethostname(), os.getpid()


def _build_remote(
    data: Any, pieces: Any, encoder: Any, batched: bool, raw: Any, cache: CacheRule
) -> Any:
    workers, budget, driver = cache
    if _driver() != driver:  # a Dask worker process, not the driver's own (processes=False)
        share_default_chunk_cache(workers)
        if budget is not None:
            set_chunk_cache_bytes(budget)
    return build_shard(data, pieces, encoder, batched, raw_pieces=raw)


def _workers_per_host(workers: dict[str, Any]) -> dict[str, int]:
    """Dask worker address -> how many Dask workers share its host (its ``host`` field)."""
    hosts = {address: info.get("host", address) for address, info in workers.items()}
    counts = Counter(hosts.values())
    return {address: counts[host] for address, host in hosts.items()}


def scheduler_workers(client: Any) -> dict[str, Any]:
    """Worker address -> the scheduler's record of it, asked of the scheduler itself.

    Not ``client.scheduler_info()``: that returns the client's cached copy, which the
    client's own periodic refresh can replace with a summary listing no workers between
    the fetch and the read (seen as "has no workers" on a cluster with two).
    """
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def _call_remote(fn: Callable[..., Any], shard: Any, *args: Any) -> Any:
    return fn(shard, *args)


async def _stop_workers(workers: list[Any], grace: float) -> None:
    """Close a local cluster's nannies, killing worker processes still busy after ``grace``."""
    await asyncio.gather(
        *(w.close(timeout=grace, reason="mixle-handle-broken") for w in workers),
        return_exceptions=True,
    )


def _release(
    client: Any, futures: list[Any], own: tuple[Any, Any] | None, grace: float | None = None
) -> None:
    """Drop the shard futures (freeing worker memory); close a cluster the handle started.

    With ``grace``, worker processes of that cluster still running a task after ``grace``
    seconds are killed (Dask cannot interrupt a running task).
    """
    if futures and client.status == "running":
        client.cancel(futures)
    futures.clear()
    if own is not None:
        if grace is not None:
            with contextlib.suppress(Exception):
                own[1].sync(_stop_workers, list(own[1].workers.values()), grace)
        own[0].close()
        own[1].close()


class DaskEncodedData(EncodedData):
    """Shard ``data`` over the workers of a Dask cluster, each reading its own shard.

    Parameters
    ----------
    data, encoder, sub_chunks, read_in, timeout, progress
        As for :class:`~mixle.utils.parallel.multiprocessing.MPEncodedData`.
    client
        A ``distributed.Client``; default: the current client, else a local cluster (one
        single-threaded worker process per shard) that :meth:`close` shuts down.
    num_workers
        Number of shards; default: one per Dask worker. Shard ``i`` lives on worker
        ``i % len(workers)`` (workers sorted by address).

    Notes
    -----
    A Dask worker that is lost takes its shards with it: the call waiting on it, or the
    constructor while it builds them, raises :class:`~mixle.errors.WorkerDiedError`
    (checked every :data:`POLL_INTERVAL_S` seconds, with or without ``timeout``) and the
    handle is broken. An interrupted call (Ctrl-C) cancels its tasks and breaks the handle;
    on a cluster the handle started, workers still busy after :data:`KILL_GRACE_S` seconds
    are killed (Dask cannot interrupt a running task).
    """

    def __init__(
        self,
        data: Any,
        encoder: EncoderLike = None,
        *,
        client: Any = None,
        num_workers: int | None = None,
        sub_chunks: int = 1,
        read_in: ReadIn = "auto",
        timeout: float | None = None,
        progress: bool | None = None,
    ) -> None:
        self._progress = parse_progress(progress)
        distributed = require("distributed", "dask", feature="DaskEncodedData")
        self._distributed = distributed
        self._timeout = parse_timeout(timeout)
        fn = parse_encoder(encoder)
        self._read_in = parse_read_in(read_in, data)
        chunks = parse_count(sub_chunks, "sub_chunks")
        if num_workers is not None:
            num_workers = parse_count(num_workers, "num_workers")
        own = None
        if client is None:
            try:
                client = distributed.default_client()
            except ValueError:  # no client yet: start a private local cluster
                cluster = distributed.LocalCluster(
                    n_workers=num_workers or None,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    scheduler_kwargs=QUIET_SCHEDULER,
                )
                client = distributed.Client(cluster, set_as_default=False)  # not the user's default
                own = (client, cluster)
        self._client = client
        self._shards: list[Any] = []
        self._own = own
        self._finalizer = weakref.finalize(self, _release, client, self._shards, own)
        try:
            workers = scheduler_workers(client)
            addresses = sorted(workers)
            if not addresses:
                raise ValueError(f"client={client!r} has no workers; start some first")
            self._sharing = _workers_per_host(workers)
            shards = len(addresses) if num_workers is None else num_workers
            self._plan = plan_shards(data, len(data), shards, chunks)
            self._homes = [addresses[w % len(addresses)] for w in range(shards)]
            self._build(data, fn, reads_batches(data, fn))
        except BaseException:
            self._abandon()
            raise

    @property
    def client(self) -> Any:
        """The ``distributed.Client`` the shards live on."""
        return self._client

    @property
    def homes(self) -> tuple[str, ...]:
        """Address of the Dask worker holding each shard, in shard order."""
        return tuple(self._homes)

    def _build(self, data: Any, encoder: Any, batched: bool) -> None:
        token = uuid.uuid4().hex
        shards = self.num_workers
        driver = self._read_in == "driver"
        show = self._progress if driver else False  # a reading bar only when reading here
        budget, here = user_chunk_cache_bytes(), _driver()
        with progress_bar(shards, "reading shards", "shard", enabled=show) as reading:
            for w, pieces in enumerate(self._plan.pieces):
                home = self._homes[w]
                if not driver:
                    args: tuple[Any, ...] = (data, pieces, encoder, batched, None)
                else:
                    raw = self._read_here(data, pieces, batched)
                    [raw] = self._client.scatter([raw], workers=[home])
                    args = (None, None, encoder, batched, raw)
                self._bytes_sent += len(dumps_for_workers(args[:4], "data and encoder"))
                cache: CacheRule = (self._sharing[home], budget, here)
                self._shards.append(
                    self._client.submit(
                        _build_remote,
                        *args,
                        cache,
                        key=f"mixle-shard-{w}-{token}",
                        workers=[home],
                        allow_other_workers=False,
                        pure=False,
                    )
                )
                reading.update(1)
        with progress_bar(shards, "building shards", "shard", enabled=self._progress) as bar:
            self._wait(  # waits only: the shards stay on their workers
                list(self._shards), self._timeout, "building the shards", build=True, bar=bar
            )

    def _map(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> list:
        self._check_usable()
        what = f"map({getattr(fn, '__qualname__', fn)!s})"
        dumps_for_workers((fn, args), "fn and its arguments")
        calls: list[Any] = []
        try:
            for shard, home in zip(self._shards, self._homes):
                calls.append(
                    self._client.submit(
                        _call_remote,
                        fn,
                        shard,
                        *args,
                        workers=[home],
                        allow_other_workers=False,
                        pure=False,
                    )
                )
            return self._wait(calls, timeout, what)
        except (WorkerError, WorkerTimeoutError):  # a user error, or already broken
            raise
        except BaseException as exc:  # e.g. KeyboardInterrupt: the tasks may still run
            if self._broken is None:
                self._break(f"{type(exc).__name__} during {what}")
            raise
        finally:
            if self._client.status == "running":
                self._client.cancel(calls)

    def _wait(
        self,
        futures: list[Any],
        timeout: float | None,
        what: str,
        *,
        build: bool = False,
        bar: ProgressBar | None = None,
    ) -> list[Any]:
        """Results of ``futures`` in order (none when ``build``: shards stay on the workers);
        bounded by ``timeout``; while mapping, a lost shard ends the wait. ``bar`` advances
        as futures finish."""
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                late = tuple(w for w, f in enumerate(futures) if not f.done())
                self._break(f"{what} ran past timeout={timeout}s")
                raise WorkerTimeoutError(
                    f"{what} ran past timeout={timeout}s waiting for shards {list(late)}; "
                    "the handle is broken: build a new one with a larger timeout=",
                    workers=late,
                )
            step = POLL_INTERVAL_S if remaining is None else min(POLL_INTERVAL_S, remaining)
            with contextlib.suppress(TimeoutError), self._client.as_current():
                self._distributed.wait(futures, timeout=step)
            if bar is not None:
                done = sum(f.status == "finished" for f in futures)
                bar.update(done - shown)
                shown = done
            if all(f.done() for f in futures) or any(f.status == "error" for f in futures):
                break
            self._check_homes(what, build)
        for w, future in enumerate(futures):
            if future.status == "error":
                self._raise_error(w, future, what)
        return [] if build else [f.result() for f in futures]

    def _check_homes(self, what: str, build: bool) -> None:
        """Raise WorkerDiedError when a shard's Dask worker left the cluster or, once built,
        the shard is no longer held (a task pinned to a gone worker would wait for ever)."""
        live = self._client.nthreads()
        for w, home in enumerate(self._homes):
            if home not in live or (not build and self._shards[w].status != "finished"):
                self._lost(w, what)

    def _lost(self, worker: int, what: str) -> None:
        reason = f"shard {worker} on Dask worker {self._homes[worker]} was lost during {what}"
        self._break(reason)
        raise WorkerDiedError(
            f"{reason}; the handle is broken: close it and build a new one", worker=worker
        )

    def _raise_error(self, worker: int, future: Any, what: str) -> None:
        exc = future.exception()
        if type(exc).__name__ == "KilledWorker":
            self._lost(worker, what)
        tb = future.traceback()
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        raise WorkerError(
            f"worker {worker} of {self.num_workers} raised {type(exc).__name__} during "
            f"{what}: {exc}\n\nWorker traceback:\n{text}",
            worker=worker,
            remote_traceback=text,
            exc_type=type(exc).__name__,
        )

    def _shutdown(self, graceful: bool) -> None:
        if self._finalizer.alive:
            # detached only once done: a second Ctrl-C here leaves the rest to the finalizer
            _release(self._client, self._shards, self._own, None if graceful else KILL_GRACE_S)
            self._finalizer.detach()
