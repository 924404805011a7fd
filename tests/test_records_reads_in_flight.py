"""Reads in flight on record sources (``_begin_read``/``_end_read``), and the row runs of
text sources: the last read to end releases the handle, a read that fails still counts out,
a forked child starts with no reads of its own; batches equal Python's csv module."""

from __future__ import annotations

import csv
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.records.text.text_source import consecutive_runs
from mixle.errors import SourceClosedError

ROWS = 50


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _csv(path: Path) -> list[list[str]]:
    path.write_text("a,b\n" + "".join(f"{i},x{i * 7 % 13}\n" for i in range(ROWS)))
    with open(path, newline="") as fh:
        return list(csv.reader(fh))[1:]


def _open(path: Path) -> Any:
    return mixle.read_csv(path, dtypes={"a": str, "b": str})


def _rows(batch: dict[str, np.ndarray]) -> list[list[str]]:
    return [list(r) for r in zip(batch["a"].tolist(), batch["b"].tolist())]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _Paused:
    """Reads that stop inside ``_read_rows`` until their gate opens (one gate per read)."""

    def __init__(self, src: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside = threading.Semaphore(0)
        self.gates: list[threading.Event] = []
        self.results: list[Any] = []
        entered = iter(range(10**6))
        self.read = type(src)._read_rows  # what a read does once its gate opens

        def paused(this: Any, handle: Any, rows: np.ndarray) -> Any:
            gate = self.gates[next(entered)]
            self.inside.release()
            gate.wait(30)
            return self.read(this, handle, rows)

        monkeypatch.setattr(type(src), "_read_rows", paused)

    def start(self, call: Callable[[], Any]) -> threading.Thread:
        """Run ``call`` in a thread and wait until its read is inside ``_read_rows``."""
        self.gates.append(threading.Event())

        def run() -> None:
            try:
                self.results.append(call())
            except Exception as exc:
                self.results.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert self.inside.acquire(timeout=30)
        return thread


def test_the_last_of_two_reads_in_flight_releases_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _csv(tmp_path / "t.csv")
    src = _open(tmp_path / "t.csv")
    assert len(src) == ROWS
    fd = src._handle.fd
    paused = _Paused(src, monkeypatch)
    first = paused.start(lambda: src.get_batch([1, 2]))
    second = paused.start(lambda: src.get_batch([7]))
    src.close()
    with pytest.raises(SourceClosedError):
        src.get_batch([0])
    with pytest.raises(SourceClosedError):
        len(src)
    paused.gates[0].set()
    first.join(30)
    assert _is_open(fd)  # the second read is still in flight
    paused.gates[1].set()
    second.join(30)
    assert not _is_open(fd)
    assert [_rows(r) for r in paused.results] == [truth[1:3], truth[7:8]]


def test_a_read_that_fails_still_counts_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _csv(tmp_path / "t.csv")
    src = _open(tmp_path / "t.csv")
    with pytest.raises(IndexError):
        src.get_batch([ROWS])  # fails after the read was counted in
    fd = src._handle.fd
    src.close()
    assert not _is_open(fd)  # no read was left counted: close() released at once

    src = _open(tmp_path / "t.csv")
    assert len(src) == ROWS
    fd = src._handle.fd
    paused = _Paused(src, monkeypatch)

    def fail(this: Any, handle: Any, rows: np.ndarray) -> Any:
        raise RuntimeError("read failed")

    thread = paused.start(lambda: src.get_batch([3]))
    paused.read = fail  # the paused read then fails
    src.close()
    assert _is_open(fd)
    paused.gates[0].set()
    thread.join(30)
    assert isinstance(paused.results[0], RuntimeError)
    assert not _is_open(fd)


def test_a_forked_child_reads_with_its_own_descriptor_while_the_parent_has_reads_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _csv(tmp_path / "t.csv")
    src = _open(tmp_path / "t.csv")
    assert len(src) == ROWS
    fd = src._handle.fd
    paused = _Paused(src, monkeypatch)
    thread = paused.start(lambda: src.get_batch([4, 5]))
    paused.gates.append(threading.Event())
    paused.gates[1].set()  # the child's own read passes the gate
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's read in flight is not its own
        status = 1
        try:
            os.close(read_end)
            got = _rows(src.get_batch([9]))
            child_fd = src._handle.fd
            src.close()  # no read of the child's in flight: released at once
            status = 0 if got == truth[9:10] and not _is_open(child_fd) else 2
            os.write(write_end, b"ok" if status == 0 else repr(got).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    message = os.read(read_end, 4096)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert _is_open(fd)  # the child's close left the parent's descriptor alone
    src.close()
    assert _is_open(fd)  # and the parent's read in flight keeps it
    paused.gates[0].set()
    thread.join(30)
    assert _rows(paused.results[0]) == truth[4:6]
    assert not _is_open(fd)


def _runs_by_hand(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and runs[-1][1] == v:
            runs[-1] = (runs[-1][0], v + 1)
        else:
            runs.append((v, v + 1))
    return runs


@given(st.sets(st.integers(-(2**40), 2**40), min_size=1, max_size=40))
def test_consecutive_runs_match_a_loop(values: set[int]) -> None:
    ordered = sorted(values)
    firsts, ends = consecutive_runs(np.array(ordered, dtype=np.int64))
    assert list(zip(firsts.tolist(), ends.tolist())) == _runs_by_hand(ordered)
    assert firsts.dtype == ends.dtype == np.int64


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[list[str]]]:
    folder = tmp_path_factory.mktemp("table")
    truth = _csv(folder / "t.csv")
    return _open(folder / "t.csv"), truth


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-ROWS, ROWS - 1), max_size=20))
def test_batches_equal_pythons_csv_rows(
    table: tuple[Any, list[list[str]]], rows: list[int]
) -> None:
    src, truth = table
    got = src.get_batch(np.array(rows, dtype=np.int64))
    assert _rows(got) == [truth[r] for r in rows]
    if len(rows) == 1:
        assert [src[rows[0]]["a"], src[rows[0]]["b"]] == truth[rows[0]]
