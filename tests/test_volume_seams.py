"""A collection sampler downstream, unchanged: Loader, JaxLoader, spawn/fork, torch, grain.

Every patch is checked against the writers' own reads (zarr-python, h5py, NumPy) of
tiny volumes of mixed backends and shapes held in one collection.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _volume_seam_helpers import DATASET, batches_in_child, check_batch, write_mixed

import mixle
from mixle import LoaderStateError
from mixle.utils.optional_deps import HAS_JAX

ROOT = Path(__file__).resolve().parents[1]
SIZE = (4, 5, 3)
#: Hang guard for child processes; no test relies on it for timing.
T = 120


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[list[str], list[np.ndarray]]:
    return write_mixed(tmp_path / "vols", count=6)


def _sampler(paths: list[str], num: int = 36, **kwargs: Any) -> Any:
    return mixle.PatchSampler(mixle.read_volumes(paths, dataset=DATASET), SIZE, num, **kwargs)


def _same(a: Any, b: Any) -> None:
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def _same_batches(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _same(a, b)


# -- ground truth ----------------------------------------------------------------------
@pytest.mark.parametrize("dtypes", [None, ["float32", "int16", "uint8"]])
def test_patches_are_numpy_slicing_of_zarr_hdf5_and_npy_volumes_in_one_collection(
    tmp_path: Path, dtypes: list[str] | None
) -> None:
    paths, truth = write_mixed(tmp_path / "vols", dtypes=dtypes)
    cast = None if dtypes is None else "float32"
    vols = mixle.read_volumes(paths, dataset=DATASET, dtype=cast)
    assert [vols.shape(i) for i in range(len(vols))] == [t.shape for t in truth]
    sampler = mixle.PatchSampler(vols, SIZE, 96, seed=5)
    loader = mixle.Loader(sampler, 16, shuffle=True, seed=2)
    seen = np.concatenate([b["volume"] for b in loader])
    assert set(seen.tolist()) == set(range(len(paths)))  # every backend and shape drawn
    total = 0
    for batch in mixle.Loader(sampler, 16, shuffle=True, seed=2):
        assert batch["patch"].dtype == np.float32 and batch["patch"].shape[1:] == SIZE
        total += check_batch(batch, truth, SIZE)
    assert total == 96


# -- Loader ----------------------------------------------------------------------------
def test_a_shuffled_loader_keeps_each_volume_run_whole(mixed) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, 48, seed=4, patches_per_volume=4)
    loader = mixle.Loader(sampler, 8, shuffle=True, seed=9)
    assert loader.shuffle_block == sampler.shuffle_block == 4
    order = []
    for t, batch in enumerate(loader):
        idx = loader.last_indices
        np.testing.assert_array_equal(idx, loader.batch_indices(t, epoch=0))
        _same(batch, sampler.get_batch(idx))
        check_batch(batch, truth, SIZE)
        # blocks of 4 aligned indices, each from one volume, in their own order
        blocks = idx.reshape(-1, 4)
        assert (blocks % 4 == 0)[:, 0].all() and (np.diff(blocks, axis=1) == 1).all()
        assert (batch["volume"].reshape(-1, 4) == batch["volume"][::4, None]).all()
        order.append(idx)
    order = np.concatenate(order)
    assert sorted(order.tolist()) == list(range(48))
    assert not np.array_equal(order, np.arange(48))  # shuffled
    one = mixle.Loader(sampler, 8, shuffle=True, seed=9, shuffle_block=1)
    assert one.shuffle_block == 1


@pytest.mark.parametrize("layout", ["interleaved", "blocked"])
@pytest.mark.parametrize("drop_last", [False, True, "pad"])
def test_shards_read_every_patch_once_and_each_batch_is_its_indices(
    mixed, layout: str, drop_last: Any
) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, 37, seed=6, patches_per_volume=3)
    opts = dict(shuffle=True, seed=1, drop_last=drop_last, num_shards=2, shard_layout=layout)
    shards = [mixle.Loader(sampler, 4, shard_index=s, **opts) for s in range(2)]
    assert all(sh.shuffle_block == 3 for sh in shards)
    seen: list[int] = []
    per_shard = []
    for sh in shards:
        batches = []
        for t, batch in enumerate(sh):
            idx = sh.batch_indices(t, epoch=0)
            real = batch.pop("mask") if drop_last == "pad" else np.ones(idx.size, bool)
            assert batch["patch"].shape[0] == idx.size
            _same(batch, sampler.get_batch(idx))
            check_batch(batch, truth, SIZE)
            seen += idx[real].tolist()
            batches.append(batch)
        per_shard.append(batches)
    assert len(per_shard[0]) == len(per_shard[1])
    if drop_last is True:
        assert len(seen) == len(set(seen)) == 32
    else:
        assert sorted(seen) == list(range(37))
    if layout == "blocked":  # shards stacked in order = one process of the global size
        single = list(mixle.Loader(sampler, 8, **{**opts, "num_shards": 1}))
        for parts, whole in zip(zip(*per_shard), single, strict=True):
            if drop_last == "pad":
                whole.pop("mask")
            _same({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, whole)


@pytest.mark.parametrize("shards", [1, 2])
def test_resume_mid_epoch_over_a_pickled_sampler_gives_the_remaining_batches(
    mixed, shards: int
) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, 45, seed=3, patches_per_volume=3)
    opts = dict(shuffle=True, seed=7, num_epochs=2, num_shards=shards, drop_last="pad")
    loader = mixle.Loader(sampler, 4, shard_index=shards - 1, **opts)
    it = iter(loader)
    head = [next(it) for _ in range(3)]  # mid epoch 0
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 0 and 0 < state["batch"] < len(loader)
    rest = list(it)
    assert len(head) + len(rest) == 2 * len(loader)
    # a pickled copy of the sampler, and one rebuilt from the same paths
    copies = [
        pickle.loads(pickle.dumps(sampler)),
        _sampler(paths, 45, seed=3, patches_per_volume=3),
    ]
    for copy in copies:
        resumed = mixle.Loader(copy, 4, shard_index=shards - 1, **opts)
        resumed.load_state_dict(state)
        _same_batches(list(resumed), rest)
    for batch in head + rest:
        batch = dict(batch)
        mask = batch.pop("mask")
        check_batch({k: v[mask] for k, v in batch.items()}, truth, SIZE)


def test_the_state_fingerprint_covers_the_collection_and_refuses_another(
    tmp_path: Path, mixed
) -> None:
    paths, _ = mixed
    other, _ = write_mixed(tmp_path / "other", count=6)  # same shapes and values, other files

    def state(ps: list[str]) -> dict[str, Any]:
        return mixle.Loader(_sampler(ps, seed=1), 4, shuffle=True).state_dict()

    base = state(paths)
    assert state(list(paths))["source"] == base["source"]  # the same list again
    variants = {
        "reversed": paths[::-1],
        "swapped": [paths[1], paths[0], *paths[2:]],
        "fewer": paths[:-1],
        "other files": other,
        "one replaced": [*paths[:-1], other[-1]],
    }
    fingerprints = {name: state(ps)["source"] for name, ps in variants.items()}
    for name, fp in fingerprints.items():
        assert fp != base["source"], name
    assert len(set(fingerprints.values())) == len(variants)
    for ps in variants.values():
        loader = mixle.Loader(_sampler(ps, seed=1), 4, shuffle=True)
        with pytest.raises(LoaderStateError, match="source"):
            loader.load_state_dict(base)


# -- other processes -------------------------------------------------------------------
@pytest.mark.slow
def test_a_spawned_process_reads_the_same_batches(mixed) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, 30, seed=8, patches_per_volume=2)
    options = dict(shuffle=True, seed=4, num_threads=2)
    want = list(mixle.Loader(sampler, 6, **options))  # the parent has opened its volumes
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        got = pool.submit(batches_in_child, pickle.dumps(sampler), 6, options).result(timeout=T)
    _same_batches(got, want)
    for batch in got:
        check_batch(batch, truth, SIZE)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("max_open", [64, 1])
def test_a_forked_child_reads_the_same_batches_with_inherited_handles(
    tmp_path: Path, mixed, max_open: int
) -> None:
    paths, _ = mixed
    vols = mixle.read_volumes(paths, dataset=DATASET, max_open=max_open)
    sampler = mixle.PatchSampler(vols, SIZE, 30, seed=8, patches_per_volume=2)
    options = dict(shuffle=True, seed=4, num_threads=2)
    want = list(mixle.Loader(sampler, 6, **options))  # handles, pool threads, caches live
    out = tmp_path / "child.pkl"

    def child() -> None:
        batches = list(mixle.Loader(sampler, 6, **options))
        out.write_bytes(pickle.dumps(batches))

    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():  # Python >= 3.12 warns when a process with threads forks
        warnings.simplefilter("ignore", DeprecationWarning)
        proc = ctx.Process(target=child)
        proc.start()
    proc.join(T)
    assert proc.exitcode == 0
    _same_batches(pickle.loads(out.read_bytes()), want)
    _same_batches(list(mixle.Loader(sampler, 6, **options)), want)  # the parent still reads


# -- torch and grain -------------------------------------------------------------------
def _collated(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in batch.items()}


def test_torch_dataloader_in_process_reads_dict_records(mixed) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths, truth = mixed
    sampler = _sampler(paths, 22, seed=2, columns=None)
    order = np.random.default_rng(0).permutation(22).tolist()
    loader = DataLoader(sampler, batch_size=5, sampler=order, num_workers=0)  # type: ignore[arg-type]
    batches = [_collated(b) for b in loader]
    assert [b["patch"].shape[0] for b in batches] == [5, 5, 5, 5, 2]
    for t, batch in enumerate(batches):
        assert set(batch) == {"patch", "coords", "volume"}
        assert batch["coords"].dtype == np.int64 and batch["volume"].dtype == np.int64
        _same(batch, sampler.get_batch(order[5 * t : 5 * t + 5]))
        check_batch(batch, truth, SIZE)


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_with_two_workers_reads_the_same_batches(mixed, context: str) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths, truth = mixed
    sampler = _sampler(paths, 22, seed=2)
    sampler.get_batch(np.arange(22))  # the parent holds handles before the workers start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        loader = DataLoader(
            sampler,  # type: ignore[arg-type]
            batch_size=4,
            num_workers=2,
            timeout=T,
            multiprocessing_context=context,
        )
        batches = [_collated(b) for b in loader]
    assert len(batches) == 6
    for t, batch in enumerate(batches):
        _same(batch, sampler.get_batch(np.arange(4 * t, min(4 * t + 4, 22))))
        check_batch(batch, truth, SIZE)


def test_grain_reads_a_collection_sampler(mixed) -> None:
    grain = pytest.importorskip("grain.python")
    paths, truth = mixed
    sampler = _sampler(paths, 20, seed=3, patches_per_volume=2)
    assert isinstance(sampler, grain.RandomAccessDataSource)
    batched = grain.MapDataset.source(sampler).batch(4)
    for t in range(len(batched)):
        batch = batched[t]
        _same(batch, sampler.get_batch(np.arange(4 * t, 4 * t + 4)))
        check_batch(batch, truth, SIZE)
    shuffled = grain.MapDataset.source(sampler).shuffle(seed=0)
    got = sorted((int(r["volume"]), tuple(r["coords"].tolist())) for r in shuffled)
    want = sorted(
        zip(sampler.volumes_array().tolist(), map(tuple, sampler.coords_array().tolist()))
    )
    assert got == want


# -- JaxLoader (in a fresh interpreter: JAX must stay out of this forking process) -------
JAX_SCRIPT = """
import json, pickle, sys
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import mixle
from mixle.jax import JaxLoader

