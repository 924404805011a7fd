"""NIfTI images written by nibabel: every read path of a NiftiArraySource equals nibabel's read.

Files are written with ``nibabel.save`` (NIfTI-1 and NIfTI-2, ``.nii``, ``.nii.gz`` and
``.hdr``/``.img`` pairs, little- and big-endian headers, several dtypes and odd shapes);
the answer is always ``nibabel.load(path).dataobj`` of the same file.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.sources.arrays.nifti import NiftiArraySource, NiftiScalingWarning, read_nifti
from mixle.testing import assert_unchanged, check_array_source

ROTATED = np.array(
    [[0.0, -2.0, 0.0, 10.0], [1.5, 0.0, 0.3, -4.0], [0.0, 0.0, 3.0, 7.0], [0.0, 0.0, 0.0, 1.0]]
)
#: keys nibabel's own ArrayProxy slicing takes, compared with the source's
KEYS: list[Any] = [
    (Ellipsis,),
    (0,),
    (-1,),
    (slice(1, 4), 2),
    (Ellipsis, 1),
    (slice(None, None, 2), slice(1, None, 3)),
    (slice(None, None, -1),),
    (2, slice(None), -2),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(folder))
    return folder


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -3000), min(info.max, 3000), size=shape).astype(dt)


def _write(
    path: Path,
    data: np.ndarray,
    *,
    version: int = 1,
    affine: np.ndarray | None = None,
    big: bool = False,
    slope_inter: tuple[float, float] | None = None,
) -> Path:
    """Save ``data`` with nibabel (the image class follows the file name: .nii or .hdr/.img)."""
    pair = path.name.endswith((".hdr", ".img", ".hdr.gz", ".img.gz"))
    klass = {
        (1, False): nib.Nifti1Image,
        (1, True): nib.Nifti1Pair,
        (2, False): nib.Nifti2Image,
        (2, True): nib.Nifti2Pair,
    }[(version, pair)]
    header = klass.header_class(endianness=">" if big else "<")
    img = klass(data, ROTATED if affine is None else affine, header)
    img.header.set_data_dtype(data.dtype)
    img.header.set_xyzt_units("mm", "sec")
    if slope_inter is not None:
        img.header.set_slope_inter(*slope_inter)
    nib.save(img, str(path))
    return path


def _reference(path: Path) -> Any:
    return nib.load(str(path))


CASES = [
    ("x.nii", (5, 6, 7), "int16", 1, False),
    ("x.nii", (9, 4), "uint8", 1, False),
    ("x.nii", (4, 5, 3, 2), "float32", 1, False),
    ("x.nii", (3, 1, 5, 2, 2), "float64", 1, False),
    ("x.nii", (5, 6, 7), ">i2", 1, True),
    ("x.nii", (7, 3, 4), ">f4", 1, True),
    ("x.nii", (6, 5, 4), "float32", 2, False),
    ("x.nii", (6, 5, 4), ">i2", 2, True),
    ("x.nii.gz", (5, 6, 7), "int16", 1, False),
    ("x.nii.gz", (4, 5, 3, 2), ">f4", 1, True),
    ("x.nii.gz", (6, 5, 4), "uint8", 2, False),
    ("x.hdr", (5, 6, 7), "int16", 1, False),
    ("x.img", (4, 3, 5), ">f4", 1, True),
    ("x.img.gz", (4, 6, 5), "float32", 1, False),
    ("x.hdr", (4, 6, 5), "uint8", 2, False),
]


@pytest.mark.parametrize(("name", "shape", "dtype", "version", "big"), CASES)
def test_every_read_path_equals_nibabel(
    tmp_path: Path, name: str, shape: tuple[int, ...], dtype: str, version: int, big: bool
) -> None:
    path = _write(tmp_path / name, _data(shape, dtype), version=version, big=big)
    ref = _reference(path)
    want = np.asanyarray(ref.dataobj)
    assert want.shape == shape
    with assert_unchanged(*tmp_path.glob("x.*")):
        src = read_nifti(path)
        assert isinstance(src, NiftiArraySource)
        assert src.shape == shape and src.dtype == ref.dataobj.dtype == want.dtype
        assert src.nifti_version == version
        for key in KEYS:
            try:
                want[key]
            except IndexError:  # the key does not fit this shape
                continue
            got, expected = src[key], ref.dataobj[key]
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected, err_msg=f"key={key!r}")
        check_array_source(src, want)


@pytest.mark.parametrize("name", ["v.nii", "v.nii.gz"])
def test_a_patch_sampler_batch_equals_nibabel_slicing(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / name, _data((13, 11, 9), "int16", seed=3))
    ref = _reference(path)
    src = read_nifti(path)
    sampler = PatchSampler(src, patch_size=(4, 5, 3), num_patches=12, seed=7)
    patches, coords = sampler.get_batch(np.arange(12))
    assert patches.shape == (12, 4, 5, 3) and patches.dtype == ref.dataobj.dtype
    for patch, corner in zip(patches, coords.tolist()):
        box = tuple(slice(a, a + n) for a, n in zip(corner, (4, 5, 3)))
        np.testing.assert_array_equal(patch, ref.dataobj[box])
    src.close()


def test_the_affine_spacing_units_and_axes_of_a_volume_are_nibabels(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.nii", _data((5, 6, 7), "int16"))
    ref = _reference(path)
    src = read_nifti(path)
    assert src.affine is not None and src.affine.shape == (4, 4)
    np.testing.assert_array_equal(src.affine, ref.affine)  # exactly
    assert not src.affine.flags.writeable
    np.testing.assert_allclose(src.spacing, ref.header.get_zooms(), rtol=1e-6)
    assert src.origin == tuple(ref.affine[:3, 3])
    assert src.physical is not None
    assert src.physical.axes == ("i", "j", "k")
    assert src.physical.units == ("mm", "mm", "mm")
    voxel = np.array([[1, 2, 3]])
    np.testing.assert_allclose(
        src.physical.world(voxel)[0], nib.affines.apply_affine(ref.affine, voxel[0])
    )


def test_axis_aligned_spacing_equals_the_zooms_exactly(tmp_path: Path) -> None:
    affine = np.diag([0.7, 1.25, 2.5, 1.0])
    affine[:3, 3] = [-3.0, 4.0, 5.5]
    path = _write(tmp_path / "v.nii.gz", _data((4, 5, 6), "float32"), affine=affine)
    ref = _reference(path)
    src = read_nifti(path)
    np.testing.assert_array_equal(src.affine, ref.affine)
    assert src.spacing == tuple(float(z) for z in ref.header.get_zooms())
    assert src.origin == (-3.0, 4.0, 5.5)


def test_a_4d_affine_is_the_spatial_one_plus_the_time_step(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.nii", _data((4, 5, 3, 6), "float32"))
    img = _reference(path)
    img.header.set_zooms((*img.header.get_zooms()[:3], 2.5))
    header = img.header
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), img.affine, header), str(path))
    ref = _reference(path)
    src = read_nifti(path)
    assert src.affine is not None and src.affine.shape == (5, 5)
    np.testing.assert_array_equal(src.affine[:3, :3], ref.affine[:3, :3])
    np.testing.assert_array_equal(src.affine[:3, 4], ref.affine[:3, 3])
    assert src.affine[3, 3] == 2.5 and src.affine[3, :3].tolist() == [0, 0, 0]
    assert src.affine[4].tolist() == [0, 0, 0, 0, 1]
    np.testing.assert_allclose(src.spacing, ref.header.get_zooms(), rtol=1e-6)
    assert src.physical is not None
    assert src.physical.axes == ("i", "j", "k", "t")
    assert src.physical.units == ("mm", "mm", "mm", "sec")


def test_a_2d_image_keeps_the_rows_and_columns_of_its_two_axes(tmp_path: Path) -> None:
    affine = np.diag([0.5, 0.25, 3.0, 1.0])
    affine[:3, 3] = [1.0, 2.0, 3.0]
    path = _write(tmp_path / "v.nii", _data((9, 4), "uint8"), affine=affine)
    ref = _reference(path)
    src = read_nifti(path)
    assert src.affine is not None and src.affine.shape == (3, 3)
    np.testing.assert_array_equal(src.affine, [[0.5, 0, 1.0], [0, 0.25, 2.0], [0, 0, 1]])
    assert src.spacing == tuple(float(z) for z in ref.header.get_zooms())


def test_qform_only_and_no_transform_affines_are_nibabels(tmp_path: Path) -> None:
    for code in ("qform", "none"):
        path = tmp_path / f"{code}.nii"
        img = nib.Nifti1Image(_data((4, 5, 6), "int16"), ROTATED)
        if code == "qform":
            img.set_sform(None, code=0)
        else:
            img.set_sform(None, code=0)
            img.set_qform(None, code=0)
        nib.save(img, str(path))
        ref = _reference(path)
        src = read_nifti(path)
        np.testing.assert_array_equal(src.affine, ref.affine)


def test_the_header_is_a_copy_of_nibabels(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.nii.gz", _data((5, 6, 7), "int16"))
    ref = _reference(path)
    src = read_nifti(path)
    header = src.header
    assert isinstance(header, nib.Nifti1Header)
    assert header.get_data_shape() == ref.header.get_data_shape()
    assert header.get_data_dtype() == ref.header.get_data_dtype()
    np.testing.assert_array_equal(header.get_best_affine(), ref.affine)
    header["descrip"] = b"changed"
    assert src.header["descrip"] != header["descrip"]  # the source's own is untouched


@pytest.mark.parametrize(
    ("dtype", "slope_inter"),
    [("int16", (0.5, 3.0)), ("uint8", (2.0, 0.0)), ("float32", (1.5, -2.0)), (">i2", (0.25, 1.0))],
)
@pytest.mark.parametrize("name", ["s.nii", "s.nii.gz"])
def test_scale_true_equals_nibabels_scaled_dataobj(
    tmp_path: Path, name: str, dtype: str, slope_inter: tuple[float, float]
) -> None:
    path = _write(
        tmp_path / name, _data((5, 6, 7), dtype), big=dtype.startswith(">"), slope_inter=slope_inter
    )
    ref = _reference(path)
    want = np.asanyarray(ref.dataobj)
    src = read_nifti(path, scale=True)
    assert (src.scl_slope, src.scl_inter) == slope_inter
    assert src.dtype == want.dtype == ref.dataobj[...].dtype
    for key in KEYS:
        np.testing.assert_array_equal(src[key], ref.dataobj[key], err_msg=f"key={key!r}")
        assert src[key].dtype == ref.dataobj[key].dtype
    sampler = PatchSampler(src, patch_size=(3, 4, 2), num_patches=6, seed=1)
    patches, coords = sampler.get_batch(np.arange(6))
    for patch, corner in zip(patches, coords.tolist()):
        np.testing.assert_array_equal(
            patch, ref.dataobj[tuple(slice(a, a + n) for a, n in zip(corner, (3, 4, 2)))]
        )
    check_array_source(src, want)


def test_scale_false_reads_raw_values_and_warns_once_per_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.nii", _data((5, 6, 7), "int16"), slope_inter=(0.5, 3.0))
    ref = _reference(path)
    with pytest.warns(NiftiScalingWarning, match=r"scale=True") as caught:
        src = read_nifti(path)
    assert str(path) in str(caught[0].message) and "0.5" in str(caught[0].message)
    assert src.dtype == np.int16 and not src.scale
    np.testing.assert_array_equal(src[...], ref.dataobj.get_unscaled())
    assert (src.scl_slope, src.scl_inter) == (0.5, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = read_nifti(path)  # the same path: no second warning
        pickle.loads(pickle.dumps(again))[0]


@pytest.mark.parametrize("slope", [0.0, np.nan])
def test_a_slope_of_zero_or_nan_means_no_scaling(tmp_path: Path, slope: float) -> None:
    path = _write(tmp_path / "s.nii", _data((5, 6, 7), "int16"))
    img = _reference(path)
    header = img.header.copy()
    header["scl_slope"], header["scl_inter"] = slope, 7.0
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), img.affine, header), str(path))
    ref = _reference(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        src = read_nifti(path, scale=True)
        raw = read_nifti(path)
    assert (src.scl_slope, src.scl_inter) == (1.0, 0.0)
    assert src.dtype == ref.dataobj[...].dtype == np.int16
    np.testing.assert_array_equal(src[...], ref.dataobj[...])
    np.testing.assert_array_equal(raw[...], ref.dataobj[...])


def _child_read(src: NiftiArraySource, queue: Any) -> None:
    queue.put((os.getpid(), src[1:3, ::2].tolist()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("name", ["f.nii", "f.nii.gz"])
def test_a_source_read_before_a_fork_reads_in_the_child(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / name, _data((5, 6, 7), "float32"))
    ref = _reference(path)
    src = read_nifti(path)
    src[0]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(src, queue))
    child.start()
    pid, rows = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and pid != os.getpid()
    np.testing.assert_array_equal(np.array(rows, dtype=np.float32), ref.dataobj[1:3, ::2])


def test_a_pickle_holds_the_path_not_the_data(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.nii.gz", _data((40, 30, 20), "float64"))
    src = read_nifti(path, scale=True)
    blob = pickle.dumps(src)
    assert len(blob) < 1000
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone)
    assert clone.scale and clone.shape == (40, 30, 20)
    np.testing.assert_array_equal(clone[...], np.asanyarray(_reference(path).dataobj))


def test_bad_arguments_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"path=3"):
        read_nifti(3)  # type: ignore[arg-type]
    path = _write(tmp_path / "v.nii", _data((2, 3, 4), "int16"))
    with pytest.raises(TypeError, match=r"scale='yes' must be True or False"):
        read_nifti(path, scale="yes")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"nope\.nii"):
        read_nifti(tmp_path / "nope.nii")


CHILD_WITHOUT_NIBABEL = """
import sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "nibabel":
            raise ImportError("nibabel is blocked in this test process")
        return None

