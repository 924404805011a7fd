"""The decompressed copy of a ``.nii.gz`` in the cache, and bad NIfTI input.

A gzipped image is decompressed once per content into ``$MIXLE_CACHE_DIR``; a copy of the
wrong size or content is rebuilt, never read; a corrupt stream raises naming the file and
leaves nothing behind; files that are not NIfTI, or shorter than their header says, raise
naming the path and the sizes. The user's files are never changed.
"""

from __future__ import annotations

import gzip
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from mixle.data.sources.arrays.nifti import files, gz_cache, read_nifti
from mixle.errors import CorruptChunkError, FileChangedError
from mixle.testing import assert_unchanged

DATA = (np.arange(6 * 5 * 4, dtype=np.int16).reshape(6, 5, 4) * 7 - 50).astype(np.int16)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def inflations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The gzip files decompressed from now on (one entry per full decompression)."""
    calls: list[str] = []
    real = gz_cache._inflate

    def counted(path: str, *args: object) -> int:
        calls.append(path)
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(gz_cache, "_inflate", counted)
    return calls


def _save(path: Path, data: np.ndarray = DATA) -> Path:
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
    return path


def _entries(cache: Path) -> list[Path]:
    folder = cache / gz_cache.CACHE_FOLDER
    return sorted(folder.iterdir()) if folder.exists() else []


def test_a_gz_is_decompressed_once_and_later_opens_map_the_copy(
    tmp_path: Path, cache: Path, inflations: list[str]
) -> None:
    path = _save(tmp_path / "v.nii.gz")
    with assert_unchanged(path):
        first = read_nifti(path)
        np.testing.assert_array_equal(first[...], DATA)
        assert inflations == [str(path)]
        (entry,) = _entries(cache)
        assert first.cache_path == entry and entry.suffix == ".raw"
        assert not os.access(entry, os.W_OK) or os.geteuid() == 0  # written read-only
        second = read_nifti(path)
        np.testing.assert_array_equal(second[2:4, ::-1], DATA[2:4, ::-1])
        assert inflations == [str(path)]  # served from the cache
        assert second.cache_path == entry
        assert not second.array.flags.writeable


def test_a_cached_copy_of_the_wrong_size_is_rebuilt_not_served(
    tmp_path: Path, cache: Path, inflations: list[str]
) -> None:
    path = _save(tmp_path / "v.nii.gz")
    read_nifti(path).close()
    (entry,) = _entries(cache)
    good = entry.read_bytes()
    os.chmod(entry, 0o644)
    entry.write_bytes(good[:-10])  # cut short
    np.testing.assert_array_equal(read_nifti(path)[...], DATA)
    assert len(inflations) == 2 and entry.read_bytes() == good
    os.chmod(entry, 0o644)
    entry.write_bytes(b"\0" * len(good))  # right size, not this file's header
    np.testing.assert_array_equal(read_nifti(path)[...], DATA)
    assert len(inflations) == 3 and entry.read_bytes() == good


def test_a_changed_gz_gets_a_new_copy_and_the_old_one_is_deleted(
    tmp_path: Path, cache: Path, inflations: list[str]
) -> None:
    path = _save(tmp_path / "v.nii.gz")
    old = read_nifti(path)
    old[0]
    (entry,) = _entries(cache)
    _save(path, DATA + 1)  # rewritten: new content
    with pytest.raises(FileChangedError, match=r"v\.nii\.gz.*open the source again"):
        old[0]
    new = read_nifti(path)
    np.testing.assert_array_equal(new[...], DATA + 1)
    assert _entries(cache) == [new.cache_path] and new.cache_path != entry
    assert len(inflations) == 2


def test_a_corrupt_gzip_names_the_file_and_leaves_no_cache_entry(
    tmp_path: Path, cache: Path
) -> None:
    path = _save(tmp_path / "v.nii.gz", np.random.default_rng(0).standard_normal((40, 30, 20)))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(64)  # damage the deflate stream
    path.write_bytes(bytes(raw))
    with assert_unchanged(path), pytest.raises(CorruptChunkError, match=r"v\.nii\.gz"):
        read_nifti(path)
    assert _entries(cache) == []  # no entry, no temporary file


def test_a_bad_crc_is_refused(tmp_path: Path, cache: Path) -> None:
    path = _save(tmp_path / "v.nii.gz")
    raw = bytearray(path.read_bytes())
    raw[-8] ^= 0xFF  # the CRC-32 of the trailer
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"v\.nii\.gz.*corrupt gzip"):
        read_nifti(path)
    assert _entries(cache) == []


def test_a_gz_cut_inside_the_stream_is_refused(tmp_path: Path, cache: Path) -> None:
    path = _save(tmp_path / "v.nii.gz", np.random.default_rng(1).standard_normal((30, 20, 10)))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptChunkError, match=r"v\.nii\.gz"):
        read_nifti(path)
    assert _entries(cache) == []


def test_a_gz_whose_stream_is_shorter_than_the_header_says_names_both_sizes(
    tmp_path: Path, cache: Path
) -> None:
    plain = _save(tmp_path / "v.nii")
    path = tmp_path / "short.nii.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()[:-6]))  # a valid stream, 6 bytes short
    with pytest.raises(ValueError, match=r"short\.nii\.gz.*decompresses to 586 bytes.*needs 592"):
        read_nifti(path)
    assert _entries(cache) == []


def test_a_truncated_nii_names_the_path_and_the_sizes(tmp_path: Path) -> None:
    path = _save(tmp_path / "v.nii")
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"v\.nii.*holds {size - 10} bytes.*needs {size}"):
        read_nifti(path)


def test_a_nii_truncated_after_opening_raises_instead_of_crashing(tmp_path: Path) -> None:
    path = _save(tmp_path / "v.nii")
    src = read_nifti(path)
    with open(path, "r+b") as fh:
        fh.truncate(400)
    with pytest.raises(FileChangedError, match=r"truncated"):
        src[...]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", r"not a NIfTI file"),
        (b"hello world, not an image" * 40, r"not a NIfTI file"),
        (np.array([348], "<i4").tobytes() + bytes(600), r"Analyze 7\.5"),
        (np.array([540], "<i4").tobytes() + bytes(600), r"NIfTI-2 magic"),
        (np.array([348], "<i4").tobytes() + bytes(100), r"ends after 104 bytes"),
    ],
)
def test_a_file_that_is_not_nifti_is_refused_clearly(
    tmp_path: Path, content: bytes, match: str
) -> None:
    path = tmp_path / "odd.nii"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"odd\.nii.*" + match):
        read_nifti(path)


def test_a_gzip_that_is_not_gzip_past_its_magic_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.nii.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 20)
    with pytest.raises(CorruptChunkError, match=r"v\.nii\.gz"):
        read_nifti(path)


def test_a_pair_without_its_partner_names_the_missing_file(tmp_path: Path) -> None:
    nib.save(nib.Nifti1Pair(DATA, np.eye(4)), str(tmp_path / "p.hdr"))
    (tmp_path / "p.img").unlink()
    with pytest.raises(FileNotFoundError, match=r"p\.img"):
        read_nifti(tmp_path / "p.hdr")


def test_an_unwritable_cache_directory_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"")
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(blocker))
    path = _save(tmp_path / "v.nii.gz")
    with pytest.raises(OSError, match=r"not-a-folder.*MIXLE_CACHE_DIR"):
        read_nifti(path)


def test_a_multi_member_gzip_with_zero_padding_reads_as_nibabel_reads_it(tmp_path: Path) -> None:
    plain = _save(tmp_path / "v.nii").read_bytes()
    path = tmp_path / "m.nii.gz"
    cut = len(plain) // 3
    path.write_bytes(gzip.compress(plain[:cut]) + gzip.compress(plain[cut:]) + bytes(16))
    want = np.asanyarray(nib.load(str(path)).dataobj)
    np.testing.assert_array_equal(read_nifti(path)[...], want)


def test_opens_racing_on_an_empty_cache_all_read_right_and_leave_one_entry(
    tmp_path: Path, cache: Path
) -> None:
    path = _save(tmp_path / "v.nii.gz", np.random.default_rng(2).standard_normal((30, 20, 10)))
    want = np.asanyarray(nib.load(str(path)).dataobj)
    with ThreadPoolExecutor(4) as pool:
        sources = list(pool.map(lambda _: read_nifti(path), range(8)))
    for src in sources:
        np.testing.assert_array_equal(src[...], want)
    assert len(_entries(cache)) == 1  # no temporary file left either


def test_a_cached_copy_cut_short_while_open_raises_instead_of_crashing(
    tmp_path: Path, cache: Path
) -> None:
    path = _save(tmp_path / "v.nii.gz")
    src = read_nifti(path)
    assert src.cache_path is not None
    os.chmod(src.cache_path, 0o644)
    with open(src.cache_path, "r+b") as fh:
        fh.truncate(360)
    with pytest.raises(FileChangedError, match=r"cached copy.*truncated"):
        src[...]
    np.testing.assert_array_equal(read_nifti(path)[...], DATA)  # a new open rebuilds it


def test_opening_a_nii_reads_the_header_bytes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "v.nii", np.zeros((64, 64, 64), np.float32))
    read: list[int] = []
    real_open = files.open_regular_file

    class Counted:
        def __init__(self, fh: Any) -> None:
            self._fh = fh

        def __getattr__(self, name: str) -> Any:
            return getattr(self._fh, name)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self._fh.close()

        def read(self, n: int = -1) -> bytes:
            data = self._fh.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(files, "open_regular_file", lambda *a: Counted(real_open(*a)))
    src = read_nifti(path)
    assert read == [2, 4, 352] and path.stat().st_size > 64**3  # magic, sizeof_hdr, header
    np.testing.assert_array_equal(src[3], np.zeros((64, 64), np.float32))


def test_header_extensions_are_read_into_the_header(tmp_path: Path) -> None:
    img = nib.Nifti1Image(DATA, np.eye(4))
    img.header.extensions.append(nib.nifti1.Nifti1Extension("comment", b"scanner notes " * 20))
    for name in ("e.nii", "e.nii.gz"):
        nib.save(img, str(tmp_path / name))
        ref = nib.load(str(tmp_path / name))
        src = read_nifti(tmp_path / name)
        assert src.header.get_data_offset() == ref.dataobj.offset > 352
        (ext,) = src.header.extensions
        assert ext.get_content() == ref.header.extensions[0].get_content()
        np.testing.assert_array_equal(src[...], np.asanyarray(ref.dataobj))


def test_a_header_with_negative_dimensions_is_refused(tmp_path: Path) -> None:
    raw = bytearray(_save(tmp_path / "v.nii").read_bytes())
    raw[42:44] = np.int16(-3).tobytes()  # dim[1]
    (tmp_path / "neg.nii").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"neg\.nii.*negative dimensions \(-3, 5, 4\)"):
        read_nifti(tmp_path / "neg.nii")


def _stored_gz(data: np.ndarray) -> bytes:
    """A gzipped .nii whose size depends only on the data's shape and dtype (level 0)."""
    raw = nib.Nifti1Image(data, np.eye(4)).to_bytes()
    return gzip.compress(raw, compresslevel=0, mtime=0)


