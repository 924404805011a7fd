"""MPEncodedData: worker-resident encoded shards in local processes; each worker reads its own.

The driver sends each worker the pickled ``data`` (a few hundred bytes for mixle sources
and samplers) and its index range; the worker reads and encodes its shard, keeps it, and
runs ``fn(shard, *args)`` on request.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mixle.data.index_math.sharding import parse_count, plan_shards
from mixle.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from mixle.reading.process_cache import user_chunk_cache_bytes
from mixle.utils.parallel._worker import CLOSE, worker_main
from mixle.utils.parallel.base import EncodedData, ReadIn, parse_read_in, parse_timeout
from mixle.utils.parallel.encoding import (
    EncoderLike,
    dumps_for_workers,
    parse_encoder,
    reads_batches,
)
from mixle.utils.processes import describe_exit, orphan_guard_args, stop_processes
from mixle.utils.progress import parse_progress, progress_bar

__all__ = ["SHUTDOWN_GRACE_S", "MPEncodedData"]

#: Seconds ``close()`` waits for workers to exit on their own before terminating them.
SHUTDOWN_GRACE_S = 5.0


def _shutdown(procs: list[BaseProcess], conns: list[Connection], graceful: bool) -> None:
    """Stop ``procs`` and close ``conns``: ask, then terminate, then kill. Idempotent."""
    stop_processes(procs, conns, close_message=CLOSE if graceful else None, grace=SHUTDOWN_GRACE_S)
    procs.clear()
    conns.clear()


class MPEncodedData(EncodedData):
    """Shard ``data`` over local worker processes that read, encode and keep their shards.

    Parameters
    ----------
    data
        Anything with ``__len__`` and ``__getitem__`` (a ``PatchSampler``, a source, a list).
    encoder
        ``encoder(records) -> encoded`` or an object with ``seq_encode(records)``; picklable.
        ``None`` keeps the records, stacked leaf by leaf (``data.get_batch`` when it has one).
    num_workers
        Number of worker processes; default ``min(os.cpu_count(), len(data))``, at least 1.
    sub_chunks
        Each worker encodes its shard in this many pieces (bounding the records held at
        once); with more than one, ``fn`` receives the list of encoded pieces.
    start_method
        ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``.
    read_in
        ``"workers"``: send the pickled ``data`` and each worker reads its shard;
        ``"driver"``: read here and send the shards; ``"auto"``: workers when ``data``
        pickles small (mixle sources and samplers always do).
    timeout
        Seconds that building the shards, and each later call, may take; ``None``: no limit.
    progress
        Show a progress bar of shards built (and, with ``read_in="driver"``, one of shards
        read here first): ``True``, ``False`` or ``None`` (automatic; see
        :mod:`mixle.utils.progress`).

    Raises
    ------
    TypeError
        ``progress`` is not ``True``, ``False`` or ``None``.
    WorkerError
        When reading or encoding a shard raised in a worker.
    WorkerDiedError, WorkerTimeoutError
        When a worker died or building ran past ``timeout``.

    Notes
    -----
    Worker ``i`` holds ``data[j]`` for ``j in range(i, len(data), num_workers)``; with a
    ``partially_exchangeable`` structure on ``data`` whole groups go to one worker
    (:meth:`shard_indices` tells which). A worker that dies is detected as soon as its
    process exits. Workers are daemon processes, stopped by :meth:`close`, by garbage
    collection of the handle, at interpreter exit and when a call is interrupted; they
    exit on their own when the driver dies, even mid-call. Each worker's default
    decoded-chunk cache budget is its share of one job's (``DEFAULT_CHUNK_CACHE_BYTES //
    num_workers``, at least ``MIN_WORKER_CHUNK_CACHE_BYTES``); a budget set in the driver
    with ``set_chunk_cache_bytes`` before the handle is built applies in every worker.
    """

    def __init__(
        self,
        data: Any,
        encoder: EncoderLike = None,
        *,
        num_workers: int | None = None,
        sub_chunks: int = 1,
        start_method: str = "spawn",
        read_in: ReadIn = "auto",
        timeout: float | None = None,
        progress: bool | None = None,
    ) -> None:
        self._progress = parse_progress(progress)
        n = len(data)
        workers = max(1, min(os.cpu_count() or 1, n)) if num_workers is None else num_workers
        workers = parse_count(workers, "num_workers")
        chunks = parse_count(sub_chunks, "sub_chunks")
        methods = multiprocessing.get_all_start_methods()
        if start_method not in methods:
            raise ValueError(
                f"start_method={start_method!r} is not available here; use one of "
                f"{', '.join(map(repr, methods))}"
            )
        self._timeout = parse_timeout(timeout)
        fn = parse_encoder(encoder)
        self._read_in = parse_read_in(read_in, data)
        self._plan = plan_shards(data, n, workers, chunks)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._pids: list[int] = []
        # registered before any process starts, so a failure half-way still cleans up
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, False)
        try:
            self._start(multiprocessing.get_context(start_method))
            self._build(data, fn, reads_batches(data, fn))
        except BaseException:
            self._abandon()
            raise

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the workers, in worker order."""
        return tuple(self._pids)

    def _start(self, ctx: Any) -> None:
        parent, pdeathsig = orphan_guard_args(ctx.get_start_method())
        # the workers share one job's default cache budget; one the user set here wins
        cache = (self.num_workers, user_chunk_cache_bytes())
        for _ in range(self.num_workers):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=worker_main, args=(theirs, parent, pdeathsig, *cache), daemon=True
            )
            self._conns.append(mine)
            proc.start()
            self._procs.append(proc)
            theirs.close()  # the worker sees EOF when the driver goes away
            assert proc.pid is not None
            self._pids.append(proc.pid)

    def _build(self, data: Any, encoder: Any, batched: bool) -> None:
        seq = next(self._seq)
        shards = self.num_workers
        if self._read_in == "workers":
            for w, pieces in enumerate(self._plan.pieces):
                self._send_build(w, (seq, "build", data, pieces, encoder, batched, None))
        else:
            with progress_bar(shards, "reading shards", "shard", enabled=self._progress) as bar:
                for w, pieces in enumerate(self._plan.pieces):
                    raw = self._read_here(data, pieces, batched)
                    self._send_build(w, (seq, "build", None, None, encoder, batched, raw))
                    bar.update(1)
        with progress_bar(shards, "building shards", "shard", enabled=self._progress) as bar:
            self._collect(seq, self._timeout, "building the shards", on_reply=bar.update)

    def _send_build(self, worker: int, message: tuple[Any, ...]) -> None:
        blob = dumps_for_workers(message, "data and encoder")
        self._bytes_sent += len(blob)
        self._send(worker, blob, "building the shards")

    def _map(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> list:
        with self._lock:
            self._check_usable()
            seq = next(self._seq)
            blob = dumps_for_workers((seq, "call", fn, args), "fn and its arguments")
            what = f"map({getattr(fn, '__qualname__', fn)!s})"
            try:
                for w in range(self.num_workers):
                    self._send(w, blob, what)
                return self._collect(seq, timeout, what)
            except (WorkerError, WorkerTimeoutError):
                raise
            except BaseException as exc:  # e.g. KeyboardInterrupt mid-call: replies unknown
                self._break(f"{type(exc).__name__} during {what}")
                raise

    def _send(self, worker: int, blob: bytes, what: str) -> None:
        try:
            self._conns[worker].send_bytes(blob)
        except OSError:
            self._died(worker, what)

    def _died(self, worker: int, what: str) -> None:
        how = describe_exit(self._procs[worker])
        reason = f"worker {worker} (pid {self._pids[worker]}) {how} during {what}"
        self._break(reason)
        raise WorkerDiedError(
            f"{reason}; the handle is broken: close it and build a new one", worker=worker
        )

    def _collect(
        self,
        seq: int,
        timeout: float | None,
        what: str,
        on_reply: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """One reply per worker for message ``seq``; raise the first worker error after all.

        ``on_reply(1)`` is called after each worker's successful reply.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = set(range(self.num_workers))
        results: list[Any] = [None] * self.num_workers
        errors: dict[int, tuple[str, str, str]] = {}
        while pending:
            owner: dict[Any, int] = {}
            for w in pending:
                owner[self._conns[w]] = w
                owner[self._procs[w].sentinel] = w
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(owner), timeout=remaining)
            if not ready:
                late = tuple(sorted(pending))
                self._break(f"{what} ran past timeout={timeout}s")
                raise WorkerTimeoutError(
                    f"{what} ran past timeout={timeout}s waiting for workers {list(late)}; "
                    "the handle is broken: build a new one with a larger timeout=",
                    workers=late,
                )
            for obj in ready:
                w = owner[obj]
                if w not in pending:
                    continue
                conn = self._conns[w]
                if obj is not conn and not conn.poll(0):
                    self._died(w, what)  # the process ended without a reply
                try:
                    reply = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._died(w, what)
                except Exception as exc:  # a result the driver cannot unpickle
                    reply = (seq, "error", type(exc).__name__, str(exc), repr(exc))
                pending.discard(w)
                # seq -1: the worker could not unpickle message ``seq``, and says why
                if reply[0] != seq and tuple(reply[:2]) != (-1, "error"):
                    self._break(f"worker {w} answered message {reply[0]} instead of {seq}")
                    raise WorkerDiedError(f"worker {w} is out of step: {self._broken}", worker=w)
                if reply[1] == "ok":
                    results[w] = reply[2]
                    if on_reply is not None:
                        on_reply(1)
                else:
                    errors[w] = reply[2:]
        if errors:
            w = min(errors)
            exc_type, message, text = errors[w]
            raise WorkerError(
                f"worker {w} of {self.num_workers} raised {exc_type} during {what}: {message}\n"
                f"\nWorker traceback:\n{text}",
                worker=w,
                remote_traceback=text,
                exc_type=exc_type,
            )
        return results

    def _shutdown(self, graceful: bool) -> None:
        if self._finalizer.alive:
            # detached only once done: a second Ctrl-C here leaves the rest to the finalizer
            _shutdown(self._procs, self._conns, graceful)
            self._finalizer.detach()
