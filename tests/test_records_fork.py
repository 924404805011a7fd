"""Sources read in a parent, then read by several threads of a forked child at once.

The first reads of a child make the source the child's (new lock, no reads in flight, the
parent's handles dropped) exactly once: no thread reads through the parent's handle, and
none closes a descriptor that another thread just opened. A slowed-down reset keeps the
other threads arriving while it runs, so the checks do not depend on luck.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from _fork_child import in_forked_child

import mixle
from mixle.data.sources import lifetime
from mixle.errors import SourceClosedError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

THREADS = 8
#: How long the first thread's reset sleeps, so that the others arrive meanwhile.
RESET_DELAY = 0.02


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _slow_reset(src: Any, name: str) -> None:
    """Make ``src.<name>`` (called by the fork reset) sleep first, in this process only."""
    original = getattr(src, name)

    def slow(handle: Any) -> Any:
        time.sleep(RESET_DELAY)
        return original(handle)

    setattr(src, name, slow)


def _handles_used(src: Any, name: str) -> list[Any]:
    """Record the handle every call of ``src.<name>(handle, ...)`` reads through."""
    original, used = getattr(src, name), []

    def recording(handle: Any, *args: Any) -> Any:
        used.append(handle)
        return original(handle, *args)

    setattr(src, name, recording)
    return used


@contextmanager
def _opening_files(paths: list[str]) -> Iterator[None]:
    """While inside, a thread opens and closes ``paths``: they take freed descriptor numbers."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for fd in [os.open(p, os.O_RDONLY) for p in paths]:
                os.close(fd)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _at_once(read: Callable[[int], None]) -> list[str]:
    """Run ``read(k)`` in ``THREADS`` threads released together; the errors they raised."""
    barrier, errors = threading.Barrier(THREADS), []

    def run(k: int) -> None:
        barrier.wait()
        try:
            read(k)
        except Exception as exc:  # reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _decoys(tmp_path: Path, write: Callable[[Path], None], suffix: str) -> list[str]:
    paths = [tmp_path / f"decoy{d}{suffix}" for d in range(4)]
    for p in paths:
        write(p)
    return [str(p) for p in paths]


def _race(
    src: Any, reset: str, reader: str, decoys: list[str], read: Callable[[int, list[str]], None]
) -> list[str]:
    """In a child: threads run ``read(k, problems)`` at once while decoys take descriptors.

    ``reset`` is the fork-reset method slowed down so the threads meet in it; ``reader`` the
    method whose handle argument must never be the parent's.
    """
    parents = src._handle
    _slow_reset(src, reset)
    used = _handles_used(src, reader)
    problems: list[str] = []
    with _opening_files(decoys):
        problems += _at_once(lambda k: read(k, problems))
    if any(h is parents for h in used):
        problems.append("a read in the child went through the parent's handle")
    return problems


def _read_csv_rows(src: Any, truth: list[dict[str, str]], decoys: list[str]) -> list[str]:
    """In a child: threads read rows of ``src`` at once; rows unlike ``truth`` are problems."""

    def read(k: int, problems: list[str]) -> None:
        for j in range(30):
            i = k * 7 + j
            batch = src.get_batch([i])
            if (str(batch["a"][0]), str(batch["c"][0])) != (truth[i]["a"], truth[i]["c"]):
                problems.append(f"row {i} read as {batch['a'][0]} {batch['c'][0]}")

    return _race(src, "_forget", "_read_rows", decoys, read)


