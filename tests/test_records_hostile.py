"""Hostile input to record sources gets a clear error naming the file, never a hang.

Deeply nested JSON lines, FIFOs, devices and directories given as a path, SQLite views read
by name, a user parameter named like mixle's own, damaged Parquet files, a full cache disk
while the CSV row index is written, and a header of a gigabyte without a line end.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mixle
from mixle import MalformedRowError, SpecialFileError
from mixle.data.sources.records.parquet_source import ParquetReadError
from mixle.data.sources.records.text.row_index import RowIndexCacheWarning

DEPTH = 100_000


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


# -- deeply nested JSON lines ------------------------------------------------------------
def _deep() -> str:
    return '{"a": ' + "[" * DEPTH + "]" * DEPTH + "}"


def test_deep_json_in_the_sample_is_a_malformed_row_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"a": 1}\n' + _deep() + "\n")
    with pytest.raises(MalformedRowError, match=r"deep\.jsonl, line 2: .*nested too deeply") as e:
        mixle.read_jsonl(path)
    assert e.value.line == 2 and e.value.path.endswith("deep.jsonl")


def test_deep_json_after_the_sample_is_a_malformed_row_in_every_read(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    rows = [json.dumps({"a": i}) for i in range(5)]
    path.write_text("\n".join([*rows, _deep(), *rows]) + "\n")
    source = mixle.read_jsonl(path, infer_rows=3)
    assert len(source) == 11
    for read in (lambda: source[5], lambda: source.get_batch([4, 5, 6])):
        with pytest.raises(MalformedRowError, match=r"deep\.jsonl, line 6: .*nested too deeply"):
            read()
    with pytest.raises(MalformedRowError, match=r"line 6: .*nested too deeply"):
        list(source.iter_batches(2))
    good = source.get_batch([0, 4, 6, 10])["a"]  # the other rows still read
    np.testing.assert_array_equal(good, [json.loads(rows[i])["a"] for i in (0, 4, 0, 4)])


# -- special files -----------------------------------------------------------------------
_FIFO_CHILD = """
import os, sys
os.environ["MIXLE_CACHE_DIR"] = sys.argv[3]
import mixle
read = {"csv": mixle.read_csv, "jsonl": mixle.read_jsonl, "parquet": mixle.read_parquet}
read = read[sys.argv[1]]
try:
    read(sys.argv[2])
except mixle.SpecialFileError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_a_fifo_path_is_refused_without_blocking(kind: str, tmp_path: Path) -> None:
    fifo = tmp_path / f"pipe.{kind}"
    os.mkfifo(fifo)
    child = subprocess.Popen(
        [sys.executable, "-c", _FIFO_CHILD, kind, str(fifo), str(tmp_path / "cache")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"read_{kind} of a FIFO blocked for 30 s")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "refused:" in out and "FIFO" in out and "pipe." in out, out


@pytest.mark.parametrize("read", [mixle.read_csv, mixle.read_jsonl])
def test_a_device_or_directory_path_is_refused(read: Any, tmp_path: Path) -> None:
    with pytest.raises(SpecialFileError, match="/dev/null' is a character device"):
        read("/dev/null")
    with pytest.raises(SpecialFileError, match="is a directory"):
        read(tmp_path)


def test_a_parquet_device_is_refused_and_a_fifo_in_a_directory_skipped(tmp_path: Path) -> None:
    with pytest.raises(SpecialFileError, match="/dev/zero' is a character device"):
        mixle.read_parquet("/dev/zero")
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "a.parquet")
    os.mkfifo(tmp_path / "b.parquet")
    os.symlink("/dev/zero", tmp_path / "c.parquet")
    source = mixle.read_parquet(tmp_path)  # lists regular files only
    assert source.get_batch([0, 1])["a"].tolist() == [1, 2]


# -- SQLite views and parameter names ----------------------------------------------------
def _database(tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"b{i}") for i in range(10)])
    con.execute("CREATE VIEW v AS SELECT a, b FROM t WHERE a % 2 = 1")
    con.commit()
    con.close()
    return path


def _sqlite_rows(path: Path, sql: str, params: Any = ()) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def test_a_sqlite_view_read_by_name_reads_its_rows(tmp_path: Path) -> None:
    path = _database(tmp_path)
    expected = _sqlite_rows(path, "SELECT a, b FROM v")
    source = mixle.read_sql("v", path)
    assert len(source) == len(expected) == 5
    batch = source.get_batch([3, 0, 4])
    assert list(zip(batch["a"].tolist(), batch["b"].tolist())) == [expected[i] for i in (3, 0, 4)]
    assert [(r["a"], r["b"]) for r in source.records()] == expected
    keyed = mixle.read_sql("v", path, key="a")  # a key the user names works too
    assert keyed.get_batch([4, 1])["a"].tolist() == [expected[4][0], expected[1][0]]


