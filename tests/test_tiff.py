"""TIFF and OME-TIFF through read_tiff: every read path equals tifffile's own read.

Files are written with ``tifffile.imwrite`` (tiles, strips, compressions, predictors, byte
orders, dtypes, RGB samples, page stacks, OME and ImageJ metadata, SubIFD pyramids) with
shapes that are not a multiple of the tile, and read back through every path of a mixle
source; the answer is always tifffile's read of the same file.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("imagecodecs")

import mixle  # noqa: E402
from mixle.data.sources.arrays.tiff import TiffArraySource, read_tiff  # noqa: E402
from mixle.testing import assert_unchanged, check_array_source  # noqa: E402

SHAPE = (5, 37, 45)  # 37 x 45 pixels: edge tiles of 16 x 16 are partial
RNG = np.random.default_rng(21)


def _values(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return RNG.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


#: name -> (dtype, shape, tifffile.imwrite keywords)
CASES: dict[str, tuple[str, tuple[int, ...], dict[str, Any]]] = {
    "tiled-zlib-u16": ("uint16", SHAPE, {"tile": (16, 16), "compression": "zlib"}),
    "strips-lzw-pred-i16": (
        "int16",
        SHAPE,
        {"rowsperstrip": 5, "compression": "lzw", "predictor": True},
    ),
    "strips-packbits-u8": ("uint8", SHAPE, {"rowsperstrip": 7, "compression": "packbits"}),
    "tiled-zstd-f32-be": (
        "float32",
        SHAPE,
        {"tile": (16, 16), "compression": "zstd", "byteorder": ">"},
    ),
    "tiled-deflate-fpred-f64-be": (
        "float64",
        SHAPE,
        {"tile": (16, 32), "compression": "zlib", "predictor": True, "byteorder": ">"},
    ),
    "tiled-raw-i16": ("int16", SHAPE, {"tile": (16, 16)}),
    "strips-raw-generic-u16": ("uint16", SHAPE, {"rowsperstrip": 6, "metadata": None}),
    "contiguous-u16": ("uint16", SHAPE, {}),
    "contiguous-f64-be": ("float64", SHAPE, {"byteorder": ">"}),
    "generic-zlib-f32": (
        "float32",
        SHAPE,
        {"tile": (16, 16), "compression": "zlib", "metadata": None},
    ),
    "rgb-contig-jpeg": (
        "uint8",
        (2, 40, 50, 3),
        {"photometric": "rgb", "tile": (16, 16), "compression": "jpeg"},
    ),
    "rgb-separate-zlib": (
        "uint8",
        (3, 37, 45),
        {"photometric": "rgb", "planarconfig": "separate", "tile": (16, 16), "compression": 8},
    ),
    "volumetric-zlib": (
        "uint8",
        (20, 33, 40),
        {"tile": (8, 16, 16), "compression": "zlib", "volumetric": True},
    ),
    "bigtiff-zstd": ("uint16", SHAPE, {"bigtiff": True, "tile": (16, 16), "compression": "zstd"}),
    "single-page-strips": ("uint16", (37, 45), {"rowsperstrip": 4, "compression": "zlib"}),
}

KEYS: list[Any] = [
    (1,),
    (-1, slice(3, 30)),
    (slice(1, 5), 3),
    (Ellipsis, 2),
    (slice(0, 5, 2), slice(1, 37, 3), slice(None)),
    (4, slice(2, 37), -2),
    (slice(None, None, -1), slice(10, 20), slice(40, 5, -3)),
]


def _write(path: Path, case: str) -> Path:
    dtype, shape, options = CASES[case]
    tifffile.imwrite(path, _values(shape, dtype), **options)
    return path


def _box(corner: Any, size: Any) -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(corner, size))


def assert_every_path_is_tifffile(src: TiffArraySource, want: np.ndarray) -> None:
    """Keys, boxes, batches, records and patches of ``src`` all equal ``want``."""
    assert src.shape == want.shape and src.dtype == want.dtype
    np.testing.assert_array_equal(src[...], want)
    for key in KEYS:
        key = key[: want.ndim]
        try:
            expected = want[key]
        except IndexError:  # not a key of this shape
            continue
        np.testing.assert_array_equal(src[key], expected, err_msg=f"key={key!r}")
    patch = tuple(min(n, k) for n, k in zip(want.shape, (3, 17, 19, 3)))
    rng = np.random.default_rng(0)
    starts = [
        [int(rng.integers(0, n - p + 1)) for n, p in zip(want.shape, patch)] for _ in range(8)
    ]
    starts.append([n - p for n, p in zip(want.shape, patch)])
    boxes = src.read_boxes(starts, patch)
    for got, corner in zip(boxes, starts):
        np.testing.assert_array_equal(got, want[_box(corner, patch)], err_msg=f"box {corner}")
    rows = np.array([len(want) - 1, 0, len(want) // 2, 0, -1])
    np.testing.assert_array_equal(src.get_batch(rows), want[rows])
    for got, expected in zip(src.records(), want):
        np.testing.assert_array_equal(got, expected)
    sampler = mixle.PatchSampler(src, patch, num_patches=8, seed=3)
    patches, corners = sampler.get_batch(np.arange(8))
    for got, corner in zip(patches, corners):
        np.testing.assert_array_equal(got, want[_box(corner, patch)], err_msg=f"{corner}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_read_path_equals_tifffile(tmp_path, case):
    path = _write(tmp_path / "x.tif", case)
    want = tifffile.imread(path)
    with assert_unchanged(path):
        assert_every_path_is_tifffile(read_tiff(path), want)
        check_array_source(read_tiff(path), want)


#: name -> (shape, tifffile.imwrite keywords): an image axis of length 1 (one row, one
#: column, one slice shallower than the volumetric tile's depth)
LENGTH_ONE_CASES: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {
    "one-row": ((1, 30), {"tile": (16, 16)}),
    "one-column": ((30, 1), {"tile": (16, 16)}),
    "one-pixel": ((1, 1), {"tile": (16, 16)}),
    "pages-of-one-row": ((2, 20, 1, 30), {"tile": (16, 16)}),
    "rgb-one-row": ((1, 30, 3), {"tile": (16, 16), "photometric": "rgb"}),
    "planar-one-row": ((3, 1, 30), {"tile": (16, 16), "photometric": "rgb", "planarconfig": 2}),
    "strips-one-row": ((1, 30), {"rowsperstrip": 4}),
    "volume-one-slice": ((1, 32, 32), {"tile": (2, 16, 16), "volumetric": True}),
    "volume-one-row": (
        (3, 1, 32),
        {"tile": (2, 16, 16), "volumetric": True, "photometric": "minisblack"},
    ),
    "volumes-one-slice": ((2, 1, 32, 32), {"tile": (2, 16, 16), "volumetric": True}),
}


@pytest.mark.parametrize("case", sorted(LENGTH_ONE_CASES))
def test_image_axes_of_length_one_read_as_tifffile(tmp_path, case):
    shape, options = LENGTH_ONE_CASES[case]
    path = tmp_path / "one.tif"
    tifffile.imwrite(path, _values(shape, "uint16"), compression="zlib", **options)
    want = tifffile.imread(path)
    with assert_unchanged(path):
        assert_every_path_is_tifffile(read_tiff(path), want)
        check_array_source(read_tiff(path), want)


def test_one_row_tiles_are_whole_tile_chunks(tmp_path):
    path = tmp_path / "row.tif"
    tifffile.imwrite(path, np.arange(30, dtype=np.uint8).reshape(1, 30), tile=(16, 16))
    assert read_tiff(path).chunks == (16, 16)  # one tile of 16 rows holds the one row
    volume = tmp_path / "v.tif"
    options = {"tile": (2, 16, 16), "volumetric": True, "compression": "zlib"}
    tifffile.imwrite(volume, _values((2, 1, 32, 32), "uint8"), **options)
    assert read_tiff(volume).chunks == (1, 1, 16, 16)  # the tile's second slice is padding


@st.composite
def tiff_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], dict[str, Any]]:
    """A small shape (length-1 axes likely) and how tifffile tiles or strips it."""
    edge = st.sampled_from([1, 1, 2, 15, 16, 17, 33])
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    rows, cols = draw(edge), draw(edge)
    kind = draw(st.sampled_from(["tiles", "volume", "strips", "rgb"]))
    options: dict[str, Any] = {"photometric": "minisblack", "compression": "zlib"}
    tile = (draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32])))
    if kind == "volume":
        depth = draw(st.sampled_from([1, 1, 2, 3, 5]))
        options.update(tile=(draw(st.integers(1, 4)), *tile), volumetric=True)
        return (*lead, depth, rows, cols), options
    if kind == "strips":
        options.update(rowsperstrip=draw(st.integers(1, 40)))
    else:
        options.update(tile=tile)
    if kind == "rgb":
        options.update(photometric="rgb", planarconfig=draw(st.sampled_from([1, 2])))
        samples = (*lead, 3, rows, cols) if options["planarconfig"] == 2 else None
        return samples or (*lead, rows, cols, 3), options
    return (*lead, rows, cols), options


@settings(max_examples=40, deadline=None)
@given(layout=tiff_layouts(), data=st.data())
def test_random_small_layouts_read_as_tifffile(layout, data):
    shape, options = layout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.tif"
        try:  # tifffile writes and reads back most, not all, of these
            tifffile.imwrite(path, _values(shape, "uint16"), **options)
            want = tifffile.imread(path)
        except (ValueError, IndexError):  # e.g. a 1x1x1 volume in tiles 2 deep
            reject()
        src = read_tiff(path)
        assert src.shape == want.shape
        np.testing.assert_array_equal(src[...], want)
        size = [data.draw(st.integers(1, n)) for n in want.shape]
        starts = [[data.draw(st.integers(0, n - k)) for n, k in zip(want.shape, size)]]
        np.testing.assert_array_equal(src.read_boxes(starts, size)[0], want[_box(starts[0], size)])
        rows = data.draw(st.lists(st.integers(0, len(want) - 1), min_size=1, max_size=4))
        np.testing.assert_array_equal(src.get_batch(rows), want[rows])
        src.close()


def test_tiles_are_the_chunks_and_contiguous_data_is_mapped(tmp_path):
    tiled = read_tiff(_write(tmp_path / "t.tif", "tiled-zlib-u16"))
    assert tiled.chunks == (1, 16, 16) and tiled.axes == "QYX"
    strips = read_tiff(_write(tmp_path / "s.tif", "strips-lzw-pred-i16"))
    assert strips.chunks == (1, 5, 45)
    rgb = read_tiff(_write(tmp_path / "rgb.tif", "rgb-contig-jpeg"))
    assert rgb.chunks == (1, 16, 16, 3) and rgb.axes.endswith("YXS")
    planar = read_tiff(_write(tmp_path / "p.tif", "rgb-separate-zlib"))
    assert planar.chunks == (1, 16, 16)
    mapped = read_tiff(_write(tmp_path / "c.tif", "contiguous-f64-be"))
    assert mapped.chunks is None and mapped.dtype == np.dtype("float64")  # native order


def test_reads_decode_each_tile_once(tmp_path, monkeypatch):
    src = read_tiff(_write(tmp_path / "t.tif", "tiled-zlib-u16"))
    reader = src._reader_for(src._live())
    calls: list[tuple[int, ...]] = []
    real = reader.read_chunk
    monkeypatch.setattr(reader, "read_chunk", lambda c: calls.append(c) or real(c))
    src.read_boxes([[0, 0, 0], [0, 1, 1], [0, 2, 2]], [2, 16, 16])
    assert len(calls) == len(set(calls)) == 2 * 4  # 2 pages x 2 x 2 tiles, each once


def test_pages_parsed_on_first_read_from_many_threads(tmp_path):
    path = tmp_path / "many.tif"
    data = _values((40, 20, 24), "uint16")
    tifffile.imwrite(path, data, tile=(16, 16), compression="zlib")  # "shaped": 1 IFD parsed
    want = tifffile.imread(path)
    src = read_tiff(path)
    starts = [[k, 3, 5] for k in range(40)][::-1]
    boxes = src.read_boxes(starts, [1, 16, 16])  # the decode pool parses the pages at once
    for got, (k, y, x) in zip(boxes, starts):
        np.testing.assert_array_equal(got[0], want[k, y : y + 16, x : x + 16])


def test_pyramid_levels_from_subifds(tmp_path):
    path = tmp_path / "pyr.ome.tif"
    base = _values((70, 90), "uint16")
    with tifffile.TiffWriter(path, ome=True) as w:
        options = {"tile": (16, 16), "compression": "zlib"}
        meta = {"axes": "YX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.25}
        w.write(base, subifds=2, metadata=meta, **options)
        w.write(base[::2, ::2], subfiletype=1, **options)
        w.write(base[::4, ::4], subfiletype=1, **options)
    src = read_tiff(path)
    assert src.levels == [(70, 90), (35, 45), (18, 23)]
    with tifffile.TiffFile(path) as tif:
        wants = [lv.asarray() for lv in tif.series[0].levels]
    for k, want in enumerate(wants):
        level = read_tiff(path, level=k)
        np.testing.assert_array_equal(want, tifffile.imread(path, series=0, level=k))
        assert_every_path_is_tifffile(level, want)
    assert read_tiff(path, level=1).spacing == (0.5, 1.0)
    assert read_tiff(path, level=2).spacing == pytest.approx((0.25 * 70 / 18, 0.5 * 90 / 23))
    with pytest.raises(ValueError, match=r"level=3 is out of range.*3 pyramid levels"):
        read_tiff(path, level=3)
    with pytest.raises(ValueError, match=r"series=1 is out of range.*holds 1 series"):
        read_tiff(path, series=1)


def test_several_series(tmp_path):
    path = tmp_path / "two.tif"
    first, second = _values((3, 20, 30), "uint8"), _values((17, 19), "float32")
    with tifffile.TiffWriter(path) as w:
        w.write(first, photometric="minisblack", tile=(16, 16), compression="zlib")
        w.write(second, compression="zstd")
    for index, want in enumerate((first, second)):
        src = read_tiff(path, series=index)
        np.testing.assert_array_equal(tifffile.imread(path, series=index), want)
        assert_every_path_is_tifffile(src, want)


def test_ome_axes_and_physical_sizes(tmp_path):
    path = tmp_path / "o.ome.tif"
    data = _values((3, 2, 37, 45), "uint16")
    meta = {
        "axes": "ZCYX",
        "PhysicalSizeX": 0.5,
        "PhysicalSizeY": 0.25,
        "PhysicalSizeZ": 2.0,
        "PhysicalSizeZUnit": "nm",
    }
    tifffile.imwrite(path, data, ome=True, metadata=meta, tile=(16, 16), compression="zlib")
    src = read_tiff(path)
    assert src.axes == "ZCYX"
    assert src.spacing == (2.0, 1.0, 0.25, 0.5)
    physical = src.physical
    assert physical is not None
    assert physical.axes == ("z", "c", "y", "x")
    assert physical.units == ("nm", None, "µm", "µm")  # OME's default unit is µm
    np.testing.assert_array_equal(src.affine, np.diag([2.0, 1.0, 0.25, 0.5, 1.0]))
    assert_every_path_is_tifffile(src, tifffile.imread(path))


def _ome_images(images: list[tuple[str, float, str]]) -> str:
    """OME-XML of 2-plane ``ZYX`` images ``(tiffdata, pixel size, name)`` of 16 x 16 pixels."""
    body = "".join(
        f'<Image ID="Image:{k}" Name="{name}"><Pixels ID="Pixels:{k}" DimensionOrder="XYZCT" '
        'Type="uint8" SizeX="16" SizeY="16" SizeZ="2" SizeC="1" SizeT="1" '
        f'PhysicalSizeX="{size}" PhysicalSizeY="{size}" PhysicalSizeZ="{size}">'
        f'<Channel ID="Channel:{k}:0" SamplesPerPixel="1"/>{tiffdata}</Pixels></Image>'
        for k, (tiffdata, size, name) in enumerate(images)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><OME '
        'xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" UUID="urn:uuid:root">'
        f"{body}</OME>"
    )


def _write_ome_pages(path: Path, xml: str, pages: int) -> np.ndarray:
    data = _values((pages, 16, 16), "uint8")
    with tifffile.TiffWriter(path) as w:
        for k, plane in enumerate(data):
            w.write(plane, metadata=None, **({"description": xml} if k == 0 else {}))
    return data


def test_ome_spacing_is_the_image_tifffile_reads_the_series_from(tmp_path):
    path = tmp_path / "o.ome.tif"
    xml = _ome_images(
        [
            ('<TiffData IFD="9" PlaneCount="2"/>', 9.0, "default"),  # no such IFD: skipped
            ('<TiffData IFD="2" PlaneCount="2"/>', 0.5, "default"),
            ('<TiffData IFD="0" PlaneCount="2"/>', 0.25, "default"),
        ]
    )
    data = _write_ome_pages(path, xml, 4)
    with tifffile.TiffFile(path) as tif:  # tifffile: 2 series, from Image:1 and Image:2
        assert [s.name for s in tif.series] == ["default", "default"]
        assert [s.keyframe.index for s in tif.series] == [2, 0]
    for index, (size, planes) in enumerate([(0.5, data[2:]), (0.25, data[:2])]):
        src = read_tiff(path, series=index)
        assert src.spacing == (size, size, size)
        np.testing.assert_array_equal(tifffile.imread(path, series=index), planes)
        np.testing.assert_array_equal(src[...], planes)


def test_ome_image_in_another_file_gives_its_spacing(tmp_path):
    own = _ome_images(
        [
            ('<TiffData IFD="0" PlaneCount="2"/>', 0.5, "here"),
            (
                '<TiffData IFD="0" PlaneCount="2">'
                '<UUID FileName="b.ome.tif">urn:uuid:b</UUID></TiffData>',
                3.0,
                "there",
            ),
        ]
    )
    _write_ome_pages(tmp_path / "a.ome.tif", own, 2)
    other = _write_ome_pages(tmp_path / "b.ome.tif", own.replace("urn:uuid:root", "urn:uuid:b"), 2)
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "a.ome.tif", series=1), other)
    src = read_tiff(tmp_path / "a.ome.tif", series=1)
    assert src.spacing == (3.0, 3.0, 3.0)
    np.testing.assert_array_equal(src[...], other)


def test_ome_images_sharing_pages_give_no_spacing(tmp_path):
    from mixle.errors import OmeTiffMetadataWarning

    path = tmp_path / "o.ome.tif"
    same = '<TiffData IFD="0" PlaneCount="2"/>'
    _write_ome_pages(path, _ome_images([(same, 0.5, "a"), (same, 2.0, "b")]), 2)
    with tifffile.TiffFile(path) as tif:
        assert len(tif.series) == 2  # both read the same two pages
    for index in (0, 1):
        with pytest.warns(OmeTiffMetadataWarning, match=r"Image:0', 'Image:1'.*no spacing"):
            src = read_tiff(path, series=index)
        assert src.physical is None and src.spacing is None
        np.testing.assert_array_equal(src[...], tifffile.imread(path, series=index))
    _write_ome_pages(path, _ome_images([(same, 0.5, "a"), (same, 0.5, "b")]), 2)
    assert read_tiff(path, series=1).spacing == (0.5, 0.5, 0.5)  # the same either way


def test_plain_tiff_has_no_physical(tmp_path):
    src = read_tiff(_write(tmp_path / "t.tif", "tiled-zlib-u16"))
    assert src.physical is None and src.spacing is None


def test_imagej_hyperstack_spacing(tmp_path):
    path = tmp_path / "ij.tif"
    data = _values((3, 4, 30, 21), "uint16")
    meta = {"axes": "ZCYX", "spacing": 2.5, "unit": "um"}
    tifffile.imwrite(path, data, imagej=True, metadata=meta, resolution=(4.0, 8.0))
    src = read_tiff(path)
    assert src.axes == "ZCYX"
    assert src.spacing == (2.5, 1.0, 0.125, 0.25)
    assert src.physical is not None and src.physical.units == ("µm", None, "µm", "µm")
    assert_every_path_is_tifffile(src, tifffile.imread(path))


def test_imagej_stack_without_spacing_has_imagejs_voxel_depth_in_its_unit(tmp_path):
    # ImageJ's default voxel depth is 1 of the stack's unit; an unknown unit on z would
    # make patch_size_mm take it for millimetres (1000x off for a micrometre stack)
    path = tmp_path / "nospacing.tif"
    tifffile.imwrite(path, np.zeros((6, 16, 16), np.uint8), imagej=True, resolution=(2.0, 2.0),
                     metadata={"axes": "ZYX", "unit": "um"})  # fmt: skip
    src = read_tiff(path)
    assert src.spacing == (1.0, 0.5, 0.5)
    assert src.physical is not None and src.physical.units == ("µm",) * 3


def test_imagej_zunit_and_yunit_give_those_axes_their_own_units(tmp_path):
    # ImageJ writes yunit=/zunit= when an axis's unit differs from unit= (x's)
    path = tmp_path / "iju.tif"
    meta = {"axes": "ZYX", "unit": "micron", "spacing": 500.0, "zunit": "nm", "yunit": "mm"}
    tifffile.imwrite(path, np.zeros((10, 32, 32), np.uint8), imagej=True, resolution=(2.0, 4.0),
                     metadata=meta)  # fmt: skip
    with tifffile.TiffFile(path) as tif:
        assert tif.imagej_metadata["zunit"] == "nm"  # as tifffile reads it back
    src = read_tiff(path)
    assert src.spacing == (500.0, 0.25, 0.5)
    assert src.physical is not None and src.physical.units == ("nm", "mm", "µm")
    # in millimetres: z 500 nm = 0.0005 mm, y 0.25 mm, x 0.5 um = 0.0005 mm
    from mixle.data.sampling.physical_patches import patch_size_from_mm

    assert patch_size_from_mm((0.005, 0.5, 0.005), src.physical, 3, "src") == (10, 2, 10)


def test_imagej_unknown_or_pixel_axis_unit_is_never_taken_for_another(tmp_path):
    from mixle.data.sampling.physical_patches import patch_size_from_mm

    path = tmp_path / "odd.tif"
    meta = {"axes": "ZYX", "unit": "micron", "spacing": 3.0, "zunit": "furlong"}
    tifffile.imwrite(path, np.zeros((4, 8, 8), np.uint8), imagej=True, resolution=(2.0, 2.0),
                     metadata=meta)  # fmt: skip
    src = read_tiff(path)
    assert src.physical is not None and src.physical.units == ("furlong", "µm", "µm")
    with pytest.raises(ValueError, match="furlong"):  # refused, not a wrong voxel count
        patch_size_from_mm(1.0, src.physical, 3, "src")
    path = tmp_path / "pix.tif"
    meta = {"axes": "ZYX", "unit": "micron", "spacing": 3.0, "zunit": "pixel"}
    tifffile.imwrite(path, np.zeros((4, 8, 8), np.uint8), imagej=True, resolution=(2.0, 2.0),
                     metadata=meta)  # fmt: skip
    src = read_tiff(path)
    assert src.spacing == (3.0, 0.5, 0.5)
    assert src.physical is not None and src.physical.units == ("pixel", "µm", "µm")
    with pytest.raises(ValueError, match="pixel"):  # z in pixels is not a length
        patch_size_from_mm(1.0, src.physical, 3, "src")


def _flip_tile(src: Path, dst: Path, page: int, tile: int) -> None:
    dst.write_bytes(src.read_bytes())
    with tifffile.TiffFile(dst) as tif:
        frame = tif.pages[page]
        offset, count = frame.dataoffsets[tile], frame.databytecounts[tile]
    with open(dst, "r+b") as fh:
        fh.seek(offset)
        raw = fh.read(count)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in raw))


def test_corrupt_tile_names_file_page_and_tile(tmp_path):
    good = _write(tmp_path / "good.tif", "tiled-zlib-u16")
    bad = tmp_path / "bad.tif"
    _flip_tile(good, bad, page=2, tile=4)
    with pytest.raises(RuntimeError, match="libdeflate"):  # tifffile refuses it too
        tifffile.imread(bad)
    src = read_tiff(bad)
    with assert_unchanged(bad):
        for read in (
            lambda: src[...],
            lambda: src.read_boxes([[2, 16, 16]], [1, 4, 4]),
            lambda: src.get_batch([2]),
        ):
            with pytest.raises(mixle.CorruptChunkError, match=r"tile 4 of page 2 of series 0"):
                read()
    np.testing.assert_array_equal(src[1], tifffile.imread(good)[1])  # other pages read


@pytest.mark.parametrize("decoded", [16 * 8 * 2, 16 * 16 * 2 * 64])  # half a tile; 64 tiles
def test_tile_decoding_to_another_size_is_corrupt(tmp_path, decoded):
    import zlib

    good = _write(tmp_path / "good.tif", "tiled-zlib-u16")
    bad = tmp_path / "resized.tif"
    bad.write_bytes(good.read_bytes())
    with tifffile.TiffFile(bad) as tif:
        frame = tif.pages[1]
        offset, count = frame.dataoffsets[0], frame.databytecounts[0]
    stream = zlib.compress(bytes(decoded))
    assert len(stream) <= count
    with open(bad, "r+b") as fh:
        fh.seek(offset)
        fh.write(stream + bytes(count - len(stream)))
    src = read_tiff(bad)
    match = r"tile 0 of page 1 of series 0 \(level 0\) of '.*resized.tif'.*corrupt"
    with pytest.raises(mixle.CorruptChunkError, match=match):
        src[1]


def test_truncated_file(tmp_path):
    good = _write(tmp_path / "good.tif", "tiled-zlib-u16")
    cut = tmp_path / "cut.tif"
    with tifffile.TiffFile(good) as tif:
        last = tif.pages[4]
        end = last.dataoffsets[-1] + last.databytecounts[-1]
    cut.write_bytes(good.read_bytes()[: end - 5])
    with tifffile.TiffFile(cut) as tif:
        assert tif.pages[4].dataoffsets[-1] + tif.pages[4].databytecounts[-1] == end
    src = read_tiff(cut)
    with pytest.raises(mixle.CorruptChunkError, match=r"truncated.*cut.tif"):
        src[4]
    np.testing.assert_array_equal(src[0], tifffile.imread(good)[0])


def test_byte_count_past_the_end_reads_nothing(tmp_path):
    path = tmp_path / "t.tif"
    data = _values((3, 256, 256), "uint16")
    options = {"bigtiff": True, "tile": (256, 256), "compression": "zlib"}
    tifffile.imwrite(path, data, photometric="minisblack", **options)  # random: counts > 2**16
    with tifffile.TiffFile(path, mode="r+") as tif:
        tag = tif.pages[1].tags["TileByteCounts"]  # 8-byte counts (LONG8)
        tag.overwrite((2**40,))  # a TiB: pread would try to allocate it
    src = read_tiff(path)
    with pytest.raises(mixle.CorruptChunkError, match=rf"tile 0 of page 1 .*truncated.*{2**40}"):
        src[1]
    np.testing.assert_array_equal(src[2], tifffile.imread(path, key=2))


def test_tile_never_written_reads_the_nodata_value(tmp_path):
    path = tmp_path / "sparse.tif"
    data = _values(SHAPE, "uint16")
    nodata = (42113, "s", 0, "7", True)  # GDAL_NODATA: what tifffile fills empty tiles with
    tifffile.imwrite(path, data, tile=(16, 16), compression="zlib", extratags=[nodata])
    with tifffile.TiffFile(path, mode="r+") as tif:
        tags = tif.pages[3].tags
        counts = list(tags["TileByteCounts"].value)
        counts[-1] = 0  # the last tile: tifffile misreads a hole between contiguous tiles
        tags["TileByteCounts"].overwrite(tuple(counts))
    want = tifffile.imread(path)
    assert (want[3, 32:, 32:] == 7).all()
    assert_every_path_is_tifffile(read_tiff(path), want)


def test_empty_tile_between_contiguous_tiles(tmp_path):
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "hole.tif"
    nodata = (42113, "s", 0, "7", True)
    tifffile.imwrite(
        path, _values(SHAPE, "uint16"), tile=(16, 16), compression="zlib", extratags=[nodata]
    )
    with tifffile.TiffFile(path, mode="r+") as tif:
        tags = tif.pages[3].tags
        counts = list(tags["TileByteCounts"].value)
        counts[4] = 0
        tags["TileByteCounts"].overwrite(tuple(counts))
    # tifffile's asarray merges the reads of tiles it takes for contiguous and skips the
    # hole's bytes (2026.3.3: tile 5 then gets tile 4's bytes); its zarr store reads each
    # tile alone, as mixle does
    with tifffile.TiffFile(path) as tif:
        want = zarr.open(tif.series[0].aszarr(), mode="r")[...]
    assert (want[3, 16:32, 16:32] == 7).all()
    assert_every_path_is_tifffile(read_tiff(path), want)


def test_damaged_page_tags_are_refused_naming_the_file(tmp_path):
    path = _write(tmp_path / "t.tif", "tiled-zlib-u16")
    with tifffile.TiffFile(path, mode="r+") as tif:
        page = tif.pages[2]
        page.tags["TileOffsets"].overwrite(page.dataoffsets[:-1])
        page.tags["TileByteCounts"].overwrite(page.databytecounts[:-1])
    with pytest.raises(RuntimeError, match="incompatible keyframe"):
        tifffile.imread(path)
    with pytest.raises(ValueError, match=r"t.tif.*series tifffile cannot read.*incompatible"):
        read_tiff(path)


def test_page_unlike_the_first_is_refused(tmp_path):
    path = _write(tmp_path / "t.tif", "tiled-zlib-u16")
    src = read_tiff(path)
    reader = src._reader_for(src._live())
    page = reader._page(2)
    short = page._replace(offsets=page.offsets[:-1], counts=page.counts[:-1])
    reader._pages[2] = short  # as a page parsed differently
    with pytest.raises(mixle.CorruptChunkError, match=r"page 2 lists 8 offsets.*need 9"):
        src[2]
    np.testing.assert_array_equal(src[1], tifffile.imread(path, key=1))


def test_contiguous_data_cut_short_is_refused_at_open(tmp_path):
    good = _write(tmp_path / "good.tif", "contiguous-u16")
    with tifffile.TiffFile(good) as tif:
        end = tif.series[0].dataoffset + tif.series[0].nbytes
    cut = tmp_path / "cut.tif"
    cut.write_bytes(good.read_bytes()[: end - 10])
    with pytest.raises(mixle.CorruptChunkError, match=r"cut.tif.*cut short"):
        read_tiff(cut)


def test_mapped_file_truncated_after_open(tmp_path):
    path = _write(tmp_path / "c.tif", "contiguous-u16")
    src = read_tiff(path)
    with open(path, "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(mixle.FileChangedError):
        src[...]


def _rewrite_in_place(path: Path, data: np.ndarray, **options: Any) -> None:
    """Write a TIFF of ``data`` over ``path``'s bytes (same inode), as ``rsync --inplace``."""
    other = path.with_name("other-" + path.name)
    tifffile.imwrite(other, data, **options)
    with open(path, "r+b") as fh:
        fh.write(other.read_bytes())
        fh.truncate()


