"""Epochs on the device (``tests/_jax_device_cases.py``), run in a fresh interpreter.

The cases need a live JAX backend with 4 CPU devices, which must stay out of the main
pytest process (see ``tests/_jax_child.py``). The child's report is shown on failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _jax_child import assert_child_passes

from mixle.utils.optional_deps import HAS_JAX


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_device_cases_pass_on_four_cpu_devices() -> None:
    assert_child_passes(Path(__file__).with_name("_jax_device_cases.py"), devices=4, timeout=400)
