"""What a progress bar costs: building a CSV row index with a bar forced on vs off.

Builds the row index of the same CSV file alternately with ``progress=True`` (a tqdm bar
written to a discarded stream) and ``progress=False``, each time into a fresh index cache
so that every run really builds it, and prints the median time of each and their ratio.
The bar advances once per block the index builder scans, never per row.

Usage: ``python3 benchmarks/progress.py [--rows 1500000] [--runs 21]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import mixle


def write_csv(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        fh.write("id,x,y,label\n")
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            ids = np.arange(start, start + n)
            xy = rng.standard_normal((n, 2))
            labels = rng.integers(0, 10, n)
            fh.writelines(f"{i},{x:.6f},{y:.6f},{k}\n" for i, (x, y), k in zip(ids, xy, labels))


def build_seconds(path: Path, cache: Path, progress: bool) -> float:
    os.environ["MIXLE_CACHE_DIR"] = str(cache)
    src = mixle.read_csv(path, progress=progress)
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        n = len(src)  # builds the row index
    elapsed = time.perf_counter() - t0
    src.close()
    assert n > 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mixle-bench-progress-") as tmp:
        folder = Path(tmp)
        path = folder / "table.csv"
        write_csv(path, args.rows)
        size_mib = path.stat().st_size / 2**20
        times: dict[bool, list[float]] = {True: [], False: []}
        for run in range(args.runs):
            for progress in (run % 2 == 0, run % 2 == 1):  # alternate which goes first
                times[progress].append(
                    build_seconds(path, folder / f"cache-{run}-{progress}", progress)
                )
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"row index of a {size_mib:.0f} MiB CSV ({args.rows:,} rows), {args.runs} runs each")
        print(f"  progress=False  median {off * 1000:8.1f} ms")
        print(f"  progress=True   median {on * 1000:8.1f} ms")
        print(f"  time with a bar / without: {on / off:.3f}")


if __name__ == "__main__":
    main()
