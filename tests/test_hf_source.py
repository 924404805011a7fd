"""read_hf: Hugging Face ``datasets`` as mixle sources, checked against ``datasets``' own reads.

Map-style datasets (in memory, memory-mapped from ``save_to_disk`` folders in small record
batches so that batches touch many of them, behind ``select``/``shuffle``/``filter`` indices
mappings) are compared row by row with ``ds[list]`` and ``ds.with_format("numpy")``; streams
with the ``IterableDataset``'s own iteration.
"""

from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fork_child import in_forked_child

datasets = pytest.importorskip("datasets")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mixle  # noqa: E402
from mixle.data.sources.records.hf import (  # noqa: E402
    HFSource,
    HFStreamSource,
    map_source,
    read_hf,
    stream_source,
)
from mixle.errors import ColumnNotFoundError, SourceClosedError  # noqa: E402
from mixle.testing import check_record_source  # noqa: E402

Features, Value, ClassLabel = datasets.Features, datasets.Value, datasets.ClassLabel

N = 120
#: Rows per record batch of the saved Arrow files (datasets' default is 1000).
FILE_BATCH = 9

FEATURES = Features(
    {
        "i": Value("int32"),
        "f": Value("float32"),
        "s": Value("string"),
        "b": Value("bool"),
        "label": ClassLabel(names=["cat", "dog", "emu"]),
        "fixed": datasets.Sequence(Value("float32"), length=3),
        "ragged": datasets.Sequence(Value("int64")),
        "image": datasets.Array2D((2, 3), "float32"),
        "dyn": datasets.Array2D((None, 2), "int16"),
        "struct": {"u": Value("int8"), "v": Value("string")},
        "nint": Value("int64"),
        "nbool": Value("bool"),
        "nstr": Value("string"),
    }
)


def _data(n: int = N) -> dict[str, list[Any]]:
    k = range(n)
    return {
        "i": [3 * j - 50 for j in k],
        "f": [j / 4 for j in k],
        "s": [f"row {j}" for j in k],
        "b": [j % 3 == 0 for j in k],
        "label": [j % 3 for j in k],
        "fixed": [[j, j + 0.5, -j] for j in k],
        "ragged": [list(range(j % 5)) for j in k],
        "image": [np.full((2, 3), j, dtype=np.float32) + np.arange(3) for j in k],
        "dyn": [np.full((j % 3, 2), j, dtype=np.int16) for j in k],
        "struct": [{"u": j % 100, "v": str(j)} for j in k],
        "nint": [None if j % 7 == 2 else j for j in k],
        "nbool": [None if j % 5 == 1 else j % 2 == 0 for j in k],
        "nstr": [None if j % 4 == 3 else f"x{j}" for j in k],
    }


#: The NumPy dtype and per-record shape read_hf promises for each column.
SPECS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "i": (np.dtype(np.int32), ()),
    "f": (np.dtype(np.float32), ()),
    "s": (np.dtype(object), ()),
    "b": (np.dtype(np.bool_), ()),
    "label": (np.dtype(np.int64), ()),
    "fixed": (np.dtype(np.float32), (3,)),
    "ragged": (np.dtype(object), ()),
    "image": (np.dtype(np.float32), (2, 3)),
    "dyn": (np.dtype(object), ()),
    "struct": (np.dtype(object), ()),
    "nint": (np.dtype(np.float64), ()),  # nulls: float64 with NaN, as read_parquet does
    "nbool": (np.dtype(object), ()),
    "nstr": (np.dtype(object), ()),
}


def _column(values: list[Any], name: str) -> np.ndarray:
    """``datasets``' Python values of column ``name`` as the NumPy column read_hf promises."""
    dtype, shape = SPECS[name]
    if dtype.kind == "O":
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray([np.nan if v is None else v for v in values], dtype=dtype).reshape(
        len(values), *shape
    )


