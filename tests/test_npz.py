"""``.npz`` files: every read path of ``read_npz`` equals ``np.load(path)[name]``.

Files are written with ``np.savez`` (members stored, memory-mapped in place) and
``np.savez_compressed`` (members deflated, refused unless ``decompress=True``), with several
dtypes (big-endian too), Fortran order, odd shapes, 0-d and empty arrays; the answer is
always NumPy's own read of the same file, and the file is never changed.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fork_child import in_forked_child

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.arrays.npz import NpzArraySource, read_npz
from mixle.data.sources.arrays.npz import cache as npz_cache
from mixle.data.sources.arrays.npz.cache import NPZ_CACHE_FOLDER
from mixle.errors import (
    ArrayNotFoundError,
    CorruptChunkError,
    FileChangedError,
    UnsupportedStoreError,
)
from mixle.inspection.npz_files import inspect_npz, is_npz
from mixle.inspection.report import ArrayReport
from mixle.testing import assert_unchanged, check_array_source

SHAPE = (7, 10, 9)
PATCH = (2, 3, 4)
STARTS = [[0, 0, 0], [2, 3, 3], [5, 7, 5], [1, 6, 0]]
DTYPES = ["<f4", ">f8", ">i2", "<u1", ">u4", "?", "<c8", "<i8"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "cache"))


def _values(dtype: str, shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 200, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _box(corner: Any, size: Any) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(corner, size))


def assert_every_path_is_numpy(path: Path, name: str, *, decompress: bool = False) -> None:
    """Every read path of ``read_npz(path, name)`` gives ``np.load(path)[name]``."""
    with np.load(path) as f:
        want = f[name]
    with assert_unchanged(path):
        src = read_npz(path, name, decompress=decompress)
        assert src.dtype == want.dtype and src.shape == want.shape
        np.testing.assert_array_equal(src[...], want)
        if want.ndim == 3:
            for key in [(1,), (-1, slice(2, 8), 3), (Ellipsis, slice(None, None, -2))]:
                np.testing.assert_array_equal(src[key], want[key], err_msg=f"key={key!r}")
            boxes = src.read_boxes(STARTS, PATCH)
            for got, corner in zip(boxes, STARTS):
                np.testing.assert_array_equal(got, want[_box(corner, PATCH)])
            rows = np.array([6, 0, 3, 3, -1])
            np.testing.assert_array_equal(src.get_batch(rows), want[rows])
            sampler = PatchSampler(src, PATCH, num_patches=8, seed=3)
            patches, corners = sampler.get_batch(np.arange(8))
            for patch, corner in zip(patches, corners):
                np.testing.assert_array_equal(patch, want[_box(corner, PATCH)])
        check_array_source(src, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stored_members_equal_numpy(tmp_path, dtype):
    path = tmp_path / "a.npz"
    data = _values(dtype)
    np.savez(path, volume=data, fortran=np.asfortranarray(data))
    for name in ("volume", "fortran"):
        assert_every_path_is_numpy(path, name)
    src = read_npz(path, "fortran")
    assert src.mapped_path == str(path)  # mapped in place
    assert src.array.flags.f_contiguous


def test_stored_members_are_mapped_not_read(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=_values("<f4"))
    src = read_npz(path, "x")
    assert isinstance(src.array, np.memmap) and src.array.filename == str(path)
    assert not src.array.flags.writeable


@pytest.mark.parametrize(
    "shape", [(), (0,), (0, 3), (1, 1), (13, 1, 2), (2, 3, 1, 5)], ids=lambda s: str(s)
)
def test_odd_shapes(tmp_path, shape):
    path = tmp_path / "a.npz"
    data = _values(">i4", shape)
    np.savez(path, a=data)
    np.savez_compressed(tmp_path / "c.npz", a=data)
    for p, decompress in ((path, False), (tmp_path / "c.npz", True)):
        with np.load(p) as f:
            want = f["a"]
        check_array_source(read_npz(p, decompress=decompress), want)


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<u2"])
def test_compressed_members_with_decompress_equal_numpy(tmp_path, dtype):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=_values(dtype), f=np.asfortranarray(_values(dtype)))
    for name in ("x", "f"):
        assert_every_path_is_numpy(path, name, decompress=True)
    cached = read_npz(path, "x", decompress=True).mapped_path
    assert cached is not None and Path(cached).parent == tmp_path / "cache" / NPZ_CACHE_FOLDER


def test_a_compressed_member_is_refused_naming_both_ways_out(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, image=_values("<f4"))
    with assert_unchanged(path), pytest.raises(ValueError, match="compressed") as info:
        read_npz(path, "image")
    message = str(info.value)
    for part in ("'image'", "compressed", "decompress=True", "np.savez"):
        assert part in message, message
    assert not (tmp_path / "cache").exists()  # nothing decompressed unasked


def test_the_cache_is_made_once_keyed_by_content_and_written_atomically(tmp_path):
    data = _values("<f4")
    np.savez_compressed(tmp_path / "one.npz", x=data)
    np.savez_compressed(tmp_path / "two.npz", renamed=data)  # same bytes, other name
    first = read_npz(tmp_path / "one.npz", decompress=True)
    cached = Path(first.mapped_path or "")
    made = cached.stat().st_mtime_ns
    second = read_npz(tmp_path / "two.npz", decompress=True)
    assert second.mapped_path == str(cached) and cached.stat().st_mtime_ns == made
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # no partial files
    np.savez_compressed(tmp_path / "one.npz", x=data + 1)  # new content: a new cache file
    third = read_npz(tmp_path / "one.npz", decompress=True)
    assert third.mapped_path != str(cached)
    np.testing.assert_array_equal(third[...], data + 1)
    np.testing.assert_array_equal(first[...], data)


def test_name_selection(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, a=np.zeros(3), b=np.ones((2, 2)))
    with np.load(path) as f:
        assert f.files == ["a", "b"]
    np.testing.assert_array_equal(read_npz(path, "b.npy")[...], np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"holds 2 arrays, so name= must say which.*arrays: a, b"):
        read_npz(path)
    with pytest.raises(ArrayNotFoundError, match=r"name='c' is not in .*arrays: a, b"):
        read_npz(path, "c")
    with pytest.raises(TypeError, match="name=3"):
        read_npz(path, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decompress='yes'"):
        read_npz(path, "a", decompress="yes")  # type: ignore[arg-type]
    single = tmp_path / "one.npz"
    np.savez(single, np.arange(5))  # positional: arr_0
    src = read_npz(single)
    assert src.member == "arr_0"
    np.testing.assert_array_equal(src[...], np.arange(5))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _append(path: Path, name: str, payload: bytes, method: int = zipfile.ZIP_DEFLATED) -> None:
    """Add ``name`` to the zip at ``path`` with zipfile's append mode (a name can repeat)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Duplicate name", UserWarning)
        with zipfile.ZipFile(path, "a", method) as zf:
            zf.writestr(name, payload)


