"""The block index of a weight map or label volume, and the draw of a voxel from it.

:class:`BlockIndex` reads the map once, block by block (whole stored chunks grown to
:data:`INDEX_BLOCK_VOXELS`), keeping per-block totals; :meth:`BlockIndex.draw` turns counter
hashes into voxels by inverse CDF over the blocks, then inside one block (whose detail is
kept in one byte-budgeted cache shared by every map of the process,
:data:`BLOCK_CACHE_BYTES`, so a sampler over many volumes, one map each, stays bounded).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.hashing import below_each, mix, uniform01
from mixle.data.sources.arrays.base import ArraySource
from mixle.errors import NothingToSampleError
from mixle.utils.progress import progress_bar

__all__ = [
    "BLOCK_CACHE_BYTES",
    "INDEX_BLOCK_VOXELS",
    "BlockIndex",
    "index_block_shape",
    "uniform01",
]

#: Index blocks are whole stored chunks grown to at least this many voxels.
INDEX_BLOCK_VOXELS = 1 << 18
#: Byte budget of the per-block detail (cumulative weights or class positions) kept, for
#: all maps of the process together.
BLOCK_CACHE_BYTES = 64 * 1024 * 1024


class _SharedDetails:
    """The process-wide LRU of block details, keyed by ``(map token, block)``.

    A map that is garbage collected only queues its token (:meth:`forget`, no lock: the
    collection may run inside :meth:`put` on the same thread); its blocks go at the next
    :meth:`get` or :meth:`put`.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: OrderedDict[tuple[int, int], tuple[Any, int]] = OrderedDict()
        self.by_token: dict[int, set[int]] = {}
        self.bytes = 0
        self.tokens = itertools.count()
        self.gone: deque[int] = deque()

    def get(self, key: tuple[int, int]) -> Any:
        with self.lock:
            self._drop_gone()
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key][0]
        return None

    def put(self, key: tuple[int, int], detail: Any) -> Any:
        """Keep ``detail`` (or return the one another thread kept first), evicting the oldest."""
        size = _nbytes(detail)  # before the lock: nothing allocates while it is held
        with self.lock:
            self._drop_gone()
            if key in self.entries:  # another thread built it meanwhile: count its bytes once
                self.entries.move_to_end(key)
                return self.entries[key][0]
            self.entries[key] = (detail, size)
            self.by_token.setdefault(key[0], set()).add(key[1])
            self.bytes += size
            while self.bytes > BLOCK_CACHE_BYTES and len(self.entries) > 1:
                self._pop(next(iter(self.entries)))
        return detail

    def forget(self, token: int) -> None:
        """Queue the blocks of map ``token`` for dropping (it is being garbage collected)."""
        self.gone.append(token)

    def _pop(self, key: tuple[int, int]) -> None:
        self.bytes -= self.entries.pop(key)[1]
        blocks = self.by_token.get(key[0])
        if blocks is not None:
            blocks.discard(key[1])
            if not blocks:
                del self.by_token[key[0]]

    def _drop_gone(self) -> None:
        while self.gone:
            token = self.gone.popleft()
            for b in list(self.by_token.get(token, ())):
                self._pop((token, b))


_details = _SharedDetails()


def _drop_details(token: int) -> None:
    _details.forget(token)


def _reset_after_fork() -> None:  # a parent thread may have held the lock at the fork
    global _details
    tokens = _details.tokens  # keep counting: maps made before the fork keep their tokens
    _details = _SharedDetails()
    _details.tokens = tokens


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
_HANG_OVER = (
    "With padding='none' a patch must fit inside the volume; pass padding='constant' (or "
    "'reflect' or 'edge') to let patches hang over the edge, or use a smaller patch_size"
)


