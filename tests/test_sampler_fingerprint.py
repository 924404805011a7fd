"""Sampler fingerprints: every argument that changes which record an index means is covered.

A Loader's resume state stores the fingerprint; a state saved over one sampler must be
refused by a Loader over a sampler configured differently in any such argument, and must
resume a sampler built the same way exactly.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from mixle import GridSampler, Loader, LoaderStateError, PatchSampler, read_zarr
from mixle.data.schema import Schema
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.data.structure import EXCHANGEABLE, SEQUENTIAL
from mixle.loading.state import source_fingerprint

RNG = np.random.default_rng(15)
VOL = RNG.standard_normal((12, 14)).astype(np.float32)
#: Small integers, so per-block sums are exact whatever order they are added in.
WEIGHTS = RNG.integers(0, 5, (12, 14)).astype(np.float64)
LABELS = (RNG.random((12, 14)) < 0.3).astype(np.uint8)
#: Where patches of 4 can be centred: permuting the maps there keeps every total.
_BOX = (slice(2, 11), slice(2, 13))
WEIGHTS_SWAPPED, LABELS_SWAPPED = WEIGHTS.copy(), LABELS.copy()
WEIGHTS_SWAPPED[_BOX], LABELS_SWAPPED[_BOX] = WEIGHTS[_BOX][::-1, ::-1], LABELS[_BOX][::-1, ::-1]
PROBS = {0: 0.5, 1: 0.5}
#: A 1-D array and one at a third (or a quarter: both round to 3 voxels) of its resolution.
SCALED = {"array": {"a": np.arange(10.0), "b": np.arange(3.0)}, "patch_size": (12,),
          "padding": "constant"}  # fmt: skip


def _geo(origin: float) -> ZarrArraySource:
    """VOL as a one-level OME-Zarr image (spacing 0.5 x 1.0, origin ``(origin, 0)``)."""
    store = zarr.storage.MemoryStore()
    group = zarr.open_group(store=store, mode="w")
    group.create_array("0", data=VOL)
    scale = {"type": "scale", "scale": [0.5, 1.0]}
    shift = {"type": "translation", "translation": [origin, 0.0]}
    ms = {
        "axes": [{"name": "y"}, {"name": "x"}],
        "datasets": [{"path": "0", "coordinateTransformations": [scale, shift]}],
    }
    group.attrs["ome"] = {"version": "0.5", "multiscales": [ms]}
    return ZarrArraySource(store, "0")


#: VOL with a recorded geometry, and moved by 3 along axis 0.
GEO, GEO_MOVED = _geo(0.0), _geo(3.0)

Kwargs = dict[str, Any]
#: For each PatchSampler argument: two configurations that differ in it alone.
PATCH_CASES: dict[str, list[tuple[Kwargs, Kwargs]]] = {
    "array": [
        ({}, {"array": VOL[:, :13]}),  # shape
        ({}, {"array": VOL.astype(np.float64)}),  # dtype
        ({}, {"array": VOL[None], "patch_size": (4, 4)}),  # a leading channel axis
        ({"array": {"a": VOL, "b": VOL}}, {"array": {"a": VOL, "c": VOL}}),  # names
        ({"array": {"a": VOL, "b": VOL}}, {"array": {"b": VOL, "a": VOL}}),  # order
        ({"array": {"array": VOL}}, {}),  # dict records vs (patch, coords)
    ],
    "patch_size": [
        ({}, {"patch_size": 3}),
        ({}, {"patch_size": (4, 5)}),
        ({"array": VOL[None], "patch_size": (4, 4)}, {"array": VOL[None], "patch_size": (1, 4, 4)}),
    ],
    "num_patches": [({}, {"num_patches": 11})],
    "seed": [({}, {"seed": 1}), ({}, {"seed": 2**64 - 1})],
    "epoch": [({}, {"epoch": 1})],
    "stride": [({}, {"stride": 2}), ({"stride": 2}, {"stride": (2, 3)})],
    "replacement": [({}, {"replacement": False})],
    "patches_per_chunk": [({}, {"patches_per_chunk": 2})],
    "region": [({"patches_per_chunk": 2}, {"patches_per_chunk": 2, "region": 6})],
    "padding": [
        ({}, {"padding": "constant"}),
        ({"padding": "edge"}, {"padding": "reflect"}),
    ],
    "pad_value": [({"padding": "constant"}, {"padding": "constant", "pad_value": 1.5})],
    "weights": [
        ({}, {"weights": WEIGHTS}),
        ({"weights": WEIGHTS}, {"weights": WEIGHTS_SWAPPED}),  # same totals, other voxels
    ],
    "labels": [
        (
            {"labels": LABELS, "label_probabilities": PROBS},
            {"labels": LABELS_SWAPPED, "label_probabilities": PROBS},
        ),
        ({"weights": LABELS}, {"labels": LABELS, "label_probabilities": {1: 1.0}}),
    ],
    "label_probabilities": [
        (
            {"labels": LABELS, "label_probabilities": PROBS},
            {"labels": LABELS, "label_probabilities": {0: 0.2, 1: 0.8}},
        ),
        (
            {"labels": LABELS, "label_probabilities": {0: 0.5, 1: 0.5}},
            {"labels": LABELS, "label_probabilities": {1: 0.5, 0: 0.5}},
        ),
    ],
    "scales": [(SCALED, {**SCALED, "scales": {"b": 4}})],  # factor 3 (inferred) or 4
    "world": [
        ({"array": GEO}, {"array": GEO, "world": True}),  # (patch, coords, world) records
        ({"array": GEO, "world": True}, {"array": GEO_MOVED, "world": True}),  # the affine
    ],
    "patch_size_mm": [  # 2 mm: (4, 2) voxels; 3 mm: (6, 3)
        (
            {"array": GEO, "patch_size": None, "patch_size_mm": 2.0},
            {"array": GEO, "patch_size": None, "patch_size_mm": 3.0},
        ),
    ],
}
#: PatchSampler arguments that never change a record, with a value to change them to.
PATCH_EXEMPT: dict[str, Kwargs] = {
    "structure": {"structure": SEQUENTIAL},
    "schema": {"schema": Schema(dtype=np.float32)},
    "progress": {"progress": False},
}
GRID_CASES: dict[str, list[tuple[Kwargs, Kwargs]]] = {
    "array": [
        ({}, {"array": VOL[:, :13]}),
        ({}, {"array": VOL.astype(np.float64)}),
        ({}, {"array": VOL[None]}),
    ],
    "patch_size": [({}, {"patch_size": 5}),
                   ({"array": VOL[None]}, {"array": VOL[None], "patch_size": (1, 4, 4)})],
    "overlap": [({}, {"overlap": 1})],
    "padding": [({}, {"padding": "constant"}), ({"padding": "edge"}, {"padding": "reflect"})],
    "pad_value": [({"padding": "constant"}, {"padding": "constant", "pad_value": 2})],
    "pad_overlap": [({"padding": "edge", "overlap": 2},
                     {"padding": "edge", "overlap": 2, "pad_overlap": True})],
}  # fmt: skip
GRID_EXEMPT: dict[str, Kwargs] = {}
#: Arguments of samplers over a VolumeCollection only; tests/test_volume_patches.py covers them.
COLLECTION_ONLY = {"volume_weights", "patches_per_volume", "columns"}


def patch_sampler(**kwargs: Any) -> PatchSampler:
    return PatchSampler(**{"array": VOL, "patch_size": 4, "num_patches": 10, **kwargs})


def grid_sampler(**kwargs: Any) -> GridSampler:
    return GridSampler(**{"array": VOL, "patch_size": (4, 4), **kwargs})


def _params(cls: type) -> list[str]:
    return [n for n in inspect.signature(cls).parameters if n != "self"]


def _pairs(cases: dict[str, list[tuple[Kwargs, Kwargs]]]) -> list[Any]:
    return [
        pytest.param(a, b, id=f"{name}-{k}")
        for name, pairs in cases.items()
        for k, (a, b) in enumerate(pairs)
    ]


def _leaves(batch: Any) -> list[np.ndarray]:
    return [batch[k] for k in sorted(batch)] if isinstance(batch, dict) else list(batch)


def _records_differ(one: Any, other: Any) -> bool:
    """Whether some index means another record in ``one`` than in ``other``."""
    if len(one) != len(other) or repr(one.element_spec()) != repr(other.element_spec()):
        return True
    got, want = _leaves(one.get_batch(range(len(one)))), _leaves(other.get_batch(range(len(one))))
    return any(not np.array_equal(x, y, equal_nan=True) for x, y in zip(got, want))


SAMPLERS = [
    (PatchSampler, patch_sampler, PATCH_CASES, PATCH_EXEMPT),
    (GridSampler, grid_sampler, GRID_CASES, GRID_EXEMPT),
]


@pytest.mark.parametrize(("cls", "make", "cases", "exempt"), SAMPLERS)
def test_every_constructor_argument_is_covered_or_exempt(
    cls: type, make: Any, cases: dict, exempt: dict
) -> None:
    """A new constructor argument fails here until a case or an exemption names it."""
    params = [n for n in _params(cls) if n not in COLLECTION_ONLY]
    missing = [n for n in params if n not in cases and n not in exempt]
    assert not missing, f"{cls.__name__} arguments without a fingerprint case: {missing}"
    assert not (set(cases) | set(exempt)) - set(params)


@pytest.mark.parametrize(("a", "b"), _pairs(PATCH_CASES))
def test_patch_sampler_argument_changes_fingerprint(a: Kwargs, b: Kwargs) -> None:
    one, other = patch_sampler(**a), patch_sampler(**b)
    assert _records_differ(one, other)  # the case is a real change, not a respelling
    assert one.fingerprint() != other.fingerprint()
    assert source_fingerprint(one) != source_fingerprint(other)
    assert patch_sampler(**a).fingerprint() == one.fingerprint()  # built again: the same


@pytest.mark.parametrize(("a", "b"), _pairs(GRID_CASES))
def test_grid_sampler_argument_changes_fingerprint(a: Kwargs, b: Kwargs) -> None:
    one, other = grid_sampler(**a), grid_sampler(**b)
    assert _records_differ(one, other)
    assert one.fingerprint() != other.fingerprint()
    assert grid_sampler(**a).fingerprint() == one.fingerprint()


@pytest.mark.parametrize("name", sorted(PATCH_EXEMPT))
def test_exempt_arguments_change_neither_records_nor_fingerprint(name: str) -> None:
    one, other = patch_sampler(), patch_sampler(**PATCH_EXEMPT[name])
    assert not _records_differ(one, other)
    assert one.fingerprint() == other.fingerprint()


def test_set_epoch_changes_the_fingerprint_and_the_state() -> None:
    sampler = patch_sampler()
    loader = Loader(sampler, 2, num_threads=0)
    before = loader.state_dict()  # taken before the epoch changes: nothing stale is kept
    sampler.set_epoch(3)
    after = loader.state_dict()
    assert before["source"] != after["source"]
    assert sampler.fingerprint() == patch_sampler(epoch=3).fingerprint()
    with pytest.raises(LoaderStateError, match="another source or sampler configuration"):
        Loader(patch_sampler(), 2).load_state_dict(after)
    with pytest.raises(LoaderStateError, match=r"call set_epoch\(\) with the epoch it had"):
        Loader(patch_sampler(), 2).load_state_dict(after)
    Loader(patch_sampler(epoch=3), 2).load_state_dict(after)
    resumed = patch_sampler()
    resumed.set_epoch(3)
    Loader(resumed, 2).load_state_dict(after)


def test_values_that_do_not_change_records_give_the_same_fingerprint() -> None:
    """Normalised arguments: equivalent spellings must not refuse a resume."""
    same = [
        ({}, {"patch_size": (4, 4), "stride": 1, "seed": 2**64}),
        ({"stride": 2}, {"stride": np.array([2, 2])}),
        ({"padding": "constant", "pad_value": 1}, {"padding": "constant", "pad_value": 1.0}),
        ({"labels": LABELS, "label_probabilities": PROBS},
         {"labels": LABELS, "label_probabilities": {0: 3, 1: 3}}),
        ({}, {"region": 8}),  # region only matters with patches_per_chunk > 1
        ({}, {"pad_value": 7}),  # pad_value only matters with padding="constant"
    ]  # fmt: skip
    for a, b in same:
        assert not _records_differ(patch_sampler(**a), patch_sampler(**b)), (a, b)
        assert patch_sampler(**a).fingerprint() == patch_sampler(**b).fingerprint(), (a, b)


def test_fingerprint_survives_pickling_and_moving_the_store(tmp_path: Path) -> None:
    path = tmp_path / "vol.zarr"
    arr = zarr.create_array(store=str(path), shape=VOL.shape, chunks=(4, 7), dtype=VOL.dtype)
    arr[...] = VOL
    sampler = PatchSampler(read_zarr(path), 4, 10, seed=3, patches_per_chunk=2)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.fingerprint() == sampler.fingerprint()
    moved = tmp_path / "moved.zarr"
    shutil.copytree(path, moved)
    again = PatchSampler(read_zarr(moved), 4, 10, seed=3, patches_per_chunk=2)
    assert again.fingerprint() == sampler.fingerprint()
    other = tmp_path / "rechunked.zarr"
    re = zarr.create_array(store=str(other), shape=VOL.shape, chunks=(6, 7), dtype=VOL.dtype)
    re[...] = VOL
    rechunked = PatchSampler(read_zarr(other), 4, 10, seed=3, patches_per_chunk=2)
    assert rechunked.fingerprint() != sampler.fingerprint()  # another default region


def test_fingerprint_is_the_same_in_another_process() -> None:
    """No hash randomisation, object ids or NumPy-version reprs leak into the digest."""
    code = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, '.')\n"
        "from tests.test_sampler_fingerprint import patch_sampler, grid_sampler, WEIGHTS\n"
        "print(patch_sampler(weights=WEIGHTS, padding='constant', pad_value=2).fingerprint(),"
        " patch_sampler(array={'a': np.zeros((12, 14)), 'b': np.ones((6, 7))},"
        " patch_size=(4, 4)).fingerprint(), grid_sampler(padding='constant').fingerprint())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True
    ).stdout.split()
    here = [
        patch_sampler(weights=WEIGHTS, padding="constant", pad_value=2).fingerprint(),
        patch_sampler(
            array={"a": np.zeros((12, 14)), "b": np.ones((6, 7))}, patch_size=(4, 4)
        ).fingerprint(),
        grid_sampler(padding="constant").fingerprint(),
    ]
    assert out == here


class CountingArray:
    """An in-memory array-like that counts reads of its data."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.shape, self.dtype, self.reads = data, data.shape, data.dtype, 0

    def __getitem__(self, key: Any) -> np.ndarray:
        self.reads += 1
        return self.data[key]