@pytest.mark.parametrize(
    "options", [{"tile": (16, 16), "compression": "zlib"}, {}], ids=["tiled", "mapped"]
)
def test_file_rewritten_in_place_after_open_is_refused(tmp_path, options):
    from mixle.reading import chunk_cache

    path = tmp_path / "t.tif"
    old = _values((3, 64, 64), "uint8")
    tifffile.imwrite(path, old, photometric="minisblack", **options)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))  # so a write moves it
    src = read_tiff(path)
    np.testing.assert_array_equal(src[0, :16, :16], old[0, :16, :16])  # a tile is cached
    reader = src._reader_for(src._live())
    if reader is not None:
        assert chunk_cache().get((reader.token, (0, 0, 0))) is not None
    _rewrite_in_place(path, 255 - old, photometric="minisblack", **options)
    sampler = mixle.PatchSampler(src, (1, 8, 8), num_patches=4, seed=0)
    for read in (
        lambda: src[...],
        lambda: src[0, :16, :16],
        lambda: src[[2, 0]],
        lambda: src.read_boxes([[0, 0, 0]], [1, 16, 16]),
        lambda: src.get_batch([1]),
        lambda: list(src.records()),
        lambda: sampler.get_batch(np.arange(4)),
    ):
        with pytest.raises(mixle.FileChangedError, match=r"t.tif' was written in place"):
            read()
    if reader is not None:  # the old version's tiles are gone from the cache
        assert chunk_cache().get((reader.token, (0, 0, 0))) is None
    np.testing.assert_array_equal(read_tiff(path)[...], tifffile.imread(path))


