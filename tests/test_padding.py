"""Edge padding: padded boxes equal np.pad ground truth; random patches may hang over edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle import PatchSampler
from mixle.data.sampling.padding import map_axis, parse_pad_value, parse_padding, read_boxes_padded
from mixle.data.sampling.patch_args import centred_grid
from mixle.data.sources.arrays.adopt import ArrayLikeSource

MARGIN = 40


class CountingSource(ArrayLikeSource):
    """An in-memory source that records every ``read_boxes`` call."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array)
        self.calls: list[tuple[int, tuple[int, ...]]] = []

    def read_boxes(self, starts, size, *, out=None):  # type: ignore[no-untyped-def]
        self.calls.append((len(np.asarray(starts).reshape(-1, self.ndim)), tuple(size)))
        return super().read_boxes(starts, size, out=out)


def _truth(vol: np.ndarray, start, size, mode: str, value=0) -> np.ndarray:
    kw = {"constant_values": value} if mode == "constant" else {}
    big = np.pad(vol, MARGIN, mode=mode, **kw)  # type: ignore[call-overload]
    return big[tuple(slice(a + MARGIN, a + MARGIN + n) for a, n in zip(start, size))]


@st.composite
def boxes(draw: st.DrawFn) -> tuple:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(ndim))
    size = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
    starts = draw(
        st.lists(
            st.tuples(*(st.integers(-12, d + 4) for d in shape)),
            min_size=1,
            max_size=6,
        )
    )
    mode = draw(st.sampled_from(["constant", "reflect", "edge"]))
    return shape, size, starts, mode, draw(st.integers(-5, 5))


@settings(max_examples=300, deadline=None)
@given(boxes())
def test_padded_boxes_equal_np_pad(case: tuple) -> None:
    shape, size, starts, mode, value = case
    vol = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    got = read_boxes_padded(
        ArrayLikeSource(vol), np.array(starts), size, padding=mode, pad_value=value
    )
    assert got.shape == (len(starts), *size)
    for row, box in zip(starts, got):
        np.testing.assert_array_equal(box, _truth(vol, row, size, mode, value))


@settings(max_examples=100, deadline=None)
@given(st.integers(-60, 60), st.integers(1, 9))
def test_map_axis_matches_numpy(coord: int, length: int) -> None:
    line = np.arange(length)
    for mode in ("reflect", "edge"):
        want = np.pad(line, MARGIN + 30, mode=mode)[coord + MARGIN + 30]
        assert map_axis(np.array([coord]), length, mode)[0] == want


def test_inside_boxes_take_one_read_and_edges_few() -> None:
    vol = np.random.default_rng(0).standard_normal((20, 20))
    src = CountingSource(vol)
    inside = np.array([[0, 0], [3, 4], [12, 12]])
    read_boxes_padded(src, inside, (8, 8), padding="reflect")
    assert src.calls == [(3, (8, 8))]
    src.calls.clear()
    mixed = np.array([[0, 0], [-2, 0], [-2, 5], [15, 15], [3, 3]])
    got = read_boxes_padded(src, mixed, (8, 8), padding="edge")
    assert src.calls[0] == (2, (8, 8))  # the inside boxes together
    assert len(src.calls) == 3  # then one call per distinct in-bounds window: (6, 8) and (5, 5)
    for row, box in zip(mixed, got):
        np.testing.assert_array_equal(box, _truth(vol, row, (8, 8), "edge"))


def test_sampler_patches_hang_over_edges_with_padding() -> None:
    vol = np.random.default_rng(1).integers(0, 100, (9, 11)).astype(np.int16)
    s = PatchSampler(vol, (6, 5), 400, seed=4, padding="constant", pad_value=-1)
    corners = s.coords_array()
    centres = corners + np.array([3, 2])
    assert (centres >= 0).all() and (centres < np.array(vol.shape)).all()
    assert (corners < 0).any() and (corners + np.array([6, 5]) > np.array(vol.shape)).any()
    patches, coords = s.get_batch(np.arange(400))
    for c, p in zip(coords, patches):
        np.testing.assert_array_equal(p, _truth(vol, c, (6, 5), "constant", -1))
    patch, corner = s[7]
    np.testing.assert_array_equal(patch, _truth(vol, corner, (6, 5), "constant", -1))


def test_patch_larger_than_volume_needs_padding() -> None:
    vol = np.arange(12.0).reshape(3, 4)
    with pytest.raises(ValueError, match=r"patch_size=\(5, 5\) is larger.*allow padding"):
        PatchSampler(vol, 5, 3)
    s = PatchSampler(vol, 5, 20, padding="reflect", seed=2)
    patches, corners = s.get_batch(range(20))
    for c, p in zip(corners, patches):
        np.testing.assert_array_equal(p, _truth(vol, c, (5, 5), "reflect"))


def test_padding_on_a_zarr_store_matches_truth(stores) -> None:
    truth = stores.truth["v3.zarr"]
    s = PatchSampler(mixle.read_zarr(stores.path("v3.zarr")), (9, 12, 8), 64, padding="edge")
    patches, corners = s.get_batch(range(64))
    for c, p in zip(corners, patches):
        np.testing.assert_array_equal(p, _truth(truth, c, (9, 12, 8), "edge"))


def test_padding_errors() -> None:
    vol = np.zeros((4, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"padding='wrap' is not a padding mode; use one of "
                                          r"'none', 'constant', 'reflect', 'edge'"):  # fmt: skip
        PatchSampler(vol, 2, 2, padding="wrap")
    with pytest.raises(TypeError, match="padding=3 must be a string"):
        parse_padding(3)
    with pytest.raises(ValueError, match=r"pad_value=-1 does not fit the array's dtype uint8"):
        PatchSampler(vol, 2, 2, padding="constant", pad_value=-1)
    with pytest.raises(TypeError, match="pad_value='x' must be a real number"):
        PatchSampler(vol, 2, 2, padding="constant", pad_value="x")  # type: ignore[arg-type]
    assert parse_pad_value(np.nan, np.dtype(np.float32)) != parse_pad_value(0, np.float32)
    empty = ArrayLikeSource(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="padding='edge' needs voxels to copy"):
        read_boxes_padded(empty, [[-1, 0]], (2, 2), padding="edge")
    got = read_boxes_padded(empty, [[-1, 0]], (2, 2), padding="constant", pad_value=3)
    assert got.tolist() == [[[3, 3], [3, 3]]]
    with pytest.raises(IndexError, match="outside the array"):
        read_boxes_padded(ArrayLikeSource(vol), [[-1, 0]], (2, 2), padding="none")
    with pytest.raises(ValueError, match="cannot be combined with padding='reflect'"):
        PatchSampler(vol, 2, 2, padding="reflect", patches_per_chunk=2)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40), st.integers(1, 50), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3)
)
def test_centred_grid_centres_cover_the_axis(length, patch, step, stride_steps, extra):
    stride = step * stride_steps
    (origin,), (count,) = centred_grid((length,), (patch,), (stride,), (step,))
    corners = origin + stride * np.arange(count + extra)
    centres = corners + patch // 2
    assert origin % step == 0 and count >= 1
    assert (corners[:count] < length).all() and (corners[:count] + patch > 0).all()
    assert 0 <= centres[0] < step  # the first centre sits at most step - 1 past 0
    inside = centres[:count] < length
    assert inside.all() or (count == 1 and length < step)  # never past the end otherwise
    assert (centres[count:] >= length).all()  # and no further grid position centres inside
