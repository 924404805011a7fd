"""Custom sources (the Source base class, SupportsSource) and Loader(check_spec=...)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import mixle
from mixle.data.sources.protocols import SupportsRecordKeys, SupportsSource
from mixle.loading.plan import record_rng
from mixle.loading.spec_check import parse_check_spec


class Squares(mixle.Source):
    """Record i: {"x": float32 [i, i*i], "y": int64 i}; ``bad`` decides which reads lie."""

    def __init__(self, n: int = 10, bad: Any = None) -> None:
        self.n = n
        self.bad = bad  # callable(call_number, indices) -> True to return float64 "x"
        self.calls = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def element_spec(self) -> dict[str, mixle.ArraySpec]:
        return {"x": mixle.ArraySpec((2,), np.float32), "y": mixle.ArraySpec((), np.int64)}

    def get_batch(self, indices: Any) -> dict[str, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        with self.lock:
            self.calls += 1
            call = self.calls
        x = np.stack([idx, idx * idx], axis=1).astype(np.float32)
        if self.bad is not None and self.bad(call, idx):
            x = x.astype(np.float64)
        return {"x": x, "y": idx.copy()}


def test_source_base_class_fills_in_the_surface() -> None:
    src = Squares(7)
    assert isinstance(src, SupportsSource)
    assert not isinstance(src, SupportsRecordKeys)
    assert src[3]["x"].tolist() == [3.0, 9.0] and src[3]["y"] == 3
    assert src[-1]["y"] == 6
    assert src[2:5]["y"].tolist() == [2, 3, 4]
    assert [r["y"] for r in src.records()] == list(range(7))
    assert [int(r["y"]) for r in src] == list(range(7))
    assert repr(src) == "Squares(7 records)"
    with src as s:
        assert not s.closed
    assert src.closed
    with pytest.raises(IndexError, match="out of range for length 7"):
        src[7]
    with pytest.raises(TypeError, match=r"index=1\.5 must be an int or a slice"):
        src[1.5]
    with pytest.raises(TypeError, match="must be an int or a slice"):
        src[True]


def test_source_base_class_needs_the_three_methods() -> None:
    class Half(mixle.Source):
        def __len__(self) -> int:
            return 1

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


def test_a_batch_that_breaks_the_spec_names_the_field() -> None:
    src = Squares(10, bad=lambda call, idx: True)
    loader = mixle.Loader(src, batch_size=4, num_threads=0)
    with pytest.raises(mixle.SchemaMismatchError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "Squares returned a batch that breaks its own element_spec() at batch 0 of epoch 0" in (
        message
    )
    assert "batch['x'] has shape (4, 2) and dtype float64" in message
    assert "spec expects shape (4, 2) and dtype float32" in message
    assert "check_spec=False" in message
    # off: the batch comes through as the source made it
    batch = next(iter(mixle.Loader(src, batch_size=4, num_threads=0, check_spec=False)))
    assert batch["x"].dtype == np.float64


def test_first_checks_the_first_batch_of_each_epoch_and_of_each_run() -> None:
    # call numbers with num_threads=0: epoch 0 reads calls 1-3, epoch 1 calls 4-6
    src = Squares(10, bad=lambda call, idx: call == 4)
    loader = mixle.Loader(src, batch_size=4, num_epochs=2, num_threads=0)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    with pytest.raises(mixle.SchemaMismatchError, match="at batch 0 of epoch 1"):
        next(batches)
    # a lie at batch 1 goes through with "first", not with True
    src = Squares(10, bad=lambda call, idx: call == 2)
    assert len(list(mixle.Loader(src, batch_size=4, num_threads=0))) == 3
    src = Squares(10, bad=lambda call, idx: call == 2)
    with pytest.raises(mixle.SchemaMismatchError, match="at batch 1 of epoch 0"):
        list(mixle.Loader(src, batch_size=4, num_threads=0, check_spec=True))
    # a run resumed at batch 1 checks its first batch
    src = Squares(10, bad=lambda call, idx: bool((idx == 4).any()))
    loader = mixle.Loader(src, batch_size=4, num_threads=0)
    state = loader.state_dict()
    state.update(batch=1, position=4, global_position=4)
    loader.load_state_dict(state)
    with pytest.raises(mixle.SchemaMismatchError, match="at batch 1 of epoch 0"):
        next(iter(loader))


def test_the_check_is_before_the_transforms_and_allows_the_short_last_batch() -> None:
    def widen(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": batch["x"].astype(np.float64)}

    def per_record(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {"x": record["x"], "y": np.int8(record["y"])}

    loader = mixle.Loader(
        Squares(10), batch_size=4, transform=widen, record_transform=per_record, check_spec=True
    )
    batches = list(loader)
    assert [b["x"].shape[0] for b in batches] == [4, 4, 2]
    assert batches[0]["x"].dtype == np.float64


def test_sources_read_record_by_record_are_checked_too() -> None:
    class Rows:
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return np.zeros(3, np.float32), np.zeros((), np.int32 if i < 4 else np.int64)

        def element_spec(self) -> tuple[mixle.ArraySpec, mixle.ArraySpec]:
            return mixle.ArraySpec((3,), np.float32), mixle.ArraySpec((), np.int32)

    loader = mixle.Loader(Rows(), batch_size=4, num_threads=0, check_spec=True)
    batches = iter(loader)
    next(batches)
    with pytest.raises(
        mixle.SchemaMismatchError, match=r"batch\[1\] has shape \(2,\) and dtype int64"
    ):
        next(batches)


def test_a_spec_nothing_can_check_is_skipped() -> None:
    class Opaque:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> np.ndarray:
            return np.full(2, i)

        def element_spec(self) -> str:
            return "unknown"

    assert len(list(mixle.Loader(Opaque(), batch_size=2, check_spec=True))) == 2


def test_the_check_runs_in_worker_processes() -> None:
    src = Squares(12, bad=lambda call, idx: bool((idx >= 8).any()))
    loader = mixle.Loader(
        src, batch_size=4, num_workers=2, worker_start_method="fork", check_spec=True
    )
    with pytest.raises(mixle.SchemaMismatchError, match="at batch 2 of epoch 0"):
        list(loader)


@pytest.mark.parametrize("value", ["every", "First", 1, 0, None, 1.0])
def test_bad_check_spec_values(value: object) -> None:
    with pytest.raises(ValueError, match=rf"check_spec={value!r} must be True"):
        mixle.Loader(Squares(4), batch_size=2, check_spec=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'first'"):
        parse_check_spec(value)


def test_record_transform_randomness_follows_the_record_keys() -> None:
    class Keyed(Squares):
        def record_keys(self, indices: Any) -> np.ndarray:
            return np.asarray(indices, dtype=np.uint64) * np.uint64(1000) + np.uint64(7)

    def draw(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {**record, "u": np.float64(rng.random())}

    src = Keyed(8)
    assert isinstance(src, SupportsRecordKeys)
    loader = mixle.Loader(src, batch_size=4, shuffle=True, seed=3, record_transform=draw)
    for batch in loader:
        keys = loader.last_record_keys
        assert keys is not None and keys.tolist() == [i * 1000 + 7 for i in loader.last_indices]
        want = [record_rng(3, 0, int(k)).random() for k in keys]
        np.testing.assert_array_equal(batch["u"], want)
    assert loader.last_origins is None  # a source that composes nothing
    plain = mixle.Loader(Squares(8), batch_size=4, shuffle=True, seed=3, record_transform=draw)
    for batch in plain:
        assert plain.last_record_keys.tolist() == plain.last_indices.tolist()
        want = [record_rng(3, 0, int(i)).random() for i in plain.last_indices]
        np.testing.assert_array_equal(batch["u"], want)


def test_a_bad_record_keys_is_named() -> None:
    class Broken(Squares):
        def record_keys(self, indices: Any) -> np.ndarray:
            return np.zeros(1)

    loader = mixle.Loader(Broken(4), batch_size=2, record_transform=lambda r, g: r)
    with pytest.raises(TypeError, match=r"Broken\.record_keys returned float64 of shape"):
        next(iter(loader))


def test_record_transform_keeps_list_columns_as_object_columns(tmp_path: Any) -> None:
    """A record source's variable-length list column is one object leaf per record: after a
    record_transform it is stacked back into an object column, not taken as structure (which
    failed for lists of different lengths and silently transposed lists of one length)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "a": [1, 2, 3, 4],
            "same": [[1, 2], [3, 4], [5, 6], [7, 8]],
            "ragged": [[1], [2, 3], [], [4]],
        }
    )
    pq.write_table(table, tmp_path / "lists.parquet")
    src = mixle.read_parquet(tmp_path / "lists.parquet")
    loader = mixle.Loader(src, batch_size=4, record_transform=lambda record, rng: record)
    batch = next(iter(loader))
    for column in ("same", "ragged"):
        assert batch[column].dtype == object and batch[column].shape == (4,)
        assert [list(v) for v in batch[column]] == table.column(column).to_pylist()
    assert batch["a"].tolist() == table.column("a").to_pylist()


