"""Loader(num_workers=N): the batches equal the num_workers=0 run exactly, whatever N and the
start method; resume mid-epoch with workers; unpicklable arguments and bad arguments.

Guards of new behaviour (issue 19: process workers): the code before it had no
``num_workers``. Every worker run passes ``timeout=`` as a hang guard only (no test relies
on timing).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _batch_checks import assert_same

import mixle
from mixle.loading.plan import batch_rng, record_rng

#: Hang guard (seconds per batch) for every run with workers; never reached when it works.
T = 60

METHODS = ["spawn", "forkserver", "fork"]


# -- module-level sources and transforms (spawn and forkserver workers import them) ---------
class DictRecords:
    """A map-style source of dict records without ``get_batch`` (read record by record)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        return {
            "x": np.arange(i, i + 6, dtype=np.float32) * 0.5,
            "label": np.int64(i % 3),
            "name": f"record-{i}",
            "pair": (np.float64(i) / 7, np.arange(2, dtype=np.int16) + i),
        }


class Unpicklable:
    """A map-style source holding a lock: it cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(3, int(i))


def _refuse_outside(parent: int) -> Any:
    if os.getpid() != parent:
        raise RuntimeError("this source cannot be rebuilt in another process")
    return BreaksInWorkers()


class BreaksInWorkers(Unpicklable):
    """Pickles (the check at Loader() passes) but cannot be unpickled in a worker."""

    def __reduce__(self) -> Any:
        return _refuse_outside, (os.getpid(),)


def _rebuild_in_worker_0() -> Any:
    """Worker 0 rebuilds the source (and is then slow); every other worker fails to."""
    import multiprocessing
    import time

    if not multiprocessing.current_process().name.endswith("-worker-0"):
        raise RuntimeError("only worker 0 may rebuild this source")
    source = BreaksInOneWorker.__new__(BreaksInOneWorker)
    source.slow = True
    time.sleep(0.5)
    return source


class BreaksInOneWorker:
    """A source that one worker process rebuilds (slowly) and every other fails to."""

    slow = False

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        if self.slow:
            import time

            time.sleep(0.2)
        return np.full(3, int(i))

    def __reduce__(self) -> Any:
        return _rebuild_in_worker_0, ()


def python_heavy_patch(record: Any, rng: np.random.Generator) -> Any:
    """A record transform that holds the GIL (a Python loop) and uses its generator."""
    patch, coords = record
    total = 0.0
    for value in patch.ravel().tolist():
        total += value * value
    noisy = patch + rng.standard_normal(patch.shape).astype(patch.dtype)
    return noisy, coords, np.float64(total) + rng.random()


def python_heavy_dict(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    out = dict(record)
    acc = 0.0
    for value in record["x"].tolist():
        acc += value * rng.random()
    out["x"] = record["x"] * np.float32(rng.standard_normal())
    out["acc"] = np.float64(acc)
    out["name"] = record["name"] + f"-{int(rng.integers(1000))}"
    return out


def flip_with_rng(batch: Any, rng: np.random.Generator) -> Any:
    """A two-argument batch transform: a random flip plus draws kept in the batch."""
    first = batch[0]
    axis = int(rng.integers(1, first.ndim)) if first.ndim > 1 else 0
    return (np.flip(first, axis).copy(), *batch[1:], rng.random(3))


def dict_with_rng(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {**batch, "batch_draw": rng.integers(0, 2**31, size=2)}


def draws_only(batch: Any, rng: np.random.Generator) -> Any:
    """Keep only the batch generator's draws (to check which generator it is)."""
    return rng.integers(0, 2**62, size=4)


class DrawsWith:
    """A callable object taking ``(batch, rng)``: gets the batch generator too."""

    def __call__(self, batch: Any, rng: np.random.Generator) -> Any:
        return draws_only(batch, rng)


def draws_scaled(batch: Any, rng: np.random.Generator, scale: int = 1) -> Any:
    return draws_only(batch, rng) * scale


def draws_if_named_rng(batch: Any, rng: Any = None) -> Any:
    return draws_only(batch, rng)


def scale_rows(batch: Any) -> Any:
    return batch * 2


