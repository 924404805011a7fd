"""MemorySource from records whose leaves are NumPy scalars, NumPy arrays or JAX arrays.

Ground truth is NumPy's own ``np.stack`` of ``np.asarray(leaf)``: every leaf keeps its
dtype and shape (no float64 upcast, no object column), and leaves that disagree raise.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mixle
from mixle.data.sources.records.array_leaves import LeafMismatchError
from mixle.testing import check_record_source
from mixle.utils.optional_deps import HAS_JAX

ROOT = Path(__file__).resolve().parents[1]


class _ArrayLike:
    """A JAX-like array: ``__array__``, ``shape`` and ``dtype``, but not a NumPy array."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)


def _check_records(src: mixle.MemorySource, expected: dict[str, np.ndarray]) -> None:
    for source in (src, pickle.loads(pickle.dumps(src))):
        for i, record in enumerate(source.records()):
            for name, column in expected.items():
                leaf = np.asarray(record[name])
                assert (leaf.dtype, leaf.shape) == (column.dtype, column.shape[1:]), (i, name)
        last = source[-1]
        for name, column in expected.items():
            assert np.asarray(last[name]).dtype == column.dtype, name
            np.testing.assert_array_equal(last[name], column[-1])
    check_record_source(src, expected, max_pickle_bytes=10**7)


def test_array_leaves_stack_with_their_own_dtype_and_shape() -> None:
    # image leaves used to become an object column and float32 scalars float64
    n = 7
    images = [np.full((28, 28), i, dtype=np.float32) for i in range(n)]
    records = [
        {
            "image": _ArrayLike(images[i]),
            "label": i,
            "weight": np.float32(i / 3),
            "mask": np.arange(i, i + 3, dtype=np.uint8) % 2 == 0,
            "when": np.datetime64(1_000_000_007 * i, "ns"),
        }
        for i in range(n)
    ]
    expected = {
        "image": np.stack(images),
        "label": np.arange(n, dtype=np.int64),
        "weight": np.array([np.float32(i / 3) for i in range(n)], dtype=np.float32),
        "mask": np.stack([np.asarray(r["mask"]) for r in records]),
        "when": np.array([np.datetime64(1_000_000_007 * i, "ns") for i in range(n)]),
    }
    src = mixle.MemorySource(records)
    spec = src.element_spec()
    assert spec["image"] == mixle.ArraySpec((28, 28), np.float32)
    assert spec["weight"].dtype == np.float32 and spec["when"].dtype == np.dtype("M8[ns]")
    batch = src.get_batch([3, 0, 3])
    assert batch["image"].shape == (3, 28, 28) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int64
    _check_records(src, expected)


def test_columns_of_array_leaves_and_whole_array_columns() -> None:
    leaves = [np.arange(6, dtype=np.int16).reshape(2, 3) * i for i in range(4)]
    src = mixle.MemorySource({"a": leaves, "b": _ArrayLike(np.arange(4.0, dtype=np.float32))})
    _check_records(src, {"a": np.stack(leaves), "b": np.arange(4.0, dtype=np.float32)})
    tuples = mixle.MemorySource([(np.float16(i), np.int8(-i)) for i in range(3)])
    assert tuples.dtypes == {"0": np.float16, "1": np.int8}


@settings(max_examples=40, deadline=None)
@given(
    st.data(),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    st.integers(1, 6),
)
def test_stacking_equals_numpy_stack(data: st.DataObject, shape: tuple, n: int) -> None:
    dtype = data.draw(st.one_of(hnp.integer_dtypes(), hnp.floating_dtypes(), hnp.boolean_dtypes()))
    leaves = [data.draw(hnp.arrays(dtype, shape)) for _ in range(n)]
    wrapped = [leaf[()] if leaf.ndim == 0 else leaf for leaf in leaves]  # 0-d: NumPy scalars
    src = mixle.MemorySource([{"x": leaf} for leaf in wrapped])
    want = np.stack([np.asarray(leaf) for leaf in wrapped])
    got = src.get_batch(np.arange(n)[::-1])["x"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want[::-1])
    assert src.element_spec()["x"] == mixle.ArraySpec(shape, want.dtype)


def test_python_values_that_numpy_reads_as_the_leaf_dtype_join_the_column() -> None:
    records = [
        {"i": np.int64(1), "f": 2.5, "b": np.bool_(True), "v": [1.0, 2.0]},
        {"i": 2, "f": np.float64(0.5), "b": False, "v": np.array([3.0, 4.0])},
    ]
    src = mixle.MemorySource(records)
    want = {name: np.stack([np.asarray(r[name]) for r in records]) for name in records[0]}
    assert src.dtypes == {"i": np.int64, "f": np.float64, "b": np.bool_, "v": np.float64}
    _check_records(src, want)


