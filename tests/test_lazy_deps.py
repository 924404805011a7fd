"""Sources construct where their library is missing and raise require()'s ImportError at first use.

The missing library is simulated honestly: a child process whose ``sys.meta_path`` refuses to
import it (so ``find_spec`` and ``import`` both fail, as on a machine without it). The store
is written here by the library itself; a second child that has the library unpickles the
source built without it and reads it, and the values must equal the writer's own read.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

import mixle
from mixle.errors import ArrayNotFoundError, ColumnNotFoundError

REPO = Path(__file__).resolve().parents[1]

#: Installed before mixle is imported: ``name`` and its submodules cannot be found.
BLOCKER = """
import sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test process")
        return None

sys.meta_path.insert(0, _Blocked())
"""

#: Runs where the library is blocked: build, check repr and eager checks, pickle, first use.
BLOCKED_SCRIPT = """
import json, pickle, re, sys
import mixle
from mixle.utils import optional_deps

spec = json.loads(sys.argv[1])
out = {"has_flag": getattr(optional_deps, spec["flag"])}
src = eval(spec["open"], {"mixle": mixle})
out["repr"] = repr(src)
blob = pickle.dumps(src)
out["pickle_bytes"] = len(blob)
with open(spec["pickle_path"], "wb") as f:
    f.write(blob)
errors = {}
for use in spec["uses"]:
    try:
        eval(use, {"src": src})
    except ImportError as exc:
        errors[use] = str(exc)
    else:
        errors[use] = None
out["errors"] = errors
eager = {}
for bad in spec["bad"]:
    try:
        eval(bad, {"mixle": mixle})
    except (TypeError, ValueError) as exc:
        eager[bad] = type(exc).__name__
    else:
        eager[bad] = None
out["eager"] = eager
out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps(out))
"""

#: Runs where the library is installed: unpickle and read everything, through the library.
READER_SCRIPT = """
import pickle, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    src = pickle.load(f)
if hasattr(src, "dtype"):
    np.save(sys.argv[2], src[...])
else:
    np.savez(sys.argv[2], **src.get_batch(np.arange(len(src))))
