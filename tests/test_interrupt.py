"""Ctrl-C and close() stop a Loader or JaxLoader whose reader is stuck in a read.

Each subprocess test runs a loop over a zarr array served by a loopback server that stalls
one chunk mid-body for two minutes, sends the child SIGINT while its loop waits for that
chunk, and bounds the time until the child has exited. The child sets Python's SIGINT
handler itself, so the tests do not depend on the disposition pytest was started with.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from mixle import Loader, ReadsStopped
from mixle.loading.prefetch import THREAD_NAME_PREFIX
from mixle.testing_servers import FaultPlan, RangeHTTPServer

#: Rows per chunk and per batch: batch ``k`` reads chunk ``k`` alone.
ROWS = 8
#: The chunk whose GET stalls (batch 2), and the seconds it is held.
STALLED_KEY, STALL_S = "c/2/0", 120.0
#: Seconds from SIGINT to the child's exit that the tests accept.
EXIT_WITHIN_S = 5.0
#: Seconds the child may take to start and read its first two batches.
START_WITHIN_S = 60.0

CHILD_HEAD = """
import json, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import mixle
"""

LOOP = """
source = mixle.read_zarr(sys.argv[1])
loader = {make}
try:
    for k, batch in enumerate(loader):
        print(f"batch {{k}}", flush=True)
except KeyboardInterrupt:
    deadline = time.monotonic() + 2.0
    while True:  # threads still alive: only ones stuck in the read, all daemon
        mine = [t for t in threading.enumerate() if t.name.startswith("mixle-")]
        others = [t for t in threading.enumerate()
                  if not t.daemon and t is not threading.main_thread()]
        if len(mine) <= {stuck} or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    print("THREADS " + json.dumps({{
        "mine": [[t.name, t.daemon] for t in mine],
        "others": [t.name for t in others],
    }}), flush=True)
    raise
"""

LOADER = "mixle.Loader(source, {rows}, num_threads=2)"
JAX_LOADER = "mixle.jax.JaxLoader(source, {rows}, num_threads={threads}, prefetch=2)"


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[tuple[str, FaultPlan]]:
    """URL of a (64, 16) zarr array of 8 chunks whose chunk 2 stalls mid-body, and the plan."""
    array = zarr.create_array(
        tmp_path / "a.zarr", shape=(8 * ROWS, 16), chunks=(ROWS, 16), dtype="float32"
    )
    array[:] = np.arange(8 * ROWS * 16, dtype=np.float32).reshape(8 * ROWS, 16)
    faults = FaultPlan(stall="body", stall_match=STALLED_KEY, stall_for=STALL_S)
    server = RangeHTTPServer(tmp_path, faults).start()
    try:
        yield f"{server.url}/a.zarr", faults
    finally:
        server.stop()


def _interrupt(
    stalled: tuple[str, FaultPlan], make: str, *, stuck: int, signals: int = 1
) -> dict[str, Any]:
    """Run ``make``'s loop in a child, SIGINT it at batch 2; its exit time and report."""
    url, faults = stalled
    imports = "import mixle.jax\n" if "jax" in make else ""
    code = CHILD_HEAD + imports + LOOP.format(make=make, stuck=stuck)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(START_WITHIN_S, child.kill)  # bounds the wait for batch 1
    watchdog.start()
    try:
        assert child.stdout is not None
        seen = []
        for line in child.stdout:  # batches 0 and 1 arrive; batch 2's chunk stalls
            seen.append(line)
            if line.startswith("batch 1"):
                break
        watchdog.cancel()
        assert seen and seen[-1].startswith("batch 1"), (seen, child.stderr.read())
        deadline = time.monotonic() + START_WITHIN_S
        while not faults.stalled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert faults.stalled, "the child never asked for the stalled chunk"
        time.sleep(0.3)  # the loop now waits for batch 2, whose read is held
        sent = time.monotonic()
        for k in range(signals):
            if k:
                time.sleep(0.25)  # the second Ctrl-C lands while the first one cleans up
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=EXIT_WITHIN_S + 5)
        took = time.monotonic() - sent
    finally:
        watchdog.cancel()
        child.kill()
        child.communicate()
    report = [line for line in out.splitlines() if line.startswith("THREADS ")]
    return {
        "took": took,
        "code": child.returncode,
        "err": err,
        "threads": json.loads(report[0][8:]) if report else None,
    }


