"""Plugin-filtered HDF5 chunks: padded blosc2 frames, stacked filters, unreadable headers.

hdf5plugin's blosc2 filter pads a chunk of two or more dimensions to whole b2nd blocks, so
its frame states more bytes than the chunk holds; a filter below another may grow its
bytes. Such chunks read as h5py reads them. A blosc2 frame whose marker bytes were changed
(c-blosc2 does not read them), or whose inner chunk states more than its frame, and a chunk
whose header mixle cannot read, are refused before HDF5's plugin allocates. Everything runs
in a child that imports ``hdf5plugin``, so the pytest process never registers its filters;
the child's peak RSS (``VmHWM``) shows what a bomb cost.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hdf5_plugin_child import run_plugin_child

CHILD = r"""
path = sys.argv[1]
rng = np.random.default_rng(7)
out = {"padded": {}, "stacked": {}, "bombs": {}}

def values(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return (rng.random(shape) * 100).round(1).astype(dtype)
    ramp = np.arange(int(np.prod(shape))).reshape(shape) % 7
    return (ramp + rng.integers(0, 3, shape)).astype(dtype)

def same(name):
    with h5py.File(path, "r") as f:
        truth = f[name][...]
    try:
        with mixle.read_hdf5(path, name) as src:
            box = tuple(slice(n // 3, n // 3 + max(1, n // 2)) for n in truth.shape)
            got = np.array_equal(src[...], truth) and np.array_equal(src[box], truth[box])
            return [bool(got), ""]
    except Exception as exc:
        return [False, f"{type(exc).__name__}: {exc}"]

# 1. blosc2 chunks of many shapes: a b2nd chunk is padded to whole blocks
CHUNKS = [(300, 300), (257, 257), (200, 200, 3), (33, 65, 7), (100, 3), (5, 1000), (9, 11, 13, 3),
          (1000,), (64, 64)]
with h5py.File(path, "w") as f:
    for chunk in CHUNKS:
        for dtype in ("u1", "f4", "f8"):
            for cname in ("lz4", "zstd"):
                shape = tuple(n + n // 2 + 1 for n in chunk)  # partial chunks at the edges
                name = f"b2-{'x'.join(map(str, chunk))}-{dtype}-{cname}"
                ds = f.create_dataset(name, shape=shape, chunks=chunk, dtype=dtype,
                                      **hdf5plugin.Blosc2(cname=cname))
                ds[...] = values(shape, dtype)
                if cname == "lz4":  # a chunk of zeros is a special chunk in its frame
                    ds[tuple(slice(0, n) for n in chunk)] = 0
for name in list(h5py.File(path, "r")):
    out["padded"][name] = same(name)

# 2. a filter that can grow the data below the checked one: incompressible bytes
OUTER = {
    "bzip2": (307, (9,)),
    "blosc2": (32026, tuple(hdf5plugin.Blosc2(cname="lz4").filter_options)),
    "zstd": (32015, (3,)),
    "bitshuffle": (32008, tuple(hdf5plugin.Bitshuffle(cname="lz4").filter_options)),
    "lz4": (32004, tuple(hdf5plugin.LZ4().filter_options)),
}  # blosc (32001) stores incompressible bytes unfiltered: nothing to check
noise = rng.integers(0, 256, (64, 64), dtype="u1")
with h5py.File(path, "a") as f:
    for below in ("deflate", "fletcher32", "deflate-shuffle"):
        for outer, (code, opts) in OUTER.items():
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk((32, 32))
            if below == "fletcher32":
                dcpl.set_fletcher32()
            else:
                dcpl.set_deflate(6)
                if below == "deflate-shuffle":
                    dcpl.set_shuffle()
            dcpl.set_filter(code, h5py.h5z.FLAG_OPTIONAL, opts)
            name = f"{below}-{outer}"
            space = h5py.h5s.create_simple((64, 64))
            h5py.h5d.create(f.id, name.encode(), h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl)
            f[name][...] = noise
            mask = f[name].id.read_direct_chunk((0, 0))[0]
            assert mask == 0, (name, mask)  # every filter ran on this chunk
for name in list(h5py.File(path, "r")):
    if name.startswith(("deflate", "fletcher32")):
        out["stacked"][name] = same(name)

# 3. bombs: a chunk of (32, 256) int32 is 32768 bytes; these state or hold 64 MiB
BIG = 64 << 20
LAYOUT = dict(shape=(64, 512), chunks=(32, 256), dtype="<i4")

def frame_of(fill, **options):
    with h5py.File(path + ".scratch", "w") as f:
        ds = f.create_dataset("x", shape=(BIG // 4,), chunks=(BIG // 4,), dtype="<i4", **options)
        ds[...] = fill
        return bytes(ds.id.read_direct_chunk((0,))[1])

def patched(raw, *changes):
    raw = bytearray(raw)
    for at, value in changes:
        raw[at : at + len(value)] = value
    return bytes(raw)

zeros, ones = frame_of(0, **hdf5plugin.Blosc2()), frame_of(1, **hdf5plugin.Blosc2())
with h5py.File(path + ".scratch", "w") as f:  # a b2nd frame of one (32, 256) chunk
    ds = f.create_dataset("x", **LAYOUT, **hdf5plugin.Blosc2())
    ds[...] = 1
    b2nd = bytes(ds.id.read_direct_chunk((0, 0))[1])
meta = int.from_bytes(b2nd[b2nd.index(b"b2nd") + 5 :][:4], "big") + 5  # its b2nd metadata
block1 = meta + 4 + 9 * 2 + 1 + 5 * 2 + 1 + 5 + 1  # the second axis of its block shape
zstd_zeros = frame_of(0, **hdf5plugin.Zstd())
small = (32768).to_bytes(8, "big"), (32768).to_bytes(4, "big")
bombs = {
    "blosc2-marker24": (dict(hdf5plugin.Blosc2()), patched(zeros, (24, b"\xa5"))),
    "blosc2-marker29": (dict(hdf5plugin.Blosc2()), patched(zeros, (29, b"\xd2"))),
    "blosc2-marker10": (dict(hdf5plugin.Blosc2()), patched(zeros, (10, b"\xce"))),
    "blosc2-marker15": (dict(hdf5plugin.Blosc2()), patched(ones, (15, b"\xce"))),
    # the frame states a chunk's 32768 bytes, its one chunk 64 MiB
    "blosc2-inner": (dict(hdf5plugin.Blosc2()), patched(ones, (30, small[0]), (58, small[1]))),
    # a block wider than the chunk: b2nd pads the chunk to 512 MiB
    "blosc2-blockshape": (
        dict(hdf5plugin.Blosc2()),
        patched(b2nd, (block1, (1 << 22).to_bytes(4, "big"))),
    ),
    "deflate-zstd": ({"compression": "gzip", **hdf5plugin.Zstd()}, zstd_zeros),
    "deflate-blosc2": ({"compression": "gzip", **hdf5plugin.Blosc2()}, zeros),
    "garbage-blosc2": (dict(hdf5plugin.Blosc2()), bytes(range(200))),
    "short-blosc2": (dict(hdf5plugin.Blosc2()), zeros[:60]),
    "short-lz4": (dict(hdf5plugin.LZ4()), b"\x00\x00\x00\x00\x04"),
    "short-bitshuffle": (dict(hdf5plugin.Bitshuffle(cname="lz4")), b"\x00\x00\x00\x00\x04"),
    "short-blosc": (dict(hdf5plugin.Blosc()), b"\x02\x01\x21\x04\x00\x00\x00\x04"),
    "garbage-zstd": (dict(hdf5plugin.Zstd()), b"not a zstd frame at all"),
    "garbage-bzip2": (dict(hdf5plugin.BZip2()), b"BZh9 but not really a bzip2 stream"),
}
with h5py.File(path, "a") as f:
    for name, (options, raw) in bombs.items():
        ds = f.create_dataset("bomb-" + name, **LAYOUT, **options)
        ds[...] = 1
        ds.id.write_direct_chunk((0, 0), raw)
measure_bombs(path, bombs, out)
print(json.dumps(out))
"""

BOMBS = [
    "blosc2-marker24",
    "blosc2-marker29",
    "blosc2-marker10",
    "blosc2-marker15",
    "blosc2-inner",
    "blosc2-blockshape",
    "deflate-zstd",
    "deflate-blosc2",
]
UNREADABLE = [
    "garbage-blosc2",
    "short-blosc2",
    "short-lz4",
    "short-bitshuffle",
    "short-blosc",
    "garbage-zstd",
    "garbage-bzip2",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_plugin_child(CHILD, tmp_path_factory.mktemp("frames") / "frames.h5")


def test_blosc2_chunks_padded_to_whole_blocks_read_as_h5py(results):
    padded = results["padded"]
    assert len(padded) == 54
    wrong = {name: why for name, (ok, why) in padded.items() if not ok}
    assert not wrong, wrong


def test_a_filter_below_that_grows_the_data_is_allowed_its_growth(results):
    stacked = results["stacked"]
    assert len(stacked) == 15
    wrong = {name: why for name, (ok, why) in stacked.items() if not ok}
    assert not wrong, wrong


@pytest.mark.parametrize("name", BOMBS)
@pytest.mark.parametrize("how", ["getitem", "boxes"])
def test_a_frame_stating_more_than_a_chunk_is_refused_however_it_is_written(results, name, how):
    error, message, growth_kib = results["bombs"][f"{name} {how}"]
    assert error == "CorruptChunkError", (error, message, growth_kib)
    assert f"chunk (0, 0) of HDF5 dataset '/bomb-{name}'" in message
    assert "a chunk has 32768" in message and "decoded bytes" in message
    assert growth_kib < 16 * 1024, growth_kib  # the 64 MiB HDF5 would allocate never was


@pytest.mark.parametrize("name", UNREADABLE)
@pytest.mark.parametrize("how", ["getitem", "boxes"])
def test_a_header_mixle_cannot_read_is_refused_not_passed_to_the_plugin(results, name, how):
    error, message, growth_kib = results["bombs"][f"{name} {how}"]
    assert error == "CorruptChunkError", (error, message, growth_kib)
    stage = name.split("-")[1]
    assert f"chunk (0, 0) of HDF5 dataset '/bomb-{name}'" in message
    assert f"its {stage} data" in message and "unknown" in message
    assert growth_kib < 16 * 1024, growth_kib
