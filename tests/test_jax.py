"""The JAX backend's in-process cases, run in a fresh interpreter.

JAX starts thread pools with its first array and then warns (an error here) on every
``os.fork()`` in the process, and forking a process with those threads risks a deadlock.
The fork-based tests elsewhere in the suite share this process, so the cases that need a
live JAX backend (``tests/_jax_cases.py``) run in a child ``pytest`` with the same
configuration; its report is shown on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mixle.utils.optional_deps import HAS_JAX

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).with_name("_jax_cases.py")
TIMEOUT_S = 300


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_jax_cases_pass_in_a_fresh_interpreter() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)]
    env = {**os.environ, "MIXLE_TEST_JAX_CHILD": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert " passed" in done.stdout and "skipped" not in done.stdout, report
