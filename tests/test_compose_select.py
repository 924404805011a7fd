"""``select``: records by indices, by a mask, or where a column equals a value.

Reads are checked against NumPy fancy indexing of the reference array and against pandas'
own filtering of the file it wrote; the column evaluation is checked for laziness, block
reads, one evaluation under threads and a compact pickle.
"""

from __future__ import annotations

import importlib
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _compose_fns import CountingSource, RecordsOnly
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.sources.compose.select import SelectSource, select
from mixle.data.sources.records.parquet_source import ParquetSource
from mixle.errors import ColumnNotFoundError, LoaderStateError, SourceClosedError

SELECT = importlib.import_module("mixle.data.sources.compose.select")

N = 37
REF = np.arange(N * 3, dtype=np.int32).reshape(N, 3) * 7 - 5


@pytest.fixture(scope="module")
def npy(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("select") / "ref.npy"
    np.save(path, REF)
    return str(path)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 1000
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "label": rng.integers(0, 5, n),
            "split": rng.choice(["train", "val", "test"], n),
            "score": rng.standard_normal(n),
        }
    )


@pytest.fixture(scope="module")
def parquet(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("select") / "t.parquet"
    frame.to_parquet(path, row_group_size=128, index=False)
    return str(path)


def counting(n: int = 100) -> CountingSource:
    return CountingSource(
        {"id": np.arange(n), "label": np.arange(n) % 4, "x": np.arange(n * 2.0).reshape(n, 2)}
    )


# -- index math against NumPy -----------------------------------------------------------
index_lists = st.lists(st.integers(-N, N - 1), max_size=60)


@settings(max_examples=60, deadline=None)
@given(first=index_lists, second=st.data())
def test_indices_and_select_of_select_are_numpy_fancy_indexing(
    npy: str, first: list[int], second: st.DataObject
) -> None:
    src = mixle.read_npy(npy)
    sel = select(src, np.array(first, dtype=np.int64))
    want = REF[np.array(first, dtype=np.int64)]
    assert len(sel) == len(want)
    np.testing.assert_array_equal(sel.get_batch(np.arange(len(sel))), want)
    if not want.shape[0]:
        return
    k = len(want)
    inner = second.draw(st.lists(st.integers(-k, k - 1), min_size=1, max_size=40))
    outer = select(sel, inner)
    np.testing.assert_array_equal(outer.get_batch(np.arange(len(inner))), want[inner])
    picks = second.draw(st.lists(st.integers(-len(inner), len(inner) - 1), max_size=20))
    np.testing.assert_array_equal(outer.get_batch(picks), want[inner][picks])
    np.testing.assert_array_equal(outer[-1], want[inner][-1])


@settings(max_examples=40, deadline=None)
@given(mask=st.lists(st.booleans(), min_size=N, max_size=N), step=st.integers(1, 4))
def test_a_mask_is_numpy_boolean_indexing(npy: str, mask: list[bool], step: int) -> None:
    sel = select(mixle.read_npy(npy), np.array(mask))
    want = REF[np.array(mask)]
    assert len(sel) == len(want)
    np.testing.assert_array_equal(sel[::step], want[::step])
    np.testing.assert_array_equal(list(sel), list(want))


def test_repeats_and_negatives_read_the_child_directly(npy: str) -> None:
    src = mixle.read_npy(npy)
    sel = select(src, [3, 3, -1, 0, -N, 3])
    np.testing.assert_array_equal(sel[0:6], src.get_batch([3, 3, N - 1, 0, 0, 3]))
    np.testing.assert_array_equal(sel[2], src[N - 1])
    np.testing.assert_array_equal(sel.get_batch([-1, -6]), src.get_batch([3, 3]))
    assert sel.element_spec() == src.element_spec()
    np.testing.assert_array_equal(sel.child_indices(), [3, 3, N - 1, 0, 0, 3])


def test_get_batch_is_one_child_read_at_the_mapped_indices() -> None:
    child = counting()
    sel = select(child, [5, 1, 5, 90])
    assert child.reads == []
    batch = sel.get_batch([3, 0, 2])
    assert len(child.reads) == 1
    np.testing.assert_array_equal(child.reads[0], [90, 5, 5])
    np.testing.assert_array_equal(batch["id"], [90, 5, 5])


def test_a_child_without_get_batch_is_read_record_by_record() -> None:
    sel = select(RecordsOnly(np.arange(10) * 3), [9, 0, 9])
    np.testing.assert_array_equal(sel.get_batch([0, 1, 2])["v"], [27, 0, 27])
    assert sel[1] == {"v": 0}


def test_records_keep_their_keys_and_origins() -> None:
    child = counting()
    sel = select(child, [7, 3, 2])
    np.testing.assert_array_equal(sel.record_keys([0, 1, 2]), np.array([7, 3, 2], np.uint64))
    assert list(sel.origins([2, 0])) == [("", 2), ("", 7)]
    sel = select(child, [7, 3, 3])
    outer = select(sel, [2, 0])
    assert list(outer.origins([0, 1])) == [("", 3), ("", 7)]
    assert outer.record_keys([1]).dtype == np.uint64


def jitter(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return record + rng.random()


def test_a_repeated_index_is_a_visit_with_its_own_key() -> None:
    sel = select(np.arange(10.0), [0, 0, 0, 1, 0])
    keys = sel.record_keys(np.arange(5)).tolist()
    assert keys[0] == 0 and keys[3] == 1  # first visits: the child's keys
    assert len(set(keys)) == 5
    assert sel.record_keys([4, 1]).tolist() == [keys[4], keys[1]]  # any order, any batch
    assert list(sel.origins(np.arange(5))) == [("", 0)] * 3 + [("", 1), ("", 0)]
    # oversampling: the Loader's record_transform and map's rng draw anew per repeat
    loaded = np.concatenate(list(mixle.Loader(sel, batch_size=2, record_transform=jitter)))
    assert len(set(loaded[[0, 1, 2, 4]].tolist())) == 4
    mapped = mixle.map(sel, jitter, seed=3).get_batch(np.arange(5))
    assert len(set(mapped[[0, 1, 2, 4]].tolist())) == 4
    # the occurrences are not pickled, and come out the same
    copy = pickle.loads(pickle.dumps(sel))
    assert copy._visits is None
    assert copy.record_keys(np.arange(5)).tolist() == keys
    assert select(sel, [4, 0]).record_keys([0, 1]).tolist() == [keys[4], keys[0]]


# -- column == value ----------------------------------------------------------------------
@pytest.mark.parametrize(("column", "value"), [("label", 3), ("split", "val"), ("id", 999)])
def test_column_equals_is_pandas_filtering_parquet(
    parquet: str, frame: pd.DataFrame, column: str, value: Any
) -> None:
    sel = select(mixle.read_parquet(parquet), column=column, equals=value)
    want = frame[frame[column] == value]
    assert len(sel) == len(want)
    got = sel[:]
    for name in frame.columns:
        np.testing.assert_array_equal(got[name], want[name].to_numpy())
    np.testing.assert_array_equal(sel.child_indices(), want.index.to_numpy())


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_column_equals_is_pandas_filtering_text(
    fmt: str, frame: pd.DataFrame, tmp_path: Path
) -> None:
    path = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
        src = mixle.read_csv(path)
    else:
        frame.to_json(path, orient="records", lines=True)
        src = mixle.read_jsonl(path)
    sel = select(src, column="split", equals="test")
    want = frame[frame["split"] == "test"]
    np.testing.assert_array_equal(sel[:]["id"], want["id"].to_numpy())
    np.testing.assert_allclose(sel[:]["score"], want["score"].to_numpy())
    np.testing.assert_array_equal(
        select(src, column="label", equals=4)[:]["id"], frame["id"][frame["label"] == 4]
    )


def test_column_equals_on_a_memory_source_and_an_array_column() -> None:
    src = mixle.MemorySource({"a": np.arange(6), "v": np.array([[0, 1], [1, 1]] * 3)})
    np.testing.assert_array_equal(select(src, column="v", equals=[1, 1])[:]["a"], [1, 3, 5])
    assert len(select(src, column="a", equals=99)) == 0
    with pytest.raises(ValueError, match=r"equals has shape \(3,\).*shape \(2,\)"):
        len(select(src, column="v", equals=[1, 1, 1]))


def test_the_column_is_read_lazily_once_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SELECT, "COLUMN_BLOCK_ROWS", 16)
    child = counting(100)
    sel = select(child, column="label", equals=2)
    assert child.reads == []
    assert "not evaluated yet" in repr(sel)
    assert len(sel) == 25
    blocks = [r.tolist() for r in child.reads]
    assert blocks == [list(range(lo, min(100, lo + 16))) for lo in range(0, 100, 16)]
    assert len(sel) == 25
    sel.get_batch([0])
    assert len(child.reads) == len(blocks) + 1
    assert "25 of 100 rows where 'label' == 2" in repr(sel)


def test_a_record_source_streams_that_column_alone(
    parquet: str, frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Parquet source is streamed in blocks with only the compared column selected."""
    streamed: list[tuple[tuple[str, ...], int]] = []
    original = ParquetSource._stream

    def spy(self: ParquetSource, handle: Any, block_rows: int) -> Any:
        for block in original(self, handle, block_rows):
            streamed.append((tuple(block), len(next(iter(block.values())))))
            yield block

    monkeypatch.setattr(ParquetSource, "_stream", spy)
    monkeypatch.setattr(SELECT, "COLUMN_BLOCK_ROWS", 300)
    sel = select(mixle.read_parquet(parquet), column="label", equals=1)
    assert streamed == []
    assert len(sel) == int((frame["label"] == 1).sum())
    assert {names for names, _ in streamed} == {("label",)}
    assert len(streamed) >= 4
    assert sum(rows for _, rows in streamed) == len(frame)
    assert max(rows for _, rows in streamed) <= 300


def test_threads_asking_at_once_evaluate_once() -> None:
    child = counting(50)
    entered, release = threading.Event(), threading.Event()
    original = child.get_batch

    def slow(indices: Any) -> Any:
        entered.set()
        assert release.wait(30)
        return original(indices)

    child.get_batch = slow  # type: ignore[method-assign]
    sel = select(child, column="label", equals=0)
    lengths: list[int] = []
    threads = [threading.Thread(target=lambda: lengths.append(len(sel))) for _ in range(8)]
    threads[0].start()
    assert entered.wait(30)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(30)
    assert lengths == [13] * 8
    assert len(child.reads) == 1  # 50 rows: one block, read once


# -- pickling -----------------------------------------------------------------------------
def test_a_big_mask_pickles_as_bits(tmp_path: Path) -> None:
    n = 1_000_000
    np.save(tmp_path / "big.npy", np.zeros(n, np.uint8))
    src = mixle.read_npy(tmp_path / "big.npy")
    mask = np.random.default_rng(1).random(n) < 0.5
    sel = select(src, mask)
    payload = pickle.dumps(sel)
    assert 125_000 <= len(payload) < 130_000  # ~125 KB of bits, not 4 MB of rows
    copy = pickle.loads(payload)
    np.testing.assert_array_equal(copy.child_indices(), np.flatnonzero(mask))
    np.testing.assert_array_equal(copy.get_batch([0, -1]), [0, 0])
    small = select(src, [5, 2, 5])
    assert len(pickle.dumps(small)) < 1000
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(small)).child_indices(), [5, 2, 5])


def test_a_pickled_column_select_is_evaluated_once() -> None:
    child = counting(100)
    sel = select(child, column="label", equals=1)
    copy = pickle.loads(pickle.dumps(sel))
    reads = len(child.reads)
    assert reads == 1
    assert len(copy) == 25
    assert len(copy.source.reads) == reads  # the copy did not read the column again
    np.testing.assert_array_equal(copy[:]["id"], np.arange(1, 100, 4))


def test_a_parquet_select_pickles_by_reference(parquet: str) -> None:
    sel = select(mixle.read_parquet(parquet), column="split", equals="train")
    copy = pickle.loads(pickle.dumps(sel))
    assert len(pickle.dumps(sel)) < 2000
    np.testing.assert_array_equal(copy[:]["id"], sel[:]["id"])


# -- lifetime and repr ----------------------------------------------------------------------
def test_close_closes_the_child() -> None:
    src = mixle.MemorySource({"a": np.arange(5)})
    with select(src, [1, 2]) as sel:
        assert not sel.closed
        assert sel[0] == {"a": 1}
    assert sel.closed and src.closed
    sel.close()  # idempotent
    for action in (lambda: sel.get_batch([0]), sel.element_spec, lambda: pickle.dumps(sel)):
        with pytest.raises(SourceClosedError):
            action()
    unevaluated = select(mixle.MemorySource({"a": np.arange(3)}), column="a", equals=1)
    unevaluated.close()
    with pytest.raises(SourceClosedError):
        len(unevaluated)
    assert "closed" in repr(sel)


def test_repr_names_the_child_and_the_choice(npy: str) -> None:
    sel = select(mixle.read_npy(npy), np.arange(N) % 2 == 0)
    text = repr(sel)
    assert "NpyArraySource" in text and f"19 of {N} rows by mask" in text
    assert "4 of 37 rows by indices" in repr(select(mixle.read_npy(npy), [1, 2, 3, 4]))


# -- bad input ------------------------------------------------------------------------------
def test_bad_selections_are_refused_naming_the_argument(npy: str) -> None:
    src = mixle.read_npy(npy)
    with pytest.raises(ValueError, match=r"indices_or_mask is a bool mask of length 3.* 37"):
        select(src, [True, False, True])
    with pytest.raises(ValueError, match=r"indices_or_mask has shape \(2, 2\)"):
        select(src, np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        select(src, 3)
    with pytest.raises(TypeError, match=r"indices_or_mask has dtype float64.*bool mask"):
        select(src, [1.0, 2.0])
    with pytest.raises(TypeError, match=r"indices_or_mask has dtype <U1"):
        select(src, ["a"])
    with pytest.raises(IndexError, match=r"indices_or_mask contains 37, out of range"):
        select(src, [0, 37])
    with pytest.raises(IndexError, match=r"-38"):
        select(src, [-38])
    with pytest.raises(IndexError, match=r"indices contains 2"):
        select(src, [0, 1]).get_batch([2])
    assert len(select(src, [])) == 0


def test_bad_column_arguments_are_refused(npy: str, parquet: str) -> None:
    table = mixle.read_parquet(parquet)
    with pytest.raises(TypeError, match="neither"):
        select(table)
    with pytest.raises(TypeError, match="both"):
        select(table, [1], column="label", equals=1)
    with pytest.raises(TypeError, match=r"needs equals="):
        select(table, column="label")
    with pytest.raises(TypeError, match=r"needs column="):
        select(table, [1], equals=1)
    with pytest.raises(TypeError, match=r"column=3 must be a column name"):
        select(table, column=3, equals=1)  # type: ignore[arg-type]
    with pytest.raises(ColumnNotFoundError, match=r"'lable'.*id, label, split, score"):
        select(table, column="lable", equals=1)
    lazy = select(counting(), column="nope", equals=1)
    with pytest.raises(ColumnNotFoundError, match=r"'nope'.*id, label, x"):
        len(lazy)
    with pytest.raises(TypeError, match=r"needs records that are dicts.*NpyArraySource"):
        len(select(mixle.read_npy(npy), column="a", equals=1))


def test_none_is_a_value_to_compare_with() -> None:
    src = mixle.MemorySource({"tag": np.array(["a", None, "b", None], dtype=object)})
    np.testing.assert_array_equal(select(src, column="tag", equals=None).child_indices(), [1, 3])


# -- the Loader seam --------------------------------------------------------------------------
def test_a_loader_over_a_select_reads_the_selected_records(npy: str) -> None:
    idx = np.array([30, 2, 2, 17, 5, 36, 0, 11, 8, 9, 21], np.int64)
    sel = select(mixle.read_npy(npy), idx)
    loader = mixle.Loader(sel, batch_size=4, shuffle=True, seed=3, num_epochs=2)
    plain = mixle.Loader(
        mixle.MemorySource({"r": REF[idx]}), batch_size=4, shuffle=True, seed=3, num_epochs=2
    )
    got = list(loader)
    want = [b["r"] for b in plain]
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert loader.element_spec() == mixle.ArraySpec((4, 3), np.dtype(np.int32))

    resumed = mixle.Loader(sel, batch_size=4, shuffle=True, seed=3, num_epochs=2)
    it = iter(resumed)
    next(it), next(it)
    state = resumed.state_dict()
    again = mixle.Loader(select(mixle.read_npy(npy), idx), 4, shuffle=True, seed=3, num_epochs=2)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 4
    for g, w in zip(rest, got[2:]):
        np.testing.assert_array_equal(g, w)
    assert set(again.last_origins.index.tolist()) <= set(idx.tolist())  # type: ignore[union-attr]


def test_resuming_with_another_selection_is_refused(npy: str) -> None:
    src = mixle.read_npy(npy)
    loader = mixle.Loader(select(src, [1, 2, 3, 4]), 2)
    next(iter(loader))
    state = loader.state_dict()
    same = mixle.Loader(select(mixle.read_npy(npy), np.arange(1, 5)), 2)
    same.load_state_dict(state)
    other = mixle.Loader(select(src, [1, 2, 3, 5]), 2)
    with pytest.raises(LoaderStateError, match="source"):
        other.load_state_dict(state)


def test_a_loader_over_a_column_select_with_fork_workers(parquet: str, frame: pd.DataFrame) -> None:
    sel = select(mixle.read_parquet(parquet), column="split", equals="val")
    threads = list(mixle.Loader(sel, 16, shuffle=True, seed=1))
    workers = list(
        mixle.Loader(sel, 16, shuffle=True, seed=1, num_workers=2, worker_start_method="fork")
    )
    assert len(threads) == len(workers) > 1
    for a, b in zip(threads, workers):
        for name in frame.columns:
            np.testing.assert_array_equal(a[name], b[name])
    ids = np.sort(np.concatenate([b["id"] for b in threads]))
    np.testing.assert_array_equal(ids, frame.index[frame["split"] == "val"].to_numpy())


def test_select_is_a_select_source() -> None:
    assert isinstance(select(counting(), [1]), SelectSource)
    assert isinstance(select(counting(), [1]), mixle.Source)


def test_repeats_at_two_levels_get_keys_of_their_own() -> None:
    """A select repeat and a mix's second pass (or two nested selects' repeats) hash-mixed
    the same key with the same visit number: two different visits of a record drew the same
    randomness."""
    base = np.arange(6, dtype=np.int64)
    wrapped = mixle.select(mixle.mix({"a": base}, seed=0, length=12), [0, 0, *range(1, 12)])
    nested = mixle.select(mixle.select(base, [0, 0]), [0, 0, 1])
    for src in (wrapped, nested):
        reads = src.get_batch(np.arange(len(src)))
        keys = src.record_keys(np.arange(len(src)))
        for value in np.unique(reads):
            same = keys[reads == value]
            assert np.unique(same).size == same.size, (value, same)
