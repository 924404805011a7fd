"""Faults of the Loader's worker processes, each bounded in time: exceptions, SIGKILL,
timeout, break, close, collection, Ctrl-C, a killed parent, a reader that cannot unpickle.

Every test checks that nothing is left behind: no worker process (the live descendants of
this process, see :func:`_workers`), no child that ``multiprocessing`` still tracks, no
mapping or descriptor of a batch slot (``memfd:mixle-batch``) once the batches are
collected, and nothing in ``/dev/shm`` (see :func:`_shm_entries`).

Child processes (Ctrl-C, a SIGKILLed parent, a script that ends mid-run) run in their own
session, and nothing of that session may be left once they are gone.

Most tests use ``"fork"`` (cheapest); spawn and forkserver where the test is about them
(pickling, orphaning). Timeouts are hang guards; the only timed assertions are "raised or
exited within :data:`RAISE_WITHIN_S`", generous against what the issue asks (a couple of
seconds).
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _loader_worker_child import (
    BATCH,
    ROWS,
    FailingRecordTransform,
    FailingTransform,
    KillAt,
    NapAt,
    Rows,
    table,
)
from _session_child import session_child

import mixle

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and /dev/shm"),
    pytest.mark.usefixtures("frozen_heap"),  # full gc collections scan this module only
]

#: Hang guard for one child process or one wait.
T = 90.0
#: An error, a stop or an exit must come within this many seconds (hang guard, not timing).
RAISE_WITHIN_S = 15.0
#: Stopped or orphaned workers must be gone within this many seconds.
GONE_WITHIN_S = 10.0
#: Batches per epoch.
NB = ROWS // BATCH
#: What a slot is called in ``/proc/<pid>/maps`` and ``/proc/<pid>/fd``.
SLOT_NAME = "memfd:mixle-batch"
_PATHS = [str(Path(__file__).parent), str(Path(mixle.__file__).parents[1])]


def expected(k: int) -> np.ndarray:
    """Batch ``k`` of a run without shuffling."""
    return table()[k * BATCH : (k + 1) * BATCH]


# -- what is left behind ------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, int]]:
    """Pid -> ``(parent pid, session id)`` of every live (not zombie) process, from ``/proc``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone while we looked
            continue
        state, ppid, _, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        if state not in ("Z", "X"):
            found[int(entry)] = (int(ppid), int(sid))
    return found


def _live_children() -> dict[int, list[int]]:
    """Parent pid -> pids of its live children."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in _processes().items():
        kids.setdefault(ppid, []).append(pid)
    return kids


def _session(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (a child started with ``start_new_session`` and
    everything it started, workers, forkserver and resource tracker included)."""
    return {pid: _cmdline(pid)[:200] for pid, (_, s) in _processes().items() if s == sid}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _workers() -> set[int]:
    """Live descendants of this process, less multiprocessing's own long-lived helpers
    (the resource tracker spawn starts, the forkserver): the forkserver's children, which
    are the workers it forked, do count."""
    kids, found = _live_children(), set()
    todo = list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        line = _cmdline(pid)
        helper = "multiprocessing.resource_tracker" in line or (
            "multiprocessing.forkserver" in line and pid in kids.get(os.getpid(), [])
        )
        if not helper:
            found.add(pid)
        todo.extend(kids.get(pid, []))
    return found


def _described(pids: set[int]) -> dict[int, str]:
    """Command lines of ``pids``, for a failure message."""
    return {pid: _cmdline(pid)[:200] for pid in pids}


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status and "\nState:\tX" not in status


def _wait_until(done: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _slot_refs(pid: int | str = "self") -> list[str]:
    """Mappings and descriptors of batch slots held by ``pid``."""
    refs = [
        line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if SLOT_NAME in line
    ]
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):
            link = os.readlink(fds / fd)
            if SLOT_NAME in link:
                refs.append(f"fd {fd} -> {link}")
    return refs


def _shm_refs(pids: set[int]) -> set[str]:
    """Paths under ``/dev/shm`` that this process or ``pids`` maps or holds open."""
    found = set()
    for pid in {"self", *pids}:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    found.add(line[line.index("/dev/shm/") :])
            fds = Path(f"/proc/{pid}/fd")
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    link = os.readlink(fds / fd)
                    if link.startswith("/dev/shm/"):
                        found.add(link)
    return found