paths, size = json.loads(sys.argv[1]), (4, 5, 3)
sampler = mixle.PatchSampler(mixle.read_volumes(paths, dataset="img"), size, 38, seed=5,
                             patches_per_volume=2)
mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))
opts = dict(shuffle=True, seed=3, num_epochs=2, drop_last="pad")
jl = JaxLoader(sampler, 8, sharding=sharding, **opts)
want = list(mixle.Loader(sampler, 8, **opts))
out = {"devices": jax.device_count(), "block": jl.loader.shuffle_block, "batches": 0,
       "values_ok": True, "layout_ok": True, "dtypes": None}
it = iter(jl)
head = []
for t, (batch, ref) in enumerate(zip(it, want)):
    out["batches"] += 1
    out["dtypes"] = {k: str(v.dtype) for k, v in batch.items()}
    for k, leaf in batch.items():
        out["layout_ok"] &= leaf.sharding == sharding and len(leaf.addressable_shards) == 4
        out["values_ok"] &= bool(np.array_equal(np.asarray(leaf), ref[k]))
    if t == 2:
        state = jl.state_dict()
        break
jl.close()
resumed = JaxLoader(pickle.loads(pickle.dumps(sampler)), 8, sharding=sharding, **opts)
resumed.load_state_dict(json.loads(json.dumps(state)))
rest = list(resumed)
out["rest"] = len(rest)
out["rest_ok"] = all(
    np.array_equal(np.asarray(b[k]), w[k]) for b, w in zip(rest, want[3:]) for k in w
)
print(json.dumps(out), flush=True)
"""


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def _child(script: str, paths: list[str], path: list[str], env: dict | None = None) -> Any:
    """Run ``script`` with ``paths`` in a fresh interpreter; its last stdout line, as JSON."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), json.dumps(paths)],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=T,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_jax_loader_over_a_collection_sampler_on_four_devices(mixed) -> None:
    paths, _ = mixed
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = _child(JAX_SCRIPT, paths, [str(ROOT)], flags)
    assert out["devices"] == 4 and out["block"] == 2
    assert out["batches"] == 3 and out["values_ok"] and out["layout_ok"]
    assert out["dtypes"] == {
        "patch": "float32",
        "coords": "int32",
        "volume": "int32",
        "mask": "bool",
    }
    assert out["rest"] == 2 * 5 - 3 and out["rest_ok"]


