"""HDF5 over HTTP, S3 and file-like objects equals local reads; chunks fetched in batches."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from _remote_fixtures import PATCH, boxes, expected_boxes, write_stores

import mixle
from mixle.data.sources.arrays.hdf5.remote import RemoteHDF5ChunkReader
from mixle.reading import chunk_cache
from mixle.testing import check_array_source
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("fast_retries", "frozen_heap")


@pytest.fixture(scope="module")
def h5_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("h5")
    return root, write_stores(root)["v.h5/gzip"]


@pytest.mark.parametrize("dataset", ["gzip", "lzf", "contiguous"])
def test_hdf5_over_http_equals_local(dataset, h5_tree):
    root, data = h5_tree
    with RangeHTTPServer(root) as server:
        src = mixle.read_hdf5(f"{server.url}/v.h5", dataset)
        reader = src._reader_for(src.array)
        assert isinstance(reader, RemoteHDF5ChunkReader) == (dataset == "gzip")
        starts = boxes(30, seed=7)
        np.testing.assert_array_equal(src.read_boxes(starts, PATCH), expected_boxes(data, starts))
        check_array_source(src, data)


def test_hdf5_chunks_of_a_batch_come_in_one_request_each_and_survive_faults(h5_tree):
    root, data = h5_tree
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = mixle.read_hdf5(f"{server.url}/v.h5", "gzip")
        starts = boxes(30, seed=8)
        src.read_boxes(starts[:1], PATCH)  # warm h5py's metadata (B-tree) reads
        chunk_cache().clear()
        faults.reset()
        out = src.read_boxes(starts, PATCH)
        np.testing.assert_array_equal(out, expected_boxes(data, starts))
        planned = mixle.reading.plan_chunks(starts, PATCH, src.chunks, src.shape)
        assert faults.requests <= len(planned)  # one ranged GET per chunk, none twice
        chunk_cache().clear()
        faults.fail_every = 3
        np.testing.assert_array_equal(src.read_boxes(starts, PATCH), out)


def test_hdf5_over_s3_pickles_by_reference(h5_tree):
    root, data = h5_tree
    with MotoS3Server() as server:
        url = server.upload(root, "mixle-h5")
        src = mixle.read_hdf5(f"{url}/v.h5", "gzip", storage_options=server.storage_options())
        clone = pickle.loads(pickle.dumps(src))
        assert "not opened yet" in repr(clone)
        np.testing.assert_array_equal(clone[3:9, 2], data[3:9, 2])
        starts = boxes(10, seed=9)
        np.testing.assert_array_equal(src.read_boxes(starts, PATCH), expected_boxes(data, starts))
        clone.close()
        src.close()


def test_hdf5_from_a_file_like_object(h5_tree):
    root, data = h5_tree
    buffer = io.BytesIO((root / "v.h5").read_bytes())
    src = mixle.read_hdf5(buffer, "gzip")
    assert "file-like BytesIO" in repr(src)
    np.testing.assert_array_equal(src[5], data[5])
    with pytest.raises(TypeError, match="cannot be pickled by reference"):
        pickle.dumps(src)
    src.close()


def test_storage_options_need_a_url(h5_tree):
    with pytest.raises(ValueError, match="storage_options only apply to fsspec URLs"):
        mixle.read_hdf5(h5_tree[0] / "v.h5", "gzip", storage_options={"anon": True})


@pytest.mark.parametrize("fail_every", [3, 4])
def test_opening_over_http_retries_transient_failures_of_the_metadata_reads(h5_tree, fail_every):
    # h5py reads the superblock and object headers through the remote file while opening;
    # a 503 there used to escape as a raw aiohttp error instead of being retried
    root, data = h5_tree
    with RangeHTTPServer(root, FaultPlan(fail_every=fail_every)) as server:
        src = mixle.read_hdf5(f"{server.url}/v.h5", "gzip")
        assert src.shape == data.shape
        src.close()


def test_opening_over_http_gives_up_with_a_remote_read_error(h5_tree):
    root, _ = h5_tree
    with (
        RangeHTTPServer(root, FaultPlan(fail_every=1)) as server,
        pytest.raises(mixle.reading.RemoteReadError, match=r"v\.h5"),
    ):
        mixle.read_hdf5(f"{server.url}/v.h5", "gzip")


@pytest.fixture(scope="module")
def big_h5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """1 MiB datasets: reading one takes blocks past the one h5py's open already cached."""
    import h5py

    root = tmp_path_factory.mktemp("big_h5")
    data = np.random.default_rng(4).standard_normal((64, 64, 64)).astype("float32")
    with h5py.File(root / "big.h5", "w") as f:
        f.create_dataset("contiguous", data=data)
        f.create_dataset("lzf", data=data, chunks=(32, 32, 32), compression="lzf")
    return root, data


@pytest.mark.parametrize("dataset", ["contiguous", "lzf"])
@pytest.mark.parametrize("fault", [("fail_every", 2), ("drop_every", 2)])
def test_data_h5py_reads_itself_is_retried_like_the_chunks_mixle_reads(dataset, fault, big_h5):
    # contiguous and lzf data come through the file object h5py reads: each block of it is
    # a checked, retried request, so a flaky server still serves every read
    root, data = big_h5
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = mixle.read_hdf5(f"{server.url}/big.h5", dataset)
        faults.reset()
        setattr(faults, *fault)
        np.testing.assert_array_equal(src[...], data)
        np.testing.assert_array_equal(src[40:, 3:9, ::5], data[40:, 3:9, ::5])
        assert faults.requests >= 3  # failures were injected and retried
        src.close()


@pytest.mark.parametrize("dataset", ["contiguous", "lzf"])
def test_data_h5py_reads_itself_gives_up_with_a_remote_read_error_naming_the_url(dataset, big_h5):
    root, _ = big_h5
    faults = FaultPlan()
    with RangeHTTPServer(root, faults) as server:
        src = mixle.read_hdf5(f"{server.url}/big.h5?token=tok-secret-1", dataset)
        faults.fail_status, faults.fail_every = 403, 1
        with pytest.raises(mixle.reading.RemoteReadError) as info:
            src[...]
        src.close()
    message = str(info.value)
    chained = (info.value.__cause__, info.value.__context__)
    del info  # its traceback holds h5py objects: no reference cycle left (h5py issue 2019)
    assert f"{server.url}/big.h5 (chunk (file bytes " in message and "403" in message
    assert "tok-secret-1" not in message
    assert chained == (None, None)  # aiohttp's error, with the token in its URL, is gone


def test_automatic_collection_is_paused_while_h5py_reads_through_the_file(big_h5, monkeypatch):
    # h5py holds its lock while it reads through the remote file and waits for fsspec's I/O
    # thread: a collection there that finalises an h5py object would wait for that lock
    import gc

    from mixle.data.sources.arrays.hdf5 import remote as hdf5_remote

    root, data = big_h5
    seen: list[bool] = []
    fetch = hdf5_remote.read_range

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return fetch(*args, **kwargs)

    monkeypatch.setattr(hdf5_remote, "read_range", spying)
    with RangeHTTPServer(root) as server:
        # spies on fsspec's read_range: pinned; obstore's reads in test_hdf5_obstore.py
        src = mixle.read_hdf5(f"{server.url}/big.h5", "contiguous", backend="fsspec")
        np.testing.assert_array_equal(src[...], data)
        src.close()
    assert seen and not any(seen)
    assert gc.isenabled()  # resumed after the last read