def test_file_replaced_or_deleted_after_open_is_refused(tmp_path):
    path = _write(tmp_path / "t.tif", "tiled-zlib-u16")
    src = read_tiff(path)
    np.testing.assert_array_equal(src[0], tifffile.imread(path, key=0))
    _write(tmp_path / "new.tif", "tiled-zlib-u16").replace(path)
    with pytest.raises(mixle.FileChangedError, match="replaced by another file"):
        src[1]
    path.unlink()
    with pytest.raises(mixle.FileChangedError, match="deleted"):
        src.read_boxes([[0, 0, 0]], [1, 4, 4])


def _ome_image(uuids: list[tuple[str, str]], planes: int, shape: tuple[int, int]) -> str:
    """OME-XML of one ``ZYX`` image whose planes lie ``planes`` per file in ``uuids``."""
    rows, cols = shape
    tiffdata = "".join(
        f'<TiffData FirstZ="{k * planes}" IFD="0" PlaneCount="{planes}">'
        f'<UUID FileName="{name}">{uuid}</UUID></TiffData>'
        for k, (name, uuid) in enumerate(uuids)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" UUID="{own}">'
        '<Image ID="Image:0" Name="mf"><Pixels ID="Pixels:0" DimensionOrder="XYZCT" '
        f'Type="uint16" SizeX="{cols}" SizeY="{rows}" SizeZ="{planes * len(uuids)}" '
        'SizeC="1" SizeT="1" PhysicalSizeX="0.5" PhysicalSizeY="0.5" PhysicalSizeZ="2">'
        f'<Channel ID="Channel:0:0" SamplesPerPixel="1"/>{tiffdata}</Pixels></Image></OME>'
    )


