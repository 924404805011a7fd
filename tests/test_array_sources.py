"""Every array backend against NumPy ground truth, through the public API."""

from __future__ import annotations

import gc
import pickle
import tempfile
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.arrays.adopt import ArrayLikeSource, as_array_source
from mixle.errors import SourceClosedError
from mixle.testing import assert_unchanged, check_array_source

ZARR_STORES = ["v3.zarr", "v2.zarr", "sharded.zarr"]
H5_DATASETS = ["gzip", "lzf", "contiguous", "scans/ct", "/scans/ct"]


@pytest.mark.parametrize("name", ZARR_STORES)
def test_zarr_conformance(stores, name):
    check_array_source(mixle.read_zarr(stores.path(name)), stores.truth[name])


@pytest.mark.parametrize("component", ["image", "labels/mask", "/labels/mask"])
def test_zarr_component_conformance(stores, component):
    src = mixle.read_zarr(stores.path("group.zarr"), component)
    check_array_source(src, stores.truth["group.zarr/" + component.strip("/")])


def test_zarr_fsspec_url(stores):
    url = "file://" + stores.path("v3.zarr")
    check_array_source(mixle.read_zarr(url), stores.truth["v3.zarr"])


def test_zarr_memory_url_with_storage_options():
    data = np.arange(60, dtype=np.int32).reshape(6, 10)
    arr = zarr.create_array(
        "memory://mixle-test/a.zarr", shape=data.shape, chunks=(4, 4), dtype=data.dtype
    )
    arr[:] = data
    src = mixle.read_zarr(
        "memory://mixle-test/a.zarr", storage_options={"skip_instance_cache": False}
    )
    np.testing.assert_array_equal(src[::-1, 3:], data[::-1, 3:])
    assert "storage_options" not in repr(src)


def test_zarr_metadata(stores):
    src = mixle.read_zarr(stores.path("sharded.zarr"))
    assert src.chunks == (4, 4, 5)
    assert src.shards == (12, 8, 10)
    assert mixle.read_zarr(stores.path("v2.zarr")).shards is None
    assert isinstance(src.array, zarr.Array)
    assert src.array.read_only


@pytest.mark.parametrize("name", H5_DATASETS)
def test_hdf5_conformance(stores, name):
    src = mixle.read_hdf5(stores.path("volumes.h5"), name)
    check_array_source(src, stores.truth["volumes.h5/" + name.strip("/")])


def test_hdf5_scalar_dataset(stores):
    src = mixle.read_hdf5(stores.path("volumes.h5"), "scalar")
    assert src.shape == () and src[()] == np.float32(2.5)
    with pytest.raises(TypeError, match="0-dimensional"):
        len(src)


def test_hdf5_chunk_cache_defaults_and_override(stores):
    from mixle.data.sources.arrays.hdf5.source import HDF5_CHUNK_CACHE_BYTES

    def cache_bytes(src):
        return src.array.id.get_access_plist().get_chunk_cache()[1]

    src = mixle.read_hdf5(stores.path("volumes.h5"), "gzip")
    assert cache_bytes(src) == HDF5_CHUNK_CACHE_BYTES
    src.close()
    small = mixle.read_hdf5(stores.path("volumes.h5"), "gzip", rdcc_nbytes=2**20)
    assert cache_bytes(small) == 2**20
    clone = pickle.loads(pickle.dumps(small))
    small.close()
    assert cache_bytes(clone) == 2**20  # options travel with the pickle


def test_hdf5_dataset_is_opened_like_h5py_opens_it(stores):
    # h5py caches shape/dtype lookups only on datasets it knows are read-only; without
    # that, every read re-queried HDF5 and patch reads were ~3x slower
    src = mixle.read_hdf5(stores.path("volumes.h5"), "gzip")
    with h5py.File(stores.path("volumes.h5"), "r") as f:
        assert src.array._readonly == f["gzip"]._readonly is True


def test_hdf5_array_outlives_its_source(stores):
    dataset = mixle.read_hdf5(stores.path("volumes.h5"), "gzip").array
    gc.collect()
    truth = stores.truth["volumes.h5/gzip"]
    np.testing.assert_array_equal(dataset[2:4], truth[2:4])
    sampler = mixle.PatchSampler(
        mixle.read_hdf5(stores.path("volumes.h5"), "gzip").array, (4, 5, 6), 10, seed=3
    )
    gc.collect()
    patch, (z, y, x) = sampler[7]
    np.testing.assert_array_equal(patch, truth[z : z + 4, y : y + 5, x : x + 6])
    clone = pickle.loads(pickle.dumps(sampler))
    assert len(pickle.dumps(sampler)) < 2048
    np.testing.assert_array_equal(clone[7][0], patch)


