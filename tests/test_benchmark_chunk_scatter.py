"""benchmarks/chunk_scatter.py runs and prints both of its rows, each with a ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from _benchmark_runs import ROOT

pytest.importorskip("zarr")


def test_chunk_scatter_benchmark_prints_its_rows():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chunk_scatter.py"), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    for label in ("scatter a kept chunk into a batch", "read_boxes, chunk-aligned, cache on"):
        (line,) = [row for row in run.stdout.splitlines() if row.startswith(label)]
        numbers = [float(v) for v in re.findall(r"\d+\.\d+", line[len(label) :])]
        assert len(numbers) == 6 and all(v > 0 for v in numbers), line