def test_fingerprint_and_resume_check_read_no_data() -> None:
    vol, weights, labels = CountingArray(VOL), CountingArray(WEIGHTS), CountingArray(LABELS)
    samplers = [
        PatchSampler(vol, 4, 10, weights=weights),
        PatchSampler({"v": vol, "w": weights}, 4, 10, labels=labels, label_probabilities=PROBS),
        PatchSampler(vol, 4, 10, padding="reflect", patches_per_chunk=1),
        GridSampler(vol, 4, overlap=1),
    ]
    for arr in (vol, weights, labels):
        arr.reads = 0
    for sampler in samplers:
        sampler.fingerprint()
        state = Loader(sampler, 3, shuffle=True, num_threads=0).state_dict()
        Loader(sampler, 3, shuffle=True, num_threads=0).load_state_dict(state)
    assert (vol.reads, weights.reads, labels.reads) == (0, 0, 0)


# -- the seam: Loader.state_dict() -> load_state_dict() ----------------------------------
def _batches(loader: Loader) -> list[Any]:
    return [tuple(np.asarray(x).copy() for x in b) if isinstance(b, tuple) else b for b in loader]


def _equal(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(g, dict):
            assert g.keys() == w.keys()
            for k in g:
                np.testing.assert_array_equal(g[k], w[k])
        else:
            for x, y in zip(g, w):
                np.testing.assert_array_equal(x, y)


def _saved_after(loader: Loader, batches: int) -> dict[str, Any]:
    state = loader.state_dict()
    for taken, _ in enumerate(loader, start=1):
        state = json.loads(json.dumps(loader.state_dict()))
        if taken == batches:
            break
    loader.close()
    return state


LOADER = {"shuffle": True, "seed": 4, "num_epochs": 2, "num_threads": 0}


@pytest.mark.parametrize(
    ("make", "a", "b"),
    [pytest.param(patch_sampler, *p.values, id="patch-" + p.id) for p in _pairs(PATCH_CASES)]
    + [pytest.param(grid_sampler, *p.values, id="grid-" + p.id) for p in _pairs(GRID_CASES)],
)
def test_state_of_one_sampler_refuses_another_and_resumes_the_same(
    make: Any, a: Kwargs, b: Kwargs
) -> None:
    full = _batches(Loader(make(**a), 2, **LOADER))
    state = _saved_after(Loader(make(**a), 2, **LOADER), 3)
    with pytest.raises(LoaderStateError, match=r"cannot resume: state (source|num_records)"):
        Loader(make(**b), 2, **LOADER).load_state_dict(state)
    resumed = Loader(make(**a), 2, **LOADER)
    resumed.load_state_dict(state)
    _equal(_batches(resumed), full[3:])


def test_array_sources_in_a_loader_are_told_apart_by_dtype_and_shape(tmp_path: Path) -> None:
    """A source handed to the Loader directly: rows of another dtype or shape are refused."""
    state = Loader(read_zarr(_zarr(tmp_path / "a.zarr", VOL)), 2).state_dict()
    for other in (VOL.astype(np.float64), VOL[:, :13]):
        src = read_zarr(_zarr(tmp_path / f"{other.dtype}{other.shape[1]}.zarr", other))
        with pytest.raises(LoaderStateError, match="another source"):
            Loader(src, 2).load_state_dict(state)
    Loader(read_zarr(_zarr(tmp_path / "b.zarr", VOL)), 2).load_state_dict(state)


def _zarr(path: Path, data: np.ndarray) -> Path:
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=(4, 7), dtype=data.dtype)
    arr[...] = data
    return path


def test_exempt_structure_is_still_a_sampler_argument() -> None:
    """``structure`` is exempt from the fingerprint but still checked by the Loader."""
    assert patch_sampler(structure=EXCHANGEABLE).structure == EXCHANGEABLE
    with pytest.raises(ValueError, match="may not be"):
        Loader(patch_sampler(structure=SEQUENTIAL), 2, shuffle=True)
