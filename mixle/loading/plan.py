"""What each batch of a Loader run reads: record indices, padding mask, record randomness.

Pure functions of the shard layout and ``(seed, epoch, batch)``; no I/O. The Loader walks
:func:`batch_plans` and reads each :class:`BatchPlan`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.elastic import Remainder, Resume, span_of
from mixle.data.index_math.hashing import hash_int, parse_seed
from mixle.data.index_math.permutation import inverse_permute, permute
from mixle.data.index_math.sharding import ShardLayout

__all__ = [
    "INDEX_WINDOW_ROWS",
    "BatchPlan",
    "batch_plans",
    "batch_rng",
    "permute_blocks",
    "record_rng",
    "window",
]

#: Record indices are computed this many rows at a time, vectorised, then sliced per batch.
INDEX_WINDOW_ROWS = 8192
_TRANSFORM_STREAM = 0x52454354  # "RECT": keeps record randomness apart from shuffles
_BATCH_STREAM = 0x42415443  # "BATC": a batch transform's randomness, apart from records'


def record_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator a record transform gets for record ``index`` in ``epoch``.

    A Philox generator keyed by the hash of ``(seed, epoch, index)``: the same for a record
    whatever its position in the stream, the shard or the thread that reads it.
    """
    key = hash_int(parse_seed(seed), _TRANSFORM_STREAM, int(epoch), int(index))
    return np.random.Generator(np.random.Philox(key=key))


def batch_rng(seed: int, epoch: int, batch: int, shard_index: int = 0) -> np.random.Generator:
    """The random generator a two-argument ``transform(batch, rng)`` gets for a batch.

    A Philox generator keyed by the hash of ``(seed, epoch, batch, shard_index)``, where
    ``batch`` is the batch's number in the epoch on its shard: the same whatever the
    thread or worker process that reads it. Each shard gets its own stream, so shards
    reading their batch ``t`` side by side do not draw the same augmentation.
    """
    key = hash_int(parse_seed(seed), _BATCH_STREAM, int(epoch), int(batch), int(shard_index))
    return np.random.Generator(np.random.Philox(key=key))


@dataclass(frozen=True)
class BatchPlan:
    """What one batch reads: its epoch, number, record indices and padding mask.

    ``first`` marks the first batch of an epoch or of a run (where ``check_spec="first"``
    checks the source's batch against its ``element_spec()``), ``last`` the last batch of
    its epoch on this shard.
    """

    epoch: int
    batch: int
    indices: NDArray[np.int64]
    mask: NDArray[np.bool_] | None
    first: bool = False
    last: bool = False


def permute_blocks(
    positions: NDArray[np.int64], n: int, block: int, *, seed: int, epoch: int
) -> NDArray[np.int64]:
    """The records at ``positions`` of epoch ``epoch``'s order of ``[0, n)`` in blocks.

    Records ``[b * block, (b + 1) * block)`` form block ``b``; when ``block`` does not
    divide ``n`` the last block is short (the ``n % block`` records left). The blocks come
    in the seeded order :func:`~mixle.data.index_math.permutation.permute` gives for their
    count, and each block is read whole, in its own order, where it lands. The short block
    moves like the others rather than staying at the end, where ``drop_last=True`` would
    drop it every epoch. ``block == 1`` is ``permute`` itself; ``block >= n`` is one block,
    the identity.

    Notes
    -----
    A bijection of ``[0, n)`` for every ``n`` and ``block``, a pure function of
    ``(seed, epoch, n, block, position)`` in O(1) memory, like ``permute``: if the short
    block lands in slot ``j``, positions before ``j * block`` read full blocks as usual,
    the ``n % block`` positions from there read the short block, and later positions read
    full blocks shifted by the gap the short block leaves.
    """
    if block == 1:
        return permute(positions, n, seed=seed, epoch=epoch)
    positions = np.asarray(positions, dtype=np.int64)
    if block >= n:
        return positions.copy()
    full, tail = divmod(n, block)
    if not tail:
        slots, offsets = np.divmod(positions, block)
        return permute(slots, full, seed=seed, epoch=epoch) * block + offsets
    start = int(inverse_permute(full, full + 1, seed=seed, epoch=epoch)) * block
    end = start + tail
    short = (positions >= start) & (positions < end)
    gapless = np.where(positions >= end, positions + (block - tail), positions)
    slots, offsets = np.divmod(gapless, block)
    records = permute(slots, full + 1, seed=seed, epoch=epoch) * block + offsets
    records[short] = full * block + (positions[short] - start)
    return records


def window(
    layout: ShardLayout,
    epoch: int,
    start: int,
    stop: int,
    *,
    shuffle: bool,
    seed: int,
    shuffle_block: int = 1,
    remainder: Remainder | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None]:
    """Record indices and padding mask of batches ``[start, stop)`` of ``epoch``.

    The mask (``drop_last="pad"`` only, else ``None``) marks the real rows; padding rows
    read the record at their position modulo ``num_records``. With ``shuffle``, blocks of
    ``shuffle_block`` consecutive records move as units (:func:`permute_blocks`). With a
    ``remainder`` (an epoch a resumed run continues,
    :mod:`mixle.data.index_math.elastic`), ``[start, stop)`` are batches of this shard's
    part of it, counted from 0.
    """
    if remainder is None:
        positions = layout.positions(start, stop)
    else:
        positions = remainder.shard_positions(layout, start, stop)
    n = layout.num_records
    mask = None
    if layout.drop_last == "pad":
        mask = positions < n
        positions = positions % n
    if shuffle and positions.size:
        positions = permute_blocks(positions, n, shuffle_block, seed=seed, epoch=epoch)
    return positions, mask


def batch_plans(
    layout: ShardLayout,
    epoch: int,
    batch: int,
    *,
    shuffle: bool,
    seed: int,
    num_epochs: int | None,
    shuffle_block: int = 1,
    resume: Resume | None = None,
) -> Iterator[BatchPlan]:
    """Plans from batch ``batch`` of ``epoch`` to the end of ``num_epochs`` (``None``: endless).

    Indices are computed :data:`INDEX_WINDOW_ROWS` rows at a time. A layout with no batches
    yields nothing. The first plan, and the first batch of each epoch, are marked
    ``first``, the last batch of each epoch ``last``. The epochs a ``resume`` covers read
    their remainder (:func:`mixle.data.index_math.elastic.span_of`), their batches
    numbered from its first batch.
    """
    if layout.num_batches == 0:
        return
    first = True
    step = max(1, INDEX_WINDOW_ROWS // layout.batch_size)
    while num_epochs is None or epoch < num_epochs:
        remainder, offset, end = span_of(layout, resume, epoch)
        span = layout if remainder is None else remainder.shard_layout(layout)
        for start in range(batch, end, step):
            stop = min(end, start + step)
            indices, mask = window(
                layout,
                epoch,
                start - offset,
                stop - offset,
                shuffle=shuffle,
                seed=seed,
                shuffle_block=shuffle_block,
                remainder=remainder,
            )
            row = 0
            for b in range(start, stop):
                rows = span.batch_rows(b - offset)
                part = None if mask is None else mask[row : row + rows].copy()
                yield BatchPlan(
                    epoch, b, indices[row : row + rows], part, first or b == offset, b == end - 1
                )
                first, row = False, row + rows
        epoch, batch = epoch + 1, 0
