"""mixle's peer options against the peers' own output: TorchIO's grid and aggregator, MONAI's
sliding window.

The golden arrays in tests/data/peer_parity/ were written by the real TorchIO and MONAI
(tests/data/peer_parity/make_golden.py says how to rerun it); the golden tests always run.
The live tests run where the peer imports and compare mixle with the peer on other cases
too, and check the golden files are still what the peer gives.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import mixle
from mixle.data.sampling.stitch import MONAI_WEIGHT_FLOOR, monai_gaussian_window

GOLDEN = Path(__file__).parent / "data" / "peer_parity"
TIO_PATCH, TIO_OVERLAP = (8, 6, 4), (4, 2, 2)  # as in make_golden.py
TIO_GRIDS = {  # TorchIO padding_mode name -> mixle GridSampler options
    "none": {"padding": "none"},
    "constant": {"padding": "constant", "pad_value": 1.5, "pad_overlap": True},
    "reflect": {"padding": "reflect", "pad_overlap": True},
    "edge": {"padding": "edge", "pad_overlap": True},
}
TIO_WINDOWS = {"average": "mean", "hann": "hann", "crop": "crop"}
MONAI_ROI = (6, 5, 4)
MONAI_CASES = {  # as in make_golden.py: (overlap fraction, mixle window, sigma_scale)
    "constant_025": (0.25, "mean", None),
    "gaussian_025": (0.25, "monai_gaussian", None),
    "gaussian_050": (0.5, "monai_gaussian", None),
    "gaussian_050_sigma": (0.5, "monai_gaussian", (0.25, 0.125, 0.5)),
}
TOL = 2e-6  # the peers accumulate in float32, mixle in float64


def golden(stem: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / f"{stem}.npz") as data:
        return {k: data[k] for k in data.files}


def ramp(size: tuple[int, ...]) -> np.ndarray:
    """make_golden.py's per-tile ramp, in float32 as torch computes it there."""
    i, j, k = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in size), indexing="ij")
    return (i + 2 * j + 3 * k) / np.float32(10)


def monai_overlap(roi: tuple[int, ...], fraction: float) -> list[int]:
    """MONAI's ``overlap=fraction`` in voxels: it steps by ``int(r * (1 - fraction))``."""
    return [r - max(int(r * (1 - fraction)), 1) for r in roi]


def monai_predictor(tiles: np.ndarray, roi: tuple[int, ...]) -> np.ndarray:
    return np.stack([tiles + ramp(roi), tiles * ramp(roi)], axis=1)


# -- golden: always run ------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(TIO_GRIDS))
def test_torchio_grid_tiles_equal_torchio_golden(mode: str) -> None:
    g = golden("torchio")
    vol = g["volume"]
    grid = mixle.GridSampler(vol, TIO_PATCH, overlap=TIO_OVERLAP, **TIO_GRIDS[mode])
    locations = g[f"grid_{mode}_locations"]  # TorchIO's, in its padded volume
    shift = np.array(TIO_OVERLAP) // 2 if mode != "none" else 0
    assert len(grid) == len(locations)
    np.testing.assert_array_equal(grid.coords_array(), locations[:, :3] - shift)
    padded = g.get(f"grid_{mode}_padded", vol)
    tiles, _ = grid.get_batch(np.arange(len(grid)))
    for tile, (a, b, c, x, y, z) in zip(tiles, locations.tolist()):
        np.testing.assert_array_equal(tile, padded[a:x, b:y, c:z])


