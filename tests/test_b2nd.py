"""blosc2 ``.b2nd`` arrays: every read path equals blosc2's own read of the same file.

Files are written with ``blosc2.asarray`` (several dtypes, big-endian too, odd shapes whose
edge chunks and blocks are partial, blocks that tile the chunks and blocks that do not,
every codec and shuffle filter) and read back through every path of ``read_b2nd``; the
answer is always ``blosc2.open(path)[...]``.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import blosc2
import numpy as np
import pytest
from _fork_child import in_forked_child

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.arrays.b2nd import B2ndArraySource, read_b2nd
from mixle.data.sources.arrays.b2nd import blocks as b2nd_blocks
from mixle.data.sources.arrays.b2nd import source as b2nd_source
from mixle.data.sources.arrays.b2nd.blocks import (
    B2ndChunkReader,
    blocks_tile_chunks,
    from_block_order,
    reads_by_block,
)
from mixle.errors import CorruptChunkError, FileChangedError, UnsupportedStoreError
from mixle.inspection.b2nd_files import inspect_b2nd, is_b2nd
from mixle.reading import read_chunked
from mixle.reading.cache import ChunkCache
from mixle.testing import assert_unchanged, check_array_source
from mixle.utils import optional_deps

SHAPE = (11, 14, 9)
#: (chunks, blocks): blocks tiling the chunks (the planner reads blocks), blocks that do
#: not (it reads whole chunks), one block per chunk
LAYOUTS = {
    "tiled": ((6, 8, 4), (3, 4, 2)),
    "untiled": ((6, 7, 5), (4, 3, 2)),
    "one-block": ((4, 5, 9), (4, 5, 9)),
}
DTYPES = ["<f4", ">f8", ">i2", "<u1", "<i8", ">u4", "?", "<c8"]
CODECS = [blosc2.Codec.ZSTD, blosc2.Codec.LZ4, blosc2.Codec.BLOSCLZ]
FILTERS = [blosc2.Filter.SHUFFLE, blosc2.Filter.BITSHUFFLE]
KEYS: list[Any] = [
    (1,),
    (-1,),
    (slice(1, 9), 3),
    (Ellipsis, 2),
    (slice(0, 11, 3), slice(1, 14, 4), slice(None)),
    (4, slice(2, 13), -2),
    (slice(5, 11), slice(7, 14), slice(3, 9)),
]
PATCH = (3, 5, 4)
STARTS = [[0, 0, 0], [2, 3, 3], [8, 9, 5], [5, 6, 0], [3, 4, 4], [7, 0, 5]]


#: The default of the rule reading small blocks as part of their whole chunk.
DEFAULT_MIN_BLOCK_BYTES = b2nd_blocks.MIN_BLOCK_BYTES


@pytest.fixture(autouse=True)
def small_blocks_read_alone(monkeypatch):
    """Blocks of the small test arrays are read alone, as large blocks are by default.

    The arrays here are small, so their blocks are far under ``MIN_BLOCK_BYTES``; the tests
    of the default rule set it back.
    """
    monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", 0)


def _values(dtype: str, shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return np.round(rng.standard_normal(shape) * 10, 2).astype(dt)  # compressible


def _write(
    path: Path,
    data: np.ndarray,
    layout: str = "tiled",
    codec: Any = blosc2.Codec.ZSTD,
    filt: Any = blosc2.Filter.SHUFFLE,
) -> Path:
    chunks, blocks = LAYOUTS[layout]
    cparams = {"codec": codec, "clevel": 5, "filters": [filt]}
    blosc2.asarray(data, chunks=chunks, blocks=blocks, urlpath=str(path), mode="w", cparams=cparams)
    return path


def _box(corner: Any, size: Any) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(corner, size))


def assert_every_path_is_blosc2(path: Path) -> None:
    """Every read path of ``read_b2nd(path)`` gives blosc2's own read of ``path``."""
    ref = blosc2.open(str(path), mode="r")
    want = ref[...]
    with assert_unchanged(path):
        src = read_b2nd(path)
        assert src.dtype == want.dtype and src.shape == want.shape
        np.testing.assert_array_equal(src[...], want)
        for key in KEYS:
            np.testing.assert_array_equal(src[key], ref[key], err_msg=f"key={key!r}")
        np.testing.assert_array_equal(src[::-2, 1::3, ::-1], want[::-2, 1::3, ::-1])
        boxes = src.read_boxes(STARTS, PATCH)
        for got, corner in zip(boxes, STARTS):
            np.testing.assert_array_equal(got, want[_box(corner, PATCH)], err_msg=f"{corner}")
        np.testing.assert_array_equal(src.read_box([1, 2, 3], [10, 12, 6]), want[1:11, 2:14, 3:9])
        rows = np.array([10, 0, 3, 3, -1, 2])
        np.testing.assert_array_equal(src.get_batch(rows), want[rows])
        for got_row, want_row in zip(src.records(), want):
            np.testing.assert_array_equal(got_row, want_row)
        sampler = PatchSampler(src, PATCH, num_patches=16, seed=3)
        patches, corners = sampler.get_batch(np.arange(16))
        for patch, corner in zip(patches, corners):
            np.testing.assert_array_equal(patch, want[_box(corner, PATCH)], err_msg=f"{corner}")
        check_array_source(src, want)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_read_path_equals_blosc2(tmp_path, dtype, layout):
    data = _values(dtype)
    path = _write(tmp_path / "a.b2nd", data, layout)
    assert blosc2.open(str(path))[...].dtype == np.dtype(dtype)  # big-endian stays so
    assert_every_path_is_blosc2(path)


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: f.name)
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("layout", ["tiled", "untiled"])
def test_codecs_and_filters_equal_blosc2(tmp_path, codec, filt, layout):
    path = _write(tmp_path / "a.b2nd", _values(">i4"), layout, codec, filt)
    assert blosc2.open(str(path)).cparams.codec == codec
    assert_every_path_is_blosc2(path)


