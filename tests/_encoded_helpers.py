"""Picklable helpers for the encoded-data tests; light imports so workers start fast."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


class PidRecorder:
    """Wraps indexable data and appends the reading process id to a file per ``__getitem__``."""

    def __init__(self, data: Any, log: str | Path) -> None:
        self.data = data
        self.log = str(log)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        with open(self.log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return self.data[index]


def logged_pids(log: str | Path) -> set[int]:
    path = Path(log)
    return {int(line) for line in path.read_text().split()} if path.exists() else set()


class Grouped:
    """Records ``i`` (as float arrays) whose group is ``keys[i]``: partially exchangeable."""

    def __init__(self, keys: list[int]) -> None:
        from mixle.data.structure import partially_exchangeable

        self.keys = list(keys)
        self.structure = partially_exchangeable(self.group)

    def group(self, index: int) -> int:
        return self.keys[index]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> np.ndarray:
        return np.array([float(index)])


class MeanEncoder:
    """An encoder object: keeps the per-patch means of ``(patch, coords)`` records."""

    def seq_encode(self, records: list[Any]) -> np.ndarray:
        return np.array([float(np.mean(patch, dtype=np.float64)) for patch, _ in records])


def square_encoder(records: list[Any]) -> list[Any]:
    return [r * r for r in records]


def patch_means(batch: Any) -> list[float]:
    """Per-patch means of a stacked ``(patches, coords)`` shard, as a list."""
    if isinstance(batch, list):  # an empty shard
        return []
    patches, _ = batch
    return [float(np.mean(p, dtype=np.float64)) for p in patches]


def exact_sum(values: list[float]) -> float:
    return math.fsum(values)


def identity(shard: Any) -> Any:
    return shard


def shard_sum(shard: Any) -> float:
    return float(np.sum(shard))


def plus(shard: Any, a: int, b: int) -> int:
    return len(shard) + a + b


def boom(shard: Any) -> None:
    raise ValueError("boom in a worker")


class Unprintable(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def boom_unprintable(shard: Any) -> None:
    raise Unprintable("boom")


def boom_if_holds(shard: Any, value: float) -> int:
    if value in np.asarray(shard):
        raise KeyError(f"holds {value}")
    return 0


def pid_of(shard: Any) -> int:
    return os.getpid()


def kill_self(shard: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def nap(shard: Any, seconds: float) -> int:
    time.sleep(seconds)
    return 0


def fail_encoder(records: list[Any]) -> None:
    raise RuntimeError("encoder failed")


def _refuse_to_load() -> None:
    raise RuntimeError("this argument cannot be unpickled here")


class LoadsOnlyInTheDriver:
    """Pickles fine; unpickling it (in a worker) raises."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_refuse_to_load, ())


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux ``/proc``; a zombie has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going while we read
        return False
    return "\nState:\tZ" not in status


def note_pid_and_nap(shard: Any, log: str, seconds: float) -> int:
    """Append this worker's pid to ``log`` (the call has started), then sleep."""
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return 0


class NotePidAndNap:
    """An encoder that appends its process id to ``log``, then sleeps ``seconds``."""

    def __init__(self, log: str | Path, seconds: float) -> None:
        self.log = str(log)
        self.seconds = seconds

    def __call__(self, records: list[Any]) -> list[Any]:
        note_pid_and_nap(records, self.log, self.seconds)
        return records


@contextmanager
def local_dask_client(workers: int, timeout: float = 60) -> Iterator[Any]:
    """A client of ``workers`` single-threaded worker processes on 127.0.0.1, closed after.

    ``set_as_default=False`` keeps ``client=None`` meaning "no client yet" in the tests. No
    dashboard, and its HTTP routes on a free port: port 8787 taken by anything else on the
    machine would otherwise warn (and warnings are errors here). On exit every worker and
    nanny must be gone.
    """
    import distributed

    from mixle.utils.parallel.dask_backend import QUIET_SCHEDULER

    cluster = distributed.LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs=QUIET_SCHEDULER,
    )
    client = distributed.Client(cluster, set_as_default=False)
    client.wait_for_workers(workers, timeout=timeout)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
    assert multiprocessing.active_children() == []
