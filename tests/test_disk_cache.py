"""The on-disk cache of fetched chunk bytes (:mod:`mixle.reading.disk_cache`)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle.reading.disk_cache import (
    CHUNK_CACHE_BYTES,
    CHUNK_CACHE_BYTES_ENV,
    EVICTION_LOW_WATER,
    STALE_TEMP_SECONDS,
    ChunkDiskCache,
    ContentKey,
    chunk_cache_budget,
    entry_name,
)

STORE = "s3://bucket/volume.zarr"


def key(name: str, version: str = "etag-1", span: tuple[int, int | None] = (0, None)) -> ContentKey:
    return ContentKey(STORE, name, version, span)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.chunk"))


def entry_size(tmp_path: Path, k: ContentKey, payload: bytes) -> int:
    """The size of ``k``'s entry file holding ``payload`` (measured in a cache of its own)."""
    cache = ChunkDiskCache(tmp_path / "measure", 2**30)
    cache.put(k, payload)
    size = (cache.directory / entry_name(k)).stat().st_size
    cache.clear()
    return size


# -- round trips and misses -------------------------------------------------------------------
def test_round_trip_of_bytes_like_objects(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    floats = np.arange(12, dtype="<f4").reshape(3, 4)
    cases = {
        "bytes": b"\x00\x01chunk" * 100,
        "bytearray": bytearray(b"xyz" * 7),
        "memoryview": memoryview(b"0123456789")[2:8],
        "numpy": floats,
        "empty": b"",
    }
    for name, data in cases.items():
        cache.put(key(name), data)  # type: ignore[arg-type]
    for name, data in cases.items():
        got = cache.get(key(name))
        assert type(got) is bytes
        assert got == bytes(memoryview(data).cast("B")), name  # type: ignore[arg-type]
    assert np.array_equal(np.frombuffer(cache.get(key("numpy")) or b"", "<f4"), floats.ravel())


def test_miss_on_an_empty_cache_and_after_clear(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    assert cache.get(key("a")) is None
    cache.put(key("a"), b"payload")
    assert cache.get(key("a")) == b"payload"
    cache.clear()
    assert cache.get(key("a")) is None
    assert cache.used_bytes == 0
    assert entries(cache.directory) == []


def test_another_cache_object_on_the_folder_reads_the_entry(tmp_path: Path) -> None:
    ChunkDiskCache(tmp_path / "c", 2**20).put(key("a"), b"shared")
    assert ChunkDiskCache(tmp_path / "c", 2**20).get(key("a")) == b"shared"


@pytest.mark.parametrize(
    "other",
    [
        ContentKey(STORE, "c/0/0", "etag-2"),  # the object was rewritten: a new ETag
        ContentKey(STORE, "c/0/0", "1024:1700000000000000000"),
        ContentKey("s3://bucket/other.zarr", "c/0/0", "etag-1"),
        ContentKey(STORE, "c/0/1", "etag-1"),
        ContentKey(STORE, "c/0/0", "etag-1", (0, 100)),
        ContentKey(STORE, "c/0/0", "etag-1", (1, None)),
    ],
)
def test_a_key_differing_in_any_field_misses(tmp_path: Path, other: ContentKey) -> None:
    """A changed version (ETag, size and mtime, VersionId) misses: stale bytes are refused."""
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    cache.put(ContentKey(STORE, "c/0/0", "etag-1"), b"old content")
    assert cache.get(other) is None
    cache.put(other, b"new content")
    assert cache.get(other) == b"new content"
    assert cache.get(ContentKey(STORE, "c/0/0", "etag-1")) == b"old content"


def test_a_second_put_of_a_key_keeps_the_good_entry(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    cache.put(key("a"), b"first")
    cache.put(key("a"), b"first")
    assert cache.get(key("a")) == b"first"
    assert len(entries(cache.directory)) == 1


def test_pickle_keeps_folder_and_budget(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 12345)
    cache.put(key("a"), b"kept")
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.directory, copy.budget_bytes) == (cache.directory, 12345)
    assert copy.get(key("a")) == b"kept"
    assert "12345" in repr(copy)


# -- budget and LRU eviction ------------------------------------------------------------------
def test_used_bytes_is_the_size_of_the_entry_files(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    for i in range(5):
        cache.put(key(f"c/{i}"), bytes(100 * i))
    assert cache.used_bytes == sum(p.stat().st_size for p in entries(cache.directory))
    assert cache.used_bytes > sum(100 * i for i in range(5))  # headers and keys count


class Model:
    """What an LRU folder under ``budget`` holds: recency order, evicted to the low water."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.order: list[str] = []  # least recent first
        self.sizes: dict[str, int] = {}

    def touch(self, name: str) -> None:
        self.order.remove(name)
        self.order.append(name)

    def put(self, name: str, size: int) -> None:
        if size > self.budget:
            return
        if name in self.sizes:
            self.touch(name)
            return
        self.order.append(name)
        self.sizes[name] = size
        total = sum(self.sizes.values())
        if total <= self.budget:
            return
        for old in list(self.order):
            if total <= int(self.budget * EVICTION_LOW_WATER):
                break
            if old != name:
                self.order.remove(old)
                total -= self.sizes.pop(old)


@pytest.mark.parametrize(
    ("payload_sizes", "entries_in_budget"),
    [((10,), 4), ((4096,), 7), ((1, 700, 5000, 64), 3), ((65536, 100), 2)],
)
def test_lru_eviction_follows_recency_under_the_budget(
    tmp_path: Path, payload_sizes: tuple[int, ...], entries_in_budget: int
) -> None:
    """Puts and hits in a seeded order: the folder holds what an exact LRU model holds."""
    names = [f"c/{i:03d}" for i in range(12)]  # equal lengths: entry size = payload + fixed
    overhead = entry_size(tmp_path, key(names[0]), b"")
    sizes = {n: payload_sizes[i % len(payload_sizes)] for i, n in enumerate(names)}
    budget = entries_in_budget * (overhead + max(payload_sizes))
    cache = ChunkDiskCache(tmp_path / "c", budget)
    model = Model(budget)
    rng = random.Random(len(payload_sizes) * 100 + entries_in_budget)
    for _ in range(80):
        name = rng.choice(names)
        if rng.random() < 0.5:
            cache.put(key(name), bytes([len(name)]) * sizes[name])
            model.put(name, overhead + sizes[name])
        else:
            got = cache.get(key(name))
            if name in model.sizes:
                assert got == bytes([len(name)]) * sizes[name]
                model.touch(name)
            else:
                assert got is None
        held = {p.name for p in entries(cache.directory)}
        assert held == {entry_name(key(n)) for n in model.sizes}
        assert cache.used_bytes <= budget


def test_a_hit_keeps_an_entry_from_eviction(tmp_path: Path) -> None:
    size = entry_size(tmp_path, key("a"), b"x" * 100)
    cache = ChunkDiskCache(tmp_path / "c", 3 * size + size // 2)  # the low water holds 3
    for name in "abc":
        cache.put(key(name), b"x" * 100)
    assert cache.get(key("a")) is not None  # now b is the least recently used
    cache.put(key("d"), b"x" * 100)
    assert cache.get(key("b")) is None
    assert all(cache.get(key(n)) is not None for n in "acd")


def test_an_entry_larger_than_the_budget_is_not_stored(tmp_path: Path) -> None:
    payload = b"p" * 1000
    size = entry_size(tmp_path, key("big"), payload)
    exact = ChunkDiskCache(tmp_path / "exact", size)
    exact.put(key("small"), b"s")
    exact.put(key("big"), payload)  # past the low water alone: kept, the rest evicted
    assert exact.get(key("big")) == payload
    assert exact.get(key("small")) is None
    short = ChunkDiskCache(tmp_path / "short", size - 1)
    short.put(key("small"), b"s")
    short.put(key("big"), payload)
    assert short.get(key("big")) is None
    assert short.get(key("small")) == b"s"  # nothing was evicted for it
    assert [p.name for p in entries(short.directory)] == [entry_name(key("small"))]


def test_budget_zero_stores_nothing(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 0)
    cache.put(key("a"), b"")
    assert cache.get(key("a")) is None
    assert os.listdir(cache.directory) == []


def test_another_process_s_entries_count_at_the_next_rescan(tmp_path: Path) -> None:
    """Two cache objects on one folder: the one whose estimate passes the budget rescans
    and evicts what both put, down to the low water."""
    overhead = entry_size(tmp_path, key("c/00"), b"")
    budget = 4 * (overhead + 50)
    one, two = ChunkDiskCache(tmp_path / "c", budget), ChunkDiskCache(tmp_path / "c", budget)
    for i in range(3):
        one.put(key(f"c/{i:02d}"), b"1" * 50)
    for i in range(3, 6):
        two.put(key(f"c/{i:02d}"), b"2" * 50)
    assert one.used_bytes <= budget
    for i in range(6, 12):
        one.put(key(f"c/{i:02d}"), b"1" * 50)
    assert one.used_bytes <= budget
    assert one.get(key("c/11")) == b"1" * 50


def test_writers_that_started_on_an_empty_folder_stay_near_the_budget(tmp_path: Path) -> None:
    """Each object scans at its first put (an empty folder) and then counts only its own
    puts; rescanning every tenth of the budget keeps four of them near the budget (without
    it, each would fill a whole budget before looking: 4x)."""
    size = entry_size(tmp_path, key("c/000"), b"w" * 200)
    budget = 20 * size
    writers = [ChunkDiskCache(tmp_path / "c", budget) for _ in range(4)]
    bound = budget + 4 * (budget - int(budget * EVICTION_LOW_WATER) + size)
    for i in range(200):
        writers[i % 4].put(key(f"c/{i:03d}"), b"w" * 200)
        assert writers[0].used_bytes <= bound
    assert writers[0].used_bytes <= budget + 4 * size


def test_an_entry_that_cannot_be_removed_is_skipped_by_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = entry_size(tmp_path, key("c/0"), b"e" * 100)
    cache = ChunkDiskCache(tmp_path / "c", 3 * size + size // 2)
    for i in range(3):
        cache.put(key(f"c/{i}"), b"e" * 100)
    stuck = entry_name(key("c/0"))  # the least recently used
    real_unlink = os.unlink

    def unlink(path: object) -> None:
        if Path(path).name == stuck:  # type: ignore[arg-type]
            raise PermissionError(13, "Operation not permitted")
        real_unlink(path)  # type: ignore[arg-type]

    monkeypatch.setattr("mixle.reading.disk_cache.os.unlink", unlink)
    cache.put(key("c/3"), b"e" * 100)  # no error; the next oldest goes instead
    assert cache.get(key("c/0")) is not None
    assert cache.get(key("c/1")) is None
    assert cache.get(key("c/3")) is not None


# -- damaged entries --------------------------------------------------------------------------
def _flip(offset: int) -> object:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))

    return damage


def _truncate(length: int) -> object:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: length if length >= 0 else len(data) + length])

    return damage


def _append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\x00")


@pytest.mark.parametrize(
    "damage",
    [
        _flip(0),  # magic
        _flip(9),  # key length
        _flip(13),  # payload length
        _flip(21),  # checksum
        _flip(30),  # the key
        _flip(-1),  # the last payload byte
        _flip(-500),  # a payload byte in the middle
        _truncate(-1),
        _truncate(24),  # the header alone
        _truncate(10),
        _truncate(0),
        _append,
    ],
    ids=[
        "magic",
        "key-length",
        "payload-length",
        "checksum",
        "key",
        "last-byte",
        "middle-byte",
        "cut-1",
        "header-only",
        "cut-in-header",
        "empty",
        "extra-byte",
    ],
)
def test_a_damaged_entry_is_a_miss_and_removed(tmp_path: Path, damage: object) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    payload = bytes(range(256)) * 4
    cache.put(key("a"), payload)
    path = cache.directory / entry_name(key("a"))
    damage(path)  # type: ignore[operator]
    assert cache.get(key("a")) is None
    assert not path.exists()
    cache.put(key("a"), payload)
    assert cache.get(key("a")) == payload


def test_a_put_replaces_a_damaged_entry(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    cache.put(key("a"), b"good bytes")
    _truncate(-2)(cache.directory / entry_name(key("a")))  # type: ignore[operator]
    cache.put(key("a"), b"good bytes")
    assert cache.get(key("a")) == b"good bytes"


def test_an_entry_of_another_key_under_this_name_is_a_miss(tmp_path: Path) -> None:
    """What a name collision would look like: the stored key is checked, not just the name."""
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    cache.put(key("b"), b"bytes of b")
    target = cache.directory / entry_name(key("a"))
    shutil.copyfile(cache.directory / entry_name(key("b")), target)
    assert cache.get(key("a")) is None
    assert not target.exists()
    assert cache.get(key("b")) == b"bytes of b"


def test_a_directory_in_place_of_an_entry_is_a_miss(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    (cache.directory / entry_name(key("a"))).mkdir()
    assert cache.get(key("a")) is None


# -- the folder -------------------------------------------------------------------------------
def test_default_folder_is_under_the_cache_root_and_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.delenv(CHUNK_CACHE_BYTES_ENV, raising=False)
    cache = ChunkDiskCache()
    assert cache.directory == tmp_path / "root" / "chunks"
    assert cache.budget_bytes == CHUNK_CACHE_BYTES == 8 * 2**30
    assert cache.directory.stat().st_mode & 0o777 == 0o700
    cache.put(key("a"), b"private")
    assert (cache.directory / entry_name(key("a"))).stat().st_mode & 0o077 == 0


def test_a_folder_the_cache_creates_is_private(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "a" / "b", 2**20)
    assert cache.directory.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a").is_dir()


def test_nothing_is_written_outside_the_folder(tmp_path: Path) -> None:
    overhead = entry_size(tmp_path / "m", key("c/0"), b"")
    cache = ChunkDiskCache(tmp_path / "c", 2 * (overhead + 10))
    for i in range(6):
        cache.put(key(f"c/{i}"), b"0123456789")
        cache.get(key(f"c/{i - 1}"))
    cache.clear()
    assert sorted(os.listdir(tmp_path)) == ["c", "m"]


def test_stale_temp_files_go_and_other_files_stay(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    stale, young, foreign = (cache.directory / n for n in (".old.tmp", ".new.tmp", "notes.txt"))
    for path in (stale, young, foreign):
        path.write_bytes(b"z" * 10)
    old = time.time_ns() - (STALE_TEMP_SECONDS + 60) * 10**9
    os.utime(stale, ns=(old, old))
    assert cache.used_bytes == 20  # temp files being written count; others' files do not
    cache.put(key("a"), b"a")  # the first put scans the folder
    assert not stale.exists()
    assert young.exists() and foreign.exists()
    cache.clear()
    assert young.exists() and foreign.exists()


def test_a_removed_folder_is_made_again_by_a_put(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    shutil.rmtree(cache.directory)
    assert cache.get(key("a")) is None
    assert cache.used_bytes == 0
    cache.put(key("a"), b"again")
    assert cache.get(key("a")) == b"again"


def test_a_failed_write_raises_naming_the_folder_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("mixle.reading.disk_cache.os.fdopen", full)
    with pytest.raises(OSError, match="No space left") as info:
        cache.put(key("a"), b"data")
    assert str(cache.directory) in str(info.value)
    assert info.value.errno == 28
    monkeypatch.undo()
    assert os.listdir(cache.directory) == []


# -- bad arguments ----------------------------------------------------------------------------
def test_a_file_as_the_folder_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file"):
        ChunkDiskCache(afile)
    with pytest.raises(NotADirectoryError, match="cannot be created"):
        ChunkDiskCache(afile / "below")


def test_an_unwritable_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)  # chmod does not stop root
    with pytest.raises(PermissionError, match="is not writable") as info:
        ChunkDiskCache(tmp_path / "ro")
    assert repr(str(tmp_path / "ro")) in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"budget_bytes": -1}, ValueError, "budget_bytes=-1 must be >= 0"),
        ({"budget_bytes": 1.5}, TypeError, "budget_bytes=1.5 must be an int"),
        ({"budget_bytes": True}, TypeError, "budget_bytes=True must be an int"),
        ({"budget_bytes": "10"}, TypeError, "budget_bytes='10' must be an int"),
        ({"directory": 3}, TypeError, "directory=3 must be a path"),
        ({"directory": ""}, ValueError, "directory='' must be a non-empty"),
        ({"directory": b"bytes"}, TypeError, "directory=b'bytes' must be a path"),
    ],
)
def test_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    args: dict[str, object] = {"directory": tmp_path / "c", **kwargs}
    with pytest.raises(error, match=match):
        ChunkDiskCache(**args)  # type: ignore[arg-type]


def test_numpy_budget_is_accepted(tmp_path: Path) -> None:
    assert ChunkDiskCache(tmp_path, np.int64(77)).budget_bytes == 77


@pytest.mark.parametrize(("raw", "want"), [("1234", 1234), (" 0 ", 0), ("", CHUNK_CACHE_BYTES)])
def test_budget_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str, want: int
) -> None:
    monkeypatch.setenv(CHUNK_CACHE_BYTES_ENV, raw)
    assert chunk_cache_budget() == want
    assert ChunkDiskCache(tmp_path / "c").budget_bytes == want


@pytest.mark.parametrize("raw", ["abc", "-3", "1.5", "8GiB"])
def test_a_bad_budget_in_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(CHUNK_CACHE_BYTES_ENV, raw)
    with pytest.raises(ValueError, match=f"{CHUNK_CACHE_BYTES_ENV}={raw!r} must be a whole"):
        ChunkDiskCache(tmp_path / "c")
    assert ChunkDiskCache(tmp_path / "c", 10).budget_bytes == 10  # an argument wins


def test_bad_keys_and_data(tmp_path: Path) -> None:
    cache = ChunkDiskCache(tmp_path / "c", 2**20)
    with pytest.raises(TypeError, match="must be a ContentKey"):
        cache.get(("s3://b", "k", "v"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a ContentKey"):
        cache.put("k", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a ContentKey"):
        entry_name("k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="data of type str must be bytes"):
        cache.put(key("a"), "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="contiguous"):
        cache.put(key("a"), np.arange(10)[::2])  # type: ignore[arg-type]
    assert os.listdir(cache.directory) == []


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        (("s3://b/x", "k", ""), ValueError, "version='' must not be empty"),
        (("s3://b/x", "k", "  "), ValueError, "version='  ' must not be empty"),
        (("", "k", "v"), ValueError, "store='' must name the store root"),
        ((None, "k", "v"), TypeError, "store=None must be a str"),
        (("s3://b/x", 3, "v"), TypeError, "key=3 must be a str"),
        (("s3://b/x", "k", 7), TypeError, "version=7 must be a str"),
        (("s3://b/x", "k", "v", (-1, None)), ValueError, "0 <= start <= stop"),
        (("s3://b/x", "k", "v", (5, 2)), ValueError, "0 <= start <= stop"),
        (("s3://b/x", "k", "v", [0, None]), TypeError, "must be a tuple"),
        (("s3://b/x", "k", "v", (0,)), TypeError, "must be a tuple"),
        (("s3://b/x", "k", "v", (True, None)), TypeError, "span start=True must be an int"),
        (("s3://b/x", "k", "v", (0, 2.0)), TypeError, "span stop=2.0 must be an int"),
    ],
)
def test_bad_content_keys(fields: tuple[object, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ContentKey(*fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("store", "secret", "shown"),
    [
        ("s3://AKIAXYZ:hunter22@host/bucket", "hunter22", "s3://***@host/bucket"),
        ("https://user:p@ss@example.org/data.h5", "p@ss", "https://***@example.org/data.h5"),
        ("https://token123@example.org", "token123", "https://***@example.org"),
    ],
)
def test_a_store_with_user_info_is_refused_without_echoing_it(
    store: str, secret: str, shown: str
) -> None:
    with pytest.raises(ValueError, match="has user-info") as info:
        ContentKey(store, "k", "v")
    assert secret not in str(info.value)
    assert repr(shown) in str(info.value)


@pytest.mark.parametrize(
    "store",
    [
        "https://bucket.s3.amazonaws.com/x.zarr?X-Amz-Signature=deadbeef99",
        "/local/path?deadbeef99",
        "https://u:pw@h/x?deadbeef99",
    ],
)
def test_a_store_with_a_query_is_refused_without_echoing_it(store: str) -> None:
    with pytest.raises(ValueError, match="has a query string") as info:
        ContentKey(store, "k", "v")
    assert "deadbeef99" not in str(info.value)
    assert ":pw@" not in str(info.value)


def test_keys_that_are_fine() -> None:
    assert ContentKey("s3://bucket/a@b/v.zarr", "c/0", "v").store == "s3://bucket/a@b/v.zarr"
    assert ContentKey("/data/v@1.h5", "bytes=100-200", "10:20").key == "bytes=100-200"
    span = ContentKey("gs://b/x", "k", "v", (np.int64(3), np.int32(9))).span
    assert span == (3, 9) and all(type(i) is int for i in span)


# -- the key -> file name mapping -------------------------------------------------------------
stores = st.builds(
    lambda scheme, path: f"{scheme}{path}",
    st.sampled_from(["s3://bucket/", "gs://b/", "https://host:8443/", "/data/", ""]),
    st.text(alphabet=st.characters(blacklist_characters="?@"), max_size=12),
).filter(bool)
versions = st.text(min_size=1, max_size=12).filter(str.strip)
spans = st.one_of(
    st.just((0, None)),
    st.tuples(st.integers(0, 2**40), st.none()),
    st.integers(0, 2**40).flatmap(lambda a: st.tuples(st.just(a), st.integers(a, 2**41))),
)
content_keys = st.builds(ContentKey, stores, st.text(max_size=12), versions, spans)


def _clone(k: ContentKey) -> ContentKey:
    return ContentKey(
        "".join(list(k.store)), "".join(list(k.key)), "".join(list(k.version)), k.span
    )


@settings(max_examples=300, deadline=None)
@given(content_keys, content_keys)
def test_entry_names_are_equal_exactly_for_equal_keys(a: ContentKey, b: ContentKey) -> None:
    assert entry_name(a) == entry_name(_clone(a))
    assert (entry_name(a) == entry_name(b)) == (a == b)
    assert "/" not in entry_name(a) and entry_name(a).endswith(".chunk")


@settings(max_examples=40, deadline=None)
@given(content_keys, content_keys)
def test_distinct_keys_keep_distinct_bytes(
    tmp_path_factory: pytest.TempPathFactory, a: ContentKey, b: ContentKey
) -> None:
    cache = ChunkDiskCache(tmp_path_factory.getbasetemp() / "distinct-keys", 2**20)
    cache.clear()
    cache.put(a, repr(a).encode())
    cache.put(b, repr(b).encode())
    assert cache.get(_clone(a)) == repr(a).encode()
    assert cache.get(b) == repr(b).encode()
    assert len(entries(cache.directory)) == (1 if a == b else 2)


# -- processes at once ------------------------------------------------------------------------
KEYS = 16


def payload_of(i: int) -> bytes:
    """Each key's bytes: distinct lengths and contents, so a mix-up cannot go unseen."""
    return bytes([i]) * (512 + 700 * i) + i.to_bytes(4, "little")


_start: object = None  # a barrier in each worker: all four begin at once


def _set_start(barrier: object) -> None:
    global _start
    _start = barrier


def hammer(folder: str, budget: int, seed: int, ops: int) -> tuple[int, int, list[str]]:
    """Random puts, gets and now and then a clear; ``(hits, misses, wrong answers)``."""
    cache = ChunkDiskCache(folder, budget)
    if _start is not None:
        _start.wait(timeout=60)  # type: ignore[attr-defined]
    return hammer_with(cache, seed, ops)


def hammer_with(cache: ChunkDiskCache, seed: int, ops: int) -> tuple[int, int, list[str]]:
    """:func:`hammer` on one cache object."""
    rng = random.Random(seed)
    hits = misses = 0
    wrong: list[str] = []
    for _ in range(ops):
        i = rng.randrange(KEYS)
        k = ContentKey("s3://bucket/v.zarr", f"c/{i}", "etag")
        roll = rng.random()
        if roll < 0.45:
            cache.put(k, payload_of(i))
        elif roll < 0.99:
            got = cache.get(k)
            if got is None:
                misses += 1
            elif got == payload_of(i):
                hits += 1
            else:
                wrong.append(f"key {i}: {len(got)} bytes")
        else:
            cache.clear()
    return hits, misses, wrong


def test_processes_sharing_a_folder_never_get_wrong_bytes(tmp_path: Path) -> None:
    """4 spawned processes put and get overlapping keys under a budget that holds about a
    third of them, so entries are evicted while others read them."""
    folder = tmp_path / "shared"
    budget = sum(len(payload_of(i)) for i in range(KEYS)) // 3
    ChunkDiskCache(folder, budget)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4, initializer=_set_start, initargs=(ctx.Barrier(4),)) as pool:
        jobs = [(str(folder), budget, seed, 1500) for seed in range(4)]
        results = pool.starmap(hammer, jobs, chunksize=1)
    assert [w for _, _, w in results] == [[], [], [], []]
    assert sum(h for h, _, _ in results) > 0
    assert sum(m for _, m, _ in results) > 0
    assert not list(folder.glob(".*.tmp"))
    cache = ChunkDiskCache(folder, budget)
    for i in range(KEYS):
        got = cache.get(ContentKey("s3://bucket/v.zarr", f"c/{i}", "etag"))
        assert got is None or got == payload_of(i)


def test_threads_sharing_one_cache_object_never_get_wrong_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "threads"
    budget = sum(len(payload_of(i)) for i in range(KEYS)) // 3
    cache = ChunkDiskCache(folder, budget)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda seed: hammer_with(cache, seed, 300), range(8)))
    assert [w for _, _, w in results] == [[]] * 8
    assert sum(h for h, _, _ in results) > 0


_inherited: ChunkDiskCache | None = None


def _use_inherited() -> None:
    assert _inherited is not None
    k = ContentKey("s3://bucket/v.zarr", "child", "etag")
    _inherited.put(k, b"from the child")
    if _inherited.get(k) != b"from the child" or _inherited.get(key("parent")) != b"parent":
        raise SystemExit(3)


def test_a_forked_child_uses_the_parent_s_cache_object(tmp_path: Path) -> None:
    global _inherited
    _inherited = ChunkDiskCache(tmp_path / "c", 2**20)
    _inherited.put(key("parent"), b"parent")
    child = multiprocessing.get_context("fork").Process(target=_use_inherited)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert _inherited.get(ContentKey("s3://bucket/v.zarr", "child", "etag")) == b"from the child"
    _inherited = None