@pytest.mark.parametrize(
    ("shape", "chunks", "blocks"),
    [
        ((1, 1), (1, 1), (1, 1)),
        ((37, 3), (10, 3), (5, 1)),
        ((3, 1, 2, 5), (2, 1, 2, 3), (1, 1, 1, 3)),
    ],
)
def test_odd_shapes(tmp_path, shape, chunks, blocks):
    data = _values("<f8", shape, seed=1)
    path = tmp_path / "odd.b2nd"
    blosc2.asarray(data, chunks=chunks, blocks=blocks, urlpath=str(path), mode="w")
    with assert_unchanged(path):
        check_array_source(read_b2nd(path), blosc2.open(str(path))[...])


@pytest.mark.parametrize("dtype", ["<U3", [("a", "<i4"), ("b", ">f8")]], ids=["str", "struct"])
def test_string_and_structured_dtypes(tmp_path, dtype):
    data = np.zeros((6, 4), dtype=dtype)
    if data.dtype.names:
        data["a"] = np.arange(24).reshape(6, 4)
        data["b"] = np.linspace(0, 1, 24).reshape(6, 4)
    else:
        data[...] = np.array(["ab", "cde", "f", ""])
    path = tmp_path / "s.b2nd"
    blosc2.asarray(data, chunks=(2, 4), blocks=(1, 2), urlpath=str(path), mode="w")
    check_array_source(read_b2nd(path), blosc2.open(str(path))[...])


@pytest.mark.parametrize("make", ["zeros", "full"])
def test_special_chunks_read_as_blosc2_reads_them(tmp_path, make):
    path = tmp_path / "sp.b2nd"
    extra = {"fill_value": 7} if make == "full" else {}
    array = getattr(blosc2, make)(
        (10, 12, 8), dtype="<f4", chunks=(5, 6, 4), blocks=(5, 3, 2), urlpath=str(path), **extra
    )
    array[0:3, 1:4, 2:5] = np.arange(27, dtype="<f4").reshape(3, 3, 3)
    del array
    ref = blosc2.open(str(path))
    assert any(c.special for c in ref.schunk.iterchunks_info())  # chunks stored as one value
    assert_every_path_is_blosc2_small(path, ref[...])


