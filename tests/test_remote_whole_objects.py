"""Whole zarr chunks over HTTP and S3 are checked like byte ranges, and so are zarr's own reads.

Unsharded chunks are fetched whole (``Range: bytes=0-``, so s3fs sends no ``HEAD``); layouts
mixle leaves to zarr's codec pipeline (a shard behind a transpose, read whole; a shard
whose index is big-endian, read as ranges) are read by zarr through a checked, retried
store. Servers on 127.0.0.1 answer those requests wrongly on purpose
(:class:`~mixle.testing_servers.FaultPlan` ``range_fault``): every read must equal
zarr-python's own local read when the faults are transient, and raise
:class:`~mixle.reading.RemoteReadError` naming the URL and the stored key when they persist.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from _remote_fixtures import ReadPaths
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

import mixle
from mixle.data.sources.arrays.zarr.stores import checked_store
from mixle.reading import (
    CorruptChunkError,
    RangeMismatchError,
    RemoteReadError,
    chunk_cache,
    faults,
)
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

pytestmark = [
    pytest.mark.usefixtures("fast_retries"),
    # zarr warns whenever it builds the pipeline of a shard compressed as a whole
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]

SHAPE = (24, 24, 20)
CHUNKS = (8, 8, 10)
FILL = 7.0
BUCKET = "mixle-whole"
#: Shards compressed as a whole (``sharding_indexed`` then ``gzip``): mixle decodes them.
_SHARD_THEN_GZIP = {"serializer": ShardingCodec(chunk_shape=(4, 4, 5)), "compressors": GzipCodec()}
#: Shards behind a transpose (``transpose`` then ``sharding_indexed``): zarr reads each whole.
_TRANSPOSED_SHARD = {
    "filters": [TransposeCodec(order=(1, 0, 2))],
    "serializer": ShardingCodec(chunk_shape=(4, 4, 5)),
    "compressors": None,
}
#: Shards whose index is big-endian (mixle reads only little-endian indices): zarr reads
#: the index and the inner chunks as byte ranges.
_BIG_ENDIAN_INDEX = {
    "chunks": (12, 12, 10),
    "serializer": ShardingCodec(
        chunk_shape=(4, 4, 5), index_codecs=[BytesCodec(endian="big"), Crc32cCodec()]
    ),
    "compressors": None,
}
#: name -> (create_array options, the reader mixle picks, a stored key pattern)
LAYOUTS: dict[str, tuple[dict[str, Any], str, str]] = {
    "v2_raw.zarr": ({"zarr_format": 2, "compressors": None}, "ZarrStoreReader", r"\d\.\d\.\d"),
    "v2_zlib.zarr": (
        {"zarr_format": 2, "compressors": numcodecs.Zlib()},
        "ZarrStoreReader",
        r"\d\.\d\.\d",
    ),
    "v3_raw.zarr": ({"compressors": None}, "ZarrStoreReader", r"c/\d/\d/\d"),
    "v3_zstd.zarr": ({"compressors": ZstdCodec(level=1)}, "ZarrStoreReader", r"c/\d/\d/\d"),
    "v3_transpose.zarr": (  # mixle decodes the transpose; whole chunks
        {"filters": [TransposeCodec(order=(2, 0, 1))], "compressors": None},
        "ZarrStoreReader",
        r"c/\d/\d/\d",
    ),
    "v3_sharded_transpose.zarr": (  # shard index and inner chunks as ranges
        {
            "chunks": (4, 4, 5),
            "shards": (12, 12, 10),
            "filters": [TransposeCodec(order=(1, 0, 2))],
            "compressors": None,
        },
        "ShardedZarrReader",
        r"c/\d/\d/\d",
    ),
    "v3_shard_then_gzip.zarr": (  # mixle decodes the whole shard; whole objects
        _SHARD_THEN_GZIP,
        "ZarrStoreReader",
        r"c/\d/\d/\d",
    ),
    "v3_transposed_shard.zarr": (  # zarr decodes; whole objects, through zarr's reads
        _TRANSPOSED_SHARD,
        "ZarrPipelineReader",
        r"c/\d/\d/\d",
    ),
    "v3_sharded_big_endian_index.zarr": (  # zarr decodes; index and inner chunks as ranges
        _BIG_ENDIAN_INDEX,
        "ZarrPipelineReader",
        r"c/\d/\d/\d",
    ),
}
WHOLE_CHUNKS = [
    "v2_raw.zarr",
    "v2_zlib.zarr",
    "v3_raw.zarr",
    "v3_zstd.zarr",
    "v3_transpose.zarr",
    "v3_shard_then_gzip.zarr",
    "v3_transposed_shard.zarr",
]
STARTS = np.array([[0, 0, 0], [17, 15, 13], [7, 11, 3], [12, 2, 9]])
PATCH = (7, 9, 7)
ROWS = [0, 23, 5, 16, 11]
PATHS = ReadPaths(STARTS, PATCH, ROWS)
READS = PATHS.reads()
_expected = PATHS.expected


@pytest.fixture(scope="module")
def whole_stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """Every layout written locally (rows 16.. never written), and zarr's own read of it."""
    root = tmp_path_factory.mktemp("whole")
    data = np.random.default_rng(5).standard_normal(SHAPE).astype("float32")
    truth = {}
    for name, (options, _, _) in LAYOUTS.items():
        options = {"chunks": CHUNKS, **options}
        path = str(root / name)
        array = zarr.create_array(path, shape=SHAPE, dtype="float32", fill_value=FILL, **options)
        array[:16] = data[:16]  # the last chunk row (or half a shard) is never written
        truth[name] = np.asarray(zarr.open_array(path, mode="r")[...])
        assert (truth[name] == FILL).any()
    return root, truth


