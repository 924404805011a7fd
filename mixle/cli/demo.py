"""``mixle demo``: write a synthetic volume, cut seeded patches from it, report what happened."""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import numpy as np

from mixle.data.patch_sampler import PatchSampler
from mixle.data.sources.array_source import read_memmap, read_zarr
from mixle.data.sources.base import ArraySource
from mixle.utils.optional_deps import HAS_ZARR, require

__all__ = ["BACKENDS", "register", "run_demo", "write_synthetic_volume"]

BACKENDS = ("auto", "zarr", "memmap")


def _slab(shape: tuple[int, ...], z0: int, z1: int) -> np.ndarray:
    """A CT-like slab: a bright ellipsoid with smooth texture, built plane by plane."""
    cz, cy, cx = (s / 2 for s in shape)
    y, x = np.ogrid[: shape[1], : shape[2]]
    y, x = y.astype(np.float32), x.astype(np.float32)
    ry = ((y - cy) / (0.4 * shape[1])) ** 2
    rx = ((x - cx) / (0.35 * shape[2])) ** 2
    slab = np.empty((z1 - z0, shape[1], shape[2]), dtype=np.float32)
    for k, z in enumerate(range(z0, z1)):
        rz = ((z - cz) / (0.45 * shape[0])) ** 2
        plane = slab[k]
        np.sin(0.2 * x + 0.13 * y + np.float32(0.07 * z), out=plane)
        plane *= 40.0
        plane += np.where(rz + ry + rx < 1.0, np.float32(1000.0), np.float32(-1000.0))
    return slab


def write_synthetic_volume(
    folder: Path, shape: tuple[int, int, int], backend: str, chunk: int = 64
) -> ArraySource:
    """Write a float32 CT-like volume slab by slab and return it opened as a source."""
    if backend == "zarr":
        zarr = require("zarr", feature="mixle demo --backend zarr")
        path = folder / "volume.zarr"
        chunks = tuple(min(chunk, s) for s in shape)
        arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32")
        for z0 in range(0, shape[0], chunks[0]):
            z1 = min(shape[0], z0 + chunks[0])
            arr[z0:z1] = _slab(shape, z0, z1)
        return read_zarr(path)
    path = folder / "volume.raw"
    with open(path, "wb") as fh:
        for z0 in range(0, shape[0], chunk):
            fh.write(_slab(shape, z0, min(shape[0], z0 + chunk)).tobytes())
    return read_memmap(path, "float32", shape)


def _peak_rss_mib() -> float:
    scale = 1024 if sys.platform != "darwin" else 1024 * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def run_demo(
    *,
    size: int = 256,
    backend: str = "auto",
    patch: int = 32,
    num_patches: int = 512,
    seed: int = 0,
    out: TextIO | None = None,
) -> dict[str, float]:
    """Run the demo and print a short report (to ``out``, default stdout); returns the numbers."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "zarr" if HAS_ZARR else "memmap"
    shape = (size, size, size)
    stream = sys.stdout if out is None else out
    say: Callable[[str], None] = lambda line: print(line, file=stream)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="mixle-demo-") as tmp:
        t0 = time.perf_counter()
        src = write_synthetic_volume(Path(tmp), shape, backend)
        t_write = time.perf_counter() - t0
        say(
            f"wrote a {shape} float32 volume ({src.nbytes / 2**20:.0f} MiB, {backend}) "
            f"to {tmp} in {t_write:.1f} s"
        )
        say(f"opened {src!r}")
        sampler = PatchSampler(src, patch, num_patches, seed=seed)
        rss_before = _peak_rss_mib()
        t0 = time.perf_counter()
        total = 0.0
        for record in sampler:
            assert isinstance(record, tuple)  # one array: (patch, corner) records
            total += float(record[0].mean())
        elapsed = max(time.perf_counter() - t0, 1e-9)
        first = sampler.coords()[:3]
        patch_mib = num_patches * int(np.prod(sampler.patch_size)) * 4 / 2**20
        peak = _peak_rss_mib()
        stats = {
            "patches_per_s": num_patches / elapsed,
            "mib_per_s": patch_mib / elapsed,
            "peak_rss_mib": peak,
            "sampling_rss_growth_mib": peak - rss_before,
            "volume_mib": src.nbytes / 2**20,
            "mean_intensity": total / max(num_patches, 1),
        }
        say(
            f"sampled {num_patches} patches of {sampler.patch_size} with seed={seed}; "
            f"first corners {first}"
        )
        say("")
        say(
            f"  {'patches/s':>10} {'MiB/s':>8} {'volume MiB':>11} {'peak RSS MiB':>13} "
            f"{'RSS growth while sampling MiB':>30}"
        )
        say(
            f"  {stats['patches_per_s']:10.0f} {stats['mib_per_s']:8.1f} "
            f"{stats['volume_mib']:11.0f} {stats['peak_rss_mib']:13.0f} "
            f"{stats['sampling_rss_growth_mib']:30.1f}"
        )
        if backend == "memmap":
            say("  (a memmap's RSS counts the file pages it touched: page cache the kernel can")
            say("   reclaim, not memory mixle allocated)")
        say("")
        say(f"mean patch intensity {stats['mean_intensity']:.2f}; removed {tmp}")
        src.close()
    return stats


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``mixle demo`` to the command line."""
    demo = sub.add_parser("demo", help="write a synthetic volume and sample patches from it")
    demo.add_argument("--size", type=int, default=256, help="edge of the cubic volume (256)")
    demo.add_argument("--backend", choices=BACKENDS, default="auto")
    demo.add_argument("--patch", type=int, default=32, help="patch edge (32)")
    demo.add_argument("--num-patches", type=int, default=512)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.size < 1 or not 1 <= args.patch <= args.size:
        parser.error(f"--patch={args.patch} must be between 1 and --size={args.size}")
    if args.num_patches < 0:
        parser.error(f"--num-patches={args.num_patches} must be >= 0")
    run_demo(
        size=args.size,
        backend=args.backend,
        patch=args.patch,
        num_patches=args.num_patches,
        seed=args.seed,
    )
    return 0
