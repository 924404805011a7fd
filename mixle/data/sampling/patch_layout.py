"""Where a :class:`~mixle.PatchSampler`'s patches can go, from its validated arguments.

:func:`parse_patch_layout` checks every argument that decides which patch an index means
(in the order the sampler documents its errors) and returns them, with the corner grid
they give, as one :class:`PatchLayout`. It reads metadata only, plus a ``weights`` or
``labels`` map once, block by block, to index it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import MASK64, parse_seed
from mixle.data.sampling.aligned import AlignedArrays
from mixle.data.sampling.padding import parse_padding, read_spatial_boxes, spatial_box_keys
from mixle.data.sampling.patch_args import (
    centred_grid,
    check_combination,
    fingerprint_digest,
    parse_epoch,
    parse_num_patches,
    parse_patch_size,
    parse_region,
    parse_stride,
    patch_entries,
    source_identity,
    split_channels,
)
from mixle.data.sampling.placement import (
    grid_counts,
    local_patch_corners,
    patch_corners,
    permuted_corners,
)
from mixle.data.sampling.weighted import WeightedPlacement, weighted_placement
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.utils.progress import parse_progress
from mixle.utils.validation import parse_int

__all__ = ["PatchLayout", "parse_patch_layout"]


@dataclass(frozen=True)
class PatchLayout:
    """A patch sampler's validated arguments and the corner grid they give.

    ``arrays`` is ``None`` for one array (then ``source`` is it and ``lead`` its channel
    axes); ``origin`` and ``counts`` are the corner grid's first corner and positions per
    spatial axis; ``per_region`` is ``patches_per_chunk``; ``epoch`` is the one given at
    construction (the sampler keeps the current one).
    """

    arrays: AlignedArrays | None
    source: ArraySource
    lead: tuple[int, ...]
    shape: tuple[int, ...]
    patch_size: tuple[int, ...]
    padding: str
    pad_values: dict[str, Any]
    seed: int
    epoch: int
    stride: tuple[int, ...]
    replacement: bool
    origin: tuple[int, ...]
    counts: tuple[int, ...]
    per_region: int
    region: tuple[int, ...]
    weighted: WeightedPlacement | None
    num_patches: int

    def corners(self, idx: ArrayLike, epoch: int) -> NDArray[np.int64]:
        """Corners ``(N, ndim)`` of patches ``idx`` (valid indices) in ``epoch`` (no I/O)."""
        seed = self.seed
        if self.weighted is not None:
            return self.weighted.corners(seed, idx, epoch=epoch)
        if not self.replacement:
            out = permuted_corners(seed, idx, self.counts, self.stride, epoch=epoch)
        elif self.per_region == 1:
            out = patch_corners(seed, idx, self.counts, self.stride, epoch=epoch)
        else:
            out = local_patch_corners(
                seed,
                idx,
                self.shape,
                self.patch_size,
                self.stride,
                self.per_region,
                self.region,
                epoch=epoch,
            )
        if any(self.origin):
            out += np.asarray(self.origin, dtype=np.int64)
        return out

    def read(self, corners: NDArray[np.int64]) -> Any:
        """Patches at ``corners``: ``(B, *lead, *patch_size)``, or ``{name: ...}`` for a dict."""
        if self.arrays is not None:
            return self.arrays.read(
                corners, self.patch_size, padding=self.padding, pad_values=self.pad_values
            )
        return read_spatial_boxes(
            self.source,
            corners,
            self.lead,
            self.patch_size,
            padding=self.padding,
            pad_value=self.pad_values["array"],
        )

    def chunk_keys(self, corners: NDArray[np.int64]) -> list[Any]:
        """The decoded-chunk cache keys :meth:`read` reads at ``corners``."""
        if self.arrays is not None:
            return self.arrays.chunk_keys(corners, self.patch_size)
        return spatial_box_keys(self.source, corners, self.lead, self.patch_size)

    def fingerprint(self, epoch: int) -> str:
        """A digest of everything that decides which patch an index of ``epoch`` means.

        See :meth:`mixle.PatchSampler.fingerprint` for what it covers.
        """
        weighted = self.weighted
        return fingerprint_digest(
            "PatchSampler",
            {
                "arrays": (
                    source_identity(self.source)
                    if self.arrays is None
                    else self.arrays.fingerprint()
                ),
                "dict": self.arrays is not None,
                "patch_size": self.patch_size,
                "num_patches": self.num_patches,
                "seed": self.seed & MASK64,  # the hash takes it modulo 2**64
                "epoch": epoch,
                "stride": self.stride,
                "replacement": self.replacement,
                "patches_per_chunk": self.per_region,
                "region": self.region if self.per_region > 1 else None,
                "padding": self.padding,
                "pad_values": self.pad_values,
                "weighted": None if weighted is None else weighted.fingerprint(),
            },
        )


def parse_patch_layout(
    array: Any,
    patch_size: int | Sequence[int],
    num_patches: int | None,
    *,
    seed: int,
    epoch: int,
    stride: int | Sequence[int] | None,
    replacement: bool,
    patches_per_chunk: int,
    region: int | Sequence[int] | None,
    padding: str,
    pad_value: float | Mapping[str, float],
    weights: Any,
    labels: Any,
    label_probabilities: Mapping[int, float] | None,
    scales: Mapping[str, object] | None,
    progress: bool | None,
    absent_classes: str = "error",
) -> PatchLayout:
    """Validate :class:`~mixle.PatchSampler`'s arguments (all but structure and schema).

    ``absent_classes`` is passed to the weighted placement
    (:class:`~mixle.data.sampling.weighted.WeightedPlacement`).

    Raises
    ------
    TypeError, ValueError, KeyError
        On bad arguments, naming the argument, the value and what is accepted.
    """
    progress = parse_progress(progress)
    padding = parse_padding(padding)
    padded = padding != "none"
    arrays: AlignedArrays | None = None
    if isinstance(array, Mapping):
        spatial = patch_entries(patch_size)  # None for an int: the arrays' smallest ndim
        arrays = AlignedArrays(array, spatial_ndim=spatial, scales=scales)
        source = next(iter(arrays.sources.values()))
        lead: tuple[int, ...] = ()
        shape, step = arrays.shape, arrays.step
    else:
        source = as_array_source(array, name="array")
        if not source.shape:
            raise ValueError("array is 0-dimensional; patches need at least one axis")
        lead, shape = split_channels(patch_size, source.shape)
        step = (1,) * len(shape)
    size = parse_patch_size(patch_size, shape, padded=padded)
    aligned = arrays or AlignedArrays({"array": source}, spatial_ndim=len(shape))
    aligned.check_patch_size(size)
    constant = padding == "constant"
    pad_values = aligned.pad_values(pad_value) if constant else dict.fromkeys(aligned.names, 0)
    seed = parse_seed(seed)
    epoch = parse_epoch(epoch)
    spacing = step if stride is None else parse_stride(stride, len(shape))
    off = [a for a, (st, m) in enumerate(zip(spacing, step)) if st % m]
    if off:
        raise ValueError(
            f"stride={spacing} must be a multiple of {step} (the arrays' scale "
            f"factors) on every axis; axis {off[0]} is not"
        )
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"replacement={replacement!r} must be True or False")
    replacement = bool(replacement)
    if padded:
        origin, counts = centred_grid(shape, size, spacing, step)
    else:
        origin = (0,) * len(shape)
        counts = grid_counts(shape, size, spacing)
    per_region = parse_int(patches_per_chunk, "patches_per_chunk")
    if per_region < 1:
        raise ValueError(f"patches_per_chunk={patches_per_chunk} must be >= 1")
    chunks = source.chunks if arrays is None else None
    chunks = None if chunks is None else chunks[len(lead) :]
    regions = parse_region(region, size, chunks)
    weighted = weighted_placement(
        weights,
        labels,
        label_probabilities,
        stride=stride,
        arrays=arrays,
        shape=shape,
        patch_size=size,
        step=step,
        padded=padded,
        progress=progress,
        absent_classes=absent_classes,
    )
    check_combination(per_region, replacement, weighted, padding)
    return PatchLayout(
        arrays=arrays,
        source=source,
        lead=lead,
        shape=shape,
        patch_size=size,
        padding=padding,
        pad_values=pad_values,
        seed=seed,
        epoch=epoch,
        stride=spacing,
        replacement=replacement,
        origin=origin,
        counts=counts,
        per_region=per_region,
        region=regions,
        weighted=weighted,
        num_patches=parse_num_patches(num_patches, replacement, counts),
    )
