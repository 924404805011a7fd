"""Grid tiling of every volume of a :class:`~mixle.VolumeCollection`, one volume after another."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.volumes import group_by_volume
from mixle.data.sampling.aligned import COORDS_KEY, PATCH_KEY, VOLUME_KEY
from mixle.data.sampling.grid import GridSampler, parse_overlap
from mixle.data.sampling.padding import (
    fill_outside,
    parse_pad_value,
    parse_padding,
    read_boxes_padded,
)
from mixle.data.sampling.patch_args import (
    fingerprint_digest,
    parse_index,
    per_axis,
    record_indices,
    split_channels,
)
from mixle.data.sampling.volume_args import parse_columns
from mixle.data.sources.collection import VolumeCollection
from mixle.data.spec import ArraySpec
from mixle.reading.pool import run_all

__all__ = ["COORDS_KEY", "PATCH_KEY", "VOLUME_KEY", "VolumeGridSampler"]

Record = dict[str, Any]


def _as_names(shape: Any) -> dict[str | None, tuple[int, ...]]:
    """One volume's shape(s) by array name (``None`` for a volume of one array)."""
    if isinstance(shape, dict):
        return {str(k): tuple(int(n) for n in v) for k, v in shape.items()}
    return {None: tuple(int(n) for n in shape)}


