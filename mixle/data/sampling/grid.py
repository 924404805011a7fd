"""Grid tiling: every tile of a regular, overlapping tiling that covers a whole volume."""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sampling.padding import (
    parse_pad_value,
    parse_padding,
    read_spatial_boxes,
    spatial_box_keys,
)
from mixle.data.sampling.patch_args import (
    fingerprint_digest,
    parse_index,
    parse_patch_size,
    per_axis,
    record_indices,
    source_identity,
    split_channels,
)
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.spec import ArraySpec

__all__ = ["GridSampler", "axis_starts", "grid_corners", "parse_overlap"]

Patch = tuple[np.ndarray, tuple[int, ...]]


def parse_overlap(overlap: object, patch_size: Sequence[int]) -> tuple[int, ...]:
    """Validate ``overlap``: an int or one int per axis, each in ``[0, patch_size)``."""
    parsed = per_axis(overlap, len(patch_size), "overlap", 0)
    bad = [a for a, (o, p) in enumerate(zip(parsed, patch_size)) if o >= p]
    if bad:
        a = bad[0]
        raise ValueError(
            f"overlap={parsed} must be smaller than patch_size={tuple(patch_size)} on every "
            f"axis (axis {a}: {parsed[a]} >= {patch_size[a]}); tiles would not advance"
        )
    return parsed


