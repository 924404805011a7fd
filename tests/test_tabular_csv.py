"""CSV and JSON lines sources: ground truth against pandas and pyarrow, the row index, errors."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.records.text import row_scan
from mixle.data.sources.records.text.row_index import cache_dir
from mixle.testing import assert_unchanged, check_record_source


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _objects(values: object) -> list[object]:
    """Object column as a list with missing values as ``None`` (pandas uses NaN)."""
    out = []
    for v in list(values):  # type: ignore[call-overload]
        out.append(None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    return out


def _assert_matches_pandas(src: mixle.data.sources.tabular.CSVSource, frame: pd.DataFrame):
    got = src.get_batch(np.arange(len(src)))
    assert list(got) == [str(c) for c in frame.columns]
    for name in frame.columns:
        want = frame[name]
        if want.dtype.kind in "if":
            assert got[name].dtype == want.to_numpy().dtype, name
            np.testing.assert_array_equal(got[name], want.to_numpy(), err_msg=name)
        else:
            assert got[name].dtype == object
            assert _objects(got[name]) == _objects(want.tolist()), name


TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\",\n 'é漢🙂"),
    max_size=12,
)
ROW = st.tuples(
    st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)),
    st.one_of(st.none(), TEXT.map(lambda t: "s" + t)),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(ROW, min_size=1, max_size=30), crlf=st.booleans(), data=st.data())
def test_random_csv_matches_pandas(tmp_path: Path, rows, crlf, data) -> None:
    path = tmp_path / "random.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\r\n" if crlf else "\n")
        writer.writerow(["id", "value", "name"])
        for row in rows:
            writer.writerow(
                ["" if v is None else repr(v) if isinstance(v, float) else v for v in row]
            )
    frame = pd.read_csv(
        path,
        keep_default_na=False,
        na_values=[""],
        dtype={"name": object},
    )
    with mixle.read_csv(path, dtypes={"name": str}) as src:
        assert len(src) == len(rows)
        _assert_matches_pandas(src, frame)
        idx = data.draw(st.lists(st.integers(-len(rows), len(rows) - 1), max_size=10))
        batch = src.get_batch(idx)
        for k, i in enumerate(idx):
            record = src[i]
            for name in src.columns:
                a, b = batch[name][k], record[name]
                assert (a == b) or (a is None and b is None) or (a != a and b != b), (i, name)
        streamed = list(src.records())
        assert len(streamed) == len(rows)
        assert _objects([r["name"] for r in streamed]) == _objects(frame["name"].tolist())


def test_numeric_csv_matches_pyarrow(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    table = {"a": rng.integers(-5, 5, 200), "b": rng.standard_normal(200), "c": rng.random(200)}
    path = tmp_path / "numbers.csv"
    pd.DataFrame(table).to_csv(path, index=False)
    truth = pacsv.read_csv(path)
    with mixle.read_csv(path, ["c", "a"]) as src:
        assert src.columns == ("c", "a")
        order = rng.permutation(200)
        got = src.get_batch(order)
        for name in ("c", "a"):
            np.testing.assert_array_equal(got[name], truth.column(name).to_numpy()[order])


def test_csv_source_contract_with_quotes_unicode_blanks_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    text = (
        'id,name,score,ok\r\n1,"Zoë, the ""first""",1.5,true\r\n\r\n'
        '2,"two\nlines",,False\r\n3,漢字,-2,TRUE\r\n'
    )
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    expected = {
        "id": np.array([1, 2, 3]),
        "name": np.array(['Zoë, the "first"', "two\nlines", "漢字"], dtype=object),
        "score": np.array([1.5, np.nan, -2.0]),
        "ok": np.array([True, False, True]),
    }
    with assert_unchanged(tmp_path):
        check_record_source(mixle.read_csv(path), expected)


def test_header_options_delimiter_and_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "plain.tsv"
    path.write_text("1\tx\n2\ty\n")
    src = mixle.read_csv(path, header=False, delimiter="\t")
    assert src.columns == ("0", "1") and src["0"].tolist() == [1, 2]
    named = mixle.read_csv(path, header=["n", "s"], delimiter="\t", dtypes={"n": "float32"})
    assert named.dtypes == {"n": np.dtype(np.float32), "s": np.dtype(object)}
    assert named[1] == {"n": np.float32(2), "s": "y"}
    dup = tmp_path / "dup.csv"
    dup.write_text("a,a,\n1,2,3\n")
    assert mixle.read_csv(dup).columns == ("a", "a.1", "Unnamed: 2")
    missing = tmp_path / "na.csv"
    missing.write_text("a,b\nNA,x\n1,NA\n")
    src = mixle.read_csv(missing, na_values=["NA"])
    assert np.isnan(src[0]["a"]) and src[1]["b"] is None