@pytest.mark.parametrize(
    "method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"]
)
def test_a_name_written_twice_reads_the_entry_numpy_reads(tmp_path, method):
    # a zip updated in place holds "x.npy" twice; np.load reads the newer entry, and the
    # decompressed copy must be keyed by the entry read (else it poisons the cache)
    old, new = np.arange(10.0), -np.arange(10.0)
    updated, other = tmp_path / "updated.npz", tmp_path / "other.npz"
    with zipfile.ZipFile(updated, "w", method) as zf:
        zf.writestr("x.npy", _npy(old))
    _append(updated, "x.npy", _npy(new), method)
    with zipfile.ZipFile(other, "w", method) as zf:
        zf.writestr("x.npy", _npy(old))
    compressed = method != zipfile.ZIP_STORED
    for path in (updated, other):
        with np.load(path) as ref:
            want = ref["x"]
        for name in ("x", "x.npy", None):
            got = read_npz(path, name, decompress=compressed)[...]
            np.testing.assert_array_equal(got, want, err_msg=f"{path.name} {name}")
    report = inspect_npz(str(updated), None, None)
    assert [c.path for c in report.children] == ["/x"]


def test_an_exact_name_wins_over_its_npy_name_as_in_numpy(tmp_path):
    path = tmp_path / "both.npz"
    np.savez(path, x=np.arange(3.0))  # "x.npy"
    _append(path, "x", _npy(np.ones((2, 2))), zipfile.ZIP_STORED)  # a raw member "x"
    _append(path, "y.npy", _npy(np.zeros(4)), zipfile.ZIP_STORED)
    with np.load(path) as ref:
        want_x, want_xnpy, want_y = ref["x"], ref["x.npy"], ref["y"]
    np.testing.assert_array_equal(read_npz(path, "x")[...], want_x)
    np.testing.assert_array_equal(read_npz(path, "x.npy")[...], want_xnpy)
    np.testing.assert_array_equal(read_npz(path, "y")[...], want_y)
    report = inspect_npz(str(path), None, None)
    assert sorted(c.path for c in report.children) == ["/x.npy", "/y"]


