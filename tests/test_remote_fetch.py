"""Concurrency of remote fetches: wide s3fs pools, streamed arrivals, decode during the fetch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from _remote_fixtures import write_stores

import mixle
from mixle.reading import chunk_cache, read_chunked
from mixle.reading.fs_options import widen_connection_pool
from mixle.reading.inflight import MAX_INFLIGHT_REQUESTS, stream_bounded
from mixle.testing_servers import FaultPlan, MotoS3Server

pytestmark = pytest.mark.usefixtures("fast_retries")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running

    async def settle() -> None:  # nothing may still be running when the loop closes
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(settle(), running).result(timeout=30)
    running.call_soon_threadsafe(running.stop)
    thread.join(timeout=30)
    running.close()


def test_s3_batches_keep_more_requests_in_flight_than_aiobotocores_ten(tmp_path):
    truth = write_stores(tmp_path)["v3.zarr"]  # 3 x 3 x 2 = 18 chunks
    faults = FaultPlan()
    with MotoS3Server(faults) as server:
        url = server.upload(tmp_path, "mixle-wide")
        faults.delay = 0.2  # a slow store: requests overlap as far as the client lets them
        src = mixle.read_zarr(f"{url}/v3.zarr", storage_options=server.storage_options())
        faults.reset()
        got = src.read_boxes([[0, 0, 0]], truth.shape)
        wide = faults.peak_inflight
        chunk_cache().clear()
        narrow_options = server.storage_options(config_kwargs={"max_pool_connections": 2})
        # a pool size is s3fs's (obstore's reqwest pool has none; mixle's in-flight cap
        # bounds it): the fsspec path
        narrow = mixle.read_zarr(f"{url}/v3.zarr", storage_options=narrow_options, backend="fsspec")
        faults.reset()
        again = narrow.read_boxes([[0, 0, 0]], truth.shape)
        chosen = faults.peak_inflight
    np.testing.assert_array_equal(got[0], truth)
    np.testing.assert_array_equal(again[0], truth)
    assert wide > 10  # every one of the 18 chunk requests at once, not rounds of ten
    assert chosen <= 2  # a pool size the user chose is kept


def test_hdf5_over_s3_keeps_more_requests_in_flight_than_aiobotocores_ten(tmp_path):
    truth = write_stores(tmp_path)["v.h5/gzip"]  # 18 chunks
    faults = FaultPlan()
    with MotoS3Server(faults) as server:
        url = server.upload(tmp_path, "mixle-wide-h5")
        src = mixle.read_hdf5(f"{url}/v.h5", "gzip", storage_options=server.storage_options())
        src.read_boxes([[0, 0, 0]], (1, 1, 1))  # metadata and the chunk index, before timing
        chunk_cache().clear()
        faults.delay = 0.2
        faults.reset()
        got = src.read_boxes([[0, 0, 0]], truth.shape)
        peak = faults.peak_inflight
        src.close()
    np.testing.assert_array_equal(got[0], truth)
    assert peak > 10


def test_widen_connection_pool_only_touches_s3fs_and_keeps_what_the_user_chose():
    s3fs = pytest.importorskip("s3fs")
    fsspec = pytest.importorskip("fsspec")
    plain = s3fs.S3FileSystem(anon=True, skip_instance_cache=True)
    wide = widen_connection_pool(plain)
    assert wide.config_kwargs["max_pool_connections"] == MAX_INFLIGHT_REQUESTS
    assert "max_pool_connections" not in plain.config_kwargs  # the caller's fs is unchanged
    chosen = s3fs.S3FileSystem(
        anon=True, config_kwargs={"max_pool_connections": 3}, skip_instance_cache=True
    )
    assert widen_connection_pool(chosen).config_kwargs["max_pool_connections"] == 3
    every = {"max_pool_connections": 3, "connect_timeout": 2, "read_timeout": 4}
    all_chosen = s3fs.S3FileSystem(anon=True, config_kwargs=every, skip_instance_cache=True)
    assert widen_connection_pool(all_chosen) is all_chosen
    memory = fsspec.filesystem("memory")
    assert widen_connection_pool(memory) is memory


def _calls(delays: Sequence[float], log: list[str]) -> list[Any]:
    def make(k: int, delay: float) -> Any:
        async def call() -> int:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                log.append(f"cancelled {k}")
                raise
            if delay < 0:
                raise OSError(f"request {k} failed")
            return k * 10

        return call

    return [make(k, d) for k, d in enumerate(delays)]


def test_stream_bounded_yields_every_result_once_in_arrival_order(loop):
    log: list[str] = []
    groups = list(stream_bounded(loop, _calls([0.3, 0.0, 0.15], log), [1, 1, 1]))
    flat = [item for group in groups for item in group]
    assert sorted(flat) == [(0, 0), (1, 10), (2, 20)]
    assert [k for k, _ in flat] == [1, 2, 0]  # the fastest first
    assert all(groups) and log == []


def test_stream_bounded_raises_the_failure_after_what_arrived(loop):
    log: list[str] = []
    seen: list[int] = []

    def consume() -> None:
        for group in stream_bounded(loop, _calls([0.0, -1.0, 5.0], log), [1, 1, 1]):
            seen.extend(k for k, _ in group)

    with pytest.raises(OSError, match="request 1 failed"):
        consume()
    assert seen == [0]
    assert log == ["cancelled 2"]  # the slow request did not outlive the failure


def test_closing_a_stream_early_cancels_the_requests_in_flight(loop):
    log: list[str] = []
    arrivals = stream_bounded(loop, _calls([0.0, 5.0, 5.0], log), [1, 1, 1])
    assert next(arrivals) == [(0, 0)]
    arrivals.close()
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: loop.call_soon(done.set))  # let the cancellations run
    assert done.wait(5)
    assert sorted(log) == ["cancelled 1", "cancelled 2"]


class _StreamingReader:
    """A 1-D array of 4 chunks whose payloads arrive one by one; logs arrivals and decodes."""

    def __init__(self, bad: int = -1) -> None:
        self.chunks = (2,)
        self.token = mixle.reading.new_token()
        self.log: list[str] = []
        self.bad = bad

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        return self.decode(coords, coords[0])

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[Any]:
        return [c[0] for c in coords]

    def fetch_each(self, coords: Sequence[tuple[int, ...]]) -> Iterator[list[tuple[int, Any]]]:
        try:
            for k, c in enumerate(coords):
                self.log.append(f"arrived {c[0]}")
                yield [(k, c[0])]
        finally:
            self.log.append("closed")

    def decode(self, coords: tuple[int, ...], raw: Any) -> np.ndarray:
        self.log.append(f"decoded {raw}")
        if raw == self.bad:
            raise mixle.reading.CorruptChunkError(f"chunk {raw} is corrupt")
        return np.full(2, raw, dtype="int64")


def test_chunks_are_decoded_as_they_arrive_not_after_the_whole_fetch():
    reader = _StreamingReader()
    out = np.empty((1, 8), dtype="int64")
    read_chunked(reader, [[0]], (8,), (8,), out)
    np.testing.assert_array_equal(out[0], np.repeat(np.arange(4), 2))
    steps = [f"{what} {k}" for k in range(4) for what in ("arrived", "decoded")]
    assert reader.log == [*steps, "closed"]


def test_a_corrupt_chunk_stops_the_fetch_and_raises():
    reader = _StreamingReader(bad=1)
    out = np.empty((1, 8), dtype="int64")
    with pytest.raises(mixle.reading.CorruptChunkError, match="chunk 1"):
        read_chunked(reader, [[0]], (8,), (8,), out)
    assert reader.log == ["arrived 0", "decoded 0", "arrived 1", "decoded 1", "closed"]


def test_a_fetch_left_unfinished_on_a_closed_loop_is_dropped_quietly():
    from mixle.reading.inflight import gather_bounded

    async def slow() -> int:
        await asyncio.sleep(60)
        return 1

    running = asyncio.new_event_loop()
    coro = gather_bounded([slow], [1])
    task = running.create_task(coro)
    running.run_until_complete(asyncio.sleep(0.01))  # started: waiting on its request
    running.close()  # the loop goes away with the fetch still pending
    coro.close()  # what garbage collection does: must not raise
    assert not task.done()