# -- more seams: bounded handles under threads, epochs, specs, dict volumes, grids --------
def test_few_handles_under_reader_threads_give_the_same_batches(mixed) -> None:
    paths, truth = mixed
    wide = _sampler(paths, 64, seed=11)
    narrow = mixle.PatchSampler(
        mixle.read_volumes(paths, dataset=DATASET, max_open=2), SIZE, 64, seed=11
    )
    opts = dict(shuffle=True, seed=5, num_epochs=2)
    want = list(mixle.Loader(wide, 8, num_threads=0, **opts))
    got = list(mixle.Loader(narrow, 8, num_threads=4, prefetch=8, **opts))
    assert max(np.unique(b["volume"]).size for b in got) > 2  # each batch outgrows max_open
    _same_batches(got, want)
    for batch in got:
        check_batch(batch, truth, SIZE)


def test_a_state_resumes_whatever_max_open_but_not_with_another_cast(mixed) -> None:
    paths, _ = mixed

    def loader(**kwargs: Any) -> Any:
        vols = mixle.read_volumes(paths, dataset=DATASET, **kwargs)
        return mixle.Loader(mixle.PatchSampler(vols, SIZE, 24, seed=1), 4, shuffle=True)

    first = loader()
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = list(it)
    again = loader(max_open=1)
    again.load_state_dict(state)
    _same_batches(list(again), rest)
    with pytest.raises(LoaderStateError, match="source"):
        loader(dtype="float64").load_state_dict(state)