def test_a_cached_copy_with_another_header_is_not_used(tmp_path):
    data = np.arange(24, dtype="<f8").reshape(4, 6)
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=data)
    cached = Path(read_npz(path, decompress=True).mapped_path or "")
    raw = cached.read_bytes()
    assert b"'<f8'" in raw[:128]
    cached.write_bytes(raw.replace(b"'<f8'", b"'>f8'", 1))  # same size, other header
    np.testing.assert_array_equal(read_npz(path, decompress=True)[...], data)


def test_a_copy_published_meanwhile_is_kept_not_replaced(tmp_path, monkeypatch):
    # a second process that found no copy decompresses too; publishing must not replace
    # the copy the first one mapped (its next read raised FileChangedError)
    data = _values("<f4")
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=data)
    first = read_npz(path, decompress=True)
    np.testing.assert_array_equal(first[1], data[1])
    monkeypatch.setattr(npz_cache.Path, "is_file", lambda self: False)  # "not there yet"
    second = read_npz(path, decompress=True)
    monkeypatch.undo()
    assert second.mapped_path == first.mapped_path
    np.testing.assert_array_equal(first[...], data)
    np.testing.assert_array_equal(second[...], data)
    assert [p.name for p in Path(first.mapped_path or "").parent.iterdir()] == [
        Path(first.mapped_path or "").name
    ]  # no temporary files left


def _open_and_read(path: str, barrier: Any, results: Any) -> None:  # pragma: no cover - child
    try:
        barrier.wait(30)
        src = read_npz(path, decompress=True)
        barrier.wait(30)  # every process has mapped its copy before any reads
        results.put(float(src[...].sum()))
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def test_processes_decompressing_at_once_all_read_the_values(tmp_path):
    data = _values("<f8", (64, 64, 32))
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=data)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        procs = [
            ctx.Process(target=_open_and_read, args=(str(path), barrier, results)) for _ in range(4)
        ]
        for proc in procs:
            proc.start()
    got = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert not proc.is_alive()
    assert got == [float(data.sum())] * 4


def test_object_arrays_are_refused(tmp_path):
    path = tmp_path / "o.npz"
    np.savez(path, o=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match="Python objects"):
        read_npz(path, "o")


def test_a_member_that_is_not_npy_is_refused(tmp_path):
    path = tmp_path / "z.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("notes.txt", b"hello")
    with pytest.raises(ValueError, match=r"not a \.npy array"):
        read_npz(path, "notes.txt")


def test_zip64_directories_are_read(tmp_path, monkeypatch):
    data = _values(">i2")
    path = tmp_path / "z64.npz"
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 8)  # every size and offset goes to ZIP64 fields
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)  # a ZIP64 end of central directory
    np.savez(path, a=data, b=data[::-1].copy())
    monkeypatch.undo()
    assert b"PK\x06\x06" in path.read_bytes()  # the ZIP64 end record is there
    for name in ("a", "b"):
        assert_every_path_is_numpy(path, name)


def test_truncated_and_corrupt_files_raise_clearly(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=_values("<f8"))
    raw = path.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="zip directory cannot be read"):
        read_npz(cut)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match=r"not a \.npz file"):
        read_npz(junk)
    at = raw.find(b"\x93NUMPY")
    bad = bytearray(raw)
    bad[at : at + 6] = b"XXXXXX"  # the member's .npy magic
    broken = tmp_path / "broken.npz"
    broken.write_bytes(bytes(bad))
    with assert_unchanged(broken), pytest.raises(ValueError, match="no NUMPY magic"):
        read_npz(broken)
    bad = bytearray(raw)
    bad[0:4] = b"XXXX"  # the local header
    broken.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="no zip local header"):
        read_npz(broken)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_npz(tmp_path / "missing.npz")
    with pytest.raises(TypeError, match="path=1"):
        read_npz(1)  # type: ignore[arg-type]