def axis_starts(length: int, patch: int, step: int, *, shift_last: bool) -> NDArray[np.int64]:
    """Tile starts along one axis: ``0, step, 2*step, ...`` until the axis is covered.

    There are ``1 + max(0, ceil((length - patch) / step))`` tiles. With ``shift_last`` the
    last tile is moved back to end exactly at ``length`` (needs ``patch <= length``);
    otherwise it keeps its place on the lattice and hangs over the edge (to be padded).
    """
    count = 1 + max(0, -(-(length - patch) // step))
    starts = np.arange(count, dtype=np.int64) * step
    if shift_last and count > 1:
        starts[-1] = length - patch
    return starts


def grid_corners(indices: ArrayLike, starts: Sequence[NDArray[np.int64]]) -> NDArray[np.int64]:
    """Corners of tiles ``indices`` (C order over the per-axis ``starts``): ``(N, ndim)``."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    multi = np.unravel_index(idx, tuple(len(s) for s in starts))
    out = np.empty((idx.size, len(starts)), dtype=np.int64)
    for axis, (m, s) in enumerate(zip(multi, starts)):
        out[:, axis] = s[m]
    return out


def _starts(
    length: int, patch: int, overlap: int, *, padding: str, pad_overlap: bool
) -> NDArray[np.int64]:
    """Tile starts along one axis for one edge policy (see :class:`GridSampler`)."""
    if pad_overlap:
        border = overlap // 2
        starts = axis_starts(length + 2 * border, patch, patch - overlap, shift_last=True)
        return starts - border
    return axis_starts(length, patch, patch - overlap, shift_last=padding == "none")


def _check_fits_padded(
    patch_size: Sequence[int], overlap: Sequence[int], shape: Sequence[int]
) -> None:
    for a, (p, o, d) in enumerate(zip(patch_size, overlap, shape)):
        if p > d + 2 * (o // 2):
            raise ValueError(
                f"patch_size={tuple(patch_size)} is larger than the volume of shape "
                f"{tuple(shape)} padded by overlap // 2 = {o // 2} on each side (axis {a}: "
                f"{p} > {d + 2 * (o // 2)}); make it smaller or pass pad_overlap=False"
            )


class GridSampler:
    """Every tile of a regular tiling with ``overlap`` that covers the whole volume.

    Parameters
    ----------
    array
        A mixle source or any N-D array-like (see :class:`~mixle.PatchSampler`), or a
        :class:`~mixle.VolumeCollection`: then every volume is tiled in turn and the grid
        is a :class:`~mixle.data.sampling.grid_volumes.VolumeGridSampler` (see there).
    patch_size
        An int (every axis) or one int per tiled axis. With fewer entries than the array
        has axes, the leading axes are channel axes and every tile holds them whole.
    overlap
        Voxels shared by neighbouring tiles, an int or per axis, in ``[0, patch_size)``.
    padding
        ``"none"`` (default): the last tile of an axis is shifted back to end at the edge,
        so every tile lies inside the volume (``patch_size`` must fit). ``"constant"``,
        ``"reflect"`` or ``"edge"``: tiles stay on the lattice ``0, step, ...`` and the last
        one hangs over the edge, padded (``patch_size`` may exceed the volume).
    pad_value
        Fill value for ``padding="constant"``.
    pad_overlap
        ``True``: TorchIO's tiling (``tio.GridSampler`` with a ``padding_mode``). The volume
        is padded by ``overlap // 2`` on *both* sides of every tiled axis (``padding``
        fills it; it must not be ``"none"``), and the padded volume is tiled as
        ``padding="none"`` tiles: the first tile starts at ``-(overlap // 2)``, the last one
        ends ``overlap // 2`` past the far edge. ``patch_size`` must fit in the padded
        volume. Default ``False``.

    Raises
    ------
    ValueError
        ``overlap`` not smaller than ``patch_size``, ``patch_size`` larger than the volume
        (or, with ``pad_overlap``, the padded volume), or ``pad_overlap`` with
        ``padding="none"``.

    Notes
    -----
    Tiles are numbered in C order over the per-axis starts (:attr:`starts`), so consecutive
    indices are neighbours and a batch of them decodes each stored chunk about once. The
    tiling is a pure function of the shape and the arguments; no I/O happens before a read.

    With channel axes, ``coords`` holds a tile's corner on the tiled axes only
    (``coords[B, len(patch_size)]``), the corners
    :class:`~mixle.data.sampling.stitch.GridAggregator` takes; channel axes are read whole
    and never padded.

    ``pad_overlap=True`` with ``padding`` ``"constant"`` (TorchIO's numeric
    ``padding_mode``), ``"reflect"`` or ``"edge"`` gives TorchIO's tile locations (minus
    ``overlap // 2``: mixle's corners are in the unpadded volume) and TorchIO's tile values;
    TorchIO needs an even ``overlap``, mixle pads ``overlap // 2`` for an odd one too.
    TorchIO's default ``padding_mode=None`` is mixle's default ``padding="none"``.
    """

    #: Subclasses that tile another kind of input, by that input's type; a subclass
    #: registers itself with ``class Sub(GridSampler, tiles=SomeType)``.
    _tiles_for: ClassVar[dict[type, type[GridSampler]]] = {}

    def __init_subclass__(cls, *, tiles: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if tiles is not None:
            GridSampler._tiles_for[tiles] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> GridSampler:
        """A new grid; for a :class:`~mixle.VolumeCollection` the subclass that tiles every volume.

        Called with no arguments too (by ``pickle`` and ``copy``): then it makes ``cls``.
        """
        target = cls
        if cls is GridSampler:
            first = args[0] if args else kwargs.get("array")
            target = next(
                (sub for kind, sub in cls._tiles_for.items() if isinstance(first, kind)), cls
            )
        return super().__new__(target)

    def __init__(
        self,
        array: Any,
        patch_size: int | Sequence[int],
        *,
        overlap: int | Sequence[int] = 0,
        padding: str = "none",
        pad_value: float = 0,
        pad_overlap: bool = False,
    ) -> None:
        self._source: ArraySource = as_array_source(array, name="array")
        shape = self._source.shape
        if not shape:
            raise ValueError("array is 0-dimensional; tiles need at least one axis")
        self._padding = parse_padding(padding)
        if not isinstance(pad_overlap, (bool, np.bool_)):
            raise TypeError(f"pad_overlap={pad_overlap!r} must be True or False")
        self._pad_overlap = bool(pad_overlap)
        if self._pad_overlap and self._padding == "none":
            raise ValueError(
                "pad_overlap=True pads overlap // 2 voxels on every side, but padding='none' "
                "has nothing to fill them with; pass padding='constant', 'reflect' or 'edge'"
            )
        self._lead, self._shape = split_channels(patch_size, shape)
        self._patch_size = parse_patch_size(patch_size, self._shape, padded=self._padding != "none")
        self._overlap = parse_overlap(overlap, self._patch_size)
        if self._pad_overlap:
            _check_fits_padded(self._patch_size, self._overlap, self._shape)
        self._pad_value = (
            parse_pad_value(pad_value, self._source.dtype) if self._padding == "constant" else 0
        )
        self._starts = tuple(
            _starts(d, p, o, padding=self._padding, pad_overlap=self._pad_overlap)
            for d, p, o in zip(self._shape, self._patch_size, self._overlap)
        )

    # -- description --------------------------------------------------------------------
    @property
    def source(self) -> ArraySource:
        """The source tiles are cut from."""
        return self._source

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tiled (spatial) axes of the volume."""
        return self._shape

    @property
    def channel_shape(self) -> tuple[int, ...]:
        """Shape of the leading channel axes every tile holds whole (``()`` if none)."""
        return self._lead

    @property
    def patch_size(self) -> tuple[int, ...]:
        """Tile extent per tiled axis."""
        return self._patch_size

    @property
    def overlap(self) -> tuple[int, ...]:
        """Voxels shared by neighbouring tiles per axis."""
        return self._overlap

    @property
    def padding(self) -> str:
        """The edge policy (see the class docstring)."""
        return self._padding

    @property
    def pad_overlap(self) -> bool:
        """Whether ``overlap // 2`` is padded on both sides before tiling (TorchIO's grid)."""
        return self._pad_overlap

    @property
    def starts(self) -> tuple[NDArray[np.int64], ...]:
        """Tile starts per tiled axis."""
        return tuple(s.copy() for s in self._starts)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of tiles per tiled axis."""
        return tuple(len(s) for s in self._starts)

    def element_spec(self) -> tuple[ArraySpec, ArraySpec]:
        """``(tile spec, coords spec)`` of one record, from metadata."""
        return (
            ArraySpec((*self._lead, *self._patch_size), self._source.dtype),
            ArraySpec((len(self._patch_size),), np.dtype(np.int64)),
        )

    def fingerprint(self) -> str:
        """A digest of everything that decides which tile an index means (no I/O).

        Covers the source (type, shape, dtype, chunks; not its path or content),
        ``patch_size``, ``overlap``, ``padding``, the fill value and ``pad_overlap``.
        """
        return fingerprint_digest(
            "GridSampler",
            {
                "source": source_identity(self._source),
                "patch_size": self._patch_size,
                "overlap": self._overlap,
                "padding": self._padding,
                "pad_value": self._pad_value,
                **({"pad_overlap": True} if self._pad_overlap else {}),
            },
        )

    def __len__(self) -> int:
        return int(np.prod(self.grid_shape, dtype=np.int64))

    def __repr__(self) -> str:
        return (
            f"GridSampler({self._source!r}, patch_size={self._patch_size}, "
            f"overlap={self._overlap}, padding={self._padding!r}, "
            f"{'pad_overlap=True, ' if self._pad_overlap else ''}grid_shape={self.grid_shape})"
        )

    # -- placement (no I/O) -------------------------------------------------------------
    def coords_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """Corners of tiles ``indices`` (default: all) as an int64 ``(N, ndim)`` array."""
        return grid_corners(record_indices(indices, len(self)), self._starts)

    # -- reading ------------------------------------------------------------------------
    def _read(self, corners: NDArray[np.int64]) -> np.ndarray:
        return read_spatial_boxes(
            self._source,
            corners,
            self._lead,
            self._patch_size,
            padding=self._padding,
            pad_value=self._pad_value,
        )

    def __getitem__(self, index: int) -> Patch:
        """Tile ``index`` and its corner: ``(tile, coords)``."""
        n = len(self)
        corners = grid_corners([parse_index(index, n, f"a grid of {n} tiles")], self._starts)
        return self._read(corners)[0], tuple(corners[0].tolist())

    def get_batch(self, indices: ArrayLike) -> tuple[np.ndarray, NDArray[np.int64]]:
        """Tiles ``indices`` stacked: ``(tiles[B, *channels, *patch_size], coords[B, ndim])``."""
        corners = self.coords_array(indices)
        return self._read(corners), corners

    def chunk_keys(self, indices: ArrayLike) -> list[Hashable]:
        """The decoded-chunk cache keys ``get_batch(indices)`` reads (for the Loader's plan)."""
        return spatial_box_keys(
            self._source, self.coords_array(indices), self._lead, self._patch_size
        )

    def records(self) -> Iterator[Patch]:
        """Yield ``(tile, coords)`` for every tile in order."""
        for i in range(len(self)):
            yield self[i]

    def __iter__(self) -> Iterator[Patch]:
        return self.records()


# ``inspect.signature(GridSampler)`` (help(), the docs) shows the constructor, not ``__new__``
_init = inspect.signature(GridSampler.__init__)
GridSampler.__signature__ = _init.replace(  # type: ignore[attr-defined]
    parameters=list(_init.parameters.values())[1:]
)
