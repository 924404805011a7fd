"""Seeded random N-D patches cut from a lazy volume, addressable by index."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.hashing import parse_seed
from mixle.data.placement import grid_counts, local_patch_corners, patch_corners
from mixle.data.schema import Schema, parse_schema
from mixle.data.sources.adopt import as_array_source
from mixle.data.sources.base import ArraySource, parse_indices
from mixle.data.spec import ArraySpec
from mixle.data.structure import EXCHANGEABLE, SampleStructure, parse_structure
from mixle.utils.validation import parse_int

__all__ = ["PatchSampler", "parse_patch_size", "parse_stride"]

Patch = tuple[np.ndarray, tuple[int, ...]]


def _per_axis(value: object, ndim: int, name: str, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        items = list(value)
    elif isinstance(value, np.ndarray) and value.ndim == 1:
        items = value.tolist()
    else:
        items = [value] * ndim
    out = [parse_int(item, name) for item in items]
    if len(out) != ndim:
        raise ValueError(
            f"{name}={value!r} has {len(out)} entries but the array has {ndim} dimensions"
        )
    if any(v < minimum for v in out):
        raise ValueError(f"{name}={value!r} must be >= {minimum} on every axis")
    return tuple(out)


def parse_patch_size(patch_size: object, shape: Sequence[int]) -> tuple[int, ...]:
    """Validate ``patch_size`` (an int for every axis, or one int per axis) against ``shape``."""
    size = _per_axis(patch_size, len(shape), "patch_size", 1)
    too_big = [a for a, (p, s) in enumerate(zip(size, shape)) if p > s]
    if too_big:
        raise ValueError(
            f"patch_size={size} is larger than the array of shape {tuple(shape)} on "
            f"axis {too_big[0]}"
        )
    return size


def parse_stride(stride: object, ndim: int) -> tuple[int, ...]:
    """Validate ``stride``: ``None`` (every position), an int, or one int per axis, all >= 1."""
    return (1,) * ndim if stride is None else _per_axis(stride, ndim, "stride", 1)


class PatchSampler:
    """``num_patches`` seeded random patches of ``patch_size`` from an N-D array.

    Parameters
    ----------
    array
        A mixle source, or any N-D array-like with ``.shape`` and basic ``__getitem__``
        (ndarray, ``np.memmap``, zarr array, h5py dataset). h5py datasets, zarr arrays and
        memmaps are wrapped so that the sampler pickles by reference.
    patch_size
        An int (same on every axis) or one int per axis, each in ``[1, shape[axis]]``.
    num_patches
        How many patches the sampler addresses (``len(sampler)``).
    seed
        Any int, taken modulo 2**64; patch corners are a pure function of ``(seed, index)``.
    stride
        Corners lie on the grid ``0, stride, 2*stride, ...`` (int or per-axis); ``None``
        allows every position.
    patches_per_chunk
        Locality: every ``patches_per_chunk`` consecutive indices share one region of the
        array (``1``, the default, draws every patch independently from the whole array).
    region
        Extent of those regions (int or per-axis, at least ``patch_size``); default: the
        store's chunk shape grown to ``patch_size``, or ``2 * patch_size`` when unchunked.
    structure
        How patches relate (see :mod:`mixle.data.structure`).
    schema
        When given, checked against one patch: ``patch_size`` and the array's dtype.

    Notes
    -----
    Corner ``i`` on each axis is a grid position drawn exactly uniformly from the in-bounds
    positions with a counter-based hash of ``(seed, i, axis)``: O(1) memory for any
    ``num_patches``, the same in every process, on every NumPy release and whatever order
    patches are asked for in. Patches never leave the array. Returned patches are new
    arrays, never views into the user's file.

    With ``patches_per_chunk=k > 1`` the array is tiled by regions and indices
    ``[b*k, (b+1)*k)`` draw their corners inside one region chosen uniformly for block
    ``b``; with the default region (one stored chunk) a batch of those patches decodes
    about one chunk per ``k`` patches instead of several per patch. The trade: patches of a
    block are correlated (same neighbourhood), and a patch never straddles two regions
    (except in the last, partial region of an axis), so voxels near region borders are
    drawn less often than with independent placement. Keep blocks together in a batch
    (no per-record shuffle) to get the speed.
    """

    def __init__(
        self,
        array: Any,
        patch_size: int | Sequence[int],
        num_patches: int,
        *,
        seed: int = 0,
        stride: int | Sequence[int] | None = None,
        patches_per_chunk: int = 1,
        region: int | Sequence[int] | None = None,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        self._source: ArraySource = as_array_source(array, name="array")
        shape = self._source.shape
        if not shape:
            raise ValueError("array is 0-dimensional; patches need at least one axis")
        self._patch_size = parse_patch_size(patch_size, shape)
        self._num_patches = parse_int(num_patches, "num_patches")
        if self._num_patches < 0:
            raise ValueError(f"num_patches={num_patches} must be >= 0")
        self._seed = parse_seed(seed)
        self._stride = parse_stride(stride, len(shape))
        self._counts = grid_counts(shape, self._patch_size, self._stride)
        self._per_region = parse_int(patches_per_chunk, "patches_per_chunk")
        if self._per_region < 1:
            raise ValueError(f"patches_per_chunk={patches_per_chunk} must be >= 1")
        self._region = self._parse_region(region)
        self._structure = parse_structure(structure)
        self._schema = parse_schema(schema)
        if self._schema is not None:
            self._schema.check(self._source.dtype, self._patch_size, what="PatchSampler patch")

    def _parse_region(self, region: object) -> tuple[int, ...]:
        if region is None:
            chunks = self._source.chunks
            base = chunks if chunks is not None else tuple(2 * p for p in self._patch_size)
            return tuple(max(c, p) for c, p in zip(base, self._patch_size))
        parsed = _per_axis(region, len(self._patch_size), "region", 1)
        small = [a for a, (r, p) in enumerate(zip(parsed, self._patch_size)) if r < p]
        if small:
            raise ValueError(
                f"region={parsed} is smaller than patch_size={self._patch_size} on axis "
                f"{small[0]}; a region must hold a whole patch"
            )
        return parsed

    # -- description --------------------------------------------------------------------
    @property
    def source(self) -> ArraySource:
        """The source patches are cut from."""
        return self._source

    @property
    def patch_size(self) -> tuple[int, ...]:
        """Patch extent per axis."""
        return self._patch_size

    @property
    def stride(self) -> tuple[int, ...]:
        """Spacing of the corner grid per axis."""
        return self._stride

    @property
    def seed(self) -> int:
        """The seed corners are derived from."""
        return self._seed

    @property
    def patches_per_chunk(self) -> int:
        """How many consecutive indices share one region (1: independent placement)."""
        return self._per_region

    @property
    def region(self) -> tuple[int, ...]:
        """Extent of the regions that locality sampling tiles the array with."""
        return self._region

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of possible corner positions per axis."""
        return self._counts

    @property
    def structure(self) -> SampleStructure:
        """How patches relate to each other."""
        return self._structure

    @property
    def schema(self) -> Schema | None:
        """The schema one patch was checked against, if any."""
        return self._schema

    def element_spec(self) -> tuple[ArraySpec, ArraySpec]:
        """``(patch spec, coords spec)`` of one record, from metadata."""
        return (
            ArraySpec(self._patch_size, self._source.dtype),
            ArraySpec((len(self._patch_size),), np.dtype(np.int64)),
        )

    def __len__(self) -> int:
        return self._num_patches

    def __repr__(self) -> str:
        local = (
            f", patches_per_chunk={self._per_region}, region={self._region}"
            if self._per_region > 1
            else ""
        )
        return (
            f"PatchSampler({self._source!r}, patch_size={self._patch_size}, "
            f"num_patches={self._num_patches}, seed={self._seed}, stride={self._stride}{local})"
        )

    # -- placement (no I/O) -------------------------------------------------------------
    def coords_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """Corners of patches ``indices`` (default: all) as an int64 ``(N, ndim)`` array."""
        if indices is None:
            idx = np.arange(self._num_patches, dtype=np.int64)
        else:
            idx = parse_indices(indices, self._num_patches)
        return self._corners(idx)

    def _corners(self, idx: ArrayLike) -> NDArray[np.int64]:
        if self._per_region == 1:
            return patch_corners(self._seed, idx, self._counts, self._stride)
        return local_patch_corners(
            self._seed,
            idx,
            self._source.shape,
            self._patch_size,
            self._stride,
            self._per_region,
            self._region,
        )

    def coords(self) -> list[tuple[int, ...]]:
        """Corners of every patch as tuples of ints (no I/O)."""
        return [tuple(row) for row in self.coords_array().tolist()]

    # -- reading ------------------------------------------------------------------------
    def _index(self, index: object) -> int:
        i = parse_int(index, "index")
        n = self._num_patches
        if not -n <= i < n:
            raise IndexError(f"index={i} is out of range for a sampler of {n} patches")
        return i + n if i < 0 else i

    def __getitem__(self, index: int) -> Patch:
        """Patch ``index`` and its corner: ``(patch, coords)``."""
        i = self._index(index)
        corner = tuple(self._corners((i,))[0].tolist())
        return self._source.read_box(corner, self._patch_size), corner

    def get_batch(self, indices: ArrayLike) -> tuple[np.ndarray, NDArray[np.int64]]:
        """Patches ``indices`` stacked: ``(patches[B, *patch_size], coords[B, ndim])``."""
        corners = self.coords_array(indices)
        return self._source.read_boxes(corners, self._patch_size), corners

    def records(self) -> Iterator[Patch]:
        """Yield ``(patch, coords)`` for every index in order."""
        for i in range(self._num_patches):
            yield self[i]

    def __iter__(self) -> Iterator[Patch]:
        return self.records()
