"""Locality sampling: blocks of patches share a region, so a batch decodes few chunks."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.index_math.hashing import below, below_each, hash_words
from mixle.data.sampling.placement import local_patch_corners
from mixle.reading import chunk_cache, set_chunk_cache_bytes


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2**63 - 1), st.integers(0, 2**64 - 1))
def test_below_each_equals_below_for_equal_bounds(n, seed):
    state = hash_words(seed, np.arange(64))
    np.testing.assert_array_equal(below_each(np.full(64, n), state), below(n, state))


def test_below_each_stays_below_each_bound_and_rejects_bad_bounds():
    bounds = np.arange(1, 5001)
    draws = below_each(bounds, hash_words(9, np.arange(5000)))
    assert ((draws >= 0) & (draws < bounds)).all()
    with pytest.raises(ValueError, match=">= 1"):
        below_each(np.array([3, 0]), hash_words(1, np.arange(2)))


@st.composite
def layouts(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 40)) for _ in range(ndim))
    patch = tuple(draw(st.integers(1, d)) for d in shape)
    stride = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    region = tuple(draw(st.integers(p, p + 12)) for p in patch)
    return shape, patch, stride, region, draw(st.integers(1, 9)), draw(st.integers(0, 2**32))


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_local_corners_in_bounds_on_grid_and_shared_per_block(layout):
    shape, patch, stride, region, per, seed = layout
    idx = np.arange(60)
    corners = local_patch_corners(seed, idx, shape, patch, stride, per, region)
    assert corners.shape == (60, len(shape))
    assert (corners >= 0).all() and (corners + np.array(patch) <= np.array(shape)).all()
    assert (corners % np.array(stride) == 0).all()
    # the same corners whichever indices are asked for, in whatever order
    some = idx[::-7]
    np.testing.assert_array_equal(
        local_patch_corners(seed, some, shape, patch, stride, per, region), corners[some]
    )
    # patches of one block sit in one region (up to one stride step at region edges)
    for block in range(0, 60, per):
        rows = corners[block : block + per]
        span = rows.max(axis=0) + np.array(patch) - rows.min(axis=0)
        assert (span <= np.array(region) + np.array(stride) + np.array(patch)).all()


def test_local_corners_golden_values():
    corners = local_patch_corners(2024, range(6), (100, 80, 60), (16, 16, 16), (1, 1, 1), 3,
                                  (32, 32, 32))  # fmt: skip
    assert corners.tolist() == GOLDEN


GOLDEN = [[40, 64, 11], [36, 64, 15], [36, 64, 14], [39, 36, 5], [45, 47, 0], [37, 34, 11]]


def test_sampler_locality_defaults_to_chunks_and_validates(tmp_path):
    path = tmp_path / "v.zarr"
    arr = zarr.create_array(str(path), shape=(64, 64, 64), chunks=(32, 32, 32), dtype="f4")
    arr[:] = np.arange(64**3, dtype="f4").reshape(64, 64, 64)
    sampler = mixle.PatchSampler(mixle.read_zarr(path), 8, 64, patches_per_chunk=8)
    assert sampler.region == (32, 32, 32) and sampler.patches_per_chunk == 8
    assert "patches_per_chunk=8" in repr(sampler)
    assert mixle.PatchSampler(np.zeros((30, 30)), 8, 4, patches_per_chunk=2).region == (16, 16)
    assert mixle.PatchSampler(np.zeros((30, 30)), 8, 4, region=(9, 20)).region == (9, 20)
    with pytest.raises(ValueError, match="patches_per_chunk=0"):
        mixle.PatchSampler(np.zeros((30, 30)), 8, 4, patches_per_chunk=0)
    with pytest.raises(TypeError, match="patches_per_chunk"):
        mixle.PatchSampler(np.zeros((30, 30)), 8, 4, patches_per_chunk=2.0)
    with pytest.raises(ValueError, match=r"region=.*smaller than patch_size"):
        mixle.PatchSampler(np.zeros((30, 30)), 8, 4, patches_per_chunk=2, region=(8, 7))


def test_locality_batch_decodes_one_chunk_per_block(tmp_path):
    data = np.random.default_rng(0).standard_normal((128, 128, 128)).astype("f4")
    path = tmp_path / "v.zarr"
    zarr.create_array(str(path), shape=data.shape, chunks=(32,) * 3, dtype="f4")[:] = data
    src = mixle.read_zarr(path)
    local = mixle.PatchSampler(src, 16, 64, patches_per_chunk=8, seed=5)
    spread = mixle.PatchSampler(src, 16, 64, seed=5)
    old = chunk_cache().budget
    try:
        set_chunk_cache_bytes(0)  # count decodes, not cache hits
        for sampler, most in ((local, 8), (spread, None)):
            before = chunk_cache().stats().misses
            patches, coords = sampler.get_batch(np.arange(64))
            decoded = chunk_cache().stats().misses - before
            for patch, (z, y, x) in zip(patches, coords.tolist()):
                np.testing.assert_array_equal(patch, data[z : z + 16, y : y + 16, x : x + 16])
            if most is not None:
                assert decoded <= most  # one 32^3 chunk per block of 8 patches
            else:
                assert decoded > 8
    finally:
        set_chunk_cache_bytes(old)


def test_locality_sampler_pickles_and_is_deterministic(tmp_path):
    data = np.arange(40 * 40, dtype="i4").reshape(40, 40)
    np.save(tmp_path / "a.npy", data)
    sampler = mixle.PatchSampler(mixle.read_npy(tmp_path / "a.npy"), 5, 30, seed=2,
                                 patches_per_chunk=4, region=12)  # fmt: skip
    clone = pickle.loads(pickle.dumps(sampler))
    np.testing.assert_array_equal(clone.coords_array(), sampler.coords_array())
    patch, corner = clone[13]
    assert corner == tuple(sampler.coords_array([13])[0].tolist())
    np.testing.assert_array_equal(patch, data[corner[0] : corner[0] + 5, corner[1] : corner[1] + 5])


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([1, 2, 3]),
    st.integers(1, 3),
    st.integers(2, 6),
    st.integers(0, 2**32),
    st.booleans(),
)
def test_locality_on_a_dict_uses_the_finest_grid(factor, channels, per, seed, coarse_first):
    # Regression: locality drew corners from the first array's shape, which for a dict may
    # have channel axes or a coarser scale than the grid corners live on.
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((channels, 18, 24)).astype(np.float32)
    label = rng.integers(0, 9, (18 // factor, 24 // factor)).astype(np.int16)
    arrays = {"label": label, "image": image} if coarse_first else {"image": image, "label": label}
    patch = (2 * factor, 4 * factor)
    s = mixle.PatchSampler(arrays, patch, 40, seed=seed, patches_per_chunk=per)
    batch = s.get_batch(range(40))
    corners = batch["coords"]
    assert (corners >= 0).all() and (corners + np.array(patch) <= np.array([18, 24])).all()
    assert (corners % factor == 0).all()
    for c, im, lb in zip(corners.tolist(), batch["image"], batch["label"]):
        box = tuple(slice(a, a + p) for a, p in zip(c, patch))
        np.testing.assert_array_equal(im, image[(slice(None), *box)])
        low = tuple(slice(a // factor, (a + p) // factor) for a, p in zip(c, patch))
        np.testing.assert_array_equal(lb, label[low])


def test_locality_on_a_dict_reaches_the_whole_fine_grid():
    s = mixle.PatchSampler({"half": np.zeros((15, 15)), "full": np.zeros((30, 30))}, 8, 400,
                           seed=1, patches_per_chunk=4)  # fmt: skip
    corners = s.coords_array()
    assert corners.max() == 22 and (corners % 2 == 0).all()