assert sys.argv[3] in sys.modules, f"{sys.argv[3]} was not used to read {src!r}"
"""


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _write_zarr(tmp: Path) -> np.ndarray:
    data = np.arange(6 * 7 * 5, dtype=np.float32).reshape(6, 7, 5) / 3
    arr = zarr.create_array(str(tmp / "v.zarr"), shape=data.shape, chunks=(4, 3, 5), dtype="f4")
    arr[...] = data
    return np.asarray(zarr.open_array(str(tmp / "v.zarr"), mode="r")[...])


def _write_hdf5(tmp: Path) -> np.ndarray:
    data = np.arange(5 * 9, dtype=np.int16).reshape(5, 9) - 7
    with h5py.File(tmp / "v.h5", "w") as f:
        f.create_dataset("scans/ct", data=data, chunks=(2, 4), compression="gzip")
    with h5py.File(tmp / "v.h5", "r") as f:
        return f["scans/ct"][...]


def _write_parquet(tmp: Path) -> dict[str, np.ndarray]:
    table = pa.table({"x": np.arange(11, dtype=np.int64) * 3, "y": np.linspace(0, 1, 11)})
    pq.write_table(table, tmp / "t.parquet", row_group_size=4)
    read = pq.read_table(tmp / "t.parquet")
    return {name: read.column(name).to_numpy() for name in read.column_names}


def _write_sqlite(tmp: Path) -> dict[str, np.ndarray]:
    rows = [(3 * i + 1, None if i % 4 == 0 else i / 3, i * i) for i in range(11)]
    with sqlite3.connect(tmp / "t.sqlite") as con:
        con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, score REAL, n INTEGER)")
        con.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
    con.close()
    con = sqlite3.connect(tmp / "t.sqlite")
    read = con.execute("SELECT id, score, n FROM items ORDER BY id").fetchall()
    con.close()
    return {
        "id": np.array([r[0] for r in read], dtype=np.int64),
        "score": np.array([np.nan if r[1] is None else r[1] for r in read], dtype=np.float64),
        "n": np.array([r[2] for r in read], dtype=np.int64),
    }


#: A URL that SQLAlchemy opens (mixle's own sqlite3 path serves only plain ``sqlite:///path``).
SA_SQLITE = "'sqlite+pysqlite:///file:' + {store!r} + '?mode=ro&uri=true'"
PG_URL = "'postgresql+psycopg://reader@127.0.0.1:9/db'"

CASES = {
    "zarr": {
        "flag": "HAS_ZARR",
        "extra": "zarr",
        "write": _write_zarr,
        "open": "mixle.read_zarr({store!r})",
        "uses": ["src.shape", "len(src)", "src[0]", "src.element_spec()", "src.get_batch([1])"],
        "bad": [
            "mixle.read_zarr({store!r}, storage_options={{'anon': True}})",
            "mixle.read_zarr({store!r}, component=3)",
            "mixle.read_zarr(3)",
        ],
        "store": "v.zarr",
    },
    "h5py": {
        "flag": "HAS_H5PY",
        "extra": "hdf5",
        "write": _write_hdf5,
        "open": "mixle.read_hdf5({store!r}, 'scans/ct')",
        "uses": ["src.shape", "len(src)", "src[0]", "src.element_spec()", "src.dtype"],
        "bad": [
            "mixle.read_hdf5({store!r}, 'scans/ct', mode='w')",
            "mixle.read_hdf5({store!r}, '')",
            "mixle.read_hdf5({store!r}, 'scans/ct', storage_options={{'anon': True}})",
        ],
        "store": "v.h5",
    },
    "pyarrow": {
        "flag": "HAS_PYARROW",
        "extra": "tabular",
        "write": _write_parquet,
        "open": "mixle.read_parquet({store!r}, columns=['x', 'y'])",
        "uses": ["len(src)", "src[0]", "src.columns", "src.element_spec()", "list(src)"],
        "bad": ["mixle.read_parquet(3)"],
        "store": "t.parquet",
    },
    "sqlalchemy": {
        "flag": "HAS_SQLALCHEMY",
        "extra": "sql",
        "write": _write_sqlite,
        "open": f"mixle.read_sql('items', {SA_SQLITE}, key='id')",
        "uses": [
            "len(src)",
            "src[0]",
            "src.get_batch([1, 0])",
            "src.columns",
            "src.element_spec()",
            "list(src.records())",
        ],
        "bad": [
            f"mixle.read_sql(3, {PG_URL})",
            f"mixle.read_sql('items', {PG_URL}, params=[1])",
            f"mixle.read_sql('items', {PG_URL}, chunk_size=0)",
            f"mixle.read_sql('items', {PG_URL}, key=3)",
        ],
        "store": "t.sqlite",
    },
}


@pytest.mark.parametrize("missing", sorted(CASES))
def test_source_without_its_library_builds_pickles_and_fails_at_first_use(tmp_path, missing):
    case = CASES[missing]
    expected = case["write"](tmp_path)
    store = str(tmp_path / case["store"])
    spec = {
        "flag": case["flag"],
        "open": case["open"].format(store=store),
        "uses": case["uses"],
        "bad": [bad.format(store=store) for bad in case["bad"]],
        "pickle_path": str(tmp_path / "src.pkl"),
    }
    blocked = f"BLOCKED = {{{missing!r}}}\n{BLOCKER}{BLOCKED_SCRIPT}"
    out = json.loads(_run(blocked, json.dumps(spec)).splitlines()[-1])

    assert out["has_flag"] is False  # the blocker is seen as "not installed"
    assert out["imported"] == []  # nothing of the library was imported, even partly
    assert f"(not opened: {missing} is not installed here)" in out["repr"]
    assert store in out["repr"]
    assert out["pickle_bytes"] < 1000  # by reference: the path and options, no data
    pattern = rf'needs {missing}\b.*pip install -e "\.\[{case["extra"]}\]" in a clone of the mixle'
    for use, message in out["errors"].items():
        assert message is not None, f"{use} did not raise ImportError without {missing}"
        assert re.search(pattern, message), (use, message)
    for bad, raised in out["eager"].items():
        assert raised is not None, f"{bad} was not refused at construction without {missing}"

    result = tmp_path / "read.npz"
    _run(READER_SCRIPT, spec["pickle_path"], str(tmp_path / "read"), missing)
    if isinstance(expected, dict):
        with np.load(result, allow_pickle=False) as got:
            assert sorted(got.files) == sorted(expected)
            for name, values in expected.items():
                np.testing.assert_array_equal(got[name], values)
                assert got[name].dtype == values.dtype
    else:
        got = np.load(tmp_path / "read.npy")
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == expected.dtype


def test_installed_library_still_validates_at_construction(tmp_path):
    _write_zarr(tmp_path)
    _write_hdf5(tmp_path)
    with pytest.raises(FileNotFoundError):
        mixle.read_zarr(str(tmp_path / "nothing.zarr"))
    with pytest.raises(ArrayNotFoundError):
        mixle.read_hdf5(str(tmp_path / "v.h5"), "nope")
    with pytest.raises(FileNotFoundError):
        mixle.read_parquet(str(tmp_path / "nothing.parquet"))
    src = mixle.read_zarr(str(tmp_path / "v.zarr"))
    assert "not installed" not in repr(src) and "shape=(6, 7, 5)" in repr(src)
    assert pickle.loads(pickle.dumps(src)).shape == (6, 7, 5)
    _write_sqlite(tmp_path)
    url = f"sqlite+pysqlite:///file:{tmp_path / 't.sqlite'}?mode=ro&uri=true"
    with pytest.raises(ValueError, match="failed"):
        mixle.read_sql("nothing", url)
    with pytest.raises(ColumnNotFoundError):
        mixle.read_sql("items", url, key="nope")
    sql = mixle.read_sql("items", url, key="id")
    assert repr(sql).startswith("SQLSource(") and "columns=['id', 'score', 'n']" in repr(sql)
    sql.close()


#: Without SQLAlchemy: a URL source with credentials, and SQLite paths (no SQLAlchemy needed).
SQL_SECRETS_SCRIPT = """
import json, pickle, sys, traceback
import mixle

