"""A seeded shuffle buffer: a stream's records in a random order, decided by ``(seed, epoch)``.

The buffer holds ``size`` records. Once full, the record at stream position ``t`` takes the
place of slot ``below(size, hash(seed, tag, epoch, t))``, whose record is emitted; at the
end of the stream the records left are emitted in the order of a seeded permutation. The
output is a permutation of the input and a pure function of ``(seed, epoch)`` and the
input's order: the same in every process, thread and NumPy release.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np

from mixle.data.index_math.hashing import below_int, hash_int
from mixle.data.index_math.permutation import permute

__all__ = ["SHUFFLE_BUFFER_STREAM", "shuffle_buffer"]

T = TypeVar("T")

#: Keeps the shuffle buffer's randomness apart from every other use of the seed ("SHUF").
SHUFFLE_BUFFER_STREAM = 0x53485546
_DRAIN_STREAM = 0x44524149  # "DRAI": the order the last records leave the buffer in


def shuffle_buffer(items: Iterable[T], size: int, *, seed: int, epoch: int) -> Iterator[T]:
    """``items`` in the order a ``size``-record shuffle buffer keyed by ``(seed, epoch)`` gives.

    Parameters
    ----------
    items
        The stream, read once, in order; it may be endless.
    size
        Records held (``>= 1``; ``1`` keeps the order). A record moves at most about
        ``size`` places earlier; a stream no longer than ``size`` comes out as a uniform
        seeded permutation.
    seed, epoch
        Key the slots and the final drain.

    Notes
    -----
    Memory is ``size`` records. The first record comes out after ``size + 1`` are read.
    """
    buffer: list[T] = []
    for t, item in enumerate(items):
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = below_int(size, hash_int(seed, SHUFFLE_BUFFER_STREAM, epoch, t))
        out, buffer[slot] = buffer[slot], item
        yield out
    if buffer:
        order = permute(
            np.arange(len(buffer)), len(buffer), seed=hash_int(seed, _DRAIN_STREAM), epoch=epoch
        )
        for slot in order.tolist():
            yield buffer[slot]
