"""``mixle.read_volumes``: every kind of ``volumes=`` gives the volumes the writing library reads.

Volumes are written with zarr-python, h5py and NumPy and compared with those libraries' own
reads; the collection's surface (keys, names, shapes, dtypes, metadata, fingerprint, repr,
close) is checked on each kind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mixle
from mixle.data.sources.collection import VolumeCollection

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")

SHAPES = [(5, 6, 7), (4, 9, 3), (8, 2, 5)]


def _data(i: int, shape: tuple[int, ...] = (5, 6, 7), dtype: str = "float32") -> np.ndarray:
    return (np.arange(np.prod(shape)).reshape(shape) * (i + 1)).astype(dtype)


def _write_zarr(path: Path, data: np.ndarray, component: str | None = None) -> None:
    if component is None:
        zarr.create_array(str(path), data=data, chunks=(2, 3, 4))
    else:
        group = zarr.open_group(str(path), mode="w")
        group.create_array(component, data=data, chunks=(2, 3, 4))


def _write_h5(path: Path, data: np.ndarray, dataset: str = "vol") -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset(dataset, data=data, chunks=(2, 2, 2))


def _read_foreign(path: str, dataset: str = "vol", component: str | None = None) -> np.ndarray:
    """The volume as its own library reads it."""
    if path.endswith(".h5"):
        with h5py.File(path, "r") as f:
            return np.asarray(f[dataset][...])
    if path.endswith(".npy"):
        return np.load(path)
    array = zarr.open_array(path, mode="r", path=component or "")
    return np.asarray(array[...])


@pytest.fixture
def mixed(tmp_path: Path) -> list[str]:
    """A zarr store, an HDF5 file and a ``.npy`` file of different shapes."""
    paths = [str(tmp_path / "a.zarr"), str(tmp_path / "b.h5"), str(tmp_path / "c.npy")]
    _write_zarr(Path(paths[0]), _data(0, SHAPES[0]))
    _write_h5(Path(paths[1]), _data(1, SHAPES[1]))
    np.save(paths[2], _data(2, SHAPES[2]))
    return paths


def _check_matches(vols: VolumeCollection, expected: list[np.ndarray]) -> None:
    assert len(vols) == len(expected)
    for i, want in enumerate(expected):
        with vols.lease(i) as src:
            np.testing.assert_array_equal(src[...], want)
            box = src.read_box([1, 0, 1], [1, 2, 2])
        np.testing.assert_array_equal(box, want[1:2, 0:2, 1:3])
        assert vols.shape(i) == want.shape


def test_paths_of_three_formats(mixed: list[str]) -> None:
    vols = mixle.read_volumes(mixed, dataset="vol")
    assert isinstance(vols, mixle.VolumeCollection)
    assert vols.keys == tuple(mixed)
    assert vols.names is None
    assert vols.columns == ()
    _check_matches(vols, [_read_foreign(p) for p in mixed])
    assert vols.shapes() == SHAPES
    np.testing.assert_array_equal(vols.shapes_array(), np.array(SHAPES))
    assert vols.dtype == np.float32 and vols.ndim == 3
    assert vols.dtype_of(1) == np.float32
    assert vols.metadata(0) == {}
    vols.close()


def test_pathlike_items_and_zarr_component(tmp_path: Path) -> None:
    _write_zarr(tmp_path / "g.zarr", _data(0), component="inner/arr")
    vols = mixle.read_volumes([tmp_path / "g.zarr"], component="inner/arr")
    _check_matches(vols, [_read_foreign(str(tmp_path / "g.zarr"), component="inner/arr")])


def test_urls_of_zarr_stores_with_and_without_a_suffix() -> None:
    pytest.importorskip("fsspec")
    urls = ["memory://mixle-collection/scan1", "memory://mixle-collection/scan2.zarr"]
    for i, url in enumerate(urls):
        zarr.create_array(url, data=_data(i, SHAPES[i]), chunks=(2, 2, 2), overwrite=True)
    vols = mixle.read_volumes(urls)
    assert vols.keys == tuple(urls)
    _check_matches(vols, [np.asarray(zarr.open_array(u, mode="r")[...]) for u in urls])


def test_raw_files(tmp_path: Path) -> None:
    data = [_data(i, (3, 4, 5), "uint16") for i in range(2)]
    paths = []
    for i, d in enumerate(data):
        path = tmp_path / f"v{i}.raw"
        path.write_bytes(b"HEAD" + d.tobytes())
        paths.append(str(path))
    vols = mixle.read_volumes(paths, raw_dtype="uint16", raw_shape=(3, 4, 5), raw_offset=4)
    expected = [np.fromfile(p, dtype="uint16", offset=4).reshape(3, 4, 5) for p in paths]
    _check_matches(vols, expected)


def test_glob_is_sorted(tmp_path: Path) -> None:
    for name in ["c", "a", "b"]:
        np.save(tmp_path / f"{name}.npy", _data(ord(name), (2, 3, 4)))
    (tmp_path / "notes.txt").write_text("not a volume")
    vols = mixle.read_volumes(str(tmp_path / "*.npy"))
    assert vols.keys == tuple(str(tmp_path / f"{n}.npy") for n in "abc")
    _check_matches(vols, [np.load(k) for k in vols.keys])


def test_a_column_of_paths(tmp_path: Path, mixed: list[str]) -> None:
    """An array or Series of path strings (``df["path"].values``) is a list of paths."""
    pd = pytest.importorskip("pandas")
    for column in (np.array(mixed[::2]), np.array(mixed[::2], dtype=object), pd.Series(mixed[::2])):
        vols = mixle.read_volumes(column)
        assert vols.keys == tuple(mixed[::2])
        _check_matches(vols, [_read_foreign(p) for p in mixed[::2]])


def test_open_sources_and_array_likes(tmp_path: Path, mixed: list[str]) -> None:
    ndarray = _data(7, (3, 3, 3))
    zarray = zarr.open_array(mixed[0], mode="r")
    with h5py.File(mixed[1], "r") as f:
        sources = [mixle.read_npy(mixed[2]), ndarray, zarray, f["vol"]]
        vols = mixle.read_volumes(sources)
        assert vols.keys == ("#0", "#1", "#2", "#3")
        assert vols[0] is sources[0]  # a source given is used as it is
        expected = [np.load(mixed[2]), ndarray, zarray[...], f["vol"][...]]
        _check_matches(vols, expected)
        named = mixle.read_volumes(sources[:2], key=["x", "y"])
        assert named.keys == ("x", "y")
        vols.close()
        assert not sources[0].closed  # the caller's source stays open
        np.testing.assert_array_equal(sources[0][0], np.load(mixed[2])[0])


def test_dicts_of_aligned_arrays_with_metadata(tmp_path: Path) -> None:
    rows = []
    for i in range(3):
        image, label = tmp_path / f"img{i}.zarr", tmp_path / f"lab{i}.npy"
        _write_zarr(image, _data(i, SHAPES[i]))
        np.save(label, (_data(i, SHAPES[i]) % 3).astype("uint8"))
        rows.append({"image": str(image), "label": str(label), "age": 30 + i, "site": f"s{i}"})
    vols = mixle.read_volumes(rows)
    assert vols.names == ("image", "label")
    assert vols.columns == ("age", "site")
    assert vols.keys == tuple(r["image"] for r in rows)
    for i, row in enumerate(rows):
        with vols.lease(i) as volume:
            assert set(volume) == {"image", "label"}
            np.testing.assert_array_equal(volume["image"][...], _read_foreign(row["image"]))
            np.testing.assert_array_equal(volume["label"][...], np.load(row["label"]))
        assert vols.shape(i) == {"image": SHAPES[i], "label": SHAPES[i]}
        assert vols.metadata(i) == {"age": 30 + i, "site": f"s{i}"}
    assert vols.dtype == {"image": np.float32, "label": np.uint8}
    assert vols.ndim == {"image": 3, "label": 3}
    batch = vols.metadata_batch([2, 0], columns=["age"])
    np.testing.assert_array_equal(batch["age"], [32, 30])
    np.testing.assert_array_equal(vols.shapes_array("label"), np.array(SHAPES))
    keyed = mixle.read_volumes(rows, key="site")
    assert keyed.keys == ("s0", "s1", "s2")
    only = mixle.read_volumes(rows, table_columns="label")  # one array per volume
    assert only.names is None and only.columns == ("image", "age", "site")
    np.testing.assert_array_equal(only[1][...], np.load(rows[1]["label"]))


def test_dicts_with_hdf5_datasets_per_name(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f["img"] = _data(0)
        f["seg"] = _data(1).astype("int32")
    rows = [{"image": str(path), "label": str(path)}]
    vols = mixle.read_volumes(rows, dataset={"image": "img", "label": "seg"})
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(vols[0]["image"][...], f["img"][...])
        np.testing.assert_array_equal(vols[0]["label"][...], f["seg"][...])


def _table_files(tmp_path: Path) -> list[dict[str, Any]]:
    rows = []
    for i in range(3):
        image = tmp_path / f"img{i}.h5"
        _write_h5(image, _data(i, SHAPES[i]))
        label = tmp_path / f"lab{i}.npy"
        np.save(label, _data(i + 5, SHAPES[i]).astype("float32"))
        rows.append({"id": f"case{i}", "img": str(image), "lab": str(label), "y": i * 1.5})
    return rows


def test_csv_table_with_path_columns(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    rows = _table_files(tmp_path)
    csv = tmp_path / "cases.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    table = mixle.read_csv(csv)
    vols = mixle.read_volumes(
        table, table_columns={"image": "img", "label": "lab"}, key="id", dataset="vol"
    )
    assert vols.keys == ("case0", "case1", "case2")
    assert vols.names == ("image", "label")
    assert vols.columns == ("id", "y")
    expected = pd.read_csv(csv)
    for i in range(3):
        np.testing.assert_array_equal(vols[i]["image"][...], _read_foreign(rows[i]["img"]))
        np.testing.assert_array_equal(vols[i]["label"][...], np.load(rows[i]["lab"]))
        meta = vols.metadata(i)
        assert meta["id"] == expected["id"][i] and meta["y"] == expected["y"][i]
    np.testing.assert_array_equal(vols.metadata_batch([1, 2])["y"], expected["y"][1:3])


def test_dataframe_and_parquet_tables(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    rows = _table_files(tmp_path)
    frame = pd.DataFrame(rows)
    vols = mixle.read_volumes(frame, table_columns="lab")
    assert vols.keys == tuple(frame["lab"])
    assert vols.columns == ("id", "img", "y")
    for i in range(3):
        np.testing.assert_array_equal(vols[i][...], np.load(rows[i]["lab"]))
    assert vols.metadata(2)["id"] == "case2"
    pytest.importorskip("pyarrow")
    frame.to_parquet(tmp_path / "cases.parquet")
    from_parquet = mixle.read_volumes(
        mixle.read_parquet(tmp_path / "cases.parquet"), table_columns=["img"], dataset="vol"
    )
    assert from_parquet.names == ("img",)
    np.testing.assert_array_equal(from_parquet[1]["img"][...], _read_foreign(rows[1]["img"]))


def test_sql_table_pickles_by_reference(tmp_path: Path) -> None:
    import pickle
    import sqlite3

    db = tmp_path / "cases.db"
    paths = []
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", _data(i, SHAPES[i]))
        paths.append(str(tmp_path / f"s{i}.npy"))
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE cases (id TEXT, path TEXT, age INTEGER)")
        con.executemany(
            "INSERT INTO cases VALUES (?, ?, ?)",
            [(f"c{i}", p, 40 + i) for i, p in enumerate(paths)],
        )
    con.close()
    vols = mixle.read_volumes(
        mixle.read_sql("cases", f"sqlite:///{db}"), table_columns="path", key="id"
    )
    clone = pickle.loads(pickle.dumps(vols))
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT id, path, age FROM cases ORDER BY rowid").fetchall()
    con.close()
    for copy in (vols, clone):
        assert copy.keys == tuple(r[0] for r in rows)
        for i, (ident, path, age) in enumerate(rows):
            np.testing.assert_array_equal(copy[i][...], np.load(path))
            assert copy.metadata(i) == {"id": ident, "age": age}


def test_opening_reads_no_volume(tmp_path: Path, mixed: list[str]) -> None:
    """No volume is opened until used: an empty file with a volume's name opens fine."""
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"")
    vols = mixle.read_volumes([*mixed, str(broken)], dataset="vol")
    assert len(vols) == 4
    assert vols._sources == [None] * 4
    with pytest.raises(OSError, match=r"broken\.h5"):
        vols.shape(3)


