"""zarr over HTTP and S3 (servers on 127.0.0.1) equals local reads; sharded reads coalesce."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from _remote_fixtures import PATCH, boxes, expected_boxes, write_stores

import mixle
from mixle.data.sources.arrays.zarr.chunks import ZarrStoreReader
from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader
from mixle.reading import chunk_cache
from mixle.testing import check_array_source
from mixle.testing_servers import MotoS3Server, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("fast_retries")

ZARRS = ["v2.zarr", "v3.zarr", "sharded.zarr", "sharded_start.zarr", "sparse_sharded.zarr"]


@pytest.fixture(scope="module")
def remote_stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("remote")
    return root, write_stores(root)


@pytest.fixture(scope="module")
def http(remote_stores) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(remote_stores[0]) as server:
        yield server


@pytest.fixture(scope="module")
def s3(remote_stores) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(remote_stores[0], "mixle-zarr")


def _open(kind: str, name: str, http, s3) -> mixle.ZarrArraySource:
    if kind == "http":
        return mixle.read_zarr(f"{http.url}/{name}")
    server, url = s3
    return mixle.read_zarr(f"{url}/{name}", storage_options=server.storage_options())


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("name", ZARRS)
def test_remote_reads_equal_local_reads(kind, name, remote_stores, http, s3):
    root, truth = remote_stores
    local = mixle.read_zarr(root / name)
    remote = _open(kind, name, http, s3)
    reader = remote._reader_for(remote.array)
    assert isinstance(reader, ShardedZarrReader if "sharded" in name else ZarrStoreReader)
    starts = boxes(40, seed=len(name))
    want = expected_boxes(truth[name], starts)
    np.testing.assert_array_equal(remote.read_boxes(starts, PATCH), want)
    np.testing.assert_array_equal(local.read_boxes(starts, PATCH), want)
    rows = np.array([23, 0, 5, 5, 17])
    np.testing.assert_array_equal(remote.get_batch(rows), local.get_batch(rows))
    check_array_source(remote, truth[name])


def test_remote_zarr_pickles_by_reference_with_its_options(remote_stores, s3):
    server, url = s3
    src = mixle.read_zarr(f"{url}/v3.zarr", storage_options=server.storage_options())
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone[3:5], remote_stores[1]["v3.zarr"][3:5])


def test_sparse_remote_chunks_read_as_the_fill_value(remote_stores, http):
    src = mixle.read_zarr(f"{http.url}/sparse.zarr")
    assert not (remote_stores[0] / "sparse.zarr" / "c" / "2" / "2" / "1").exists()  # never written
    np.testing.assert_array_equal(src[16:, 16:, 10:], np.full((8, 8, 10), 7, "float32"))


def _gets(server) -> list[tuple[str, str, str]]:
    return [entry for entry in server.faults.log if entry[0] == "GET"]


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_a_batch_reads_each_shard_in_few_requests(kind, remote_stores, http, s3):
    src = _open(kind, "sharded.zarr", http, s3)
    server = http if kind == "http" else s3[0]
    starts = boxes(64, seed=3)
    inner = mixle.reading.plan_chunks(starts, PATCH, (4, 4, 5), (24, 24, 20)).chunks
    shards = {tuple(c // k for c, k in zip(chunk, (3, 3, 2))) for chunk in inner}
    server.faults.reset()
    out = src.read_boxes(starts, PATCH)
    np.testing.assert_array_equal(out, expected_boxes(remote_stores[1]["sharded.zarr"], starts))
    gets = _gets(server)
    index_reads = [g for g in gets if g[2].startswith("bytes=-")]
    data_reads = [g for g in gets if not g[2].startswith("bytes=-")]
    # one suffix request per shard for its index, then one coalesced range per shard
    assert len(index_reads) == len(shards)
    assert len(data_reads) == len(shards)
    assert len(gets) <= len(inner) / 4  # zarr's own reader: two requests per inner chunk

    # a second batch over the same shards reuses the parsed indices: data requests only
    chunk_cache().clear()
    server.faults.reset()
    src.read_boxes(starts, PATCH)
    assert [g for g in _gets(server) if g[2].startswith("bytes=-")] == []
    assert len(_gets(server)) == len(shards)


def test_unsharded_batch_fetches_each_chunk_once_in_one_concurrent_call(remote_stores, s3):
    server, url = s3
    src = mixle.read_zarr(f"{url}/v3.zarr", storage_options=server.storage_options())
    starts = boxes(32, seed=4)
    plan_chunks = mixle.reading.plan_chunks(starts, PATCH, (8, 8, 10), (24, 24, 20))
    server.faults.reset()
    src.read_boxes(starts, PATCH)
    gets = _gets(server)
    assert len(gets) == len(plan_chunks)  # one GET per touched chunk: no HEAD, no repeats
    assert len({g[1] for g in gets}) == len(gets)


def test_index_at_the_start_of_shards_is_read_with_a_range_request(remote_stores, http):
    src = mixle.read_zarr(f"{http.url}/sharded_start.zarr")
    http.faults.reset()
    src[0:4, 0:4, 0:5]
    ranges = [g[2] for g in _gets(http)]
    assert ranges[0] == f"bytes=0-{16 * 3 * 3 * 2 + 4 - 1}"  # 18 (offset, length) pairs + crc


def test_zarr_over_a_store_object_in_memory_uses_the_batched_reader(remote_stores):
    mem = zarr.storage.MemoryStore()
    data = remote_stores[1]["v3.zarr"]
    zarr.create_array(mem, shape=data.shape, chunks=(8, 8, 10), dtype=data.dtype)[:] = data
    src = mixle.read_zarr(mem)
    assert isinstance(src._reader_for(src.array), ZarrStoreReader)
    starts = boxes(10, seed=9)
    np.testing.assert_array_equal(src.read_boxes(starts, PATCH), expected_boxes(data, starts))
