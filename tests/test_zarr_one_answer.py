"""One zarr source, one answer: every read path agrees with zarr-python's own read.

``src[...]``, ``src[key]``, ``read_boxes``, ``get_batch``, ``records`` and
``PatchSampler.get_batch`` go through the same chunk readers, so they agree on values, on
chunks never written (the fill value), on corrupt chunks and on directories where a chunk
should be (both :class:`~mixle.reading.CorruptChunkError` naming the array and chunk), and
on chunks stored as several zstd frames (decoded as numcodecs decodes them).
"""

from __future__ import annotations

import math
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.codecs import numcodecs as zarr_numcodecs

import mixle
from mixle.data.sources.arrays.zarr.readers import zarr_chunk_reader
from mixle.data.sources.indexing import parse_key
from mixle.data.sources.key_plan import plan_key, read_extent
from mixle.reading import CorruptChunkError, chunk_cache, set_chunk_cache_bytes

SHAPE = (12, 10, 7)
CHUNKS = (4, 5, 4)
SHARDS = (8, 10, 8)
FILL = -7
_NOT_IN_SPEC = "Numcodecs codecs are not in the Zarr version 3 specification"


def _numcodecs_v3(codec: type, **config: Any) -> Any:
    """A numcodecs codec for format 3 (zarr warns that it is not in the v3 spec)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NOT_IN_SPEC)
        return codec(**config)


# zarr warns on opening an array whose codecs come from numcodecs (the fallback layouts)
pytestmark = pytest.mark.filterwarnings(f"ignore:{_NOT_IN_SPEC}")


#: name -> (create_array options, the chunk reader mixle picks for it)
LAYOUTS: dict[str, tuple[dict[str, Any], str]] = {
    "v2 raw": ({"zarr_format": 2, "compressors": None}, "ZarrCodecReader"),
    "v2 zstd": ({"zarr_format": 2, "compressors": numcodecs.Zstd(level=1)}, "ZarrCodecReader"),
    "v2 blosc shuffle": (
        {"zarr_format": 2, "compressors": numcodecs.Blosc(cname="lz4", shuffle=1)},
        "ZarrCodecReader",
    ),
    "v2 delta zlib": (
        {
            "zarr_format": 2,
            "filters": [numcodecs.Delta(dtype="int32")],
            "compressors": numcodecs.Zlib(),
        },
        "ZarrCodecReader",
    ),
    "v2 shuffle zstd": (
        {
            "zarr_format": 2,
            "filters": [numcodecs.Shuffle(elementsize=4)],
            "compressors": numcodecs.Zstd(),
        },
        "ZarrCodecReader",
    ),
    "v2 order F": ({"zarr_format": 2, "order": "F"}, "ZarrCodecReader"),
    "v3 raw": ({"compressors": None}, "ZarrCodecReader"),
    "v3 zstd": ({"compressors": ZstdCodec(level=1)}, "ZarrCodecReader"),
    "v3 gzip": ({"compressors": GzipCodec()}, "ZarrCodecReader"),
    "v3 blosc": ({"compressors": BloscCodec(cname="lz4", shuffle="shuffle")}, "ZarrCodecReader"),
    "v3 zstd crc32c": ({"compressors": [ZstdCodec(), Crc32cCodec()]}, "ZarrCodecReader"),
    "v3 delta": (
        {
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32")],
            "compressors": ZstdCodec(),
        },
        "ZarrCodecReader",
    ),
    "v3 shuffle": (
        {"compressors": [_numcodecs_v3(zarr_numcodecs.Shuffle, elementsize=4), ZstdCodec()]},
        "ZarrCodecReader",
    ),
    "v3 bz2": ({"compressors": _numcodecs_v3(zarr_numcodecs.BZ2)}, "ZarrCodecReader"),
    "v3 transpose": (
        {"filters": [TransposeCodec(order=(2, 0, 1))], "compressors": ZstdCodec()},
        "ZarrCodecReader",
    ),
    "v3 delta astype": (
        {
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32", astype="int16")],
            "compressors": ZstdCodec(),
        },
        "ZarrCodecReader",
    ),
    "v3 sharded raw": ({"shards": SHARDS, "compressors": None}, "ShardedZarrReader"),
    "v3 sharded zstd": ({"shards": SHARDS, "compressors": ZstdCodec()}, "ShardedZarrReader"),
    "v3 sharded transpose": (
        {"shards": SHARDS, "filters": [TransposeCodec(order=(1, 0, 2))]},
        "ShardedZarrReader",
    ),
    "v3 sharded delta astype": (
        {
            "shards": SHARDS,
            "filters": [_numcodecs_v3(zarr_numcodecs.Delta, dtype="int32", astype="int16")],
        },
        "ShardedZarrReader",
    ),
}
ZSTD_LAYOUTS = ["v2 zstd", "v2 shuffle zstd", "v3 zstd", "v3 zstd crc32c", "v3 sharded zstd"]


def _data() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 1000, SHAPE).astype(np.int32)


def _write(path: Path, layout: str, *, partial: bool) -> np.ndarray:
    """Write the array; ``partial`` leaves chunks (and a whole shard) never written.

    Returns zarr-python's own read of the whole array.
    """
    options, _ = LAYOUTS[layout]
    array = zarr.create_array(
        str(path), shape=SHAPE, chunks=CHUNKS, dtype="int32", fill_value=FILL, **options
    )
    data = _data()
    if partial:
        array[:4] = data[:4]
        array[4:8, :5] = data[4:8, :5]  # chunks (1, 1, *) and rows 8.. never written
    else:
        array[...] = data
    return np.asarray(zarr.open_array(str(path), mode="r")[...])


class _Written(dict):
    """Written layouts, shown briefly when hypothesis reports an example."""

    def __repr__(self) -> str:
        return f"<{len(self)} written layouts>"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """Every layout written once, partly: ``name -> (path, zarr's read)``."""
    root = tmp_path_factory.mktemp("layouts")
    out = _Written()
    for k, name in enumerate(LAYOUTS):
        path = root / f"a{k}.zarr"
        out[name] = (path, _write(path, name, partial=True))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_uses_the_reader_it_claims(written, layout):
    path, expected = written[layout]
    assert (
        type(zarr_chunk_reader(zarr.open_array(str(path), mode="r"))).__name__
        == (LAYOUTS[layout][1])
    )
    assert (expected == FILL).any() and (expected != FILL).any()  # holds unwritten chunks


# -- keys, boxes and patches agree with zarr's read -------------------------------------------


def _item(dim: int) -> st.SearchStrategy[Any]:
    bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
    step = st.one_of(st.none(), st.integers(-6, -1), st.integers(1, 6))
    slices = st.builds(slice, bound, bound, step)
    return st.one_of(st.integers(-dim, dim - 1), slices) if dim else slices


@st.composite
def keys(draw: st.DrawFn, shape: tuple[int, ...] = SHAPE) -> Any:
    """A basic key for ``shape``: in-range ints, any slices, maybe one ``...``."""
    count = draw(st.integers(0, len(shape)))
    if not draw(st.booleans()):
        items = [draw(_item(d)) for d in shape[:count]]
    else:  # the ellipsis stands for the axes between the leading and the trailing items
        lead = draw(st.integers(0, count))
        axes = [*range(lead), *range(len(shape) - (count - lead), len(shape))]
        items = [draw(_item(shape[a])) for a in axes]
        items.insert(lead, Ellipsis)
    return items[0] if len(items) == 1 and draw(st.booleans()) else tuple(items)


def _same(got: Any, expected: Any) -> None:
    """Same values, dtype, and scalar-ness (a NumPy scalar or an ndarray) as NumPy gives."""
    assert isinstance(got, np.ndarray) == isinstance(expected, np.ndarray)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(list(LAYOUTS)), key=keys())
