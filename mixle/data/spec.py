"""Per-record shape and dtype, reported from metadata without reading data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ArraySpec"]


@dataclass(frozen=True)
class ArraySpec:
    """The shape and dtype of one array leaf of a record."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes of one leaf of this spec."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"ArraySpec(shape={self.shape}, dtype={self.dtype})"