def test_sampler_over_hdf5_source_pickles(stores):
    sampler = mixle.PatchSampler(mixle.read_hdf5(stores.path("volumes.h5"), "lzf"), 5, 4)
    clone = pickle.loads(pickle.dumps(sampler))
    for i in range(4):
        np.testing.assert_array_equal(clone[i][0], sampler[i][0])


@pytest.mark.parametrize("name", ["c.npy", "fortran.npy"])
def test_npy_conformance(stores, name):
    src = mixle.read_npy(stores.path(name))
    assert src.array.flags.f_contiguous == (name == "fortran.npy")
    check_array_source(src, stores.truth[name])


def test_memmap_conformance_with_offset(stores):
    src = mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64)
    check_array_source(src, stores.truth["header.raw"])


def test_memmap_fortran_order(stores):
    src = mixle.read_memmap(stores.path("fortran.raw"), "float64", (5, 7, 3), order="F")
    check_array_source(src, stores.truth["fortran.raw"])


def test_memmap_is_read_only_and_patches_are_copies(stores):
    src = mixle.read_memmap(stores.path("header.raw"), np.uint16, [12, 10, 8], offset=64)
    assert not src.array.flags.writeable
    sampler = mixle.PatchSampler(src, (3, 3, 3), 5)
    patch, _ = sampler[0]
    assert patch.flags.writeable and patch.flags.owndata
    patch[...] = 0  # touches only the copy


def test_copy_on_write_mode_never_reaches_the_file(stores):
    src = mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64, mode="c")
    src.array[0, 0, 0] = 12345
    assert src[0, 0, 0] == 12345
    src.close()  # the stores fixture then checks the file is byte-identical


def test_readwrite_memmap_only_when_asked(tmp_path):
    path = tmp_path / "rw.raw"
    np.arange(10, dtype=np.int8).tofile(path)
    src = mixle.read_memmap(path, "int8", 10, mode="r+")
    src.array[0] = 42
    src.array.flush()
    assert np.fromfile(path, dtype=np.int8)[0] == 42


def test_empty_memmap(tmp_path):
    path = tmp_path / "empty.raw"
    path.write_bytes(b"head")
    src = mixle.read_memmap(path, "float32", (0, 4), offset=4)
    assert src.shape == (0, 4) and len(src) == 0
    assert src[:].shape == (0, 4)
    assert list(src) == []


def test_in_memory_array_source():
    data = np.arange(24.0).reshape(4, 6)
    src = as_array_source(data)
    assert isinstance(src, ArrayLikeSource)
    check_array_source(src, data.copy(), max_pickle_bytes=4096)


def test_adopting_live_objects_pickles_by_reference(stores):
    truth = stores.truth["c.npy"]
    mm = np.load(stores.path("c.npy"), mmap_mode="r")
    src = as_array_source(mm)
    assert isinstance(src, mixle.MemmapArraySource)
    assert len(pickle.dumps(src)) < 2048
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(src))[3], truth[3])

    with h5py.File(stores.path("volumes.h5"), "r") as f:
        src = as_array_source(f["lzf"])
        assert isinstance(src, mixle.HDF5ArraySource)
        clone = pickle.loads(pickle.dumps(src))
        src.close()  # must not close the caller's file
        assert f["lzf"].shape == (40, 9)
    np.testing.assert_array_equal(clone[:5], stores.truth["volumes.h5/lzf"][:5])

    arr = zarr.open_array(stores.path("v3.zarr"), mode="r")
    src = as_array_source(arr)
    assert isinstance(src, mixle.ZarrArraySource)
    assert len(pickle.dumps(src)) < 2048
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(src))[1], stores.truth["v3.zarr"][1])


def test_adopted_memmap_of_part_of_a_file_pickles_the_same_region(tmp_path):
    path = tmp_path / "header_data_trailer.raw"
    whole = np.arange(30, dtype="<i4")
    whole.tofile(path)
    mm = np.memmap(path, dtype="<i4", mode="r", offset=8, shape=(5, 4))  # 2 before, 8 after
    src = as_array_source(mm)
    assert isinstance(src, mixle.MemmapArraySource)
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone[...], whole[2:22].reshape(5, 4))
    np.testing.assert_array_equal(clone.get_batch([4, 0]), whole[2:22].reshape(5, 4)[[4, 0]])
    with pytest.raises(ValueError, match="check dtype, shape and offset"):
        mixle.read_memmap(path, "<i4", (5, 4), offset=8)  # by hand the size must match


