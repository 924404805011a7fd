"""N5 over HTTP and S3 (servers on 127.0.0.1): every read equals tensorstore's local read."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _n5_writers import ts_create, ts_read, values, write_n5

import mixle
from mixle.data.sources.arrays.n5 import read_n5
from mixle.data.sources.arrays.n5.remote import RemoteN5BlockReader
from mixle.errors import (
    ArrayNotFoundError,
    CorruptChunkError,
    MetadataLimitError,
    NotAnArrayError,
    RemoteReadError,
)
from mixle.reading import chunk_cache
from mixle.testing import check_array_source
from mixle.testing_servers import MotoS3Server, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("fast_retries")

SHAPE = (9, 7, 6)
BLOCKS = (4, 3, 4)


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("n5remote") / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    write_n5(root / "raw", values(SHAPE, "uint16"), blocks=BLOCKS, compression={"type": "gzip"})
    blosc = {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1}
    write_n5(root / "blosc", values(SHAPE, "float32"), blocks=BLOCKS, compression=blosc)
    sparse = ts_create(root / "sparse", SHAPE, BLOCKS, "int64", {"type": "zstd"})
    sparse[:4, :3] = values((4, 3, 6), "int64")  # most blocks never written
    (root / "group").mkdir()
    (root / "group" / "attributes.json").write_text("{}")
    return root


@pytest.fixture(scope="module")
def http(container: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(container) as server:
        yield server


@pytest.fixture(scope="module")
def s3(container: Path) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(container, "mixle-n5")


def _open(kind: str, dataset: str | None, http: Any, s3: Any) -> Any:
    if kind == "http":
        return read_n5(http.url, dataset)
    server, url = s3
    return read_n5(url, dataset, storage_options=server.storage_options())


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("dataset", ["raw", "blosc", "sparse"])
def test_remote_reads_equal_tensorstore_local_reads(kind, dataset, container, http, s3):
    want = ts_read(container / dataset)
    src = _open(kind, dataset, http, s3)
    assert isinstance(src._reader_for(src.array), RemoteN5BlockReader)
    starts = [(0, 0, 0), (5, 4, 2), (2, 1, 1), (6, 0, 3)]
    boxes = src.read_boxes(starts, (3, 3, 3))
    for got, (a, b, c) in zip(boxes, starts):
        np.testing.assert_array_equal(got, want[a : a + 3, b : b + 3, c : c + 3])
    sampler = mixle.PatchSampler(src, (2, 3, 4), num_patches=8, seed=1)
    patches, corners = sampler.get_batch(np.arange(8))
    for patch, (a, b, c) in zip(patches, corners):
        np.testing.assert_array_equal(patch, want[a : a + 2, b : b + 3, c : c + 4])
    check_array_source(src, want)


def test_a_batch_fetches_each_block_once_in_one_concurrent_call(container, http, monkeypatch):
    calls: list[int] = []
    real = RemoteN5BlockReader.fetch_many

    def counted(self: RemoteN5BlockReader, coords: Any) -> Any:
        calls.append(len(coords))
        return real(self, coords)

    monkeypatch.setattr(RemoteN5BlockReader, "fetch_many", counted)
    chunk_cache().clear()
    src = read_n5(http.url, "raw")
    http.faults.reset()
    src.read_boxes([(0, 0, 0), (1, 1, 1), (4, 3, 0)], (3, 2, 3))
    assert calls == [2] and http.requests == 2  # blocks (0,0,0) and (1,1,0), once each
    src.read_boxes([(0, 0, 0)], (3, 2, 3))
    assert calls == [2]  # from the cache


def test_a_flaky_server_is_retried(container, http):
    chunk_cache().clear()
    src = read_n5(http.url, "raw")
    http.faults.fail_every = 3
    try:
        np.testing.assert_array_equal(src[...], ts_read(container / "raw"))
    finally:
        http.faults.fail_every = 0


def test_remote_pickles_by_reference_with_its_options(container, s3):
    server, url = s3
    src = read_n5(url, "raw", storage_options=server.storage_options())
    clone = pickle.loads(pickle.dumps(src))
    assert "not opened yet" in repr(clone)
    secret = server.storage_options()["secret"]
    assert secret not in repr(src) and secret not in repr(clone)
    np.testing.assert_array_equal(clone[3:5], ts_read(container / "raw")[3:5])


def test_remote_groups_and_missing_datasets_say_so(http):
    with pytest.raises(NotAnArrayError, match=r"is an N5 group.*pass dataset="):
        read_n5(http.url)
    with pytest.raises(NotAnArrayError, match="group"):
        read_n5(http.url, "group")
    with pytest.raises(ArrayNotFoundError, match=r"dataset='nope'.*no attributes\.json found"):
        read_n5(http.url, "nope")
    with pytest.raises(FileNotFoundError, match="no N5 dataset there"):
        read_n5(f"{http.url}/nothing")


def test_a_remote_damaged_block_raises_corrupt_chunk_naming_the_url(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), blocks=BLOCKS)
    (path / "1" / "0" / "0").write_bytes(b"\x00\x00\x00\x03" + b"\x00" * 12 + b"junk")
    with RangeHTTPServer(tmp_path) as server:
        src = read_n5(f"{server.url}/a.n5")
        with pytest.raises(CorruptChunkError, match=r"block '1/0/0'.*a\.n5/1/0/0"):
            src[...]
        np.testing.assert_array_equal(src[:4], ts_read(path, np.s_[:4]))


def test_remote_attributes_past_the_limit_are_refused(tmp_path, monkeypatch):
    from mixle.data.sources.arrays.n5 import remote

    path = write_n5(tmp_path / "a.n5", values((3, 3), "uint8"), blocks=(2, 2))
    monkeypatch.setattr(remote, "N5_METADATA_LIMIT", 20)
    with RangeHTTPServer(tmp_path) as server, pytest.raises(MetadataLimitError):
        read_n5(f"{server.url}/a.n5")
    assert path.exists()


def test_a_server_that_keeps_failing_raises_remote_read_error(tmp_path):
    write_n5(tmp_path / "a.n5", values((3, 3), "uint8"), blocks=(2, 2))
    with RangeHTTPServer(tmp_path) as server:
        server.faults.fail_every = 1
        with pytest.raises(RemoteReadError):
            read_n5(f"{server.url}/a.n5")


def test_a_synchronous_file_system_reads_too(container):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.put(str(container), "/n5-sync-test/c.n5", recursive=True)
    try:
        src = read_n5("memory://n5-sync-test/c.n5", "sparse")
        check_array_source(src, ts_read(container / "sparse"))
    finally:
        fs.rm("/n5-sync-test", recursive=True)


def _read_in_child(src: Any, queue: Any) -> None:
    queue.put(src.read_boxes([(1, 2, 3)], (3, 3, 3))[0].tolist())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_over_http_too(container, http):
    src = read_n5(http.url, "raw")
    src[...]  # the parent has a live file system, reader and cached blocks
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(src, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(np.array(got), ts_read(container / "raw")[1:4, 2:5, 3:6])