def index_block_shape(shape: Sequence[int], chunks: Sequence[int] | None) -> tuple[int, ...]:
    """Blocks the index is built from: whole chunks, grown to :data:`INDEX_BLOCK_VOXELS`.

    Unchunked maps use runs of whole trailing rows (contiguous in C order) of about that size.
    """
    block = [max(1, min(c, d)) for c, d in zip(chunks or [1] * len(shape), shape)]
    for a in reversed(range(len(shape))):
        have = math.prod(block)
        if have >= INDEX_BLOCK_VOXELS:
            break
        block[a] = min(shape[a], block[a] * -(-INDEX_BLOCK_VOXELS // have))
    return tuple(block)


def _nbytes(detail: Any) -> int:
    return int(detail.nbytes) if isinstance(detail, np.ndarray) else sum(d.nbytes for d in detail)


class BlockIndex:
    """Per-block totals of a weight map or per-class voxel counts of a label volume.

    Parameters
    ----------
    source
        The map, an :class:`ArraySource` (read one block at a time).
    lo, hi
        The box of voxels that may be drawn (others count as weight 0).
    classes
        Label values to count, or ``None`` for a weight map.
    name
        How errors call the map (``"weights"`` or ``"labels"``).
    required
        One flag per class: whether it must occur in the box (default: every class).
        Classes that are never drawn (probability 0) may be absent.
    progress
        Show a progress bar (blocks read) while the totals are built: ``True``, ``False``
        or ``None`` (automatic; see :mod:`mixle.utils.progress`).

    Raises
    ------
    ValueError
        A weight is negative or not finite, every weight in the box is zero, or a required
        class is absent from the box.

    Notes
    -----
    :attr:`digest` is a hash of the map's voxels in the drawable box, taken while the
    totals are built (the only pass over the map), so fingerprints can tell two maps of one
    shape apart without reading either again.
    """

    def __init__(
        self,
        source: ArraySource,
        lo: Sequence[int],
        hi: Sequence[int],
        classes: list[int] | None,
        name: str,
        *,
        required: Sequence[bool] | None = None,
        progress: bool | None = None,
    ) -> None:
        self._source, self._lo, self._hi = source, tuple(lo), tuple(hi)
        self._classes, self._name = classes, name
        self._block = index_block_shape(source.shape, source.chunks)
        self._grid = tuple(-(-d // b) for d, b in zip(source.shape, self._block))
        count = math.prod(self._grid)
        rows = []
        content = hashlib.blake2b(digest_size=16)
        with progress_bar(count, f"indexing {name}", "block", enabled=progress) as bar:
            for b in range(count):
                start, block = self._read(b)
                rows.append(self._totals_of(start, block))
                content.update(b"-" if block is None else np.ascontiguousarray(block).data)
                bar.update(1)
        #: Hex hash of the map's voxels inside the drawable box, block by block.
        self.digest = content.hexdigest()
        self.totals = np.array(rows).reshape(len(rows), -1).T  # (classes or 1, blocks)
        self._check(required)
        self._init_cache()

    def _init_cache(self) -> None:  # the token of its cached blocks never travels in a pickle
        self._token = next(_details.tokens)
        weakref.finalize(self, _drop_details, self._token)

    def __getstate__(self) -> dict[str, Any]:
        skip = ("_token", "_cache", "_cache_bytes", "_lock")  # the last three: older releases
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    def _box(self, b: int) -> tuple[list[int], list[int]]:
        """Start and size of block ``b`` cut to the drawable box (size 0: nothing)."""
        pos = np.unravel_index(b, self._grid)
        start, size = [], []
        for p, blk, lo, hi in zip(pos, self._block, self._lo, self._hi):
            a, z = max(int(p) * blk, lo), min((int(p) + 1) * blk, hi)
            start.append(a)
            size.append(max(0, z - a))
        return start, size

    def _read(self, b: int) -> tuple[list[int], np.ndarray | None]:
        start, size = self._box(b)
        return start, (self._source.read_box(start, size) if all(size) else None)

    def _totals_of(self, start: list[int], block: np.ndarray | None) -> list[float] | list[int]:
        if self._classes is not None:
            if block is None:
                return [0] * len(self._classes)
            return [int(np.count_nonzero(block == c)) for c in self._classes]
        if block is None:
            return [0.0]
        values = block.astype(np.float64, copy=False)
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if bad.size:
            at = np.unravel_index(int(bad[0]), values.shape)
            voxel = tuple(s + int(i) for s, i in zip(start, at))
            raise ValueError(
                f"weights has the value {float(values.flat[int(bad[0])])!r} at {voxel}; "
                "weights must be finite and >= 0"
            )
        return [float(values.sum())]

    def _check(self, required: Sequence[bool] | None) -> None:
        sums = self.totals.sum(axis=1)
        where = f"voxels {self._lo} to {tuple(h - 1 for h in self._hi)} of the map"
        if self._classes is None and not sums[0] > 0:
            outside = self._find_outside_box(lambda block: block > 0)
            if outside is not None:
                raise NothingToSampleError(
                    f"weights are zero everywhere a patch can be centred ({where}); the map "
                    f"has positive weights (e.g. at {outside}) only near the edge, where no "
                    f"patch can be centred. {_HANG_OVER}"
                )
            raise NothingToSampleError(
                f"weights are zero everywhere a patch can be centred ({where}); give "
                "some voxel a positive weight"
            )
        classes = self._classes or []
        needed = [True] * len(classes) if required is None else list(required)
        for c, n, need in zip(classes, sums.tolist(), needed):
            if n == 0 and need:
                outside = self._find_outside_box(lambda block, c=c: block == c)
                if outside is not None:
                    raise NothingToSampleError(
                        f"label_probabilities asks for class {c}: the {self._name} have it "
                        f"(e.g. at {outside}), but only near the edge, where no patch can be "
                        f"centred (only {where} can centre one). {_HANG_OVER}"
                    )
                raise NothingToSampleError(
                    f"label_probabilities asks for class {c}, but no voxel where a patch can be "
                    f"centred has that label; choose classes present in the {self._name} or "
                    "give this one probability 0 (or leave it out)"
                )

    def _find_outside_box(self, hit: Callable[[np.ndarray], np.ndarray]) -> tuple[int, ...] | None:
        """The first map voxel outside the drawable box where ``hit`` holds, or ``None``.

        Only called on the way to an error: it reads the map's blocks again, whole.
        """
        shape = self._source.shape
        if self._lo == (0,) * len(shape) and self._hi == tuple(shape):
            return None  # the box is the whole map: nothing lies outside it
        for b in range(math.prod(self._grid)):
            pos = np.unravel_index(b, self._grid)
            start = [int(p) * blk for p, blk in zip(pos, self._block)]
            size = [min(blk, d - s) for blk, d, s in zip(self._block, shape, start)]
            found = np.argwhere(hit(self._source.read_box(start, size)))
            if found.size:
                return tuple(s + int(i) for s, i in zip(start, found[0]))
        return None

    def _detail(self, b: int) -> Any:
        """Cumulative weights (weights) or ``[positions of each class]`` (labels) of ``b``."""
        key = (self._token, b)
        cached = _details.get(key)
        if cached is not None:
            return cached
        _, block = self._read(b)
        assert block is not None
        flat = block.reshape(-1)
        if self._classes is None:
            detail: Any = np.cumsum(flat, dtype=np.float64)
        else:
            detail = [np.flatnonzero(flat == c).astype(np.int64) for c in self._classes]
        return _details.put(key, detail)

    def _voxels(self, blocks: NDArray[np.int64], local: NDArray[np.int64]) -> NDArray[np.int64]:
        out = np.empty((blocks.size, len(self._block)), dtype=np.int64)
        for b in np.unique(blocks).tolist():
            sel = np.flatnonzero(blocks == b)
            start, size = self._box(b)
            out[sel] = np.stack(np.unravel_index(local[sel], size), axis=1) + start
        return out

    def draw(self, state: NDArray[np.uint64], picks: NDArray[np.int64]) -> NDArray[np.int64]:
        """Voxels for hash ``state`` (one per draw); ``picks`` selects the class row."""
        counts = self.totals
        cum = np.cumsum(counts, axis=1)
        blocks = np.empty(state.size, dtype=np.int64)
        local = np.empty(state.size, dtype=np.int64)
        for c in np.unique(picks).tolist():
            sel = np.flatnonzero(picks == c)
            row = cum[c]
            if self._classes is None:  # inverse CDF on float totals; clamp rounding at the top
                u = uniform01(mix(state[sel], 1)) * row[-1]
                last = int(np.flatnonzero(counts[c] > 0)[-1])
                blocks[sel] = np.minimum(np.searchsorted(row, u, side="right"), last)
            else:  # exact: a uniform voxel number among the class's voxels
                k = below_each(np.full(sel.size, int(row[-1])), mix(state[sel], 1))
                blk = np.searchsorted(row, k, side="right")
                blocks[sel] = blk
                local[sel] = k - (row[blk] - counts[c][blk])
            for b in np.unique(blocks[sel]).tolist():
                sub = sel[blocks[sel] == b]
                detail = self._detail(b)
                if self._classes is None:
                    u2 = uniform01(mix(state[sub], 2)) * detail[-1]
                    top = int(np.searchsorted(detail, detail[-1], side="left"))
                    local[sub] = np.minimum(np.searchsorted(detail, u2, side="right"), top)
                else:
                    local[sub] = detail[c][local[sub]]
        return self._voxels(blocks, local)
