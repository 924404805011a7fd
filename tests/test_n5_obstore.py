"""N5 over URLs read through obstore: the same values as fsspec and tensorstore's local read.

Containers written by tensorstore are served by a Range-honouring HTTP server and a moto S3
server on 127.0.0.1. ``attributes.json`` and every block come through the obstore client
(whole objects, ``bytes=0-``, capped); requests are counted at the server; failing,
botched and stalled answers give the right values or a loud error; no error shows a
secret; a forked child reads through fsspec.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("tensorstore")

from _n5_writers import ts_create, ts_read, values, write_n5
from _remote_fixtures import request_methods

from mixle.data.sources.arrays.n5 import read_n5
from mixle.data.sources.arrays.n5.remote import RemoteN5BlockReader
from mixle.errors import (
    ArrayNotFoundError,
    CorruptChunkError,
    MetadataLimitError,
    NotAnArrayError,
    RemoteReadError,
)
from mixle.reading import chunk_cache, set_retry_policy
from mixle.reading.faults import RemoteTimeoutError
from mixle.reading.object_client import ObstoreUnsupported
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer
from mixle.utils.redact import is_safe_error

pytestmark = pytest.mark.usefixtures("fast_retries")

SHAPE = (9, 7, 6)
BLOCKS = (4, 3, 4)
DATASETS = ("raw", "blosc", "sparse", "nested/be")


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("n5obstore") / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    write_n5(root / "raw", values(SHAPE, "uint16"), blocks=BLOCKS, compression={"type": "gzip"})
    blosc = {"type": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1}
    write_n5(root / "blosc", values(SHAPE, "float32"), blocks=BLOCKS, compression=blosc)
    sparse = ts_create(root / "sparse", SHAPE, BLOCKS, "int64", {"type": "zstd"})
    sparse[:4, :3] = values((4, 3, 6), "int64")  # most blocks never written
    (root / "nested").mkdir()
    (root / "nested" / "attributes.json").write_text("{}")
    write_n5(root / "nested" / "be", values((5, 11), "float64"), blocks=(2, 4))
    (root / "group").mkdir()
    (root / "group" / "attributes.json").write_text("{}")
    return root


@pytest.fixture(scope="module")
def s3(container: Path) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(container, "n5-obstore", prefix="in/c.n5")


def _open(where: Any, dataset: str | None, backend: str = "auto") -> Any:
    if isinstance(where, RangeHTTPServer):
        return read_n5(where.url, dataset, backend=backend)
    server, url = where
    return read_n5(url, dataset, storage_options=server.storage_options(), backend=backend)


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_obstore_reads_equal_fsspec_reads_and_tensorstores(kind, container, s3):
    with RangeHTTPServer(container) as http:
        where = http if kind == "http" else s3
        for dataset in DATASETS:
            want = ts_read(container / dataset)
            starts = [(0,) * want.ndim, tuple(d // 2 for d in want.shape)]
            patch = tuple(max(1, d // 3) for d in want.shape)
            reads = {}
            for backend in ("obstore", "fsspec"):
                chunk_cache().clear()
                src = _open(where, dataset, backend)
                assert f"backend={backend!r}" in repr(src)
                reader = src._reader_for(src.array)
                assert isinstance(reader, RemoteN5BlockReader)
                assert (reader._client is not None) == (backend == "obstore")
                reads[backend] = (
                    src[...],
                    src.read_boxes(starts, patch),
                    src.get_batch([-1, 0, 2]),
                )
            boxes = np.stack(
                [want[tuple(slice(a, a + p) for a, p in zip(s, patch))] for s in starts]
            )
            for got in reads.values():
                for value, truth in zip(got, (want, boxes, want[[-1, 0, 2]])):
                    np.testing.assert_array_equal(value, truth)
            for got, same in zip(reads["obstore"], reads["fsspec"]):
                assert got.dtype == same.dtype


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_requests_at_open_and_per_batch_match_fsspecs(kind, container, s3):
    counted = {}
    with RangeHTTPServer(container) as http:
        where = http if kind == "http" else s3
        faults = http.faults if kind == "http" else s3[0].faults
        for backend in ("obstore", "fsspec"):
            chunk_cache().clear()
            faults.reset()
            src = _open(where, "raw", backend)
            opened = request_methods(faults)
            faults.reset()
            src.read_boxes([(0, 0, 0), (1, 1, 1), (4, 3, 0)], (3, 2, 3))
            counted[backend] = (opened, request_methods(faults))
    # attributes.json of the dataset and of the container; blocks (0,0,0), (1,1,0) once each
    assert counted["obstore"] == ({"GET": 2}, {"GET": 2})
    assert sum(counted["fsspec"][0].values()) >= 2 and counted["fsspec"][1] == {"GET": 2}


@pytest.mark.parametrize(
    "fault",
    [
        {"fail_every": 3},
        {"drop_every": 3},
        {"range_fault": "truncate", "range_once": True},
        {"range_fault": "html", "range_rate": 0.5},
        {"range_fault": "whole"},
    ],
    ids=lambda f: "-".join(map(str, f.values())),
)
def test_faulty_answers_are_retried_into_the_right_values(fault, container):
    set_retry_policy(attempts=10)  # 18 blocks in flight: none fails all its tries
    faults = FaultPlan()
    with RangeHTTPServer(container, faults) as http:
        src = _open(http, "raw", "obstore")
        for name, value in fault.items():
            setattr(faults, name, value)
        np.testing.assert_array_equal(src[...], ts_read(container / "raw"))


@pytest.mark.parametrize("fault", ["truncate", "html"])
def test_answers_that_stay_wrong_raise_never_wrong_values(fault, container):
    # an HTML page for bytes=0- is a server ignoring Range: the object is asked again
    # without Range, so the page answers those too here
    faults = FaultPlan(unranged=True)
    with RangeHTTPServer(container, faults) as http:
        src = _open(http, "raw", "obstore")
        faults.range_fault = fault
        with pytest.raises((RemoteReadError, CorruptChunkError)) as info:
            src[...]
        assert f"{http.url}/raw/" in str(info.value)
        assert info.value.__cause__ is None


def test_a_block_larger_than_a_block_can_be_is_refused(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), blocks=BLOCKS)
    (path / "1" / "0" / "0").write_bytes(b"\x00" * 100_000)
    with RangeHTTPServer(tmp_path) as http:
        src = read_n5(f"{http.url}/a.n5", backend="obstore")
        with pytest.raises(CorruptChunkError, match=r"a\.n5/1/0/0.*more than the"):
            src[...]
        np.testing.assert_array_equal(src[:4], ts_read(path, np.s_[:4]))


def test_a_damaged_block_raises_corrupt_chunk_naming_the_url(tmp_path):
    path = write_n5(tmp_path / "a.n5", values(SHAPE, "uint16"), blocks=BLOCKS)
    (path / "1" / "0" / "0").write_bytes(b"\x00\x00\x00\x03" + b"\x00" * 12 + b"junk")
    with RangeHTTPServer(tmp_path) as http:
        src = read_n5(f"{http.url}/a.n5", backend="obstore")
        with pytest.raises(CorruptChunkError, match=r"block '1/0/0'.*a\.n5/1/0/0"):
            src[...]


def test_attributes_past_the_limit_are_refused(tmp_path, monkeypatch):
    from mixle.data.sources.arrays.n5 import remote

    write_n5(tmp_path / "a.n5", values((3, 3), "uint8"), blocks=(2, 2))
    monkeypatch.setattr(remote, "N5_METADATA_LIMIT", 20)
    with RangeHTTPServer(tmp_path) as http, pytest.raises(MetadataLimitError):
        read_n5(f"{http.url}/a.n5", backend="obstore")


def test_groups_and_missing_datasets_say_so(container):
    with RangeHTTPServer(container) as http:
        with pytest.raises(NotAnArrayError, match=r"is an N5 group.*pass dataset="):
            read_n5(http.url, backend="obstore")
        with pytest.raises(NotAnArrayError, match="group"):
            read_n5(http.url, "group", backend="obstore")
        with pytest.raises(ArrayNotFoundError, match=r"dataset='nope'.*no attributes\.json"):
            read_n5(http.url, "nope", backend="obstore")
        with pytest.raises(FileNotFoundError, match="no N5 dataset there"):
            read_n5(f"{http.url}/nothing", backend="obstore")


def test_a_server_that_keeps_failing_or_stalls_raises(container):
    set_retry_policy(attempts=2, timeout=0.5)
    faults = FaultPlan()
    with RangeHTTPServer(container, faults) as http:
        src = _open(http, "raw", "obstore")
        faults.stall = "body"
        began = time.monotonic()
        with pytest.raises(RemoteTimeoutError, match=r"0\.5 s request timeout"):
            src[...]
        assert time.monotonic() - began < 10
        faults.stall, faults.fail_every = None, 1
        with pytest.raises(RemoteReadError, match=r"raw/attributes\.json.*after 2 tries"):
            _open(http, "raw", "obstore")


def test_no_secret_in_reprs_or_errors_over_s3(container, s3):
    server, url = s3
    options = server.storage_options()
    src = _open(s3, "raw", "obstore")
    clone = pickle.loads(pickle.dumps(src))
    errors: list[BaseException] = []
    server.faults.fail_status, server.faults.fail_every = 403, 1
    try:
        for attempt in (lambda: src[...], lambda: clone[...]):
            try:
                attempt()
            except RemoteReadError as exc:
                errors.append(exc)
    finally:
        server.faults.fail_status, server.faults.fail_every = 503, 0
    unknown = {**options, "profile": "prof-secret-abc"}
    try:
        read_n5(url, "raw", storage_options=unknown, backend="obstore")
    except ObstoreUnsupported as exc:
        errors.append(exc)
    assert len(errors) == 3 and "403" in str(errors[0]) and "profile=" in str(errors[2])
    texts = [repr(src), repr(clone), *map(str, errors)]
    for secret in (server.SECRET, server.KEY, "prof-secret-abc"):
        assert all(secret not in text for text in texts)
    assert all(is_safe_error(e, [options, unknown]) for e in errors)


def test_backend_is_checked_kept_when_pickled_and_shown(container, tmp_path):
    with pytest.raises(ValueError, match=r"backend='rust' is not one of"):
        read_n5("s3://b/c.n5", backend="rust")
    with pytest.raises(ValueError, match=r"backend='fsspec' only applies to URLs"):
        read_n5(container, "raw", backend="fsspec")
    with pytest.raises(ObstoreUnsupported, match="query string"):
        read_n5("https://127.0.0.1:9/c.n5?sig=x", backend="obstore")
    with RangeHTTPServer(container) as http:
        for backend in ("fsspec", "obstore"):
            clone = pickle.loads(pickle.dumps(_open(http, "raw", backend)))
            assert f"backend={backend!r}" in repr(clone) and "not opened yet" in repr(clone)
            np.testing.assert_array_equal(clone[...], ts_read(container / "raw"))
            assert f"backend={backend!r}" in repr(clone)


_FORKED = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from mixle.data.sources.arrays.n5 import read_n5

    url = sys.argv[1]
    auto = read_n5(url, "raw")
    strict = read_n5(url, "raw", backend="obstore")
    before = auto[...]  # obstore's runtime runs in this process now
    strict[:1]
    assert "backend='obstore'" in repr(auto), repr(auto)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            same = np.array_equal(auto[...], before)
            fell_back = "backend='fsspec'" in repr(auto)
            try:
                strict[...]
                refused = False
            except ValueError as exc:
                refused = "forked" in str(exc)
            code = 0 if same and fell_back and refused else 4 + same + 2 * fell_back
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert np.array_equal(auto[...], before)
    print("child", os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_child_forked_after_obstore_ran_reads_the_same_values_through_fsspec(container):
    with RangeHTTPServer(container) as http:
        done = subprocess.run(
            [sys.executable, "-c", _FORKED, http.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "child 0", done.stdout + done.stderr[-3000:]