def fails_at_batch_2(batch: Any, rng: np.random.Generator) -> Any:
    if int(np.asarray(batch).ravel()[0]) == 6:
        raise ValueError("boom at the batch starting with 6")
    return batch


def reader_pid(batch: Any) -> Any:
    return np.array([os.getpid()])


# -- data written by the foreign libraries -----------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import h5py
    import zarr

    root = tmp_path_factory.mktemp("loader-workers")
    rng = np.random.default_rng(19)
    volume = rng.standard_normal((20, 24, 18)).astype(np.float32)
    zpath = str(root / "volume.zarr")
    z = zarr.create_array(zpath, shape=volume.shape, chunks=(8, 8, 8), dtype="float32")
    z[:] = volume
    rows = rng.integers(-1000, 1000, size=(37, 5)).astype(np.int32)
    hpath = str(root / "rows.h5")
    with h5py.File(hpath, "w") as f:
        f.create_dataset("rows", data=rows, chunks=(8, 5))
        f.create_dataset("volume", data=volume, chunks=(5, 6, 9))
    cpath = root / "table.csv"
    lines = ["id,score,name,tag"]
    lines += [f"{i},{i * 0.25 - 3},name-{i:03d},{'abc'[i % 3]}" for i in range(29)]
    cpath.write_text("\n".join(lines) + "\n")
    return {"zarr": zpath, "hdf5": hpath, "csv": str(cpath), "volume": volume, "rows": rows}


def make_source(kind: str, files: dict[str, Any]) -> Any:
    if kind == "zarr-patches":
        return mixle.PatchSampler(mixle.read_zarr(files["zarr"]), (4, 6, 5), 23, seed=3)
    if kind == "hdf5-patches":
        vol = mixle.read_hdf5(files["hdf5"], "volume")
        return mixle.PatchSampler(vol, (5, 4, 7), 19, seed=11)
    if kind == "hdf5-rows":
        return mixle.read_hdf5(files["hdf5"], "rows")
    if kind == "csv":
        return mixle.read_csv(files["csv"])
    if kind == "dicts":
        return DictRecords(26)
    raise AssertionError(kind)


def assert_runs_equal(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want), f"{len(got)} batches != {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {k}")


def reference(source: Any, batch_size: int, **options: Any) -> list[Any]:
    """The run read in this thread (num_workers=0, num_threads=0)."""
    return list(mixle.Loader(source, batch_size, num_threads=0, **options))


# -- equality with num_workers=0 ---------------------------------------------------------
HEAVY = {
    "shuffle": True,
    "shuffle_block": 2,
    "seed": 7,
    "num_epochs": 2,
    "drop_last": "pad",
    "record_transform": python_heavy_patch,
    "transform": flip_with_rng,
}


@pytest.mark.parametrize("method", METHODS)
def test_every_start_method_gives_the_batches_of_one_thread(
    files: dict[str, Any], method: str
) -> None:
    """The heaviest case (zarr patches, shuffle by blocks, a Python record transform with
    its rng, a two-argument transform, pad with mask, 2 epochs, threads in each worker,
    prefetch 1) with each start method."""
    source = make_source("zarr-patches", files)
    want = reference(source, 4, **HEAVY)
    loader = mixle.Loader(
        source,
        4,
        **HEAVY,
        num_workers=2,
        worker_start_method=method,
        num_threads=2,
        prefetch=1,
        timeout=T,
    )
    got = list(loader)
    assert_runs_equal(got, want)
    assert len(got) == 2 * len(loader)
    mask = got[len(loader) - 1][-1]  # the padded last batch of epoch 0: 23 = 5 * 4 + 3
    np.testing.assert_array_equal(mask, [True, True, True, False])


CASES: list[tuple[str, str, int, dict[str, Any]]] = [
    # (source, start method, num_workers, loader options)
    ("zarr-patches", "fork", 1, {"num_threads": 0, "prefetch": 1}),
    ("zarr-patches", "fork", 3, {"shuffle": True, "num_epochs": 3, "drop_last": True}),
    ("hdf5-patches", "fork", 2, {"record_transform": python_heavy_patch, "num_threads": 2}),
    ("hdf5-rows", "fork", 3, {"drop_last": "pad", "transform": scale_rows, "num_threads": 0}),
    ("hdf5-rows", "spawn", 1, {"shuffle": True, "num_epochs": 2, "prefetch": 1}),
    (
        "csv",
        "fork",
        2,
        {"shuffle": True, "shuffle_block": 3, "num_epochs": 2, "drop_last": "pad"},
    ),
    ("csv", "spawn", 3, {"transform": dict_with_rng, "num_threads": 2, "prefetch": 1}),
    (
        "dicts",
        "fork",
        2,
        {"record_transform": python_heavy_dict, "drop_last": "pad", "num_epochs": 2},
    ),
    (
        "dicts",
        "spawn",
        2,
        {"record_transform": python_heavy_dict, "transform": dict_with_rng, "shuffle": True},
    ),
]


