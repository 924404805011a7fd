"""Reading SQLite files writes nothing beside them, WAL mode included; rows match sqlite3's read.

Writers that commit and close between reads (checkpointing into a file opened ``immutable``)
are seen; rows of two versions of the file are never returned.

``mode=ro`` alone creates ``-wal`` and ``-shm`` files next to a WAL-mode database (and fails
in a read-only folder). Tests run as root, which ignores permission bits, so "writes
nothing" is checked by listing the folder and comparing every file's bytes and mtime.
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import mixle
from mixle.data.sources.records.sql import sqlite_backend as sql_connect
from mixle.data.sources.records.sql.sqlite_backend import UncheckpointedWALError, sqlite_read_uri
from mixle.errors import FileChangedError

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
    from mixle.data.sources.records.sql.sql_connect import connection_args, sqlite_url_path

    assert sqlite_url_path("sqlite:////data/x.db") == "/data/x.db"
    assert sqlite_url_path("sqlite:///rel/x%20y.db") == "rel/x y.db"
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///x.db?mode=ro", "postgresql:///x"):
        assert sqlite_url_path(url) is None, url
    with pytest.raises(FileNotFoundError, match=r"con='sqlite:///absent\.db'"):
        connection_args("sqlite:///absent.db")


# -- an immutable connection watches the file: no stale rows, no rows of two versions ----------
def _settle(path: Path) -> None:
    """Set the file's modification time back, so that any later write moves it."""
    os.utime(path, ns=(10**18, 10**18))


def _write(path: Path, sql: str, params: tuple = ()) -> None:
    """A writer that opens, commits and closes: the last connection checkpoints, deletes -wal."""
    writer = sqlite3.connect(path)
    writer.execute(sql, params)
    writer.commit()
    writer.close()
    assert sorted(os.listdir(path.parent)) == ["data.db"]


def _truth(path: Path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return _sqlite_rows(con)
    finally:
        con.close()


@pytest.fixture(params=["settled", "just written"])
def watched(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a change is told: the file's signature only, or a reopen per statement."""
    if request.param == "settled":  # every file counts as settled: the signature alone tells
        monkeypatch.setattr(sql_connect, "TIMESTAMP_SLACK_NS", -(10**18))
    return str(request.param)


def test_immutable_open_sees_a_writer_that_committed_and_closed(tmp_path: Path) -> None:
    # the immutable connection kept its cached pages and returned the old [1.0]
    path = tmp_path / "db.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v REAL)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, float(i)) for i in range(5000)])
    con.commit()
    con.close()  # last connection: log checkpointed and deleted

    src = mixle.read_sql("t", str(path))
    assert src.get_batch([1])["v"].tolist() == [1.0]

    writer = sqlite3.connect(path)
    writer.execute("UPDATE t SET v = -v")
    writer.commit()
    writer.close()  # checkpoints and deletes the -wal again

    got = src.get_batch([1])["v"].tolist()  # read before anything recreates a -wal
    check = sqlite3.connect(path)
    truth = check.execute("SELECT v FROM t WHERE id = 1").fetchall()
    check.close()
    assert truth == [(-1.0,)]
    assert got == [-1.0]
    assert os.listdir(tmp_path) == ["db.sqlite"]


def test_writers_that_commit_and_close_between_reads_are_seen(tmp_path: Path, watched: str) -> None:
    path = _make(tmp_path / "db")
    _settle(path)
    src = mixle.read_sql("t", path)
    assert src.get_batch(np.arange(len(ROWS)))["b"].tolist() == [r[1] for r in ROWS]
    steps = [
        ("UPDATE t SET b = 'first', c = -c", ()),
        ("UPDATE t SET b = ? WHERE a % 3 = 0", ("second",)),
        ("UPDATE t SET c = c * 2 WHERE a < 7", ()),
    ]
    for sql, params in steps:
        _write(path, sql, params)
        want = _truth(path)
        assert _mixle_rows(src) == want  # get_batch and records() both
        assert src[5] == dict(zip("abc", want[5]))
        assert sorted(os.listdir(path.parent)) == ["data.db"]
    src.close()
    assert sorted(os.listdir(path.parent)) == ["data.db"]


def test_a_settled_file_keeps_its_connection_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_connect, "TIMESTAMP_SLACK_NS", -(10**18))
    path = _make(tmp_path / "db")
    _settle(path)
    src = mixle.read_sql("t", path)
    backend = src._live().backend
    assert src[1]["b"] == "name 1"
    first = backend._con
    assert src[2]["b"] == "name 2" and backend._con is first  # its cached pages are reused
    _write(path, "UPDATE t SET b = 'new'")
    assert src[1]["b"] == "new" and backend._con is not first
    src.close()


def _drain(blocks: Iterator[dict], into: list[tuple]) -> None:
    for block in blocks:
        into.extend(zip(*(block[k].tolist() for k in "abc")))


def test_a_checkpoint_between_stream_blocks_raises(tmp_path: Path, watched: str) -> None:
    path = _make(tmp_path / "db")
    _write(path, "INSERT INTO t SELECT a + 40, b, c FROM t")  # 80 rows
    _settle(path)
    old = _truth(path)
    src = mixle.read_sql("t", path, chunk_size=10)
    blocks = src.iter_batches(10)
    seen: list[tuple] = []
    _drain(itertools.islice(blocks, 1), seen)
    assert seen == old[:10]
    _write(path, "UPDATE t SET b = 'changed', c = -c")  # checkpointed into the open file
    with pytest.raises(
        FileChangedError, match=r"data\.db'.*changed while its rows were streamed"
    ) as e:
        _drain(blocks, seen)  # every block yielded is of the old version, none of the new
    assert seen == old[: len(seen)]
    assert isinstance(e.value, OSError)
    # a stream that starts after the change reads the new version
    assert [(r["a"], r["b"], r["c"]) for r in src.records()] == _truth(path)
    src.close()
    assert sorted(os.listdir(path.parent)) == ["data.db"]


def _writing_after_execute(monkeypatch: pytest.MonkeyPatch, path: Path, times: int) -> list[int]:
    """Make ``times`` statements each followed by a writer's commit-and-close (mid-statement)."""
    calls: list[int] = []
    real = sql_connect._execute

    def execute(con: sqlite3.Connection, sql: str, params: object) -> sqlite3.Cursor:
        cursor = real(con, sql, params)
        calls.append(1)
        if len(calls) <= times:
            _write(path, "UPDATE t SET c = c + 1")  # between the first row and the rest
        return cursor

    monkeypatch.setattr(sql_connect, "_execute", execute)
    return calls


def test_a_statement_that_overlaps_a_checkpoint_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watched: str
) -> None:
    path = _make(tmp_path / "db")
    _settle(path)
    src = mixle.read_sql("t", path)
    assert len(src) == len(ROWS)
    calls = _writing_after_execute(monkeypatch, path, times=2)
    batch = src.get_batch(np.arange(len(ROWS)))
    assert len(calls) == 3  # two runs overlapped a change and were discarded
    want = _truth(path)
    assert list(zip(*(batch[k].tolist() for k in "abc"))) == want
    assert [r[2] for r in want] == [r[2] + 2 for r in ROWS]
    assert sorted(os.listdir(path.parent)) == ["data.db"]
    src.close()


