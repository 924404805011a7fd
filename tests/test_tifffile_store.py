"""tifffile's zarr store (``tifffile.imread(path, aszarr=True)``) reads like tifffile itself.

tifffile's store answers whole-object requests only (it refuses byte ranges), so mixle asks
it for whole chunks; every read path gives what ``tifffile.imread`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.reading import chunk_cache

#: name -> (array written, tifffile.imwrite options)
TIFFS: dict[str, tuple[np.ndarray, dict[str, Any]]] = {
    "2-D tiled": (
        (np.arange(100 * 90, dtype=np.uint16).reshape(100, 90) * 7),
        {"tile": (32, 32)},
    ),
    "2-D tiled zlib": (
        np.random.default_rng(1).integers(0, 4000, (70, 45)).astype(np.uint16),
        {"tile": (32, 32), "compression": "zlib"},
    ),
    "3-D tiled pages": (
        np.random.default_rng(2).integers(-500, 500, (5, 70, 50)).astype(np.int16),
        {"tile": (32, 32), "photometric": "minisblack"},
    ),
    "3-D striped pages": (
        np.random.default_rng(3).random((4, 30, 20)).astype(np.float32),
        {"rowsperstrip": 8, "photometric": "minisblack"},
    ),
}


class _Tiffs(dict):
    """Written TIFF files, shown briefly when hypothesis reports an example."""

    def __repr__(self) -> str:
        return f"<{len(self)} TIFF files>"


@pytest.fixture(scope="module")
def tiffs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """Each TIFF written once: ``name -> (path, tifffile.imread's array)``."""
    root = tmp_path_factory.mktemp("tiffs")
    out = _Tiffs()
    for k, (name, (data, options)) in enumerate(TIFFS.items()):
        path = root / f"t{k}.tif"
        tifffile.imwrite(path, data, **options)
        expected = tifffile.imread(path)
        np.testing.assert_array_equal(expected, data)
        out[name] = (path, expected)
    return out


@contextmanager
def _opened(path: Path, how: str) -> Iterator[mixle.ZarrArraySource]:
    """A source over tifffile's store of ``path``; the store (an open file) closed after."""
    with tifffile.imread(path, aszarr=True) as store:
        yield mixle.read_zarr(store) if how == "read_zarr" else mixle.ZarrArraySource(store)


@pytest.mark.parametrize("how", ["read_zarr", "ZarrArraySource"])
@pytest.mark.parametrize("name", list(TIFFS))
def test_every_path_reads_what_tifffile_reads(tiffs, name, how):
    path, expected = tiffs[name]
    with _opened(path, how) as src:
        _check_every_path(src, expected)


def _check_every_path(src: mixle.ZarrArraySource, expected: np.ndarray) -> None:
    assert src.shape == expected.shape and src.dtype == expected.dtype
    chunk_cache().clear()
    np.testing.assert_array_equal(src[...], expected)
    chunk_cache().clear()
    np.testing.assert_array_equal(src[1:-1, ::3], expected[1:-1, ::3])
    chunk_cache().clear()
    size = tuple(min(d, 9) for d in expected.shape)
    starts = [[0] * expected.ndim, [d - n for d, n in zip(expected.shape, size)]]
    boxes = src.read_boxes(starts, size)
    for box, start in zip(boxes, starts):
        np.testing.assert_array_equal(box, expected[tuple(map(slice, start, np.add(start, size)))])
    chunk_cache().clear()
    rows = [expected.shape[0] - 1, 0, 1]
    np.testing.assert_array_equal(src.get_batch(rows), expected[rows])
    chunk_cache().clear()
    patches, corners = mixle.PatchSampler(src, size, 6, seed=3).get_batch(range(6))
    for patch, corner in zip(patches, corners.tolist()):
        np.testing.assert_array_equal(
            patch, expected[tuple(map(slice, corner, np.add(corner, size)))]
        )


def _item(dim: int) -> st.SearchStrategy[Any]:
    bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
    step = st.one_of(st.none(), st.integers(-5, -1), st.integers(1, 5))
    return st.one_of(st.integers(-dim, dim - 1), st.builds(slice, bound, bound, step))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(list(TIFFS)), data=st.data())
def test_getitem_equals_tifffile(tiffs, name, data):
    path, expected = tiffs[name]
    key = tuple(data.draw(_item(d)) for d in expected.shape)
    chunk_cache().clear()
    with _opened(path, "read_zarr") as src:
        got = src[key]
    assert isinstance(got, np.ndarray) == isinstance(expected[key], np.ndarray)
    np.testing.assert_array_equal(got, expected[key])
