"""The parent's side of a Loader's worker processes: start them, hand out batches round-robin,
yield the results in order, and stop them whatever happens.

Batch ``k`` of a run goes to worker ``k % num_workers``; each worker has ``prefetch`` batches
in flight. The parent waits for the batches in order, so a slow worker delays the stream,
never reorders it, and what each batch holds is the same as with no workers (it is a pure
function of its plan).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import pickle
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mixle.errors import ReadsStopped, WorkerDiedError, WorkerError, WorkerTimeoutError
from mixle.loading.plan import BatchPlan
from mixle.loading.prefetch import StopSignal
from mixle.loading.workers.process import CLOSE, loader_worker_main
from mixle.loading.workers.slots import SlotMaps, Written, fd_socket, recv_fd
from mixle.reading.process_cache import user_chunk_cache_bytes
from mixle.utils.pickling import pickling_error
from mixle.utils.processes import describe_exit, orphan_guard_args, stop_processes

__all__ = ["STOP_GRACE_S", "WAIT_SLICE_S", "WorkerPool", "reader_payload"]

#: Seconds the workers get to exit by themselves at the end of a run before they are killed.
STOP_GRACE_S = 1.0
#: With ``timeout``, seconds a worker may take to start (import, rebuild the source) at
#: least; ``timeout`` itself when it is longer.
START_TIMEOUT_S = 120.0
#: The parent waits for a batch in slices this long, to notice ``close()`` from another
#: thread (a :class:`~mixle.loading.prefetch.StopSignal`).
WAIT_SLICE_S = 0.2


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, shown as its cause."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\nthe worker's traceback:\n\n{self.text}"


def reader_payload(reader: Any, start_method: str, *, check_only: bool = False) -> bytes | None:
    """What the workers are started with: ``reader`` pickled, or ``None`` for ``"fork"``
    (the workers inherit it, so lambdas and unpicklable sources work there).

    Raises
    ------
    TypeError
        The source, ``record_transform`` or ``transform`` cannot be pickled; the message
        names which, the value and the fixes.
    """
    if start_method == "fork":
        return None
    parts = (
        ("source", reader.source),
        ("record_transform", reader.record_transform),
        ("transform", reader.transform),
    )
    for name, value in parts:
        exc = pickling_error(value)
        if exc is not None:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise TypeError(
                f"{name}={shown} cannot be pickled ({type(exc).__name__}: {exc}), but "
                f"num_workers with worker_start_method={start_method!r} sends it to each "
                "worker process by pickling: open sources with a mixle read_* function "
                "(pickled by reference), define functions at module level (not lambdas "
                "or closures), or use worker_start_method='fork'"
            ) from None
    if check_only:
        return None
    return pickle.dumps(reader, pickle.HIGHEST_PROTOCOL)


def _stop(procs: list[BaseProcess], conns: list[Connection], graceful: bool) -> None:
    # a Loader worker holds nothing to clean up (its slots go with it): killed, never
    # SIGTERMed, so a fork child never runs a SIGTERM handler inherited from the parent
    close = CLOSE if graceful else None
    stop_processes(procs, conns, close_message=close, grace=STOP_GRACE_S, terminate=False)
    procs.clear()
    conns.clear()


class WorkerPool:
    """``num_workers`` processes, each reading the batches of a run that it is sent.

    Parameters
    ----------
    reader
        The :class:`~mixle.loading.reader.BatchReader`; pickled once per worker (by
        reference for mixle sources) unless the start method is ``"fork"``.
    num_workers, start_method, num_threads, prefetch, timeout
        The Loader's arguments: ``num_threads`` reader threads in each worker, ``prefetch``
        batches in flight per worker, ``timeout`` seconds a batch may take (``None``: no
        limit).

    Notes
    -----
    The processes start in the constructor and are stopped by :meth:`stop`, which the
    Loader calls when a run ends, breaks, fails or is collected; a finalizer stops them at
    interpreter exit too. They exit by themselves when the parent dies.
    """

    def __init__(
        self,
        reader: Any,
        *,
        num_workers: int,
        start_method: str,
        num_threads: int,
        prefetch: int,
        timeout: float | None,
        pickled: bytes | None,
    ) -> None:
        self._n, self._prefetch, self._timeout = num_workers, prefetch, timeout
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._pids: list[int] = []
        self._maps = [SlotMaps() for _ in range(num_workers)]
        self._done: list[dict[int, tuple[Any, ...]]] = [{} for _ in range(num_workers)]
        self._ready = [False] * num_workers  # the worker has rebuilt the reader
        self._socks: list[Any] = []  # for the descriptors of new slots
        self._method = start_method
        self._started = time.monotonic()
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns, False)
        ctx = multiprocessing.get_context(start_method)
        parent, pdeathsig = orphan_guard_args(start_method)
        payload = reader if pickled is None else pickled
        args = (num_threads, parent, pdeathsig, num_workers, user_chunk_cache_bytes())
        try:
            for _ in range(num_workers):
                mine, theirs = ctx.Pipe(duplex=True)
                self._conns.append(mine)
                self._socks.append(fd_socket(mine.fileno()))
                ours = [c.fileno() for c in self._conns] + [s.fileno() for s in self._socks]
                inherited = tuple(ours) if start_method == "fork" else ()
                proc = ctx.Process(
                    target=loader_worker_main,
                    args=(theirs, payload, *args, inherited),
                    name=f"mixle-loader-worker-{len(self._procs)}",
                    daemon=True,
                )
                proc.start()
                self._procs.append(proc)
                theirs.close()  # the worker sees EOF when the parent goes away
                assert proc.pid is not None
                self._pids.append(proc.pid)
        except BaseException:
            self.stop(graceful=False)
            raise

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the workers, in worker order."""
        return tuple(self._pids)

    # -- the run ------------------------------------------------------------------------
    def batches(
        self, plans: Iterable[BatchPlan], signal: StopSignal
    ) -> Iterator[tuple[BatchPlan, Any]]:
        """Yield ``(plan, batch)`` for each plan in order, read by the workers ahead.

        Raises
        ------
        Exception
            A worker's exception for a batch, re-raised (its traceback as the cause)
            when the stream reaches that batch; :class:`~mixle.WorkerError` when it
            cannot be rebuilt here.
        WorkerDiedError, WorkerTimeoutError
            A worker died, or a batch took longer than ``timeout``.
        ReadsStopped
            ``signal`` was set (``close()`` from another thread).
        """
        stream = iter(plans)
        pending: deque[tuple[int, BatchPlan]] = deque()
        counter = itertools.count()

        lost: list[WorkerDiedError] = []  # raised after the batch already in hand

        def submit() -> None:
            for plan in itertools.islice(stream, 1):
                seq = next(counter)
                try:
                    self._send(seq % self._n, ("read", seq, plan))
                except WorkerDiedError as exc:
                    lost.append(exc)
                    return
                pending.append((seq, plan))

        for _ in range(self._n * self._prefetch):
            if not lost:
                submit()
        while pending or lost:
            if lost:
                raise lost[0]
            seq, plan = pending.popleft()
            batch = self._receive(seq, plan, signal)
            self._send_released()
            if not lost:
                submit()
            yield plan, batch
            del batch

    def _send(self, worker: int, message: tuple[Any, ...]) -> None:
        try:
            self._conns[worker].send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        except OSError:
            self._died(worker, f"the loop sent it batch {message[1]} of the run")

    def _send_released(self) -> None:
        for w, maps in enumerate(self._maps):
            slots = maps.take_released()
            if slots:
                with contextlib.suppress(OSError):  # a dead worker is reported on its read
                    self._conns[w].send_bytes(pickle.dumps(("free", slots)))

    def _receive(self, seq: int, plan: BatchPlan, signal: StopSignal) -> Any:
        w = seq % self._n
        done, conn = self._done[w], self._conns[w]
        what = f"batch {plan.batch} of epoch {plan.epoch}"
        ends = {proc.sentinel: i for i, proc in enumerate(self._procs)}
        deadline = None
        while seq not in done:
            if signal.is_set():
                raise ReadsStopped("the Loader was closed while it waited for a worker")
            if deadline is None and self._timeout is not None and self._ready[w]:
                deadline = time.monotonic() + self._timeout  # start-up does not count
            left = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            if self._timeout is not None and not self._ready[w]:
                limit = max(START_TIMEOUT_S, self._timeout)
                if time.monotonic() > self._started + limit:
                    raise WorkerTimeoutError(
                        f"Loader worker {w} (pid {self._pids[w]}) did not start within "
                        f"{limit:g}s (importing what the source and transforms need, "
                        "rebuilding the source); the workers are stopped",
                        workers=(w,),
                    )
            if left <= 0:
                raise WorkerTimeoutError(
                    f"Loader worker {w} (pid {self._pids[w]}) took longer than "
                    f"timeout={self._timeout}s to read {what}; the workers are stopped: "
                    "raise timeout= or look at what the source or transform waits for",
                    workers=(w,),
                )
            ready = wait([conn, *ends], timeout=min(left, WAIT_SLICE_S))
            if conn in ready:  # before its end: what it sent before it died counts
                self._take(w, done)
                continue
            for end in ready:  # any worker that dies is reported now, not at its batch
                other = ends[end]
                while self._conns[other].poll(0):  # what it sent first: a start-up error
                    self._take(other, self._done[other])
                doing = f"reading {what}" if other == w else f"the loop waited for {what}"
                self._died(other, doing)
        reply = done.pop(seq)
        if reply[0] == "batch":
            return self._maps[w].batch(reply[2])
        raise self._error(w, reply, f"reading {what}")

    def _take(self, w: int, done: dict[int, tuple[Any, ...]]) -> None:
        """Receive one message from worker ``w`` (and the descriptor of a new slot)."""
        try:
            blob = self._conns[w].recv_bytes()
        except (EOFError, OSError):
            self._died(w, "reading or sending a batch")
        try:
            reply = pickle.loads(blob)
        except Exception as exc:
            raise WorkerError(
                f"Loader worker {w} (pid {self._pids[w]}) sent a batch this process cannot "
                f"unpickle ({type(exc).__name__}: {exc}); return NumPy arrays, or objects "
                "that pickle both ways, from the source and transforms",
                worker=w,
                exc_type=type(exc).__name__,
            ) from exc
        if reply[0] == "ready":
            self._ready[w] = True
            return
        if reply[0] == "batch" and reply[2].new_size:
            written: Written = reply[2]
            try:
                fd = recv_fd(self._socks[w])
            except (EOFError, OSError):
                self._died(w, "reading or sending a batch")
            try:
                self._maps[w].add(written.slot, written.new_size, fd)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot map the shared memory of a batch from Loader worker {w} "
                    f"({written.new_size} bytes): {exc.strerror}; every batch kept alive "
                    "holds one mapping (vm.max_map_count bounds them): keep fewer batches "
                    "or copy the ones you keep",
                ) from exc
        if reply[1] < 0:  # the worker could not start: the reader did not unpickle
            raise self._error(w, reply, "starting")
        done[reply[1]] = reply

    def _error(self, w: int, reply: tuple[Any, ...], what: str) -> BaseException:
        _, _, blob, name, message, text = reply
        where = f"Loader worker {w} (pid {self._pids[w]}) raised {name} while {what}"
        if blob is not None and what != "starting":
            try:
                exc: BaseException = pickle.loads(blob)
            except Exception:  # rebuilds only where it was raised: the WorkerError below
                pass
            else:
                exc.__cause__ = _RemoteTraceback(text)
                if hasattr(exc, "add_note"):
                    exc.add_note(where)
                return exc
        fix = ""
        if what == "starting":
            fix = (
                "; with worker_start_method='spawn' or 'forkserver' the worker imports what "
                "the source and transforms need: define them in an importable module (not "
                "in __main__ of an interactive session), or use worker_start_method='fork'"
            )
        return WorkerError(
            f"{where}: {message}{fix}\n\nthe worker's traceback:\n\n{text}",
            worker=w,
            remote_traceback=text,
            exc_type=name,
        )

    def _died(self, w: int, what: str) -> None:
        how = describe_exit(self._procs[w])
        if "SIGKILL" in how:
            hint = (
                " A worker killed by SIGKILL often ran out of memory: lower num_workers, "
                "prefetch or the batch size."
            )
        elif how.startswith("exited") and not self._ready[w] and self._method != "fork":
            hint = (
                " It ended before it could start reading: its own error is on stderr. With "
                "worker_start_method='spawn' or 'forkserver' a script must start the Loader "
                'under `if __name__ == "__main__":`.'
            )
        else:
            hint = ""
        raise WorkerDiedError(
            f"Loader worker {w} (pid {self._pids[w]}) {how} while {what}; the other workers "
            f"are stopped.{hint}",
            worker=w,
        )

    # -- lifetime -----------------------------------------------------------------------
    def stop(self, graceful: bool) -> None:
        """Stop the workers (asked first when ``graceful``) and drop the parent's mappings;
        arrays of batches still alive keep theirs. Idempotent."""
        _stop(self._procs, self._conns, graceful)
        for sock in self._socks:
            sock.close()  # its own duplicate of the descriptor
        self._socks.clear()
        self._finalizer.detach()
        for maps in self._maps:
            maps.close()
