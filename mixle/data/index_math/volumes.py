"""Which volume of a collection an index means: pure functions of ``(seed, epoch, index)``.

A sampler over many volumes first picks the volume of index ``i``, then a corner inside it.
Indices come in blocks of ``per_volume`` consecutive indices that share one volume
(``block = i // per_volume``). The volume of a block is drawn

- uniformly among the volumes (:func:`uniform_volumes`), with a deterministic redraw for
  volumes that cannot hold a patch (:func:`uniform_valid_volumes`);
- with probability proportional to a weight per volume (:func:`weighted_volumes`);

or, without replacement, every position of every volume's corner grid is visited once per
pass (:func:`permuted_positions`). No I/O, O(1) memory per index beyond the O(volumes)
cumulative table.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import below, hash_int, mix, uniform01
from mixle.data.index_math.permutation import MAX_PERMUTATION_SIZE, permute_in_passes

__all__ = [
    "MAX_VOLUME_REDRAWS",
    "STREAM_VOLUMES",
    "STREAM_VOLUME_PASSES",
    "cumulative_weights",
    "group_by_volume",
    "permuted_positions",
    "uniform_valid_volumes",
    "uniform_volumes",
    "weighted_volumes",
]

#: Stream tag of the volume drawn for each block of indices.
STREAM_VOLUMES = 0x564F4C55  # "VOLU"
#: Stream tag of the permutation key of each pass without replacement.
STREAM_VOLUME_PASSES = 0x56504153  # "VPAS"
#: Redraws a block makes among all volumes before it draws among the valid ones directly.
MAX_VOLUME_REDRAWS = 64


def _block_state(seed: int, indices: ArrayLike, per_volume: int, epoch: int) -> NDArray[np.uint64]:
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    return mix(np.uint64(hash_int(seed, STREAM_VOLUMES, epoch)), idx // per_volume)


def uniform_volumes(
    seed: int, indices: ArrayLike, count: int, per_volume: int = 1, *, epoch: int = 0
) -> NDArray[np.int64]:
    """Volume of each index, exactly uniform in ``[0, count)``, shared by blocks of indices.

    Indices ``i`` with the same ``i // per_volume`` get the same volume; a pure function of
    ``(seed, epoch, i // per_volume)``.
    """
    return below(count, _block_state(seed, indices, per_volume, epoch))


def uniform_valid_volumes(
    seed: int,
    indices: ArrayLike,
    count: int,
    valid: Callable[[NDArray[np.int64]], NDArray[np.bool_]],
    per_volume: int = 1,
    *,
    epoch: int = 0,
    all_valid: Callable[[], NDArray[np.int64]] | None = None,
) -> NDArray[np.int64]:
    """:func:`uniform_volumes`, redrawn where ``valid(volumes)`` is ``False``.

    Each block tries ``uniform_volumes`` and then up to :data:`MAX_VOLUME_REDRAWS` redraws
    (``mix(state, attempt)``) until it lands on a valid volume, so every valid volume is
    exactly equally likely and ``valid`` is only asked about the volumes drawn (reading a
    volume's shape is left to it). A block still without one after that draws uniformly
    among ``all_valid()`` (the sorted valid volumes, which may read every shape); an empty
    result there raises ``ValueError``. Redrawing keeps each block's volume a pure
    function of ``(seed, epoch, block)`` and the set of valid volumes.
    """
    state = _block_state(seed, indices, per_volume, epoch)
    out = below(count, state)
    bad = np.flatnonzero(~valid(out))
    attempt = 1
    while bad.size and attempt <= MAX_VOLUME_REDRAWS:
        out[bad] = below(count, mix(state[bad], attempt))
        bad = bad[~valid(out[bad])]
        attempt += 1
    if bad.size:
        choices = np.asarray([] if all_valid is None else all_valid(), dtype=np.int64)
        if not choices.size:
            raise ValueError("no volume of the collection can hold a patch")
        out[bad] = choices[below(choices.size, mix(state[bad], attempt))]
    return out


def cumulative_weights(weights: ArrayLike, name: str = "volume_weights") -> NDArray[np.float64]:
    """Running sum of per-volume ``weights`` (finite, ``>= 0``, not all zero), as float64.

    Raises
    ------
    ValueError
        A weight is negative, not finite, or every weight is zero; the message names
        ``name`` and the first offending volume.
    """
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        v = int(bad[0])
        raise ValueError(
            f"{name} must be finite and >= 0 for every volume; volume {v} has {float(w[v])!r}"
        )
    if not w.size or not w.any():
        raise ValueError(f"{name} are all zero: no volume could be drawn")
    return np.cumsum(w)


def weighted_volumes(
    seed: int,
    indices: ArrayLike,
    cumulative: NDArray[np.float64],
    per_volume: int = 1,
    *,
    epoch: int = 0,
) -> NDArray[np.int64]:
    """Volume of each index, drawn with probability ``weight[v] / sum(weights)``.

    ``cumulative`` is :func:`cumulative_weights`' output. Inverse CDF on a 53-bit uniform
    float of the block's hash; a volume of weight 0 is never drawn (rounding at the top is
    clamped to the last volume of positive weight).
    """
    state = _block_state(seed, indices, per_volume, epoch)
    total = float(cumulative[-1])
    picks = np.searchsorted(cumulative, uniform01(mix(state, 0)) * total, side="right")
    last = int(np.flatnonzero(np.diff(cumulative, prepend=0.0) > 0)[-1])
    return np.minimum(picks, last).astype(np.int64)


def permuted_positions(
    seed: int, indices: ArrayLike, cumulative: NDArray[np.int64], *, epoch: int = 0
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(volume, position)`` of each index when every grid position is visited once per pass.

    ``cumulative[v]`` is the number of corner positions of volumes ``0..v`` (an int64
    running sum). With ``G = cumulative[-1]``, indices ``[k*G, (k+1)*G)`` (pass ``k``) are
    the Feistel permutation keyed by ``(seed, epoch, k)`` of ``range(G)``; a permuted value
    ``p`` is position ``p - cumulative[v-1]`` of the volume ``v`` it falls in. Every
    position of every volume appears exactly once per pass.

    Raises
    ------
    ValueError
        No positions at all, or more than ``2**62``.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    total = int(cumulative[-1]) if len(cumulative) else 0
    if total < 1:
        raise ValueError("no volume of the collection has a corner position")
    if total > MAX_PERMUTATION_SIZE:
        raise ValueError(
            f"the volumes have {total} corner positions in all, more than a permutation "
            "takes (2**62); use a larger stride or sampling with replacement"
        )
    flat = permute_in_passes(idx, total, seed, STREAM_VOLUME_PASSES, epoch)
    volume = np.searchsorted(cumulative, flat, side="right").astype(np.int64)
    before = np.where(volume > 0, cumulative[np.maximum(volume - 1, 0)], 0)
    return volume, flat - before


def group_by_volume(volumes: ArrayLike) -> list[NDArray[np.intp]]:
    """Positions of each distinct volume in ``volumes``, one ascending array per volume.

    Largest group first (ties: lowest volume), so a caller reading groups in parallel can
    read the biggest itself. O(n log n), one stable sort.
    """
    vols = np.asarray(volumes, dtype=np.int64).reshape(-1)
    if not vols.size:
        return []
    order = np.argsort(vols, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(vols[order])) + 1)
    groups.sort(key=len, reverse=True)  # stable: equal sizes stay in volume order
    return groups
