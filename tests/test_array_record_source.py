"""read_array_record against files written, and read back, by array_record's own classes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fork_child import in_forked_child
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("array_record")

from array_record.python.array_record_module import (
    ArrayRecordReader,
    ArrayRecordWriter,
)

import mixle
from mixle.data.sources.protocols import SupportsBatchRead, SupportsRecords
from mixle.data.sources.records.array_record_source import (
    STREAM_RECORDS,
    ArrayRecordSource,
    read_array_record,
)
from mixle.data.spec import ArraySpec
from mixle.errors import (
    CorruptChunkError,
    FileChangedError,
    LeafMismatchError,
    SourceClosedError,
    SpecialFileError,
)
from mixle.testing import MAX_PICKLE_BYTES, assert_unchanged

#: (records, writer options) of the files of the multi-file source; one is empty.
LAYOUT = [(7, "group_size:1"), (0, "group_size:1"), (13, "group_size:4"), (5, "")]


def _write(path: Path, records: list[bytes], options: str = "") -> Path:
    writer = ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return path


def _reference(paths: list[Path]) -> list[bytes]:
    """Every record of ``paths`` in order, as array_record's own reader reads them."""
    out: list[bytes] = []
    for path in paths:
        reader = ArrayRecordReader(str(path))
        if reader.num_records():
            out.extend(reader.read_all())
        reader.close()
    return out


def _payload(k: int, i: int) -> bytes:
    # varied lengths, zero bytes at the end (fixed-width NumPy bytes would drop them)
    return f"file{k}-record{i}-".encode() + bytes(range(i % 7)) + b"\x00" * (i % 3)


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    return [
        _write(tmp_path / f"part{k}.array_record", [_payload(k, i) for i in range(n)], options)
        for k, (n, options) in enumerate(LAYOUT)
    ]


def _dict_record(i: int) -> bytes:
    x = (np.arange(12, dtype=np.float32).reshape(4, 3) + i) * 0.5
    return pickle.dumps({"x": x, "y": i, "name": f"r{i}", "pair": (np.int16(i), b"\x00z")})


@pytest.fixture
def dict_files(tmp_path: Path) -> list[Path]:
    return [
        _write(tmp_path / "d0.ar", [_dict_record(i) for i in range(6)], "group_size:1"),
        _write(tmp_path / "d1.ar", [_dict_record(i) for i in range(6, 15)], "group_size:3"),
    ]


def _assert_dict_batch(batch: dict[str, Any], want: list[dict[str, Any]]) -> None:
    assert list(batch) == ["x", "y", "name", "pair"]
    np.testing.assert_array_equal(batch["x"], np.stack([r["x"] for r in want]))
    assert batch["x"].dtype == np.float32 and batch["y"].dtype == np.int64
    assert batch["y"].tolist() == [r["y"] for r in want]
    assert batch["name"].dtype == object and batch["name"].tolist() == [r["name"] for r in want]
    assert isinstance(batch["pair"], tuple) and batch["pair"][0].dtype == np.int16
    assert batch["pair"][0].tolist() == [r["pair"][0] for r in want]
    assert batch["pair"][1].tolist() == [r["pair"][1] for r in want]


class _Counting:
    """A reader stand-in that records each batched read's indices, then reads them."""

    def __init__(self, reader: Any, calls: list[tuple[int, list[int]]], k: int) -> None:
        self._reader, self._calls, self._k = reader, calls, k

    def read(self, *args: Any) -> Any:
        if len(args) == 1:
            self._calls.append((self._k, list(args[0])))
        return self._reader.read(*args)

    def close(self) -> None:
        self._reader.close()


def _count_reads(src: ArrayRecordSource) -> list[tuple[int, list[int]]]:
    calls: list[tuple[int, list[int]]] = []
    src._handle = tuple(_Counting(r, calls, k) for k, r in enumerate(src._handle))
    return calls


