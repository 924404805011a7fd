"""inspect_n5 and is_n5 on N5 containers written by tensorstore: sizes from the files, advice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from _n5_writers import ts_create, ts_read, values, write_n5

from mixle.errors import InvalidMetadataError
from mixle.inspection import n5_files
from mixle.inspection.n5_files import inspect_n5, is_n5
from mixle.inspection.report import ArrayReport, GroupReport, UnsupportedStoreError
from mixle.testing import assert_unchanged


def _block_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.name != "attributes.json"]


def test_a_dataset_reports_its_layout_and_the_sizes_of_its_block_files(tmp_path):
    path = tmp_path / "a.n5"
    store = ts_create(path, (7, 10, 9), (3, 4, 4), "uint16", {"type": "gzip"})
    store[:3, :4, :] = values((3, 4, 9), "uint16")  # 3 of 3 x 3 x 3 blocks written
    files = _block_files(path)
    with assert_unchanged(path):
        report = inspect_n5(str(path), None, None)
    assert isinstance(report, ArrayReport)
    assert report.format == "n5" and report.layout == "chunked"
    assert report.shape == ts_read(path).shape == (7, 10, 9)
    assert report.dtype == "uint16" and report.itemsize == 2
    assert report.chunks == (3, 4, 4) and report.chunk_nbytes == 3 * 4 * 4 * 2
    assert report.codecs == ("gzip(level=-1, useZlib=False)",) and report.compressed
    assert report.fill_value == 0 and report.order == "F"
    assert report.chunks_in_grid == 27
    assert report.chunks_stored == len(files) == 3
    assert report.stored_bytes == sum(p.stat().st_size for p in files)
    assert report.data_bytes == 3 * 4 * 9 * 2
    codes = {f.code for f in report.findings}
    assert "missing-chunks" in codes
    message = next(f.message for f in report.findings if f.code == "missing-chunks")
    assert "24 of 27 chunks never written" in message and "fill value 0" in message


def test_a_container_reports_its_groups_and_datasets(tmp_path):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1", "owner": "lab"}))
    write_n5(root / "volumes" / "raw", values((7, 10, 9), "uint8"), compression={"type": "raw"})
    write_n5(root / "volumes" / "labels", values((4, 5), "uint64"), blocks=(3, 3))
    with assert_unchanged(root):
        report = inspect_n5(str(root), None, None)
    assert isinstance(report, GroupReport) and report.format == "n5"
    assert report.path == "/" and report.attributes == 1
    (volumes,) = report.children
    assert isinstance(volumes, GroupReport) and volumes.path == "/volumes"
    labels, raw = volumes.children
    assert isinstance(raw, ArrayReport) and raw.path == "/volumes/raw"
    assert raw.codecs == () and not raw.compressed and raw.shape == (7, 10, 9)
    assert isinstance(labels, ArrayReport) and labels.dtype == "uint64"
    assert labels.chunks_stored == labels.chunks_in_grid == 4
    assert report.to_dict()["children"][0]["children"][1]["format"] == "n5"


def test_the_walk_of_a_container_is_bounded_and_says_what_it_left_out(tmp_path, monkeypatch):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    for name in "abcd":
        write_n5(root / name, values((2, 2), "uint8"), blocks=(2, 2))
    monkeypatch.setattr(n5_files, "MAX_WALKED_FOLDERS", 2)
    report = inspect_n5(str(root), None, None)
    assert [c.path for c in report.children] == ["/a", "/b"]
    (finding,) = report.findings
    assert finding.code == "members-unlisted" and "/c, /d" in finding.message


def test_a_newer_n5_version_is_a_warning(tmp_path):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "9.1.0"}))
    report = inspect_n5(str(root), None, None)
    (finding,) = report.findings
    assert finding.code == "unsupported-version" and "'9.1.0'" in finding.message


def test_incompressible_blocks_get_the_poor_compression_advice(tmp_path):
    path = write_n5(
        tmp_path / "a.n5", values((64, 64, 16), "uint16"), blocks=(64, 64, 16)
    )  # random bits: gzip saves nothing
    report = inspect_n5(str(path), None, None)
    assert report.compression_ratio is not None and report.compression_ratio < 1.1
    assert "poor-compression" in {f.code for f in report.findings}


def test_small_blocks_get_the_small_chunks_advice(tmp_path):
    path = write_n5(tmp_path / "a.n5", values((40, 40, 40), "uint16"), blocks=(4, 4, 4))
    report = inspect_n5(str(path), None, (16, 16, 16))
    assert report.patch_cost is not None and report.patch_cost.chunks_touched > 60
    assert "small-chunks" in {f.code for f in report.findings}


@pytest.mark.parametrize("kind", ["lz4", "snappy"])
def test_a_compression_mixle_cannot_decode_is_a_warning_naming_it(tmp_path, kind):
    path = write_n5(tmp_path / "a.n5", values((5, 6), "uint8"), blocks=(2, 2))
    attrs = json.loads((path / "attributes.json").read_text())
    attrs["compression"] = {"type": kind}
    (path / "attributes.json").write_text(json.dumps(attrs))
    report = inspect_n5(str(path), None, None)
    (finding,) = [f for f in report.findings if f.code == "unsupported-compression"]
    assert finding.severity == "warning" and repr(kind) in finding.message


def test_stray_files_in_a_dataset_are_counted_not_taken_for_blocks(tmp_path):
    path = write_n5(tmp_path / "a.n5", values((5, 6), "uint8"), blocks=(2, 2))
    (path / "notes.txt").write_text("x")
    (path / "9").mkdir()  # past the grid (3 x 3 blocks)
    (path / "9" / "0").write_bytes(b"x")
    report = inspect_n5(str(path), None, None)
    assert report.chunks_stored == 9
    assert "stray-files" in {f.code for f in report.findings}


def test_a_damaged_attributes_json_is_named(tmp_path):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    (root / "bad").mkdir()
    (root / "bad" / "attributes.json").write_text('{"dimensions": [1')
    with pytest.raises(InvalidMetadataError, match="bad"):
        inspect_n5(str(root), None, None)


def test_urls_and_folders_without_attributes_are_refused(tmp_path):
    with pytest.raises(UnsupportedStoreError, match="local folders only"):
        inspect_n5("s3://bucket/c.n5", None, None)
    with pytest.raises(UnsupportedStoreError, match=r"no attributes\.json"):
        inspect_n5(str(tmp_path), None, None)


def test_is_n5_knows_containers_and_datasets_and_nothing_else(tmp_path):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text(json.dumps({"n5": "4.0.0"}))
    dataset = write_n5(root / "raw", values((5, 6), "uint8"), blocks=(2, 2))
    assert is_n5(str(root)) and is_n5(str(dataset))
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not is_n5(str(plain))
    (plain / "attributes.json").write_text(json.dumps({"name": "not n5"}))
    assert not is_n5(str(plain))
    (plain / "attributes.json").write_text("[1, 2")
    assert not is_n5(str(plain))
    assert not is_n5(str(dataset / "attributes.json"))  # a file
    assert not is_n5("s3://bucket/c.n5")
    assert not is_n5(str(tmp_path / "missing"))
    zarr_like = tmp_path / "z.zarr"
    zarr_like.mkdir()
    (zarr_like / ".zgroup").write_text('{"zarr_format": 2}')
    assert not is_n5(str(zarr_like))


def test_a_container_tensorstore_wrote_with_a_dataset_path_is_n5(tmp_path):
    # tensorstore writes no root attributes.json when it is given the dataset's path
    import tensorstore as ts

    root = tmp_path / "c.n5"
    metadata = {"dimensions": [5, 9], "blockSize": [2, 4], "dataType": "uint16"}
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(root)}, "path": "ds"}
    store = ts.open({**spec, "metadata": metadata, "create": True}).result()
    store[...] = np.arange(45, dtype="u2").reshape(5, 9)
    assert not (root / "attributes.json").exists()
    assert is_n5(str(root))
    with assert_unchanged(root):
        report = inspect_n5(str(root), None, None)
    assert isinstance(report, GroupReport)
    (dataset,) = report.children
    assert isinstance(dataset, ArrayReport) and dataset.path == "/ds"
    assert dataset.shape == (5, 9) and dataset.chunks == (2, 4) and dataset.dtype == "uint16"
    assert dataset.chunks_stored == 9
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert not is_n5(str(empty))


def _nested_container(root: Path) -> np.ndarray:
    """A container tensorstore wrote with ``path="volumes/raw"``: no attributes.json above."""
    import tensorstore as ts

    metadata = {"dimensions": [5, 9], "blockSize": [2, 4], "dataType": "uint16"}
    spec = {
        "driver": "n5",
        "kvstore": {"driver": "file", "path": str(root)},
        "path": "volumes/raw",
    }
    store = ts.open({**spec, "metadata": metadata, "create": True}).result()
    store[...] = np.arange(45, dtype="u2").reshape(5, 9)
    assert not (root / "attributes.json").exists()
    assert not (root / "volumes" / "attributes.json").exists()
    return store.read().result()


def test_a_dataset_nested_below_folders_without_attributes_is_found(tmp_path):
    from mixle.data.sources.arrays.n5 import read_n5
    from mixle.inspection.store import inspect_store

    root = tmp_path / "c.n5"
    want = _nested_container(root)
    np.testing.assert_array_equal(read_n5(root, "volumes/raw")[...], want)
    assert is_n5(str(root))
    with assert_unchanged(root):
        report = inspect_store(root)
    assert report.kind == "n5"
    (volumes,) = report.root.children
    assert isinstance(volumes, GroupReport) and volumes.path == "/volumes"
    (raw,) = volumes.children
    assert isinstance(raw, ArrayReport) and raw.path == "/volumes/raw"
    assert raw.shape == (5, 9) and raw.chunks == (2, 4) and raw.chunks_stored == 9


def test_the_probe_below_a_folder_without_attributes_is_bounded(tmp_path, monkeypatch):
    root = tmp_path / "c.n5"
    _nested_container(root)
    (root / "a").mkdir()  # looked into before "volumes"
    assert is_n5(str(root))
    monkeypatch.setattr(n5_files, "MAX_PROBED_DEPTH", 1)  # the dataset is two levels down
    assert not is_n5(str(root))
    with pytest.raises(UnsupportedStoreError, match="MAX_PROBED_DEPTH=1"):
        inspect_n5(str(root), None, None)
    monkeypatch.setattr(n5_files, "MAX_PROBED_DEPTH", 4)
    monkeypatch.setattr(n5_files, "MAX_PROBED_FOLDERS", 2)  # a, volumes: not volumes/raw
    assert not is_n5(str(root))
    monkeypatch.setattr(n5_files, "MAX_PROBED_FOLDERS", 3)
    assert is_n5(str(root))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_is_n5_does_not_block_on_a_fifo(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    os.mkfifo(folder / "attributes.json")
    assert not is_n5(str(folder))


def test_reports_of_tensorstore_datasets_match_their_data(tmp_path):
    data = values((9, 5, 3), "float64")
    path = write_n5(tmp_path / "a.n5", data, blocks=(4, 2, 3), compression={"type": "zstd"})
    report = inspect_n5(str(path), None, None)
    assert report.nbytes == ts_read(path).nbytes == data.nbytes
    assert report.data_bytes == data.nbytes
    assert np.prod(report.chunks) * 8 == report.chunk_nbytes
