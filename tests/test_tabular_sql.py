"""SQL sources on SQLite and a real PostgreSQL server: keys, rowid, offsets, binding, errors."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _postgres import postgres_server
from test_lazy_deps import BLOCKER, _run

import mixle
from mixle.testing import assert_unchanged, check_record_source

INJECTION = "x' OR '1'='1"
N = 120


def _rows() -> list[tuple]:
    # ids with gaps (not a dense range), names with quotes, missing scores
    return [
        (3 * i + 1, f"name {i}'s" if i % 7 else None, i / 4 if i % 5 else None, i % 2 == 0)
        for i in range(N)
    ]


def _expected(rows: list[tuple]) -> dict[str, np.ndarray]:
    names = np.empty(len(rows), dtype=object)
    names[:] = [r[1] for r in rows]
    return {
        "id": np.array([r[0] for r in rows]),
        "name": names,
        "score": np.array([np.nan if r[2] is None else r[2] for r in rows]),
        "flag": np.array([r[3] for r in rows]),
    }


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, score REAL, flag BOOL)")
        con.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", _rows())
        con.execute("CREATE TABLE secret (v TEXT)")
        con.execute("INSERT INTO secret VALUES ('hidden')")
    con.close()
    return path


def _sqlite_expected() -> dict[str, np.ndarray]:
    out = _expected(_rows())
    out["flag"] = out["flag"].astype(np.int64)  # SQLite stores booleans as integers
    return out


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with postgres_server() as server:
        if server.url is None:
            if os.environ.get("MIXLE_TEST_REQUIRE_POSTGRES"):
                pytest.fail(f"MIXLE_TEST_REQUIRE_POSTGRES is set but: {server.reason}")
            pytest.skip(f"no PostgreSQL server: {server.reason}")
        yield server.url


@pytest.fixture(scope="module")
def postgres_table(postgres_url: str) -> str:
    sa = pytest.importorskip("sqlalchemy")
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS items"))
        conn.execute(
            sa.text(
                "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT, score FLOAT8, flag BOOL)"
            )
        )
        conn.execute(
            sa.text("INSERT INTO items VALUES (:id, :name, :score, :flag)"),
            [dict(zip(("id", "name", "score", "flag"), r)) for r in _rows()],
        )
    engine.dispose()
    return postgres_url


def test_sqlite_table_by_rowid_keeps_the_contract(sqlite_db: Path) -> None:
    with assert_unchanged(sqlite_db.parent):
        check_record_source(mixle.read_sql("items", sqlite_db), _sqlite_expected())
        check_record_source(mixle.read_sql("items", str(sqlite_db), key="id"), _sqlite_expected())


def test_sqlite_query_with_string_key_and_offsets(sqlite_db: Path) -> None:
    con = sqlite3.connect(sqlite_db)
    query = "SELECT name, id FROM items WHERE name IS NOT NULL AND id > :low"
    keyed = mixle.read_sql(query, con, params={"low": 10}, key="name")
    names = sorted(r[1] for r in _rows() if r[1] is not None and r[0] > 10)
    assert len(keyed) == len(names)
    order = np.random.default_rng(0).permutation(len(names))
    got = keyed.get_batch(order)
    assert got["name"].tolist() == [names[i] for i in order]
    assert keyed[-1]["name"] == names[-1]
    assert [r["name"] for r in keyed.records()] == names  # streaming follows key order
    offsets = mixle.read_sql("SELECT id, score FROM items ORDER BY id DESC", con)
    ids = [r[0] for r in reversed(_rows())]
    assert len(offsets) == N
    idx = np.array([5, 6, 7, 0, 119, 6])
    assert offsets.get_batch(idx)["id"].tolist() == [ids[i] for i in idx]
    assert pickle.loads(pickle.dumps(offsets))[3]["id"] == ids[3]
    con.close()


def test_long_runs_read_by_range_and_batches_equal_records(sqlite_db: Path) -> None:
    src = mixle.read_sql("SELECT * FROM items", sqlite_db, key="id", chunk_size=7)
    idx = np.concatenate([np.arange(10, 60), [3, 100, 3, -1]])
    batch = src.get_batch(idx)
    for k, i in enumerate(idx):
        record = src[int(i)]
        assert batch["id"][k] == record["id"] and batch["name"][k] == record["name"]


def test_injection_strings_are_bound_never_interpolated(sqlite_db: Path) -> None:
    con = sqlite3.connect(sqlite_db)
    by_name = mixle.read_sql("SELECT * FROM items WHERE name = :n", con, params={"n": INJECTION})
    assert len(by_name) == 0
    positional = mixle.read_sql("SELECT * FROM items WHERE name = ?", con, params=[INJECTION])
    assert len(positional) == 0
    with pytest.raises(ValueError, match="failed"):
        mixle.read_sql(f"items WHERE name = '{INJECTION}'", sqlite_db)
    memory = sqlite3.connect(":memory:")
    memory.execute("CREATE TABLE keys (k TEXT PRIMARY KEY, v INTEGER)")
    memory.executemany("INSERT INTO keys VALUES (?, ?)", [(INJECTION, 1), ("plain", 2)])
    keyed = mixle.read_sql("SELECT * FROM keys", memory, key="k")  # read through `memory`
    assert keyed.get_batch([1, 0])["k"].tolist() == sorted([INJECTION, "plain"])[::-1]
    with pytest.raises(TypeError, match="in-memory SQLite database"):
        pickle.dumps(mixle.read_sql("SELECT 1 AS one", sqlite3.connect(":memory:")))
    assert con.execute("SELECT COUNT(*) FROM items").fetchone()[0] == N
    con.close()


def test_sql_errors_are_clear(sqlite_db: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"con='.*nope\.db' is not a SQLite file"):
        mixle.read_sql("items", str(tmp_path / "nope.db"))
    assert not (tmp_path / "nope.db").exists()  # nothing created
    with pytest.raises(ValueError, match="no such table: missing"):
        mixle.read_sql("missing", sqlite_db)
    with pytest.raises(mixle.ColumnNotFoundError, match=r"key='nope'.*its columns: id, name"):
        mixle.read_sql("items", sqlite_db, key="nope")
    with pytest.raises(ValueError, match=r"key='flag' has 2 distinct values in 120 rows"):
        len(mixle.read_sql("items", sqlite_db, key="flag"))
    with pytest.raises(ValueError, match="key='name' is NULL in"):
        len(mixle.read_sql("items", sqlite_db, key="name"))
    with pytest.raises(TypeError, match="con=int must be a SQLite path"):
        mixle.read_sql("items", 3)
    with pytest.raises(
        mixle.MalformedRowError, match=r"row 2: column 'name' \(float64\) cannot hold \"name 1's\""
    ):
        mixle.read_sql("items", sqlite_db, dtypes={"name": "float64"})


def test_postgres_table_and_query(postgres_table: str) -> None:
    expected = _expected(_rows())
    check_record_source(mixle.read_sql("items", postgres_table, key="id"), expected)
    sa = pytest.importorskip("sqlalchemy")
    engine = sa.create_engine(postgres_table)
    query = "SELECT id, name FROM items WHERE score > :s ORDER BY id"
    src = mixle.read_sql(query, engine, params={"s": 10.0})
    want = [r[0] for r in _rows() if r[2] is not None and r[2] > 10.0]
    assert len(src) == len(want)
    assert src.get_batch([2, 0, 2])["id"].tolist() == [want[2], want[0], want[2]]
    assert [r["id"] for r in src.records()] == want  # a server-side cursor
    with mixle.read_sql("items", postgres_table, key="id") as keyed:
        blocks = list(keyed.iter_batches(50))
    assert [len(b["id"]) for b in blocks] == [50, 50, 20]
    injected = mixle.read_sql(
        "SELECT * FROM items WHERE name = :n", engine, params={"n": INJECTION}, key="id"
    )
    assert len(injected) == 0
    assert "password" not in repr(src)
    with pytest.raises(TypeError, match="SQLAlchemy queries take named parameters"):
        mixle.read_sql("SELECT * FROM items WHERE id = ?", engine, params=[1])
    with pytest.raises(ValueError, match="failed"):
        mixle.read_sql(f"items WHERE name = '{INJECTION}'", engine)
    with pytest.raises(ValueError, match=r"column name\(s\) \['id'\] more than once"):
        mixle.read_sql("SELECT a.id, b.id FROM items a JOIN items b ON a.id = b.id", engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM items")).scalar() == N
    engine.dispose()


def test_postgres_keyless_query_and_pickle(postgres_table: str) -> None:
    src = mixle.read_sql("SELECT id FROM items ORDER BY id DESC", postgres_table)
    ids = [r[0] for r in reversed(_rows())]
    assert len(src) == N
    assert src.get_batch([0, 1, 2, 50])["id"].tolist() == [ids[0], ids[1], ids[2], ids[50]]
    clone = pickle.loads(pickle.dumps(src))
    assert clone[119]["id"] == ids[119]
    clone.close()
    src.close()


#: Where SQLAlchemy is blocked: build the source, show it, pickle it (a Dask/MP driver).
_DRIVER_WITHOUT_SQLALCHEMY = """
import json, pickle, sys
import mixle
src = mixle.read_sql("items", sys.argv[1], key="id")
with open(sys.argv[2], "wb") as f:
    pickle.dump(src, f)
