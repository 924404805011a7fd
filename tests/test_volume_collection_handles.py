"""Bounded handles of a ``VolumeCollection``: the LRU, ``release_handle()``, pickles, processes.

Descriptors are counted in ``/proc/self/fd``; volumes are written with h5py, zarr-python and
NumPy and every value read is compared with that library's own read.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.collection.handles import HandlePool

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")

MANY = 2000


def _open_files_under(folder: Path) -> set[str]:
    """The files below ``folder`` this process holds a descriptor of."""
    found = set()
    prefix = str(folder)
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listing /proc itself, closed meanwhile
            continue
        if target.startswith(prefix):
            found.add(target)
    return found


@pytest.fixture(scope="module")
def many_h5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """2,000 tiny chunked HDF5 files; file ``i`` holds ``arange(8).reshape(2, 2, 2) + i``."""
    folder = tmp_path_factory.mktemp("many_h5")
    paths = []
    for i in range(MANY):
        path = folder / f"v{i:04d}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset(
                "vol", data=np.arange(8, dtype="int32").reshape(2, 2, 2) + i, chunks=(1, 2, 2)
            )
        paths.append(str(path))
    return folder, paths


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_2000_hdf5_volumes_never_hold_more_than_max_open(many_h5: tuple[Path, list[str]]) -> None:
    folder, paths = many_h5
    assert not _open_files_under(folder)
    vols = mixle.read_volumes(paths, dataset="vol", max_open=16)
    most = 0
    for i in range(MANY):
        with vols.lease(i) as src:
            got = src.read_box([0, 0, 0], [2, 2, 2])
            whole = src[...]
            most = max(most, len(_open_files_under(folder)))
        if i % 50 == 0:
            with h5py.File(paths[i], "r") as f:
                want = f["vol"][...]
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(whole, want)
        else:
            assert int(got[0, 0, 0]) == i
    assert 0 < most <= 16
    assert len(vols._pool.live()) == 16
    vols.close()
    assert not _open_files_under(folder)


def test_shapes_in_parallel_keep_the_bound(many_h5: tuple[Path, list[str]]) -> None:
    folder, paths = many_h5
    vols = mixle.read_volumes(paths[:300], dataset="vol", max_open=8)
    assert vols.shapes() == [(2, 2, 2)] * 300
    assert len(_open_files_under(folder)) <= 8
    vols.close()


def _zarr_volume(path: Path, value: int) -> np.ndarray:
    data = np.arange(64, dtype="int64").reshape(4, 4, 4) + value
    zarr.create_array(str(path), data=data, chunks=(2, 2, 2), overwrite=True)
    return np.asarray(zarr.open_array(str(path), mode="r")[...])


def test_eviction_reopens_with_correct_values_and_no_stale_chunk(tmp_path: Path) -> None:
    """A volume given back and rewritten reads its new chunks, never the cached old ones."""
    paths = [tmp_path / f"v{i}.zarr" for i in range(3)]
    for i, path in enumerate(paths):
        _zarr_volume(path, 100 * i)
    vols = mixle.read_volumes([str(p) for p in paths], max_open=1)
    with vols.lease(0) as src:
        before = src.read_box([0, 0, 0], [4, 4, 4])  # every chunk now in the cache
    assert mixle.chunk_cache().stats().entries > 0
    np.testing.assert_array_equal(before, np.arange(64).reshape(4, 4, 4))
    with vols.lease(1) as other:  # max_open=1: volume 0's handle is given back
        other.read_box([0, 0, 0], [2, 2, 2])
    assert vols._pool.live() == (1,)
    want = _zarr_volume(paths[0], 7000)  # rewritten in place, same chunk grid
    with vols.lease(0) as src:
        assert src is vols._sources[0]  # the same source object, reopened
        np.testing.assert_array_equal(src.read_box([0, 0, 0], [4, 4, 4]), want)
        np.testing.assert_array_equal(src[1:3, 0, :], want[1:3, 0, :])


def test_release_handle_drops_handle_and_chunks_then_reopens(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    _zarr_volume(path, 0)
    src = mixle.read_zarr(str(path))
    src.read_box([0, 0, 0], [4, 4, 4])
    reader = src._reader[1]
    cache = mixle.chunk_cache()
    assert any(key[0] == reader.token for key in list(cache._entries))
    src.release_handle()
    assert src._handle is None and src._reader is None and not src.closed
    assert not any(key[0] == reader.token for key in list(cache._entries))
    want = _zarr_volume(path, 5)
    np.testing.assert_array_equal(src.read_box([0, 0, 0], [4, 4, 4]), want)
    src.close()
    src.release_handle()  # a closed source is left as it is
    assert src.closed


def test_release_handle_closes_the_hdf5_file(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["vol"] = np.arange(12).reshape(3, 4)
    src = mixle.read_hdf5(path, "vol")
    np.testing.assert_array_equal(src[1], np.arange(4, 8))
    assert _open_files_under(tmp_path)
    src.release_handle()
    assert not _open_files_under(tmp_path)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(src[2], f["vol"][2])


def test_release_handle_waits_for_record_reads_in_flight(tmp_path: Path) -> None:
    """A record read in flight finishes on its handle; the last one releases it."""
    path = tmp_path / "t.csv"
    path.write_text("a\n1\n2\n3\n")
    table = mixle.read_csv(path)
    assert table[0]["a"] == 1
    handle = table._begin_read()  # a read in flight
    try:
        table.release_handle()
        assert table._handle is None and table._unreleased == [handle]
        assert table[2]["a"] == 3  # a new read reopens
        table.release_handle()
        assert len(table._unreleased) == 2
    finally:
        table._end_read()
    assert table._unreleased == []
    assert table[1]["a"] == 2
    table.close()


def test_user_source_without_a_path_keeps_its_handle() -> None:
    import io

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f["vol"] = np.arange(6)
    src = mixle.read_hdf5(buffer, "vol")
    src.release_handle()  # cannot reopen a file object: nothing is dropped
    np.testing.assert_array_equal(src[...], np.arange(6))


@pytest.fixture
def npy_volumes(tmp_path: Path) -> list[str]:
    paths = []
    for i in range(200):
        path = tmp_path / f"v{i:03d}.npy"
        np.save(path, np.full((3, 4, 5), i, dtype="int16"))
        paths.append(str(path))
    return paths


def test_pickle_size_does_not_grow_with_volumes_opened(npy_volumes: list[str]) -> None:
    vols = mixle.read_volumes(npy_volumes, max_open=8)
    vols.shape(0)
    one = len(pickle.dumps(vols))
    for i in range(len(vols)):
        with vols.lease(i) as src:
            src[0]
    vols.shapes()
    assert len(pickle.dumps(vols)) == one
    clone = pickle.loads(pickle.dumps(vols))
    assert clone._sources == [None] * 200  # nothing open in the copy
    assert clone.shapes() == [(3, 4, 5)] * 200  # cached: no volume opened for them
    assert clone._sources == [None] * 200
    assert clone.keys == vols.keys and clone.fingerprint() == vols.fingerprint()
    np.testing.assert_array_equal(clone[17][...], np.load(npy_volumes[17]))


def _sums_in_child(vols: mixle.VolumeCollection, indices: list[int]) -> list[int]:
    out = []
    for i in indices:
        with vols.lease(i) as src:
            out.append(int(src[...].sum()))
    return out


def _child_after_fork(vols: mixle.VolumeCollection, queue: multiprocessing.Queue) -> None:
    try:
        queue.put((_sums_in_child(vols, [0, 5, 199, 3]), len(vols._pool.live())))
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_reopens_after_fork(npy_volumes: list[str]) -> None:
    vols = mixle.read_volumes(npy_volumes, max_open=4)
    held = vols.lease(5)
    held.__enter__()  # a lease the parent holds across the fork
    for i in range(4):
        vols[i]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_after_fork, args=(vols, queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=60)
    held.__exit__(None, None, None)
    want = [int(np.load(npy_volumes[i]).sum()) for i in (0, 5, 199, 3)]
    assert result == (want, 4)
    assert _sums_in_child(vols, [0, 5]) == want[:2]  # the parent's collection still works


@pytest.mark.slow
def test_same_values_in_a_spawned_process(npy_volumes: list[str]) -> None:
    vols = mixle.read_volumes(npy_volumes, max_open=4)
    vols.shapes()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        got = pool.submit(_sums_in_child, vols, [0, 150, 42]).result(timeout=120)
    assert got == [int(np.load(npy_volumes[i]).sum()) for i in (0, 150, 42)]


def test_threads_hammering_leases(tmp_path: Path) -> None:
    paths = []
    for i in range(60):
        path = tmp_path / f"v{i:02d}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("vol", data=np.full((4, 4), i, dtype="int32"), chunks=(2, 2))
        paths.append(str(path))
    vols = mixle.read_volumes(paths, dataset="vol", max_open=5)
    threads, errors, most = 8, [], [0]
    barrier = threading.Barrier(threads)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        barrier.wait()
        try:
            for i in rng.integers(0, 60, 80).tolist():
                with vols.lease(i) as src:
                    box = src.read_box([1, 1], [2, 2])
                    most[0] = max(most[0], len(vols._pool.live()))
                    if not (box == i).all():
                        errors.append((i, box))
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert most[0] <= 5 + threads  # only leases held at once go past the bound
    assert len(vols._pool.live()) <= 5
    assert len(_open_files_under(tmp_path)) <= 5
    with h5py.File(paths[7], "r") as f:
        np.testing.assert_array_equal(vols[7][...], f["vol"][...])


# -- the pool against a model ----------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    max_open=st.integers(1, 4),
    ops=st.lists(
        st.tuples(st.sampled_from(["acquire", "release"]), st.integers(0, 6)), max_size=60
    ),
)
def test_pool_is_a_bounded_lru(max_open: int, ops: list[tuple[str, int]]) -> None:
    """Live volumes: never past the bound except by leases; given back least recent first."""
    released: list[int] = []
    pool = HandlePool(max_open, released.append)
    leases: dict[int, int] = {}
    order: list[int] = []  # model: live volumes, least recent first
    for op, i in ops:
        if op == "acquire":
            pool.acquire(i)
            leases[i] = leases.get(i, 0) + 1
            if i in order:
                order.remove(i)
            order.append(i)
        elif leases.get(i):
            pool.release(i)
            leases[i] -= 1
            if not leases[i]:
                del leases[i]
        else:
            continue
        expected_gone = []
        while len(order) > max_open:
            victims = [j for j in order if j not in leases]
            if not victims:
                break
            order.remove(victims[0])
            expected_gone.append(victims[0])
        assert released[len(released) - len(expected_gone) :] == expected_gone or not expected_gone
        assert list(pool.live()) == order
        assert len(order) <= max(max_open, len(leases))
        assert all(j in order for j in leases)  # a leased volume is never given back


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_fork_while_another_thread_holds_the_collections_locks(npy_volumes: list[str]) -> None:
    """Locks a parent thread held at the fork are not the child's: its leases never hang."""
    vols = mixle.read_volumes(npy_volumes, max_open=4)
    vols[0]
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with vols._lock, vols._locks[5 % len(vols._locks)], vols._pool._lock:
            held.set()
            done.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(60)
    try:
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_after_fork, args=(vols, queue))
        child.start()
        result = queue.get(timeout=60)  # only catches a hang
        child.join(timeout=60)
    finally:
        done.set()
        holder.join(60)
    want = [int(np.load(npy_volumes[i]).sum()) for i in (0, 5, 199, 3)]
    assert result == (want, 4)


