"""A jitted step fed by ``JaxLoader`` against the same step on batches staged on the device.

Run: python3 benchmarks/jax_feed.py  (``--only scan`` for the last table alone)

Patches of a ``PatchSampler`` over a ``.npy`` memmap volume (page cache warmed) feed a
jitted step whose cost is set by how many ``tanh(h @ w)`` layers it runs. For each step
cost the table shows steps per second when every batch of the epoch is already on the
device ("staged", the upper bound), from ``JaxLoader`` with its default ``prefetch=2``, and
from ``JaxLoader(prefetch=0, num_threads=0)`` (reading and placing each batch in the loop,
nothing overlapped). ``ratio`` is JaxLoader over staged: the target is >= 0.9 once the step
takes longer than reading a batch. Best of several interleaved repeats; everything runs on
JAX's default device (the CPU here, so the step and the reader threads share its cores).

The last table is an epoch on the device: a small MLP's SGD step over 256 MiB of float32
records (``--quick``: 8 MiB), steps per second from ``scan_epoch`` (the whole epoch in one
jitted ``lax.scan`` over a ``DeviceSource``), from a Python loop calling one jitted
gather-and-step per batch on the same ``DeviceSource`` (the data pre-staged on the device),
and from ``JaxLoader`` over the same records in host memory, side by side. The goal is
``scan_epoch`` >= 2x ``JaxLoader`` for small steps. ``params equal`` checks the three runs
trained the same parameters (same batches, same order).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mixle
from mixle import Loader, MemorySource, PatchSampler
from mixle.jax import DeviceSource, JaxLoader, scan_epoch, to_jax

VOLUME = (64, 256, 256)  # float32, 16 MiB
PATCH = (16, 32, 32)  # 64 KiB per patch
BATCH = 32  # 2 MiB per batch
NUM_PATCHES = 1024  # 32 batches per epoch
WIDTH = 64
ROWS = 256  # one layer: ROWS x WIDTH x WIDTH multiply-adds, a few tens of microseconds
REPEATS = 5
STEP_OVER_READ = (0.5, 1.0, 2.0, 4.0)  # step cost as a multiple of one batch read
SCAN_FEATURES = 256  # 1 KiB float32 records
SCAN_BYTES = 256 << 20
SCAN_QUICK_BYTES = 8 << 20
SCAN_BATCH = 256
SCAN_HIDDEN = 64


def make_step(layers: int) -> Callable[[Any, Any], Any]:
    """A jitted step running ``layers`` dense ``tanh`` layers over the batch."""

    def step(carry: Any, batch: Any) -> Any:
        patches, coords = batch
        x = patches.reshape(-1, WIDTH)
        h = x[:ROWS] + x.mean()  # touch the whole batch; the layers run on ROWS rows
        w = jnp.eye(WIDTH, dtype=h.dtype) * 0.5 + carry

        def layer(_: int, x: Any) -> Any:
            return jnp.tanh(x @ w)

        h = jax.lax.fori_loop(0, layers, layer, h)
        return carry + 1e-6 * (h.mean() + coords.sum().astype(h.dtype) * 0)

    return jax.jit(step)


def per_call(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "volume.npy"
        np.save(path, np.random.default_rng(0).standard_normal(VOLUME, dtype=np.float32))
        sampler = PatchSampler(mixle.read_npy(str(path)), PATCH, NUM_PATCHES, seed=1)
        options = {"shuffle": True, "seed": 2, "drop_last": True}
        host_batches = list(Loader(sampler, BATCH, num_threads=0, **options))  # warm cache
        staged = [to_jax(b) for b in host_batches]
        jax.block_until_ready(staged)
        n = len(staged)

        def read_epoch() -> None:
            for _ in Loader(sampler, BATCH, num_threads=0, **options):
                pass

        read_s = per_call(read_epoch) / n
        carry0 = jnp.zeros((), jnp.float32)
        cost = {}
        for layers in (4, 68):  # step time = fixed + layers * per layer
            probe = make_step(layers)
            jax.block_until_ready(probe(carry0, staged[0]))
            cost[layers] = per_call(lambda p=probe: jax.block_until_ready(p(carry0, staged[0])))
        layer_s = (cost[68] - cost[4]) / 64
        fixed_s = max(0.0, cost[4] - 4 * layer_s)

        print(
            f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores; "
            f"{n} batches of {BATCH} x {PATCH} float32 ({BATCH * np.prod(PATCH) * 4 >> 20} "
            f"MiB) per epoch; one batch read (Loader, no threads): {read_s * 1e3:.2f} ms"
        )
        header = (
            f"{'step/read':>9} {'step ms':>8} {'staged/s':>9} {'JaxLoader/s':>12} "
            f"{'ratio':>6} {'threads=0/s':>12} {'ratio':>6} {'no-overlap/s':>13}"
        )
        print(header)
        print("-" * len(header))
        for multiple in STEP_OVER_READ:
            layers = max(1, round((multiple * read_s - fixed_s) / layer_s))
            step = make_step(layers)
            jax.block_until_ready(step(carry0, staged[0]))  # compile once

            def run_staged(step: Callable[[Any, Any], Any] = step) -> None:
                carry = carry0
                for batch in staged:
                    carry = step(carry, batch)
                jax.block_until_ready(carry)

            def run_loader(
                prefetch: int, threads: int | None, step: Callable[[Any, Any], Any] = step
            ) -> None:
                carry = carry0
                loader = JaxLoader(
                    sampler, BATCH, prefetch=prefetch, num_threads=threads, **options
                )
                for batch in loader:
                    carry = step(carry, batch)
                jax.block_until_ready(carry)

            runs = {
                "staged": run_staged,
                "loader": lambda: run_loader(2, None),
                "one_thread": lambda: run_loader(2, 0),
                "serial": lambda: run_loader(0, 0),
            }
            times = dict.fromkeys(runs, float("inf"))
            for _ in range(REPEATS):  # interleaved, best of each
                for key, fn in runs.items():
                    times[key] = min(times[key], per_call(fn, 1))
            step_ms = times["staged"] / n * 1e3
            rate = {key: n / value for key, value in times.items()}
            print(
                f"{step_ms / (read_s * 1e3):>9.2f} {step_ms:>8.2f} {rate['staged']:>9.1f} "
                f"{rate['loader']:>12.1f} {rate['loader'] / rate['staged']:>6.2f} "
                f"{rate['one_thread']:>12.1f} {rate['one_thread'] / rate['staged']:>6.2f} "
                f"{rate['serial']:>13.1f}"
            )
        idle_table(sampler, staged, options)


def idle_table(sampler: PatchSampler, staged: list[Any], options: dict[str, Any]) -> None:
    """The same comparison with a step that leaves the host idle, as an accelerator does.

    Each step is a tiny jitted op on the batch, then the host waits ``step`` seconds (as a
    loop does while a GPU step runs): the loader's threads have the CPU to themselves.
    """
    n = len(staged)
    touch = jax.jit(lambda carry, batch: carry + batch[0][0, 0, 0, 0])
    carry0 = jnp.zeros((), jnp.float32)
    jax.block_until_ready(touch(carry0, staged[0]))
    print("\nstep that leaves the host idle (time.sleep after a tiny jitted op):")
    header = f"{'step ms':>8} {'staged/s':>9} {'JaxLoader/s':>12} {'ratio':>6} {'no-overlap/s':>13}"
    print(header)
    print("-" * len(header))
    for step_ms in (0.5, 1.0, 2.0, 4.0):

        def run(batches: Any, step_ms: float = step_ms) -> None:
            carry = carry0
            for batch in batches:
                carry = jax.block_until_ready(touch(carry, batch))
                time.sleep(step_ms / 1e3)

        runs = {
            "staged": lambda: run(staged),
            "loader": lambda: run(JaxLoader(sampler, BATCH, **options)),
            "serial": lambda: run(JaxLoader(sampler, BATCH, prefetch=0, num_threads=0, **options)),
        }
        times = dict.fromkeys(runs, float("inf"))
        for _ in range(REPEATS):
            for key, fn in runs.items():
                times[key] = min(times[key], per_call(fn, 1))
        rate = {key: n / value for key, value in times.items()}
        print(
            f"{step_ms:>8.2f} {rate['staged']:>9.1f} {rate['loader']:>12.1f} "
            f"{rate['loader'] / rate['staged']:>6.2f} {rate['serial']:>13.1f}"
        )


def mlp_step(params: Any, batch: Any) -> Any:
    """One SGD step of a one-hidden-layer MLP regressing ``y`` on ``x``."""

    def loss(p: Any) -> Any:
        h = jnp.tanh(batch["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


def scan_table(quick: bool, as_json: bool) -> None:
    """``scan_epoch`` against a per-batch jitted loop on the device and ``JaxLoader``."""
    n = (SCAN_QUICK_BYTES if quick else SCAN_BYTES) // (SCAN_FEATURES * 4)
    rng = np.random.default_rng(0)
    data = {
        "x": rng.standard_normal((n, SCAN_FEATURES), dtype=np.float32),
        "y": rng.standard_normal((n, 1), dtype=np.float32),
    }
    src = DeviceSource(data, progress=False)
    params0 = {
        "w1": jnp.asarray(rng.standard_normal((SCAN_FEATURES, SCAN_HIDDEN), np.float32) * 0.05),
        "w2": jnp.asarray(rng.standard_normal((SCAN_HIDDEN, 1), np.float32) * 0.05),
    }
    seed, steps = 3, n // SCAN_BATCH

    @jax.jit
    def step_at(params: Any, src: DeviceSource, t: Any, epoch: Any) -> Any:
        batch = src.get_batch_at(t * SCAN_BATCH, SCAN_BATCH, seed=seed, epoch=epoch)
        return mlp_step(params, batch)

    host_step = jax.jit(mlp_step)
    host = MemorySource(data)

    def run_scan(epoch: int) -> Any:
        out = scan_epoch(mlp_step, params0, src, SCAN_BATCH, seed=seed, epoch=epoch, drop_last=True)
        return jax.block_until_ready(out)

    def run_loop(epoch: int) -> Any:
        params = params0
        for t in range(steps):
            params = step_at(params, src, t, epoch)
        return jax.block_until_ready(params)

    def run_loader(epoch: int) -> Any:
        params = params0
        loader = JaxLoader(
            host, SCAN_BATCH, shuffle=True, seed=seed, drop_last=True, num_epochs=None
        )
        loader.load_state_dict({**loader.state_dict(), "epoch": epoch})
        for t, batch in enumerate(loader):
            params = host_step(params, batch)
            if t + 1 == steps:
                break
        return jax.block_until_ready(params)

    runs = {"scan_epoch": run_scan, "device loop": run_loop, "JaxLoader": run_loader}
    results = {name: fn(0) for name, fn in runs.items()}  # compile, and check they agree
    equal = all(
        bool(np.allclose(a, b, rtol=1e-4, atol=1e-6))
        for other in ("device loop", "JaxLoader")
        for a, b in zip(
            jax.tree_util.tree_leaves(results["scan_epoch"]),
            jax.tree_util.tree_leaves(results[other]),
        )
    )
    times = dict.fromkeys(runs, float("inf"))
    for repeat in range(1 if quick else REPEATS):  # interleaved, best of each
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn(1 + repeat)
            times[name] = min(times[name], time.perf_counter() - t0)
    rate = {name: steps / value for name, value in times.items()}
    if as_json:
        for name in runs:
            row = {"table": "scan", "row": name, "steps_per_s": rate[name], "steps": steps}
            print(json.dumps({**row, "params_equal": equal}))
        return
    print(
        f"\nan epoch on the device: {n} records of {SCAN_FEATURES} float32 "
        f"({n * SCAN_FEATURES * 4 >> 20} MiB), {steps} SGD steps of a "
        f"{SCAN_FEATURES}-{SCAN_HIDDEN}-1 MLP on batches of {SCAN_BATCH}; params equal: {equal}"
    )
    header = f"{'run':<12} {'steps/s':>9} {'x JaxLoader':>12}"
    print(header)
    print("-" * len(header))
    for name in runs:
        print(f"{name:<12} {rate[name]:>9.1f} {rate[name] / rate['JaxLoader']:>12.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("all", "feed", "scan"), default="all")
    parser.add_argument("--quick", action="store_true", help="small data (for the test suite)")
    parser.add_argument("--json", action="store_true", help="scan table rows as JSON lines")
    parser.add_argument("--data-dir", help="unused: the data is generated in memory")
    args = parser.parse_args()
    if args.only in ("all", "feed"):
        main()
    if args.only in ("all", "scan"):
        scan_table(args.quick, args.json)
