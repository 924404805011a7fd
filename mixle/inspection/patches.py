"""What a uniformly placed patch costs: chunks touched, bytes decoded, read amplification."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mixle.inspection.formatting import shape_text
from mixle.inspection.report import PatchCost
from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_PATCH_EDGE",
    "TARGET_CHUNK_BYTES",
    "PatchLike",
    "chunk_data_elements",
    "expected_chunks_along_axis",
    "fit_patch",
    "parse_patch",
    "patch_cost",
    "suggest_chunks",
]

#: Decoded size the suggested rechunking aims at (64³ float32).
TARGET_CHUNK_BYTES = 1024 * 1024
#: Patch edge the warnings use for their numbers when no ``patch`` is given.
DEFAULT_PATCH_EDGE = 32

PatchLike = int | Sequence[int]


def chunk_data_elements(
    shape: Sequence[int], chunks: Sequence[int], coords: Sequence[Sequence[int]] | np.ndarray
) -> int:
    """Array elements the chunks at grid ``coords`` hold, edge chunks without their padding.

    A chunk at grid position ``i`` along an axis of length ``d`` chunked by ``c`` holds
    ``min(c, d - i * c)`` elements along it (0 for a position past the end).
    """
    if not shape:
        return len(coords)  # a 0-d array: its one chunk holds its one element
    grid = np.asarray(coords, dtype=np.int64).reshape(-1, len(shape))
    if not grid.size:
        return 0
    sizes = np.asarray(shape, dtype=np.int64)
    edges = np.asarray(chunks, dtype=np.int64)
    held = np.clip(np.minimum(edges, sizes - grid * edges), 0, None)
    return int(np.prod(held, axis=1, dtype=np.int64).sum())


def parse_patch(patch: PatchLike | None, name: str = "patch") -> tuple[int, ...] | None:
    """Return ``patch`` as a tuple of positive ints (one int stands for every axis).

    Raises
    ------
    TypeError
        When ``patch`` is not an int or a sequence of ints.
    ValueError
        When it is empty or has an entry below 1.
    """
    if patch is None:
        return None
    if isinstance(patch, (str, bytes)):
        raise TypeError(f"{name}={patch!r} must be an int or a sequence of ints")
    values = (patch,) if not isinstance(patch, Sequence) else tuple(patch)
    edges = tuple(parse_int(v, name) for v in values)
    if not edges or min(edges) < 1:
        raise ValueError(f"{name}={patch!r} must be one or more edges, each >= 1")
    return edges


def expected_chunks_along_axis(extent: int, chunk: int, patch: int) -> float:
    """Expected chunks a patch overlaps along one axis, over all placements inside the axis.

    The patch starts at ``s`` uniform in ``0 .. extent - patch`` and overlaps chunks
    ``s // chunk`` to ``(s + patch - 1) // chunk``. The count is periodic in ``s`` with
    period ``chunk`` and sums to ``patch - 1 + chunk`` over one period, so away from the
    edges the expectation is ``(patch - 1) / chunk + 1``; the partial period at the end is
    summed exactly.

    Raises
    ------
    ValueError
        When ``chunk < 1`` or ``patch`` is not between 1 and ``extent``.
    """
    extent, chunk, patch = (
        parse_int(v, n) for v, n in ((extent, "extent"), (chunk, "chunk"), (patch, "patch"))
    )
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    if not 1 <= patch <= extent:
        raise ValueError(f"patch={patch} must be between 1 and extent={extent}")
    placements = extent - patch + 1
    periods, rest = divmod(placements, chunk)
    # the partial period: starts s < rest < chunk, so s // chunk == 0 and the count is
    # 1 + (s + patch - 1) // chunk; integer sums keep it O(1) for any chunk size
    partial = rest + _floor_sum(rest + patch - 1, chunk) - _floor_sum(patch - 1, chunk)
    return (periods * (patch - 1 + chunk) + partial) / placements


def _floor_sum(m: int, c: int) -> int:
    """``sum(t // c for t in range(m))`` in closed form."""
    q, r = divmod(m, c)
    return c * q * (q - 1) // 2 + q * r


def patch_cost(
    shape: Sequence[int],
    chunks: Sequence[int] | None,
    itemsize: int,
    patch: PatchLike,
    shards: Sequence[int] | None = None,
) -> PatchCost:
    """Expected chunks touched and bytes decoded by one uniformly placed patch.

    Placements are independent per axis, so the expected number of chunks is the product of
    :func:`expected_chunks_along_axis` over the axes. Contiguous arrays (``chunks=None``)
    are read directly: nothing is decoded beyond the patch itself.

    Parameters
    ----------
    shape
        Array shape.
    chunks
        Chunk shape (the unit of decoding), or ``None`` for an unchunked array.
    itemsize
        Bytes per element.
    patch
        Patch shape (one int for every axis); must fit inside ``shape``.
    shards
        Shard shape, to count the shards touched as well.

    Raises
    ------
    ValueError
        When ``patch`` does not match or fit ``shape``.
    """
    dims = tuple(parse_int(d, "shape") for d in shape)
    edges = fit_patch(dims, parse_patch(patch))
    if isinstance(edges, str):
        raise ValueError(edges)
    patch_bytes = math.prod(edges) * itemsize
    if chunks is None:
        return PatchCost(edges, (), None, None, patch_bytes, float(patch_bytes), 1.0)
    per_axis = tuple(expected_chunks_along_axis(d, c, p) for d, c, p in zip(dims, chunks, edges))
    touched = math.prod(per_axis)
    decoded = touched * math.prod(chunks) * itemsize
    shards_touched = None
    if shards is not None:
        shards_touched = math.prod(
            expected_chunks_along_axis(d, s, p) for d, s, p in zip(dims, shards, edges)
        )
    amplification = decoded / patch_bytes if patch_bytes else 1.0
    return PatchCost(edges, per_axis, touched, shards_touched, patch_bytes, decoded, amplification)


def fit_patch(shape: tuple[int, ...], patch: tuple[int, ...] | None) -> tuple[int, ...] | str:
    """``patch`` broadcast to ``shape``'s axes, or a sentence saying why it does not fit."""
    if not shape:
        return "a 0-d array has no patches"
    if 0 in shape:
        return f"shape {shape_text(shape)} is empty (an axis of length 0)"
    if patch is None:
        return tuple(min(DEFAULT_PATCH_EDGE, d) for d in shape)
    if len(patch) == 1:
        patch = patch * len(shape)
    if len(patch) != len(shape):
        return f"patch {shape_text(patch)} has {len(patch)} axes, the array has {len(shape)}"
    if any(p > d for p, d in zip(patch, shape)):
        return f"patch {shape_text(patch)} does not fit inside shape {shape_text(shape)}"
    return patch


def suggest_chunks(
    shape: Sequence[int], itemsize: int, target: int = TARGET_CHUNK_BYTES
) -> tuple[int, ...]:
    """A cubic chunk shape (power-of-two edge, capped by each axis) of at most ``target`` bytes.

    Falls back to edge 1 when even that is larger than ``target``.
    """
    edge = 1
    while edge < max(shape, default=1):
        bigger = tuple(min(2 * edge, d) for d in shape)
        if math.prod(bigger) * itemsize > target:
            break
        edge *= 2
    return tuple(min(edge, d) for d in shape)
