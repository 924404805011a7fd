"""Epochs on the device (``tests/_jax_device_cases.py``), run in a fresh interpreter.

The cases need a live JAX backend with 4 CPU devices: JAX reads ``XLA_FLAGS`` once, at
import, and once started it warns (an error here) on every ``os.fork()`` of the main
pytest process. The child's report is shown on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mixle.utils.optional_deps import HAS_JAX

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).with_name("_jax_device_cases.py")
TIMEOUT_S = 400


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_device_cases_pass_on_four_cpu_devices() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
        "MIXLE_TEST_JAX_CHILD": "1",
    }
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert " passed" in done.stdout and "skipped" not in done.stdout, report
