"""inspect_tiff: series and levels, tiles or strips, stored sizes and advice, from tags only."""

from __future__ import annotations

import json

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("imagecodecs")

from mixle.inspection.report import ArrayReport, GroupReport, UnsupportedStoreError  # noqa: E402
from mixle.inspection.tiff_files import TIFF_MAGICS, inspect_tiff, is_tiff  # noqa: E402
from mixle.testing import assert_unchanged  # noqa: E402


def _codes(report: ArrayReport) -> dict[str, str]:
    return {f.code: f.severity for f in report.findings}


def test_is_tiff_magic():
    for magic in TIFF_MAGICS:
        assert is_tiff(magic + b"\x00" * 4)
    assert not is_tiff(b"\x89HDF\r\n\x1a\n")
    assert not is_tiff(b"II")


@pytest.mark.parametrize(
    "options", [{}, {"byteorder": ">"}, {"bigtiff": True}, {"bigtiff": True, "byteorder": ">"}]
)
def test_written_files_start_with_a_tiff_magic(tmp_path, options):
    path = tmp_path / "x.tif"
    tifffile.imwrite(path, np.zeros((4, 5), np.uint8), **options)
    assert is_tiff(path.read_bytes()[:8])


def test_tiled_file_reports_tiles_and_stored_sizes(tmp_path):
    path = tmp_path / "t.tif"
    data = np.random.default_rng(0).integers(0, 9, (5, 300, 260), dtype=np.uint16)
    tifffile.imwrite(path, data, tile=(64, 64), compression="zlib")
    with assert_unchanged(path):
        report = inspect_tiff(str(path), None, None)
    assert isinstance(report, ArrayReport)
    assert report.path == "/" and report.format == "tiff" and report.layout == "chunked"
    assert report.shape == (5, 300, 260) and report.dtype == "uint16"
    assert report.chunks == (1, 64, 64)
    assert report.codecs == ("adobe_deflate",) and report.compressed
    assert report.chunks_in_grid == report.chunks_stored == 5 * 5 * 5
    with tifffile.TiffFile(path) as tif:
        stored = sum(sum(p.databytecounts) for p in tif.pages)
    assert report.stored_bytes == stored
    assert report.nbytes == data.nbytes
    json.dumps(report.to_dict())


def test_whole_row_strips_are_a_warning_with_a_tiling(tmp_path):
    path = tmp_path / "s.tif"
    tifffile.imwrite(path, np.zeros((2, 300, 1000), np.uint8), rowsperstrip=8, compression="lzw")
    report = inspect_tiff(str(path), None, (1, 32, 32))
    assert isinstance(report, ArrayReport)
    assert report.chunks == (1, 8, 1000)
    strips = next(f for f in report.findings if f.code == "whole-row-strips")
    assert strips.severity == "warning"
    assert "1000 pixels wide" in strips.message and "tile=(256, 256)" in strips.message
    assert report.patch_cost is not None


def test_contiguous_file_is_mapped(tmp_path):
    path = tmp_path / "c.tif"
    tifffile.imwrite(path, np.zeros((3, 20, 30), ">f4"), byteorder=">", photometric="minisblack")
    report = inspect_tiff(str(path), None, None)
    assert isinstance(report, ArrayReport)
    assert report.layout == "contiguous" and report.chunks is None and not report.compressed
    assert report.dtype == "float32" and report.stored_bytes == 3 * 20 * 30 * 4
    assert "memory-mapped" in _codes(report)


def test_small_tiles_are_noted(tmp_path):
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, np.zeros((512, 512), np.uint8), tile=(16, 16))
    report = inspect_tiff(str(path), None, None)
    assert isinstance(report, ArrayReport)
    assert _codes(report).get("small-chunks") == "warning"
    assert _codes(report).get("tile-size") == "info"


def test_pyramid_and_series_are_groups(tmp_path):
    path = tmp_path / "p.ome.tif"
    base = np.zeros((64, 80), np.uint8)
    with tifffile.TiffWriter(path, ome=True) as w:
        w.write(base, subifds=1, tile=(16, 16), compression="zlib")
        w.write(base[::2, ::2], subfiletype=1, tile=(16, 16), compression="zlib")
        w.write(np.zeros((3, 10, 12), np.int16), photometric="minisblack")
    report = inspect_tiff(str(path), None, None)
    assert isinstance(report, GroupReport) and report.format == "ome-tiff"
    assert [g.path for g in report.children] == ["/series0", "/series1"]
    first, second = report.children
    assert isinstance(first, GroupReport) and isinstance(second, GroupReport)
    assert [a.path for a in first.children] == ["/series0/level0", "/series0/level1"]
    assert [a.shape for a in first.children] == [(64, 80), (32, 40)]  # type: ignore[union-attr]
    assert [a.path for a in second.children] == ["/series1/level0"]
    json.dumps(report.to_dict())


