"""The loop a :class:`~mixle.utils.parallel.multiprocessing.MPEncodedData` worker runs.

Kept apart so that a spawned worker imports only this module, the shard builder, the
chunk cache and NumPy. Messages are pickled tuples ``(seq, kind, *payload)``; every message except
``close`` gets exactly one reply ``(seq, "ok", result)`` or
``(seq, "error", type name, message, traceback)``; a message the worker cannot unpickle
gets an error reply with ``seq`` -1.

A worker never outlives its driver, even while ``fn`` runs
(:func:`mixle.utils.processes.guard_against_orphaning`).

A worker is one of ``workers`` processes sharing one job's default chunk-cache budget
(:func:`~mixle.reading.process_cache.share_default_chunk_cache`), unless the driver's user set a
budget (``set_chunk_cache_bytes``), which the worker then keeps, whatever the start method.
"""

from __future__ import annotations

import os
import pickle
import signal
from multiprocessing.connection import Connection
from typing import Any

from mixle.reading.process_cache import set_chunk_cache_bytes, share_default_chunk_cache
from mixle.utils.parallel.encoding import build_shard
from mixle.utils.processes import WATCHDOG_INTERVAL_S, describe_error, guard_against_orphaning

__all__ = ["CLOSE", "WATCHDOG_INTERVAL_S", "guard_against_orphaning", "worker_main"]

#: The message that ends a worker's loop.
CLOSE = pickle.dumps((-1, "close"), protocol=pickle.HIGHEST_PROTOCOL)


def _error_reply(seq: int, exc: BaseException) -> bytes:
    return pickle.dumps((seq, "error", *describe_error(exc)), protocol=pickle.HIGHEST_PROTOCOL)


def _handle(kind: str, payload: tuple[Any, ...], state: dict[str, Any]) -> Any:
    if kind == "build":
        data, pieces, encoder, batched, raw_pieces = payload
        state["shard"] = build_shard(data, pieces, encoder, batched, raw_pieces=raw_pieces)
        return os.getpid()
    if kind == "call":
        fn, args = payload
        if "shard" not in state:
            raise RuntimeError("this worker has no shard yet; 'build' must come first")
        return fn(state["shard"], *args)
    raise ValueError(f"unknown message kind {kind!r}")


def worker_main(
    conn: Connection,
    parent: int | None = None,
    pdeathsig: bool = False,
    workers: int = 1,
    cache_budget: int | None = None,
) -> None:
    """Serve messages from the driver until ``close`` or until the driver goes away.

    ``parent`` and ``pdeathsig`` go to :func:`guard_against_orphaning`. ``workers`` is
    how many workers the driver starts; ``cache_budget`` the chunk-cache budget its user
    set (``None``: this worker's share of the default).
    """
    # Ctrl-C goes to the whole process group; the driver decides what to do with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard_against_orphaning(conn, parent, pdeathsig)
    share_default_chunk_cache(workers)
    if cache_budget is not None:
        set_chunk_cache_bytes(cache_budget)
    state: dict[str, Any] = {}
    while True:
        try:
            blob = conn.recv_bytes()
        except (EOFError, OSError):  # the driver closed its end or exited
            return
        seq = -1
        try:
            seq, kind, *payload = pickle.loads(blob)
            if kind == "close":
                return
            result = _handle(kind, tuple(payload), state)
            reply = pickle.dumps((seq, "ok", result), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # report everything; the loop survives user errors
            reply = _error_reply(seq, exc)
        try:
            conn.send_bytes(reply)
        except (EOFError, OSError):
            return
