"""blosc2 ``.b2nd`` arrays: :func:`read_b2nd` and :class:`B2ndArraySource`."""

from mixle.data.sources.arrays.b2nd.source import B2ndArraySource, read_b2nd

__all__ = ["B2ndArraySource", "read_b2nd"]
