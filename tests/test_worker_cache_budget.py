"""MPEncodedData workers share one job's default chunk-cache budget; a budget set wins."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mixle
from mixle.reading import DEFAULT_CHUNK_CACHE_BYTES, MIN_WORKER_CHUNK_CACHE_BYTES

# generous: only catches a hang (spawned workers import mixle)
TIMEOUT_S = 120

BUDGETS = textwrap.dedent(
    """
    import json, sys
    from mixle.reading import chunk_cache, set_chunk_cache_bytes
    from mixle.utils.parallel.multiprocessing import MPEncodedData

    def budget(shard):
        return chunk_cache().budget

    if __name__ == "__main__":
        method, workers, explicit = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
        if explicit is not None:
            set_chunk_cache_bytes(explicit)
        data = list(range(2 * workers))
        with MPEncodedData(data, num_workers=workers, start_method=method, timeout=60) as enc:
            got = enc.map(budget)
        print(json.dumps({"workers": got, "driver": chunk_cache().budget}))
    """
)


def _budgets(tmp_path, method: str, workers: int, explicit: int | None) -> dict:
    script = tmp_path / "budgets.py"
    script.write_text(BUDGETS)
    # the script's folder comes first on its sys.path: point it at the mixle under test
    here = str(Path(mixle.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, str(script), method, str(workers), json.dumps(explicit)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.splitlines()[-1])


METHODS = [m for m in ("spawn", "fork") if m in multiprocessing.get_all_start_methods()]
# start methods whose workers inherit nothing of the driver's state
FRESH = [m for m in ("spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]


@pytest.mark.parametrize("method", METHODS)
def test_four_workers_each_get_a_quarter_of_the_default_budget(tmp_path, method):
    got = _budgets(tmp_path, method, 4, None)
    assert got["workers"] == [DEFAULT_CHUNK_CACHE_BYTES // 4] * 4
    assert got["driver"] == DEFAULT_CHUNK_CACHE_BYTES  # the driver keeps the whole default


def test_the_share_never_drops_below_the_worker_minimum(tmp_path):
    workers = DEFAULT_CHUNK_CACHE_BYTES // MIN_WORKER_CHUNK_CACHE_BYTES + 2  # 10
    got = _budgets(tmp_path, "fork" if "fork" in METHODS else "spawn", workers, None)
    assert got["workers"] == [MIN_WORKER_CHUNK_CACHE_BYTES] * workers


@pytest.mark.parametrize("method", FRESH)
def test_a_budget_set_in_the_driver_is_every_workers_budget(tmp_path, method):
    explicit = 3 * 2**20
    got = _budgets(tmp_path, method, 4, explicit)
    assert got["workers"] == [explicit] * 4
    assert got["driver"] == explicit


def test_a_disabled_cache_stays_disabled_in_workers(tmp_path):
    got = _budgets(tmp_path, "spawn", 2, 0)
    assert got["workers"] == [0, 0]


def test_share_default_chunk_cache_in_this_process_and_its_bad_counts():
    from mixle.reading.process_cache import (
        chunk_cache,
        set_chunk_cache_bytes,
        share_default_chunk_cache,
        user_chunk_cache_bytes,
    )

    old = user_chunk_cache_bytes()
    try:
        set_chunk_cache_bytes(None)
        share_default_chunk_cache(8)
        assert chunk_cache().budget == DEFAULT_CHUNK_CACHE_BYTES // 8
        set_chunk_cache_bytes(5 * 2**20)  # a budget set wins over the share...
        share_default_chunk_cache(2)
        assert chunk_cache().budget == 5 * 2**20 == user_chunk_cache_bytes()
        set_chunk_cache_bytes(None)  # ... until the rule is back
        assert chunk_cache().budget == DEFAULT_CHUNK_CACHE_BYTES // 2
        with pytest.raises(ValueError, match="workers=0 must be >= 1"):
            share_default_chunk_cache(0)
        with pytest.raises(TypeError, match="workers=True"):
            share_default_chunk_cache(True)
    finally:
        share_default_chunk_cache(1)
        set_chunk_cache_bytes(old)
    assert chunk_cache().budget == (DEFAULT_CHUNK_CACHE_BYTES if old is None else old)
