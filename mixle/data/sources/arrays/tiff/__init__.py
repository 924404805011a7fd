"""TIFF, BigTIFF and OME-TIFF series: the source, the tile reader and OME pixel sizes."""

from mixle.data.sources.arrays.tiff.source import TiffArraySource, read_tiff

__all__ = ["TiffArraySource", "read_tiff"]
