"""What a source can do, as protocols; implementations live beside this module."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.origins import Origins
from mixle.data.spec import ArraySpec

__all__ = [
    "SupportsArrayRead",
    "SupportsBatchRead",
    "SupportsChunkKeys",
    "SupportsOrigins",
    "SupportsRecordKeys",
    "SupportsRecords",
    "SupportsSource",
]


@runtime_checkable
class SupportsRecords(Protocol):
    """A map-style source of records."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...

    def records(self) -> Iterator[Any]: ...

    def element_spec(self) -> Any: ...


@runtime_checkable
class SupportsBatchRead(Protocol):
    """A source that reads many records in one call, stacked on a new leading axis."""

    def get_batch(self, indices: ArrayLike) -> Any: ...


@runtime_checkable
class SupportsArrayRead(Protocol):
    """An N-D array source that can read an axis-aligned box."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def read_box(self, start: ArrayLike, size: ArrayLike) -> np.ndarray: ...

    def read_boxes(
        self, starts: ArrayLike, size: ArrayLike, *, out: np.ndarray | None = None
    ) -> np.ndarray: ...

    def element_spec(self) -> ArraySpec: ...


@runtime_checkable
class SupportsSource(Protocol):
    """What a custom source implements for the Loader: a length, batched reads, a spec.

    ``get_batch(indices)`` returns the records at ``indices`` (int64, any order, repeats
    allowed) with every leaf stacked on a new leading axis; ``element_spec()`` describes
    one record (a tree of :class:`~mixle.data.spec.ArraySpec`), and the Loader checks the
    batches against it (``check_spec``). :class:`mixle.Source` is a base class that fills
    in the rest of a source's surface from these three.
    """

    def __len__(self) -> int: ...

    def get_batch(self, indices: ArrayLike) -> Any: ...

    def element_spec(self) -> Any: ...


@runtime_checkable
class SupportsRecordKeys(Protocol):
    """A source whose records have their own identity, apart from their position.

    ``record_keys(indices)`` returns one uint64 per index; the Loader keys
    ``record_transform``'s randomness on it instead of the position, so a record draws the
    same randomness wherever a composition (:func:`mixle.concat`, :func:`mixle.mix`,
    :func:`mixle.select`) puts it.
    """

    def record_keys(self, indices: ArrayLike) -> NDArray[np.uint64]: ...


@runtime_checkable
class SupportsChunkKeys(Protocol):
    """A source that can say which decoded-chunk cache entries a batch reads.

    ``chunk_keys(indices)`` lists the keys ``get_batch(indices)`` reads through the shared
    cache (``[]``: none, or it cannot say). The Loader hands the keys of its next batches to
    the cache (:meth:`mixle.reading.ChunkCache.read_ahead`), which then keeps what those
    batches need. Chunked array sources and :class:`~mixle.PatchSampler` have it.
    """

    def chunk_keys(self, indices: ArrayLike) -> list[Hashable]: ...


@runtime_checkable
class SupportsOrigins(Protocol):
    """A composed source that can say which underlying source and index each record is."""

    def origins(self, indices: ArrayLike) -> Origins: ...