def test_a_user_parameter_named_like_mixles_own_is_not_overwritten(tmp_path: Path) -> None:
    path = _database(tmp_path)
    sql = "SELECT a, b FROM t WHERE a >= :_mixle_0 AND b != :_mixle_1 ORDER BY a"
    params = {"_mixle_0": 3, "_mixle_1": "b5"}
    expected = _sqlite_rows(path, sql, params)
    source = mixle.read_sql(sql, path, params=params)
    assert source.dtypes["a"] == np.dtype(np.int64)
    assert len(source) == len(expected) == 6
    batch = source.get_batch([0, 1, 5])
    assert list(zip(batch["a"].tolist(), batch["b"].tolist())) == [expected[i] for i in (0, 1, 5)]
    assert source[2]["a"] == expected[2][0]
    assert [(r["a"], r["b"]) for r in source.records()] == expected


# -- Parquet -----------------------------------------------------------------------------
def _parquet(tmp_path: Path) -> Path:
    path = tmp_path / "good.parquet"
    table = pa.table({"a": np.arange(1000), "b": np.arange(1000) * 0.5})
    pq.write_table(table, path, row_group_size=250, compression="snappy")
    return path


def test_a_truncated_parquet_file_names_the_file(tmp_path: Path) -> None:
    data = _parquet(tmp_path).read_bytes()
    for name, cut in (("short.parquet", data[:-100]), ("head.parquet", data[:3000])):
        (tmp_path / name).write_bytes(cut)
        with pytest.raises(ParquetReadError, match=rf"{name}: pyarrow cannot read its footer"):
            mixle.read_parquet(tmp_path / name)
    with pytest.raises(ValueError, match=r"short\.parquet"):  # a ValueError, as pyarrow raises
        mixle.read_parquet(tmp_path / "short.parquet")


def test_a_corrupted_row_group_names_the_file_and_row_group(tmp_path: Path) -> None:
    good = _parquet(tmp_path)
    raw = bytearray(good.read_bytes())
    column = pq.ParquetFile(good).metadata.row_group(2).column(0)
    first = column.dictionary_page_offset or column.data_page_offset
    raw[first + 20 : first + column.total_compressed_size - 2] = b"\xab" * (
        column.total_compressed_size - 22
    )
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(raw))
    source = mixle.read_parquet(bad)
    expected = pq.read_table(good)["a"].to_numpy()
    np.testing.assert_array_equal(source.get_batch([0, 499, 750])["a"], expected[[0, 499, 750]])
    with pytest.raises(
        ParquetReadError, match=r"bad\.parquet, row group 2: .*rows 500\.\.749"
    ) as e:
        source.get_batch([10, 600])
    assert e.value.row_group == 2 and isinstance(e.value, OSError)
    with pytest.raises(ParquetReadError, match=r"bad\.parquet, row group 2: .*row 500 of the file"):
        list(source.iter_batches(100))


# -- a full cache disk -------------------------------------------------------------------
class _FullDisk:
    """A binary file whose every write fails as on a full disk."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()


def test_a_full_cache_disk_falls_back_to_an_index_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(cache))
    real_fdopen = os.fdopen

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = real_fdopen(fd, mode, *args, **kwargs)
        return _FullDisk(file) if "w" in mode else file

    monkeypatch.setattr(os, "fdopen", fdopen)
    paths = []
    for k in range(3):
        path = tmp_path / f"t{k}.csv"
        path.write_text("a,b\n" + "".join(f"{i + k},x{i}\n" for i in range(50)))
        paths.append(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: once per message and place
        sources = [mixle.read_csv(path) for path in paths]
        assert [len(source) for source in sources] == [50, 50, 50]
    monkeypatch.setattr(os, "fdopen", real_fdopen)
    shown = [w for w in caught if issubclass(w.category, RowIndexCacheWarning)]
    assert len(shown) == 1, [str(w.message) for w in caught]
    assert str(cache / "row-index") in str(shown[0].message)
    assert "No space left on device" in str(shown[0].message)
    for source, path in zip(sources, paths):
        expected = pd.read_csv(path)
        assert source.row_index_origin == "built"
        batch = source.get_batch([49, 0, 17])
        np.testing.assert_array_equal(batch["a"], expected["a"].to_numpy()[[49, 0, 17]])
        assert batch["b"].tolist() == expected["b"][[49, 0, 17]].tolist()
    assert not list((cache / "row-index").iterdir())  # no partial index left behind


# -- a header without a line end ---------------------------------------------------------
_HUGE_CHILD = """
import os, sys
os.environ["MIXLE_CACHE_DIR"] = sys.argv[3]
kind, path = sys.argv[1], sys.argv[2]
with open(path, "wb") as fh:  # 1 GiB, sparse: a header that never ends
    fh.write(b"a,b" if kind == "csv" else b'{"a": 1')
    fh.truncate(2**30)