@pytest.mark.parametrize(
    ("kind", "method", "workers", "options"),
    CASES,
    ids=[f"{k}-{m}-{w}w-{i}" for i, (k, m, w, _) in enumerate(CASES)],
)
def test_batches_equal_the_run_without_workers(
    files: dict[str, Any], kind: str, method: str, workers: int, options: dict[str, Any]
) -> None:
    source = make_source(kind, files)
    batch_size = 5
    opts = dict(options)
    threads = opts.pop("num_threads", None)
    prefetch = opts.pop("prefetch", None)
    want = reference(source, batch_size, **opts)
    loader = mixle.Loader(
        source,
        batch_size,
        **opts,
        num_workers=workers,
        worker_start_method=method,
        num_threads=threads,
        prefetch=prefetch,
        timeout=T,
    )
    assert loader.num_workers == workers
    assert_runs_equal(list(loader), want)


def test_reference_patches_are_what_zarr_python_reads(files: dict[str, Any]) -> None:
    """The num_workers=0 run the other tests compare against reads what zarr-python reads,
    and so does a worker run."""
    import zarr

    z = zarr.open_array(files["zarr"], mode="r")
    source = make_source("zarr-patches", files)
    for run in (
        reference(source, 6),
        list(mixle.Loader(source, 6, num_workers=2, worker_start_method="fork", timeout=T)),
    ):
        assert sum(len(coords) for _, coords in run) == 23
        for patches, coords in run:
            for patch, corner in zip(patches, coords):
                box = tuple(slice(c, c + s) for c, s in zip(corner, (4, 6, 5)))
                np.testing.assert_array_equal(patch, z[box])


def test_hdf5_rows_are_what_h5py_reads(files: dict[str, Any]) -> None:
    import h5py

    source = make_source("hdf5-rows", files)
    loader = mixle.Loader(
        source, 8, shuffle=True, seed=5, num_workers=2, worker_start_method="fork", timeout=T
    )
    with h5py.File(files["hdf5"], "r") as f:
        rows = f["rows"][()]
    for batch in loader:
        np.testing.assert_array_equal(batch, rows[loader.last_indices])


def test_csv_strings_travel_pickled_and_equal(files: dict[str, Any]) -> None:
    source = make_source("csv", files)
    got = list(mixle.Loader(source, 4, num_workers=2, worker_start_method="fork", timeout=T))
    names = np.concatenate([b["name"] for b in got])
    assert names.dtype == object
    assert names.tolist() == [f"name-{i:03d}" for i in range(29)]
    assert_runs_equal(got, reference(source, 4))


def test_transform_rng_is_batch_rng_and_record_rng_is_record_rng(files: dict[str, Any]) -> None:
    """With workers, transform(batch, rng) gets batch_rng(seed, epoch, batch, shard_index)
    and record_transform gets record_rng(seed, epoch, index) -- checked against the
    functions themselves, not only against the run without workers."""
    source = make_source("hdf5-rows", files)
    seed, shard = 1234, 1
    loader = mixle.Loader(
        source,
        4,
        shuffle=True,
        seed=seed,
        num_epochs=2,
        shard_index=shard,
        num_shards=2,
        transform=draws_only,
        num_workers=2,
        worker_start_method="fork",
        timeout=T,
    )
    nb = len(loader)
    for k, draws in enumerate(loader):
        epoch, batch = divmod(k, nb)
        want = batch_rng(seed, epoch, batch, shard).integers(0, 2**62, size=4)
        np.testing.assert_array_equal(draws, want)

    def first_draw(record: Any, rng: np.random.Generator) -> Any:
        return np.float64(rng.random())

    loader = mixle.Loader(
        source,
        4,
        shuffle=True,
        seed=seed,
        record_transform=first_draw,
        num_workers=2,
        worker_start_method="fork",  # a closure: fork needs no pickling
        timeout=T,
    )
    for draws in loader:
        want = [record_rng(seed, 0, i).random() for i in loader.last_indices.tolist()]
        np.testing.assert_array_equal(draws, want)