def _multifile_ome(folder: Path, data: np.ndarray, files: int, **options: Any) -> list[Path]:
    """``data`` (``ZYX``) as a multi-file OME-TIFF: ``len(data) // files`` planes a file."""
    import uuid

    planes = len(data) // files
    names = [(f"part{k}.ome.tif", f"urn:uuid:{uuid.UUID(int=k + 1)}") for k in range(files)]
    xml = _ome_image(names, planes, data.shape[1:])
    paths = []
    for k, (name, own) in enumerate(names):
        paths.append(folder / name)
        with tifffile.TiffWriter(paths[-1]) as w:
            for z, plane in enumerate(data[k * planes : (k + 1) * planes]):
                described = {"description": xml.replace("{own}", own)} if z == 0 else {}
                w.write(plane, metadata=None, **described, **options)
    return paths


MULTIFILE_OPTIONS = {
    "raw-strips": {},
    "zlib-strips": {"compression": "zlib", "rowsperstrip": 7},
    "zstd-tiles": {"compression": "zstd", "tile": (16, 16)},
}


@pytest.mark.parametrize("case", sorted(MULTIFILE_OPTIONS))
def test_multifile_ome_planes_are_read_from_their_files(tmp_path, case):
    data = _values((6, 37, 45), "uint16")
    paths = _multifile_ome(tmp_path, data, 3, **MULTIFILE_OPTIONS[case])
    want = tifffile.imread(paths[0])
    np.testing.assert_array_equal(want, data)  # tifffile reads the planes of all 3 files
    with assert_unchanged(tmp_path):
        src = read_tiff(paths[0])
        assert src.axes == "ZYX" and src.spacing == (2.0, 0.5, 0.5)
        assert_every_path_is_tifffile(src, want)
        check_array_source(read_tiff(paths[0]), want)


