"""``src[rows]`` and ``src[mask]`` on axis 0 equal NumPy on every array source; other
advanced keys raise a clear error.

Each source is checked against the array the writing library (zarr-python, h5py, NumPy's
``tofile``) reads back, never against mixle's own output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.arrays.adopt import ArrayLikeSource
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.indexing import RowsKey, parse_key
from mixle.data.sources.key_plan import plan_key, read_extent
from mixle.reading.process_cache import chunk_cache
from mixle.testing import check_array_source

SHAPES = {"3d": ((11, 6, 5), (3, 4, 2)), "1d": ((13,), (4,))}
KINDS = ("zarr", "hdf5", "hdf5-contiguous", "memmap", "in-memory")


def _write(kind: str, root: Path, data: np.ndarray, chunks: tuple[int, ...]) -> np.ndarray:
    """Write ``data`` as ``kind`` below ``root``; return what the writing library reads."""
    if kind == "zarr":
        arr = zarr.create_array(str(root / "a.zarr"), shape=data.shape, chunks=chunks, dtype="i4")
        arr[...] = data
        return np.asarray(zarr.open_array(str(root / "a.zarr"), mode="r")[...])
    if kind.startswith("hdf5"):
        opts: dict[str, Any] = {} if kind.endswith("contiguous") else {"chunks": chunks}
        if opts:
            opts["compression"] = "gzip"
        with h5py.File(root / "a.h5", "w") as f:
            f.create_dataset("x", data=data, **opts)
        with h5py.File(root / "a.h5", "r") as f:
            return np.asarray(f["x"][...])
    if kind == "memmap":
        data.tofile(root / "a.raw")
        return np.fromfile(root / "a.raw", dtype=data.dtype).reshape(data.shape)
    return data


def _open(kind: str, root: Path, data: np.ndarray) -> ArraySource:
    if kind == "zarr":
        return mixle.read_zarr(root / "a.zarr")
    if kind.startswith("hdf5"):
        return mixle.read_hdf5(root / "a.h5", "x")
    if kind == "memmap":
        return mixle.read_memmap(root / "a.raw", data.dtype, data.shape)
    return ArrayLikeSource(data)


@pytest.fixture(scope="module")
def sources(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], tuple[ArraySource, np.ndarray]]]:
    opened: dict[tuple[str, str], tuple[ArraySource, np.ndarray]] = {}
    for name, (shape, chunks) in SHAPES.items():
        data = np.arange(math.prod(shape), dtype=np.int32).reshape(shape) * 7 - 100
        for kind in KINDS:
            root = tmp_path_factory.mktemp(f"{kind}-{name}")
            expected = _write(kind, root, data, chunks)
            opened[kind, name] = (_open(kind, root, expected), expected)
    yield opened
    for src, _ in opened.values():
        src.close()


@st.composite
def _basic_item(draw: st.DrawFn, dim: int) -> Any:
    if dim and draw(st.booleans()):
        return draw(st.integers(-dim, dim - 1))
    bound = st.none() | st.integers(-dim - 2, dim + 2)
    step = st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])
    return slice(draw(bound), draw(bound), draw(step))


@st.composite
def _rows_item(draw: st.DrawFn, n: int) -> Any:
    how = draw(st.sampled_from(["list", "int64", "int8", "uint16", "mask", "mask-list"]))
    if how.startswith("mask"):
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return mask if how == "mask-list" else np.array(mask, dtype=bool)
    low = 0 if how == "uint16" else -n
    rows = draw(st.lists(st.integers(low, n - 1), max_size=8))
    return rows if how == "list" else np.array(rows, dtype=how)


@st.composite
def rows_keys(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    """An array or mask on axis 0, then random basic keys, maybe with ``...``, maybe short."""
    rest = [draw(_basic_item(d)) for d in shape[1:]]
    rest = rest[: draw(st.integers(0, len(rest)))]
    if draw(st.booleans()):
        rest.insert(draw(st.integers(0, len(rest))), Ellipsis)
    first = draw(_rows_item(shape[0]))
    return first if not rest and draw(st.booleans()) else (first, *rest)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(KINDS), name=st.sampled_from(list(SHAPES)))
def test_rows_and_masks_equal_numpy(sources, data, kind, name):
    src, expected = sources[kind, name]
    key = data.draw(rows_keys(expected.shape), label="key")
    chunk_cache().clear()
    try:
        want = expected[key]
    except IndexError:  # an item moved by '...' onto a shorter axis: NumPy refuses, so must we
        with pytest.raises(IndexError):
            src[key]
        return
    got = src[key]
    assert type(got) is np.ndarray and got.dtype == want.dtype
    assert got.shape == want.shape, (key, got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, expected)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_plan_key_reads_each_chunk_once_for_rows(data, chunks):
    shape = tuple(data.draw(st.integers(1, 9)) for _ in chunks)
    key = data.draw(rows_keys(shape), label="key")
    arr = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    try:
        parsed = parse_key(key, shape)
    except IndexError:
        with pytest.raises(IndexError):
            arr[key]
        return
    assert isinstance(parsed, RowsKey)
    plan = plan_key(parsed.read, chunks)
    extent = read_extent(parsed.read)
    out = np.full(extent, -1, dtype=np.int64)
    hits = np.zeros(extent, dtype=np.int64)
    for coords, pieces in zip(plan.chunks, plan.pieces):
        chunk = arr[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, chunks))]
        for box, region, inner in pieces:
            assert box == 0 and all(isinstance(r, slice) for r in (*region, *inner))
            out[region] = chunk[inner]
            hits[region] += 1
    assert plan.chunks == sorted(set(plan.chunks))  # each chunk once, in C order
    assert (hits == 1).all()
    flat = out.reshape([n for k, n in zip(parsed.read, extent) if not isinstance(k, int)])
    np.testing.assert_array_equal(parsed.finish(flat), arr[key])


def test_zarr_rows_decode_each_touched_chunk_once(sources):
    src, expected = sources["zarr", "3d"]  # chunks (3, 4, 2)
    rows = [10, 0, 1, 0, 9, 10, 2]  # chunk rows 0 and 3 only
    chunk_cache().clear()
    np.testing.assert_array_equal(src[rows, 1:3, -1], expected[rows, 1:3, -1])
    stats = chunk_cache().stats()
    assert (stats.misses, stats.hits) == (2, 0)  # chunks (0, 0, 2) and (3, 0, 2), once each


@pytest.mark.parametrize("kind", KINDS)
def test_empty_rows_and_empty_masks_keep_the_shape(sources, kind):
    src, expected = sources[kind, "3d"]
    for key in ([], ([], 2), ([], ..., slice(None, None, -1)), np.zeros(11, dtype=bool)):
        got = src[key]
        assert got.shape == expected[key].shape and got.dtype == expected.dtype, key
    assert src[[], 1:1].shape == (0, 0, 5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("key", "match"),
    [
        ([11], "index 11 is out of bounds for axis 0 with size 11"),
        (np.array([0, -12]), "index -12 is out of bounds for axis 0 with size 11"),
        (([0], 6), "index 6 is out of bounds for axis 1 with size 6"),
        (np.ones(10, dtype=bool), "size of axis is 11 but size of corresponding boolean axis"),
        (np.array([0.0, 1.0]), "must be of integer \\(or boolean\\) type"),
        (["a"], "must be of integer \\(or boolean\\) type"),
        (([0], 0, 0, 0), "too many indices"),
    ],
)
def test_bad_rows_raise_numpys_index_error(sources, kind, key, match):
    src, expected = sources[kind, "3d"]
    with pytest.raises(IndexError):
        expected[key]  # NumPy refuses it too
    with pytest.raises(IndexError, match=match):
        src[key]


@pytest.mark.parametrize("kind", KINDS)
def test_huge_unsigned_rows_are_refused_not_wrapped(sources, kind):
    # NumPy casts uint64 indices to intp: 2**64 - 1 becomes -1 and reads the last row
    src, _ = sources[kind, "3d"]
    with pytest.raises(IndexError, match="index 18446744073709551615 is out of bounds"):
        src[np.array([2**64 - 1], dtype=np.uint64)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("key", "match"),
    [
        ((slice(None), [0, 1]), "on axis 1 is not supported"),
        ((..., np.array([True, False, True, False, True])), "on axis 2 is not supported"),
        (([0, 1], [2, 3]), r"on axes \[0, 1\] is not supported"),
        (np.array([[0, 1], [2, 3]]), r"integer index arrays must be 1-D .* shape \(2, 2\).*ravel"),
        (np.ones((11, 6), dtype=bool), r"boolean masks must be 1-D .* shape \(11, 6\)"),
        (None, r"None \(np.newaxis\) is not supported"),
        (([0, 1], None), r"None \(np.newaxis\) is not supported"),
    ],
)
def test_unsupported_advanced_keys_say_what_to_use(sources, kind, key, match):
    src, expected = sources[kind, "3d"]
    expected[key]  # NumPy takes every one of them
    with pytest.raises(TypeError, match=match) as info:
        src[key]
    message = str(info.value)
    assert message.startswith(f"key={key!r}"[:100]), message
    assert "Instead" in message or "add the axis in NumPy" in message, message


def test_rows_read_equals_get_batch(sources):
    for (kind, _), (src, expected) in sources.items():
        rows = [len(expected) - 1, 0, 2, 0]
        np.testing.assert_array_equal(src[rows], src.get_batch(rows), err_msg=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_conformance_suite_with_fancy_keys(tmp_path, kind):
    shape, chunks = SHAPES["3d"]
    data = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    expected = _write(kind, tmp_path, data, chunks)
    check_array_source(_open(kind, tmp_path, expected), expected)


def test_a_long_key_is_cut_in_the_error(sources):
    src, _ = sources["in-memory", "3d"]
    with pytest.raises(IndexError, match="index 99999 is out of bounds") as info:
        src[list(range(100_000))]
    assert len(str(info.value)) < 400
