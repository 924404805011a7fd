"""Where each record of a composed source comes from: the underlying source and its index."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Origins"]


@dataclass(frozen=True, eq=False)
class Origins:
    """Per row of a batch: which underlying source the record is from, and its index there.

    Attributes
    ----------
    names
        The underlying (leaf) sources' names, e.g. ``("web", "books")``; a source composed
        inside another is named by its path, ``"train/web"``.
    source
        Per row, the position of its source in ``names`` (int64).
    index
        Per row, the record's index in that source (int64).

    Notes
    -----
    ``origins[i]`` is the pair ``(name, index)`` of row ``i``; iterating gives the pairs in
    row order.
    """

    names: tuple[str, ...]
    source: NDArray[np.int64]
    index: NDArray[np.int64]

    def __post_init__(self) -> None:
        source = np.asarray(self.source, dtype=np.int64)
        index = np.asarray(self.index, dtype=np.int64)
        if source.shape != index.shape or source.ndim != 1:
            raise ValueError(
                f"source and index must be 1-D arrays of one length, got shapes "
                f"{source.shape} and {index.shape}"
            )
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "index", index)

    def __len__(self) -> int:
        return int(self.source.size)

    def __getitem__(self, row: int) -> tuple[str, int]:
        return self.names[int(self.source[row])], int(self.index[row])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for s, i in zip(self.source.tolist(), self.index.tolist()):
            yield self.names[s], i

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Origins):
            return NotImplemented
        return list(self) == list(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}[{i}]" for name, i in list(self)[:6])
        more = f", ... {len(self) - 6} more" if len(self) > 6 else ""
        return f"Origins({shown}{more})"