def test_multifile_ome_errors_name_the_file_of_the_plane(tmp_path):
    data = _values((4, 37, 45), "uint16")
    paths = _multifile_ome(tmp_path, data, 2, compression="zlib", tile=(16, 16))
    want = tifffile.imread(paths[0])
    good = tmp_path / "good.ome.tif"
    good.write_bytes(paths[1].read_bytes())
    _flip_tile(good, paths[1], page=1, tile=2)  # the second file's second plane
    st = paths[1].stat()
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))  # so a write moves it
    src = read_tiff(paths[0])
    match = r"tile 2 of page 3 of series 0 .*part0.ome.tif.*stored in '.*part1.ome.tif'"
    with pytest.raises(mixle.CorruptChunkError, match=match):
        src[3]
    np.testing.assert_array_equal(src[:3], want[:3])
    paths[1].write_bytes(good.read_bytes())  # the other file rewritten after open
    with pytest.raises(mixle.FileChangedError, match=r"part1.ome.tif"):
        src[0]


@pytest.mark.parametrize("case", ["raw-strips", "zlib-strips"])
def test_multifile_ome_with_a_missing_file_warns_naming_it_and_reads_zeros_as_tifffile(
    tmp_path, case
):
    from mixle.errors import OmeTiffMissingFilesWarning

    data = _values((6, 37, 45), "uint16")
    paths = _multifile_ome(tmp_path, data, 3, **MULTIFILE_OPTIONS[case])
    paths[1].unlink()
    want = tifffile.imread(paths[0])  # tifffile only logs, and zeroes the missing planes
    assert not want[2:4].any() and np.array_equal(want[[0, 1, 4, 5]], data[[0, 1, 4, 5]])
    with pytest.warns(OmeTiffMissingFilesWarning, match=r"2 of its 6 planes.*'.*part1\.ome\.tif'"):
        src = read_tiff(paths[0])
    assert_every_path_is_tifffile(src, want)


