"""concat: batches equal reading the children directly, one get_batch per child, specs,
origins and record keys keyed on names, the source surface, pickles by reference."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import ArrayLike

import mixle
from mixle.data.sources.compose.concat import ConcatSource, concat
from mixle.data.sources.compose.mix import mix
from mixle.data.spec import describe_kind
from mixle.errors import SchemaMismatchError, SourceClosedError


class Counting(mixle.Source):
    """Wraps a source and records every get_batch call's indices."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.inner)

    def get_batch(self, indices: ArrayLike) -> Any:
        self.calls.append(np.asarray(indices).tolist())
        return self.inner.get_batch(indices)

    def element_spec(self) -> Any:
        return self.inner.element_spec()


class Listy2:
    """Two records that are tuples, read record by record (no get_batch)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.zeros(2), np.zeros(2))


class Rows(mixle.Source):
    """Rows of an array; no element spec, so mismatches show only at read time."""

    def __init__(self, data: np.ndarray, spec: bool = False) -> None:
        self.data, self.spec = data, spec

    def __len__(self) -> int:
        return len(self.data)

    def get_batch(self, indices: ArrayLike) -> np.ndarray:
        return self.data[self._indices(indices)]

    def element_spec(self) -> Any:
        return mixle.ArraySpec(self.data.shape[1:], self.data.dtype) if self.spec else None


def rows_data(n: int, base: int) -> np.ndarray:
    return (base + np.arange(n * 3).reshape(n, 3)).astype(np.float32)


def write_zarr(path: Path, data: np.ndarray, rows: int = 2) -> str:
    import zarr

    chunks = (rows, *data.shape[1:])
    arr = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[:] = data
    return str(path)


@pytest.fixture
def row_children(tmp_path: Path) -> dict[str, Any]:
    """Four kinds of children with records of shape (3,) float32, and their arrays."""
    np.save(tmp_path / "a.npy", rows_data(5, 0))
    return {
        "npy": mixle.read_npy(str(tmp_path / "a.npy")),
        "zarr": mixle.read_zarr(write_zarr(tmp_path / "b.zarr", rows_data(7, 1000))),
        "empty": np.zeros((0, 3), np.float32),
        "array": rows_data(4, 2000),
    }


def truth(children: dict[str, Any]) -> np.ndarray:
    return np.concatenate([np.asarray(c[:]) for c in children.values()])


def test_batches_equal_the_children_read_directly(row_children: dict[str, Any]) -> None:
    both = concat(row_children)
    expected = truth(row_children)
    assert len(both) == 16 == len(expected)
    idx = np.array([15, 0, 3, 3, -1, 7, 12, 5, 0, -16])
    np.testing.assert_array_equal(both.get_batch(idx), expected[idx])
    np.testing.assert_array_equal(both[-1], expected[-1])
    np.testing.assert_array_equal(both[3:9], expected[3:9])
    np.testing.assert_array_equal(np.stack(list(both)), expected)
    np.testing.assert_array_equal(np.stack(list(both.records())), expected)
    assert both.element_spec() == mixle.ArraySpec((3,), np.float32)
    assert both.get_batch([]).shape == (0, 3)


def test_dict_records_and_patch_samplers(tmp_path: Path) -> None:
    a = mixle.MemorySource({"x": np.arange(4.0), "y": np.arange(8).reshape(4, 2)})
    b = mixle.MemorySource({"x": -np.arange(3.0), "y": -np.arange(6).reshape(3, 2)})
    both = concat({"a": a, "b": b})
    got = both.get_batch([4, 0, 6])
    assert set(got) == {"x", "y"}
    np.testing.assert_array_equal(got["x"], [-0.0, 0.0, -2.0])
    np.testing.assert_array_equal(got["y"], [[0, -1], [0, 1], [-4, -5]])

    vol = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.save(tmp_path / "v.npy", vol)
    p = mixle.PatchSampler(
        mixle.read_npy(str(tmp_path / "v.npy")), patch_size=(3, 3), num_patches=5, seed=1
    )
    q = mixle.PatchSampler(
        mixle.read_zarr(write_zarr(tmp_path / "v.zarr", vol * 2)), patch_size=(3, 3), num_patches=4
    )
    patches = concat([p, q])
    idx = np.array([8, 0, 4, 5, 5])
    got_patch, got_coords = patches.get_batch(idx)
    want_p, want_q = p.get_batch([0, 4]), q.get_batch([3, 0, 0])
    np.testing.assert_array_equal(
        got_patch, np.concatenate([want_q[0][:1], want_p[0], want_q[0][1:]])
    )
    np.testing.assert_array_equal(
        got_coords, np.concatenate([want_q[1][:1], want_p[1], want_q[1][1:]])
    )
    assert isinstance(patches.get_batch([0]), tuple)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.data())
def test_against_concatenated_lists(lengths: list[int], data: st.DataObject) -> None:
    arrays = [np.arange(n, dtype=np.int64) + 100 * k for k, n in enumerate(lengths)]
    counted = [Counting(Rows(a)) for a in arrays]
    both = concat(counted)
    reference = [v for a in arrays for v in a.tolist()]
    assert len(both) == len(reference)
    if not reference:
        return
    idx = data.draw(st.lists(st.integers(-len(reference), len(reference) - 1), max_size=25))
    assert both.get_batch(np.asarray(idx, np.int64)).tolist() == [reference[i] for i in idx]
    for c in counted:
        assert len(c.calls) <= 1
    assert sum(len(c.calls[0]) for c in counted if c.calls) == len(idx)


def test_one_get_batch_per_child_in_request_order() -> None:
    a, b, c = (Counting(Rows(rows_data(n, 100 * k))) for k, n in enumerate([3, 4, 5]))
    both = concat({"a": a, "b": b, "c": c})
    both.get_batch([8, 0, 4, 2, 0, 11, 3])
    assert a.calls == [[0, 2, 0]] and b.calls == [[1, 0]] and c.calls == [[1, 4]]


def test_plain_getitem_children_are_read_row_by_row() -> None:
    class Listy:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"v": np.full(2, i, np.int16), "w": (np.float32(i), np.int64(-i))}

    both = concat([Listy(4), Listy(2)])
    got = both.get_batch([5, 1])
    np.testing.assert_array_equal(got["v"], [[1, 1], [1, 1]])
    assert isinstance(got["w"], tuple) and got["w"][1].tolist() == [-1, -1]
    assert both.element_spec() is None


def test_spec_mismatch_names_both_children_and_the_field(tmp_path: Path) -> None:
    a = mixle.MemorySource({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2)})
    b = mixle.MemorySource({"x": np.zeros((2, 4), np.float32), "y": np.zeros(2)})
    with pytest.raises(SchemaMismatchError) as info:
        concat({"first": a, "second": b})
    message = str(info.value)
    assert "'first'" in message and "'second'" in message and "spec['x']" in message
    assert "shape=(3,)" in message and "shape=(4,)" in message
    with pytest.raises(SchemaMismatchError, match=r"differ at spec\b"):
        concat([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)])


def test_children_without_a_spec_fail_when_a_batch_mixes_them() -> None:
    both = concat({"ints": Rows(np.zeros((3, 2), np.int64)), "floats": Rows(np.zeros((3, 2)))})
    both.get_batch([0, 1])  # one child: nothing to compare
    with pytest.raises(SchemaMismatchError, match=r"'floats'.*dtype float64.*'ints'"):
        both.get_batch([0, 4])


def test_a_child_breaking_the_declared_spec_is_caught_in_its_own_batch() -> None:
    both = concat({"a": np.zeros(2, np.float32), "b": [np.float64(1), np.float64(2)]})
    assert both.element_spec() == mixle.ArraySpec((), np.dtype(np.float32))
    assert both.get_batch([0, 1]).dtype == np.float32
    with pytest.raises(SchemaMismatchError, match=r"'b'.*dtype float64.*float32"):
        both.get_batch([2, 3])  # b's records alone: no sibling in the batch to compare


def test_children_without_a_spec_are_checked_against_the_first_batch_read() -> None:
    both = concat({"ints": Rows(np.zeros((3, 2), np.int64)), "floats": Rows(np.zeros((3, 2)))})
    assert both.element_spec() is None
    both.get_batch([0, 1])
    with pytest.raises(SchemaMismatchError, match=r"'floats'.*float64.*first batch.*'ints'"):
        both.get_batch([4, 5])
    fresh = concat({"ints": Rows(np.zeros((3, 2), np.int64)), "floats": Rows(np.zeros((3, 2)))})
    assert fresh.get_batch([3]).dtype == np.float64  # the first batch read sets the spec
    with pytest.raises(SchemaMismatchError, match=r"'ints'.*int64.*float64"):
        fresh.get_batch([0])
    with pytest.raises(SchemaMismatchError, match=r"'ints'"):
        mixle.mix({"ints": Rows(np.zeros((3, 2), np.int64)), "f": Rows(np.zeros((3, 2)))})[:]
    words = concat([["a", "b"], ["ccc"]])  # undeclared strings: any width, batch by batch
    assert words.get_batch([0]).tolist() == ["a"] and words.get_batch([2]).tolist() == ["ccc"]


class Ordered(Rows):
    """Rows with a declared :class:`mixle.SampleStructure`."""

    def __init__(self, data: np.ndarray, structure: mixle.SampleStructure) -> None:
        super().__init__(data)
        self.structure = structure


def test_concat_keeps_its_sources_structure() -> None:
    series = Ordered(np.zeros((4, 2)), mixle.SEQUENTIAL)
    both = concat({"series": series, "plain": Rows(np.zeros((3, 2)))})
    assert both.structure == mixle.SEQUENTIAL
    with pytest.raises(ValueError, match="SEQUENTIAL"):
        mixle.Loader(both, batch_size=2, shuffle=True)
    assert len(list(mixle.Loader(both, batch_size=2, shuffle=False))) == 4
    iid = [Ordered(np.zeros((2, 2)), mixle.IID) for _ in range(2)]
    assert concat(iid).structure == mixle.IID
    assert concat([iid[0], Ordered(np.zeros((2, 2)), mixle.EXCHANGEABLE)]).structure == (
        mixle.EXCHANGEABLE
    )
    assert concat([Rows(np.zeros((2, 2)))]).structure is None
    by_index = mixle.partially_exchangeable(by=lambda i: i // 2)
    assert concat([Ordered(np.zeros((2, 2)), by_index)] * 2).structure == mixle.SEQUENTIAL
    assert concat({"outer": both}).structure == mixle.SEQUENTIAL  # nested


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: concat(["web.npy", "books.npy"]), r"sources\['0'\]='web.npy' is a str"),
        (lambda: concat({"a": b"web.npy"}), r"sources\['a'\]=b'web.npy' is a bytes"),
        (lambda: concat([Path("web.npy")]), r"sources\['0'\]=\w*Path\('web.npy'\)"),
        (lambda: concat("web.npy"), r"sources='web.npy' is a str"),
        (lambda: mix({"a": np.zeros(2), "b": "books.npy"}), r"sources\['b'\]='books.npy'"),
        (lambda: mixle.select("web.npy", [0, 1]), r"source='web.npy' is a str"),
        (lambda: mixle.map("x.npy", len), r"source='x.npy' is a str"),
    ],
)
def test_a_path_is_not_a_source(build: Any, where: str) -> None:
    with pytest.raises(TypeError, match=where + r".*open the path first.*read_npy\(path\)"):
        build()


class Undeclared(Rows):
    """Rows whose element_spec() says it is not implemented (as the Source protocol allows)."""

    def element_spec(self) -> Any:
        raise NotImplementedError


def test_a_child_whose_spec_is_not_implemented_declares_none() -> None:
    odd = Undeclared(np.zeros((3, 2)))
    both = concat({"odd": odd, "known": Rows(np.ones((2, 2)), spec=True)})
    assert both.element_spec() == mixle.ArraySpec((2,), np.dtype(np.float64))
    np.testing.assert_array_equal(both.get_batch([4, 0]), [[1, 1], [0, 0]])
    picked = mixle.select(odd, [2, 0])
    with pytest.raises(TypeError, match="Undeclared declares no element_spec"):
        picked.element_spec()
    assert concat([picked, odd]).element_spec() is None
    assert mixle.map(odd, lambda r: r + 1).element_spec() == mixle.ArraySpec((2,), np.float64)
    assert len(list(mixle.Loader(picked, batch_size=2))) == 1
    assert mixle.select(np.zeros((4, 3), np.int8), [1]).element_spec() == mixle.ArraySpec(
        (3,), np.dtype(np.int8)
    )


def test_structure_mismatches_are_described_as_the_spec_check_does() -> None:
    assert describe_kind({"b": 1, "a": 2}) == "a dict with keys ['a', 'b']"
    assert describe_kind((1, 2)) == "a tuple of 2" and describe_kind(np.zeros(3)) == "an array"
    a, b = Rows(np.zeros((2, 2))), Listy2()
    with pytest.raises(SchemaMismatchError, match=r"'1'.* is a tuple of 2; spec expects an array"):
        concat([a, b]).get_batch([0, 2])


def test_names_and_bad_sources() -> None:
    x = np.zeros((2, 1))
    for bad, error, words in [
        ({1: x}, TypeError, "key 1"),
        ({"": x}, ValueError, "key ''"),
        ({"a/b": x}, ValueError, "'a/b'"),
        ([], ValueError, "empty"),
        ({}, ValueError, "empty"),
        (x, TypeError, "list or tuple"),
        ([x, object()], TypeError, r"sources\['1'\]"),
    ]:
        with pytest.raises(error, match=words):
            concat(bad)
    assert concat([x, x]).names == ("0", "1")
    assert concat((x,)).lengths == {"0": 2}


def test_origins_and_keys_follow_names_not_positions() -> None:
    a, b = Rows(rows_data(3, 0)), Rows(rows_data(4, 100))
    ab, ba = concat({"a": a, "b": b}), concat({"b": b, "a": a})
    assert ab.origins([0, 3, 6]) == mixle.Origins(
        ("a", "b"), np.array([0, 1, 1]), np.array([0, 0, 3])
    )
    # record a[2] is index 2 of ab and index 6 of ba: same origin, same key
    assert list(ab.origins([2, 4])) == list(ba.origins([6, 1])) == [("a", 2), ("b", 1)]
    np.testing.assert_array_equal(ab.record_keys([2, 4]), ba.record_keys([6, 1]))
    keys = ab.record_keys(np.arange(7))
    assert keys.dtype == np.uint64 and len(set(keys.tolist())) == 7
    m = mix({"a": a, "b": b}, seed=3)
    pairs = list(m.origins(np.arange(len(m))))
    ab_index = {pair: i for i, pair in enumerate(ab.origins(np.arange(7)))}
    np.testing.assert_array_equal(
        m.record_keys(np.arange(len(m))), ab.record_keys([ab_index[p] for p in pairs])
    )


def test_nested_compositions_name_their_path() -> None:
    a, b, c = Rows(rows_data(3, 0)), Rows(rows_data(4, 100)), Rows(rows_data(2, 200))
    inner = mix({"web": a, "books": b}, [1, 1], seed=1)
    outer = concat({"train": inner, "extra": c})
    got = outer.origins(np.arange(len(outer)))
    names = [name for name, _ in got]
    assert set(names) == {"train/web", "train/books", "extra"}
    for (name, i), row in zip(got, outer.get_batch(np.arange(len(outer)))):
        source = {"train/web": a, "train/books": b, "extra": c}[name]
        np.testing.assert_array_equal(row, source.data[i])
    again = concat({"extra": c, "train": mix({"books": b, "web": a}, [1, 1], seed=1)})
    order = {pair: k for k, pair in enumerate(again.origins(np.arange(len(again))))}
    np.testing.assert_array_equal(
        outer.record_keys(np.arange(len(outer))), again.record_keys([order[p] for p in got])
    )


def test_surface_close_repr_and_bad_indices(row_children: dict[str, Any]) -> None:
    both = concat(row_children)
    text = repr(both)
    assert "ConcatSource(16 records from 4 sources" in text
    assert (
        "'zarr': 7 records, ZarrArraySource(" in text
        and "'empty': 0 records, ndarray(shape=(0, 3)" in text
    )
    assert "2000" not in text  # no data
    with pytest.raises(IndexError, match="16"):
        both.get_batch([16])
    with pytest.raises(TypeError, match="integers"):
        both.get_batch([0.5])
    with both as same:
        assert same is both and not both.closed
    assert both.closed and row_children["npy"].closed and row_children["zarr"].closed
    both.close()  # idempotent
    for action in (
        lambda: both.get_batch([0]),
        lambda: both[0],
        both.element_spec,
        lambda: both.origins([0]),
        lambda: both.record_keys([0]),
        lambda: pickle.dumps(both),
    ):
        with pytest.raises(SourceClosedError, match="ConcatSource is closed"):
            action()
    assert "16 records from 4 sources, closed" in repr(both)


def test_pickles_by_reference(tmp_path: Path) -> None:
    big = (np.arange(20000 * 3).reshape(20000, 3) % 251).astype(np.float32)
    paths = [write_zarr(tmp_path / f"{k}.zarr", big + k, rows=5000) for k in range(3)]
    both = concat({f"z{k}": mixle.read_zarr(p) for k, p in enumerate(paths)})
    blob = pickle.dumps(both)
    assert len(blob) < 2000  # the data is 720 KB
    copy = pickle.loads(blob)
    assert isinstance(copy, ConcatSource) and copy.names == both.names
    idx = np.array([59999, 0, 20000, 45, 45])
    np.testing.assert_array_equal(copy.get_batch(idx), both.get_batch(idx))
    assert copy.fingerprint() == both.fingerprint()
    assert concat({"other": both.sources["z0"]}).fingerprint() != both.fingerprint()


def test_record_transform_randomness_follows_the_record() -> None:
    """The Loader keys record_transform's rng on record_keys: a record draws the same
    randomness in concat({"a", "b"}), concat({"b", "a"}) and a mix of the two."""
    a, b = Rows(np.zeros((5, 2))), Rows(np.zeros((6, 2)))

    def noise_of(source: Any) -> dict[tuple[str, int], list[float]]:
        loader = mixle.Loader(
            source, batch_size=4, shuffle=False, record_transform=lambda r, rng: r + rng.random()
        )
        out = {}
        for batch in loader:
            for pair, row in zip(source.origins(loader.last_indices), batch):
                out[pair] = row.tolist()
        return out

    ab = noise_of(concat({"a": a, "b": b}))
    assert noise_of(concat({"b": b, "a": a})) == ab
    mixed = noise_of(mix({"b": b, "a": a}, seed=4))
    assert mixed and all(ab[pair] == value for pair, value in mixed.items())
    assert len({value[0] for value in ab.values()}) == 11


def test_select_and_map_children() -> None:
    table = mixle.MemorySource({"x": np.arange(6.0), "k": np.arange(6) % 2})
    picked = mixle.select(table, [5, 1, 3])
    scaled = mixle.map(table, lambda r: {"x": r["x"] * 10, "k": r["k"]})
    both = concat({"sel": picked, "map": scaled})
    got = both.get_batch([0, 3, 8])
    np.testing.assert_array_equal(got["x"], [5.0, 0.0, 50.0])
    assert list(both.origins([0, 3, 8])) == [("sel", 5), ("map", 0), ("map", 5)]
    # a select over a plain array declares the array's row
    plain = concat([mixle.select(np.arange(8.0).reshape(4, 2), [3, 0]), np.zeros((1, 2))])
    assert plain.element_spec() == mixle.ArraySpec((2,), np.float64)
    np.testing.assert_array_equal(plain.get_batch([1, 2, 0]), [[0, 1], [0, 0], [6, 7]])
    # an empty map child: its lazy spec would need a record, and it gives none
    empty = mixle.map(mixle.MemorySource({"x": np.zeros(0), "k": np.zeros(0, np.int64)}), dict)
    assert len(concat({"map": empty, "sel": picked})) == 3


def test_undeclared_children_may_vary_in_axis_lengths_not_in_dtype() -> None:
    """Without a declared spec, later batches were checked against the first one's shapes:
    a source of variable-length records (or one padding each batch to its longest) failed
    with batch_size=1. Structure, dtype and the number of axes must still agree."""

    class Ragged:
        def __init__(self, dtype: Any) -> None:
            self.dtype = dtype

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> dict[str, np.ndarray]:
            return {"x": np.arange(i + 1, dtype=self.dtype)}

    both = mixle.concat([Ragged(np.int64), Ragged(np.int64)])
    batches = list(mixle.Loader(both, batch_size=1))
    assert [b["x"].shape for b in batches] == [(1, 1), (1, 2), (1, 3)] * 2
    mixed = mixle.concat([Ragged(np.int64), Ragged(np.int32)])
    mixed.get_batch([0])
    with pytest.raises(SchemaMismatchError, match="source '1'"):
        mixed.get_batch([3])
