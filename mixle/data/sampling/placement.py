"""Patch placement: where patch ``i`` of a sampler sits, as a pure function of integers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import below, below_each, below_int, hash_int, mix, mix_int
from mixle.data.index_math.permutation import MAX_PERMUTATION_SIZE, permute_in_passes

__all__ = [
    "SCALAR_PATH_MAX",
    "STREAM_LOCAL_CORNERS",
    "STREAM_PATCH_CORNERS",
    "STREAM_PERMUTED_CORNERS",
    "STREAM_REGIONS",
    "grid_counts",
    "local_patch_corners",
    "patch_corners",
    "permuted_corners",
]

#: Stream tag that separates patch-corner draws from every other use of the seed.
STREAM_PATCH_CORNERS = 0x50415443  # "PATC"
#: Stream tags of locality sampling: the region of a block, and a corner inside it.
STREAM_REGIONS = 0x52454749  # "REGI"
STREAM_LOCAL_CORNERS = 0x4C4F4341  # "LOCA"
#: Stream tag of sampling without replacement: the key of each pass's permutation.
STREAM_PERMUTED_CORNERS = 0x50524D43  # "PRMC"
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
    :func:`~mixle.data.index_math.hashing.below` from the hash of
    ``(seed, stream, epoch, index, axis)`` and multiplies it by ``stride[a]``. Every grid
    position is exactly equally
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


def local_patch_corners(
    seed: int,
    indices: ArrayLike,
    shape: Sequence[int],
    patch_size: Sequence[int],
    stride: Sequence[int],
    per_region: int,
    region: Sequence[int],
    *,
    epoch: int = 0,
) -> NDArray[np.int64]:
    """Corners of patches ``indices`` when ``per_region`` consecutive patches share a region.

    The array is tiled by regions of extent ``region`` (each >= ``patch_size``). Patches
    ``i`` with the same block ``i // per_region`` share one region, drawn uniformly among all
    tiles from the hash of ``(seed, block, axis)``; each corner is then drawn uniformly
    among the stride-grid positions that keep the patch inside that region (the last, partial
    tile of an axis lets the patch reach back into its neighbour so it stays in the array).
    A pure function of ``(seed, epoch, index)``, like :func:`patch_corners`.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    out = np.empty((idx.size, len(shape)), dtype=np.int64)
    blocks = idx // per_region
    region_state = mix(np.uint64(hash_int(seed, STREAM_REGIONS, epoch)), blocks)
    corner_state = mix(np.uint64(hash_int(seed, STREAM_LOCAL_CORNERS, epoch)), idx)
    for axis, (d, p, st, r) in enumerate(zip(shape, patch_size, stride, region)):
        tiles = -(-d // r)
        tile = below(tiles, mix(region_state, axis))
        lo = np.minimum(tile * r, d - p)  # corner range that keeps the patch in the tile
        hi = np.maximum(lo, np.minimum((tile + 1) * r, d) - p)
        first = -(-lo // st)  # stride-grid positions inside [lo, hi]
        last = np.maximum(hi // st, np.minimum(first, (d - p) // st))
        first = np.minimum(first, last)
        out[:, axis] = (first + below_each(last - first + 1, mix(corner_state, axis))) * st
    return out


def permuted_corners(
    seed: int,
    indices: ArrayLike,
    counts: Sequence[int],
    stride: Sequence[int],
    *,
    epoch: int = 0,
) -> NDArray[np.int64]:
    """Corners of patches ``indices`` drawn *without* replacement from the stride grid.

    With ``G = prod(counts)`` grid positions, indices ``[k*G, (k+1)*G)`` (pass ``k``) visit
    every position exactly once, in the order of the Feistel permutation
    (:func:`~mixle.data.index_math.permutation.permute`) keyed by the hash of ``(seed, epoch, k)``.
    A pure function of ``(seed, epoch, index)``; ``counts`` and ``stride`` as in
    :func:`patch_corners`.

    Raises
    ------
    ValueError
        The grid has more than ``2**62`` positions.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    total = math.prod(int(n) for n in counts)
    if total > MAX_PERMUTATION_SIZE:
        raise ValueError(
            f"the corner grid {tuple(counts)} has {total} positions, more than a permutation "
            "takes (2**62); use a larger stride or sampling with replacement"
        )
    flat = permute_in_passes(idx, total, seed, STREAM_PERMUTED_CORNERS, epoch)
    multi = np.unravel_index(flat, tuple(int(n) for n in counts))
    out = np.empty((idx.size, len(counts)), dtype=np.int64)
    for axis, (m, st) in enumerate(zip(multi, stride)):
        out[:, axis] = m * st
    return out
