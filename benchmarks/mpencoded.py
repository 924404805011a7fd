"""MPEncodedData: build + one pass over zstd-zarr patches, driver-reads vs workers-read.

Run: python3 benchmarks/mpencoded.py [--patches 4000] [--patch 32] [--size 192]

Writes a zstd-compressed zarr volume (chunks 32^3) to a temporary folder, then for 1 and 2
workers times building an MPEncodedData over a PatchSampler (each worker's shard read,
stacked and kept) plus one ``map_reduce`` pass summing patch means. "driver" reads every
patch in this process and sends the arrays to the workers (what the library our users
come from does); "workers" sends each worker the pickled sampler and its index range.
Prints the best of three runs: seconds, speed-up over driver-reads with 1 worker, and
the bytes the driver read and sent.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

import mixle
from mixle.utils.parallel.multiprocessing import MPEncodedData

CHUNK = 32
#: Each configuration runs this many times; the table shows the fastest run.
REPEATS = 3


def patch_mean_sum(batch: Any) -> float:
    """Sum of the patch means of one shard (a stacked ``(patches, coords)`` batch)."""
    patches, _ = batch
    return math.fsum(patches.mean(axis=tuple(range(1, patches.ndim)), dtype=np.float64))


def write_volume(folder: str, size: int) -> str:
    import zarr
    from zarr.codecs import ZstdCodec

    path = os.path.join(folder, "volume.zarr")
    arr = zarr.create_array(
        path,
        shape=(size,) * 3,
        chunks=(CHUNK,) * 3,
        dtype="float32",
        compressors=ZstdCodec(level=3),
    )
    rng = np.random.default_rng(0)
    for z in range(0, size, CHUNK):  # slab by slab: never the whole volume in memory
        arr[z : z + CHUNK] = rng.standard_normal((min(CHUNK, size - z), size, size), "float32")
    return path


def run(sampler: mixle.PatchSampler, workers: int, read_in: str) -> dict[str, float]:
    t0 = time.perf_counter()
    enc = MPEncodedData(sampler, num_workers=workers, read_in=read_in, timeout=600)
    t1 = time.perf_counter()
    total = enc.map_reduce(patch_mean_sum)
    t2 = time.perf_counter()
    stats = enc.stats
    enc.close()
    return {
        "build": t1 - t0,
        "pass": t2 - t1,
        "total": t2 - t0,
        "driver_mib": stats["driver_bytes_read"] / 2**20,  # type: ignore[operator]
        "sent_mib": stats["bytes_sent"] / 2**20,  # type: ignore[operator]
        "result": total,
    }


def _total(result: dict[str, float]) -> float:
    return result["total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=4000)
    parser.add_argument("--patch", type=int, default=32)
    parser.add_argument("--size", type=int, default=192)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="mixle-mpencoded-")
    try:
        sampler = mixle.PatchSampler(
            mixle.read_zarr(write_volume(folder, args.size)), args.patch, args.patches, seed=1
        )
        sampler.get_batch(np.arange(min(8, args.patches)))  # warm up: imports, first open
        print(
            f"{args.patches} patches of {args.patch}^3 float32 from a {args.size}^3 zstd zarr "
            f"volume (chunks {CHUNK}^3); {os.cpu_count()} CPUs"
        )
        header = (
            f"{'read in':>8} {'workers':>7} {'build s':>8} {'pass s':>7} {'total s':>8} "
            f"{'speed-up':>8} {'driver MiB read':>15} {'MiB sent':>9}"
        )
        print(header)
        print("-" * len(header))
        base = None
        results = set()
        for read_in in ("driver", "workers"):
            for workers in (1, 2):
                r = min((run(sampler, workers, read_in) for _ in range(REPEATS)), key=_total)
                results.add(round(r["result"], 6))
                base = base or r["total"]
                print(
                    f"{read_in:>8} {workers:>7} {r['build']:>8.2f} {r['pass']:>7.3f} "
                    f"{r['total']:>8.2f} {base / r['total']:>7.2f}x {r['driver_mib']:>15.1f} "
                    f"{r['sent_mib']:>9.3f}"
                )
        assert len(results) == 1, f"runs disagree: {results}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
