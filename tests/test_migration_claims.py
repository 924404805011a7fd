"""The mixle side of each difference docs/migration.md states against xbatcher, TorchIO, MONAI
and grain: tile counts, edge handling, window floor and how other loaders collate ``coords``.

The peers' numbers on that page are not checked here (the peers are not installed); these
tests pin what mixle does, so the page cannot drift from it.
"""

from __future__ import annotations

import numpy as np
import pytest

import mixle
from mixle.data.stitch import window_1d

VOLUME = (64, 64, 48)  # the page's scan.zarr volume


@pytest.mark.parametrize("padding", ["none", "reflect", "edge", "constant"])
def test_overlap_16_grid_has_18_tiles_whatever_the_padding(padding: str) -> None:
    grid = mixle.GridSampler(np.zeros(VOLUME, np.float32), 32, overlap=16, padding=padding)
    assert (len(grid), grid.grid_shape) == (18, (3, 3, 2))
    corners = grid.coords_array()
    assert corners.min() == 0  # nothing padded before voxel 0 (TorchIO pads overlap/2 there)


def test_default_grid_shifts_the_last_tile_inside_and_covers_every_voxel() -> None:
    cube = np.zeros((12, 96, 128), np.float32)  # (time, lat, lon), the xbatcher recipe
    grid = mixle.GridSampler(cube, (32, 32), overlap=8)
    assert (len(grid), grid.grid_shape) == (20, (4, 5))
    corners = grid.coords_array()
    assert corners[:, 0].max() == 96 - 32 and corners[:, 1].max() == 128 - 32
    covered = np.zeros((96, 128), bool)
    for lat, lon in corners:
        covered[lat : lat + 32, lon : lon + 32] = True
    assert covered.all()  # xbatcher drops latitudes 80..95 here


def test_patch_sampler_with_2d_patch_on_3d_source_keeps_time_whole() -> None:
    cube = np.arange(12 * 96 * 128, dtype=np.float32).reshape(12, 96, 128)
    sampler = mixle.PatchSampler(cube, (32, 32), 16, seed=0)
    patches, corners = next(iter(mixle.Loader(sampler, batch_size=8)))
    assert patches.shape == (8, 12, 32, 32) and corners.shape == (8, 2)
    lat, lon = corners[0]
    np.testing.assert_array_equal(patches[0], cube[:, lat : lat + 32, lon : lon + 32])


def test_gaussian_window_is_not_floored_at_1e_3() -> None:
    # sigma is 1/8 of the tile, so a tile's face weighs about exp(-8) of the peak per axis
    for size in (32, 512):
        w = window_1d(size, "gaussian")
        assert w.max() == 1.0 and w.min() < 1e-3
    np.testing.assert_allclose(window_1d(512, "gaussian").min(), np.exp(-8), rtol=0.05)
    assert window_1d(32, "gaussian").min() ** 3 < 1e-9  # a 3-D tile's corner (separable)


def test_torch_dataloader_collates_coords_per_axis_and_stack_restores_them() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    sampler = mixle.PatchSampler(np.zeros(VOLUME, np.float32), 16, 16, seed=0)
    _, coords = next(iter(DataLoader(sampler, batch_size=8)))
    assert len(coords) == 3 and tuple(coords[0].shape) == (8,)
    _, expected = next(iter(mixle.Loader(sampler, batch_size=8)))
    np.testing.assert_array_equal(torch.stack(coords, dim=1).numpy(), expected)


def test_grain_batch_collates_coords_per_axis_and_stack_restores_them() -> None:
    grain = pytest.importorskip("grain")
    sampler = mixle.PatchSampler({"image": np.zeros(VOLUME, np.float32)}, 16, 16, seed=0)
    coords = grain.MapDataset.source(sampler).batch(8)[0]["coords"]
    assert len(coords) == 3 and np.shape(coords[0]) == (8,)
    expected = next(iter(mixle.Loader(sampler, batch_size=8)))["coords"]
    np.testing.assert_array_equal(np.stack(coords, axis=1), expected)
