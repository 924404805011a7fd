"""A server that ignores ``Range`` (``200`` with the whole object): one ``HEAD`` per object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

import mixle  # noqa: E402
from mixle.reading import CorruptChunkError, chunk_cache  # noqa: E402
from mixle.reading.fetch import read_range  # noqa: E402
from mixle.testing_servers import FaultPlan, RangeHTTPServer  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_retries")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ignored")
    data = np.arange(24 * 20, dtype="float32").reshape(24, 20)
    array = zarr.create_array(
        str(folder / "sharded.zarr"),
        shape=data.shape,
        chunks=(4, 5),
        shards=(12, 20),
        dtype="float32",
        compressors=None,
    )
    array[...] = data
    (folder / "blob.bin").write_bytes(bytes(range(256)) * 64)
    return folder


@pytest.fixture
def ignoring(root: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(root, FaultPlan(range_fault="whole")) as server:
        yield server


def _heads(server: RangeHTTPServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for method, path, _ in server.faults.log:
        if method == "HEAD":
            counts[path] = counts.get(path, 0) + 1
    return counts


def test_repeated_reads_of_a_sharded_zarr_ask_each_shards_size_once(ignoring, root):
    truth = np.asarray(zarr.open_array(str(root / "sharded.zarr"), mode="r")[...])
    source = mixle.read_zarr(f"{ignoring.url}/sharded.zarr")
    ignoring.faults.reset()
    for _ in range(3):
        chunk_cache().clear()
        np.testing.assert_array_equal(np.asarray(source[...]), truth)
        np.testing.assert_array_equal(np.asarray(source[13:17, 3:9]), truth[13:17, 3:9])
    assert ignoring.faults.range_faults > 0  # every range was answered with the whole shard
    heads = _heads(ignoring)
    assert heads and max(heads.values()) == 1, heads
    source.close()


def test_a_replaced_object_is_probed_again_and_the_cap_still_holds(ignoring, root):
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    url = f"{ignoring.url}/blob.bin"
    blob = (root / "blob.bin").read_bytes()
    for span in [(10, 20), (100, 300), (-7, None)]:
        got = read_range(fs, url, span, url=url, key="blob")
        assert got == blob[span[0] : span[1]]
    assert sum(_heads(ignoring).values()) == 1
    # the whole object is still refused past the limit, remembered size or not
    with pytest.raises(CorruptChunkError, match="more than the 100 bytes"):
        read_range(fs, url, (0, None), url=url, key="blob", limit=100)
    with pytest.raises(CorruptChunkError, match="more than the 5 bytes"):
        read_range(fs, url, (0, 10), url=url, key="blob", limit=5)
    # replaced by a shorter object: its new length disagrees, so the size is asked again
    try:
        (root / "blob.bin").write_bytes(blob[:1000])
        assert read_range(fs, url, (990, 995), url=url, key="blob") == blob[990:995]
        assert read_range(fs, url, (-3, None), url=url, key="blob") == blob[997:1000]
    finally:
        (root / "blob.bin").write_bytes(blob)
    assert sum(_heads(ignoring).values()) == 2