def test_row_index_is_cached_reused_and_invalidated(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = data / "rows.csv"
    path.write_text("a\n" + "".join(f"{i}\n" for i in range(100)))
    with assert_unchanged(data):
        first = mixle.read_csv(path)
        assert first.row_index_origin is None  # opening reads the header and a sample only
        assert len(first) == 100 and first.row_index_origin == "built"
        second = mixle.read_csv(path)
        assert second[99]["a"] == 99 and second.row_index_origin == "cached"
    indexes = list((cache_dir() / "row-index").glob("*.i64"))
    assert len(indexes) == 1
    with open(path, "a") as fh:
        fh.write("100\n101\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = mixle.read_csv(path)
    assert len(third) == 102 and third.row_index_origin == "built" and third[-1]["a"] == 101
    assert list((cache_dir() / "row-index").glob("*.i64")) != indexes  # old index replaced
    assert len(list((cache_dir() / "row-index").glob("*.i64"))) == 1


def test_row_index_in_memory_when_the_cache_cannot_be_written(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(blocker))
    path = tmp_path / "rows.csv"
    path.write_text("a\n1\n2\n")
    src = mixle.read_csv(path)
    assert len(src) == 2 and src.row_index_origin == "built" and src[1]["a"] == 2


def test_cache_dir_follows_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("MIXLE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "mixle"


def test_csv_errors_name_the_argument_value_and_line(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"path='nope\.csv' does not exist"):
        mixle.read_csv("nope.csv")
    path = tmp_path / "bad.csv"
    path.write_text('a,b\n1,"x\ny"\n2,z\n3\n4,w\n')
    with pytest.raises(mixle.ColumnNotFoundError, match=r"no column 'c'; its columns: a, b"):
        mixle.read_csv(path, ["a", "c"])
    src = mixle.read_csv(path, infer_rows=1)
    with pytest.raises(
        mixle.MalformedRowError, match=r"bad\.csv, line 5: the row has 1 fields"
    ) as info:
        src.get_batch([2, 0])
    assert info.value.line == 5
    assert src[1]["b"] == "z"  # rows around the bad one still read
    with pytest.raises(mixle.MalformedRowError, match="line 5"):
        list(src.records())
    with pytest.raises(mixle.MalformedRowError, match="line 5"):
        mixle.read_csv(path)  # in the sample read at open
    typed = tmp_path / "typed.csv"
    typed.write_text("n,s\n1,a\n2,b\n3,c\nx,d\n")
    with pytest.raises(
        mixle.MalformedRowError, match=r"line 2: column 's' \(int64\) cannot hold 'a'"
    ):
        mixle.read_csv(typed, dtypes={"s": "int64"})
    late = mixle.read_csv(typed, infer_rows=2)
    with pytest.raises(
        mixle.MalformedRowError,
        match=r"line 5: column 'n' \(int64\) cannot hold 'x'; pass dtypes=\{'n': 'str'\}",
    ):
        late.get_batch([3])
    with pytest.raises(TypeError, match=r"dtypes\['n'\]='banana' is not a supported dtype"):
        mixle.read_csv(typed, dtypes={"n": "banana"})
    with pytest.raises(mixle.ColumnNotFoundError, match="dtypes="):
        mixle.read_csv(typed, dtypes={"q": "int64"})
    with pytest.raises(ValueError, match="delimiter=';;'"):
        mixle.read_csv(typed, delimiter=";;")
    with pytest.raises(IndexError, match="out of range for length 4"):
        late.get_batch([4])
    with pytest.raises(TypeError, match="int, a slice or a column name"):
        late[1.5]  # type: ignore[index]
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty: header=True needs a header row"):
        mixle.read_csv(empty)
    missing_int = tmp_path / "gap.csv"
    missing_int.write_text("n,m\n1,a\n2,b\n\n,c\n")
    gap = mixle.read_csv(missing_int, dtypes={"n": "int64"}, infer_rows=1)
    with pytest.raises(mixle.MalformedRowError, match=r"line 5.*a missing value.*'float64'"):
        gap.get_batch([2])


def test_jsonl_source_contract_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [
        {"id": 1, "tags": "a\nb", "xy": [0.5, 1.0], "ok": True},
        {"id": 2, "tags": None, "xy": [2.0, 3.0], "ok": False},
        {"id": 3, "xy": [4.0, 5.0], "ok": True, "tags": "q\u2028"},
    ]
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text(lines[0] + "\n" + lines[1] + "\n\n" + lines[2] + "\n", encoding="utf-8")
    expected = {
        "id": np.array([1, 2, 3]),
        "tags": np.array(["a\nb", None, "q\u2028"], dtype=object),
        "xy": np.array([[0.5, 1.0], [2.0, 3.0], [4.0, 5.0]]),
        "ok": np.array([True, False, True]),
    }
    check_record_source(mixle.read_jsonl(path), expected)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"a": 2}\n\n{"a": 3,\n{"a": "x"}\n')
    src = mixle.read_jsonl(bad, infer_rows=2)
    with pytest.raises(mixle.MalformedRowError, match=r"bad\.jsonl, line 4: the row cannot be"):
        src.get_batch([2])
    with pytest.raises(mixle.MalformedRowError, match=r"line 5: column 'a' \(int64\) cannot"):
        src.get_batch([3])
    with pytest.raises(mixle.MalformedRowError, match="line 4: the row is not valid JSON"):
        list(src.records())
    with pytest.raises(mixle.ColumnNotFoundError, match="its columns: a"):
        mixle.read_jsonl(bad, ["b"], infer_rows=2)


UNQUOTED = st.text(st.sampled_from("x\"' ;"), min_size=1, max_size=6).filter(
    lambda t: not t.startswith('"')  # a leading quote would open a quoted field
)
QUOTED = st.text(st.sampled_from('x",\n\r '), max_size=6).map(
    lambda t: '"' + t.replace('"', '""') + '"'
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(UNQUOTED | QUOTED, UNQUOTED | QUOTED), min_size=1, max_size=12),
    crlf=st.booleans(),
    block=st.integers(1, 16),
)
def test_row_index_reads_literal_quotes_like_the_csv_module(tmp_path, rows, crlf, block) -> None:
    # a quote inside an unquoted field (5'11") is a literal character, not a field quote;
    # the index used to count it and merge rows, returning the wrong row for [i]
    end = "\r\n" if crlf else "\n"
    text = end.join(",".join(row) for row in rows) + end
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "quotes.csv"
    path.write_bytes(text.encode())
    want = [row for row in csv.reader(io.StringIO(text, newline=""), strict=True) if row]
    with mock.patch.object(row_scan, "INDEX_BLOCK_BYTES", block):
        src = mixle.read_csv(path, header=False, dtypes={"0": str, "1": str}, na_values=())
        assert len(src) == len(want)
        got = src.get_batch(np.arange(len(want)))
        assert list(zip(got["0"].tolist(), got["1"].tolist())) == [tuple(r) for r in want]
        assert [(r["0"], r["1"]) for r in src.records()] == [tuple(r) for r in want]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(
        st.integers(0, 9).map(lambda v: json.dumps({"v": v}))
        | st.text(st.sampled_from(" \t\r\x0b\x0c"), max_size=3),
        min_size=1,
        max_size=12,
    ),
    block=st.integers(1, 16),
)
def test_jsonl_whitespace_lines_are_blank_for_the_index_too(tmp_path, lines, block) -> None:
    # the index used to count a line of spaces as a row that no read could parse
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "rows.jsonl"
    path.write_text("\n".join(lines))
    want = [json.loads(line)["v"] for line in lines if line.strip()]
    if not want:
        return
    with mock.patch.object(row_scan, "INDEX_BLOCK_BYTES", block):
        src = mixle.read_jsonl(path)
        assert len(src) == len(want)
        assert src.get_batch(np.arange(len(want)))["v"].tolist() == want
        assert [r["v"] for r in src.records()] == want


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_forked_child_reopens_without_keeping_the_parents_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(50)))
    src = mixle.read_csv(path)
    assert src[3]["b"] == 9  # open in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = 0
        try:
            before = len(os.listdir("/proc/self/fd"))
            row = src[7]
            after = len(os.listdir("/proc/self/fd"))
            ok = int(row["b"] == 49 and after == before)  # one closed, one opened
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        result = fh.read()
    os.waitpid(pid, 0)
    assert result == b"\x01"
    assert src[7]["b"] == 49  # the parent's descriptor still works


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_infer_rows_must_be_a_positive_int_for_every_text_format(tmp_path: Path, bad) -> None:
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("a\n1\n")
    jsonl_path = tmp_path / "a.jsonl"
    jsonl_path.write_text('{"a": 1}\n')
    for read, path in ((mixle.read_csv, csv_path), (mixle.read_jsonl, jsonl_path)):
        with pytest.raises(ValueError, match=f"infer_rows={bad!r} must be an int >= 1"):
            read(path, infer_rows=bad)
