"""Record sources closed while other threads read: every read returns THIS source's rows or
raises SourceClosedError, never rows of a file that took a released descriptor number."""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mixle
from mixle.errors import SourceClosedError

ROWS = 60
#: Digits of a decoy file: the same layout as the real file, every value different.
_SHIFT = str.maketrans("0123456789", "5678901234")


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def _fast_switches() -> Iterator[None]:
    """Switch threads often, so reads and close() interleave at many points."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _values(k: int) -> list[tuple[str, str]]:
    return [(f"{i:06d}", f"{(i * 7919 + k) % 10**6:06d}") for i in range(ROWS)]


def _write_csv(path: Path, decoy: bool) -> None:
    lines = ["a,b"] + [f"{a},{b}" for a, b in _values(0)]
    text = "\n".join(lines) + "\n"
    path.write_text(text.translate(_SHIFT) if decoy else text)


def _write_jsonl(path: Path, decoy: bool) -> None:
    text = "".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in _values(0))
    path.write_text(text.translate(_SHIFT) if decoy else text)


def _write_parquet(path: Path, decoy: bool) -> None:
    rows = _values(0)
    a = [int(x.translate(_SHIFT) if decoy else x) for x, _ in rows]
    b = [y.translate(_SHIFT) if decoy else y for _, y in rows]
    pq.write_table(pa.table({"a": a, "b": b}), path, row_group_size=7)


def _write_sqlite(path: Path, decoy: bool) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
    rows = [(int(a.translate(_SHIFT) if decoy else a), b) for a, b in _values(0)]
    con.executemany("INSERT INTO t VALUES (?, ?)", rows)
    con.commit()
    con.close()


def _truth_csv(path: Path) -> dict[str, list[Any]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return {name: [row[k] for row in rows[1:]] for k, name in enumerate(rows[0])}


def _truth_jsonl(path: Path) -> dict[str, list[Any]]:
    with open(path, "rb") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {name: [row[name] for row in rows] for name in rows[0]}


def _truth_parquet(path: Path) -> dict[str, list[Any]]:
    return pq.read_table(path).to_pydict()  # type: ignore[no-any-return]


def _truth_sqlite(path: Path) -> dict[str, list[Any]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT a, b FROM t ORDER BY rowid").fetchall()
    con.close()
    return {"a": [r[0] for r in rows], "b": [r[1] for r in rows]}


# name -> (suffix, writer, the writing library's own read, open with mixle)
FILES: dict[str, tuple[str, Callable[..., None], Callable[..., Any], Callable[..., Any]]] = {
    "csv": (
        ".csv",
        _write_csv,
        _truth_csv,
        lambda p: mixle.read_csv(p, dtypes=dict.fromkeys("ab", str)),
    ),
    "jsonl": (".jsonl", _write_jsonl, _truth_jsonl, mixle.read_jsonl),
    "parquet": (".parquet", _write_parquet, _truth_parquet, mixle.read_parquet),
    "sqlite": (".db", _write_sqlite, _truth_sqlite, lambda p: mixle.read_sql("t", str(p))),
}


class _Memory:
    """Stand-ins for the in-memory sources: a "file" is the data they were built from."""

    @staticmethod
    def _data() -> dict[str, list[Any]]:
        return {"a": [int(a) for a, _ in _values(0)], "b": [b for _, b in _values(0)]}

    @staticmethod
    def memory() -> tuple[Any, dict[str, list[Any]]]:
        data = _Memory._data()
        return mixle.MemorySource(data), data

    @staticmethod
    def dataframe() -> tuple[Any, dict[str, list[Any]]]:
        frame = pd.DataFrame(_Memory._data())
        return mixle.read_dataframe(frame), {c: frame[c].tolist() for c in frame.columns}


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _check(got: dict[str, Any], truth: dict[str, list[Any]], rows: np.ndarray) -> str | None:
    """What differs between a batch and the truth at ``rows``, or ``None``."""
    if list(got) != list(truth):
        return f"columns {list(got)} != {list(truth)}"
    for name, column in got.items():
        want = [truth[name][int(r)] for r in rows]
        have = [_plain(v) for v in np.asarray(column).tolist()]
        if have != want:
            return f"column {name!r} at rows {rows.tolist()}: {have} != {want}"
    return None


def _reader(
    src: Any, truth: dict[str, list[Any]], seed: int, out: list[str], started: Any, warmup: int
) -> None:
    """Read until the source is closed; append every wrong result or foreign error to ``out``.

    ``started`` is released after ``warmup`` reads.
    """
    rng = np.random.default_rng(seed)
    n = len(truth["a"])
    reads = 0
    while True:
        if reads == warmup:
            started.release()
        kind = reads % 3
        rows = rng.integers(-n, n, size=int(rng.integers(1, 9)))
        try:
            if kind == 0:
                got = src.get_batch(rows)
            elif kind == 1:
                got = {k: [v] for k, v in src[int(rows[0])].items()}
                rows = rows[:1]
            else:
                got = src[3 : 3 + int(rng.integers(0, 12))]
                rows = np.arange(3, 3 + len(got["a"]))
        except SourceClosedError:
            return
        except Exception as exc:  # any other error is a failure, reported below
            out.append(f"{type(exc).__name__}: {exc}")
            return
        problem = _check(got, truth, np.where(rows < 0, rows + n, rows))
        if problem is not None:
            out.append(problem)
            return
        reads += 1


def _race(src: Any, truth: dict[str, list[Any]], decoys: list[Path], warmup: int) -> None:
    """Close ``src`` under 4 readers once each has read ``warmup`` times (0: the first read,
    which loads the row index, may race with the close), then open ``decoys`` to take its
    descriptor numbers."""
    problems: list[str] = []
    started = threading.Semaphore(0)
    workers = [
        threading.Thread(target=_reader, args=(src, truth, seed, problems, started, warmup))
        for seed in range(4)
    ]
    for w in workers:
        w.start()
    for _ in workers:  # every reader is mid-loop before the close
        started.acquire(timeout=30)
    src.close()
    stolen = [os.open(p, os.O_RDONLY) for p in decoys for _ in range(3)]
    try:
        for w in workers:
            w.join(timeout=60)
    finally:
        for fd in stolen:
            os.close(fd)
    assert not any(w.is_alive() for w in workers), "a reader never saw SourceClosedError"
    assert not problems, problems
    with pytest.raises(SourceClosedError, match="is closed"):
        src.get_batch([0])


@pytest.mark.usefixtures("_fast_switches")
@pytest.mark.parametrize("kind", sorted(FILES))
def test_threads_reading_while_a_file_source_closes(tmp_path: Path, kind: str) -> None:
    suffix, write, read_truth, open_source = FILES[kind]
    path = tmp_path / f"real{suffix}"
    write(path, False)
    decoys = []
    for k in range(4):
        decoy = tmp_path / f"decoy{k}{suffix}"
        write(decoy, True)
        decoys.append(decoy)
    truth = read_truth(path)
    assert read_truth(decoys[0]) != truth
    for k in range(16):  # each round closes at a different point of the readers' loops
        _race(open_source(path), truth, decoys, warmup=k % 4)


@pytest.mark.usefixtures("_fast_switches")
@pytest.mark.parametrize("make", [_Memory.memory, _Memory.dataframe], ids=["memory", "dataframe"])
def test_threads_reading_while_an_in_memory_source_closes(make: Callable[[], Any]) -> None:
    for k in range(16):
        src, truth = make()
        _race(src, truth, [], warmup=k % 4)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_read_in_flight_keeps_its_descriptor_until_it_ends(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # close() used to close the descriptor at once: the read then pread whatever file took
    # its number (here, a decoy with the same layout), or failed on a closed handle
    suffix, write, read_truth, open_source = FILES[kind]
    path, decoy = tmp_path / f"real{suffix}", tmp_path / f"decoy{suffix}"
    write(path, False)
    write(decoy, True)
    truth = read_truth(path)
    src = open_source(path)
    assert len(src) == ROWS  # the index (or the count) is loaded before the race
    inside, resume = _pause_reads(src, monkeypatch)
    result: list[Any] = []
    rows = np.array([5, 1, 40, 41, 42], dtype=np.int64)
    reader = threading.Thread(target=lambda: result.append(_try(lambda: src.get_batch(rows))))
    reader.start()
    assert inside.wait(30)
    src.close()
    stolen = [os.open(decoy, os.O_RDONLY) for _ in range(8)]
    try:
        with pytest.raises(SourceClosedError):
            src.get_batch([0])  # a read that starts after close() refuses at once
        resume.set()
        reader.join(30)
    finally:
        for fd in stolen:
            os.close(fd)
    (got,) = result
    assert not isinstance(got, BaseException), repr(got)
    assert _check(got, truth, rows) is None


def _pause_reads(
    src: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Hold every ``_read_rows`` of ``src``'s class: ``inside`` is set when one starts, and it
    goes on when ``resume`` is."""
    inside, resume = threading.Event(), threading.Event()
    original = type(src)._read_rows

    def paused(self: Any, handle: Any, rows: np.ndarray) -> Any:
        inside.set()
        resume.wait(30)
        return original(self, handle, rows)

    monkeypatch.setattr(type(src), "_read_rows", paused)
    return inside, resume


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_the_last_read_in_flight_closes_the_descriptor(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix, write, _, open_source = FILES[kind]
    path = tmp_path / f"real{suffix}"
    write(path, False)
    src = open_source(path)
    assert len(src) == ROWS
    fd = src._handle.fd
    inside, resume = _pause_reads(src, monkeypatch)
    reader = threading.Thread(target=lambda: src.get_batch([1, 2]))
    reader.start()
    assert inside.wait(30)
    src.close()
    assert os.path.samestat(os.fstat(fd), os.stat(path))  # still open, for the read in flight
    resume.set()
    reader.join(30)
    with pytest.raises(OSError, match="Bad file descriptor"):  # released when the read ended
        os.fstat(fd)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_stream_stops_with_source_closed_error_after_close(tmp_path: Path, kind: str) -> None:
    suffix, write, read_truth, open_source = FILES[kind]
    path = tmp_path / f"real{suffix}"
    write(path, False)
    truth = read_truth(path)
    src = open_source(path)
    stream = src.iter_batches(7)
    first = next(stream)
    assert _check(first, truth, np.arange(7)) is None
    src.close()
    with pytest.raises(SourceClosedError, match="is closed"):
        next(stream)