def test_set_epoch_draws_new_patches_still_true_and_the_state_follows_it(mixed) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, 30, seed=2, patches_per_volume=3)
    first = sampler.get_batch(np.arange(30))
    state0 = mixle.Loader(sampler, 5).state_dict()
    sampler.set_epoch(1)
    second = sampler.get_batch(np.arange(30))
    assert not np.array_equal(first["coords"], second["coords"])
    check_batch(second, truth, SIZE)
    np.testing.assert_array_equal(second["volume"], sampler.volumes_array())
    loader = mixle.Loader(sampler, 5)
    assert loader.state_dict()["source"] != state0["source"]
    with pytest.raises(LoaderStateError, match="set_epoch"):
        loader.load_state_dict(state0)
    copy = pickle.loads(pickle.dumps(sampler))  # the epoch travels with the pickle
    _same(copy.get_batch(np.arange(30)), second)
    sampler.set_epoch(0)
    _same(sampler.get_batch(np.arange(30)), first)


def test_the_loader_element_spec_is_what_batches_hold(tmp_path: Path) -> None:
    paths, truth = write_mixed(tmp_path / "vols", count=4, dtypes=["int16", "uint8"])
    rows = [{"image": p, "age": 40.5 + i, "site": i % 2} for i, p in enumerate(paths)]
    vols = mixle.read_volumes(rows, dataset=DATASET, dtype="float32")
    sampler = mixle.PatchSampler(vols, SIZE, 18, seed=4, columns=["age", "site"])
    loader = mixle.Loader(sampler, 4, drop_last="pad")
    spec = loader.element_spec()
    batches = list(loader)
    assert len(batches) == 5
    for batch in batches:
        assert set(batch) == set(spec) == {"image", "coords", "volume", "age", "site", "mask"}
        for k, s in spec.items():
            assert (batch[k].shape, batch[k].dtype) == (tuple(s.shape), s.dtype), k
        np.testing.assert_array_equal(batch["age"], 40.5 + batch["volume"])
        np.testing.assert_array_equal(batch["site"], batch["volume"] % 2)
        mask = batch.pop("mask")
        check_batch(
            {"patch": batch["image"][mask], **{k: v[mask] for k, v in batch.items()}}, truth, SIZE
        )