def test_missing_float_scalars_are_nan_in_their_own_dtype() -> None:
    src = mixle.MemorySource([{"x": np.float32(1.5)}, {"x": None}, {"x": np.float32(2)}])
    got = src.get_batch([0, 1, 2])["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array([1.5, np.nan, 2], dtype=np.float32))


@pytest.mark.parametrize(
    ("records", "pattern", "index"),
    [
        (
            [{"img": np.zeros((2, 2), np.float32)}, {"img": np.zeros((2, 3), np.float32)}],
            r"data\[1\]\['img'\] is ndarray of shape \(2, 3\) and dtype float32, but "
            r"data\[0\]\['img'\] is ndarray of shape \(2, 2\) and dtype float32.*object array",
            1,
        ),
        (
            [{"v": np.float32(1)}, {"v": np.float32(2)}, {"v": np.float64(3)}],
            r"data\[2\]\['v'\] is float64 of shape \(\) and dtype float64, but data\[0\]\['v'\]"
            r" is float32 of shape \(\) and dtype float32.*dtype='float32'",
            2,
        ),
        (
            [{"v": 1.0}, {"v": np.float32(2)}],
            r"data\[0\]\['v'\] is a Python float \(.*float64 in NumPy\), "
            r"but data\[1\]\['v'\] is float32",
            0,
        ),
        (
            [{"v": np.ones(2)}, {"v": None}],
            r"data\[1\]\['v'\] is None \(missing\), but data\[0\]\['v'\] is ndarray of shape",
            1,
        ),
        ([{"v": np.int32(1)}, {"v": None}], r"data\[1\]\['v'\] is None \(missing\)", 1),
    ],
)
def test_leaves_that_disagree_raise_naming_both(
    records: list[dict[str, Any]], pattern: str, index: int
) -> None:
    with pytest.raises(LeafMismatchError, match=pattern) as caught:
        mixle.MemorySource(records)
    assert caught.value.column == next(iter(records[0])) and caught.value.index == index
    assert isinstance(caught.value, ValueError)


def test_dict_column_errors_name_the_column_place() -> None:
    with pytest.raises(LeafMismatchError, match=r"data\['a'\]\[1\] is ndarray of shape \(3,\)"):
        mixle.MemorySource({"a": [np.zeros(2), np.zeros(3)]})
    with pytest.raises(
        LeafMismatchError,
        match=r"data\[1\]\[0\] is a Python int \(of shape \(\) and dtype int64 in NumPy\), "
        r"but data\[0\]\[0\] is int32",
    ):
        mixle.MemorySource([(np.int32(1),), (2,)])
    with pytest.raises(TypeError, match=r"data\['a'\] is a 0-d _ArrayLike"):
        mixle.MemorySource({"a": _ArrayLike(np.array(1.0))})


def test_arrays_of_different_shapes_stay_objects_when_asked() -> None:
    ragged = [np.zeros(2), np.ones(3)]
    column = np.empty(2, dtype=object)
    column[:] = ragged
    src = mixle.MemorySource({"r": column})
    assert src.element_spec()["r"] == mixle.ArraySpec((), object)
    np.testing.assert_array_equal(src[1]["r"], ragged[1])


def test_plain_python_values_keep_their_json_dtypes() -> None:
    src = mixle.MemorySource(
        [{"i": 1, "f": 2.5, "s": "x", "xy": [1, 2]}, {"i": 2, "f": None, "s": None, "xy": [3, 4]}]
    )
    assert src.dtypes == {"i": np.int64, "f": np.float64, "s": object, "xy": np.int64}
    assert src.element_spec()["xy"].shape == (2,)


def test_loader_batches_keep_leaf_dtypes() -> None:
    records = [{"image": np.full((4, 4), i, np.float32), "label": i} for i in range(10)]
    loader = mixle.Loader(mixle.MemorySource(records), batch_size=4, drop_last=True)
    spec = loader.element_spec()
    assert spec["image"] == mixle.ArraySpec((4, 4, 4), np.float32)
    batches = list(loader)
    assert len(batches) == 2
    for batch in batches:
        assert batch["image"].dtype == np.float32 and batch["image"].shape == (4, 4, 4)
        np.testing.assert_array_equal(batch["image"][:, 0, 0], batch["label"])


JAX_CHILD = textwrap.dedent(
    """
    import numpy as np, jax.numpy as jnp
    import mixle
    from mixle.jax import JaxLoader

    records = [{"image": jnp.full((28, 28), i, jnp.float32), "label": i} for i in range(8)]
    src = mixle.MemorySource(records)
    assert src.element_spec()["image"] == mixle.ArraySpec((28, 28), np.float32)
    batch = src.get_batch([5, 1])
    assert batch["image"].dtype == np.float32 and batch["image"].shape == (2, 28, 28)
    np.testing.assert_array_equal(batch["image"], np.stack([np.asarray(records[5]["image"]),
                                                           np.asarray(records[1]["image"])]))
    assert batch["label"].dtype == np.int64 and batch["label"].tolist() == [5, 1]
    scalars = mixle.MemorySource([{"w": jnp.float32(i)} for i in range(3)])
    assert scalars.dtypes["w"] == np.float32
    seen = 0
    for out in JaxLoader(src, batch_size=4):
        assert out["image"].shape == (4, 28, 28) and out["image"].dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(out["image"])[:, 0, 0], np.asarray(out["label"]))
        seen += 1
    assert seen == 2
    print("jax ok")
    """
)


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_jax_array_leaves_through_memory_source_and_jax_loader() -> None:
    # JAX runs in a child: a started JAX backend breaks the suite's fork tests
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MIXLE_TEST_JAX_CHILD": "1"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", JAX_CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0 and "jax ok" in done.stdout, done.stdout + done.stderr[-4000:]