# -- round trips ---------------------------------------------------------------------------
def test_records_equal_the_writers_own_reads_over_files_group_sizes_and_an_empty_file(files):
    want = _reference(files)
    assert len(want) == sum(n for n, _ in LAYOUT)
    with assert_unchanged(*files), read_array_record(files) as src:
        assert isinstance(src, SupportsRecords) and isinstance(src, SupportsBatchRead)
        assert len(src) == len(want)
        assert src.file_lengths == tuple(n for n, _ in LAYOUT)
        assert src.paths == tuple(map(str, files))
        assert [src[i] for i in range(len(want))] == want
        assert [src[-i] for i in range(1, len(want) + 1)] == want[::-1]
        batch = src.get_batch(np.arange(len(want)))
        assert batch.dtype == object and batch.shape == (len(want),)
        assert batch.tolist() == want
        assert list(src.records()) == want and list(src) == want
        assert src[5:16:3].tolist() == want[5:16:3]
        assert src[::-1].tolist() == want[::-1]
        assert src.element_spec() == ArraySpec((), np.dtype(object))
        empty = src.get_batch([])
        assert empty.shape == (0,) and empty.dtype == object


def test_a_single_path_as_str_or_pathlike(files):
    want = _reference(files[:1])
    for path in (files[0], str(files[0])):
        with read_array_record(path) as src:
            assert src.get_batch([-1, 0]).tolist() == [want[-1], want[0]]
            assert repr(src) == f"ArrayRecordSource({str(files[0])!r}, records=7)"


def test_records_streams_files_longer_than_one_block(tmp_path):
    n = STREAM_RECORDS + 5
    path = _write(tmp_path / "long.ar", [b"%d" % i for i in range(n)], "group_size:64")
    with read_array_record([path, path]) as src:
        assert list(src.records()) == _reference([path, path])


def test_get_batch_any_order_repeats_and_negatives_equal_per_record_reads(files):
    want = _reference(files)
    n = len(want)
    with read_array_record(files) as src:
        idx = [n - 1, 0, 3, 3, -1, -n, 8, 7, 24, 8, 0]
        assert src.get_batch(idx).tolist() == [src[i] for i in idx]
        assert src.get_batch(np.array(idx, dtype=np.int32)).tolist() == [want[i] for i in idx]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_property_get_batch_equals_the_reference_at_every_index(files, data):
    want = _reference(files)
    n = len(want)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=40))
    with read_array_record(files) as src:
        assert src.get_batch(idx).tolist() == [want[i] for i in idx]


def test_each_distinct_record_is_read_once_with_one_read_per_file_touched(files):
    with read_array_record(files) as src:
        calls = _count_reads(src)
        # file 0 holds 0..6, file 1 none, file 2 holds 7..19, file 3 holds 20..24
        src.get_batch([24, 1, 9, 1, 8, 0, -1, 9, 20])
        assert sorted(calls) == [(0, [0, 1]), (2, [1, 2]), (3, [0, 4])]


def test_decode_pickle_loads_stacks_dicts_of_arrays(dict_files):
    want = [pickle.loads(b) for b in _reference(dict_files)]
    with read_array_record(dict_files, decode=pickle.loads) as src:
        assert len(src) == 15
        idx = [14, 0, 5, 6, 6, -2]
        _assert_dict_batch(src.get_batch(idx), [want[i] for i in idx])
        _assert_dict_batch(src[2:12:2], want[2:12:2])
        record = src[-1]
        np.testing.assert_array_equal(record["x"], want[-1]["x"])
        assert record["name"] == "r14" and record["pair"][1] == b"\x00z"
        assert [r["y"] for r in src.records()] == list(range(15))
        assert src.element_spec() == {
            "x": ArraySpec((4, 3), np.float32),
            "y": ArraySpec((), np.int64),
            "name": ArraySpec((), object),
            "pair": (ArraySpec((), np.int16), ArraySpec((), object)),
        }
        empty = src.get_batch([])
        assert empty["x"].shape == (0, 4, 3) and empty["pair"][1].shape == (0,)
        assert "decode=_pickle.loads" in repr(src)


