"""Sources and samplers across processes: pickled by reference, reopened after fork."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest

import mixle


def _sources(stores):
    return {
        "zarr": mixle.read_zarr(stores.path("sharded.zarr")),
        "hdf5": mixle.read_hdf5(stores.path("volumes.h5"), "gzip"),
        "npy": mixle.read_npy(stores.path("c.npy")),
        "memmap": mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64),
    }


def _patches_in_child(sampler_bytes: bytes, queue) -> None:
    sampler = pickle.loads(sampler_bytes)
    patches, coords = sampler.get_batch(np.arange(len(sampler)))
    queue.put((os.getpid(), patches, coords))


@pytest.mark.parametrize("backend", ["zarr", "hdf5", "npy", "memmap"])
def test_spawned_process_sees_the_same_patches(stores, backend):
    sampler = mixle.PatchSampler(_sources(stores)[backend], 3, 12, seed=2**40 + 7, stride=2)
    blob = pickle.dumps(sampler)
    assert len(blob) < 2048, len(blob)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_patches_in_child, args=(blob, queue))
    proc.start()
    pid, patches, coords = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0 and pid != os.getpid()
    want_patches, want_coords = sampler.get_batch(np.arange(12))
    np.testing.assert_array_equal(coords, want_coords)
    np.testing.assert_array_equal(patches, want_patches)


def _count_opens(src):
    opened = []
    real_open = src._open

    def counting_open():
        opened.append(os.getpid())
        return real_open()

    src._open = counting_open  # instance attribute shadows the method
    return opened


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("backend", ["zarr", "hdf5", "npy", "memmap"])
def test_forked_child_reopens_instead_of_sharing_handles(stores, backend):
    src = _sources(stores)[backend]
    opened = _count_opens(src)
    parent_handle = src.array
    expected = src[1:3]
    assert opened == []  # already open in the parent since construction
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def child():
        rows = src[1:3]
        queue.put((list(opened), src.array is parent_handle, rows))

    proc = ctx.Process(target=child)
    proc.start()
    child_opens, same_handle, rows = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert child_opens == [proc.pid]  # reopened exactly once, in the child
    assert not same_handle
    np.testing.assert_array_equal(rows, expected)
    # the parent's handle is untouched and still works
    assert src.array is parent_handle and opened == []
    np.testing.assert_array_equal(src[1:3], expected)


def test_unpickled_source_opens_lazily_on_first_use(stores):
    src = mixle.read_hdf5(stores.path("volumes.h5"), "lzf")
    clone = pickle.loads(pickle.dumps(src))
    opened = _count_opens(clone)
    assert "not opened yet" in repr(clone) and opened == []
    assert len(clone) == 40
    assert opened == [os.getpid()]
    clone[0]
    assert opened == [os.getpid()]


def test_pickle_size_does_not_grow_with_data(tmp_path):
    sizes = []
    for n in (10, 1_000_000):
        path = tmp_path / f"v{n}.npy"
        np.save(path, np.zeros(n, dtype=np.float64))
        sampler = mixle.PatchSampler(mixle.read_npy(path), 5, 100)
        sizes.append(len(pickle.dumps(sampler)))
        mm = np.load(path, mmap_mode="r")  # a plain memmap handed to the sampler
        sizes.append(len(pickle.dumps(mixle.PatchSampler(mm, 5, 100))))
    assert max(sizes) < 2048
    assert abs(sizes[0] - sizes[2]) < 16 and abs(sizes[1] - sizes[3]) < 16


@pytest.mark.parametrize("backend", ["zarr", "hdf5", "npy", "memmap"])
def test_threads_share_one_lazily_opened_source(stores, backend):
    from concurrent.futures import ThreadPoolExecutor

    sampler = mixle.PatchSampler(_sources(stores)[backend], 3, 64, seed=5)
    expected, _ = sampler.get_batch(np.arange(64))
    clone = pickle.loads(pickle.dumps(sampler))  # not opened yet
    opened = _count_opens(clone.source)
    with ThreadPoolExecutor(8) as pool:
        patches = list(pool.map(lambda i: clone[i][0], range(64)))
    assert len(opened) == 1  # the first reads raced to open; exactly one did
    np.testing.assert_array_equal(np.stack(patches), expected)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_forked_child_keeps_a_handle_that_cannot_be_reopened():
    import h5py

    from mixle.data.sources.arrays.adopt import as_array_source

    with h5py.File("in-memory.h5", "w", driver="core", backing_store=False) as f:
        src = as_array_source(f.create_dataset("x", data=np.arange(6)))
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=lambda: queue.put(src[2:4]))
        proc.start()
        rows = queue.get(timeout=120)
        proc.join(timeout=60)
    assert proc.exitcode == 0
    np.testing.assert_array_equal(rows, [2, 3])