def _shm_entries() -> set[str]:
    """Entries of ``/dev/shm`` that mixle could have made.

    ``/dev/shm`` is shared by every process on the machine, and other test runs create
    and leave entries there at the same time (``psm_*`` from ``multiprocessing.shared_memory``
    users, ``sem.mp-*`` from any ``multiprocessing`` lock), so a plain before/after
    comparison would blame this test for them. Two checks instead: exactly, while a run is
    in progress, that neither this process nor its workers map or hold open anything
    under ``/dev/shm`` (:func:`_shm_refs`: slots are memfds, with no name anywhere); and
    here, that no entry with mixle's name appears and stays.
    """
    try:
        return {name for name in os.listdir("/dev/shm") if "mixle" in name.lower()}
    except FileNotFoundError:
        return set()


def _mixle_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("mixle-")}


class Leaks:
    """The state before a test; :meth:`running` checks a run in progress, :meth:`check`
    that nothing was added once it is over."""

    def __init__(self) -> None:
        gc.collect()
        self.workers = _workers()
        self.shm = _shm_entries()
        self.slots = _slot_refs()
        self.threads = _mixle_threads()
        self.children = {p.pid for p in multiprocessing.active_children()}
        # what this process maps in /dev/shm already (e.g. a multiprocessing lock of an
        # earlier test): fork workers inherit it
        self.shm_refs = _shm_refs(set())

    def new_workers(self) -> set[int]:
        return _workers() - self.workers

    def running(self, loader: mixle.Loader) -> tuple[int, ...]:
        """``loader.worker_pids``, checked: they are the new processes, they hand batches
        over in slots (memfds), and nobody maps or holds open anything in ``/dev/shm``."""
        pids = loader.worker_pids
        assert len(pids) == loader.num_workers and set(pids) == self.new_workers(), (
            pids,
            _described(self.new_workers()),
        )
        assert any(_slot_refs(pid) for pid in pids), "no worker holds a slot"
        assert _shm_refs(set(pids)) - self.shm_refs == set()
        return pids

    def check(self) -> None:
        gc.collect()
        assert _wait_until(lambda: not self.new_workers(), GONE_WITHIN_S), (
            f"worker processes left: {_described(self.new_workers())}"
        )
        assert {p.pid for p in multiprocessing.active_children()} <= self.children
        left = set(_slot_refs()) - set(self.slots)  # an earlier failure's traceback may
        assert not left, f"slot mappings or descriptors left after gc: {left}"  # hold some
        assert _shm_entries() - self.shm == set()
        assert _wait_until(lambda: _mixle_threads() <= self.threads, GONE_WITHIN_S), (
            _mixle_threads() - self.threads
        )


@pytest.fixture
def leaks() -> Iterator[Leaks]:
    state = Leaks()
    yield state
    for pid in state.new_workers():  # one failure must not leave processes to the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _drain(loader: mixle.Loader) -> tuple[list[np.ndarray], BaseException | None]:
    """The batches the loop yields (copied), then what it raised."""
    got = []
    try:
        for batch in loader:
            got.append(np.array(batch))
    except Exception as exc:
        return got, exc
    return got, None


# -- exceptions -----------------------------------------------------------------------------
FAIL_AT = 3


def _failing(where: str, kind: str) -> dict[str, Any]:
    """Loader arguments whose ``where`` raises ``kind`` at batch :data:`FAIL_AT`."""
    if where == "get_batch":
        return {"source": Rows(FAIL_AT, kind)}
    if where == "transform":
        return {"source": Rows(), "transform": FailingTransform(FAIL_AT, kind)}
    return {"source": Rows(), "record_transform": FailingRecordTransform(FAIL_AT, kind)}