def test_slicing_a_source_reads_only_the_slice() -> None:
    class Huge(mixle.Source):
        def __len__(self) -> int:
            return 2**40

        def get_batch(self, indices: Any) -> np.ndarray:
            return np.asarray(indices, dtype=np.int64)

        def element_spec(self) -> mixle.ArraySpec:
            return mixle.ArraySpec((), np.int64)

    src = Huge()
    assert src[:3].tolist() == [0, 1, 2]
    assert src[-2:].tolist() == [2**40 - 2, 2**40 - 1]
    assert src[:: 2**39].tolist() == [0, 2**39]
    assert src[5:2].tolist() == []
    assert src[-1] == 2**40 - 1


@pytest.mark.parametrize("path", ["web.npy", b"web.npy"])
def test_a_path_is_not_a_source(path: Any) -> None:
    with pytest.raises(TypeError, match="is a path, not a source: open it first"):
        mixle.Loader(path, batch_size=2)


def test_records_of_different_dtypes_are_refused_not_promoted() -> None:
    """np.stack would promote an int32 and a float64 leaf silently, so one batch could differ
    in dtype from the next (a recompile, or precision lost in JAX)."""

    def mixed(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        y = record["y"]
        return {**record, "y": np.int32(y) if y < 2 else np.float64(y)}

    loader = mixle.Loader(Squares(4), batch_size=4, record_transform=mixed)
    with pytest.raises(
        ValueError, match=r"different dtypes \['float64', 'int32'\] at record\['y'\]"
    ):
        next(iter(loader))
    # strings of different lengths stack to the longest, as before
    assert mixle.data.batches.stack_records(["a", "bcd"]).dtype == np.dtype("<U3")


def test_string_fields_declared_object_stay_object() -> None:
    class Names(mixle.Source):
        def __len__(self) -> int:
            return 4

        def get_batch(self, indices: Any) -> dict[str, np.ndarray]:
            out = np.empty(len(indices), dtype=object)
            out[:] = [("n" * (int(i) + 1)) if i != 2 else None for i in indices]
            return {"name": out}

        def element_spec(self) -> dict[str, mixle.ArraySpec]:
            return {"name": mixle.ArraySpec((), object)}

    loader = mixle.Loader(Names(), batch_size=4, record_transform=lambda r, g: r, check_spec=True)
    batch = next(iter(loader))
    assert batch["name"].dtype == object
    assert batch["name"].tolist() == ["n", "nn", None, "nnnn"]


def test_python_numbers_strings_and_none_stack_as_numpy_promotes_them() -> None:
    """Only NumPy numeric leaves of different dtypes are refused: a JSON row's 1 and 0.5, a
    bool and an int, a string and None stack as before (float64, int64, object)."""
    stack = mixle.data.batches.stack_records
    assert stack([{"score": 1}, {"score": 0.5}])["score"].dtype == np.float64
    assert stack([True, 1]).dtype == np.int64
    assert stack(["a", None]).tolist() == ["a", None]
    assert stack([1, np.int64(2)]).dtype == np.int64


def test_an_object_leaf_does_not_depend_on_the_first_records_type() -> None:
    spec = mixle.ArraySpec((), object)
    stack = mixle.data.batches.stack_records
    for values in ([1.5, None], [None, 1.5], [np.array([1, 2]), [1, 2, 3]], [1, "a"]):
        out = stack(values, spec)
        assert out.dtype == object and out.shape == (2,), values
        assert all(a is b for a, b in zip(out, values)), values