def test_a_same_size_rewrite_that_keeps_the_mtime_is_not_served_stale(tmp_path: Path) -> None:
    path = tmp_path / "scan.nii.gz"
    old, new = _stored_gz(DATA), _stored_gz(-DATA)
    assert len(old) == len(new)
    path.write_bytes(old)
    src = read_nifti(path)
    np.testing.assert_array_equal(src[...], DATA)
    before = os.stat(path)
    with open(path, "r+b") as fh:  # what cp -p / rsync --inplace -t do: same inode
        fh.write(new)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:  # a coarse clock: until it ticks
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    np.testing.assert_array_equal(np.asanyarray(nib.load(str(path)).dataobj), -DATA)
    with pytest.raises(FileChangedError, match=r"scan\.nii\.gz.*rewritten"):
        src[...]
    np.testing.assert_array_equal(read_nifti(path)[...], -DATA)  # a new open reads it


def _rewrite_in_place(path: Path, new: bytes) -> None:
    """Write ``new`` over ``path`` (same inode), until its status-change time has moved."""
    before = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(new)
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:  # a coarse clock: until it ticks
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_ino == before.st_ino


def test_a_nii_rewritten_in_place_raises_and_a_new_open_reads_it(tmp_path: Path) -> None:
    path = _save(tmp_path / "v.nii")
    src = read_nifti(path)
    np.testing.assert_array_equal(src[...], DATA)
    _rewrite_in_place(path, _save(tmp_path / "w.nii", -DATA).read_bytes())
    with pytest.raises(FileChangedError, match=r"v\.nii.*rewritten"):
        src[...]
    np.testing.assert_array_equal(read_nifti(path)[...], np.asanyarray(nib.load(str(path)).dataobj))


