"""CSV and JSON lines files changed after they were indexed or opened: the row index of the
old content is never used; a changed file is either reindexed on open or refused with
FileChangedError, never read through stale row offsets."""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import mixle
from mixle.data.sources.arrays.memmap.check import FileChangedError
from mixle.data.sources.records.text import row_index
from mixle.data.sources.records.text.row_index import cache_dir, content_fingerprint


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _csv_text(widths: list[int]) -> str:
    """Rows ``i,<digits>`` whose second field has ``widths[i]`` digits."""
    return "a,b\n" + "".join(f"{i},{str(i % 10) * w}\n" for i, w in enumerate(widths))


def _jsonl_text(widths: list[int]) -> str:
    return "".join(json.dumps({"a": i, "b": str(i % 10) * w}) + "\n" for i, w in enumerate(widths))


OLD = [1, 5, 1, 5, 1, 5, 1, 5]
NEW = [5, 1, 5, 1, 5, 1, 5, 1]  # the same size, every row boundary but the ends moved


def _truth(path: Path) -> list[tuple[Any, Any]]:
    """Rows as Python's csv or json module reads the file."""
    if path.suffix == ".csv":
        with open(path, newline="") as fh:
            return [(int(a), b) for a, b in list(csv.reader(fh))[1:]]
    with open(path, "rb") as fh:
        return [(row["a"], row["b"]) for row in map(json.loads, fh)]


def _open(path: Path) -> Any:
    if path.suffix == ".csv":
        return mixle.read_csv(path, dtypes={"b": str})
    return mixle.read_jsonl(path)


def _rows(src: Any) -> list[tuple[Any, Any]]:
    batch = src.get_batch(np.arange(len(src)))
    return [(int(a), b) for a, b in zip(batch["a"].tolist(), batch["b"].tolist())]


def _rewrite_in_place(path: Path, text: str) -> None:
    """Overwrite ``path`` in place and restore its modification time (``rsync --inplace -t``)."""
    before = path.stat()
    with open(path, "r+b") as fh:
        fh.write(text.encode())
        fh.truncate()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    while path.stat().st_ctime_ns == before.st_ctime_ns:  # rsync takes longer than a tick of
        time.sleep(0.001)  # the file system's clock; this test may not
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )


TEXTS: dict[str, Callable[[list[int]], str]] = {".csv": _csv_text, ".jsonl": _jsonl_text}


@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_same_size_rewrite_with_the_old_mtime_is_reindexed(tmp_path: Path, suffix: str) -> None:
    # the cached index was keyed by size, mtime and inode only: it was reused for the new
    # content, and rows came back cut at the old offsets
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    with _open(path) as first:
        assert _rows(first) == _truth(path) and first.row_index_origin == "built"
    _rewrite_in_place(path, TEXTS[suffix](NEW))
    with _open(path) as second:
        assert _rows(second) == _truth(path)
        assert second.row_index_origin == "built"
        assert [second[i]["b"] for i in range(len(NEW))] == [b for _, b in _truth(path)]
    assert len(list((cache_dir() / "row-index").glob("*.i64"))) == 1  # the old one is gone


#: Stale offsets of OLD_CSV cut NEW_CSV's second row "10,5" to "0,5": a valid row, wrong values.
OLD_CSV, NEW_CSV = "a,b\n7,77\n0,5\n", "a,b\n7,7\n10,5\n"