def assert_every_path_is_blosc2_small(path: Path, want: np.ndarray) -> None:
    """The conformance suite and a PatchSampler batch against blosc2's read ``want``."""
    src = read_b2nd(path)
    sampler = PatchSampler(src, (2, 3, 4), num_patches=8, seed=1)
    patches, corners = sampler.get_batch(np.arange(8))
    for patch, corner in zip(patches, corners):
        np.testing.assert_array_equal(patch, want[_box(corner, (2, 3, 4))])
    check_array_source(src, want)


def test_reading_leaves_the_folder_unchanged(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = _write(folder / "a.b2nd", _values("<f4"))
    with assert_unchanged(folder):  # no lock or cache files beside it either
        src = read_b2nd(path)
        src.read_boxes(STARTS, PATCH)
        src.close()
    assert sorted(p.name for p in folder.iterdir()) == ["a.b2nd"]


def test_zero_d_and_empty_arrays(tmp_path):
    blosc2.asarray(np.array(3.5), urlpath=str(tmp_path / "z.b2nd"), mode="w")
    blosc2.asarray(np.zeros((0, 4), "<i2"), urlpath=str(tmp_path / "e.b2nd"), mode="w")
    zero = read_b2nd(tmp_path / "z.b2nd")
    assert zero.shape == () and zero[()] == blosc2.open(str(tmp_path / "z.b2nd"))[()]
    check_array_source(zero, np.asarray(blosc2.open(str(tmp_path / "z.b2nd"))[()]))
    check_array_source(read_b2nd(tmp_path / "e.b2nd"), blosc2.open(str(tmp_path / "e.b2nd"))[...])


def test_blocks_are_the_planner_unit_when_they_tile_the_chunks(tmp_path):
    data = _values("<f4", (16, 16, 16))
    path = tmp_path / "v.b2nd"
    blosc2.asarray(data, chunks=(8, 8, 8), blocks=(4, 4, 4), urlpath=str(path), mode="w")
    src = read_b2nd(path)
    assert src.chunks == (8, 8, 8) and src.blocks == (4, 4, 4)
    reader = src._reader_for(src.array)
    assert reader is not None and reader.chunks == (4, 4, 4)
    out = np.empty((1, 3, 3, 3), "<f4")
    # a patch inside one block decodes that block only, not its 8^3 chunk
    plan = read_chunked(reader, [[9, 1, 4]], (3, 3, 3), src.shape, out, cache=ChunkCache())
    assert plan.chunks == [(2, 0, 1)]
    np.testing.assert_array_equal(out[0], data[9:12, 1:4, 4:7])
    plan = read_chunked(reader, [[3, 3, 3]], (2, 2, 2), src.shape, out[:, :2, :2, :2])
    assert len(plan.chunks) == 8  # straddles a corner of 8 blocks (of one chunk)


def test_a_reader_outliving_its_source_still_reads(tmp_path):
    data = _values("<f4")
    path = _write(tmp_path / "a.b2nd", data)
    src = read_b2nd(path)
    reader = src._reader_for(src.array)
    assert reader is not None
    src.close()
    del src
    gc.collect()  # the blosc2 array the reader decodes from must stay alive with it
    np.testing.assert_array_equal(reader.read_chunk((0, 0, 0)), data[:3, :4, :2])


def test_whole_chunks_when_blocks_do_not_tile(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"), "untiled")
    src = read_b2nd(path)
    reader = src._reader_for(src.array)
    assert reader is not None and reader.chunks == LAYOUTS["untiled"][0]
    assert not blocks_tile_chunks((6, 7, 5), (4, 3, 2))
    assert blocks_tile_chunks((6, 8, 4), (3, 4, 2))


def test_from_block_order_rearranges_a_chunk():
    chunks, blocks = (5, 7), (2, 3)
    want = np.arange(35.0).reshape(chunks)
    grid = (3, 3)
    raw = np.zeros((*grid, *blocks))
    for g in np.ndindex(*grid):
        part = want[g[0] * 2 : g[0] * 2 + 2, g[1] * 3 : g[1] * 3 + 3]
        raw[g][: part.shape[0], : part.shape[1]] = part
    np.testing.assert_array_equal(from_block_order(raw.ravel(), chunks, blocks), want)


def test_reads_from_many_threads_equal_blosc2(tmp_path):
    data = _values("<i4", (24, 20, 18))
    path = tmp_path / "t.b2nd"
    blosc2.asarray(data, chunks=(12, 10, 9), blocks=(4, 5, 3), urlpath=str(path), mode="w")
    src = read_b2nd(path)
    rng = np.random.default_rng(5)
    starts = [rng.integers(0, [24 - 5, 20 - 6, 18 - 7], size=(8, 3)) for _ in range(8)]
    got: list[Any] = [None] * 8
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            fresh = ChunkCache()  # every thread decodes its own blocks at the same time
            reader = src._reader_for(src.array)
            out = np.empty((8, 5, 6, 7), "<i4")
            read_chunked(reader, starts[k].tolist(), (5, 6, 7), src.shape, out, cache=fresh)
            got[k] = out
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = blosc2.open(str(path))[...]
    for k in range(8):
        for box, corner in zip(got[k], starts[k]):
            np.testing.assert_array_equal(box, want[_box(corner, (5, 6, 7))])


def test_pickles_by_reference_and_reopens_lazily(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    src = read_b2nd(path)
    blob = pickle.dumps(src)
    assert len(blob) < 600
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone)
    np.testing.assert_array_equal(clone[2:5], blosc2.open(str(path))[2:5])


def test_reads_after_fork_reopen_the_file(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    src = read_b2nd(path)
    want = blosc2.open(str(path))[...]
    parent_handle = src.array
    np.testing.assert_array_equal(src[1], want[1])

    def child() -> list[str]:
        problems = []
        if not np.array_equal(src.read_boxes(STARTS, PATCH)[2], want[_box(STARTS[2], PATCH)]):
            problems.append("the child read other values")
        if src.array is parent_handle:
            problems.append("the child kept the parent's blosc2 handle")
        return problems

    assert in_forked_child(child) == []
    np.testing.assert_array_equal(src[...], want)


def test_reads_in_a_forked_child_after_the_parent_decoded_whole_chunks(tmp_path):
    # blosc2's decoding threads do not survive fork: a child decoding a whole chunk through
    # them waited forever (in_forked_child's alarm ends such a child: "no answer")
    path = _write(tmp_path / "a.b2nd", _values("<i4"), "untiled")
    threads = blosc2.nthreads
    src = read_b2nd(path)
    want = blosc2.open(str(path))[...]
    assert not src._reader_for(src.array).by_block  # the decompress_chunk path
    np.testing.assert_array_equal(src[...], want)
    own = blosc2.open(str(path), mode="r")  # the user's own blosc2 reads, on its threads
    own.schunk.decompress_chunk(0)

    def child() -> list[str]:
        if not np.array_equal(src[...], want):
            return ["the child read other values"]
        return []

    assert in_forked_child(child) == []
    assert blosc2.nthreads == threads  # the user's blosc2 settings are left alone


def _filter_values(filt: Any, dtype: str) -> tuple[np.ndarray, int]:
    """Data for ``filt`` (a ramp, so DELTA's deltas are small) and its ``filters_meta``."""
    data = (np.arange(40 * 100).reshape(40, 100) % 97).astype(dtype)
    if np.dtype(dtype).kind == "f":
        data = data + np.linspace(0, 1, data.size, dtype=dtype).reshape(data.shape)
    meta = {"TRUNC_PREC": 10, "INT_TRUNC": 2, "NDCELL": 4, "NDMEAN": 4}.get(filt.name, 0)
    return data, meta


@pytest.mark.parametrize("dtype", ["<i8", "<f4", ">i2", "<u1"])
@pytest.mark.parametrize("filt", list(blosc2.Filter), ids=lambda f: f.name)
def test_every_blosc2_filter_reads_as_blosc2_reads_it(tmp_path, filt, dtype):
    # DELTA stores blocks as differences from block 0 of their chunk: read alone, as
    # get_slice did, a block decoded wrong values
    data, meta = _filter_values(filt, dtype)
    path = tmp_path / "f.b2nd"
    cparams = {"filters": [filt, blosc2.Filter.SHUFFLE], "filters_meta": [meta, 0]}
    try:
        blosc2.asarray(
            data, chunks=(20, 50), blocks=(10, 25), urlpath=str(path), mode="w", cparams=cparams
        )
    except RuntimeError:  # a filter this dtype does not take (TRUNC_PREC on integers)
        assert filt.name in {"TRUNC_PREC", "NDMEAN"}
        return
    ref = blosc2.open(str(path), mode="r")
    want = ref[...]
    src = read_b2nd(path)
    np.testing.assert_array_equal(src[...], want)
    np.testing.assert_array_equal(src[12, 30], want[12, 30])
    starts = [[0, 0], [12, 30], [27, 61], [35, 90]]
    for got, corner in zip(src.read_boxes(starts, (5, 10)), starts):
        np.testing.assert_array_equal(got, want[_box(corner, (5, 10))])
    if blosc2.Filter.DELTA in ref.schunk.cparams.filters:
        assert not reads_by_block(ref) and src.chunks == (20, 50)


def test_reads_by_block_needs_the_dtypes_item_size(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<i4"))
    array = blosc2.open(str(path), mode="r")
    assert reads_by_block(array)

    class OtherTypesize:  # a frame storing items of another size than the dtype's
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.schunk = type("S", (), {"typesize": 1, "cparams": inner.schunk.cparams})()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    odd = OtherTypesize(array)
    assert not reads_by_block(odd)
    assert not B2ndChunkReader(odd, "x").by_block


def test_inspect_b2nd_says_block_reads_only_where_the_reader_reads_blocks(tmp_path):
    path = tmp_path / "d.b2nd"
    cparams = {"filters": [blosc2.Filter.DELTA]}
    data = np.arange(16 * 16, dtype="<i4").reshape(16, 16)
    blosc2.asarray(data, chunks=(8, 8), blocks=(4, 4), urlpath=str(path), mode="w", cparams=cparams)
    report = inspect_b2nd(str(path), None, None)
    src = read_b2nd(path)
    assert src.chunks == (8, 8) and report.chunks == (8, 8) and report.shards is None
    codes = {f.code: f for f in report.findings}
    assert "block-reads" not in codes
    assert "DELTA" in codes["whole-chunk-reads"].message


def test_a_sparse_blosc2_folder_is_refused_by_name(tmp_path):
    folder = tmp_path / "sparse.b2nd"
    blosc2.asarray(np.arange(20).reshape(4, 5), urlpath=str(folder), mode="w", contiguous=False)
    assert folder.is_dir()
    with pytest.raises(ValueError, match=r"sparse blosc2 frame folder.*contiguous \.b2nd files"):
        read_b2nd(folder)


def _corrupt_copy(src: Path, dst: Path, nchunk: int, where: str) -> None:
    """Copy ``src`` to ``dst`` with the header or block offsets of chunk ``nchunk`` flipped."""
    array = blosc2.open(str(src))  # kept: its super-chunk dies with it
    chunk = array.schunk.get_chunk(nchunk)
    data = bytearray(src.read_bytes())
    at = bytes(data).find(chunk)
    assert at >= 0
    assert not chunk[2] & 0x2  # compressed (not stored as is): block offsets follow the header
    lo, hi = (at + 4, at + 12) if where == "header" else (at + 32, at + 48)
    data[lo:hi] = bytes(b ^ 0xFF for b in data[lo:hi])
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["header", "block offsets"])
@pytest.mark.parametrize("layout", ["tiled", "untiled"])
def test_a_corrupt_chunk_raises_naming_the_file_and_chunk(tmp_path, layout, where):
    data = (np.arange(np.prod(SHAPE)) // 5 % 4).astype("<u2").reshape(SHAPE)  # compressible
    good = _write(tmp_path / "good.b2nd", data, layout)
    bad = tmp_path / "bad.b2nd"
    _corrupt_copy(good, bad, 3, where)
    chunks = LAYOUTS[layout][0]
    coords = np.unravel_index(3, [-(-s // c) for s, c in zip(SHAPE, chunks)])
    corner = [int(c) * n for c, n in zip(coords, chunks)]
    with assert_unchanged(bad):
        src = read_b2nd(bad)
        for read in (lambda: src[...], lambda: src.read_boxes([corner], (2, 2, 2))):
            with pytest.raises(CorruptChunkError, match=r"bad\.b2nd") as info:
                read()
            assert f"chunk {tuple(int(c) for c in coords)}" in str(info.value)
        np.testing.assert_array_equal(src[0:6, 0:7, 0:4], data[0:6, 0:7, 0:4])  # chunk 0


def test_a_file_cut_short_after_opening_raises_instead_of_crashing(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    copy = tmp_path / "b.b2nd"
    shutil.copy(path, copy)
    src = read_b2nd(copy)
    np.testing.assert_array_equal(src[0], blosc2.open(str(path))[0])
    os.truncate(copy, 100)
    with pytest.raises(FileChangedError, match="changed size from"):
        src.read_boxes([[5, 5, 5]], (2, 2, 2))


@pytest.mark.parametrize("grow", [0, 4096], ids=["same-size", "larger"])
def test_a_file_rewritten_in_place_raises_and_drops_its_cached_chunks(tmp_path, grow):
    # ``cp new.b2nd old.b2nd``: same inode, same (or larger) size; without the full file
    # signature, cached chunks came from the old file and the others decoded the new bytes
    # with the old frame's metadata
    kw: dict[str, Any] = {"chunks": (32, 64), "blocks": (32, 64), "cparams": {"clevel": 0}}
    path, fresh = tmp_path / "old.b2nd", tmp_path / "new.b2nd"
    blosc2.asarray(np.zeros((64, 64), "<f4"), urlpath=str(path), mode="w", **kw)
    blosc2.asarray(np.ones((64, 64), "<f4"), urlpath=str(fresh), mode="w", **kw)
    os.utime(path, ns=(10**18, 10**18))  # an old modification time, as a copy would not keep
    inode = os.stat(path).st_ino
    src = read_b2nd(path)
    np.testing.assert_array_equal(src[:32], np.zeros((32, 64), "<f4"))  # chunk 0 cached
    with open(path, "r+b") as f:  # in place, as cp writes it
        f.write(fresh.read_bytes() + b"\0" * grow)
    assert os.stat(path).st_ino == inode
    with pytest.raises(FileChangedError, match=r"old\.b2nd.* after it was opened"):
        src[...]
    with pytest.raises(FileChangedError):
        src.read_boxes([[0, 0]], (2, 2))  # the cached chunk is not served either
    np.testing.assert_array_equal(read_b2nd(path)[...], blosc2.open(str(path))[...])


def test_bad_paths_and_files(tmp_path):
    with pytest.raises(TypeError, match="path=3"):
        read_b2nd(3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_b2nd(tmp_path / "missing.b2nd")
    junk = tmp_path / "junk.b2nd"
    junk.write_bytes(b"not a blosc2 frame" * 20)
    with pytest.raises(ValueError, match="not a blosc2 file"):
        read_b2nd(junk)
    frame = tmp_path / "plain.b2frame"
    blosc2.SChunk(chunksize=40, data=b"x" * 100, urlpath=str(frame), mode="w")
    with pytest.raises(ValueError, match="holds a blosc2 SChunk, not an N-D array"):
        read_b2nd(frame)
    with pytest.raises(OSError, match="directory"):
        read_b2nd(tmp_path)


def test_without_blosc2_the_error_names_the_extra(tmp_path, monkeypatch):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    pickled = pickle.dumps(read_b2nd(path))
    monkeypatch.setitem(sys.modules, "blosc2", None)
    clone = pickle.loads(pickled)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[blosc2\]"'):
        _ = clone.shape


def test_without_blosc2_a_source_builds_and_says_why_it_cannot_open(tmp_path, monkeypatch):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    monkeypatch.setitem(sys.modules, "blosc2", None)
    monkeypatch.setattr(optional_deps, "HAS_BLOSC2", False)
    src = read_b2nd(path)  # no I/O: a process without blosc2 can hand it to workers
    assert "blosc2 is not installed here" in repr(src)
    with pytest.raises(ImportError, match=r'read_b2nd needs blosc2.*pip install -e "\.\[blosc2\]"'):
        src[0]


def test_source_class_is_exported():
    assert read_b2nd.__module__ == B2ndArraySource.__module__


# -- mixle inspect ---------------------------------------------------------------------------


def test_is_b2nd_finds_b2nd_arrays_only(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    assert is_b2nd(str(path))
    frame = tmp_path / "plain.b2frame"
    blosc2.SChunk(chunksize=40, data=b"x" * 100, urlpath=str(frame), mode="w")
    np.save(tmp_path / "x.npy", np.zeros(3))
    for other in (frame, tmp_path / "x.npy", tmp_path / "missing.b2nd", tmp_path):
        assert not is_b2nd(str(other)), other
    assert not is_b2nd("s3://bucket/a.b2nd")


def test_inspect_b2nd_reports_blocks_chunks_and_codecs(tmp_path):
    data = _values("<f4", (16, 16, 16))
    path = tmp_path / "v.b2nd"
    cparams = {"codec": blosc2.Codec.LZ4, "clevel": 3, "filters": [blosc2.Filter.BITSHUFFLE]}
    blosc2.asarray(
        data, chunks=(8, 8, 8), blocks=(4, 4, 4), urlpath=str(path), mode="w", cparams=cparams
    )
    with assert_unchanged(path):
        report = inspect_b2nd(str(path), None, (4, 4, 4))
    ref = blosc2.open(str(path))
    assert report.format == "b2nd" and report.shape == (16, 16, 16) and report.dtype == "float32"
    assert report.chunks == (4, 4, 4) and report.shards == (
        8,
        8,
        8,
    )  # decoded blocks, stored chunks
    assert report.codecs == ("bitshuffle", "lz4(clevel=3)") and report.compressed
    assert report.stored_bytes == ref.schunk.cbytes and report.nbytes == data.nbytes
    assert report.chunks_in_grid == 64 and report.shards_stored == 8
    codes = [f.code for f in report.findings]
    assert "block-reads" in codes and "no-checksum" in codes
    assert report.patch_cost is not None and report.patch_cost.patch == (4, 4, 4)
    assert report.to_dict()["format"] == "b2nd"


def test_inspect_b2nd_warns_when_blocks_do_not_tile_the_chunks(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"), "untiled")
    report = inspect_b2nd(str(path), None, None)
    assert report.chunks == LAYOUTS["untiled"][0] and report.shards is None
    untiled = [f for f in report.findings if f.code == "blocks-untiled"]
    assert untiled and untiled[0].severity == "warning" and "multiple" in untiled[0].message


def test_inspect_b2nd_refuses_what_is_not_a_b2nd_array(tmp_path):
    junk = tmp_path / "junk.b2nd"
    junk.write_bytes(b"junk" * 50)
    with pytest.raises(UnsupportedStoreError, match="not a file blosc2 opens"):
        inspect_b2nd(str(junk), None, None)
    with pytest.raises(UnsupportedStoreError, match=r"local \.b2nd files only"):
        inspect_b2nd("s3://bucket/a.b2nd", None, None)


# -- whole chunks or blocks; the file checked once per read call -----------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_small_blocks_of_small_chunks_are_read_as_whole_chunks_equal_to_blosc2(
    tmp_path, monkeypatch, layout
):
    monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", DEFAULT_MIN_BLOCK_BYTES)
    path = _write(tmp_path / "a.b2nd", _values("<f4", seed=4), layout)
    src = read_b2nd(path)
    reader = src._reader_for(src.array)
    assert reader is not None and not reader.by_block and reader.chunks == src.chunks
    assert_every_path_is_blosc2(path)


def test_blocks_are_read_alone_when_large_or_their_chunk_is(tmp_path, monkeypatch):
    monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", DEFAULT_MIN_BLOCK_BYTES)
    data = _values("<f4", (16, 16, 64), seed=5)
    path = tmp_path / "a.b2nd"  # one 64 KiB chunk of two 32 KiB blocks
    blosc2.asarray(data, chunks=(16, 16, 64), blocks=(8, 16, 64), urlpath=str(path), mode="w")
    array = blosc2.open(str(path))
    want = array[...]
    assert not reads_by_block(array)  # small blocks of a small chunk: the chunk whole
    monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", 32 * 1024)
    assert reads_by_block(array)  # blocks as large as the minimum
    monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", DEFAULT_MIN_BLOCK_BYTES)
    monkeypatch.setattr(b2nd_blocks, "WHOLE_CHUNK_BYTES", 32 * 1024)
    assert reads_by_block(array)  # a chunk over the whole-chunk size: by block
    src = read_b2nd(path)
    assert src._reader_for(src.array).chunks == (8, 16, 64)
    np.testing.assert_array_equal(src[...], want)
    boxes = src.read_boxes([[5, 3, 7], [0, 7, 40]], (6, 9, 20))
    np.testing.assert_array_equal(boxes[0], want[5:11, 3:12, 7:27])
    np.testing.assert_array_equal(boxes[1], want[0:6, 7:16, 40:60])


def _count_checks(monkeypatch) -> list[int]:
    """The inodes of the files checked (one ``check_file_unchanged`` per check), in order."""
    calls: list[int] = []
    real = b2nd_source.check_file_unchanged

    def counted(path: str, *args: Any, **kwargs: Any) -> None:
        calls.append(os.stat(path).st_ino)
        real(path, *args, **kwargs)

    monkeypatch.setattr(b2nd_source, "check_file_unchanged", counted)
    return calls


@pytest.mark.parametrize("unit", ["blocks", "chunks"])
def test_the_mapped_file_is_checked_once_per_read_call(tmp_path, monkeypatch, unit):
    if unit == "chunks":
        monkeypatch.setattr(b2nd_blocks, "MIN_BLOCK_BYTES", DEFAULT_MIN_BLOCK_BYTES)
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    want = blosc2.open(str(path))[...]
    src = read_b2nd(path)
    assert src._reader_for(src.array).by_block == (unit == "blocks")
    calls = _count_checks(monkeypatch)
    np.testing.assert_array_equal(src[...], want)  # every block or chunk of the array
    assert calls == [os.stat(path).st_ino]
    boxes = src.read_boxes(STARTS, PATCH)
    assert len(calls) == 2
    for got, corner in zip(boxes, STARTS):
        np.testing.assert_array_equal(got, want[_box(corner, PATCH)])
    np.testing.assert_array_equal(src.get_batch([3, 0, 3]), want[[3, 0, 3]])
    assert len(calls) == 3


def test_a_file_replaced_after_its_chunks_are_cached_raises_on_the_next_read(tmp_path):
    path = _write(tmp_path / "a.b2nd", _values("<f4"))
    src = read_b2nd(path)
    first = src[...]  # every block decoded and cached
    np.testing.assert_array_equal(first, blosc2.open(str(path))[...])
    other = _write(tmp_path / "b.b2nd", _values("<f4", seed=9))
    os.replace(other, path)
    with pytest.raises(FileChangedError):
        src.read_boxes([[0, 0, 0]], (2, 2, 2))  # the cached blocks are not served
    with pytest.raises(FileChangedError):
        src[0]
