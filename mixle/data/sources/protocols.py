"""What a source can do, as protocols; implementations live beside this module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from mixle.data.spec import ArraySpec

__all__ = ["SupportsArrayRead", "SupportsBatchRead", "SupportsRecords"]


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
