"""Write the golden arrays of tests/test_peer_parity.py from the real TorchIO and MONAI.

Every number in ``torchio.npz`` and ``monai.npz`` comes from the peer (mixle is not
imported here). Rerun it only when a case is added or the peers change behaviour, with
the peers on ``PYTHONPATH`` and without touching the installed torch::

    python3 -m pip install --no-deps --target /tmp/parity/peers torchio monai \\
        nibabel deprecated humanize typer rich einops jaxtyping wadler_lindig \\
        shellingham SimpleITK
    PYTHONPATH=/tmp/parity/peers python3 tests/data/peer_parity/make_golden.py

Written with TorchIO 1.2.1, MONAI 1.6.1 and torch 2.13.0 (CPU); the versions are stored in
each file (``versions``).
"""

from __future__ import annotations

from pathlib import Path

import monai
import numpy as np
import torch
import torchio as tio
from monai.inferers import sliding_window_inference

HERE = Path(__file__).parent
SHAPE = (10, 9, 8)  # the volume every case cuts
TIO_PATCH, TIO_OVERLAP = (8, 6, 4), (4, 2, 2)
TIO_GRID_MODES = {"none": None, "constant": 1.5, "reflect": "reflect", "edge": "edge"}
TIO_STITCH_PADDING = {"none": None, "reflect": "reflect"}
TIO_OVERLAP_MODES = ("average", "hann", "crop")
MONAI_ROI = (6, 5, 4)
MONAI_CASES = {  # name: (overlap fraction, mode, sigma_scale)
    "constant_025": (0.25, "constant", 0.125),
    "gaussian_025": (0.25, "gaussian", 0.125),
    "gaussian_050": (0.5, "gaussian", 0.125),
    "gaussian_050_sigma": (0.5, "gaussian", (0.25, 0.125, 0.5)),
}


def volume() -> np.ndarray:
    """The input volume (stored in both files, so tests never regenerate it)."""
    return np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)


def ramp(size: tuple[int, ...]) -> torch.Tensor:
    """A per-tile ramp: overlapping tiles predict different values, so blending matters."""
    i, j, k = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) for n in size), indexing="ij")
    return (i + 2 * j + 3 * k) / 10


def torchio_cases(vol: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    subject = tio.Subject(image=tio.ScalarImage(tensor=torch.from_numpy(vol)[None]))
    for name, mode in TIO_GRID_MODES.items():
        sampler = tio.GridSampler(subject, TIO_PATCH, TIO_OVERLAP, padding_mode=mode)
        out[f"grid_{name}_locations"] = np.asarray(sampler.locations, dtype=np.int64)
        padded = sampler.subject["image"].data[0].numpy()
        for index in range(len(sampler)):  # every tile is a crop of the padded volume
            lo = out[f"grid_{name}_locations"][index]
            tile = sampler[index]["image"].data[0].numpy()
            assert (tile == padded[lo[0] : lo[3], lo[1] : lo[4], lo[2] : lo[5]]).all()
        if mode is not None:  # without padding_mode the tiles are crops of the volume itself
            out[f"grid_{name}_padded"] = padded
    for pad_name, mode in TIO_STITCH_PADDING.items():
        for overlap_mode in TIO_OVERLAP_MODES:
            sampler = tio.GridSampler(subject, TIO_PATCH, TIO_OVERLAP, padding_mode=mode)
            agg = tio.inference.GridAggregator(sampler, overlap_mode=overlap_mode)
            for index in range(len(sampler)):  # grid order, as a DataLoader without shuffle
                patch = sampler[index]
                x = patch["image"].data[None]  # (1, 1, *patch)
                agg.add_batch(x + ramp(TIO_PATCH), torch.as_tensor(patch[tio.LOCATION])[None])
            result = agg.get_output_tensor()[0].numpy()
            out[f"stitch_{pad_name}_{overlap_mode}"] = result
    return out


def monai_cases(vol: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    inputs = torch.from_numpy(vol)[None, None]

    def predictor(x: torch.Tensor) -> torch.Tensor:  # (B, 1, *roi) -> (B, 2, *roi)
        return torch.cat([x + ramp(MONAI_ROI), x * ramp(MONAI_ROI)], dim=1)

    for name, (overlap, mode, sigma_scale) in MONAI_CASES.items():
        result = sliding_window_inference(
            inputs, MONAI_ROI, 3, predictor, overlap=overlap, mode=mode, sigma_scale=sigma_scale
        )
        out[name] = result[0].numpy()
    return out


def main() -> None:
    vol = volume()
    versions = f"torchio {tio.__version__}, monai {monai.__version__}, torch {torch.__version__}"
    for stem, cases in (("torchio", torchio_cases(vol)), ("monai", monai_cases(vol))):
        path = HERE / f"{stem}.npz"
        np.savez_compressed(path, volume=vol, versions=np.array(versions), **cases)
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
