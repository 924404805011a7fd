"""Arrays inside ``.npz`` files: :func:`read_npz` and :class:`NpzArraySource`."""

from mixle.data.sources.arrays.npz.source import NpzArraySource, read_npz

__all__ = ["NpzArraySource", "read_npz"]
