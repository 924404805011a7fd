"""The read planner's index math: every box covered exactly once, each chunk planned once."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.reading import ChunkCache, order_by_offset, plan_chunks, read_chunked, touched_chunks
from mixle.reading.executor import new_token


class ArrayChunks:
    """A chunk reader over an in-memory array that counts its reads."""

    def __init__(self, data: np.ndarray, chunks: tuple[int, ...]) -> None:
        self.data, self.chunks, self.token, self.reads = data, chunks, new_token(), []

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        self.reads.append(coords)
        key = tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, self.chunks))
        return self.data[key].copy()


@st.composite
def layouts(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 12)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, 7)) for _ in range(ndim))
    size = tuple(draw(st.integers(1, d)) for d in shape)
    boxes = draw(st.integers(0, 9))
    starts = [[draw(st.integers(0, d - s)) for d, s in zip(shape, size)] for _ in range(boxes)]
    return shape, chunks, size, starts


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_plan_covers_every_box_exactly_once(layout):
    shape, chunks, size, starts = layout
    plan = plan_chunks(starts, size, chunks, shape)
    assert len(set(plan.chunks)) == len(plan.chunks)  # each chunk once
    assert plan.chunks == sorted(plan.chunks)  # C order of the chunk grid
    hits = np.zeros((len(starts), *size), dtype=np.int64)
    for coords, pieces in zip(plan.chunks, plan.pieces):
        for box, region, inner in pieces:
            hits[box][region] += 1
            # the inner region lies in the chunk and maps to the same voxels
            for c, n, r, i, a in zip(coords, chunks, region, inner, starts[box]):
                assert 0 <= i.start < i.stop <= n
                assert c * n + i.start == a + r.start and i.stop - i.start == r.stop - r.start
    assert (hits == 1).all()


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 2**32))
def test_executed_plan_equals_numpy_and_reads_each_chunk_once(layout, seed):
    shape, chunks, size, starts = layout
    data = np.random.default_rng(seed).integers(0, 1000, size=shape).astype(np.int32)
    reader = ArrayChunks(data, chunks)
    out = np.full((len(starts), *size), -1, dtype=data.dtype)
    read_chunked(reader, starts, size, shape, out, cache=ChunkCache(0))
    for b, row in enumerate(starts):
        expected = data[tuple(slice(a, a + n) for a, n in zip(row, size))]
        np.testing.assert_array_equal(out[b], expected)
    assert len(reader.reads) == len(set(reader.reads))


def test_boxes_sharing_one_chunk_decode_it_once():
    data = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    reader = ArrayChunks(data, (32, 32))
    starts = [[r, c] for r in range(0, 24, 3) for c in range(0, 24, 3)]  # 64 boxes, 1 chunk
    out = np.empty((len(starts), 8, 8), dtype=data.dtype)
    plan = read_chunked(reader, starts, (8, 8), data.shape, out, cache=ChunkCache(0))
    assert reader.reads == [(0, 0)]
    assert len(plan) == 1 and plan.num_pieces == 64


def test_box_on_chunk_and_volume_edges():
    data = np.arange(10 * 7, dtype=np.int16).reshape(10, 7)
    reader = ArrayChunks(data, (4, 3))
    starts = [[0, 0], [4, 3], [3, 2], [6, 4], [8, 5]]  # aligned, straddling, last partial chunk
    out = np.empty((5, 2, 2), dtype=data.dtype)
    read_chunked(reader, starts, (2, 2), data.shape, out, cache=ChunkCache(0))
    for b, (r, c) in enumerate(starts):
        np.testing.assert_array_equal(out[b], data[r : r + 2, c : c + 2])
    plan = plan_chunks([[3, 2]], (2, 2), (4, 3), data.shape)
    assert plan.chunks == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_empty_plans():
    assert len(plan_chunks(np.empty((0, 3)), (2, 2, 2), (4, 4, 4), (8, 8, 8))) == 0
    assert len(plan_chunks([[0, 0]], (0, 2), (4, 4), (8, 8))) == 0


def test_plan_of_thousands_of_boxes_counts_every_piece():
    starts = np.random.default_rng(0).integers(0, 200, size=(4000, 3))
    plan = plan_chunks(starts, (32, 32, 32), (64, 64, 64), (232, 232, 232))
    per_box = np.prod((starts + 31) // 64 - starts // 64 + 1, axis=1)
    assert plan.num_pieces == per_box.sum()
    assert len(plan) == len({tuple(c) for c in (starts // 64).tolist()} | set(plan.chunks))


@pytest.mark.parametrize("order", ["C", "F"])
def test_order_by_offset_sorts_by_file_position(order):
    arr = np.zeros((5, 6, 7), dtype=np.float64, order=order)
    starts = np.random.default_rng(1).integers(0, 5, size=(50, 3))
    visit = order_by_offset(starts, arr.strides)
    offsets = (starts @ np.asarray(arr.strides))[visit]
    assert (np.diff(offsets) >= 0).all()
    assert sorted(visit.tolist()) == list(range(50))


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_a_plan_far_out_on_a_huge_grid_is_the_plan_near_the_origin_shifted(layout):
    # 2**62 voxels per axis: the chunk grid has more chunks than an int64 flat index holds
    shape, chunks, size, starts = layout
    shift = [(2**62 // n) for n in chunks]  # in chunks, per axis
    far = [[a + k * n for a, k, n in zip(row, shift, chunks)] for row in starts]
    huge = tuple(2**62 + d for d in shape)
    near, out = plan_chunks(starts, size, chunks, shape), plan_chunks(far, size, chunks, huge)
    assert out.chunks == [tuple(c + k for c, k in zip(cs, shift)) for cs in near.chunks]
    assert out.pieces == near.pieces


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_touched_chunks_are_the_plans_chunks_and_clip_boxes_hanging_over_the_edges(data):
    ndim = data.draw(st.integers(1, 4))
    shape = data.draw(st.tuples(*[st.integers(1, 30)] * ndim))
    chunks = data.draw(st.tuples(*[st.integers(1, 9)] * ndim))
    size = data.draw(st.tuples(*[st.integers(1, 12)] * ndim))
    starts = data.draw(st.lists(st.tuples(*[st.integers(-12, 30)] * ndim), min_size=1, max_size=6))
    got = touched_chunks(starts, size, chunks, shape)
    # brute force: every element inside the array that a box covers, mapped to its chunk
    want = set()
    for start in starts:
        lo = [max(0, a) for a in start]
        hi = [min(d, a + n) for a, n, d in zip(start, size, shape)]
        if all(h > low for low, h in zip(lo, hi)):
            grids = [range(low // c, (h - 1) // c + 1) for low, h, c in zip(lo, hi, chunks)]
            want.update(itertools.product(*grids))
    assert got == sorted(want)
    inside = [s for s in starts if all(a >= 0 and a + n <= d for a, n, d in zip(s, size, shape))]
    if inside:
        assert (
            touched_chunks(inside, size, chunks, shape)
            == plan_chunks(inside, size, chunks, shape).chunks
        )
