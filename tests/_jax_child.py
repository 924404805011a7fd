"""Run JAX test cases in a child ``pytest``: a live backend must stay out of this process.

JAX warns (an error here) on every ``os.fork()`` once its backend has started, and reads
``XLA_FLAGS`` (the forced CPU device count) only once, at import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def assert_child_passes(
    path: str | Path,
    *,
    functions: str | None = None,
    devices: int | None = None,
    timeout: int = 300,
) -> None:
    """Run the tests of ``path`` in a fresh interpreter; fail with its report if any fails.

    ``functions`` is pytest's ``python_functions`` pattern (e.g. ``"case_*"``); ``devices``
    forces that many CPU devices. A run that skips anything fails too.
    """
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if functions:
        cmd += ["-o", f"python_functions={functions}"]
    env = {**os.environ, "MIXLE_TEST_JAX_CHILD": "1"}
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [*cmd, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert " passed" in done.stdout and "skipped" not in done.stdout, report
