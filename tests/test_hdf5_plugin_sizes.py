"""bzip2, bitshuffle and blosc2 chunks that decode to more than a chunk are refused first.

HDF5's plugins allocate what a stored chunk decodes to (bitshuffle and blosc2: what its
header states; bzip2: as much as its stream holds) before keeping a chunk's worth. mixle
checks each chunk before h5py reads it; sound chunks read as h5py reads them. Everything
runs in a child that imports ``hdf5plugin``, so the pytest process never registers its
filters, and the child's peak RSS (``VmHWM``) shows what a bomb cost.
"""

from __future__ import annotations

from typing import Any

import pytest
from _hdf5_plugin_child import run_plugin_child

CHILD = """
import bz2

BIG = 64 << 20  # what a bomb decodes to; a chunk (32, 256) of int32 is 32768 bytes
LAYOUT = dict(shape=(64, 512), chunks=(32, 256), dtype="<i4")
filters = {
    "bitshuffle-lz4": dict(hdf5plugin.Bitshuffle(cname="lz4")),
    "bitshuffle-zstd": dict(hdf5plugin.Bitshuffle(cname="zstd")),
    "bitshuffle-none": dict(hdf5plugin.Bitshuffle(cname="none")),
    "blosc2": dict(hdf5plugin.Blosc2()),
    "blosc2-bitshuffle": dict(
        hdf5plugin.Blosc2(cname="zstd", filters=hdf5plugin.Blosc2.BITSHUFFLE)
    ),
    "bzip2": dict(hdf5plugin.BZip2()),
    "shuffle-bzip2": {"shuffle": True, **hdf5plugin.BZip2()},
}
path = sys.argv[1]
rng = np.random.default_rng(16)
data = (np.arange(64 * 512).reshape(64, 512) // 5 % 70).astype("<i4")
data[::3, ::7] += rng.integers(0, 9, size=data[::3, ::7].shape, dtype="<i4")

def bomb_of(name, options):  # a chunk of BIG zero bytes as the filter stores it
    if name.endswith("bzip2"):
        return bz2.compress(bytes(BIG))
    with h5py.File(path + ".scratch", "w") as f:
        ds = f.create_dataset("x", shape=(BIG // 4,), chunks=(BIG // 4,), dtype="<i4", **options)
        ds[...] = 0
        return bytes(ds.id.read_direct_chunk((0,))[1])

with h5py.File(path, "w") as f:
    for name, options in filters.items():
        f.create_dataset(name, fillvalue=3, **LAYOUT, **options)
        f[name][:40] = data[:40]
        if name != "bitshuffle-none":
            bomb = f.create_dataset("bomb-" + name, **LAYOUT, **options)
            bomb[...] = 1
            bomb.id.write_direct_chunk((0, 0), bomb_of(name, options))

out = {"equal": {}, "bombs": {}}
with h5py.File(path, "r") as f:
    for name in filters:
        truth = f[name][...]
        with mixle.read_hdf5(path, name) as src:
            box = (slice(5, 37), slice(100, 400))
            same = np.array_equal(src[...], truth) and np.array_equal(src[box], truth[box])
        out["equal"][name] = bool(same)
measure_bombs(path, [name for name in filters if name != "bitshuffle-none"], out)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_plugin_child(CHILD, tmp_path_factory.mktemp("sizes") / "plugins.h5", timeout=300)


def test_sound_chunks_of_each_filter_read_as_h5py(results):
    assert results["equal"] and all(results["equal"].values()), results["equal"]


@pytest.mark.parametrize(
    "name",
    ["bitshuffle-lz4", "bitshuffle-zstd", "blosc2", "blosc2-bitshuffle", "bzip2", "shuffle-bzip2"],
)
@pytest.mark.parametrize("how", ["getitem", "boxes"])
def test_a_chunk_decoding_to_more_than_a_chunk_is_refused_before_hdf5_allocates(results, name, how):
    error, message, growth_kib = results["bombs"][f"{name} {how}"]
    assert error == "CorruptChunkError", (error, message, growth_kib)
    stage = name.split("-")[-1] if name.endswith("bzip2") else name.split("-")[0]
    assert (
        f"chunk (0, 0) of HDF5 dataset '/bomb-{name}'" in message and f"its {stage} data" in message
    )
    assert "a chunk has 32768" in message
    assert growth_kib < 16 * 1024, growth_kib  # the 64 MiB HDF5 would allocate never was