def test_a_corrupt_compressed_member_raises_and_caches_nothing(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=np.arange(4000, dtype="<i4"))
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("x.npy")
    middle = info.header_offset + 30 + len("x.npy") + 40 + info.compress_size // 2
    raw[middle : middle + 4] = bytes(b ^ 0x5A for b in raw[middle : middle + 4])
    path.write_bytes(bytes(raw))
    with assert_unchanged(path), pytest.raises(CorruptChunkError, match=r"member 'x' of .*c\.npz"):
        read_npz(path, decompress=True)
    folder = tmp_path / "cache" / NPZ_CACHE_FOLDER
    assert not folder.exists() or not list(folder.iterdir())


def test_pickles_by_reference_and_reopens_after_fork(tmp_path):
    path = tmp_path / "a.npz"
    data = _values("<f4")
    np.savez(path, x=data)
    src = read_npz(path, "x")
    blob = pickle.dumps(src)
    assert len(blob) < 600
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone)
    np.testing.assert_array_equal(clone[3], data[3])
    parent = src.array

    def child() -> list[str]:
        problems = []
        if not np.array_equal(src.read_boxes(STARTS, PATCH)[1], data[_box(STARTS[1], PATCH)]):
            problems.append("the child read other values")
        if src.array is parent:
            problems.append("the child kept the parent's map")
        return problems

    assert in_forked_child(child) == []


def test_a_file_cut_short_after_opening_raises_instead_of_crashing(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=_values("<f8"))
    copy = tmp_path / "b.npz"
    shutil.copy(path, copy)
    src = read_npz(copy)
    os.truncate(copy, 200)
    with pytest.raises(FileChangedError, match="truncated"):
        src.read_boxes([[5, 5, 5]], (2, 2, 2))


def test_source_class_is_exported():
    assert read_npz.__module__ == NpzArraySource.__module__


# -- mixle inspect ---------------------------------------------------------------------------


def test_is_npz(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros(3))
    np.savez_compressed(tmp_path / "c.bin", x=np.zeros(3))  # any name: the .npy members count
    assert is_npz(str(tmp_path / "a.npz")) and is_npz(str(tmp_path / "c.bin.npz"))
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("notes.txt", b"hello")
    np.save(tmp_path / "x.npy", np.zeros(3))
    for other in ("other.zip", "x.npy", "missing.npz", "."):
        assert not is_npz(str(tmp_path / other)), other
    assert not is_npz("s3://bucket/a.npz")


def test_inspect_npz_reports_each_member(tmp_path):
    path = tmp_path / "a.npz"
    data = _values(">f8")
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in (("b", np.asfortranarray(data)), ("a", data[:2])):
            with zf.open(f"{name}.npy", "w") as out:
                np.save(out, array)
        zf.writestr("notes.txt", b"hello")
    with assert_unchanged(path):
        group = inspect_npz(str(path), None, (2, 2, 2))
    assert group.format == "npz" and [c.path for c in group.children] == ["/a", "/b"]
    a, b = group.children
    assert isinstance(a, ArrayReport) and isinstance(b, ArrayReport)
    assert a.shape == (2, 10, 9) and a.dtype == ">f8" and a.order == "C"
    assert b.shape == SHAPE and b.order == "F" and not b.compressed and b.codecs == ()
    assert b.nbytes == data.nbytes and b.patch_cost is not None
    assert [f.code for f in group.findings] == ["members-unlisted"]
    assert group.to_dict()["children"][1]["name"] == "b"


def test_inspect_npz_warns_that_compressed_members_cannot_be_mapped(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=np.zeros((50, 40), "<f4"), o=np.array([None], dtype=object))
    group = inspect_npz(str(path), None, None)
    reports = {c.name: c for c in group.children}
    x = reports["x"]
    assert isinstance(x, ArrayReport)
    assert x.compressed and x.codecs == ("deflate",) and x.shape == (50, 40)
    assert x.stored_bytes is not None and x.stored_bytes < x.nbytes  # type: ignore[operator]
    warning = next(f for f in x.findings if f.code == "compressed-member")
    assert warning.severity == "warning"
    assert "decompress=True" in warning.message and "np.savez" in warning.message
    assert "sizes-unknown" in [f.code for f in reports["o"].findings]


def test_inspect_npz_refuses_what_is_not_a_zip(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(UnsupportedStoreError, match="zip directory cannot be read"):
        inspect_npz(str(junk), None, None)
