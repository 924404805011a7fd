"""Loader overhead and permutation speed, measured side by side in one run.

Run: python benchmarks/loader.py

1. Throughput of ``Loader`` over a ``PatchSampler`` on a ``.npy`` memmap volume against
   calling ``sampler.get_batch`` directly in a loop on the same shuffled indices. The
   ``num_threads=0`` row does exactly the same reads in the caller's thread, so its ratio is
   the Loader's own cost (target: >= 0.95, i.e. overhead <= 5 %). Rows with threads show
   what prefetch buys on this machine.
2. Permutation speed: ``mixle.data.index_math.permutation.permute`` over all of ``[0, n)`` against
   ``np.random.permutation(n)``, and one batch of positions (which NumPy cannot do without
   the whole permutation).
Best of several interleaved repeats; the page cache is warmed first.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import mixle
from mixle import Loader, PatchSampler
from mixle.data.index_math.permutation import permute

VOLUME = (96, 256, 256)  # float32, 24 MiB
PATCH = (32, 32, 32)  # 128 KiB per patch
NUM_PATCHES = 4096
BATCH = 32
REPEATS = 9


def best(fns: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, float]:
    """Best wall time of each function, running them interleaved."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in times.items()}


def loader_table(root: Path) -> None:
    volume = np.random.default_rng(0).standard_normal(VOLUME, dtype=np.float32)
    np.save(root / "volume.npy", volume)
    sampler = PatchSampler(mixle.read_npy(str(root / "volume.npy")), PATCH, NUM_PATCHES, seed=1)
    probe = Loader(sampler, BATCH, shuffle=True, seed=3, num_threads=0)
    order = probe.record_indices(0)
    batches = [order[i : i + BATCH] for i in range(0, order.size, BATCH)]

    def direct() -> None:
        batch = None
        for idx in batches:  # like a training loop: the last batch is alive during a read
            batch = sampler.get_batch(idx)
        del batch

    def through_loader(threads: int) -> Callable[[], None]:
        def go() -> None:
            for _ in Loader(sampler, BATCH, shuffle=True, seed=3, num_threads=threads):
                pass

        return go

    direct()  # warm the page cache
    runs = {"sampler.get_batch loop": direct}
    for threads in (0, 1, 2):
        runs[f"Loader num_threads={threads}"] = through_loader(threads)
    t = best(runs)
    mib = len(batches) * BATCH * np.prod(PATCH) * 4 / 2**20
    print(
        f"Loader vs direct batched reads: {len(batches)} batches of {BATCH} patches "
        f"{PATCH} float32 from a {VOLUME} .npy memmap"
    )
    print(f"{'reader':<26} {'batches/s':>10} {'MiB/s':>9} {'vs direct':>10}")
    for name, secs in t.items():
        ratio = t["sampler.get_batch loop"] / secs
        print(f"{name:<26} {len(batches) / secs:>10.1f} {mib / secs:>9.0f} {ratio:>10.3f}")
    overhead = t["Loader num_threads=0"] / t["sampler.get_batch loop"] - 1
    print(f"Loader overhead with the same reads in the caller's thread: {overhead:+.1%}")

    class Instant:  # a source whose batched read costs nothing: what is left is the Loader
        def __len__(self) -> int:
            return NUM_PATCHES

        def __getitem__(self, i: int) -> np.ndarray:
            return np.zeros(1)

        def get_batch(self, indices: np.ndarray) -> np.ndarray:
            return indices

    def bare() -> None:
        for _ in Loader(Instant(), BATCH, shuffle=True, seed=3, num_threads=0):
            pass

    per_batch = best({"bare": bare})["bare"] / len(batches)
    read = t["sampler.get_batch loop"] / len(batches)
    print(
        f"Loader bookkeeping per batch (indices, shuffle, cursor): {per_batch * 1e6:.1f} us "
        f"= {per_batch / read:.1%} of one {read * 1e6:.0f} us batched read"
    )


def permutation_table() -> None:
    print()
    print("Permutation of [0, n): mixle Feistel (O(1) memory) vs np.random.permutation")
    print(f"{'n':>10} {'mixle idx/s':>14} {'numpy idx/s':>14} {'mixle/numpy':>12}")
    rng = np.random.default_rng(0)
    for n in (10_000, 1_000_000, 10_000_000):
        positions = np.arange(n, dtype=np.int64)
        t = best(
            {
                "mixle": lambda n=n, p=positions: permute(p, n, seed=1, epoch=2),
                "numpy": lambda n=n: rng.permutation(n),
            },
            repeats=3,
        )
        print(f"{n:>10,} {n / t['mixle']:>14,.0f} {n / t['numpy']:>14,.0f} "
              f"{t['numpy'] / t['mixle']:>12.2f}")  # fmt: skip
    n, rows = 10_000_000, 256
    window = np.arange(5_000_000, 5_000_000 + rows, dtype=np.int64)
    t = best(
        {"mixle": lambda: permute(window, n, seed=1, epoch=2), "numpy": lambda: rng.permutation(n)}
    )
    print(f"one batch of {rows} positions of n={n:,}: mixle {t['mixle'] * 1e6:.0f} us, "
          f"numpy needs the whole permutation: {t['numpy'] * 1e6:,.0f} us")  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        loader_table(Path(tmp))
    permutation_table()


if __name__ == "__main__":
    main()