def _expected(ds: Any, idx: Any, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """``ds[list(idx)]`` (datasets' own read) as NumPy columns."""
    rows = ds[[int(i) for i in idx]]
    return {name: _column(rows[name], name) for name in (columns or list(rows))}


def _assert_batch(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, column in want.items():
        assert got[name].dtype == column.dtype, name
        assert got[name].shape == column.shape, name
        if column.dtype == object:
            assert got[name].tolist() == column.tolist(), name
        else:
            np.testing.assert_array_equal(got[name], column, err_msg=name)


@pytest.fixture(scope="module", autouse=True)
def _quiet() -> Any:
    """No progress bars; and no torch import (5 s) when an IterableDataset is built."""
    datasets.disable_progress_bars()
    torch = datasets.config.TORCH_AVAILABLE
    datasets.config.TORCH_AVAILABLE = False
    yield
    datasets.config.TORCH_AVAILABLE = torch
    datasets.enable_progress_bars()


def _save(ds: Any, path: Path, **options: Any) -> Path:
    """``ds.save_to_disk(path)`` in record batches of :data:`FILE_BATCH` rows."""
    before = datasets.config.DEFAULT_MAX_BATCH_SIZE
    datasets.config.DEFAULT_MAX_BATCH_SIZE = FILE_BATCH
    try:
        ds.save_to_disk(str(path), **options)
    finally:
        datasets.config.DEFAULT_MAX_BATCH_SIZE = before
    return path


@pytest.fixture(scope="module")
def memory_ds() -> Any:
    return datasets.Dataset.from_dict(_data(), features=FEATURES)


@pytest.fixture(scope="module")
def folder(memory_ds: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(memory_ds, tmp_path_factory.mktemp("hf") / "ds", num_shards=2)


@pytest.fixture(scope="module")
def dict_folder(memory_ds: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dd = datasets.DatasetDict({"train": memory_ds, "test": memory_ds.select(range(10))})
    return _save(dd, tmp_path_factory.mktemp("hf") / "dd")


@pytest.fixture
def disk_ds(folder: Path) -> Any:
    ds = datasets.load_from_disk(str(folder))
    assert ds.data.table.column("i").num_chunks > 10  # many record batches, in two files
    return ds


IDX = [5, -1, 5, 0, N // 2, -N, 17, 16]


@pytest.mark.parametrize("kind", ["memory", "path", "loaded"])
def test_batches_equal_datasets_reads_in_any_order_with_repeats_and_negatives(
    kind: str, memory_ds: Any, folder: Path
) -> None:
    src = {"memory": lambda: read_hf(memory_ds), "path": lambda: read_hf(folder)}.get(
        kind, lambda: read_hf(datasets.load_from_disk(str(folder)))
    )()
    assert isinstance(src, HFSource) and len(src) == N
    want = _expected(memory_ds, [i % N for i in IDX])
    _assert_batch(src.get_batch(IDX), want)
    _assert_batch(src.get_batch(np.asarray(IDX, dtype=np.int32)), want)
    assert {n: (s.dtype, s.shape) for n, s in src.element_spec().items()} == SPECS
    record = src[-1]
    assert list(record) == list(SPECS)
    assert record["s"] == memory_ds[N - 1]["s"] and type(record["i"]) is np.int32
    np.testing.assert_array_equal(record["image"], memory_ds.with_format("numpy")[N - 1]["image"])


def test_array_columns_equal_datasets_numpy_format(disk_ds: Any) -> None:
    idx = [3, 100, 3, 42]
    theirs = disk_ds.with_format("numpy")[idx]
    got = read_hf(disk_ds).get_batch(idx)
    for name in ("i", "f", "b", "label", "fixed", "image"):
        np.testing.assert_array_equal(got[name], theirs[name], err_msg=name)
    for name in ("fixed", "image"):  # (datasets' numpy format makes int32 scalars int64)
        assert got[name].dtype == theirs[name].dtype, name


def test_the_conformance_suite_passes(memory_ds: Any, folder: Path, disk_ds: Any) -> None:
    want = _expected(memory_ds, range(N))
    check_record_source(read_hf(folder), want)
    # a Dataset's memory-mapped tables pickle as paths and the Arrow schema (its features)
    check_record_source(read_hf(disk_ds), want, max_pickle_bytes=4096)
    # in memory: pickling copies the data (there is no file to refer to)
    check_record_source(read_hf(memory_ds), want, max_pickle_bytes=10**7)
    shuffled = disk_ds.shuffle(seed=4, keep_in_memory=True)
    order = np.asarray(shuffled._indices.column(0))
    check_record_source(
        read_hf(shuffled),
        {k: v[order] for k, v in want.items()},
        max_pickle_bytes=8192,  # the paths, schema and indices mapping (8 bytes a row)
    )


def _mappings(ds: Any) -> dict[str, Any]:
    return {
        "select": ds.select([7, 3, 3, 90, 0, 45, 46, 47, 119]),
        "select_range": ds.select(range(10, 60)),
        "shuffle": ds.shuffle(seed=1, keep_in_memory=True),
        "filter": ds.filter(lambda r: r["i"] % 4 != 0, keep_in_memory=True),
        "shuffle_select": ds.shuffle(seed=2, keep_in_memory=True).select(range(5, 80, 3)),
    }


@pytest.mark.parametrize("name", ["select", "select_range", "shuffle", "filter", "shuffle_select"])
@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_indices_mappings_read_as_datasets_does_also_after_unpickling(
    name: str, on_disk: bool, memory_ds: Any, folder: Path
) -> None:
    base = datasets.load_from_disk(str(folder)) if on_disk else memory_ds
    ds = _mappings(base)[name]
    src = read_hf(ds)
    n = len(ds)
    assert len(src) == n
    idx = [n - 1, 0, n // 2, 0, -2, 1]
    want = _expected(ds, [i % n for i in idx])
    _assert_batch(src.get_batch(idx), want)
    clone = pickle.loads(pickle.dumps(src))
    _assert_batch(clone.get_batch(idx), want)
    every = _expected(ds, range(n), ["i", "s", "image"])
    streamed = list(read_hf(ds, columns=["i", "s", "image"]).iter_batches(7))
    _assert_batch({c: np.concatenate([b[c] for b in streamed]) for c in every}, every)


@pytest.fixture(scope="module")
def gather_cases(folder: Path) -> list[tuple[Any, HFSource]]:
    ds = datasets.load_from_disk(str(folder))
    names = ["i", "s", "ragged", "fixed"]
    return [(d, read_hf(d, columns=names)) for d in (ds, ds.shuffle(seed=9, keep_in_memory=True))]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-N, N - 1), max_size=80), st.booleans())
def test_every_gather_path_equals_datasets_read(
    gather_cases: list[tuple[Any, HFSource]], idx: list[int], shuffled: bool
) -> None:
    ds, src = gather_cases[shuffled]
    got = src.get_batch(idx)
    _assert_batch(got, _expected(ds, [i % N for i in idx], ["i", "s", "ragged", "fixed"]))


@pytest.mark.parametrize("take_runs", [1, map_source.TAKE_RUNS])
def test_dense_and_contiguous_reads_of_many_record_batches(
    disk_ds: Any, take_runs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # take_runs=1: a record batch with two runs of asked rows is read with one take
    monkeypatch.setattr(map_source, "TAKE_RUNS", take_runs)
    src = read_hf(disk_ds, columns=["i", "nint", "dyn"])
    for idx in (np.arange(N), np.arange(20, 70), np.arange(0, N, 2)[::-1], np.r_[0:30, 31:N:3]):
        _assert_batch(src.get_batch(idx), _expected(disk_ds, idx, ["i", "nint", "dyn"]))


def test_concatenated_datasets_with_other_record_batches_read_as_datasets_does(
    memory_ds: Any, disk_ds: Any
) -> None:
    left = disk_ds.select_columns(["i", "s"])
    right = datasets.Dataset.from_dict({"extra": [f"e{j}" for j in range(N)]})
    sideways = datasets.concatenate_datasets([left, right], axis=1)
    stacked = datasets.concatenate_datasets([left, memory_ds.select_columns(["i", "s"])])
    for ds in (sideways, stacked):
        n = len(ds)
        idx = [n - 1, 0, 8, 9, 10, n // 2, 8]
        got = read_hf(ds).get_batch(idx)
        rows = ds[idx]
        assert {c: got[c].tolist() for c in got} == rows
    assert "in-memory parts" in repr(read_hf(stacked))


def test_an_empty_dataset_has_no_rows_and_its_columns() -> None:
    # (datasets 5.2 cannot load_from_disk an empty dataset it saved, so in memory only)
    features = Features({"i": Value("int16"), "s": Value("string")})
    src = read_hf(datasets.Dataset.from_dict({"i": [], "s": []}, features=features))
    assert len(src) == 0 and src.columns == ("i", "s")
    batch = src.get_batch([])
    assert batch["i"].dtype == np.int16 and batch["i"].shape == (0,)
    assert list(src.records()) == []
    with pytest.raises(IndexError):
        src[0]


def test_columns_are_a_subset_in_the_given_order(folder: Path, memory_ds: Any) -> None:
    src = read_hf(folder, columns=["nstr", "i", "image"])
    assert src.columns == ("nstr", "i", "image")
    assert list(src.element_spec()) == ["nstr", "i", "image"]
    assert list(src[3]) == ["nstr", "i", "image"]
    _assert_batch(src.get_batch([4, 3]), _expected(memory_ds, [4, 3], ["nstr", "i", "image"]))
    assert "columns=['nstr', 'i', 'image']" in repr(src)


def test_dataset_dicts_need_a_split_unless_they_have_one(memory_ds: Any, dict_folder: Path) -> None:
    dd = datasets.DatasetDict({"train": memory_ds, "test": memory_ds.select(range(10))})
    for source in (dd, dict_folder):
        test = read_hf(source, split="test")
        assert len(test) == 10
        _assert_batch(test.get_batch([9, 0]), _expected(memory_ds, [9, 0]))
        with pytest.raises(ValueError, match=r"split=None.*'train', 'test'.*pass split="):
            read_hf(source)
        with pytest.raises(KeyError, match=r"split='valid'.*its splits: train, test"):
            read_hf(source, split="valid")
    assert len(read_hf(datasets.DatasetDict({"only": memory_ds}))) == N
    assert "split='test'" in repr(read_hf(dict_folder, split="test"))


def test_pickles_by_reference_and_rereads_equal(folder: Path, disk_ds: Any, tmp_path: Path) -> None:
    big = datasets.Dataset.from_dict({"x": np.ones((30_000, 8), dtype=np.float32)})
    big_folder = tmp_path / "big"
    big.save_to_disk(str(big_folder))
    loaded = datasets.load_from_disk(str(big_folder))
    for src in (read_hf(big_folder), read_hf(loaded), read_hf(loaded.select(range(0, 9, 2)))):
        assert len(pickle.dumps(src)) < 2048 < big.data.nbytes // 100
    want = _expected(disk_ds, [7, 100, 7])
    for src in (read_hf(folder), read_hf(disk_ds), read_hf(disk_ds.select([7, 100, 7]))):
        blob = pickle.dumps(src)
        assert len(blob) < 4096  # the paths, the Arrow schema (its features)
        clone = pickle.loads(blob)
        assert "not opened yet" in repr(clone)
        got = clone.get_batch([7, 100, 7]) if len(clone) == N else clone.get_batch([0, 1, 2])
        _assert_batch(got, want)


def test_a_shuffle_whose_indices_mapping_is_a_cache_file_pickles_its_path(
    memory_ds: Any, tmp_path: Path
) -> None:
    ds = datasets.load_from_disk(str(_save(memory_ds, tmp_path / "ds")))
    shuffled = ds.shuffle(seed=5)  # datasets writes the mapping next to the data
    assert len(shuffled.cache_files) == 2
    src = read_hf(shuffled)
    blob = pickle.dumps(src)
    assert len(blob) < 4096
    order = [int(i) for i in np.asarray(shuffled._indices.column(0))]
    _assert_batch(pickle.loads(blob).get_batch(range(N)), _expected(memory_ds, order))


def test_operations_replayed_on_memory_mapped_tables_survive_pickling(disk_ds: Any) -> None:
    ds = disk_ds.rename_column("i", "j").cast_column("f", Value("float64"))
    ds = ds.select_columns(["j", "f", "s"])
    src = read_hf(ds)
    assert src.dtypes["f"] == np.float64
    blob = pickle.dumps(src)
    assert len(blob) < 4096
    rows = ds[[3, 0, 3]]
    got = pickle.loads(blob).get_batch([3, 0, 3])
    assert {c: got[c].tolist() for c in got} == rows


def test_an_in_memory_dataset_pickles_its_data(memory_ds: Any) -> None:
    src = read_hf(memory_ds, columns=["i", "s"])
    assert "in memory" in repr(src)
    blob = pickle.dumps(src)
    assert len(blob) > N * 4
    _assert_batch(pickle.loads(blob)[:], _expected(memory_ds, range(N), ["i", "s"]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_correctly(folder: Path, disk_ds: Any) -> None:
    idx = [100, 3, 3, -1]
    names = ["i", "s", "image"]
    shuffled = disk_ds.shuffle(seed=3, keep_in_memory=True)
    sources = [read_hf(folder, columns=names), read_hf(shuffled, columns=names)]
    wants = [_expected(ds, [i % N for i in idx], names) for ds in (disk_ds, shuffled)]
    for src in sources:
        src.get_batch([0])  # opened in the parent

    def body() -> list[str]:
        problems = []
        for k, (src, want) in enumerate(zip(sources, wants)):
            try:
                _assert_batch(src.get_batch(idx), want)
            except AssertionError as exc:
                problems.append(f"source {k}: {exc}")
            if src._pid != os.getpid():
                problems.append(f"source {k} was not made the child's")
        return problems

    assert in_forked_child(body) == []
    _assert_batch(sources[0].get_batch(idx), wants[0])  # the parent's source still reads


def test_loader_batches_equal_datasets_rows_at_last_indices(disk_ds: Any) -> None:
    names = ["i", "s", "image", "nint", "ragged", "struct"]
    src = read_hf(disk_ds, columns=names)
    loader = mixle.Loader(src, batch_size=4, shuffle=True, seed=1)
    seen = []
    for batch in loader:
        idx = loader.last_indices
        assert idx is not None
        _assert_batch(batch, _expected(disk_ds, idx, names))
        seen.extend(idx.tolist())
    assert sorted(seen) == list(range(N)) and seen != list(range(N))


def test_bad_inputs_raise_clear_errors(
    folder: Path, dict_folder: Path, memory_ds: Any, tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"dataset_or_path=.*nope.* does not exist"):
        read_hf(missing)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"is a file, not a folder"):
        read_hf(tmp_path / "file.txt")
    with pytest.raises(FileNotFoundError, match=r"neither dataset_dict.json.*files: file.txt"):
        read_hf(tmp_path)
    with pytest.raises(ColumnNotFoundError, match=r"no column 'zz'; its columns: i, f, s"):
        read_hf(folder, columns=["i", "zz"])
    with pytest.raises(ColumnNotFoundError, match=r"no column 'zz'"):
        read_hf(memory_ds, columns=["zz"])
    with pytest.raises(ValueError, match=r"names a column twice"):
        read_hf(memory_ds, columns=["i", "i"])
    with pytest.raises(TypeError, match=r"columns='i' must be a list"):
        read_hf(memory_ds, columns="i")
    with pytest.raises(TypeError, match=r"split=3 must be a split name"):
        read_hf(dict_folder, split=3)
    with pytest.raises(ValueError, match=r"split='train', but .* is a Dataset folder"):
        read_hf(folder, split="train")
    with pytest.raises(ValueError, match=r"split='train', but dataset_or_path is a Dataset"):
        read_hf(memory_ds, split="train")
    with pytest.raises(TypeError, match=r"dataset_or_path=dict must be a datasets.Dataset"):
        read_hf({"i": [1, 2]})
    with pytest.raises(ValueError, match=r"local folders only"):
        read_hf("s3://bucket/ds")
    with pytest.raises(ValueError, match=r"has a transform .*with_transform"):
        read_hf(memory_ds.with_transform(lambda batch: batch))
    (dict_folder.parent / "broken").mkdir()
    (dict_folder.parent / "broken" / "dataset_dict.json").write_text('{"splits": ["a"]}')
    with pytest.raises(FileNotFoundError, match=r"split='a'.*is not a Dataset folder"):
        read_hf(dict_folder.parent / "broken")
    src = read_hf(folder)
    with pytest.raises(IndexError):
        src.get_batch([N])
    with pytest.raises(ColumnNotFoundError, match=r"'zz' is not a column"):
        src["zz"]


def test_a_format_is_ignored_the_arrow_data_is_read(memory_ds: Any) -> None:
    formatted = memory_ds.with_format("numpy", columns=["i"])
    _assert_batch(read_hf(formatted).get_batch([2, 1]), _expected(memory_ds, [2, 1]))


# -- streams ---------------------------------------------------------------------------
NO_NULLS = [c for c in FEATURES if not c.startswith("n")]


def _stream_records(ds: Any) -> list[dict[str, Any]]:
    """What the map-style source reads of ``ds``, record by record."""
    return list(read_hf(ds).records())


def _assert_records(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for name in w:
            assert type(g[name]) is type(w[name]), name
            if isinstance(w[name], np.ndarray):
                assert g[name].dtype == w[name].dtype and g[name].shape == w[name].shape
            np.testing.assert_equal(g[name], w[name])


def test_a_stream_equals_the_iterable_datasets_own_iteration(memory_ds: Any) -> None:
    ds = memory_ds.select_columns(NO_NULLS).select(range(40))  # (datasets iterates slowly)
    ids = ds.to_iterable_dataset(num_shards=3)
    src = read_hf(ids)
    assert isinstance(src, HFStreamSource)
    assert not hasattr(src, "__len__") and not hasattr(src, "__getitem__")
    records = list(src)
    theirs = list(ids)
    assert len(records) == len(theirs) == 40
    for ours, row in zip(records, theirs):
        assert list(ours) == list(row)
        for name, (dtype, shape) in SPECS.items():
            if name in ours and dtype.kind != "O":
                np.testing.assert_array_equal(ours[name], np.asarray(row[name], dtype=dtype))
                assert ours[name].dtype == dtype and ours[name].shape == shape, name
            elif name in ours:
                assert ours[name] == row[name], name
    # the same conversion as the map-style source, and a fresh pass every time
    _assert_records(records, _stream_records(ds))
    _assert_records(list(src), records)
    spec = src.element_spec()
    assert spec is not None
    assert {n: (s.dtype, s.shape) for n, s in spec.items()} == {n: SPECS[n] for n in NO_NULLS}
    assert "IterableDataset of 3 shards" in repr(src)


def test_a_stream_follows_datasets_shuffling_and_survives_pickling(memory_ds: Any) -> None:
    ids = memory_ds.select_columns(["i", "s"]).to_iterable_dataset(num_shards=4)
    shuffled = ids.shuffle(seed=3, buffer_size=16)
    src = read_hf(shuffled, columns=["s", "i"])
    got = [(r["s"], int(r["i"])) for r in src]
    assert got == [(r["s"], r["i"]) for r in shuffled]
    clone = pickle.loads(pickle.dumps(src))
    assert [(r["s"], int(r["i"])) for r in clone] == got
    assert src.columns == ("s", "i")


def test_a_stream_of_an_iterable_dataset_dict_and_its_split(memory_ds: Any) -> None:
    ids = memory_ds.select_columns(["i"]).to_iterable_dataset()
    idd = datasets.IterableDatasetDict({"train": ids, "test": ids.take(3)})
    assert [int(r["i"]) for r in read_hf(idd, split="test")] == memory_ds["i"][:3]
    with pytest.raises(ValueError, match=r"split=None"):
        read_hf(idd)
    with pytest.raises(ValueError, match=r"IterableDataset \(one split\)"):
        read_hf(ids, split="train")
    with pytest.raises(ColumnNotFoundError, match=r"no column 'zz'"):
        read_hf(ids, columns=["zz"])


def test_a_stream_without_features_converts_values_one_by_one() -> None:
    def rows() -> Any:
        for j in range(5):
            yield {"x": j, "y": j / 2, "ok": j % 2 == 0, "s": f"s{j}", "v": list(range(j))}

    ids = datasets.IterableDataset.from_generator(rows)
    assert ids.features is None
    src = read_hf(ids)
    assert src.element_spec() is None and src.columns is None
    got = list(src)
    assert got == list(ids)
    assert type(got[1]["x"]) is np.int64 and type(got[1]["y"]) is np.float64
    assert type(got[1]["ok"]) is np.bool_ and got[3]["v"] == [0, 1, 2]
    picked = list(read_hf(ids, columns=["s", "x"]))
    assert [list(r) for r in picked] == [["s", "x"]] * 5
    with pytest.raises(ColumnNotFoundError, match=r"example 0 .* no column 'zz'"):
        list(read_hf(ids, columns=["zz"]))


def test_a_stream_refuses_a_missing_value_its_dtype_cannot_hold(memory_ds: Any) -> None:
    ids = memory_ds.select_columns(["nint", "nstr", "f"]).to_iterable_dataset()
    records = iter(read_hf(ids, columns=["nstr", "f"]))
    assert [r["nstr"] for r in records] == memory_ds["nstr"]
    with pytest.raises(ValueError, match=r"example 2 .* column 'nint' \(int64.*cast_column"):
        list(read_hf(ids))

    def rows() -> Any:
        yield {"v": [1, 2, 3]}
        yield {"v": [1, None, 3]}

    fixed = Features({"v": datasets.Sequence(Value("int32"), length=3)})
    stream = iter(read_hf(datasets.IterableDataset.from_generator(rows, features=fixed)))
    np.testing.assert_array_equal(next(stream)["v"], np.array([1, 2, 3], dtype=np.int32))
    with pytest.raises(ValueError, match=r"example 1 .* column 'v' has values NumPy cannot"):
        next(stream)


def test_a_closed_stream_stops(memory_ds: Any) -> None:
    with read_hf(memory_ds.select_columns(["i"]).to_iterable_dataset()) as src:
        running = iter(src)
        next(running)
    assert src.closed and "(closed)" in repr(src)
    for action in (lambda: next(running), lambda: iter(src), lambda: pickle.dumps(src)):
        with pytest.raises(SourceClosedError):
            action()


def test_a_loader_over_a_stream_reshuffles_each_epoch_as_datasets_does(memory_ds: Any) -> None:
    """The Loader tells the stream the epoch (set_epoch) before each pass, as it tells a raw
    IterableDataset; without it a read_hf stream repeated epoch 0's order every epoch."""
    ids = memory_ds.select_columns(["i"]).to_iterable_dataset(num_shards=4)
    shuffled = ids.shuffle(seed=0, buffer_size=10)
    n = len(memory_ds)
    epochs = [b["i"].tolist() for b in mixle.Loader(read_hf(shuffled), n, num_epochs=2)]
    want = []
    for epoch in range(2):
        shuffled.set_epoch(epoch)
        want.append([int(r["i"]) for r in shuffled])
    assert epochs == want and epochs[0] != epochs[1]


def test_a_stream_source_reads_each_epoch_from_a_copy_that_does_not_share_it(
    memory_ds: Any,
) -> None:
    """set_epoch changed the given dataset's epoch in place (with torch installed, a tensor
    in shared memory that processes forked from this one see); read_hf's source and
    at_epoch now read a copy, and the dataset keeps its epoch."""
    shuffled = memory_ds.select_columns(["i"]).to_iterable_dataset(num_shards=4)
    shuffled = shuffled.shuffle(seed=1, buffer_size=5)
    src = read_hf(shuffled)
    before = src._dataset  # the with_format(None) copy read_hf made
    src.set_epoch(3)
    assert src._dataset is not before and src._dataset.epoch == 3 and before.epoch == 0
    shuffled.set_epoch(3)
    assert [int(r["i"]) for r in src] == [int(r["i"]) for r in shuffled]
    copy = stream_source.at_epoch(shuffled, 7)
    assert copy.epoch == 7 and shuffled.epoch == 3 and vars(copy) is not vars(shuffled)


def test_a_streams_format_is_ignored_like_the_map_style_sources() -> None:
    ds = datasets.Dataset.from_dict({"seq": [[1, 2], [3]], "s": ["a", "bb"]})
    for fmt in ("numpy", "arrow", "pandas"):
        src = read_hf(ds.to_iterable_dataset().with_format(fmt))
        batch = next(iter(mixle.Loader(src, 2)))
        assert batch["s"].dtype == object and batch["s"].tolist() == ds["s"], fmt
        assert [list(v) for v in batch["seq"]] == ds["seq"], fmt  # datasets' own read


def test_the_loader_reads_a_datasets_dataset_through_read_hf() -> None:
    """Read record by record, a Dataset gave fixed-width strings whose width changed per
    batch (and failed on None); the Loader now reads it through read_hf, a batch at a time."""
    ds = datasets.Dataset.from_dict({"s": ["a", None, "ccc", "dd"], "i": [1, 2, 3, 4]})
    for source in (ds, ds.to_iterable_dataset(), datasets.DatasetDict({"train": ds})):
        loader = mixle.Loader(source, 2)
        batches = list(loader)
        assert [b["s"].tolist() for b in batches] == [["a", None], ["ccc", "dd"]]
        assert all(b["s"].dtype == object and b["i"].dtype == np.int64 for b in batches)
    assert isinstance(mixle.Loader(ds, 2).source, HFSource)
    with pytest.raises(ValueError, match=r"pick one, e.g. Loader\(dataset\['train'\]"):
        mixle.Loader(datasets.DatasetDict({"train": ds, "test": ds}), 2)
    # a format (a type, or only a column selection) is the user's choice of rows: kept
    assert list(next(iter(mixle.Loader(ds.with_format(columns=["i"]), 2)))) == ["i"]
    with pytest.raises(ValueError, match="pick one"):  # a dict of splits is not rows
        mixle.Loader(datasets.DatasetDict({"train": ds}).with_format("numpy"), 2)


def test_a_dataset_dict_folders_split_list_is_read_within_a_bound(
    dict_folder: Path, monkeypatch: Any
) -> None:
    """dataset_dict.json was read whole, however big it had grown (a FIFO there is not a
    regular file and is never opened)."""
    opening = importlib.import_module("mixle.data.sources.records.hf.opening")
    monkeypatch.setattr(opening, "HF_METADATA_LIMIT", 8)
    with pytest.raises(ValueError, match="larger than 8 bytes"):
        read_hf(str(dict_folder), split="train")
