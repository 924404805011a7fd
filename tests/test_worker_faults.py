"""Worker faults with a bound: a Dask worker lost while building, Ctrl-C, a killed driver.

Each case runs in a child process (its own session, so every process it starts is killed
afterwards) and is read with a timeout, so a regression fails instead of hanging. Child
processes that take Ctrl-C set their SIGINT handler themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _encoded_helpers import pid_alive, shard_sum
from _session_child import session_child

import mixle
from mixle.utils.parallel.multiprocessing import MPEncodedData

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and compares monotonic clocks"
)

#: Hang guard for a whole child process; no test relies on it for timing.
T = 90
#: Ctrl-C must hand control back within this many seconds.
INTERRUPT_BOUND_S = 4.0
#: A call on a broken handle must raise within this many seconds ("at once").
AT_ONCE_S = 1.0
#: A killed driver's workers must be gone within this many seconds.
ORPHAN_BOUND_S = 10.0

_PATHS = json.dumps([str(Path(__file__).parent), str(Path(mixle.__file__).parents[1])])


@contextlib.contextmanager
def _child(script: str, tmp_path: Path, **values: object) -> Iterator[subprocess.Popen[str]]:
    """Run ``script`` (``{name}`` filled with ``values`` as literals) in a new session."""
    code = textwrap.dedent(script).format(paths=_PATHS, **{k: repr(v) for k, v in values.items()})
    with session_child(["-c", code], tmp_path) as proc:
        yield proc


def _stderr(tmp_path: Path) -> str:
    return (tmp_path / "child-stderr.txt").read_text()[-4000:]


def _wait_for_lines(log: Path, n: int, proc: subprocess.Popen[str], tmp_path: Path) -> list[int]:
    """The first ``n`` pids written to ``log`` (by calls that have started)."""
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        lines = log.read_text().split() if log.exists() else []
        if len(lines) >= n:
            return [int(x) for x in lines[:n]]
        if proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}) early:\n{_stderr(tmp_path)}")
        time.sleep(0.05)
    pytest.fail(f"the child's workers never started the call:\n{_stderr(tmp_path)}")


def _result(proc: subprocess.Popen[str], tmp_path: Path) -> dict:
    try:
        out, _ = proc.communicate(timeout=T)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {T} s:\n{_stderr(tmp_path)}")
    assert proc.returncode == 0, _stderr(tmp_path)
    return json.loads(out.splitlines()[-1])


# -- a Dask worker lost while the shards are built ------------------------------------------
_DASK_BUILD = """
import json, sys, time
sys.path[:0] = {paths}
import distributed
import mixle
from _encoded_helpers import NotePidAndNap
from mixle.utils.parallel.dask_backend import QUIET_SCHEDULER, DaskEncodedData

cluster = distributed.LocalCluster(
    n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
    dashboard_address=None, scheduler_kwargs=QUIET_SCHEDULER,
)
client = distributed.Client(cluster, set_as_default=False)
out = {{}}
start = time.monotonic()
try:
    DaskEncodedData(list(range(4)), NotePidAndNap({log}, 120), client=client)  # no timeout=
except mixle.WorkerDiedError as exc:
    out = {{"raised": type(exc).__name__, "message": str(exc)}}
out["seconds"] = time.monotonic() - start
print(json.dumps(out), flush=True)
client.close()
cluster.close()
"""


@pytest.mark.slow
def test_dask_worker_killed_while_building_raises_worker_died_error(tmp_path):
    pytest.importorskip("distributed", reason="needs mixle[dask]")
    log = tmp_path / "pids.txt"
    with _child(_DASK_BUILD, tmp_path, log=str(log)) as proc:
        [worker] = _wait_for_lines(log, 1, proc, tmp_path)
        os.kill(worker, signal.SIGKILL)
        out = _result(proc, tmp_path)
    assert out.get("raised") == "WorkerDiedError", out
    assert "was lost during building the shards" in out["message"]
    assert out["seconds"] < 30


# -- Ctrl-C -------------------------------------------------------------------------------
_DASK_CTRL_C = """
import json, multiprocessing, signal, sys, time
sys.path[:0] = {paths}
import distributed
import mixle
from _encoded_helpers import NotePidAndNap, note_pid_and_nap, shard_sum
from mixle.utils.parallel.dask_backend import QUIET_SCHEDULER, DaskEncodedData

signal.signal(signal.SIGINT, signal.default_int_handler)  # never the inherited one
log = {log}
rounds = []


def interrupted(call, enc=None):
    try:
        call()
    except KeyboardInterrupt:
        got = {{"caught_at": time.monotonic(), "children": len(multiprocessing.active_children())}}
        if enc is not None:
            got["broken"] = enc.broken
            start = time.monotonic()
            try:
                enc.map(shard_sum, timeout=5)
            except Exception as exc:
                got["next"] = type(exc).__name__
            got["next_seconds"] = time.monotonic() - start
        rounds.append(got)
    else:
        rounds.append({{"caught_at": None}})