print(json.dumps({"repr": repr(src), "imported": [m for m in sys.modules if "sqlalchemy" in m]}))
"""


def test_postgres_source_built_without_sqlalchemy_reads_where_it_is(
    postgres_table: str, tmp_path: Path
) -> None:
    sa = pytest.importorskip("sqlalchemy")
    url = sa.engine.make_url(postgres_table)
    if url.password is None:  # trust authentication ignores it; it must travel, unshown
        url = url.set(password="pw-never-shown")
    given = url.render_as_string(hide_password=False)
    blocked = f"BLOCKED = {{'sqlalchemy'}}\n{BLOCKER}{_DRIVER_WITHOUT_SQLALCHEMY}"
    out = json.loads(_run(blocked, given, str(tmp_path / "src.pkl")).splitlines()[-1])
    assert out["imported"] == []
    assert out["repr"].endswith("(not opened: sqlalchemy is not installed here)>")
    assert str(url.password) not in out["repr"] and url.host in out["repr"]
    with open(tmp_path / "src.pkl", "rb") as f:
        clone = pickle.load(f)  # here SQLAlchemy is installed: it connects on first use
    engine = sa.create_engine(given)
    with engine.connect() as conn:
        direct = conn.execute(sa.text("SELECT * FROM items ORDER BY id")).fetchall()
    engine.dispose()
    assert [tuple(r) for r in direct] == _rows()
    check_record_source(clone, _expected([tuple(r) for r in direct]))
    clone.close()


def _in_forked_child(fn) -> str:
    """Run ``fn()`` in a forked child; return what it returned, or the error it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            message = str(fn())
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}"
        os.write(w, message.encode()[:4000])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        out = fh.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_forked_child_never_uses_the_callers_connection(sqlite_db: Path) -> None:
    con = sqlite3.connect(sqlite_db)
    src = mixle.read_sql("items", con)
    first = src[0]
    # a file database: the child opens its own connection and reads the same rows
    assert _in_forked_child(lambda: src[0]["id"] == first["id"] and len(src) == N) == "True"
    memory = sqlite3.connect(":memory:")
    memory.execute("CREATE TABLE t (a INTEGER)")
    memory.execute("INSERT INTO t VALUES (1)")
    mem_src = mixle.read_sql("t", memory)
    assert mem_src[0]["a"] == 1
    # an in-memory database cannot follow into another process: a clear error, not a
    # connection shared with the parent
    assert "in-memory SQLite database cannot be reopened" in _in_forked_child(lambda: mem_src[0])
