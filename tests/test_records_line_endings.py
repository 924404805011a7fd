"""CSV and JSON lines rows end where Python's csv and json readers end them: ``\\n``,
``\\r\\n`` and lone ``\\r`` (CSV), quoted fields holding any of them, blank lines, a last row
without a terminator; ``len``, ``[i]``, ``get_batch`` and streaming all agree."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.records.text import row_scan
from mixle.errors import MalformedRowError

ENDS = ["\n", "\r\n", "\r"]
END = st.sampled_from(ENDS)
#: Fields written by csv.writer: any of these characters, quoted where needed.
FIELD = st.text(st.sampled_from('ab,"\r\n '), max_size=5)
#: Raw unquoted fields with literal quotes inside (``5'11"``), never starting with one.
RAW = st.text(st.sampled_from("x\"' ;"), min_size=1, max_size=5).filter(
    lambda t: not t.startswith('"')
)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@st.composite
def csv_texts(draw: st.DrawFn) -> tuple[str, int]:
    """A CSV text with a header ``c0,c1...``, random line ends, quoting and blank lines."""
    width = draw(st.integers(1, 3))
    out = io.StringIO()
    out.write(",".join(f"c{k}" for k in range(width)) + draw(END))
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
            row = io.StringIO()
            # with "\r\n" as its terminator the writer quotes fields holding \r or \n
            csv.writer(row, lineterminator="\r\n", quoting=quoting).writerow(
                draw(st.lists(FIELD, min_size=width, max_size=width))
            )
            out.write(row.getvalue().removesuffix("\r\n") + draw(END))
        else:
            out.write(",".join(draw(st.lists(RAW, min_size=width, max_size=width))) + draw(END))
        for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else 0):
            out.write(draw(END))  # blank lines
    text = out.getvalue()
    if draw(st.booleans()):  # the last row without a terminator
        text = text.rstrip("\r\n")
    return text, width


def _csv_truth(path: Path) -> list[list[str]]:
    """Rows as Python's csv module reads them (blank lines give ``[]``, skipped like pandas)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [row for row in csv.reader(fh, strict=True) if row]


def _open(path: Path, width: int) -> mixle.data.sources.tabular.CSVSource:
    names = [f"c{k}" for k in range(width)]
    return mixle.read_csv(path, dtypes=dict.fromkeys(names, str), na_values=())


def _rows(batch: dict[str, np.ndarray]) -> list[list[str]]:
    columns = [batch[name].tolist() for name in batch]
    return [list(row) for row in zip(*columns)]


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=csv_texts(), block=st.integers(1, 12), data=st.data())
def test_csv_rows_end_where_the_csv_module_ends_them(tmp_path: Path, case, block, data) -> None:
    # the index used to end rows at \n only: a CR-only file had len() == 0, and one stray
    # \r made len() one short and a row unreadable
    text, width = case
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "rows.csv"
    path.write_bytes(text.encode())
    try:
        truth = _csv_truth(path)
    except csv.Error:  # broken quoting: mixle raises MalformedRowError, tested elsewhere
        assume(False)
    assert truth[0] == [f"c{k}" for k in range(width)]
    want = truth[1:]
    with mock.patch.object(row_scan, "INDEX_BLOCK_BYTES", block):
        src = _open(path, width)
        assert [list(r.values()) for r in src.records()] == want
        assert len(src) == len(want)
        assert [list(src[i].values()) for i in range(len(want))] == want
        assert [list(src[i].values()) for i in range(-len(want), 0)] == want
        if want:
            idx = data.draw(st.lists(st.integers(0, len(want) - 1), max_size=10))
            assert _rows(src.get_batch(idx)) == [want[i] for i in idx]
            assert _rows(src[:]) == want


CASES = {
    "cr only": "a,b\r1,x\r2,y\r3,z\r",
    "one stray cr": "a,b\n1,x\n2,y\r3,z\n4,w\n",
    "crlf": "a,b\r\n1,x\r\n2,y\r\n",
    "mixed, last row unterminated": "a,b\r\n1,x\n2,y\r3,z",
    "quoted line ends": 'a,b\r1,"x\ry"\r2,"p\r\nq"\n3,"m\nn"\r\n',
    "blank lines": "a,b\n\n1,x\r\r\n\r2,y\n\r\n3,z\r",
    "cr then quote": 'a,b\r"1","x"\r"2","y"\r',
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_line_ends_agree_with_csv_and_pandas(tmp_path: Path, name: str) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes(CASES[name].encode())
    truth = _csv_truth(path)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    assert [list(frame.columns), *frame.to_numpy().tolist()] == truth  # the writers agree
    src = mixle.read_csv(path, dtypes={"a": str, "b": str}, na_values=())
    assert len(src) == len(truth) - 1
    assert _rows(src.get_batch(np.arange(len(src))[::-1])) == truth[1:][::-1]
    assert [list(r.values()) for r in src.records()] == truth[1:]
    loader = mixle.Loader(src, batch_size=2)
    assert sum(len(batch["a"]) for batch in loader) == len(truth) - 1  # used to yield nothing


@pytest.mark.parametrize("end", ENDS)
def test_a_malformed_row_names_the_same_line_on_every_path(tmp_path: Path, end: str) -> None:
    path = tmp_path / "rows.csv"
    path.write_bytes(end.join(["a,b", "1,x", '2,"y', 'z"', "3", "4,w"]).encode())
    src = mixle.read_csv(path, infer_rows=1)
    with pytest.raises(MalformedRowError, match="line 5") as streamed:
        list(src.records())
    with pytest.raises(MalformedRowError, match="line 5") as indexed:
        src.get_batch([2])
    assert streamed.value.line == indexed.value.line == 5


JSON_LINE = st.integers(0, 99).map(lambda v: json.dumps({"v": v})) | st.sampled_from(
    ["", " ", "\r", "\t \r"]
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.tuples(JSON_LINE, st.sampled_from(["\n", "\r\n"])), max_size=10),
    last=st.booleans(),
    block=st.integers(1, 12),
)
def test_jsonl_rows_end_at_newlines_with_crlf_allowed(tmp_path: Path, lines, last, block) -> None:
    # JSON lines: each line ends with \n, and \r\n is allowed (the \r is JSON whitespace)
    text = "".join(line + end for line, end in lines)
    if not last:
        text = text.removesuffix("\r\n").removesuffix("\n")
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "rows.jsonl"
    path.write_bytes(text.encode())
    want = [json.loads(line)["v"] for line in text.split("\n") if line.strip()]
    assume(want)
    with mock.patch.object(row_scan, "INDEX_BLOCK_BYTES", block):
        src = mixle.read_jsonl(path)
        assert len(src) == len(want)
        assert [int(src[i]["v"]) for i in range(len(want))] == want
        assert src.get_batch(np.arange(len(want)))["v"].tolist() == want
        assert [int(r["v"]) for r in src.records()] == want
    frame = pd.read_json(path, lines=True)
    assert frame["v"].tolist() == want


def test_jsonl_lone_cr_is_not_a_line_end(tmp_path: Path) -> None:
    # \r alone does not end a JSON line: json.loads refuses two objects on one line, and
    # mixle names that line on every path
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"v": 1}\n{"v": 2}\r{"v": 3}\n{"v": 4}\n')
    src = mixle.read_jsonl(path, infer_rows=1)
    assert len(src) == 3
    assert src[0]["v"] == 1 and src[2]["v"] == 4
    with pytest.raises(MalformedRowError, match="line 2"):
        src[1]
    with pytest.raises(MalformedRowError, match="line 2"):
        list(src.records())
