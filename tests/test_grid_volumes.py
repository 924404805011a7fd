"""GridSampler over a VolumeCollection, and stitching its predictions into one output per volume.

Ground truth is each writing library's own read (zarr-python, h5py, ``np.load``), sliced and
padded with NumPy.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sampling.grid_volumes import VolumeGridSampler
from mixle.data.sampling.stitch import GridAggregator, stitch, volume_array_names
from mixle.loading.state import source_fingerprint

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")

SHAPES = [(11, 9, 14), (7, 12, 8), (16, 10, 10)]


def _volume(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 200, shape).astype(dtype)


def _write(tmp_path: Path, arrays: list[np.ndarray], tag: str = "") -> list[str]:
    """Volume 0 as zarr, 1 as HDF5 (dataset ``"x"``), 2 as .npy; more cycle through them."""
    paths = []
    for i, a in enumerate(arrays):
        kind = i % 3
        if kind == 0:
            path = str(tmp_path / f"v{tag}{i}.zarr")
            z = zarr.create_array(path, shape=a.shape, dtype=a.dtype, chunks=(4,) * a.ndim)
            z[...] = a
        elif kind == 1:
            path = str(tmp_path / f"v{tag}{i}.h5")
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=a, chunks=tuple(min(3, n) for n in a.shape))
        else:
            path = str(tmp_path / f"v{tag}{i}.npy")
            np.save(path, a)
        paths.append(path)
    return paths


def _truth(path: str) -> np.ndarray:
    """The writing library's own read of a volume written by :func:`_write`."""
    if path.endswith(".zarr"):
        return np.asarray(zarr.open_array(path, mode="r")[...])
    if path.endswith(".h5"):
        with h5py.File(path, "r") as f:
            return np.asarray(f["x"][...])
    return np.load(path)


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Any, list[np.ndarray]]:
    """A collection of a zarr, an HDF5 and an .npy volume of different shapes, and their truth."""
    paths = _write(tmp_path, [_volume(s, i) for i, s in enumerate(SHAPES)])
    return mixle.read_volumes(paths, dataset="x"), [_truth(p) for p in paths]


def _expected_tile(
    truth: np.ndarray, corner: np.ndarray, patch: tuple[int, ...], padding: str, pad_value: float
) -> np.ndarray:
    lead = truth.ndim - len(patch)
    if padding == "none":
        box = tuple(slice(c, c + p) for c, p in zip(corner.tolist(), patch))
        return truth[(Ellipsis, *box)]
    pad = [(0, 0)] * lead + [(p, p) for p in patch]
    kw = {"constant_values": pad_value} if padding == "constant" else {}
    padded = np.pad(truth, pad, mode=padding, **kw)
    box = tuple(slice(c + p, c + 2 * p) for c, p in zip(corner.tolist(), patch))
    return padded[(Ellipsis, *box)]


GRIDS = [
    {"overlap": 0},
    {"overlap": (2, 1, 3)},
    {"overlap": 2, "padding": "constant", "pad_value": 7},
    {"overlap": 1, "padding": "reflect"},
    {"overlap": 3, "padding": "edge", "pad_overlap": True},
]


@pytest.mark.parametrize("kwargs", GRIDS)
def test_every_tile_equals_numpy_slicing_of_its_own_volume(mixed: Any, kwargs: dict) -> None:
    vols, truth = mixed
    patch = (5, 4, 6)
    grid = mixle.GridSampler(vols, patch, **kwargs)
    assert isinstance(grid, VolumeGridSampler) and isinstance(grid, mixle.GridSampler)
    batch = grid.get_batch(np.arange(len(grid)))
    assert set(batch) == {"patch", "coords", "volume"}
    assert batch["coords"].dtype == np.int64 and batch["volume"].dtype == np.int64
    assert sorted(set(batch["volume"].tolist())) == [0, 1, 2]
    assert (np.diff(batch["volume"]) >= 0).all()  # volume 0's tiles, then 1's, then 2's
    for tile, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
        want = _expected_tile(
            truth[v], corner, patch, kwargs.get("padding", "none"), kwargs.get("pad_value", 0)
        )
        np.testing.assert_array_equal(tile, want)