def test_a_stale_cached_index_gave_another_rows_values(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(OLD_CSV)
    with mixle.read_csv(path) as first:
        assert first[1] == {"a": 0, "b": 5}
    _rewrite_in_place(path, NEW_CSV)
    with mixle.read_csv(path) as second:
        assert second[1] == {"a": 10, "b": 5}  # was {"a": 0, "b": 5}: a cut of "10,5"
        assert [second[i] for i in range(len(second))] == [{"a": 7, "b": 7}, {"a": 10, "b": 5}]
    assert _truth(path) == [(7, "7"), (10, "5")]


def test_a_stale_index_in_an_open_source_gave_another_rows_values(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(OLD_CSV)
    src = mixle.read_csv(path)
    assert src[1] == {"a": 0, "b": 5}
    _rewrite_in_place(path, NEW_CSV)
    with pytest.raises(FileChangedError, match="was written"):
        src[1]  # used to return {"a": 0, "b": 5}: a cut of the new row "10,5"


@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_the_content_fingerprint_alone_refuses_a_stale_cached_index(
    tmp_path: Path, suffix: str
) -> None:
    # where the status-change time says nothing (here: it is left out of the cache key), the
    # fingerprint of the file's first, last and sampled blocks still tells the versions apart
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    original = row_index.file_signature

    def without_ctime(st: os.stat_result) -> tuple[int, ...]:
        return (*original(st)[:4], 0)

    def load() -> row_index.RowIndex:
        fd = os.open(path, os.O_RDONLY)
        try:
            index = row_index.load_row_index(fd, str(path.resolve()), 0, None, "test", False)
            return row_index.RowIndex(np.array(index.starts), index.origin, index.path)
        finally:
            os.close(fd)

    with mock.patch.object(row_index, "file_signature", without_ctime):
        assert load().origin == "built" and load().origin == "cached"
        _rewrite_in_place(path, TEXTS[suffix](NEW))
        again = load()
    text = path.read_bytes()
    want = [0, *[k + 1 for k, byte in enumerate(text[:-1]) if byte == ord("\n")], len(text)]
    assert again.origin == "built" and again.starts.tolist() == want


def test_the_fingerprint_samples_first_last_and_middle_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    size = 3 * row_index.FINGERPRINT_BLOCKS * row_index.FINGERPRINT_BLOCK_BYTES + 11
    data = bytearray(os.urandom(size))
    path.write_bytes(bytes(data))
    places = np.linspace(
        0, size - row_index.FINGERPRINT_BLOCK_BYTES, row_index.FINGERPRINT_BLOCKS
    ).astype(np.int64)
    with open(path, "rb") as fh:
        base = content_fingerprint(fh.fileno(), size)
    for place in [0, size - 1, int(places[3]) + 5]:
        data[place] ^= 1
        path.write_bytes(bytes(data))
        with open(path, "rb") as fh:
            assert content_fingerprint(fh.fileno(), size) != base, place
        data[place] ^= 1


@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_same_size_rewrite_while_open_raises(tmp_path: Path, suffix: str) -> None:
    # rows used to come back cut at the old offsets, with no error
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    src = _open(path)
    assert _rows(src) == _truth(path)
    _rewrite_in_place(path, TEXTS[suffix](NEW))
    for read in (lambda: src[3], lambda: src.get_batch([0, 5]), lambda: list(src.records())):
        with pytest.raises(FileChangedError, match=rf"{path.name}'? was written"):
            read()
    with _open(path) as again:  # opening it again reads the new content
        assert _rows(again) == _truth(path)


def _append(path: Path) -> None:
    with open(path, "a") as fh:
        fh.write("99,9\n" if path.suffix == ".csv" else '{"a": 99, "b": "9"}\n')


def _replace(path: Path) -> None:
    other = path.with_name("other" + path.suffix)
    other.write_text(TEXTS[path.suffix](NEW))
    os.replace(other, path)


CHANGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "appended": (_append, "changed size from"),
    "truncated": (lambda p: os.truncate(p, 20), "changed size from"),
    "replaced": (_replace, "replaced by another file"),
    "deleted": (os.unlink, "was deleted"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_file_changed_while_open_raises_on_every_path(
    tmp_path: Path, suffix: str, change: str
) -> None:
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    src = _open(path)
    assert len(src) == len(OLD)
    act, message = CHANGES[change]
    act(path)
    for read in (lambda: src[0], lambda: src.get_batch([1, 2]), lambda: list(src.records())):
        with pytest.raises(FileChangedError, match=message) as info:
            read()
        assert str(path.resolve()) in str(info.value)
        assert isinstance(info.value, OSError)


@pytest.mark.parametrize("change", sorted([*CHANGES, "rewritten"]))
@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_file_changed_between_open_and_indexing_raises(
    tmp_path: Path, suffix: str, change: str
) -> None:
    # the header and the column types were read from the old content
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    src = _open(path)
    assert src.row_index_origin is None
    if change == "rewritten":
        _rewrite_in_place(path, TEXTS[suffix](NEW))
        message = "was written"
    else:
        act, message = CHANGES[change]
        act(path)
    for _ in range(2):  # and again: nothing of the failed load is kept
        with pytest.raises(FileChangedError, match=message):
            len(src)
    assert src.row_index_origin is None
    if change != "replaced":  # (the replaced file's old inode is indexed, but never used)
        assert not list((cache_dir() / "row-index").glob("*.i64"))


@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_rewrite_during_a_stream_stops_it(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    src = _open(path)
    stream = src.iter_batches(2)
    first = next(stream)
    assert first["b"].tolist() == [b for _, b in _truth(path)[:2]]
    _rewrite_in_place(path, TEXTS[suffix](NEW))
    with pytest.raises(FileChangedError, match="was written"):
        list(stream)


@pytest.mark.parametrize("suffix", sorted(TEXTS))
def test_a_file_changed_while_being_indexed_stores_no_index(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"rows{suffix}"
    path.write_text(TEXTS[suffix](OLD))
    src = _open(path)
    scan = row_index.scan_row_starts

    def scan_then_rewrite(*args: Any, **kwargs: Any) -> Any:
        yield from scan(*args, **kwargs)
        _rewrite_in_place(path, TEXTS[suffix](NEW))

    monkeypatch.setattr(row_index, "scan_row_starts", scan_then_rewrite)
    with pytest.raises(FileChangedError, match="was written"):
        len(src)
    assert not list((cache_dir() / "row-index").glob("*.i64"))
    assert not list((cache_dir() / "row-index").glob(".*.tmp"))
