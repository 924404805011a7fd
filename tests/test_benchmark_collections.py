"""benchmarks/collections.py runs at a tiny size and prints every row of its two tables
(without TorchIO installed too: its rows are then skipped with a line saying so)."""

from __future__ import annotations

import importlib.util

import pytest
from _benchmark_runs import run_quick

from mixle.data.sources.collection import DEFAULT_MAX_OPEN


@pytest.mark.slow
def test_collections_benchmark_quick_run_prints_its_tables(tmp_path):
    stdout, rows = run_quick("collections.py", tmp_path)
    main = [r for r in rows if r["table"] == "collection"]
    got = {
        (r["contender"], r["weights"], r["k"], r["workers"], r["cache"], r["max_open"])
        for r in main
    }
    want = set()
    for k in (1, 4):  # --quick: locality 4
        want |= {
            ("mixle", "uniform", k, 0, "default", DEFAULT_MAX_OPEN),
            ("mixle", "voxels", k, 0, "default", DEFAULT_MAX_OPEN),
            ("wrapper", "uniform", k, 0, "default", None),
            ("mixle", "uniform", k, 0, "off", DEFAULT_MAX_OPEN),
            ("wrapper", "uniform", k, 0, "off", None),
        }
    # bounded below the number of volumes (--quick: --small-max-open 3 of 6 volumes)
    want |= {("mixle", "uniform", 1, 0, cache, 3) for cache in ("default", "off")}
    torchio = importlib.util.find_spec("torchio") is not None
    if torchio:
        want |= {("torchio", "uniform", k, 0, "-", None) for k in (1, 4)}
        want.add(("torchio", "uniform", 4, 2, "-", None))
    else:
        assert "TorchIO rows skipped: torchio is not installed" in stdout
        assert 'pip install -e ".[bench]"' in stdout  # the extra that brings torchio
    assert got == want
    assert len(main) == len(want)
    for r in main:
        assert r["patches_per_s"] > 0 and r["first_batch_s"] > 0 and r["peak_rss_mib"] > 0
        # --quick: batch 8, 16^3 patches; TorchIO's images are (C, W, H, D) and its queue
        # of 6 volumes x 1 patch ends on a short batch
        channels = [1] if r["contender"] == "torchio" else []
        size = 6 if (r["contender"], r["k"]) == ("torchio", 1) else 8
        assert r["batch_shape"] == [size, *channels, 16, 16, 16], r
        if r["contender"] != "torchio":
            # batch 8, blocks of k records from one volume: at most 8 / k volumes per batch
            assert r["volumes_per_batch"] <= 8 / r["k"], r
    first = {
        (r["contender"], r["weights"], r["threads"], r["volumes"])
        for r in rows
        if r["table"] == "first"
    }
    assert first == {
        (*c, n)
        for c in (
            ("mixle", "uniform", None),
            ("mixle", "uniform", 0),
            ("mixle", "voxels", None),
            ("wrapper", "uniform", None),
        )
        for n in (10, 100)
    }
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert sum(line.split(" | ")[0] in {"| mixle", "| wrapper", "| torchio"} for line in table) == (
        len(want)
    )
    assert "Time to first batch" in stdout
    assert {line.split(" | ")[0] for line in table} >= {"| 10", "| 100"}
