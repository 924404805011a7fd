"""A mixle sampler used unchanged as a PyTorch map-style Dataset and a grain data source."""

from __future__ import annotations

import numpy as np
import pytest

from mixle import PatchSampler


def _sampler() -> PatchSampler:
    volume = np.arange(16 * 20, dtype=np.float32).reshape(16, 20)
    return PatchSampler(volume, (4, 5), 10, seed=3)


def test_torch_dataloader_reads_a_sampler() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    sampler = _sampler()
    loader = DataLoader(sampler, batch_size=4, shuffle=False)  # type: ignore[arg-type]
    batches = list(loader)
    assert len(batches) == 3
    patches, coords = batches[0]
    assert isinstance(patches, torch.Tensor) and patches.shape == (4, 4, 5)
    want_patches, want_coords = sampler.get_batch(np.arange(4))
    np.testing.assert_array_equal(patches.numpy(), want_patches)
    got_coords = np.stack([c.numpy() for c in coords], axis=1)  # tuples collate per axis
    np.testing.assert_array_equal(got_coords, want_coords)
    assert not isinstance(sampler, Dataset)  # works by protocol, no subclassing


def test_grain_map_dataset_reads_a_sampler() -> None:
    grain = pytest.importorskip("grain.python")

    sampler = _sampler()
    assert isinstance(sampler, grain.RandomAccessDataSource)  # a runtime-checkable protocol
    dataset = grain.MapDataset.source(sampler).batch(4)
    patches, coords = dataset[0]
    want_patches, want_coords = sampler.get_batch(np.arange(4))
    np.testing.assert_array_equal(patches, want_patches)
    np.testing.assert_array_equal(np.stack(coords, axis=1), want_coords)  # one array per axis
    shuffled = grain.MapDataset.source(sampler).shuffle(seed=0)
    seen = sorted(tuple(shuffled[i][1]) for i in range(len(sampler)))
    assert seen == sorted(sampler.coords())
