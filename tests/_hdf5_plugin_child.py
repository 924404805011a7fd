"""A child process that imports ``hdf5plugin``, for the HDF5 plugin-filter tests.

The pytest process never imports ``hdf5plugin`` (it would register its filters there and
change what other tests write), so these tests write and read in a child, which prints one
JSON line. :data:`PRELUDE` starts every child script: peak-RSS helpers (``VmHWM``, reset
through ``/proc/self/clear_refs``) and :func:`measure_bombs`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

PRELUDE = r"""
import json, sys
import h5py, hdf5plugin
import numpy as np
import mixle

def hwm():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1])

def reset():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")

def measure_bombs(path, names, out):
    # out["bombs"]["<name> <how>"] = [error type or None, message, peak growth in KiB]
    for name in names:
        with mixle.read_hdf5(path, "bomb-" + name) as src:
            assert (src[-1:, -1:] == 1).all()  # a sound chunk of the same filters, warmed up
            for how in ("getitem", "boxes"):
                reset()
                base = hwm()
                try:
                    src[0:1, 0:1] if how == "getitem" else src.read_boxes([[0, 0]], [1, 1])
                    got = [None, "", hwm() - base]
                except Exception as exc:
                    got = [type(exc).__name__, str(exc), hwm() - base]
                out["bombs"][f"{name} {how}"] = got
"""


def run_plugin_child(body: str, path: Path, timeout: float = 600) -> dict[str, Any]:
    """Run :data:`PRELUDE` + ``body`` with ``path`` as ``sys.argv[1]``; its last JSON line.

    Skips where ``hdf5plugin`` is not installed or peak RSS cannot be reset (not Linux).
    """
    if importlib.util.find_spec("hdf5plugin") is None:  # not imported: it would register here
        pytest.skip("needs hdf5plugin")
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to measure peak RSS")
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + body, str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
