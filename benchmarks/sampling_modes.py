"""Sampling modes: grid tiling and stitching, label-driven sampling, foreground-index build.

Run: python benchmarks/sampling_modes.py [--size 128]

Writes zstd zarr volumes (float32 image, uint8 labels with ~1% foreground, 32^3 chunks) in
a temporary directory and measures, side by side in one process, with the decoded-chunk
cache cleared before every measurement (cold decode):

- grid tiles/s (32^3 tiles, overlap 8): zarr slicing per tile, ``grid[i]`` per tile,
  ``grid.get_batch`` of 16, and ``stitch`` with an identity model;
- patches/s of ``get_batch(64)``: uniform placement vs label-driven placement
  (``label_probabilities={0: 0.5, 1: 0.5}``) on the same image;
- foreground-index build time vs label volume size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import mixle
from mixle.reading import chunk_cache

CHUNKS = (32, 32, 32)
TILE = 32
OVERLAP = 8
BATCH = 64


def write(path: Path, data: np.ndarray) -> mixle.ZarrArraySource:
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=CHUNKS, dtype=data.dtype, compressors=ZstdCodec()
    )
    arr[:] = data
    return mixle.read_zarr(path)


def volumes(root: Path, n: int) -> tuple[mixle.ZarrArraySource, mixle.ZarrArraySource]:
    rng = np.random.default_rng(0)
    image = rng.standard_normal((n, n, n)).astype(np.float32)
    labels = (rng.random((n, n, n)) < 0.01).astype(np.uint8)
    return write(root / f"image{n}.zarr", image), write(root / f"labels{n}.zarr", labels)


def timed(fn: Callable[[], object]) -> float:
    chunk_cache().clear()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def grid_rows(image: mixle.ZarrArraySource) -> list[tuple[str, float]]:
    grid = mixle.GridSampler(image, TILE, overlap=OVERLAP)
    n = len(grid)
    corners = grid.coords_array()
    raw = zarr.open_array(image.array.store, mode="r")

    def naive() -> None:
        for c in corners.tolist():
            raw[c[0] : c[0] + TILE, c[1] : c[1] + TILE, c[2] : c[2] + TILE]

    def per_index() -> None:
        for i in range(n):
            grid[i]

    def batched() -> None:
        for lo in range(0, n, 16):
            grid.get_batch(np.arange(lo, min(lo + 16, n)))

    def stitched() -> None:
        mixle.stitch(grid, lambda t: t, batch_size=16)

    return [
        (f"grid: zarr slicing per tile ({n} tiles)", n / timed(naive)),
        ("grid: grid[i] per tile", n / timed(per_index)),
        ("grid: get_batch(16)", n / timed(batched)),
        ("grid: stitch, identity model", n / timed(stitched)),
    ]


def label_rows(image: mixle.ZarrArraySource, labels: mixle.ZarrArraySource) -> list:
    uniform = mixle.PatchSampler(image, TILE, 100_000, seed=0)
    t0 = time.perf_counter()
    by_label = mixle.PatchSampler(
        {"image": image, "label": labels},
        TILE,
        100_000,
        seed=0,
        labels="label",
        label_probabilities={0: 0.5, 1: 0.5},
    )
    build = time.perf_counter() - t0
    batches = 8

    def run(sampler: mixle.PatchSampler) -> Callable[[], None]:
        return lambda: [
            sampler.get_batch(np.arange(b * BATCH, (b + 1) * BATCH)) for b in range(batches)
        ]

    t_uniform = timed(run(uniform))
    t_label = timed(run(by_label))
    corners = by_label.coords_array(np.arange(batches * BATCH))
    t_place = min(
        timed(lambda: by_label.coords_array(np.arange(batches * BATCH))) for _ in range(3)
    )
    centres = corners + TILE // 2
    hit = labels[...][tuple(centres.T)].mean()
    return [
        (f"uniform PatchSampler get_batch({BATCH})", batches * BATCH / t_uniform),
        (f"label-driven get_batch({BATCH}) (image + label)", batches * BATCH / t_label),
        ("label-driven placement only (corners/s, warm)", batches * BATCH / t_place),
        ("  fraction of centres on foreground (asked 0.5)", hit),
        ("  index build at construction (s)", build),
    ]


def index_rows(root: Path, sizes: list[int]) -> list[tuple[str, float]]:
    rows = []
    rng = np.random.default_rng(1)
    for n in sizes:
        data = (rng.random((n, n, n)) < 0.01).astype(np.uint8)
        labels = write(root / f"index{n}.zarr", data)
        vol = np.zeros((n, n, n), dtype=np.uint8)

        def build(vol: np.ndarray = vol, labels: mixle.ZarrArraySource = labels) -> None:
            mixle.PatchSampler(vol, TILE, 10, labels=labels, label_probabilities={1: 1.0})

        t = timed(build)
        rows.append((f"index build {n}^3 labels (s)", t))
        rows.append((f"index build {n}^3 labels (Mvoxel/s)", n**3 / t / 1e6))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128, help="edge of the grid/label volume")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        image, labels = volumes(root, args.size)
        rows = grid_rows(image)
        rows += label_rows(image, labels)
        rows += index_rows(root, [64, 128, 192, 256])
    base = rows[0][1]
    print(f"volume {args.size}^3 float32 + uint8 labels, zarr zstd, chunks {CHUNKS}, cold cache")
    print(f"{'measurement':<52} {'value':>12} {'vs first':>9}")
    for name, value in rows:
        ratio = f"{value / base:>9.2f}" if name.startswith("grid") else ""
        print(f"{name:<52} {value:>12,.3f} {ratio:>9}")
    u, lab = rows[4][1], rows[5][1]
    print(f"label-driven / uniform get_batch throughput: {lab / u:.2f}")


if __name__ == "__main__":
    main()
