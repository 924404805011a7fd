"""A jitted step fed by ``JaxLoader`` against the same step on batches staged on the device.

Run: python3 benchmarks/jax_feed.py

Patches of a ``PatchSampler`` over a ``.npy`` memmap volume (page cache warmed) feed a
jitted step whose cost is set by how many ``tanh(h @ w)`` layers it runs. For each step
cost the table shows steps per second when every batch of the epoch is already on the
device ("staged", the upper bound), from ``JaxLoader`` with its default ``prefetch=2``, and
from ``JaxLoader(prefetch=0, num_threads=0)`` (reading and placing each batch in the loop,
nothing overlapped). ``ratio`` is JaxLoader over staged: the target is >= 0.9 once the step
takes longer than reading a batch. Best of several interleaved repeats; everything runs on
JAX's default device (the CPU here, so the step and the reader threads share its cores).
"""

from __future__ import annotations

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
from mixle import Loader, PatchSampler
from mixle.jax import JaxLoader, to_jax

VOLUME = (64, 256, 256)  # float32, 16 MiB
PATCH = (16, 32, 32)  # 64 KiB per patch
BATCH = 32  # 2 MiB per batch
NUM_PATCHES = 1024  # 32 batches per epoch
WIDTH = 64
ROWS = 256  # one layer: ROWS x WIDTH x WIDTH multiply-adds, a few tens of microseconds
REPEATS = 5
STEP_OVER_READ = (0.5, 1.0, 2.0, 4.0)  # step cost as a multiple of one batch read


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


if __name__ == "__main__":
    main()
