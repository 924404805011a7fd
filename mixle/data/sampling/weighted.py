"""Weighted and label-driven patch placement, still a pure function of ``(seed, epoch, index)``.

Patches are centred on a voxel drawn in proportion to a weight map, or uniformly among the
voxels of a class picked with ``label_probabilities``. The map is indexed block by block
(never loaded whole); a draw picks a block from the per-block totals by inverse CDF, then a
voxel inside it, both from the counter hash of ``(seed, epoch, index)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import hash_int, mix
from mixle.data.sampling.aligned import AlignedArrays, infer_scale
from mixle.data.sampling.patch_args import fingerprint_digest, source_identity
from mixle.data.sampling.weight_index import BlockIndex, uniform01
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource, listing
from mixle.errors import NothingToSampleError
from mixle.utils.validation import parse_int

__all__ = [
    "STREAM_WEIGHTED",
    "WeightedPlacement",
    "parse_label_probabilities",
    "weighted_placement",
]

#: Stream tag that separates weighted draws from every other use of the seed.
STREAM_WEIGHTED = 0x57454947  # "WEIG"


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
    absent_classes
        ``"error"`` (default): a class of ``label_probabilities`` with probability above 0
        that no drawable voxel has raises :class:`~mixle.errors.NothingToSampleError`.
        ``"drop"``: such classes get probability 0 and the rest are renormalised
        (:attr:`dropped_classes` lists them); the error is raised only when no class is left.

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
        absent_classes: str = "error",
    ) -> None:
        if absent_classes not in ("error", "drop"):
            raise ValueError(f"absent_classes={absent_classes!r} must be 'error' or 'drop'")
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
        if absent_classes == "drop":
            required = [False] * len(required)
        self._source, self._name = source, name
        self._box = (tuple(lo), tuple(hi))
        self._index = BlockIndex(
            source, lo, hi, self._classes, name, required=required, progress=progress
        )
        self._dropped: list[int] = []
        if self._classes is not None and absent_classes == "drop":
            present = self._index.totals.sum(axis=1) > 0
            gone = (self._probs > 0) & ~present
            self._dropped = [c for c, g in zip(self._classes, gone.tolist()) if g]
            if not (self._probs * present).any():
                raise NothingToSampleError(
                    f"label_probabilities asks for classes {self._dropped}, but no voxel of "
                    f"the {name} where a patch can be centred has any of them"
                )
            if self._dropped:
                probs = self._probs * present
                self._probs = probs / probs.sum()

    @property
    def dropped_classes(self) -> list[int]:
        """Classes of ``label_probabilities`` absent from the map, set to probability 0."""
        return list(self._dropped)

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
        return np.minimum(np.searchsorted(cum, uniform01(mix(state, 0)), side="right"), last)

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
    absent_classes: str = "error",
) -> WeightedPlacement | None:
    """The placement a sampler's ``weights=``/``labels=`` ask for, or ``None``.

    ``arrays`` are the sampler's aligned arrays (``None`` for one array), by which a map
    may be named; ``shape`` and ``step`` are the grid corners live on and their spacing;
    ``progress`` shows a bar while the map is indexed; ``absent_classes`` as for
    :class:`WeightedPlacement`.

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
        absent_classes=absent_classes,
    )
