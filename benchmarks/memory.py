"""Memory per process: peak RSS growth against the chunk-cache budget for 1, 4 and 16
decode threads, and total private memory of a torch DataLoader with 1, 4 and 8 workers and
of an MPEncodedData with 1 and 4 workers.

Run: python benchmarks/memory.py [--quick] [--json]

Writes a float32 cube with 64^3 zstd chunks (512^3: 512 MiB decoded, twice the default
256 MiB budget) to a temporary folder. Every measurement runs in a fresh process.

- threads: random 32^3 patches in batches of 64 through ``PatchSampler.get_batch`` with
  the default budget; growth is VmHWM (``/proc/self/status``) after the reads minus VmHWM
  after opening and reading two patches. ``over`` is growth - budget - one batch: what the
  process holds beyond the cache and the batch (malloc arenas, decoder buffers), and
  ``per thread`` that divided by the decode threads.
- workers: a ``PatchSampler`` used as a map-style torch Dataset (as in
  tests/test_interop.py), ``DataLoader(batch_size=16, num_workers=N)``, 192 patches per
  worker. ``private`` is the largest sum, sampled after every batch, of Private_Clean +
  Private_Dirty from ``/proc/<pid>/smaps_rollup`` over the parent and its workers;
  ``cache`` is the budget each worker's cache had. ``default`` rows use mixle's defaults;
  ``256 MiB each`` rows set the budget of every process to 256 MiB explicitly (the default
  before budgets were shared among DataLoader workers).

- mp: the same sampler as the data of ``MPEncodedData(num_workers=N, read_in="workers")``:
  each worker reads ``per`` patches of its shard and keeps them. ``private`` is Private_Clean
  + Private_Dirty over the driver and its workers once the build is done; ``cache`` is each
  worker's budget (asked of the workers). ``256 MiB each`` sets the budget in the driver,
  which every worker then takes (before workers shared the default, each had 256 MiB).

``--quick`` runs a smoke version (a 128^3 volume, 1 and 4 threads, 1 and 2 workers of each
kind with the defaults) in a few seconds; ``--json`` prints the rows as JSON lines as well.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _proc import children, private_bytes, run_measurement, vm_hwm

MIB = 2**20
CHUNK = 64
PATCH = 32
BATCH = 64
#: Budget of the "256 MiB each" rows: the per-process default before it was shared.
OLD_BUDGET = 256 * MIB
FULL: dict[str, Any] = {
    "size": 512,
    "threads": (1, 4, 16),
    "workers": (1, 4, 8),
    "budgets": (None, OLD_BUDGET),
    "batches": 40,
    "per": 192,
    "mp_workers": (1, 4),
}
QUICK: dict[str, Any] = {
    "size": 128,
    "threads": (1, 4),
    "workers": (1, 2),
    "budgets": (None,),
    "batches": 4,
    "per": 32,
    "mp_workers": (1, 2),
}


def write_volume(path: Path, size: int) -> None:
    """A smooth float32 cube, zstd-compressed in 64^3 chunks (zarr's default codec)."""
    import zarr

    arr = zarr.create_array(str(path), shape=(size,) * 3, chunks=(CHUNK,) * 3, dtype="f4")
    z, y, x = np.ogrid[0:CHUNK, 0:size, 0:size]
    for z0 in range(0, size, CHUNK):
        arr[z0 : z0 + CHUNK] = (np.sin(0.05 * (z + z0)) * np.cos(0.03 * y) + 0.01 * x).astype("f4")


# -- measurements, each in its own process ------------------------------------------------
def measure_threads(path: str, threads: int, batches: int) -> dict[str, Any]:
    import mixle
    from mixle.reading import chunk_cache, set_decode_threads

    set_decode_threads(threads)
    sampler = mixle.PatchSampler(mixle.read_zarr(path), PATCH, BATCH * batches + 2, seed=0)
    sampler.get_batch(range(2))  # two patches: opened, the pool started, a chunk or two kept
    base = vm_hwm()
    start = time.perf_counter()
    for b in range(batches):
        patches, _ = sampler.get_batch(range(2 + b * BATCH, 2 + (b + 1) * BATCH))
    seconds = time.perf_counter() - start
    budget = chunk_cache().budget
    growth = vm_hwm() - base
    over = growth - budget - patches.nbytes
    return {
        "table": "threads",
        "threads": threads,
        "budget_mib": budget / MIB,
        "growth_mib": growth / MIB,
        "x_budget": growth / budget,
        "over_mib": over / MIB,
        "per_thread_mib": over / MIB / threads,
        "patches_per_s": batches * BATCH / seconds,
    }


def _cache_budget(_: int) -> int:
    from mixle.reading import chunk_cache

    return chunk_cache().budget


def measure_workers(path: str, workers: int, per: int, budget: int | None) -> dict[str, Any]:
    import torch  # noqa: F401  (imported before the workers fork, as in a training script)
    from torch.utils.data import DataLoader

    import mixle
    from mixle.reading import set_chunk_cache_bytes

    if budget is not None:
        set_chunk_cache_bytes(budget)
    sampler = mixle.PatchSampler(mixle.read_zarr(path), PATCH, per * workers, seed=0)
    loader = DataLoader(sampler, batch_size=16, num_workers=workers)  # type: ignore[arg-type]
    peak = 0
    me = os.getpid()
    for _batch in loader:
        peak = max(peak, sum(private_bytes(p) for p in [me, *children(me)]))
    budgets = sorted({int(b) for b in DataLoader(_Budgets(workers), num_workers=workers)})
    return {
        "table": "workers",
        "workers": workers,
        "setting": "default" if budget is None else f"{budget // MIB} MiB each",
        "cache_mib": budgets[0] / MIB if len(budgets) == 1 else [b / MIB for b in budgets],
        "private_mib": peak / MIB,
    }


def measure_mp(path: str, workers: int, per: int, budget: int | None) -> dict[str, Any]:
    import mixle
    from mixle.reading import set_chunk_cache_bytes

    if budget is not None:
        set_chunk_cache_bytes(budget)
    sampler = mixle.PatchSampler(mixle.read_zarr(path), PATCH, per * workers, seed=0)
    me = os.getpid()
    with mixle.MPEncodedData(sampler, num_workers=workers, read_in="workers") as data:
        private = sum(private_bytes(p) for p in [me, *children(me)])
        budgets = sorted(set(data.map(_cache_budget)))
    return {
        "table": "mp",
        "workers": workers,
        "setting": "default" if budget is None else f"{budget // MIB} MiB each",
        "cache_mib": budgets[0] / MIB if len(budgets) == 1 else [b / MIB for b in budgets],
        "private_mib": private / MIB,
    }


class _Budgets:
    """A Dataset whose items are the cache budget of the worker that reads them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return _cache_budget(i)


# -- driver -------------------------------------------------------------------------------
def run_child(kind: str, *args: Any) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its row."""
    return run_measurement(__file__, ["--child", json.dumps([kind, *args])], f"{kind} {args}")


def _print_private(rows: list[dict[str, Any]], table: str, title: str) -> None:
    print(f"\n{title}")
    print("| workers | setting | cache per worker | private memory |")
    print("| ---: | --- | ---: | ---: |")
    for r in rows:
        if r["table"] == table:
            cache = r["cache_mib"]
            shown = f"{cache:.0f} MiB" if isinstance(cache, float) else str(cache)
            print(f"| {r['workers']} | {r['setting']} | {shown} | {r['private_mib']:.0f} MiB |")


def print_tables(rows: list[dict[str, Any]]) -> None:
    print("\nPeak RSS growth against the chunk-cache budget (default settings)")
    print(
        "| decode threads | budget | growth | x budget | over budget + batch | per thread "
        "| patches/s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["table"] == "threads":
            print(
                f"| {r['threads']} | {r['budget_mib']:.0f} MiB | {r['growth_mib']:.0f} MiB | "
                f"{r['x_budget']:.2f} | {r['over_mib']:.0f} MiB | {r['per_thread_mib']:.1f} MiB "
                f"| {r['patches_per_s']:.0f} |"
            )
    _print_private(rows, "workers", "Total private memory, DataLoader parent + workers")
    _print_private(rows, "mp", "Total private memory, MPEncodedData driver + workers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--json", action="store_true", help="also print rows as JSON lines")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        measure = {"threads": measure_threads, "workers": measure_workers, "mp": measure_mp}
        row = measure[kind](*rest)
        print(json.dumps(row))
        return
    plan = QUICK if args.quick else FULL
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.zarr"
        write_volume(path, plan["size"])
        for threads in plan["threads"]:
            rows.append(run_child("threads", str(path), threads, plan["batches"]))
        for workers in plan["workers"]:
            for budget in plan["budgets"]:
                rows.append(run_child("workers", str(path), workers, plan["per"], budget))
        for workers in plan["mp_workers"]:
            for budget in plan["budgets"]:
                rows.append(run_child("mp", str(path), workers, plan["per"], budget))
    if args.json:
        for row in rows:
            print(json.dumps(row))
    print_tables(rows)


if __name__ == "__main__":
    main()
