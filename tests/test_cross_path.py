"""One source, one answer: every read path agrees with the writing library's own read.

Each layout below is written by the library users write it with (zarr-python, h5py,
NumPy) and read back by that library (``zarr.open_array(...)[...]``, ``h5py``'s
``ds[...]``, ``np.load``/``np.fromfile``). Hypothesis then draws keys, boxes, rows and
patch indices, and ``src[...]``, ``src[key]``, ``read_box``, ``read_boxes``,
``get_batch`` and ``PatchSampler.get_batch`` must all give the writer's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.testing_servers import RangeHTTPServer


@dataclass(frozen=True)
class Layout:
    """How to write one layout and how to open it with mixle."""

    write: Callable[[Path, np.ndarray], None]
    writer_read: Callable[[Path], np.ndarray]
    open: Callable[[Path], ArraySource]
    shape: tuple[int, ...] = (19, 22, 13)
    dtype: str = "float32"
    #: part of the volume is never written (the writer reads fill values there)
    partial: bool = False


def _values(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -30000), min(info.max, 30000), size=shape).astype(dtype)


# -- zarr -----------------------------------------------------------------------------------
def _zarr_writer(**kwargs: Any) -> Callable[[Path, np.ndarray], None]:
    def write(path: Path, values: np.ndarray) -> None:
        import zarr

        arr = zarr.create_array(
            str(path), shape=values.shape, dtype=values.dtype, fill_value=7, **kwargs
        )
        arr[...] = values

    return write


def _zarr_partial(**kwargs: Any) -> Callable[[Path, np.ndarray], None]:
    def write(path: Path, values: np.ndarray) -> None:
        import zarr

        arr = zarr.create_array(
            str(path), shape=values.shape, dtype=values.dtype, fill_value=7, **kwargs
        )
        half = values.shape[0] // 2
        arr[:half] = values[:half]  # the rest of the chunks are never written: fill value

    return write


def _zarr_multi_frame(path: Path, values: np.ndarray) -> None:
    """zarr v2 + Zstd, every chunk then stored as two zstd frames (numcodecs reads those)."""
    import numcodecs
    import zarr

    arr = zarr.create_array(
        str(path),
        shape=values.shape,
        chunks=(8, 10, 7),
        dtype=values.dtype,
        zarr_format=2,
        compressors=numcodecs.Zstd(),
    )
    arr[...] = values
    codec = numcodecs.Zstd()
    for chunk in path.glob("*.*.*"):
        raw = bytes(codec.decode(chunk.read_bytes()))
        half = len(raw) // 2
        chunk.write_bytes(bytes(codec.encode(raw[:half])) + bytes(codec.encode(raw[half:])))


def _zarr_read(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[...])


def _zarr_open(path: Path) -> ArraySource:
    return mixle.read_zarr(str(path))


def _zarr_layouts() -> dict[str, Layout]:
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, TransposeCodec, ZstdCodec

    def layout(write: Callable[[Path, np.ndarray], None], **kw: Any) -> Layout:
        return Layout(write, _zarr_read, _zarr_open, **kw)

    return {
        "zarr3-zstd": layout(_zarr_writer(chunks=(8, 10, 7), compressors=ZstdCodec(level=1))),
        "zarr3-raw": layout(_zarr_writer(chunks=(8, 10, 7), compressors=None), dtype="int16"),
        "zarr3-big-endian": layout(
            _zarr_writer(chunks=(5, 9, 13), serializer=BytesCodec(endian="big"), compressors=None),
            dtype="uint16",
        ),
        "zarr3-transpose": layout(
            _zarr_writer(chunks=(8, 10, 7), filters=[TransposeCodec(order=(2, 0, 1))]),
            dtype="int32",
        ),
        "zarr3-sharded": layout(
            _zarr_writer(chunks=(4, 5, 7), shards=(8, 10, 14), compressors=BloscCodec()),
            dtype="float64",
        ),
        "zarr3-sharded-raw": layout(
            _zarr_writer(chunks=(4, 5, 7), shards=(8, 10, 14), compressors=None), dtype="int16"
        ),
        "zarr3-partial": layout(
            _zarr_partial(chunks=(4, 10, 7), compressors=ZstdCodec()), partial=True
        ),
        "zarr2-blosc": layout(
            _zarr_writer(chunks=(7, 6, 5), zarr_format=2, compressors=numcodecs.Blosc()),
            dtype="int16",
        ),
        "zarr2-raw-F": layout(
            _zarr_writer(chunks=(7, 6, 5), zarr_format=2, compressors=None, order="F"),
            dtype="uint8",
        ),
        "zarr2-delta-zlib": layout(
            _zarr_writer(
                chunks=(7, 6, 5),
                zarr_format=2,
                filters=[numcodecs.Delta(dtype="int32")],
                compressors=numcodecs.Zlib(level=1),
            ),
            dtype="int32",
        ),
        "zarr2-zstd-multi-frame": layout(_zarr_multi_frame, dtype="int32"),
        "zarr2-partial": layout(
            _zarr_partial(chunks=(4, 6, 5), zarr_format=2, compressors=numcodecs.Zstd()),
            dtype="int16",
            partial=True,
        ),
    }


# -- HDF5 -----------------------------------------------------------------------------------
def _h5_writer(**kwargs: Any) -> Callable[[Path, np.ndarray], None]:
    def write(path: Path, values: np.ndarray) -> None:
        import h5py

        with h5py.File(path, "w") as f:
            f.create_dataset("v", data=values, **kwargs)

    return write


def _h5_partial(**kwargs: Any) -> Callable[[Path, np.ndarray], None]:
    def write(path: Path, values: np.ndarray) -> None:
        import h5py

        with h5py.File(path, "w") as f:
            ds = f.create_dataset(
                "v", shape=values.shape, dtype=values.dtype, fillvalue=7, **kwargs
            )
            half = values.shape[0] // 2
            ds[:half] = values[:half]  # later chunks are never allocated

    return write


def _h5_read(path: Path) -> np.ndarray:
    import h5py

    with h5py.File(path, "r") as f:
        return np.asarray(f["v"][...])


def _h5_open(path: Path) -> ArraySource:
    return mixle.read_hdf5(str(path), "v")


def _h5_layouts() -> dict[str, Layout]:
    def layout(write: Callable[[Path, np.ndarray], None], **kw: Any) -> Layout:
        return Layout(write, _h5_read, _h5_open, **kw)

    return {
        "hdf5-gzip": layout(_h5_writer(chunks=(8, 10, 7), compression="gzip")),
        "hdf5-shuffle-gzip": layout(
            _h5_writer(chunks=(8, 10, 7), compression="gzip", shuffle=True), dtype="int32"
        ),
        "hdf5-chunked-raw": layout(_h5_writer(chunks=(5, 9, 13)), dtype="int16"),
        "hdf5-big-endian": layout(_h5_writer(chunks=(5, 9, 13), dtype=">i4"), dtype=">i4"),
        "hdf5-lzf": layout(_h5_writer(chunks=(8, 10, 7), compression="lzf"), dtype="uint16"),
        "hdf5-fletcher32": layout(_h5_writer(chunks=(8, 10, 7), fletcher32=True)),
        "hdf5-contiguous": layout(_h5_writer(), dtype="float64"),
        "hdf5-contiguous-big-endian": layout(_h5_writer(dtype=">f4"), dtype=">f4"),
        "hdf5-compact": layout(_h5_compact, shape=(6, 7, 5), dtype="int16"),
        "hdf5-partial": layout(
            _h5_partial(chunks=(4, 10, 7), compression="gzip"), dtype="int16", partial=True
        ),
        "hdf5-partial-raw": layout(_h5_partial(chunks=(4, 10, 7)), partial=True),
        "hdf5-int12": layout(_h5_lowlevel(precision=12), dtype="int16", partial=True),
        "hdf5-uint12-offset4": layout(
            _h5_lowlevel(precision=12, offset=4), dtype="uint16", partial=True
        ),
        "hdf5-int12-contiguous": layout(
            _h5_lowlevel(precision=12, chunks=None), dtype="int16", partial=True
        ),
        "hdf5-fill-time-never": layout(_h5_lowlevel(fill_never=True), partial=True),
    }


def _h5_lowlevel(
    precision: int = 0, offset: int = 0, fill_never: bool = False, chunks: Any = (5, 9, 13)
) -> Callable[[Path, np.ndarray], None]:
    """A dataset made with h5py's low-level API: a reduced-precision / bit-offset integer
    type (``precision``, ``offset``), or unwritten chunks under ``FILL_TIME_NEVER``."""

    def write(path: Path, values: np.ndarray) -> None:
        import h5py

        tid = h5py.h5t.py_create(values.dtype).copy()
        if precision:
            tid.set_precision(precision)
        if offset:
            tid.set_offset(offset)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        if chunks:
            dcpl.set_chunk(chunks)
            dcpl.set_deflate(1)
        if fill_never:
            dcpl.set_fill_value(np.array(7, dtype=values.dtype))
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        with h5py.File(path, "w") as f:
            h5py.h5d.create(f.id, b"v", tid, h5py.h5s.create_simple(values.shape), dcpl=dcpl)
            if fill_never:
                f["v"][: values.shape[0] // 2] = values[: values.shape[0] // 2]
            else:  # keep the values inside the stored precision
                bits = precision - (1 if values.dtype.kind == "i" else 0)
                f["v"][...] = np.clip(
                    values, -(2**bits) if values.dtype.kind == "i" else 0, 2**bits - 1
                )

    return write


def _h5_compact(path: Path, values: np.ndarray) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple(values.shape)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        tid = h5py.h5t.py_create(values.dtype)
        h5py.h5d.create(f.id, b"v", tid, space, dcpl=dcpl)
        f["v"][...] = values


# -- NumPy ----------------------------------------------------------------------------------
def _npy_write(fortran: bool) -> Callable[[Path, np.ndarray], None]:
    def write(path: Path, values: np.ndarray) -> None:
        np.save(path, np.asfortranarray(values) if fortran else values)

    return write


def _raw_write(path: Path, values: np.ndarray) -> None:
    with open(path, "wb") as fh:
        fh.write(b"\0" * 48)  # a header to skip
        fh.write(values.tobytes())


def _raw_layout(dtype: str) -> Layout:
    shape = (19, 22, 13)
    return Layout(
        _raw_write,
        lambda p: np.fromfile(p, dtype=dtype, offset=48).reshape(shape),
        lambda p: mixle.read_memmap(str(p), dtype, shape, offset=48),
        shape=shape,
        dtype=dtype,
    )


def _numpy_layouts() -> dict[str, Layout]:
    npy_open: Callable[[Path], ArraySource] = lambda p: mixle.read_npy(str(p))  # noqa: E731
    return {
        "npy-C": Layout(_npy_write(False), np.load, npy_open, dtype="int16"),
        "npy-F": Layout(_npy_write(True), np.load, npy_open, dtype="float64"),
        "npy-big-endian": Layout(_npy_write(False), np.load, npy_open, dtype=">u2"),
        "raw": _raw_layout("float32"),
        "raw-big-endian": _raw_layout(">i4"),
    }


def _adopted_layouts() -> dict[str, Layout]:
    """Objects the user opened themselves, handed to mixle (as samplers accept them)."""
    import numcodecs

    def zarr_object(path: Path) -> ArraySource:
        import zarr

        return as_array_source(zarr.open_array(str(path), mode="r"))

    def h5py_object(path: Path) -> ArraySource:
        import h5py

        file = h5py.File(path, "r")
        USER_HANDLES.append(file)
        return as_array_source(file["v"])

    def tiff_write(path: Path, values: np.ndarray) -> None:
        import tifffile

        tifffile.imwrite(path, values, tile=(16, 16), compression="zlib")

    def tiff_read(path: Path) -> np.ndarray:
        import tifffile

        return np.asarray(tifffile.imread(path))

    def tiff_store(path: Path) -> ArraySource:
        import tifffile

        store = tifffile.imread(path, aszarr=True)
        USER_HANDLES.append(store)  # mixle never closes what the user opened
        return mixle.read_zarr(store)

    return {
        "adopted-tifffile-store": Layout(tiff_write, tiff_read, tiff_store, dtype="uint16"),
        "adopted-zarr3": Layout(
            _zarr_writer(chunks=(8, 10, 7), shards=(16, 20, 7)), _zarr_read, zarr_object
        ),
        "adopted-zarr2": Layout(
            _zarr_writer(chunks=(7, 6, 5), zarr_format=2, compressors=numcodecs.Zlib()),
            _zarr_read,
            zarr_object,
            dtype="int16",
        ),
        "adopted-hdf5": Layout(
            _h5_writer(chunks=(8, 10, 7), compression="gzip"), _h5_read, h5py_object
        ),
        "adopted-ndarray": Layout(
            _npy_write(False), np.load, lambda p: as_array_source(np.load(p)), dtype="int32"
        ),
    }


#: stores and files the tests opened themselves, closed after the module's tests
USER_HANDLES: list[Any] = []

#: layouts served over HTTP by a loopback server (read as ``http://127.0.0.1:port/name``)
REMOTE = {
    "http-zarr3-zstd": "zarr3-zstd",
    "http-zarr3-sharded-raw": "zarr3-sharded-raw",
    "http-zarr2-partial": "zarr2-partial",
    "http-hdf5-shuffle-gzip": "hdf5-shuffle-gzip",
    "http-hdf5-chunked-raw": "hdf5-chunked-raw",
    "http-hdf5-contiguous": "hdf5-contiguous",
}

LAYOUTS: dict[str, Layout] = {
    **_zarr_layouts(),
    **_h5_layouts(),
    **_numpy_layouts(),
    **_adopted_layouts(),
}


@dataclass
class Written:
    source: ArraySource
    truth: np.ndarray


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Written]]:
    root = tmp_path_factory.mktemp("cross")
    opened: dict[str, Written] = {}

    def write(name: str) -> tuple[Path, np.ndarray]:
        layout = LAYOUTS[name]
        suffix = ".npy" if "npy" in name or "ndarray" in name else ""
        path = root / (name + (".tif" if "tifffile" in name else suffix))
        if not path.exists():
            values = _values(layout.shape, layout.dtype, seed=len(name))
            layout.write(path, values)
            if not layout.partial:
                np.testing.assert_array_equal(layout.writer_read(path), values)  # round trip
        return path, layout.writer_read(path)

    def get(name: str) -> Written:
        if name not in opened:
            if name in REMOTE:
                path, truth = write(REMOTE[name])
                url = f"{server.url}/{path.name}"
                is_h5 = REMOTE[name].startswith("hdf5")
                source = mixle.read_hdf5(url, "v") if is_h5 else mixle.read_zarr(url)
            else:
                path, truth = write(name)
                source = LAYOUTS[name].open(path)
            opened[name] = Written(source, truth)
        return opened[name]

    with RangeHTTPServer(root) as server:
        yield get
        for w in opened.values():
            w.source.close()
        while USER_HANDLES:
            USER_HANDLES.pop().close()


# -- strategies -----------------------------------------------------------------------------
def _axis_key(n: int) -> st.SearchStrategy[Any]:
    index = st.integers(-n, n - 1)
    bound = st.none() | st.integers(-n - 2, n + 2)
    step = st.none() | st.integers(-4, 4).filter(lambda s: s != 0)
    return index | st.builds(slice, bound, bound, step)


@st.composite
def keys(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    parts = [draw(_axis_key(n)) for n in shape]
    cut = draw(st.integers(0, len(shape)))
    form = draw(st.sampled_from(["full", "prefix", "ellipsis"]))
    if form == "prefix":
        return parts[0] if cut == 1 else tuple(parts[:cut])
    if form == "ellipsis":
        return (*parts[:cut], Ellipsis)
    return tuple(parts)


@st.composite
def boxes(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[np.ndarray, list[int]]:
    size = [draw(st.integers(1, n)) for n in shape]
    count = draw(st.integers(1, 6))
    starts = [[draw(st.integers(0, n - s)) for n, s in zip(shape, size)] for _ in range(count)]
    return np.asarray(starts, dtype=np.int64), size


def _box(truth: np.ndarray, start: Any, size: Any) -> np.ndarray:
    return truth[tuple(slice(int(a), int(a) + int(s)) for a, s in zip(start, size))]


PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NAMES = sorted([*LAYOUTS, *REMOTE])


# -- the properties ------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_whole_array_and_metadata_match_the_writer(written: Any, name: str) -> None:
    w = written(name)
    assert w.source.shape == w.truth.shape
    assert w.source.dtype == w.truth.dtype
    got = w.source[...]
    assert got.dtype == w.truth.dtype
    np.testing.assert_array_equal(got, w.truth)
    np.testing.assert_array_equal(w.source.read_box((0,) * w.truth.ndim, w.truth.shape), w.truth)
    np.testing.assert_array_equal(w.source.get_batch(np.arange(len(w.truth))), w.truth)


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(data=st.data())
def test_basic_indexing_matches_the_writer(written: Any, name: str, data: st.DataObject) -> None:
    w = written(name)
    key = data.draw(keys(w.truth.shape), label="key")
    want = w.truth[key]
    got = w.source[key]
    assert np.shape(got) == np.shape(want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(data=st.data())
def test_boxes_and_rows_match_the_writer(written: Any, name: str, data: st.DataObject) -> None:
    w = written(name)
    starts, size = data.draw(boxes(w.truth.shape), label="boxes")
    got = w.source.read_boxes(starts, size)
    assert got.shape == (len(starts), *size) and got.dtype == w.truth.dtype
    for one, start in zip(got, starts):
        np.testing.assert_array_equal(one, _box(w.truth, start, size))
    first = w.source.read_box(starts[0], size)
    np.testing.assert_array_equal(first, _box(w.truth, starts[0], size))

    n = len(w.truth)
    rows = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=12), label="rows")
    np.testing.assert_array_equal(w.source.get_batch(rows), w.truth[np.asarray(rows)])
    ordered = sorted({r % n for r in rows})  # increasing, each once: read straight into out
    np.testing.assert_array_equal(w.source.get_batch(ordered), w.truth[np.asarray(ordered)])


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(data=st.data())
def test_patch_batches_match_the_writer(written: Any, name: str, data: st.DataObject) -> None:
    w = written(name)
    shape = w.truth.shape
    patch = [data.draw(st.integers(1, min(n, 9)), label="patch") for n in shape]
    sampler = mixle.PatchSampler(
        w.source,
        patch_size=patch,
        num_patches=50,
        seed=data.draw(st.integers(0, 2**64 - 1), label="seed"),
        patches_per_chunk=data.draw(st.sampled_from([1, 4]), label="patches_per_chunk"),
    )
    indices = data.draw(st.lists(st.integers(0, 49), min_size=1, max_size=10), label="indices")
    patches, coords = sampler.get_batch(indices)
    assert patches.shape == (len(indices), *patch) and coords.shape == (len(indices), len(shape))
    for one, corner, index in zip(patches, coords, indices):
        np.testing.assert_array_equal(one, _box(w.truth, corner, patch))
        single, single_corner = sampler[index]
        assert tuple(single_corner) == tuple(corner)
        np.testing.assert_array_equal(single, one)


def test_every_layout_family_is_covered() -> None:
    families = {name.split("-")[0] for name in NAMES}
    assert {"zarr2", "zarr3", "hdf5", "npy", "raw", "adopted", "http"} <= families
