"""``benchmarks/jax_feed.py --only scan`` runs at its quick size and trains identically."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmark_runs import run_quick

from mixle.utils.optional_deps import HAS_JAX


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_scan_table_runs_and_every_run_trains_the_same(tmp_path: Path) -> None:
    _, rows = run_quick("jax_feed.py", tmp_path, "--only", "scan")
    assert {row["row"] for row in rows} == {"scan_epoch", "device loop", "JaxLoader"}
    for row in rows:
        assert row["table"] == "scan" and row["steps"] == 32
        assert row["params_equal"] is True
        assert row["steps_per_s"] > 0
