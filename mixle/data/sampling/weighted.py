"""Weighted and label-driven patch placement, still a pure function of ``(seed, epoch, index)``.

Patches are centred on a voxel drawn in proportion to a weight map, or uniformly among the
voxels of a class picked with ``label_probabilities``. The map is indexed block by block
(never loaded whole); a draw picks a block from the per-block totals by inverse CDF, then a
voxel inside it, both from the counter hash of ``(seed, epoch, index)``.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import below_each, hash_int, mix
from mixle.data.sampling.aligned import AlignedArrays, infer_scale
from mixle.data.sampling.patch_args import fingerprint_digest, source_identity
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource, listing
from mixle.utils.progress import progress_bar
from mixle.utils.validation import parse_int

__all__ = [
    "BLOCK_CACHE_BYTES",
    "INDEX_BLOCK_VOXELS",
    "STREAM_WEIGHTED",
    "BlockIndex",
    "WeightedPlacement",
    "index_block_shape",
    "parse_label_probabilities",
    "weighted_placement",
]

#: Stream tag that separates weighted draws from every other use of the seed.
STREAM_WEIGHTED = 0x57454947  # "WEIG"
#: Index blocks are whole stored chunks grown to at least this many voxels.
INDEX_BLOCK_VOXELS = 1 << 18
#: Byte budget of the per-block detail (cumulative weights or class positions) kept.
BLOCK_CACHE_BYTES = 64 * 1024 * 1024
_TWO53 = 2.0**-53
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


def parse_label_probabilities(probabilities: object) -> tuple[list[int], NDArray[np.float64]]:
    """Validate ``{class: probability}`` and divide the probabilities by their sum.

    Classes must be ints and probabilities finite, ``>= 0`` and not all zero; they are
    relative weights (``{0: 1, 1: 3}`` means ``{0: 0.25, 1: 0.75}``), so any positive sum
    is accepted. Returns the classes and the normalised probabilities.
    """
    if not isinstance(probabilities, Mapping) or not probabilities:
        raise ValueError(
            f"label_probabilities={probabilities!r} must be a non-empty dict of "
            "{label value: probability}, e.g. {0: 0.2, 1: 0.8}"
        )
    classes = [parse_int(c, "label_probabilities key") for c in probabilities]
    probs = np.array([float(p) for p in probabilities.values()])
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise ValueError(
            f"label_probabilities={dict(probabilities)!r} must map to finite numbers >= 0"
        )
    if probs.sum() <= 0:
        raise ValueError(f"label_probabilities={dict(probabilities)!r} are all zero")
    return classes, probs / probs.sum()


def _nbytes(detail: Any) -> int:
    return int(detail.nbytes) if isinstance(detail, np.ndarray) else sum(d.nbytes for d in detail)


def _uniform01(state: NDArray[np.uint64]) -> NDArray[np.float64]:
    return (state >> np.uint64(11)).astype(np.float64) * _TWO53


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

    def _init_cache(self) -> None:  # the block cache and lock never travel in a pickle
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

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
                raise ValueError(
                    f"weights are zero everywhere a patch can be centred ({where}); the map "
                    f"has positive weights (e.g. at {outside}) only near the edge, where no "
                    f"patch can be centred. {_HANG_OVER}"
                )
            raise ValueError(
                f"weights are zero everywhere a patch can be centred ({where}); give "
                "some voxel a positive weight"
            )
        classes = self._classes or []
        needed = [True] * len(classes) if required is None else list(required)
        for c, n, need in zip(classes, sums.tolist(), needed):
            if n == 0 and need:
                outside = self._find_outside_box(lambda block, c=c: block == c)
                if outside is not None:
                    raise ValueError(
                        f"label_probabilities asks for class {c}: the {self._name} have it "
                        f"(e.g. at {outside}), but only near the edge, where no patch can be "
                        f"centred (only {where} can centre one). {_HANG_OVER}"
                    )
                raise ValueError(
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
        with self._lock:
            if b in self._cache:
                self._cache.move_to_end(b)
                return self._cache[b]
        _, block = self._read(b)
        assert block is not None
        flat = block.reshape(-1)
        if self._classes is None:
            detail: Any = np.cumsum(flat, dtype=np.float64)
        else:
            detail = [np.flatnonzero(flat == c).astype(np.int64) for c in self._classes]
        with self._lock:
            if b in self._cache:  # another thread built it meanwhile: count its bytes once
                self._cache.move_to_end(b)
                return self._cache[b]
            self._cache[b] = detail
            self._cache_bytes += _nbytes(detail)
            while self._cache_bytes > BLOCK_CACHE_BYTES and len(self._cache) > 1:
                self._cache_bytes -= _nbytes(self._cache.popitem(last=False)[1])
        return detail

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
                u = _uniform01(mix(state[sel], 1)) * row[-1]
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
                    u2 = _uniform01(mix(state[sub], 2)) * detail[-1]
                    top = int(np.searchsorted(detail, detail[-1], side="left"))
                    local[sub] = np.minimum(np.searchsorted(detail, u2, side="right"), top)
                else:
                    local[sub] = detail[c][local[sub]]
        return self._voxels(blocks, local)


class WeightedPlacement:
    """Corners of patches centred on voxels drawn from a weight map or a label volume.

    Parameters
    ----------
    source
        The weight map or label volume, spatial axes only, at the finest resolution or a
        coarser one (integer factor per axis).
    fine_shape
        Spatial shape of the grid corners live on.
    patch_size
        Patch extent on that grid.
    step
        Corners must be multiples of it (aligned arrays at coarser scales).
    padded
        Whether patches may hang over the edge (then every voxel may be a centre).
    label_probabilities
        ``{class: probability}`` for a label volume; ``None`` for a weight map.
    name
        How errors call the map (``"weights"`` or ``"labels"``).
    progress
        Show a progress bar while the map is indexed (see :class:`BlockIndex`).

    Notes
    -----
    Map voxel ``u`` at factor ``f`` covers fine voxels ``[u*f, (u+1)*f)``; the patch drawn
    for it has corner ``u*f - s`` with ``s`` the largest multiple of ``step`` not above
    ``patch_size // 2``, so its centre voxel ``corner + patch_size // 2`` lies inside that
    cover. Without padding only voxels whose patch fits in the volume can be drawn.
    """

    def __init__(
        self,
        source: ArraySource,
        fine_shape: Sequence[int],
        patch_size: Sequence[int],
        step: Sequence[int],
        *,
        padded: bool,
        label_probabilities: Mapping[int, float] | None = None,
        name: str = "weights",
        progress: bool | None = None,
    ) -> None:
        if source.ndim != len(fine_shape):
            raise ValueError(
                f"{name} has shape {source.shape} but patches have {len(fine_shape)} spatial "
                f"axes {tuple(fine_shape)}; give the map without channel axes"
            )
        f = infer_scale(fine_shape, source.shape, name)
        bad = [a for a, (k, m) in enumerate(zip(f, step)) if k % m]
        if bad:
            raise ValueError(
                f"{name} is at scale {f} but corners must be multiples of {tuple(step)}; use a "
                "map whose scale factors are multiples of every array's factor"
            )
        self._factor = np.asarray(f, dtype=np.int64)
        self._shift = np.array([(p // 2) // m * m for p, m in zip(patch_size, step)])
        lo, hi = [], []
        for a, (d, p, k, s, dm) in enumerate(
            zip(fine_shape, patch_size, f, self._shift.tolist(), source.shape)
        ):
            if padded:
                lo.append(0)
                hi.append(min(dm, -(-d // k)))
            else:
                lo.append(-(-s // k))
                hi.append(min(dm, (d - p + s) // k + 1))
            if lo[-1] >= hi[-1]:
                raise ValueError(
                    f"no voxel of {name} can centre a patch of {tuple(patch_size)} on axis {a}: "
                    f"the map's scale {k} leaves no corner inside the volume; use padding="
                    "'constant' (or another mode) or a finer map"
                )
        if label_probabilities is None:
            self._classes: list[int] | None = None
            self._probs = np.ones(1)
        else:
            self._classes, self._probs = parse_label_probabilities(label_probabilities)
        required = (self._probs > 0).tolist()
        self._source, self._name = source, name
        self._box = (tuple(lo), tuple(hi))
        self._index = BlockIndex(
            source, lo, hi, self._classes, name, required=required, progress=progress
        )

    @property
    def source(self) -> ArraySource:
        """The weight map or label volume draws are made from."""
        return self._source

    @property
    def factor(self) -> tuple[int, ...]:
        """Per-axis scale of the map: map voxel ``u`` covers fine voxels ``[u*f, (u+1)*f)``."""
        return tuple(self._factor.tolist())

    @property
    def box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(lo, hi)``: the map voxels that may be drawn (others count as weight 0)."""
        return self._box

    @property
    def label_probabilities(self) -> dict[int, float] | None:
        """``{class: probability}`` (normalised) for a label volume; ``None`` for weights."""
        if self._classes is None:
            return None
        return dict(zip(self._classes, self._probs.tolist()))

    @property
    def totals(self) -> NDArray:
        """Per-block totals: ``(1, blocks)`` weights or ``(classes, blocks)`` voxel counts."""
        return self._index.totals.copy()

    def fingerprint(self) -> str:
        """A digest of everything that decides the draws, from memory (no I/O).

        Covers the map's identity (type, shape, dtype, chunks) and content (the hash taken
        while it was indexed), its scale, the drawable box, the centre shift and the
        normalised class probabilities.
        """
        return fingerprint_digest(
            "WeightedPlacement",
            {
                "name": self._name,
                "map": source_identity(self._source),
                "content": self._index.digest,
                "factor": self.factor,
                "shift": self._shift,
                "box": self._box,
                "classes": self._classes,
                "probabilities": self._probs,
            },
        )

    def classes(self, seed: int, indices: ArrayLike, *, epoch: int = 0) -> NDArray[np.int64]:
        """Which class (position in ``label_probabilities``) each index draws."""
        state = self._state(seed, indices, epoch)
        if self._classes is None:
            return np.zeros(state.size, dtype=np.int64)
        cum = np.cumsum(self._probs)
        last = int(np.flatnonzero(self._probs > 0)[-1])
        return np.minimum(np.searchsorted(cum, _uniform01(mix(state, 0)), side="right"), last)

    def _state(self, seed: int, indices: ArrayLike, epoch: int) -> NDArray[np.uint64]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return mix(np.uint64(hash_int(seed, STREAM_WEIGHTED, epoch)), idx)

    def centres(self, seed: int, indices: ArrayLike, *, epoch: int = 0) -> NDArray[np.int64]:
        """Drawn map voxels ``(N, ndim)`` of ``indices``, in the map's own coordinates."""
        state = self._state(seed, indices, epoch)
        return self._index.draw(state, self.classes(seed, indices, epoch=epoch))

    def corners(self, seed: int, indices: ArrayLike, *, epoch: int = 0) -> NDArray[np.int64]:
        """Patch corners ``(N, ndim)`` on the fine grid for ``indices``."""
        return self.centres(seed, indices, epoch=epoch) * self._factor - self._shift


