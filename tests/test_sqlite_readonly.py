"""Reading SQLite files writes nothing beside them, WAL mode included; rows match sqlite3's read.

``mode=ro`` alone creates ``-wal`` and ``-shm`` files next to a WAL-mode database (and fails
in a read-only folder). Tests run as root, which ignores permission bits, so "writes
nothing" is checked by listing the folder and comparing every file's bytes and mtime.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import mixle
from mixle.data.sources.sql_connect import UncheckpointedWALError, sqlite_read_uri

ROWS = [(i, f"name {i}", i / 4) for i in range(40)]
MORE = [(i, f"late {i}", -i / 8) for i in range(40, 55)]


def _make(folder: Path, wal: bool = True) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "data.db"
    con = sqlite3.connect(path)
    if wal:
        assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.execute("CREATE TABLE t (a INTEGER, b TEXT, c REAL)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", ROWS)
    con.commit()
    con.close()  # the last connection checkpoints the log and removes -wal and -shm
    return path


def _sqlite_rows(con: sqlite3.Connection) -> list[tuple]:
    return con.execute("SELECT a, b, c FROM t ORDER BY rowid").fetchall()


def _mixle_rows(src: mixle.SQLSource) -> list[tuple]:
    batch = src.get_batch(np.arange(len(src)))
    streamed = [(r["a"], r["b"], r["c"]) for r in src.records()]
    rows = list(zip(batch["a"].tolist(), batch["b"].tolist(), batch["c"].tolist()))
    assert streamed == rows
    return rows


def _listing(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every file's name, and (unless in ``skip``) its bytes and mtime."""
    out: dict[str, tuple] = {}
    for p in sorted(folder.iterdir()):
        out[p.name] = () if p.name.endswith(skip) else (p.read_bytes(), p.stat().st_mtime_ns)
    return out


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """The folder without write permission (binding for non-root users only)."""
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    try:
        yield
    finally:
        folder.chmod(mode)


def test_checkpointed_wal_database_reads_without_creating_files(tmp_path: Path) -> None:
    # mode=ro used to create data.db-wal and data.db-shm here (and fail in a read-only folder)
    path = _make(tmp_path / "db")
    with sqlite3.connect(path) as con:
        want = _sqlite_rows(con)
    con.close()
    assert sorted(os.listdir(path.parent)) == ["data.db"]
    before = _listing(path.parent)
    with _read_only(path.parent):
        src = mixle.read_sql("t", str(path))
        assert _mixle_rows(src) == want
        assert src[7] == {"a": 7, "b": "name 7", "c": 7 / 4}
        clone = pickle.loads(pickle.dumps(src))
        assert _mixle_rows(clone) == want
        query = mixle.read_sql("SELECT a, c FROM t WHERE a >= ?", path, params=[30])
        assert query.get_batch([0, -1])["a"].tolist() == [30, 39]
        for source in (src, clone, query):
            source.close()
        assert _listing(path.parent) == before


def test_live_writer_transactions_are_read_and_no_file_is_created(tmp_path: Path) -> None:
    path = _make(tmp_path / "db")
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")  # keep the new rows in the log only
        writer.executemany("INSERT INTO t VALUES (?, ?, ?)", MORE)
        writer.execute("UPDATE t SET b = 'changed' WHERE a = 3")
        writer.commit()
        want = _sqlite_rows(writer)
        assert len(want) == len(ROWS) + len(MORE)
        assert sorted(os.listdir(path.parent)) == ["data.db", "data.db-shm", "data.db-wal"]
        # the -shm is SQLite's shared memory with the writer: readers record read marks in it
        before = _listing(path.parent, skip=("-shm",))
        src = mixle.read_sql("t", path)
        assert _mixle_rows(src) == want  # an immutable open would give the 40 old rows
        assert src[3]["b"] == "changed"
        src.close()
        assert _listing(path.parent, skip=("-shm",)) == before
    finally:
        writer.close()


