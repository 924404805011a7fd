"""benchmarks/patch_read.py runs at a tiny size and prints every row of its two tables: the
cubes (zarr, HDF5, memmap against naive slicing and tensorstore) and the formats (mixle's
TIFF, NIfTI, N5 and b2nd readers against each format library's own read), whose batches
hold the values the library reads (the ``same`` column)."""

from __future__ import annotations

import pytest
from _benchmark_runs import run_quick

for _library in ("zarr", "h5py", "tensorstore", "tifffile", "nibabel", "blosc2"):
    pytest.importorskip(_library)

CUBES = [
    ("zarr zstd", "naive"),
    ("zarr zstd", "tensorstore"),
    ("zarr zstd", "tensorstore, no cache"),
    ("zarr zstd", "per-index"),
    ("zarr zstd", "batched"),
    ("zarr zstd", "batched, no cache"),
    ("zarr zstd", "batched, 384 MiB cache"),
    ("zarr zstd", "locality"),
    ("hdf5 gzip", "naive"),
    ("hdf5 gzip", "per-index"),
    ("hdf5 gzip", "batched"),
    ("hdf5 gzip", "batched, no cache"),
    ("hdf5 raw", "naive"),
    ("hdf5 raw", "naive, no stack"),
    ("hdf5 raw", "per-index"),
    ("hdf5 raw", "batched"),
    ("memmap", "naive"),
    ("memmap", "naive, no stack"),
    ("memmap", "per-index"),
    ("memmap", "batched"),
]
CHUNKED = ["library", "mixle", "mixle, no cache"]
FORMATS = {
    "tiff": CHUNKED,
    "nii": ["library", "mixle"],  # memory-mapped: no decoded chunks to cache
    "nii.gz": ["library", "mixle", "mixle, copy kept"],  # the inflated copy deleted or kept
    "n5": CHUNKED,
    "b2nd": CHUNKED,
}


@pytest.mark.slow
def test_patch_read_benchmark_quick_run_prints_both_tables(tmp_path):
    stdout, rows = run_quick("patch_read.py", tmp_path)
    cubes = [r for r in rows if r["table"] == "cubes"]
    assert [(r["backend"], r["method"]) for r in cubes] == CUBES
    for r in cubes:
        assert r["rate"] > 0 and r["x_naive"] > 0 and r["rss_peak"] >= r["rss_ready"] > 0, r
        assert f"{r['backend']:<10} {r['method']:<23} {r['rate']:>10.0f}" in stdout, r

    formats = [r for r in rows if r["table"] == "formats"]
    assert [(r["format"], r["contender"]) for r in formats] == [
        (name, contender) for name, contenders in FORMATS.items() for contender in contenders
    ]
    assert len(rows) == len(cubes) + len(formats)
    for r in formats:
        assert "missing" not in r, r  # every reader imported
        assert r["same"] is True, r  # mixle's batch equals the volume and the library's read
        assert r["rate"] > 0 and r["rounds"] == 2, r  # --quick
        assert r["x_library_low"] <= r["x_library"] <= r["x_library_high"], r
        if r["contender"] == "library":
            assert r["x_library"] == 1.0, r
        else:
            assert r["read"] == "read_boxes", r
        chunked = r["contender"] != "library" and FORMATS[r["format"]] == CHUNKED
        assert (r["chunks_per_patch"] is not None) == chunked, r
        if chunked:
            assert r["chunks_per_patch"] > 0, r  # the cache is emptied before every pass
        assert f"{r['format']:<7} stored: {r['stored']}" in stdout, r
    for name, contenders in FORMATS.items():
        lines = [line for line in stdout.splitlines() if line.startswith(f"{name:<7} ")]
        assert len(lines) == 1 + len(contenders), lines  # the stored line and its rows
    assert "cached: the OS page cache is warm" in stdout
    assert "chunk_cache().clear()" in stdout
    assert "cached (nii.gz): mixle: 'mixle' deletes its inflated on-disk copy" in stdout
    assert (tmp_path / "mixle-cache" / "nifti").is_dir()  # never the user's cache folder
    goals = {
        "mixle": "tiff, nii, nii.gz, n5, b2nd",
        "mixle, no cache": "tiff, n5, b2nd",
        "mixle, copy kept": "nii.gz",
    }
    for label, names in goals.items():
        assert f"goal ({label}): >= 1.5x the library's own read ({names}): worst " in stdout


PASS = {
    "zarr zstd": [
        "naive",
        "tensorstore",
        "mixle",
        "mixle, fresh pages",
        "mixle, get_batch (no plan)",
    ],
    "hdf5 gzip": ["naive", "mixle", "mixle, fresh pages", "mixle, get_batch (no plan)"],
}


@pytest.mark.slow
def test_patch_read_pass_table_decodes_each_chunk_of_a_pass_once(tmp_path):
    stdout, rows = run_quick("patch_read.py", tmp_path, "--only", "pass")
    table = [r for r in rows if r["table"] == "pass"]
    assert [(r["backend"], r["contender"]) for r in table] == [
        (b, c) for b, contenders in PASS.items() for c in contenders
    ]
    for r in table:
        assert r["same"] is True and r["rate"] > 0, r  # the first batch is the library's
        if r["contender"] in ("mixle", "mixle, fresh pages"):  # planned: each chunk once
            assert r["decodes"] == r["distinct"], r
    threads = [r for r in rows if r["table"] == "pass threads"]
    assert {r["backend"] for r in threads} == set(PASS) and all(r["speedup"] > 0 for r in threads)
    for r in threads:  # every thread count ran its passes beside the others, limit included
        assert r["passes"] == 2 and r["limit_ms"] > 0 and r["decodes"] == r["distinct"], r
    bare = [r for r in rows if r["table"] == "pass bare decode"]
    assert [r["backend"] for r in bare] == list(PASS) and all(r["speedup"] > 0 for r in bare)
    for r in bare:  # the most x limit the machine's own scaling allows a pass
        assert r["x_limit"] == pytest.approx(r["speedup"] / r["threads"]), r
    assert "goal (zarr zstd): mixle >= 0.85x limit" in stdout
    assert "the bare decodes on these threads reach" in stdout
    assert "the rows take turns pass by pass" in stdout
    assert "goal (zarr zstd): mixle decodes within 10% of the distinct chunks" in stdout
