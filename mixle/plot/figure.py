"""Shared matplotlib pieces: fresh axes without pyplot, a framed and clipped plane, labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mixle.plot.planes import Plane, read_plane
from mixle.utils.optional_deps import require

__all__ = [
    "axis_label",
    "draw_plane",
    "new_axes",
    "parse_axis_names",
    "parse_clip",
    "where",
]


def new_axes(ax: Any, count: int = 1, *, shape: Sequence[float] = (1.0, 1.0)) -> list[Any]:
    """``count`` side-by-side Axes of a new ``Figure`` (no pyplot), or the caller's ``ax``.

    A new figure is sized for images of ``(height, width)`` proportions ``shape``.

    Raises
    ------
    ImportError
        matplotlib is missing; the message names ``mixle[plot]``.
    ValueError
        ``ax`` holds a different number of Axes than ``count``.
    """
    require("matplotlib", "plot", feature="mixle.plot")
    if ax is None:
        from matplotlib.figure import Figure

        ratio = min(max(float(shape[0]) / max(float(shape[1]), 1.0), 0.25), 2.0)
        fig = Figure(figsize=(5.5 * count + 0.5, 5.5 * ratio + 1.2), layout="constrained")
        return list(np.atleast_1d(fig.subplots(1, count)))
    given = list(np.ravel(np.asarray(ax, dtype=object)))
    if len(given) != count:
        raise ValueError(f"ax={ax!r} holds {len(given)} Axes; this plot draws {count}")
    return given


def parse_clip(clip: object) -> tuple[float, float] | None:
    """Validate ``clip``: ``None`` or ``(low, high)`` percentiles with 0 <= low < high <= 100."""
    if clip is None:
        return None
    try:
        low, high = (float(v) for v in clip)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ValueError(f"clip={clip!r} must be None or (low, high) percentiles") from None
    if not 0 <= low < high <= 100:
        raise ValueError(f"clip={clip!r} must satisfy 0 <= low < high <= 100")
    return low, high


def draw_plane(
    ax: Any,
    plane: Plane,
    *,
    cmap: str,
    clip: tuple[float, float] | None,
    axis_names: Sequence[str] | None,
) -> Any:
    """Read ``plane`` and show it on ``ax`` (``None``: new axes), framed at the volume's edge.

    The image lies over :attr:`Plane.extent` in voxel units, its contrast clipped to the
    ``clip`` percentiles of its finite values; the axes are labelled and limited to
    :attr:`Plane.limits`. Returns the Axes.
    """
    (target,) = new_axes(ax, shape=plane.size)
    image = read_plane(plane)
    shown = image.astype(np.uint8) if image.dtype == bool else image
    scale: dict[str, float] = {}
    if clip is not None:
        finite = shown[np.isfinite(shown)] if shown.dtype.kind == "f" else shown.ravel()
        if finite.size:
            low, high = np.percentile(finite, clip)
            scale = {"vmin": float(low), "vmax": float(high)}
    target.imshow(
        shown, cmap=cmap, extent=plane.extent, interpolation="nearest", origin="upper", **scale
    )
    target.set_ylabel(axis_label(plane, plane.rows, axis_names))
    target.set_xlabel(axis_label(plane, plane.cols, axis_names))
    left, right, bottom, top = plane.limits
    target.set_xlim(left, right)
    target.set_ylim(bottom, top)
    return target


def axis_label(plane: Plane, spatial_axis: int, axis_names: Sequence[str] | None) -> str:
    """``"axis 2"`` (the array axis), or the caller's name for that spatial axis."""
    if axis_names is not None:
        return str(axis_names[spatial_axis])
    return f"axis {plane.array_axis(spatial_axis)}"


def parse_axis_names(axis_names: object, ndim: int) -> tuple[str, ...] | None:
    """Validate ``axis_names``: ``None`` or one name per spatial axis (a string like "zyx")."""
    if axis_names is None:
        return None
    names = tuple(str(n) for n in axis_names)  # type: ignore[attr-defined]
    if len(names) != ndim:
        raise ValueError(
            f"axis_names={axis_names!r} has {len(names)} names; give one per spatial axis ({ndim})"
        )
    return names


def where(plane: Plane, axis_names: Sequence[str] | None) -> str:
    """``"slice 8 of axis 0"``, ``"max along axis 0"`` or ``""`` for 2-D data."""
    if plane.axis is None:
        return ""
    name = axis_label(plane, plane.axis, axis_names)
    if plane.projection == "slice":
        return f"slice {plane.index} of {name}"
    return f"{plane.projection} along {name}"