def test_multifile_ome_with_every_file_present_does_not_warn(tmp_path):
    import warnings

    paths = _multifile_ome(tmp_path, _values((4, 9, 7), "uint16"), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_tiff(paths[0])


def test_multifile_ome_is_never_memory_mapped(tmp_path):
    import uuid

    data = _values((2, 20, 24), "uint16")
    names = [(f"{c}.ome.tif", f"urn:uuid:{uuid.UUID(int=k + 1)}") for k, c in enumerate("ab")]
    xml = _ome_image(names, 1, (20, 24))

    def write(pad: int) -> None:  # b's plane after ``pad`` more bytes of description
        for k, (name, own) in enumerate(names):
            text = xml.replace("{own}", own) + " " * (pad if k else 0)
            with tifffile.TiffWriter(tmp_path / name) as w:
                w.write(data[k], description=text, metadata=None)
                if not k:  # a second page: a.ome.tif is long enough for both planes
                    w.write(np.zeros_like(data[0]), metadata=None)

    write(0)
    with tifffile.TiffFile(tmp_path / "a.ome.tif") as tif:
        first, second = tif.series[0][0], tif.series[0][1]
        pad = first.dataoffsets[0] + first.nbytes - second.dataoffsets[0]
    write(pad)  # b's plane starts where a's ends: tifffile takes the two for one run
    with tifffile.TiffFile(tmp_path / "a.ome.tif") as tif:
        assert tif.series[0].dataoffset is not None  # contiguous, says tifffile: two files
    planes = [tifffile.imread(tmp_path / name, key=0, is_ome=False) for name, _ in names]
    want = np.stack(planes)  # tifffile's read of each plane from its own file
    np.testing.assert_array_equal(want, data)
    src = read_tiff(tmp_path / "a.ome.tif")
    assert src.chunks is not None  # read page by page, each from its file
    assert_every_path_is_tifffile(src, want)


def test_unknown_compression_is_named(tmp_path):
    path = _write(tmp_path / "u.tif", "tiled-zlib-u16")
    with tifffile.TiffFile(path, mode="r+") as tif:
        for page in tif.pages:
            page.tags["Compression"].overwrite(12345)
    with pytest.raises(ValueError, match=r"compression 12345.*imagecodecs"):
        read_tiff(path)


def test_missing_imagecodecs_names_the_extra(tmp_path, monkeypatch):
    from mixle.utils import optional_deps

    path = _write(tmp_path / "u.tif", "tiled-zlib-u16")
    with tifffile.TiffFile(path, mode="r+") as tif:
        for page in tif.pages:
            page.tags["Compression"].overwrite(12345)
    monkeypatch.setattr(optional_deps, "HAS_IMAGECODECS", False)
    with pytest.raises(ImportError, match=r'compression 12345.*pip install -e "\.\[tiff\]"'):
        read_tiff(path)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"path": "https://example.org/x.tif"}, ValueError, r"is a URL.*local paths only"),
        ({"path": 3}, TypeError, r"path=3 must be a path"),
        ({"series": -1}, ValueError, r"series=-1 must be >= 0"),
        ({"series": 1.0}, TypeError, r"series=1.0 must be an int"),
        ({"level": True}, TypeError, r"level=True must be an int"),
        ({"series": 4}, ValueError, r"series=4 is out of range.*holds 1 series \(0 to 0\)"),
        ({"level": 2}, ValueError, r"level=2 is out of range.*1 pyramid level \(0 to 0\)"),
    ],
)
def test_bad_arguments_name_the_value(tmp_path, kwargs, error, match):
    path = _write(tmp_path / "t.tif", "tiled-zlib-u16")
    with pytest.raises(error, match=match):
        read_tiff(**{"path": path, **kwargs})


