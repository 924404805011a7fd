"""The JAX backend over several CPU devices and two processes, each run in subprocesses.

JAX reads ``XLA_FLAGS`` once, at import, so every check that needs 4 host devices or
``jax.distributed`` runs in a fresh interpreter; the script prints one JSON line of results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mixle.utils.optional_deps import HAS_JAX

pytestmark = pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240

RECORDS = """
import json, threading
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from mixle import Loader
from mixle.jax import JaxLoader, THREAD_NAME

class Records:
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return self.get_batch(np.array([i]))
    def get_batch(self, indices):
        idx = np.asarray(indices, dtype=np.int64)
        return {"i": idx.copy(), "x": np.stack([idx, -idx], axis=1).astype(np.float32)}

def leaves_equal(got, want):
    got = jax.tree_util.tree_leaves(got)
    want = jax.tree_util.tree_leaves(want)
    return len(got) == len(want) and all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want)
    )

def stray_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(("mixle", THREAD_NAME))]

OPTIONS = dict(drop_last="pad", shuffle=True, seed=3, num_epochs=2)
"""

FOUR_DEVICES = """
config_before = dict(jax.config.values)
compiles = []
def on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        compiles.append(event)
jax.monitoring.register_event_duration_secs_listener(on_event)

out = {"devices": jax.device_count()}
mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))
jl = JaxLoader(Records(30), 8, sharding=sharding, **OPTIONS)
expected = list(Loader(Records(30), 8, **OPTIONS))
traces = []

def step(total, batch):
    traces.append(1)
    return total + jnp.where(batch["mask"], batch["x"][:, 0], 0.0).sum()

jitted = jax.jit(step)
# the carried value starts on the mesh, as the step returns it: one input layout throughout
total = jax.device_put(jnp.zeros((), jnp.float32), NamedSharding(mesh, P()))
layout_ok, values_ok, seen = True, True, 0
start = len(compiles)
last = None
for batch, want in zip(jl, expected, strict=True):
    seen += 1
    for leaf, ref in zip(jax.tree_util.tree_leaves(batch), jax.tree_util.tree_leaves(want)):
        shards = sorted(leaf.addressable_shards, key=lambda s: s.index[0].start)
        layout_ok &= leaf.sharding == sharding and len(shards) == 4
        layout_ok &= [(s.index[0].start, s.index[0].stop) for s in shards] == [
            (2 * k, 2 * k + 2) for k in range(4)
        ]
        layout_ok &= len({s.device for s in shards}) == 4
        values_ok &= all(np.array_equal(np.asarray(s.data), ref[s.index]) for s in shards)
    total = jitted(total, batch)
    last = batch
out.update(
    batches=seen,
    layout_ok=bool(layout_ok),
    values_ok=bool(values_ok),
    compiles=len(compiles) - start,
    traces=len(traces),
    total=float(total),
)
spec = jl.element_spec()
out["spec"] = {k: [list(s.shape), str(s.dtype), s.sharding == sharding] for k, s in spec.items()}
compiled = jax.jit(step).lower(jax.ShapeDtypeStruct((), jnp.float32), spec).compile()
out["spec_runs"] = float(compiled(total, last)) - float(total)
out["last_sum"] = float(expected[-1]["i"][expected[-1]["mask"]].sum())

errors = []
for kwargs in ({"batch_size": 6}, {"batch_size": 8, "drop_last": False}):
    try:
        JaxLoader(Records(30), sharding=sharding, **kwargs)
    except ValueError as exc:
        errors.append(str(exc))
out["errors"] = errors

mesh2 = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
two = JaxLoader(Records(8), 4, sharding=NamedSharding(mesh2, P("data")))
first = next(iter(two))
two.close()
out["mesh2_shards"] = sorted(
    (s.index[0].start, s.index[0].stop) for s in first["x"].addressable_shards
)
out["mesh2_values"] = leaves_equal(first, next(iter(Loader(Records(8), 4))))
del jl, last, batch, first
out["config_unchanged"] = dict(jax.config.values) == config_before
out["threads"] = stray_threads()
print(json.dumps(out))
"""

TWO_PROCESSES = """
import sys
from jax.experimental import multihost_utils
port, pid = sys.argv[1], int(sys.argv[2])
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
    initialization_timeout=120,
)
out = {"process": jax.process_index(), "count": jax.process_count(),
       "devices": jax.device_count(), "local": jax.local_device_count()}
mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))
jl = JaxLoader(Records(30), 4, sharding=sharding, **OPTIONS)
out["shard"] = [jl.loader.layout.shard_index, jl.loader.layout.num_shards]
out["spec"] = {k: list(s.shape) for k, s in jl.element_spec().items()}
shards = [
    Loader(Records(30), 4, shard_index=s, num_shards=2, shard_layout="blocked", **OPTIONS)
    for s in range(2)
]
single = Loader(Records(30), 8, **OPTIONS)
step = jax.jit(lambda b: jnp.where(b["mask"], b["x"][:, 0], 0.0).sum())
local_ok, global_ok, same_batch, sums, shapes = True, True, True, [], set()
for batch, parts, whole in zip(jl, zip(*shards), single, strict=True):
    want = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    want["i"] = want["i"].astype(np.int32)
    for key, leaf in batch.items():
        shapes.add(leaf.shape[0])
        local_ok &= all(
            np.array_equal(np.asarray(s.data), want[key][s.index]) for s in leaf.addressable_shards
        )
    gathered = multihost_utils.process_allgather(batch, tiled=True)
    global_ok &= leaves_equal(gathered, want)
    # row for row the batch one process reads with the global batch size
    same_batch &= leaves_equal(gathered, {**whole, "i": whole["i"].astype(np.int32)})
    sums.append(float(step(batch)))
out.update(local_ok=bool(local_ok), global_ok=bool(global_ok), same_batch=bool(same_batch),
           epoch_sum=sum(sums), batches=len(sums), rows=sorted(shapes))
try:
    JaxLoader(Records(30), 4, sharding=sharding)
    out["uneven_error"] = ""
except ValueError as exc:
    out["uneven_error"] = str(exc)
try:
    JaxLoader(Records(32), 4, sharding=sharding, shard_index=1 - pid, num_shards=2)
    out["layout_error"] = ""
except ValueError as exc:
    out["layout_error"] = str(exc)
del jl, batch
out["threads"] = stray_threads()
print(json.dumps(out), flush=True)
jax.distributed.shutdown()
"""


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Wait for ``proc`` (with a timeout; killed on expiry) and parse its JSON line."""
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"subprocess ran past {TIMEOUT_S} s:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _spawn(script: str, *args: str, devices: int) -> subprocess.Popen[str]:
    code = textwrap.dedent(RECORDS) + textwrap.dedent(script)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=_env(devices),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_four_devices_shard_the_batch_axis_and_compile_once() -> None:
    out = _result(_spawn(FOUR_DEVICES, devices=4))
    assert out["devices"] == 4
    assert out["batches"] == 2 * 4  # 30 records padded to 32, two epochs
    assert out["layout_ok"] and out["values_ok"]
    assert out["compiles"] == 1 and out["traces"] == 1  # padded last batches: one shape
    assert out["total"] == 2 * sum(range(30))
    assert out["spec"] == {
        "i": [[8], "int32", True],
        "x": [[8, 2], "float32", True],
        "mask": [[8], "bool", True],
    }
    assert out["spec_runs"] == out["last_sum"]  # compiled from the spec, run on a batch
    assert "cannot be split over the 4 devices" in out["errors"][0]
    assert "batches of 6 rows" in out["errors"][1] and "drop_last='pad'" in out["errors"][1]
    assert out["mesh2_shards"] == [(0, 2), (0, 2), (2, 4), (2, 4)] or out["mesh2_shards"] == [
        [0, 2],
        [0, 2],
        [2, 4],
        [2, 4],
    ]
    assert out["mesh2_values"]
    assert out["config_unchanged"] and out["threads"] == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_two_processes_each_load_their_half_of_the_global_batch() -> None:
    port = str(_free_port())
    procs = [_spawn(TWO_PROCESSES, port, str(pid), devices=2) for pid in range(2)]
    try:
        results = [_result(proc) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    for pid, out in enumerate(results):
        assert (out["process"], out["count"], out["devices"], out["local"]) == (pid, 2, 4, 2)
        assert out["shard"] == [pid, 2]
        assert out["spec"] == {"i": [8], "x": [8, 2], "mask": [8]}  # global: 2 x 4 rows
        assert out["rows"] == [8] and out["batches"] == 2 * 4
        assert out["local_ok"] and out["global_ok"] and out["same_batch"]
        assert out["epoch_sum"] == 2 * sum(range(30))
        assert "different numbers of batches" in out["uneven_error"]
        assert f"gives this process share {pid} of 2" in out["layout_error"]
        assert out["threads"] == []
