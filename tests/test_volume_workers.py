"""MPEncodedData and DaskEncodedData over a collection sampler: each worker opens its own
volumes only, the driver reads nothing, and the shards equal the serial computation.

Which volumes a process opens is logged by :class:`_volume_seam_helpers.OpenRecorder`
(Python-level opens through an audit hook; files held open by HDF5 through
``/proc/self/fd``), installed only where the wrapper is unpickled: in the workers.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _volume_seam_helpers import (
    DATASET,
    OpenRecorder,
    VolumeOf,
    check_batch,
    identity,
    open_files,
    opened_volumes,
    patch_sums,
    pid_of,
    record_opens,
    record_sums,
    stop_recording,
    write_mixed,
)

import mixle
from mixle.data.structure import partially_exchangeable
from mixle.utils.parallel.multiprocessing import MPEncodedData

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd"),
]

SIZE = (4, 5, 3)
#: Hang guard for every call; no test relies on it for timing.
T = 60


@pytest.fixture(autouse=True)
def _no_leftover_workers():
    yield
    assert multiprocessing.active_children() == []


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[dict[str, Any]]:
    root = tmp_path / "vols"
    paths, truth = write_mixed(root, count=8)  # zarr, HDF5, .npy in turn
    sampler = mixle.PatchSampler(mixle.read_volumes(paths, dataset=DATASET), SIZE, 6, seed=2)
    names = [Path(p).name for p in paths]
    yield {
        "root": root,
        "log": tmp_path / "opens.log",
        "truth": truth,
        "sampler": sampler,
        "names": names,
    }
    stop_recording()  # also what a Dask scheduler in this process started by unpickling


def _build(make: Callable[[Any], Any], setup: dict[str, Any]) -> Any:
    """Build the handle while this process records its opens; none may happen here."""
    root, log = setup["root"], setup["log"]
    held = open_files(root)  # the sampler's constructor read volume 0's metadata
    record_opens(root, log)
    enc = make(OpenRecorder(setup["sampler"], root, log))
    enc.map(pid_of)
    assert enc.read_in == "workers"  # chosen by "auto": the sampler pickles small
    assert enc.stats["driver_bytes_read"] == 0
    assert open_files(root) <= held
    assert os.getpid() not in opened_volumes(log, root)
    stop_recording()
    return enc


def _check(enc: Any, setup: dict[str, Any], pids: list[int]) -> None:
    sampler, names = setup["sampler"], setup["names"]
    opened = opened_volumes(setup["log"], setup["root"])
    assert set(opened) <= set(pids), {p: sorted(v) for p, v in opened.items()}
    shards = [enc.shard_indices(w) for w in range(enc.num_workers)]
    # what each worker's records need (index math; it reads shapes here, after the log)
    own = [{names[v] for v in sampler.volumes_array(s).tolist()} for s in shards]
    # the check means something: the workers' volumes differ and none needs all of them
    assert own[0] != own[1] and all(len(o) < len(names) for o in own)
    for w, pid in enumerate(pids):
        assert opened.get(pid, set()) == own[w], (w, shards[w])
    # the shards equal the serial computation here, and the writers' reads
    got = enc.map(identity)
    for w, shard in enumerate(got):
        want = sampler.get_batch(shards[w])
        assert set(shard) == set(want)
        for k in want:
            np.testing.assert_array_equal(shard[k], want[k])
        check_batch(shard, setup["truth"], SIZE)
    sums = enc.map_reduce(patch_sums)
    order = np.concatenate(shards)
    serial = [float(np.sum(p, dtype=np.float64)) for p in sampler.get_batch(order)["patch"]]
    assert sums == serial


def test_mp_workers_open_only_the_volumes_of_their_own_records(setup) -> None:
    with _build(lambda data: MPEncodedData(data, num_workers=2, timeout=T), setup) as enc:
        assert enc.map(pid_of) == list(enc.pids)
        _check(enc, setup, list(enc.pids))


def test_dask_workers_open_only_the_volumes_of_their_own_records(setup) -> None:
    pytest.importorskip("distributed", reason="needs mixle[dask]")
    from _encoded_helpers import local_dask_client

    from mixle.utils.parallel.dask_backend import DaskEncodedData

    with local_dask_client(2, timeout=T) as client:

        def make(data: Any) -> Any:
            return DaskEncodedData(data, client=client, num_workers=2, timeout=T)

        with _build(make, setup) as enc:
            pids = enc.map(pid_of)
            assert len(set(pids)) == 2
            _check(enc, setup, pids)


def test_forked_mp_workers_with_an_encoder_in_pieces_equal_the_serial_encoding(setup) -> None:
    sampler = setup["sampler"]
    sampler.get_batch(np.arange(len(sampler)))  # the driver holds handles when it forks
    with warnings.catch_warnings():  # Python >= 3.12 warns when a process with threads forks
        warnings.simplefilter("ignore", DeprecationWarning)
        enc = MPEncodedData(
            sampler, record_sums, num_workers=2, sub_chunks=2, start_method="fork", timeout=T
        )
    with enc:
        assert enc.read_in == "workers" and enc.stats["driver_bytes_read"] == 0
        for w, pieces in enumerate(enc.map(identity)):
            shard = enc.shard_indices(w)
            assert len(pieces) == 2
            got = np.concatenate(pieces)
            np.testing.assert_array_equal(got, record_sums([sampler[int(i)] for i in shard]))


def test_read_in_driver_counts_the_bytes_the_driver_read(setup) -> None:
    sampler = setup["sampler"]
    with MPEncodedData(sampler, num_workers=2, read_in="driver", timeout=T) as enc:
        got = enc.map(identity)
        want = sum(
            sum(v.nbytes for v in sampler.get_batch(enc.shard_indices(w)).values())
            for w in range(2)
        )
        assert enc.stats["driver_bytes_read"] == want > 0
        for shard in got:
            check_batch(shard, setup["truth"], SIZE)


def _grouped(setup: dict[str, Any], by: Any) -> Any:
    vols = setup["sampler"].collection
    return mixle.PatchSampler(vols, SIZE, 12, seed=2, structure=partially_exchangeable(by))


def test_workers_grouped_by_volume_hold_disjoint_volumes_and_open_only_those(setup) -> None:
    by = VolumeOf()
    sampler = by.sampler = _grouped(setup, by)
    keys = [by(i) for i in range(len(sampler))]  # metadata only, before the driver records
    setup["sampler"] = sampler
    with _build(lambda data: MPEncodedData(data, num_workers=2, timeout=T), setup) as enc:
        held = [set(np.asarray(keys)[enc.shard_indices(w)].tolist()) for w in range(2)]
        assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(keys)
        _check(enc, setup, list(enc.pids))


def test_grouping_by_the_volume_field_reads_nothing_in_the_driver_or_counts_it(
    setup, monkeypatch
) -> None:
    sampler = _grouped(setup, "volume")
    calls: list[int] = []
    read = type(sampler).get_batch

    def counted(self: Any, indices: Any) -> Any:
        calls.append(int(np.size(indices)))
        return read(self, indices)

    monkeypatch.setattr(type(sampler), "get_batch", counted)  # in the driver only (spawn)
    with MPEncodedData(sampler, num_workers=2, timeout=T) as enc:
        assert enc.read_in == "workers"
        assert not calls or enc.stats["driver_bytes_read"] > 0, (calls, enc.stats)


def test_a_collection_from_a_csv_table_shards_to_workers_by_reference(setup, tmp_path) -> None:
    paths = [str(setup["root"] / n) for n in setup["names"]]
    csv = tmp_path / "volumes.csv"  # outside the volumes' folder: its reads are not logged
    csv.write_text("path,age\n" + "".join(f"{p},{30 + i}\n" for i, p in enumerate(paths)))
    vols = mixle.read_volumes(mixle.read_csv(str(csv)), table_columns="path", dataset=DATASET)
    setup["sampler"] = mixle.PatchSampler(vols, SIZE, 6, seed=2, columns=["age"])
    with _build(lambda data: MPEncodedData(data, num_workers=2, timeout=T), setup) as enc:
        _check(enc, setup, list(enc.pids))
        for shard in enc.map(identity):
            np.testing.assert_array_equal(shard["age"], 30 + shard["volume"])
