"""parse_key: reading ``parsed.read`` and applying ``finish`` equals NumPy basic indexing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.data.sources.indexing import BasicKey, parse_key

shapes = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple)


def _slices(dim: int) -> st.SearchStrategy[slice]:
    bound = st.one_of(st.none(), st.integers(-dim - 3, dim + 3))
    step = st.one_of(st.none(), st.integers(-4, -1), st.integers(1, 4))
    return st.builds(slice, bound, bound, step)


def _items(dim: int, *, in_range: bool) -> st.SearchStrategy[object]:
    valid = [st.integers(-dim, dim - 1)] if dim else []
    anything = [] if in_range else [st.integers(-dim - 2, dim + 1)]
    ints = st.one_of(*valid, *anything)
    if not valid and not anything:
        return _slices(dim)
    return st.one_of(ints, ints.map(np.int64), _slices(dim), _slices(dim))


@st.composite
def shapes_and_keys(draw: st.DrawFn, *, in_range: bool = False) -> tuple[tuple[int, ...], object]:
    """A shape and a basic key for it: maybe fewer items than axes, maybe one ``...``.

    Unless ``in_range``, integers may be out of bounds and a key may have one item too many.
    """
    shape = draw(shapes)
    n_items = draw(st.integers(0, len(shape)))
    use_ellipsis = draw(st.booleans())
    if use_ellipsis:
        # the ellipsis stands for the axes between the leading and trailing items
        n_lead = draw(st.integers(0, n_items))
        axes = list(range(n_lead)) + list(range(len(shape) - (n_items - n_lead), len(shape)))
        items = [draw(_items(shape[a], in_range=in_range)) for a in axes]
        items.insert(n_lead, Ellipsis)
    else:
        items = [draw(_items(shape[a], in_range=in_range)) for a in range(n_items)]
    if not in_range and draw(st.integers(0, 9)) == 0:
        items.append(draw(_items(2, in_range=False)))  # one index too many
    if len(items) == 1 and draw(st.booleans()):
        return shape, items[0]  # a bare item, not wrapped in a tuple
    return shape, tuple(items)


def _read(arr: np.ndarray, parsed: BasicKey) -> np.ndarray:
    return np.asarray(parsed.finish(np.asarray(arr[parsed.read])))


def _check_read_is_normalised(parsed: BasicKey, shape: tuple[int, ...]) -> None:
    assert len(parsed.read) == len(shape)
    for item, dim in zip(parsed.read, shape):
        if isinstance(item, slice):
            assert isinstance(item.step, int)
            assert item.step >= 1
        else:
            assert type(item) is int
            assert 0 <= item < dim


@settings(max_examples=400, deadline=None)
@given(shapes_and_keys())
def test_parse_key_matches_numpy(shape_and_key: tuple[tuple[int, ...], object]) -> None:
    shape, key = shape_and_key
    arr = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    try:
        expected = np.asarray(arr[key])
    except IndexError:
        with pytest.raises(IndexError, match="key="):
            parse_key(key, shape)
        return
    parsed = parse_key(key, shape)
    assert parsed.shape == expected.shape
    _check_read_is_normalised(parsed, shape)
    got = _read(arr, parsed)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=200, deadline=None)
@given(shapes_and_keys(in_range=True))
def test_parse_key_in_range_keys_never_raise(shape_and_key: tuple[tuple[int, ...], object]) -> None:
    shape, key = shape_and_key
    arr = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    parsed = parse_key(key, shape)
    _check_read_is_normalised(parsed, shape)
    expected = np.asarray(arr[key])
    assert parsed.shape == expected.shape
    np.testing.assert_array_equal(_read(arr, parsed), expected)
    # flips name output axes: one per output axis at most, all in range
    assert len(set(parsed.flip)) == len(parsed.flip)
    assert all(0 <= a < len(parsed.shape) for a in parsed.flip)


@pytest.mark.parametrize(
    ("key", "shape"),
    [
        (slice(None, None, -1), (5,)),
        (slice(None, None, -1), (0,)),
        (slice(-100, None, -1), (5,)),
        (slice(100, None, 1), (5,)),
        (slice(None, -100, -1), (5,)),
        (slice(3, 1), (5,)),
        (slice(None, None, -2), (6,)),
        ((Ellipsis, slice(None, None, -3)), (2, 10)),
        ((-1, Ellipsis), (3, 4)),
        ((Ellipsis,), ()),
        ((), ()),
        ((), (2, 3)),
        (Ellipsis, (0, 3)),
        ((slice(None), 2), (0, 3)),
    ],
)
def test_parse_key_examples(key: object, shape: tuple[int, ...]) -> None:
    arr = np.arange(math.prod(shape)).reshape(shape)
    parsed = parse_key(key, shape)
    _check_read_is_normalised(parsed, shape)
    expected = np.asarray(arr[key])
    assert parsed.shape == expected.shape
    np.testing.assert_array_equal(_read(arr, parsed), expected)


@pytest.mark.parametrize(
    ("key", "shape"),
    [(slice(None, None, -1), (0,)), (slice(-100, None, -1), (5,))],
)
def test_parse_key_read_slices_are_within_bounds(key: object, shape: tuple[int, ...]) -> None:
    parsed = parse_key(key, shape)
    for item, dim in zip(parsed.read, shape):
        assert isinstance(item, slice)
        assert 0 <= item.start <= item.stop <= dim


@pytest.mark.parametrize(
    ("key", "shape"),
    [
        (5, (5,)),
        (-6, (5,)),
        (0, (0,)),
        ((0, 3), (2, 3)),
        ((slice(None), -4), (2, 3)),
        ((slice(None), 3), (0, 3)),
        (0, ()),
        ((0, 0), (3,)),
        ((0, Ellipsis, 0, 0), (2, 2)),
        ((slice(None),) * 3, (2, 2)),
    ],
)
def test_parse_key_index_errors_match_numpy(key: object, shape: tuple[int, ...]) -> None:
    arr = np.zeros(shape)
    with pytest.raises(IndexError):
        arr[key]
    with pytest.raises(IndexError, match="key="):
        parse_key(key, shape)


def test_parse_key_two_ellipses() -> None:
    with pytest.raises(IndexError):
        np.zeros((2, 3))[..., ...]
    with pytest.raises(IndexError, match="ellipsis"):
        parse_key((Ellipsis, Ellipsis), (2, 3))
    with pytest.raises(IndexError, match="ellipsis"):
        parse_key((Ellipsis, 0, Ellipsis), (2, 3))


def test_parse_key_zero_step_is_a_value_error_like_numpy() -> None:
    with pytest.raises(ValueError, match="step"):
        np.zeros(3)[::0]
    with pytest.raises(ValueError, match="step"):
        parse_key(slice(None, None, 0), (3,))


@pytest.mark.parametrize(
    "key",
    [
        1.5,
        np.float64(1.0),
        None,
        True,
        np.True_,
        (slice(None), [0]),  # an array on axis 0 is a RowsKey (tests/test_fancy_keys.py)
        ([0], [1]),
        np.array([[0, 1]]),
        (Ellipsis, np.array([True, False, True])),
        (0, None),
        (slice(None), 1.5),
        (None, Ellipsis),
        "0",
        (0, [1]),
    ],
)
def test_parse_key_type_errors(key: object) -> None:
    with pytest.raises(TypeError, match="key="):
        parse_key(key, (2, 3))


def test_parse_key_integer_likes() -> None:
    arr = np.arange(12).reshape(3, 4)
    for key in (np.int8(-1), np.uint64(2), (np.int64(1), np.int32(-2)), np.array(1)):
        parsed = parse_key(key, arr.shape)
        _check_read_is_normalised(parsed, arr.shape)
        np.testing.assert_array_equal(_read(arr, parsed), arr[key])