@pytest.mark.parametrize("where", ["record_transform", "transform", "get_batch"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_exception_arrives_at_its_batch_as_without_workers(leaks, where, method):
    args = _failing(where, "value")
    source = args.pop("source")
    want, want_exc = _drain(mixle.Loader(source, BATCH, **args, num_threads=2))
    assert len(want) == FAIL_AT and type(want_exc) is ValueError

    loader = mixle.Loader(source, BATCH, **args, num_workers=2, worker_start_method=method)
    got, exc = _drain(loader)
    assert len(got) == FAIL_AT
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert type(exc) is ValueError and str(exc) == str(want_exc)
    cause = str(exc.__cause__)
    assert "Traceback (most recent call last)" in cause, cause
    assert "make_error" in cause and f"bad record in {where}" in cause, cause
    assert f"Loader worker {FAIL_AT % 2} (pid " in "\n".join(getattr(exc, "__notes__", [])), exc
    del exc
    leaks.check()


def _rebuilds(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("kind", ["needs-arg", "lock"])
@pytest.mark.parametrize("where", ["record_transform", "transform", "get_batch"])
def test_an_exception_that_does_not_pickle_arrives_as_worker_error(leaks, where, kind):
    args = _failing(where, kind)
    source = args.pop("source")
    want, want_exc = _drain(mixle.Loader(source, BATCH, **args, num_threads=2))
    name = "NeedsArg" if kind == "needs-arg" else "HoldsLock"
    assert len(want) == FAIL_AT and type(want_exc).__name__ == name

    loader = mixle.Loader(source, BATCH, **args, num_workers=2, worker_start_method="fork")
    got, exc = _drain(loader)
    assert len(got) == FAIL_AT and all(np.array_equal(g, w) for g, w in zip(got, want))
    if kind == "needs-arg" and _rebuilds(want_exc):
        # dask's distributed, once imported (by an earlier test), installs tblib's exception
        # pickling process-wide, and that rebuilds NeedsArg: then it arrives as itself
        assert type(exc) is type(want_exc) and str(exc) == str(want_exc), repr(exc)
        assert "bad record in" in str(exc.__cause__)
    else:
        assert type(exc) is mixle.WorkerError, repr(exc)
        assert exc.worker == FAIL_AT % 2 and exc.exc_type == name
        assert "Traceback (most recent call last)" in exc.remote_traceback
        assert f"{name}: " in exc.remote_traceback and "make_error" in exc.remote_traceback
        assert f"bad record in {where}" in str(exc) and "Loader worker 1" in str(exc)
    del exc
    leaks.check()


def test_an_exception_that_only_unpickles_in_the_worker_arrives_as_worker_error(leaks):
    loader = mixle.Loader(
        Rows(),
        BATCH,
        transform=FailingTransform(FAIL_AT, "only-here"),
        num_workers=2,
        worker_start_method="fork",
    )
    got, exc = _drain(loader)
    assert len(got) == FAIL_AT
    if isinstance(exc, RuntimeError) and "only be rebuilt" in str(exc):
        raise exc
    assert type(exc) is mixle.WorkerError and exc.exc_type == "OnlyHere", repr(exc)
    assert "bad record in transform" in exc.remote_traceback
    del exc
    leaks.check()


# -- a worker dies ------------------------------------------------------------------------
def test_a_worker_that_kills_itself_raises_worker_died_error(leaks):
    """The batches before the error are right, and none from the dead worker's batch on.

    How many come first is not pinned: the pool may notice the death when it next sends
    that worker a read (after batch 1 arrives) or at batch 3 itself, and either is prompt.
    """
    loader = mixle.Loader(  # no reader threads: worker 1 sends batch 1 before it reads 3
        Rows(),
        BATCH,
        transform=KillAt(FAIL_AT),
        num_workers=2,
        worker_start_method="fork",
        num_threads=0,
        prefetch=2,
    )
    it = iter(loader)
    got = [np.array(next(it))]
    assert _slot_refs(), "the batches were not handed over in slots"
    # worker 1 dies in batch 3 while the loop still holds batch 0 (it had 1 and 3 to read)
    assert _wait_until(lambda: len(leaks.new_workers()) == 1, T)
    died = time.monotonic()
    with pytest.raises(mixle.WorkerDiedError) as info:  # noqa: PT012
        for _ in range(NB):
            got.append(np.array(next(it)))
    assert time.monotonic() - died < RAISE_WITHIN_S
    assert len(got) <= FAIL_AT and all(np.array_equal(g, expected(k)) for k, g in enumerate(got))
    message = str(info.value)
    assert f"Loader worker {FAIL_AT % 2} (pid " in message and "SIGKILL" in message, message
    assert info.value.worker == FAIL_AT % 2 and loader.worker_pids == ()
    del it, info
    leaks.check()


def _napping(log: Path, at: tuple[int, ...], seconds: float = 30.0, **kwargs: Any) -> mixle.Loader:
    """Two workers (fork unless told), one batch at a time each, that nap ``seconds`` at
    batches ``at``."""
    options = {"worker_start_method": "fork", "num_threads": 0, "prefetch": 2, **kwargs}
    return mixle.Loader(
        Rows(), BATCH, transform=NapAt(at, seconds, str(log)), num_workers=2, **options
    )


def _logged(log: Path, n: int) -> dict[int, int]:
    """Batch -> pid of the first ``n`` workers logged inside their nap."""
    assert _wait_until(lambda: log.exists() and len(log.read_text().split("\n")) > n, T)
    lines = log.read_text().split("\n")[:n]
    return {int(k): int(pid) for pid, k in (line.split() for line in lines)}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_killing_the_worker_the_loop_waits_for_raises_worker_died_error(leaks, tmp_path, method):
    log = tmp_path / "naps.txt"
    loader = _napping(log, (1,), worker_start_method=method)
    it = iter(loader)
    assert np.array_equal(next(it), expected(0))
    pid = _logged(log, 1)[1]  # worker 1 naps in batch 1, which the loop waits for
    assert leaks.running(loader)[1] == pid
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(mixle.WorkerDiedError) as info:
        next(it)
    assert time.monotonic() - killed < RAISE_WITHIN_S
    message = str(info.value)
    assert f"Loader worker 1 (pid {pid}) was killed by SIGKILL" in message, message
    assert info.value.worker == 1 and loader.worker_pids == ()
    del it, info
    leaks.check()


def test_a_worker_killed_while_the_loop_waits_for_another_is_noticed(leaks, tmp_path):
    log = tmp_path / "naps.txt"
    loader = _napping(log, (1,), 10.0)
    it = iter(loader)
    assert np.array_equal(next(it), expected(0))
    assert leaks.running(loader)[1] == _logged(log, 1)[1]  # worker 1 naps in batch 1
    other = loader.worker_pids[0]  # idle, or reading batch 2
    os.kill(other, signal.SIGKILL)
    with pytest.raises(mixle.WorkerDiedError, match=f"Loader worker 0 \\(pid {other}\\)"):
        next(it)  # not batch 1, 10 s later
    del it
    leaks.check()


# -- timeout ------------------------------------------------------------------------------
def test_a_batch_past_timeout_raises_worker_timeout_error_and_stops_the_workers(leaks, tmp_path):
    log = tmp_path / "naps.txt"
    it = iter(_napping(log, (1,), timeout=3.0))  # batch 0 must come within it, even loaded
    assert np.array_equal(next(it), expected(0))
    start = time.monotonic()
    with pytest.raises(mixle.WorkerTimeoutError, match=r"worker 1 .*timeout=3\.0s") as info:
        next(it)
    assert time.monotonic() - start < RAISE_WITHIN_S
    assert info.value.workers == (1,)
    assert _logged(log, 1)  # it was the nap, not a slow start
    del it, info
    leaks.check()


# -- stopping a run -----------------------------------------------------------------------
def _loader(**kwargs: Any) -> mixle.Loader:
    return mixle.Loader(Rows(), BATCH, num_workers=2, worker_start_method="fork", **kwargs)


def test_break_stops_the_workers_and_a_kept_batch_keeps_its_slot(leaks):
    loader = _loader()
    for k, batch in enumerate(loader):
        kept = batch
        if k == 2:
            leaks.running(loader)
            break
    del batch
    assert _wait_until(lambda: not leaks.new_workers(), GONE_WITHIN_S)
    assert np.array_equal(kept, expected(2)) and _slot_refs()  # still mapped, still right
    del kept
    leaks.check()


def test_close_from_another_thread_raises_reads_stopped(leaks, tmp_path):
    log = tmp_path / "naps.txt"
    loader = _napping(log, (2,))
    closed: list[float] = []

    def close() -> None:
        closed.append(time.monotonic())
        loader.close()

    got = []
    with pytest.raises(mixle.ReadsStopped):  # noqa: PT012
        for k, batch in enumerate(loader):
            got.append(int(batch[0, 0]))
            if k == 1:  # the loop is about to wait for batch 2, which naps 30 s
                threading.Timer(0.5, close).start()
            del batch
    assert closed and time.monotonic() - closed[0] < RAISE_WITHIN_S
    assert got == [int(expected(k)[0, 0]) for k in range(2)]
    assert _logged(log, 1)  # the loop was waiting for the nap
    leaks.check()


def test_an_abandoned_iterator_that_is_collected_stops_the_workers(leaks):
    loader = _loader()
    it = iter(loader)
    first = next(it)
    leaks.running(loader)
    del it
    gc.collect()
    assert _wait_until(lambda: not leaks.new_workers(), GONE_WITHIN_S)
    assert np.array_equal(first, expected(0))
    del first
    leaks.check()


def test_close_then_a_new_iter_starts_fresh_workers_at_the_cursor(leaks):
    loader = _loader(shuffle=True, seed=5)
    reference = [np.array(b) for b in mixle.Loader(Rows(), BATCH, shuffle=True, seed=5)]
    it = iter(loader)
    first = [np.array(next(it)) for _ in range(2)]
    old = set(leaks.running(loader))
    loader.close()
    assert loader.worker_pids == ()
    assert _wait_until(lambda: not any(map(pid_alive, old)), GONE_WITHIN_S)
    with pytest.raises(StopIteration):
        next(it)
    rest = []
    for batch in loader:
        rest.append(np.array(batch))
        assert old.isdisjoint(leaks.running(loader))
        del batch
    assert len(first + rest) == NB
    assert all(np.array_equal(g, w) for g, w in zip(first + rest, reference))
    del it
    leaks.check()


# -- child processes ----------------------------------------------------------------------
@contextlib.contextmanager
def _child(args: list[str], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``python -c`` running a scenario of :mod:`_loader_worker_child`, in its own session
    (so it and every process it started can be killed afterwards)."""
    code = f"import sys; sys.path[:0] = {_PATHS!r}; from _loader_worker_child import main; main()"
    with session_child(["-c", code, *args], tmp_path) as proc:
        yield proc


def _stderr(tmp_path: Path) -> str:
    return (tmp_path / "child-stderr.txt").read_text()[-4000:]


def _napping_pids(proc: subprocess.Popen[str], log: Path, tmp_path: Path) -> list[int]:
    """The pids of the child's two workers, once both nap (batches 2 and 3), checked
    against the ``Loader.worker_pids`` the child printed."""

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}):\n{_stderr(tmp_path)}")
        return log.exists() and len(log.read_text().split()) >= 4

    if not _wait_until(ready, T):
        pytest.fail(f"the child's workers never napped:\n{_stderr(tmp_path)}")
    pids = [int(pid) for pid, _ in (line.split() for line in log.read_text().splitlines())]
    assert proc.stdout is not None
    printed = proc.stdout.readline()
    if printed == "starting\n":
        printed = proc.stdout.readline()
    assert printed.startswith("pids "), printed
    assert sorted(pids) == sorted(json.loads(printed[5:])), printed
    assert {proc.pid, *pids} <= set(_session(proc.pid)), _session(proc.pid)
    return pids


@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice"])
def test_ctrl_c_ends_the_loop_promptly_and_leaves_no_worker(tmp_path, signals):
    log, shm = tmp_path / "naps.txt", _shm_entries()
    with _child(["interrupt", "spawn", str(log)], tmp_path) as proc:
        pids = _napping_pids(proc, log, tmp_path)
        time.sleep(0.3)  # the loop now waits for batch 2
        sent = time.monotonic()
        for k in range(signals):
            if k:
                time.sleep(0.2)  # the second Ctrl-C lands while the first one cleans up
            with contextlib.suppress(ProcessLookupError):  # as Ctrl-C: the process group
                os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=T)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child hung after Ctrl-C:\n{_stderr(tmp_path)}")
        exited = time.monotonic()
        gone = _wait_until(lambda: not any(map(pid_alive, pids)), GONE_WITHIN_S)
        alive = [p for p in pids if pid_alive(p)]
        emptied = _wait_until(lambda: not _session(proc.pid), GONE_WITHIN_S)
        leftover = _session(proc.pid)  # before _child kills what is left
    err = _stderr(tmp_path)
    assert proc.returncode in (-signal.SIGINT, 1, 130), err
    assert "KeyboardInterrupt" in err, err
    lines = out.splitlines()  # what _napping_pids did not read already
    assert exited - sent < RAISE_WITHIN_S
    if signals == 1:  # a second Ctrl-C may land in the handler, before the report
        report = json.loads(lines[-1])
        assert report["caught"] - sent < RAISE_WITHIN_S and report["children"] == [], report
    assert gone, f"workers {alive} outlived the interrupted loop"
    assert emptied, f"processes of the interrupted child left: {leftover}"
    assert _shm_entries() - shm == set()


def test_ctrl_c_while_the_workers_start_leaves_nothing_behind(tmp_path):
    log, shm = tmp_path / "naps.txt", _shm_entries()
    with _child(["interrupt-early", "spawn", str(log)], tmp_path) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "starting\n", _stderr(tmp_path)
        time.sleep(0.1)  # spawned workers are importing now
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=T)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child hung after Ctrl-C:\n{_stderr(tmp_path)}")
        exited = time.monotonic()
        left = _wait_until(lambda: not _session(proc.pid), GONE_WITHIN_S)
        leftover = _session(proc.pid)  # before _child kills what is left
    err = _stderr(tmp_path)
    assert proc.returncode in (-signal.SIGINT, 1, 130) and "KeyboardInterrupt" in err, err
    assert exited - sent < RAISE_WITHIN_S
    assert left, f"processes of the interrupted child left: {leftover}"
    assert _shm_entries() - shm == set()


@pytest.mark.parametrize(
    "scenario",
    ["spawn", "forkserver", "fork", "spawn-thread"],
    ids=["spawn", "forkserver", "fork", "started-in-a-thread-that-ended"],
)
def test_workers_of_a_sigkilled_parent_exit_by_themselves(tmp_path, scenario):
    method, _, thread = scenario.partition("-")
    log, shm = tmp_path / "naps.txt", _shm_entries()
    args = ["orphan-thread" if thread else "orphan", method, str(log)]
    with _child(args, tmp_path) as proc:
        pids = _napping_pids(proc, log, tmp_path)  # both workers are inside the transform
        proc.kill()
        proc.wait()
        gone = _wait_until(lambda: not any(map(pid_alive, pids)), GONE_WITHIN_S)
        alive = [p for p in pids if pid_alive(p)]
        emptied = _wait_until(lambda: not _session(proc.pid), GONE_WITHIN_S)
        leftover = _session(proc.pid)  # before _child kills what is left
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert gone, f"workers {alive} outlived their parent by {GONE_WITHIN_S} s"
    assert emptied, f"processes of the killed child left: {leftover}"
    assert _shm_entries() - shm == set()


@pytest.mark.parametrize("scenario", ["exit", "exit-error"])
def test_a_script_that_ends_mid_run_exits_promptly_and_leaves_nothing(tmp_path, scenario):
    log, shm = tmp_path / "naps.txt", _shm_entries()
    with _child([scenario, "spawn", str(log)], tmp_path) as proc:
        pids = _napping_pids(proc, log, tmp_path)
        Path(f"{log}.go").touch()  # the script ends now
        ended = time.monotonic()
        try:
            proc.communicate(timeout=T)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child hung at exit:\n{_stderr(tmp_path)}")
        exited = time.monotonic()
        emptied = _wait_until(lambda: not _session(proc.pid), GONE_WITHIN_S)
        leftover = _session(proc.pid)  # before _child kills what is left
    err = _stderr(tmp_path)
    assert proc.returncode == (1 if scenario == "exit-error" else 0), err
    assert exited - ended < RAISE_WITHIN_S
    assert not any(map(pid_alive, pids)) and emptied, f"left at exit: {leftover}"
    assert _shm_entries() - shm == set()


_MAIN_SOURCE = """
import json, multiprocessing, sys, time
sys.path[:0] = {paths!r}
import numpy as np
import mixle


class Source:  # lives in __main__ of `python -c`: a spawned worker cannot import it
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.zeros(4096, np.float32)


start = time.monotonic()
try:
    for _ in mixle.Loader(Source(), 2, num_workers=1, worker_start_method={method!r}):
        pass
    out = {{"raised": None}}
except Exception as exc:
    out = {{"raised": type(exc).__name__, "message": str(exc)}}
out["seconds"] = time.monotonic() - start
out["children"] = [p.pid for p in multiprocessing.active_children()]
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_reader_the_worker_cannot_unpickle_raises_worker_error_with_advice(method):
    code = textwrap.dedent(_MAIN_SOURCE).format(paths=_PATHS, method=method)
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=T, check=False
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["raised"] == "WorkerError", out
    message = out["message"]
    assert "Loader worker 0" in message and "Source" in message, message
    assert "worker_start_method='fork'" in message and "importable module" in message, message
    assert out["seconds"] < RAISE_WITHIN_S + 10, out  # spawning the worker included
    assert out["children"] == [], out
