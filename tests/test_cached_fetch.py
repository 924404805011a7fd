"""The on-disk chunk cache on the obstore path (mixle.reading.cached_fetch): a second run
fetches no cached chunk, a rewritten object is fetched again, never served stale, and what
cannot be versioned is read without the cache, with a warning.

Objects are served by a moto S3 server (ETags, listings) and a Range-honouring HTTP server
(neither) on 127.0.0.1; bytes are compared with the objects uploaded."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("obstore")

from mixle.errors import DiskCacheWarning
from mixle.reading import cached_fetch
from mixle.reading.cached_fetch import (
    DISK_CACHE_ENV,
    CachedObjects,
    chunk_disk_cache,
    use_disk_cache,
)
from mixle.reading.disk_cache import ChunkDiskCache
from mixle.reading.faults import CorruptChunkError
from mixle.reading.object_client import choose_client
from mixle.testing_servers import MotoS3Server, RangeHTTPServer

OBJECTS = {f"c/{k}": bytes([k]) * (1000 + k) for k in range(6)}


@pytest.fixture
def served(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    for key, body in OBJECTS.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)
    return root


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        yield server


@pytest.fixture(autouse=True)
def cache_off_after() -> Iterator[None]:
    before = {k: os.environ.get(k) for k in (DISK_CACHE_ENV, "MIXLE_CHUNK_CACHE_BYTES")}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    cached_fetch._instance = None


def objects(s3: MotoS3Server, served: Path, tmp_path: Path, bucket: str) -> CachedObjects:
    base = s3.upload(served, bucket)
    client = choose_client(base, s3.storage_options())
    assert client is not None
    return CachedObjects(client, ChunkDiskCache(tmp_path / "cache"))


def test_a_second_run_fetches_nothing_it_has_cached(s3, served, tmp_path) -> None:
    first = objects(s3, served, tmp_path, "run-twice")
    s3.faults.reset()
    got = [asyncio.run(first.fetch(k, (0, None))) for k in OBJECTS]
    assert got == list(OBJECTS.values())
    assert s3.requests == 1 + len(OBJECTS)  # one listing, one GET per object
    second = CachedObjects(first.client, ChunkDiskCache(tmp_path / "cache"))  # a new process
    s3.faults.reset()
    again = [second.read(k, (0, None), url=k, name=k) for k in OBJECTS]
    ranged = asyncio.run(second.fetch("c/3", (10, 20)))
    assert again == list(OBJECTS.values()) and ranged == OBJECTS["c/3"][10:20]
    assert s3.requests == 1 + 1  # the listing, and the range not yet cached


def test_a_rewritten_object_is_fetched_again_never_served_stale(s3, served, tmp_path) -> None:
    first = objects(s3, served, tmp_path, "rewritten")
    assert asyncio.run(first.fetch("c/2", (0, None))) == OBJECTS["c/2"]
    s3.client().put_object(Bucket="rewritten", Key="c/2", Body=b"new bytes")
    later = CachedObjects(first.client, first.cache)  # a process started after the rewrite
    s3.faults.reset()
    assert later.read("c/2", (0, None), url="u", name="c/2") == b"new bytes"
    assert s3.requests == 2  # its listing, and the GET: the old entry is not served


def test_bytes_are_kept_under_the_version_their_answer_carries(s3, served, tmp_path) -> None:
    """An object rewritten between the listing and the request is kept as what the answer
    was, so the listed version never gets bytes of another."""
    reader = objects(s3, served, tmp_path, "raced")
    listed = reader.versions()["c/3"]
    s3.client().put_object(Bucket="raced", Key="c/3", Body=b"written meanwhile")
    assert reader.read("c/3", (0, None), url="u", name="c/3") == b"written meanwhile"
    s3.client().put_object(Bucket="raced", Key="c/3", Body=OBJECTS["c/3"])  # back again
    again = CachedObjects(reader.client, reader.cache)
    assert again.versions()["c/3"] == listed  # S3's ETag is the content's MD5
    assert again.read("c/3", (0, None), url="u", name="c/3") == OBJECTS["c/3"]


def test_a_damaged_entry_is_fetched_again(s3, served, tmp_path) -> None:
    first = objects(s3, served, tmp_path, "damaged")
    assert asyncio.run(first.fetch("c/1", (0, None))) == OBJECTS["c/1"]
    for entry in (tmp_path / "cache").iterdir():
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF
        entry.write_bytes(bytes(data))
    s3.faults.reset()
    assert asyncio.run(first.fetch("c/1", (0, None))) == OBJECTS["c/1"]
    assert s3.requests == 1


def test_a_cached_entry_larger_than_the_limit_is_not_served(s3, served, tmp_path) -> None:
    first = objects(s3, served, tmp_path, "limits")
    assert asyncio.run(first.fetch("c/5", (0, None))) == OBJECTS["c/5"]
    with pytest.raises(CorruptChunkError, match="more than the 100 bytes"):
        asyncio.run(first.fetch("c/5", (0, None), limit=100))


def test_a_single_object_is_versioned_by_one_head(s3, served, tmp_path) -> None:
    base = s3.upload(served, "single")
    client = choose_client(base, s3.storage_options())
    assert client is not None
    one = CachedObjects(client, ChunkDiskCache(tmp_path / "cache"), single="c/4")
    s3.faults.reset()
    assert one.read("c/4", (5, 50), url="u", name="r") == OBJECTS["c/4"][5:50]
    assert s3.requests == 2  # the HEAD, the GET
    two = CachedObjects(client, one.cache, single="c/4")
    s3.faults.reset()
    assert two.read("c/4", (5, 50), url="u", name="r") == OBJECTS["c/4"][5:50]
    assert s3.requests == 1  # the HEAD only


def test_a_store_that_cannot_be_listed_is_read_without_the_cache(served, tmp_path) -> None:
    with RangeHTTPServer(served) as http:
        client = choose_client(http.url, None)
        assert client is not None
        plain = CachedObjects(client, ChunkDiskCache(tmp_path / "cache"))
        with pytest.warns(DiskCacheWarning, match="without the on-disk chunk cache"):
            assert plain.read("c/0", (0, None), url="u", name="c/0") == OBJECTS["c/0"]
        http.faults.reset()
        assert asyncio.run(plain.fetch("c/0", (0, None))) == OBJECTS["c/0"]  # no second warning
        assert http.requests == 1
    assert not any((tmp_path / "cache").iterdir())


def test_use_disk_cache_switches_this_process_and_its_workers(tmp_path) -> None:
    os.environ.pop(DISK_CACHE_ENV, None)
    assert chunk_disk_cache() is None  # off by default
    use_disk_cache(tmp_path / "c", budget_bytes=10_000)
    assert os.environ[DISK_CACHE_ENV] == str(tmp_path / "c")
    cache = chunk_disk_cache()
    assert cache is not None and cache.budget_bytes == 10_000 and cache is chunk_disk_cache()
    use_disk_cache(False)
    assert chunk_disk_cache() is None
    os.environ[DISK_CACHE_ENV] = "1"
    default = chunk_disk_cache()
    assert default is not None and default.directory.name == "chunks"


@pytest.mark.parametrize(
    ("directory", "budget", "error", "match"),
    [
        (3, None, TypeError, "directory=3 must be True, False or a folder path"),
        ("", None, ValueError, "directory='' is not a folder"),
        ("on", None, ValueError, "directory='on' is not a folder"),
        (True, -1, ValueError, "budget_bytes=-1 must be 0 or more"),
        (True, 1.5, TypeError, "budget_bytes"),
    ],
)
def test_use_disk_cache_refuses_bad_arguments(directory, budget, error, match) -> None:
    with pytest.raises(error, match=match):
        use_disk_cache(directory, budget_bytes=budget)


def test_use_disk_cache_refuses_a_file_as_folder(tmp_path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    with pytest.raises(NotADirectoryError):
        use_disk_cache(file)
    assert os.environ.get(DISK_CACHE_ENV) != str(file)


def test_suffix_spans_are_kept_by_the_listed_size_and_empty_ones_not(s3, served, tmp_path) -> None:
    reader = objects(s3, served, tmp_path, "suffixes")
    assert reader.read("c/4", (-10, None), url="u", name="k") == OBJECTS["c/4"][-10:]
    assert reader.read("c/4", (5, 5), url="u", name="k") == b""
    s3.faults.reset()
    again = CachedObjects(reader.client, reader.cache)
    assert asyncio.run(again.fetch("c/4", (-10, None))) == OBJECTS["c/4"][-10:]
    assert asyncio.run(again.fetch("c/4", (-5000, None))) == OBJECTS["c/4"]  # past the start
    assert s3.requests == 1 + 1  # the listing, and the longer suffix (not cached yet)
    s3.client().put_object(Bucket="suffixes", Key="c/4", Body=b"shorter")
    later = CachedObjects(reader.client, reader.cache)
    assert later.read("c/4", (-3, None), url="u", name="k") == b"ter"


def test_two_endpoints_with_the_same_bucket_do_not_share_entries() -> None:
    one = choose_client("s3://b/x", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}})
    two = choose_client("s3://b/x", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:2"}})
    assert one is not None and two is not None and one.cache_store != two.cache_store


def test_an_hdf5_file_reopened_reads_its_chunks_from_disk(s3, tmp_path) -> None:
    import h5py
    import numpy as np

    import mixle
    from mixle.reading import chunk_cache

    data = np.arange(40 * 30, dtype="<f4").reshape(40, 30)
    folder = tmp_path / "h5"
    folder.mkdir()
    with h5py.File(folder / "f.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(10, 10), compression="gzip")
    base = s3.upload(folder, "hdf5-cached")
    use_disk_cache(tmp_path / "cache")
    options = s3.storage_options()

    def read_all() -> np.ndarray:
        chunk_cache().clear()  # not the decoded chunks in memory: the bytes on disk
        src = mixle.read_hdf5(f"{base}/f.h5", "x", storage_options=options, backend="obstore")
        return np.asarray(src[:])

    np.testing.assert_array_equal(read_all(), data)
    s3.faults.reset()
    np.testing.assert_array_equal(read_all(), data)
    gets = s3.requests
    assert gets == 2  # the size and the version (two HEADs); every block and chunk from disk
    with h5py.File(folder / "f.h5", "r+") as f:
        f["x"][:] = -data
    s3.upload(folder, "hdf5-cached")  # rewritten: a new ETag
    np.testing.assert_array_equal(read_all(), -data)


@pytest.mark.parametrize("shards", [None, (16, 16)])
def test_a_zarr_array_reopened_fetches_no_chunk_it_has_on_disk(s3, tmp_path, shards) -> None:
    import numpy as np
    import zarr

    import mixle
    from mixle.reading import chunk_cache

    data = np.arange(32 * 40, dtype="<i4").reshape(32, 40)
    folder = tmp_path / "z"
    zarr.create_array(
        str(folder / "v.zarr"), shape=data.shape, chunks=(8, 8), shards=shards, dtype="<i4"
    )[...] = data
    bucket = "zarr-sharded" if shards else "zarr-plain"
    base = s3.upload(folder, bucket)
    use_disk_cache(tmp_path / "cache")
    options = s3.storage_options()
    starts = np.array([[0, 0], [9, 17], [24, 32]])

    def read() -> np.ndarray:
        chunk_cache().clear()
        return open_it().read_boxes(starts, (8, 8))

    def open_it() -> mixle.ZarrArraySource:
        return mixle.read_zarr(f"{base}/v.zarr", storage_options=options, backend="obstore")

    want = np.stack([data[a : a + 8, b : b + 8] for a, b in starts.tolist()])
    np.testing.assert_array_equal(read(), want)
    s3.faults.reset()
    opened = open_it()
    opening = s3.requests  # the metadata documents
    chunk_cache().clear()
    np.testing.assert_array_equal(opened.read_boxes(starts, (8, 8)), want)
    assert s3.requests == opening + 1  # the listing: no chunk, no shard index
    zarr.open_array(str(folder / "v.zarr"), mode="r+")[...] = -data
    s3.upload(folder, bucket)
    np.testing.assert_array_equal(read(), -want)


def test_an_array_of_a_group_lists_only_its_own_prefix(s3, tmp_path, monkeypatch) -> None:
    import numpy as np
    import obstore
    import zarr

    import mixle

    group = zarr.open_group(str(tmp_path / "g" / "g.zarr"), mode="w")
    group.create_array("big", shape=(40,), chunks=(1,), dtype="i1")[...] = 1
    group.create_array("small", shape=(4,), chunks=(4,), dtype="i1")[...] = 7
    base = s3.upload(tmp_path / "g", "group-prefix")
    use_disk_cache(tmp_path / "cache")
    listed: list[object] = []
    real = obstore.list

    def spy(store: object, prefix: object = None, **kwargs: object) -> object:
        listed.append(prefix)
        return real(store, prefix, **kwargs)

    monkeypatch.setattr(obstore, "list", spy)
    src = mixle.read_zarr(
        f"{base}/g.zarr", "small", storage_options=s3.storage_options(), backend="obstore"
    )
    np.testing.assert_array_equal(src[:], np.full(4, 7, "i1"))
    assert listed == ["small"]  # not the group, whose other array has 40 chunks