def _map_source(value: Any, name: str, arrays: AlignedArrays | None) -> ArraySource:
    """A map given as an array, a source, or the name of one of the sampler's arrays."""
    if isinstance(value, str):
        names = list(arrays.names) if arrays is not None else []
        if value not in names:
            raise KeyError(
                f"{name}={value!r} names no array of this sampler; "
                f"{listing(names, 'arrays')} (or pass the array itself)"
            )
        assert arrays is not None
        return arrays.sources[value]
    return as_array_source(value, name=name)


def weighted_placement(
    weights: Any,
    labels: Any,
    label_probabilities: Mapping[int, float] | None,
    *,
    stride: object,
    arrays: AlignedArrays | None,
    shape: Sequence[int],
    patch_size: Sequence[int],
    step: Sequence[int],
    padded: bool,
    progress: bool | None = None,
) -> WeightedPlacement | None:
    """The placement a sampler's ``weights=``/``labels=`` ask for, or ``None``.

    ``arrays`` are the sampler's aligned arrays (``None`` for one array), by which a map
    may be named; ``shape`` and ``step`` are the grid corners live on and their spacing;
    ``progress`` shows a bar while the map is indexed.

    Raises
    ------
    ValueError
        Conflicting or missing arguments (see :class:`~mixle.PatchSampler`), or a bad map.
    KeyError
        A map named by a string that is not one of ``arrays``.
    """
    if labels is None and label_probabilities is not None:
        raise ValueError("label_probabilities needs labels= (the label volume to sample by)")
    if weights is None and labels is None:
        return None
    if weights is not None and labels is not None:
        raise ValueError("pass weights= or labels=, not both")
    if labels is not None and label_probabilities is None:
        raise ValueError(
            "labels= needs label_probabilities={label value: probability}, e.g. {0: 0.5, 1: 0.5}"
        )
    if stride is not None:
        raise ValueError(
            f"stride={stride!r} cannot be combined with weights= or labels=: weighted "
            "patches are centred on the drawn voxel"
        )
    name = "weights" if weights is not None else "labels"
    source = _map_source(weights if weights is not None else labels, name, arrays)
    return WeightedPlacement(
        source,
        shape,
        patch_size,
        step,
        padded=padded,
        label_probabilities=label_probabilities,
        name=name,
        progress=progress,
    )