def test_not_a_tiff_and_urls(tmp_path):
    other = tmp_path / "x.tif"
    other.write_bytes(b"II*\x00garbage")
    with pytest.raises(UnsupportedStoreError, match="holds no image series"):
        inspect_tiff(str(other), None, None)
    other.write_bytes(b"not a tiff")
    with pytest.raises(UnsupportedStoreError, match="not a TIFF file"):
        inspect_tiff(str(other), None, None)
    with pytest.raises(UnsupportedStoreError, match="local paths only"):
        inspect_tiff("https://example.org/x.tif", None, None)


def test_length_one_image_axes_report_whole_tiles(tmp_path):
    row = tmp_path / "row.tif"
    tifffile.imwrite(row, np.arange(30, dtype=np.uint8).reshape(1, 30), tile=(16, 16))
    report = inspect_tiff(str(row), None, None)
    assert isinstance(report, ArrayReport)
    assert report.shape == (1, 30) and report.chunks == (16, 16)
    assert report.chunks_in_grid == report.chunks_stored == 2
    assert report.decoded_bytes == 2 * 16 * 16 and report.data_bytes == 30
    volume = tmp_path / "v.tif"
    data = np.zeros((2, 1, 32, 32), np.uint16)
    tifffile.imwrite(volume, data, tile=(2, 16, 16), volumetric=True, compression="zlib")
    report = inspect_tiff(str(volume), None, None)
    assert isinstance(report, ArrayReport)
    assert report.chunks == (1, 1, 16, 16)  # the tiles' second slice lies past the image
    assert report.chunks_in_grid == report.chunks_stored == 2 * 4
    assert report.chunk_nbytes == 16 * 16 * 2
    assert report.decoded_bytes == 2 * 4 * (2 * 16 * 16 * 2)  # each tile decodes 2 slices
    with tifffile.TiffFile(volume) as tif:
        assert report.stored_bytes == sum(sum(p.databytecounts) for p in tif.pages)


def test_multifile_ome_counts_the_pages_of_every_file(tmp_path):
    import uuid

    data = np.arange(2 * 20 * 24, dtype=np.uint16).reshape(2, 20, 24)
    names = [(f"{c}.ome.tif", f"urn:uuid:{uuid.UUID(int=k + 1)}") for k, c in enumerate("ab")]
    planes = "".join(
        f'<TiffData FirstZ="{k}" IFD="0" PlaneCount="1"><UUID FileName="{n}">{u}</UUID></TiffData>'
        for k, (n, u) in enumerate(names)
    )
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" UUID="{own}">'
        '<Image ID="Image:0"><Pixels ID="Pixels:0" DimensionOrder="XYZCT" Type="uint16" '
        'SizeX="24" SizeY="20" SizeZ="2" SizeC="1" SizeT="1">'
        f'<Channel ID="Channel:0:0" SamplesPerPixel="1"/>{planes}</Pixels></Image></OME>'
    )
    for k, (name, own) in enumerate(names):
        with tifffile.TiffWriter(tmp_path / name) as w:
            w.write(data[k], description=xml.replace("{own}", own), metadata=None)
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "a.ome.tif"), data)
    with assert_unchanged(tmp_path):
        report = inspect_tiff(str(tmp_path / "a.ome.tif"), None, None)
    assert isinstance(report, ArrayReport)
    assert report.shape == (2, 20, 24) and report.layout == "chunked"
    assert report.chunks_in_grid == report.chunks_stored == 2
    stored = 0
    for name, _ in names:
        with tifffile.TiffFile(tmp_path / name, is_ome=False) as tif:
            stored += sum(tif.pages[0].databytecounts)
    assert report.stored_bytes == stored
    multi = next(f for f in report.findings if f.code == "multi-file")
    assert "2 files ('a.ome.tif', 'b.ome.tif')" in multi.message
    assert "memory-mapped" not in _codes(report)
