"""OME-Zarr (NGFF 0.4 and 0.5): spacing, origin, axes and units of ``ZarrArraySource``.

Images are written by hand per the spec (zarr-python writing the group attributes), and by
ome-zarr-py (the reference writer) where it is installed. Expected geometry is computed
from the transformations written, never from mixle's output.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from _ome_zarr_writer import write_ome_zarr

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.arrays.zarr import local_files, ome
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.errors import OmeZarrMetadataWarning
from mixle.testing import assert_unchanged, check_array_source

AXES = [
    {"name": "c", "type": "channel"},
    {"name": "z", "type": "space", "unit": "micrometer"},
    {"name": "y", "type": "space", "unit": "micrometer"},
    {"name": "x", "type": "space", "unit": "micrometer"},
]
SCALE0 = [1.0, 0.5, 0.25, 0.3]
SHIFT0 = [0.0, 10.0, -4.0, 2.5]
SCALE1 = [1.0, 0.5, 0.5, 0.6]
SHIFT1 = [0.0, 10.0, -3.875, 2.65]


def _datasets() -> list[dict[str, Any]]:
    return [
        {
            "path": "0",
            "coordinateTransformations": [
                {"type": "scale", "scale": SCALE0},
                {"type": "translation", "translation": SHIFT0},
            ],
        },
        {"path": "1", "coordinateTransformations": [{"type": "scale", "scale": SCALE1},
                                                    {"type": "translation",
                                                     "translation": SHIFT1}]},
    ]  # fmt: skip


def _write(
    path: Path | str | Any,
    version: str,
    *,
    multiscale: dict[str, Any] | None = None,
    attrs: dict[str, Any] | None = None,
    group: str = "",
) -> list[np.ndarray]:
    """An OME-Zarr image (two levels, CZYX) at ``path``; its levels as zarr reads them."""
    zarr_format = 3 if version == "0.5" else 2
    root = zarr.open_group(store=path, mode="a", zarr_format=zarr_format)
    g = root.require_group(group) if group else root
    data = np.arange(2 * 6 * 8 * 10, dtype=">u2").reshape(2, 6, 8, 10)
    g.create_array("0", data=data, chunks=(1, 3, 4, 5))
    g.create_array("1", data=data[:, :, ::2, ::2].copy(), chunks=(1, 3, 2, 5))
    ms = {"axes": AXES, "datasets": _datasets(), "name": "image", **(multiscale or {})}
    if attrs is None:
        attrs = (
            {"ome": {"version": "0.5", "multiscales": [ms]}}
            if version == "0.5"
            else {"multiscales": [{"version": version, **ms}]}
        )
    g.attrs.update(attrs)
    return [g["0"][...], g["1"][...]]


def _expected_affine(scale: list[float], shift: list[float]) -> np.ndarray:
    a = np.eye(len(scale) + 1)
    a[:-1, :-1] = np.diag(scale)
    a[:-1, -1] = shift
    return a


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_each_level_gets_its_scale_and_translation(tmp_path: Path, version: str) -> None:
    path = tmp_path / "img.ome.zarr"
    levels = _write(path, version)
    with assert_unchanged(path):
        for level, scale, shift in (("0", SCALE0, SHIFT0), ("1", SCALE1, SHIFT1)):
            src = ZarrArraySource(path, level)
            assert src.spacing == tuple(scale)
            assert src.origin == tuple(shift)
            np.testing.assert_array_equal(src.affine, _expected_affine(scale, shift))
            assert src.physical is not None
            assert src.physical.axes == ("c", "z", "y", "x")
            assert src.physical.units == (None, "micrometer", "micrometer", "micrometer")
            np.testing.assert_array_equal(src[...], levels[int(level)])
            assert "spacing=" in repr(src)


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_an_array_opened_at_the_root_of_its_path_reads_the_folder_above(
    tmp_path: Path, version: str
) -> None:
    path = tmp_path / "img.ome.zarr"
    _write(path, version)
    src = ZarrArraySource(os.path.join(path, "1"))
    assert src.spacing == tuple(SCALE1) and src.origin == tuple(SHIFT1)
    url = ZarrArraySource("file://" + os.path.join(path, "0"))
    assert url.spacing == tuple(SCALE0)


def test_multiscale_level_transformations_apply_after_the_datasets(tmp_path: Path) -> None:
    outer = {
        "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, 2.0, 2.0, 4.0]},
            {"type": "translation", "translation": [0.0, 1.0, 0.0, -1.0]},
        ]
    }
    path = tmp_path / "img.ome.zarr"
    _write(path, "0.5", multiscale=outer)
    src = ZarrArraySource(path, "0")
    ds = _expected_affine(SCALE0, SHIFT0)
    ms = _expected_affine([1.0, 2.0, 2.0, 4.0], [0.0, 1.0, 0.0, -1.0])
    np.testing.assert_allclose(src.affine, ms @ ds, rtol=0, atol=1e-12)
    voxel = np.array([1, 2, 3, 4])
    world = [ms_s * (s * v + t) + ms_t for v, s, t, ms_s, ms_t in
             zip(voxel, SCALE0, SHIFT0, [1, 2, 2, 4], [0, 1, 0, -1])]  # fmt: skip
    np.testing.assert_allclose(src.physical.world(voxel), world, atol=1e-12)


def test_a_label_image_nested_in_the_store(tmp_path: Path) -> None:
    path = tmp_path / "img.ome.zarr"
    _write(path, "0.4")
    _write(path, "0.4", group="labels/nuclei")
    src = ZarrArraySource(path, "labels/nuclei/1")
    assert src.spacing == tuple(SCALE1)


def test_memory_and_fsspec_stores(tmp_path: Path) -> None:
    store = zarr.storage.MemoryStore()
    _write(store, "0.5")
    assert ZarrArraySource(store, "1").spacing == tuple(SCALE1)
    _write("memory://ome/img.zarr", "0.4")
    assert ZarrArraySource("memory://ome/img.zarr", "0").spacing == tuple(SCALE0)
    # a remote store is not read above the root it was given: component= finds the group
    assert ZarrArraySource("memory://ome/img.zarr/1").physical is None


def test_plain_zarr_and_unlisted_arrays_have_no_geometry(tmp_path: Path) -> None:
    plain = tmp_path / "plain.zarr"
    zarr.create_array(str(plain), shape=(4, 4), dtype="f4")
    assert ZarrArraySource(plain).physical is None
    path = tmp_path / "img.ome.zarr"
    _write(path, "0.5")
    zarr.open_group(str(path), mode="a").create_array("other", shape=(3,), dtype="u1")
    assert ZarrArraySource(path, "other").physical is None
    old = tmp_path / "old.ome.zarr"
    _write(old, "0.3")  # before coordinate transformations: no spacing recorded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ZarrArraySource(old, "0").physical is None


def test_geometry_survives_pickling_and_the_conformance_suite(tmp_path: Path) -> None:
    path = tmp_path / "img.ome.zarr"
    levels = _write(path, "0.4")
    src = ZarrArraySource(path, "1")
    copy = pickle.loads(pickle.dumps(src))
    assert copy.physical == src.physical
    with assert_unchanged(path):
        check_array_source(src, levels[1])


def test_patches_in_micrometres_and_world_positions(tmp_path: Path) -> None:
    path = tmp_path / "img.ome.zarr"
    levels = _write(path, "0.5")
    src = ZarrArraySource(path, "0")
    # 0.002 mm = 2 um: 4 voxels of 0.5 um, 8 of 0.25 um; 0.0015 mm over 0.3 um: 5
    sampler = PatchSampler(src, num_patches=6, patch_size_mm=(0.002, 0.002, 0.0015), world=True)
    assert sampler.patch_size == (4, 8, 5)
    patches, coords, world = sampler.get_batch(np.arange(6))
    for patch, corner, w in zip(patches, coords, world):
        z, y, x = corner.tolist()
        np.testing.assert_array_equal(patch, levels[0][:, z : z + 4, y : y + 8, x : x + 5])
        want = [s * c + t for s, c, t in zip(SCALE0[1:], corner, SHIFT0[1:])]
        np.testing.assert_allclose(w, want, rtol=0, atol=1e-12)


# -- malformed metadata -----------------------------------------------------------------
def _ms(**over: Any) -> dict[str, Any]:
    return {"version": "0.4", "axes": AXES, "datasets": _datasets(), **over}


@pytest.mark.parametrize(
    ("attrs", "why"),
    [
        ({"multiscales": {"not": "a list"}}, "not a list"),
        ({"multiscales": ["x"]}, r"multiscales\[0\] is not an object"),
        ({"multiscales": [_ms(datasets="0")]}, "datasets is not a list"),
        (
            {"multiscales": [_ms(datasets=[{"path": "0"}])]},
            r"datasets\[0\] has no coordinateTransformations",
        ),
        (
            {"multiscales": [_ms(datasets=[{"path": "0", "coordinateTransformations": [
                {"type": "affine", "affine": [[1, 0], [0, 1]]}]}])]},
            "type 'affine'",
        ),
        (
            {"multiscales": [_ms(datasets=[{"path": "0", "coordinateTransformations": [
                {"type": "scale", "path": "scale_array"}]}])]},
            r"stored in an array \(path=\)",
        ),
        (
            {"multiscales": [_ms(datasets=[{"path": "0", "coordinateTransformations": [
                {"type": "scale", "scale": [1, 0, 1, 1]}]}])]},
            "singular",
        ),
        (
            {"multiscales": [_ms(datasets=[{"path": "0", "coordinateTransformations": [
                {"type": "scale", "scale": [1, "2", 1, 1]}]}])]},
            "finite numbers",
        ),
        ({"multiscales": [_ms(axes=[{"type": "space"}] * 4)]}, r"axes\[0\] has no name"),
    ],
)  # fmt: skip
def test_malformed_metadata_warns_and_gives_no_geometry(
    tmp_path: Path, attrs: dict[str, Any], why: str
) -> None:
    path = tmp_path / "bad.ome.zarr"
    levels = _write(path, "0.4", attrs=attrs)
    with pytest.warns(OmeZarrMetadataWarning, match=why) as caught:
        src = ZarrArraySource(path, "0")
    assert "bad.ome.zarr" in str(caught[0].message) and ".zattrs" in str(caught[0].message)
    assert src.physical is None and src.spacing is None
    np.testing.assert_array_equal(src[...], levels[0])  # the data stays readable


@pytest.mark.parametrize(
    ("ms", "match"),
    [
        (
            _ms(datasets=[{"path": "0", "coordinateTransformations": [
                {"type": "scale", "scale": [0.5, 0.5, 0.5]}]}]),
            r"datasets\[0\].coordinateTransformations\[0\] is a scale of 3 values but the "
            "array has 4 axes",
        ),
        (
            _ms(coordinateTransformations=[{"type": "translation", "translation": [1, 2]}]),
            r"multiscales\[0\].coordinateTransformations\[0\] is a translation of 2 values",
        ),
        (_ms(axes=AXES[1:]), r"axes has 3 entries but the array has 4 axes"),
    ],
)  # fmt: skip
def test_a_transformation_of_the_wrong_length_is_an_error_naming_the_file(
    tmp_path: Path, ms: dict[str, Any], match: str
) -> None:
    path = tmp_path / "bad.ome.zarr"
    _write(path, "0.4", attrs={"multiscales": [ms]})
    with pytest.raises(ValueError, match=match) as info:
        ZarrArraySource(path, "0")
    assert os.path.join("bad.ome.zarr", ".zattrs") in str(info.value)


def test_an_oversized_group_document_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "img.ome.zarr"
    _write(path, "0.4")
    attrs = path / ".zattrs"
    doc = json.loads(attrs.read_text())
    doc["padding"] = "x" * 4000
    attrs.write_text(json.dumps(doc))
    monkeypatch.setattr(ome, "ZARR_METADATA_LIMIT", 2000)
    monkeypatch.setattr(local_files, "ZARR_METADATA_LIMIT", 2000)
    with pytest.raises(ValueError, match="more than the 2,000"):
        ZarrArraySource(path, "0")  # inside the store: zarr's own metadata check
    with pytest.warns(OmeZarrMetadataWarning, match="not read for OME-Zarr metadata"):
        src = ZarrArraySource(os.path.join(path, "0"))  # the folder above the store
    assert src.physical is None


# -- ome-zarr-py, the reference writer --------------------------------------------------
@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_images_written_by_ome_zarr_py(tmp_path: Path, version: str) -> None:
    path = str(tmp_path / "ref.ome.zarr")
    data = np.arange(2 * 8 * 12 * 10, dtype=np.uint16).reshape(2, 8, 12, 10)
    write_ome_zarr(
        Path(path),
        data,
        version=version,
        axes="czyx",
        scale_factors=(2,),
        scale={"c": 1.0, "z": 2.0, "y": 0.5, "x": 0.25},
        axes_units={"z": "micrometer", "y": "micrometer", "x": "micrometer"},
    )
    group = zarr.open_group(path, mode="r")
    meta = dict(group.attrs)
    ms = (meta["ome"] if version == "0.5" else meta)["multiscales"][0]
    for ds in ms["datasets"]:
        scale = next(t["scale"] for t in ds["coordinateTransformations"] if t["type"] == "scale")
        shifts = [t["translation"] for t in ds["coordinateTransformations"]
                  if t["type"] == "translation"]  # fmt: skip
        src = ZarrArraySource(path, ds["path"])
        assert src.spacing == tuple(scale)
        assert src.origin == tuple(shifts[0] if shifts else [0.0] * 4)
        assert src.physical.axes == ("c", "z", "y", "x")
        np.testing.assert_array_equal(src[...], group[ds["path"]][...])
