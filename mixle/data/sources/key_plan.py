"""Which stored chunks a normalised N-D key touches, and where each piece goes.

:func:`read_extent` is the shape a key from :func:`~mixle.data.sources.indexing.parse_key`
selects; :func:`plan_key` turns that key into one box of a read plan
(:class:`~mixle.reading.plan.ChunkPlan`) for the read planner: every chunk holding a
selected element, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import product

import numpy as np

from mixle.data.sources.indexing import ReadItem, consecutive_runs
from mixle.reading.plan import ChunkPlan

__all__ = ["plan_key", "read_extent"]


def read_extent(read: Sequence[ReadItem]) -> tuple[int, ...]:
    """Shape of what a normalised ``read`` (``BasicKey.read``, ``RowsKey.read``) selects.

    Integer axes are kept as 1.
    """
    return tuple(
        1
        if isinstance(k, int)
        else len(range(k.start, k.stop, k.step))
        if isinstance(k, slice)
        else k.size
        for k in read
    )


def plan_key(read: Sequence[ReadItem], chunks: Sequence[int]) -> ChunkPlan:
    """The chunks a normalised key touches and what each gives, as one box of a read plan.

    Parameters
    ----------
    read
        Non-negative integers and positive-step slices inside the array
        (:attr:`BasicKey.read`), or on axis 0 sorted distinct non-negative rows
        (:attr:`RowsKey.read`).
    chunks
        Chunk extent per axis, each >= 1.

    Returns
    -------
    ChunkPlan
        Every chunk holding a selected element, once, in C order of the chunk grid; each of
        its pieces ``(0, region, inner)`` puts ``chunk[inner]`` (stepped like the key) at
        ``out[region]`` of an output of shape :func:`read_extent` (integer axes kept as 1).
        A basic key gives one piece per chunk, rows give one per run of consecutive rows.
        Chunks between strided selections that hold no selected element are left out.
    """
    per_axis = [_axis_pieces(k, n) for k, n in zip(read, chunks)]
    coords: list[tuple[int, ...]] = []
    pieces: list[list[tuple[int, tuple[slice, ...], tuple[slice, ...]]]] = []
    for combo in product(*per_axis):
        coords.append(tuple(c for c, _ in combo))
        pieces.append(
            [
                (0, tuple(r for r, _ in runs), tuple(i for _, i in runs))
                for runs in product(*(axis_runs for _, axis_runs in combo))
            ]
        )
    return ChunkPlan(coords, pieces)


def _slice_pieces(item: slice, chunk: int) -> list[tuple[int, list[tuple[slice, slice]]]]:
    """:func:`_axis_pieces` of a positive-step slice, by arithmetic: no per-element array.

    Each touched chunk ``k`` holds selected elements ``i0..i1`` (positions in the output);
    the loop runs once per touched chunk (per element when the step skips whole chunks).
    """
    start, step = item.start, item.step
    count = len(range(start, item.stop, step))
    if not count:
        return []
    last = start + (count - 1) * step
    out: list[tuple[int, list[tuple[slice, slice]]]] = []
    chunks: Iterable[int] = (
        ((start + i * step) // chunk for i in range(count))
        if step >= chunk  # one element per chunk at most: visit only the chunks it lands in
        else range(start // chunk, last // chunk + 1)  # every chunk between is touched
    )
    for k in chunks:
        i0 = -(-(max(start, k * chunk) - start) // step)  # first selected index in chunk k
        i1 = (min(last, (k + 1) * chunk - 1) - start) // step  # and the last
        lo, hi = start + i0 * step - k * chunk, start + i1 * step - k * chunk + 1
        out.append((k, [(slice(i0, i1 + 1), slice(lo, hi, step))]))
    return out


def _axis_pieces(item: ReadItem, chunk: int) -> list[tuple[int, list[tuple[slice, slice]]]]:
    """``(chunk index, [(region in the output, region in the chunk), ...])`` along one axis."""
    if isinstance(item, int):
        return [(item // chunk, [(slice(0, 1), slice(item % chunk, item % chunk + 1))])]
    if isinstance(item, slice):
        return _slice_pieces(item, chunk)
    selected = item
    if not selected.size:
        return []
    which = selected // chunk
    heads = np.flatnonzero(np.diff(which, prepend=-1)).tolist()
    tails = [*heads[1:], selected.size]
    out: list[tuple[int, list[tuple[slice, slice]]]] = []
    for head, tail in zip(heads, tails):
        k = int(which[head])
        firsts, ends = consecutive_runs(selected[head:tail] - k * chunk)
        runs, at = [], head
        for lo, hi in zip(firsts.tolist(), ends.tolist()):
            runs.append((slice(at, at + hi - lo), slice(lo, hi)))
            at += hi - lo
        out.append((k, runs))
    return out