def test_a_file_that_changes_during_every_run_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _make(tmp_path / "db")
    src = mixle.read_sql("t", path)
    assert len(src) == len(ROWS)
    calls = _writing_after_execute(monkeypatch, path, times=10**6)
    with pytest.raises(FileChangedError, match=r"data\.db'.*during each of 5 reads"):
        src.get_batch([0, 1])
    assert len(calls) == sql_connect.SQLITE_READ_TRIES == 5
    src.close()


def test_a_stream_that_sees_a_change_before_its_first_block_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _make(tmp_path / "db")
    src = mixle.read_sql("t", path)
    calls = _writing_after_execute(monkeypatch, path, times=1)
    streamed = [(r["a"], r["b"], r["c"]) for r in src.records()]
    assert len(calls) == 2
    assert streamed == _truth(path)
    assert [r[2] for r in streamed] == [r[2] + 1 for r in ROWS]
    src.close()


def test_a_log_left_for_a_moment_without_its_shm_is_looked_at_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a writer closing deletes -shm, then the -wal it has checkpointed: in between the files
    # look like an uncheckpointed log, which used to be refused
    live = _make(tmp_path / "live")
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.executemany("INSERT INTO t VALUES (?, ?, ?)", MORE)
    writer.commit()
    busy, log, done = writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and log == done > 0  # every frame is in the main file, the log remains
    want = _sqlite_rows(writer)
    closing = tmp_path / "closing"
    closing.mkdir()
    shutil.copy(live, closing / "data.db")
    shutil.copy(str(live) + "-wal", closing / "data.db-wal")
    writer.close()
    pauses: list[int] = []

    def pause(attempt: int) -> None:
        pauses.append(attempt)
        (closing / "data.db-wal").unlink()  # the writer finishes closing

    monkeypatch.setattr(sql_connect, "_pause", pause)
    with mixle.read_sql("t", closing / "data.db") as src:
        assert _mixle_rows(src) == want
    assert pauses == [1]
    assert sorted(os.listdir(closing)) == ["data.db"]


# -- one get_batch reads one version of the file, however many statements it runs -------------
BATCH_ROWS = np.arange(0, 2000, 2)[:600]  # 600 single rows: two IN lists (IN_LIST_MAX = 500)


def _versions_db(path: Path, wal: bool) -> None:
    con = sqlite3.connect(path)
    if wal:
        con.execute("pragma journal_mode=wal")
    con.execute("create table t(id integer primary key, v integer)")
    con.executemany("insert into t values (?, 0)", [(i,) for i in range(2000)])
    con.commit()
    con.close()