@pytest.fixture(scope="module")
def http(whole_stores) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(whole_stores[0]) as server:
        yield server


@pytest.fixture(scope="module")
def s3(whole_stores) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(whole_stores[0], BUCKET)


@pytest.fixture(params=["http", "s3"])
def served(request, http, s3) -> Iterator[tuple[FaultPlan, Callable[..., Any], str]]:
    """``(faults, open, shown)`` for the HTTP server, then the S3 one.

    ``open(name, secret_url=False)`` opens a source of the server's copy; ``shown`` is the
    base URL an error shows for a source opened with ``secret_url``.
    """
    if request.param == "http":
        plan = http.faults
        shown = http.url.replace("://", "://***@")  # user info masked

        def open_http(name: str, secret_url: bool = False, **kw: Any) -> Any:
            base = http.url.replace("://", "://user:pw-secret@") if secret_url else http.url
            return mixle.read_zarr(f"{base}/{name}", **kw)

        opener = open_http
    else:
        server, url = s3
        plan = server.faults
        shown = url
        options = server.storage_options(config_kwargs={"retries": {"max_attempts": 1}})

        def open_s3(name: str, secret_url: bool = False, **kw: Any) -> Any:
            return mixle.read_zarr(f"{url}/{name}", storage_options=options, **kw)

        opener = open_s3
    plan.range_fault, plan.range_once = None, False
    plan.reset()
    yield plan, opener, shown
    plan.range_fault, plan.range_once = None, False
    plan.reset()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_uses_the_reader_it_claims(name, served):
    _, opener, _ = served
    src = opener(name)
    assert type(src._reader_for(src.array)).__name__ == LAYOUTS[name][1]
    src.close()


