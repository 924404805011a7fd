"""zarr over obstore against flaky, lying and stalling servers: right bytes or a clear error.

Every fault of :class:`~mixle.testing_servers.FaultPlan` (503s, dropped connections, wrong
answers to ranges, servers that ignore ``Range``, stalls) on a Range-honouring HTTP server
and a moto S3 server on 127.0.0.1, read with ``backend="obstore"``: the data equals
zarr-python's own read of the local copy after retries, or the read raises
:class:`~mixle.reading.RemoteReadError` (:class:`RemoteTimeoutError` for stalls) naming the
URL and the key, never wrong data, never a secret in a message, repr or chain.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
zarr = pytest.importorskip("zarr")

from _remote_fixtures import PATCH, boxes, retries, write_stores  # noqa: E402
from zarr.codecs import ShardingCodec, TransposeCodec  # noqa: E402

import mixle  # noqa: E402
from mixle.data.sources.arrays.zarr import stores as zarr_stores  # noqa: E402
from mixle.reading import CorruptChunkError, RemoteReadError, chunk_cache, ranges  # noqa: E402
from mixle.reading.faults import RemoteTimeoutError  # noqa: E402
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer  # noqa: E402
from mixle.utils.redact import is_safe_error  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("fast_retries"),
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),  # pipeline.zarr
]

NAMES = ["v2.zarr", "v3.zarr", "sharded.zarr", "sharded_start.zarr"]
#: One of each kind (plain v2, plain v3, sharded), for the long fault matrices.
KINDS = ["v2.zarr", "v3.zarr", "sharded.zarr"]
#: A key of each array, as errors name it.
KEYS = {
    "v2.zarr": r"\d\.\d\.\d",
    "v3.zarr": r"c/\d/\d/\d",
    "sharded.zarr": r"c/\d/\d/\d",
    "sharded_start.zarr": r"c/\d/\d/\d",
}
#: What the S3 server's storage_options hold (masked in every message).
SECRETS = (MotoS3Server.KEY, MotoS3Server.SECRET)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("obstore_faults")
    write_stores(root)
    # a layout zarr's own codec pipeline reads (a transpose around the shards)
    zarr.create_array(
        str(root / "pipeline.zarr"),
        shape=(64, 64),
        chunks=(32, 32),
        dtype="float32",
        serializer=ShardingCodec(chunk_shape=(16, 16)),
        filters=[TransposeCodec(order=(1, 0))],
    )[...] = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    return root


@pytest.fixture(scope="module")
def http(folder: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(folder) as server:
        yield server


@pytest.fixture(scope="module")
def s3(folder: Path) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(folder, "mixle-obstore-faults")


@pytest.fixture(params=["http", "s3"])
def served(request, http, s3) -> Iterator[tuple[FaultPlan, object]]:
    """``(faults, open)``: the server's fault plan, and ``open(name)`` with obstore."""
    if request.param == "http":
        plan = http.faults

        def opener(name: str, **kw: object) -> mixle.ZarrArraySource:
            return mixle.read_zarr(f"{http.url}/{name}", backend="obstore", **kw)

    else:
        server, url = s3
        plan = server.faults

        def opener(name: str, **kw: object) -> mixle.ZarrArraySource:
            options = server.storage_options()
            return mixle.read_zarr(
                f"{url}/{name}", storage_options=options, backend="obstore", **kw
            )

    _calm(plan)
    yield plan, opener
    _calm(plan)


def _calm(plan: FaultPlan) -> None:
    plan.fail_every = plan.drop_every = 0
    plan.range_fault, plan.range_once, plan.range_rate, plan.unranged = None, False, 1.0, False
    plan.stall, plan.stall_once, plan.stall_for, plan.stall_match = None, False, 60.0, ""
    plan.dead = False
    plan.reset()


def _truth(folder: Path, name: str) -> np.ndarray:
    return np.asarray(zarr.open_array(str(folder / name), mode="r")[...])


def _reads(src: mixle.ZarrArraySource, truth: np.ndarray) -> None:
    """Every read path, each compared with zarr-python's read."""
    starts = boxes(24, seed=7)
    chunk_cache().clear()
    want = np.stack(
        [truth[tuple(slice(a, a + p) for a, p in zip(row, PATCH))] for row in starts.tolist()]
    )
    np.testing.assert_array_equal(src.read_boxes(starts, PATCH), want)
    chunk_cache().clear()
    np.testing.assert_array_equal(src[...], truth)


