"""The decoded-chunk cache and the decode pool: budgets, eviction, counters, threads."""

from __future__ import annotations

import mmap
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import mixle
from mixle.reading import (
    DEFAULT_CHUNK_CACHE_BYTES,
    ChunkCache,
    chunk_cache,
    decode_threads,
    default_decode_threads,
    set_chunk_cache_bytes,
    set_decode_threads,
)
from mixle.reading.pool import run_all


def _chunk(value: int, nbytes: int = 800) -> np.ndarray:
    return np.full(nbytes // 8, value, dtype=np.float64)


def test_budget_is_respected_and_least_recently_used_goes_first():
    cache = ChunkCache(budget=2400)  # three 800-byte chunks
    for k in range(3):
        cache.put(k, _chunk(k))
    assert cache.get(0) is not None  # 0 is now the most recently used
    cache.put(3, _chunk(3))  # evicts 1, the least recently used
    assert cache.get(1) is None
    assert [k for k in (0, 2, 3) if cache.get(k) is not None] == [0, 2, 3]
    stats = cache.stats()
    assert stats.bytes == 2400 <= stats.budget
    assert stats.entries == 3 and stats.evictions == 1
    assert (stats.hits, stats.misses) == (4, 1)
    assert stats.hit_rate == pytest.approx(0.8)


def test_cached_chunks_are_read_only_and_values_survive():
    cache = ChunkCache()
    kept = cache.put("a", _chunk(7))
    with pytest.raises(ValueError, match="read-only"):
        kept[0] = 1.0
    np.testing.assert_array_equal(cache.get("a"), _chunk(7))


def test_zero_budget_disables_and_oversized_chunks_are_not_kept():
    off = ChunkCache(budget=0)
    off.put("a", _chunk(1))
    assert off.get("a") is None and len(off) == 0
    small = ChunkCache(budget=100)
    np.testing.assert_array_equal(small.put("big", _chunk(2)), _chunk(2))
    assert len(small) == 0


def test_get_or_load_loads_once_then_hits():
    cache, loads = ChunkCache(), []

    def load():
        loads.append(1)
        return _chunk(5)

    for _ in range(3):
        np.testing.assert_array_equal(cache.get_or_load("k", load), _chunk(5))
    assert len(loads) == 1 and cache.stats().hits == 2


def test_shrinking_the_budget_evicts_at_once_and_clear_resets():
    cache = ChunkCache(budget=8000)
    for k in range(10):
        cache.put(k, _chunk(k))
    cache.budget = 1600
    assert cache.stats().bytes <= 1600 and cache.stats().entries == 2
    cache.clear()
    assert cache.stats() == type(cache.stats())(0, 0, 0, 0, 0, 1600)
    assert "0 chunks" in repr(cache)


def test_replacing_a_key_keeps_the_byte_count_right():
    cache = ChunkCache(budget=10_000)
    cache.put("a", _chunk(1))
    cache.put("a", _chunk(2, nbytes=1600))
    assert cache.stats().bytes == 1600 and len(cache) == 1


@pytest.mark.parametrize(
    ("bad", "error"), [(-1, ValueError), ("64MB", TypeError), (1.5, TypeError)]
)
def test_bad_budgets_name_the_argument(bad, error):
    with pytest.raises(error, match="budget"):
        ChunkCache(bad)
    with pytest.raises(error, match="budget"):
        set_chunk_cache_bytes(bad)


def test_process_cache_counts_hits_for_repeated_batches(stores):
    src = mixle.read_zarr(stores.path("v3.zarr"))
    old = chunk_cache().budget
    try:
        set_chunk_cache_bytes(DEFAULT_CHUNK_CACHE_BYTES)
        chunk_cache().clear()
        starts = [[0, 0, 0], [10, 21, 5]]
        first = src.read_boxes(starts, (8, 10, 7))
        misses = chunk_cache().stats().misses
        assert misses == 1 + 8 and chunk_cache().stats().hits == 0  # aligned box + straddler
        np.testing.assert_array_equal(src.read_boxes(starts, (8, 10, 7)), first)
        assert chunk_cache().stats().hits == misses
        set_chunk_cache_bytes(0)
        assert chunk_cache().stats().entries == 0
        np.testing.assert_array_equal(src.read_boxes(starts, (8, 10, 7)), first)
        assert chunk_cache().stats().entries == 0
    finally:
        set_chunk_cache_bytes(old)


def test_concurrent_cache_use_keeps_accounting_exact():
    cache = ChunkCache(budget=50 * 800)

    def work(offset):
        for k in range(500):
            key = (offset + k) % 120
            cache.get_or_load(key, lambda key=key: _chunk(key))

    threads = [threading.Thread(target=work, args=(7 * i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stats = cache.stats()
    assert stats.bytes == 800 * stats.entries <= stats.budget
    assert stats.hits + stats.misses == 8 * 500


def test_decode_threads_settable_and_validated():
    assert decode_threads() == default_decode_threads() >= 1
    try:
        set_decode_threads(1)
        assert decode_threads() == 1
        order: list[int] = []
        run_all([lambda i=i: order.append(i) for i in range(5)])
        assert order == [0, 1, 2, 3, 4]  # one thread: everything inline, in order
        set_decode_threads(3)
        assert decode_threads() == 3
    finally:
        set_decode_threads(None)
    with pytest.raises(ValueError, match="threads=0"):
        set_decode_threads(0)
    with pytest.raises(TypeError, match="threads"):
        set_decode_threads(2.0)  # type: ignore[arg-type]


def test_run_all_waits_for_every_task_then_raises_the_first_error():
    done: list[int] = []
    barrier = threading.Event()

    def slow():
        barrier.wait(timeout=30)
        done.append(1)

    def boom():
        barrier.set()
        raise KeyError("bad chunk")

    with pytest.raises(KeyError, match="bad chunk"):
        run_all([boom, slow, slow])
    assert done == [1, 1]  # no task still running when the error reaches the caller


def test_nested_runs_inside_the_pool_do_not_deadlock():
    results: list[int] = []
    lock = threading.Lock()

    def inner(i):
        with lock:
            results.append(i)

    def outer(k):
        return lambda: run_all([lambda i=i: inner(10 * k + i) for i in range(4)])

    run_all([outer(k) for k in range(2 * default_decode_threads() + 1)])
    assert sorted(results) == sorted(10 * k + i for k in range(2 * default_decode_threads() + 1)
                                     for i in range(4))  # fmt: skip


STUCK = textwrap.dedent(
    """
    import signal, sys, threading
    from mixle.reading import set_decode_threads
    from mixle.reading.pool import run_all
    signal.signal(signal.SIGINT, signal.default_int_handler)
    set_decode_threads(3)
    started = threading.Semaphore(0)
    never = threading.Event()

    def stuck():  # a decode thread stuck in a read that never returns
        started.release()
        never.wait()

    def caller():
        for _ in range(2):
            started.acquire()
        if sys.argv[1] == "raise":
            raise KeyboardInterrupt
        print("ready", flush=True)
        never.wait()  # the caller's own task is stuck too: Ctrl-C arrives here

    try:
        run_all([caller, stuck, stuck, stuck])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        if sys.argv[1] == "sigint":
            raise
    """
)


@pytest.mark.parametrize("how", ["sigint", "raise"])
def test_ctrl_c_leaves_run_all_at_once_and_stuck_threads_do_not_block_exit(how):
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        if how == "sigint":
            assert child.stdout.readline() == "ready\n"
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=5)
    finally:
        child.kill()
        child.wait()
    assert "interrupted" in out, err
    assert child.returncode == (0 if how == "raise" else -signal.SIGINT), err


def test_run_all_cancels_tasks_not_started_when_interrupted():
    ran: list[int] = []
    try:
        set_decode_threads(2)
        release = threading.Event()

        def blocker():
            release.wait(timeout=10)

        def caller():
            raise KeyboardInterrupt

        def slow_append(i):
            ran.append(i)
            time.sleep(0.05)

        with pytest.raises(KeyboardInterrupt):
            run_all([caller, blocker, *[lambda i=i: slow_append(i) for i in range(20)]])
        release.set()
        run_all([lambda: None, lambda: None])  # the pool still works afterwards
    finally:
        set_decode_threads(None)
    assert len(ran) < 20  # the one free thread got to at most a few before the cancel


def test_large_chunks_are_kept_in_pages_of_their_own_and_reused_only_when_unseen():
    cache = ChunkCache(budget=3 * 2**20)
    chunk = np.arange(2**18, dtype=np.float32)  # 1 MiB
    kept = cache.put(("t", (0,)), chunk)
    assert kept is not chunk and kept.base is not None and not kept.flags.writeable
    np.testing.assert_array_equal(kept, chunk)
    assert chunk.flags.writeable  # the caller's array is left alone when it is copied
    small = cache.put(("t", (1,)), np.ones(100))
    assert small.base is None and not small.flags.writeable  # small ones are kept as given
    held = kept[10:20]  # a view of a chunk that is about to be evicted
    for k in range(2, 12):
        cache.put(("t", (k,)), np.full(2**18, k, dtype=np.float32))
        np.testing.assert_array_equal(held, np.arange(10, 20, dtype=np.float32))
    del held, kept
    for k in range(12, 30):  # unseen evicted pages are reused: every value stays right
        got = cache.put(("t", (k,)), np.full(2**18, k, dtype=np.float32))
        assert (got == k).all()
        np.testing.assert_array_equal(cache.get(("t", (k,))), got)
    stats = cache.stats()
    assert stats.bytes <= stats.budget and stats.entries == 3


def test_drop_token_drops_one_handles_chunks_only():
    cache = ChunkCache()
    for token in (1, 2):
        for k in range(3):
            cache.put((token, (k,)), _chunk(k))
    cache.put("other", _chunk(9))
    assert cache.drop_token(1) == 3
    assert cache.drop_token(1) == 0
    assert len(cache) == 4 and cache.stats().bytes == 4 * 800
    assert cache.get((2, (0,))) is not None and cache.get((1, (0,))) is None


class _WorkerInfo:
    num_workers = 4


def test_the_default_budget_is_shared_among_dataloader_workers(monkeypatch):
    from types import ModuleType

    from mixle.reading import MIN_WORKER_CHUNK_CACHE_BYTES, default_chunk_cache_bytes

    old = chunk_cache().budget
    try:
        set_chunk_cache_bytes(None)
        assert chunk_cache().budget == default_chunk_cache_bytes() == DEFAULT_CHUNK_CACHE_BYTES
        worker = ModuleType("torch.utils.data._utils.worker")
        worker._worker_info = _WorkerInfo()  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch.utils.data._utils.worker", worker)
        assert chunk_cache().budget == DEFAULT_CHUNK_CACHE_BYTES // 4
        _WorkerInfo.num_workers = 64
        assert chunk_cache().budget == MIN_WORKER_CHUNK_CACHE_BYTES
        set_chunk_cache_bytes(3 * 2**20)  # a budget the user sets is kept in workers too
        assert chunk_cache().budget == 3 * 2**20
    finally:
        _WorkerInfo.num_workers = 4
        monkeypatch.undo()
        set_chunk_cache_bytes(old)


ABANDON = textwrap.dedent(
    """
    import os, signal, threading, time
    import numpy as np
    from mixle.reading import read_chunked, set_chunk_cache_bytes, set_decode_threads
    signal.signal(signal.SIGINT, signal.default_int_handler)
    set_decode_threads(3)
    set_chunk_cache_bytes(0)
    reads = []

    class Slow:  # a chunk reader that takes 50 ms a chunk
        chunks, token = (1, 8), 0
        def read_chunk(self, coords):
            reads.append(coords)
            time.sleep(0.05)
            return np.zeros((1, 8))

    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    out = np.empty((1, 400, 8))
    try:
        read_chunked(Slow(), [[0, 0]], (400, 8), (400, 8), out)
    except KeyboardInterrupt:
        at_interrupt = len(reads)
        time.sleep(1.0)
        print(at_interrupt, len(reads))
    """
)


def test_an_interrupted_batch_read_takes_no_further_chunks():
    run = subprocess.run(
        [sys.executable, "-c", ABANDON], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    at_interrupt, after = map(int, run.stdout.split())
    assert at_interrupt < 400
    assert after - at_interrupt <= 3  # at most the chunk each pool thread was reading


class _Buffer(bytearray):
    """Bytes that can be weakly referenced (a chunk whose death can be watched)."""


def test_a_chunk_reader_collected_inside_the_cache_lock_does_not_deadlock():
    import weakref

    cache = ChunkCache(budget=800)
    cache.put((7, (0,)), _chunk(1))  # a chunk of a "dead reader" with token 7
    buffer = _Buffer(800)
    weakref.finalize(buffer, cache.drop_token, 7)  # dies inside put's eviction, under the lock
    cache.put((1, (0,)), np.frombuffer(buffer, dtype=np.float64))
    del buffer
    worker = threading.Thread(target=cache.put, args=((2, (0,)), _chunk(2)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert len(cache) == 1 and cache.get((2, (0,))) is not None


def test_page_backed_false_keeps_the_decoders_array_without_a_copy() -> None:
    chunk = np.arange(64 * 1024, dtype="f4")  # 256 KiB: page-backed by default
    kept = ChunkCache(1 << 30, page_backed=False).put((1, (0,)), chunk)
    assert kept is chunk and not kept.flags.writeable
    paged = ChunkCache(1 << 30).put((1, (0,)), chunk.copy())
    assert isinstance(paged.base.base, mmap.mmap) and np.array_equal(paged, chunk)
    with pytest.raises(TypeError, match="page_backed"):
        ChunkCache(page_backed=1)  # type: ignore[arg-type]


def test_free_pages_count_against_the_budget_and_are_the_next_chunks_pages() -> None:
    size = 128 * 1024
    cache = ChunkCache(8 * size * 4)  # 4 MiB: 32 chunks
    seen = set()
    for i in range(64):  # from the 33rd on, every put evicts one chunk and reuses its pages
        kept = cache.put((1, (i,)), np.full(size // 4, i, dtype="f4"))
        seen.add(id(kept.base.base))
        assert cache.stats().bytes + cache.spare_bytes <= cache.budget
        del kept
    assert len(seen) <= 33  # pages of evicted chunks were the next chunks' pages
    assert cache.drop_token(1) == 32
    assert cache.spare_bytes == 32 * size  # a dropped source's pages stay, within the budget
    cache.budget = 8 * size  # 1 MiB budget: 8 pages at most
    assert cache.spare_bytes <= cache.budget
    last = cache.put((1, (99,)), np.full(size // 4, 99, dtype="f4"))
    assert np.all(last == 99) and cache.stats().bytes + cache.spare_bytes <= cache.budget


def test_clear_gives_pages_back_unless_asked_to_keep_them() -> None:
    size = 128 * 1024
    cache = ChunkCache(8 * size)
    for i in range(8):
        cache.put((1, (i,)), np.full(size // 4, i, dtype="f4"))
    cache.clear(keep_pages=True)
    assert len(cache) == 0 and cache.spare_bytes == 8 * size
    buffer = cache.lease((1, (0,)), size)  # one of the kept pages, nothing new
    assert buffer is not None and cache.spare_bytes == 7 * size
    del buffer
    cache.clear()
    assert cache.spare_bytes == 0 and cache.stats().bytes == 0


def test_interrupted_run_all_waits_for_running_tasks_before_returning() -> None:
    started, wrote, stopped = threading.Event(), [], []

    def interrupted() -> None:
        assert started.wait(10)
        raise KeyboardInterrupt

    def writer() -> None:
        started.set()
        time.sleep(0.2)  # still writing into the output when the caller is interrupted
        wrote.append(True)

    set_decode_threads(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_all([interrupted, writer], on_interrupt=lambda: stopped.append(True))
        assert wrote and stopped  # the running task ended before the interrupt came back
    finally:
        set_decode_threads(None)
