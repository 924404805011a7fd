"""Read plans: the cache keeps what the next batches read; the Loader says what that is.

Also decoding into the cache's own buffers (``lease``) and the per-stage seconds.
"""

from __future__ import annotations

import gc
import mmap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.loading.plan import BatchPlan
from mixle.reading import ChunkCache, chunk_cache, set_chunk_cache_bytes, set_decode_threads
from mixle.reading.cache import PAGE_BACKED_CHUNK_BYTES, PAGE_OFFSET

KIB = 1024


def _chunk(value: int, nbytes: int = 800) -> np.ndarray:
    return np.full(nbytes // 8, value, dtype=np.float64)


# -- the cache's policy -----------------------------------------------------------------
def test_planned_chunks_outlive_unplanned_ones_and_unplanned_ones_are_not_kept_for_them():
    cache = ChunkCache(budget=2400)  # three 800-byte chunks
    with cache.read_ahead() as plan:
        plan.update([["a"], ["b"]])  # the next batch reads a, the one after b
        cache.put("a", _chunk(1))
        cache.put("b", _chunk(2))
        cache.put("x", _chunk(3))  # unplanned, and there is room: kept
        cache.put("y", _chunk(4))  # unplanned: takes x's room, never a planned chunk's
        assert cache.get("a") is not None and cache.get("b") is not None
        assert cache.get("x") is None and cache.get("y") is not None
        plan.update([["a"], ["b"], ["c"]])
        kept = cache.put("c", _chunk(5))  # planned: evicts the unplanned y
        assert cache.get("y") is None and cache.get("c") is not None
        refused = cache.put("z", _chunk(6))  # unplanned, the cache is full of planned chunks
        assert cache.get("z") is None and cache.stats().skipped == 1
        assert not refused.flags.writeable and np.all(refused == 6)
        assert np.all(kept == 5)
    # the plan withdrawn: plain LRU again, the least recently used goes first
    cache.put("w", _chunk(7))
    assert len(cache) == 3 and cache.get("w") is not None


def test_a_chunk_needed_sooner_evicts_the_one_needed_last_but_not_the_reverse():
    cache = ChunkCache(budget=1600)  # two chunks
    plan = cache.read_ahead()
    plan.update([["near"], ["mid"], ["far"]])
    cache.put("mid", _chunk(1))
    cache.put("far", _chunk(2))
    cache.put("near", _chunk(3))  # needed first: evicts "far", needed last
    assert cache.get("far") is None and cache.get("mid") is not None
    assert cache.get("near") is not None
    plan.update([["a"], ["near"], ["mid"], ["late"]])
    cache.put("late", _chunk(4))  # needed after both kept chunks: not kept
    assert cache.get("late") is None and cache.get("mid") is not None
    plan.close()
    plan.update([["q"]])  # a closed plan plans nothing
    cache.put("q2", _chunk(5))
    assert cache.get("q2") is not None


def test_a_replaced_chunk_refused_for_a_plan_leaves_no_trace():
    cache = ChunkCache(budget=2400)
    with cache.read_ahead() as plan:
        plan.update([[(1, (0,)), (1, (1,))]])
        cache.put((1, (0,)), _chunk(1))
        cache.put((1, (1,)), _chunk(2))
        cache.put((2, (0,)), _chunk(3))  # unplanned, in the free room
        cache.put((2, (0,)), _chunk(4, 1600))  # replaced by a larger one: no room for it
        assert cache.get((2, (0,))) is None and len(cache) == 2
        assert 2 not in cache._by_token and cache.drop_token(2) == 0
        assert cache.stats().bytes == 1600


def test_plans_of_two_readers_combine_and_a_collected_plan_is_withdrawn():
    cache = ChunkCache(budget=1600)
    one, two = cache.read_ahead(), cache.read_ahead()
    one.update([["a"]])
    two.update([["b"]])
    cache.put("a", _chunk(1))
    cache.put("b", _chunk(2))
    cache.put("x", _chunk(3))  # both kept chunks are planned: x is not kept
    assert cache.get("x") is None
    del one, two
    gc.collect()
    cache.put("x", _chunk(3))  # no plan is left: LRU evicts a
    assert cache.get("x") is not None and cache.get("a") is None


def test_shrinking_the_budget_evicts_planned_chunks_too():
    cache = ChunkCache(budget=2400)
    plan = cache.read_ahead()
    plan.update([["a", "b", "c"]])
    for key in "abc":
        cache.put(key, _chunk(1))
    cache.budget = 800
    assert cache.stats().bytes <= 800 and len(cache) == 1
    plan.close()


def test_leased_buffers_hold_kept_chunks_without_a_copy_and_reuse_evicted_pages():
    size = PAGE_BACKED_CHUNK_BYTES * 2
    cache = ChunkCache(budget=2 * size)
    first = cache.lease("a", size)
    assert first is not None and first.flags.writeable and first.nbytes == size
    view = first.view(np.float32).reshape(-1, 16)
    view[...] = 1.5
    kept = cache.put("a", view)
    assert np.shares_memory(kept, first) and not kept.flags.writeable
    del first, view, kept
    second = cache.lease("b", size)
    cache.put("b", second)
    del second
    third = cache.lease("c", size)  # the cache is full: the LRU chunk's pages come back
    assert third is not None
    assert cache.get("a") is None and cache.get("b") is not None
    stats = cache.stats()
    assert stats.bytes + size <= stats.budget  # the lease counts against the budget
    cache.put("c", third)
    assert cache.stats().bytes == 2 * size
    assert cache.lease("huge", 4 * size) is None  # larger than the budget: decode elsewhere
    assert ChunkCache(budget=0).lease("a", size) is None


def test_page_backed_chunks_start_half_a_page_in():
    # a batch array's data starts a few bytes past a page boundary: a chunk starting on one
    # would copy into it at the same offset within a page (4K aliasing, ~3x slower copies)
    size = PAGE_BACKED_CHUNK_BYTES
    cache = ChunkCache(budget=4 * size)
    leased = cache.lease("a", size)
    assert leased is not None and leased.ctypes.data % mmap.PAGESIZE == PAGE_OFFSET
    kept = cache.put("b", np.ones(size // 8))  # copied into pages of its own
    assert kept.ctypes.data % mmap.PAGESIZE == PAGE_OFFSET and kept.sum() == size // 8
    cache.put("a", leased)
    del leased, kept
    cache.clear(keep_pages=True)  # both pages spare, then reused at the same offset
    again = cache.lease("c", size)
    assert again is not None and again.ctypes.data % mmap.PAGESIZE == PAGE_OFFSET
    assert cache.spare_bytes == size  # the other spare chunk's pages; counted by chunk size


def test_a_borrowed_chunk_is_copied_when_kept_and_returned_as_is_when_not():
    scratch = np.arange(PAGE_BACKED_CHUNK_BYTES // 4, dtype=np.float32)
    for budget in (1 << 20, 0):
        cache = ChunkCache(budget=budget)
        kept = cache.put("a", scratch, borrowed=True)
        scratch[:] = -1  # the caller reuses its buffer
        if budget:
            assert not np.shares_memory(kept, scratch)
            assert np.array_equal(cache.get("a"), np.arange(scratch.size, dtype=np.float32))
        else:
            assert kept is scratch
        scratch = np.arange(PAGE_BACKED_CHUNK_BYTES // 4, dtype=np.float32)
    small = np.arange(10, dtype=np.float32)
    cache = ChunkCache(page_backed=False)
    kept = cache.put("s", small, borrowed=True)
    small[:] = 0
    assert np.array_equal(cache.get("s"), np.arange(10, dtype=np.float32))


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["put", "lease_put", "lease_drop", "get", "plan", "budget", "drop", "clear"]
        ),
        st.integers(0, 11),
        st.integers(1, 4),
    ),
    max_size=60,
)


def _check_books(cache: ChunkCache) -> None:
    """Every counter of the cache against what it holds (white-box)."""
    entries = cache._entries
    assert cache._bytes == sum(c.nbytes for c in entries.values())
    assert cache._lru_bytes == sum(entries[k].nbytes for k in cache._lru)
    for key in entries:  # every kept chunk is evictable: LRU, or filed under its distance
        planned = cache._next.get(key)
        assert (key in cache._lru) != (planned is not None)
        assert planned is None or key in cache._planned[planned]
    for distance, keys in cache._planned.items():
        assert keys and all(cache._next[k] == distance for k in keys)
        assert cache._planned_bytes[distance] == sum(entries[k].nbytes for k in keys)
    assert cache._spare_bytes == sum(p.size for pages in cache._spare.values() for p in pages)
    assert cache._reserved >= 0
    for token, keys in cache._by_token.items():
        assert all(k in entries and k[0] == token for k in keys)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_kept_spare_and_leased_bytes_stay_within_the_budget(ops):
    unit = PAGE_BACKED_CHUNK_BYTES
    cache = ChunkCache(budget=6 * unit)
    plan = cache.read_ahead()
    held = []
    for op, k, n in ops:
        key = (k % 3, (k,))  # (token, coords): three tokens
        if op == "put":
            cache.put(key, np.full(n * unit // 8, k, dtype=np.float64))
        elif op in ("lease_put", "lease_drop"):
            buffer = cache.lease(key, n * unit)
            if buffer is not None:
                buffer[...] = k
                if op == "lease_put":
                    cache.put(key, buffer)
                else:
                    held.append(buffer)  # decoded into, then dropped unput later
        elif op == "get":
            found = cache.get(key)
            if found is not None:
                assert np.all(found.view(np.uint8) == k) or np.all(found == k)
        elif op == "plan":
            plan.update([[(j % 3, (j,))] for j in range(k, k + n)])
        elif op == "budget":
            cache.budget = n * 2 * unit
            held.clear()
        elif op == "drop":
            cache.drop_token(k % 3)
        else:
            cache.clear()
        if len(held) > 2:
            held.pop(0)
        _check_books(cache)
        stats = cache.stats()
        leased = sum(b.nbytes for b in held)
        assert stats.bytes + cache.spare_bytes + leased <= max(stats.budget, leased)
    held.clear()
    plan.close()
    _check_books(cache)
    assert not cache._next and not cache._planned
    stats = cache.stats()
    assert stats.bytes + cache.spare_bytes <= stats.budget


# -- the Loader plans the cache -----------------------------------------------------------
@pytest.fixture
def volume(tmp_path: Path) -> tuple[str, np.ndarray]:
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(0)
    data = rng.standard_normal((128, 128, 128)).astype("f4")
    path = str(tmp_path / "v.zarr")
    arr = zarr.create_array(path, shape=data.shape, chunks=(16, 16, 16), dtype="f4")
    arr[...] = data
    return path, np.asarray(zarr.open_array(path, mode="r")[...])


@pytest.fixture
def small_cache():
    """A cache of 32 16^3 float32 chunks: smaller than a pass of the volume's patches."""
    set_chunk_cache_bytes(32 * 16**3 * 4)
    try:
        yield chunk_cache()
    finally:
        set_chunk_cache_bytes(None)
        set_decode_threads(None)


def _distinct_chunks(corners: np.ndarray, size: int, chunk: int) -> int:
    first, last = corners // chunk, (corners + size - 1) // chunk
    seen = set()
    for f, lo in zip(first.tolist(), last.tolist()):
        for z in range(f[0], lo[0] + 1):
            for y in range(f[1], lo[1] + 1):
                for x in range(f[2], lo[2] + 1):
                    seen.add((z, y, x))
    return len(seen)


@pytest.mark.parametrize("threads", [0, 2])
def test_the_loader_decodes_each_chunk_of_a_pass_once_where_lru_decodes_more(
    volume, small_cache, threads
):
    path, data = volume
    src = mixle.read_zarr(path)
    sampler = mixle.PatchSampler(src, 12, 60, seed=3)
    corners = sampler.coords_array()
    distinct = _distinct_chunks(corners, 12, 16)
    assert distinct > 32  # the pass does not fit the cache (but every batch does)
    small_cache.clear()
    for b in range(0, 60, 6):  # plain get_batch: LRU, no plan
        sampler.get_batch(np.arange(b, b + 6))
    lru = small_cache.stats().decodes
    assert lru == small_cache.stats().misses  # one thread: every miss is decoded
    small_cache.clear()
    loader = mixle.Loader(
        sampler, batch_size=6, shuffle=False, num_epochs=1, num_threads=threads, prefetch=2
    )
    batches = list(loader)
    planned = small_cache.stats().decodes
    if threads:  # a chunk may be evicted before a batch in flight asks for it
        assert distinct <= planned <= distinct * 1.05 and planned < lru
    else:
        assert planned == distinct < lru
    for patches, coords in batches:  # and the values are zarr's
        for patch, (z, y, x) in zip(patches, coords.tolist()):
            np.testing.assert_array_equal(patch, data[z : z + 12, y : y + 12, x : x + 12])
    assert not small_cache._plans  # the run's plan is withdrawn when it ends


def test_a_loader_stopped_early_withdraws_its_plan(volume, small_cache):
    path, _ = volume
    sampler = mixle.PatchSampler(mixle.read_zarr(path), 12, 60, seed=1)
    loader = mixle.Loader(sampler, batch_size=6, shuffle=False, num_threads=0)
    run = iter(loader)
    next(run)
    assert small_cache._plans
    run.close()
    assert not small_cache._plans


def test_chunk_keys_name_what_a_batch_reads(volume, tmp_path):
    path, _ = volume
    src = mixle.read_zarr(path)
    cache = chunk_cache()
    cache.clear()
    keys = src.chunk_keys([0, 17, 127])
    src.get_batch([0, 17, 127])
    assert keys and all(cache.get(k) is not None for k in keys)
    assert len(keys) == 3 * 64  # three chunk rows of 8x8 chunks
    sampler = mixle.PatchSampler(src, 12, 10, seed=0, padding="constant")
    keys = sampler.chunk_keys(np.arange(4))
    assert len(set(keys)) == len(keys)
    grid = mixle.GridSampler(src, 24, overlap=4)
    cache.clear()
    keys = grid.chunk_keys([0, 5, 9])
    grid.get_batch([0, 5, 9])
    assert keys and sorted(keys) == sorted(cache._entries)  # exactly what the batch read
    raw = tmp_path / "v.raw"
    np.zeros((4, 4), np.float32).tofile(raw)
    assert mixle.read_memmap(raw, "float32", (4, 4)).chunk_keys([0]) == []  # no cache reads


def test_stats_split_the_time_into_reading_decoding_and_scattering(volume):
    path, _ = volume
    cache = chunk_cache()
    cache.clear()
    mixle.read_zarr(path).read_boxes([[0, 0, 0], [40, 40, 40]], (20, 20, 20))
    stats = cache.stats()
    assert stats.read_seconds > 0 and stats.decode_seconds > 0 and stats.scatter_seconds > 0
    cache.clear()
    stats = cache.stats()
    assert stats.read_seconds == stats.decode_seconds == stats.scatter_seconds == 0


class _SlowReader:
    """A chunk reader that counts its decodes and takes a while over each."""

    chunks = (4, 4)

    def __init__(self) -> None:
        self.token = mixle.reading.new_token()
        self.calls: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        with self._lock:
            self.calls.append(coords)
        time.sleep(0.01)
        return np.full((4, 4), coords[0] * 10 + coords[1], dtype=np.float32)


def test_threads_reading_batches_that_share_chunks_decode_each_chunk_once():
    reader = _SlowReader()
    cache = ChunkCache()
    starts = [[0, 0], [4, 4], [2, 2]]  # 4 distinct chunks, shared between the boxes
    outs = [np.empty((3, 4, 4), np.float32) for _ in range(4)]
    set_decode_threads(2)
    try:
        threads = [
            threading.Thread(
                target=mixle.reading.read_chunked,
                args=(reader, starts, (4, 4), (8, 8), out),
                kwargs={"cache": cache},
            )
            for out in outs
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        set_decode_threads(None)
    assert sorted(reader.calls) == sorted(set(reader.calls)) and len(reader.calls) == 4
    expected = np.full((8, 8), 0, np.float32)
    for cz in range(2):
        for cx in range(2):
            expected[cz * 4 : cz * 4 + 4, cx * 4 : cx * 4 + 4] = cz * 10 + cx
    for out in outs:
        for b, (z, x) in enumerate(starts):
            np.testing.assert_array_equal(out[b], expected[z : z + 4, x : x + 4])
    assert cache.stats().decodes == 4


def test_a_claim_makes_its_event_only_when_another_thread_waits():
    cache = ChunkCache()
    assert cache.claim("a") is None  # this thread loads "a"; nobody waits yet
    waiting = cache.claim("a")
    assert isinstance(waiting, threading.Event) and not waiting.is_set()
    assert cache.claim("a") is waiting  # every later waiter waits on the same event
    done = threading.Event()
    waiter = threading.Thread(target=lambda: done.set() if waiting.wait(10) else None)
    waiter.start()
    cache.put("a", _chunk(1))
    cache.unclaim("a")
    waiter.join()
    assert waiting.is_set() and done.is_set()
    assert cache.claim("a") is not None and not isinstance(cache.claim("a"), threading.Event)
    assert cache.claim("b") is None  # a load nobody waited for ends without an event
    cache.unclaim("b")
    assert cache.claim("b") is None  # not kept, so claimed again
    cache.unclaim("b")


def test_a_claim_never_released_delays_a_read_but_never_hangs_it(monkeypatch):
    """A thread interrupted between claiming a chunk and decoding it never says it is done."""
    monkeypatch.setattr(mixle.reading.executor, "CLAIM_WAIT_S", 0.05)
    reader = _SlowReader()
    cache = ChunkCache()
    assert cache.claim((reader.token, (0, 0))) is None  # claimed, and abandoned
    out = np.empty((1, 4, 4), np.float32)
    mixle.reading.read_chunked(reader, [[0, 0]], (4, 4), (8, 8), out, cache=cache)
    np.testing.assert_array_equal(out[0], np.zeros((4, 4), np.float32))
    assert reader.calls == [(0, 0)]


def test_a_plan_not_updated_for_a_while_stops_holding_the_cache(monkeypatch):
    now = [1000.0]  # the cache's clock, moved by hand (no sleeping, no timing)

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(mixle.reading.cache, "time", Clock)
    cache = ChunkCache(budget=1600)
    plan = cache.read_ahead()
    plan.update([["a", "b"]])
    cache.put("a", _chunk(1))
    cache.put("b", _chunk(2))
    now[0] += mixle.reading.cache.PLAN_LAPSE_S * 0.9
    cache.put("x", _chunk(3))  # the plan is fresh: x is not kept at a planned chunk's cost
    assert cache.get("x") is None
    now[0] += mixle.reading.cache.PLAN_LAPSE_S * 0.2  # the reader paused: its plan lapses
    cache.put("x", _chunk(3))
    assert cache.get("x") is not None and not cache._plans
    plan.update([["a"]])  # it reads again: planned again
    assert cache._plans


def _volume_sampler(path: str, **options) -> mixle.PatchSampler:
    return mixle.PatchSampler(mixle.read_zarr(path), 12, 60, seed=3, **options)


def test_a_planned_run_reads_the_batches_of_an_unplanned_one(volume, small_cache):
    path, _ = volume
    sampler = _volume_sampler(path)
    plain = [sampler.get_batch(np.arange(b, b + 6)) for b in range(0, 60, 6)]
    for threads in (0, 3):
        small_cache.clear()
        loader = mixle.Loader(sampler, batch_size=6, shuffle=False, num_threads=threads)
        for (patches, coords), (want, where) in zip(loader, plain):
            np.testing.assert_array_equal(patches, want)
            np.testing.assert_array_equal(coords, where)
        assert not small_cache._plans


class _Failing(mixle.Source):
    """A sampler whose third batch raises, and whose keys cannot be hashed."""

    def __init__(self, sampler: mixle.PatchSampler, keys: str = "good") -> None:
        self._sampler, self._keys = sampler, keys
        self.batches = 0

    def __len__(self) -> int:
        return len(self._sampler)

    def element_spec(self):
        return self._sampler.element_spec()

    def get_batch(self, indices):
        self.batches += 1
        if self.batches == 3:
            raise RuntimeError("the third batch fails")
        return self._sampler.get_batch(indices)

    def chunk_keys(self, indices):
        if self._keys == "unhashable":
            return [[1, 2]]
        return self._sampler.chunk_keys(indices)


def test_a_run_that_fails_or_breaks_withdraws_its_plan_and_fails_where_it_did(volume, small_cache):
    path, _ = volume
    failing = _Failing(_volume_sampler(path))
    loader = mixle.Loader(failing, batch_size=6, shuffle=False, num_threads=0)
    got = []

    def read_all() -> None:
        for batch in loader:
            got.append(batch)

    with pytest.raises(RuntimeError, match="third batch"):
        read_all()
    assert len(got) == 2 and not small_cache._plans  # the same batches as without a plan
    for _ in mixle.Loader(_volume_sampler(path), batch_size=6, num_threads=2):
        break
    assert not small_cache._plans
    odd = _Failing(_volume_sampler(path), keys="unhashable")
    odd.batches = -100  # never fails
    assert len(list(mixle.Loader(odd, batch_size=6, num_epochs=1, num_threads=0))) == 10


def test_an_error_in_the_plans_comes_after_the_batches_before_it():
    from mixle.loading.read_ahead import ReadAheadPlans

    def plans():
        for k in range(3):
            yield BatchPlan(0, k, np.array([k]), None)
        raise ValueError("no fourth plan")

    ahead = ReadAheadPlans(plans(), lambda idx: [("t", int(idx[0]))], ChunkCache())
    seen = []

    def read_all() -> None:
        for plan in ahead:
            ahead.starting(plan)
            seen.append(plan.batch)

    with pytest.raises(ValueError, match="fourth"):
        read_all()
    assert seen == [0, 1, 2]
    ahead.close()


def test_worker_processes_read_without_a_plan(volume, small_cache, monkeypatch):
    made = []
    real = mixle.loading.loader.ReadAheadPlans
    monkeypatch.setattr(
        mixle.loading.loader, "ReadAheadPlans", lambda *a, **k: made.append(1) or real(*a, **k)
    )
    path, _ = volume
    loader = mixle.Loader(_volume_sampler(path), batch_size=6, num_epochs=1, num_workers=2)
    assert len(list(loader)) == 10 and not made
    assert len(list(mixle.Loader(_volume_sampler(path), batch_size=6, num_epochs=1))) == 10
    assert made == [1]


@pytest.fixture(scope="module")
def keyed_stores(tmp_path_factory) -> dict[str, object]:
    """Sources of several layouts (with channels, a coarser label array, CF decoding)."""
    zarr = pytest.importorskip("zarr")
    h5py = pytest.importorskip("h5py")
    tmp = tmp_path_factory.mktemp("keys")
    rng = np.random.default_rng(0)
    data = rng.standard_normal((40, 36, 30)).astype("f4")

    def written(name, values, chunks, **options):
        path = str(tmp / name)
        zarr.create_array(path, shape=values.shape, chunks=chunks, dtype=values.dtype, **options)[
            ...
        ] = values
        return path

    plain = written("v.zarr", data, (8, 8, 8))
    channels = written("c.zarr", rng.standard_normal((3, 40, 36, 30)).astype("f4"), (2, 8, 8, 8))
    labels = written("l.zarr", (rng.random((20, 18, 15)) * 3).astype("u1"), (4, 4, 4))
    cf = written(
        "cf.zarr",
        (data * 100).astype("i2"),
        (8, 8, 8),
        attributes={"scale_factor": 0.5, "add_offset": 1.0, "_FillValue": -999},
    )
    h5 = tmp / "v.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("c", data=data, chunks=(8, 8, 8), compression="gzip", shuffle=True)
        f.create_dataset("cf", data=(data * 100).astype("i2"), chunks=(8, 8, 8)).attrs[
            "scale_factor"
        ] = 0.5
    return {"plain": plain, "channels": channels, "labels": labels, "cf": cf, "h5": h5}


KEYED = {
    "zarr rows": lambda s: (mixle.read_zarr(s["plain"]), [0, 9, 39, -1]),
    **{
        f"patches, padding={pad}": (
            lambda s, pad=pad: (
                mixle.PatchSampler(mixle.read_zarr(s["plain"]), 12, 50, seed=1, padding=pad),
                np.arange(50),
            )
        )
        for pad in ("none", "constant", "edge", "reflect")
    },
    "grid": lambda s: (mixle.GridSampler(mixle.read_zarr(s["plain"]), 12, overlap=2), None),
    "grid, reflect": lambda s: (
        mixle.GridSampler(mixle.read_zarr(s["plain"]), 16, padding="reflect"),
        None,
    ),
    "patches with channels": lambda s: (
        mixle.PatchSampler(mixle.read_zarr(s["channels"]), (12, 12, 12), 40, seed=2),
        np.arange(40),
    ),
    "a dict with a 2x coarser array": lambda s: (
        mixle.PatchSampler(
            {"img": mixle.read_zarr(s["plain"]), "lab": mixle.read_zarr(s["labels"])},
            12,
            40,
            seed=3,
            padding="constant",
        ),
        np.arange(40),
    ),
    "CF-decoded zarr": lambda s: (
        mixle.PatchSampler(mixle.read_zarr(s["cf"], mask_and_scale=True), 12, 30, seed=4),
        np.arange(30),
    ),
    "HDF5 rows": lambda s: (mixle.read_hdf5(s["h5"], "c"), [0, 17, 39]),
    "HDF5 patches, reflect": lambda s: (
        mixle.PatchSampler(mixle.read_hdf5(s["h5"], "c"), 12, 30, seed=5, padding="reflect"),
        np.arange(30),
    ),
    "CF-decoded HDF5": lambda s: (mixle.read_hdf5(s["h5"], "cf", mask_and_scale=True), [0, 17]),
}


@pytest.mark.parametrize("case", list(KEYED))
def test_chunk_keys_are_exactly_what_a_batch_reads(keyed_stores, case):
    set_chunk_cache_bytes(1 << 30)
    try:
        source, indices = KEYED[case](keyed_stores)
        indices = np.arange(len(source)) if indices is None else indices
        cache = chunk_cache()
        cache.clear()
        keys = source.chunk_keys(indices)
        source.get_batch(indices)
        assert keys and len(set(keys)) == len(keys)
        assert set(keys) == set(cache._entries)  # white-box: every chunk the batch read
    finally:
        set_chunk_cache_bytes(None)


def test_a_source_read_without_the_cache_is_asked_for_keys_once(tmp_path, small_cache):
    raw = tmp_path / "v.raw"
    np.arange(32**3, dtype=np.float32).tofile(raw)
    sampler = mixle.PatchSampler(mixle.read_memmap(raw, "float32", (32, 32, 32)), 8, 40, seed=0)
    asked = []

    class Counted(_Failing):
        def chunk_keys(self, indices):
            asked.append(len(indices))
            return super().chunk_keys(indices)

    counted = Counted(sampler)
    counted.batches = -100  # never fails
    batches = list(mixle.Loader(counted, batch_size=4, num_epochs=1, num_threads=0))
    assert len(batches) == 10 and asked == [4]  # a memory map: no keys, no more asking
    assert not small_cache._plans
