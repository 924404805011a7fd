"""zarr over obstore (``backend="obstore"``, what ``"auto"`` picks when obstore is installed).

Plain and sharded arrays, zarr format 2 and 3, served by a Range-honouring HTTP server and a
moto S3 server on 127.0.0.1: what obstore reads equals what fsspec reads equals zarr-python's
own read of the local copy; requests are counted at the server (no ``HEAD``, one ``GET`` per
plain chunk, the fsspec path's count for sharded arrays); the repr names the backend, never
secrets; pickling keeps it; a forked worker falls back to fsspec (``"auto"``) or refuses
(``"obstore"``); ``backend=`` is checked.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
zarr = pytest.importorskip("zarr")

from _remote_fixtures import PATCH, boxes, write_stores  # noqa: E402

import mixle  # noqa: E402
from mixle.data.sources.arrays.zarr.chunks import ZarrStoreReader  # noqa: E402
from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader  # noqa: E402
from mixle.errors import ArrayNotFoundError, NotAnArrayError  # noqa: E402
from mixle.reading import chunk_cache, plan_chunks  # noqa: E402
from mixle.reading.object_client import ObstoreUnsupported  # noqa: E402
from mixle.testing_servers import MotoS3Server, RangeHTTPServer  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_retries")

PLAIN = ["v2.zarr", "v3.zarr"]
SHARDED = ["sharded.zarr", "sharded_start.zarr"]
#: name -> (inner) chunk shape and shard shape (None: not sharded)
GRIDS = {
    "v2.zarr": ((8, 8, 10), None),
    "v3.zarr": ((8, 8, 10), None),
    "sharded.zarr": ((4, 4, 5), (12, 12, 10)),
    "sharded_start.zarr": ((4, 4, 5), (12, 12, 10)),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("obstore_zarr")
    write_stores(root)
    group = zarr.open_group(str(root / "group.zarr"), mode="w")
    group.create_array("inner", shape=(4, 5), dtype="int16")[...] = np.arange(20).reshape(4, 5)
    return root


@pytest.fixture(scope="module")
def http(folder: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(folder) as server:
        yield server


@pytest.fixture(scope="module")
def s3(folder: Path) -> Iterator[tuple[MotoS3Server, str]]:
    with MotoS3Server() as server:
        yield server, server.upload(folder, "mixle-obstore-zarr")


def _open(kind: str, name: str, http, s3, **kw) -> mixle.ZarrArraySource:
    if kind == "http":
        return mixle.read_zarr(f"{http.url}/{name}", **kw)
    server, url = s3
    return mixle.read_zarr(f"{url}/{name}", storage_options=server.storage_options(), **kw)


def _server(kind: str, http, s3):
    return http if kind == "http" else s3[0]


def _zarr_read(folder: Path, name: str) -> np.ndarray:
    """zarr-python's own read of the local copy."""
    return np.asarray(zarr.open_array(str(folder / name), mode="r")[...])