def test_getitem_is_the_same_object_and_indexes_like_a_list(mixed: list[str]) -> None:
    vols = mixle.read_volumes(mixed, dataset="vol")
    assert vols[0] is vols[0] is vols[-3]
    with vols.lease(-1) as src:
        assert src is vols[2]
    with pytest.raises(IndexError, match=r"volume index 3 is out of range for 3 volumes"):
        vols[3]
    with pytest.raises(IndexError, match=r"-4"):
        vols.shape(-4)
    with pytest.raises(TypeError, match="must be an int"):
        vols["a"]  # type: ignore[index]


@given(n=st.integers(1, 40), data=st.data())
def test_indices_map_like_python_lists(n: int, data: st.DataObject) -> None:
    """Every in-range index (negative too) names the volume a list would; others raise."""
    items = [np.full((1, 1), k, dtype="int16") for k in range(n)]
    vols = mixle.read_volumes(items)
    i = data.draw(st.integers(-2 * n, 2 * n))
    if -n <= i < n:
        assert vols[i][0, 0] == items[i][0, 0]
        assert vols.keys[i] == f"#{i % n}"
    else:
        with pytest.raises(IndexError):
            vols[i]


def test_dtype_cast_allows_mixed_dtypes(tmp_path: Path) -> None:
    items = [_data(0, (2, 2, 2), "float32"), _data(1, (3, 2, 2), "uint8")]
    with pytest.raises(ValueError, match=r"volumes\[1\] \(key '#1'\) has dtype uint8") as info:
        mixle.read_volumes(items)[1]
    assert "dtype=" in str(info.value)
    assert isinstance(info.value, mixle.data.sources.collection.VolumeMismatchError)
    vols = mixle.read_volumes(items, dtype="float64")
    assert vols.dtype == np.float64 and vols.cast == np.float64
    assert vols.dtype_of(1) == np.uint8
    np.testing.assert_array_equal(vols[1][...], items[1])