sys.meta_path.insert(0, _Blocked())
from mixle.data.sources.arrays.nifti import read_nifti

src = read_nifti(sys.argv[1])
print(repr(src))
try:
    src.shape
except ImportError as exc:
    print("ImportError:", exc)
print("nibabel imported:", "nibabel" in sys.modules)
"""


def test_without_nibabel_a_source_builds_and_its_first_use_names_the_extra(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.nii", _data((2, 3, 4), "int16"))
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", CHILD_WITHOUT_NIBABEL, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "nibabel is not installed here" in lines[0]
    assert lines[1].startswith("ImportError:") and '".[nifti]"' in lines[1]
    assert lines[2] == "nibabel imported: False"


def test_rgb_complex_and_int8_images_equal_nibabel(tmp_path: Path) -> None:
    rgb = np.zeros((4, 5, 3), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    rgb["R"], rgb["B"] = np.arange(60).reshape(4, 5, 3), 7
    arrays = {
        "rgb.nii": rgb,
        "c64.nii.gz": (np.arange(60) + 1j * np.arange(60)[::-1]).reshape(4, 5, 3).astype("c8"),
        "i8.nii": (np.arange(60) - 30).reshape(4, 5, 3).astype(np.int8),
    }
    for name, data in arrays.items():
        img = nib.Nifti1Image(data, np.eye(4))
        img.header.set_data_dtype(data.dtype)
        nib.save(img, str(tmp_path / name))
        want = np.asanyarray(nib.load(str(tmp_path / name)).dataobj)
        check_array_source(read_nifti(tmp_path / name), want)


def test_a_time_step_of_zero_counts_as_one_and_a_singular_affine_gives_no_physical(
    tmp_path: Path,
) -> None:
    img = nib.Nifti1Image(_data((4, 5, 3, 2), "int16"), np.diag([2.0, 3.0, 4.0, 1.0]))
    img.header["pixdim"][4] = 0.0  # TR left unset, as many writers do
    nib.save(img, str(tmp_path / "t0.nii"))
    src = read_nifti(tmp_path / "t0.nii")
    assert src.spacing == (2.0, 3.0, 4.0, 1.0)
    path = _write(tmp_path / "flat.nii", _data((4, 5, 3), "int16"))
    raw = path.read_bytes()
    header = nib.Nifti1Header(raw[:348])
    header["srow_x"] = [0.0, 0.0, 0.0, 5.0]  # the sform maps every voxel to one x
    path.write_bytes(header.binaryblock + raw[348:])
    ref = nib.load(str(path))
    assert np.linalg.matrix_rank(ref.affine[:3, :3]) < 3
    src = read_nifti(tmp_path / "flat.nii")
    assert src.physical is None and src.spacing is None
    np.testing.assert_array_equal(src[...], np.asanyarray(ref.dataobj))


def test_compression_is_told_from_the_bytes_not_the_name(tmp_path: Path) -> None:
    gz = _write(tmp_path / "v.nii.gz", _data((5, 6, 7), "float32"))
    renamed = tmp_path / "really-gzipped.nii"
    renamed.write_bytes(gz.read_bytes())
    want = np.asanyarray(_reference(gz).dataobj)
    src = read_nifti(renamed)
    assert src.cache_path is not None
    np.testing.assert_array_equal(src[...], want)
    plain = _write(tmp_path / "p.nii", _data((5, 6, 7), "float32"))
    misnamed = tmp_path / "not-gzipped.nii.gz"
    misnamed.write_bytes(plain.read_bytes())
    src = read_nifti(misnamed)
    assert src.cache_path is None
    np.testing.assert_array_equal(src[...], np.asanyarray(_reference(plain).dataobj))


def _oblique_2d() -> np.ndarray:
    """A 4x4 affine whose voxel axes i, j leave the world's x-y plane (spacing 0.7, 1.3)."""
    rot = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
    affine = np.eye(4)
    affine[:3, :3] = rot @ np.diag([0.7, 1.3, 2.1])
    affine[:3, 3] = [1.0, 2.0, 3.0]
    return affine