@pytest.mark.parametrize("name", ["v.nii", "v.hdr"])
def test_a_same_size_rewrite_with_another_dtype_is_not_read_with_the_old_header(
    tmp_path: Path, name: str
) -> None:
    # int16 -> uint16: the same size, the same layout; only the header's datatype differs
    path = _save(tmp_path / name)
    src = read_nifti(path)
    np.testing.assert_array_equal(src[...], DATA)
    header = tmp_path / name  # the .hdr of a pair, or the .nii itself
    other = _save(tmp_path / ("w" + name[1:]), DATA.astype(np.uint16))
    assert other.stat().st_size == header.stat().st_size
    _rewrite_in_place(header, other.read_bytes())
    assert np.asanyarray(nib.load(str(path)).dataobj).dtype == np.uint16
    with pytest.raises(FileChangedError, match="rewritten"):
        src[...]
    with pytest.raises(FileChangedError, match="rewritten"):
        src.read_boxes([[0, 0, 0]], (2, 2, 2))
    again = read_nifti(path)
    np.testing.assert_array_equal(again[...], np.asanyarray(nib.load(str(path)).dataobj))


@pytest.mark.parametrize(
    "tail",
    [b"garbage!!", b"\0" * 100, b"\x1f\x8bnot a member", gzip.compress(b"extra member")],
)
def test_bytes_after_the_gzip_stream_are_ignored_as_nibabel_does(
    tmp_path: Path, tail: bytes
) -> None:
    path = tmp_path / "t.nii.gz"
    data = np.arange(10 * 11 * 12, dtype=np.int16).reshape(10, 11, 12)
    raw = _save(tmp_path / "t.nii", data).read_bytes()  # nibabel's own sniff of a much
    path.write_bytes(gzip.compress(raw) + tail)  # smaller file would reach the tail
    want = np.asanyarray(nib.load(str(path)).dataobj)  # nibabel never reads the tail
    np.testing.assert_array_equal(want, data)
    with assert_unchanged(path):
        src = read_nifti(path)
        np.testing.assert_array_equal(src[...], want)
        np.testing.assert_array_equal(src[1:4, ::2, -1], want[1:4, ::2, -1])