# 1: building on a cluster the handle starts itself
interrupted(lambda: DaskEncodedData(list(range(2)), NotePidAndNap(log, 60), num_workers=1))
# 2: a map on a cluster the handle started
enc = DaskEncodedData(list(range(2)), num_workers=1)
interrupted(lambda: enc.map(note_pid_and_nap, log, 60), enc)
enc.close()
# 3: a map on the user's cluster
cluster = distributed.LocalCluster(
    n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
    dashboard_address=None, scheduler_kwargs=QUIET_SCHEDULER,
)
client = distributed.Client(cluster, set_as_default=False)
enc = DaskEncodedData(list(range(2)), client=client)
interrupted(lambda: enc.map(note_pid_and_nap, log, 60), enc)
enc.close()
print(json.dumps(rounds), flush=True)
client.close()
cluster.close()
"""


def _interrupt_rounds(
    proc: subprocess.Popen[str], log: Path, rounds: int, per_round: int, tmp_path: Path
) -> list[float]:
    """Send SIGINT once the workers of each round have started; the times it was sent."""
    sent = []
    for r in range(1, rounds + 1):
        _wait_for_lines(log, r * per_round, proc, tmp_path)
        sent.append(time.monotonic())
        proc.send_signal(signal.SIGINT)
    return sent


@pytest.mark.slow
def test_ctrl_c_in_a_dask_build_or_map_returns_at_once_and_breaks_the_handle(tmp_path):
    pytest.importorskip("distributed", reason="needs mixle[dask]")
    log = tmp_path / "pids.txt"
    with _child(_DASK_CTRL_C, tmp_path, log=str(log)) as proc:
        sent = _interrupt_rounds(proc, log, 3, 1, tmp_path)
        rounds = _result(proc, tmp_path)
    for at, got in zip(sent, rounds):
        assert got["caught_at"] is not None and got["caught_at"] - at < INTERRUPT_BOUND_S, got
    build, own_map, user_map = rounds
    assert build["children"] == 0 and own_map["children"] == 0  # its own cluster is gone
    for got in (own_map, user_map):
        assert got["broken"] and got["next"] == "BrokenEncodedDataError", got
        assert got["next_seconds"] < AT_ONCE_S, got


_MP_CTRL_C = """
import json, multiprocessing, signal, sys, time
sys.path[:0] = {paths}
import mixle
from _encoded_helpers import NotePidAndNap, note_pid_and_nap, pid_alive, shard_sum
from mixle.utils.parallel.multiprocessing import MPEncodedData

signal.signal(signal.SIGINT, signal.default_int_handler)  # never the inherited one
log = {log}
out = {{}}
if __name__ == "__main__":
    try:  # 1: while the workers build their shards
        MPEncodedData(list(range(4)), NotePidAndNap(log, 60), num_workers=2)
    except KeyboardInterrupt:
        out["build"] = {{"caught_at": time.monotonic(),
                        "children": len(multiprocessing.active_children())}}
    enc = MPEncodedData(list(range(4)), num_workers=2)
    try:  # 2: in a loop of calls
        for epoch in range(3):
            enc.map(note_pid_and_nap, log, 60)
    except KeyboardInterrupt:
        got = {{"caught_at": time.monotonic(), "broken": enc.broken}}
        got["alive"] = [p for p in enc.pids if pid_alive(p)]
        start = time.monotonic()
        try:
            enc.map(shard_sum, timeout=5)
        except Exception as exc:
            got["next"] = type(exc).__name__
        got["next_seconds"] = time.monotonic() - start
        out["map"] = got
    enc.close()
    print(json.dumps(out), flush=True)
"""


def test_ctrl_c_in_an_mp_build_or_map_stops_the_workers(tmp_path):
    log = tmp_path / "pids.txt"
    with _child(_MP_CTRL_C, tmp_path, log=str(log)) as proc:
        sent = _interrupt_rounds(proc, log, 2, 2, tmp_path)
        out = _result(proc, tmp_path)
    build, got = out["build"], out["map"]
    assert build["caught_at"] - sent[0] < INTERRUPT_BOUND_S and build["children"] == 0, out
    assert got["caught_at"] - sent[1] < INTERRUPT_BOUND_S and got["alive"] == [], out
    assert got["broken"] and got["next"] == "BrokenEncodedDataError", out
    assert got["next_seconds"] < AT_ONCE_S, out


# -- the driver dies ----------------------------------------------------------------------
_MP_DRIVER = """
import sys, threading
sys.path[:0] = {paths}
from _encoded_helpers import note_pid_and_nap
from mixle.utils.parallel.multiprocessing import MPEncodedData

if __name__ == "__main__":
    box = []
    build = lambda: box.append(MPEncodedData(list(range(4)), num_workers=2,
                                             start_method={method}, timeout=300))
    if {in_thread}:  # a thread that has exited by the time of the call
        thread = threading.Thread(target=build)
        thread.start()
        thread.join()
    else:
        build()
    box[0].map(note_pid_and_nap, {log}, 300)
"""


@pytest.mark.parametrize(
    ("method", "in_thread"),
    [("spawn", False), ("spawn", True), ("forkserver", False), ("fork", False)],
    ids=["spawn", "built-in-a-thread", "forkserver", "fork"],
)
def test_sigkilled_driver_leaves_no_worker_even_mid_call(tmp_path, method, in_thread):
    log = tmp_path / "pids.txt"
    with _child(_MP_DRIVER, tmp_path, log=str(log), method=method, in_thread=in_thread) as proc:
        pids = _wait_for_lines(log, 2, proc, tmp_path)  # both workers are inside the call
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + ORPHAN_BOUND_S
        while any(map(pid_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [p for p in pids if pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert alive == [], f"workers {alive} outlived their driver by {ORPHAN_BOUND_S} s"


def test_a_handle_built_in_a_thread_that_ended_stays_usable():
    """The death signal follows the forking thread: it is not used off the main thread."""
    box: list[MPEncodedData] = []
    thread = threading.Thread(
        target=lambda: box.append(MPEncodedData(list(range(4)), num_workers=2, timeout=T))
    )
    thread.start()
    thread.join()
    with box[0] as enc:
        time.sleep(0.2)  # time for a death signal to arrive
        assert enc.map(shard_sum) == [2.0, 4.0]
