"""Bad input to ``mixle.read_volumes``: each a typed error naming the argument and the volume."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mixle
from mixle.data.sources.collection import VolumeMismatchError

h5py = pytest.importorskip("h5py")
pd = pytest.importorskip("pandas")


@pytest.fixture
def two_npy(tmp_path: Path) -> list[str]:
    paths = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    np.save(paths[0], np.zeros((2, 3, 4), dtype="float32"))
    np.save(paths[1], np.ones((3, 3, 4), dtype="float32"))
    return paths


def _table(tmp_path: Path, paths: list[Any], **extra: list[Any]) -> Any:
    csv = tmp_path / "cases.csv"
    pd.DataFrame({"path": paths, **extra}).to_csv(csv, index=False)
    return mixle.read_csv(csv)


@pytest.mark.parametrize("volumes", [[], ()])
def test_empty_list(volumes: Any) -> None:
    with pytest.raises(ValueError, match=r"volumes= is empty"):
        mixle.read_volumes(volumes)


def test_empty_table(tmp_path: Path) -> None:
    frame = pd.DataFrame({"path": pd.Series([], dtype=object), "y": pd.Series([], dtype=float)})
    with pytest.raises(ValueError, match=r"volumes=.* has no rows"):
        mixle.read_volumes(frame, table_columns="path")


def test_glob_matching_nothing(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.zarr")
    with pytest.raises(FileNotFoundError, match=r"volumes=.*\*\.zarr.*glob matches no file"):
        mixle.read_volumes(pattern)


def test_missing_file_in_a_list(two_npy: list[str], tmp_path: Path) -> None:
    gone = str(tmp_path / "gone.npy")
    with pytest.raises(FileNotFoundError, match=r"volumes\[2\]: path=.*gone\.npy.*no such file"):
        mixle.read_volumes([*two_npy, gone])


def test_missing_file_named_with_its_row(two_npy: list[str], tmp_path: Path) -> None:
    table = _table(tmp_path, [two_npy[0], str(tmp_path / "gone.npy"), two_npy[1]])
    with pytest.raises(
        FileNotFoundError, match=r"row 1 of .*cases\.csv.*column 'path'.*gone\.npy.*no such file"
    ):
        mixle.read_volumes(table, table_columns="path")


@pytest.mark.parametrize("value", [float("nan"), ""])
def test_unreadable_row(two_npy: list[str], value: Any) -> None:
    frame = pd.DataFrame({"path": [two_npy[0], value], "y": [1, 2]})
    with pytest.raises(ValueError, match=r"row 1 of .*column 'path' holds .*not a path"):
        mixle.read_volumes(frame, table_columns="path")


def test_row_whose_file_does_not_open(two_npy: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not a npy file at all")
    vols = mixle.read_volumes(pd.DataFrame({"path": [two_npy[0], str(bad)]}), table_columns="path")
    with pytest.raises(ValueError, match=r"volumes= row 1 of .* \(key '.*bad\.npy'\)"):
        vols.shape(1)


def test_unknown_format(tmp_path: Path) -> None:
    odd = tmp_path / "scan.mha"
    odd.write_bytes(b"ObjectType = Image\n")
    with pytest.raises(mixle.UnsupportedStoreError, match=r"volumes\[0\]: path=.*scan\.mha"):
        mixle.read_volumes([str(odd)])


def test_hdf5_without_dataset(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["vol"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"volumes\[0\]: .*HDF5 file: pass dataset="):
        mixle.read_volumes([str(path)])


def test_hdf5_dataset_missing_names_the_volume(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["vol"] = np.zeros(3)
    vols = mixle.read_volumes([str(path)], dataset="nope")
    with pytest.raises(mixle.ArrayNotFoundError, match=r"volumes\[0\] \(key .*a\.h5.*nope"):
        vols[0]


def test_raw_without_layout(tmp_path: Path) -> None:
    path = tmp_path / "a.raw"
    path.write_bytes(bytes(8))
    with pytest.raises(ValueError, match=r"raw file: pass raw_dtype= and raw_shape="):
        mixle.read_volumes([str(path)])


def test_duplicate_keys(two_npy: list[str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"volumes 0 and 2 the same key .*a\.npy"):
        mixle.read_volumes([two_npy[0], two_npy[1], two_npy[0]])
    table = _table(tmp_path, two_npy, id=["x", "x"])
    with pytest.raises(ValueError, match=r"key= gives volumes 0 and 1 the same key 'x'"):
        mixle.read_volumes(table, table_columns="path", key="id")
    with pytest.raises(ValueError, match=r"key= gives volumes 0 and 1 the same key 'k'"):
        mixle.read_volumes(two_npy, key=["k", "k"])


def test_table_without_the_named_column(two_npy: list[str], tmp_path: Path) -> None:
    table = _table(tmp_path, two_npy, y=[1, 2])
    with pytest.raises(
        mixle.ColumnNotFoundError, match=r"table_columns='image' is not a column .*path, y"
    ):
        mixle.read_volumes(table, table_columns={"img": "image"})
    with pytest.raises(KeyError, match=r"key='id' is not a column"):
        mixle.read_volumes(table, table_columns="path", key="id")
    with pytest.raises(TypeError, match=r"is a table: pass table_columns=.*path, y"):
        mixle.read_volumes(table)


def test_dicts_without_array_entries(two_npy: list[str]) -> None:
    with pytest.raises(ValueError, match=r"volumes\[0\] has no array entry"):
        mixle.read_volumes([{"subject": "s01", "age": 3}])
    with pytest.raises(ValueError, match=r"volumes\[1\] has no entry 'image'"):
        mixle.read_volumes([{"image": two_npy[0]}, {"label": two_npy[1]}])
    with pytest.raises(TypeError, match=r"volumes\[1\] is not a dict but volumes\[0\] is a dict"):
        mixle.read_volumes([{"image": two_npy[0]}, two_npy[1]])
    with pytest.raises(FileNotFoundError, match=r"volumes\[0\]\['image'\]: path='nope\.npy'"):
        mixle.read_volumes([{"image": "nope.npy"}])


def test_mixed_dtypes_and_dimensions_name_the_volume(tmp_path: Path, two_npy: list[str]) -> None:
    other = tmp_path / "c.npy"
    np.save(other, np.zeros((2, 3, 4), dtype="int16"))
    vols = mixle.read_volumes([*two_npy, str(other)])
    with pytest.raises(
        VolumeMismatchError, match=r"volumes\[2\] \(key '.*c\.npy'\) has dtype int16"
    ):
        vols.shape(2)
    with pytest.raises(VolumeMismatchError):  # again: the volume is not kept
        vols[2]
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((6, 4), dtype="float32"))
    cast = mixle.read_volumes([two_npy[0], str(flat)], dtype="float64")
    with pytest.raises(ValueError, match=r"volumes\[1\] .* has 2 dimensions but volume 0"):
        cast[1]


@pytest.mark.parametrize(
    ("max_open", "error"),
    [(0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError), ("4", TypeError)],
)
def test_max_open_must_be_a_positive_int(two_npy: list[str], max_open: Any, error: type) -> None:
    with pytest.raises(error, match=r"max_open=.* must be an int >= 1"):
        mixle.read_volumes(two_npy, max_open=max_open)


@pytest.mark.parametrize(
    ("volumes", "match"),
    [
        (3, r"volumes=int is not accepted"),
        (np.zeros((2, 3, 4)), r"volumes=ndarray is one array: pass a list"),
        ({"a": "b.npy"}, r"volumes= is a dict: pass a list of dicts"),
        ([3], r"volumes\[0\] is int"),
        ("s3://bucket/*.zarr", r"is a URL: mixle globs local paths only"),
    ],
)
def test_volumes_of_the_wrong_kind(volumes: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        mixle.read_volumes(volumes)


def test_options_of_the_wrong_kind(two_npy: list[str]) -> None:
    with pytest.raises(TypeError, match=r"dataset=3 must be a string"):
        mixle.read_volumes(two_npy, dataset=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"table_columns= applies to a table or a list of dicts"):
        mixle.read_volumes(two_npy, table_columns="path")
    with pytest.raises(ValueError, match=r"key= has 1 keys for 2 volumes"):
        mixle.read_volumes(two_npy, key=["a"])
    with pytest.raises(ValueError, match=r"raw_shape=.* non-negative"):
        mixle.read_volumes(two_npy, raw_shape=(-1, 2))
    vols = mixle.read_volumes(two_npy)
    with pytest.raises(mixle.ColumnNotFoundError, match=r"columns= names 'age'"):
        vols.metadata_batch([0], columns=["age"])
    with pytest.raises(ValueError, match=r"name='image'.*one array each"):
        vols.shapes_array("image")


def test_errors_carry_no_credentials(tmp_path: Path) -> None:
    secret = "hunter2secret"
    url = f"https://user:{secret}@example.com/x.tiff?token={secret}"
    with pytest.raises(mixle.UnsupportedStoreError) as info:
        mixle.read_volumes([url])
    assert secret not in str(info.value) and "example.com" in str(info.value)


def test_dict_metadata_that_does_not_form_a_table(two_npy: list[str]) -> None:
    rows = [{"image": two_npy[0], "m": np.zeros(3)}, {"image": two_npy[1], "m": np.zeros(4)}]
    with pytest.raises(ValueError, match=r"volumes= metadata entries do not form a table"):
        mixle.read_volumes(rows, table_columns=["image"])
    with pytest.raises(KeyError, match=r"key='id' is not an entry of volumes\[1\]"):
        mixle.read_volumes([{"image": two_npy[0], "id": "a"}, {"image": two_npy[1]}], key="id")
    keyed = mixle.read_volumes([{"image": p} for p in two_npy], key="image")  # an array entry
    assert keyed.keys == tuple(two_npy)


def test_a_dict_entry_naming_an_image_mixle_cannot_open_is_not_metadata(
    two_npy: list[str],
) -> None:
    # A MONAI-style data list with an NRRD label would silently lose the label array
    rows = [{"image": two_npy[0], "label": "case0_seg.nrrd", "site": "A"}]
    with pytest.raises(mixle.UnsupportedStoreError, match=r"volumes\[0\]\['label'\]=.*nrrd"):
        mixle.read_volumes(rows)
    kept = mixle.read_volumes(rows, table_columns=["image"])  # asked for: metadata
    assert kept.metadata(0) == {"label": "case0_seg.nrrd", "site": "A"}


def test_numpy_scalars_and_vectors_in_dicts_are_metadata_by_default(two_npy: list[str]) -> None:
    # values from df.iterrows() are NumPy scalars; a spacing vector is 1-D
    rows = [
        {"image": np.zeros((4, 4)), "age": np.int64(41 + i), "spacing": np.array([1.0, 2.5])}
        for i in range(2)
    ]
    vols = mixle.read_volumes(rows)
    assert vols.names == ("image",) and vols.columns == ("age", "spacing")
    assert vols.metadata(1)["age"] == 42
    named = mixle.read_volumes(rows, table_columns=["image", "spacing"])  # asked for
    assert named.names == ("image", "spacing")


def test_a_table_whose_key_is_its_path_column(two_npy: list[str], tmp_path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("path\n" + "".join(f"{p}\n" for p in two_npy))
    vols = mixle.read_volumes(mixle.read_csv(str(table)), table_columns="path", key="path")
    assert len(vols) == 2 and vols.keys == tuple(two_npy)


def test_a_volume_gone_after_its_handle_was_given_back_is_named(tmp_path) -> None:
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], np.zeros((4, 4)))
    vols = mixle.read_volumes(paths, max_open=1)
    for i in range(3):
        with vols.lease(i):
            pass  # volume 0 is given back by now
    os.remove(paths[0])
    with pytest.raises(FileNotFoundError, match=r"volumes\[0\] \(key '.*v0\.npy'\)"):
        vols.lease(0).__enter__()


def test_a_metadata_string_naming_a_folder_in_the_cwd_stays_metadata(
    two_npy: list[str], tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")  # a folder that is not a zarr store
    rows = [{"image": p, "split": s} for p, s in zip(two_npy, ["train", "val"])]
    vols = mixle.read_volumes(rows)
    assert vols.names == ("image",) and vols.metadata(0) == {"split": "train"}


def test_the_first_open_of_a_source_handed_in_names_the_volume(tmp_path) -> None:
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], np.zeros((4, 4)))
    sources = [mixle.read_npy(p) for p in paths]
    sources[1].release_handle()
    os.remove(paths[1])
    vols = mixle.read_volumes(sources)
    with pytest.raises(OSError, match=r"volumes\[1\] \(key '#1'\)"):
        vols.lease(1).__enter__()