def test_element_spec_with_decode_reads_record_zero_once(dict_files):
    seen: list[bytes] = []

    def decode(data: bytes) -> Any:
        seen.append(data)
        return pickle.loads(data)

    with read_array_record(dict_files, decode=decode) as src:
        assert not seen  # opening reads no record
        spec = src.element_spec()
        assert src.element_spec() is spec
        assert seen == _reference(dict_files)[:1]


def test_decode_runs_once_per_distinct_record(dict_files):
    seen: list[int] = []

    def decode(data: bytes) -> Any:
        record = pickle.loads(data)
        seen.append(record["y"])
        return record

    with read_array_record(dict_files, decode=decode) as src:
        src.get_batch([3, 3, 9, 3, 9])
        assert sorted(seen) == [3, 9]


def test_decode_to_arrays_with_a_module_level_function(tmp_path):
    rows = [np.arange(3, dtype=np.float64) + i for i in range(4)]
    path = _write(tmp_path / "f8.ar", [r.tobytes() for r in rows])
    with read_array_record(path, decode=np.frombuffer) as src:
        np.testing.assert_array_equal(src.get_batch([3, 1]), np.stack([rows[3], rows[1]]))
        assert src.element_spec() == ArraySpec((3,), np.float64)


# -- pickling, fork, threads ---------------------------------------------------------------
def test_pickle_is_small_lazy_and_rereads_equal(files, dict_files):
    want = _reference(files)
    src = read_array_record(files)
    blob = pickle.dumps(src)
    assert len(blob) < MAX_PICKLE_BYTES
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone)
    assert clone.get_batch(np.arange(len(want))).tolist() == want
    clone.close()
    decoded = pickle.loads(pickle.dumps(read_array_record(dict_files, decode=pickle.loads)))
    assert decoded.decode is pickle.loads
    assert decoded[7]["y"] == 7
    decoded.close()
    src.close()
    with pytest.raises(SourceClosedError, match="pickle it"):
        pickle.dumps(src)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_reads_refuses_to_read_instead_of_crashing(files):
    # array_record's C++ background threads do not survive fork: a read there crashes
    want = _reference(files)
    src = read_array_record(files)
    parent_handle = src._handle
    assert src.get_batch([0, 24]).tolist() == [want[0], want[24]]

    def body() -> list[str]:
        problems: list[str] = []

        def work() -> None:
            try:
                src.get_batch([1])
                problems.append("a thread of the child read")
            except RuntimeError as exc:
                if "forked after array_record was imported or used" not in str(exc):
                    problems.append(str(exc))

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        work()  # the main thread too
        fresh = pickle.loads(pickle.dumps(src))
        try:
            len(fresh)
            problems.append("a copy opened in the child")
        except RuntimeError:
            pass
        return problems

    assert in_forked_child(body) == []
    assert src._handle is parent_handle  # the parent's readers are untouched
    assert list(src.records()) == want
    src.close()


