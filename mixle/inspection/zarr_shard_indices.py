"""Sharded zarr arrays: inner chunks counted from the shard indices, damaged shards named."""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle.inspection.formatting import count_text
from mixle.inspection.patches import chunk_data_elements
from mixle.inspection.report import LayoutFinding
from mixle.reading.faults import CorruptChunkError

__all__ = ["MAX_PROBED_OBJECTS", "count_inner_chunks", "damaged_finding"]

#: Most stored objects whose size is asked for one by one (stores that cannot list, such as
#: plain HTTP) or whose shard index is read to count inner chunks.
MAX_PROBED_OBJECTS = 4096
#: Damaged shards named one by one in a ``corrupt-shard`` finding (the rest are counted).
_DAMAGED_SHOWN = 5


def count_inner_chunks(
    array: Any, shards: list[tuple[int, ...]], where: str, secrets: Any
) -> tuple[int | None, int | None, str, list[str]]:
    """``(inner chunks, array elements they hold, why not, damaged)`` for the stored ``shards``.

    Both are counted from the shard indices (edge chunks without their padding), of the
    shards whose index reads; ``damaged`` says why each other shard's index does not
    (:class:`~mixle.reading.faults.CorruptChunkError`: truncated, bad checksum).
    """
    from mixle.data.sources.arrays.zarr.shards import _EMPTY, ShardedZarrReader

    reader = ShardedZarrReader.for_array(array, where, where, secrets)
    if reader is None:
        return None, None, "codecs around the shards that mixle does not read itself", []
    if len(shards) > MAX_PROBED_OBJECTS:
        return (
            None,
            None,
            (
                f"{len(shards)} shards stored, more than MAX_PROBED_OBJECTS={MAX_PROBED_OBJECTS} "
                "indices to read"
            ),
            [],
        )
    chunks = tuple(int(c) for c in array.chunks)
    per_shard = np.asarray([s // c for s, c in zip(array.shards, chunks)], dtype=np.int64)
    written: list[np.ndarray] = []
    indices, damaged = _shard_indices(reader, shards)
    for shard, index in indices.items():
        if index is not None:
            local = np.argwhere((index[..., 0] != _EMPTY) | (index[..., 1] != _EMPTY))
            written.append(local + np.asarray(shard, dtype=np.int64) * per_shard)
    coords = np.concatenate(written) if written else np.zeros((0, len(chunks)), np.int64)
    return len(coords), chunk_data_elements(array.shape, chunks, coords), "", damaged


def _shard_indices(
    reader: Any, shards: list[tuple[int, ...]]
) -> tuple[dict[tuple[int, ...], Any], list[str]]:
    """The indices of ``shards`` that read, and why each of the others is damaged.

    All are read in one call; only when one of them is corrupt is each read on its own, to
    tell the damaged shards from the sound ones.
    """
    try:
        return reader.shard_indices(shards), []
    except CorruptChunkError:
        pass
    found: dict[tuple[int, ...], Any] = {}
    damaged: list[str] = []
    for shard in shards:
        try:
            found.update(reader.shard_indices([shard]))
        except CorruptChunkError as exc:
            damaged.append(str(exc))
    return found, damaged


def damaged_finding(damaged: list[str]) -> LayoutFinding:
    """The warning for stored shards whose index cannot be read (named, with the reason)."""
    shown = "; ".join(damaged[:_DAMAGED_SHOWN])
    more = len(damaged) - _DAMAGED_SHOWN
    rest = f"; and {more} more" if more > 0 else ""
    return LayoutFinding(
        "corrupt-shard",
        "warning",
        f"{count_text(len(damaged), 'stored shard')} cannot be read (reads of their chunks "
        "fail with CorruptChunkError; their inner chunks count as never written above): "
        f"{shown}{rest}; "
        "fix: rewrite those shards from a good copy",
    )
