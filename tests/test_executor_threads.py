"""A chunk reader may cap how many decode threads read from it at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mixle.reading import ChunkCache, read_chunked, set_decode_threads
from mixle.reading.executor import reader_threads


class CountingReader:
    """Chunks of ``arange`` over ``shape``, recording the most threads inside at once."""

    def __init__(self, limit: int | None) -> None:
        self.chunks = (4, 4)
        self.token = object()
        if limit is not None:
            self.max_decode_threads = limit
        self.inside = 0
        self.most = 0
        self.lock = threading.Lock()

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.002)  # long enough for a second thread to come in, were it allowed
        with self.lock:
            self.inside -= 1
        i, j = coords
        full = np.arange(32 * 32, dtype=np.int64).reshape(32, 32)
        return full[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].copy()


@pytest.fixture
def four_threads():
    old = set_decode_threads(4)
    yield
    set_decode_threads(old)


@pytest.mark.parametrize(("limit", "bound"), [(1, 1), (2, 2), (None, 4)])
def test_a_reader_caps_its_decode_threads(four_threads, limit: int | None, bound: int) -> None:
    reader = CountingReader(limit)
    out = np.empty((1, 32, 32), dtype=np.int64)
    read_chunked(reader, [[0, 0]], (32, 32), (32, 32), out, cache=ChunkCache(0))
    np.testing.assert_array_equal(out[0], np.arange(32 * 32).reshape(32, 32))
    assert 1 <= reader.most <= bound
    assert reader_threads(reader) == bound


def test_the_cap_never_goes_below_one_thread(four_threads) -> None:
    assert reader_threads(CountingReader(0)) == 1