def _read_v(path: Path) -> list[int]:
    """sqlite3's own read of ``v`` at ``BATCH_ROWS``'s ids."""
    con = sqlite3.connect(path)
    try:
        by_id = dict(con.execute("select id, v from t").fetchall())
    finally:
        con.close()
    return [by_id[int(i)] for i in BATCH_ROWS]


def _between_statements(
    monkeypatch: pytest.MonkeyPatch, action: Callable[[], None], at: int = 2
) -> list[str]:
    """Run ``action()`` just before the batch's statement number ``at`` (the seam's calls)."""
    real = sql_connect._execute
    calls: list[str] = []

    def execute(con: sqlite3.Connection, sql: str, params: object) -> sqlite3.Cursor:
        calls.append(sql)
        if len(calls) == at:
            action()
        return real(con, sql, params)

    monkeypatch.setattr(sql_connect, "_execute", execute)
    return calls


def test_one_batch_one_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # immutable: each statement was checked on its own, giving v = [0] * 500 + [1] * 100
    path = tmp_path / "t.db"
    _versions_db(path, wal=True)
    src = mixle.read_sql("t", str(path), key="id")
    rows = BATCH_ROWS
    assert (src.get_batch(rows)["v"] == 0).all()
    assert sqlite_read_uri(str(path))[1]  # no log: the file is read immutable

    def write() -> None:  # a writer commits and closes between the batch's statements
        w = sqlite3.connect(path)
        w.execute("update t set v = 1")
        w.commit()
        w.close()

    calls = _between_statements(monkeypatch, write)
    v = src.get_batch(rows)["v"]
    assert len(calls) >= 2
    assert len(np.unique(v)) == 1, f"one batch mixes versions: {np.unique(v, return_counts=True)}"
    assert v.tolist() == _read_v(path) == [1] * rows.size  # the whole batch was run again
    assert sorted(os.listdir(tmp_path)) == ["t.db"]
    src.close()


def test_a_live_writer_committing_inside_a_batch_is_not_seen_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mode=ro through a live writer's -wal: the batch's second IN list saw the new version
    path = tmp_path / "t.db"
    _versions_db(path, wal=True)
    writer = sqlite3.connect(path, timeout=0)
    try:
        writer.execute("pragma wal_autocheckpoint=0")
        writer.execute("update t set v = id % 7 + 10")
        writer.commit()
        old = _read_v(path)
        src = mixle.read_sql("t", path, key="id")
        assert not sqlite_read_uri(str(path))[1]  # -wal and -shm present: mode=ro
        assert src.get_batch(BATCH_ROWS)["v"].tolist() == old

        def write() -> None:  # WAL: the writer commits while the batch holds its snapshot
            writer.execute("update t set v = -v")
            writer.commit()

        calls = _between_statements(monkeypatch, write)
        v = src.get_batch(BATCH_ROWS)["v"].tolist()
        assert len(calls) == 2
        new = _read_v(path)
        assert new == [-x for x in old] and new != old
        assert v == old  # all of the version its first statement saw
        assert src.get_batch(BATCH_ROWS)["v"].tolist() == new  # the next batch: the new one
        # the read transaction ended with the batch: a full checkpoint waits for no reader
        assert writer.execute("pragma wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        assert sorted(os.listdir(tmp_path)) == ["t.db", "t.db-shm", "t.db-wal"]
        src.close()
    finally:
        writer.close()


def test_a_rollback_journal_writer_waits_for_the_batch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mode=ro on a rollback-journal file: the writer committed between two statements
    path = tmp_path / "t.db"
    _versions_db(path, wal=False)
    src = mixle.read_sql("t", path, key="id")
    assert len(src) == 2000  # counted: the batch below runs only its two IN lists
    old = _read_v(path)
    writer = sqlite3.connect(path, timeout=0)
    refused: list[str] = []

    def write() -> None:
        writer.execute("update t set v = 5")
        try:
            writer.commit()
        except sqlite3.OperationalError as exc:
            refused.append(str(exc))  # the batch's shared lock: the commit must wait

    try:
        _between_statements(monkeypatch, write)
        assert src.get_batch(BATCH_ROWS)["v"].tolist() == old
        assert refused == ["database is locked"]
        writer.commit()  # the batch is over: nothing holds the lock now
        new = _read_v(path)
        assert new == [5] * BATCH_ROWS.size
        assert src.get_batch(BATCH_ROWS)["v"].tolist() == new
    finally:
        writer.close()
        src.close()
    assert sorted(os.listdir(tmp_path)) == ["t.db"]


def test_a_sqlalchemy_batch_runs_on_one_connection(tmp_path: Path) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    path = tmp_path / "t.db"
    _versions_db(path, wal=False)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    checkouts: list[int] = []
    sqlalchemy.event.listen(engine, "checkout", lambda *args: checkouts.append(1))
    with mixle.read_sql("t", engine, key="id") as src:
        assert len(src) == 2000
        checkouts.clear()
        assert src.get_batch(BATCH_ROWS)["v"].tolist() == _read_v(path)
        assert len(checkouts) == 1  # one connection (one transaction) for both IN lists
    engine.dispose()
