"""Decoded blocks (or whole chunks) of a blosc2 ``.b2nd`` array, for the read planner.

A ``.b2nd`` array is a grid of chunks; each chunk is compressed as a sequence of *blocks*
(``array.blocks``), C-ordered within the chunk, each block a C-contiguous array of its own.
blosc2 decodes any run of blocks of a chunk without the others
(``SChunk.get_slice`` asks C-Blosc2's ``getitem`` for exactly those items), so when the
blocks tile the chunks (every chunk extent a multiple of the block's) the read planner's
unit is the block: a patch decodes only the blocks it touches, not every chunk it touches
whole. Otherwise the unit is the chunk, decoded whole and rearranged from block order.
A block decodes alone only when every filter of the array is local to the block
(:data:`BLOCK_LOCAL_FILTERS`): blosc2's ``DELTA`` filter stores every block as its
difference from block 0 of its chunk, so a block read alone would decode wrong values, and a
filter mixle does not know is treated the same way (whole chunks, always right).

python-blosc2 holds the GIL while it decodes and shares one decompression context per
array, so reads of one array run one at a time (under a lock of the reader too,
so that a build without a GIL stays correct). The source opens arrays with one blosc2
decoding thread (``dparams={"nthreads": 1}``): mixle decodes chunks in parallel on its own
pool, and blosc2's thread pool does not survive ``fork`` (a child decoding a chunk through it
waits forever). Stored bytes blosc2 cannot decode raise
:class:`~mixle.reading.CorruptChunkError` naming the file, the chunk and the block.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from mixle.reading import CorruptChunkError, new_token

__all__ = [
    "BLOCK_LOCAL_FILTERS",
    "B2ndChunkReader",
    "blocks_decode_alone",
    "blocks_tile_chunks",
    "from_block_order",
    "reads_by_block",
]

#: Codes of the blosc2 filters whose decoding of a block needs that block alone (checked
#: against ``blosc2.open(path)[...]`` for every ``blosc2.Filter``): no filter, byte and bit
#: shuffles, precision and integer truncation, the N-D cell and mean filters and BYTEDELTA
#: (its deltas run within a block). ``DELTA`` (3) is missing on purpose: its blocks are
#: differences from block 0 of their chunk.
BLOCK_LOCAL_FILTERS = frozenset({0, 1, 2, 4, 32, 33, 35, 36})


def blocks_tile_chunks(chunks: tuple[int, ...], blocks: tuple[int, ...]) -> bool:
    """Whether ``blocks`` tile ``chunks`` exactly (so blocks form one grid over the array)."""
    return all(b > 0 and c % b == 0 for c, b in zip(chunks, blocks))


def blocks_decode_alone(filters: Any) -> bool:
    """Whether every filter in ``filters`` (blosc2's ``cparams.filters``) is block-local."""
    return all(int(getattr(f, "value", f)) in BLOCK_LOCAL_FILTERS for f in filters)


def reads_by_block(array: Any) -> bool:
    """Whether the read planner's unit for the blosc2 ``NDArray`` ``array`` is the block.

    Blocks are read alone when they tile the chunks (and differ from them), the stored
    item size is the dtype's (blosc2 counts items in ``typesize`` bytes) and every filter
    is block-local (:func:`blocks_decode_alone`). :func:`mixle.inspect` says "block reads"
    by the same rule.
    """
    chunks = tuple(int(c) for c in array.chunks)
    blocks = tuple(int(b) for b in array.blocks)
    return (
        bool(array.shape)
        and blocks_tile_chunks(chunks, blocks)
        and blocks != chunks
        and int(array.schunk.typesize) == np.dtype(array.dtype).itemsize
        and blocks_decode_alone(array.schunk.cparams.filters)
    )


def from_block_order(
    raw: np.ndarray, chunks: tuple[int, ...], blocks: tuple[int, ...]
) -> np.ndarray:
    """A decoded chunk's elements (blocks one after another) as an array of shape ``chunks``.

    ``raw`` holds ``prod(ceil(chunks / blocks) * blocks)`` elements: the blocks of the
    chunk's block grid in C order, edge blocks padded to a whole block.
    """
    ndim = len(chunks)
    grid = [math.ceil(c / b) for c, b in zip(chunks, blocks)]
    padded = [g * b for g, b in zip(grid, blocks)]
    order = [axis for pair in zip(range(ndim), range(ndim, 2 * ndim)) for axis in pair]
    whole = raw.reshape(*grid, *blocks).transpose(order).reshape(padded)
    return whole[tuple(slice(0, c) for c in chunks)]


class B2ndChunkReader:
    """Blocks (when they tile the chunks) or chunks of an open blosc2 ``NDArray``.

    Parameters
    ----------
    array
        The open ``blosc2.NDArray``; its shape has no zero extent.
    where
        How errors name the file (``repr`` of its path).
    check
        Called before every read (the memory-map guard against a file cut short).

    Attributes
    ----------
    chunks
        The read planner's unit: ``array.blocks`` or ``array.chunks``.
    by_block
        Whether the unit is the block.
    """

    def __init__(self, array: Any, where: str, check: Callable[[], None]) -> None:
        # the NDArray owns the C super-chunk: its wrapper alone would let it be freed
        self._array = array
        self._schunk = array.schunk
        self._dtype = np.dtype(array.dtype)
        self._stored = tuple(int(c) for c in array.chunks)
        self._blocks = tuple(int(b) for b in array.blocks)
        shape = tuple(int(s) for s in array.shape)
        self._grid = tuple(math.ceil(s / c) for s, c in zip(shape, self._stored))
        padded = [math.ceil(c / b) * b for c, b in zip(self._stored, self._blocks)]
        self._chunk_items = math.prod(padded)
        self._block_items = math.prod(self._blocks)
        self.by_block = reads_by_block(array)
        self.chunks: tuple[int, ...] = self._blocks if self.by_block else self._stored
        self._per_chunk = tuple(c // b for c, b in zip(self._stored, self._blocks))
        self.token = new_token()
        self._where = where
        self._check = check
        self._lock = threading.Lock()

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        """Block (or chunk) ``coords`` of the planner's grid, decoded."""
        self._check()
        if self.by_block:
            return self._read_block(coords)
        nchunk = int(np.ravel_multi_index(coords, self._grid))
        nbytes = self._chunk_items * self._dtype.itemsize
        try:
            with self._lock:
                raw = self._schunk.decompress_chunk(nchunk)
            if len(raw) != nbytes:  # a header stating another size decodes "successfully"
                raise ValueError(f"decoded {len(raw)} bytes, a chunk has {nbytes}")
        except (RuntimeError, ValueError) as exc:
            raise self._corrupt(f"chunk {coords}", exc) from None
        items = np.frombuffer(raw, dtype=self._dtype)
        return from_block_order(items, self._stored, self._blocks)

    def _read_block(self, coords: tuple[int, ...]) -> np.ndarray:
        chunk = tuple(c // n for c, n in zip(coords, self._per_chunk))
        inner = tuple(c % n for c, n in zip(coords, self._per_chunk))
        nchunk = int(np.ravel_multi_index(chunk, self._grid))
        nblock = int(np.ravel_multi_index(inner, self._per_chunk))
        start = nchunk * self._chunk_items + nblock * self._block_items
        out = np.empty(self._blocks, dtype=self._dtype)
        try:
            with self._lock:
                self._schunk.get_slice(start, start + self._block_items, out)
        except (RuntimeError, ValueError) as exc:
            raise self._corrupt(f"block {inner} of chunk {chunk}", exc) from None
        return out

    def _corrupt(self, what: str, exc: Exception) -> CorruptChunkError:
        return CorruptChunkError(
            f"{what} of blosc2 array {self._where} cannot be decoded: its stored bytes are "
            f"corrupt or truncated (blosc2: {exc})"
        )