def _safe(exc: BaseException) -> None:
    text = str(exc)
    for secret in SECRETS:
        assert secret not in text
    assert is_safe_error(exc, {"key": MotoS3Server.KEY, "secret": MotoS3Server.SECRET})
    assert exc.__cause__ is None and exc.__context__ is None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fault", ["fail_every", "drop_every"])
def test_failed_and_dropped_requests_are_retried(fault, name, served, folder):
    plan, opener = served
    setattr(plan, fault, 4)  # every fourth request, from the metadata on
    # requests in flight together share the count: ten tries make a request that fails
    # every try (about 4**-10) too rare to flake
    with retries(attempts=10, base_delay=0.001, max_delay=0.002):
        src = opener(name)
        _reads(src, _truth(folder, name))
    assert plan.requests > 4  # the faults were met
    assert "backend='obstore'" in repr(src)


@pytest.mark.parametrize("name", ["v2.zarr", "v3.zarr"])
def test_a_flaky_server_cannot_fail_every_try_of_an_open(name, served, folder):
    # zarr.open asks for three metadata documents at once: with every other request failing,
    # each try of the open as a whole meets a failure; each document retried on its own does not
    plan, opener = served
    plan.fail_every = 2
    with retries(attempts=10, base_delay=0.001, max_delay=0.002):
        src = opener(name)
        plan.fail_every = 0
        np.testing.assert_array_equal(src[...], _truth(folder, name))


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("fault", ["shift", "truncate", "html", "whole"])
def test_each_wrong_answer_once_still_gives_the_right_bytes(fault, name, served, folder):
    plan, opener = served
    src = opener(name)
    ranges._IGNORED_RANGE_SIZES.clear()
    plan.range_fault, plan.range_once = fault, True  # each request answered wrongly once
    _reads(src, _truth(folder, name))
    assert plan.range_faults > 0


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("fault", ["shift", "truncate"])
def test_persistent_wrong_ranges_raise_naming_url_and_key(fault, name, served):
    plan, opener = served
    src = opener(name)
    plan.range_fault = fault
    chunk_cache().clear()
    with pytest.raises(RemoteReadError) as info:
        src.read_boxes(boxes(8, seed=1), PATCH)
    message = str(info.value)
    where = re.escape(f"{src._args['path']}/")
    key = KEYS[name]
    assert re.search(rf"reading {where}(?P<k>{key}) \(chunk (?P=k)\) failed after 5 tries", message)
    assert re.search(r"RangeMismatchError: \S+: asked bytes=", message), message
    _safe(info.value)
    del info


@pytest.mark.parametrize("name", NAMES)
def test_a_server_ignoring_range_gives_the_right_bytes(name, served, folder):
    # every answer a 200 with the whole object: its length checked against the object's size
    plan, opener = served
    src = opener(name)
    ranges._IGNORED_RANGE_SIZES.clear()
    plan.range_fault = "whole"
    _reads(src, _truth(folder, name))
    assert plan.range_faults > 0
    # obstore refuses a 200 to a range: the object is asked again without Range and its
    # size once (a HEAD, remembered per object), so the whole answer's length is checked
    heads = [path for method, path, _ in plan.log if method == "HEAD"]
    assert len(heads) == len(set(heads)), heads


@pytest.mark.parametrize("name", ["v3.zarr", "sharded.zarr"])
def test_an_error_page_for_every_get_is_raised_never_decoded(name, http):
    # HTTP only: a page for ranged and plain GETs alike, so no answer holds the object
    src = mixle.read_zarr(f"{http.url}/{name}", backend="obstore")
    http.faults.range_fault, http.faults.unranged = "html", True
    try:
        ranges._IGNORED_RANGE_SIZES.clear()
        chunk_cache().clear()
        with pytest.raises(RemoteReadError, match=rf"{name}/c/\d/\d/\d .*text/html") as info:
            src.read_boxes(boxes(4, seed=2), PATCH)
        _safe(info.value)
        del info
    finally:
        _calm(http.faults)


