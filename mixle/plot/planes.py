"""Which 2-D plane of an N-D volume a plot shows, and reading it with bounded memory.

No matplotlib here: this is argument parsing and block-by-block reading that the plotting
modules share, testable on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.utils.validation import parse_choice, parse_int

__all__ = [
    "MAX_PIXELS",
    "PROJECTIONS",
    "SLAB_BYTES",
    "Plane",
    "fit_bins",
    "parse_plane",
    "plan_blocks",
    "read_block",
    "read_plane",
    "sum_along",
]

#: How a volume is flattened to a plane: one plane, or a projection along ``axis``.
PROJECTIONS = ("slice", "max", "mean")
#: Default bound on the pixels of a shown plane; larger planes are subsampled by a stride.
MAX_PIXELS = 4_000_000
#: Bytes one block of a projection may take (blocks follow chunk boundaries below this).
SLAB_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Plane:
    """A 2-D view of a volume: leading channel axes fixed, one spatial axis removed.

    Attributes
    ----------
    source
        The volume.
    lead
        The index fixed on each leading (channel) axis.
    spatial
        Shape of the spatial (trailing) axes.
    axis
        The spatial axis sliced or projected along, ``None`` for 2-D data.
    index
        The plane along ``axis`` (``None`` for a projection or 2-D data).
    projection
        ``"slice"``, ``"max"`` or ``"mean"``.
    rows, cols
        The spatial axes shown as image rows and columns.
    step
        In-plane subsampling stride (1: every pixel).
    """

    source: ArraySource
    lead: tuple[int, ...]
    spatial: tuple[int, ...]
    axis: int | None
    index: int | None
    projection: str
    rows: int
    cols: int
    step: int

    @property
    def extent(self) -> tuple[float, float, float, float]:
        """``imshow`` extent in voxel units: pixel ``(r, c)`` covers ``[c, c+1) x [r, r+1)``."""
        h = -(-self.spatial[self.rows] // self.step) * self.step
        w = -(-self.spatial[self.cols] // self.step) * self.step
        return (0.0, float(w), float(h), 0.0)

    @property
    def limits(self) -> tuple[float, float, float, float]:
        """Axis limits ``(left, right, bottom, top)``: the plane of the volume, in voxels.

        A subsampled image's last pixels may reach past it (see :attr:`extent`); the limits
        stop at the volume's edge, where chunk lines and footprints are measured from.
        """
        height, width = self.size
        return (0.0, float(width), float(height), 0.0)

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` of the plane in voxels."""
        return self.spatial[self.rows], self.spatial[self.cols]

    def array_axis(self, spatial_axis: int) -> int:
        """The array axis number of spatial axis ``spatial_axis``."""
        return len(self.lead) + spatial_axis


