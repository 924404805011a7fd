"""Batched reads through the read planner equal per-index reads and NumPy, for every backend."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import h5py
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

import mixle
from mixle.data.sources.arrays.hdf5.chunks import HDF5ChunkReader
from mixle.data.sources.arrays.zarr.chunks import ZarrCodecReader
from mixle.data.sources.arrays.zarr.pipeline import ZarrPipelineReader
from mixle.data.sources.arrays.zarr.shards import ShardedZarrReader
from mixle.reading import chunk_cache
from mixle.testing import assert_unchanged


def _data(shape, dtype="float32", seed=0):
    """Whole numbers (so that lossless float filters such as Delta stay exact)."""
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_normal(shape) * 100).astype(dtype)


def _zarr(folder: Path, data: np.ndarray, chunks, **kwargs) -> mixle.ZarrArraySource:
    path = folder / "a.zarr"
    zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, **kwargs)[:] = (
        data
    )
    return mixle.read_zarr(path)


def _hdf5(folder: Path, data: np.ndarray, chunks, **kwargs) -> mixle.HDF5ArraySource:
    path = folder / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=data, chunks=chunks, **kwargs)
    return mixle.read_hdf5(path, "a")


def _memmap(folder: Path, data: np.ndarray, chunks) -> mixle.MemmapArraySource:
    path = folder / "a.raw"
    data.tofile(path)
    return mixle.read_memmap(path, data.dtype, data.shape)


def _npy(folder: Path, data: np.ndarray, chunks) -> mixle.NpyArraySource:
    path = folder / "a.npy"
    np.save(path, np.asfortranarray(data))
    return mixle.read_npy(path)


LAYOUTS = {
    "zarr v3 zstd": lambda d, a, c: _zarr(d, a, c, compressors=ZstdCodec(level=1)),
    "zarr v3 gzip": lambda d, a, c: _zarr(d, a, c, compressors=GzipCodec()),
    "zarr v3 blosc": lambda d, a, c: _zarr(d, a, c, compressors=BloscCodec(cname="lz4")),
    "zarr v3 raw": lambda d, a, c: _zarr(d, a, c, compressors=None),
    "zarr v2 zlib": lambda d, a, c: _zarr(d, a, c, zarr_format=2, compressors=numcodecs.Zlib()),
    "zarr v2 delta": lambda d, a, c: _zarr(
        d, a, c, zarr_format=2, filters=[numcodecs.Delta(dtype=a.dtype)], compressors=None
    ),
    "hdf5 gzip": lambda d, a, c: _hdf5(d, a, c, compression="gzip"),
    "hdf5 shuffle gzip": lambda d, a, c: _hdf5(d, a, c, compression="gzip", shuffle=True),
    "hdf5 chunked raw": lambda d, a, c: _hdf5(d, a, c),
    "hdf5 lzf": lambda d, a, c: _hdf5(d, a, c, compression="lzf"),
    "hdf5 contiguous": lambda d, a, c: _hdf5(d, a, None),
    "memmap": _memmap,
    "npy fortran": _npy,
}


def _boxes(shape, size, count, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, d - s + 1, size=count) for d, s in zip(shape, size)], axis=1)


def _check_boxes(src, data, starts, size):
    batched = src.read_boxes(starts, size)
    for b, row in enumerate(starts.tolist()):
        expected = data[tuple(slice(a, a + n) for a, n in zip(row, size))]
        np.testing.assert_array_equal(batched[b], expected)
        np.testing.assert_array_equal(src.read_box(row, size), expected)


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(2, 13 if ndim < 4 else 6)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, d)) for d in shape)
    size = tuple(draw(st.integers(1, d)) for d in shape)
    return shape, chunks, size, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(max_examples=12, deadline=None)
@given(case=cases())
def test_batched_equals_per_index_equals_numpy(layout, case):
    shape, chunks, size, seed = case
    data = _data(shape, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        src = LAYOUTS[layout](Path(tmp), data, chunks)
        with assert_unchanged(tmp):
            _check_boxes(src, data, _boxes(shape, size, 7, seed), size)
        src.close()


def test_patch_sampler_batches_equal_numpy_on_every_backend(tmp_path):
    data = _data((40, 36, 30), seed=3)
    for i, (name, make) in enumerate(sorted(LAYOUTS.items())):
        folder = tmp_path / str(i)
        folder.mkdir()
        sampler = mixle.PatchSampler(make(folder, data, (16, 16, 16)), (9, 17, 8), 50, seed=i)
        patches, coords = sampler.get_batch(np.arange(50))
        for b, (z, y, x) in enumerate(coords.tolist()):
            expected = data[z : z + 9, y : y + 17, x : x + 8]
            np.testing.assert_array_equal(patches[b], expected, err_msg=name)
            np.testing.assert_array_equal(sampler[b][0], expected, err_msg=name)


def test_chunk_readers_chosen_per_layout(tmp_path, stores):
    src = _zarr(tmp_path, _data((20, 20)), (8, 8))
    assert isinstance(src._reader_for(src.array), ZarrCodecReader)
    sharded = mixle.read_zarr(stores.path("sharded.zarr"))
    assert isinstance(sharded._reader_for(sharded.array), ShardedZarrReader)
    gz = mixle.read_hdf5(stores.path("volumes.h5"), "gzip")
    assert isinstance(gz._reader_for(gz.array), HDF5ChunkReader)
    lzf = mixle.read_hdf5(stores.path("volumes.h5"), "lzf")
    assert lzf._reader_for(lzf.array) is None  # h5py's own filter: read through h5py
    contiguous = mixle.read_hdf5(stores.path("volumes.h5"), "contiguous")
    assert isinstance(contiguous._memmap_for(contiguous.array), np.memmap)


def test_zarr_codec_and_pipeline_readers_agree(stores):
    for name in ("v3.zarr", "v2.zarr"):
        src = mixle.read_zarr(stores.path(name))
        arr, direct = src.array, src._reader_for(src.array)
        assert isinstance(direct, ZarrCodecReader)
        pipeline = ZarrPipelineReader(arr)
        grid = [-(-s // c) for s, c in zip(arr.shape, arr.chunks)]
        for coords in np.ndindex(*grid):
            a, b = direct.read_chunk(coords), pipeline.read_chunk(coords)
            np.testing.assert_array_equal(a[tuple(slice(0, n) for n in b.shape)], b)


def test_missing_chunks_read_as_fill_value(tmp_path):
    arr = zarr.create_array(
        str(tmp_path / "sparse.zarr"), shape=(20, 20), chunks=(5, 5), dtype="i4", fill_value=7
    )
    arr[0:5, 0:5] = 1
    h5 = tmp_path / "sparse.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("a", shape=(20, 20), chunks=(5, 5), dtype="i4", fillvalue=7,
                         compression="gzip")[0:5, 0:5] = 1  # fmt: skip
    expected = np.full((20, 20), 7, dtype="i4")
    expected[:5, :5] = 1
    for src in (mixle.read_zarr(tmp_path / "sparse.zarr"), mixle.read_hdf5(h5, "a")):
        starts = np.array([[0, 0], [3, 3], [10, 10], [15, 0]])
        out = src.read_boxes(starts, (5, 5))
        for b, (r, c) in enumerate(starts.tolist()):
            np.testing.assert_array_equal(out[b], expected[r : r + 5, c : c + 5])


def test_big_endian_and_fortran_order_zarr_v2(tmp_path):
    data = _data((11, 9), dtype=">f8", seed=5)
    path = tmp_path / "be.zarr"
    arr = zarr.create_array(str(path), shape=data.shape, chunks=(4, 4), dtype=data.dtype,
                            zarr_format=2, order="F")  # fmt: skip
    arr[:] = data
    src = mixle.read_zarr(path)
    assert isinstance(src._reader_for(src.array), ZarrCodecReader)
    _check_boxes(src, data, _boxes(data.shape, (3, 5), 20, 1), (3, 5))


def test_hdf5_user_block_and_big_endian(tmp_path):
    data = _data((14, 12), dtype=">i4", seed=6)
    path = tmp_path / "ub.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f.create_dataset("gz", data=data, chunks=(5, 5), compression="gzip", shuffle=True)
        f.create_dataset("flat", data=data)
    for name in ("gz", "flat"):
        _check_boxes(mixle.read_hdf5(path, name), data, _boxes(data.shape, (4, 6), 20, 2), (4, 6))


@pytest.mark.parametrize("userblock", [0, 4096])
def test_hdf5_contiguous_never_written_reads_fill_value(tmp_path, userblock):
    # with a user block HDF5 reports an offset for unallocated storage (undefined address
    # plus the block size): mapping it returned whatever bytes sit there
    path = tmp_path / "unwritten.h5"
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset("filled", shape=(4, 5), dtype="f4", fillvalue=3)
        f.create_dataset("zeros", shape=(4, 5), dtype=">i2")
    for name, value in (("filled", 3), ("zeros", 0)):
        src = mixle.read_hdf5(path, name)
        assert src._memmap_for(src.array) is None
        expected = np.full((4, 5), value, dtype=src.dtype)
        np.testing.assert_array_equal(src[...], expected)
        np.testing.assert_array_equal(src.read_boxes([[0, 0], [2, 3]], (2, 2))[1], expected[:2, :2])
        np.testing.assert_array_equal(src.get_batch([3, 0]), expected[[3, 0]])
        src.close()


def test_hdf5_opened_for_writing_reads_through_h5py(tmp_path):
    data = _data((10, 10))
    path = tmp_path / "rw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("gz", data=data, chunks=(4, 4), compression="gzip")
        f.create_dataset("flat", data=data)
    gz = mixle.read_hdf5(path, "gz", mode="r+")
    assert gz._reader_for(gz.array) is None
    flat = mixle.read_hdf5(path, "flat", mode="r+")
    assert flat._memmap_for(flat.array) is None
    gz.array[0, 0] = 123.0  # the user's own write is seen by the next read
    assert gz.read_box((0, 0), (1, 1))[0, 0] == 123.0


def test_threads_reading_one_source_at_once(stores):
    src = mixle.read_zarr(stores.path("v3.zarr"))
    data = stores.truth["v3.zarr"]
    errors: list[BaseException] = []

    def work(seed):
        try:
            for k in range(10):
                _check_boxes(src, data, _boxes(data.shape, (5, 7, 6), 6, seed * 100 + k),
                             (5, 7, 6))  # fmt: skip
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a reader thread hung"
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_cache_is_empty_in_a_forked_child_and_reads_stay_correct(stores):
    src = mixle.read_hdf5(stores.path("volumes.h5"), "gzip")
    data = stores.truth["volumes.h5/gzip"]
    src.read_boxes([[0, 0, 0]], (5, 5, 5))
    assert chunk_cache().stats().entries > 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = 0
        try:
            empty = chunk_cache().stats().entries == 0 and chunk_cache().stats().hits == 0
            box = src.read_box((3, 4, 5), (9, 9, 9))
            ok = int(empty and np.array_equal(box, data[3:12, 4:13, 5:14]))
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    result = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert result == b"\x01"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_get_batch_of_shuffled_rows_equals_numpy(layout, tmp_path):
    data = _data((37, 6, 5), seed=8)
    src = LAYOUTS[layout](tmp_path, data, (8, 4, 5))
    idx = np.array([36, 0, 5, 5, -1, 17, 8, 7, 30])
    np.testing.assert_array_equal(src.get_batch(idx), data[idx])
    assert src.get_batch([]).shape == (0, 6, 5)


def test_shuffled_rows_decode_each_chunk_once(tmp_path):
    data = _data((128, 16, 16), seed=9)
    src = _zarr(tmp_path, data, (32, 16, 16))
    idx = np.random.default_rng(0).permutation(128)[:64]
    old = chunk_cache().budget
    try:
        chunk_cache().budget = 0
        before = chunk_cache().stats().misses
        np.testing.assert_array_equal(src.get_batch(idx), data[idx])
        assert chunk_cache().stats().misses - before == 4  # 128 rows in 4 chunks
    finally:
        chunk_cache().budget = old


@pytest.mark.parametrize(
    ("starts", "size", "name"),
    [
        ([[1.7, 0]], (2, 2), "starts"),
        ([[1, 0]], (2.0, 2), "size"),
        ([[True, False]], (2, 2), "starts"),
    ],
)
def test_box_coordinates_must_be_integers(tmp_path, starts, size, name):
    src = _memmap(tmp_path, _data((6, 6)), None)
    with pytest.raises(TypeError, match=f"{name} must be integers"):
        src.read_boxes(starts, size)
    with pytest.raises(TypeError, match="must be integers"):
        src.read_box((0.5, 0), (2, 2))


def test_a_reader_made_while_the_source_closes_is_not_kept(tmp_path):
    src = _zarr(tmp_path, _data((8, 8)), (4, 4))
    make = src._chunk_reader

    def closing_meanwhile(handle):
        reader = make(handle)
        src._closed = True  # close() finishing in another thread while the reader was built
        return reader

    src._chunk_reader = closing_meanwhile  # type: ignore[method-assign]
    src._reader_for(src.array)
    assert src._reader is None  # nothing (no reader, no descriptor) outlives close()