def test_in_memory_hdf5_cannot_pickle_by_reference():
    with h5py.File("in-memory.h5", "w", driver="core", backing_store=False) as f:
        ds = f.create_dataset("x", data=np.arange(5))
        src = as_array_source(ds)
        np.testing.assert_array_equal(src[:], np.arange(5))
        with pytest.raises(TypeError, match="cannot be pickled by reference"):
            pickle.dumps(src)


def test_structure_and_schema_are_kept(stores):
    src = mixle.read_npy(
        stores.path("c.npy"),
        structure=mixle.SEQUENTIAL,
        schema=mixle.Schema("float32", (None, 6, 5)),
    )
    assert src.structure is mixle.SEQUENTIAL
    clone = pickle.loads(pickle.dumps(src))
    assert clone.structure == mixle.SEQUENTIAL and clone.schema == src.schema


def test_sampler_reads_ground_truth_on_every_backend(stores):
    cases = [
        (mixle.read_zarr(stores.path("sharded.zarr")), stores.truth["sharded.zarr"]),
        (mixle.read_hdf5(stores.path("volumes.h5"), "gzip"), stores.truth["volumes.h5/gzip"]),
        (mixle.read_npy(stores.path("fortran.npy")), stores.truth["fortran.npy"]),
        (
            mixle.read_memmap(stores.path("header.raw"), "uint16", (12, 10, 8), offset=64),
            stores.truth["header.raw"],
        ),
    ]
    for src, truth in cases:
        sampler = mixle.PatchSampler(src, (3, 4, 5), 25, seed=11, stride=(1, 2, 1))
        patches, coords = sampler.get_batch(np.arange(25))
        assert patches.shape == (25, 3, 4, 5) and coords.dtype == np.int64
        for i, (patch, corner) in enumerate(zip(patches, coords)):
            box = tuple(slice(c, c + p) for c, p in zip(corner, (3, 4, 5)))
            np.testing.assert_array_equal(patch, truth[box])
            single, single_corner = sampler[i]
            np.testing.assert_array_equal(single, patch)
            assert single_corner == tuple(corner)
        assert [c for _, c in sampler] == sampler.coords()


# -- hypothesis round trips ---------------------------------------------------------------

shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


@st.composite
def volume_and_chunks(draw):
    shape = draw(shapes)
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    dtype = draw(st.sampled_from(["int16", "float32", "uint8", "float64"]))
    data = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 97
    return data.astype(dtype), chunks


def _slice_for(draw, dim):
    start = draw(st.none() | st.integers(-dim - 2, dim + 2))
    stop = draw(st.none() | st.integers(-dim - 2, dim + 2))
    step = draw(st.none() | st.integers(-4, 4).filter(bool))
    return slice(start, stop, step)


@st.composite
def keys_for(draw, shape):
    ndim = len(shape)
    n_items = draw(st.integers(0, ndim))
    split = draw(st.integers(0, n_items))  # items before '...' index leading axes
    axes = list(range(split)) + list(range(ndim - (n_items - split), ndim))
    items = []
    for axis in axes:
        dim = shape[axis]
        if draw(st.booleans()):
            items.append(draw(st.integers(-dim, dim - 1)))
        else:
            items.append(_slice_for(draw, dim))
    if draw(st.booleans()) or split != n_items:
        items.insert(split, Ellipsis)
    return tuple(items)


def _write_all(folder: Path, data: np.ndarray, chunks: tuple[int, ...]):
    zarr.create_array(str(folder / "a.zarr"), shape=data.shape, chunks=chunks, dtype=data.dtype)[
        :
    ] = data
    with h5py.File(folder / "a.h5", "w") as f:
        f.create_dataset("a", data=data, chunks=chunks, compression="gzip")
    np.save(folder / "a.npy", data)
    data.tofile(folder / "a.raw")
    return [
        mixle.read_zarr(folder / "a.zarr"),
        mixle.read_hdf5(folder / "a.h5", "a"),
        mixle.read_npy(folder / "a.npy"),
        mixle.read_memmap(folder / "a.raw", data.dtype, data.shape),
    ]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_random_keys_match_numpy_on_every_backend(data):
    volume, chunks = data.draw(volume_and_chunks())
    keys = [data.draw(keys_for(volume.shape)) for _ in range(5)]
    with tempfile.TemporaryDirectory() as tmp:
        sources = _write_all(Path(tmp), volume, chunks)
        with assert_unchanged(tmp):
            for src in sources:
                for key in keys:
                    got, want = src[key], volume[key]
                    assert np.shape(got) == np.shape(want)
                    np.testing.assert_array_equal(got, want)
                idx = data.draw(st.lists(st.integers(-len(volume), len(volume) - 1), max_size=8))
                np.testing.assert_array_equal(
                    src.get_batch(idx), volume[np.asarray(idx, dtype=np.int64)]
                )
                src.close()


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_random_patches_match_numpy_on_every_backend(data):
    volume, chunks = data.draw(volume_and_chunks())
    patch = tuple(data.draw(st.integers(1, s)) for s in volume.shape)
    seed = data.draw(st.integers(-(2**63), 2**64 - 1))
    with tempfile.TemporaryDirectory() as tmp:
        for src in _write_all(Path(tmp), volume, chunks):
            sampler = mixle.PatchSampler(src, patch, 6, seed=seed)
            patches, coords = sampler.get_batch(range(6))
            for got, corner in zip(patches, coords):
                box = tuple(slice(c, c + p) for c, p in zip(corner, patch))
                np.testing.assert_array_equal(got, volume[box])
            src.close()


