"""Random patch reads: naive slicing vs mixle per-index and batched vs tensorstore vs the
decode-bound limit, side by side in one run.

Run: python benchmarks/patch_read.py [--size 512] [--batches 12]

Writes a float32 cube with 64^3 chunks (zstd zarr, gzip HDF5, uncompressed contiguous HDF5,
raw memmap) to a temporary folder, then reads random 32^3 patches in batches of 64 with a
warm page cache. Every measurement runs in its own fresh process so that its peak RSS is
its own. Each process first reads the whole volume once through its own handle (so memory
maps are populated and caches are full, as in a long training run), warms up on a few
batches, then times other, fresh batches. Peak RSS of memory-mapped rows (memmap, HDF5
raw in mixle) includes the file's pages mapped from the page cache, shared and reclaimable.

- naive: ``np.array(arr[slices])`` per patch in a Python loop on a plain zarr / h5py
  (default 1 MiB chunk cache) / np.memmap handle, stacked into the batch with ``np.stack``
  as a DataLoader collates it, as users write it today (every ratio is against this row).
  ``naive, no stack`` skips the stacking (the patches are dropped, never batched): shown for
  the memory-mapped stores, where copying is the whole cost.
- per-index: ``sampler[i]``; batched: ``sampler.get_batch`` (256 MiB decoded-chunk cache);
  batched, no cache: the same with the cache off (each batch decodes what it touches once).
- tensorstore: zarr3 driver, one ``ts.Batch`` per batch, the same 256 MiB cache (or none,
  beside mixle's no-cache row), as many copy threads as mixle has decode threads (where
  tensorstore is installed). ``x tstore`` compares each mixle row with the tensorstore row
  of the same cache setting.
- batched, 384 MiB cache: mixle with a cache as large as the memory tensorstore actually
  holds with its 256 MiB budget (compare the RSS columns), against tensorstore's row.
- locality: batched with ``patches_per_chunk=8`` (8 patches share one 64^3 chunk region).
- limit: decode threads x single-thread decode rate of one stored chunk / chunks touched
  per patch, measured in this run: what a reader that decodes every touched chunk once per
  patch, on every core, with no cache, could reach.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

PATCH = 32
CHUNK = 64
BATCH = 64
WARM_BATCHES = 4
CACHE_BYTES = 256 * 2**20
#: A larger mixle cache for a row at tensorstore's own peak memory: tensorstore holds well
#: over its configured budget (its RSS column shows how much).
BIG_CACHE_BYTES = 384 * 2**20
MIB = 2**20


# -- the volume ---------------------------------------------------------------------------
def write_volumes(folder: Path, size: int) -> None:
    """The same smooth float32 cube as zarr (zstd), HDF5 (gzip / contiguous) and raw."""
    import h5py
    import zarr

    shape = (size, size, size)
    z, y, x = np.ogrid[0:CHUNK, 0:size, 0:size]
    arr = zarr.create_array(str(folder / "v.zarr"), shape=shape, chunks=(CHUNK,) * 3, dtype="f4")
    with h5py.File(folder / "v.h5", "w") as f, open(folder / "v.raw", "wb") as raw:
        gz = f.create_dataset(
            "gzip", shape=shape, dtype="f4", chunks=(CHUNK,) * 3, compression="gzip"
        )
        flat = f.create_dataset("raw", shape=shape, dtype="f4")
        for z0 in range(0, size, CHUNK):
            slab = (np.sin(0.05 * (z + z0)) * np.cos(0.03 * y) + 0.01 * x).astype("f4")
            arr[z0 : z0 + CHUNK] = slab
            gz[z0 : z0 + CHUNK] = slab
            flat[z0 : z0 + CHUNK] = slab
            raw.write(slab.tobytes())


def corners(size: int, count: int, seed: int = 0) -> np.ndarray:
    """The random patch corners every method reads (mixle's own placement)."""
    import mixle

    return mixle.PatchSampler(
        np.empty((size,) * 3, np.uint8), PATCH, count, seed=seed
    ).coords_array()


# -- one measurement, in a fresh process -----------------------------------------------------
def measure(folder: Path, size: int, backend: str, method: str, batches: int) -> dict:
    """Patches/s and peak RSS of one (backend, method); runs inside the worker process."""
    import mixle
    from mixle.reading import set_chunk_cache_bytes

    shape = (size,) * 3
    n_warm, n_timed = WARM_BATCHES * BATCH, batches * BATCH
    where = corners(size, n_warm + n_timed)
    budgets = {"batched, no cache": 0, "batched, 384 MiB cache": BIG_CACHE_BYTES}
    set_chunk_cache_bytes(budgets.get(method, CACHE_BYTES))
    slabs = [(z0, y0) for z0 in range(0, size, CHUNK) for y0 in range(0, size, CHUNK)]

    if method.startswith("naive"):
        live = _naive_handle(folder, backend, shape)
        stack = method == "naive"

        def read_slab(z0: int, y0: int) -> None:
            np.array(live[z0 : z0 + CHUNK, y0 : y0 + CHUNK])

        def run(lo: int, hi: int) -> None:
            for b in range(lo, hi, BATCH):
                patches = [
                    np.array(live[zc : zc + PATCH, yc : yc + PATCH, xc : xc + PATCH])
                    for zc, yc, xc in where[b : b + BATCH].tolist()
                ]
                if stack:  # the batch a training step needs, as a DataLoader collates it
                    np.stack(patches)

    elif method.startswith("tensorstore"):
        budget = 0 if method.endswith("no cache") else CACHE_BYTES
        read_slab, run = _tensorstore_runner(folder, where, budget)
    else:
        src = _mixle_source(folder, backend, shape)
        local = 8 if method == "locality" else 1
        sampler = mixle.PatchSampler(src, PATCH, n_warm + n_timed, seed=0, patches_per_chunk=local)

        def read_slab(z0: int, y0: int) -> None:
            src.read_box((z0, y0, 0), (CHUNK, CHUNK, size))

        if method == "per-index":

            def run(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    sampler[i]

        else:

            def run(lo: int, hi: int) -> None:
                for b in range(lo, hi, BATCH):
                    sampler.get_batch(np.arange(b, b + BATCH))

    rss_ready = _peak_rss()
    for z0, y0 in slabs:  # every method first reads the whole volume through its own handle
        read_slab(z0, y0)
    run(0, n_warm)
    t0 = time.perf_counter()
    run(n_warm, n_warm + n_timed)
    elapsed = time.perf_counter() - t0
    return {
        "rate": n_timed / elapsed,
        "rss_ready": rss_ready,
        "rss_peak": _peak_rss(),
    }


def _naive_handle(folder: Path, backend: str, shape: tuple[int, ...]):
    import h5py
    import zarr

    if backend == "zarr zstd":
        return zarr.open_array(str(folder / "v.zarr"), mode="r")
    if backend in ("hdf5 gzip", "hdf5 raw"):
        return h5py.File(folder / "v.h5", "r")[backend.split()[1]]  # HDF5's default cache
    return np.memmap(folder / "v.raw", dtype="f4", mode="r", shape=shape)


def _mixle_source(folder: Path, backend: str, shape: tuple[int, ...]):
    import mixle

    if backend == "zarr zstd":
        return mixle.read_zarr(folder / "v.zarr")
    if backend in ("hdf5 gzip", "hdf5 raw"):
        return mixle.read_hdf5(folder / "v.h5", backend.split()[1])
    return mixle.read_memmap(folder / "v.raw", "float32", shape)


def _tensorstore_runner(folder: Path, where: np.ndarray, budget: int):
    import tensorstore as ts

    from mixle.reading import decode_threads

    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(folder / "v.zarr")},
        "context": {
            "cache_pool": {"total_bytes_limit": budget},
            "data_copy_concurrency": {"limit": decode_threads()},
        },
    }
    store = ts.open(spec, read=True).result()

    def read_slab(z0: int, y0: int) -> None:
        store[z0 : z0 + CHUNK, y0 : y0 + CHUNK].read().result()

    def run(lo: int, hi: int) -> None:
        for b in range(lo, hi, BATCH):
            out = np.empty((BATCH, PATCH, PATCH, PATCH), dtype="f4")
            with ts.Batch() as batch:
                futures = [
                    store[zc : zc + PATCH, yc : yc + PATCH, xc : xc + PATCH].read(batch=batch)
                    for zc, yc, xc in where[b : b + BATCH].tolist()
                ]
            for k, future in enumerate(futures):
                out[k] = future.result()

    return read_slab, run


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_isolated(folder: Path, size: int, backend: str, method: str, batches: int) -> dict:
    """Run :func:`measure` in a fresh process (through ``sh`` so its peak RSS is its own)."""
    cmd = [sys.executable, __file__, "--worker", str(folder), str(size), backend, method,
           str(batches)]  # fmt: skip
    out = subprocess.run(
        ["sh", "-c", '"$0" "$@"; exit $?', *cmd], capture_output=True, text=True, timeout=1800
    )
    if out.returncode:
        raise RuntimeError(f"{backend} / {method} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the decode-bound limit ------------------------------------------------------------------
def decode_rates(folder: Path, size: int) -> dict[str, float]:
    """Single-thread decoded chunks per second, for zstd (zarr) and gzip (HDF5) chunks."""
    import h5py
    import numcodecs

    rng = np.random.default_rng(1)
    grid = size // CHUNK
    picks = [tuple(int(v) for v in rng.integers(0, grid, 3)) for _ in range(24)]
    zstd = numcodecs.Zstd()
    blobs = [(folder / "v.zarr" / "c" / "/".join(map(str, c))).read_bytes() for c in picks]
    out = np.empty(CHUNK**3, dtype="f4")
    rates = {"zarr zstd": _rate(lambda: [zstd.decode(b, out=out) for b in blobs], len(blobs))}
    with h5py.File(folder / "v.h5", "r") as f:
        ds = f["gzip"]
        raw = [ds.id.read_direct_chunk(tuple(v * CHUNK for v in c))[1] for c in picks]
    nbytes = CHUNK**3 * 4
    rates["hdf5 gzip"] = _rate(lambda: [zlib.decompress(b, bufsize=nbytes) for b in raw], len(raw))
    return rates


def _rate(fn, n: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def chunks_per_patch(size: int, count: int) -> float:
    where = corners(size, count)
    spans = (where + PATCH - 1) // CHUNK - where // CHUNK + 1
    return float(np.prod(spans, axis=1).mean())


def zarr_reader_rates(folder: Path) -> tuple[float, float]:
    """Chunks/s through numcodecs directly vs through zarr's codec pipeline (one thread)."""
    import mixle
    from mixle.data.sources.arrays.zarr.chunks import ZarrCodecReader
    from mixle.data.sources.arrays.zarr.pipeline import ZarrPipelineReader

    src = mixle.read_zarr(folder / "v.zarr")
    direct = src._reader_for(src.array)  # what mixle picks for this array
    assert isinstance(direct, ZarrCodecReader)
    pipeline = ZarrPipelineReader(src.array)
    grid = src.shape[0] // CHUNK
    coords = [(i % grid, (i // grid) % grid, 0) for i in range(16)]
    return (
        _rate(lambda: [direct.read_chunk(c) for c in coords], len(coords), 3),
        _rate(lambda: [pipeline.read_chunk(c) for c in coords], len(coords), 3),
    )


# -- the table -------------------------------------------------------------------------------
METHODS = {
    "zarr zstd": [
        "naive",
        "tensorstore",
        "tensorstore, no cache",
        "per-index",
        "batched",
        "batched, no cache",
        "batched, 384 MiB cache",
        "locality",
    ],
    "hdf5 gzip": ["naive", "per-index", "batched", "batched, no cache"],
    "hdf5 raw": ["naive", "naive, no stack", "per-index", "batched"],
    "memmap": ["naive", "naive, no stack", "per-index", "batched"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=512, help="cube edge (512: 512 MiB)")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per method")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(METHODS), help="backends to measure (default: all)"
    )
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        folder, size, backend, method, batches = args.worker
        print(json.dumps(measure(Path(folder), int(size), backend, method, int(batches))))
        return

    from mixle.reading import decode_threads
    from mixle.utils.optional_deps import has

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        write_volumes(folder, args.size)
        print(
            f"{args.size}^3 float32 ({args.size**3 * 4 / MIB:.0f} MiB), {CHUNK}^3 chunks, "
            f"random {PATCH}^3 patches, batch {BATCH}, {decode_threads()} decode threads, "
            f"cache {CACHE_BYTES // MIB} MiB (written in {time.perf_counter() - t0:.0f} s)"
        )
        rates = decode_rates(folder, args.size)
        touched = chunks_per_patch(args.size, 4096)
        limit = {k: decode_threads() * r / touched for k, r in rates.items()}
        for name, r in rates.items():
            print(
                f"  {name}: one thread decodes {r:.0f} chunks/s; {touched:.2f} chunks per "
                f"patch -> limit {limit[name]:.0f} patches/s"
            )
        direct, pipeline = zarr_reader_rates(folder)
        print(
            f"  zarr chunk read+decode, one thread: numcodecs direct {direct:.0f} chunks/s, "
            f"zarr codec pipeline {pipeline:.0f} chunks/s ({direct / pipeline:.2f}x)"
        )
        patch_mib = PATCH**3 * 4 / MIB
        print()
        print(
            f"{'backend':<10} {'method':<23} {'patches/s':>10} {'MiB/s':>8} {'x naive':>8} "
            f"{'x tstore':>9} {'x limit':>8} {'RSS MiB':>8} {'+RSS':>6}"
        )
        for backend, methods in METHODS.items():
            if args.only and backend not in args.only:
                continue
            results: dict[str, dict] = {}
            for method in methods:
                if method.startswith("tensorstore") and not has("tensorstore"):
                    print(f"{backend:<10} {method:<23} {'not installed':>10}")
                    continue
                results[method] = r = run_isolated(folder, args.size, backend, method, args.batches)
                naive = results["naive"]["rate"]
                peer = "tensorstore, no cache" if method.endswith("no cache") else "tensorstore"
                ts_rate = results.get(peer, {}).get("rate")
                mine = not method.startswith(("tensorstore", "naive"))
                vs_ts = f"{r['rate'] / ts_rate:.2f}" if ts_rate and mine else "-"
                vs_limit = f"{r['rate'] / limit[backend]:.2f}" if backend in limit else "-"
                print(
                    f"{backend:<10} {method:<23} {r['rate']:>10.0f} "
                    f"{r['rate'] * patch_mib:>8.0f} {r['rate'] / naive:>8.2f} {vs_ts:>9} "
                    f"{vs_limit:>8} {r['rss_peak'] / MIB:>8.0f} "
                    f"{(r['rss_peak'] - r['rss_ready']) / MIB:>6.0f}"
                )


if __name__ == "__main__":
    main()
