"""MPEncodedData: sharding, workers that read their own shard, map/reduce, and faults."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _encoded_helpers import (
    Grouped,
    LoadsOnlyInTheDriver,
    MeanEncoder,
    PidRecorder,
    boom,
    boom_if_holds,
    boom_unprintable,
    exact_sum,
    fail_encoder,
    identity,
    kill_self,
    logged_pids,
    nap,
    patch_means,
    pid_alive,
    pid_of,
    plus,
    shard_sum,
    square_encoder,
)
from hypothesis import given
from hypothesis import strategies as st

import mixle
from mixle.data.index_math.sharding import group_shards, plan_shards
from mixle.utils.parallel.multiprocessing import MPEncodedData

#: Hang guard for every call in this module; no test relies on it for timing.
T = 60


@pytest.fixture(autouse=True)
def _no_leftover_workers():
    yield
    assert multiprocessing.active_children() == []


def _sources(stores):
    return {
        "zarr": mixle.read_zarr(stores.path("v3.zarr")),
        "hdf5": mixle.read_hdf5(stores.path("volumes.h5"), "gzip"),
        "memmap": mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64),
    }


# -- index math ---------------------------------------------------------------------------
@given(st.integers(0, 300), st.integers(1, 9), st.integers(1, 5))
def test_round_robin_shards_are_disjoint_and_cover(n, workers, sub_chunks):
    plan = plan_shards(list(range(n)), n, workers, sub_chunks)
    shards = [plan.shard_indices(w) for w in range(workers)]
    for w, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, np.arange(w, n, workers))
        assert len(plan.pieces[w]) == sub_chunks
        sizes = [len(p) for p in plan.pieces[w]]
        assert max(sizes) - min(sizes) <= 1
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(n))


@given(st.lists(st.integers(0, 12), max_size=200), st.integers(1, 6), st.integers(1, 4))
def test_grouped_shards_keep_groups_whole(keys, workers, sub_chunks):
    plan = plan_shards(Grouped(keys), len(keys), workers, sub_chunks)
    shards = [plan.shard_indices(w) for w in range(workers)]
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(len(keys)))
    owner = {}
    for w, shard in enumerate(shards):
        for i in shard.tolist():
            assert owner.setdefault(keys[i], w) == w  # a group never spans two workers
        # sub-chunks cut at group boundaries too
        seen: dict[int, int] = {}
        for c, piece in enumerate(plan.pieces[w]):
            for i in piece.tolist():
                assert seen.setdefault(keys[i], c) == c
    loads = [s.size for s in shards]
    biggest = max((keys.count(k) for k in set(keys)), default=0)
    assert max(loads) - min(loads) <= biggest


def test_group_shards_is_deterministic_and_balanced():
    keys = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"]
    held = group_shards(keys, 2)
    assert [[g.tolist() for g in w] for w in held] == [
        [[0, 1, 2, 3, 4], [11]],
        [[5, 6, 7], [8, 9, 10]],
    ]


def test_unhashable_group_key_is_named():
    with pytest.raises(TypeError, match=r"group key \[1\] of record 0 is not hashable"):
        group_shards([[1]], 2)


def test_shard_indices_rejects_bad_worker():
    plan = plan_shards(list(range(5)), 5, 2)
    with pytest.raises(IndexError, match="worker=2 is out of range for 2 workers"):
        plan.shard_indices(2)


# -- results ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "workers"), [("zarr", 1), ("zarr", 2), ("zarr", 3), ("hdf5", 2), ("memmap", 2)]
)
def test_map_reduce_equals_the_serial_computation(stores, backend, workers):
    sampler = mixle.PatchSampler(_sources(stores)[backend], 4, 37, seed=11)
    serial = [float(np.mean(p, dtype=np.float64)) for p, _ in sampler]
    with MPEncodedData(sampler, num_workers=workers, timeout=T) as enc:
        assert len(enc) == 37 and enc.num_workers == workers and enc.read_in == "workers"
        means = enc.map_reduce(patch_means)  # lists concatenate in worker order
        assert exact_sum(means) == exact_sum(serial)
        order = np.concatenate([enc.shard_indices(w) for w in range(workers)])
        assert means == [serial[i] for i in order]
        assert enc.stats["driver_bytes_read"] == 0


def test_default_encoder_stacks_like_get_batch(stores):
    sampler = mixle.PatchSampler(_sources(stores)["zarr"], (3, 5, 4), 20, seed=3, stride=2)
    with MPEncodedData(sampler, num_workers=2, timeout=T) as enc:
        for w, (patches, coords) in enumerate(enc.map(identity)):
            want_patches, want_coords = sampler.get_batch(enc.shard_indices(w))
            np.testing.assert_array_equal(patches, want_patches)
            np.testing.assert_array_equal(coords, want_coords)
            assert coords.dtype == np.int64


def test_records_without_get_batch_are_stacked(tmp_path):
    sampler_like = PidRecorder([(np.full(2, i), (i, -i)) for i in range(7)], tmp_path / "log")
    with MPEncodedData(sampler_like, num_workers=2, timeout=T) as enc:
        (patches, coords), _ = enc.map(identity)
    np.testing.assert_array_equal(patches, [[0, 0], [2, 2], [4, 4], [6, 6]])
    np.testing.assert_array_equal(coords, [[0, 0], [2, -2], [4, -4], [6, -6]])


def test_encoders_and_sub_chunks(stores):
    sampler = mixle.PatchSampler(_sources(stores)["memmap"], 3, 10, seed=1)
    serial = [float(np.mean(p, dtype=np.float64)) for p, _ in sampler]
    with MPEncodedData(sampler, MeanEncoder(), num_workers=2, sub_chunks=3, timeout=T) as enc:
        pieces = enc.map(identity)
        assert [len(p) for p in pieces] == [3, 3]  # one encoded piece per sub-chunk
        for w, shard in enumerate(pieces):
            want = [serial[i] for i in enc.shard_indices(w)]
            assert np.concatenate(shard).tolist() == want
    with MPEncodedData(list(range(9)), square_encoder, num_workers=3, timeout=T) as enc:
        assert enc.map(identity) == [[0, 9, 36], [1, 16, 49], [4, 25, 64]]
        assert enc.map(plus, 10, 100) == [113, 113, 113]


def test_grouped_data_sends_whole_groups_to_one_worker():
    keys = [0, 1, 0, 2, 1, 0, 3, 3]
    data = Grouped(keys)
    with MPEncodedData(data, num_workers=2, timeout=T) as enc:
        held = [set(np.asarray(s).ravel().astype(int).tolist()) for s in enc.map(identity)]
    assert held[0] | held[1] == set(range(8)) and not held[0] & held[1]
    assert all(len({w for w in range(2) if i in held[w]}) == 1 for i in range(8))
    for group in set(keys):
        members = {i for i, k in enumerate(keys) if k == group}
        assert members <= held[0] or members <= held[1]


def test_more_workers_than_records_gives_empty_shards():
    with MPEncodedData([np.ones(2)], num_workers=2, timeout=T) as enc:
        assert enc.map(shard_sum) == [2.0, 0.0]


# -- who reads ----------------------------------------------------------------------------
@pytest.mark.parametrize("read_in", ["workers", "auto"])
def test_workers_really_read(stores, tmp_path, read_in):
    log = tmp_path / "pids.txt"
    data = PidRecorder(mixle.PatchSampler(_sources(stores)["zarr"], 4, 30, seed=5), log)
    with MPEncodedData(data, num_workers=2, read_in=read_in, timeout=T) as enc:
        assert enc.read_in == "workers"
        assert len(set(enc.pids)) == 2 and os.getpid() not in enc.pids
        assert enc.stats["bytes_sent"] < 2 * 4096  # the lazy object and a range per worker
        pids = logged_pids(log)
    assert os.getpid() not in pids
    assert pids == set(enc.pids)


def test_driver_reads_when_asked(stores, tmp_path):
    log = tmp_path / "pids.txt"
    sampler = mixle.PatchSampler(_sources(stores)["zarr"], 4, 30, seed=5)
    with MPEncodedData(
        PidRecorder(sampler, log), num_workers=2, read_in="driver", timeout=T
    ) as enc:
        assert enc.read_in == "driver"
        assert enc.stats["driver_bytes_read"] == 30 * 4**3 * 4
        assert exact_sum(enc.map_reduce(patch_means)) == exact_sum(
            [float(np.mean(p, dtype=np.float64)) for p, _ in sampler]
        )
    assert logged_pids(log) == {os.getpid()}


def test_auto_reads_in_the_driver_when_data_pickles_big():
    data = [np.zeros(1000) for _ in range(20)]  # ~160 KB pickled
    with MPEncodedData(data, num_workers=2, timeout=T) as enc:
        assert enc.read_in == "driver" and enc.map(shard_sum) == [0.0, 0.0]


def test_workers_mode_needs_picklable_data():
    data = [lambda: 1]
    with pytest.raises(TypeError, match=r"read_in='workers' needs data that pickles.*'driver'"):
        MPEncodedData(data, num_workers=1, read_in="workers")


def test_workers_mode_takes_data_with_big_array_buffers():
    # protocol 5 hands arrays of 64 KiB or more to the size-counting file as PickleBuffer,
    # which has no len(): such data was refused as "needs data that pickles"
    data = np.arange(2 * 9000, dtype=np.float64).reshape(2, 9000)
    with MPEncodedData(data, num_workers=2, read_in="workers", timeout=T) as enc:
        assert enc.read_in == "workers"
        assert enc.map(shard_sum) == [float(data[0].sum()), float(data[1].sum())]


# -- faults -------------------------------------------------------------------------------
def test_an_exception_whose_str_fails_reaches_the_driver_and_the_handle_stays_usable():
    # formatting the error reply raised in the worker, which died of it: the driver saw a
    # dead worker and a broken handle instead of the worker's error
    with MPEncodedData([np.ones(2) * i for i in range(4)], num_workers=2, timeout=T) as enc:
        with pytest.raises(mixle.WorkerError, match="raised Unprintable") as info:
            enc.map(boom_unprintable)
        assert info.value.exc_type == "Unprintable"
        assert "could not be formatted" in str(info.value)
        assert enc.map(shard_sum) == [4.0, 8.0]


def test_worker_exception_carries_traceback_and_keeps_the_handle_usable():
    with MPEncodedData([np.ones(2) * i for i in range(6)], num_workers=3, timeout=T) as enc:
        with pytest.raises(mixle.WorkerError, match="worker 0 of 3 raised ValueError") as info:
            enc.map(boom)
        assert info.value.worker == 0 and info.value.exc_type == "ValueError"
        assert "boom in a worker" in info.value.remote_traceback
        assert "in boom" in str(info.value)
        with pytest.raises(mixle.WorkerError) as info:
            enc.map(boom_if_holds, 4.0)  # only worker 1 holds record 4
        assert info.value.worker == 1 and info.value.exc_type == "KeyError"
        assert enc.map(shard_sum) == [6.0, 10.0, 14.0]  # no stale replies


def test_sigkilled_worker_is_reported_and_breaks_the_handle():
    enc = MPEncodedData(list(range(4)), num_workers=2, timeout=T)
    os.kill(enc.pids[1], signal.SIGKILL)
    with pytest.raises(mixle.WorkerDiedError, match=r"worker 1 \(pid \d+\) was killed by SIGKILL"):
        enc.map(shard_sum)
    assert enc.broken
    with pytest.raises(mixle.BrokenEncodedDataError, match=r"is broken.*SIGKILL.*build a new one"):
        enc.map(shard_sum)
    enc.close()
    enc.close()


def test_worker_that_kills_itself_mid_call_is_reported():
    with (
        MPEncodedData(list(range(4)), num_workers=2, timeout=T) as enc,
        pytest.raises(mixle.WorkerDiedError, match="killed by SIGKILL during map"),
    ):
        enc.map(kill_self)


def test_timeout_breaks_the_handle_and_stops_the_workers():
    with MPEncodedData(list(range(4)), num_workers=2, timeout=T) as enc:
        assert enc.map(nap, 0.0) == [0, 0]
        with pytest.raises(mixle.WorkerTimeoutError, match=r"timeout=0.2s.*workers \[0, 1\]"):
            enc.map(nap, 30.0, timeout=0.2)
        assert isinstance(mixle.WorkerTimeoutError("x"), TimeoutError)
        assert multiprocessing.active_children() == []  # stopped, not left sleeping
        with pytest.raises(mixle.BrokenEncodedDataError, match="ran past timeout"):
            enc.map(shard_sum)


def test_close_twice_and_use_after_close():
    enc = MPEncodedData(list(range(4)), num_workers=2, timeout=T)
    with enc as same:
        assert same is enc
    assert enc.closed and multiprocessing.active_children() == []
    enc.close()
    with pytest.raises(mixle.EncodedDataClosedError, match="is closed; build a new"):
        enc.map(shard_sum)
    assert "closed" in repr(enc)


def test_encoder_failure_raises_from_the_constructor_and_leaves_no_workers():
    with pytest.raises(mixle.WorkerError, match="RuntimeError during building the shards"):
        MPEncodedData(list(range(4)), fail_encoder, num_workers=2, timeout=T)


def test_unpicklable_fn_is_refused_and_the_handle_stays_usable():
    with MPEncodedData(list(range(4)), num_workers=2, timeout=T) as enc:
        with pytest.raises(TypeError, match=r"must be picklable.*module level"):
            enc.map(lambda shard: 0)
        assert enc.map(shard_sum) == [2.0, 4.0]


def test_arguments_a_worker_cannot_unpickle_raise_its_error_and_keep_the_handle():
    with MPEncodedData(list(range(4)), num_workers=2, timeout=T) as enc:
        with pytest.raises(mixle.WorkerError, match=r"RuntimeError.*cannot be unpickled here"):
            enc.map(plus, LoadsOnlyInTheDriver(), 0)
        assert not enc.broken and enc.map(shard_sum) == [2.0, 4.0]
    with pytest.raises(mixle.WorkerError, match=r"during building the shards.*unpickled"):
        MPEncodedData([LoadsOnlyInTheDriver()], num_workers=1, read_in="driver", timeout=T)


def test_dropped_handle_stops_its_workers():
    enc = MPEncodedData(list(range(4)), num_workers=2, timeout=T)
    assert len(multiprocessing.active_children()) == 2
    del enc
    gc.collect()
    assert multiprocessing.active_children() == []


_EXIT_SCRIPT = """
import json, sys
sys.path[:0] = {paths}
from mixle.utils.parallel.multiprocessing import MPEncodedData
enc = MPEncodedData(list(range(4)), num_workers=2, timeout=60)
print(json.dumps(enc.pids), flush=True)
if {crash}:
    raise SystemExit("driver exits with an error")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("crash", [False, True])