class VolumeGridSampler(GridSampler, tiles=VolumeCollection):
    """Every tile of every volume of a collection: volume 0's tiles, then volume 1's, ...

    Made by ``GridSampler(vols, patch_size, ...)`` when ``vols`` is a
    :class:`~mixle.VolumeCollection`; the arguments mean what they mean for one volume
    (see :class:`~mixle.GridSampler`) and apply to each volume on its own.

    Parameters
    ----------
    array
        The :class:`~mixle.VolumeCollection`. Its shapes are read at construction
        (metadata only, cached by the collection).
    patch_size, overlap, padding, pad_value, pad_overlap
        As for :class:`~mixle.GridSampler`, the same for every volume. Axes before the
        ``len(patch_size)`` trailing ones are channel axes, read whole; every volume must
        have the same channel shape.
    columns
        Metadata columns of the collection added to every record (one value per tile), as
        for the collection's :class:`~mixle.PatchSampler`.

    Raises
    ------
    ValueError
        A volume the tiles do not fit (with ``padding="none"``, or the padded volume with
        ``pad_overlap``), volumes with different channel shapes, a dict volume whose arrays
        differ in their tiled axes, an array named ``"coords"`` or ``"volume"``, or a
        ``pad_value`` the dtype does not hold; each names the volume's key.

    Notes
    -----
    Records are dicts: ``{"patch": tile, "coords": corner, "volume": v}``, for dict volumes
    ``{name: tile, ..., "coords", "volume"}`` (every array cut at the same corner; arrays
    at other scales need :class:`~mixle.PatchSampler`). ``coords`` is the corner on the
    tiled axes of its own volume, as one volume's :class:`~mixle.GridSampler` gives it, so
    :func:`~mixle.stitch` and :class:`~mixle.GridAggregator` (``volume=v``) put every
    prediction back into its own volume.

    Index ``i`` means tile ``i - offsets[v]`` of volume ``v``, where ``offsets`` is the
    cumulative table of tile counts (:attr:`volume_offsets`, O(volumes) memory); within a
    volume tiles are in C order. A batch is grouped by volume and each volume's tiles are
    read in one batched read through a lease of that volume, the volumes in parallel on
    the decode pool. With the collection's ``dtype=`` the tiles have that dtype.
    The grid pickles by reference: the collection (by reference, with its cached shapes)
    and the arguments; unpickling rebuilds the tile table without reading a volume.
    """

    def __init__(
        self,
        array: VolumeCollection,
        patch_size: int | Sequence[int],
        *,
        overlap: int | Sequence[int] = 0,
        padding: str = "none",
        pad_value: float = 0,
        pad_overlap: bool = False,
        columns: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(array, VolumeCollection):
            raise TypeError(f"array={type(array).__name__} must be a VolumeCollection")
        vols = array
        self._vols = vols
        self._padding = parse_padding(padding)
        if not isinstance(pad_overlap, (bool, np.bool_)):
            raise TypeError(f"pad_overlap={pad_overlap!r} must be True or False")
        self._pad_overlap = bool(pad_overlap)
        if self._pad_overlap and self._padding == "none":
            raise ValueError(
                "pad_overlap=True pads overlap // 2 voxels on every side, but padding='none' "
                "has nothing to fill them with; pass padding='constant', 'reflect' or 'edge'"
            )
        self._columns = parse_columns(vols, columns)
        keys = vols.keys
        shapes = [_as_names(s) for s in vols.shapes()]
        names = list(shapes[0])
        for reserved in (COORDS_KEY, VOLUME_KEY):
            if reserved in names:
                raise ValueError(
                    f"volume {keys[0]!r} has an array named {reserved!r}, the record key of "
                    "each tile's corner or volume; rename that array"
                )
        first = names[0]
        self._lead: dict[str | None, tuple[int, ...]] = {}
        spatial0: tuple[int, ...] | None = None
        for name in names:
            lead, spatial = split_channels(patch_size, shapes[0][name])
            self._lead[name] = lead
            if spatial0 is not None and len(spatial) != len(spatial0):
                raise ValueError(
                    f"patch_size={patch_size!r} names {len(spatial0)} tiled axes of array "
                    f"{first!r} but {len(spatial)} of array {name!r} in volume {keys[0]!r}; "
                    "pass one int per tiled axis"
                )
            spatial0 = spatial if spatial0 is None else spatial0
        assert spatial0 is not None
        nd = len(spatial0)
        self._patch_size = per_axis(patch_size, nd, "patch_size", 1)
        self._overlap = parse_overlap(overlap, self._patch_size)
        self._shapes = np.empty((len(shapes), nd), dtype=np.int64)
        for v, by_name in enumerate(shapes):
            self._shapes[v] = self._check_volume(v, keys[v], by_name, names)
        self._dtypes = self._output_dtypes(names)
        self._pad_values = {
            name: parse_pad_value(pad_value, dt) if self._padding == "constant" else 0
            for name, dt in self._dtypes.items()
        }
        self._pad_value = self._pad_values[first]
        self._pad_value_given = pad_value
        border = np.asarray(self._overlap, dtype=np.int64) // 2 if self._pad_overlap else 0
        self._border = np.broadcast_to(np.asarray(border, dtype=np.int64), (nd,)).copy()
        self._step = np.asarray(self._patch_size, dtype=np.int64) - np.asarray(self._overlap)
        length = self._shapes + 2 * self._border
        extra = length - np.asarray(self._patch_size, dtype=np.int64)
        self._grid_shapes = 1 + np.maximum(0, -(-extra // self._step))
        counts = np.prod(self._grid_shapes, axis=1, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    # -- construction helpers -------------------------------------------------------------
    def _check_volume(
        self,
        v: int,
        key: str,
        by_name: dict[str | None, tuple[int, ...]],
        names: list[str | None],
    ) -> tuple[int, ...]:
        """The tiled shape of volume ``v``, after checking it against volume 0's layout."""
        if list(by_name) != names:
            raise ValueError(
                f"volume {key!r} (index {v}) has arrays {list(by_name)}, volume 0 has {names}"
            )
        nd = len(self._patch_size)
        spatial: tuple[int, ...] | None = None
        for name, shape in by_name.items():
            what = "volume" if name is None else f"array {name!r} of volume"
            lead = self._lead[name]
            if len(shape) != len(lead) + nd or tuple(shape[: len(lead)]) != lead:
                raise ValueError(
                    f"{what} {key!r} (index {v}) has shape {shape}; every volume must have "
                    f"channel shape {lead} before the {nd} tiled axes, as volume 0 has"
                )
            here = tuple(shape[len(lead) :])
            if spatial is not None and here != spatial:
                raise ValueError(
                    f"{what} {key!r} (index {v}) has tiled shape {here}, the other arrays "
                    f"{spatial}; a grid cuts every array at the same corner (arrays at other "
                    "scales need PatchSampler)"
                )
            spatial = here
        assert spatial is not None
        self._check_fits(v, key, spatial)
        return spatial

    def _check_fits(self, v: int, key: str, spatial: tuple[int, ...]) -> None:
        pad = (
            [o // 2 for o in self._overlap]
            if self._pad_overlap
            else [0 if self._padding == "none" else None] * len(spatial)
        )
        for a, (p, d, b) in enumerate(zip(self._patch_size, spatial, pad)):
            if b is not None and p > d + 2 * b:
                hint = (
                    "make it smaller or pass pad_overlap=False"
                    if self._pad_overlap
                    else "make it smaller or pass padding='constant', 'reflect' or 'edge'"
                )
                raise ValueError(
                    f"patch_size={self._patch_size} is larger than volume {key!r} (index {v}) "
                    f"of tiled shape {spatial}{' padded by overlap // 2' if b else ''} "
                    f"(axis {a}: {p} > {d + 2 * b}); {hint}"
                )

    def _output_dtypes(self, names: list[str | None]) -> dict[str | None, np.dtype]:
        dtype = self._vols.dtype
        if isinstance(dtype, dict):
            return {name: np.dtype(dtype[name]) for name in names}
        return {name: np.dtype(dtype) for name in names}

    # -- description ----------------------------------------------------------------------
    @property
    def collection(self) -> VolumeCollection:
        """The collection tiles are cut from."""
        return self._vols

    @property
    def source(self) -> Any:
        """Not defined for a collection (one source per volume): use :attr:`collection`."""
        raise AttributeError(
            "a grid over a VolumeCollection has one source per volume; use .collection"
        )

    @property
    def shape(self) -> tuple[int, ...]:
        """Not defined for a collection: use :meth:`volume_shape`."""
        raise AttributeError(
            "a grid over a VolumeCollection has one shape per volume; use .volume_shape(v)"
        )

    @property
    def starts(self) -> tuple[NDArray[np.int64], ...]:
        """Not defined for a collection: use :meth:`volume_starts`."""
        raise AttributeError(
            "a grid over a VolumeCollection has tile starts per volume; use .volume_starts(v)"
        )

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Not defined for a collection: use :meth:`volume_grid_shape`."""
        raise AttributeError(
            "a grid over a VolumeCollection has one grid shape per volume; use "
            ".volume_grid_shape(v)"
        )

    @property
    def channel_shape(self) -> Any:
        """Channel axes every tile holds whole: a tuple, or ``{name: tuple}`` for dicts."""
        if None in self._lead:
            return self._lead[None]
        return dict(self._lead)

    @property
    def num_volumes(self) -> int:
        """Number of volumes tiled."""
        return len(self._shapes)

    @property
    def tile_counts(self) -> NDArray[np.int64]:
        """Tiles of each volume, int64 ``(volumes,)``."""
        return np.diff(self._offsets)

    @property
    def volume_offsets(self) -> NDArray[np.int64]:
        """Index of each volume's first tile, and the total at the end: ``(volumes + 1,)``."""
        return self._offsets.copy()

    def _volume(self, v: int) -> int:
        n = self.num_volumes
        return parse_index(v, n, f"a collection of {n} volumes")

    def volume_shape(self, v: int) -> tuple[int, ...]:
        """Shape of the tiled axes of volume ``v``."""
        return tuple(int(n) for n in self._shapes[self._volume(v)])

    def volume_grid_shape(self, v: int) -> tuple[int, ...]:
        """Number of tiles per tiled axis of volume ``v``."""
        return tuple(int(n) for n in self._grid_shapes[self._volume(v)])

    def volume_starts(self, v: int) -> tuple[NDArray[np.int64], ...]:
        """Tile starts per tiled axis of volume ``v`` (as its own :class:`GridSampler`'s)."""
        v = self._volume(v)
        counts = self._grid_shapes[v]
        return tuple(
            self._axis_starts(np.arange(c, dtype=np.int64), int(c), a, int(self._shapes[v, a]))
            for a, c in enumerate(counts)
        )

    def volume_tiles(self, v: int) -> range:
        """The indices of volume ``v``'s tiles."""
        v = self._volume(v)
        return range(int(self._offsets[v]), int(self._offsets[v + 1]))

    def element_spec(self) -> dict[str, ArraySpec]:
        """Spec of one record, from metadata: the tile(s), ``"coords"`` and ``"volume"``."""
        tiles = {
            PATCH_KEY if name is None else name: ArraySpec(
                (*self._lead[name], *self._patch_size), self._dtypes[name]
            )
            for name in self._lead
        }
        first = self._vols.metadata_batch(np.zeros(1, dtype=np.int64), self._columns)
        return {
            **tiles,
            COORDS_KEY: ArraySpec((len(self._patch_size),), np.dtype(np.int64)),
            VOLUME_KEY: ArraySpec((), np.dtype(np.int64)),
            **{c: ArraySpec(first[c].shape[1:], first[c].dtype) for c in self._columns},
        }

    def fingerprint(self) -> str:
        """A digest of everything that decides which tile an index means (no I/O).

        Covers the collection's own fingerprint (volumes, keys, names, cast), every
        volume's tiled shape, ``patch_size``, ``overlap``, ``padding``, the fill value and
        ``pad_overlap``.
        """
        return fingerprint_digest(
            "GridSampler/volumes",
            {
                "collection": self._vols.fingerprint(),
                "shapes": fingerprint_digest("shapes", {"shapes": self._shapes}),
                "patch_size": self._patch_size,
                "overlap": self._overlap,
                "padding": self._padding,
                "pad_value": self._pad_value,
                "pad_overlap": self._pad_overlap,
            },
        )

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by reference: the collection (by reference) and the arguments, no tables."""
        args = (self._patch_size, self._overlap, self._padding, self._pad_value_given)
        return (_rebuild, (self._vols, *args, self._pad_overlap, self._columns))

    def __repr__(self) -> str:
        return (
            f"GridSampler({self._vols!r}, patch_size={self._patch_size}, "
            f"overlap={self._overlap}, padding={self._padding!r}, "
            f"{'pad_overlap=True, ' if self._pad_overlap else ''}"
            f"volumes={self.num_volumes}, tiles={len(self)})"
        )

    # -- placement (no I/O) ---------------------------------------------------------------
    def _axis_starts(
        self, k: NDArray[np.int64], count: Any, axis: int, length: Any
    ) -> NDArray[np.int64]:
        """Start of tile ``k`` of ``count`` along ``axis`` of a volume of ``length``."""
        p, b = self._patch_size[axis], int(self._border[axis])
        start = k * self._step[axis]
        if self._padding == "none" or self._pad_overlap:  # the last tile ends at the edge
            last = (k == count - 1) & (count > 1)
            start = np.where(last, length + 2 * b - p, start)
        return np.asarray(start - b, dtype=np.int64)

    def volumes_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """The volume of tiles ``indices`` (default: all), int64 ``(N,)``; no I/O."""
        idx = record_indices(indices, len(self))
        return np.searchsorted(self._offsets, idx, side="right").astype(np.int64) - 1

    def coords_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """Corners of tiles ``indices`` (default: all), each in its own volume: ``(N, ndim)``."""
        idx = record_indices(indices, len(self))
        return self._corners(idx, self.volumes_array(idx))

    def _corners(self, idx: NDArray[np.int64], vol: NDArray[np.int64]) -> NDArray[np.int64]:
        local = idx - self._offsets[vol]
        grid = self._grid_shapes[vol]
        out = np.empty((idx.size, len(self._patch_size)), dtype=np.int64)
        for a in range(len(self._patch_size) - 1, -1, -1):  # C order: the last axis fastest
            k = local % grid[:, a]
            local = local // grid[:, a]
            out[:, a] = self._axis_starts(k, grid[:, a], a, self._shapes[vol, a])
        return out

    # -- reading --------------------------------------------------------------------------
    def _read(self, vol: NDArray[np.int64], corners: NDArray[np.int64]) -> dict[str, np.ndarray]:
        """Tiles at ``corners`` of volumes ``vol``, every array stacked in index order."""
        b = corners.shape[0]
        outs = {
            name: np.empty((b, *self._lead[name], *self._patch_size), dtype=self._dtypes[name])
            for name in self._lead
        }
        groups = group_by_volume(vol)  # largest first: the caller reads it, the pool the rest
        run_all([partial(self._read_volume, int(vol[r[0]]), corners[r], outs, r) for r in groups])
        return {PATCH_KEY if name is None else name: out for name, out in outs.items()}

    def _read_volume(
        self,
        v: int,
        corners: NDArray[np.int64],
        outs: dict[str | None, np.ndarray],
        rows: NDArray[np.intp],
    ) -> None:
        """Read volume ``v``'s tiles at ``corners`` into ``outs[name][rows]``, inside a lease."""
        with self._vols.lease(v) as src:
            for name, out in outs.items():
                self._read_into(src if name is None else src[name], name, corners, out, rows)

    def _read_into(
        self,
        source: Any,
        name: str | None,
        corners: NDArray[np.int64],
        out: np.ndarray,
        rows: NDArray[np.intp],
    ) -> None:
        """Read one volume's boxes (the read path of one volume's grid) into ``out[rows]``."""
        lead = self._lead[name]
        starts = np.zeros((corners.shape[0], len(lead) + corners.shape[1]), dtype=np.int64)
        starts[:, len(lead) :] = corners
        size = (*lead, *self._patch_size)
        pad = self._pad_values[name] if self._padding == "constant" else 0
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        same = np.dtype(source.dtype) == out.dtype
        if same and hi - lo == rows.size:  # tiles in index order: read in place
            read_boxes_padded(
                source, starts, size, padding=self._padding, pad_value=pad, out=out[lo:hi]
            )
            return
        if same or self._padding != "constant":
            out[rows] = read_boxes_padded(
                source, starts, size, padding=self._padding, pad_value=pad
            )
            return
        # a cast: pad_value fits the output dtype, perhaps not the stored one (-1 for uint8)
        block = read_boxes_padded(source, starts, size, padding="constant").astype(out.dtype)
        fill_outside(block, corners, tuple(source.shape)[len(lead) :], self._patch_size, pad)
        out[rows] = block

    def __getitem__(self, index: int) -> Record:  # type: ignore[override]
        """Tile ``index``: ``{"patch": tile, "coords": corner, "volume": v}`` (or by array name)."""
        n = len(self)
        i = np.asarray([parse_index(index, n, f"a grid of {n} tiles")], dtype=np.int64)
        batch = self.get_batch(i)
        return {key: value[0] for key, value in batch.items()}

    def get_batch(self, indices: ArrayLike) -> Record:  # type: ignore[override]
        """Tiles ``indices`` stacked, grouped by volume for reading, in the order asked.

        ``{"patch": (B, *channels, *patch_size), "coords": (B, ndim), "volume": (B,)}``;
        for dict volumes one entry per array name instead of ``"patch"``. ``coords`` is each
        tile's corner in its own volume (int64), ``volume`` its volume (int64).
        """
        idx = record_indices(indices, len(self))
        vol = self.volumes_array(idx)
        corners = self._corners(idx, vol)
        columns = self._vols.metadata_batch(vol, self._columns) if self._columns else {}
        return {**self._read(vol, corners), COORDS_KEY: corners, VOLUME_KEY: vol, **columns}

    def records(self) -> Iterator[Record]:  # type: ignore[override]
        """Yield the record of every tile in order."""
        for i in range(len(self)):
            yield self[i]

    def __iter__(self) -> Iterator[Record]:  # type: ignore[override]
        return self.records()


def _rebuild(
    vols: VolumeCollection,
    patch_size: tuple[int, ...],
    overlap: tuple[int, ...],
    padding: str,
    pad_value: float,
    pad_overlap: bool,
    columns: tuple[str, ...] = (),
) -> VolumeGridSampler:
    """Unpickle a :class:`VolumeGridSampler` (the collection brings its cached shapes)."""
    return VolumeGridSampler(
        vols,
        patch_size,
        overlap=overlap,
        padding=padding,
        pad_value=pad_value,
        pad_overlap=pad_overlap,
        columns=columns,
    )