def test_dict_volumes_through_the_loader_and_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    images, _ = write_mixed(tmp_path / "img", count=4)
    label_truth = []
    rows = []
    for i, path in enumerate(images):
        lab = (np.load(path) if path.endswith(".npy") else _read(path)) > 500
        label_truth.append(lab.astype(np.uint8))
        lpath = str(tmp_path / f"label{i}.npy")
        np.save(lpath, label_truth[-1])
        rows.append({"image": path, "label": lpath})
    vols = mixle.read_volumes(rows, dataset={"image": DATASET})
    sampler = mixle.PatchSampler(vols, SIZE, 20, seed=6, patches_per_volume=2)
    image_truth = [_read(p) for p in images]
    batches = list(mixle.Loader(sampler, 4, shuffle=True, seed=1))
    batches += [
        {k: v.numpy() for k, v in b.items()}
        for b in DataLoader(sampler, batch_size=4, num_workers=0)  # type: ignore[arg-type]
    ]
    assert isinstance(next(iter(DataLoader(sampler, batch_size=2)))["label"], torch.Tensor)
    for batch in batches:
        assert set(batch) == {"image", "label", "coords", "volume"}
        check_batch({**batch, "patch": batch["image"]}, image_truth, SIZE)
        check_batch({**batch, "patch": batch["label"]}, label_truth, SIZE)


def _read(path: str) -> np.ndarray:
    """A volume as its writer reads it (zarr-python, h5py or NumPy)."""
    if path.endswith(".zarr"):
        import zarr

        return zarr.open_array(path, mode="r")[...]
    if path.endswith(".h5"):
        import h5py

        with h5py.File(path, "r") as f:
            return f[DATASET][...]
    return np.load(path)


@pytest.mark.parametrize("layout", ["interleaved", "blocked"])
def test_a_grid_over_the_collection_through_sharded_loaders_and_torch(mixed, layout) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths, truth = mixed
    grid = mixle.GridSampler(mixle.read_volumes(paths, dataset=DATASET), SIZE, overlap=1)
    whole = grid.get_batch(np.arange(len(grid)))
    assert set(whole["volume"].tolist()) == set(range(len(paths)))
    check_batch(whole, truth, SIZE)
    seen = []
    for s in range(2):
        loader = mixle.Loader(
            grid, 8, shuffle=True, seed=3, num_shards=2, shard_index=s, shard_layout=layout
        )
        for t, batch in enumerate(loader):
            idx = loader.batch_indices(t, epoch=0)
            np.testing.assert_array_equal(idx, loader.last_indices)
            _same(batch, {k: v[idx] for k, v in whole.items()})
            seen += idx.tolist()
    assert sorted(seen) == list(range(len(grid)))
    first = next(iter(DataLoader(grid, batch_size=8)))  # type: ignore[arg-type]
    _same({k: v.numpy() for k, v in first.items()}, {k: v[:8] for k, v in whole.items()})


def test_a_grain_dataloader_in_process_reads_shuffled_records(mixed) -> None:
    grain = pytest.importorskip("grain.python")
    paths, truth = mixed
    sampler = _sampler(paths, 20, seed=3)
    index = grain.IndexSampler(20, grain.NoSharding(), shuffle=True, num_epochs=1, seed=1)
    loader = grain.DataLoader(
        data_source=sampler, sampler=index, operations=[grain.Batch(4)], worker_count=0
    )
    got = []
    for batch in loader:
        check_batch(batch, truth, SIZE)
        got += zip(batch["volume"].tolist(), map(tuple, batch["coords"].tolist()))
    want = zip(sampler.volumes_array().tolist(), map(tuple, sampler.coords_array().tolist()))
    assert sorted(got) == sorted(want) and len(got) == 20


GRAIN_WORKERS = """
import json, sys
import numpy as np
from absl import flags
import grain.python as grain
import mixle

flags.FLAGS.mark_as_parsed()  # grain's worker processes read its absl flags
if __name__ == "__main__":
    paths = json.loads(sys.argv[1])
    sampler = mixle.PatchSampler(mixle.read_volumes(paths, dataset="img"), (4, 5, 3), 20, seed=3)
    index = grain.IndexSampler(20, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)
    loader = grain.DataLoader(
        data_source=sampler, sampler=index, operations=[grain.Batch(4)], worker_count=2
    )
    rows = []
    for batch in loader:
        rows += [[int(v), c, p] for v, c, p in zip(
            batch["volume"].tolist(), batch["coords"].tolist(),
            [float(np.sum(x, dtype=np.float64)) for x in batch["patch"]])]
    print(json.dumps(rows), flush=True)
"""


