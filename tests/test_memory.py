"""Streaming patches from a large volume keeps memory within the decoded-chunk cache budget
plus one batch (measured in a clean subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from mixle.testing import assert_unchanged

VOLUME_SHAPE = (512, 512, 512)  # float32: 512 MiB decoded
CHUNK = 32

MEASURE = textwrap.dedent(
    """
    import json, sys

    def peak_rss():  # VmHWM: this process's own peak (ru_maxrss carries the parent's)
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM:"))

    import mixle
    from mixle.reading import chunk_cache, set_chunk_cache_bytes
    set_chunk_cache_bytes(int(sys.argv[2]))
    after_import = peak_rss()
    src = mixle.read_zarr(sys.argv[1])
    after_open = peak_rss()
    sampler = mixle.PatchSampler(src, 16, 400, seed=1)
    total = 0.0
    for patch, corner in sampler:
        total += float(patch.sum())
    for lo in range(0, 400, 64):
        total += float(sampler.get_batch(range(lo, min(lo + 64, 400)))[0].sum())
    after_stream = peak_rss()
    print(json.dumps({
        "after_import": after_import, "after_open": after_open,
        "after_stream": after_stream, "nbytes": src.nbytes,
        "cached": chunk_cache().stats().bytes,
    }))
    """
)


@pytest.fixture(scope="module")
def big_zarr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 512 MiB zarr volume, written once for every budget (each test leaves it unchanged)."""
    path = tmp_path_factory.mktemp("memory") / "big.zarr"
    arr = zarr.create_array(str(path), shape=VOLUME_SHAPE, chunks=(CHUNK,) * 3, dtype="float32")
    z, y, x = np.ogrid[0:CHUNK, 0 : VOLUME_SHAPE[1], 0 : VOLUME_SHAPE[2]]
    for z0 in range(0, VOLUME_SHAPE[0], CHUNK):  # non-constant data: every chunk is stored
        arr[z0 : z0 + CHUNK] = ((z + z0) * 7 + y * 3 + x) % 251
    return path


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0, 32 * 2**20])
def test_streaming_patches_from_a_512_mib_zarr_stays_within_cache_budget(big_zarr, budget):
    path = big_zarr
    with assert_unchanged(path):
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(path), str(budget)],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    rss = json.loads(out.stdout)
    volume = rss["nbytes"]
    assert volume >= 512 * 2**20
    growth = rss["after_stream"] - rss["after_open"]
    print(
        f"\npeak RSS after import {rss['after_import'] / 2**20:.1f} MiB, after open "
        f"{rss['after_open'] / 2**20:.1f} MiB, after 400 patches "
        f"{rss['after_stream'] / 2**20:.1f} MiB (growth {growth / 2**20:.1f} MiB = "
        f"{100 * growth / volume:.2f} % of the {volume / 2**20:.0f} MiB volume)"
    )
    assert rss["cached"] <= budget
    batch = 64 * 16**3 * 4
    # the cache and one batch, plus decoded chunks in flight and the allocator's per-thread
    # arenas of the decode pool (about 10 MiB measured on 2 cores), under 5 % of the volume
    assert growth < budget + batch + 0.05 * volume
    assert rss["after_stream"] < 0.25 * volume  # far below the volume size overall
