"""Channels-first volumes: a ``(C, Z, Y, X)`` array with a 3-D ``patch_size``.

Leading axes are read whole (patches ``(C, *patch_size)``), corners live on the trailing
(spatial) axes. Every patch is checked against the writing library's own read of the same
box, ``vol[:, z:z+pz, y:y+py, x:x+px]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle import GridSampler, Loader, PatchSampler, read_hdf5, read_zarr, stitch
from mixle.data.schema import Schema, SchemaMismatchError

RNG = np.random.default_rng(150)
VOL = RNG.integers(-3000, 3000, (2, 10, 9, 8)).astype(np.int16)  # (C, Z, Y, X)
CHUNKS = (1, 4, 4, 4)
PATCH = (3, 4, 5)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("channels")
    z = zarr.create_array(store=str(root / "vol.zarr"), shape=VOL.shape, chunks=CHUNKS,
                          dtype=VOL.dtype)  # fmt: skip
    z[...] = VOL
    with h5py.File(root / "vol.h5", "w") as f:
        f.create_dataset("vol", data=VOL, chunks=CHUNKS)
        f.create_dataset("flat", data=VOL)  # contiguous
    return {"zarr": root / "vol.zarr", "hdf5": root / "vol.h5"}


OPENERS = ["read_zarr", "zarr.Array", "read_hdf5", "h5py.Dataset", "read_hdf5-contiguous"]


def _open(how: str, written: dict[str, Path]) -> tuple[Any, Any, Any]:
    """``(what mixle gets, the writer's own array, a file to close or None)``."""
    if how.startswith("read_zarr") or how == "zarr.Array":
        writer = zarr.open_array(str(written["zarr"]), mode="r")
        return (read_zarr(written["zarr"]) if how == "read_zarr" else writer), writer, None
    name = "flat" if how.endswith("contiguous") else "vol"
    f = h5py.File(written["hdf5"], "r")
    given_ = f[name] if how == "h5py.Dataset" else read_hdf5(written["hdf5"], name)
    return given_, f[name], f


def _box(corner: Any, patch: tuple[int, ...]) -> tuple[slice, ...]:
    return (slice(None), *(slice(c, c + p) for c, p in zip(corner, patch)))


@pytest.mark.parametrize("how", OPENERS)
@pytest.mark.parametrize(
    "options",
    [{}, {"stride": (2, 3, 1)}, {"patches_per_chunk": 3}, {"replacement": False}],
    ids=["independent", "stride", "locality", "no-replacement"],
)
def test_patches_equal_the_writers_slices(how: str, options: dict, written: dict) -> None:
    given_, writer, f = _open(how, written)
    try:
        n = None if options.get("replacement") is False else 25
        s = PatchSampler(given_, PATCH, n, seed=9, **options)
        assert s.channel_shape == (2,)
        patches, coords = s.get_batch(range(len(s)))
        assert patches.shape == (len(s), 2, *PATCH) and patches.dtype == VOL.dtype
        assert coords.shape == (len(s), 3) and coords.dtype == np.int64
        whole = writer[...]  # the writer's own read; a few boxes are also read by it alone
        for i, corner in enumerate(coords.tolist()):
            np.testing.assert_array_equal(patches[i], whole[_box(corner, PATCH)])
        for i, corner in enumerate(coords[:6].tolist()):
            np.testing.assert_array_equal(patches[i], writer[_box(corner, PATCH)])
            one, at = s[i]
            assert at == tuple(corner)
            np.testing.assert_array_equal(one, patches[i])
        if "stride" in options:
            assert not (coords % np.array(options["stride"])).any()
        if options.get("replacement") is False:  # each spatial position once
            assert len(s) == 8 * 6 * 4
            assert len({tuple(c) for c in coords.tolist()}) == len(s)
    finally:
        if f is not None:
            f.close()


def test_default_region_is_the_spatial_part_of_the_chunks(written: dict) -> None:
    s = PatchSampler(read_zarr(written["zarr"]), PATCH, 12, patches_per_chunk=4, seed=2)
    assert s.region == (4, 4, 5)  # chunks (1, 4, 4, 4) without the channel axis, grown
    coords = s.coords_array()
    for block in range(3):  # the four patches of a block lie in one region (locality)
        rows = coords[4 * block : 4 * block + 4]
        for axis, (r, p, d) in enumerate(zip(s.region, PATCH, VOL.shape[1:])):
            spans = [(min(t * r, d - p), max(min(t * r, d - p), min((t + 1) * r, d) - p))
                     for t in range(-(-d // r))]  # fmt: skip
            assert any(((lo <= rows[:, axis]) & (rows[:, axis] <= hi)).all() for lo, hi in spans)


@pytest.mark.parametrize("padding", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("how", ["read_zarr", "read_hdf5"])
def test_padding_pads_spatial_axes_only(padding: str, how: str, written: dict) -> None:
    given_, writer, f = _open(how, written)
    try:
        patch = (12, 4, 9)  # larger than the volume on two axes
        extra = {"pad_value": -7} if padding == "constant" else {}
        s = PatchSampler(given_, patch, 30, seed=4, padding=padding, **extra)
        pad = [(0, 0)] + [(p, p) for p in patch]
        kwargs = {"constant_values": -7} if padding == "constant" else {}
        full = np.pad(writer[...], pad, mode=padding, **kwargs)
        patches, coords = s.get_batch(range(30))
        assert patches.shape == (30, 2, *patch)
        for i, corner in enumerate(coords.tolist()):
            want = full[_box([c + p for c, p in zip(corner, patch)], patch)]
            np.testing.assert_array_equal(patches[i], want)
            np.testing.assert_array_equal(s[i][0], want)
    finally:
        if f is not None:
            f.close()


@pytest.mark.parametrize("how", ["read_zarr", "h5py.Dataset"])
def test_loader_batches_of_a_channels_first_sampler(how: str, written: dict) -> None:
    given_, writer, f = _open(how, written)
    try:
        s = PatchSampler(given_, PATCH, 22, seed=1)
        loader = Loader(s, 4, shuffle=True, seed=3, drop_last=True, num_threads=2)
        spec = loader.element_spec()
        assert spec[0].shape == (4, 2, *PATCH) and spec[1].shape == (4, 3)
        seen = 0
        for patches, coords in loader:
            assert patches.shape == spec[0].shape and patches.dtype == spec[0].dtype
            assert coords.shape == spec[1].shape
            for patch, corner in zip(patches, coords.tolist()):
                np.testing.assert_array_equal(patch, writer[_box(corner, PATCH)])
            seen += len(patches)
        assert seen == 20
    finally:
        if f is not None:
            f.close()


def test_weighted_placement_over_channels_matches_one_channel() -> None:
    weights = RNG.random(VOL.shape[1:])
    labels = (weights > 0.7).astype(np.uint8)
    for extra in ({"weights": weights}, {"labels": labels, "label_probabilities": {1: 1.0}}):
        many = PatchSampler(VOL, PATCH, 15, seed=5, **extra)
        one = PatchSampler(VOL[0], PATCH, 15, seed=5, **extra)
        np.testing.assert_array_equal(many.coords_array(), one.coords_array())
        patches, coords = many.get_batch(range(15))
        for i, corner in enumerate(coords.tolist()):
            np.testing.assert_array_equal(patches[i], VOL[_box(corner, PATCH)])
    with pytest.raises(ValueError, match="give the map without channel axes"):
        PatchSampler(VOL, PATCH, 5, weights=np.ones(VOL.shape))


def test_grid_and_stitching_over_channels(written: dict) -> None:
    with h5py.File(written["hdf5"], "r") as f:
        grid = GridSampler(f["vol"], (4, 4, 3), overlap=1)
        tiles, coords = grid.get_batch(range(len(grid)))
        assert tiles.shape[1:] == (2, 4, 4, 3) and coords.shape[1] == 3
        for tile, corner in zip(tiles, coords.tolist()):
            np.testing.assert_array_equal(tile, f["vol"][_box(corner, (4, 4, 3))])
        np.testing.assert_array_equal(stitch(grid, lambda t: t, dtype=np.int16), f["vol"][...])


def test_channels_first_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"patch_size=\(1, 2, 3, 4, 5\) has 5 entries; the array"):
        PatchSampler(VOL, (1, 2, 3, 4, 5), 3)
    with pytest.raises(ValueError, match=r"patch_size=\(\) has 0 entries"):
        PatchSampler(VOL, (), 3)
    with pytest.raises(ValueError, match=r"patch_size=\(4, 4, 4, 4\) is larger"):
        PatchSampler(VOL, 4, 3)  # an int covers every axis, the channel axis too
    with pytest.raises(ValueError, match=r"stride=\(1, 1, 1, 1\) has 4 entries"):
        PatchSampler(VOL, PATCH, 3, stride=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"region=\(4, 4\) has 2 entries"):
        PatchSampler(VOL, PATCH, 3, patches_per_chunk=2, region=(4, 4))
    s = PatchSampler(VOL, PATCH, 3, schema=Schema(shape=(2, *PATCH), dtype=np.int16))
    assert s.element_spec()[0].shape == (2, *PATCH)
    with pytest.raises(SchemaMismatchError, match=r"shape is \(2, 3, 4, 5\)"):
        PatchSampler(VOL, PATCH, 3, schema=Schema(shape=PATCH))


@st.composite
def _cases(draw: Any) -> dict[str, Any]:
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    padding = draw(st.sampled_from(["none", "constant", "reflect", "edge"]))
    top = 9 if padding != "none" else None
    patch = tuple(draw(st.integers(1, top or d)) for d in shape)
    stride = tuple(draw(st.integers(1, 3)) for _ in shape)
    replacement = draw(st.booleans())
    return {
        "lead": lead,
        "shape": shape,
        "patch": patch,
        "padding": padding,
        "stride": draw(st.sampled_from([None, stride])),
        "replacement": replacement,
        "num_patches": draw(st.integers(0, 12)) if replacement else None,
        "seed": draw(st.integers(0, 2**64 - 1)),
        "epoch": draw(st.integers(0, 3)),
    }


@settings(max_examples=60, deadline=None)
@given(case=_cases())
def test_placement_with_leading_axes(case: dict[str, Any]) -> None:
    """Channels change neither the corners nor the voxels of each channel's patch."""
    lead, shape, patch = case["lead"], case["shape"], case["patch"]
    vol = np.arange(int(np.prod(lead + shape)), dtype=np.float64).reshape(lead + shape)
    options = {k: case[k] for k in ("padding", "stride", "replacement", "seed", "epoch")}
    many = PatchSampler(vol, patch, case["num_patches"], **options)
    one = PatchSampler(vol[(0,) * len(lead)], patch, case["num_patches"], **options)
    assert len(many) == len(one) and many.channel_shape == lead
    np.testing.assert_array_equal(many.coords_array(), one.coords_array())
    patches, coords = many.get_batch(range(len(many)))
    assert patches.shape == (len(many), *lead, *patch)
    assert coords.shape == (len(many), len(shape))
    assert many.element_spec()[0].shape == (*lead, *patch)
    mode = "constant" if case["padding"] == "none" else case["padding"]
    full = np.pad(vol, [(0, 0)] * len(lead) + [(p, p) for p in patch], mode=mode)
    for i, corner in enumerate(coords.tolist()):
        box = tuple(slice(c + p, c + 2 * p) for c, p in zip(corner, patch))
        want = full[(Ellipsis, *box)]
        np.testing.assert_array_equal(patches[i], want)
        np.testing.assert_array_equal(many[i][0], want)
