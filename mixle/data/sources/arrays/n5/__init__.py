"""N5 datasets (local folders and fsspec URLs): the source, its ``attributes.json`` parser
and its bounded block decoder."""

from mixle.data.sources.arrays.n5.source import N5ArraySource, read_n5

__all__ = ["N5ArraySource", "read_n5"]
