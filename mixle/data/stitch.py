"""Stitch per-tile outputs of a :class:`~mixle.data.grid.GridSampler` back into one volume."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from mixle.data.grid import GridSampler
from mixle.utils.progress import parse_progress, progress_bar
from mixle.utils.validation import parse_int

__all__ = [
    "GAUSSIAN_SIGMA_SCALE",
    "RESULT_BLOCK_BYTES",
    "WINDOWS",
    "GridAggregator",
    "coverage_1d",
    "stitch",
    "window_1d",
]

#: Accepted ``window=`` values: ``"mean"`` weighs every voxel of a tile alike,
#: ``"gaussian"`` weighs tile centres more (smooth seams; not MONAI's or TorchIO's exact
#: weights: see docs/migration.md).
WINDOWS = ("mean", "gaussian")
#: Standard deviation of the gaussian window as a fraction of the tile extent.
GAUSSIAN_SIGMA_SCALE = 0.125
#: Bytes of accumulator the final normalisation handles at a time.
RESULT_BLOCK_BYTES = 64 * 1024 * 1024


def window_1d(size: int, window: str) -> NDArray[np.float64]:
    """Per-voxel weights along one tile axis (all positive)."""
    if window == "mean":
        return np.ones(size)
    sigma = max(GAUSSIAN_SIGMA_SCALE * size, 1e-3)
    x = np.arange(size) - (size - 1) / 2
    w = np.exp(-(x**2) / (2 * sigma**2))
    return np.maximum(w / w.max(), 1e-6)


def coverage_1d(
    length: int, starts: NDArray[np.int64], size: int, window: str
) -> NDArray[np.float64]:
    """Sum over tiles of their window at each voxel of one axis (the tiling is separable)."""
    total = np.zeros(length)
    w = window_1d(size, window)
    for s in starts.tolist():
        a, b = max(s, 0), min(s + size, length)
        total[a:b] += w[a - s : b - s]
    return total


class GridAggregator:
    """Accumulates per-tile outputs into a full-size volume, averaging where tiles overlap.

    Parameters
    ----------
    grid
        The :class:`GridSampler` whose tiles are added.
    channels
        Shape of the leading axes of each tile's output (e.g. ``3`` class scores), ``()``
        for none; default: taken from ``out`` or from the first :meth:`add`.
    dtype
        dtype of the result when ``out`` is not given.
    window
        ``"mean"`` (plain average of overlapping tiles) or ``"gaussian"``.
    out
        Optional output of shape ``(*channels, *grid.shape)``: an ndarray, an ``np.memmap``
        or a zarr array, for volumes larger than memory.
    scratch_dir
        Where the float64 accumulator lives when ``out`` is given (a temporary file,
        removed at once and freed with the aggregator); default: the system's temp dir.
    progress
        Show a progress bar (slabs written) while :meth:`result` writes the volume:
        ``True``, ``False`` or ``None`` (automatic; see :mod:`mixle.utils.progress`).

    Raises
    ------
    ValueError
        Unknown ``window``, ``out`` of the wrong shape, a tile added twice, or a tile output
        of the wrong shape.
    TypeError
        ``grid`` is not a :class:`GridSampler`, or ``progress`` is not ``True``, ``False``
        or ``None``.

    Notes
    -----
    Sums are kept in float64 and divided by the summed window once, in
    :meth:`result`; the summed window is the product of one 1-D sum per axis, so it is
    never stored. With ``window="mean"`` an identity model gives back the input exactly
    (for inputs float64 holds exactly: every integer and float32 type).
    """

    def __init__(
        self,
        grid: GridSampler,
        *,
        channels: int | Sequence[int] | None = None,
        dtype: DTypeLike = np.float32,
        window: str = "mean",
        out: Any = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
    ) -> None:
        if not isinstance(grid, GridSampler):
            raise TypeError(f"grid={type(grid).__name__} must be a GridSampler")
        self._progress = parse_progress(progress)
        if window not in WINDOWS:
            raise ValueError(f"window={window!r} is not one of {', '.join(map(repr, WINDOWS))}")
        self._grid, self._window, self._out = grid, window, out
        self._dtype = np.dtype(out.dtype if out is not None else dtype)
        self._scratch_dir = scratch_dir
        nd = len(grid.shape)
        if out is not None:
            if tuple(out.shape[-nd:]) != grid.shape or len(out.shape) < nd:
                raise ValueError(
                    f"out has shape {tuple(out.shape)}; expected (*channels, *{grid.shape})"
                )
            lead: tuple[int, ...] | None = tuple(out.shape[:-nd])
            if channels is not None and _shape(channels) != lead:
                raise ValueError(f"channels={channels!r} disagrees with out's shape {out.shape}")
        else:
            lead = None if channels is None else _shape(channels)
        self._lead = lead
        self._acc: np.ndarray | None = None
        self._seen = np.zeros(len(grid), dtype=bool)
        tile_w = [window_1d(p, window) for p in grid.patch_size]
        self._tile_window: NDArray[np.float64] | None = (
            None if window == "mean" else np.asarray(math.prod(np.ix_(*tile_w)))
        )
        self._done = False

    @property
    def tiles_added(self) -> int:
        """How many distinct tiles have been added."""
        return int(self._seen.sum())

    def _accumulator(self, lead: tuple[int, ...]) -> np.ndarray:
        if self._acc is None:
            shape = (*lead, *self._grid.shape)
            if self._out is None:
                self._acc = np.zeros(shape)
            else:
                fd, path = tempfile.mkstemp(suffix=".acc", dir=self._scratch_dir)
                os.close(fd)
                self._acc = np.memmap(path, dtype=np.float64, mode="w+", shape=shape)
                with contextlib.suppress(OSError):  # the mapping keeps the data alive
                    os.remove(path)
        return self._acc

    def _tile_numbers(self, coords: NDArray[np.int64]) -> NDArray[np.int64]:
        starts = self._grid.starts
        multi = []
        for a, s in enumerate(starts):
            pos = np.searchsorted(s, coords[:, a])
            pos = np.minimum(pos, len(s) - 1)
            if (s[pos] != coords[:, a]).any():
                bad = coords[np.flatnonzero(s[pos] != coords[:, a])[0]].tolist()
                raise ValueError(f"coords {bad} is not a corner of the grid's tiles")
            multi.append(pos)
        return np.ravel_multi_index(tuple(multi), self._grid.grid_shape).astype(np.int64)

    def add(self, outputs: ArrayLike, coords: ArrayLike) -> None:
        """Add tile outputs ``(B, *channels, *patch_size)`` at their grid ``coords`` ``(B, ndim)``.

        Raises
        ------
        ValueError
            Shapes do not match, a corner is not a tile of the grid, or a tile comes twice.
        """
        if self._done:
            raise ValueError("result() was already called; make a new GridAggregator")
        values = np.asarray(outputs)
        corners = np.asarray(coords, dtype=np.int64).reshape(-1, len(self._grid.shape))
        patch = self._grid.patch_size
        lead = self._lead if self._lead is not None else tuple(values.shape[1 : -len(patch)])
        want = (corners.shape[0], *lead, *patch)
        if values.shape != want:
            raise ValueError(f"outputs has shape {values.shape}; expected {want} for these coords")
        self._lead = lead
        tiles = self._tile_numbers(corners)
        again = tiles[self._seen[tiles]]
        if again.size or np.unique(tiles).size != tiles.size:
            first = int(again[0]) if again.size else int(tiles[0])
            raise ValueError(f"tile {first} was added twice; add each grid tile once")
        acc = self._accumulator(lead)
        shape = self._grid.shape
        for b, corner in enumerate(corners.tolist()):
            dest = [slice(max(c, 0), min(c + p, d)) for c, p, d in zip(corner, patch, shape)]
            src = tuple(slice(s.start - c, s.stop - c) for s, c in zip(dest, corner))
            tile = values[b][(Ellipsis, *src)].astype(np.float64)
            if self._tile_window is not None:
                tile = tile * self._tile_window[src]
            where: tuple[Any, ...] = (Ellipsis, *dest)
            acc[where] += tile
        self._seen[tiles] = True

    def result(self) -> Any:
        """The stitched volume ``(*channels, *grid.shape)``: ``out`` if given, else an ndarray.

        Raises
        ------
        ValueError
            Some tile of the grid was never added.
        """
        missing = np.flatnonzero(~self._seen)
        if missing.size:
            raise ValueError(
                f"{missing.size} of {self._seen.size} tiles were never added (first: tile "
                f"{int(missing[0])}); add every tile of the grid before result()"
            )
        acc = self._accumulator(self._lead or ())
        cover = [
            coverage_1d(d, s, p, self._window)
            for d, s, p in zip(self._grid.shape, self._grid.starts, self._grid.patch_size)
        ]
        lead = acc.ndim - len(cover)
        target = self._out if self._out is not None else np.empty(acc.shape, self._dtype)
        plane = max(1, acc[(slice(None),) * lead + (0,)].nbytes if acc.shape[lead] else 1)
        rows = max(1, RESULT_BLOCK_BYTES // plane)
        depth = acc.shape[lead]
        slabs = -(-depth // rows)
        with progress_bar(slabs, "writing volume", "slab", enabled=self._progress) as bar:
            for z in range(0, depth, rows):
                zs = slice(z, min(z + rows, depth))
                norm = math.prod(np.ix_(cover[0][zs], *cover[1:]))
                where: tuple[Any, ...] = (Ellipsis, zs, *(slice(None),) * (len(cover) - 1))
                target[where] = (acc[where] / norm).astype(self._dtype)
                bar.update(1)
        self._done, self._acc = True, None
        return target


def _shape(channels: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(channels, (int, np.integer)):
        return (int(channels),)
    return tuple(int(c) for c in channels)


def stitch(
    grid: GridSampler,
    fn: Callable[[np.ndarray], ArrayLike],
    *,
    batch_size: int = 8,
    progress: bool | None = None,
    **aggregator_options: Any,
) -> Any:
    """Run ``fn`` on every batch of tiles of ``grid`` and stitch the outputs.

    ``fn`` maps tiles ``(B, *channels_in, *patch_size)`` to outputs
    ``(B, *channels_out, *patch_size)``; ``aggregator_options`` go to
    :class:`GridAggregator` (``window``, ``out``, ``dtype``...). Returns its result.
    ``progress`` shows a bar of tiles processed, then one of slabs written: ``True``,
    ``False`` or ``None`` (automatic; see :mod:`mixle.utils.progress`).
    """
    batch_size = parse_int(batch_size, "batch_size")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    progress = parse_progress(progress)
    agg = GridAggregator(grid, progress=progress, **aggregator_options)
    n = len(grid)
    with progress_bar(n, "stitching tiles", "tile", enabled=progress) as bar:
        for lo in range(0, n, batch_size):
            tiles, coords = grid.get_batch(np.arange(lo, min(lo + batch_size, n)))
            agg.add(fn(tiles), coords)
            bar.update(len(coords))
    return agg.result()