@pytest.mark.parametrize("overlap_mode", list(TIO_WINDOWS))
@pytest.mark.parametrize("mode", ["none", "reflect"])
def test_torchio_aggregator_equals_torchio_golden(mode: str, overlap_mode: str) -> None:
    g = golden("torchio")
    grid = mixle.GridSampler(g["volume"], TIO_PATCH, overlap=TIO_OVERLAP, **TIO_GRIDS[mode])
    got = mixle.stitch(grid, lambda t: t + ramp(TIO_PATCH), window=TIO_WINDOWS[overlap_mode])
    want = g[f"stitch_{mode}_{overlap_mode}"]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    if overlap_mode == "crop":  # each voxel is one tile's value: no arithmetic at all
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", list(MONAI_CASES))
def test_monai_sliding_window_equals_monai_golden(case: str) -> None:
    g = golden("monai")
    fraction, window, sigma_scale = MONAI_CASES[case]
    grid = mixle.GridSampler(g["volume"], MONAI_ROI, overlap=monai_overlap(MONAI_ROI, fraction))
    options = {} if sigma_scale is None else {"sigma_scale": sigma_scale}
    got = mixle.stitch(
        grid, lambda t: monai_predictor(t, MONAI_ROI), batch_size=3, window=window, **options
    )
    np.testing.assert_allclose(got, g[case], rtol=0, atol=TOL)


def test_mixle_gaussian_is_not_the_peers_windows() -> None:
    """The differences docs/migration.md states, measured against the peers' golden output."""
    t, m = golden("torchio"), golden("monai")
    grid = mixle.GridSampler(t["volume"], TIO_PATCH, overlap=TIO_OVERLAP, **TIO_GRIDS["reflect"])
    ours = mixle.stitch(grid, lambda x: x + ramp(TIO_PATCH), window="gaussian")
    assert 0.3 < np.abs(ours - t["stitch_reflect_hann"]).max() < 0.5
    grid = mixle.GridSampler(m["volume"], MONAI_ROI, overlap=monai_overlap(MONAI_ROI, 0.5))
    ours = mixle.stitch(grid, lambda x: monai_predictor(x, MONAI_ROI), window="gaussian")
    assert 0.7 < np.abs(ours - m["gaussian_050"]).max() < 1.0


def test_monai_window_is_floored_on_the_nd_product() -> None:
    w = monai_gaussian_window(MONAI_ROI)
    assert w.min() == MONAI_WEIGHT_FLOOR and w.max() < 1.0  # even extents: no voxel at 0
    x = [np.arange(n) - (n - 1) / 2 for n in MONAI_ROI]
    raw = np.exp(-(x[0][:, None, None] ** 2) / (2 * 0.75**2))
    raw = raw * np.exp(-(x[1][None, :, None] ** 2) / (2 * 0.625**2))
    raw = raw * np.exp(-(x[2][None, None, :] ** 2) / (2 * 0.5**2))
    np.testing.assert_allclose(w, np.maximum(raw, 1e-3))


def test_peer_options_are_checked() -> None:
    vol = np.zeros((10, 9, 8), np.float32)
    with pytest.raises(
        ValueError, match=r"pads overlap // 2 .* pass padding='constant', 'reflect' or 'edge'"
    ):
        mixle.GridSampler(vol, 4, overlap=2, pad_overlap=True)
    with pytest.raises(TypeError, match="pad_overlap='yes' must be True or False"):
        mixle.GridSampler(vol, 4, overlap=2, padding="edge", pad_overlap="yes")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"padded by overlap // 2 = 1 on each side \(axis 0: 13 > 12"
    ):
        mixle.GridSampler(vol, 13, overlap=2, padding="edge", pad_overlap=True)
    grid = mixle.GridSampler(vol, (12, 11, 10), overlap=2, padding="edge", pad_overlap=True)
    assert grid.pad_overlap and "pad_overlap=True" in repr(grid)
    assert (
        grid.fingerprint()
        != mixle.GridSampler(vol, (12, 11, 10), overlap=2, padding="edge").fingerprint()
    )
    small = mixle.GridSampler(vol, 4, overlap=2)
    with pytest.raises(
        ValueError, match=r"sigma_scale=0\.2 only applies to window='monai_gaussian'"
    ):
        mixle.GridAggregator(small, window="gaussian", sigma_scale=0.2)
    with pytest.raises(ValueError, match=r"sigma_scale=\(0.1, 0.2\) must be a positive number"):
        mixle.GridAggregator(small, window="monai_gaussian", sigma_scale=(0.1, 0.2))


