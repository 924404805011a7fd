"""Patch placement: where patch ``i`` of a sampler sits, as a pure function of integers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.hashing import below, below_int, hash_int, mix, mix_int

__all__ = ["SCALAR_PATH_MAX", "STREAM_PATCH_CORNERS", "grid_counts", "patch_corners"]

#: Stream tag that separates patch-corner draws from every other use of the seed.
STREAM_PATCH_CORNERS = 0x50415443  # "PATC"
#: Up to this many indices, corners are computed with Python ints (faster for few).
SCALAR_PATH_MAX = 8


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

    Each axis draws a grid position exactly uniformly from ``range(counts[a])`` with
    :func:`~mixle.data.hashing.below` from the hash of ``(seed, stream, epoch, index, axis)``
    and multiplies it by ``stride[a]``. Every grid position is exactly equally
    likely; the result for an index never depends on which other indices are asked for.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    prefix = hash_int(seed, STREAM_PATCH_CORNERS, epoch)
    if idx.size <= SCALAR_PATH_MAX:  # same values as below, without per-call array overhead
        rows = []
        for i in idx.tolist():
            key = mix_int(prefix, i)
            rows.append(
                [
                    below_int(n, mix_int(key, a)) * st
                    for a, (n, st) in enumerate(zip(counts, stride))
                ]
            )
        return np.array(rows, dtype=np.int64).reshape(idx.size, len(counts))
    out = np.empty((idx.size, len(counts)), dtype=np.int64)
    state = mix(np.uint64(prefix), idx)
    for axis, (n, st) in enumerate(zip(counts, stride)):
        out[:, axis] = below(n, mix(state, axis))
        out[:, axis] *= st
    return out