def test_getitem_equals_zarr(written, layout, key):
    path, expected = written[layout]
    chunk_cache().clear()
    _same(mixle.read_zarr(path)[key], expected[key])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(list(LAYOUTS)), data=st.data())
def test_boxes_rows_and_patches_equal_zarr(written, layout, data):
    path, expected = written[layout]
    size = tuple(data.draw(st.integers(1, d)) for d in SHAPE)
    starts = [
        [data.draw(st.integers(0, d - n)) for d, n in zip(SHAPE, size)]
        for _ in range(data.draw(st.integers(1, 5)))
    ]
    rows = data.draw(st.lists(st.integers(-SHAPE[0], SHAPE[0] - 1), min_size=1, max_size=6))
    src = mixle.read_zarr(path)
    chunk_cache().clear()
    boxes = src.read_boxes(starts, size)
    for box, start in zip(boxes, starts):
        np.testing.assert_array_equal(box, expected[tuple(map(slice, start, np.add(start, size)))])
    chunk_cache().clear()
    np.testing.assert_array_equal(src.get_batch(rows), expected[rows])
    chunk_cache().clear()
    patches, corners = mixle.PatchSampler(src, size, 4, seed=len(rows)).get_batch(range(4))
    for patch, corner in zip(patches, corners.tolist()):
        np.testing.assert_array_equal(
            patch, expected[tuple(map(slice, corner, np.add(corner, size)))]
        )