spec = json.loads(sys.argv[1])
src = mixle.read_sql("items", spec["url"], key="id")
blob = pickle.dumps(src)
shown = [repr(src), repr(pickle.loads(blob))]
for use in (lambda: len(src), lambda: src[0], lambda: src.element_spec()):
    try:
        use()
    except ImportError as exc:
        shown.append("".join(traceback.format_exception(exc)))
    else:
        raise AssertionError("no ImportError without sqlalchemy")
paths = [mixle.read_sql("items", c) for c in (spec["path"], "sqlite:///" + spec["path"])]
print(json.dumps({
    "shown": shown,
    "secrets_in_pickle": [s.encode() in blob for s in spec["secrets"]],
    "sqlite_ids": [p.get_batch(range(len(p)))["id"].tolist() for p in paths],
    "imported": sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy"),
}))
"""


def test_sql_url_without_sqlalchemy_hides_credentials_and_sqlite_paths_still_read(tmp_path):
    expected = _write_sqlite(tmp_path)
    secrets = ["pw-s3cret-42", "qs-s3cret-7"]
    spec = {
        "url": f"postgresql+psycopg://alice:{secrets[0]}@db.example:5432/labels"
        f"?sslpassword={secrets[1]}",
        "path": str(tmp_path / "t.sqlite"),
        "secrets": secrets,
    }
    blocked = f"BLOCKED = {{'sqlalchemy'}}\n{BLOCKER}{SQL_SECRETS_SCRIPT}"
    out = json.loads(_run(blocked, json.dumps(spec)).splitlines()[-1])

    assert out["imported"] == []
    want = "postgresql+psycopg://***@db.example:5432/labels"
    assert (
        out["shown"][0]
        == f"<SQLSource 'items' on {want} (not opened: sqlalchemy is not installed here)>"
    )
    assert out["shown"][1] == out["shown"][0]  # the unpickled copy is not opened either
    for text in out["shown"]:
        assert not any(secret in text for secret in secrets), text
        assert "alice" not in text, text
    for trace in out["shown"][2:]:
        assert "read_sql with a database URL needs sqlalchemy" in trace
        assert 'pip install -e ".[sql]"' in trace
    # pickled by reference: the URL as given, credentials included, so a worker can connect
    assert out["secrets_in_pickle"] == [True, True]
    # a SQLite path or plain sqlite:/// URL is read by mixle's own sqlite3 connection
    assert out["sqlite_ids"] == [expected["id"].tolist()] * 2


def test_a_library_another_thread_is_still_importing_counts_as_not_imported(tmp_path):
    """Threads opening volumes at once met a half-imported zarr (no ``zarr.Array`` yet)."""
    path = tmp_path / "v.npy"
    np.save(path, np.arange(6.0))
    out = _run(
        """
import importlib.machinery, sys, types
import numpy as np
import mixle
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.zarr.local_files import local_root
for name in ("zarr", "h5py"):  # what sys.modules holds while another thread imports them
    half = types.ModuleType(name)
    half.__spec__ = importlib.machinery.ModuleSpec(name, None)
    half.__spec__._initializing = True
    sys.modules[name] = half
src = as_array_source(np.zeros((2, 3)))
vols = mixle.read_volumes([sys.argv[1], np.ones((4, 4))])
print(src.shape, vols[0][:].tolist(), local_root(object()))
""",
        str(path),
    )
    assert out.strip() == "(2, 3) [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] None"
