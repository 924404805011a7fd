"""``map``: a function per record, applied at read time, its randomness keyed on the record.

Mapped reads are checked against applying the function to the child's own reads; the
generator a record gets is checked to follow the record through select and concat.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _compose_fns import CountingSource, RecordsOnly, noisy, row_noise, scaled, widen

import mixle
from mixle.data.sources.compose.concat import concat
from mixle.data.sources.compose.map import MapSource, map, map_rng
from mixle.data.sources.compose.select import select
from mixle.errors import LoaderStateError, SchemaMismatchError, SourceClosedError

N = 23
REF = np.arange(N * 4, dtype=np.int64).reshape(N, 4)


@pytest.fixture(scope="module")
def npy(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("map") / "ref.npy"
    np.save(path, REF)
    return str(path)


def table(n: int = 40) -> CountingSource:
    return CountingSource({"x": np.arange(n * 2.0).reshape(n, 2), "label": np.arange(n) % 3})


def plus_one(row: np.ndarray) -> np.ndarray:
    return row + 1


def test_map_is_fn_of_each_record_read_from_the_child(npy: str) -> None:
    src = mixle.read_npy(npy)
    mapped = map(src, plus_one)
    idx = [5, 0, 5, -1]
    np.testing.assert_array_equal(mapped.get_batch(idx), src.get_batch(idx) + 1)
    np.testing.assert_array_equal(mapped[3], src[3] + 1)
    np.testing.assert_array_equal(mapped[-2], src[N - 2] + 1)
    np.testing.assert_array_equal(mapped[2:9:3], REF[2:9:3] + 1)
    np.testing.assert_array_equal(np.stack(list(mapped)), REF + 1)
    assert len(mapped) == N
    assert mapped.element_spec() == mixle.ArraySpec((4,), np.dtype(np.int64))


def test_dict_records_of_a_memory_source() -> None:
    src = mixle.MemorySource({"x": np.arange(12.0).reshape(6, 2), "label": np.arange(6)})
    mapped = map(src, scaled)
    batch = mapped.get_batch([4, 1])
    np.testing.assert_array_equal(batch["x"], np.float32([[16, 18], [4, 6]]))
    np.testing.assert_array_equal(batch["label"], [4, 1])
    assert mapped.element_spec() == {
        "x": mixle.ArraySpec((2,), np.dtype(np.float32)),
        "label": mixle.ArraySpec((), np.dtype(np.int64)),
    }


def test_get_batch_is_one_child_read_and_the_spec_is_read_once() -> None:
    child = table()
    mapped = map(child, scaled)
    assert child.reads == []
    mapped.get_batch([7, 2, 7])
    assert [r.tolist() for r in child.reads] == [[7, 2, 7]]
    spec = mapped.element_spec()
    assert [r.tolist() for r in child.reads] == [[7, 2, 7], [0]]
    assert mapped.element_spec() == spec
    assert len(child.reads) == 2
    given = {"x": mixle.ArraySpec((2,), np.float32), "label": mixle.ArraySpec((), np.int64)}
    declared = map(child, scaled, spec=given)
    assert declared.element_spec() is given
    assert len(child.reads) == 2


def test_a_child_without_get_batch_is_read_record_by_record() -> None:
    mapped = map(RecordsOnly(np.arange(5)), lambda r: {"v": r["v"] * 10})
    np.testing.assert_array_equal(mapped.get_batch([4, 0])["v"], [40, 0])


def test_an_empty_read_has_the_spec() -> None:
    mapped = map(table(), scaled)
    empty = mapped.get_batch(np.zeros(0, np.int64))
    assert empty["x"].shape == (0, 2) and empty["x"].dtype == np.float32
    with pytest.raises(ValueError, match=r"no records to compute element_spec.*spec="):
        map(select(table(), []), scaled).element_spec()


# -- strings and object leaves -----------------------------------------------------------------
def same(record: Any) -> Any:
    return record


def upper(record: dict[str, Any]) -> dict[str, Any]:
    return {"s": record["s"].upper()}


def assert_batches_equal(got: Any, want: Any) -> None:
    """Two dict batches with the same keys, dtypes and values (object leaves compared as lists)."""
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].tolist() == want[key].tolist(), key


def test_a_map_over_a_csv_loads_what_the_csv_loads(tmp_path: Path) -> None:
    path = tmp_path / "words.csv"
    pd.DataFrame({"s": ["a", "bb", "ccc", "dddd", "eeeee"], "x": [1, 2, 3, 4, 5]}).to_csv(
        path, index=False
    )
    csv = mixle.read_csv(str(path))
    mapped = map(csv, same)
    assert mapped.element_spec() == csv.element_spec()
    got = list(mixle.Loader(mapped, batch_size=3))  # check_spec="first"
    want = list(mixle.Loader(mixle.read_csv(str(path)), batch_size=3))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert_batches_equal(g, w)


def test_strings_fn_returns_are_object_leaves_of_any_width() -> None:
    src = mixle.MemorySource({"s": ["a", "bb", "ccc"]})
    mapped = map(src, upper)
    assert mapped.element_spec() == {"s": mixle.ArraySpec((), np.dtype(object))}
    for rows in ([0], [2, 1], [0, 1, 2]):
        want = {"s": np.array([v.upper() for v in src.get_batch(rows)["s"]], dtype=object)}
        got = mapped.get_batch(rows)
        assert_batches_equal(got, want)
        assert all(type(v) is str for v in got["s"])
    # a string made from a number: the child declares no object leaf, the map does
    numbers = map(mixle.MemorySource({"x": [1, 22, 333]}), lambda r: {"s": str(r["x"])})
    assert numbers.element_spec() == {"s": mixle.ArraySpec((), np.dtype(object))}
    assert numbers.get_batch([0])["s"].dtype == numbers.get_batch([2, 1])["s"].dtype == object


def test_a_string_array_child_maps_to_object_strings() -> None:
    words = np.array(["a", "bb", "ccc"])  # declares <U3; a batch of "a" alone stacks as <U1
    mapped = map(words, same)
    assert mapped.element_spec() == mixle.ArraySpec((), np.dtype(object))
    assert mapped.get_batch([0]).dtype == mapped.get_batch([2, 1]).dtype == object
    assert mapped.get_batch([2, 0]).tolist() == words[[2, 0]].tolist()
    fixed = map(words, same, spec=mixle.ArraySpec((), np.dtype("<U3")))
    assert fixed.get_batch([2]).dtype == np.dtype("<U3")  # a declared string dtype stays


def test_list_columns_stay_one_value_per_record() -> None:
    src = mixle.MemorySource({"tags": [[1], [2, 3], []], "n": [1, 2, 3]})
    mapped = map(src, same)
    assert mapped.element_spec() == src.element_spec()
    for rows in ([0, 1, 2], [2], [1, 1]):
        assert_batches_equal(mapped.get_batch(rows), src.get_batch(rows))


def test_a_declared_object_spec_concatenates_with_an_object_sibling() -> None:
    words = mixle.MemorySource({"s": ["x", "yy"]})
    shouted = map(words, upper, spec={"s": mixle.ArraySpec((), np.dtype(object))})
    both = concat({"a": shouted, "b": mixle.MemorySource({"s": ["zzz"]})})
    batch = both.get_batch([2, 0, 1])
    assert batch["s"].dtype == object and batch["s"].tolist() == ["zzz", "X", "YY"]


# -- randomness follows the record -------------------------------------------------------------
def test_fn_with_rng_gets_the_generator_keyed_on_the_record() -> None:
    child = table()
    mapped = map(child, noisy, seed=9)
    got = mapped.get_batch([3, 3, 10])["x"]
    want = [
        child.columns["x"][i] + map_rng(9, i).standard_normal() for i in (3, 3, 10)
    ]  # record 3 twice: the same draw
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(mapped.get_batch([10])["x"], got[2:])  # same every read
    other = map(child, noisy, seed=10).get_batch([3])["x"]
    assert not np.array_equal(other, got[:1])


def test_rng_is_chosen_by_the_signature() -> None:
    def keyword(record: dict[str, Any], rng: np.random.Generator | None = None) -> Any:
        assert rng is not None
        return record["v"] + rng.integers(1, 10)

    def plain(record: dict[str, Any], scale: int = 1) -> Any:
        return record["v"] * scale

    src = CountingSource({"v": np.arange(5)})
    np.testing.assert_array_equal(map(src, lambda r: r["v"]).get_batch([2]), [2])
    np.testing.assert_array_equal(map(src, plain).get_batch([2, 3]), [2, 3])
    assert map(src, keyword).get_batch([2])[0] > 2


def test_select_of_map_and_map_of_select_draw_alike(npy: str) -> None:
    src = mixle.read_npy(npy)
    rows = np.array([17, 4, 0, 22], np.int64)
    a = select(map(src, row_noise, seed=5), rows)
    b = map(select(src, rows), row_noise, seed=5)
    direct = map(src, row_noise, seed=5).get_batch(rows)
    np.testing.assert_array_equal(a[:], direct)
    np.testing.assert_array_equal(b[:], direct)
    np.testing.assert_array_equal(b.record_keys([0, 1]), np.uint64([17, 4]))
    assert list(b.origins([1, 0])) == [("", 4), ("", 17)]
    # a repeat in the select is another visit: the map of it draws anew, the select of
    # the map reads the same mapped record again
    twice = np.array([4, 4])
    again = map(select(src, twice), row_noise, seed=5)[:]
    np.testing.assert_array_equal(again[0], direct[1])
    assert not np.array_equal(again[1], again[0])
    np.testing.assert_array_equal(select(map(src, row_noise, seed=5), twice)[:], direct[[1, 1]])


def test_through_concat_a_record_draws_alike_in_any_position(npy: str) -> None:
    src = mixle.read_npy(npy)
    first = map(concat({"a": src, "b": select(src, [3, 2, 1])}), row_noise, seed=1)
    second = map(concat({"b": select(src, [3, 2, 1]), "a": src}), row_noise, seed=1)
    np.testing.assert_array_equal(first.get_batch([N + 1]), second.get_batch([1]))
    np.testing.assert_array_equal(first.get_batch([0, 5]), second.get_batch([3, 8]))
    assert list(first.origins([N + 1])) == [("b", 2)]


# -- bad input ------------------------------------------------------------------------------------
def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match=r"fn=3 \(int\) must be callable"):
        map(table(), 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"spec=\{'x': \(2,\)\} must be a tree.*ArraySpec"):
        map(table(), scaled, spec={"x": (2,)})
    with pytest.raises(TypeError, match="seed"):
        map(table(), scaled, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="40"):
        map(table(), scaled).get_batch([40])


def test_inconsistent_records_name_the_record() -> None:
    def ragged(record: dict[str, Any]) -> np.ndarray:
        return np.zeros(2 if record["label"] == 0 else 3)

    def keys(record: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1} if record["label"] == 0 else {"b": 1}

    with pytest.raises(ValueError, match=r"record 7 but ArraySpec\(shape=\(2,\).* record 6"):
        map(table(), ragged).get_batch([6, 9, 7])
    with pytest.raises(ValueError, match=r"for record 1 but \{'a'"):
        map(table(), keys).get_batch([0, 1])


def test_records_of_different_dtypes_name_the_records() -> None:
    def two_dtypes(r: np.ndarray) -> np.ndarray:
        return r.astype(np.int32) if r < 5 else r.astype(np.float64)

    mapped = map(np.arange(10, dtype=np.float32), two_dtypes)
    with pytest.raises(ValueError, match=r"float64\) for record 5 but .*int32\) for record 0"):
        mapped.get_batch(np.arange(10))
    with pytest.raises(ValueError, match=r"record 7 but .* record 2.*different dtypes"):
        mapped.get_batch([2, 3, 7])
    # strings of other widths are one dtype (object), so they name nothing
    words = map(mixle.MemorySource({"s": ["a", "bb"], "n": [1, 2]}), same)
    assert words.get_batch([0, 1])["s"].tolist() == ["a", "bb"]


def test_an_error_in_fn_names_the_record() -> None:
    def broken(record: dict[str, Any]) -> Any:
        if record["label"] == 2:
            raise KeyError("oops")
        return record

    with pytest.raises(KeyError, match="oops") as info:
        map(table(), broken).get_batch([0, 5])
    assert "on record 5" in "".join(getattr(info.value, "__notes__", []))


def test_a_changing_spec_is_caught_by_the_loader_check() -> None:
    def grows(record: dict[str, Any]) -> np.ndarray:
        return np.zeros(1 + int(record["label"] > 0))

    mapped = map(table(), grows, spec=mixle.ArraySpec((1,), np.float64))
    with pytest.raises(SchemaMismatchError):
        list(mixle.Loader(select(mapped, [1, 4]), 2, check_spec=True))


# -- lifetime, repr, pickling ---------------------------------------------------------------------
def test_close_closes_the_child_and_repr_names_the_parts() -> None:
    src = mixle.MemorySource({"x": np.arange(3), "label": np.arange(3)})
    with map(src, scaled, seed=4) as mapped:
        text = repr(mapped)
        assert "MemorySource" in text and "fn=scaled" in text and "seed=4" in text
    assert mapped.closed and src.closed
    mapped.close()  # idempotent
    actions = (
        lambda: mapped[0],
        lambda: len(mapped),
        mapped.element_spec,
        lambda: pickle.dumps(mapped),
    )
    for action in actions:
        with pytest.raises(SourceClosedError):
            action()


def test_map_pickles_by_reference(npy: str) -> None:
    mapped = map(mixle.read_npy(npy), row_noise, seed=2)
    mapped.element_spec()
    payload = pickle.dumps(mapped)
    assert len(payload) < 1000
    copy = pickle.loads(payload)
    assert isinstance(copy, MapSource)
    np.testing.assert_array_equal(copy[:], mapped[:])
    assert copy.element_spec() == mapped.element_spec()


# -- the Loader seam ------------------------------------------------------------------------------
def test_a_loader_over_a_map_resumes(npy: str) -> None:
    def make() -> mixle.Loader:
        return mixle.Loader(map(mixle.read_npy(npy), row_noise, seed=3), 4, shuffle=True)

    loader = make()
    got = list(loader)
    assert len(got) == 6
    order = loader.record_indices(0)
    want = map(mixle.read_npy(npy), row_noise, seed=3).get_batch(order)
    np.testing.assert_array_equal(np.concatenate(got), want)
    first = make()
    it = iter(first)
    next(it), next(it), next(it)
    again = make()
    again.load_state_dict(first.state_dict())
    rest = list(again)
    assert len(rest) == 3
    for a, b in zip(rest, got[3:]):
        np.testing.assert_array_equal(a, b)


def test_resuming_with_another_fn_or_seed_is_refused(npy: str) -> None:
    loader = mixle.Loader(map(mixle.read_npy(npy), row_noise, seed=3), 4)
    next(iter(loader))
    state = loader.state_dict()
    mixle.Loader(map(mixle.read_npy(npy), row_noise, seed=3), 4).load_state_dict(state)
    for changed in (
        map(mixle.read_npy(npy), row_noise, seed=4),
        map(mixle.read_npy(npy), plus_one),
    ):
        with pytest.raises(LoaderStateError, match="source"):
            mixle.Loader(changed, 4).load_state_dict(state)


def test_spawned_workers_read_what_threads_read(tmp_path: Path) -> None:
    """Module-level fns over a column select, pickled into spawned worker processes."""
    n = 200
    path = tmp_path / "t.parquet"
    pd.DataFrame({"x0": np.arange(n * 1.0), "label": np.arange(n) % 4}).to_parquet(path)
    src = map(select(mixle.read_parquet(path), column="label", equals=2), widen, seed=7)
    mapped = map(src, noisy, seed=7)
    options: dict[str, Any] = {"shuffle": True, "seed": 2, "num_epochs": 2}
    threads = list(mixle.Loader(mapped, 8, **options))
    workers = list(
        mixle.Loader(mapped, 8, **options, num_workers=2, worker_start_method="spawn", timeout=60)
    )
    assert len(threads) == len(workers) == 14
    for a, b in zip(threads, workers):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["label"], b["label"])
    assert (np.concatenate([b["label"] for b in threads]) == 2).all()
