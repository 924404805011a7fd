"""The loop a Loader worker process runs: read the batches it is sent, hand them back
through shared memory.

Messages from the parent are pickled tuples: ``("read", seq, plan)``, ``("free", [slot,
...])`` and ``("close",)``. Replies are ``("ready", pid)`` once the reader is rebuilt,
``("batch", seq, written)`` (followed by a file descriptor when ``written`` names a new
slot; see :mod:`mixle.loading.workers.slots`) and ``("error", seq, exception or None, type
name, message, traceback text)``; ``seq`` is ``-1`` for an error before the first read
(the reader did not unpickle).

The receiving thread only receives: it queues reads for the reader threads (``num_threads``
of them, or one when ``num_threads`` is 0) and frees slots, so the worker always drains its
inbox and the parent never blocks sending while the worker blocks replying. Batches are
replied to as each is done; the parent puts them back in order. Ctrl-C is ignored here (it
reaches the whole process group, and the parent decides). A reply that cannot be sent
whole ends the process, so the parent sees a death rather than waiting for it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from mixle.loading.workers.slots import SlotWriter, fd_socket, send_fd
from mixle.reading.process_cache import set_chunk_cache_bytes, share_default_chunk_cache
from mixle.utils.processes import describe_error, guard_against_orphaning

__all__ = ["CLOSE", "error_reply", "loader_worker_main"]

#: The message that ends a worker's loop.
CLOSE = pickle.dumps(("close",), protocol=pickle.HIGHEST_PROTOCOL)
#: Exit status of a worker whose reply could not be sent whole (the stream is unusable).
_BROKEN_PIPE_EXIT = 4


def error_reply(seq: int, exc: BaseException) -> bytes:
    """The reply for ``exc``: the exception itself when it pickles, and its traceback."""
    name, message, text = describe_error(exc)
    try:
        blob: bytes | None = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except BaseException:
        blob = None
    reply = ("error", seq, blob, name, message, text)
    return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)


class _Replies:
    """Sends replies from any thread: one message (and its descriptor) at a time."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._sock = fd_socket(conn.fileno())  # before the receiving thread starts
        self._lock = threading.Lock()

    def send(self, blob: bytes, fd: int | None = None) -> None:
        with self._lock:
            try:
                self._conn.send_bytes(blob)
                if fd is not None:
                    send_fd(self._sock, fd)
            except OSError:  # the parent is gone, or a reply (or the descriptor after it)
                os._exit(_BROKEN_PIPE_EXIT)  # went out in part: end, so the parent sees EOF


def _read_one(reader: Any, slots: SlotWriter, replies: _Replies, seq: int, plan: Any) -> None:
    written, fd = None, None
    try:
        written, fd = slots.write(reader(plan))
        blob = pickle.dumps(("batch", seq, written), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # the parent raises it at this batch, in order (a
        if written is not None and written.slot >= 0:  # SystemExit too: a reader thread
            slots.abandon(written.slot, fd)  # would swallow it)
        fd = None
        blob = error_reply(seq, exc)
    try:
        replies.send(blob, fd)
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _receive(conn: Connection, todo: Any, slots: SlotWriter) -> None:
    """Queue every read the parent sends until ``close`` or EOF (then queue ``None``)."""
    try:
        while True:
            try:
                kind, *payload = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):  # the parent closed its end or exited
                return
            if kind == "read":
                todo(*payload)
            elif kind == "free":
                slots.free(payload[0])
            elif kind == "close":
                return
    finally:
        todo(None, None)


def loader_worker_main(
    conn: Connection,
    reader: Any,
    num_threads: int,
    parent: int | None,
    pdeathsig: bool,
    workers: int,
    cache_budget: int | None,
    inherited: tuple[int, ...] = (),
) -> None:
    """Serve ``read`` messages until ``close`` or until the parent goes away.

    ``reader`` is the :class:`~mixle.loading.reader.BatchReader`, or its pickle (spawn and
    forkserver; unpickled here, so an import error is reported as a reply). ``parent`` and
    ``pdeathsig`` go to :func:`~mixle.utils.processes.guard_against_orphaning`; ``workers``
    share one job's default chunk-cache budget unless the parent's user set
    ``cache_budget``. ``inherited`` are descriptors a fork child holds that are the
    parent's (its ends of the workers' sockets), closed first, so that the worker sees
    EOF when the parent goes away.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in inherited:  # a fork child's copies of the parent's ends of the sockets
        with contextlib.suppress(OSError):
            os.close(fd)
    guard_against_orphaning(conn, parent, pdeathsig)
    share_default_chunk_cache(workers)
    if cache_budget is not None:
        set_chunk_cache_bytes(cache_budget)
    replies = _Replies(conn)
    try:
        if isinstance(reader, bytes):
            reader = pickle.loads(reader)
    except BaseException as exc:
        replies.send(error_reply(-1, exc))
        return
    replies.send(pickle.dumps(("ready", os.getpid()), protocol=pickle.HIGHEST_PROTOCOL))
    slots = SlotWriter()
    if num_threads:
        pool = ThreadPoolExecutor(num_threads, "mixle-worker-reader")

        def submit(seq: Any, plan: Any) -> None:
            if seq is not None:
                pool.submit(_read_one, reader, slots, replies, seq, plan)

        try:
            _receive(conn, submit, slots)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return
    todo: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    threading.Thread(
        target=_receive,
        args=(conn, lambda seq, plan: todo.put((seq, plan)), slots),
        name="mixle-worker-receiver",
        daemon=True,
    ).start()
    while True:
        seq, plan = todo.get()
        if seq is None:
            return
        _read_one(reader, slots, replies, seq, plan)
