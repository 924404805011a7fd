"""Grid tiling, stitching, epochs and sampling without replacement."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import zarr
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mixle
from mixle import GridAggregator, GridSampler, PatchSampler, stitch
from mixle.data.sampling.grid import axis_starts
from mixle.data.sampling.placement import permuted_corners
from mixle.reading import chunk_cache


@st.composite
def tilings(draw: st.DrawFn) -> tuple:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 14)) for _ in range(ndim))
    padding = draw(st.sampled_from(["none", "constant", "reflect", "edge"]))
    hi = (lambda d: d) if padding == "none" else (lambda d: d + 4)
    patch = tuple(draw(st.integers(1, hi(d))) for d in shape)
    overlap = tuple(draw(st.integers(0, p - 1)) for p in patch)
    return shape, patch, overlap, padding


@settings(max_examples=200, deadline=None)
@given(tilings())
def test_tiles_cover_every_voxel_with_the_formula_count(case: tuple) -> None:
    shape, patch, overlap, padding = case
    vol = np.zeros(shape, dtype=np.uint8)
    g = GridSampler(vol, patch, overlap=overlap, padding=padding)
    want = tuple(1 + max(0, -(-(d - p) // (p - o))) for d, p, o in zip(shape, patch, overlap))
    assert g.grid_shape == want and len(g) == int(np.prod(want))
    corners = g.coords_array()
    assert len({tuple(c) for c in corners.tolist()}) == len(g)  # distinct tiles
    count = np.zeros(shape, dtype=np.int64)
    for c in corners.tolist():
        count[tuple(slice(max(a, 0), a + p) for a, p in zip(c, patch))] += 1
    assert (count >= 1).all()
    if padding == "none":
        assert (corners >= 0).all() and (corners + np.array(patch) <= np.array(shape)).all()
    else:  # tiles stay on the lattice 0, step, 2*step, ...
        assert (corners % (np.array(patch) - np.array(overlap)) == 0).all()
    for a, s in enumerate(g.starts):  # consecutive tiles overlap by at least `overlap`
        assert (np.diff(s) <= patch[a] - overlap[a]).all()


@settings(max_examples=60, deadline=None)
@given(tilings(), st.integers(1, 7))
def test_identity_model_stitches_back_exactly(case: tuple, batch: int) -> None:
    shape, patch, overlap, padding = case
    vol = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    g = GridSampler(vol, patch, overlap=overlap, padding=padding)
    out = stitch(g, lambda t: t, batch_size=batch)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, vol)
    smooth = stitch(g, lambda t: t, window="gaussian")
    np.testing.assert_allclose(smooth, vol, rtol=1e-5, atol=1e-5)


@st.composite
def padded_tilings(draw: st.DrawFn) -> tuple:
    """Tilings with ``pad_overlap=True`` (TorchIO's): the patch fits the padded volume."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 12)) for _ in range(ndim))
    overlap = tuple(draw(st.integers(0, 6)) for _ in range(ndim))
    patch = tuple(
        draw(st.integers(o + 1, max(o + 1, d + 2 * (o // 2)))) for d, o in zip(shape, overlap)
    )
    assume(all(p <= d + 2 * (o // 2) for p, d, o in zip(patch, shape, overlap)))
    padding = draw(st.sampled_from(["constant", "reflect", "edge"]))
    return shape, patch, overlap, padding


@settings(max_examples=150, deadline=None)
@given(padded_tilings())
def test_pad_overlap_tiles_the_volume_padded_by_half_the_overlap(case: tuple) -> None:
    shape, patch, overlap, padding = case
    vol = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    g = GridSampler(vol, patch, overlap=overlap, padding=padding, pad_overlap=True)
    for s, d, p, o in zip(g.starts, shape, patch, overlap):
        h = o // 2
        assert s[0] == -h and s[-1] + p == d + h  # from -h to h past the far edge
        assert (np.diff(s) > 0).all() and (np.diff(s) <= p - o).all()
        assert len(s) == 1 + max(0, -(-(d + 2 * h - p) // (p - o)))
    tiles, corners = g.get_batch(np.arange(len(g)))
    pad = [(o // 2, o // 2) for o in overlap]
    padded = np.pad(vol, pad, mode=padding)  # TorchIO pads with np.pad too
    for t, c in zip(tiles, corners):
        box = tuple(slice(a + o // 2, a + o // 2 + p) for a, o, p in zip(c, overlap, patch))
        np.testing.assert_array_equal(t, padded[box])
    for window in ("crop", "mean"):  # an identity model gives the volume back exactly
        np.testing.assert_array_equal(stitch(g, lambda t: t, window=window), vol)
    for window in ("hann", "monai_gaussian"):
        np.testing.assert_allclose(stitch(g, lambda t: t, window=window), vol, atol=1e-5)


@settings(max_examples=150, deadline=None)
@given(tilings(), st.booleans())
def test_crop_gives_each_voxel_from_the_last_tile_that_keeps_it(case: tuple, pad: bool) -> None:
    shape, patch, overlap, padding = case
    pad = (
        pad
        and padding != "none"
        and all(p <= d + 2 * (o // 2) for p, d, o in zip(patch, shape, overlap))
    )
    g = GridSampler(np.zeros(shape), patch, overlap=overlap, padding=padding, pad_overlap=pad)
    agg = GridAggregator(g, dtype=np.float64, window="crop")
    corners = g.coords_array()
    want = np.full(shape, -1.0)
    for i, c in enumerate(corners.tolist()):  # each tile's output: its own number
        agg.add(np.full((1, *patch), float(i)), [c])
        keep = []
        for a, o in enumerate(overlap):  # TorchIO: drop o // 2 per side except at the edges
            lo = 0 if c[a] == g.starts[a][0] else c[a] + o // 2
            hi = shape[a] if c[a] == g.starts[a][-1] else c[a] + patch[a] - o // 2
            keep.append(slice(max(lo, 0), min(hi, shape[a])))
        want[tuple(keep)] = i  # later tiles overwrite, as TorchIO's writes do
    np.testing.assert_array_equal(agg.result(), want)
    assert (want >= 0).all()


def test_overlaps_are_averaged() -> None:
    vol = np.zeros((10, 7))
    g = GridSampler(vol, (4, 3), overlap=(2, 1))
    agg = GridAggregator(g, dtype=np.float64)
    total, count = np.zeros(vol.shape), np.zeros(vol.shape)
    for i in range(len(g)):
        _, corner = g[i]
        agg.add(np.full((1, 4, 3), float(i)), [corner])
        box = tuple(slice(c, c + p) for c, p in zip(corner, (4, 3)))
        total[box] += i
        count[box] += 1
    np.testing.assert_allclose(agg.result(), total / count)
    assert agg.tiles_added == len(g)


def test_class_scores_into_zarr_and_memmap_outputs(tmp_path) -> None:
    vol = np.random.default_rng(2).standard_normal((2, 16, 13)).astype(np.float32)
    g = GridSampler(vol, (6, 5), overlap=2)  # the leading axis is a channel axis
    assert g.channel_shape == (2,) and g.element_spec()[0].shape == (2, 6, 5)
    model = lambda t: np.stack([t.sum(1), t[:, 0] - t[:, 1], -t[:, 1]], axis=1)  # noqa: E731
    want = np.stack([vol.sum(0), vol[0] - vol[1], -vol[1]])
    z = zarr.create_array(str(tmp_path / "out.zarr"), shape=(3, 16, 13), chunks=(3, 8, 8),
                          dtype="f4")  # fmt: skip
    got = stitch(g, model, out=z, scratch_dir=tmp_path)
    assert got is z
    np.testing.assert_allclose(z[:], want, rtol=1e-6, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]  # scratch removed
    mm = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype="f8", shape=want.shape)
    stitch(g, model, out=mm)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6, atol=1e-6)


def test_grid_batches_read_zarr_once_per_batch(stores) -> None:
    truth = stores.truth["v3.zarr"]
    src = mixle.read_zarr(stores.path("v3.zarr"))
    g = GridSampler(src, (8, 10, 7), overlap=(2, 2, 0))
    chunk_cache().clear()
    before = chunk_cache().stats().misses
    tiles, corners = g.get_batch(range(len(g)))
    assert chunk_cache().stats().misses - before == 3 * 4 * 3  # every chunk decoded once
    for c, t in zip(corners, tiles):
        np.testing.assert_array_equal(t, truth[tuple(slice(a, a + p) for a, p in
                                                     zip(c, (8, 10, 7)))])  # fmt: skip
    copy = pickle.loads(pickle.dumps(g))
    np.testing.assert_array_equal(copy[5][0], g[5][0])
    assert len(pickle.dumps(g)) < 2000  # by reference
    assert "GridSampler" in repr(g) and len(list(g)) == len(g)


def test_grid_errors() -> None:
    vol = np.zeros((8, 8))
    with pytest.raises(ValueError, match=r"overlap=\(4, 1\) must be smaller than patch_size"):
        GridSampler(vol, 4, overlap=(4, 1))
    with pytest.raises(ValueError, match="overlap=-1 must be >= 0"):
        GridSampler(vol, 4, overlap=-1)
    with pytest.raises(ValueError, match="patch_size=\\(9, 9\\) is larger"):
        GridSampler(vol, 9)
    with pytest.raises(ValueError, match="padding='same' is not a padding mode"):
        GridSampler(vol, 4, padding="same")
    with pytest.raises(ValueError, match="patch_size=\\[1, 2, 3\\] has 3 entries"):
        GridSampler(vol, [1, 2, 3])
    with pytest.raises(IndexError, match="index=4 is out of range for a grid of 4 tiles"):
        GridSampler(vol, 4)[4]
    g = GridSampler(vol, 4, overlap=1)
    with pytest.raises(ValueError, match="window='hamming' is not one of 'mean', 'gaussian'"):
        GridAggregator(g, window="hamming")
    with pytest.raises(TypeError, match="grid=ndarray must be a GridSampler"):
        GridAggregator(vol)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"out has shape \(8, 7\); expected"):
        GridAggregator(g, out=np.zeros((8, 7)))
    agg = GridAggregator(g)
    tiles, corners = g.get_batch([0, 1])
    with pytest.raises(ValueError, match=r"outputs has shape \(2, 4, 3\); expected \(2, 4, 4\)"):
        agg.add(tiles[:, :, :3], corners)
    with pytest.raises(ValueError, match=r"coords \[1, 0\] is not a corner of the grid"):
        agg.add(tiles[:1], [[1, 0]])
    agg.add(tiles, corners)
    with pytest.raises(ValueError, match="tile 1 was added twice"):
        agg.add(tiles[1:], corners[1:])
    with pytest.raises(ValueError, match="7 of 9 tiles were never added"):
        agg.result()
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        stitch(g, lambda t: t, batch_size=0)
    with pytest.raises(TypeError, match=r"batch_size=2\.5 must be an int"):
        stitch(g, lambda t: t, batch_size=2.5)  # type: ignore[arg-type]


def test_axis_starts_values() -> None:
    assert axis_starts(10, 4, 3, shift_last=True).tolist() == [0, 3, 6]
    assert axis_starts(11, 4, 3, shift_last=True).tolist() == [0, 3, 6, 7]
    assert axis_starts(11, 4, 3, shift_last=False).tolist() == [0, 3, 6, 9]
    assert axis_starts(3, 8, 5, shift_last=False).tolist() == [0]


# -- epochs and sampling without replacement --------------------------------------------
def test_set_epoch_gives_fresh_deterministic_corners() -> None:
    vol = np.zeros((40, 50))
    s = PatchSampler(vol, 5, 30, seed=9)
    first = s.coords_array()
    s.set_epoch(3)
    third = s.coords_array()
    assert s.epoch == 3 and not np.array_equal(first, third)
    np.testing.assert_array_equal(PatchSampler(vol, 5, 30, seed=9, epoch=3).coords_array(), third)
    s.set_epoch(0)
    np.testing.assert_array_equal(s.coords_array(), first)  # epoch 0 is the old placement
    copy = pickle.loads(pickle.dumps(PatchSampler(vol, 5, 30, seed=9, epoch=3)))
    np.testing.assert_array_equal(copy.coords_array(), third)
    with pytest.raises(ValueError, match="epoch=-1 must be >= 0"):
        s.set_epoch(-1)
    with pytest.raises(TypeError, match=r"epoch=1\.5 must be an int"):
        PatchSampler(vol, 5, 3, epoch=1.5)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=3),
    st.integers(0, 2**64 - 1),
    st.integers(0, 5),
    st.integers(1, 3),
)
def test_without_replacement_visits_each_grid_position_once(counts, seed, epoch, passes) -> None:
    total = int(np.prod(counts))
    stride = tuple(range(1, len(counts) + 1))
    corners = permuted_corners(seed, np.arange(passes * total), counts, stride, epoch=epoch)
    grid = {tuple(int(k) * s for k, s in zip(idx, stride)) for idx in np.ndindex(*counts)}
    for p in range(passes):
        chunk = {tuple(c) for c in corners[p * total : (p + 1) * total].tolist()}
        assert chunk == grid
    again = permuted_corners(seed, np.arange(total)[::-1], counts, stride, epoch=epoch)
    np.testing.assert_array_equal(again, corners[:total][::-1])


def test_sampler_without_replacement_per_epoch() -> None:
    vol = np.zeros((20, 18))
    s = PatchSampler(vol, (4, 6), stride=(4, 3), replacement=False, seed=1)
    assert len(s) == 5 * 5 and s.replacement is False
    first = s.coords_array()
    assert len({tuple(c) for c in first.tolist()}) == len(s)
    s.set_epoch(1)
    second = s.coords_array()
    assert {tuple(c) for c in second.tolist()} == {tuple(c) for c in first.tolist()}
    assert not np.array_equal(first, second)
    assert permuted_corners(1, [0, 1, 2], (5, 5), (4, 3)).tolist() == [[8, 9], [0, 9], [8, 0]]
    padded = PatchSampler(vol, 5, replacement=False, padding="edge")
    assert len({tuple(c) for c in padded.coords_array().tolist()}) == 20 * 18
    with pytest.raises(TypeError, match="num_patches=None must be an int"):
        PatchSampler(vol, 4)
    with pytest.raises(TypeError, match="replacement=1 must be True or False"):
        PatchSampler(vol, 4, 3, replacement=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patches_per_chunk=2 cannot be combined with "
                                         "replacement=False"):  # fmt: skip
        PatchSampler(vol, 4, 3, replacement=False, patches_per_chunk=2)


def test_monai_gaussian_into_a_memmap_keeps_its_weight_sum_in_scratch(tmp_path) -> None:
    vol = np.random.default_rng(3).standard_normal((2, 15, 11)).astype(np.float32)
    g = GridSampler(vol, (6, 5), overlap=(3, 2))
    model = lambda t: t * np.arange(6)[:, None]  # noqa: E731  (tiles disagree on overlaps)
    want = stitch(g, model, window="monai_gaussian", sigma_scale=(0.2, 0.3), dtype=np.float64)
    mm = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype="f8", shape=vol.shape)
    got = stitch(g, model, window="monai_gaussian", sigma_scale=(0.2, 0.3), out=mm,
                 scratch_dir=tmp_path)  # fmt: skip
    np.testing.assert_array_equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]  # scratch removed