def _boxes_of(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.stack(
        [values[tuple(slice(a, a + p) for a, p in zip(row, PATCH))] for row in starts.tolist()]
    )


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("name", PLAIN + SHARDED + ["sparse.zarr", "sparse_sharded.zarr"])
def test_obstore_reads_equal_fsspec_reads_equal_zarrs_own(kind, name, folder, http, s3):
    truth = _zarr_read(folder, name)
    auto = _open(kind, name, http, s3)
    fast = _open(kind, name, http, s3, backend="obstore")
    slow = _open(kind, name, http, s3, backend="fsspec")
    assert "backend='obstore'" in repr(auto) and "backend='obstore'" in repr(fast)
    assert "backend='fsspec'" in repr(slow)
    reader = fast._reader_for(fast.array)
    assert isinstance(reader, ShardedZarrReader if "sharded" in name else ZarrStoreReader)
    starts = boxes(30, seed=len(name))
    want = _boxes_of(truth, starts)
    for src in (auto, fast, slow):
        chunk_cache().clear()
        np.testing.assert_array_equal(src.read_boxes(starts, PATCH), want)
        np.testing.assert_array_equal(src[...], truth)
        np.testing.assert_array_equal(src[3:9, ::5, -3], truth[3:9, ::5, -3])
        np.testing.assert_array_equal(src.get_batch(np.array([5, 0, 23, 5])), truth[[5, 0, 23, 5]])


def _gets(server) -> list[tuple[str, str, str]]:
    return [entry for entry in server.faults.log if entry[0] == "GET"]


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("name", PLAIN)
def test_plain_chunks_are_one_get_each_and_no_head(kind, name, http, s3):
    server = _server(kind, http, s3)
    starts = boxes(32, seed=4)
    chunks, _ = GRIDS[name]
    touched = plan_chunks(starts, PATCH, chunks, (24, 24, 20)).chunks
    counts = {}
    for backend in ("obstore", "fsspec"):
        server.faults.reset()
        src = _open(kind, name, http, s3, backend=backend)
        opened = list(server.faults.log)
        chunk_cache().clear()
        server.faults.reset()
        src.read_boxes(starts, PATCH)
        log = list(server.faults.log)
        counts[backend] = len(log)
        if backend == "obstore":  # metadata through the same client: GETs only
            assert opened and all(method == "GET" for method, _, _ in opened), opened
            assert all(method == "GET" and spec == "bytes=0-" for method, _, spec in log), log
            assert len({path for _, path, _ in log}) == len(log) == len(touched)
    assert counts["obstore"] == counts["fsspec"]


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("name", SHARDED)
def test_sharded_reads_coalesce_and_cache_indices_as_the_fsspec_path(kind, name, http, s3):
    server = _server(kind, http, s3)
    starts = boxes(48, seed=3)
    chunks, shards = GRIDS[name]
    inner = plan_chunks(starts, PATCH, chunks, (24, 24, 20)).chunks
    per = tuple(s // c for s, c in zip(shards, chunks))
    touched = {tuple(c // n for c, n in zip(chunk, per)) for chunk in inner}
    counts = {}
    for backend in ("obstore", "fsspec"):
        src = _open(kind, name, http, s3, backend=backend)
        chunk_cache().clear()
        server.faults.reset()
        src.read_boxes(starts, PATCH)
        first = _gets(server)
        assert len(first) == len(server.faults.log)  # no HEAD
        chunk_cache().clear()
        server.faults.reset()
        src.read_boxes(starts, PATCH)  # the indices are kept: data ranges only
        second = _gets(server)
        counts[backend] = (len(first), len(second), sorted(g[2] for g in second))
        # one index read and one coalesced data range per shard
        assert len(first) == 2 * len(touched), first
        assert len(second) == len(touched), second
    assert counts["obstore"] == counts["fsspec"]


def test_a_batch_has_all_its_requests_in_flight_at_once(folder, s3):
    # every chunk of the array requested at once (under mixle's in-flight bounds)
    server, url = s3
    src = mixle.read_zarr(f"{url}/v3.zarr", storage_options=server.storage_options())
    server.faults.delay = 0.05
    try:
        chunk_cache().clear()
        server.faults.reset()
        np.testing.assert_array_equal(src[...], _zarr_read(folder, "v3.zarr"))
        assert server.faults.peak_inflight > 10  # 18 chunks, not rounds of a small pool
    finally:
        server.faults.delay = 0.0


def test_the_repr_names_the_backend_and_no_secret(s3):
    server, url = s3
    options = server.storage_options()
    src = mixle.read_zarr(f"{url}/v3.zarr", storage_options=options)
    text = repr(src)
    assert text.startswith(f"ZarrArraySource('{url}/v3.zarr', backend='obstore', shape=")
    for secret in (MotoS3Server.KEY, MotoS3Server.SECRET):
        assert secret not in text and secret not in str(src.array.store)


def test_a_local_source_shows_no_backend(folder):
    src = mixle.read_zarr(folder / "v3.zarr")
    assert "backend" not in repr(src)


@pytest.mark.parametrize("backend", ["auto", "obstore", "fsspec"])
def test_pickling_keeps_the_backend(backend, folder, s3):
    server, url = s3
    src = mixle.read_zarr(
        f"{url}/sharded.zarr", storage_options=server.storage_options(), backend=backend
    )
    clone = pickle.loads(pickle.dumps(src))
    assert f"backend={backend!r}" in repr(clone)  # not opened yet: the one asked for
    np.testing.assert_array_equal(clone[2:7], _zarr_read(folder, "sharded.zarr")[2:7])
    shown = "fsspec" if backend == "fsspec" else "obstore"
    assert f"backend={shown!r}" in repr(clone)  # opened: the one reading


def test_a_url_obstore_cannot_map_falls_back_to_fsspec_under_auto(folder, http):
    # aiohttp's trust_env has no obstore equivalent: "auto" reads through fsspec
    options = {"client_kwargs": {"trust_env": False}}
    src = mixle.read_zarr(f"{http.url}/v3.zarr", storage_options=options)
    assert "backend='fsspec'" in repr(src)
    np.testing.assert_array_equal(src[...], _zarr_read(folder, "v3.zarr"))
    with pytest.raises(ObstoreUnsupported, match="client_kwargs= has no obstore equivalent"):
        mixle.read_zarr(f"{http.url}/v3.zarr", storage_options=options, backend="obstore")


@pytest.mark.parametrize("backend", ["bogus", "", "OBSTORE", None, 1])
def test_a_bad_backend_is_refused_at_construction(backend, folder):
    with pytest.raises(ValueError, match=r"backend=.* is not one of 'auto', 'obstore', 'fsspec'"):
        mixle.read_zarr(folder / "v3.zarr", backend=backend)


def test_backend_obstore_where_obstore_cannot_read(folder, http, s3):
    server, url = s3
    cases = [
        (f"file://{folder}/v3.zarr", {}, "scheme 'file'"),
        ("memory://x/v3.zarr", {}, "scheme 'memory'"),
        (str(folder / "v3.zarr"), {}, "not a URL obstore reads"),
        (f"{http.url}/v3.zarr?token=abcdef123", {}, "query string"),
        (
            f"{url}/v3.zarr",
            server.storage_options(profile="someone-secret"),
            "storage_options profile= has no obstore equivalent",
        ),
    ]
    for path, options, why in cases:
        with pytest.raises(ObstoreUnsupported, match=why) as info:
            mixle.read_zarr(path, storage_options=options or None, backend="obstore")
        message = str(info.value)
        assert "backend='auto' or 'fsspec'" in message
        for secret in ("abcdef123", "someone-secret", MotoS3Server.SECRET, MotoS3Server.KEY):
            assert secret not in message
        assert info.value.__cause__ is None
        del info
    # the same URLs under "auto": fsspec reads them
    src = mixle.read_zarr(f"file://{folder}/v3.zarr")
    np.testing.assert_array_equal(src[...], _zarr_read(folder, "v3.zarr"))


def test_an_open_zarr_array_takes_no_backend(folder):
    array = zarr.open_array(str(folder / "v3.zarr"), mode="r")
    with pytest.raises(ValueError, match="backend= only apply to paths and URLs"):
        mixle.ZarrArraySource(array, backend="fsspec")


def test_groups_and_missing_arrays_through_obstore(s3):
    server, url = s3
    options = server.storage_options()
    with pytest.raises(NotAnArrayError, match=r"zarr group.*inner \(4, 5\) int16"):
        mixle.read_zarr(f"{url}/group.zarr", storage_options=options, backend="obstore")
    src = mixle.read_zarr(f"{url}/group.zarr", "inner", storage_options=options)
    assert "backend='obstore'" in repr(src)
    np.testing.assert_array_equal(src[...], np.arange(20).reshape(4, 5))
    with pytest.raises(ArrayNotFoundError, match=r"component='nope'.*inner"):
        mixle.read_zarr(f"{url}/group.zarr", "nope", storage_options=options, backend="obstore")
    with pytest.raises(FileNotFoundError, match="no zarr array or group found"):
        mixle.read_zarr(f"{url}/absent.zarr", storage_options=options, backend="obstore")


_FORKED_LOADER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import mixle

    url, backend = sys.argv[1], sys.argv[2]
    src = mixle.read_zarr(url, backend=backend)
    assert "backend='obstore'" in repr(src), repr(src)
    whole = np.asarray(src[...])  # the parent reads through obstore: its runtime runs
    want = [whole[i : i + 4] for i in range(0, len(whole), 4)]
    try:
        got = list(mixle.Loader(src, 4, num_workers=2, worker_start_method="fork"))
    except Exception as exc:
        print("ERROR", type(exc).__name__, exc)
        sys.exit(3)
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
    print("BATCHES EQUAL", len(got))
    """
)


@pytest.mark.parametrize("name", ["v3.zarr", "sharded.zarr"])
def test_fork_workers_after_the_parent_read_through_obstore(name, http):
    runs = {}
    for backend in ("auto", "obstore"):
        done = subprocess.run(
            [sys.executable, "-c", _FORKED_LOADER, f"{http.url}/{name}", backend],
            capture_output=True,
            text=True,
            timeout=120,  # a hang fails here instead of stalling the suite
        )
        runs[backend] = (done.returncode, done.stdout + done.stderr)
    code, out = runs["auto"]
    assert code == 0 and "BATCHES EQUAL 6" in out, out  # the workers read through fsspec
    code, out = runs["obstore"]
    assert code == 3 and "ERROR ObstoreUnsupported" in out, out
    assert "forked from one where obstore's tokio runtime ran" in out, out


def test_where_obstore_is_unusable_auto_reads_through_fsspec(folder, http, monkeypatch):
    from mixle.reading import object_client

    why = 'obstore is not installed (pip install -e ".[obstore]" in the mixle checkout)'
    monkeypatch.setattr(object_client, "obstore_usable", lambda: why)
    src = mixle.read_zarr(f"{http.url}/v3.zarr")
    assert "backend='fsspec'" in repr(src)
    np.testing.assert_array_equal(src[...], _zarr_read(folder, "v3.zarr"))
    with pytest.raises(ObstoreUnsupported, match=r"obstore is not installed"):
        mixle.read_zarr(f"{http.url}/v3.zarr", backend="obstore")


def test_a_group_over_plain_http_says_its_arrays_cannot_be_listed(tmp_path: Path) -> None:
    """Listing a group over HTTP through obstore (a PROPFIND, 501) escaped as obstore's own
    error, its debug dump and request in the text; the errors now say what fsspec's do."""
    import zarr

    from mixle.utils.redact import is_safe_error

    group = zarr.open_group(str(tmp_path / "grp.zarr"), mode="w")
    group.create_array("a", shape=(2,), dtype="i1")
    options = {"headers": {"Authorization": "Bearer HEADERSECRET9"}}
    with RangeHTTPServer(tmp_path) as http:
        url = f"{http.url}/grp.zarr"
        src = mixle.read_zarr(url, "a", storage_options=options, backend="obstore")
        assert src.shape == (2,)
        with pytest.raises(ArrayNotFoundError, match="cannot be listed over this store") as one:
            mixle.read_zarr(url, "nope", storage_options=options, backend="obstore")
        with pytest.raises(NotAnArrayError, match="cannot be listed over this store") as two:
            mixle.read_zarr(url, storage_options=options, backend="obstore")
    assert is_safe_error(one.value, options) and is_safe_error(two.value, options)
    del one, two
