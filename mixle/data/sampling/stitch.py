"""Stitch per-tile outputs of a :class:`~mixle.data.sampling.grid.GridSampler` into volumes.

A grid over one volume stitches into one volume; a grid over a
:class:`~mixle.VolumeCollection` into one output per volume (a dict of ndarrays, or one
array per volume in a zarr group, named by :func:`volume_array_names`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from mixle.data.sampling.grid import GridSampler
from mixle.data.sampling.grid_volumes import (
    COORDS_KEY,
    PATCH_KEY,
    VOLUME_KEY,
    VolumeGridSampler,
)
from mixle.utils.progress import parse_progress, progress_bar
from mixle.utils.validation import parse_int

__all__ = [
    "GAUSSIAN_SIGMA_SCALE",
    "MONAI_SIGMA_SCALE",
    "MONAI_WEIGHT_FLOOR",
    "RESULT_BLOCK_BYTES",
    "WINDOWS",
    "GridAggregator",
    "coverage_1d",
    "crop_intervals",
    "monai_gaussian_window",
    "stitch",
    "volume_array_names",
    "window_1d",
]

#: Accepted ``window=`` values. ``"mean"`` weighs every voxel of a tile alike (TorchIO's
#: ``"average"``, MONAI's ``"constant"``); ``"gaussian"`` weighs tile centres more (mixle's
#: own window, smooth seams); ``"hann"`` is TorchIO's ``overlap_mode="hann"``; ``"crop"``
#: is TorchIO's ``overlap_mode="crop"`` (each tile gives only its centre); and
#: ``"monai_gaussian"`` is MONAI's ``mode="gaussian"`` (``sigma_scale``, weights floored
#: at :data:`MONAI_WEIGHT_FLOOR`). See docs/migration.md for the exact mappings.
WINDOWS = ("mean", "gaussian", "hann", "crop", "monai_gaussian")
#: Standard deviation of the gaussian window as a fraction of the tile extent.
GAUSSIAN_SIGMA_SCALE = 0.125
#: MONAI's default ``sigma_scale`` of ``window="monai_gaussian"`` (sigma = scale * extent).
MONAI_SIGMA_SCALE = 0.125
#: MONAI's floor on the N-D importance map of ``window="monai_gaussian"``.
MONAI_WEIGHT_FLOOR = 1e-3
#: Bytes of accumulator the final normalisation handles at a time.
RESULT_BLOCK_BYTES = 64 * 1024 * 1024


def window_1d(size: int, window: str) -> NDArray[np.float64]:
    """Per-voxel weights along one tile axis (all positive) of a separable window.

    ``"crop"`` gives ones (its tiles are cut, see :func:`crop_intervals`); ``"hann"`` is
    TorchIO's ``torch.hann_window(size + 2, periodic=False)[1:-1]``, that is
    ``sin(pi * n / (size + 1)) ** 2`` for ``n = 1 .. size``. ``"monai_gaussian"`` is not
    separable: see :func:`monai_gaussian_window`.
    """
    if window in ("mean", "crop"):
        return np.ones(size)
    if window == "hann":
        return np.sin(np.pi * np.arange(1, size + 1) / (size + 1)) ** 2
    if window != "gaussian":
        raise ValueError(
            f"window={window!r} has no 1-D form; use one of 'mean', 'gaussian', 'hann', 'crop'"
        )
    sigma = max(GAUSSIAN_SIGMA_SCALE * size, 1e-3)
    x = np.arange(size) - (size - 1) / 2
    w = np.exp(-(x**2) / (2 * sigma**2))
    return np.maximum(w / w.max(), 1e-6)


def monai_gaussian_window(
    patch_size: Sequence[int], sigma_scale: float | Sequence[float] = MONAI_SIGMA_SCALE
) -> NDArray[np.float64]:
    """MONAI's Gaussian importance map of a tile (``compute_importance_map``), in float64.

    The product over axes of ``exp(-x**2 / (2 * sigma**2))``, ``x`` measured from the tile
    centre and ``sigma = sigma_scale * extent`` (not rescaled to a peak of 1), then every
    weight below ``max(its minimum, MONAI_WEIGHT_FLOOR)`` raised to that value. The floor
    acts on the N-D product, so the window is not separable.
    """
    scales = _sigma_scales(sigma_scale, len(patch_size))
    axes = []
    for size, scale in zip(patch_size, scales):
        x = np.arange(size) - (size - 1) / 2
        axes.append(np.exp(-(x**2) / (2 * (scale * size) ** 2)))
    w = np.asarray(math.prod(np.ix_(*axes)), dtype=np.float64)
    return np.maximum(w, max(float(w.min()), MONAI_WEIGHT_FLOOR))


def _sigma_scales(sigma_scale: object, ndim: int) -> tuple[float, ...]:
    items = list(sigma_scale) if isinstance(sigma_scale, (tuple, list)) else [sigma_scale] * ndim
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, float, np.number))]
    if bad or len(items) != ndim or not all(float(v) > 0 for v in items):
        raise ValueError(
            f"sigma_scale={sigma_scale!r} must be a positive number or one per tiled axis "
            f"({ndim}), e.g. MONAI's default {MONAI_SIGMA_SCALE}"
        )
    return tuple(float(v) for v in items)


def crop_intervals(
    length: int, starts: NDArray[np.int64], size: int, overlap: int
) -> list[tuple[int, int]]:
    """The part ``[lo, hi)`` of one axis each tile gives under ``window="crop"``.

    As TorchIO's ``overlap_mode="crop"``: a tile drops ``overlap // 2`` voxels on each
    side, except at the volume's edges (the first tile keeps everything from voxel 0, the
    last everything up to ``length``); where the kept parts still overlap (a last tile
    shifted back to the edge, an odd ``overlap``), the later tile wins, as TorchIO's later
    write does when tiles are added in grid order. The parts tile ``[0, length)`` exactly.
    """
    half = overlap // 2
    n = len(starts)
    lo = [0 if k == 0 else int(s) + half for k, s in enumerate(starts.tolist())]
    hi = [length if k == n - 1 else int(s) + size - half for k, s in enumerate(starts.tolist())]
    return [(lo[k], min(hi[k], lo[k + 1]) if k + 1 < n else hi[k]) for k in range(n)]


def coverage_1d(
    length: int, starts: NDArray[np.int64], size: int, window: str, overlap: int = 0
) -> NDArray[np.float64]:
    """Sum over tiles of their window at each voxel of one axis (the tiling is separable).

    ``overlap`` matters only for ``window="crop"`` (see :func:`crop_intervals`).
    """
    total = np.zeros(length)
    w = window_1d(size, window)
    for s, (a, b) in zip(starts.tolist(), _kept(length, starts, size, window, overlap)):
        a, b = max(a, 0), min(b, length)
        if a < b:
            total[a:b] += w[a - s : b - s]
    return total


def _kept(
    length: int, starts: NDArray[np.int64], size: int, window: str, overlap: int
) -> list[tuple[int, int]]:
    if window == "crop":
        return crop_intervals(length, starts, size, overlap)
    return [(int(s), int(s) + size) for s in starts.tolist()]


@dataclass(frozen=True)
class _Tiling:
    """The tiling of one volume: what an aggregator needs of its grid."""

    shape: tuple[int, ...]
    starts: tuple[NDArray[np.int64], ...]
    patch_size: tuple[int, ...]
    overlap: tuple[int, ...]
    grid_shape: tuple[int, ...]


def _tiling(grid: object, volume: int | None) -> _Tiling:
    if not isinstance(grid, GridSampler):
        raise TypeError(f"grid={type(grid).__name__} must be a GridSampler")
    if isinstance(grid, VolumeGridSampler):
        if volume is None:
            raise TypeError(
                f"grid tiles {grid.num_volumes} volumes; pass volume=v for the aggregator of "
                "volume v, or use stitch(), which gives one output per volume"
            )
        return _Tiling(
            grid.volume_shape(volume),
            grid.volume_starts(volume),
            grid.patch_size,
            grid.overlap,
            grid.volume_grid_shape(volume),
        )
    if volume is not None:
        raise TypeError(
            f"volume={volume!r} applies only to a grid over a VolumeCollection; this grid "
            "tiles one volume"
        )
    return _Tiling(grid.shape, grid.starts, grid.patch_size, grid.overlap, grid.grid_shape)


class GridAggregator:
    """Accumulates per-tile outputs into a full-size volume, averaging where tiles overlap.

    Parameters
    ----------
    grid
        The :class:`GridSampler` whose tiles are added.
    volume
        Only for a grid over a :class:`~mixle.VolumeCollection`, and then required: the
        volume whose tiles are added (their ``coords`` are corners in that volume, as the
        grid's records give them); the result has that volume's shape.
    channels
        Shape of the leading axes of each tile's output (e.g. ``3`` class scores), ``()``
        for none; default: taken from ``out`` or from the first :meth:`add`.
    dtype
        dtype of the result when ``out`` is not given.
    window
        How overlapping tiles are blended (:data:`WINDOWS`): ``"mean"`` (plain average),
        ``"gaussian"`` (mixle's Gaussian, sigma = 1/8 of the tile), ``"hann"`` (TorchIO's
        Hann window), ``"crop"`` (TorchIO's crop: each tile gives only its centre, see
        :func:`crop_intervals`) or ``"monai_gaussian"`` (MONAI's Gaussian importance map,
        see :func:`monai_gaussian_window`).
    sigma_scale
        Only with ``window="monai_gaussian"``: MONAI's ``sigma_scale``, a positive number or
        one per tiled axis (default :data:`MONAI_SIGMA_SCALE`).
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
        Unknown ``window``, ``sigma_scale`` with another window or not positive, ``out`` of
        the wrong shape, a tile added twice, or a tile output of the wrong shape.
    TypeError
        ``grid`` is not a :class:`GridSampler`, ``volume`` missing for a grid over a
        collection (or given for one volume's grid), or ``progress`` is not ``True``,
        ``False`` or ``None``.
    IndexError
        ``volume`` is not a volume of the collection.

    Notes
    -----
    Sums are kept in float64 and divided by the summed window once, in
    :meth:`result`; the summed window is the product of one 1-D sum per axis, so it is
    never stored. With ``window="mean"`` an identity model gives back the input exactly
    (for inputs float64 holds exactly: every integer and float32 type); so does
    ``window="crop"``, where each voxel comes from exactly one tile.
    ``window="monai_gaussian"`` is not separable (MONAI's floor acts on the N-D product), so
    it also keeps the summed window: one more float64 volume of ``grid.shape`` (without the
    channel axes), beside the accumulator.
    """

    def __init__(
        self,
        grid: GridSampler,
        *,
        volume: int | None = None,
        channels: int | Sequence[int] | None = None,
        dtype: DTypeLike = np.float32,
        window: str = "mean",
        sigma_scale: float | Sequence[float] | None = None,
        out: Any = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
    ) -> None:
        self._grid = tiling = _tiling(grid, volume)
        self._progress = parse_progress(progress)
        if window not in WINDOWS:
            raise ValueError(f"window={window!r} is not one of {', '.join(map(repr, WINDOWS))}")
        if sigma_scale is not None and window != "monai_gaussian":
            raise ValueError(
                f"sigma_scale={sigma_scale!r} only applies to window='monai_gaussian', not "
                f"window={window!r}; drop it or pass window='monai_gaussian'"
            )
        self._window, self._out = window, out
        self._dtype = np.dtype(out.dtype if out is not None else dtype)
        self._scratch_dir = scratch_dir
        nd = len(tiling.shape)
        if out is not None:
            if tuple(out.shape[-nd:]) != tiling.shape or len(out.shape) < nd:
                raise ValueError(
                    f"out has shape {tuple(out.shape)}; expected (*channels, *{tiling.shape})"
                )
            lead: tuple[int, ...] | None = tuple(out.shape[:-nd])
            if channels is not None and _shape(channels) != lead:
                raise ValueError(f"channels={channels!r} disagrees with out's shape {out.shape}")
        else:
            lead = None if channels is None else _shape(channels)
        self._lead = lead
        self._acc: np.ndarray | None = None
        self._weight_sum: np.ndarray | None = None
        self._seen = np.zeros(math.prod(tiling.grid_shape), dtype=bool)
        self._tile_window: NDArray[np.float64] | None = None
        if window == "monai_gaussian":
            scale = MONAI_SIGMA_SCALE if sigma_scale is None else sigma_scale
            self._tile_window = monai_gaussian_window(tiling.patch_size, scale)
        elif window in ("gaussian", "hann"):
            tile_w = [window_1d(p, window) for p in tiling.patch_size]
            self._tile_window = np.asarray(math.prod(np.ix_(*tile_w)))
        self._kept = [
            _kept(d, s, p, window, o)
            for d, s, p, o in zip(tiling.shape, tiling.starts, tiling.patch_size, tiling.overlap)
        ]
        self._done = False

    @property
    def tiles_added(self) -> int:
        """How many distinct tiles have been added."""
        return int(self._seen.sum())

    def _zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        if self._out is None:
            return np.zeros(shape)
        fd, path = tempfile.mkstemp(suffix=".acc", dir=self._scratch_dir)
        os.close(fd)
        acc = np.memmap(path, dtype=np.float64, mode="w+", shape=shape)
        with contextlib.suppress(OSError):  # the mapping keeps the data alive
            os.remove(path)
        return acc

    def _accumulator(self, lead: tuple[int, ...]) -> np.ndarray:
        if self._acc is None:
            self._acc = self._zeros((*lead, *self._grid.shape))
            if self._window == "monai_gaussian":
                self._weight_sum = self._zeros(self._grid.shape)
        return self._acc

    def _tile_positions(self, coords: NDArray[np.int64]) -> list[NDArray[np.intp]]:
        starts = self._grid.starts
        multi: list[NDArray[np.intp]] = []
        for a, s in enumerate(starts):
            pos = np.searchsorted(s, coords[:, a])
            pos = np.minimum(pos, len(s) - 1)
            if (s[pos] != coords[:, a]).any():
                bad = coords[np.flatnonzero(s[pos] != coords[:, a])[0]].tolist()
                raise ValueError(f"coords {bad} is not a corner of the grid's tiles")
            multi.append(pos)
        return multi

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
        multi = self._tile_positions(corners)
        tiles = np.ravel_multi_index(tuple(multi), self._grid.grid_shape).astype(np.int64)
        again = tiles[self._seen[tiles]]
        if again.size or np.unique(tiles).size != tiles.size:
            first = int(again[0]) if again.size else int(tiles[0])
            raise ValueError(f"tile {first} was added twice; add each grid tile once")
        acc = self._accumulator(lead)
        shape = self._grid.shape
        for b, corner in enumerate(corners.tolist()):
            kept = [self._kept[a][int(m[b])] for a, m in enumerate(multi)]
            dest = [slice(max(lo, 0), min(hi, d)) for (lo, hi), d in zip(kept, shape)]
            src = tuple(slice(s.start - c, s.stop - c) for s, c in zip(dest, corner))
            tile = values[b][(Ellipsis, *src)].astype(np.float64)
            where: tuple[Any, ...] = (Ellipsis, *dest)
            if self._tile_window is not None:
                tile = tile * self._tile_window[src]
                if self._weight_sum is not None:
                    self._weight_sum[where] += self._tile_window[src]
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
        g = self._grid
        cover = [
            coverage_1d(d, s, p, "mean" if self._window == "monai_gaussian" else self._window, o)
            for d, s, p, o in zip(g.shape, g.starts, g.patch_size, g.overlap)
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
                if self._weight_sum is not None:  # not separable: the summed window itself
                    norm = self._weight_sum[zs]
                else:
                    norm = math.prod(np.ix_(cover[0][zs], *cover[1:]))
                where: tuple[Any, ...] = (Ellipsis, zs, *(slice(None),) * (len(cover) - 1))
                target[where] = (acc[where] / norm).astype(self._dtype)
                bar.update(1)
        self._done, self._acc, self._weight_sum = True, None, None
        return target


def _shape(channels: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(channels, (int, np.integer)):
        return (int(channels),)
    return tuple(int(c) for c in channels)


def stitch(
    grid: GridSampler,
    fn: Callable[[Any], ArrayLike],
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

    For a grid over a :class:`~mixle.VolumeCollection`, every volume is stitched on its
    own (the window and crop rules apply per volume) and the result is one output per
    volume: without ``out``, a dict ``{key: ndarray}`` in the collection's order (keys
    are ``grid.collection.keys``); with ``out`` a zarr group (or an h5py group), one new
    array per volume, named by :func:`volume_array_names` and carrying its key and index
    in its attributes ``"mixle_volume_key"`` and ``"mixle_volume"``; the group is
    returned. ``fn`` gets the batch's tiles: an array, or ``{name: tiles}`` for dict
    volumes. Batches may span two volumes; a volume's output is finished as soon as its
    last tile is added, so at most the volumes of one batch are accumulated at a time.

    Raises
    ------
    ValueError
        ``batch_size`` below 1; for a collection, ``fn`` returned a number of outputs
        other than the batch's, or ``out`` already holds an array of a volume's name.
    TypeError
        ``out`` for a collection is not a group.
    """
    batch_size = parse_int(batch_size, "batch_size")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    progress = parse_progress(progress)
    if isinstance(grid, VolumeGridSampler):
        return _stitch_volumes(grid, fn, batch_size, progress, aggregator_options)
    agg = GridAggregator(grid, progress=progress, **aggregator_options)
    n = len(grid)
    with progress_bar(n, "stitching tiles", "tile", enabled=progress) as bar:
        for lo in range(0, n, batch_size):
            tiles, coords = grid.get_batch(np.arange(lo, min(lo + batch_size, n)))
            agg.add(fn(tiles), coords)
            bar.update(len(coords))
    return agg.result()


def volume_array_names(keys: Sequence[str]) -> tuple[str, ...]:
    """The array name of each volume key in a :func:`stitch` output group.

    Every run of characters other than ASCII letters, digits, ``.``, ``_`` and ``-``
    becomes one ``_``, and leading and trailing ``.`` and ``_`` are dropped
    (``"/data/case 01.zarr"`` -> ``"data_case_01.zarr"``, ``"#3"`` -> ``"3"``); an empty
    result is ``"volume"``. Keys that give the same name get ``-<volume index>`` appended
    (``"a/b"`` and ``"a_b"`` -> ``"a_b-0"`` and ``"a_b-1"``). Names are valid zarr and HDF5
    array names (no ``/``, never ``.``, ``..`` or a leading ``__``).

    Raises
    ------
    ValueError
        Two keys still give one name after the suffix (a key that already ends in the
        suffix another one gets).
    """
    names = [re.sub(r"[^A-Za-z0-9._-]+", "_", str(k)).strip("._") or "volume" for k in keys]
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    out = [f"{n}-{v}" if seen[n] > 1 else n for v, n in enumerate(names)]
    if len(set(out)) != len(out):
        dup = next(n for n in out if out.count(n) > 1)
        raise ValueError(
            f"two volume keys give the array name {dup!r}; give the volumes distinct keys"
        )
    return tuple(out)


def _group_array(group: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A new array ``name`` in a zarr group (``create_array``) or h5py group."""
    if name in group:
        raise ValueError(
            f"out already holds {name!r}; stitch into an empty group or remove that array"
        )
    make = getattr(group, "create_array", None)
    if make is None:
        return group.create_dataset(name, shape=shape, dtype=dtype)
    return make(name, shape=shape, dtype=dtype)


def _stitch_volumes(
    grid: VolumeGridSampler,
    fn: Callable[[Any], ArrayLike],
    batch_size: int,
    progress: bool,
    options: dict[str, Any],
) -> Any:
    """:func:`stitch` for a grid over a collection: one output per volume."""
    options = dict(options)
    group = options.pop("out", None)
    if group is not None and not (
        hasattr(group, "create_array") or hasattr(group, "create_dataset")
    ):
        raise TypeError(
            f"out={type(group).__name__} must be a zarr group (one array per volume is made "
            "in it) or None (a dict of ndarrays) for a grid over a VolumeCollection"
        )
    keys = grid.collection.keys
    names = volume_array_names(keys) if group is not None else ()
    dtype = np.dtype(options.get("dtype", np.float32))
    channels = options.get("channels")
    counts = grid.tile_counts
    tiled = len(grid.patch_size)
    arrays = grid.collection.names  # None: one array per volume, its tiles under "patch"
    results: dict[str, Any] = {}
    live: dict[int, GridAggregator] = {}
    n = len(grid)
    with progress_bar(n, "stitching tiles", "tile", enabled=progress) as bar:
        for lo in range(0, n, batch_size):
            batch = grid.get_batch(np.arange(lo, min(lo + batch_size, n)))
            tiles = batch[PATCH_KEY] if arrays is None else {k: batch[k] for k in arrays}
            outputs = np.asarray(fn(tiles))
            vol = batch[VOLUME_KEY]
            if outputs.ndim < 1 or outputs.shape[0] != vol.size:
                raise ValueError(
                    f"fn returned outputs of shape {outputs.shape} for a batch of {vol.size} "
                    "tiles; it must return one output per tile, stacked on the first axis"
                )
            for v in np.unique(vol).tolist():
                rows = vol == v
                if v not in live:
                    out = None
                    if group is not None:
                        lead = (
                            _shape(channels)
                            if channels is not None
                            else tuple(outputs.shape[1 : outputs.ndim - tiled])
                        )
                        out = _group_array(group, names[v], (*lead, *grid.volume_shape(v)), dtype)
                        out.attrs["mixle_volume_key"] = keys[v]
                        out.attrs["mixle_volume"] = v
                    live[v] = GridAggregator(
                        grid, volume=v, progress=False, **{**options, "out": out}
                    )
                live[v].add(outputs[rows], batch[COORDS_KEY][rows])
                if live[v].tiles_added == counts[v]:
                    results[keys[v]] = live.pop(v).result()
            bar.update(vol.size)
    return group if group is not None else results
