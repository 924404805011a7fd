"""Patch placement speed: mixle's counter-based corners vs NumPy's stateful generator.

Run: python benchmarks/placement.py

Both draw the same number of 3-D corners uniformly on a grid; NumPy's Generator.integers is
the reference for "how fast can uniform integers be drawn". Prints corners/s and the ratio.
"""

from __future__ import annotations

import time

import numpy as np

from mixle.data.sampling.placement import patch_corners

COUNTS = (481, 449, 417)  # grid positions per axis of a 512^3 volume, 32^3 patches
STRIDE = (1, 1, 1)
REPEATS = 5


def best_of(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    print(f"{'corners':>10} {'mixle corners/s':>16} {'numpy corners/s':>16} {'mixle/numpy':>12}")
    for n in (64, 4096, 1_000_000):
        idx = np.arange(n, dtype=np.int64)
        rng = np.random.default_rng(0)
        t_mixle = best_of(lambda idx=idx: patch_corners(7, idx, COUNTS, STRIDE))
        t_numpy = best_of(lambda n=n, rng=rng: rng.integers(0, COUNTS, size=(n, 3)))
        print(f"{n:>10} {n / t_mixle:>16,.0f} {n / t_numpy:>16,.0f} {t_numpy / t_mixle:>12.2f}")


if __name__ == "__main__":
    main()
