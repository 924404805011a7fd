"""Remote byte ranges are checked: a shifted, truncated or HTML answer never becomes data.

Layouts whose bytes are used as they come (sharded uncompressed zarr, unfiltered chunked and
contiguous HDF5) are served over 127.0.0.1 by servers that answer ranged requests wrongly
(:class:`~mixle.testing_servers.FaultPlan` ``range_fault``). Every read must equal the
writer's own local read (zarr, h5py) when the faults are transient, and raise
:class:`RemoteReadError` (or :class:`CorruptChunkError`) when they persist.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr
from _remote_fixtures import ReadPaths
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.arrays.hdf5 import remote as hdf5_remote
from mixle.reading import RemoteReadError, chunk_cache, set_retry_policy
from mixle.reading.faults import RangeMismatchError, is_transient
from mixle.reading.fetch import fetch_range, read_range
from mixle.reading.ranges import check_range, range_header
from mixle.testing_servers import ERROR_PAGE, FaultPlan, MotoS3Server, RangeHTTPServer, shifted

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

SHAPE = (24, 24, 20)
PATCH = (5, 7, 6)
FAULTS = ("shift", "truncate", "html", "whole")
#: (source kind, file or store, HDF5 dataset)
LAYOUTS = {
    "sharded-raw-zarr": ("zarr", "raw_sharded.zarr", None),
    "chunked-hdf5": ("hdf5", "v.h5", "chunked"),
    "contiguous-hdf5": ("hdf5", "v.h5", "contiguous"),
}


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    old = set_retry_policy(attempts=4, base_delay=0.0005, max_delay=0.002)
    # small blocks: h5py's reads of metadata and contiguous data each need a fresh request
    monkeypatch.setattr(hdf5_remote, "HDF5_REMOTE_BLOCK_BYTES", 4096)
    chunk_cache().clear()
    yield
    chunk_cache().clear()
    set_retry_policy(**dataclasses.asdict(old))
    # an error raised through h5py and kept by pytest.raises holds h5py objects in a cycle:
    # collected later on a server thread while h5py's lock waits for that server, it would
    # stall the next test until aiohttp's timeout (h5py issue 2019); free it here
    gc.collect()


@pytest.fixture(scope="module")
def range_stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The range_stores, written locally, and each one as its writer reads it back."""
    root = tmp_path_factory.mktemp("ranges")
    data = np.random.default_rng(3).standard_normal(SHAPE).astype("float32")
    for name, shards in (("raw_sharded.zarr", (12, 12, 10)), ("raw.zarr", None)):
        arr = zarr.create_array(
            str(root / name),
            shape=SHAPE,
            dtype="float32",
            chunks=(4, 4, 5) if shards else (8, 8, 10),
            shards=shards,
            compressors=None,
        )
        arr[...] = data
    zarr.create_array(str(root / "zstd.zarr"), data=data, chunks=(8, 8, 10))
    with h5py.File(root / "v.h5", "w") as f:
        f.create_dataset("chunked", data=data, chunks=(8, 8, 10))
        f.create_dataset("contiguous", data=data)
    truth = {
        name: zarr.open_array(str(root / name), mode="r")[...]
        for name in ("raw_sharded.zarr", "raw.zarr", "zstd.zarr")
    }
    with h5py.File(root / "v.h5", "r") as f:
        truth["chunked"], truth["contiguous"] = f["chunked"][...], f["contiguous"][...]
    return root, truth


def _open(kind: str, url: str, dataset: str | None, **options: Any) -> Any:
    if kind == "zarr":
        return mixle.read_zarr(url, **options)
    return mixle.read_hdf5(url, dataset, **options)


def _truth(truth: dict[str, np.ndarray], name: str, dataset: str | None) -> np.ndarray:
    return truth[dataset or name]


