"""A small base class for a source a user writes: three methods, the rest filled in.

A custom source implements :class:`~mixle.data.sources.protocols.SupportsSource`:
``__len__``, ``get_batch(indices)`` (the records stacked on a new leading axis) and
``element_spec()`` (one record's shapes and dtypes). :class:`Source` adds what the Loader,
the combinators and users expect of every mixle source: ``src[i]``, ``src[a:b]``,
``records()``, iteration, ``close()``, ``closed`` and a context manager.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.batches import unstack_batch
from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.spec import SpecTree

__all__ = ["RECORDS_BLOCK", "Source"]

#: Records per ``get_batch`` call when :meth:`Source.records` walks a source.
RECORDS_BLOCK = 256


class Source(abc.ABC):
    """Base class of a custom source: implement ``__len__``, ``get_batch`` and
    ``element_spec``.

    Notes
    -----
    - ``get_batch(indices)`` receives non-negative int64 indices in any order, repeats
      allowed, and returns the records in that order, every leaf stacked on a new leading
      axis (NumPy arrays in tuples, lists or dicts).
    - ``element_spec()`` describes one record as a tree of :class:`mixle.ArraySpec`; the
      Loader checks the batches against it (``Loader(check_spec=...)``), so a source that
      breaks its declaration fails at the batch, naming the field.
    - Optionally ``record_keys(indices) -> uint64 array`` gives records an identity apart
      from their position (see :class:`~mixle.data.sources.protocols.SupportsRecordKeys`).
    - A source that process workers read must pickle; keep it small (paths and options,
      not data), and open files lazily so a copy opens its own.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Records in the source."""

    @abc.abstractmethod
    def get_batch(self, indices: ArrayLike) -> Any:
        """The records at ``indices``, every leaf stacked on a new leading axis."""

    @abc.abstractmethod
    def element_spec(self) -> SpecTree:
        """Shapes and dtypes of one record."""

    _closed = False

    def _indices(self, indices: ArrayLike) -> NDArray[np.int64]:
        return parse_indices(indices, len(self))

    def __getitem__(self, index: Any) -> Any:
        """Record ``index`` (an int, negative from the end), or a batch for a slice."""
        if isinstance(index, slice):
            return self.get_batch(np.arange(*index.indices(len(self)), dtype=np.int64))
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(
                f"index={index!r} must be an int or a slice; use get_batch(indices) for "
                "many records"
            )
        row = self._indices([index])
        return unstack_batch(self.get_batch(row), 1)[0]

    def records(self) -> Iterator[Any]:
        """Every record in order, read :data:`RECORDS_BLOCK` at a time."""
        n = len(self)
        for start in range(0, n, RECORDS_BLOCK):
            rows = np.arange(start, min(n, start + RECORDS_BLOCK), dtype=np.int64)
            yield from unstack_batch(self.get_batch(rows), rows.size)

    def __iter__(self) -> Iterator[Any]:
        return self.records()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Mark the source closed (a subclass that holds files closes them here too)."""
        self._closed = True

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            size = f"{len(self)} records"
        except Exception as exc:  # a repr never raises
            size = f"length unknown: {type(exc).__name__}"
        return f"{type(self).__name__}({size})"