def test_release_handle_racing_record_reads(tmp_path: Path) -> None:
    """Threads reading a CSV while another releases its handle: every row right, no leak."""
    pd = pytest.importorskip("pandas")
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": np.arange(500), "b": np.arange(500) * 2.5}).to_csv(path, index=False)
    want = pd.read_csv(path)
    table = mixle.read_csv(path)
    stop, errors = threading.Event(), []

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                rows = rng.integers(0, 500, 7)
                batch = table.get_batch(rows)
                if not (batch["a"] == want["a"].to_numpy()[rows]).all():
                    errors.append(rows)
        except BaseException as exc:
            errors.append(exc)

    def release() -> None:
        while not stop.is_set():
            table.release_handle()

    releaser = threading.Thread(target=release)
    readers = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    releaser.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=120)
    stop.set()
    releaser.join(timeout=60)
    assert not errors, errors[:3]
    assert table._unreleased == [] and table._readers == 0
    table.release_handle()
    assert not _open_files_under(tmp_path)  # every handle given back was closed
    table.close()


def test_a_source_handed_in_for_every_volume_keeps_its_handle_while_one_reads(tmp_path) -> None:
    # One mask source in every dict, max_open=1: giving back one volume dropped the handle
    # another volume was reading through ("Not an id of a file object").
    rng = np.random.default_rng(0)
    mask = (rng.random((24, 24, 24)) > 0.5).astype(np.uint8)
    with h5py.File(tmp_path / "mask.h5", "w") as f:
        f.create_dataset("m", data=mask, chunks=(8, 8, 8))
    shared = mixle.read_hdf5(str(tmp_path / "mask.h5"), "m")
    images = [rng.random((24, 24, 24)).astype(np.float32) for _ in range(6)]
    vols = mixle.read_volumes([{"image": im, "mask": shared} for im in images], max_open=1)
    sampler = mixle.PatchSampler(vols, 6, 64 * 60, seed=0)
    for b in range(60):
        batch = sampler.get_batch(np.arange(b * 64, (b + 1) * 64))
        for k in range(64):
            box = tuple(slice(c, c + 6) for c in batch["coords"][k].tolist())
            np.testing.assert_array_equal(batch["mask"][k], mask[box])
            np.testing.assert_array_equal(batch["image"][k], images[batch["volume"][k]][box])
    vols.close()
    assert not shared.closed  # handed in: released, never closed
    np.testing.assert_array_equal(shared[:2, :2, :2], mask[:2, :2, :2])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_sampler_over_2000_volumes_with_max_open_16_holds_at_most_16(
    many_h5: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18's bound, through the sampler: counted inside every read, on every thread."""
    from mixle.data.sampling import patch_layout

    folder, paths = many_h5
    vols = mixle.read_volumes(paths, dataset="vol", max_open=16)
    sampler = mixle.PatchSampler(vols, 2, 64 * 40, seed=4)
    seen: list[int] = []
    read = patch_layout.read_spatial_boxes

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = read(*args, **kwargs)
        # listing /proc/self/fd is not atomic: while another thread closes one volume and
        # opens the next, a listing may see both. Under the pool's lock no volume is being
        # given back or taken, so the listing is one moment's truth.
        with vols._pool._lock:
            seen.append(len(_open_files_under(folder)))
        return out

    monkeypatch.setattr(patch_layout, "read_spatial_boxes", counted)
    base = np.arange(8, dtype="int32").reshape(2, 2, 2)
    for b in range(40):
        batch = sampler.get_batch(np.arange(b * 64, (b + 1) * 64))
        np.testing.assert_array_equal(batch["patch"], base + batch["volume"][:, None, None, None])
    assert len(seen) > 1000 and max(seen) <= 16  # about 1,900 volumes read in all
    vols.close()
    assert not _open_files_under(folder)