@pytest.mark.parametrize(
    "transform",
    [DrawsWith(), functools.partial(draws_scaled, scale=3), draws_if_named_rng],
    ids=["callable-object", "partial", "second-named-rng"],
)
def test_every_form_of_two_argument_transform_gets_batch_rng(transform: Any) -> None:
    scale = 3 if isinstance(transform, functools.partial) else 1
    loader = mixle.Loader(
        np.arange(14),
        4,
        seed=8,
        num_epochs=2,
        transform=transform,
        num_workers=2,
        worker_start_method="spawn" if scale == 3 else "fork",
        timeout=T,
    )
    got = list(loader)
    assert len(got) == 8
    for k, draws in enumerate(got):
        epoch, batch = divmod(k, 4)
        want = batch_rng(8, epoch, batch, 0).integers(0, 2**62, size=4) * scale
        np.testing.assert_array_equal(draws, want)


def test_array_source_padded_gives_batch_and_mask() -> None:
    data = np.arange(11 * 3, dtype=np.float64).reshape(11, 3)
    want = reference(data, 4, drop_last="pad", num_epochs=2)
    got = list(
        mixle.Loader(
            data, 4, drop_last="pad", num_epochs=2, num_workers=2, worker_start_method="fork"
        )
    )
    assert_runs_equal(got, want)
    batch, mask = got[2]
    np.testing.assert_array_equal(mask, [True, True, True, False])
    np.testing.assert_array_equal(batch[:3], data[8:11])


@pytest.mark.parametrize(("method", "workers"), [("fork", 3), ("spawn", 2)])
def test_batch_k_is_read_by_worker_k_mod_n(method: str, workers: int) -> None:
    """The batches really are read in the worker processes, round-robin by batch number."""
    loader = mixle.Loader(
        np.arange(40),
        3,
        transform=reader_pid,
        num_workers=workers,
        worker_start_method=method,
        num_threads=2,
        timeout=T,
    )
    pids = [int(b[0]) for b in loader]
    assert len(pids) == 14
    assert len(set(pids[:workers])) == workers
    assert os.getpid() not in pids
    assert pids == [pids[k % workers] for k in range(len(pids))]


@pytest.mark.parametrize("threads", [0, 2])
def test_an_exception_in_a_worker_is_reraised_at_its_batch(threads: int) -> None:
    """(Faults are another file's; this is the smallest case, found while writing these.)"""
    loader = mixle.Loader(
        np.arange(12),
        3,
        transform=fails_at_batch_2,
        num_workers=2,
        worker_start_method="fork",
        num_threads=threads,
        timeout=T,
    )
    it = iter(loader)
    assert_runs_equal([next(it), next(it)], [np.arange(3), np.arange(3, 6)])
    with pytest.raises(ValueError, match="boom at the batch starting with 6") as info:
        next(it)
    assert "fails_at_batch_2" in str(info.value.__cause__)


def test_more_workers_than_batches_an_empty_shard_and_an_endless_run() -> None:
    got = list(mixle.Loader(np.arange(4), 2, num_workers=5, worker_start_method="fork"))
    assert_runs_equal(got, [np.array([0, 1]), np.array([2, 3])])
    empty = mixle.Loader(
        np.arange(3),
        2,
        shard_index=3,
        num_shards=4,
        drop_last=True,
        num_workers=2,
        worker_start_method="fork",
        timeout=T,
    )
    assert list(empty) == []
    endless = mixle.Loader(
        np.arange(5), 2, num_epochs=None, num_workers=2, worker_start_method="fork", timeout=T
    )
    want = reference(np.arange(5), 2, num_epochs=7)
    got = []
    for k, batch in enumerate(endless):
        got.append(batch)
        if k == 20:
            break
    assert_runs_equal(got, want[:21])
    assert (endless.epoch, endless.state_dict()["batch"]) == (7, 0)
    assert endless.worker_pids == ()