def test_an_oblique_2d_image_has_nibabels_zooms_and_true_in_plane_distances(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "o.nii", _data((12, 10), "int16"), affine=_oblique_2d())
    ref = _reference(path)
    src = read_nifti(path)
    zooms = nib.affines.voxel_sizes(ref.affine)[:2]
    np.testing.assert_allclose(src.spacing, zooms, rtol=1e-12)  # not the x-y projection
    np.testing.assert_allclose(src.spacing, ref.header.get_zooms(), rtol=1e-6)
    np.testing.assert_array_equal(src.nifti_affine, ref.affine)
    assert not src.nifti_affine.flags.writeable
    assert src.affine is not None and src.affine.shape == (3, 3)
    # in-plane coordinates: every distance between voxels is the 3-D world's
    voxels = np.array([[0, 0], [3, 4], [11, 0], [2, 9], [7, 7]])
    world3 = nib.affines.apply_affine(ref.affine, np.c_[voxels, np.zeros(len(voxels))])
    assert src.physical is not None
    plane = src.physical.world(voxels)
    for a in range(len(voxels)):
        for b in range(len(voxels)):
            np.testing.assert_allclose(
                np.linalg.norm(plane[a] - plane[b]),
                np.linalg.norm(world3[a] - world3[b]),
                rtol=1e-12,
                atol=1e-12,
            )
    sampler = PatchSampler(src, num_patches=2, patch_size_mm=(2.8, 2.6))
    assert sampler.patch_size == (4, 2)  # round(2.8 / 0.7), round(2.6 / 1.3)