def test_no_orphans_at_interpreter_exit(crash):
    paths = json.dumps([str(Path(__file__).parent), str(Path(mixle.__file__).parents[1])])
    script = textwrap.dedent(_EXIT_SCRIPT).format(paths=paths, crash=crash)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=T, check=False
    )
    assert out.returncode == (1 if crash else 0), out.stderr
    pids = json.loads(out.stdout.splitlines()[0])
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)


# -- arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": 0}, ValueError, "num_workers=0 must be >= 1"),
        ({"num_workers": 1.5}, TypeError, "num_workers=1.5 must be an int"),
        ({"sub_chunks": 0}, ValueError, "sub_chunks=0 must be >= 1"),
        ({"read_in": "disk"}, ValueError, "read_in='disk' must be one of 'auto', 'workers'"),
        ({"start_method": "thread"}, ValueError, "start_method='thread' is not available"),
        ({"timeout": -1}, ValueError, "timeout=-1 must be a positive, finite number"),
        ({"timeout": "1"}, TypeError, "timeout='1' must be a number of seconds"),
        ({"encoder": 3}, TypeError, "encoder=3 must be None"),
    ],
)
def test_bad_arguments_are_named_before_any_worker_starts(kwargs, error, match):
    encoder = kwargs.pop("encoder", None)
    with pytest.raises(error, match=match):
        MPEncodedData(list(range(3)), encoder, **kwargs)


