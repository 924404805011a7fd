"""Which record indices each worker holds: round-robin, or whole groups per worker.

Pure functions of integers (and, for grouped data, of the group keys); no I/O except
reading group keys named by a field.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.structure import SampleStructure
from mixle.utils.validation import parse_int

__all__ = [
    "IndexSeq",
    "ShardPlan",
    "group_keys",
    "group_shards",
    "parse_count",
    "plan_shards",
    "round_robin",
    "split_groups",
    "split_range",
]

#: The indices of one sub-chunk: a ``range`` for round-robin shards (pickles in a few
#: bytes), an int64 array for grouped shards.
IndexSeq = range | NDArray[np.int64]


def parse_count(value: object, name: str) -> int:
    """Validate a positive count such as ``num_workers`` or ``sub_chunks``."""
    count = parse_int(value, name)
    if count < 1:
        raise ValueError(f"{name}={value!r} must be >= 1")
    return count


def round_robin(n: int, num_workers: int) -> list[range]:
    """Worker ``i`` holds ``range(i, n, num_workers)``."""
    return [range(i, n, num_workers) for i in range(num_workers)]


def split_range(indices: range, parts: int) -> list[range]:
    """Split ``indices`` into ``parts`` contiguous pieces whose lengths differ by at most one."""
    size, extra = divmod(len(indices), parts)
    out, lo = [], 0
    for p in range(parts):
        hi = lo + size + (p < extra)
        out.append(indices[lo:hi])
        lo = hi
    return out


def group_keys(data: Any, by: str | Callable[[int], Hashable], n: int) -> list[Hashable]:
    """The group key of every index: ``by(i)``, or field ``by`` of record ``i``.

    A field name reads every record in the calling process; pass a callable mapping an
    index to its group to avoid that.
    """
    if callable(by):
        return [by(i) for i in range(n)]
    keys = []
    for i in range(n):
        record = data[i]
        try:
            keys.append(record[by])
        except (KeyError, IndexError, TypeError) as exc:
            raise KeyError(
                f"partially_exchangeable(by={by!r}): record {i} has no field {by!r} "
                f"({type(exc).__name__}: {exc}); use records that are mappings with that "
                "field, or a callable by(index) -> group"
            ) from None
    return keys


def group_shards(keys: Sequence[Hashable], num_workers: int) -> list[list[NDArray[np.int64]]]:
    """Assign whole groups to workers, balancing record counts.

    Groups are taken largest first (ties: earliest first index) and each goes to the
    worker holding the fewest records so far (ties: lowest worker). Returns, per worker,
    its groups as ascending index arrays, ordered by their first index. Deterministic.
    """
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        try:
            members.setdefault(key, []).append(i)
        except TypeError:
            raise TypeError(
                f"group key {key!r} of record {i} is not hashable; partially_exchangeable "
                "needs hashable group keys (str, int, tuple...)"
            ) from None
    groups = [np.asarray(idx, dtype=np.int64) for idx in members.values()]
    order = sorted(range(len(groups)), key=lambda g: (-groups[g].size, int(groups[g][0])))
    loads = [0] * num_workers
    held: list[list[NDArray[np.int64]]] = [[] for _ in range(num_workers)]
    for g in order:
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        held[worker].append(groups[g])
        loads[worker] += groups[g].size
    for worker_groups in held:
        worker_groups.sort(key=lambda idx: int(idx[0]))
    return held


def split_groups(groups: Sequence[NDArray[np.int64]], parts: int) -> list[NDArray[np.int64]]:
    """Cut a worker's groups into ``parts`` pieces at group boundaries, near-equal in records."""
    sizes = np.fromiter((g.size for g in groups), dtype=np.int64, count=len(groups))
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if ends.size else 0
    # piece p takes the groups whose cumulative end lies in (total*p/parts, total*(p+1)/parts]
    cuts = np.searchsorted(ends, [total * p / parts for p in range(1, parts)], side="right")
    bounds = [0, *cuts.tolist(), len(groups)]
    empty = np.empty(0, dtype=np.int64)
    return [
        np.concatenate(groups[lo:hi]) if hi > lo else empty for lo, hi in itertools.pairwise(bounds)
    ]


@dataclass(frozen=True)
class ShardPlan:
    """The indices each worker holds, cut into sub-chunks.

    Attributes
    ----------
    length
        Number of records sharded (``len(data)``).
    pieces
        ``pieces[w][c]``: the indices of sub-chunk ``c`` of worker ``w``.
    """

    length: int
    pieces: tuple[tuple[IndexSeq, ...], ...]

    @property
    def num_workers(self) -> int:
        """Number of shards."""
        return len(self.pieces)

    def shard_indices(self, worker: int) -> NDArray[np.int64]:
        """The indices worker ``worker`` holds, in the order its shard keeps them."""
        w = parse_int(worker, "worker")
        if not 0 <= w < self.num_workers:
            raise IndexError(f"worker={worker} is out of range for {self.num_workers} workers")
        parts = [np.asarray(p, dtype=np.int64) for p in self.pieces[w]]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def plan_shards(data: Any, n: int, num_workers: int, sub_chunks: int = 1) -> ShardPlan:
    """Shard ``range(n)`` over ``num_workers``: whole groups per worker when ``data`` has a
    ``partially_exchangeable`` structure, round-robin otherwise."""
    structure = getattr(data, "structure", None)
    pieces: tuple[tuple[IndexSeq, ...], ...]
    if isinstance(structure, SampleStructure) and structure.grouped:
        assert structure.by is not None
        per_worker = group_shards(group_keys(data, structure.by, n), num_workers)
        pieces = tuple(tuple(split_groups(groups, sub_chunks)) for groups in per_worker)
    else:
        pieces = tuple(tuple(split_range(r, sub_chunks)) for r in round_robin(n, num_workers))
    return ShardPlan(n, pieces)