def test_records_equal_zarr(written):
    for path, expected in written.values():
        chunk_cache().clear()
        np.testing.assert_array_equal(np.stack(list(mixle.read_zarr(path))), expected)


# -- corrupt chunks and directories: the same error on every path ----------------------------

#: name -> (a read, what it reads from the whole array zarr read)
PATHS: dict[str, tuple[Callable[[mixle.ZarrArraySource], Any], Callable[[np.ndarray], Any]]] = {
    "src[...]": (lambda s: s[...], lambda e: e),
    "src[int key]": (lambda s: s[0, 0], lambda e: e[0, 0]),
    "src[strided key]": (lambda s: s[::3, ::-4, 1], lambda e: e[::3, ::-4, 1]),
    "read_box": (lambda s: s.read_box((0, 0, 0), (2, 2, 2)), lambda e: e[:2, :2, :2]),
    "read_boxes": (
        lambda s: s.read_boxes([[0, 0, 0], [1, 1, 1]], (3, 3, 3)),
        lambda e: np.stack([e[:3, :3, :3], e[1:4, 1:4, 1:4]]),
    ),
    "get_batch": (lambda s: s.get_batch([2, 0]), lambda e: e[[2, 0]]),
    "records": (lambda s: next(iter(s)), lambda e: e[0]),
    "PatchSampler.get_batch": (
        lambda s: mixle.PatchSampler(s, SHAPE, 1).get_batch([0])[0],
        lambda e: e[np.newaxis],
    ),
}


def _first_object(path: Path, layout: str) -> tuple[Path, str]:
    """The stored object of chunk (0, 0, 0) (its shard, if sharded) and how errors name it."""
    if LAYOUTS[layout][0].get("zarr_format") == 2:
        return path / "0.0.0", "chunk '0.0.0'"
    if "shards" in LAYOUTS[layout][0]:
        return path / "c" / "0" / "0" / "0", "shard 'c/0/0/0'"
    return path / "c" / "0" / "0" / "0", "chunk 'c/0/0/0'"