def test_threads_first_read_after_fork(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b,c\n" + "".join(f"{i},{i * 0.5},r{i}\n" for i in range(1000)))
    with open(path, newline="") as f:
        truth = list(csv.DictReader(f))  # the writer's read
    decoys = _decoys(
        tmp_path,
        lambda p: p.write_text("a,b,c\n" + "".join(f"{-i},0,DECOY\n" for i in range(1000))),
        ".csv",
    )
    for _ in range(5):
        src = mixle.read_csv(str(path))
        assert len(src) == 1000 and src[0]["a"] == 0  # opened in the parent
        assert in_forked_child(partial(_read_csv_rows, src, truth, decoys)) == []
        src.close()


def test_loader_threads_in_a_forked_child_read_this_files_rows(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,c\n" + "".join(f"{i},r{i}\n" for i in range(400)))
    with open(path, newline="") as f:
        truth = [int(row["a"]) for row in csv.DictReader(f)]
    decoys = _decoys(tmp_path, lambda p: p.write_text("a,c\n" + "-1,DECOY\n" * 400), ".csv")
    src = mixle.read_csv(str(path))
    assert src[3]["a"] == 3  # opened in the parent

    def child() -> list[str]:
        _slow_reset(src, "_forget")
        with _opening_files(decoys):
            batches = list(mixle.Loader(src, 16, num_threads=4))
        got = np.concatenate([b["a"] for b in batches]).tolist()
        return [] if got == truth else [f"the loader read {got[:5]}... not {truth[:5]}..."]

    assert in_forked_child(child) == []
    src.close()


def _write_h5(path: Path, data: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(4, 5, 6), compression="gzip")


def _read_hdf5_rows(src: Any, truth: np.ndarray, decoys: list[str]) -> list[str]:
    """In a child: threads read rows and boxes of ``src`` at once, compared with ``truth``."""

    def read(k: int, problems: list[str]) -> None:
        for j in range(10):
            rows = [(k * 5 + j) % 40, (k * 5 + j + 17) % 40]
            if not np.array_equal(src.get_batch(rows), truth[rows]):
                problems.append(f"rows {rows} differ from h5py's")
            box = src.read_box((k, j % 5, 0), (8, 5, 12))
            if not np.array_equal(box, truth[k : k + 8, j % 5 : j % 5 + 5]):
                problems.append(f"the box at ({k}, {j % 5}, 0) differs from h5py's")

    return _race(src, "_forked", "_get_rows", decoys, read)


def test_hdf5_threads_first_read_after_fork(tmp_path):
    data = np.random.default_rng(3).integers(0, 1000, (40, 10, 12)).astype(np.int32)
    path = tmp_path / "volume.h5"
    _write_h5(path, data)
    with h5py.File(path, "r") as f:
        truth = f["x"][...]  # the writer's read
    decoys = _decoys(tmp_path, lambda p: _write_h5(p, -1 - data), ".h5")
    for _ in range(3):
        src = mixle.read_hdf5(str(path), "x")
        np.testing.assert_array_equal(src.get_batch([0, 39]), truth[[0, 39]])  # in the parent
        assert in_forked_child(partial(_read_hdf5_rows, src, truth, decoys)) == []
        src.close()


@pytest.mark.parametrize("held_lock", ["source", "reset"])
def test_close_in_a_child_while_a_parent_thread_held_a_lock(tmp_path, held_lock):
    path = tmp_path / "rows.csv"
    path.write_text("a\n" + "".join(f"{i}\n" for i in range(50)))
    src = mixle.read_csv(str(path))
    assert src[1]["a"] == 1
    lock = src._lock if held_lock == "source" else lifetime._fork_lock
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait()

    def child() -> list[str]:
        src.close()  # a thread the child does not have holds the inherited lock
        try:
            src[0]
        except SourceClosedError:
            return []
        return ["a read after close() in the child did not raise SourceClosedError"]

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        assert in_forked_child(child) == []
    finally:
        done.set()
        thread.join()
    assert src[2]["a"] == 2  # the parent's source is still open
    src.close()


def test_first_read_in_a_child_while_a_parent_thread_held_the_reset_lock(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a\n" + "".join(f"{i}\n" for i in range(50)))
    with open(path, newline="") as f:
        truth = [int(row["a"]) for row in csv.DictReader(f)]
    src = mixle.read_csv(str(path))
    assert src[1]["a"] == 1
    lock = lifetime._fork_lock
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait()

    def child() -> list[str]:
        got = src.get_batch(np.arange(50))["a"].tolist()
        return [] if got == truth else [f"read {got[:5]}... not {truth[:5]}..."]

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        assert in_forked_child(child) == []
    finally:
        done.set()
        thread.join()
    src.close()