def test_a_new_iter_stops_the_previous_run_and_continues_from_the_cursor() -> None:
    source = make_source("dicts", {})
    want = reference(source, 4, shuffle=True, seed=1)
    loader = mixle.Loader(
        source, 4, shuffle=True, seed=1, num_workers=2, worker_start_method="fork", timeout=T
    )
    first = iter(loader)
    kept = [next(first), next(first)]
    pids = loader.worker_pids
    assert len(pids) == 2
    rest = list(iter(loader))
    assert loader.worker_pids == ()
    assert_runs_equal(kept + rest, want)
    assert next(first, None) is None  # the first run was stopped
    assert not set(pids) & set(int(p) for p in os.listdir("/proc") if p.isdigit())


# -- resume --------------------------------------------------------------------------------
RESUME = {"shuffle": True, "seed": 3, "num_epochs": 2, "drop_last": "pad"}


# 5 batches per epoch: mid epoch 0, the last batch of epoch 0, mid epoch 1
@pytest.mark.parametrize("stop_at", [2, 4, 7])
def test_resume_mid_epoch_with_workers(files: dict[str, Any], stop_at: int) -> None:
    source = make_source("zarr-patches", files)
    options = {**RESUME, "record_transform": python_heavy_patch}
    want = reference(source, 5, **options)
    assert len(want) == 10
    loader = mixle.Loader(
        source, 5, **options, num_workers=2, worker_start_method="fork", prefetch=2, timeout=T
    )
    head = []
    state = None
    for k, batch in enumerate(loader):
        head.append(batch)
        if k == stop_at:
            state = loader.state_dict()
            break
    assert state is not None
    assert_runs_equal(head, want[: stop_at + 1])
    for workers, method in ((2, "spawn"), (0, "spawn"), (2, "fork")):
        fresh = mixle.Loader(
            source,
            5,
            **options,
            num_workers=workers,
            worker_start_method=method,
            timeout=T if workers else None,
        )
        fresh.load_state_dict(state)
        assert_runs_equal(list(fresh), want[stop_at + 1 :])
    # the loader that broke out continues from its own cursor too
    assert_runs_equal(list(loader), want[stop_at + 1 :])


def test_state_from_a_run_without_workers_resumes_with_workers(files: dict[str, Any]) -> None:
    source = make_source("dicts", files)
    options = {"shuffle": True, "seed": 9, "record_transform": python_heavy_dict}
    want = reference(source, 4, **options)
    loader = mixle.Loader(source, 4, **options, num_threads=2)
    for k, _ in enumerate(loader):
        if k == 3:
            state = loader.state_dict()
            break
    fresh = mixle.Loader(source, 4, **options, num_workers=3, worker_start_method="fork")
    fresh.load_state_dict(state)
    assert_runs_equal(list(fresh), want[4:])


# -- what cannot be pickled ----------------------------------------------------------------
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize(
    ("argument", "make"),
    [
        ("transform", lambda: {"transform": lambda batch: batch}),
        ("record_transform", lambda: {"record_transform": lambda record, rng: record}),
        ("source", lambda: {"source": Unpicklable()}),
    ],
    ids=["transform", "record_transform", "source"],
)
def test_unpicklable_argument_raises_type_error_naming_it(
    method: str, argument: str, make: Callable[[], dict[str, Any]]
) -> None:
    kwargs = make()
    source = kwargs.pop("source", np.arange(10))
    with pytest.raises(TypeError, match=rf"^{argument}=.*cannot be pickled.*fork"):
        mixle.Loader(source, 2, num_workers=2, worker_start_method=method, **kwargs)
    mixle.Loader(source, 2, worker_start_method=method, **kwargs)  # no workers: fine


def test_with_fork_a_lambda_and_an_unpicklable_source_work() -> None:
    source = Unpicklable()
    want = reference(source, 3, transform=lambda b: b * 3)
    got = list(
        mixle.Loader(
            source,
            3,
            transform=lambda b: b * 3,
            record_transform=lambda r, rng: r + 1,
            num_workers=2,
            worker_start_method="fork",
            timeout=T,
        )
    )
    assert_runs_equal(got, [w + 3 for w in want])


