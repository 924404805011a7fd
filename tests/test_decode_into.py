"""Chunks decoded into the read planner's buffers read what the writing library reads.

The planner decodes a chunk into a buffer of the cache's, or, for a chunk the cache will
not keep, into a scratch buffer its thread reuses for the next chunk; the stored bytes are
read into a reusable buffer too. A chunk (or a batch) that views one of those buffers
reads right at first and wrong once the buffer is reused. So every batch here is compared
with what zarr-python or h5py reads, and every batch read earlier is compared again after
the later ones ran: with the cache off (everything through scratch buffers), with a budget
of a few chunks (evicting all the time) and with a large one, on one and two decode threads.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.reading import ChunkCache, read_chunked, set_chunk_cache_bytes, set_decode_threads
from mixle.reading.cache import PAGE_BACKED_CHUNK_BYTES, _pages_of
from mixle.reading.executor import SupportsDecodeInto

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
h5py = pytest.importorskip("h5py")

from zarr import codecs as zc  # noqa: E402

#: Small chunks (2 KiB, below the cache's page-backed size) and large ones (64 KiB, at it).
SMALL = ((37, 29, 23), (8, 8, 8), "int32")
LARGE = ((70, 66, 20), (32, 32, 16), "float32")
LARGE_BUDGET = 64 * 1024 * 1024


@dataclass(frozen=True)
class Case:
    """An array written by zarr-python or h5py, and what that library reads back."""

    name: str
    open: Callable[[], Any]
    truth: np.ndarray
    chunk_nbytes: int


def _values(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Compressible values: small random steps along the last axis."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-3, 4, size=shape)
    values = np.cumsum(steps, axis=-1) + np.arange(np.prod(shape)).reshape(shape) % 7
    return values.astype(dtype)


def _zarr_case(
    root: Path, name: str, layout: tuple[Any, ...], *, fill: bool = False, **options: Any
) -> Case:
    shape, chunks, dtype = layout
    path = str(root / f"{name}.zarr")
    dtype = options.pop("dtype", dtype)
    data = _values(shape, dtype, len(name))
    array = zarr.create_array(
        store=path, shape=shape, chunks=chunks, dtype=dtype, fill_value=-5 if fill else 0, **options
    )
    if fill:  # the chunks past the first row of chunks are never written
        array[: chunks[0]] = data[: chunks[0]]
    else:
        array[...] = data
    truth = zarr.open_array(path, mode="r")[...]
    nbytes = int(np.prod(chunks)) * np.dtype(dtype).itemsize
    return Case(name, lambda: mixle.read_zarr(path), truth, nbytes)


def _hdf5_case(
    root: Path,
    name: str,
    layout: tuple[Any, ...],
    *,
    fill: bool = False,
    write: Callable[[Any, np.ndarray], None] | None = None,
    **options: Any,
) -> Case:
    shape, chunks, dtype = layout
    path = str(root / f"{name}.h5")
    dtype = options.pop("dtype", dtype)
    data = _values(shape, dtype, len(name))
    with h5py.File(path, "w") as file:
        ds = file.create_dataset(
            "x", shape=shape, chunks=chunks, dtype=dtype, fillvalue=-5 if fill else 0, **options
        )
        if write is not None:
            write(ds, data)
        elif fill:
            ds[: chunks[0]] = data[: chunks[0]]
        else:
            ds[...] = data
    with h5py.File(path, "r") as file:
        truth = file["x"][...]
    nbytes = int(np.prod(chunks)) * np.dtype(dtype).itemsize
    return Case(name, lambda: mixle.read_hdf5(path, "x"), truth, nbytes)


def _masked_chunks(ds: Any, data: np.ndarray) -> None:
    """Most chunks through shuffle + deflate; some with shuffle skipped, some with both.

    The filter mask is HDF5's own record of which filters a chunk skipped: a chunk with
    every filter skipped is stored as its plain bytes.
    """
    ds[...] = data
    chunks = ds.chunks
    for k, corner in enumerate([(0, 0, 0), (8, 8, 0), (16, 0, 8), (0, 16, 16), (32, 24, 16)]):
        block = np.zeros(chunks, dtype=data.dtype)
        part = data[tuple(slice(c, c + n) for c, n in zip(corner, chunks))]
        block[tuple(slice(0, n) for n in part.shape)] = part
        if k % 2:
            ds.id.write_direct_chunk(corner, block.tobytes(), filter_mask=0b11)
        else:
            ds.id.write_direct_chunk(corner, zlib.compress(block.tobytes()), filter_mask=0b01)


_V2 = {"zarr_format": 2}
_BLOSC = zc.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")
_ZSTD = [zc.ZstdCodec(level=1)]
_DELTA = [numcodecs.Delta(dtype="<i4")]
_SCALED = [numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4")]

#: ``(writer, name, layout, options)`` of every array the batch tests read.
SPECS: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = [
    ("zarr", "v3-zstd-small", SMALL, {"compressors": _ZSTD}),
    ("zarr", "v3-zstd-large", LARGE, {"compressors": _ZSTD}),
    ("zarr", "v3-blosc-small", SMALL, {"compressors": [_BLOSC]}),
    ("zarr", "v3-blosc-large", LARGE, {"compressors": [_BLOSC]}),
    ("zarr", "v3-gzip-small", SMALL, {"compressors": [zc.GzipCodec(level=1)]}),
    ("zarr", "v3-gzip-large", LARGE, {"compressors": [zc.GzipCodec(level=1)]}),
    ("zarr", "v3-crc32c-small", SMALL, {"compressors": [zc.Crc32cCodec()]}),
    ("zarr", "v3-crc32c-large", LARGE, {"compressors": [zc.Crc32cCodec()]}),
    ("zarr", "v3-raw-small", SMALL, {"compressors": None}),
    ("zarr", "v3-raw-large", LARGE, {"compressors": None}),
    ("zarr", "v3-raw-fill", SMALL, {"compressors": None, "fill": True}),
    ("zarr", "v3-zstd-fill", LARGE, {"compressors": _ZSTD, "fill": True}),
    (
        "zarr",
        "v3-transpose-zstd",
        SMALL,
        {"filters": [zc.TransposeCodec(order=(2, 0, 1))], "compressors": _ZSTD},
    ),
    (
        "zarr",
        "v3-transpose-raw",
        LARGE,
        {"filters": [zc.TransposeCodec(order=(1, 2, 0))], "compressors": None},
    ),
    ("zarr", "v2-lz4-small", SMALL, {"compressors": numcodecs.LZ4(), **_V2}),
    ("zarr", "v2-lz4-large", LARGE, {"compressors": numcodecs.LZ4(), **_V2}),
    (
        "zarr",
        "v2-blosc-large",
        LARGE,
        {"compressors": numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.SHUFFLE), **_V2},
    ),
    ("zarr", "v2-zstd-small", SMALL, {"compressors": numcodecs.Zstd(level=1), **_V2}),
    ("zarr", "v2-gzip-large", LARGE, {"compressors": numcodecs.GZip(level=1), **_V2}),
    ("zarr", "v2-raw-small", SMALL, {"compressors": None, **_V2}),
    ("zarr", "v2-raw-large", LARGE, {"compressors": None, **_V2}),
    ("zarr", "v2-raw-fill", LARGE, {"compressors": None, "fill": True, **_V2}),
    ("zarr", "v2-forder-raw", SMALL, {"compressors": None, "order": "F", **_V2}),
    ("zarr", "v2-forder-zstd", LARGE, {"compressors": numcodecs.Zstd(), "order": "F", **_V2}),
    ("zarr", "v2-delta-zstd", SMALL, {"filters": _DELTA, "compressors": numcodecs.Zstd(), **_V2}),
    ("zarr", "v2-delta-raw", SMALL, {"filters": _DELTA, "compressors": None, **_V2}),
    (
        "zarr",
        "v2-scaleoffset-lz4",
        LARGE,
        {"dtype": "<f8", "filters": _SCALED, "compressors": numcodecs.LZ4(), **_V2},
    ),
    ("hdf5", "h5-gzip-small", SMALL, {"compression": "gzip", "compression_opts": 1}),
    ("hdf5", "h5-gzip-large", LARGE, {"compression": "gzip", "compression_opts": 1}),
    ("hdf5", "h5-shuffle-gzip-small", SMALL, {"shuffle": True, "compression": "gzip"}),
    ("hdf5", "h5-shuffle-gzip-large", LARGE, {"shuffle": True, "compression": "gzip"}),
    ("hdf5", "h5-shuffle-small", SMALL, {"shuffle": True}),
    ("hdf5", "h5-shuffle-large", LARGE, {"shuffle": True}),
    ("hdf5", "h5-shuffle-gzip-u1", SMALL, {"dtype": "u1", "shuffle": True, "compression": "gzip"}),
    ("hdf5", "h5-shuffle-u1", SMALL, {"dtype": "u1", "shuffle": True}),
    ("hdf5", "h5-shuffle-gzip-be", LARGE, {"dtype": ">f8", "shuffle": True, "compression": "gzip"}),
    ("hdf5", "h5-raw-small", SMALL, {}),
    ("hdf5", "h5-raw-large", LARGE, {}),
    ("hdf5", "h5-raw-fill", SMALL, {"fill": True}),
    ("hdf5", "h5-gzip-fill", LARGE, {"fill": True, "compression": "gzip"}),
    (
        "hdf5",
        "h5-filter-mask",
        SMALL,
        {"write": _masked_chunks, "shuffle": True, "compression": "gzip"},
    ),
]
CASE_NAMES = [name for _writer, name, _layout, _options in SPECS]


def _write_cases(root: Path) -> dict[str, Case]:
    write = {"zarr": _zarr_case, "hdf5": _hdf5_case}
    return {
        name: write[writer](root, name, layout, **dict(options))
        for writer, name, layout, options in SPECS
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every array of this module, written once."""
    return _write_cases(tmp_path_factory.mktemp("decode-into"))


