"""Record sources dropped without close() release their descriptors (RLIMIT_NOFILE = 64).

Each case runs in a fresh interpreter whose descriptor limit is lowered to 64, opens 300
sources (one file each), reads a row from each and drops it without ``close()``: no
``EMFILE``, and the count of open descriptors is back to its baseline, with the cycle
collector off and after ``gc``. A second
child does the same across ``fork``: sources opened and read in the parent, then read (and so
reopened) and dropped in the child, leave the child with the parent's baseline.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: Writes file ``i`` of a kind, whose one column ``a`` holds ``[i, i + 1]``.
_WRITERS = {
    "csv": """
def write(path, i):
    with open(path, "w") as fh:
        fh.write(f"a\\n{i}\\n{i + 1}\\n")
def open_source(path):
    return mixle.read_csv(path)
def expected(path, i):
    import pandas as pd
    return int(pd.read_csv(path)["a"][0])
""",
    "jsonl": """
def write(path, i):
    with open(path, "w") as fh:
        fh.write(json.dumps({"a": i}) + "\\n" + json.dumps({"a": i + 1}) + "\\n")
def open_source(path):
    return mixle.read_jsonl(path)
def expected(path, i):
    import pandas as pd
    return int(pd.read_json(path, lines=True)["a"][0])
""",
    "parquet": """
import pyarrow as pa
import pyarrow.parquet as pq
def write(path, i):
    pq.write_table(pa.table({"a": [i, i + 1]}), path)
def open_source(path):
    return mixle.read_parquet(path)
def expected(path, i):
    return pq.read_table(path)["a"][0].as_py()
""",
    "sqlite": """
import sqlite3
def write(path, i):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,), (i + 1,)])
    con.commit()
    con.close()
def open_source(path):
    return mixle.read_sql("t", path)
def expected(path, i):
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT a FROM t ORDER BY rowid LIMIT 1").fetchone()[0]
    finally:
        con.close()
""",
}

_PRELUDE = """
import gc, json, os, resource, sys
os.environ["MIXLE_CACHE_DIR"] = sys.argv[2]
import mixle
folder = sys.argv[1]
"""

_MANY = """
paths = [os.path.join(folder, f"f{i}") for i in range(300)]
for i, path in enumerate(paths):
    write(path, i)
assert expected(paths[7], 7) == 7  # the library's own read of one file
gc.collect()
base = len(os.listdir("/proc/self/fd"))
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
gc.disable()  # released when the last reference goes, not at the next cycle collection
for i, path in enumerate(paths):
    source = open_source(path)
    assert source[0]["a"] == i, (i, source[0])
    assert len(source) == 2
    del source  # never closed
after = len(os.listdir("/proc/self/fd"))
assert after == base, f"{after} descriptors open, {base} before"
gc.enable()
gc.collect()
after = len(os.listdir("/proc/self/fd"))
assert after == base, f"{after} descriptors open after gc, {base} before"
print("ok")
"""

_FORK = """
paths = [os.path.join(folder, f"f{i}") for i in range(20)]
for i, path in enumerate(paths):
    write(path, i)
gc.collect()
base = len(os.listdir("/proc/self/fd"))
sources = [open_source(path) for path in paths]
for i in range(20):
    assert sources[i][0]["a"] == i
pid = os.fork()
if pid == 0:
    code = 1
    try:
        for i in range(20):
            assert sources[i][1]["a"] == i + 1  # reopened in the child
        for i in range(20, 120):  # and new sources dropped in the child
            path = os.path.join(folder, f"g{i}")
            write(path, i)
            assert open_source(path)[0]["a"] == i
        del sources[:]
        gc.collect()
        after = len(os.listdir("/proc/self/fd"))
        code = 0 if after == base else 3
        if code:
            print(f"child: {after} descriptors open, {base} before", flush=True)
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
for i in range(20):  # the parent's handles still read its own rows
    assert sources[i][1]["a"] == i + 1
print("ok")
"""


def _run(kind: str, body: str, tmp_path: Path) -> None:
    code = _PRELUDE + textwrap.dedent(_WRITERS[kind]) + body
    data = tmp_path / "data"
    data.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", code, str(data), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.stdout + done.stderr)[
        -3000:
    ]


@pytest.mark.parametrize("kind", sorted(_WRITERS))
def test_dropped_sources_release_their_descriptors(kind: str, tmp_path: Path) -> None:
    _run(kind, _MANY, tmp_path)


@pytest.mark.parametrize("kind", sorted(_WRITERS))
def test_sources_dropped_in_a_forked_child_release_their_descriptors(
    kind: str, tmp_path: Path
) -> None:
    _run(kind, _FORK, tmp_path)
