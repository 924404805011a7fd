"""Remote answers are capped: ``limit=`` bounds what one request downloads.

A stored object larger than its metadata allows (a 1.5 GiB "chunk") must be refused before
its body is read, as a local file is, and a server that ignores ``Range`` (``200`` with the
whole object) must cost only the bytes up to the range's end, not the whole object.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.asyn import sync
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.reading import CorruptChunkError, set_retry_policy
from mixle.reading.fetch import fetch_range, read_range
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

#: Size of the big object served: far more than the limits and ranges asked of it.
BIG_BYTES = 96 << 20
LIMIT = 1 << 20
DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[None]:
    old = set_retry_policy(attempts=3, base_delay=0.0005, max_delay=0.002)
    yield
    set_retry_policy(**dataclasses.asdict(old))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("caps")
    with open(folder / "big.bin", "wb") as f:
        f.truncate(BIG_BYTES)
    (folder / "small.bin").write_bytes(DATA)
    return folder


@pytest.fixture(scope="module")
def honest(root: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(root) as server:
        yield server


@pytest.fixture(scope="module")
def whole(root: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(root, FaultPlan(range_fault="whole")) as server:
        yield server


def _fetch(url: str, span: tuple[int, int | None], **kw: object) -> bytes:
    fs = fsspec.filesystem("http")
    return bytes(sync(fs.loop, fetch_range, fs, url, span, **kw))


_CHILD = """
import json, sys
import fsspec
from fsspec.asyn import sync
from mixle.reading import CorruptChunkError
from mixle.reading.fetch import fetch_range

def hwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])

fs = fsspec.filesystem("http")
sync(fs.loop, fetch_range, fs, sys.argv[2], (0, 100))  # warm up: session, imports
out = {}
open("/proc/self/clear_refs", "w").write("5"); base = hwm()
try:
    sync(fs.loop, fetch_range, fs, sys.argv[1], (0, None), limit=1 << 20)
    out["refused"] = "no error"
except CorruptChunkError as exc:
    out["refused"] = str(exc)
out["refuse_kib"] = hwm() - base
open("/proc/self/clear_refs", "w").write("5"); base = hwm()
body = sync(fs.loop, fetch_range, fs, sys.argv[2], (1000, 5096))
out["range_ok"] = body == bytes(4096)
out["range_kib"] = hwm() - base
print("REPORT " + json.dumps(out))
"""


def test_big_objects_cost_no_memory_refused_or_asked_a_range_of(honest, whole):
    # a 96 MiB object: refused unread past a 1 MiB limit, and a 4 KiB range of it from a
    # server that sends the whole object with 200 reads 5 KiB of it
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_CHILD),
            f"{honest.url}/big.bin",
            f"{whole.url}/big.bin",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    assert report, result.stderr[-2000:]
    out = json.loads(report[0][7:])
    assert "big.bin" in out["refused"] and str(LIMIT) in out["refused"], out
    assert out["range_ok"]
    assert out["refuse_kib"] < 16 << 10, out  # not the 96 MiB body
    assert out["range_kib"] < 16 << 10, out


def test_a_refused_answer_names_the_url_without_its_query_and_is_not_retried(honest, root):
    before = honest.requests
    with pytest.raises(CorruptChunkError, match=rf"big\.bin: .*than the {LIMIT} bytes") as info:
        _fetch(f"{honest.url}/big.bin?token=tok-secret", (0, None), limit=LIMIT)
    assert "tok-secret" not in str(info.value)
    # read_range: the same error, at once (corrupt data is not a transfer glitch)
    fs = fsspec.filesystem("http")
    with pytest.raises(CorruptChunkError, match="refused"):
        read_range(fs, f"{honest.url}/big.bin", (0, 2 * LIMIT), url="u", key="k", limit=LIMIT)
    assert honest.requests - before == 2


def test_answers_within_the_limit_pass(honest, whole):
    for server in (honest, whole):
        url = f"{server.url}/small.bin"
        assert _fetch(url, (0, None), limit=len(DATA)) == DATA
        assert _fetch(url, (100, 200), limit=len(DATA)) == DATA[100:200]
        assert _fetch(url, (-50, None), limit=len(DATA)) == DATA[-50:]
    with pytest.raises(CorruptChunkError):
        _fetch(f"{honest.url}/small.bin", (0, None), limit=len(DATA) - 1)


@settings(max_examples=40, deadline=None)
@given(st.integers(-len(DATA) - 5, len(DATA) + 5), st.integers(0, len(DATA) + 10))
def test_a_server_ignoring_range_gives_exactly_the_bytes_asked(whole, first, length):
    # the answer is cut at the range's end and sliced: every kind of span, past the end too
    span = (first, None) if first < 0 or length == 0 else (first, first + length)
    if first < 0:
        want = DATA[max(0, len(DATA) + first) :]
    else:
        want = DATA[first:] if span[1] is None else DATA[first : span[1]]
    if span[0] >= len(DATA) and span != (0, None):
        return  # unsatisfiable: a 416, as for an honest server
    assert _fetch(f"{whole.url}/small.bin", span, limit=len(DATA)) == want


def test_other_backends_check_the_length_against_the_limit():
    fs = fsspec.filesystem("memory")
    fs.pipe("/caps/x", DATA)
    assert read_range(fs, "/caps/x", (0, 100), url="memory://x", key="k", limit=100) == DATA[:100]
    with pytest.raises(CorruptChunkError, match=r"memory.*x.*than the 99 bytes"):
        read_range(fs, "/caps/x", (0, 100), url="memory://x", key="k", limit=99)
    fs.rm("/caps/x")


def test_s3_answers_past_the_limit_are_refused(root):
    with MotoS3Server() as server:
        base = server.upload(root, "caps")
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options())
        path = f"{base}/small.bin"
        assert bytes(sync(fs.loop, fetch_range, fs, path, (5, 50), limit=100)) == DATA[5:50]
        with pytest.raises(CorruptChunkError, match=r"than the 100 bytes"):
            sync(fs.loop, fetch_range, fs, path, (0, None), limit=100)
        server.faults.range_fault = "whole"
        assert bytes(sync(fs.loop, fetch_range, fs, path, (5, 50), limit=100)) == DATA[5:50]