@pytest.mark.parametrize("fault", ["shift", "truncate", "html", "whole"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_transient_faults_are_retried_and_reads_equal_zarrs(name, fault, served, whole_stores):
    plan, opener, _ = served
    src = opener(name)
    for read, how in READS.items():
        chunk_cache().clear()
        plan.reset()
        plan.range_fault, plan.range_once = fault, True  # each request answered wrongly once
        got = how(src)
        plan.range_fault = None
        assert plan.range_faults > 0, read  # the faults were met
        np.testing.assert_array_equal(got, _expected(whole_stores[1][name], read), err_msg=read)
    src.close()


@pytest.mark.parametrize("fault", ["shift", "truncate", "html"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_persistent_faults_raise_remote_read_error_naming_url_and_key(name, fault, served):
    plan, opener, shown = served
    # the message format below is the fsspec path's (obstore's message names the URL before
    # "asked": tests/test_zarr_obstore_faults.py checks the same faults through obstore)
    src = opener(name, secret_url=True, backend="fsspec")
    for read, how in READS.items():
        chunk_cache().clear()
        plan.range_fault = fault
        with pytest.raises(RemoteReadError) as info:
            how(src)
        plan.range_fault = None
        message = str(info.value)
        key = LAYOUTS[name][2]
        where = re.escape(f"reading {shown}/{name}/")
        pattern = rf"{where}(?P<key>{key}) \(chunk (?P=key)\) failed after 5 tries"
        assert re.search(pattern, message), (read, message)
        # botocore checks a whole object's S3 checksum itself: a truncated body fails there
        checked = r"RangeMismatchError: asked bytes=|FlexibleChecksumError: Expected checksum"
        assert re.search(checked, message), (read, message)
        for secret in ("pw-secret", "user:", MotoS3Server.SECRET, MotoS3Server.KEY):
            assert secret not in message
    src.close()


@pytest.mark.parametrize("name", ["v3_raw.zarr", "v3_sharded_transpose.zarr"])
def test_a_server_that_always_ignores_range_gives_the_right_bytes(name, served, whole_stores):
    # every answer a 200 with the whole object: its length checked against the object's size
    plan, opener, _ = served
    src = opener(name)
    plan.reset()
    plan.range_fault = "whole"
    got = src[...]
    plan.range_fault = None
    assert plan.range_faults > 0
    np.testing.assert_array_equal(got, whole_stores[1][name])
    if name in WHOLE_CHUNKS:  # a binary 200 as long as it says is the whole chunk: no HEAD
        assert all(method == "GET" for method, _, _ in plan.log), plan.log
    src.close()


@pytest.mark.parametrize("name", WHOLE_CHUNKS)
def test_whole_chunks_are_one_get_each_with_no_head(name, served, whole_stores):
    # "bytes=0-": s3fs sends one GET (no HEAD first), and an honest 206 needs no size probe
    plan, opener, _ = served
    src = opener(name)
    plan.reset()
    np.testing.assert_array_equal(src[...], whole_stores[1][name])
    log = plan.log
    assert log and all(method == "GET" and spec == "bytes=0-" for method, _, spec in log), log
    assert len({path for _, path, _ in log}) == len(log) == 3 * 3 * 2  # written or not
    src.close()


@pytest.fixture(scope="module")
def emptied(tmp_path_factory, whole_stores) -> Path:
    """Copies of the whole-chunk layouts whose first chunk object is an empty file."""
    import shutil

    root = tmp_path_factory.mktemp("emptied")
    for name in WHOLE_CHUNKS:
        shutil.copytree(whole_stores[0] / name, root / name)
        zarr_format = LAYOUTS[name][0].get("zarr_format", 3)
        first = root / name / ("0.0.0" if zarr_format == 2 else "c/0/0/0")
        first.write_bytes(b"")
    return root


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("name", WHOLE_CHUNKS)
def test_an_empty_chunk_object_is_a_corrupt_chunk(name, kind, emptied, s3):
    # "bytes=0-" of an empty object is unsatisfiable (416): read as the empty object it is
    zarr_format = LAYOUTS[name][0].get("zarr_format", 3)
    key = "0.0.0" if zarr_format == 2 else "c/0/0/0"
    with pytest.raises((ValueError, RuntimeError, zlib.error)):  # zarr's own read fails too
        zarr.open_array(str(emptied / name), mode="r")[:8, :8, :10]
    with RangeHTTPServer(emptied) as http_emptied:
        if kind == "http":
            src = mixle.read_zarr(f"{http_emptied.url}/{name}")
        else:  # the module's moto server (its state is process-wide): another bucket
            server, _ = s3
            url = server.upload(emptied, "mixle-emptied")
            src = mixle.read_zarr(f"{url}/{name}", storage_options=server.storage_options())
        with pytest.raises(CorruptChunkError, match=rf"{re.escape(key)}.*{name}"):
            src[:8, :8, :10]
        src.close()


def test_local_and_memory_stores_are_read_as_they_are(whole_stores):
    local = zarr.open_array(str(whole_stores[0] / "v3_transpose.zarr"), mode="r")
    assert checked_store(local.store, "x") is local.store
    memory = zarr.storage.MemoryStore()
    assert checked_store(memory, "x") is memory


def test_range_mismatch_error_is_public_and_transient():
    assert mixle.reading.RangeMismatchError is faults.RangeMismatchError
    assert issubclass(RangeMismatchError, OSError)
    assert faults.is_transient(RangeMismatchError("asked bytes=0-, got 3 bytes"))


def test_a_body_damaged_in_transit_on_s3_is_retried():
    # botocore checks S3's checksum of a whole object; a mismatch is a transfer glitch
    from botocore.exceptions import FlexibleChecksumError

    assert faults.is_transient(FlexibleChecksumError(error_msg="Expected checksum x"))