def test_trailing_bytes_before_the_image_is_complete_raise_naming_them(
    tmp_path: Path, cache: Path
) -> None:
    path = tmp_path / "short.nii.gz"
    raw = _save(tmp_path / "t.nii").read_bytes()
    path.write_bytes(gzip.compress(raw[:-40]) + b"garbage!!")
    with pytest.raises(CorruptChunkError, match=r"short\.nii\.gz.*b'garbage!'.*not another gzip"):
        read_nifti(path)
    assert _entries(cache) == []  # nothing kept, no temporary file either


def _maps_of(path: Path) -> bool:
    """Whether this process maps the file ``path`` names (its inode, in /proc/self/maps).

    By inode, not name: a new cache copy is mapped from the temporary file it was checked
    in before it was published under its entry name.
    """
    inode = str(path.stat().st_ino)
    return any(
        len(fields) > 4 and fields[4] == inode
        for fields in (line.split() for line in Path("/proc/self/maps").read_text().splitlines())
    )


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
@pytest.mark.parametrize("name", ["m.nii", "m.nii.gz"])
def test_close_unmaps_the_data(tmp_path: Path, name: str) -> None:
    path = _save(tmp_path / name)
    src = read_nifti(path)
    handle = src._live()  # held, as a reader thread or a leaked reference would
    mapped = src.cache_path if src.cache_path is not None else path
    np.testing.assert_array_equal(src[...], DATA)
    assert _maps_of(mapped)
    src.close()
    assert handle.map is None or handle.map.closed
    assert not _maps_of(mapped)