def test_a_start_error_is_raised_even_while_the_loop_waits_for_another_worker() -> None:
    # a worker that sent its start-up error and exited was reported as dead (with a hint to
    # read stderr, which was empty) when the loop was waiting for another worker's batch
    loader = mixle.Loader(
        BreaksInOneWorker(),
        2,
        num_workers=2,
        num_threads=0,
        worker_start_method="spawn",
        timeout=T,
    )
    with pytest.raises(mixle.WorkerError, match=r"(?s)worker 1 .*starting.*only worker 0"):
        list(loader)


def test_a_source_the_worker_cannot_rebuild_raises_worker_error() -> None:
    loader = mixle.Loader(BreaksInWorkers(), 2, num_workers=1, worker_start_method="spawn")
    with pytest.raises(mixle.WorkerError, match=r"(?s)starting.*cannot be rebuilt"):
        next(iter(loader))


# -- bad arguments ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": -1}, ValueError, r"num_workers=-1 must be an int >= 0"),
        ({"num_workers": True}, TypeError, r"num_workers=True"),
        ({"num_workers": 1.5}, TypeError, r"num_workers=1\.5"),
        ({"num_workers": 1, "worker_start_method": "thread"}, ValueError, r"worker_start_method"),
        ({"worker_start_method": "thread"}, ValueError, r"worker_start_method='thread'.*'spawn'"),
        ({"num_workers": 1, "timeout": 0}, ValueError, r"timeout=0 must be a positive"),
        ({"num_workers": 1, "timeout": -2.5}, ValueError, r"timeout=-2\.5"),
        ({"num_workers": 1, "timeout": float("inf")}, ValueError, r"timeout=inf"),
        ({"num_workers": 1, "timeout": "5"}, TypeError, r"timeout='5'"),
        ({"timeout": 5}, ValueError, r"timeout=5 .*num_workers=0"),
        ({"num_workers": 0, "timeout": 5.0}, ValueError, r"timeout=5\.0 .*num_workers"),
        ({"num_workers": 1, "prefetch": 0}, ValueError, r"prefetch=0"),
    ],
)
def test_bad_worker_arguments_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        mixle.Loader(np.arange(10), 2, **kwargs)


def test_no_process_starts_before_the_first_batch() -> None:
    """Building a Loader with workers starts nothing; the run does (and ends them)."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    loader = mixle.Loader(np.arange(12), 3, num_workers=2, worker_start_method="fork", timeout=T)
    assert set(multiprocessing.active_children()) == before
    assert len(list(loader)) == 4
    assert set(multiprocessing.active_children()) == before


# -- regressions found by review ----------------------------------------------------------
class TextRows:
    """A source whose batches are big object arrays of strings (they travel pickled)."""

    def __init__(self, n: int, width: int = 40) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        return f"{int(i):0{self.width}d}"

    def get_batch(self, indices: np.ndarray) -> np.ndarray:
        return np.array([self[i] for i in indices.tolist()], dtype=object)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def raises_unprintable(batch: Any) -> Any:
    raise UnprintableError("boom")


def sleeps_a_little(batch: Any) -> Any:
    import time

    time.sleep(0.05)
    return batch


class SlowToRebuild:
    """An array source that takes 2 s to unpickle in another process (a slow open)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.pid = array, os.getpid()

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.array[i]

    def __setstate__(self, state: dict[str, Any]) -> None:
        import time

        self.__dict__.update(state)
        if os.getpid() != self.pid:
            time.sleep(2.0)


