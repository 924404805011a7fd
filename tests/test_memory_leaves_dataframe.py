"""read_dataframe with columns of arrays: pandas columns of NumPy arrays and Arrow list columns.

Ground truth is the frame library's own read (``Series.to_numpy()``, ``to_pylist()``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mixle
from mixle.data.sources.records.array_leaves import LeafMismatchError
from mixle.testing import check_record_source


def test_pandas_column_of_arrays_stacks_with_the_arrays_dtype() -> None:
    # used to crash: ValueError "The truth value of an array ... is ambiguous"
    n = 9
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "image": [rng.random((2, 3)).astype(np.float32) for _ in range(n)],
            "label": np.arange(n),
            "w": pd.Series([np.float32(i / 7) for i in range(n)], dtype=object),
        }
    )
    expected = {
        "image": np.stack(frame["image"].to_numpy()),
        "label": frame["label"].to_numpy(),
        "w": np.array(frame["w"].tolist(), dtype=np.float32),
    }
    src = mixle.read_dataframe(frame)
    assert src.element_spec()["image"] == mixle.ArraySpec((2, 3), np.float32)
    assert src.get_batch([4, 1])["image"].shape == (2, 2, 3)
    check_record_source(src, expected, max_pickle_bytes=10**6)


@pytest.mark.parametrize(
    ("column", "pattern"),
    [
        ([np.zeros(2), np.zeros(3)], r"df\['a'\].iloc\[1\] is ndarray of shape \(3,\) and dtype "),
        ([np.zeros(2), None], r"df\['a'\].iloc\[1\] is None \(missing\), but df\['a'\].iloc\[0\]"),
        ([np.zeros(2), np.nan], r"df\['a'\].iloc\[1\] is None \(missing\)"),
        ([np.zeros(2, np.float32), np.zeros(2)], r"iloc\[1\] is ndarray .* dtype float64, but"),
        ([np.zeros(2), "x"], r"df\['a'\].iloc\[1\] is a Python str"),
    ],
)
def test_pandas_arrays_that_disagree_raise(column: list, pattern: str) -> None:
    frame = pd.DataFrame({"a": pd.Series(column, dtype=object)})
    with pytest.raises(LeafMismatchError, match=pattern) as caught:
        mixle.read_dataframe(frame)
    assert caught.value.column == "a" and caught.value.index == 1


def _chunked_sliced(values: list, arrow_type: pa.DataType) -> pa.Table:
    half = len(values) // 2
    chunks = [pa.array(values[:half], arrow_type), pa.array(values[half:], arrow_type)]
    return pa.table({"a": pa.chunked_array(chunks)}).slice(1, len(values) - 2)


@pytest.mark.parametrize(
    ("values", "arrow_type", "dtype", "shape"),
    [
        ([[i, -i, 2 * i] for i in range(10)], pa.list_(pa.float32()), np.float32, (3,)),
        ([[i, i + 1] for i in range(10)], pa.large_list(pa.int16()), np.int16, (2,)),
        (
            [[[i, 1], [2, i], [3, 3]] for i in range(10)],
            pa.list_(pa.list_(pa.uint8())),
            np.uint8,
            (3, 2),
        ),
        (
            [[[i, 1, 0], [2, i, 0]] for i in range(10)],
            pa.list_(pa.list_(pa.float64(), 3)),
            np.float64,
            (2, 3),
        ),
        ([[i, None] for i in range(10)], pa.list_(pa.int32()), np.float64, (2,)),
        ([[True, i % 2 == 0] for i in range(10)], pa.list_(pa.bool_()), np.bool_, (2,)),
    ],
)
def test_arrow_list_columns_of_one_length_stack(
    values: list, arrow_type: pa.DataType, dtype: type, shape: tuple
) -> None:
    # variable-size list columns used to be object columns of lists
    table = _chunked_sliced(values, arrow_type)
    rows = [[np.nan if v is None else v for v in r] for r in table.column("a").to_pylist()]
    want = np.array(rows, dtype=dtype)
    src = mixle.read_dataframe(table)
    assert src.element_spec()["a"] == mixle.ArraySpec(shape, dtype)
    check_record_source(src, {"a": want}, max_pickle_bytes=10**6)


def test_arrow_lists_of_different_lengths_stay_objects_as_read_parquet_reads_them(
    tmp_path: Path,
) -> None:
    table = pa.table(
        {
            "ragged": pa.array([[1.0], [2.0, 3.0], []], pa.list_(pa.float32())),
            "nulls": pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int64())),
            "words": pa.array([["a", "b"], ["c", "d"], ["e", "f"]], pa.list_(pa.string())),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    from_parquet = mixle.read_parquet(tmp_path / "t.parquet")
    src = mixle.read_dataframe(table)
    assert src.element_spec() == from_parquet.element_spec()
    got, also = src.get_batch([0, 1, 2]), from_parquet.get_batch([0, 1, 2])
    for name in table.column_names:
        assert src.element_spec()[name] == mixle.ArraySpec((), object)
        want = table.column(name).to_pylist()
        assert [None if v is None else list(v) for v in got[name]] == want, name
        assert [None if v is None else list(v) for v in also[name]] == want, name


def test_pandas_frame_from_arrow_lists_reads_like_the_table() -> None:
    table = pa.table({"a": pa.array([[i, i / 2] for i in range(5)], pa.list_(pa.float32()))})
    frame = table.to_pandas()  # an object column of float32 NumPy arrays
    want = np.stack(frame["a"].to_numpy())
    for src in (mixle.read_dataframe(table), mixle.read_dataframe(frame)):
        check_record_source(src, {"a": want}, max_pickle_bytes=10**6)