@pytest.mark.slow
def test_a_grain_dataloader_with_two_worker_processes_reads_every_record(mixed) -> None:
    pytest.importorskip("grain.python")
    paths, truth = mixed
    sampler = _sampler(paths, 20, seed=3)
    rows = _child(GRAIN_WORKERS, paths, [str(ROOT), str(ROOT / "tests")])
    corners = sampler.coords_array().tolist()
    want = []  # from the writers' reads
    for v, c in zip(sampler.volumes_array().tolist(), corners):
        box = tuple(slice(a, a + p) for a, p in zip(c, SIZE))
        want.append([v, c, float(np.sum(truth[v][box], dtype=np.float64))])
    assert sorted(rows) == sorted(want)  # grain batches per worker: compare the records


def test_without_replacement_each_epoch_visits_every_position_of_every_volume_once(
    mixed,
) -> None:
    paths, truth = mixed
    sampler = _sampler(paths, None, seed=3, replacement=False, stride=SIZE)
    n = len(sampler)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(mixle.Loader(sampler, 7, shuffle=True, seed=epoch))
        seen = [
            (v, tuple(c))
            for b in batches
            for v, c in zip(b["volume"].tolist(), b["coords"].tolist())
        ]
        assert len(seen) == len(set(seen)) == n
        for b in batches:
            check_batch(b, truth, SIZE)
        orders.append(seen)
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])
    grid = set()  # the stride grid of every volume, from the writers' shapes
    for v, t in enumerate(truth):
        counts = [d // p for d, p in zip(t.shape, SIZE)]
        grid |= {(v, tuple(int(m) * p for m, p in zip(ms, SIZE))) for ms in np.ndindex(*counts)}
    assert set(orders[0]) == grid


def _open_sources(paths: list[str]) -> list[Any]:
    """Each volume opened as a mixle source (by its reader), in the order given."""
    out = []
    for p in paths:
        if p.endswith(".zarr"):
            out.append(mixle.read_zarr(p))
        elif p.endswith(".h5"):
            out.append(mixle.read_hdf5(p, DATASET))
        else:
            out.append(mixle.read_volumes([p])[0])
    return out


@pytest.mark.parametrize("given", ["sources", "arrays"])
def test_the_state_of_a_collection_of_open_volumes_refuses_another_order(mixed, given: str) -> None:
    paths, truth = mixed

    def loader(order: list[int]) -> Any:
        items = _open_sources(paths) if given == "sources" else list(truth)
        vols = mixle.read_volumes([items[i] for i in order])
        return mixle.Loader(mixle.PatchSampler(vols, SIZE, 12, seed=1), 4, shuffle=True)

    ahead = list(range(len(paths)))
    state = loader(ahead).state_dict()
    other = loader(ahead[::-1])  # different shapes at every index: other patches
    assert other.state_dict()["source"] != state["source"]
    with pytest.raises(LoaderStateError, match="source"):
        other.load_state_dict(state)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_reader_threads_hold_leases_reads_true_patches_in_the_child(
    tmp_path: Path,
) -> None:
    paths, truth = write_mixed(tmp_path / "vols")
    vols = mixle.read_volumes(paths, dataset=DATASET, max_open=2)  # evicting all the time
    sampler = mixle.PatchSampler(vols, SIZE, 400, seed=1)
    want = sampler.get_batch(np.arange(64))
    codes = []
    for _ in range(5):
        loader = mixle.Loader(sampler, 16, shuffle=True, num_epochs=None, prefetch=8)
        it = iter(loader)
        next(it)  # reader threads are reading ahead, holding leases, when the fork comes
        with warnings.catch_warnings():  # Python >= 3.12 warns when a process with threads forks
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                import signal

                signal.alarm(T)  # a hang in the child ends it instead of the run
                got = sampler.get_batch(np.arange(64))
                same = all(np.array_equal(got[k], want[k]) for k in want)
                check_batch(got, truth, SIZE)
                rest = list(zip(range(3), mixle.Loader(sampler, 16, num_threads=2)))
                code = 0 if same and len(rest) == 3 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        loader.close()
    assert codes == [0] * 5
    _same(sampler.get_batch(np.arange(64)), want)  # and the parent still reads
