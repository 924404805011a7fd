"""N5 datasets: the source, its ``attributes.json`` parser and its block decoder."""

from mixle.data.sources.arrays.n5.source import N5ArraySource, read_n5

__all__ = ["N5ArraySource", "read_n5"]