def test_close_with_a_view_of_the_array_held_keeps_the_view_valid(tmp_path: Path) -> None:
    path = _save(tmp_path / "m.nii")
    src = read_nifti(path)
    view = src.array[1:3]
    src.close()  # the map cannot close under a live view: it stays until the view goes
    np.testing.assert_array_equal(view, DATA[1:3])


def _gz(tmp_path: Path, name: str, seed: int) -> Path:
    data = np.random.default_rng(seed).integers(-100, 100, (6, 5, 4)).astype(np.int16)
    path = tmp_path / f"{name}.nii"
    _save(path, data)
    gz = tmp_path / f"{name}.nii.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    return gz


def _age(entry: Path, seconds: int) -> None:
    os.utime(entry, (seconds, seconds))  # an explicit, old use time: no clock granularity


def test_the_cache_evicts_the_least_recently_used_copy_past_its_budget(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = (_gz(tmp_path, n, i) for i, n in enumerate("abc"))
    with read_nifti(a) as src:
        size = src.cache_path.stat().st_size  # type: ignore[union-attr]
        entry_a = src.cache_path
    monkeypatch.setenv(gz_cache.CACHE_BYTES_ENV, str(2 * size))  # room for two copies
    with read_nifti(b) as src:
        entry_b = src.cache_path
    assert entry_a is not None and entry_b is not None
    _age(entry_a, 1_000)
    _age(entry_b, 2_000)
    with read_nifti(a) as src:  # a cache hit marks a used now: b is the oldest
        np.testing.assert_array_equal(src[...], np.asanyarray(nib.load(str(a)).dataobj))
    with read_nifti(c) as src:
        np.testing.assert_array_equal(src[...], np.asanyarray(nib.load(str(c)).dataobj))
        entry_c = src.cache_path
    assert set(_entries(cache)) == {entry_a, entry_c}
    with read_nifti(b) as src:  # an evicted copy is simply made again
        np.testing.assert_array_equal(src[...], np.asanyarray(nib.load(str(b)).dataobj))


def test_the_cache_never_evicts_a_copy_this_process_has_mapped(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _gz(tmp_path, "a", 0), _gz(tmp_path, "b", 1)
    monkeypatch.setenv(gz_cache.CACHE_BYTES_ENV, "1")  # smaller than any copy
    held = read_nifti(a)
    entry_a = held.cache_path
    assert entry_a is not None
    _age(entry_a, 1_000)
    with read_nifti(b) as src:
        entry_b = src.cache_path
        assert set(_entries(cache)) == {entry_a, entry_b}  # a is open; b was just made
    np.testing.assert_array_equal(held[...], np.asanyarray(nib.load(str(a)).dataobj))
    held.close()
    with read_nifti(_gz(tmp_path, "c", 2)) as src:  # a and b are closed now: both go
        assert _entries(cache) == [src.cache_path]


def test_a_bad_cache_budget_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gz_cache.CACHE_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=r"MIXLE_NIFTI_CACHE_BYTES='lots'.*whole number"):
        read_nifti(_gz(tmp_path, "a", 0))
    assert gz_cache.NIFTI_CACHE_BYTES == 32 * 2**30


def _open_many(args: tuple[list[str], int, str]) -> list[str]:
    """Open each path ``rounds`` times (in a spawned process); the errors met, and wrong values."""
    paths, rounds, cache = args
    os.environ["MIXLE_CACHE_DIR"] = cache
    os.environ[gz_cache.CACHE_BYTES_ENV] = "1"  # every new copy evicts the others
    problems: list[str] = []
    for r in range(rounds):
        for i, path in enumerate(paths[r % len(paths) :] + paths[: r % len(paths)]):
            try:
                src = read_nifti(path)
                value = int(src[:1, :1, :1][0, 0, 0])
                src.close()
            except Exception as exc:  # every failure is reported, none is expected
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            want = int(Path(path).name[1])
            if value != want:
                problems.append(f"{path}: read {value}, not {want} ({i})")
    return problems


def test_processes_opening_gz_files_at_once_with_a_tiny_cache_all_read_right(
    tmp_path: Path, cache: Path
) -> None:
    # every process's new copy evicts the others' copies: a copy unlinked between its
    # publication (or lookup) and its map must never be taken for a changed file
    import multiprocessing as mp

    paths = []
    for i in range(4):
        paths.append(str(_save(tmp_path / f"v{i}.nii.gz", np.full((32, 32, 16), i, np.int16))))
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_open_many, [(paths, 25, str(cache))] * 4)
    assert [p for r in results for p in r] == []


