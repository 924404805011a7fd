"""Memory per process, measured in fresh subprocesses (VmHWM and smaps_rollup, never
ru_maxrss): decode threads add a bounded amount over the chunk-cache budget, and the
default budget is shared among the workers of a torch DataLoader."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from mixle.reading import DEFAULT_CHUNK_CACHE_BYTES

MIB = 2**20
ROOT = Path(__file__).resolve().parents[1]


def _volume(path: Path, size: int) -> str:
    arr = zarr.create_array(str(path), shape=(size,) * 3, chunks=(64,) * 3, dtype="f4")
    z, y, x = np.ogrid[0:64, 0:size, 0:size]
    for z0 in range(0, size, 64):
        arr[z0 : z0 + 64] = (np.sin(0.05 * (z + z0)) * np.cos(0.03 * y) + 0.01 * x).astype("f4")
    return str(path)


def _run(code: str, *args: str, timeout: float = 120) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.splitlines()[-1])


THREADS = textwrap.dedent(
    """
    import json, sys
    import mixle
    from mixle.reading import set_chunk_cache_bytes, set_decode_threads

    def vm_hwm():
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM:"))

    set_decode_threads(int(sys.argv[2]))
    set_chunk_cache_bytes(int(sys.argv[3]))
    sampler = mixle.PatchSampler(mixle.read_zarr(sys.argv[1]), 32, 2 + 32 * 30, seed=0)
    sampler.get_batch(range(2))  # opened, pool started: the baseline
    base = vm_hwm()
    for b in range(30):
        patches, _ = sampler.get_batch(range(2 + 32 * b, 2 + 32 * (b + 1)))
    print(json.dumps({"growth": vm_hwm() - base, "batch": patches.nbytes}))
    """
)


@pytest.mark.slow
def test_sixteen_decode_threads_stay_near_the_cache_budget(tmp_path):
    # 64 MiB of 1 MiB chunks read through a 32 MiB cache: every batch evicts. With the
    # decoded chunks kept in the decode threads' malloc heaps, 16 threads grew ~4x the
    # budget (127 MiB); kept in pages of their own, ~2.5 MiB per thread over it (76 MiB)
    budget, threads = 32 * MIB, 16
    path = _volume(tmp_path / "v.zarr", 256)
    got = _run(THREADS, path, str(threads), str(budget))
    bound = budget + 2 * got["batch"] + threads * 4 * MIB
    assert got["growth"] < bound, (got["growth"] / MIB, bound / MIB)


WORKERS = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader
    import mixle
    from mixle.reading import chunk_cache

    def private(pid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                lines = fh.read().splitlines()
        except OSError:  # the worker has exited
            return 0
        fields = ("Private_Clean:", "Private_Dirty:")
        return sum(int(l.split()[1]) * 1024 for l in lines if l.startswith(fields))

    def children():
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == os.getpid():
                found.append(int(entry))
        return found

    class Budgets:  # each item: the cache budget of the worker that reads it
        def __len__(self):
            return 4
        def __getitem__(self, i):
            return chunk_cache().budget

    sampler = mixle.PatchSampler(mixle.read_zarr(sys.argv[1]), 32, 4 * 96, seed=0)
    before = private(os.getpid())
    peak = 0
    for batch in DataLoader(sampler, batch_size=16, num_workers=4):
        peak = max(peak, sum(private(p) for p in [os.getpid(), *children()]))
    budgets = sorted({int(b) for b in DataLoader(Budgets(), num_workers=4)})
    print(json.dumps({"growth": peak - before, "budgets": budgets}))
    """
)


@pytest.mark.slow
def test_four_dataloader_workers_share_the_default_budget(tmp_path):
    # each worker reads ~300 distinct 1 MiB chunks of a 216 MiB volume: with 256 MiB per
    # worker the four held ~530 MiB of private memory over the parent's
    path = _volume(tmp_path / "v.zarr", 384)
    got = _run(WORKERS, path)
    assert got["budgets"] == [DEFAULT_CHUNK_CACHE_BYTES // 4]
    bound = DEFAULT_CHUNK_CACHE_BYTES + 4 * 24 * MIB  # the job's budget + per-process overhead
    assert got["growth"] < bound, (got["growth"] / MIB, bound / MIB)


@pytest.mark.slow
def test_memory_benchmark_quick_run_prints_its_tables():
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert {(r["table"], r.get("threads", r.get("workers"))) for r in rows} == {
        ("threads", 1),
        ("threads", 4),
        ("workers", 1),
        ("workers", 2),
        ("mp", 1),
        ("mp", 2),
    }
    assert "decode threads" in run.stdout and "private memory" in run.stdout
    assert "MPEncodedData driver + workers" in run.stdout