@pytest.fixture
def reading_settings() -> Iterator[Callable[[int, int], None]]:
    """``apply(budget, threads)``; the default budget and thread count come back after."""

    def apply(budget: int, threads: int) -> None:
        set_chunk_cache_bytes(budget)
        set_decode_threads(threads)

    try:
        yield apply
    finally:
        set_chunk_cache_bytes(None)
        set_decode_threads(None)


def _expected(truth: np.ndarray, starts: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    boxes = [truth[tuple(slice(s, s + n) for s, n in zip(row, size))] for row in starts]
    return np.stack(boxes)


def _random_batch(
    rng: np.random.Generator, shape: tuple[int, ...], chunks: tuple[int, ...], boxes: int
) -> tuple[np.ndarray, tuple[int, ...]]:
    """``boxes`` corners of one random size, up to one and a half chunks on a side."""
    size = tuple(int(rng.integers(1, min(n, c + c // 2) + 1)) for n, c in zip(shape, chunks))
    starts = np.stack([rng.integers(0, n - s + 1, size=boxes) for n, s in zip(shape, size)], 1)
    return starts, size


def _read_batches(case: Case, batches: int, seed: int) -> None:
    """Read ``batches`` random batches; every one, earlier ones again, equals the truth."""
    rng = np.random.default_rng(seed)
    held: list[tuple[np.ndarray, np.ndarray]] = []
    with case.open() as source:
        assert source.shape == case.truth.shape
        for _ in range(batches):
            starts, size = _random_batch(rng, source.shape, source.chunks, 7)
            got = source.read_boxes(starts, size)
            held.append((got, _expected(case.truth, starts, size)))
            for k, (earlier, want) in enumerate(held):
                np.testing.assert_array_equal(earlier, want, err_msg=f"batch {k} of {len(held)}")
        # a second pass over the first corners: chunks now come from the cache
        rng = np.random.default_rng(seed)
        for k, (earlier, want) in enumerate(held):
            starts, size = _random_batch(rng, source.shape, source.chunks, 7)
            np.testing.assert_array_equal(source.read_boxes(starts, size), want)
            np.testing.assert_array_equal(earlier, want, err_msg=f"batch {k}, reread")


BUDGETS = {
    "off": lambda chunk: 0,
    "tiny": lambda chunk: chunk * 5 // 2,
    "large": lambda chunk: LARGE_BUDGET,
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("budget", sorted(BUDGETS))
@pytest.mark.parametrize("name", CASE_NAMES)
def test_batches_equal_the_writers_read(
    cases: dict[str, Case],
    reading_settings: Callable[[int, int], None],
    name: str,
    budget: str,
    threads: int,
) -> None:
    case = cases[name]
    reading_settings(BUDGETS[budget](case.chunk_nbytes), threads)
    _read_batches(case, batches=4, seed=zlib.crc32(f"{name}-{budget}-{threads}".encode()))


@pytest.mark.parametrize("budget", ["off", "tiny"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_read_path_equals_the_writers_read(
    cases: dict[str, Case],
    reading_settings: Callable[[int, int], None],
    name: str,
    budget: str,
) -> None:
    """src[key], get_batch and a patch sampler through the buffers: one source, one answer."""
    case = cases[name]
    reading_settings(BUDGETS[budget](case.chunk_nbytes), 2)
    truth = case.truth
    with case.open() as source:
        whole = source[...]
        part = source[1:-1, ::2, 3]
        rows = source.get_batch([0, len(truth) - 1, 1, 0])
        size = tuple(min(5, n) for n in truth.shape)
        sampler = mixle.PatchSampler(source, size, 12, seed=7)
        patches, corners = sampler.get_batch(np.arange(12))
        np.testing.assert_array_equal(whole, truth)
        np.testing.assert_array_equal(part, truth[1:-1, ::2, 3])
        np.testing.assert_array_equal(rows, truth[[0, len(truth) - 1, 1, 0]])
        np.testing.assert_array_equal(patches, _expected(truth, corners, size))


def test_two_sources_share_the_threads_buffers(
    cases: dict[str, Case], reading_settings: Callable[[int, int], None]
) -> None:
    """Batches of sources of every layout, interleaved, keep their values."""
    reading_settings(0, 2)
    rng = np.random.default_rng(5)
    held = []
    picked = [cases[n] for n in ("v3-raw-large", "v2-raw-small", "h5-raw-large", "h5-gzip-small")]
    sources = [case.open() for case in picked]
    try:
        for _ in range(3):
            for case, source in zip(picked, sources):
                starts, size = _random_batch(rng, source.shape, source.chunks, 5)
                held.append((source.read_boxes(starts, size), _expected(case.truth, starts, size)))
        for got, want in held:
            np.testing.assert_array_equal(got, want)
    finally:
        for source in sources:
            source.close()


@pytest.mark.parametrize("name", CASE_NAMES)
def test_the_readers_decode_into_buffers(cases: dict[str, Case], name: str) -> None:
    """These tests exercise the planner's buffers: every local reader here decodes into them.

    (A reader that stopped doing so would leave the tests above passing for the wrong
    reason.)
    """
    with cases[name].open() as source:
        reader = source._reader_for(source._live())
        assert isinstance(reader, SupportsDecodeInto)
        assert callable(getattr(reader, "read_stored", None))
        assert reader.decoded_nbytes == cases[name].chunk_nbytes
        if reader.decoded_nbytes < PAGE_BACKED_CHUNK_BYTES:
            return
        cache = ChunkCache(1 << 26)  # a large kept chunk is the lease it was decoded into
        ones = [1] * len(source.shape)
        out = np.empty((1, *ones), source.dtype)
        read_chunked(reader, [[0] * len(ones)], ones, source.shape, out, cache=cache)
        (kept,) = cache._entries.values()
        pages = _pages_of(kept)
        if cache.stats().decodes:  # a chunk never written is the fill chunk, no buffer
            assert pages is not None and pages.owner is cache and pages.size == kept.nbytes


# -- property: any corners and sizes, a budget that evicts all the time ----------------------

_PROPERTY_SHAPE = (19, 17, 13)
_PROPERTY_CHUNKS = (6, 5, 4)


@pytest.fixture(scope="module")
def small_arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("decode-into-property")
    layout = (_PROPERTY_SHAPE, _PROPERTY_CHUNKS, "int16")
    found = [
        _zarr_case(root, "zstd-fill", layout, compressors=[zc.ZstdCodec(level=1)], fill=True),
        _zarr_case(root, "raw", layout, compressors=None, zarr_format=2),
        _hdf5_case(root, "h5-shuffle-gzip", layout, shuffle=True, compression="gzip", fill=True),
    ]
    return {case.name: case for case in found}


_corner = st.tuples(*(st.integers(0, n - 1) for n in _PROPERTY_SHAPE))
_batch = st.tuples(
    st.tuples(*(st.integers(1, n) for n in _PROPERTY_SHAPE)),
    st.lists(_corner, min_size=1, max_size=5),
)


@pytest.mark.parametrize("name", ["zstd-fill", "raw", "h5-shuffle-gzip"])
@settings(max_examples=25, deadline=None)
@given(batches=st.lists(_batch, min_size=1, max_size=4), threads=st.sampled_from([1, 2]))
def test_random_boxes_equal_the_writers_read(
    small_arrays: dict[str, Case], name: str, batches: list[Any], threads: int
) -> None:
    case = small_arrays[name]
    try:
        set_chunk_cache_bytes(case.chunk_nbytes * 5 // 2)
        set_decode_threads(threads)
        held = []
        with case.open() as source:
            for size, corners in batches:
                starts = np.array(
                    [
                        [min(c, n - s) for c, n, s in zip(corner, _PROPERTY_SHAPE, size)]
                        for corner in corners
                    ]
                )
                got = source.read_boxes(starts, size)
                held.append((got, _expected(case.truth, starts, size)))
                np.testing.assert_array_equal(got, held[-1][1])
        for got, want in held:
            np.testing.assert_array_equal(got, want)
    finally:
        set_chunk_cache_bytes(None)
        set_decode_threads(None)
