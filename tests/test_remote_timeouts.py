"""Stalled servers: per-request timeouts, retried stalls, the batch deadline, jittered waits."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import h5py
import numpy as np
import pytest
import zarr
from _remote_fixtures import retries, write_stores

import mixle
from mixle.reading import RemoteReadError, chunk_cache, retry_policy, set_retry_policy
from mixle.reading.faults import RemoteTimeoutError
from mixle.reading.fs_options import widen_connection_pool
from mixle.reading.policy import DEFAULT_REQUEST_TIMEOUT
from mixle.testing_servers import FaultPlan, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

BIG = (64, 64, 64)  # 1 MiB of float32: more than one 512 KiB block of the remote HDF5 file
#: (store, dataset): zarr arrays read by mixle, HDF5 chunks read by mixle (gzip) and HDF5
#: data h5py reads itself through the file object (contiguous, lzf).
TARGETS = [
    ("v3.zarr", None),
    ("sharded.zarr", None),
    ("big.h5", "gzip"),
    ("big.h5", "contiguous"),
    ("big.h5", "lzf"),
]


@pytest.fixture(autouse=True)
def short_timeouts() -> Iterator[None]:
    with retries(attempts=2, base_delay=0.001, max_delay=0.004, timeout=0.5):
        yield


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("timeouts")
    write_stores(root)
    data = np.random.default_rng(3).standard_normal(BIG).astype("float32")
    with h5py.File(root / "big.h5", "w") as f:
        f.create_dataset("gzip", data=data, chunks=(16, 16, 16), compression="gzip")
        f.create_dataset("contiguous", data=data)
        f.create_dataset("lzf", data=data, chunks=(32, 32, 32), compression="lzf")
    return root, {}


def _open(server: RangeHTTPServer, name: str, dataset: str | None, **kw: Any) -> Any:
    url = f"{server.url}/{name}"
    return mixle.read_zarr(url, **kw) if dataset is None else mixle.read_hdf5(url, dataset, **kw)


def _local(root: Path, name: str, dataset: str | None) -> np.ndarray:
    """What zarr-python or h5py read from the same store on disk."""
    if dataset is None:
        return np.asarray(zarr.open_array(str(root / name), mode="r")[...])
    with h5py.File(root / name, "r") as f:
        return np.asarray(f[dataset][...])


@pytest.mark.parametrize("stall", ["headers", "body"])
@pytest.mark.parametrize(("name", "dataset"), TARGETS)
def test_a_server_that_stalls_every_read_gives_up_in_bounded_time(stall, name, dataset, tree):
    root, _ = tree
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = _open(server, name, dataset)  # metadata served; then every GET stalls
        faults.stall = stall
        began = time.monotonic()
        with pytest.raises(RemoteTimeoutError) as info:
            src[...]
        took = time.monotonic() - began
        src.close()
    assert took < 10  # 2 tries of 0.5 s, not aiohttp's 300 s per try
    assert isinstance(info.value, RemoteReadError)
    message = str(info.value)
    del info  # its traceback holds h5py objects: no reference cycle left (h5py issue 2019)
    assert f"{server.url}/{name}" in message and "after 2 tries" in message
    assert "0.5 s request timeout" in message and "chunk " in message


@pytest.mark.parametrize("stall", ["headers", "body"])
@pytest.mark.parametrize(("name", "dataset"), TARGETS)
def test_a_request_that_stalls_once_is_retried_and_serves_the_right_values(
    stall, name, dataset, tree
):
    root, _ = tree
    set_retry_policy(attempts=3)
    # zarr: the chunks (or shards) under c/0; HDF5: every range request, each once
    faults = FaultPlan(stall_match="/c/0/" if dataset is None else "", stall_once=True)
    with RangeHTTPServer(root, faults) as server:
        src = _open(server, name, dataset)
        faults.stall = stall
        got = src[...]
        src.close()
        assert faults.stalled >= 1  # some requests did stall, and their retries were served
    np.testing.assert_array_equal(got, _local(root, name, dataset))


def test_the_batch_deadline_caps_a_read_whatever_the_request_timeout(tree):
    root, _ = tree
    set_retry_policy(attempts=5, timeout=30, deadline=1)
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        sources = [_open(server, name, ds) for name, ds in TARGETS[:3]]
        faults.stall = "body"
        for src in sources:
            began = time.monotonic()
            with pytest.raises(RemoteTimeoutError, match="1 s deadline") as info:
                src[...]
            assert time.monotonic() - began < 10
            assert "chunk " in str(info.value) and server.url in str(info.value)
            del info  # no reference cycle through its traceback (h5py issue 2019)
            src.close()


class _SentTimeouts:
    """Records the ``timeout=`` of every ranged GET aiohttp is asked to send."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[Any] = []
        original = aiohttp.ClientSession._request

        def spy(session: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
            if method == "GET" and "Range" in (kwargs.get("headers") or {}):
                self.seen.append(kwargs.get("timeout", "session's"))
            return original(session, method, url, *args, **kwargs)

        monkeypatch.setattr(aiohttp.ClientSession, "_request", spy)


@pytest.mark.parametrize(("name", "dataset"), [("v3.zarr", None), ("big.h5", "gzip")])
def test_every_request_carries_the_default_timeout_unless_storage_options_set_one(
    name, dataset, tree, monkeypatch
):
    root, _ = tree
    set_retry_policy(**dataclasses.asdict(mixle.reading.RetryPolicy()))  # the defaults
    assert retry_policy().timeout == DEFAULT_REQUEST_TIMEOUT == 30
    sent = _SentTimeouts(monkeypatch)
    mine = aiohttp.ClientTimeout(sock_read=9)
    with RangeHTTPServer(root) as server:
        for options, expected in [
            (None, "default"),
            ({"timeout": mine}, "theirs"),  # for every request: theirs is sent
            ({"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=7)}}, "session's"),
        ]:
            chunk_cache().clear()
            sent.seen.clear()
            # spies on aiohttp's request timeouts: the fsspec path (obstore's timeouts:
            # tests/test_zarr_obstore_faults.py)
            src = _open(server, name, dataset, storage_options=options, backend="fsspec")
            src.read_boxes([[0, 0, 0]], (8, 8, 8))
            src.close()
            assert sent.seen, "no ranged GET was seen"
            for timeout in sent.seen:
                if expected == "default":
                    assert timeout.sock_read == timeout.sock_connect == 30
                    assert timeout.total is None  # the batch deadline bounds whole transfers
                elif expected == "theirs":
                    assert timeout is mine
                else:
                    assert timeout == "session's"


def test_a_zarr_url_opened_before_a_policy_change_takes_the_new_timeout(tree, monkeypatch):
    # opening gives the session mixle's timeout; it is not mistaken for one the user chose,
    # so later requests carry the policy's timeout of the moment
    root, _ = tree
    old = set_retry_policy(**dataclasses.asdict(mixle.reading.RetryPolicy()))
    sent = _SentTimeouts(monkeypatch)
    try:
        with RangeHTTPServer(root) as server:
            # spies on aiohttp's request timeouts: the fsspec path (obstore's timeouts:
            # tests/test_zarr_obstore_faults.py)
            src = _open(server, "v3.zarr", None, backend="fsspec")
            set_retry_policy(timeout=7)
            chunk_cache().clear()
            src.read_boxes([[0, 0, 0]], (8, 8, 8))
            src.close()
    finally:
        set_retry_policy(**dataclasses.asdict(old))
    assert sent.seen and all(t.sock_read == t.sock_connect == 7 for t in sent.seen)


def test_s3_file_systems_get_the_timeout_unless_the_user_chose_one():
    s3fs = pytest.importorskip("s3fs")
    set_retry_policy(timeout=12)
    plain = s3fs.S3FileSystem(anon=True, skip_instance_cache=True)
    config = widen_connection_pool(plain).config_kwargs
    assert config["connect_timeout"] == config["read_timeout"] == 12
    chosen = s3fs.S3FileSystem(
        anon=True, config_kwargs={"read_timeout": 3}, skip_instance_cache=True
    )
    config = widen_connection_pool(chosen).config_kwargs
    assert config["read_timeout"] == 3 and config["connect_timeout"] == 12


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("timeout", 0, ValueError),
        ("timeout", -1.5, ValueError),
        ("timeout", math.nan, ValueError),
        ("timeout", math.inf, ValueError),
        ("timeout", "30", TypeError),
        ("timeout", True, TypeError),
        ("deadline", 0, ValueError),
        ("deadline", math.nan, ValueError),
        ("deadline", [1], TypeError),
    ],
)
def test_bad_timeouts_and_deadlines_name_the_argument(field, value, error):
    before = retry_policy()
    with pytest.raises(error, match=rf"^{field}=.* seconds"):
        set_retry_policy(**{field: value})
    assert retry_policy() == before  # nothing changed
    set_retry_policy(deadline=math.inf)  # no deadline at all is allowed
    assert retry_policy().deadline == math.inf


def test_retry_waits_are_jittered_within_the_backoff_bound_and_leave_random_alone():
    policy = mixle.reading.RetryPolicy(base_delay=0.1, max_delay=0.5)
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    for retry in range(6):
        bound = policy.delay(retry)
        waits = [policy.wait(retry) for _ in range(40)]
        assert all(bound / 2 <= w <= bound <= 0.5 for w in waits)
        assert len(set(waits)) > 30  # drawn, not one fixed step for every request
    assert [random.random() for _ in range(3)] == expected  # the user's stream is untouched


#: A child looping over a Loader whose third chunk stalls; after Ctrl-C it reports how long
#: the reader threads took to go, then stays alive for a while (as a notebook would).
_AFTER_CTRL_C = """
import json, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import mixle
mixle.reading.set_retry_policy(timeout=0.5, base_delay=0.01, max_delay=0.02)
source = mixle.read_zarr(sys.argv[1])
try:
    for batch in mixle.Loader(source, 8, num_threads=2):
        print("batch", flush=True)
except KeyboardInterrupt:
    start = time.monotonic()
    while any(t.name.startswith("mixle-loader") for t in threading.enumerate()):
        if time.monotonic() - start > 5:
            break
        time.sleep(0.02)
    gone = time.monotonic() - start
    time.sleep(2.0)  # stays alive: a stuck read would keep retrying now
    print("REPORT " + json.dumps({"gone": gone}), flush=True)
"""


def test_after_ctrl_c_a_stalled_read_is_not_retried_and_its_thread_ends(tmp_path: Path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(64, 16), chunks=(8, 16), dtype="f4")
    array[:] = 1.0
    faults = FaultPlan(stall="headers", stall_match="c/2/0", stall_for=60)
    server = RangeHTTPServer(tmp_path, faults).start()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_AFTER_CTRL_C), f"{server.url}/a.zarr"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not faults.stalled and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.01)
        assert faults.stalled, child.communicate(timeout=5)
        time.sleep(0.2)  # the loop waits for the stalled batch
        at_sigint = faults.stalled
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        child.kill()
        child.communicate()
        server.stop()
    report = [line for line in out.splitlines() if line.startswith("REPORT ")]
    assert report, err[-2000:]
    assert faults.stalled - at_sigint <= 1  # no retry of the stalled chunk after Ctrl-C
    assert json.loads(report[0][7:])["gone"] < 2.0  # the reader thread is gone too