@st.composite
def _grids(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
    nd = draw(st.integers(1, 3))
    patch = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    overlap = tuple(draw(st.integers(0, p - 1)) for p in patch)
    padding = draw(st.sampled_from(["none", "constant", "reflect", "edge"]))
    pad_overlap = padding != "none" and draw(st.booleans())
    if pad_overlap:  # the padded volume must hold a tile
        low = [max(1, p - 2 * (o // 2)) for p, o in zip(patch, overlap)]
    else:
        low = [p if padding == "none" else 1 for p in patch]
    shapes = draw(
        st.lists(st.tuples(*(st.integers(lo, lo + 12) for lo in low)), min_size=1, max_size=4)
    )
    kwargs = {"patch_size": patch, "overlap": overlap, "padding": padding}
    return shapes, {**kwargs, "pad_overlap": pad_overlap}


@settings(max_examples=150, deadline=None)
@given(_grids())
def test_corners_and_volumes_of_every_index_match_each_volumes_own_grid(case: Any) -> None:
    shapes, kwargs = case
    arrays = [np.zeros(s, dtype=np.uint8) for s in shapes]
    grid = mixle.GridSampler(mixle.read_volumes(arrays), **kwargs)
    singles = [mixle.GridSampler(a, **kwargs) for a in arrays]
    assert grid.tile_counts.tolist() == [len(g) for g in singles]
    np.testing.assert_array_equal(
        grid.coords_array(), np.concatenate([g.coords_array() for g in singles])
    )
    np.testing.assert_array_equal(
        grid.volumes_array(), np.repeat(np.arange(len(singles)), [len(g) for g in singles])
    )
    picks = np.arange(len(grid))[::-1]  # any order: each index on its own
    np.testing.assert_array_equal(grid.coords_array(picks), grid.coords_array()[picks])


@pytest.mark.parametrize("kwargs", GRIDS)
def test_tiles_in_order_are_the_per_volume_grids_concatenated(mixed: Any, kwargs: dict) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), **kwargs)
    singles = [mixle.GridSampler(t, (5, 4, 6), **kwargs) for t in truth]
    assert grid.tile_counts.tolist() == [len(g) for g in singles]
    assert len(grid) == sum(len(g) for g in singles)
    patches, coords = zip(*(g.get_batch(np.arange(len(g))) for g in singles))
    batch = grid.get_batch(np.arange(len(grid)))
    np.testing.assert_array_equal(batch["patch"], np.concatenate(patches))
    np.testing.assert_array_equal(batch["coords"], np.concatenate(coords))
    want_vol = np.repeat(np.arange(3), [len(g) for g in singles])
    np.testing.assert_array_equal(batch["volume"], want_vol)
    np.testing.assert_array_equal(grid.coords_array(), np.concatenate(coords))
    np.testing.assert_array_equal(grid.volumes_array(), want_vol)
    for v, g in enumerate(singles):
        assert grid.volume_shape(v) == g.shape and grid.volume_grid_shape(v) == g.grid_shape
        for mine, theirs in zip(grid.volume_starts(v), g.starts):
            np.testing.assert_array_equal(mine, theirs)
        assert list(grid.volume_tiles(v)) == list(
            range(int(grid.volume_offsets[v]), int(grid.volume_offsets[v + 1]))
        )


def test_shuffled_batches_and_single_records_agree_with_the_ordered_batch(mixed: Any) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=1, padding="constant")
    whole = grid.get_batch(np.arange(len(grid)))
    order = np.random.default_rng(0).permutation(len(grid))
    shuffled = grid.get_batch(order)
    for key in ("patch", "coords", "volume"):
        np.testing.assert_array_equal(shuffled[key], whole[key][order])
    for i in (0, len(grid) // 2, -1):
        record = grid[i]
        assert set(record) == {"patch", "coords", "volume"}
        np.testing.assert_array_equal(record["patch"], whole["patch"][i])
        np.testing.assert_array_equal(record["coords"], whole["coords"][i])
        assert int(record["volume"]) == int(whole["volume"][i])
    assert sum(1 for _ in grid.records()) == len(grid)
    mixle.validate_batch(shuffled, mixle.Loader(grid, len(grid)).element_spec())


def test_a_batch_reads_each_of_its_volumes_once_through_a_lease(
    mixed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6))
    leased: list[int] = []
    lease = type(vols).lease

    def counting(self: Any, i: int) -> Any:
        leased.append(int(i))
        return lease(self, i)

    monkeypatch.setattr(type(vols), "lease", counting)
    last = int(grid.volume_offsets[-1]) - 1
    grid.get_batch([last, 0, last - 1, 1, int(grid.volume_offsets[1])])
    assert sorted(leased) == [0, 1, 2]


def _open_files(folder: Path) -> int:
    """Distinct files of ``folder`` this process holds open (an HDF5 volume may hold two fds)."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = Path(fd.readlink())
        except OSError:  # closed meanwhile
            continue
        if target.parent == folder:
            found.add(target)
    return len(found)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_sweep_over_many_volumes_keeps_at_most_max_open_files_open(tmp_path: Path) -> None:
    paths = []
    for i in range(8):
        paths.append(str(tmp_path / f"v{i}.h5"))
        with h5py.File(paths[-1], "w") as f:
            f.create_dataset("x", data=_volume((6 + i % 3, 7, 5), i), chunks=(3, 3, 3))
    grid = mixle.GridSampler(mixle.read_volumes(paths, dataset="x", max_open=2), (4, 4, 4))
    order = np.random.default_rng(0).permutation(len(grid))
    for idx in [*np.array_split(np.arange(len(grid)), 9), *np.array_split(order, 5)]:
        batch = grid.get_batch(idx)
        assert _open_files(tmp_path) <= 2, f"after volumes {np.unique(batch['volume'])}"


def test_channels_first_volumes_keep_their_channels_whole(tmp_path: Path) -> None:
    arrays = [_volume((2, *s), i) for i, s in enumerate(SHAPES)]
    paths = _write(tmp_path, arrays)
    grid = mixle.GridSampler(mixle.read_volumes(paths, dataset="x"), (4, 4, 4), overlap=1)
    assert grid.channel_shape == (2,)
    batch = grid.get_batch(np.arange(len(grid)))
    assert batch["patch"].shape == (len(grid), 2, 4, 4, 4) and batch["coords"].shape[1] == 3
    for tile, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
        want = _expected_tile(_truth(paths[v]), corner, (4, 4, 4), "none", 0)
        np.testing.assert_array_equal(tile, want)


def test_dict_volumes_cut_every_array_at_the_same_corner(tmp_path: Path) -> None:
    images = [_volume(s, i) for i, s in enumerate(SHAPES[:2])]
    labels = [(a > 100).astype(np.uint8) for a in images]
    image_paths = _write(tmp_path, images, "img")
    label_paths = [str(tmp_path / f"label{i}.npy") for i in range(2)]
    for p, a in zip(label_paths, labels):
        np.save(p, a)
    vols = mixle.read_volumes(
        [{"image": i, "label": lab} for i, lab in zip(image_paths, label_paths)], dataset="x"
    )
    grid = mixle.GridSampler(vols, (4, 5, 4), overlap=1)
    spec = grid.element_spec()
    assert set(spec) == {"image", "label", "coords", "volume"}
    assert spec["label"].dtype == np.uint8 and spec["image"].dtype == np.float32
    batch = grid.get_batch(np.arange(len(grid)))
    for k in range(len(grid)):
        v, corner = int(batch["volume"][k]), batch["coords"][k]
        img, lab = _truth(image_paths[v]), np.load(label_paths[v])
        np.testing.assert_array_equal(
            batch["image"][k], _expected_tile(img, corner, (4, 5, 4), "none", 0)
        )
        np.testing.assert_array_equal(
            batch["label"][k], _expected_tile(lab, corner, (4, 5, 4), "none", 0)
        )
    out = stitch(grid, lambda tiles: tiles["image"] * tiles["label"], dtype=np.float64)
    for key, img, lab in zip(vols.keys, images, labels):
        np.testing.assert_array_equal(out[key], img * lab)


def test_dict_volumes_whose_arrays_differ_in_shape_are_refused(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.npy"), str(tmp_path / "b.npy")
    np.save(a, np.zeros((8, 8, 8), np.float32))
    np.save(b, np.zeros((4, 4, 4), np.float32))
    vols = mixle.read_volumes([{"image": a, "label": b}])
    with pytest.raises(ValueError, match=r"a\.npy.*PatchSampler"):
        mixle.GridSampler(vols, 4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"padding": "constant", "pad_value": -1.5, "overlap": 2},  # a value uint8 cannot hold
        {"padding": "reflect", "overlap": 1},
    ],
)
def test_the_collection_cast_dtype_applies_to_every_tile(tmp_path: Path, kwargs: dict) -> None:
    arrays = [_volume(s, i, dtype) for i, (s, dtype) in enumerate(zip(SHAPES, ("u1", "i2", "f8")))]
    paths = _write(tmp_path, arrays)
    vols = mixle.read_volumes(paths, dataset="x", dtype=np.float32)
    grid = mixle.GridSampler(vols, (4, 5, 4), **kwargs)
    assert grid.element_spec()["patch"].dtype == np.float32
    order = np.random.default_rng(0).permutation(len(grid))
    for idx in (np.arange(len(grid)), order):  # in order (in place) and shuffled (gathered)
        batch = grid.get_batch(idx)
        assert batch["patch"].dtype == np.float32
        for tile, corner, v in zip(batch["patch"], batch["coords"], batch["volume"]):
            truth = _truth(paths[v]).astype(np.float32)
            padding, fill = kwargs.get("padding", "none"), kwargs.get("pad_value", 0)
            np.testing.assert_array_equal(
                tile, _expected_tile(truth, corner, (4, 5, 4), padding, fill)
            )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"overlap": 2},
        {"overlap": (3, 1, 2), "padding": "reflect"},
        {"overlap": 2, "padding": "constant", "pad_overlap": True},
    ],
)
@pytest.mark.parametrize("window", ["mean", "crop"])
def test_stitching_an_identity_model_gives_every_volume_back_in_memory(
    mixed: Any, kwargs: dict, window: str
) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), **kwargs)
    out = stitch(grid, lambda tiles: tiles, batch_size=7, window=window, dtype=np.float32)
    assert list(out) == list(vols.keys)
    for key, want in zip(vols.keys, truth):
        assert out[key].dtype == np.float32
        np.testing.assert_array_equal(out[key], want)


@pytest.mark.parametrize("window", ["gaussian", "hann", "monai_gaussian"])
def test_weighted_windows_stitch_each_volume_on_its_own(mixed: Any, window: str) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=2)
    out = stitch(grid, lambda tiles: tiles, batch_size=5, window=window, dtype=np.float64)
    for key, want, single in zip(vols.keys, truth, truth):
        one = stitch(mixle.GridSampler(single, (5, 4, 6), overlap=2), lambda t: t, window=window)
        np.testing.assert_allclose(out[key], want, rtol=1e-6)
        np.testing.assert_allclose(out[key], one, rtol=1e-6)


def test_stitching_into_a_zarr_group_writes_one_array_per_volume(
    mixed: Any, tmp_path: Path
) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=(2, 2, 3))
    path = str(tmp_path / "pred.zarr")
    group = zarr.open_group(path, mode="w")
    got = stitch(grid, lambda t: np.stack([t, -t], axis=1), batch_size=4, out=group, dtype="f4")
    assert got is group
    back = zarr.open_group(path, mode="r")  # zarr-python's own read of what was written
    names = volume_array_names(vols.keys)
    assert sorted(back.array_keys()) == sorted(names)
    for v, (name, key, want) in enumerate(zip(names, vols.keys, truth)):
        arr = back[name]
        assert arr.shape == (2, *want.shape) and arr.dtype == np.float32
        np.testing.assert_array_equal(arr[0], want)
        np.testing.assert_array_equal(arr[1], -want)
        assert arr.attrs["mixle_volume_key"] == key and arr.attrs["mixle_volume"] == v


def test_stitching_into_an_hdf5_group_writes_one_dataset_per_volume(
    mixed: Any, tmp_path: Path
) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=1, padding="edge", pad_overlap=True)
    path = tmp_path / "pred.h5"
    with h5py.File(path, "w") as f:
        stitch(grid, lambda t: t, batch_size=6, out=f.create_group("pred"), window="crop")
    with h5py.File(path, "r") as f:  # h5py's own read
        for name, key, want in zip(volume_array_names(vols.keys), vols.keys, truth):
            np.testing.assert_array_equal(f["pred"][name][...], want)
            assert f["pred"][name].attrs["mixle_volume_key"] == key


def test_stitching_refuses_a_group_that_already_holds_a_volume_name(
    mixed: Any, tmp_path: Path
) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6))
    group = zarr.open_group(str(tmp_path / "pred.zarr"), mode="w")
    group.create_array(volume_array_names(vols.keys)[1], shape=(1,), dtype="f4")
    with pytest.raises(ValueError, match="already holds"):
        stitch(grid, lambda t: t, out=group)
    with pytest.raises(TypeError, match="zarr group"):
        stitch(grid, lambda t: t, out=np.zeros(3))
    with pytest.raises(ValueError, match="one output per tile"):
        stitch(grid, lambda t: t[:1], batch_size=4)


def test_a_shuffled_loader_stitches_back_through_per_volume_aggregators(mixed: Any) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=1, padding="edge")
    aggregators = {v: GridAggregator(grid, volume=v, dtype=np.float32) for v in range(len(vols))}
    seen = 0
    for batch in mixle.Loader(grid, batch_size=6, shuffle=True, seed=3):
        seen += len(batch["volume"])
        for v in np.unique(batch["volume"]).tolist():
            rows = batch["volume"] == v
            aggregators[v].add(batch["patch"][rows], batch["coords"][rows])
    assert seen == len(grid)
    for v, want in enumerate(truth):
        np.testing.assert_array_equal(aggregators[v].result(), want)


def test_aggregators_need_a_volume_for_a_collection_grid_only(mixed: Any) -> None:
    vols, truth = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6))
    with pytest.raises(TypeError, match="volume=v"):
        GridAggregator(grid)
    with pytest.raises(IndexError, match="3 volumes"):
        GridAggregator(grid, volume=3)
    with pytest.raises(TypeError, match="one volume"):
        GridAggregator(mixle.GridSampler(truth[0], 4), volume=0)
    agg = GridAggregator(grid, volume=-1)  # negative counts from the end
    with pytest.raises(ValueError, match="not a corner"):
        agg.add(np.zeros((1, 5, 4, 6)), [[1, 1, 1]])


def test_pickling_is_by_reference_and_keeps_every_tile(mixed: Any) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=1, padding="reflect")
    before = len(pickle.dumps(grid))
    whole = grid.get_batch(np.arange(len(grid)))  # opens and reads every volume
    assert len(pickle.dumps(grid)) == before  # no handle, data or cached chunk travels
    for other in (pickle.loads(pickle.dumps(grid)), copy.copy(grid), copy.deepcopy(grid)):
        assert type(other) is VolumeGridSampler
        assert other.fingerprint() == grid.fingerprint() and len(other) == len(grid)
        again = other.get_batch(np.arange(len(grid)))
        for key in whole:
            np.testing.assert_array_equal(again[key], whole[key])
    plain = mixle.GridSampler(np.zeros((6, 6)), 3)  # the one-volume grid still pickles
    assert type(pickle.loads(pickle.dumps(plain))) is mixle.GridSampler
    assert type(mixle.GridSampler.__new__(mixle.GridSampler)) is mixle.GridSampler


def _batch_in_child(payload: bytes) -> dict[str, np.ndarray]:
    """Run in a spawned process: unpickle a grid and read every tile."""
    grid = pickle.loads(payload)
    return grid.get_batch(np.arange(len(grid)))


@pytest.mark.slow
def test_a_spawned_process_reads_the_same_tiles(mixed: Any) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=2, padding="reflect")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        got = pool.submit(_batch_in_child, pickle.dumps(grid)).result(timeout=120)
    want = grid.get_batch(np.arange(len(grid)))
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_unpickling_reads_no_volume(tmp_path: Path) -> None:
    paths = _write(tmp_path, [_volume(s, i) for i, s in enumerate(SHAPES)])
    grid = mixle.GridSampler(mixle.read_volumes(paths, dataset="x"), 4, overlap=1)
    data = pickle.dumps(grid)
    for path in paths:  # gone: any read would fail
        Path(path).rename(path + ".moved")
    again = pickle.loads(data)
    assert len(again) == len(grid) and again.fingerprint() == grid.fingerprint()
    np.testing.assert_array_equal(again.coords_array(), grid.coords_array())


def test_the_fingerprint_covers_the_collection_and_every_argument(
    mixed: Any, tmp_path: Path
) -> None:
    vols, truth = mixed
    base = {"patch_size": (5, 4, 6), "overlap": 1, "padding": "constant", "pad_value": 0}
    changes = [
        {"patch_size": (4, 4, 6)},
        {"overlap": 2},
        {"padding": "edge"},
        {"pad_value": 3},
        {"padding": "edge", "pad_overlap": True},
    ]
    prints = {mixle.GridSampler(vols, **base).fingerprint()}
    for change in changes:
        prints.add(mixle.GridSampler(vols, **{**base, **change}).fingerprint())
    other = mixle.read_volumes(_write(tmp_path, truth[:2], "other"), dataset="x")
    prints.add(mixle.GridSampler(other, **base).fingerprint())
    assert len(prints) == len(changes) + 2
    grid = mixle.GridSampler(vols, **base)
    assert source_fingerprint(grid) == source_fingerprint(mixle.GridSampler(vols, **base))
    assert source_fingerprint(grid) != source_fingerprint(mixle.GridSampler(other, **base))


def test_describes_itself_per_volume(mixed: Any) -> None:
    vols, _ = mixed
    grid = mixle.GridSampler(vols, (5, 4, 6), overlap=1)
    assert grid.collection is vols and grid.num_volumes == 3
    assert grid.patch_size == (5, 4, 6) and grid.overlap == (1, 1, 1)
    assert "volumes=3" in repr(grid) and f"tiles={len(grid)}" in repr(grid)
    for name in ("shape", "starts", "grid_shape", "source"):
        with pytest.raises(AttributeError, match=r"per volume|\.volume_shape"):
            getattr(grid, name)
        assert not hasattr(grid, name)  # AttributeError: hasattr answers instead of raising
    spec = grid.element_spec()
    assert spec["patch"].shape == (5, 4, 6) and spec["coords"].shape == (3,)
    assert spec["volume"].shape == () and spec["volume"].dtype == np.int64
    with pytest.raises(IndexError):
        grid[len(grid)]
    with pytest.raises(IndexError, match="3 volumes"):
        grid.volume_shape(3)


def test_bad_arguments_name_the_volume(tmp_path: Path) -> None:
    small = [_volume((12, 12, 12), 0), _volume((12, 3, 12), 1)]
    vols = mixle.read_volumes(_write(tmp_path, small), dataset="x")
    with pytest.raises(ValueError, match=r"v1\.h5.*padding="):
        mixle.GridSampler(vols, 4)
    mixle.GridSampler(vols, 4, padding="constant")  # a padded grid tiles the small volume
    with pytest.raises(ValueError, match="pad_overlap"):
        mixle.GridSampler(vols, 4, padding="none", pad_overlap=True)
    with pytest.raises(ValueError, match="overlap"):
        mixle.GridSampler(vols, 3, overlap=3)
    with pytest.raises(ValueError, match="pad_value"):
        mixle.GridSampler(vols, 3, padding="constant", pad_value=0.1)
    chans = [_volume((2, 6, 6, 6), 0), _volume((3, 6, 6, 6), 1)]
    vols = mixle.read_volumes(_write(tmp_path, chans, "ch"), dataset="x")
    with pytest.raises(ValueError, match=r"vch1\.h5"):
        mixle.GridSampler(vols, (3, 3, 3))


def test_volume_array_names_are_valid_and_distinct() -> None:
    keys = ["/data/case 01.zarr", "#3", "s3://b/x.h5", "a/b", "a_b", "__x", "..", ""]
    names = volume_array_names(keys)
    assert names[:3] == ("data_case_01.zarr", "3", "s3_b_x.h5")
    assert names[3:5] == ("a_b-3", "a_b-4")
    assert names[5] == "x" and names[6] == "volume-6" and names[7] == "volume-7"
    assert len(set(names)) == len(names)
    assert all("/" not in n and not n.startswith("__") and n not in (".", "..") for n in names)
    with pytest.raises(ValueError, match="distinct keys"):
        volume_array_names(["a", "a", "a-1"])


def test_metadata_columns_in_tiles_and_after_pickling() -> None:
    rows = [{"image": np.full((6, 6), float(i)), "age": 30 + i, "site": "ab"[i]} for i in range(2)]
    vols = mixle.read_volumes(rows)
    grid = mixle.GridSampler(vols, 3, columns=["age", "site"])
    batch = grid.get_batch(np.arange(len(grid)))
    np.testing.assert_array_equal(batch["age"], 30 + batch["volume"])
    assert batch["site"].tolist() == ["ab"[v] for v in batch["volume"].tolist()]
    assert set(grid.element_spec()) == {"image", "coords", "volume", "age", "site"}
    again = pickle.loads(pickle.dumps(grid)).get_batch([0, len(grid) - 1])
    assert again["age"].tolist() == [30, 31]
    with pytest.raises(KeyError, match="'weight' is not a metadata column"):
        mixle.GridSampler(vols, 3, columns=["weight"])
