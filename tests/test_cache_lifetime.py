"""Sources give back what they hold: decoded chunks leave the shared cache when a source is
closed or collected, and OS handles are released when a source is dropped unclosed."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import mixle
from mixle.reading import chunk_cache, set_chunk_cache_bytes

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

CHUNK = 16
CHUNK_BYTES = CHUNK**3 * 4


@pytest.fixture
def volumes(tmp_path: Path) -> dict[str, str]:
    data = np.arange(64**3, dtype="f4").reshape(64, 64, 64)
    z = zarr.create_array(
        str(tmp_path / "v.zarr"), shape=data.shape, chunks=(CHUNK,) * 3, dtype="f4"
    )
    z[:] = data
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(CHUNK,) * 3, compression="gzip")
    return {"zarr": str(tmp_path / "v.zarr"), "hdf5": str(tmp_path / "v.h5")}


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    old = chunk_cache().budget
    chunk_cache().clear()
    try:
        yield
    finally:
        set_chunk_cache_bytes(old)
        chunk_cache().clear()


def _open(kind: str, volumes: dict[str, str]) -> mixle.ArraySource:
    if kind == "zarr":
        return mixle.read_zarr(volumes["zarr"])
    return mixle.read_hdf5(volumes["hdf5"], "x")


def _read_a_few(src: mixle.ArraySource, at: int = 0) -> np.ndarray:
    # two boxes, each straddling 8 chunks
    return src.read_boxes([[at + 8, 8, 8], [40, 40, 40]], (16, 16, 16))


@pytest.mark.parametrize("kind", ["zarr", "hdf5"])
def test_closing_a_source_drops_its_chunks_and_keeps_the_live_ones(kind, volumes, fresh_cache):
    live = _open(kind, volumes)
    expected = _read_a_few(live)
    kept = chunk_cache().stats()
    assert kept.entries == 16 and kept.bytes == 16 * CHUNK_BYTES
    for _ in range(30):
        src = _open(kind, volumes)
        _read_a_few(src, at=16)
        assert len(chunk_cache()) > kept.entries
        src.close()
        stats = chunk_cache().stats()
        assert (stats.entries, stats.bytes) == (kept.entries, kept.bytes)
    misses = chunk_cache().stats().misses
    np.testing.assert_array_equal(_read_a_few(live), expected)
    assert chunk_cache().stats().misses == misses  # the live source's chunks are all there
    live.close()
    assert chunk_cache().stats().entries == 0 and chunk_cache().stats().bytes == 0


@pytest.mark.parametrize("kind", ["zarr", "hdf5"])
def test_a_collected_source_drops_its_chunks(kind, volumes, fresh_cache):
    live = _open(kind, volumes)
    _read_a_few(live)
    kept = chunk_cache().stats()
    for _ in range(10):
        src = _open(kind, volumes)
        _read_a_few(src, at=16)
        src.get_batch([3, 60])
        sampler = mixle.PatchSampler(src, 8, 6, seed=0)
        sampler.get_batch(range(6))
        del src, sampler
        gc.collect()
        stats = chunk_cache().stats()
        assert (stats.entries, stats.bytes) == (kept.entries, kept.bytes)
    del live
    gc.collect()
    assert len(chunk_cache()) == 0


def test_dead_sources_no_longer_evict_live_chunks(volumes, fresh_cache):
    set_chunk_cache_bytes(32 * CHUNK_BYTES)  # the live 16 chunks and one other source's 16
    live = _open("zarr", volumes)
    _read_a_few(live)
    for _ in range(50):
        with _open("zarr", volumes) as src:
            _read_a_few(src, at=16)
    misses = chunk_cache().stats().misses
    _read_a_few(live)
    assert chunk_cache().stats().misses == misses
    assert chunk_cache().stats().evictions == 0


FORKED = textwrap.dedent(
    """
    import json, os, sys
    import mixle
    from mixle.reading import chunk_cache
    src = mixle.read_zarr(sys.argv[1])
    src.read_boxes([[8, 8, 8]], (16, 16, 16))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child rebuilds its own reader; closing drops the child's chunks
        os.close(r)
        src.read_boxes([[8, 8, 8], [40, 40, 40]], (16, 16, 16))
        during = len(chunk_cache())
        src.close()
        os.write(w, json.dumps([during, len(chunk_cache())]).encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 1000))
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": len(chunk_cache())}))
    """
)


def test_a_reader_rebuilt_after_fork_drops_its_chunks_on_close(volumes):
    run = subprocess.run(
        [sys.executable, "-c", FORKED, volumes["zarr"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result == {"child": [16, 0], "parent": 8}


HANDLES = textwrap.dedent(
    """
    import gc, os, resource, sys
    import numpy as np
    import mixle
    folder = sys.argv[1]
    gc.disable()  # released by reference counting alone: no cycle keeps a handle
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    openers = {
        "npy": lambda: mixle.read_npy(folder + "/a.npy"),
        "raw": lambda: mixle.read_memmap(folder + "/a.raw", "f4", (64, 64)),
        "hdf5 chunked": lambda: mixle.read_hdf5(folder + "/a.h5", "chunked"),
        "hdf5 contiguous": lambda: mixle.read_hdf5(folder + "/a.h5", "flat"),
        "zarr": lambda: mixle.read_zarr(folder + "/a.zarr"),
    }
    for name, opener in openers.items():
        for _ in range(300):
            src = opener()
            src[0:5]
            src.read_boxes([[0, 0], [20, 30]], (8, 8))
            src.get_batch([1, 40])
            mixle.PatchSampler(src, 8, 4, seed=0).get_batch(range(4))
            del src
    print(len(os.listdir("/proc/self/fd")))
    """
)


def test_sources_dropped_unclosed_release_their_handles(tmp_path):
    data = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    np.save(tmp_path / "a.npy", data)
    data.tofile(tmp_path / "a.raw")
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("chunked", data=data, chunks=(16, 16), compression="gzip")
        f.create_dataset("flat", data=data)
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(16, 16), dtype="f4")
    z[:] = data
    run = subprocess.run(
        [sys.executable, "-c", HANDLES, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) < 32
