"""mixle.plot: footprints, projections, chunk grids and sampling density, drawn without pyplot."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import mixle
import mixle.plot
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.plot import plot_chunk_grid, plot_patches, plot_sampler, plot_sampling_density
from mixle.plot.patches import INDIVIDUAL_PATCHES
from mixle.plot.planes import parse_plane, plan_blocks, read_plane, sum_along

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import LineCollection, PatchCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

zarr = pytest.importorskip("zarr")


@pytest.fixture
def volume() -> np.ndarray:
    return np.random.default_rng(0).random((12, 20, 24), dtype=np.float32)


def rects(ax: Axes) -> list[tuple[float, float, float, float]]:
    return sorted(
        (p.get_x(), p.get_y(), p.get_width(), p.get_height())
        for p in ax.patches
        if isinstance(p, Rectangle)
    )


def image(ax: Axes, i: int = 0) -> np.ndarray:
    return np.asarray(ax.images[i].get_array())


def zarr_volume(tmp_path, data: np.ndarray, chunks, shards=None) -> ZarrArraySource:
    path = tmp_path / "vol.zarr"
    z = zarr.create_array(path, shape=data.shape, chunks=chunks, shards=shards, dtype=data.dtype)
    z[:] = data
    return mixle.read_zarr(path)


# -- import and the optional dependency ---------------------------------------------------


def test_import_does_not_import_matplotlib():
    code = (
        "import sys, json, mixle; lazy = mixle.plot; "  # the attribute imports the submodule
        "print(json.dumps(['matplotlib' in sys.modules, lazy.__name__]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, "mixle.plot"]


def test_mixle_plot_is_a_lazy_attribute_of_mixle():
    assert mixle.plot is sys.modules["mixle.plot"]
    assert mixle.plot.plot_patches is plot_patches


def test_missing_matplotlib_names_the_extra(monkeypatch, volume):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[plot\]"'):
        plot_patches(volume, np.zeros((1, 3), dtype=np.int64), 4)
    with pytest.raises(ImportError, match=r'"\.\[plot\]"'):
        plot_chunk_grid(volume)


def test_missing_matplotlib_in_a_fresh_interpreter():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import numpy as np, mixle.plot\n"
        "try:\n"
        "    mixle.plot.plot_chunk_grid(np.zeros((4, 4, 4)))\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'mixle.plot needs matplotlib, which is not installed: pip install -e ".[plot]"' in (
        out.stdout
    )


# -- plot_patches ---------------------------------------------------------------------------


CORNERS = np.array([[0, 0, 0], [2, 4, 6], [5, 1, 2], [6, 10, 12], [8, 12, 16]], dtype=np.int64)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_slice_draws_the_patches_that_contain_the_plane(volume, axis):
    size = (4, 6, 8)
    a = axis % 3
    index = 6
    ax = plot_patches(volume, CORNERS, size, axis=axis, index=index)
    assert isinstance(ax, Axes) and isinstance(ax.figure, Figure)
    rows, cols = (b for b in range(3) if b != a)
    hits = [c for c in CORNERS if c[a] <= index < c[a] + size[a]]
    assert 0 < len(hits) < len(CORNERS)
    want = sorted((float(c[cols]), float(c[rows]), size[cols], size[rows]) for c in hits)
    assert rects(ax) == want
    key = [slice(None)] * 3
    key[a] = index
    np.testing.assert_array_equal(image(ax), volume[tuple(key)])
    assert f"{len(hits)} of {len(CORNERS)} patches cross slice {index} of axis {a}" in (
        ax.get_title()
    )
    assert ax.get_ylabel() == f"axis {rows}" and ax.get_xlabel() == f"axis {cols}"


def test_default_index_is_the_middle_plane(volume):
    ax = plot_patches(volume, CORNERS, 4, axis=1)
    np.testing.assert_array_equal(image(ax), volume[:, 10])
    assert "slice 10 of axis 1" in ax.get_title()


@pytest.mark.parametrize("how", ["max", "mean"])
def test_projection_draws_every_patch_and_projects(volume, how):
    ax = plot_patches(volume, CORNERS, (4, 6, 8), axis=2, projection=how)
    want = volume.max(axis=2) if how == "max" else volume.mean(axis=2, dtype=np.float64)
    np.testing.assert_allclose(image(ax), want, rtol=1e-12)
    assert len(ax.patches) == len(CORNERS)
    assert rects(ax) == sorted((float(c[1]), float(c[0]), 6, 4) for c in CORNERS)
    assert f"{len(CORNERS)} patches, {how} along axis 2" in ax.get_title()


@pytest.mark.parametrize("how", ["max", "mean"])
def test_projection_of_a_chunked_zarr_reads_chunk_aligned_slabs(tmp_path, volume, how, monkeypatch):
    src = zarr_volume(tmp_path, volume, chunks=(4, 8, 8))
    reads: list[tuple] = []
    original = ZarrArraySource.__getitem__

    def recording(self, key):
        reads.append(key)
        return original(self, key)

    monkeypatch.setattr(ZarrArraySource, "__getitem__", recording)
    ax = plot_patches(src, CORNERS, 4, axis=1, projection=how)
    want = volume.max(axis=1) if how == "max" else volume.mean(axis=1, dtype=np.float64)
    np.testing.assert_allclose(image(ax), want, rtol=1e-12)
    spans = [(k[1].start, k[1].stop) for k in reads]
    assert spans == [(0, 20)]  # the whole volume fits the byte budget: one read


def covered(blocks, shape) -> np.ndarray:
    """How many of ``blocks`` (``(start, stop)`` boxes) cover each voxel of ``shape``."""
    count = np.zeros(shape, dtype=int)
    for start, stop in blocks:
        count[tuple(slice(a, b) for a, b in zip(start, stop))] += 1
    return count


def test_slice_reads_only_the_plane(tmp_path, volume, monkeypatch):
    src = zarr_volume(tmp_path, volume, chunks=(4, 8, 8))
    reads: list[tuple] = []
    original = ZarrArraySource.__getitem__
    monkeypatch.setattr(
        ZarrArraySource, "__getitem__", lambda self, key: reads.append(key) or original(self, key)
    )
    ax = plot_patches(src, CORNERS, 4, axis=0, index=3)
    np.testing.assert_array_equal(image(ax), volume[3])
    assert len(reads) == 1 and reads[0][0] == 3


@pytest.mark.parametrize("planes", [0, 1, 3, 5, 100])
@pytest.mark.parametrize("how", ["max", "mean"])
def test_projection_blocks_respect_the_byte_budget_when_unchunked(volume, planes, how):
    plane = parse_plane(volume, 3, axis=0, projection=how)
    row = 24 * 8  # one image row, counted at 8 bytes a pixel
    budget = 20 * row * planes  # one plane is 20 rows
    blocks = list(plan_blocks(plane, slab_bytes=budget))
    assert (covered(blocks, volume.shape) == 1).all()
    sizes = [(b[0] - a[0]) * (b[1] - a[1]) * row for a, b in blocks]
    assert max(sizes) == max(row, min(budget, volume.size * 8))  # full, or one row at least
    assert all(a[2] == 0 and b[2] == 24 for a, b in blocks)  # whole image rows
    got = read_plane(plane, slab_bytes=budget)
    want = volume.max(axis=0) if how == "max" else volume.mean(axis=0, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("budget", [8 * 64 * 8 * 64, 8 * 64 * 8 * 16, 4 * 8 * 64, 100])
@pytest.mark.parametrize(("how", "step"), [("max", 1), ("mean", 1), ("max", 3), ("mean", 2)])
def test_projection_of_a_big_plane_reads_each_chunk_once(tmp_path, monkeypatch, budget, how, step):
    data = np.random.default_rng(4).random((20, 64, 64), dtype=np.float32)
    src = zarr_volume(tmp_path, data, chunks=(8, 16, 16))
    reads: list[tuple] = []
    original = ZarrArraySource.__getitem__

    def recording(self, key):
        out = original(self, key)
        reads.append((key, out.size * 8))
        return out

    monkeypatch.setattr(ZarrArraySource, "__getitem__", recording)
    plane = parse_plane(src, 3, axis=0, projection=how, max_pixels=(-(-64 // step)) ** 2)
    assert plane.step == step
    got = read_plane(plane, slab_bytes=budget)
    every = slice(None, None, step)
    full = data[:, every, every]
    want = full.max(axis=0) if how == "max" else full.mean(axis=0, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    boxes = [([k.start for k in key], [k.stop for k in key]) for key, _ in reads]
    assert (covered(boxes, data.shape)[:, every, every] == 1).all()  # each shown voxel once
    row = -(-64 // step) * 8
    assert max(n for _, n in reads) <= max(budget, row)
    if budget >= 8 * 16 * row:  # a chunk-thick band of chunk rows fits: no chunk is cut
        for start, stop in boxes:
            assert all(a % c == 0 for a, c in zip(start, (8, 16, 16)))
            assert all(b % c == 0 or b == d for b, c, d in zip(stop, (8, 16, 16), data.shape))


def test_density_of_a_big_2d_map_is_summed_block_by_block(monkeypatch):
    weights = np.zeros((60, 50), dtype=np.float32)
    weights[20:40, 10:30] = 1.0
    map_source = as_array_source(weights)
    plane = parse_plane(map_source, 2, projection="max")
    reads: list[int] = []
    cls = type(map_source)
    original = cls.__getitem__
    monkeypatch.setattr(cls, "__getitem__", lambda self, k: reads.append(k) or original(self, k))
    budget = 5 * 50 * 8  # five rows
    got = sum_along(
        plane, (0, 0), (60, 50), lambda b: b.astype(np.float64), (4, 5), slab_bytes=budget
    )
    want = np.add.reduceat(np.add.reduceat(weights, np.arange(0, 60, 4), 0), np.arange(0, 50, 5), 1)
    np.testing.assert_array_equal(got, want)
    assert len(reads) == 12  # five rows at a time, never the whole map


def test_max_pixels_subsamples_the_image_but_not_the_footprints(volume):
    ax = plot_patches(volume, CORNERS, (4, 6, 8), axis=0, index=2, max_pixels=120)
    np.testing.assert_array_equal(image(ax), volume[2, ::2, ::2])
    assert ax.images[0].get_extent() == [0.0, 24.0, 20.0, 0.0]
    assert ax.get_xlim() == (0.0, 24.0) and ax.get_ylim() == (20.0, 0.0)
    assert (0.0, 0.0, 8, 6) in rects(ax)
    assert "image every 2 pixels" in ax.get_title()


@pytest.mark.parametrize("how", ["slice", "max"])
def test_a_subsampled_image_is_framed_at_the_volumes_edge(tmp_path, how):
    data = np.random.default_rng(3).random((5, 11, 13), dtype=np.float32)
    src = zarr_volume(tmp_path, data, chunks=(5, 4, 4))
    index = 2 if how == "slice" else None
    ax = plot_patches(src, [[0, 8, 10]], 3, index=index, projection=how, max_pixels=42)
    assert ax.images[0].get_extent() == [0.0, 14.0, 12.0, 0.0]  # 7 x 6 pixels, 2 voxels each
    assert ax.get_xlim() == (0.0, 13.0) and ax.get_ylim() == (11.0, 0.0)  # not 14 x 12
    grid = plot_chunk_grid(src, index=index, projection=how, max_pixels=42)
    assert grid.get_xlim() == (0.0, 13.0) and grid.get_ylim() == (11.0, 0.0)
    assert lines(grid, "chunks") == ([4.0, 8.0, 12.0], [4.0, 8.0])


def test_contrast_is_clipped_to_percentiles(volume):
    ax = plot_patches(volume, CORNERS, 4, index=0, clip=(5, 95))
    low, high = np.percentile(volume[0], (5, 95))
    assert ax.images[0].norm.vmin == pytest.approx(low)
    assert ax.images[0].norm.vmax == pytest.approx(high)
    full = plot_patches(volume, CORNERS, 4, index=0, clip=None)
    assert full.images[0].norm.vmin == pytest.approx(volume[0].min())


def test_max_patches_limits_and_the_title_says_so(volume):
    ax = plot_patches(volume, CORNERS, 4, projection="max", max_patches=2)
    assert rects(ax) == sorted((float(c[2]), float(c[1]), 4, 4) for c in CORNERS[:2])
    assert "(first 2 drawn)" in ax.get_title()


def test_many_patches_go_into_one_collection(volume):
    n = INDIVIDUAL_PATCHES + 44
    corners = np.stack([np.zeros(n), np.arange(n) % 16, np.arange(n) % 20], axis=1).astype(int)
    ax = plot_patches(volume, corners, 4, projection="max")
    assert not ax.patches
    (coll,) = [c for c in ax.collections if isinstance(c, PatchCollection)]
    paths = coll.get_paths()
    assert len(paths) == n
    lo = np.array([p.vertices.min(axis=0) for p in paths])
    hi = np.array([p.vertices.max(axis=0) for p in paths])
    np.testing.assert_array_equal(lo, corners[:, [2, 1]])
    np.testing.assert_array_equal(hi - lo, np.full((n, 2), 4))


def test_two_d_image_draws_every_patch():
    img = np.arange(30 * 40, dtype=np.uint16).reshape(30, 40)
    ax = plot_patches(img, [[0, 0], [10, 20]], (8, 16))
    np.testing.assert_array_equal(image(ax), img)
    assert rects(ax) == [(0.0, 0.0, 16, 8), (20.0, 10.0, 16, 8)]
    assert ax.get_title() == "2 patches"


def test_channel_axes_are_indexed_by_channel(volume):
    stack = np.stack([volume, -volume])
    ax = plot_patches(stack, CORNERS, 4, index=5, channel=1)
    np.testing.assert_array_equal(image(ax), -volume[5])
    assert ax.get_xlabel() == "axis 3"  # labels name the array's axes
    named = plot_patches(stack, CORNERS, 4, index=5, axis_names="zyx")
    assert (named.get_ylabel(), named.get_xlabel()) == ("y", "x")


def test_draws_into_a_given_axes_and_saves_a_png(tmp_path, volume):
    fig = Figure()
    given = fig.subplots()
    ax = plot_patches(volume, CORNERS, 4, ax=given)
    assert ax is given
    path = tmp_path / "patches.png"
    ax.figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- plot_sampler ---------------------------------------------------------------------------


def test_plot_sampler_uses_the_samplers_corners(tmp_path, volume):
    src = zarr_volume(tmp_path, volume, chunks=(4, 8, 8))
    sampler = mixle.PatchSampler(src, (4, 6, 8), 40, seed=3)
    ax = plot_sampler(sampler, projection="max")
    corners = sampler.coords_array()
    assert rects(ax) == sorted((float(c[2]), float(c[1]), 8, 6) for c in corners)
    np.testing.assert_array_equal(image(ax), volume.max(axis=0))
    sliced = plot_sampler(sampler, axis=0, index=7, num_patches=10)
    hits = [c for c in corners[:10] if c[0] <= 7 < c[0] + 4]
    assert len(sliced.patches) == len(hits)


def test_plot_sampler_with_a_grid_sampler_and_channels(volume):
    stack = np.stack([volume, volume * 2])
    grid = mixle.GridSampler(stack, (6, 10, 12))
    ax = plot_sampler(grid, projection="max", channel=1)
    np.testing.assert_array_equal(image(ax), (volume * 2).max(axis=0))
    assert len(ax.patches) == len(grid) == 8


def test_plot_sampler_of_a_dict_uses_the_finest_array(volume):
    coarse = volume[::2, ::2, ::2]
    sampler = mixle.PatchSampler({"label": coarse, "image": volume}, (4, 4, 4), 10, seed=1)
    ax = plot_sampler(sampler, projection="max")
    np.testing.assert_array_equal(image(ax), volume.max(axis=0))


def test_a_dict_sampler_without_one_finest_array_is_refused_clearly():
    wide = np.zeros((8, 16, 8), dtype=np.float32)  # finest on axis 1 only
    tall = np.zeros((8, 8, 16), dtype=np.float32)  # finest on axis 2 only
    sampler = mixle.PatchSampler({"wide": wide, "tall": tall}, 4, 5, seed=0)
    with pytest.raises(ValueError, match=r"no array at the finest scale on every axis"):
        plot_sampler(sampler)
    with pytest.raises(ValueError, match=r"grid of shape \(8, 16, 16\)"):
        plot_sampling_density(sampler)


def test_padded_footprints_may_leave_the_image_but_limits_do_not(volume):
    sampler = mixle.PatchSampler(volume, 10, 50, seed=0, padding="constant")
    ax = plot_sampler(sampler, projection="max")
    assert min(x for x, *_ in rects(ax)) < 0
    assert ax.get_xlim() == (0.0, 24.0) and ax.get_ylim() == (20.0, 0.0)


# -- plot_chunk_grid --------------------------------------------------------------------


def lines(ax: Axes, label: str) -> tuple[list[float], list[float]]:
    (coll,) = [
        c for c in ax.collections if isinstance(c, LineCollection) and c.get_label() == label
    ]
    (x_lo, x_hi), (y_hi, y_lo) = ax.get_xlim(), ax.get_ylim()
    xs, ys = [], []
    for (x0, y0), (x1, y1) in coll.get_segments():
        if x0 == x1:  # a vertical line spans the image's height
            assert (y0, y1) == (y_lo, y_hi)
            xs.append(float(x0))
        else:
            assert (y0 == y1) and (x0, x1) == (x_lo, x_hi)
            ys.append(float(y0))
    return xs, ys


def test_chunk_grid_lines_at_chunk_boundaries(tmp_path, volume):
    src = zarr_volume(tmp_path, volume, chunks=(4, 8, 5))
    ax = plot_chunk_grid(src, index=6)
    assert lines(ax, "chunks") == ([5.0, 10.0, 15.0, 20.0], [8.0, 16.0])
    np.testing.assert_array_equal(image(ax), volume[6])
    assert "chunks (4, 8, 5)" in ax.get_title() and "in chunk 1 along it" in ax.get_title()
    across = plot_chunk_grid(src, axis=2)
    assert lines(across, "chunks") == ([8.0, 16.0], [4.0, 8.0])


def test_chunk_grid_draws_shards_of_a_sharded_zarr(tmp_path):
    data = np.random.default_rng(1).random((8, 32, 48), dtype=np.float32)
    src = zarr_volume(tmp_path, data, chunks=(4, 8, 8), shards=(8, 16, 24))
    assert src.shards == (8, 16, 24)
    ax = plot_chunk_grid(src, axis=0, index=3)
    assert lines(ax, "chunks") == ([8.0, 16.0, 24.0, 32.0, 40.0], [8.0, 16.0, 24.0])
    assert lines(ax, "shards") == ([24.0], [16.0])
    assert "shards (16, 24)" not in ax.get_title() and "shards (8, 16, 24)" in ax.get_title()
    path = tmp_path / "grid.png"
    ax.figure.savefig(path)
    assert path.stat().st_size > 1000


def test_chunk_grid_of_an_unchunked_array_says_so(volume):
    ax = plot_chunk_grid(volume)
    assert not ax.collections
    assert ax.get_title().startswith("not chunked")


def test_chunk_grid_max_projection(tmp_path, volume):
    src = zarr_volume(tmp_path, volume, chunks=(4, 8, 8))
    ax = plot_chunk_grid(src, projection="max", axis=0)
    np.testing.assert_array_equal(image(ax), volume.max(axis=0))


# -- plot_sampling_density ----------------------------------------------------------------


def test_density_of_a_weighted_sampler_stays_where_the_weights_are(tmp_path):
    shape = (16, 40, 48)
    data = np.random.default_rng(2).random(shape, dtype=np.float32)
    weights = np.zeros(shape, dtype=np.float32)
    weights[4:12, 10:20, 20:36] = 1.0
    src = zarr_volume(tmp_path, data, chunks=(8, 16, 16))
    sampler = mixle.PatchSampler(src, (4, 8, 8), 500, seed=5, weights=weights)
    axes = plot_sampling_density(sampler, num_draws=1200, axis=0)
    assert axes.shape == (2,) and all(isinstance(a, Axes) for a in axes)
    expected, drawn = image(axes[0]), image(axes[1])
    assert drawn.sum() == 1200 and drawn.shape == (40, 48)
    inside = np.zeros((40, 48), dtype=bool)
    inside[10:20, 20:36] = True
    assert drawn[~inside].sum() == 0
    assert expected.sum() == pytest.approx(1200)
    assert expected[~inside].sum() == 0
    np.testing.assert_allclose(expected[inside], 1200 / inside.sum())
    assert "1,200 drawn patch centres (epochs 0-2), summed along axis 0" in axes[1].get_title()
    assert sampler.epoch == 0  # the caller's sampler is not moved to another epoch


def test_density_with_a_coarse_weight_map_is_drawn_in_volume_coordinates():
    vol = np.zeros((16, 40, 48), dtype=np.float32)
    weights = np.zeros((8, 20, 24), dtype=np.float32)  # half resolution
    weights[2:6, 5:10, 10:18] = 1.0
    sampler = mixle.PatchSampler(vol, (4, 8, 8), 500, seed=1, weights=weights)
    axes = plot_sampling_density(sampler, num_draws=1000)
    expected, drawn = image(axes[0]), image(axes[1])
    assert drawn.shape == (20, 24) and drawn.sum() == 1000  # one bin per map voxel
    hit = np.argwhere(drawn)
    assert hit.min(axis=0).tolist() == [5, 10] and hit.max(axis=0).tolist() == [9, 17]
    np.testing.assert_allclose(expected[5:10, 10:18], 1000 / 40)
    assert axes[1].images[0].get_extent() == [0.0, 48.0, 40.0, 0.0]
    assert "(2x2 voxels)" in axes[0].figure.axes[-1].get_ylabel()


def test_density_of_a_label_sampler_and_pooled_bins():
    shape = (8, 64, 64)
    labels = np.zeros(shape, dtype=np.uint8)
    labels[:, 40:56, 8:24] = 1
    vol = np.zeros(shape, dtype=np.float32)
    sampler = mixle.PatchSampler(
        vol, (2, 8, 8), 300, seed=1, labels=labels, label_probabilities={1: 1.0}
    )
    axes = plot_sampling_density(sampler, num_draws=300, max_bins=16)
    expected, drawn = image(axes[0]), image(axes[1])
    assert drawn.shape == (16, 16) and drawn.sum() == 300
    assert drawn[:10].sum() == 0 and drawn[:, 6:].sum() == 0  # bins of 4 voxels
    assert expected.sum() == pytest.approx(300) and expected[:10].sum() == 0
    assert "labels" in axes[0].get_title()


def test_density_of_an_unweighted_sampler_is_one_histogram(volume):
    sampler = mixle.PatchSampler(volume, 4, 1000, seed=2)
    axes = plot_sampling_density(sampler, num_draws=500, axis=1)
    assert axes.shape == (1,)
    drawn = image(axes[0])
    assert drawn.shape == (12, 24) and drawn.sum() == 500
    centres = sampler.coords_array(np.arange(500)) + 2
    want = np.zeros((12, 24))
    np.add.at(want, (centres[:, 0], centres[:, 2]), 1)
    np.testing.assert_array_equal(drawn, want)


def test_pooled_density_is_framed_at_the_volumes_edge():
    vol = np.zeros((4, 50, 70), dtype=np.float32)
    sampler = mixle.PatchSampler(vol, 2, 100, seed=0)
    (ax,) = plot_sampling_density(sampler, num_draws=100, max_bins=16)
    assert image(ax).shape == (13, 14)  # bins of 4 x 5 voxels
    assert ax.images[0].get_extent() == [0.0, 70.0, 52.0, 0.0]  # the last row of bins
    assert ax.get_xlim() == (0.0, 70.0) and ax.get_ylim() == (50.0, 0.0)


def test_drawing_never_imports_pyplot():
    code = (
        "import sys, numpy as np, mixle, mixle.plot as mp\n"
        "v = np.random.default_rng(0).random((6, 8, 8))\n"
        "s = mixle.PatchSampler(v, 4, 5, weights=v)\n"
        "mp.plot_sampler(s, projection='max'); mp.plot_chunk_grid(v)\n"
        "mp.plot_sampling_density(s, num_draws=20)\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_density_of_a_grid_sampler_stops_at_its_length(volume):
    grid = mixle.GridSampler(volume, (6, 10, 12))
    axes = plot_sampling_density(grid, num_draws=100)
    assert image(axes[0]).sum() == len(grid) == 8


def test_density_into_given_axes(volume):
    weights = np.ones_like(volume)
    sampler = mixle.PatchSampler(volume, 4, 10, weights=weights)
    fig = Figure()
    pair = fig.subplots(1, 2)
    axes = plot_sampling_density(sampler, num_draws=10, ax=pair)
    assert list(axes) == list(pair)
    with pytest.raises(ValueError, match="holds 1 Axes; this plot draws 2"):
        plot_sampling_density(sampler, num_draws=10, ax=fig.subplots())


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"axis": 3}, ValueError, "axis=3 is out of range"),
        ({"axis": -4}, ValueError, "axis=-4 is out of range"),
        ({"index": 12}, IndexError, "index=12 is out of range for axis 0 of length 12"),
        ({"index": -1}, IndexError, "index=-1 is out of range"),
        ({"projection": "sum"}, ValueError, "projection='sum' must be one of 'slice', 'max'"),
        ({"projection": "max", "index": 3}, ValueError, "index=3 applies to projection='slice'"),
        ({"max_patches": -1}, ValueError, "max_patches=-1 must be >= 0"),
        ({"max_pixels": 0}, ValueError, "max_pixels=0 must be >= 1"),
        ({"channel": 1}, ValueError, "channel=1 has 1 entries but volume has 0 channel axes"),
        ({"clip": (90, 10)}, ValueError, r"clip=\(90, 10\) must satisfy"),
        ({"axis_names": "yx"}, ValueError, "axis_names='yx' has 2 names"),
        ({"axis": 1.0}, TypeError, "axis=1.0 must be an int"),
    ],
)
def test_plot_patches_rejects_bad_arguments(volume, kwargs, error, match):
    with pytest.raises(error, match=match):
        plot_patches(volume, CORNERS, 4, **kwargs)


def test_rejects_bad_volumes_and_corners(volume):
    with pytest.raises(ValueError, match=r"volume has shape \(10,\); plots need at least 2"):
        plot_patches(np.zeros(10), np.zeros((1, 2), dtype=int), 2)
    with pytest.raises(ValueError, match=r"source has shape \(10,\); plots need at least 2"):
        plot_chunk_grid(np.zeros(10))
    with pytest.raises(ValueError, match=r"corners has shape \(5, 4\); expected \(N, 2\)"):
        plot_patches(volume, np.zeros((5, 4), dtype=int), 4)
    with pytest.raises(ValueError, match=r"corners has 3 columns but volume has shape \(20, 24\)"):
        plot_patches(volume[0], CORNERS, 4)
    with pytest.raises(TypeError, match="corners has dtype float64"):
        plot_patches(volume, CORNERS.astype(float), 4)
    with pytest.raises(ValueError, match=r"patch_size=\(4, 4\) has 2 entries but the array has 3"):
        plot_patches(volume, CORNERS, (4, 4))
    with pytest.raises(ValueError, match=r"patch_size=0 must be >= 1"):
        plot_patches(volume, CORNERS, 0)
    with pytest.raises(ValueError, match=r"shape \(0, 20, 24\); an empty spatial axis"):
        plot_patches(volume[:0], CORNERS, 4, projection="max")
    with pytest.raises(ValueError, match=r"shape \(12, 0\); an empty spatial axis"):
        plot_chunk_grid(volume[:, 0, :0])
    with pytest.raises(ValueError, match="index=3 picks a plane of 3-D data"):
        plot_patches(volume[0], CORNERS[:, 1:], 4, index=3)
    with pytest.raises(IndexError, match=r"channel=2 is out of range for channel axes \(2,\)"):
        plot_patches(np.stack([volume, volume]), CORNERS, 4, channel=2)
    with pytest.raises(ValueError, match=r"source has 4 spatial axes \(shape \(1, 12, 20, 24\)\)"):
        plot_chunk_grid(volume[None], spatial_ndim=4)


def test_sampler_functions_reject_bad_arguments(volume):
    sampler = mixle.PatchSampler(volume, 4, 10)
    with pytest.raises(TypeError, match="sampler=ndarray must be a PatchSampler or GridSampler"):
        plot_sampler(volume)
    with pytest.raises(TypeError, match="sampler=list must be a PatchSampler"):
        plot_sampling_density([1, 2])
    with pytest.raises(ValueError, match=r"num_patches=11 must be in \[0, 10\]"):
        plot_sampler(sampler, num_patches=11)
    with pytest.raises(ValueError, match="num_draws=0 must be >= 1"):
        plot_sampling_density(sampler, num_draws=0)
    with pytest.raises(ValueError, match="max_bins=0 must be >= 1"):
        plot_sampling_density(sampler, max_bins=0)
    with pytest.raises(ValueError, match="axis=5 is out of range"):
        plot_sampling_density(sampler, axis=5)