# -- live: where the peer is installed -----------------------------------------------------
def make_golden() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_golden_files_are_what_the_peers_give_now() -> None:
    pytest.importorskip("torchio")
    pytest.importorskip("monai")
    gen = make_golden()
    for stem, cases in (("torchio", gen.torchio_cases), ("monai", gen.monai_cases)):
        stored = golden(stem)
        fresh = cases(stored["volume"])
        assert set(fresh) == set(stored) - {"volume", "versions"}
        for name, value in fresh.items():
            np.testing.assert_array_equal(value, stored[name], err_msg=f"{stem}:{name}")


LIVE_TIO = [  # (shape, patch, overlap): odd shapes, a shifted last tile, one tile on an axis
    ((11, 7, 9), (5, 4, 6), (2, 2, 4)),
    ((9, 12, 6), (9, 5, 3), (4, 0, 2)),
]


@pytest.mark.parametrize("case", LIVE_TIO)
def test_torchio_live(case: tuple) -> None:
    tio = pytest.importorskip("torchio")
    torch = pytest.importorskip("torch")
    shape, patch, overlap = case
    vol = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    subject = tio.Subject(image=tio.ScalarImage(tensor=torch.from_numpy(vol)[None]))
    peer_modes = {"none": None, "constant": -2.0, "reflect": "reflect", "edge": "edge"}
    for mode, peer_mode in peer_modes.items():
        options = dict(TIO_GRIDS[mode])
        if mode == "constant":
            options["pad_value"] = -2.0
        grid = mixle.GridSampler(vol, patch, overlap=overlap, **options)
        sampler = tio.GridSampler(subject, patch, overlap, padding_mode=peer_mode)
        shift = np.array(overlap) // 2 if peer_mode is not None else 0
        locations = np.asarray(sampler.locations)
        np.testing.assert_array_equal(grid.coords_array(), locations[:, :3] - shift)
        tiles, _ = grid.get_batch(np.arange(len(grid)))
        for i in range(len(sampler)):
            np.testing.assert_array_equal(tiles[i], sampler[i]["image"].data[0].numpy())
        for overlap_mode, window in TIO_WINDOWS.items():
            agg = tio.inference.GridAggregator(sampler, overlap_mode=overlap_mode)
            for i in range(len(sampler)):
                x = sampler[i]["image"].data[None] + torch.from_numpy(ramp(patch))
                agg.add_batch(x, torch.as_tensor(sampler[i][tio.LOCATION])[None])
            want = agg.get_output_tensor()[0].numpy()
            got = mixle.stitch(grid, lambda t: t + ramp(patch), window=window)
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"{mode} {window}")


@pytest.mark.parametrize(("fraction", "sigma_scale"), [(0.3, 0.125), (0.6, 0.2), (0.0, 0.125)])
def test_monai_live(fraction: float, sigma_scale: float) -> None:
    pytest.importorskip("monai")
    torch = pytest.importorskip("torch")
    from monai.inferers import sliding_window_inference

    roi, vol = (5, 7, 3), np.random.default_rng(2).standard_normal((11, 13, 8)).astype(np.float32)
    grid = mixle.GridSampler(vol, roi, overlap=monai_overlap(roi, fraction))
    for mode, window in (("constant", "mean"), ("gaussian", "monai_gaussian")):
        want = sliding_window_inference(
            torch.from_numpy(vol)[None, None],
            roi,
            4,
            lambda x: torch.from_numpy(monai_predictor(x[:, 0].numpy(), roi)),
            overlap=fraction,
            mode=mode,
            sigma_scale=sigma_scale,
        )[0].numpy()
        options = {"sigma_scale": sigma_scale} if window == "monai_gaussian" else {}
        got = mixle.stitch(grid, lambda t: monai_predictor(t, roi), window=window, **options)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"{mode}")
