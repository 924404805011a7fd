"""``Loader.to_jax()`` reaches the JAX adapter through its registration, not an import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mixle import Loader
from mixle.loading import adapters

REPO = Path(__file__).resolve().parents[1]


def test_to_jax_imports_the_adapter_on_use_in_a_fresh_process() -> None:
    code = """
import sys
import numpy as np
import mixle
assert "mixle.jax" not in sys.modules, "import mixle loaded the JAX adapter"
loader = mixle.Loader(np.arange(8, dtype=np.int32), batch_size=4)
jl = loader.to_jax()
from mixle.jax import JaxLoader
assert isinstance(jl, JaxLoader)
print([int(v) for b in jl for v in np.asarray(b)])
"""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(list(range(8)))


def test_an_unknown_adapter_is_named() -> None:
    with pytest.raises(ValueError, match=r"adapter='torch' is not one of \['jax'\]"):
        adapters.adapt("torch", Loader(np.arange(4), batch_size=2))


def test_a_registered_builder_gets_the_loader_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(adapters.ADAPTER_PACKAGES, "probe", "no.such.package")
    seen: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setitem(
        adapters._builders, "probe", lambda loader, **options: seen.append((loader, options))
    )
    loader = Loader(np.arange(4), batch_size=2)
    adapters.adapt("probe", loader, device="cpu")
    assert seen == [(loader, {"device": "cpu"})]
