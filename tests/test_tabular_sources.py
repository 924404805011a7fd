"""Memory, Parquet and data-frame sources: the contract, ground truth against pyarrow, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.typing import NDArray

import mixle
from mixle.data.sources.records.base import Batch, MemorySource
from mixle.testing import assert_unchanged, check_record_source


def _table(n: int = 57) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.standard_normal(n).astype(np.float32),
            "label": [f"class {i % 4}" if i % 9 else None for i in range(n)],
            "count": pa.array([None if i % 11 == 0 else i for i in range(n)], pa.int32()),
            "xy": pa.array([[i, -i] for i in range(n)], pa.list_(pa.float64(), 2)),
        }
    )


def _expected(table: pa.Table) -> dict[str, np.ndarray]:
    label = np.empty(table.num_rows, dtype=object)
    label[:] = table.column("label").to_pylist()
    return {
        "id": table.column("id").to_numpy(),
        "x": table.column("x").to_numpy(),
        "label": label,
        "count": table.column("count").to_numpy(zero_copy_only=False).astype(np.float64),
        "xy": np.stack(table.column("xy").to_numpy(zero_copy_only=False)),
    }


def test_memory_source_contract_and_errors() -> None:
    columns = {"a": np.arange(6), "b": ["x", None, "z", "w", "v", "u"], "c": [1, None, 3, 4, 5, 6]}
    expected = {
        "a": np.arange(6),
        "b": np.array(["x", None, "z", "w", "v", "u"], dtype=object),
        "c": np.array([1, np.nan, 3, 4, 5, 6]),
    }
    check_record_source(mixle.MemorySource(columns), expected, max_pickle_bytes=10**5)
    records = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert mixle.MemorySource(records).get_batch([1, 0])["a"].tolist() == [2, 1]
    assert mixle.MemorySource([(1, 2.5), (2, 3.5)])[1] == {"0": 2, "1": 3.5}
    with pytest.raises(ValueError, match=r"equal lengths, got 'a': 3, 'b': 2, 'c': 3"):
        mixle.MemorySource({"a": [1, 2, 3], "b": [1, 2], "c": np.zeros(3)})
    with pytest.raises(ValueError, match=r"data\[1\] has keys \['a'\]"):
        mixle.MemorySource([{"a": 1, "b": 2}, {"a": 1}])
    with pytest.raises(TypeError, match="dict of equal-length columns"):
        mixle.MemorySource(42)  # type: ignore[arg-type]


class _Huge(MemorySource):
    """A source that reports 10**15 rows: row ``i`` holds ``i``."""

    def _count(self, handle: dict[str, np.ndarray]) -> int:
        return 10**15

    def _read_rows(self, handle: dict[str, np.ndarray], rows: NDArray[np.int64]) -> Batch:
        return {"i": rows.copy()}


def test_slices_of_a_long_source_read_only_their_rows() -> None:
    # src[a:b] used to build np.arange(len(src)) first: 8 bytes for every row of the source
    src = _Huge({"i": np.zeros(1, dtype=np.int64)})
    assert src[5:8]["i"].tolist() == [5, 6, 7]
    assert src[-2:]["i"].tolist() == [10**15 - 2, 10**15 - 1]
    assert src[10:4:-3]["i"].tolist() == [10, 7]


def test_parquet_directory_by_row_group_matches_pyarrow(tmp_path: Path) -> None:
    table = _table()
    folder = tmp_path / "set"
    folder.mkdir()
    pq.write_table(table.slice(0, 30), folder / "part-0.parquet", row_group_size=8)
    pq.write_table(table.slice(30), folder / "part-1.parquet", row_group_size=10)
    (folder / "_SUCCESS").write_text("")
    with assert_unchanged(folder):
        src = mixle.read_parquet(folder)
        assert src.num_row_groups == 4 + 3
        check_record_source(src, _expected(table))
        order = np.random.default_rng(0).permutation(table.num_rows)
        picked = mixle.read_parquet(str(folder), ["x", "id"]).get_batch(order)
        assert list(picked) == ["x", "id"]
        np.testing.assert_array_equal(picked["id"], order)
        np.testing.assert_array_equal(picked["x"], table.column("x").to_numpy()[order])


def test_parquet_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"path_or_url=.*does not exist"):
        mixle.read_parquet(tmp_path / "none.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="a directory with no Parquet files"):
        mixle.read_parquet(tmp_path / "empty")
    pq.write_table(_table(), tmp_path / "t.parquet")
    with pytest.raises(mixle.ColumnNotFoundError, match="no column 'nope'; its columns: id, x"):
        mixle.read_parquet(tmp_path / "t.parquet", ["nope"])
    url = (tmp_path / "t.parquet").as_uri()
    assert len(mixle.read_parquet(url)) == 57


def test_read_dataframe_pandas_and_arrow() -> None:
    table = _table(12)
    frame = table.to_pandas()
    expected = _expected(table)
    check_record_source(mixle.read_dataframe(table), expected, max_pickle_bytes=10**5)
    from_pandas = mixle.read_dataframe(frame, ["id", "label", "count"])
    batch = from_pandas.get_batch(np.arange(12))
    np.testing.assert_array_equal(batch["id"], expected["id"])
    assert batch["label"].tolist() == expected["label"].tolist()
    np.testing.assert_array_equal(batch["count"], expected["count"])
    nullable = pd.DataFrame({"n": pd.array([1, None], dtype="Int64"), "s": ["a", None]})
    got = mixle.read_dataframe(nullable).get_batch([0, 1])
    assert np.isnan(got["n"][1]) and got["s"].tolist() == ["a", None]
    with pytest.raises(TypeError, match="pandas or polars DataFrame or a pyarrow Table"):
        mixle.read_dataframe({"a": [1]})