import mixle

def peak():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM"))

before = peak()
try:
    (mixle.read_csv if kind == "csv" else mixle.read_jsonl)(path)
except mixle.MalformedRowError as exc:
    print("refused:", exc)
print("grew", (peak() - before) // 2**20, "MiB")
"""


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_gigabyte_header_without_a_line_end_is_refused_in_bounded_memory(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / f"huge.{kind}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_HUGE_CHILD), kind, str(path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"huge.{kind}, line 1: the row is longer than 67,108,864 bytes" in out, out[-3000:]
    grew = int(out.split("grew ")[1].split()[0])
    assert grew < 512, out  # the cap (64 MiB) and its decoded copy, never the whole GiB


def test_long_rows_under_the_cap_still_open(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    text = "x" * 2**21
    path.write_text(json.dumps({"a": text}) + "\n" + json.dumps({"a": "y"}) + "\n")
    source = mixle.read_jsonl(path)
    assert source[0]["a"] == text and source[1]["a"] == "y"
    csv_path = tmp_path / "wide.csv"
    names = [f"c{i}" for i in range(20_000)]
    csv_path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    wide = mixle.read_csv(csv_path)
    assert wide.columns == tuple(pd.read_csv(csv_path).columns)


_WIDE_CHILD = """
import os, sys
os.environ["MIXLE_CACHE_DIR"] = sys.argv[2]
import mixle
source = mixle.read_csv(sys.argv[1])
print(len(source.columns), source.columns[7], source.columns[-1], source[0]["c99999"])
"""


@pytest.mark.slow  # ~3 s unloaded: 100,000 columns each parsed and typed
def test_a_header_of_100k_columns_opens_in_linear_time(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    names = [f"c{i}" for i in range(100_000)]
    names[5] = names[7] = "dup"  # made unique the way pandas does
    path.write_text(",".join(names) + "\n" + ",".join(str(i) for i in range(len(names))) + "\n")
    expected = pd.read_csv(path).columns
    done = subprocess.run(  # seconds when linear; hours when quadratic (it was)
        [sys.executable, "-c", _WIDE_CHILD, str(path), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(len(expected)), expected[7], expected[-1], "99999"]
    assert expected[7] == "dup.1"


_SAMPLE_CHILD = """
import json, os, sys
os.environ["MIXLE_CACHE_DIR"] = sys.argv[3]
kind, path = sys.argv[1], sys.argv[2]
with open(path, "w") as fh:
    if kind == "jsonl":  # 160 rows of 1 MiB: the type sample stops after about 64 MiB
        big = "x" * 2**20
        fh.writelines(json.dumps({"a": i, "b": big}) + "\\n" for i in range(160))
    else:  # one field of 100,000 characters among 999 short ones
        fh.write("a,b\\n")
        fh.writelines(f"{i},{'y' * 100_000 if i == 500 else i}\\n" for i in range(1000))
import mixle

def peak():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM"))

before = peak()
source = (mixle.read_csv if kind == "csv" else mixle.read_jsonl)(path)
grew = (peak() - before) // 2**20
print(source.dtypes["a"], source.dtypes["b"], source[-1]["a"], "grew", grew, "MiB")
"""


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_the_type_sample_at_open_stays_bounded(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"sample.{kind}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SAMPLE_CHILD), kind, str(path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    a, b, last, _, grew, _ = done.stdout.split()
    if kind == "csv":
        expected = int(pd.read_csv(path)["a"].iloc[-1])
    else:
        with path.open("rb") as fh:
            fh.seek(-(2**20 + 100), os.SEEK_END)
            expected = json.loads(fh.read().splitlines()[-1])["a"]
    assert (a, b) == ("int64", "object")
    assert int(last) == expected
    # jsonl: about 64 MiB of sampled rows, not 160; csv: no 1000 x 100,000 x 4-byte array
    assert int(grew) < 120, done.stdout


@pytest.mark.parametrize("bad_line", [2, 5, 400])
def test_bytes_that_are_not_utf8_are_named_at_their_line(tmp_path, bad_line):
    # the text layer decodes KiBs ahead of the CSV reader: the line must come from the bytes
    rows = [f"{i},{i * 2}".encode() for i in range(1, 500)]
    rows[bad_line - 2] = b"\xff\xfe," + str(bad_line).encode()
    path = tmp_path / "bad.csv"
    path.write_bytes(b"x,y\n" + b"\n".join(rows) + b"\n")
    with pytest.raises(
        MalformedRowError, match=rf"bad\.csv, line {bad_line}: the row is not UTF-8"
    ):
        mixle.read_csv(path)
