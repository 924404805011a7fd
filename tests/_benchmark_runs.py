"""Run a benchmark script at its ``--quick`` size in a subprocess and parse its JSON rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, data_dir: Path, *extra: str) -> tuple[str, list[dict[str, Any]]]:
    """``benchmarks/<script> --quick --json --data-dir data_dir [extra]``: stdout, JSON rows.

    Fails the test (with the end of stderr) when the script exits non-zero.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = ["--quick", "--json", "--data-dir", str(data_dir), *extra]
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.stdout, rows