def test_eviction_deletes_temporary_files_left_by_a_killed_process(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "m.nii.gz")
    folder = cache / gz_cache.CACHE_FOLDER
    folder.mkdir(parents=True)
    old = folder / ".0123-left.tmp"
    young = folder / ".4567-writing.tmp"
    old.write_bytes(b"x" * 100)
    young.write_bytes(b"x" * 100)
    hours_ago = os.stat(old).st_mtime - 2 * gz_cache.STALE_TEMP_SECONDS
    os.utime(old, (hours_ago, hours_ago))
    monkeypatch.setenv(gz_cache.CACHE_BYTES_ENV, "1")
    src = read_nifti(path)
    np.testing.assert_array_equal(src[...], DATA)
    assert not old.exists()  # stale: deleted
    assert young.exists()  # may be another process's copy being written


def test_a_copy_unlike_its_header_says_changed_only_when_the_file_changed(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "m.nii.gz")
    real = gz_cache._inflate

    def garbled(source: str, expected: int, out: Any, folder: Path) -> int:
        out.write(b"\0" * expected)  # not the header: as if the stream decoded otherwise
        return expected

    monkeypatch.setattr(gz_cache, "_inflate", garbled)
    with assert_unchanged(path), pytest.raises(CorruptChunkError, match="is corrupt") as info:
        read_nifti(path)
    assert "changed" not in str(info.value)

    def rewritten(source: str, expected: int, out: Any, folder: Path) -> int:
        _save(path, DATA + 1)  # the file is rewritten while it is decompressed
        out.write(b"\0" * expected)
        return expected

    monkeypatch.setattr(gz_cache, "_inflate", rewritten)
    with pytest.raises(CorruptChunkError, match="the file changed while it was read"):
        read_nifti(path)
    monkeypatch.setattr(gz_cache, "_inflate", real)
    assert not list((cache / gz_cache.CACHE_FOLDER).glob("*"))  # nothing published
    np.testing.assert_array_equal(read_nifti(path)[...], DATA + 1)


def test_a_copy_another_process_published_first_is_kept_and_used(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "m.nii.gz")
    first = read_nifti(path)
    entry = first.cache_path
    assert entry is not None
    inode = entry.stat().st_ino
    # the lookup misses (as when it ran just before the other process published)
    monkeypatch.setattr(gz_cache, "_touch", lambda entry: None)
    real = gz_cache._open_valid
    calls: list[Path] = []

    def miss_once(entry: Path, expected: int, prefix: bytes) -> Any:
        calls.append(entry)
        return None if len(calls) == 1 else real(entry, expected, prefix)

    monkeypatch.setattr(gz_cache, "_open_valid", miss_once)
    second = read_nifti(path)
    assert entry.stat().st_ino == inode  # not replaced under the first source's map
    np.testing.assert_array_equal(second[...], DATA)
    np.testing.assert_array_equal(first[...], DATA)
    assert not list(entry.parent.glob(".*.tmp"))
