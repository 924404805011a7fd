"""read_zarr on a zipped zarr store: every read path equals zarr's own read of the zip.

Stores are written by zarr-python into its ``ZipStore`` (format 2 and 3, groups, sharded,
big-endian, several codecs, chunks left unwritten) or zipped from a folder store with
deflate; nothing mixle does may change the zip file.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from _fork_child import in_forked_child  # noqa: E402
from zarr.codecs import (  # noqa: E402
    BloscCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.storage import ZipStore  # noqa: E402

from mixle.data.sampling.patch_sampler import PatchSampler  # noqa: E402
from mixle.data.sources.array_source import read_zarr  # noqa: E402
from mixle.data.sources.arrays.zarr.chunks import ZipChunkReader  # noqa: E402
from mixle.errors import ArrayNotFoundError, NotAnArrayError, UnsupportedStoreError  # noqa: E402
from mixle.reading import CorruptChunkError, chunk_cache  # noqa: E402
from mixle.testing import assert_unchanged, check_array_source  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:Duplicate name"),
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
]


def _values(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 100, size=shape).astype(dtype)


#: name -> (component, create_array options, region written (the rest reads the fill value))
LAYOUTS: dict[str, tuple[str | None, dict[str, Any], tuple[slice, ...]]] = {
    "v3 root uint16 zstd": (
        None,
        {
            "shape": (13, 17, 9),
            "chunks": (5, 4, 4),
            "dtype": "uint16",
            "fill_value": 7,
            "compressors": ZstdCodec(level=1),
        },
        (slice(0, 9), slice(0, 17), slice(2, 9)),
    ),
    "v3 group float32 gzip": (
        "raw/img",
        {"shape": (11, 6, 7), "chunks": (4, 6, 3), "dtype": "float32", "compressors": GzipCodec()},
        (slice(None),) * 3,
    ),
    "v3 group uint8 uncompressed": (
        "labels/mask",
        {"shape": (9, 10), "chunks": (4, 3), "dtype": "uint8", "compressors": None},
        (slice(1, 9), slice(0, 7)),
    ),
    "v3 sharded int64 blosc": (
        "sharded",
        {
            "shape": (10, 12, 5),
            "chunks": (2, 3, 5),
            "shards": (4, 6, 5),
            "dtype": "int64",
            "compressors": BloscCodec(cname="lz4"),
        },
        (slice(0, 8), slice(None), slice(None)),
    ),
    "v3 transposed shards (zarr's pipeline)": (
        None,
        {
            "shape": (12, 10),
            "chunks": (8, 8),
            "dtype": "float32",
            "filters": [TransposeCodec(order=(1, 0))],
            "serializer": ShardingCodec(chunk_shape=(4, 4)),
            "compressors": None,
        },
        (slice(0, 8), slice(None)),
    ),
    "v2 big-endian int16 blosc order F": (
        None,
        {
            "shape": (7, 15, 6),
            "chunks": (3, 4, 6),
            "dtype": ">i2",
            "zarr_format": 2,
            "order": "F",
            "compressors": numcodecs.Blosc(cname="zstd", shuffle=2),
        },
        (slice(None),) * 3,
    ),
    "v2 group float64 zlib": (
        "a/b",
        {
            "shape": (5, 9),
            "chunks": (2, 4),
            "dtype": "<f8",
            "zarr_format": 2,
            "compressors": numcodecs.Zlib(level=1),
            "fill_value": -1.5,
        },
        (slice(0, 3), slice(0, 9)),
    ),
}


def _write(path: Path, component: str | None, options: dict[str, Any], region: Any) -> None:
    store = ZipStore(path, mode="w")
    if component is None:
        array = zarr.create_array(store=store, **options)
    else:
        options = dict(options)
        root = zarr.open_group(store=store, mode="w", zarr_format=options.pop("zarr_format", 3))
        array = root.create_array(component, **options)
    data = _values(tuple(options["shape"]), options["dtype"], seed=len(path.name))
    array[region] = data[region]
    store.close()


def _zarrs_read(path: Path, component: str | None) -> np.ndarray:
    store = ZipStore(path, mode="r")
    try:
        return np.asarray(zarr.open_array(store=store, path=component or "", mode="r")[...])
    finally:
        store.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    root = tmp_path_factory.mktemp("zips")
    out = {}
    for i, (name, (component, options, region)) in enumerate(LAYOUTS.items()):
        path = root / f"store{i}.zarr.zip"
        _write(path, component, options, region)
        out[name] = (path, _zarrs_read(path, component))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_read_path_equals_zarrs_read_of_the_zip(written, layout):
    path, expected = written[layout]
    component = LAYOUTS[layout][0]
    with assert_unchanged(path):
        chunk_cache().clear()
        src = read_zarr(str(path), component)
        reader = src._reader_for(src.array)
        options = LAYOUTS[layout][1]
        want = "ShardedZarrReader" if "shards" in options else "ZipChunkReader"
        assert type(reader).__name__ == ("ZarrPipelineReader" if "serializer" in options else want)
        patch = tuple(max(1, s // 2) for s in expected.shape)
        patches, corners = PatchSampler(src, patch, num_patches=8, seed=2).get_batch(np.arange(8))
        for got, corner in zip(patches, corners):
            box = tuple(slice(int(c), int(c) + p) for c, p in zip(corner, patch))
            np.testing.assert_array_equal(got, expected[box])
        check_array_source(src, expected)  # keys, boxes, batches, records, pickle, close


def test_a_deflated_zip_of_a_folder_store_reads_as_zarr_reads_it(tmp_path):
    folder = tmp_path / "v.zarr"
    data = _values((12, 9, 8), "float32", seed=5)
    array = zarr.create_array(
        folder, shape=data.shape, chunks=(5, 4, 8), dtype="float32", compressors=None
    )  # deflate is the only compression
    array[...] = data
    path = tmp_path / "v.zarr.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                zf.write(file, file.relative_to(folder).as_posix())
    assert {i.compress_type for i in zipfile.ZipFile(path).infolist()} == {zipfile.ZIP_DEFLATED}
    with assert_unchanged(path):
        src = read_zarr(path)
        assert isinstance(src._reader_for(src.array), ZipChunkReader)
        check_array_source(src, _zarrs_read(path, None))


def test_pickles_by_path_and_the_copy_reads_the_same(written):
    path, expected = written["v3 group float32 gzip"]
    src = read_zarr(str(path), "raw/img")
    blob = pickle.dumps(src)
    assert str(path).encode() in blob and len(blob) < 1024
    copy = pickle.loads(blob)
    assert "not opened yet" in repr(copy)
    np.testing.assert_array_equal(copy[2:9, ::2], expected[2:9, ::2])
    assert copy.array.store is not src.array.store
    copy.close()
    src.close()


def test_a_zip_store_object_is_reopened_read_only_by_its_path(written):
    path, expected = written["v3 root uint16 zstd"]
    given = ZipStore(path, mode="r")
    src = read_zarr(given)
    assert src.array.store is not given  # its own descriptor: a fork shares no file offset
    np.testing.assert_array_equal(src[...], expected)
    src.close()
    assert not given._is_open  # the caller's store was never opened, nor closed, by mixle


def test_close_releases_the_zip_file(written):
    path, _ = written["v3 root uint16 zstd"]
    src = read_zarr(path)
    store = src.array.store
    src[0]
    src.close()
    assert store._zf.fp is None  # closed: no descriptor left behind


def test_reads_after_fork_open_the_zip_again(written):
    path, expected = written["v3 sharded int64 blosc"]
    src = read_zarr(path, "sharded")
    np.testing.assert_array_equal(src[0], expected[0])
    parent_store = src.array.store

    def child() -> list[str]:
        problems = []
        if src.array.store is parent_store:
            problems.append("the child reads through the parent's ZipStore")
        for i in range(len(expected)):
            if not np.array_equal(src[i], expected[i]):
                problems.append(f"row {i} differs in the child")
        return problems

    assert in_forked_child(child) == []
    np.testing.assert_array_equal(src[...], expected)  # the parent's handle still reads right
    src.close()


def test_a_corrupt_member_names_the_zip_and_the_chunk(tmp_path):
    path = tmp_path / "c.zarr.zip"
    _write(
        path,
        None,
        {"shape": (8, 8), "chunks": (4, 4), "dtype": "uint8", "compressors": None},
        (slice(None),) * 2,
    )
    info = zipfile.ZipFile(path).getinfo("c/1/0")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start] ^= 0xFF  # one stored byte flipped: the CRC no longer matches
    path.write_bytes(bytes(raw))
    src = read_zarr(path)
    store = ZipStore(path, mode="r")
    theirs = zarr.open_array(store=store, mode="r")
    np.testing.assert_array_equal(src[:4, :4], theirs[:4, :4])  # the other chunks read
    with pytest.raises(zipfile.BadZipFile):  # zarr's own read refuses it too
        theirs[4:, :4]
    store.close()
    with pytest.raises(CorruptChunkError, match=r"c/1/0.*c\.zarr\.zip.*CRC-32"):
        src[4:, :4]


def test_a_member_larger_than_a_chunk_is_refused_unread(tmp_path):
    path = tmp_path / "big.zarr.zip"
    _write(
        path,
        None,
        {"shape": (4,), "chunks": (4,), "dtype": "uint8", "compressors": None},
        (slice(None),),
    )
    with zipfile.ZipFile(path, "a") as zf:  # a later member of the same name wins, as in zarr
        zf.writestr("c/0", b"\0" * 4096)
    with pytest.raises(CorruptChunkError, match=r"4,096 bytes, more than the 4 a stored chunk"):
        read_zarr(path)[...]


def test_a_component_is_found_in_groups_and_a_wrong_one_lists_arrays(written):
    path, _ = written["v3 group float32 gzip"]
    with pytest.raises(NotAnArrayError, match=r"raw/img"):
        read_zarr(path)
    with pytest.raises(ArrayNotFoundError, match=r"component='raw/nope'.*raw/img"):
        read_zarr(path, "raw/nope")


def test_a_zip_that_is_no_zarr_store_lists_what_it_holds(tmp_path):
    path = tmp_path / "notes.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(60):
            zf.writestr(f"note{i:02d}.txt", "hello")
    with assert_unchanged(path), pytest.raises(UnsupportedStoreError) as info:
        read_zarr(path)
    message = str(info.value)
    assert "not a zipped zarr store" in message and "note00.txt" in message
    assert "and 20 more" in message  # bounded


def _zip_with_folder(folder: Path, path: Path, litter: bool = False) -> None:
    """Zip ``folder`` as ``zip -r path folder`` does: members named ``folder/...``."""
    with zipfile.ZipFile(path, "w") as zf:
        for file in sorted([folder, *folder.rglob("*")]):
            zf.write(file, file.relative_to(folder.parent).as_posix())
        if litter:  # what macOS's Finder adds
            zf.writestr(f"__MACOSX/{folder.name}/._zarr.json", b"\x00\x05\x16\x07")


def test_a_zip_of_the_store_folder_says_which_component_to_pass(tmp_path):
    folder = tmp_path / "inner.zarr"
    zarr.create_array(folder, shape=(4,), chunks=(2,), dtype="i4")[...] = np.arange(4)
    path = tmp_path / "wrapped.zip"
    _zip_with_folder(folder, path)
    with pytest.raises(
        UnsupportedStoreError, match=r"folder 'inner\.zarr'.*component='inner\.zarr'"
    ):
        read_zarr(path)
    np.testing.assert_array_equal(read_zarr(path, "inner.zarr")[...], np.arange(4))


def test_a_zipped_store_folder_error_names_the_exact_component(tmp_path):
    folder = tmp_path / "x.zarr"
    root = zarr.open_group(folder, mode="w")
    root.create_array("a", shape=(4, 4), chunks=(2, 2), dtype=">i2")[...] = 1
    root.create_group("sub").create_array("b", shape=(3,), dtype="f8")[...] = 2.0
    v2 = zarr.open_group(folder / "old", mode="w", zarr_format=2)
    v2.create_array("c", shape=(2,), dtype="u1")[...] = 3
    path = tmp_path / "x.zip"
    _zip_with_folder(folder, path)
    with pytest.raises(UnsupportedStoreError) as info:
        read_zarr(path)
    message = str(info.value)
    assert "pass component= one of its arrays: x.zarr/a, x.zarr/old/c, x.zarr/sub/b," in message
    with pytest.raises(UnsupportedStoreError, match=r"pass component='x\.zarr/sub/b',"):
        read_zarr(path, "sub/b")  # the path below the folder: the whole component is named
    theirs = zarr.open_array(ZipStore(path, mode="r"), path="x.zarr/sub/b", mode="r")[...]
    np.testing.assert_array_equal(read_zarr(path, "x.zarr/sub/b")[...], theirs)


@pytest.mark.parametrize("litter", [False, True], ids=["zip -r", "macOS Finder"])
def test_inspect_reports_a_store_zipped_with_its_folder_from_that_folder(tmp_path, litter):
    from mixle.inspection.store import inspect_store

    folder = tmp_path / "x.zarr"
    root = zarr.open_group(folder, mode="w")
    root.create_array("a", shape=(5, 4), chunks=(2, 4), dtype=">u2", fill_value=9)[:4] = 1
    root.create_group("sub").create_array("b", shape=(7,), chunks=(3,), dtype="f4")[...] = 2
    path = tmp_path / "x.zip"
    _zip_with_folder(folder, path, litter)
    with zipfile.ZipFile(path) as zf:
        sizes = {i.filename: i.file_size for i in zf.infolist() if "/c/" in i.filename}
    with assert_unchanged(path):
        report = inspect_store(str(path), patch=(2, 2))
    assert report.kind == "zarr-zip"
    assert report.root.path == "/x.zarr"  # the folder is the store's root
    (note,) = [f for f in report.root.findings if f.code == "zip-folder"]
    assert "'x.zarr'" in note.message and "component='x.zarr/<array>'" in note.message
    arrays = {a.path: a for a in report.arrays()}
    assert sorted(arrays) == ["/x.zarr/a", "/x.zarr/sub/b"]
    store = ZipStore(path, mode="r")
    for name, array in arrays.items():
        theirs = zarr.open_array(store=store, path=name.strip("/"), mode="r")
        assert (array.shape, array.chunks, array.dtype) == (
            theirs.shape,
            theirs.chunks,
            str(theirs.dtype),
        )
        assert array.chunks_stored == theirs.nchunks_initialized
        members = {k: v for k, v in sizes.items() if k.startswith(f"{name.strip('/')}/c/")}
        assert array.stored_bytes == sum(members.values())
        # the reported path is the component read_zarr takes
        np.testing.assert_array_equal(read_zarr(path, name.strip("/"))[...], theirs[...])
    store.close()


def test_inspect_of_a_zip_with_stores_in_two_folders_names_the_read_zarr_call(tmp_path):
    from mixle.inspection.zip_stores import inspect_zarr_zip

    path = tmp_path / "two.zip"
    for name in ("one.zarr", "two.zarr"):
        zarr.create_array(tmp_path / name, shape=(3,), dtype="i4")[...] = 1
    with zipfile.ZipFile(path, "w") as zf:
        for name in ("one.zarr", "two.zarr"):
            for file in sorted((tmp_path / name).rglob("*")):
                zf.write(file, file.relative_to(tmp_path).as_posix())
    with assert_unchanged(path), pytest.raises(UnsupportedStoreError) as info:
        inspect_zarr_zip(str(path), None, None)
    message = str(info.value)
    assert "pass component=" not in message  # inspect takes no such argument
    assert "top-level entries: one.zarr, two.zarr" in message
    assert f"mixle.read_zarr({str(path)!r}, component='one.zarr/<array>')" in message


def test_npz_and_damaged_zips_are_named(tmp_path):
    npz = tmp_path / "a.npz"
    np.savez(npz, x=np.arange(3))
    with pytest.raises(UnsupportedStoreError, match=r"NumPy \.npz archive.*mixle\.read_npz\("):
        read_zarr(npz)
    fake = tmp_path / "fake.zip"
    fake.write_bytes(b"not a zip at all")
    with pytest.raises(UnsupportedStoreError, match=r"fake\.zip' is not a zip file"):
        read_zarr(fake)


def test_zarr_never_writes_to_the_zip(written):
    path, _ = written["v2 group float64 zlib"]
    before = os.stat(path).st_mtime_ns
    with assert_unchanged(path):
        src = read_zarr(path, "a/b")
        with pytest.raises(ValueError, match="read-only"):
            src.array[0, 0] = 5  # the store is read-only: zarr refuses the write
        src.close()
    assert os.stat(path).st_mtime_ns == before


def test_inspect_describes_a_zipped_store_from_its_central_directory(written, tmp_path):
    from mixle.inspection.zip_stores import inspect_zarr_zip, is_zarr_zip

    path, _ = written["v3 group float32 gzip"]
    npz = tmp_path / "a.npz"
    np.savez(npz, x=np.arange(3))
    assert is_zarr_zip(str(path)) and not is_zarr_zip(str(npz))
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: i.file_size for i in zf.infolist() if "/c/" in i.filename}
    with assert_unchanged(path):
        root = inspect_zarr_zip(str(path), None, (2, 3, 3))
    array = next(a for g in root.children for a in g.children if a.path == "/raw/img")
    store = ZipStore(path, mode="r")
    theirs = zarr.open_array(store=store, path="raw/img", mode="r")
    assert (array.shape, array.chunks, array.dtype) == (
        theirs.shape,
        theirs.chunks,
        str(theirs.dtype),
    )
    store.close()
    img = {k: v for k, v in members.items() if k.startswith("raw/img/")}
    assert array.chunks_stored == len(img) and array.stored_bytes == sum(img.values())
    assert array.patch_cost is not None
    assert not any(f.code.startswith("zip-") for f in array.findings)  # stored members


def test_inspect_warns_of_members_the_zip_compresses_again(tmp_path):
    from mixle.inspection.zip_stores import inspect_zarr_zip

    folder = tmp_path / "z.zarr"
    zarr.create_array(folder, shape=(8, 8), chunks=(4, 4), dtype="u2", compressors=ZstdCodec())[
        ...
    ] = 1
    path = tmp_path / "z.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(folder.rglob("*")):
            zf.write(file, file.relative_to(folder).as_posix())
    root = inspect_zarr_zip(str(path), None, None)
    (finding,) = [f for f in root.findings if f.code == "zip-deflated"]
    assert finding.severity == "warning" and "zip -0" in finding.message
    with pytest.raises(UnsupportedStoreError, match="not a zipped zarr store"):
        inspect_zarr_zip(_plain_zip(tmp_path), None, None)


def _plain_zip(tmp_path: Path) -> str:
    path = tmp_path / "plain.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hi")
    return str(path)


@pytest.mark.parametrize("compression", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_members_of_other_zip_compressions_read_through_zipfile(tmp_path, compression):
    folder = tmp_path / "o.zarr"
    data = _values((10, 7), "int32", seed=9)
    zarr.create_array(folder, shape=data.shape, chunks=(4, 3), dtype="int32")[...] = data
    path = tmp_path / "o.zip"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for file in sorted(folder.rglob("*")):
            zf.write(file, file.relative_to(folder).as_posix())
    src = read_zarr(path)
    assert isinstance(src._reader_for(src.array), ZipChunkReader)
    check_array_source(src, _zarrs_read(path, None))


def test_variable_length_strings_in_a_zip_read_as_zarr_reads_them(tmp_path):
    path = tmp_path / "s.zarr.zip"
    store = ZipStore(path, mode="w")
    words = np.array([["a", "bb", "ccc"], ["", "ééé", "x" * 40]] * 3, dtype=object)
    zarr.create_array(store=store, shape=words.shape, chunks=(4, 2), dtype=str)[...] = words
    store.close()
    src = read_zarr(path)
    assert isinstance(src._reader_for(src.array), ZipChunkReader)
    expected = _zarrs_read(path, None)
    np.testing.assert_array_equal(src[...], expected)
    np.testing.assert_array_equal(src.read_boxes([(0, 0), (2, 1)], (4, 2))[1], expected[2:6, 1:3])
    np.testing.assert_array_equal(src.get_batch([5, 0]), expected[[5, 0]])