@pytest.mark.parametrize("read", list(PATHS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_corrupt_chunk_raises_naming_array_and_chunk(tmp_path, layout, read):
    path = tmp_path / "a.zarr"
    _write(path, layout, partial=False)
    stored, named = _first_object(path, layout)
    stored.write_bytes(b"not a chunk, not a shard" * 3)
    with pytest.raises(CorruptChunkError, match="corrupt") as caught:
        PATHS[read][0](mixle.read_zarr(path))
    assert f"{named} of zarr array '{path}'" in str(caught.value)
    if "shards" not in LAYOUTS[layout][0]:
        assert "chunk grid coordinates (0, 0, 0)" in str(caught.value)


@pytest.mark.parametrize("read", list(PATHS))
@pytest.mark.parametrize("layout", ["v2 zstd", "v3 raw", "v3 sharded zstd", "v3 delta astype"])
def test_chunk_path_that_is_a_directory_raises(tmp_path, layout, read):
    path = tmp_path / "a.zarr"
    _write(path, layout, partial=False)
    stored, _ = _first_object(path, layout)
    stored.unlink()
    stored.mkdir()
    with pytest.raises(CorruptChunkError, match="is a directory") as caught:
        PATHS[read][0](mixle.read_zarr(path))
    assert str(stored) in str(caught.value)


def test_directory_chunk_over_a_file_url_raises(tmp_path):
    path = tmp_path / "a.zarr"
    _write(path, "v3 zstd", partial=False)
    stored, _ = _first_object(path, "v3 zstd")
    stored.unlink()
    stored.mkdir()
    src = mixle.read_zarr(f"file://{path}")
    for read, _ in PATHS.values():
        with pytest.raises(CorruptChunkError, match="is a directory"):
            read(src)


# -- chunks stored as several zstd frames --------------------------------------------------


def _without_content_size(frame: bytes, size: int) -> bytes:
    """The same zstd frame of ``size`` bytes, its header rewritten without the content size."""
    descriptor = frame[4]
    assert descriptor & 3 == 0  # no dictionary id
    single_segment = (descriptor >> 5) & 1
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    header = 5 + (0 if single_segment else 1) + width
    exponent = max(0, math.ceil(math.log2(max(size, 1))) - 10)  # a window >= the content
    rewritten = bytes([descriptor & 0b100, exponent << 3])
    return frame[:4] + rewritten + frame[header:]


def _frames(
    raw: bytes, cuts: list[int], sized: list[bool], checksum: bool, skippable: bool = False
) -> bytes:
    """``raw`` compressed as one zstd frame per piece between ``cuts``.

    ``sized[k]``: frame ``k`` records its content size; ``skippable``: a skippable frame
    (no content) follows the first one.
    """
    codec = numcodecs.Zstd(level=1, checksum=checksum)
    bounds = [0, *sorted(cuts), len(raw)]
    out = b""
    for lo, hi, keep in zip(bounds, bounds[1:], sized):
        frame = bytes(codec.encode(raw[lo:hi]))
        out += frame if keep else _without_content_size(frame, hi - lo)
        if skippable and lo == 0:
            out += b"\x5a\x2a\x4d\x18" + (6).to_bytes(4, "little") + b"mixle!"
    return out


def _inner_chunk_bytes(array: Any) -> bytes:
    """Decoded bytes of chunk (0, 0, 0) as the store keeps them (C order, little-endian)."""
    block = np.asarray(array[: CHUNKS[0], : CHUNKS[1], : CHUNKS[2]])
    full = np.full(CHUNKS, FILL, dtype="<i4")
    full[tuple(slice(0, n) for n in block.shape)] = block
    if array.metadata.zarr_format == 2 and array.metadata.order == "F":
        return full.tobytes(order="F")
    return full.tobytes()


def _filtered(layout: str, raw: bytes) -> bytes:
    """What a layout's filters (numcodecs, format 2) turn a chunk's bytes into."""
    for f in LAYOUTS[layout][0].get("filters", []):
        raw = bytes(f.encode(np.frombuffer(raw, dtype="<i4")))
    return raw


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(ZSTD_LAYOUTS),
    data=st.data(),
    checksum=st.booleans(),
)
def test_multi_frame_zstd_chunks_read_like_zarr(tmp_path_factory, layout, data, checksum):
    path = tmp_path_factory.mktemp("frames") / "a.zarr"
    _write(path, layout, partial=False)
    array = zarr.open_array(str(path), mode="r")
    chunk = _filtered(layout, _inner_chunk_bytes(array))
    cuts = data.draw(st.lists(st.integers(1, len(chunk) - 1), min_size=1, max_size=4, unique=True))
    sized = data.draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    frames = _frames(chunk, cuts, sized, checksum, data.draw(st.booleans()))
    assert bytes(numcodecs.Zstd().decode(frames)) == chunk  # numcodecs reads the frames
    _rewrite(path, layout, frames)
    expected = np.asarray(zarr.open_array(str(path), mode="r")[...])  # zarr reads them too
    np.testing.assert_array_equal(expected, _data())
    src = mixle.read_zarr(path)
    for read, want in PATHS.values():
        chunk_cache().clear()
        np.testing.assert_array_equal(read(src), want(expected))


def _rewrite(path: Path, layout: str, frames: bytes) -> None:
    """Store ``frames`` as chunk (0, 0, 0) of ``layout`` (inside its shard when sharded)."""
    obj, _ = _first_object(path, layout)
    options = LAYOUTS[layout][0]
    codecs = options.get("compressors")
    if isinstance(codecs, list) and any(isinstance(c, Crc32cCodec) for c in codecs):
        frames += google_crc32c.value(frames).to_bytes(4, "little")  # crc32c follows zstd
    if "shards" not in options:
        obj.write_bytes(frames)
        return
    raw = obj.read_bytes()  # inner chunk (0, 0, 0) first, then the others as they were
    n = math.prod(s // c for s, c in zip(SHARDS, CHUNKS))
    index = np.frombuffer(raw[-16 * n - 4 : -4], dtype="<u8").reshape(n, 2).copy()
    body = frames
    for k in range(1, n):
        offset, length = index[k].tolist()
        if offset != 2**64 - 1:
            index[k] = (len(body), length)
            body += raw[offset : offset + length]
    index[0] = (0, len(frames))
    table = index.tobytes()
    obj.write_bytes(body + table + google_crc32c.value(table).to_bytes(4, "little"))


@pytest.mark.parametrize("sized", [True, False])
@pytest.mark.parametrize("layout", ZSTD_LAYOUTS)
def test_frames_short_of_a_chunk_raise_on_every_path(tmp_path, layout, sized):
    path = tmp_path / "a.zarr"
    _write(path, layout, partial=False)
    chunk = _filtered(layout, _inner_chunk_bytes(zarr.open_array(str(path), mode="r")))
    half = len(chunk) // 2
    frames = _frames(chunk[: half - 4], [half // 2], [sized, sized], False)  # 4 bytes short
    _rewrite(path, layout, frames)
    for read, _ in PATHS.values():
        with pytest.raises(CorruptChunkError, match=r"\(0, 0, 0\)"):
            read(mixle.read_zarr(path))


# -- 0-d arrays and open zarr.Array objects -------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("written_value", [True, False])
def test_zero_d_array_reads_like_numpy(tmp_path, zarr_format, written_value):
    path = tmp_path / "a.zarr"
    array = zarr.create_array(
        str(path), shape=(), dtype="float32", fill_value=-1.5, zarr_format=zarr_format
    )
    if written_value:
        array[()] = 3.25
    expected = np.asarray(zarr.open_array(str(path), mode="r")[()])
    src = mixle.read_zarr(path)
    box = src.read_box((), ())
    assert type(box) is np.ndarray and box.shape == () and box.dtype == np.float32
    np.testing.assert_array_equal(box, expected)
    boxes = src.read_boxes([[], []], ())
    assert boxes.shape == (2,) and (boxes == expected).all()
    _same(src[()], expected[()])  # a NumPy scalar, as NumPy gives
    _same(src[...], expected[...])  # a 0-d array, as NumPy gives


def test_zero_d_corrupt_chunk_raises(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=(), dtype="int64", compressors=ZstdCodec())[()] = 5
    (path / "c").write_bytes(b"garbage!")
    src = mixle.read_zarr(path)
    for read in (lambda: src[()], lambda: src[...], lambda: src.read_box((), ())):
        with pytest.raises(CorruptChunkError, match="'c'"):
            read()


def test_integer_keys_with_an_ellipsis_give_0d_arrays_like_numpy(written):
    path, expected = written["v3 zstd"]
    src = mixle.read_zarr(path)
    _same(src[1, 2, 3], expected[1, 2, 3])
    _same(src[1, 2, 3, ...], expected[1, 2, 3, ...])
    _same(src[..., 1, 2, 3], expected[..., 1, 2, 3])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_read_zarr_accepts_an_open_zarr_array(tmp_path, zarr_format):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=zarr_format)
    inner = group.create_group("inner")
    array = inner.create_array("a", shape=(6, 5), chunks=(4, 4), dtype="int16")
    array[...] = np.arange(30, dtype=np.int16).reshape(6, 5)
    expected = np.asarray(array[...])
    src = mixle.read_zarr(array)
    np.testing.assert_array_equal(src[...], expected)
    np.testing.assert_array_equal(src.read_box((1, 1), (4, 3)), expected[1:5, 1:4])
    again = pickle.loads(pickle.dumps(src))  # reopened from the store, read-only
    np.testing.assert_array_equal(again[...], expected)
    np.testing.assert_array_equal(mixle.ZarrArraySource(array).get_batch([5, 0]), expected[[5, 0]])
    with pytest.raises(ValueError, match="component="):
        mixle.read_zarr(array, "inner/a")


# -- the key planner -----------------------------------------------------------------------


@st.composite
def key_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=0, max_size=3)))
    chunks = tuple(draw(st.integers(1, 6)) for _ in shape)
    return shape, chunks, draw(keys(shape))


