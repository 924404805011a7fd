"""Sharding an index space: what each Loader shard and worker reads, what each worker holds.

Two callers, one module. **The Loader** (:class:`ShardLayout`, :func:`worker_batches`)
splits an epoch's global order among process shards and their workers. **Worker-resident
data** (:class:`ShardPlan`, :func:`plan_shards`, used by ``MPEncodedData`` and
``DaskEncodedData``) decides which record indices each worker process holds: round-robin,
or whole groups per worker for ``partially_exchangeable`` data. Both are pure functions of
integers (and, for grouped data, of the group keys; reading keys named by a field is the
only I/O here), and both hand out round-robin shares with :func:`round_robin`.

Loader
------
An epoch is a global order of ``n`` positions (shuffled or not; the permutation is applied
afterwards, see :mod:`mixle.data.index_math.permutation`). Batch ``t`` of every shard
together is the contiguous block ``[t B S, (t + 1) B S)`` of the global order: the union
over shards is the epoch exactly once, and the global order does not depend on ``S`` or on
how many workers read a shard. Workers take whole batches (:func:`worker_batches`). Within
a global batch:

- interleaved (default): shard ``s`` of ``S`` takes the positions ``s, s + S, s + 2 S, ...``
  and cuts them into batches of ``B``; with ``drop_last=False`` shards differ by at most one
  row per epoch.
- blocked (``blocked=True``): shard ``s`` takes rows ``[s B, (s + 1) B)`` of each global
  batch, so the shards' batches stacked in shard order are exactly the batch one process
  with batch size ``B S`` reads (what a global array assembled from processes needs).

Remainder policy (``drop_last``):

- ``False``: every position is read once; the last batch of a shard may be short and shards
  may differ by one batch.
- ``True``: the last ``n mod (B S)`` positions of the epoch's order are dropped, so every
  shard reads the same number of full batches (with shuffling, a different tail each epoch).
- ``"pad"``: the order is padded to a multiple of ``B S`` so every shard reads the same number
  of full batches; a padding position ``p >= n`` reads the record at position ``p - n``
  (wrapping again if needed) and is marked not real in the batch mask.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from mixle.data.structure import SampleStructure
from mixle.utils.validation import parse_int

__all__ = [
    "DropLast",
    "IndexSeq",
    "SHARD_LAYOUTS",
    "ShardLayout",
    "ShardPlan",
    "group_keys",
    "group_shards",
    "parse_count",
    "parse_drop_last",
    "plan_shards",
    "round_robin",
    "split_groups",
    "split_range",
    "worker_batches",
]

#: How shards may split a global batch (see the module notes).
SHARD_LAYOUTS = ("interleaved", "blocked")

DropLast = bool | Literal["pad"]


def parse_drop_last(drop_last: object) -> DropLast:
    """Validate ``drop_last``: ``False``, ``True`` or ``"pad"``."""
    if drop_last is False or drop_last is True or drop_last == "pad":
        return drop_last  # type: ignore[return-value]
    raise ValueError(f"drop_last={drop_last!r} must be False, True or 'pad'")


def _check_member(index: int, index_name: str, count: int, count_name: str) -> None:
    """Refuse ``count < 1`` and an ``index`` outside ``[0, count)``, naming both arguments."""
    if count < 1:
        raise ValueError(f"{count_name}={count} must be an int >= 1")
    if not 0 <= index < count:
        raise IndexError(
            f"{index_name}={index} is out of range for {count_name}={count}: "
            f"it must be in [0, {count - 1}]"
        )


@dataclass(frozen=True)
class ShardLayout:
    """The positions one shard reads in each epoch, batch by batch.

    Parameters
    ----------
    num_records
        ``n``, the positions in one epoch (``>= 0``).
    batch_size
        Rows per batch (``>= 1``).
    shard_index, num_shards
        This shard and how many there are: ``0 <= shard_index < num_shards``.
    drop_last
        The remainder policy: ``False``, ``True`` or ``"pad"`` (see the module notes).
    blocked
        Shards take contiguous blocks of each global batch instead of interleaved rows
        (see the module notes).

    Raises
    ------
    TypeError
        An argument that must be an int is not one.
    ValueError
        ``batch_size < 1``, ``num_shards < 1``, ``num_records < 0`` or a bad ``drop_last``.
    IndexError
        ``shard_index`` is outside ``[0, num_shards)``.
    """

    num_records: int
    batch_size: int
    shard_index: int = 0
    num_shards: int = 1
    drop_last: DropLast = False
    blocked: bool = False

    def __post_init__(self) -> None:
        n = parse_int(self.num_records, "num_records")
        batch = parse_int(self.batch_size, "batch_size")
        shards = parse_int(self.num_shards, "num_shards")
        index = parse_int(self.shard_index, "shard_index")
        if n < 0:
            raise ValueError(f"num_records={n} must be >= 0")
        if batch < 1:
            raise ValueError(f"batch_size={batch} must be an int >= 1")
        _check_member(index, "shard_index", shards, "num_shards")
        for name, value in (
            ("num_records", n),
            ("batch_size", batch),
            ("num_shards", shards),
            ("shard_index", index),
            ("drop_last", parse_drop_last(self.drop_last)),
            ("blocked", _parse_bool(self.blocked, "blocked")),
        ):
            object.__setattr__(self, name, value)

    @property
    def global_batch_size(self) -> int:
        """Rows per step over all shards: ``batch_size * num_shards``."""
        return self.batch_size * self.num_shards

    @property
    def epoch_positions(self) -> int:
        """Positions of the global order read in one epoch, padding included."""
        n, g = self.num_records, self.global_batch_size
        if self.drop_last is True:
            return n // g * g
        if self.drop_last == "pad":
            return -(-n // g) * g
        return n

    @property
    def shard_length(self) -> int:
        """Rows this shard reads per epoch, padding included."""
        total, s, shards = self.epoch_positions, self.shard_index, self.num_shards
        if self.blocked:  # B rows of every full global batch, then its block of the rest
            full, rest = divmod(total, self.global_batch_size)
            return full * self.batch_size + min(self.batch_size, max(0, rest - s * self.batch_size))
        return max(0, -(-(total - s) // shards))

    @property
    def num_batches(self) -> int:
        """Batches this shard reads per epoch."""
        return -(-self.shard_length // self.batch_size)

    def batch_rows(self, batch: int) -> int:
        """Rows of batch ``batch``: ``batch_size``, fewer for a short last batch."""
        return min(self.batch_size, self.shard_length - batch * self.batch_size)

    def positions(self, start: int, stop: int) -> NDArray[np.int64]:
        """Global positions of batches ``[start, stop)`` of this shard, concatenated.

        Positions ``>= num_records`` are padding (``drop_last="pad"`` only).
        """
        if not 0 <= start <= stop <= self.num_batches:
            raise IndexError(
                f"batches [{start}, {stop}) are outside [0, {self.num_batches}] for {self}"
            )
        lo = start * self.batch_size
        hi = min(stop * self.batch_size, self.shard_length)
        rows = np.arange(lo, hi, dtype=np.int64)
        if self.blocked:
            batch, offset = np.divmod(rows, self.batch_size)
            return batch * self.global_batch_size + self.shard_index * self.batch_size + offset
        return self.shard_index + self.num_shards * rows


def _parse_bool(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be True or False")
    return bool(value)


def worker_batches(num_batches: int, worker_index: int, num_workers: int) -> range:
    """Batches ``worker_index, worker_index + num_workers, ...`` below ``num_batches``.

    Workers take whole batches round-robin, so the batches (and their contents) do not
    depend on ``num_workers``; only who reads them does.
    """
    num_batches = parse_int(num_batches, "num_batches")
    worker_index = parse_int(worker_index, "worker_index")
    num_workers = parse_int(num_workers, "num_workers")
    _check_member(worker_index, "worker_index", num_workers, "num_workers")
    return _share(num_batches, worker_index, num_workers)


def _share(n: int, index: int, count: int) -> range:
    """Member ``index`` of ``count``'s round-robin share of ``range(n)``."""
    return range(index, max(0, n), count)


# Worker-resident data: which records each worker holds

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
    """Worker ``i`` holds ``range(i, n, num_workers)`` (the Loader's workers share batches so)."""
    return [_share(n, i, num_workers) for i in range(num_workers)]


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

    A field name reads every record in the calling process, unless ``data`` knows the
    field's values without reading (``data.field_values(by, indices)`` returns them, or
    ``None`` when it does not; a sampler over a collection knows ``"volume"``). Otherwise
    pass a callable mapping an index to its group to avoid the reads.
    """
    if callable(by):
        return [by(i) for i in range(n)]
    peek = getattr(data, "field_values", None)
    if callable(peek):
        values = peek(by, np.arange(n, dtype=np.int64))
        if values is not None:
            return list(np.asarray(values).tolist())
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