STARTS = np.array([[0, 0, 0], [19, 17, 14], [7, 11, 3], [12, 0, 9]])
ROWS = [0, 23, 5, 11]
PATHS = ReadPaths(STARTS, PATCH, ROWS)
READS = PATHS.reads()
_expected = PATHS.expected


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_transient_range_faults_are_retried_and_the_read_equals_the_writers(
    layout, fault, read, range_stores
):
    root, truth = range_stores
    kind, name, dataset = LAYOUTS[layout]
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = _open(kind, f"{server.url}/{name}", dataset)
        faults.reset()
        faults.range_fault, faults.range_once = fault, True  # each request wrong once
        got = READS[read](src)
        assert faults.range_faults > 0  # the faults were met, and retried
        faults.range_fault = None
        src.close()
    np.testing.assert_array_equal(got, _expected(_truth(truth, name, dataset), read))


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("fault", ["shift", "truncate", "html"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_persistent_range_faults_raise_never_a_wrong_array(layout, fault, read, range_stores):
    root, _ = range_stores
    kind, name, dataset = LAYOUTS[layout]
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        url = server.url.replace("://", "://user:pw-secret@")
        src = _open(kind, f"{url}/{name}", dataset)
        faults.range_fault = fault
        with pytest.raises(RemoteReadError) as info:
            READS[read](src)
        faults.range_fault = None
        src.close()
    message = str(info.value)
    assert f"/{name}" in message and "127.0.0.1" in message and "after 4 tries" in message
    assert "pw-secret" not in message and "user" not in message
    assert "asked bytes=" in message and "the response was status" in message


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_server_that_always_ignores_range_still_gives_the_right_bytes(layout, read, range_stores):
    # a 200 carrying the whole object is sliced, after its length was checked against the
    # object's size: the same bytes a 206 would have carried
    root, truth = range_stores
    kind, name, dataset = LAYOUTS[layout]
    with RangeHTTPServer(root, FaultPlan(range_fault="whole")) as server:
        src = _open(kind, f"{server.url}/{name}", dataset)
        got = READS[read](src)
        assert server.faults.range_faults > 0
        src.close()
    np.testing.assert_array_equal(got, _expected(_truth(truth, name, dataset), read))


@pytest.mark.parametrize("fault", ["shift", "truncate", "html"])
@pytest.mark.parametrize("dataset", ["chunked", "contiguous"])
def test_hdf5_metadata_reads_while_opening_are_checked_too(dataset, fault, range_stores):
    # superblock, object headers and B-tree nodes come through the same checked file
    root, truth = range_stores
    with RangeHTTPServer(root, FaultPlan(range_fault=fault, range_once=True)) as server:
        src = mixle.read_hdf5(f"{server.url}/v.h5", dataset)
        opened = server.faults.range_faults
        got = src[...]
        server.faults.range_fault = None
        src.close()
    assert opened > 0
    np.testing.assert_array_equal(got, truth[dataset])


def test_hdf5_that_cannot_be_opened_through_bad_ranges_raises_remote_read_error(range_stores):
    root, _ = range_stores
    with (
        RangeHTTPServer(root, FaultPlan(range_fault="html")) as server,
        pytest.raises(RemoteReadError, match=r"v\.h5.*bytes=0-4095.*text/html"),
    ):
        # fsspec takes a 200 to a range as the whole object; obstore asks again without
        # Range, which this server answers rightly (tests/test_zarr_obstore_faults.py)
        mixle.read_hdf5(f"{server.url}/v.h5", "contiguous", backend="fsspec")


@pytest.mark.parametrize("fault", ["shift", "truncate"])
def test_a_fraction_of_bad_answers_on_sequential_reads_is_retried(fault, range_stores):
    # h5py reads one block at a time: every other answer wrong, each retry gets the next
    root, truth = range_stores
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = mixle.read_hdf5(f"{server.url}/v.h5", "contiguous")
        faults.range_fault, faults.range_rate = fault, 0.5
        got = src[...]
        assert faults.range_faults > 0
        faults.range_fault = None
        src.close()
    np.testing.assert_array_equal(got, truth["contiguous"])


@pytest.mark.parametrize("name", ["raw.zarr", "zstd.zarr"])
def test_an_html_page_served_for_a_whole_chunk_is_retried_then_raised(name, range_stores):
    root, _ = range_stores
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = mixle.read_zarr(f"{server.url}/{name}")
        faults.range_fault, faults.unranged = "html", True
        for read in READS.values():
            chunk_cache().clear()
            with pytest.raises(RemoteReadError, match=rf"{name}/c/\d/\d/\d .*text/html"):
                read(src)
        faults.range_fault = None


@pytest.mark.parametrize("fault", ["shift", "truncate", "html"])
def test_bad_ranges_over_s3(fault, range_stores):
    # s3fs hides the response headers: mixle asks S3 itself and checks its ContentRange
    root, truth = range_stores
    faults = FaultPlan()
    with MotoS3Server(faults) as server:
        url = server.upload(root, "ranges")
        opts = server.storage_options(config_kwargs={"retries": {"max_attempts": 1}})
        for name, dataset in (("raw_sharded.zarr", None), ("v.h5", "contiguous")):
            kind = "zarr" if dataset is None else "hdf5"
            for once in (True, False):
                chunk_cache().clear()
                # html: obstore asks again without Range and gets the right bytes from this
                # server, so no error to see (tests/test_zarr_obstore_faults.py)
                backend = "fsspec" if fault == "html" else "auto"
                src = _open(kind, f"{url}/{name}", dataset, storage_options=opts, backend=backend)
                faults.reset()
                faults.range_fault, faults.range_once = fault, once
                if once:
                    np.testing.assert_array_equal(src[...], _truth(truth, name, dataset))
                else:
                    with pytest.raises(RemoteReadError, match=rf"{name}.*asked bytes="):
                        src.read_boxes(STARTS, PATCH)
                assert faults.range_faults > 0
                faults.range_fault = None
                src.close()


# -- the checks themselves ------------------------------------------------------------
@st.composite
def _object_and_span(draw: Any) -> tuple[bytes, tuple[int, int | None]]:
    size = draw(st.integers(1, 300))
    data = bytes(draw(st.binary(min_size=size, max_size=size)))
    kind = draw(st.sampled_from(["range", "suffix", "open"]))
    if kind == "suffix":
        return data, (-draw(st.integers(1, size + 20)), None)
    start = draw(st.integers(0, size - 1))
    if kind == "open":
        return data, (start, None)
    return data, (start, draw(st.integers(start + 1, size + 20)))


def _served(data: bytes, span: tuple[int, int | None]) -> tuple[int, int]:
    """What an honest server sends for ``span``: ``[first, end)``."""
    start, end = span
    if start < 0:
        return max(0, len(data) + start), len(data)
    return start, len(data) if end is None else min(end, len(data))


@settings(max_examples=300, deadline=None)
@given(_object_and_span(), st.booleans())
def test_an_honest_answer_passes_and_gives_exactly_the_bytes_asked(case, size_known):
    data, span = case
    a, b = _served(data, span)
    size = len(data) if size_known else None
    answer = check_range(
        data[a:b], span, size=size, status=206, content_range=f"bytes {a}-{b - 1}/{len(data)}"
    )
    assert answer == data[a:b]
    assert check_range(data, span, size=len(data), status=200) == data[a:b]
    if span[0] >= 0 and span[1] is not None and span[1] <= len(data):
        assert check_range(data[a:b], span, size=size) == data[a:b]  # length-only backends
    assert check_range(data[a:b], span, size=len(data)) == data[a:b]


@settings(max_examples=300, deadline=None)
@given(_object_and_span(), st.integers(1, 50), st.booleans())
def test_a_shifted_truncated_or_html_answer_never_passes(case, by, size_known):
    data, span = case
    a, b = _served(data, span)
    size = len(data) if size_known else None
    total = len(data)
    wrong = []
    if b - a < total:  # a range that is not the whole object can be moved
        c, d = shifted(a, b, total, by)
        wrong.append((data[c:d], 206, f"bytes {c}-{d - 1}/{total}"))
    wrong.append((data[a : a + (b - a) // 2], 206, f"bytes {a}-{b - 1}/{total}"))  # truncated
    wrong.append((ERROR_PAGE, 200, None))
    if size_known:  # another object's size (a replaced file) shows only against the known one
        wrong.append((data[a:b], 206, f"bytes {a}-{b - 1}/{total + by}"))
    for body, status, content_range in wrong:
        if status == 200 and size is None:
            continue  # fetch_range always learns the size before judging a 200
        if status == 200 and len(ERROR_PAGE) == total:
            continue
        with pytest.raises(RangeMismatchError, match=range_header(span)):
            check_range(body, span, size=size, status=status, content_range=content_range)


def test_a_range_mismatch_is_transient_and_retried_into_a_remote_read_error():
    assert is_transient(RangeMismatchError("asked bytes=0-9, got 5 bytes"))
    calls: list[int] = []

    def short() -> bytes:
        calls.append(1)
        return check_range(b"12345", (0, 10), size=100)

    with pytest.raises(RemoteReadError, match=r"http://h/x \(chunk k\).*after 4 tries.*bytes=0-9"):
        mixle.reading.faults.retry_call(short, url="http://h/x", key="k")
    assert len(calls) == 4


class _FlakyMemory:
    """An async fsspec-like file system over bytes whose first answers are short."""

    async_impl = True

    def __init__(self, data: bytes, short: int) -> None:
        from fsspec.asyn import get_loop

        self.loop = get_loop()
        self.data, self.short, self.calls = data, short, 0

    async def _cat_file(self, path: str, start: int, end: int | None) -> bytes:
        self.calls += 1
        piece = self.data[start:end]
        return piece[: len(piece) // 2] if self.calls <= self.short else piece

    async def _info(self, path: str) -> dict[str, Any]:
        return {"size": len(self.data)}


def test_other_backends_get_the_length_checked_and_retried():
    data = bytes(range(256)) * 4
    fs = _FlakyMemory(data, short=2)
    assert read_range(fs, "x", (100, 300), url="mem://x", key="k") == data[100:300]
    assert fs.calls == 3
    fs = _FlakyMemory(data, short=99)
    with pytest.raises(RemoteReadError, match=r"mem://x.*bytes=100-299.*100 bytes"):
        read_range(fs, "x", (100, 300), url="mem://x", key="k")
    truncated = _FlakyMemory(data[:150], short=0)  # the object really ends early: no retry
    assert asyncio.run(fetch_range(truncated, "x", (100, 300))) == data[100:150]


@pytest.mark.parametrize("dataset", ["chunked", "contiguous"])
def test_hdf5_on_a_blocking_file_system_gets_short_answers_retried(
    dataset, range_stores, monkeypatch
):
    import fsspec

    root, truth = range_stores
    fs = fsspec.filesystem("memory")
    fs.pipe("/mixle-ranges/v.h5", (root / "v.h5").read_bytes())
    real, calls = fs.cat_file, []

    def some_short(path: str, start: int | None = None, end: int | None = None) -> bytes:
        calls.append(1)  # the first answer and every fifth after it come back cut in half
        body = real(path, start=start, end=end)
        return body[: len(body) // 2] if len(calls) % 5 == 1 else body

    monkeypatch.setattr(fs, "cat_file", some_short)
    try:
        src = mixle.read_hdf5("memory://mixle-ranges/v.h5", dataset)
        for read in READS:
            chunk_cache().clear()
            np.testing.assert_array_equal(READS[read](src), _expected(truth[dataset], read))
        src.close()
    finally:
        fs.rm("/mixle-ranges", recursive=True)
    assert len(calls) > 5


def test_a_text_page_for_a_whole_object_of_unknown_size_is_refused() -> None:
    # no size to compare with: a text/html 200 for "bytes=0-" is an error page, not a chunk
    page = b"<html><body>Service busy</body></html>"
    for content_type in ("text/html", "text/html; charset=utf-8", "TEXT/plain"):
        with pytest.raises(RangeMismatchError, match="Content-Type"):
            check_range(page, (0, None), status=200, content_type=content_type)
    binary = b"\x28\xb5\x2f\xfd stored chunk bytes"
    assert check_range(binary, (0, None), status=200, content_type="binary/octet-stream") == binary
    assert check_range(binary, (0, None), status=200) == binary  # no type said: as before
