"""Decoded blocks (or whole chunks) of a blosc2 ``.b2nd`` array, for the read planner.

A ``.b2nd`` array is a grid of chunks; each chunk is compressed as a sequence of *blocks*
(``array.blocks``), C-ordered within the chunk, each block a C-contiguous array of its own.
blosc2 decodes any run of blocks of a chunk without the others
(``SChunk.get_slice`` asks C-Blosc2's ``getitem`` for exactly those items), so when the
blocks tile the chunks (every chunk extent a multiple of the block's) the read planner's
unit is the block: a patch decodes only the blocks it touches, not every chunk it touches
whole. Otherwise the unit is the chunk, decoded whole and rearranged from block order.
Small blocks (under :data:`MIN_BLOCK_BYTES`) of chunks that decode to at most
:data:`WHOLE_CHUNK_BYTES` are not read alone: a block read alone costs a Python call, a
cache entry and a scatter of its own, which a small block does not repay. The two
thresholds were chosen from a few layouts tried while building this reader; the committed
measurement is ``benchmarks/patch_read.py --only b2nd`` (128 KiB blocks, read alone).
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
from typing import Any

import numpy as np

from mixle.reading import CorruptChunkError, new_token

__all__ = [
    "BLOCK_LOCAL_FILTERS",
    "MIN_BLOCK_BYTES",
    "WHOLE_CHUNK_BYTES",
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
#: Blocks that decode to fewer bytes are read as part of their whole chunk when the chunk
#: decodes to at most :data:`WHOLE_CHUNK_BYTES` (see the module's notes).
MIN_BLOCK_BYTES = 64 << 10
#: Chunks decoding to more bytes are read by block whatever their blocks' size.
WHOLE_CHUNK_BYTES = 4 << 20


def blocks_tile_chunks(chunks: tuple[int, ...], blocks: tuple[int, ...]) -> bool:
    """Whether ``blocks`` tile ``chunks`` exactly (so blocks form one grid over the array)."""
    return all(b > 0 and c % b == 0 for c, b in zip(chunks, blocks))


def blocks_decode_alone(filters: Any) -> bool:
    """Whether every filter in ``filters`` (blosc2's ``cparams.filters``) is block-local."""
    return all(int(getattr(f, "value", f)) in BLOCK_LOCAL_FILTERS for f in filters)


def reads_by_block(array: Any) -> bool:
    """Whether the read planner's unit for the blosc2 ``NDArray`` ``array`` is the block.

    Blocks are read alone when they are large enough (at least :data:`MIN_BLOCK_BYTES`,
    or their chunk over :data:`WHOLE_CHUNK_BYTES`), tile the chunks (and differ from them),
    the stored item size is the dtype's (blosc2 counts items in ``typesize`` bytes) and
    every filter is block-local (:func:`blocks_decode_alone`). :func:`mixle.inspect` says
    "block reads" by the same rule.
    """
    chunks = tuple(int(c) for c in array.chunks)
    blocks = tuple(int(b) for b in array.blocks)
    itemsize = np.dtype(array.dtype).itemsize
    return (
        bool(array.shape)
        and not _small_blocks(chunks, blocks, itemsize)
        and blocks_tile_chunks(chunks, blocks)
        and blocks != chunks
        and int(array.schunk.typesize) == np.dtype(array.dtype).itemsize
        and blocks_decode_alone(array.schunk.cparams.filters)
    )


def _small_blocks(chunks: tuple[int, ...], blocks: tuple[int, ...], itemsize: int) -> bool:
    """Whether blocks are too small to read alone from chunks small enough to read whole."""
    return (
        math.prod(blocks) * itemsize < MIN_BLOCK_BYTES
        and math.prod(chunks) * itemsize <= WHOLE_CHUNK_BYTES
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

    Attributes
    ----------
    chunks
        The read planner's unit: ``array.blocks`` or ``array.chunks``.
    by_block
        Whether the unit is the block.

    Notes
    -----
    The reader does not check the memory-mapped file: its source checks it once per read
    call, before the planner asks for any chunk. python-blosc2 holds the GIL while it
    decodes, so one decode thread reads from it at a time (``max_decode_threads``): two
    only take turns, and lose to it (measured in ``benchmarks/patch_read.py``).
    """

    #: Decode threads the read planner runs on this reader at once (see above).
    max_decode_threads = 1

    def __init__(self, array: Any, where: str) -> None:
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
        self._chunk_strides = _c_strides(self._grid)
        self._block_strides = _c_strides(self._per_chunk)
        self.token = new_token()
        self._where = where
        self._lock = threading.Lock()

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        """Block (or chunk) ``coords`` of the planner's grid, decoded."""
        if self.by_block:
            return self._read_block(coords)
        nchunk = sum(c * s for c, s in zip(coords, self._chunk_strides))
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
        nchunk = nblock = 0
        for c, n, cs, bs in zip(coords, self._per_chunk, self._chunk_strides, self._block_strides):
            nchunk += (c // n) * cs
            nblock += (c % n) * bs
        start = nchunk * self._chunk_items + nblock * self._block_items
        out = np.empty(self._blocks, dtype=self._dtype)
        try:
            with self._lock:
                self._schunk.get_slice(start, start + self._block_items, out)
        except (RuntimeError, ValueError) as exc:
            chunk = tuple(c // n for c, n in zip(coords, self._per_chunk))
            inner = tuple(c % n for c, n in zip(coords, self._per_chunk))
            raise self._corrupt(f"block {inner} of chunk {chunk}", exc) from None
        return out

    def _corrupt(self, what: str, exc: Exception) -> CorruptChunkError:
        return CorruptChunkError(
            f"{what} of blosc2 array {self._where} cannot be decoded: its stored bytes are "
            f"corrupt or truncated (blosc2: {exc})"
        )


def _c_strides(grid: tuple[int, ...]) -> tuple[int, ...]:
    """Steps of each axis in the C-order numbering of a grid of extents ``grid``."""
    strides, step = [], 1
    for n in reversed(grid):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