def _check(result: dict[str, Any], stuck: list[str]) -> None:
    assert "KeyboardInterrupt" in result["err"], result["err"]
    assert result["code"] == -signal.SIGINT  # the interpreter re-raised it as the signal
    assert result["took"] < EXIT_WITHIN_S, result
    threads = result["threads"]
    if threads is not None:  # the child reports, unless a second Ctrl-C cut that short
        assert threads["others"] == [], threads  # nothing that would hold up the exit
        assert all(daemon for _, daemon in threads["mine"]), threads
        names = sorted(name.rsplit("_", 1)[0] for name, _ in threads["mine"])
        # idle threads stopped; the one stuck in the read (if it is still there) left
        assert len(names) <= len(stuck) and set(names) <= set(stuck), threads


def test_ctrl_c_stops_a_loader_stuck_in_a_remote_read(stalled: tuple[str, FaultPlan]) -> None:
    result = _interrupt(stalled, LOADER.format(rows=ROWS), stuck=1)
    _check(result, [THREAD_NAME_PREFIX])


@pytest.mark.parametrize("threads", [2, 0])
def test_ctrl_c_stops_a_jax_loader_stuck_in_a_remote_read(
    stalled: tuple[str, FaultPlan], threads: int
) -> None:
    make = JAX_LOADER.format(rows=ROWS, threads=threads)
    result = _interrupt(stalled, make, stuck=1)
    # with reader threads the prefetch thread is woken and stops; without, it is the reader
    _check(result, [THREAD_NAME_PREFIX] if threads else ["mixle-jax-prefetch"])


@pytest.mark.parametrize(
    "make",
    [LOADER.format(rows=ROWS), JAX_LOADER.format(rows=ROWS, threads=2)],
    ids=["Loader", "JaxLoader"],
)
def test_a_second_ctrl_c_during_cleanup_does_not_hang(
    stalled: tuple[str, FaultPlan], make: str
) -> None:
    result = _interrupt(stalled, make, stuck=1, signals=2)
    # (without a report when the second one came after the loop had let go of the error)
    _check(result, [THREAD_NAME_PREFIX])


# -- close() from another thread ------------------------------------------------------------
class Stalling:
    """Rows ``0..n``; reading a batch that holds ``stall_at`` waits for ``release``."""

    def __init__(self, n: int, stall_at: int) -> None:
        self.n, self.stall_at = n, stall_at
        self.release = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.stall_at:
            self.release.wait(timeout=60)
        return np.array([i])


def _loop_in_thread(loader: Any) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def consume() -> None:
        try:
            for batch in loader:
                got.append(batch)
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("num_threads", [2, 0])
def test_close_from_another_thread_stops_a_loop_waiting_on_a_stuck_read(
    num_threads: int,
) -> None:
    source = Stalling(40, stall_at=9)
    loader = Loader(source, 4, num_threads=num_threads)
    loop, got = _loop_in_thread(loader)
    try:
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the loop waits for batch 2
        loader.close()
        if num_threads == 0:  # the loop's own thread is in the read: it stops right after
            source.release.set()
        loop.join(timeout=10)
        assert not loop.is_alive()  # the loop ended without batch 2
        assert len(got) == 3 and isinstance(got[-1], ReadsStopped), got
        assert loader.state_dict()["batch"] == 2  # batch 2 is read again after a resume
    finally:
        source.release.set()
        loop.join(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        t.name.startswith(THREAD_NAME_PREFIX) for t in threading.enumerate()
    ):
        time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]
    assert [int(b[0, 0]) for b in Loader(source, 4, num_threads=num_threads)][:3] == [0, 4, 8]