def parse_plane(
    volume: Any,
    spatial_ndim: int | None,
    *,
    axis: object = 0,
    index: object = None,
    projection: object = "slice",
    channel: object = None,
    max_pixels: object = MAX_PIXELS,
    name: str = "volume",
) -> Plane:
    """Validate the arguments that pick a plane of ``volume`` (no I/O).

    Parameters
    ----------
    volume
        A mixle source or any array-like with ``.shape`` and N-D ``__getitem__``.
    spatial_ndim
        How many trailing axes are spatial (the rest are channels); ``None``: up to 3.
    axis
        Spatial axis to slice or project along (negative counts from the end).
    index
        The plane along ``axis`` for a slice; ``None``: the middle one.
    projection
        One of :data:`PROJECTIONS`.
    channel
        Index on the leading channel axes: an int, one int per channel axis, or ``None``
        (0 on each).
    max_pixels
        Planes with more pixels are subsampled by the smallest stride that fits.
    name
        How errors call ``volume``.

    Returns
    -------
    Plane
        What to read and how to lay it out.

    Raises
    ------
    ValueError, TypeError, IndexError
        Naming the bad argument and its value.
    """
    source = as_array_source(volume, name=name)
    shape = source.shape
    nd = min(len(shape), 3) if spatial_ndim is None else spatial_ndim
    if len(shape) < 2 or nd < 2:
        raise ValueError(
            f"{name} has shape {shape}; plots need at least 2 spatial dimensions "
            f"({nd} given), e.g. a 2-D image or a 3-D volume"
        )
    if nd > 3:
        raise ValueError(
            f"{name} has {nd} spatial axes (shape {shape}); plots show a plane of 2-D or 3-D "
            "data: pass a 3-D sub-volume or patches with at most 3 axes"
        )
    if nd > len(shape):
        raise ValueError(f"{name} has shape {shape}, fewer than the {nd} spatial axes asked for")
    lead_shape, spatial = shape[: len(shape) - nd], shape[len(shape) - nd :]
    if 0 in spatial:
        raise ValueError(f"{name} has shape {shape}; an empty spatial axis leaves nothing to draw")
    lead = _parse_channel(channel, lead_shape, name)
    how = parse_choice(projection, "projection", PROJECTIONS)
    if nd == 2:
        if index is not None:
            raise ValueError(
                f"index={index!r} picks a plane of 3-D data, but {name} of shape {shape} has "
                "2 spatial axes; leave index=None"
            )
        ax, at, rows, cols = None, None, 0, 1
    else:
        a = parse_int(axis, "axis")
        if not -nd <= a < nd:
            raise ValueError(f"axis={axis!r} is out of range for {nd} spatial axes ({spatial})")
        ax = a % nd
        rows, cols = (b for b in range(nd) if b != ax)
        at = None
        if how == "slice":
            at = spatial[ax] // 2 if index is None else parse_int(index, "index")
            if not 0 <= at < spatial[ax]:
                raise IndexError(
                    f"index={index!r} is out of range for axis {axis} of length {spatial[ax]}"
                )
        elif index is not None:
            raise ValueError(f"index={index!r} applies to projection='slice', not {how!r}")
    limit = parse_int(max_pixels, "max_pixels")
    if limit < 1:
        raise ValueError(f"max_pixels={max_pixels!r} must be >= 1")
    step = 1
    while -(-spatial[rows] // step) * -(-spatial[cols] // step) > limit:
        step += 1
    return Plane(source, lead, spatial, ax, at, how, rows, cols, step)


def _parse_channel(channel: object, lead_shape: Sequence[int], name: str) -> tuple[int, ...]:
    if channel is None:
        return (0,) * len(lead_shape)
    items = list(channel) if isinstance(channel, (tuple, list)) else [channel]
    picked = [parse_int(c, "channel") for c in items]
    if len(picked) != len(lead_shape):
        raise ValueError(
            f"channel={channel!r} has {len(picked)} entries but {name} has "
            f"{len(lead_shape)} channel axes {tuple(lead_shape)}"
        )
    for c, n in zip(picked, lead_shape):
        if not 0 <= c < n:
            raise IndexError(f"channel={channel!r} is out of range for channel axes {lead_shape}")
    return tuple(picked)


def _plane_key(plane: Plane, along: slice | int) -> tuple[slice | int, ...]:
    step = slice(None, None, plane.step)
    spatial = [along if a == plane.axis else step for a in range(len(plane.spatial))]
    return (*plane.lead, *spatial)


def plan_blocks(
    plane: Plane,
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
    *,
    step: int = 1,
    slab_bytes: int = SLAB_BYTES,
) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Boxes ``(start, stop)`` that tile ``[lo, hi)`` (default: everything) block by block.

    Every block spans whole image columns and is cut along ``plane.axis`` (3-D data) and
    the image rows. Cuts fall on the source's chunk boundaries, so each stored chunk is read
    once, and a block holds at most ``slab_bytes`` (values counted at 8 bytes or more;
    ``step`` subsamples rows and columns). Only when one chunk-thick band of chunk rows
    exceeds the budget are chunks cut (and read more than once); a block always holds at
    least one image row of one plane.
    """
    lo = [0] * len(plane.spatial) if lo is None else list(lo)
    hi = list(plane.spatial) if hi is None else list(hi)
    if any(a >= b for a, b in zip(lo, hi)):
        return
    rows, cols, along = plane.rows, plane.cols, plane.axis
    grid = plane.source.chunks

    def chunk(a: int) -> int:
        return grid[plane.array_axis(a)] if grid else 1

    item = max(plane.source.dtype.itemsize, 8)
    fit = slab_bytes // max(1, _samples(lo[cols], hi[cols], step) * item)  # image rows that fit
    height = _samples(lo[rows], hi[rows], step)
    c_along = 1 if along is None else chunk(along)
    slab = 1 if along is None else min(c_along, hi[along] - lo[along])  # planes per slab
    c_rows = chunk(rows)
    band: int | None = None  # voxel rows per block (None: all of them)
    if height * slab <= fit:  # whole planes, as many chunks thick as fit
        thick = max(c_along, fit // height // c_along * c_along)
    elif fit // slab * step >= c_rows:  # chunk-thick slabs cut into bands of chunk rows
        thick, band = c_along, fit // slab * step // c_rows * c_rows
    else:  # one band of chunk rows of a chunk-thick slab is too big: cut inside chunks
        rows_in_chunk = -(-c_rows // step)
        thick = min(c_along, max(1, fit // rows_in_chunk))
        band = c_rows if fit >= rows_in_chunk else max(1, fit) * step
    spans_along = [(0, 1)] if along is None else _cuts(lo[along], hi[along], thick)
    for a0, a1 in spans_along:
        for r0, r1 in _cuts(lo[rows], hi[rows], band):
            start, stop = list(lo), list(hi)
            start[rows], stop[rows] = r0, r1
            if along is not None:
                start[along], stop[along] = a0, a1
            yield tuple(start), tuple(stop)


def _samples(lo: int, hi: int, step: int) -> int:
    """How many multiples of ``step`` lie in ``[lo, hi)``."""
    return -(-hi // step) - -(-lo // step)


def _cuts(lo: int, hi: int, size: int | None) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut at the multiples of ``size`` (``None``: not cut)."""
    if size is None:
        return [(lo, hi)]
    out, start = [], lo
    while start < hi:
        stop = min(hi, (start // size + 1) * size)
        out.append((start, stop))
        start = stop
    return out


def read_block(
    plane: Plane, start: Sequence[int], stop: Sequence[int], step: int = 1
) -> np.ndarray:
    """The spatial box ``[start, stop)`` of ``plane``'s channel, every ``step``-th voxel in plane.

    In-plane axes keep the voxels at multiples of ``step`` (the pixels :func:`read_plane`
    shows), whatever ``start`` is; ``plane.axis`` is read whole.
    """
    key: list[slice] = []
    for a, (b, e) in enumerate(zip(start, stop)):
        first = b if a == plane.axis else -(-b // step) * step
        key.append(slice(b, e) if a == plane.axis else slice(first, e, step))
    return np.asarray(plane.source[(*plane.lead, *key)])


def read_plane(plane: Plane, *, slab_bytes: int = SLAB_BYTES) -> np.ndarray:
    """The 2-D image of ``plane``: one plane read lazily, or a projection block by block.

    A projection holds the image and one block of at most ``slab_bytes`` (see
    :func:`plan_blocks`) at a time, and reads every stored chunk once.
    """
    every = slice(None, None, plane.step)
    if plane.axis is None:
        return np.asarray(plane.source[(*plane.lead, every, every)])
    axis, step = plane.axis, plane.step
    if plane.projection == "slice":
        assert plane.index is not None
        spatial = [plane.index if a == axis else every for a in range(len(plane.spatial))]
        return np.asarray(plane.source[(*plane.lead, *spatial)])
    shape = (-(-plane.spatial[plane.rows] // step), -(-plane.spatial[plane.cols] // step))
    acc: np.ndarray | None = None
    for start, stop in plan_blocks(plane, step=step, slab_bytes=slab_bytes):
        block = read_block(plane, start, stop, step)
        band = slice(-(-start[plane.rows] // step), -(-stop[plane.rows] // step))
        if plane.projection == "max":
            part = block.max(axis=axis)
            if acc is None:
                acc = np.empty(shape, dtype=part.dtype)
            if start[axis] == 0:  # the first slab along the axis covers every row once
                acc[band] = part
            else:
                np.maximum(acc[band], part, out=acc[band])
        else:
            if acc is None:
                acc = np.zeros(shape, dtype=np.float64)
            acc[band] += block.sum(axis=axis, dtype=np.float64)
    assert acc is not None
    return acc / plane.spatial[axis] if plane.projection == "mean" else acc


def sum_along(
    plane: Plane,
    lo: Sequence[int],
    hi: Sequence[int],
    amounts: Callable[[np.ndarray], np.ndarray],
    bins: Sequence[int],
    *,
    slab_bytes: int = SLAB_BYTES,
) -> np.ndarray:
    """Sum ``amounts(values)`` over the box ``[lo, hi)`` along ``plane.axis`` into bins.

    ``amounts`` maps a block of the volume to per-voxel amounts (same shape). The result
    has one cell per ``bins`` block of in-plane voxels (the last partial block included);
    only one block of at most ``slab_bytes`` (see :func:`plan_blocks`) and the binned
    plane are held in memory, for 2-D data too.
    """
    rows, cols = plane.rows, plane.cols
    shape = [-(-plane.spatial[a] // b) for a, b in zip((rows, cols), bins)]
    out = np.zeros(shape, dtype=np.float64)
    br, bc = bins
    cut_c = _bin_starts(lo[cols], hi[cols], bc)
    c0 = lo[cols] // bc
    for start, stop in plan_blocks(plane, lo, hi, slab_bytes=slab_bytes):
        total = amounts(read_block(plane, start, stop)).astype(np.float64, copy=False)
        if plane.axis is not None:
            total = total.sum(axis=plane.axis)
        cut_r = _bin_starts(start[rows], stop[rows], br)
        binned = np.add.reduceat(np.add.reduceat(total, cut_r, axis=0), cut_c, axis=1)
        r0 = start[rows] // br
        out[r0 : r0 + len(cut_r), c0 : c0 + len(cut_c)] += binned
    return out


def _bin_starts(lo: int, hi: int, size: int) -> np.ndarray:
    """Offsets into ``[lo, hi)`` where a new bin of ``size`` starts (0 first)."""
    pos = np.arange(lo, hi)
    return np.flatnonzero(np.diff(pos // size, prepend=lo // size - 1))


def fit_bins(size: Sequence[int], max_bins: int) -> tuple[int, ...]:
    """The smallest per-axis bin sizes that leave at most ``max_bins`` bins on each axis."""
    return tuple(max(1, math.ceil(n / max_bins)) for n in size)