def test_a_dead_server_raises_without_secrets(served):
    plan, opener = served
    src = opener("v3.zarr")
    plan.dead = True
    chunk_cache().clear()
    with pytest.raises(
        RemoteReadError, match=r"v3\.zarr/c/\d/\d/\d .*failed after 5 tries"
    ) as info:
        src[...]
    _safe(info.value)
    assert all(secret not in repr(src) for secret in SECRETS)
    del info
    plan.dead = False
    np.testing.assert_array_equal(src[0], src[0])  # it reads again once the server is back


@pytest.mark.parametrize("name", ["v3.zarr", "sharded.zarr"])
@pytest.mark.parametrize("stall", ["headers", "body"])
def test_stalls_time_out_and_are_retried(stall, name, http, folder):
    plan = http.faults  # the HTTP server stalls on purpose (the S3 one does not)
    _calm(plan)
    src = mixle.read_zarr(f"{http.url}/{name}", backend="obstore")  # the default 30 s timeout
    with retries(attempts=3, base_delay=0.001, max_delay=0.002, timeout=0.2):
        plan.stall, plan.stall_once, plan.stall_for = stall, True, 3.0
        plan.stall_match = "/c/"  # chunks and shards, not metadata
        _reads(src, _truth(folder, name))  # each request stalls once: its retry is served
        assert plan.stalled > 0
        plan.stall_once = False
        chunk_cache().clear()
        with pytest.raises(RemoteTimeoutError, match=r"failed after 3 tries") as info:
            src[...]  # had the policy's timeout of the moment not been taken, this read waits
        _safe(info.value)  # 3 s per request and succeeds
        del info
    _calm(plan)


def test_a_read_timeout_in_storage_options_wins_over_the_policy(silent):
    options = {
        "key": "k-not-shown",
        "secret": "s3cret-value",
        "endpoint_url": silent,
        "config_kwargs": {"read_timeout": 0.2},
    }
    done: dict[str, BaseException] = {}

    def run() -> None:
        try:
            mixle.read_zarr("s3://bucket/a.zarr", storage_options=options, backend="obstore")
        except BaseException as exc:  # handed to the test's thread
            done["error"] = exc

    with retries(attempts=2, base_delay=0.001, max_delay=0.002, timeout=30):
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(20)  # the policy's 30 s per try would keep it waiting past this
    assert not worker.is_alive(), "the read_timeout of storage_options was not applied"
    error = done["error"]
    assert isinstance(error, RemoteTimeoutError), repr(error)
    assert "s3cret-value" not in str(error) and "k-not-shown" not in str(error)
    assert is_safe_error(error, options)


def test_metadata_past_the_limit_is_refused_unread(served, monkeypatch):
    _, opener = served
    monkeypatch.setattr(zarr_stores, "ZARR_METADATA_LIMIT", 100)  # zarr.json is larger
    with pytest.raises(CorruptChunkError, match=r"zarr\.json: .*more than the 100 bytes"):
        opener("v3.zarr")


def test_an_oversized_download_on_zarrs_pipeline_is_refused(tmp_path, folder):
    import shutil

    shutil.copytree(folder / "pipeline.zarr", tmp_path / "pipeline.zarr")
    expected = _truth(folder, "pipeline.zarr")
    (tmp_path / "pipeline.zarr" / "c" / "0" / "0").write_bytes(bytes(2**20))  # ~8 KiB at most
    with RangeHTTPServer(tmp_path) as server:
        src = mixle.read_zarr(f"{server.url}/pipeline.zarr", backend="obstore")
        assert type(src._reader_for(src.array)).__name__ == "ZarrPipelineReader"
        np.testing.assert_array_equal(src[32:, 32:], expected[32:, 32:])
        with pytest.raises(CorruptChunkError, match=r"pipeline\.zarr/c/0/0: .*refused without"):
            src[0, 0]


def test_missing_chunks_are_the_fill_value_other_failures_are_errors(served, folder):
    plan, opener = served
    src = opener("sparse.zarr")
    _reads(src, _truth(folder, "sparse.zarr"))
    plan.fail_every, plan.fail_status = 1, 403  # every request refused: never a fill value
    try:
        chunk_cache().clear()
        with pytest.raises(RemoteReadError, match=r"failed after 1 tr") as info:
            src[...]
        _safe(info.value)
        del info
    finally:
        plan.fail_status = 503
