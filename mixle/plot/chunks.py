"""The stored chunk (and shard) grid over a slice of a volume."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.data.sources.arrays.adopt import as_array_source
from mixle.plot.figure import draw_plane, parse_axis_names, parse_clip, where
from mixle.plot.planes import MAX_PIXELS, Plane, parse_plane

__all__ = ["plot_chunk_grid"]


def plot_chunk_grid(
    source: Any,
    *,
    axis: int = 0,
    index: int | None = None,
    ax: Any = None,
    projection: str = "slice",
    spatial_ndim: int | None = None,
    channel: int | Sequence[int] | None = None,
    max_pixels: int = MAX_PIXELS,
    clip: tuple[float, float] | None = (1.0, 99.0),
    cmap: str = "gray",
    chunk_color: str = "tab:cyan",
    shard_color: str = "tab:red",
    axis_names: Sequence[str] | str | None = None,
    title: str | None = None,
) -> Any:
    """Draw the chunk boundaries (and shard boundaries) of ``source`` over one of its planes.

    Parameters
    ----------
    source
        A mixle source, zarr array, h5py dataset or any array-like; chunks and shards come
        from its metadata (an unchunked array draws no lines and says so).
    axis
        Spatial axis the plane is taken across (3-D data; ignored for 2-D).
    index
        Plane along ``axis``; ``None``: the middle one.
    ax
        Axes to draw into; ``None`` makes a new ``Figure`` (no pyplot).
    projection
        ``"slice"`` (default), or ``"max"``/``"mean"`` along ``axis`` read block by block.
    spatial_ndim
        How many trailing axes are spatial (default: up to 3); leading ones are channels.
    channel
        Index on the channel axes (default 0 on each).
    max_pixels, clip, cmap, axis_names, title
        As for :func:`~mixle.plot.plot_patches`.
    chunk_color, shard_color
        Line colours of chunk and shard boundaries.

    Returns
    -------
    matplotlib.axes.Axes
        The Axes; chunk lines are a ``LineCollection`` with label ``"chunks"``, shard lines
        one labelled ``"shards"``.

    Raises
    ------
    ImportError
        matplotlib is missing (``pip install -e ".[plot]"``).
    ValueError, TypeError, IndexError
        A bad argument, named with its value.
    """
    src = as_array_source(source, name="source")
    plane = parse_plane(
        src,
        spatial_ndim,
        axis=axis,
        index=index,
        projection=projection,
        channel=channel,
        max_pixels=max_pixels,
        name="source",
    )
    names = parse_axis_names(axis_names, len(plane.spatial))
    shade = parse_clip(clip)
    target = draw_plane(ax, plane, cmap=cmap, clip=shade, axis_names=names)
    chunks, shards = src.chunks, src.shards
    drawn = []
    for grid, color, width, label in (
        (chunks, chunk_color, 0.8, "chunks"),
        (shards, shard_color, 2.0, "shards"),
    ):
        if grid is not None and _lines(target, plane, grid, color, width, label):
            drawn.append(label)
    if drawn:
        target.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    target.set_title(title if title is not None else _title(plane, chunks, shards, names))
    return target


def boundaries(length: int, size: int) -> np.ndarray:
    """Interior grid boundaries ``size, 2*size, ...`` below ``length``."""
    return np.arange(size, length, size, dtype=np.float64)


def _lines(
    ax: Any, plane: Plane, grid: Sequence[int], color: str, width: float, label: str
) -> bool:
    """Draw the interior boundaries of ``grid`` in the plane; ``False`` if there are none."""
    rows, cols = plane.rows, plane.cols
    height, span = plane.spatial[rows], plane.spatial[cols]
    xs = boundaries(span, grid[plane.array_axis(cols)])
    ys = boundaries(height, grid[plane.array_axis(rows)])
    segments = [[(x, 0.0), (x, float(height))] for x in xs]
    segments += [[(0.0, y), (float(span), y)] for y in ys]
    if not segments:
        return False
    from matplotlib.collections import LineCollection

    ax.add_collection(
        LineCollection(segments, colors=color, linewidths=width, label=label), autolim=False
    )
    return True


def _title(plane: Plane, chunks: Any, shards: Any, names: Any) -> str:
    def spatial(grid: Sequence[int]) -> tuple[int, ...]:
        return tuple(grid[len(plane.lead) :])

    if chunks is None:
        text = "not chunked (one block)"
    else:
        text = f"chunks {spatial(chunks)}"
        if shards is not None:
            text += f", shards {spatial(shards)}"
    place = where(plane, names)
    if place:
        text += f"\n{place}"
        if plane.axis is not None and plane.index is not None and chunks is not None:
            along = chunks[plane.array_axis(plane.axis)]
            text += f" (in chunk {plane.index // along} along it)"
    if plane.step > 1:
        text += f"\nimage every {plane.step} pixels"
    return text
