"""Where a sampler's patch centres fall, beside where its weight or label map says they should."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.plot.figure import axis_label, new_axes, parse_axis_names, where
from mixle.plot.patches import check_sampler, sampler_volume
from mixle.plot.planes import Plane, fit_bins, parse_plane, sum_along
from mixle.utils.validation import parse_int

__all__ = ["plot_sampling_density"]

#: Default number of patch centres drawn for the histogram.
NUM_DRAWS = 10_000
#: Default cap on histogram bins per image axis (voxels are pooled into square-ish bins).
MAX_BINS = 64


def plot_sampling_density(
    sampler: Any,
    *,
    num_draws: int = NUM_DRAWS,
    axis: int = 0,
    ax: Any = None,
    max_bins: int = MAX_BINS,
    cmap: str = "magma",
    axis_names: Sequence[str] | str | None = None,
    title: str | None = None,
) -> NDArray[np.object_]:
    """Histogram the centres of ``num_draws`` patches, beside the density the map asks for.

    Parameters
    ----------
    sampler
        A :class:`~mixle.PatchSampler` (weighted by ``weights=``/``labels=`` or not) or a
        :class:`~mixle.GridSampler`. Draws are indices ``0, 1, ...``; past ``len(sampler)``
        they continue in the next epochs (a sampler without epochs stops at its length).
    num_draws
        How many patch centres to histogram (>= 1).
    axis
        Spatial axis summed over (3-D patches; ignored for 2-D).
    ax
        ``None`` for a new ``Figure``, or the Axes to draw into: two (a sequence) for a
        weighted sampler, one otherwise.
    max_bins
        At most this many histogram bins per image axis; voxels are pooled to fit.
    cmap, axis_names, title
        Colour map, names of the patch axes (e.g. ``"zyx"``), and a replacement title for
        the histogram panel.

    Returns
    -------
    numpy.ndarray
        The Axes as a 1-D object array: ``[expected, drawn]`` for a weighted sampler (the
        weight or label map turned into expected centres per bin, on the same colour scale
        as the histogram), ``[drawn]`` otherwise. Image data are counts per bin; the drawn
        histogram sums to the number of draws.

    Raises
    ------
    ImportError
        matplotlib is missing (``pip install -e ".[plot]"``).
    TypeError, ValueError
        A bad argument, named with its value.
    """
    check_sampler(sampler)
    n = parse_int(num_draws, "num_draws")
    if n < 1:
        raise ValueError(f"num_draws={num_draws!r} must be >= 1")
    limit = parse_int(max_bins, "max_bins")
    if limit < 1:
        raise ValueError(f"max_bins={max_bins!r} must be >= 1")
    size = tuple(sampler.patch_size)
    names = parse_axis_names(axis_names, len(size))
    view = parse_plane(sampler_volume(sampler), len(size), axis=axis, projection="max")
    weighted = getattr(sampler, "weighted", None)
    corners, note = _draw(sampler, n)
    centres = corners + np.asarray(size, dtype=np.int64) // 2
    if weighted is None:
        grid, factor = view, (1,) * len(size)
    else:
        grid = parse_plane(weighted.source, len(size), axis=axis, projection="max", name="map")
        factor = weighted.factor
        centres //= np.asarray(factor, dtype=np.int64)
    rows, cols = grid.rows, grid.cols
    bins = fit_bins((grid.spatial[rows], grid.spatial[cols]), limit)
    drawn = _histogram(centres, grid, bins)
    panels = [
        (drawn, title if title is not None else _drawn_title(view, names, len(centres), note))
    ]
    if weighted is not None:
        expected = _expected(weighted, grid, bins)
        expected *= len(centres) / expected.sum()
        kind = "weights" if weighted.label_probabilities is None else "labels"
        text = f"expected centres from the {kind}" + _summed(view, names)
        panels.insert(0, (expected, text))
    axes = new_axes(ax, len(panels), shape=view.size)
    top = max(float(p.max()) for p, _ in panels) or 1.0
    extent = (
        0.0,
        float(drawn.shape[1] * bins[1] * factor[cols]),
        float(drawn.shape[0] * bins[0] * factor[rows]),
        0.0,
    )
    left, right, bottom, top_edge = view.limits
    for target, (image, text) in zip(axes, panels):
        im = target.imshow(
            image, cmap=cmap, vmin=0.0, vmax=top, extent=extent, interpolation="nearest"
        )
        target.set_ylabel(axis_label(view, rows, names))
        target.set_xlabel(axis_label(view, cols, names))
        target.set_xlim(left, right)  # the last bins may reach past the volume's edge
        target.set_ylim(bottom, top_edge)
        target.set_title(text, fontsize="medium")
    pooled = f"patch centres per bin ({bins[0] * factor[rows]}x{bins[1] * factor[cols]} voxels)"
    axes[-1].figure.colorbar(im, ax=list(axes), shrink=0.8, label=pooled)
    return np.array(axes, dtype=object)


def _draw(sampler: Any, n: int) -> tuple[NDArray[np.int64], str]:
    """Corners of draws ``0..n-1``, continuing in later epochs past ``len(sampler)``."""
    total = len(sampler)
    if total == 0:
        raise ValueError(f"sampler={sampler!r} has no patches to draw")
    if not hasattr(sampler, "set_epoch"):
        n = min(n, total)
        return sampler.coords_array(np.arange(n, dtype=np.int64)), ""
    walker = copy.copy(sampler)  # set_epoch on a copy: the caller's sampler is not touched
    first = int(sampler.epoch)
    parts, left, epoch = [], n, first
    while left:
        walker.set_epoch(epoch)
        take = min(left, total)
        parts.append(walker.coords_array(np.arange(take, dtype=np.int64)))
        left -= take
        epoch += 1
    note = f" (epochs {first}-{epoch - 1})" if epoch - first > 1 else ""
    return np.concatenate(parts), note


def _histogram(centres: NDArray[np.int64], grid: Plane, bins: Sequence[int]) -> NDArray[np.float64]:
    """Count ``centres`` per in-plane bin of ``grid`` (clipped to the grid)."""
    rows, cols = grid.rows, grid.cols
    shape = (-(-grid.spatial[rows] // bins[0]), -(-grid.spatial[cols] // bins[1]))
    r = np.clip(centres[:, rows], 0, grid.spatial[rows] - 1) // bins[0]
    c = np.clip(centres[:, cols], 0, grid.spatial[cols] - 1) // bins[1]
    flat = np.bincount(r * shape[1] + c, minlength=shape[0] * shape[1])
    return flat.reshape(shape).astype(np.float64)


def _expected(weighted: Any, grid: Plane, bins: Sequence[int]) -> NDArray[np.float64]:
    """Relative density of centres per bin that the weight or label map asks for."""
    lo, hi = weighted.box
    probabilities = weighted.label_probabilities
    if probabilities is None:
        return sum_along(grid, lo, hi, lambda block: block.astype(np.float64), bins)
    counts = weighted.totals.sum(axis=1)
    rates = [(c, p / k) for (c, p), k in zip(probabilities.items(), counts.tolist()) if p > 0 and k]

    def density(block: np.ndarray) -> np.ndarray:
        out = np.zeros(block.shape, dtype=np.float64)
        for c, rate in rates:
            out[block == c] += rate
        return out

    return sum_along(grid, lo, hi, density, bins)


def _drawn_title(view: Plane, names: Sequence[str] | None, n: int, note: str) -> str:
    return f"{n:,} drawn patch centres{note}" + _summed(view, names)


def _summed(view: Plane, names: Sequence[str] | None) -> str:
    """``", summed along axis 0"``, or ``""`` for 2-D data."""
    place = where(view, names).replace("max along", "summed along")
    return f", {place}" if place else ""