@settings(max_examples=400, deadline=None)
@given(key_layouts())
def test_plan_key_reads_each_touched_chunk_once_and_covers_the_selection(layout):
    shape, chunks, key = layout
    arr = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    try:
        parsed = parse_key(key, shape)
    except IndexError:
        return
    plan = plan_key(parsed.read, chunks)
    extent = read_extent(parsed.read)
    out = np.full(extent, -1, dtype=np.int64)
    hits = np.zeros(extent, dtype=np.int64)
    for coords, pieces in zip(plan.chunks, plan.pieces):
        chunk = arr[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, chunks))]
        for box, region, inner in pieces:
            assert box == 0
            out[region] = chunk[inner]
            hits[region] += 1
    assert plan.chunks == sorted(set(plan.chunks))  # each chunk once, in C order
    if math.prod(extent):
        assert (hits == 1).all()
        flat = out.reshape([n for k, n in zip(parsed.read, extent) if not isinstance(k, int)])
        np.testing.assert_array_equal(parsed.finish(flat), arr[key])
    # exactly the chunks holding a selected element
    selected = np.indices(shape).reshape(len(shape), -1).T if shape else np.zeros((1, 0), int)
    mask = np.zeros(shape, dtype=bool)
    mask[parsed.read] = True
    touched = {tuple(int(i // n) for i, n in zip(p, chunks)) for p in selected[mask.reshape(-1)]}
    assert set(plan.chunks) == touched


def test_strided_key_skips_chunks_between_its_steps(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=(40,), chunks=(2,), dtype="int32")[...] = np.arange(40)
    src = mixle.read_zarr(path)
    chunk_cache().clear()
    np.testing.assert_array_equal(src[1::10], np.arange(40)[1::10])
    assert chunk_cache().stats().entries == 4  # chunks 0, 5, 10 and 15 of 20


def test_planning_a_long_slice_allocates_nothing_per_element():
    # a 10**9-element slab of a 1-D array used to plan through np.arange: 8 GB of indices
    import tracemalloc

    tracemalloc.start()
    try:
        plan = plan_key([slice(0, 10**9, 1)], [2**20])
        wide = plan_key([slice(5, 10**9, 3 * 2**20)], [2**20])  # a step past whole chunks
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(plan.chunks) == -(-(10**9) // 2**20) and len(wide.chunks) == 318
    assert peak < 16 * 2**20, peak


# -- fixed-width bytes, UTF-32 and structured dtypes: mixle decodes them as zarr reads them ---

_FIXED_DTYPES = ["S4", "<U3", ">U3", "V6", [("a", "<i4"), ("b", ">f8")]]


@pytest.mark.parametrize("dtype", _FIXED_DTYPES, ids=str)
def test_fixed_width_dtypes_read_as_zarr_reads_them(tmp_path, dtype):
    path = tmp_path / "a.zarr"
    array = zarr.create_array(str(path), shape=(10, 7), chunks=(4, 3), dtype=dtype, zarr_format=2)
    raw = np.random.default_rng(1).integers(0, 256, 70 * array.dtype.itemsize, dtype=np.uint8)
    values = (
        raw.view(np.dtype(dtype)).reshape(10, 7)
        if np.dtype(dtype).kind != "U"
        else (np.array([chr(65 + b % 26) * 3 for b in raw[:70]], dtype=dtype).reshape(10, 7))
    )
    if np.dtype(dtype).fields:
        values = np.zeros((10, 7), dtype=dtype)
        values["a"], values["b"] = raw[:70].reshape(10, 7), raw[70:140].reshape(10, 7)
    array[...] = values
    opened = zarr.open_array(str(path), mode="r")
    assert type(zarr_chunk_reader(opened)).__name__ == "ZarrCodecReader"
    got, expected = mixle.read_zarr(path)[...], opened[...]
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def _at_corner(batch_patches: np.ndarray, corners: np.ndarray, corner: list[int]) -> np.ndarray:
    """The patch of a full-grid batch whose corner is ``corner``."""
    (k,) = np.flatnonzero((corners == corner).all(axis=1))
    return batch_patches[k]


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_never_written_chunks_read_as_writable_copies_of_the_fill(written, layout, cache):
    """Unwritten chunks come from one shared, read-only fill element per reader: every read
    path must hand out its own writable array, and writing into it must not reach the fill
    that later reads see."""
    path, expected = written[layout]
    box = (slice(8, 12), slice(0, 5), slice(0, 4))  # one whole never-written chunk
    assert (expected[box] == FILL).all()
    if not cache:
        set_chunk_cache_bytes(0)
    chunk_cache().clear()
    src = mixle.read_zarr(path)
    grid = {"replacement": False, "stride": (8, 5, 4)}  # corners (0|8, 0|5, 0)
    one = mixle.PatchSampler(src, (4, 5, 4), **grid)
    many = mixle.PatchSampler(mixle.read_volumes([str(path)]), (4, 5, 4), **grid)
    reads = {
        "src[key]": lambda: src[box],
        "read_box": lambda: src.read_box([8, 0, 0], [4, 5, 4]),
        "read_boxes": lambda: src.read_boxes([[8, 0, 0]], [4, 5, 4])[0],
        "get_batch": lambda: src.get_batch([8, 9, 10, 11])[:, :5, :4],
        "sampler": lambda: _at_corner(*one.get_batch(range(len(one))), [8, 0, 0]),
        "collection": lambda: _at_corner(
            *(lambda b: (b["patch"], b["coords"]))(many.get_batch(range(len(many)))), [8, 0, 0]
        ),
    }
    for name, read in reads.items():
        got = read()
        np.testing.assert_array_equal(got, expected[box], err_msg=name)
        assert got.flags.writeable, name
        got[...] = 123  # the caller's array: no later read may see this
        for again in reads.values():
            np.testing.assert_array_equal(again(), expected[box], err_msg=name)
