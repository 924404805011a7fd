"""DaskEncodedData on a local multi-process Dask cluster: same contract as MPEncodedData."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
from _encoded_helpers import (
    PidRecorder,
    boom,
    boom_if_holds,
    exact_sum,
    fail_encoder,
    identity,
    local_dask_client,
    logged_pids,
    nap,
    patch_means,
    shard_sum,
    square_encoder,
)

import mixle

distributed = pytest.importorskip("distributed", reason="needs mixle[dask]")
from mixle.utils.parallel.dask_backend import DaskEncodedData, scheduler_workers  # noqa: E402

#: Hang guard for every call in this module; no test relies on it for timing.
T = 60


@pytest.fixture(scope="module")
def client() -> Iterator[distributed.Client]:
    """Two single-threaded worker processes on 127.0.0.1, shared by this module's tests.

    ``set_as_default=False`` keeps ``client=None`` meaning "no client yet" in the tests.
    """
    with local_dask_client(2, timeout=T) as dask_client:
        yield dask_client


def _worker_pids(client) -> set[int]:
    client.wait_for_workers(2, timeout=T)
    return set(client.run(os.getpid).values())


def _sources(stores):
    return {
        "zarr": mixle.read_zarr(stores.path("v3.zarr")),
        "hdf5": mixle.read_hdf5(stores.path("volumes.h5"), "gzip"),
        "memmap": mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64),
    }


@pytest.mark.parametrize(
    ("backend", "workers"), [("zarr", 1), ("zarr", 2), ("zarr", 3), ("hdf5", 2), ("memmap", 2)]
)
def test_map_reduce_equals_the_serial_computation(client, stores, backend, workers):
    sampler = mixle.PatchSampler(_sources(stores)[backend], 4, 37, seed=11)
    serial = [float(np.mean(p, dtype=np.float64)) for p, _ in sampler]
    with DaskEncodedData(sampler, client=client, num_workers=workers, timeout=T) as enc:
        assert len(enc) == 37 and enc.num_workers == workers and enc.read_in == "workers"
        means = enc.map_reduce(patch_means)
        assert exact_sum(means) == exact_sum(serial)
        order = np.concatenate([enc.shard_indices(w) for w in range(workers)])
        assert means == [serial[i] for i in order]
        homes = sorted(scheduler_workers(client))
        assert enc.homes == tuple(homes[w % 2] for w in range(workers))


@pytest.mark.parametrize("read_in", ["workers", "auto"])
def test_workers_really_read(client, stores, tmp_path, read_in):
    log = tmp_path / "pids.txt"
    data = PidRecorder(mixle.PatchSampler(_sources(stores)["zarr"], 4, 30, seed=5), log)
    with DaskEncodedData(data, client=client, read_in=read_in, timeout=T) as enc:
        assert enc.read_in == "workers" and enc.num_workers == 2
        assert enc.stats["driver_bytes_read"] == 0
        pids = logged_pids(log)
    assert os.getpid() not in pids
    assert pids == _worker_pids(client)


def test_driver_reads_when_asked(client, stores, tmp_path):
    log = tmp_path / "pids.txt"
    sampler = mixle.PatchSampler(_sources(stores)["hdf5"], 4, 30, seed=5)
    data = PidRecorder(sampler, log)
    with DaskEncodedData(data, client=client, read_in="driver", timeout=T) as enc:
        assert enc.stats["driver_bytes_read"] == 30 * 4**3 * 4
        patches = [p for p, _ in enc.map(identity)]
    assert logged_pids(log) == {os.getpid()}
    for w, shard in enumerate(patches):
        np.testing.assert_array_equal(shard, sampler.get_batch(enc.shard_indices(w))[0])


def test_encoder_sub_chunks_and_args(client):
    with DaskEncodedData(
        list(range(9)), square_encoder, client=client, num_workers=3, sub_chunks=2, timeout=T
    ) as enc:
        assert enc.map(identity) == [[[0, 9], [36]], [[1, 16], [49]], [[4, 25], [64]]]


def test_worker_exception_carries_traceback_and_keeps_the_handle_usable(client):
    data = [np.ones(2) * i for i in range(6)]
    with DaskEncodedData(data, client=client, num_workers=3, timeout=T) as enc:
        with pytest.raises(mixle.WorkerError, match="raised ValueError during map") as info:
            enc.map(boom)
        assert "boom in a worker" in info.value.remote_traceback
        with pytest.raises(mixle.WorkerError) as info:
            enc.map(boom_if_holds, 4.0)  # only shard 1 holds record 4
        assert info.value.worker == 1 and info.value.exc_type == "KeyError"
        assert enc.map(shard_sum) == [6.0, 10.0, 14.0]


def test_encoder_failure_raises_from_the_constructor(client):
    with pytest.raises(mixle.WorkerError, match="RuntimeError during building the shards"):
        DaskEncodedData(list(range(4)), fail_encoder, client=client, timeout=T)


@pytest.mark.parametrize("read_in", ["workers", "driver"])
def test_unpicklable_encoder_is_refused_with_the_fix(client, read_in):
    with pytest.raises(TypeError, match=r"data and encoder must be picklable.*module level"):
        DaskEncodedData(list(range(4)), lambda rs: rs, client=client, read_in=read_in, timeout=T)


def test_timeout_breaks_the_handle(client):
    enc = DaskEncodedData(list(range(4)), client=client, num_workers=1, timeout=T)
    with pytest.raises(mixle.WorkerTimeoutError, match=r"timeout=0.2s.*shards \[0\]"):
        enc.map(nap, 1.0, timeout=0.2)  # short nap: the worker thread cannot be interrupted
    with pytest.raises(mixle.BrokenEncodedDataError, match="ran past timeout"):
        enc.map(shard_sum)
    enc.close()


def test_close_twice_use_after_close_and_factory(client):
    enc = mixle.encoded_data(list(range(4)), backend="dask", client=client, timeout=T)
    assert isinstance(enc, DaskEncodedData) and enc.map(shard_sum) == [2.0, 4.0]
    with enc:
        pass
    enc.close()
    with pytest.raises(mixle.EncodedDataClosedError, match="is closed"):
        enc.map(shard_sum)


def test_workers_are_asked_of_the_scheduler_not_the_client_cache(client, monkeypatch):
    # The client's periodic refresh can leave a cached summary with no workers (CI saw
    # "has no workers" on a two-worker cluster); the constructor must not read that cache.
    monkeypatch.setattr(client, "scheduler_info", lambda *a, **k: {"workers": {}})
    with DaskEncodedData(list(range(4)), client=client, timeout=T) as enc:
        assert enc.num_workers == 2 and enc.map(shard_sum) == [2.0, 4.0]
        assert sorted(enc.homes) == sorted(scheduler_workers(client))


def test_killed_dask_worker_is_reported(client):
    enc = DaskEncodedData(list(range(4)), client=client, num_workers=2, timeout=T)
    pid = client.run(os.getpid, workers=[enc.homes[0]])[enc.homes[0]]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(mixle.WorkerDiedError, match=r"shard 0 on Dask worker .* was lost"):
        enc.map(nap, 0.0)
    with pytest.raises(mixle.BrokenEncodedDataError, match="was lost"):
        enc.map(shard_sum)
    enc.close()
    client.wait_for_workers(2, timeout=T)  # the nanny restarts it for the next tests


def test_without_a_client_it_runs_and_closes_its_own_cluster():
    enc = DaskEncodedData(list(range(4)), num_workers=1, timeout=T)
    own = enc.client
    assert enc.map(shard_sum) == [6.0]
    try:  # its private client does not become the user's default client
        default = distributed.default_client()
    except ValueError:
        default = None
    assert default is not own
    enc.close()
    assert own.status == "closed"
