"""benchmarks/compose.py runs at a tiny size and prints every row of its three tables: each
composed source reads the records its children give by hand, and mixle's HF and ArrayRecord
batches hold the values of the libraries' own reads (the ``same`` column)."""

from __future__ import annotations

import os

import pytest
from _benchmark_runs import run_quick

pytest.importorskip("zarr")
pytest.importorskip("datasets")
pytest.importorskip("array_record")


@pytest.mark.slow
def test_compose_benchmark_quick_run_prints_its_tables(tmp_path):
    stdout, rows = run_quick("compose.py", tmp_path)
    direct = [r for r in rows if r["table"] in ("overhead", "loader")]
    assert [(r["table"], r["children"], r["contender"]) for r in direct] == [
        ("overhead", kind, name) for kind in ("zarr", "npy") for name in ("concat", "mix", "select")
    ] + [("loader", kind, "Loader(concat)") for kind in ("zarr", "npy")]
    rivals = [(r["table"], r["contender"]) for r in rows if r["table"] in ("hf", "arrayrecord")]
    assert rivals == [
        ("hf", "__getitems__"),
        ("hf", "numpy format"),
        ("arrayrecord", "bytes"),
        ("arrayrecord", "decoded"),
    ]
    assert len(rows) == len(direct) + len(rivals)
    for r in rows:
        assert r["same"] is True, r  # equal batches, checked before timing
        ratio = "x_direct" if r in direct else "x_mixle"
        assert r[f"{ratio}_low"] <= r[ratio] <= r[f"{ratio}_high"], r
        assert r[ratio] > 0 and r[f"{ratio}_cpu"] > 0, r
        assert r["rounds"] == 2, r  # --quick
    assert all(r["direct_ms"] > 0 and r["composed_ms"] > 0 for r in direct)
    for r in direct:  # the index math of each combinator against one child's read
        if r["table"] == "overhead":
            assert r["index_math_us"] > 0 and r["child_read_us"] > 0, r
            assert f"  {r['children']} {r['contender']}: origins(indices)" in stdout, r
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    firsts = [line.split(" | ")[:2] for line in table]
    for r in direct:
        assert [f"| {r['children']}", r["contender"]] in firsts, r
    for name in ("__getitems__", "numpy format", "bytes", "decoded"):
        assert any(line.startswith(f"| {name} | ") for line in table), name
    assert f"{os.cpu_count()} CPUs" in stdout
    assert "goal: composed / direct time <= 1.05 on every row" in stdout
    assert "goal (hf): rival time / mixle time >= 1 on every row" in stdout
    assert "goal (arrayrecord): rival time / mixle time >= 1 on every row" in stdout
