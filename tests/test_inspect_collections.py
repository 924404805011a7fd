"""``mixle inspect`` on a glob or a table of volumes: counts, shapes, dtypes, chunks, sizes.

Every fact is checked against what zarr-python or h5py report for the files they wrote.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import mixle.inspection.collections as collections_module
from mixle.cli import main
from mixle.inspection import (
    MAX_LISTED,
    CollectionReport,
    format_bytes,
    inspect_volumes,
    is_collection,
)

ROOT = Path(__file__).resolve().parents[1]
ZARR_SHAPES = [((10, 12, 14), (5, 6, 7)), ((16, 12, 14), (8, 6, 7)), ((10, 12, 14), (5, 6, 7)),
               ((8, 8, 8), (8, 8, 8))]  # fmt: skip
H5_SHAPES = [((12, 10, 9), (6, 5, 9)), ((7, 10, 9), None), ((12, 10, 9), (4, 4, 4))]


def write_zarr(path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype="float32"):
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype)
    arr[...] = np.ones(shape, dtype=dtype)
    return arr


def write_h5(path: Path, shape, chunks, dtype="uint16", name="img"):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=np.ones(shape, dtype=dtype), chunks=chunks)


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture
def zarr_glob(tmp_path: Path) -> str:
    folder = tmp_path / "scans"
    folder.mkdir()
    for k, (shape, chunks) in enumerate(ZARR_SHAPES):
        write_zarr(folder / f"s{k}.zarr", shape, chunks)
    return str(folder / "*.zarr")


@pytest.fixture
def h5_table(tmp_path: Path) -> Path:
    rows = []
    for k, (shape, chunks) in enumerate(H5_SHAPES):
        path = tmp_path / f"v{k}.h5"
        write_h5(path, shape, chunks)
        rows.append([str(path), f"subject{k}", k % 2])
    return write_csv(tmp_path / "volumes.csv", ["image_path", "subject", "fold"], rows)


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["inspect", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def truth_zarr(pattern: str) -> list[zarr.Array]:
    return [zarr.open_array(str(p), mode="r") for p in sorted(Path(pattern).parent.glob("*.zarr"))]


def ranked(values: list) -> list:
    return Counter(values).most_common()


# -- what is reported ----------------------------------------------------------------------
def test_glob_of_zarr_stores_reports_what_zarr_reports(zarr_glob, capsys):
    truth = truth_zarr(zarr_glob)
    data = run_json([zarr_glob], capsys)
    assert data["kind"] == "glob" and data["count"] == len(truth) == 4
    (summary,) = data["summaries"]
    shapes = ranked([tuple(a.shape) for a in truth])
    assert [(tuple(s["shape"]), s["count"]) for s in summary["shapes"]] == shapes
    assert [(d["dtype"], d["count"]) for d in summary["dtypes"]] == [("float32", 4)]
    chunks = ranked([tuple(a.chunks) for a in truth])
    assert [(tuple(c["chunks"]), c["count"]) for c in summary["chunks"]] == chunks
    assert data["nbytes"] == summary["nbytes"] == sum(a.nbytes for a in truth)
    assert summary["min_shape"] == [8, 8, 8] and summary["max_shape"] == [16, 12, 14]
    by_key = {Path(v["key"]).name: v for v in data["volumes"]}
    for k, arr in enumerate(truth):
        v = by_key[f"s{k}.zarr"]
        assert tuple(v["shape"]) == arr.shape and tuple(v["chunks"]) == arr.chunks
        assert v["dtype"] == str(arr.dtype) and v["nbytes"] == arr.nbytes and v["error"] is None
    assert data["findings"] == []


def test_glob_text_output_lists_count_shapes_dtypes_chunks_and_size(zarr_glob, capsys):
    total = sum(a.nbytes for a in truth_zarr(zarr_glob))
    assert main(["inspect", zarr_glob]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"{zarr_glob}  glob of 4 volumes"
    assert lines[1] == (
        "  shapes       (8, 8, 8) to (16, 12, 14) per axis; 3 distinct: (10, 12, 14) x2, "
        "(16, 12, 14) x1, (8, 8, 8) x1"
    )
    assert lines[2] == "  dtypes       float32 in every volume"
    assert lines[3] == "  chunks       3 distinct: (5, 6, 7) x2, (8, 6, 7) x1, (8, 8, 8) x1"
    assert lines[4] == f"  total        {format_bytes(total)} decoded"
    assert "warning" not in out


def test_table_of_hdf5_volumes_reports_what_h5py_reports(h5_table, capsys):
    data = run_json([str(h5_table), "--column", "image_path", "--dataset", "img"], capsys)
    assert data["kind"] == "table" and data["count"] == 3
    assert set(data["columns"]) == {"subject", "fold"}
    truth = []
    for k in range(3):
        with h5py.File(h5_table.parent / f"v{k}.h5", "r") as f:
            ds = f["img"]
            truth.append((ds.shape, str(ds.dtype), ds.chunks, ds.nbytes))
    for v, (shape, dtype, chunks, nbytes) in zip(data["volumes"], truth, strict=True):
        assert tuple(v["shape"]) == shape and v["dtype"] == dtype and v["nbytes"] == nbytes
        assert v["chunks"] == (None if chunks is None else list(chunks))
    (summary,) = data["summaries"]
    assert [(tuple(s["shape"]), s["count"]) for s in summary["shapes"]] == ranked(
        [t[0] for t in truth]
    )
    assert [(None if c["chunks"] is None else tuple(c["chunks"]), c["count"])
            for c in summary["chunks"]] == ranked([t[2] for t in truth])  # fmt: skip
    assert data["nbytes"] == sum(t[3] for t in truth)
    # the text names the contiguous volume's layout and the metadata columns
    assert main(["inspect", str(h5_table), "--column", "image_path", "--dataset", "img"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{h5_table}  table of 3 volumes; 2 metadata columns: ")
    assert "none (contiguous) x1" in out and "uint16 in every volume" in out


def test_table_of_aligned_arrays_reports_each_name(tmp_path, capsys):
    rows = []
    for k, shape in enumerate([(6, 8, 8), (9, 8, 8)]):
        write_zarr(tmp_path / f"img{k}.zarr", shape, (3, 4, 4), "float32")
        write_h5(tmp_path / f"lab{k}.h5", shape, (3, 8, 8), "uint8", name="seg")
        rows.append([str(tmp_path / f"img{k}.zarr"), str(tmp_path / f"lab{k}.h5")])
    table = write_csv(tmp_path / "pairs.csv", ["image_path", "label_path"], rows)
    argv = [str(table), "--column", "image=image_path", "--column", "label=label_path",
            "--dataset", "label=seg"]  # fmt: skip
    data = run_json(argv, capsys)
    assert data["names"] == ["image", "label"] and data["count"] == 2
    image, label = data["summaries"]
    assert image["name"] == "image" and label["name"] == "label"
    assert [d["dtype"] for d in image["dtypes"]] == ["float32"]
    assert [d["dtype"] for d in label["dtypes"]] == ["uint8"]
    zarr_bytes = sum(zarr.open_array(r[0], mode="r").nbytes for r in rows)
    h5_bytes = 0
    for r in rows:
        with h5py.File(r[1], "r") as f:
            h5_bytes += f["seg"].nbytes
            assert f["seg"].chunks == (3, 8, 8)
    assert image["nbytes"] == zarr_bytes and label["nbytes"] == h5_bytes
    assert data["nbytes"] == zarr_bytes + h5_bytes
    assert [c["chunks"] for c in label["chunks"]] == [[3, 8, 8]]
    assert main(["inspect", *argv]) == 0
    out = capsys.readouterr().out
    assert "arrays image, label" in out.splitlines()[0]
    assert "\n  image\n    shapes" in out and "\n  label\n    shapes" in out


def test_python_api_gives_the_same_report(zarr_glob):
    report = inspect_volumes(zarr_glob)
    assert isinstance(report, CollectionReport)
    assert report.count == 4 and report.nbytes == sum(a.nbytes for a in truth_zarr(zarr_glob))
    json.dumps(report.to_dict())


# -- volumes that do not fit together ------------------------------------------------------
def test_mixed_dtypes_warn_and_name_the_odd_volume(tmp_path, capsys):
    for k in range(3):
        write_zarr(tmp_path / f"a{k}.zarr", (8, 8, 8), (4, 4, 4), "float32")
    write_zarr(tmp_path / "odd.zarr", (8, 8, 8), (4, 4, 4), "int16")
    pattern = str(tmp_path / "*.zarr")
    data = run_json([pattern], capsys)
    dtypes = {d["dtype"]: d["count"] for d in data["summaries"][0]["dtypes"]}
    assert dtypes == {"float32": 3, "int16": 1}
    odd = next(v for v in data["volumes"] if v["key"].endswith("odd.zarr"))
    assert odd["dtype"] == str(zarr.open_array(str(tmp_path / "odd.zarr"), mode="r").dtype)
    (finding,) = [f for f in data["findings"] if f["code"] == "mixed-dtypes"]
    assert finding["severity"] == "warning"
    assert "float32 in 3 volumes; int16 in 1 volume: " in finding["message"]
    assert "odd.zarr" in finding["message"] and "a0.zarr" not in finding["message"]
    assert main(["inspect", pattern]) == 0  # warnings never change the exit status
    assert "warning      dtypes differ: float32 in 3 volumes; int16 in 1 volume" in (
        capsys.readouterr().out
    )


def test_mixed_ndim_and_channels_warn_naming_volumes_with_their_rows(tmp_path, capsys):
    specs = [("a", (2, 8, 8, 8)), ("b", (2, 8, 8, 8)), ("c", (3, 8, 8, 8)), ("d", (8, 8, 8))]
    rows = []
    for name, shape in specs:
        write_h5(tmp_path / f"{name}.h5", shape, None, "float32")
        rows.append([str(tmp_path / f"{name}.h5")])
    table = write_csv(tmp_path / "t.csv", ["path"], rows)
    data = run_json([str(table), "--column", "path", "--dataset", "img"], capsys)
    codes = {f["code"]: f["message"] for f in data["findings"]}
    assert "mixed-ndim" in codes
    assert f"3 axes in 1 volume: '{tmp_path / 'd.h5'}' (row 3)" in codes["mixed-ndim"]
    # the 4-D ones alone: their channel axis differs
    table2 = write_csv(tmp_path / "t2.csv", ["path"], rows[:3])
    data = run_json([str(table2), "--column", "path", "--dataset", "img"], capsys)
    codes = {f["code"]: f["message"] for f in data["findings"]}
    assert set(codes) == {"mixed-channels"}
    assert f"(3,) in 1 volume: '{tmp_path / 'c.h5'}' (row 2)" in codes["mixed-channels"]
    assert "(2,) in 2 volumes" in codes["mixed-channels"]


def test_many_shapes_print_the_most_common_and_a_count(tmp_path, capsys):
    n = MAX_LISTED + 3
    for k in range(n):
        write_zarr(tmp_path / f"v{k:02d}.zarr", (4 + k, 4, 4), (4, 4, 4))
    write_zarr(tmp_path / "w.zarr", (4, 4, 4), (4, 4, 4))  # (4, 4, 4) is the most common
    assert main(["inspect", str(tmp_path / "*.zarr")]) == 0
    shapes = capsys.readouterr().out.splitlines()[1]
    assert f"{n} distinct: (4, 4, 4) x2, (5, 4, 4) x1," in shapes
    assert shapes.endswith(", and 3 more")
    assert shapes.count(") x") == MAX_LISTED


# -- bad input -----------------------------------------------------------------------------
def assert_one_line_error(capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("mixle inspect: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for part in parts:
        assert part in err, err
    return err


def test_glob_matching_nothing_is_a_clear_error(tmp_path, capsys):
    pattern = str(tmp_path / "nothing*.zarr")
    assert main(["inspect", pattern]) == 1
    assert_one_line_error(capsys, pattern, "the glob matches no file or folder")


def test_missing_file_in_table_is_named_with_its_row(h5_table, tmp_path, capsys):
    with open(h5_table, newline="") as fh:
        rows = list(csv.reader(fh))
    rows[2][0] = str(tmp_path / "gone.h5")  # row 1 (the second data row)
    write_csv(h5_table, rows[0], rows[1:])
    assert main(["inspect", str(h5_table), "--column", "image_path", "--dataset", "img"]) == 1
    assert_one_line_error(capsys, "gone.h5", "row 1")


def test_table_without_the_named_column_is_a_clear_error(h5_table, capsys):
    assert main(["inspect", str(h5_table), "--column", "scan_path", "--dataset", "img"]) == 1
    assert_one_line_error(capsys, "scan_path")


def test_unreadable_volume_is_reported_and_exits_1(tmp_path, capsys):
    for k in range(2):
        write_zarr(tmp_path / f"ok{k}.zarr", (4, 4, 4), (2, 2, 2))
    bad = tmp_path / "bad.zarr"
    bad.mkdir()
    (bad / "zarr.json").write_text("{not json")
    pattern = str(tmp_path / "*.zarr")
    assert main(["inspect", pattern]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{pattern}  glob of 3 volumes")
    assert "warning      1 volume of 3 could not be read: " in captured.out
    assert "bad.zarr" in captured.out and "Traceback" not in captured.err
    assert (
        captured.err == f"mixle inspect: {pattern}: 1 volume of 3 could not be read "
        "(named in the report)\n"
    )
    good = math.prod((4, 4, 4)) * 4 * 2
    assert f"total        {good} B decoded (the 2 arrays read)" in captured.out


@pytest.mark.parametrize(
    "extra",
    [["--patch", "4"], ["--column", "a=x", "--column", "a=y"]],
)
def test_collection_usage_errors_exit_2(zarr_glob, extra, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["inspect", zarr_glob, *extra])
    assert exc.value.code == 2
    assert "usage: mixle inspect" in capsys.readouterr().err


def test_dataset_on_one_store_is_a_usage_error_and_a_bracketed_name_is_a_store(tmp_path, capsys):
    store = tmp_path / "scan[1].zarr"
    write_zarr(store, (4, 4), (2, 2))
    with pytest.raises(SystemExit) as exc:
        main(["inspect", str(store), "--dataset", "img"])
    assert exc.value.code == 2
    assert "--dataset and --component name the array inside each volume" in (
        capsys.readouterr().err
    )
    assert main(["inspect", str(store)]) == 0  # exists: a store, not a glob
    assert "zarr v3 array (4, 4) float32" in capsys.readouterr().out


def test_what_counts_as_a_collection(tmp_path):
    assert is_collection(str(tmp_path / "*.zarr"))
    assert not is_collection(str(tmp_path / "scan.zarr"))
    assert is_collection(str(tmp_path / "scan.zarr"), table=True)
    assert is_collection("s3://bucket/scans/*.zarr")
    assert not is_collection("https://example.org/v.h5?token=abc")  # a query, not a glob
    assert not is_collection("http://[::1]:8000/v.zarr")  # an IPv6 host


def test_table_given_without_column_says_which_columns_it_has(h5_table, capsys):
    assert main(["inspect", str(h5_table)]) == 1
    assert_one_line_error(capsys, "is a table: give --column", "image_path, subject, fold")


def test_a_fresh_process_reads_every_volume(tmp_path):
    """The first volumes import zarr and h5py; threads importing them at once saw them half
    initialised ("partially initialized module 'zarr'") and reported readable volumes as
    unreadable."""
    rows = []
    for k in range(12):
        write_zarr(tmp_path / f"z{k}.zarr", (4, 4, 4), (2, 2, 2))
        write_h5(tmp_path / f"h{k}.h5", (4, 4, 4), (2, 2, 2))
        rows += [[str(tmp_path / f"z{k}.zarr")], [str(tmp_path / f"h{k}.h5")]]
    table = write_csv(tmp_path / "mixed.csv", ["path"], rows)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "mixle", "inspect", str(table), "--column", "path",
            "--dataset", "img", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    data = json.loads(done.stdout)
    assert data["count"] == 24 and all(v["error"] is None for v in data["volumes"])
    assert [(d["dtype"], d["count"]) for d in data["summaries"][0]["dtypes"]] == [
        ("float32", 12),
        ("uint16", 12),
    ]


def open_h5_files() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").endswith(".h5")
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@pytest.mark.parametrize("max_open", [1, 3])
def test_metadata_is_read_with_a_bounded_number_of_open_files(tmp_path, monkeypatch, max_open):
    for k in range(40):
        write_h5(tmp_path / f"v{k:02d}.h5", (4, 4, 4), (2, 2, 2))
    real = collections_module.read_volumes
    peak = [0]
    lock = threading.Lock()

    @contextlib.contextmanager
    def counted(lease, i):
        with lease(i) as src:
            src.shape  # noqa: B018  (the file is open now)
            with lock:
                peak[0] = max(peak[0], open_h5_files())
            time.sleep(0.002)  # hold it a moment, so that overlapping opens would show
            yield src

    def read_volumes(*args, **kwargs):
        vols = real(*args, **kwargs)
        if isinstance(args[0], list):  # one array's own collection
            vols.lease = functools.partial(counted, vols.lease)
        return vols

    monkeypatch.setattr(collections_module, "read_volumes", read_volumes)
    report = inspect_volumes(str(tmp_path / "*.h5"), dataset="img", max_open=max_open)
    assert report.count == 40 and not report.unreadable
    assert 1 <= peak[0] <= max_open
    assert open_h5_files() == 0  # every file closed once read
