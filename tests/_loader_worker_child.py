"""Picklable pieces for the Loader worker fault tests, and the loops they run in children.

Light imports (NumPy, and mixle only inside :func:`main`), so spawn workers that unpickle
these start fast. Records are rows of :data:`COLS` float32 (8 KiB): every batch of
:data:`BATCH` rows (32 KiB) travels through a shared-memory slot, not pickled. Batch ``k``
(``shuffle=False``) holds rows ``[k * BATCH, (k + 1) * BATCH)``, and row ``i`` starts with
``i * COLS``, so a transform can tell which batch or record it has.

Run as ``python -c "...; from _loader_worker_child import main; main()" SCENARIO ...`` by
the tests: see :func:`main`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

__all__ = [
    "BATCH",
    "COLS",
    "ROWS",
    "FailingRecordTransform",
    "FailingTransform",
    "HoldsLock",
    "KillAt",
    "NapAt",
    "NeedsArg",
    "OnlyHere",
    "Rows",
    "main",
    "table",
]

#: Records, floats per record, records per batch.
ROWS, COLS, BATCH = 40, 2048, 4
_TABLE = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def table() -> np.ndarray:
    """The records every test reads (read-only)."""
    view = _TABLE.view()
    view.flags.writeable = False
    return view


def batch_number(batch: np.ndarray) -> int:
    """Which batch ``batch`` is (``shuffle=False``)."""
    return int(batch[0, 0]) // (COLS * BATCH)


class NeedsArg(Exception):
    """Pickles, but cannot be rebuilt: ``__init__`` needs two arguments, ``args`` has one."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code


class HoldsLock(Exception):
    """Cannot be pickled at all: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def _rebuild_here_only(pid: int, message: str) -> Exception:
    if os.getpid() != pid:
        raise RuntimeError("this exception can only be rebuilt in the process that raised it")
    return OnlyHere(message)


class OnlyHere(Exception):
    """Pickles, and unpickles in the process that raised it, but in no other (as one that
    holds a handle on a process-local resource)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_here_only, (os.getpid(), *self.args)


def make_error(kind: str, where: str) -> Exception:
    """The exception ``kind`` (``"value"``, ``"needs-arg"``, ``"lock"``, ``"only-here"``)
    raised in ``where``."""
    if kind == "value":
        return ValueError(f"bad record in {where}")
    if kind == "needs-arg":
        return NeedsArg(7, f"bad record in {where}")
    if kind == "lock":
        return HoldsLock(f"bad record in {where}")
    if kind == "only-here":
        return OnlyHere(f"bad record in {where}")
    raise AssertionError(kind)


class Rows:
    """The table as a source with ``get_batch``, which raises ``kind`` at batch ``fail_at``."""

    def __init__(self, fail_at: int | None = None, kind: str = "value") -> None:
        self.fail_at, self.kind = fail_at, kind

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> np.ndarray:
        return _TABLE[index].copy()

    def get_batch(self, indices: Any) -> np.ndarray:
        indices = np.asarray(indices)
        if self.fail_at is not None and int(indices[0]) // BATCH == self.fail_at:
            raise make_error(self.kind, "get_batch")
        return _TABLE[indices]


class FailingTransform:
    """``transform(batch)`` that raises ``kind`` at batch ``at``."""

    def __init__(self, at: int, kind: str = "value") -> None:
        self.at, self.kind = at, kind

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if batch_number(batch) == self.at:
            raise make_error(self.kind, "transform")
        return batch


class FailingRecordTransform:
    """``record_transform(record, rng)`` that raises ``kind`` on the first record of ``at``."""

    def __init__(self, at: int, kind: str = "value") -> None:
        self.at, self.kind = at, kind

    def __call__(self, record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if int(record[0]) // COLS == self.at * BATCH:
            raise make_error(self.kind, "record_transform")
        return record


class KillAt:
    """``transform(batch)`` whose process kills itself with SIGKILL at batch ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if batch_number(batch) == self.at:
            os.kill(os.getpid(), signal.SIGKILL)
        return batch


class NapAt:
    """``transform(batch)`` that sleeps ``seconds`` at the batches ``at``, first appending
    ``"<pid> <batch>"`` to ``log`` (the worker is now inside the nap)."""

    def __init__(self, at: tuple[int, ...], seconds: float, log: str) -> None:
        self.at, self.seconds, self.log = tuple(at), seconds, log

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        k = batch_number(batch)
        if k in self.at:
            with open(self.log, "a") as fh:
                fh.write(f"{os.getpid()} {k}\n")
            time.sleep(self.seconds)
        return batch


#: What the ``exit`` scenarios keep alive until the interpreter exits.
_KEPT: list[Any] = []


def main() -> None:
    """Run one scenario in this (child) process: ``sys.argv[1:]`` is ``SCENARIO METHOD LOG``.

    A ``num_workers=2`` loop whose batches 2 and 3 nap for minutes (both workers inside
    the transform); it prints ``pids [...]`` (``Loader.worker_pids``) after batch 0 and
    ``batch k`` per batch. ``interrupt``: on Ctrl-C it prints ``{"caught": <monotonic time>,
    "children": [...]}`` (the worker processes multiprocessing still sees) and re-raises.
    ``interrupt-early``: the same, Ctrl-C expected while the workers start (``starting``
    is printed just before the first ``next()``). ``orphan``: to be killed with SIGKILL
    while both workers nap. ``orphan-thread``: the same, but the first batch (which starts
    the workers) is taken in a thread that has ended before the loop goes on in the main
    thread. ``exit`` and ``exit-error``: after batch 0 the script ends (normally, or with
    an uncaught exception) once the file ``LOG.go`` exists, with the iterator and the batch
    still referenced from a module global, while both workers nap.
    """
    import multiprocessing

    import mixle

    scenario, method, log = sys.argv[1:4]
    if scenario.startswith("interrupt"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = mixle.Loader(
        Rows(),
        BATCH,
        transform=NapAt((2, 3), 300.0, log),
        num_workers=2,
        worker_start_method=method,
        num_threads=0,
        prefetch=2,
    )
    it = iter(loader)
    print("starting", flush=True)
    try:
        if scenario == "orphan-thread":
            thread = threading.Thread(target=next, args=(it,))
            thread.start()
            thread.join()
        else:
            _KEPT.append(next(it))
        print(f"pids {json.dumps(list(loader.worker_pids))}", flush=True)
        print("batch 0", flush=True)
        if scenario.startswith("exit"):
            _KEPT.append(it)
            while not os.path.exists(log + ".go"):  # the test has seen both workers nap
                time.sleep(0.02)
            if scenario == "exit-error":
                raise RuntimeError("the script fails mid-run")
            return
        for k, _ in enumerate(it, 1):
            print(f"batch {k}", flush=True)
    except KeyboardInterrupt:
        caught = time.monotonic()
        alive = [p.pid for p in multiprocessing.active_children()]
        print(json.dumps({"caught": caught, "children": alive}), flush=True)
        raise