def test_a_2d_image_in_the_xz_plane_has_its_zooms(tmp_path: Path) -> None:
    affine = np.array([[0.5, 0, 0, 1.0], [0, 0, 2.0, 2.0], [0, 1.5, 0, 3.0], [0, 0, 0, 1]])
    path = _write(tmp_path / "c.nii", _data((6, 5), "uint8"), affine=affine)
    ref = _reference(path)
    src = read_nifti(path)  # the x-y block is singular: it had no physical before
    np.testing.assert_allclose(src.spacing, ref.header.get_zooms(), rtol=1e-12)
    world = nib.affines.apply_affine(ref.affine, [2, 3, 0])  # (2.0, 2.0, 7.5)
    assert src.physical is not None
    # the plane's own axes are the world's x and z here: in-plane coordinates are those
    np.testing.assert_allclose(src.physical.world([[2, 3]])[0], world[[0, 2]], rtol=1e-12)
    np.testing.assert_array_equal(src.nifti_affine, ref.affine)


def test_a_hdr_with_the_single_file_magic_reads_its_data_from_the_img(tmp_path: Path) -> None:
    want = _data((4, 5, 6), "int16", seed=9)
    _write(tmp_path / "p.img", want)
    raw = bytearray((tmp_path / "p.hdr").read_bytes())
    raw[344:348] = b"n+1\0"  # the magic of a single .nii, in a pair's header
    (tmp_path / "p.hdr").write_bytes(bytes(raw))
    ref = _reference(tmp_path / "p.hdr")
    assert ref.dataobj.offset == 0
    for name in ("p.hdr", "p.img"):
        with assert_unchanged(tmp_path / "p.hdr", tmp_path / "p.img"):
            got = read_nifti(tmp_path / name)[...]
        np.testing.assert_array_equal(got, np.asanyarray(ref.dataobj))


def test_a_nii_with_the_pair_magic_and_offset_zero_is_refused_not_read_from_its_header(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "s.nii", _data((4, 5, 6), "int16"))
    raw = bytearray(path.read_bytes())
    raw[344:348] = b"ni1\0"
    (tmp_path / "ok.nii").write_bytes(bytes(raw))  # offset 352 kept: read as nibabel does
    np.testing.assert_array_equal(
        read_nifti(tmp_path / "ok.nii")[...], np.asanyarray(nib.load(tmp_path / "ok.nii").dataobj)
    )
    raw[108:112] = np.float32(0).tobytes()  # vox_offset 0: nibabel would read the header
    (tmp_path / "zero.nii").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"zero\.nii.*vox_offset=0.*overlap the header"):
        read_nifti(tmp_path / "zero.nii")