class _Unloadable:
    """Pickles in the worker, but rebuilding it fails in any other process."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __reduce__(self) -> Any:
        return _load_only_in, (os.getpid(),)


def _load_only_in(pid: int) -> Any:
    if os.getpid() != pid:
        raise ValueError("this object cannot be rebuilt here")
    return _Unloadable()


def returns_unloadable(batch: Any) -> Any:
    return batch, _Unloadable()


def test_a_source_of_64_kib_or_more_passes_the_pickle_check() -> None:
    # protocol 5 hands big buffers to the check's file as PickleBuffer (no len()): a plain
    # array source of 64 KiB was refused as "cannot be pickled"
    source = np.arange(16384, dtype=np.int64).reshape(2048, 8)
    got = list(mixle.Loader(source, 512, num_workers=1, worker_start_method="spawn", timeout=T))
    assert_runs_equal(got, reference(source, 512))


@pytest.mark.parametrize("threads", [0, 2])
def test_big_pickled_batches_do_not_deadlock_the_pipes(threads: int) -> None:
    # a worker reading in its receiving thread blocked replying a batch bigger than the
    # socket buffer while the parent blocked sending the next plans: neither read again
    source = TextRows(120_000)
    loader = mixle.Loader(
        source,
        30_000,
        num_workers=1,
        num_threads=threads,
        prefetch=4,
        worker_start_method="fork",
        timeout=T,
    )
    got = list(loader)
    assert [len(b) for b in got] == [30_000] * 4
    np.testing.assert_array_equal(np.concatenate(got), source.get_batch(np.arange(120_000)))


@pytest.mark.parametrize("threads", [0, 1])
def test_an_exception_whose_str_fails_is_still_reraised(threads: int) -> None:
    # formatting the reply raised in the worker: a reader thread swallowed it (the loop
    # waited forever) and the receiving thread died (reported as a dead worker)
    loader = mixle.Loader(
        np.zeros((8, 2)),
        4,
        transform=raises_unprintable,
        num_workers=1,
        num_threads=threads,
        worker_start_method="fork",
        timeout=T,
    )
    with pytest.raises(UnprintableError):
        next(iter(loader))


def test_fork_workers_do_not_run_the_parents_sigterm_handler(tmp_path: Any) -> None:
    import signal

    marker = tmp_path / "handler-ran"

    def handler(signum: int, frame: Any) -> None:
        marker.write_text(str(os.getpid()))

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        loader = mixle.Loader(
            np.zeros((64, 4)), 2, num_workers=2, worker_start_method="fork", timeout=T
        )
        for _ in loader:
            break  # the workers are terminated with SIGTERM
        loader.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not marker.exists()


def test_timeout_counts_from_the_worker_ready_not_from_its_start() -> None:
    # a worker's start-up (imports, rebuilding the source: 2 s here) counted against
    # batch 0's timeout
    source = SlowToRebuild(np.arange(32.0).reshape(16, 2))
    loader = mixle.Loader(
        source,
        2,
        transform=sleeps_a_little,
        num_workers=1,
        worker_start_method="spawn",
        timeout=1.0,  # far above 0.05 s per batch, below the worker's start-up
    )
    assert_runs_equal(list(loader), reference(source.array, 2))


def test_a_batch_the_parent_cannot_unpickle_raises_worker_error_naming_the_worker() -> None:
    loader = mixle.Loader(
        np.zeros((8, 2)),
        4,
        transform=returns_unloadable,
        num_workers=1,
        worker_start_method="fork",
        timeout=T,
    )
    with pytest.raises(mixle.WorkerError, match=r"worker 0 .*cannot unpickle"):
        next(iter(loader))


def test_a_run_with_no_batch_left_starts_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from mixle.loading.workers import pool

    loader = mixle.Loader(np.zeros((6, 2)), 2, num_workers=2, worker_start_method="fork")
    assert len(list(loader)) == 3
    started: list[int] = []
    real = pool.WorkerPool.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        started.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(pool.WorkerPool, "__init__", counting)
    assert list(loader) == []  # the run is over
    assert started == []


def _socket_inodes() -> set[str]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def reports_sockets(batch: Any) -> Any:
    return {"pid": os.getpid(), "sockets": sorted(_socket_inodes())}


def test_fork_workers_hold_none_of_the_parents_socket_ends() -> None:
    # a fork child kept the parent's ends of every worker's socket (its own included), so
    # it never saw EOF when the parent went away, and leaked descriptors
    loader = mixle.Loader(
        np.zeros((8, 2)),
        4,
        transform=reports_sockets,
        num_workers=2,
        num_threads=0,
        worker_start_method="fork",
        timeout=T,
    )
    it = iter(loader)
    first = next(it)
    parents = {f"socket:[{os.fstat(c.fileno()).st_ino}]" for c in loader._pool._conns}
    reports = [first, next(it)]
    assert {r["pid"] for r in reports} == set(loader.worker_pids)
    for report in reports:
        assert not parents & set(report["sockets"]), report
    it.close()
