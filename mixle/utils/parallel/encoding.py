"""Reading and encoding one worker's shard; shared by every encoded-data backend.

Runs in worker processes, so it imports NumPy and mixle's light modules only.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mixle.data.sources.protocols import SupportsBatchRead
from mixle.utils.pickling import pickled_size

__all__ = [
    "Encoder",
    "EncoderLike",
    "build_shard",
    "dumps_for_workers",
    "encode_piece",
    "parse_encoder",
    "pickled_size",
    "reads_batches",
    "read_piece",
    "stack_records",
    "tree_nbytes",
]

#: A callable ``encoder(records) -> encoded``.
Encoder = Callable[[list[Any]], Any]
#: What ``encoder=`` accepts: ``None`` (keep the records, stacked), a callable, or an object
#: with a ``seq_encode(records)`` method.
EncoderLike = Encoder | Any | None


def parse_encoder(encoder: EncoderLike) -> Encoder | None:
    """Validate ``encoder=``; returns a callable, or ``None`` for the default (stacking)."""
    if encoder is None:
        return None
    seq_encode = getattr(encoder, "seq_encode", None)
    if callable(seq_encode):
        return seq_encode  # type: ignore[no-any-return]
    if callable(encoder):
        return encoder  # type: ignore[no-any-return]
    raise TypeError(
        f"encoder={encoder!r} must be None (keep the records), a callable "
        "encoder(records) -> encoded, or an object with a seq_encode(records) method"
    )


def _is_scalar(value: object) -> bool:
    return isinstance(value, (int, float, complex, bool, np.generic))


def stack_records(records: Sequence[Any]) -> Any:
    """Stack records leaf by leaf on a new leading axis, the way a batch is built.

    Arrays of one shape and dtype stack into one array; tuples of scalars (e.g. patch
    corners) and scalars become one array; tuples and dicts keep their structure with
    each leaf stacked. Anything else (ragged shapes, objects) stays a list. An empty
    shard gives ``[]``.
    """
    records = list(records)
    if not records:
        return []
    first = records[0]
    if isinstance(first, np.ndarray):
        if all(
            isinstance(r, np.ndarray) and r.shape == first.shape and r.dtype == first.dtype
            for r in records
        ):
            return np.stack(records)
        return records
    if _is_scalar(first) and all(_is_scalar(r) for r in records):
        return np.asarray(records)
    if isinstance(first, tuple) and all(
        isinstance(r, tuple) and len(r) == len(first) for r in records
    ):
        if all(_is_scalar(v) for r in records for v in r):
            return np.asarray(records)
        return tuple(stack_records([r[k] for r in records]) for k in range(len(first)))
    if isinstance(first, dict) and all(
        isinstance(r, dict) and r.keys() == first.keys() for r in records
    ):
        return {k: stack_records([r[k] for r in records]) for k in first}
    return records


def reads_batches(data: Any, encoder: Encoder | None) -> bool:
    """Whether shards are read with ``data.get_batch`` (default encoder, batch-capable data)."""
    return encoder is None and isinstance(data, SupportsBatchRead)


def read_piece(data: Any, indices: Sequence[int] | np.ndarray, batched: bool) -> Any:
    """Read one sub-chunk: ``data.get_batch(indices)`` when ``batched``, else the records."""
    if batched and len(indices):
        return data.get_batch(np.asarray(indices, dtype=np.int64))
    if batched:
        return []
    return [data[int(i)] for i in indices]


def encode_piece(raw: Any, encoder: Encoder | None, batched: bool) -> Any:
    """Encode what :func:`read_piece` returned (a batch read is already encoded)."""
    if batched:
        return raw
    return stack_records(raw) if encoder is None else encoder(raw)


def build_shard(
    data: Any,
    pieces: Sequence[Sequence[int] | np.ndarray] | None,
    encoder: Encoder | None,
    batched: bool,
    *,
    raw_pieces: Sequence[Any] | None = None,
) -> Any:
    """Read (unless ``raw_pieces`` were read elsewhere) and encode one worker's shard.

    Returns the encoded shard for one sub-chunk, else a list with one encoded object per
    sub-chunk. Each sub-chunk's records are dropped once encoded.
    """
    if raw_pieces is None:
        assert pieces is not None
        encoded = [encode_piece(read_piece(data, p, batched), encoder, batched) for p in pieces]
    else:
        encoded = [encode_piece(raw, encoder, batched) for raw in raw_pieces]
    return encoded[0] if len(encoded) == 1 else encoded


def tree_nbytes(obj: Any) -> int:
    """Bytes of the NumPy arrays inside ``obj`` (nested tuples, lists, dicts)."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (tuple, list)):
        return sum(tree_nbytes(v) for v in obj)
    if isinstance(obj, dict):
        return sum(tree_nbytes(v) for v in obj.values())
    return 0


def dumps_for_workers(message: Any, what: str) -> bytes:
    """Pickle ``message`` for the workers; a ``TypeError`` that names ``what`` if it cannot."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"{what} must be picklable to reach the workers ({type(exc).__name__}: {exc}); "
            "define functions at module level rather than as lambdas or closures"
        ) from exc
