"""Streaming a record source keeps memory bounded: a file 10x the budget, measured in a clean
subprocess (Linux carries peak RSS across fork+exec, so a shell in between starts fresh)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# growth of peak RSS allowed while streaming; pyarrow's reader holds ~9 MiB of page and
# decode buffers whatever the file size, so Parquet gets a larger budget (and file); SQLite
# grows ~5.5 MiB (its page cache and a chunk of rows), so it gets headroom and a file 10x that
BUDGET = {"csv": 6 * 2**20, "sqlite": 9 * 2**20, "parquet": 12 * 2**20}
ROWS = {"csv": 800_000, "sqlite": 1_100_000, "parquet": 1_600_000}

MEASURE = textwrap.dedent(
    """
    import json, resource, sys

    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    import mixle
    kind, path = sys.argv[1], sys.argv[2]
    if kind == "csv":
        src = mixle.read_csv(path)
    elif kind == "parquet":
        src = mixle.read_parquet(path)
    else:
        src = mixle.read_sql("t", path, chunk_size=4096)
    first = next(src.iter_batches(4096))  # warm up: imports and one block's buffers
    after_open = peak_rss()
    rows, total = 0, 0.0
    for block in src.iter_batches(4096):
        rows += len(block["a"])
        total += float(block["b"].sum())
    print(json.dumps({"after_open": after_open, "after_stream": peak_rss(), "rows": rows}))
    """
)


def _write(kind: str, folder: Path) -> Path:
    rng = np.random.default_rng(0)
    a = np.arange(ROWS[kind])
    b = rng.random(ROWS[kind])
    names = np.char.add("item-" + "x" * 60 + "-", (a % 977).astype(str))  # ~80 bytes a row
    if kind == "csv":
        path = folder / "big.csv"
        with open(path, "w") as fh:
            fh.write("a,b,name\n")
            step = 100_000
            for lo in range(0, ROWS[kind], step):
                part = zip(
                    a[lo : lo + step].tolist(),
                    b[lo : lo + step].tolist(),
                    names[lo : lo + step].tolist(),
                )
                fh.write("".join(f"{x},{y!r},{z}\n" for x, y, z in part))
        return path
    if kind == "parquet":
        path = folder / "big.parquet"
        pq.write_table(
            pa.table({"a": a, "b": b, "name": names}),
            path,
            row_group_size=10_000,  # streaming holds about one row group
            compression="none",
            use_dictionary=False,
        )
        return path
    path = folder / "big.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b REAL, name TEXT)")
        con.executemany(
            "INSERT INTO t VALUES (?, ?, ?)", zip(a.tolist(), b.tolist(), names.tolist())
        )
    con.close()
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["csv", "parquet", "sqlite"])
def test_streaming_a_file_ten_times_the_budget_stays_within_it(tmp_path, kind) -> None:
    path = _write(kind, tmp_path)
    size = path.stat().st_size
    out = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" "$2" "$3"; exit $?', sys.executable, MEASURE, kind, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={
            "MIXLE_CACHE_DIR": str(tmp_path / "cache"),
            "PATH": "/usr/bin:/bin",
            # Arrow's default mimalloc pool keeps ~12 MiB of freed pages cached whatever the
            # file size; the system allocator shows what the reader itself holds
            "ARROW_DEFAULT_MEMORY_POOL": "system",
        },
    )
    rss = json.loads(out.stdout)
    growth = rss["after_stream"] - rss["after_open"]
    print(f"\n{kind}: {size / 2**20:.1f} MiB file, peak RSS growth {growth / 2**20:.2f} MiB")
    assert rss["rows"] == ROWS[kind]
    assert size >= 10 * BUDGET[kind]
    assert growth < BUDGET[kind]
