"""The loop a Loader worker process runs: read the batches it is sent, hand them back
through shared memory.

Messages from the parent are pickled tuples: ``("read", seq, plan)``, ``("free", [slot,
...])`` and ``("close",)``. Replies are ``("batch", seq, written)`` (followed by a file
descriptor when ``written`` names a new slot; see :mod:`mixle.loading.workers.slots`) or
``("error", seq, exception or None, type name, message, traceback text)``; ``seq`` is
``-1`` for an error before the first read (the reader did not unpickle).

With ``num_threads`` reader threads, batches are read side by side and replied to as each
is done (the parent puts them back in order); with 0 each is read in the receiving thread.
Ctrl-C is ignored here: it reaches the whole process group, and the parent decides.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from mixle.loading.plan import BatchPlan
from mixle.loading.workers.slots import SlotWriter, send_fd
from mixle.reading.process_cache import set_chunk_cache_bytes, share_default_chunk_cache
from mixle.utils.processes import guard_against_orphaning

__all__ = ["CLOSE", "error_reply", "loader_worker_main"]

#: The message that ends a worker's loop.
CLOSE = pickle.dumps(("close",), protocol=pickle.HIGHEST_PROTOCOL)


def error_reply(seq: int, exc: BaseException) -> bytes:
    """The reply for ``exc``: the exception itself when it pickles, and its traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: bytes | None = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        blob = None
    message = ("error", seq, blob, type(exc).__name__, str(exc), text)
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class _Replies:
    """Sends replies from any thread: one message (and its descriptor) at a time."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, blob: bytes, fd: int | None = None) -> None:
        with self._lock:
            self._conn.send_bytes(blob)
            if fd is not None:
                send_fd(self._conn.fileno(), fd)


def _read_one(reader: Any, slots: SlotWriter, replies: _Replies, seq: int, plan: Any) -> None:
    fd = None
    try:
        written, fd = slots.write(reader(plan))
        blob = pickle.dumps(("batch", seq, written), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # the parent raises it at this batch, in order (a
        blob = error_reply(seq, exc)  # SystemExit too: a reader thread would swallow it)
    try:
        replies.send(blob, fd)
    except OSError:  # the parent went away; the watchdog ends the process
        pass
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def loader_worker_main(
    conn: Connection,
    reader: Any,
    num_threads: int,
    parent: int | None,
    pdeathsig: bool,
    workers: int,
    cache_budget: int | None,
) -> None:
    """Serve ``read`` messages until ``close`` or until the parent goes away.

    ``reader`` is the :class:`~mixle.loading.reader.BatchReader`, or its pickle (spawn and
    forkserver; unpickled here, so an import error is reported as a reply). ``parent`` and
    ``pdeathsig`` go to :func:`~mixle.utils.processes.guard_against_orphaning`; ``workers``
    share one job's default chunk-cache budget unless the parent's user set
    ``cache_budget``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard_against_orphaning(conn, parent, pdeathsig)
    share_default_chunk_cache(workers)
    if cache_budget is not None:
        set_chunk_cache_bytes(cache_budget)
    replies = _Replies(conn)
    try:
        if isinstance(reader, bytes):
            reader = pickle.loads(reader)
    except Exception as exc:
        with contextlib.suppress(OSError):
            replies.send(error_reply(-1, exc))
        return
    slots = SlotWriter()
    pool = ThreadPoolExecutor(num_threads, "mixle-worker-reader") if num_threads else None
    try:
        while True:
            try:
                kind, *payload = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):  # the parent closed its end or exited
                return
            if kind == "read":
                seq, plan = payload
                if not isinstance(plan, BatchPlan):
                    raise TypeError(f"a read message carries {type(plan).__name__}")
                if pool is None:
                    _read_one(reader, slots, replies, seq, plan)
                else:
                    pool.submit(_read_one, reader, slots, replies, seq, plan)
            elif kind == "free":
                slots.free(payload[0])
            elif kind == "close":
                return
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
