"""benchmarks/workers.py runs at a tiny size and prints every row of its two tables: every
contender yields the same batches (their digests agree) and the ratios are filled in."""

from __future__ import annotations

import os

import pytest
from _benchmark_runs import run_quick

pytest.importorskip("torch")
pytest.importorskip("grain")


@pytest.mark.slow
def test_workers_benchmark_quick_run_prints_its_tables(tmp_path):
    stdout, rows = run_quick("workers.py", tmp_path)
    transform = [r for r in rows if r["table"] == "transform"]
    handoff = [r for r in rows if r["table"] == "handoff"]
    assert {(r["contender"], r["workers"], r["threads"]) for r in transform} == {
        ("mixle workers", 2, 1),
        ("mixle threads", 0, 2),
        ("mixle 1 thread", 0, 0),
        ("torch", 2, None),
        ("grain", 2, None),
    }
    want = {
        (name, touch)
        for name in ("mixle parent reads", "mixle workers", "torch", "grain")
        for touch in ("none", "sum")
    }
    assert {(r["contender"], r["touch"]) for r in handoff} == want
    assert len(transform) == 5 and len(handoff) == len(want)
    for r in rows:
        assert r["batches_per_s"] > 0 and r["startup_s"] > 0 and r["parent_cpu_s"] >= 0, r
        assert r["timed_batches"] == r["batches"] - 3, r  # --quick: 2 warm batches + the first
    # --quick: batches of 8 patches of 16^3; hand-off batches of 16 records of 256 x 512
    assert all(r["batch_shape"] == [8, 16, 16, 16] for r in transform)
    assert all(r["batch_shape"] == [16, 256, 512] for r in handoff)
    # every contender reads the same records and draws the same record rngs: equal sums
    digest = transform[0]["digest"]
    assert digest != 0
    assert all(r["digest"] == pytest.approx(digest, rel=1e-12) for r in transform)
    summed = [r for r in handoff if r["touch"] == "sum"]
    assert len({r["digest"] for r in summed}) == 1 and summed[0]["digest"] > 0
    assert all(r["digest"] is None for r in handoff if r["touch"] == "none")
    threads = next(r for r in transform if r["contender"] == "mixle threads")
    assert threads["x_threads"] == 1.0
    assert all(r["x_threads"] > 0 for r in transform)
    assert all(r["x_parent_cpu"] > 0 and r["x_parent_rate"] > 0 for r in handoff)
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    names = {"| mixle workers", "| mixle threads", "| mixle 1 thread", "| torch", "| grain"}
    assert sum(line.split(" | ")[0] in names for line in table) == 5
    assert sum(line.split(" | ")[0] in {"| none", "| sum"} for line in table) == len(want)
    assert f"{os.cpu_count()} CPUs" in stdout
    assert "goal: mixle workers >= 1.7x threads and >= torch and grain" in stdout
    assert "goal (none): mixle workers' parent CPU per MiB" in stdout
    assert "goal (sum): mixle workers' parent CPU per MiB" in stdout
