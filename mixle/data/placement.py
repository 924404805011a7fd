"""Patch placement: where patch ``i`` of a sampler sits, as a pure function of integers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.hashing import uniform_below

__all__ = ["STREAM_PATCH_CORNERS", "grid_counts", "patch_corners"]

#: Stream tag that separates patch-corner draws from every other use of the seed.
STREAM_PATCH_CORNERS = 0x50415443  # "PATC"


def grid_counts(
    shape: Sequence[int], patch_size: Sequence[int], stride: Sequence[int]
) -> tuple[int, ...]:
    """Number of in-bounds corner positions per axis on the stride grid.

    Positions along axis ``a`` are ``0, stride[a], 2*stride[a], ...`` up to
    ``shape[a] - patch_size[a]``; there are ``(shape[a] - patch_size[a]) // stride[a] + 1``.
    """
    return tuple((s - p) // st + 1 for s, p, st in zip(shape, patch_size, stride))


def patch_corners(
    seed: int,
    indices: ArrayLike,
    counts: Sequence[int],
    stride: Sequence[int],
    *,
    epoch: int = 0,
) -> NDArray[np.int64]:
    """Corners of patches ``indices``: an ``(len(indices), ndim)`` int64 array.

    Each axis draws a grid position uniformly from ``range(counts[a])`` with
    :func:`~mixle.data.hashing.uniform_below` keyed by ``(seed, stream, epoch, index,
    axis)`` and multiplies it by ``stride[a]``. Every grid position is exactly equally
    likely; the result for an index never depends on which other indices are asked for.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    out = np.empty((idx.size, len(counts)), dtype=np.int64)
    for axis, (n, st) in enumerate(zip(counts, stride)):
        out[:, axis] = uniform_below(n, seed, STREAM_PATCH_CORNERS, epoch, idx, axis)
        out[:, axis] *= st
    return out