def test_a_log_without_shared_memory_file_is_refused_until_checkpointed(tmp_path: Path) -> None:
    live = _make(tmp_path / "live")
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.executemany("INSERT INTO t VALUES (?, ?, ?)", MORE)
    writer.commit()
    want = _sqlite_rows(writer)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(live, copy / "data.db")
    shutil.copy(str(live) + "-wal", copy / "data.db-wal")  # a copy taken without the -shm
    writer.close()
    before = _listing(copy)
    path = copy / "data.db"
    with pytest.raises(UncheckpointedWALError, match=r"data\.db-wal' holds \d+ bytes") as caught:
        mixle.read_sql("t", path)
    assert isinstance(caught.value, OSError)
    assert "PRAGMA wal_checkpoint(TRUNCATE)" in str(caught.value)
    assert _listing(copy) == before
    fixer = sqlite3.connect(path)  # what the message tells the user to do
    fixer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    fixer.close()
    with mixle.read_sql("t", path) as src:
        assert _mixle_rows(src) == want


def test_a_writer_that_starts_after_open_is_seen(tmp_path: Path) -> None:
    path = _make(tmp_path / "db")
    src = mixle.read_sql("t", path)
    assert sqlite_read_uri(str(path))[1]  # opened immutable: there is no log yet
    assert src[0]["b"] == "name 0" and sorted(os.listdir(path.parent)) == ["data.db"]
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE t SET b = 'rewritten' WHERE a = 0")
        writer.executemany("INSERT INTO t VALUES (?, ?, ?)", MORE)
        writer.commit()
        want = _sqlite_rows(writer)
        assert src[0]["b"] == "rewritten"  # the immutable connection would still say "name 0"
        streamed = [(r["a"], r["b"], r["c"]) for r in src.records()]
        assert streamed == want
    finally:
        src.close()
        writer.close()


def test_rollback_journal_database_reads_without_writing(tmp_path: Path) -> None:
    path = _make(tmp_path / "db", wal=False)
    with sqlite3.connect(path) as con:
        want = _sqlite_rows(con)
    con.close()
    before = _listing(path.parent)
    assert sqlite_read_uri(str(path)) == ("file:" + str(path.resolve()) + "?mode=ro", False)
    with _read_only(path.parent), mixle.read_sql("t", path) as src:
        assert _mixle_rows(src) == want
    assert _listing(path.parent) == before


def test_odd_file_names_are_quoted_in_the_uri(tmp_path: Path) -> None:
    path = _make(tmp_path / "a ?b#c%d&mode=rwc")
    before = _listing(path.parent)
    with mixle.read_sql("t", path) as src:
        assert len(src) == len(ROWS)
    assert _listing(path.parent) == before


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+pysqlite"])
def test_a_plain_sqlite_url_reads_without_creating_files(tmp_path: Path, scheme: str) -> None:
    # SQLAlchemy opened such URLs read-write: -wal and -shm appeared beside a WAL database
    path = _make(tmp_path / "a b")
    with sqlite3.connect(path) as con:
        want = _sqlite_rows(con)
    con.close()
    before = _listing(path.parent)
    url = f"{scheme}:///{str(path).replace(' ', '%20')}"
    with mixle.read_sql("t", url) as src:
        assert _mixle_rows(src) == want
        assert _listing(path.parent) == before  # no -wal/-shm while it is open either
        assert "://" not in repr(src)  # read as the file, by mixle's own connection
    assert _listing(path.parent) == before


def test_sqlite_urls_with_options_or_in_memory_stay_with_sqlalchemy(tmp_path: Path) -> None:
    from mixle.data.sources.sql_connect import connection_args, sqlite_url_path

    assert sqlite_url_path("sqlite:////data/x.db") == "/data/x.db"
    assert sqlite_url_path("sqlite:///rel/x%20y.db") == "rel/x y.db"
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///x.db?mode=ro", "postgresql:///x"):
        assert sqlite_url_path(url) is None, url
    with pytest.raises(FileNotFoundError, match=r"con='sqlite:///absent\.db'"):
        connection_args("sqlite:///absent.db")