def test_not_a_tiff_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_tiff(tmp_path / "none.tif")
    other = tmp_path / "x.tif"
    other.write_bytes(b"not a tiff at all")
    with pytest.raises(ValueError, match="not a TIFF file"):
        read_tiff(other)
    other.write_bytes(b"II*\x00garbage")
    with pytest.raises(ValueError, match="holds no image series"):
        read_tiff(other)


def test_pickle_is_by_reference(tmp_path):
    path = _write(tmp_path / "t.tif", "tiled-zlib-u16")
    src = read_tiff(path, series=0, level=0)
    blob = pickle.dumps(src)
    assert len(blob) < 1024
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone)
    np.testing.assert_array_equal(clone[...], tifffile.imread(path))


@pytest.mark.parametrize("case", ["tiled-zlib-u16", "contiguous-u16"])
def test_forked_child_reads_the_same_values(tmp_path, case):
    from tests._fork_child import in_forked_child

    path = _write(tmp_path / "t.tif", case)
    want = tifffile.imread(path)
    src = read_tiff(path)
    np.testing.assert_array_equal(src[1:3], want[1:3])  # parent opened and read

    def body() -> list[str]:
        problems = []
        if not np.array_equal(src[...], want):
            problems.append("src[...] differs")
        got = src.read_boxes([[0, 1, 2], [4, 20, 28]], [1, 16, 16])
        if not np.array_equal(got[1], want[4:5, 20:36, 28:44]):
            problems.append("read_boxes differs")
        return problems

    assert in_forked_child(body) == []
    np.testing.assert_array_equal(src[...], want)  # the parent's handle still works


def test_forked_child_reads_multifile_ome(tmp_path):
    from tests._fork_child import in_forked_child

    paths = _multifile_ome(tmp_path, _values((4, 20, 24), "uint16"), 2, compression="zlib")
    want = tifffile.imread(paths[0])
    src = read_tiff(paths[0])
    np.testing.assert_array_equal(src[1], want[1])  # the parent opened the first file only

    def body() -> list[str]:
        return [] if np.array_equal(src[...], want) else ["src[...] differs"]

    assert in_forked_child(body) == []
    np.testing.assert_array_equal(src[...], want)