def test_map_rejects_non_callable():
    with (
        MPEncodedData(list(range(2)), num_workers=1, timeout=T) as enc,
        pytest.raises(TypeError, match="fn=3 must be callable"),
    ):
        enc.map(3)


def test_pickled_payload_is_small_for_a_mixle_sampler(stores):
    sampler = mixle.PatchSampler(_sources(stores)["hdf5"], 4, 1000, seed=2)
    with MPEncodedData(sampler, num_workers=2, timeout=T) as enc:
        # each worker gets the pickled sampler and a range: no patch data crosses the pipe
        assert enc.stats["bytes_sent"] < 2 * (len(pickle.dumps(sampler)) + 512)
        assert [len(patches) for patches, _ in enc.map(identity)] == [500, 500]
        assert len(set(enc.map(pid_of))) == 2


# -- registry and package face ------------------------------------------------------------
def test_encoded_data_factory_and_registry():
    with mixle.encoded_data(list(range(4)), backend="mp", num_workers=2, timeout=T) as enc:
        assert isinstance(enc, MPEncodedData) and enc.map(shard_sum) == [2.0, 4.0]
    with pytest.raises(ValueError, match=r"backend='ray' is not a registered.*'dask'"):
        mixle.encoded_data([1], backend="ray")
    with pytest.raises(ValueError, match="name='dask' is already a registered"):
        mixle.register_encoded_data_backend("dask", MPEncodedData)

    calls = []

    def serial_backend(data, encoder, **options):
        calls.append(options)
        return [encoder(list(data))]

    mixle.register_encoded_data_backend("serial-test", serial_backend, replace=True)
    assert mixle.encoded_data([2, 3], square_encoder, backend="serial-test", x=1) == [[4, 9]]
    assert calls == [{"x": 1}]
    assert "serial-test" in mixle.utils.parallel.available_backends()


def test_import_mixle_does_not_import_dask_or_worker_machinery():
    code = (
        "import sys, json, mixle; print(json.dumps([m for m in ('dask', 'distributed', "
        "'multiprocessing.connection', 'mixle.utils.parallel.multiprocessing') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    from mixle.utils.parallel import MPEncodedData as face

    assert face is MPEncodedData is mixle.MPEncodedData