def test_fingerprint_no_io_and_sensitive(mixed: list[str]) -> None:
    a = mixle.read_volumes(mixed, dataset="vol")
    b = mixle.read_volumes(mixed, dataset="vol")
    assert a.fingerprint() == b.fingerprint()
    assert a._sources == [None] * 3  # no volume opened
    assert mixle.read_volumes(mixed[:2], dataset="vol").fingerprint() != a.fingerprint()
    assert mixle.read_volumes(mixed, dataset="vol", dtype="f8").fingerprint() != a.fingerprint()
    assert mixle.read_volumes(mixed[::-1], dataset="vol").fingerprint() != a.fingerprint()


def test_repr_hides_credentials() -> None:
    secret = "s3cr3tT0ken"
    url = f"https://user:{secret}@example.com/data/a.zarr?X-Amz-Signature={secret}"
    vols = mixle.read_volumes([url], storage_options={"password": secret})
    assert secret not in repr(vols) and secret not in "".join(vols.keys)
    assert "example.com" in repr(vols)
    assert secret not in vols.fingerprint()


def test_close_and_context_manager(mixed: list[str]) -> None:
    with mixle.read_volumes(mixed, dataset="vol") as vols:
        src = vols[1]
        assert not vols.closed
    assert vols.closed and src.closed  # sources the collection opened are closed
    assert "closed" in repr(vols)
    assert vols.keys == tuple(mixed) and len(vols) == 3
    with pytest.raises(mixle.SourceClosedError, match="closed"):
        vols.lease(0)
    with pytest.raises(mixle.SourceClosedError):
        vols.shape(0)
    vols.close()  # twice is fine


def test_collection_is_thread_safe_for_shapes(tmp_path: Path) -> None:
    paths = []
    for i in range(40):
        path = tmp_path / f"v{i}.npy"
        np.save(path, np.zeros((i + 1, 2, 3), dtype="int8"))
        paths.append(str(path))
    vols = mixle.read_volumes(paths, max_open=4)
    assert vols.shapes() == [(i + 1, 2, 3) for i in range(40)]
    assert len(vols._pool.live()) <= 4
    assert os.path.basename(vols.keys[5]) == "v5.npy"


def test_fingerprint_tells_sources_and_arrays_handed_in_apart(tmp_path) -> None:
    a, b = np.zeros((4, 5)), np.zeros((6, 5))
    assert mixle.read_volumes([a, b]).fingerprint() != mixle.read_volumes([b, a]).fingerprint()
    assert mixle.read_volumes([a, b]).fingerprint() == mixle.read_volumes([a, b]).fingerprint()
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], np.zeros((4, 4)))
    one = mixle.read_volumes([mixle.read_npy(p) for p in paths]).fingerprint()
    other = mixle.read_volumes([mixle.read_npy(p) for p in paths[::-1]]).fingerprint()
    assert one != other  # same shapes, other files: told apart by location
