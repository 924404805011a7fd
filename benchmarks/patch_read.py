"""Patch reads today: mixle per-index and batched vs naive per-patch slicing of the store.

Run: python benchmarks/patch_read.py [--size 256] [--patches 512]

Writes a float32 cube (zstd zarr with 64^3 chunks, gzip HDF5 with 64^3 chunks, raw memmap)
to a temporary folder, then reads the same random 32^3 patches three ways, side by side,
warm page cache. Prints patches/s and the ratio mixle/naive for each backend. Naive HDF5
slicing uses a fresh h5py handle with HDF5's default 1 MiB chunk cache, as users have today;
mixle opens datasets with a 64 MiB cache.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import zarr

import mixle

PATCH = 32
CHUNK = 64
BATCH = 64


def write_volumes(folder: Path, size: int) -> dict[str, tuple[Callable, Callable]]:
    """Write the cube three ways; return per backend (open naive handle, open mixle source)."""
    shape = (size, size, size)
    z, y, x = np.ogrid[0:CHUNK, 0:size, 0:size]
    arr = zarr.create_array(str(folder / "v.zarr"), shape=shape, chunks=(CHUNK,) * 3, dtype="f4")
    with h5py.File(folder / "v.h5", "w") as f, open(folder / "v.raw", "wb") as raw:
        ds = f.create_dataset("v", shape=shape, dtype="f4", chunks=(CHUNK,) * 3, compression="gzip")
        for z0 in range(0, size, CHUNK):
            slab = (np.sin(0.05 * (z + z0)) * np.cos(0.03 * y) + 0.01 * x).astype("f4")
            arr[z0 : z0 + CHUNK] = slab
            ds[z0 : z0 + CHUNK] = slab
            raw.write(slab.tobytes())
    return {
        "zarr zstd": (
            lambda: zarr.open_array(str(folder / "v.zarr"), mode="r"),
            lambda: mixle.read_zarr(folder / "v.zarr"),
        ),
        "hdf5 gzip": (
            lambda: h5py.File(folder / "v.h5", "r")["v"],  # HDF5's default 1 MiB cache
            lambda: mixle.read_hdf5(folder / "v.h5", "v"),
        ),
        "memmap": (
            lambda: np.memmap(folder / "v.raw", dtype="f4", mode="r", shape=shape),
            lambda: mixle.read_memmap(folder / "v.raw", "float32", shape),
        ),
    }


def rate(fn: Callable[[], object], n: int, repeats: int = 3) -> float:
    best = min(_timed(fn) for _ in range(repeats))
    return n / best


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--patches", type=int, default=512)
    args = parser.parse_args()
    n = args.patches - args.patches % BATCH
    with tempfile.TemporaryDirectory() as tmp:
        sources = write_volumes(Path(tmp), args.size)
        shape = (args.size,) * 3
        print(f"{args.size}^3 float32, {n} random {PATCH}^3 patches, batch {BATCH}")
        print(
            f"{'backend':>10} {'naive/s':>9} {'per-index/s':>12} {'batched/s':>10} "
            f"{'index/naive':>12} {'batch/naive':>12}"
        )
        for name, (open_naive, open_mixle) in sources.items():
            corners = mixle.PatchSampler(np.empty(shape), PATCH, n, seed=0).coords_array()
            live = open_naive()

            def naive(live=live, corners=corners) -> None:
                for z, y, x in corners.tolist():
                    np.array(live[z : z + PATCH, y : y + PATCH, x : x + PATCH])

            r_naive = rate(naive, n)
            del live, naive  # closes the naive handle before mixle opens its own
            sampler = mixle.PatchSampler(open_mixle(), PATCH, n, seed=0)

            def per_index(sampler=sampler) -> None:
                for i in range(n):
                    sampler[i]

            def batched(sampler=sampler) -> None:
                for lo in range(0, n, BATCH):
                    sampler.get_batch(np.arange(lo, lo + BATCH))

            r_index, r_batch = rate(per_index, n), rate(batched, n)
            print(
                f"{name:>10} {r_naive:>9.0f} {r_index:>12.0f} {r_batch:>10.0f} "
                f"{r_index / r_naive:>12.2f} {r_batch / r_naive:>12.2f}"
            )
            sampler.source.close()


if __name__ == "__main__":
    main()
