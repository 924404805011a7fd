"""Module paths from before the layered layout import as the very same modules."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mixle
from mixle._moved import MOVED

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_the_new_module(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is importlib.import_module(new)


def test_every_new_home_exists_and_no_old_path_is_a_file() -> None:
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (REPO / Path(*old.split("."))).with_suffix(".py").exists(), old


def test_old_paths_import_in_a_fresh_process_without_import_mixle_first() -> None:
    code = (
        "from mixle.data.sources.zarr_source import ZarrArraySource\n"
        "from mixle.data.grid import GridSampler\n"
        "from mixle.utils.parallel.sharding import plan_shards\n"
        "from mixle.data.sources.records import MemorySource\n"
        "import mixle.data.sources.hdf5_chunks as old\n"
        "print(ZarrArraySource.__module__, GridSampler.__module__, plan_shards.__module__,"
        " MemorySource.__module__, old.__name__)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "mixle.data.sources.arrays.zarr.source",
        "mixle.data.sampling.grid",
        "mixle.data.index_math.sharding",
        "mixle.data.sources.records.base",
        "mixle.data.sources.arrays.hdf5.chunks",
    ]


OLD_NAME = {new: old for old, new in MOVED.items() if "index_math.sharding" not in new}
OLD_NAME["mixle.data.sources.records.base"] = "mixle.data.sources.records"


def _as_before_the_move(payload: bytes) -> bytes:
    """A protocol-2 pickle with every module path spelled as before the move."""
    for new in sorted(OLD_NAME, key=len, reverse=True):
        payload = payload.replace(f"{new}\n".encode(), f"{OLD_NAME[new]}\n".encode())
    return payload


def _sources(tmp_path: Path) -> dict[str, object]:
    zarr = pytest.importorskip("zarr")
    h5py = pytest.importorskip("h5py")
    data = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    zarr.create_array(tmp_path / "v.zarr", data=data, chunks=(2, 3, 4))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("v", data=data, chunks=(2, 3, 4), compression="gzip")
    data.tofile(tmp_path / "v.raw")
    np.save(tmp_path / "v.npy", data)
    (tmp_path / "t.csv").write_text("a,b\n1,x\n2,y\n")
    (tmp_path / "t.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    src = mixle.read_zarr(tmp_path / "v.zarr")
    return {
        "zarr": src,
        "hdf5": mixle.read_hdf5(tmp_path / "v.h5", "v"),
        "memmap": mixle.read_memmap(tmp_path / "v.raw", shape=data.shape, dtype=data.dtype),
        "npy": mixle.read_npy(tmp_path / "v.npy"),
        "csv": mixle.read_csv(tmp_path / "t.csv"),
        "jsonl": mixle.read_jsonl(tmp_path / "t.jsonl"),
        "memory": mixle.MemorySource({"a": np.arange(3)}),
        "patches": mixle.PatchSampler(src, (2, 3, 4), 5, seed=1),
        "grid": mixle.GridSampler(src, (2, 3, 4)),
    }


def test_pickles_that_name_the_old_module_paths_load(tmp_path: Path) -> None:
    """What ``pickle.dumps`` wrote before the move (classes and helpers by their old paths)."""
    for name, obj in _sources(tmp_path).items():
        payload = _as_before_the_move(pickle.dumps(obj, protocol=2))
        assert not any(f"{new}\n".encode() in payload for new in OLD_NAME), name
        assert any(f"{old}\n".encode() in payload for old in OLD_NAME.values()), name
        again = pickle.loads(payload)
        assert type(again) is type(obj), name
        np.testing.assert_equal(again[0], obj[0], err_msg=name)  # type: ignore[index]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("mixle.reading.faults.DEFAULT_REQUEST_TIMEOUT", "mixle.reading.policy"),
        ("mixle.reading.faults.RetryPolicy", "mixle.reading.policy"),
        ("mixle.reading.faults.set_retry_policy", "mixle.reading.policy"),
        ("mixle.reading.faults.STOP_POLL_S", "mixle.reading.stopping"),
        ("mixle.reading.faults.stop_when", "mixle.reading.stopping"),
        ("mixle.reading.fetch.MAX_INFLIGHT_BYTES", "mixle.reading.inflight"),
        ("mixle.reading.fetch.coalesce_ranges", "mixle.reading.inflight"),
        ("mixle.reading.fetch.widen_connection_pool", "mixle.reading.fs_options"),
    ],
)
def test_names_the_docs_showed_under_a_split_module_still_import_from_it(
    old: str, new: str
) -> None:
    module, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(module), name) is getattr(
        importlib.import_module(new), name
    )
