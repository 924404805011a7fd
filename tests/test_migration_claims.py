"""The mixle side of each difference docs/migration.md states against xbatcher, TorchIO, MONAI
and grain: tile counts, edge handling, window floor and how other loaders collate ``coords``.

The page's "Checked against the peers" table is checked row by row: its peer column against
the golden arrays the real TorchIO and MONAI wrote (tests/data/peer_parity/), its mixle and
match columns against what mixle computes; tests/test_peer_parity.py compares with the live
peers where they are installed. The other tests pin what mixle does, so the page cannot
drift from it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_peer_parity import (
    MONAI_ROI,
    TIO_GRIDS,
    TIO_OVERLAP,
    TIO_PATCH,
    golden,
    monai_overlap,
    monai_predictor,
    ramp,
)

import mixle
from mixle.data.sampling.stitch import MONAI_WEIGHT_FLOOR, monai_gaussian_window, window_1d

PAGE = Path(__file__).resolve().parents[1] / "docs" / "migration.md"

VOLUME = (64, 64, 48)  # the page's scan.zarr volume


@pytest.mark.parametrize("padding", ["none", "reflect", "edge", "constant"])
def test_overlap_16_grid_has_18_tiles_whatever_the_padding(padding: str) -> None:
    grid = mixle.GridSampler(np.zeros(VOLUME, np.float32), 32, overlap=16, padding=padding)
    assert (len(grid), grid.grid_shape) == (18, (3, 3, 2))
    corners = grid.coords_array()
    assert corners.min() == 0  # nothing padded before voxel 0 (TorchIO pads overlap/2 there)


def test_pad_overlap_grid_is_torchios_48_tiles() -> None:
    vol = np.zeros(VOLUME, np.float32)
    grid = mixle.GridSampler(vol, 32, overlap=16, padding="reflect", pad_overlap=True)
    assert (len(grid), grid.grid_shape) == (48, (4, 4, 3))
    assert grid.coords_array().min() == -8  # overlap // 2 padded before voxel 0
    with pytest.raises(ValueError, match="pad_overlap=True"):
        mixle.GridSampler(vol, 32, overlap=16, pad_overlap=True)  # padding="none": no fill


def test_monai_gaussian_window_is_floored_at_1e_3() -> None:
    w = monai_gaussian_window((32, 32, 32))
    assert MONAI_WEIGHT_FLOOR == 1e-3 and w.min() == 1e-3 and w.max() < 1.0


def _table() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8").split("## Checked against the peers", 1)[1]
    lines = [ln for ln in text.split("\n## ", 1)[0].splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines[2:]]  # no header


def _stitch_case(row: int) -> tuple[np.ndarray, np.ndarray]:
    """(peer's stitched volume from the golden file, mixle's) for table row ``row``."""
    t, m = golden("torchio"), golden("monai")
    tio_rows = {4: ("none", "average", "mean"), 5: ("none", "hann", "hann"),
                6: ("none", "crop", "crop"), 7: ("reflect", "average", "mean"),
                8: ("reflect", "hann", "hann"), 9: ("reflect", "crop", "crop"),
                10: ("reflect", "hann", "gaussian")}  # fmt: skip
    if row in tio_rows:
        mode, peer, window = tio_rows[row]
        grid = mixle.GridSampler(t["volume"], TIO_PATCH, overlap=TIO_OVERLAP, **TIO_GRIDS[mode])
        ours = mixle.stitch(grid, lambda x: x + ramp(TIO_PATCH), window=window)
        return t[f"stitch_{mode}_{peer}"], ours
    monai_rows = {11: ("constant_025", 0.25, "mean", {}),
                  12: ("gaussian_025", 0.25, "monai_gaussian", {}),
                  13: ("gaussian_050", 0.5, "monai_gaussian", {}),
                  14: ("gaussian_050_sigma", 0.5, "monai_gaussian",
                       {"sigma_scale": (0.25, 0.125, 0.5)}),
                  15: ("gaussian_050", 0.5, "gaussian", {})}  # fmt: skip
    case, fraction, window, options = monai_rows[row]
    grid = mixle.GridSampler(m["volume"], MONAI_ROI, overlap=monai_overlap(MONAI_ROI, fraction))
    predict = lambda x: monai_predictor(x, MONAI_ROI)  # noqa: E731
    return m[case], mixle.stitch(grid, predict, window=window, **options)


def test_checked_against_the_peers_table_is_true() -> None:
    rows = _table()
    assert len(rows) == 16
    for k, (mapping, peer, ours, match) in enumerate(rows):
        diff = float(re.search(r"max abs diff ([0-9.e+-]+)", match).group(1))  # type: ignore[union-attr]
        if k < 4:  # grid rows: tile counts, tiles equal
            mode = list(TIO_GRIDS)[k]
            g = golden("torchio")
            locations = g[f"grid_{mode}_locations"]
            grid = mixle.GridSampler(g["volume"], TIO_PATCH, overlap=TIO_OVERLAP, **TIO_GRIDS[mode])
            assert peer == f"{len(locations)} tiles" and ours.startswith(f"{len(grid)} tiles")
            assert match.startswith("yes") and diff == 0
            continue
        want, got = _stitch_case(k)
        assert peer == f"mean {want.mean():.6f}", mapping
        assert ours == f"mean {got.mean():.6f}", mapping
        measured = float(np.abs(got - want).max())
        assert match.startswith("yes" if measured < 1e-6 else "no"), mapping
        printed = f"{measured:.2g}" if measured >= 1e-6 else f"{measured:.1e}"
        assert diff == pytest.approx(float(printed), abs=1e-12), (mapping, measured)


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