def test_sampler_keeps_the_record_protocols(stores):
    from mixle.data.sources.protocols import SupportsBatchRead, SupportsRecords

    sampler = mixle.PatchSampler(mixle.read_npy(stores.path("c.npy")), 2, 3)
    assert isinstance(sampler, SupportsRecords)
    assert isinstance(sampler, SupportsBatchRead)
    patch_spec, coords_spec = sampler.element_spec()
    patches, coords = sampler.get_batch([0, 1])
    assert patches.shape[1:] == patch_spec.shape and patches.dtype == patch_spec.dtype
    assert coords.shape[1:] == coords_spec.shape and coords.dtype == coords_spec.dtype


class _ClosedUnderneath:
    """An array whose reads fail the way a backend does when its file is closed mid-read."""

    shape, dtype = (6, 4), np.dtype("f4")
    source: mixle.ArraySource | None = None

    def __getitem__(self, key):
        assert self.source is not None
        self.source.close()  # another thread closes the source while this read runs
        raise RuntimeError("Unable to synchronously get dataspace (identifier is not valid)")


@pytest.mark.parametrize("read", ["getitem", "read_boxes", "get_batch"])
def test_close_during_a_read_raises_source_closed(read):
    array = _ClosedUnderneath()
    src = as_array_source(array)
    array.source = src
    reads = {
        "getitem": lambda: src[1:3],
        "read_boxes": lambda: src.read_boxes([[0, 0], [2, 1]], (2, 2)),
        "get_batch": lambda: src.get_batch([3, 1]),
    }
    with pytest.raises(SourceClosedError, match="closed by another thread") as info:
        reads[read]()
    assert isinstance(info.value.__cause__, RuntimeError)  # the backend's words kept


def test_other_read_errors_pass_through_unchanged():
    class Broken:
        shape, dtype = (3,), np.dtype("i2")

        def __getitem__(self, key):
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        as_array_source(Broken())[0]


@pytest.mark.parametrize("dataset", ["gzip", "contiguous"])
def test_hdf5_closed_while_threads_read_gives_source_closed(stores, dataset):
    for _ in range(5):
        src = mixle.read_hdf5(stores.path("volumes.h5"), dataset)
        errors: list[BaseException] = []
        started = threading.Barrier(3)

        rows, row = len(src), (1, *src.shape[1:])

        def work(src=src, errors=errors, started=started, rows=rows, row=row):
            started.wait()
            try:
                for k in range(10_000):
                    src.get_batch([k % rows, (3 * k) % rows])
                    src[k % rows]
                    src.read_boxes([[k % rows] + [0] * (len(row) - 1)], row)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        started.wait()
        src.close()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert all(isinstance(e, SourceClosedError) for e in errors), errors


@pytest.mark.parametrize("kind", ["array", "records"])
def test_metadata_is_published_before_the_handle(tmp_path, kind):
    # _live() hands out the handle without the lock once it is set: a thread that sees the
    # handle must also see the metadata (record sources set the handle first, once)
    np.save(tmp_path / "v.npy", np.arange(24.0).reshape(4, 6))
    base = mixle.NpyArraySource if kind == "array" else mixle.MemorySource
    seen: list[object] = []

    class Watched(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: object) -> None:
            if name == "_handle" and value is not None:
                seen.append(self._meta)
            super().__setattr__(name, value)

    src = Watched(tmp_path / "v.npy") if kind == "array" else Watched({"x": np.arange(5)})
    assert len(src) in (4, 5) and seen and all(meta is not None for meta in seen)


def test_conformance_suite_runs_on_one_dimensional_arrays(tmp_path: Path) -> None:
    # its keys once included an array index plus a slice, two axes a 1-D array lacks
    data = np.arange(11, dtype="float32")
    np.save(tmp_path / "line.npy", data)
    check_array_source(mixle.read_npy(tmp_path / "line.npy"), data)
