"""Patch footprints over a slice or projection of the volume they were cut from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sampling.patch_args import per_axis
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.plot.figure import draw_plane, parse_axis_names, parse_clip, where
from mixle.plot.planes import MAX_PIXELS, Plane, parse_plane
from mixle.utils.validation import parse_int

__all__ = ["INDIVIDUAL_PATCHES", "plot_patches", "plot_sampler"]

#: Up to this many footprints are separate ``Rectangle`` artists; more go in one collection.
INDIVIDUAL_PATCHES = 256
#: Default cap on footprints drawn (the title says how many of how many are shown).
MAX_PATCHES = 1000
#: Sampler indices :func:`plot_sampler` looks at by default.
SAMPLER_INDICES = 100_000


def plot_patches(
    volume: Any,
    corners: ArrayLike,
    patch_size: int | Sequence[int],
    *,
    axis: int = 0,
    index: int | None = None,
    projection: str = "slice",
    ax: Any = None,
    max_patches: int = MAX_PATCHES,
    channel: int | Sequence[int] | None = None,
    max_pixels: int = MAX_PIXELS,
    clip: tuple[float, float] | None = (1.0, 99.0),
    cmap: str = "gray",
    color: str = "tab:orange",
    linewidth: float = 1.0,
    axis_names: Sequence[str] | str | None = None,
    title: str | None = None,
) -> Any:
    """Draw patch footprints over a slice or a max/mean projection of ``volume``.

    Parameters
    ----------
    volume
        A mixle source or an N-D array-like. Its last ``corners.shape[1]`` axes are the
        patches' axes; leading axes are channels (one is shown, see ``channel``).
    corners
        Patch corners, ``(N, ndim)`` ints (e.g. ``sampler.coords_array()``).
    patch_size
        One int for every axis or one per axis.
    axis
        Patch axis to slice or project along (3-D patches; ignored for 2-D).
    index
        Plane along ``axis`` for ``projection="slice"``; ``None``: the middle one.
    projection
        ``"slice"`` reads only that plane and draws the patches that contain it; ``"max"``
        or ``"mean"`` project along ``axis`` block by block (each chunk read once, bounded
        memory) and draw every footprint.
    ax
        Axes to draw into; ``None`` makes a new ``Figure`` (no pyplot state is touched).
    max_patches
        Draw at most this many footprints (the first ones); the title says how many of how
        many are shown.
    channel
        Index on the leading channel axes (default 0 on each).
    max_pixels
        Larger planes are shown subsampled by an in-plane stride; footprints stay exact.
    clip
        Percentiles the image contrast is clipped to, or ``None`` for the full range.
    cmap, color, linewidth
        Image colour map, footprint colour and line width.
    axis_names
        One name per patch axis (e.g. ``"zyx"``) for labels; default ``"axis k"``.
    title
        Replaces the generated title.

    Returns
    -------
    matplotlib.axes.Axes
        The Axes drawn into; save with ``ax.figure.savefig(path)``.

    Raises
    ------
    ImportError
        matplotlib is missing (``pip install -e ".[plot]"``).
    ValueError, TypeError, IndexError
        A bad argument, named with its value.
    """
    boxes = _parse_corners(corners)
    ndim = boxes.shape[1]
    size = per_axis(patch_size, ndim, "patch_size", 1)
    limit = parse_int(max_patches, "max_patches")
    if limit < 0:
        raise ValueError(f"max_patches={max_patches!r} must be >= 0")
    source = as_array_source(volume, name="volume")
    if ndim > source.ndim >= 2:
        raise ValueError(
            f"corners has {ndim} columns but volume has shape {source.shape}; give one "
            "column per patch axis (the volume's trailing axes)"
        )
    names = parse_axis_names(axis_names, ndim)
    shade = parse_clip(clip)
    plane = parse_plane(
        source,
        ndim,
        axis=axis,
        index=index,
        projection=projection,
        channel=channel,
        max_pixels=max_pixels,
    )
    target = draw_plane(ax, plane, cmap=cmap, clip=shade, axis_names=names)
    if plane.axis is not None and plane.index is not None:  # a slice: the patches across it
        a, at = plane.axis, plane.index
        hits = boxes[(boxes[:, a] <= at) & (at < boxes[:, a] + size[a])]
    else:
        hits = boxes
    drawn = hits[:limit]
    _draw_boxes(target, drawn, size, plane.rows, plane.cols, color, linewidth)
    target.set_title(
        title if title is not None else _title(plane, names, len(drawn), len(hits), len(boxes))
    )
    return target


def plot_sampler(
    sampler: Any,
    *,
    axis: int = 0,
    index: int | None = None,
    projection: str = "slice",
    max_patches: int = MAX_PATCHES,
    num_patches: int | None = None,
    ax: Any = None,
    **options: Any,
) -> Any:
    """Draw the footprints of a sampler's patches over its volume (see :func:`plot_patches`).

    Parameters
    ----------
    sampler
        A :class:`~mixle.PatchSampler` or :class:`~mixle.GridSampler`; corners come from
        its index math (no patch is read). A dict sampler is drawn over its finest array.
    axis, index, projection, max_patches, ax
        As for :func:`plot_patches`.
    num_patches
        How many of the sampler's indices (from 0) to consider; default all, up to 100,000.
    **options
        Passed to :func:`plot_patches` (``channel``, ``clip``, ``color``, ``axis_names``...).

    Returns
    -------
    matplotlib.axes.Axes
        The Axes drawn into.

    Raises
    ------
    TypeError
        ``sampler`` has no ``coords_array``/``patch_size``.
    ValueError
        ``num_patches`` is negative or larger than the sampler.
    """
    check_sampler(sampler)
    total = len(sampler)
    n = (
        min(total, SAMPLER_INDICES)
        if num_patches is None
        else parse_int(num_patches, "num_patches")
    )
    if not 0 <= n <= total:
        raise ValueError(f"num_patches={num_patches!r} must be in [0, {total}] (len(sampler))")
    corners = sampler.coords_array(np.arange(n, dtype=np.int64))
    return plot_patches(
        sampler_volume(sampler),
        corners,
        sampler.patch_size,
        axis=axis,
        index=index,
        projection=projection,
        ax=ax,
        max_patches=max_patches,
        **options,
    )


def check_sampler(sampler: object) -> None:
    """Raise ``TypeError`` unless ``sampler`` has the index math the plots draw from.

    Raises
    ------
    TypeError
        ``sampler`` has no ``coords_array``/``patch_size``.
    """
    if not (hasattr(sampler, "coords_array") and hasattr(sampler, "patch_size")):
        raise TypeError(
            f"sampler={type(sampler).__name__} must be a PatchSampler or GridSampler "
            "(with coords_array() and patch_size)"
        )


def sampler_volume(sampler: Any) -> ArraySource:
    """The array a sampler's corners refer to: its source, or a dict's finest array.

    Raises
    ------
    ValueError
        A dict sampler none of whose arrays is at the finest scale on every axis.
    """
    arrays = getattr(sampler, "arrays", None)
    if arrays is None:
        return sampler.source
    finest = [k for k, f in arrays.factors.items() if all(v == 1 for v in f)]
    if not finest:
        raise ValueError(
            f"sampler has no array at the finest scale on every axis (scale factors "
            f"{arrays.factors}); its corners live on a grid of shape {arrays.shape} that "
            "no array has: draw one array with plot_patches(array, corners // factor, ...)"
        )
    return arrays.sources[finest[0]]


def _parse_corners(corners: ArrayLike) -> NDArray[np.int64]:
    boxes = np.asarray(corners)
    if boxes.ndim == 1 and boxes.size == 0:
        boxes = boxes.reshape(0, 0)
    if boxes.ndim != 2 or boxes.shape[1] not in (2, 3):
        raise ValueError(
            f"corners has shape {boxes.shape}; expected (N, 2) or (N, 3) patch corners, "
            "e.g. sampler.coords_array()"
        )
    if boxes.size and boxes.dtype.kind not in "iu":
        raise TypeError(f"corners has dtype {boxes.dtype}; corners must be integers")
    return boxes.astype(np.int64, copy=False)


def _draw_boxes(
    ax: Any,
    corners: NDArray[np.int64],
    size: Sequence[int],
    rows: int,
    cols: int,
    color: str,
    linewidth: float,
) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    boxes = [
        Rectangle(
            (float(c[cols]), float(c[rows])),
            size[cols],
            size[rows],
            fill=False,
            edgecolor=color,
            linewidth=linewidth,
        )
        for c in corners.tolist()
    ]
    if len(boxes) <= INDIVIDUAL_PATCHES:
        for box in boxes:
            ax.add_patch(box)
    else:
        ax.add_collection(PatchCollection(boxes, match_original=True), autolim=False)


def _title(plane: Plane, names: Sequence[str] | None, drawn: int, hits: int, total: int) -> str:
    place = where(plane, names)
    if plane.axis is not None and plane.index is not None:
        what = f"{hits:,} of {total:,} patches cross {place}"
    else:
        what = f"{total:,} patches" + (f", {place}" if place else "")
    if drawn < hits:
        what += f" (first {drawn:,} drawn)"
    if plane.step > 1:
        what += f"\nimage every {plane.step} pixels"
    return what