_FORK_CHILD_READS = """
import os, pickle, sys, threading
import numpy as np
src = pickle.loads(bytes.fromhex(sys.argv[1]))  # opens nothing: array_record not used yet
want = pickle.loads(bytes.fromhex(sys.argv[2]))
pid = os.fork()
if pid == 0:
    import signal
    signal.alarm(20)
    bad = []
    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            idx = rng.integers(-len(want), len(want), 16)
            if src.get_batch(idx).tolist() != [want[i] for i in idx]:
                bad.append(seed)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os._exit(3 if bad else 0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert src.get_batch([0, -1]).tolist() == [want[0], want[-1]]  # the parent reads after
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_before_the_first_read_reads_correctly_from_several_threads(files):
    want = _reference(files)
    with read_array_record(files) as src:
        blob = pickle.dumps(src)
    args = [sys.executable, "-c", _FORK_CHILD_READS, blob.hex(), pickle.dumps(want).hex()]
    subprocess.run(args, check=True, timeout=60)


def test_many_threads_reading_at_once_get_the_right_records(files):
    want = _reference(files)
    n = len(want)
    problems: list[str] = []
    with read_array_record(files) as src:
        barrier = threading.Barrier(8)

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            barrier.wait()
            for _ in range(40):
                idx = rng.integers(-n, n, 32)
                if src.get_batch(idx).tolist() != [want[i] for i in idx]:
                    problems.append(f"thread {seed}")
                if src[int(idx[0])] != want[idx[0]]:
                    problems.append(f"thread {seed} [i]")

        threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert problems == []


def test_close_context_manager_and_reads_after_close(files):
    src = read_array_record(files)
    stream = src.records()
    next(stream)
    with src as entered:
        assert entered is src
    assert src.closed
    src.close()  # idempotent
    assert "(closed)" in repr(src)
    for action in (
        lambda: src[0],
        lambda: src.get_batch([1]),
        lambda: len(src),
        src.element_spec,
        lambda: list(stream),  # the next block of a stream begun before close()
    ):
        with pytest.raises(SourceClosedError, match="is closed"):
            action()


def test_damaged_chunks_raise_corrupt_chunk_error_naming_the_file(tmp_path):
    rng = np.random.default_rng(0)
    records = [rng.bytes(300) for _ in range(50)]
    path = _write(tmp_path / "damaged.ar", records, "group_size:1")
    data = bytearray(path.read_bytes())
    data[2000:2040] = bytes(b ^ 0xFF for b in data[2000:2040])  # inside a chunk's data
    path.write_bytes(bytes(data))
    with read_array_record(path) as src:
        with pytest.raises(CorruptChunkError, match=r"damaged\.ar'.*hash mismatch"):
            src.get_batch(np.arange(50))
        with pytest.raises(CorruptChunkError, match=r"damaged\.ar'.*hash mismatch"):
            list(src.records())


def test_a_file_truncated_after_opening_raises_file_changed_error(tmp_path):
    records = [bytes(1000) + b"%d" % i for i in range(200)]
    path = _write(tmp_path / "shrinks.ar", records, "group_size:1,uncompressed")
    with read_array_record(path) as src:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        # array_record itself reads the lost record as b"" without an error
        assert ArrayRecordReader(str(path)).ok() is False
        with pytest.raises(FileChangedError, match=r"shrinks\.ar' changed after it was opened"):
            src.get_batch([199])
        with pytest.raises(FileChangedError, match="now 163840 bytes"):
            list(src.records())


def test_a_file_rewritten_with_more_records_raises_file_changed_error(tmp_path):
    """A rewrite whose chunks no longer match the footer array_record read made it fail
    with a hash mismatch, reported as a corrupt chunk rather than a changed file."""
    path = _write(tmp_path / "rw.ar", [b"old%03d" % i for i in range(50)], "group_size:1")
    with read_array_record(path) as src:
        assert src[0] == b"old000"
        _write(tmp_path / "rw.ar", [b"NEW-%d" % i for i in range(80)], "group_size:1")
        with pytest.raises(FileChangedError, match=r"rw\.ar' changed after it was opened"):
            src.get_batch(np.arange(50))
        with pytest.raises(FileChangedError, match=r"rw\.ar' changed after it was opened"):
            list(src.records())


def test_empty_records_of_an_unchanged_file_are_read_as_empty(tmp_path):
    path = _write(tmp_path / "blank.ar", [b"", b"a", b""])
    with read_array_record(path) as src:
        assert src.get_batch([2, 1, 0]).tolist() == [b"", b"a", b""]
        assert list(src.records()) == [b"", b"a", b""]


def test_decode_errors_say_which_record(dict_files):
    def decode(data: bytes) -> Any:
        record = pickle.loads(data)
        if record["y"] == 9:
            raise ValueError("bad record")
        return record

    with read_array_record(dict_files, decode=decode) as src:
        with pytest.raises(ValueError, match="bad record") as info:
            src.get_batch([1, 9])
        if sys.version_info >= (3, 11):
            assert "while decoding record 9" in "".join(info.value.__notes__)


def test_decoded_records_that_do_not_stack_raise_naming_the_records(tmp_path):
    records = [pickle.dumps({"x": np.zeros(3)}), pickle.dumps({"x": np.zeros(4)})]
    records += [pickle.dumps({"z": 1}), pickle.dumps({"x": np.zeros(3, np.float32)})]
    with read_array_record(_write(tmp_path / "odd.ar", records), decode=pickle.loads) as src:
        with pytest.raises(
            LeafMismatchError, match=r"record 1\)\['x'\] is a ndarray of shape \(4,\)"
        ):
            src.get_batch([0, 1])
        with pytest.raises(LeafMismatchError, match="dtype float32"):
            src.get_batch([0, 3])
        with pytest.raises(ValueError, match=r"record 2\) is a dict with keys \['z'\]"):
            src.get_batch([0, 2])


# -- bad input -----------------------------------------------------------------------------
def test_bad_paths_are_refused_naming_the_argument_and_value(tmp_path, files):
    good = str(files[0])
    (tmp_path / "dir").mkdir()
    _write(tmp_path / "dir" / "a.array_record", [b"a"])
    (tmp_path / "junk.ar").write_bytes(b"not an array record file at all")
    (tmp_path / "zero.ar").write_bytes(b"")
    missing = str(tmp_path / "missing.ar")
    with pytest.raises(FileNotFoundError, match=r"paths=.*missing\.ar' does not exist"):
        read_array_record(missing)
    with pytest.raises(FileNotFoundError, match=r"paths\[1\]=.*missing\.ar'"):
        read_array_record([good, missing])
    with pytest.raises(SpecialFileError, match=r"is a directory \(it holds 'a.array_record'\)"):
        read_array_record(tmp_path / "dir")
    for name in ("junk.ar", "zero.ar"):
        with pytest.raises(ValueError, match=rf"paths\[1\]=.*{name}' is not an ArrayRecord file"):
            read_array_record([good, tmp_path / name])
    with pytest.raises(ValueError, match=r"paths=\[\] names no file"):
        read_array_record([])
    with pytest.raises(TypeError, match="paths=3 must be a path"):
        read_array_record(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"paths=b'x.ar' must be a path"):
        read_array_record(b"x.ar")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"paths\[1\]=None must be a path"):
        read_array_record([good, None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="decode='utf-8' must be None"):
        read_array_record(good, decode="utf-8")  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "pipe.ar"
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError, match="FIFO"):
        read_array_record(fifo)


def test_bad_indices_are_refused(files):
    with read_array_record(files) as src:
        with pytest.raises(IndexError, match="25"):
            src.get_batch([0, 25])
        with pytest.raises(IndexError, match="-26"):
            src[-26]
        with pytest.raises(TypeError, match="must be integers"):
            src.get_batch([0.5])
        with pytest.raises(TypeError, match="index must be an int or a slice"):
            src["x"]  # type: ignore[index]
        with pytest.raises(TypeError, match="index must be an int or a slice"):
            src[True]  # type: ignore[index]


def test_without_array_record_the_error_names_the_extra(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "array_record.python.array_record_module", None)
    with pytest.raises(ImportError, match=r"read_array_record needs .*\.\[arrayrecord\]"):
        read_array_record(files[0])


def test_import_mixle_does_not_import_array_record():
    code = "import sys, mixle.data.sources.records.array_record_source, mixle; "
    code += "assert 'array_record' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the seam with the Loader ----------------------------------------------------------------
def test_loader_with_spawned_workers_reads_the_writers_records(dict_files):
    want = [pickle.loads(b) for b in _reference(dict_files)]
    src = read_array_record(dict_files, decode=pickle.loads)
    loader = mixle.Loader(
        src, batch_size=4, shuffle=True, seed=2, num_workers=2, worker_start_method="spawn"
    )
    seen: list[int] = []
    try:
        for batch in loader:
            idx = loader.last_indices
            assert idx is not None
            _assert_dict_batch(batch, [want[i] for i in idx])
            seen += idx.tolist()
    finally:
        loader.close()
        src.close()
    assert sorted(seen) == list(range(15)) and seen != sorted(seen)  # every record, shuffled
