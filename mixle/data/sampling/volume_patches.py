"""Seeded random patches across the volumes of a :class:`~mixle.VolumeCollection`.

``PatchSampler(collection, ...)`` returns a :class:`VolumePatchSampler`. Index ``i`` first
picks its volume (:mod:`mixle.data.index_math.volumes`), then its corner inside that volume
with the placement of a single-volume sampler over it (a :class:`PatchLayout` built per
volume, the first time the volume is drawn). Batches are read volume by volume, each
through a lease of the collection (its handle stays open meanwhile), in parallel on the
decode pool.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import MASK64, parse_seed
from mixle.data.index_math.volumes import (
    group_by_volume,
    permuted_positions,
    uniform_valid_volumes,
    weighted_volumes,
)
from mixle.data.sampling.aligned import COORDS_KEY, PATCH_KEY, VOLUME_KEY, AlignedArrays
from mixle.data.sampling.padding import (
    fill_outside,
    parse_pad_value,
    parse_padding,
)
from mixle.data.sampling.patch_args import (
    check_combination,
    fingerprint_digest,
    parse_epoch,
    parse_index,
    parse_stride,
    record_indices,
    split_channels,
)
from mixle.data.sampling.patch_layout import PatchLayout, parse_patch_layout
from mixle.data.sampling.patch_sampler import PatchSampler, check_size_args, parse_world
from mixle.data.sampling.physical_patches import (
    WORLD_KEY,
    SizeMm,
    describe_sizes,
    finest_array,
    parse_patch_size_mm,
    patch_size_from_mm,
    spatial_affine,
    world_positions,
)
from mixle.data.sampling.volume_args import (
    full_size,
    parse_columns,
    parse_size,
    parse_volume_weights,
    spatial_shape,
)
from mixle.data.schema import Schema, parse_schema
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.collection import VolumeCollection
from mixle.data.spec import ArraySpec
from mixle.data.structure import EXCHANGEABLE, SampleStructure, parse_structure
from mixle.errors import NothingToSampleError
from mixle.reading.pool import run_all
from mixle.utils.forks import ForkLock
from mixle.utils.validation import parse_int

__all__ = ["VolumePatchSampler"]

#: Locks that serialise building one volume's layout, shared by volume index modulo this.
_BUILD_LOCKS = 64
#: Serialises the reset of a sampler's locks in a forked child.
_FORK_LOCK = ForkLock()


class VolumePatchSampler(PatchSampler, collections=VolumeCollection):
    """``num_patches`` seeded random patches across the volumes of a collection.

    Made by ``PatchSampler(collection, patch_size, num_patches, ...)``; every argument of
    :class:`~mixle.PatchSampler` applies to each volume, plus:

    Parameters
    ----------
    volume_weights
        How the volume of each patch is drawn: ``"uniform"`` (default, every volume
        equally likely; reads the shape of the volumes drawn only), ``"voxels"``
        (proportional to each volume's spatial voxel count, reads every shape), the name
        of a numeric metadata column, or one weight per volume (array-like, ``>= 0``).
    patches_per_volume
        Locality: every ``patches_per_volume`` consecutive indices come from one volume
        (and, with ``patches_per_chunk``, share regions of it). :attr:`shuffle_block` is
        this number, so a shuffled :class:`~mixle.Loader` keeps those runs together.
    columns
        Metadata columns of the collection added to every record (one value per patch).
    patch_size_mm
        As for one volume, converted with each volume's own spacing (dict volumes: the
        finest array's) when the sampler is made, which reads every volume's metadata. The
        volumes must all give the same voxel patch size, since a batch stacks patches of
        one shape: volumes of different spacings raise ``ValueError`` listing the spacings
        and the voxel sizes they give. Resample them to one spacing first (TorchIO's
        ``Resample``, or when converting them), or pass ``patch_size=`` in voxels (the
        same voxels in every volume, so a different physical extent per spacing).
    world
        ``True`` adds ``"world"``: the float64 world position of each patch's corner,
        ``affine @ [*coords, 1]`` with that volume's own affine (dict volumes: the finest
        array's). A volume that records no affine, or whose recorded spatial axes are
        not the patched ones (as for one volume; axes of length 1 among or after them
        are fine), raises ``ValueError`` naming it, the first time it is drawn. Every
        volume must give world positions of one length (volume 0's spatial axes).

    Notes
    -----
    Records are dicts: ``{"patch": patch, "coords": corner, "volume": v}`` (for volumes
    that are dicts of arrays, one entry per array name instead of ``"patch"``) plus the
    ``columns``. ``coords`` is the int64 corner on the volume's spatial axes, ``volume``
    the int64 index of the volume in the collection.

    The volume of index ``i`` is a pure function of ``(seed, epoch, i // patches_per_volume)``
    and its corner of ``(seed, epoch, i)`` and that volume's shape, exactly as for one
    volume: the same in every process and whatever the order indices are asked in.

    A volume that cannot hold a patch (smaller than ``patch_size`` with
    ``padding="none"``) is skipped with a warning (once, when it is first drawn for
    uniform weights; when the sampler is made otherwise): uniform draws redraw (every other volume
    stays equally likely), weighted draws give it weight 0, and sampling without
    replacement gives it no positions. ``replacement=False`` visits every stride-grid
    position of every volume once per pass (``num_patches`` defaults to their number) and
    takes neither ``volume_weights`` nor ``patches_per_volume``.

    Volumes must agree on the patch they give (dtype, channels, scale factors of a dict);
    one that does not raises ``ValueError`` naming it the first time it is drawn, unless
    the collection casts (``read_volumes(..., dtype=)``), which relaxes the dtype only.
    ``weights=``/``labels=`` name arrays of dict volumes (``labels="label"``); each
    volume's map is indexed the first time that volume is drawn. A volume whose map lacks
    a class of ``label_probabilities`` draws the other classes, renormalised (a scan with
    no lesion gives background patches), with a warning; one with no class left, or with
    weights zero wherever a patch fits, is skipped with a warning.
    """

    #: ``world=True`` (class defaults: pickles made before these arguments existed).
    _world_on: bool = False
    _volumes_mm: SizeMm | None = None

    def __init__(
        self,
        array: VolumeCollection,
        patch_size: int | Sequence[int] | None = None,
        num_patches: int | None = None,
        *,
        seed: int = 0,
        epoch: int = 0,
        stride: int | Sequence[int] | None = None,
        replacement: bool = True,
        patches_per_chunk: int = 1,
        region: int | Sequence[int] | None = None,
        padding: str = "none",
        pad_value: float | Mapping[str, float] = 0,
        weights: Any = None,
        labels: Any = None,
        label_probabilities: Mapping[int, float] | None = None,
        scales: Mapping[str, object] | None = None,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
        progress: bool | None = None,
        volume_weights: Any = "uniform",
        patches_per_volume: int = 1,
        columns: Sequence[str] | None = None,
        patch_size_mm: float | Sequence[float] | None = None,
        world: bool = False,
    ) -> None:
        check_size_args(patch_size, patch_size_mm)
        self._world_on = parse_world(world)
        vols = array
        if len(vols) == 0:
            raise ValueError("the collection has no volumes; a sampler needs at least one")
        for name, value in (("weights", weights), ("labels", labels)):
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"{name}={value!r}: over a collection, {name}= names an array of the "
                    f"volumes' dicts (e.g. {name}='label'), one map per volume"
                )
        if not isinstance(replacement, (bool, np.bool_)):
            raise TypeError(f"replacement={replacement!r} must be True or False")
        self._volumes = vols
        self._seed = parse_seed(seed)
        self._epoch = parse_epoch(epoch)
        self._replacement = bool(replacement)
        self._padding = parse_padding(padding)
        self._volumes_mm = None if patch_size_mm is None else parse_patch_size_mm(patch_size_mm)
        if self._volumes_mm is not None:
            self._patch_size_arg = self._mm_patch_size(self._volumes_mm)
        else:
            self._patch_size_arg = parse_size(patch_size)
        self._per_volume = parse_int(patches_per_volume, "patches_per_volume")
        if self._per_volume < 1:
            raise ValueError(f"patches_per_volume={patches_per_volume} must be >= 1")
        self._per_region = parse_int(patches_per_chunk, "patches_per_chunk")
        if self._per_region < 1:
            raise ValueError(f"patches_per_chunk={patches_per_chunk} must be >= 1")
        weighted = weights is not None or labels is not None
        check_combination(self._per_region, self._replacement, weighted or None, self._padding)
        # what every volume's layout is built from (replacement is handled here)
        self._layout_args: dict[str, Any] = dict(
            seed=self._seed,
            epoch=self._epoch,
            stride=stride,
            replacement=True,
            patches_per_chunk=self._per_region,
            region=region,
            padding=self._padding,
            pad_value=pad_value,
            weights=weights,
            labels=labels,
            label_probabilities=label_probabilities,
            scales=scales,
            progress=progress,
        )
        self._structure = parse_structure(structure)
        self._init_cache()
        self._reference = self._reference_specs()
        self._pad_value = pad_value
        self._fills = self._cast_fills(pad_value)
        if self._fills:  # read with 0 (any stored dtype holds it), fill after the cast
            self._layout_args["pad_value"] = 0
        if self._fits(0):  # every placement argument is checked here, on volume 0
            self._volume_layout(0)
        self._columns = parse_columns(vols, columns)
        if self._world_on and WORLD_KEY in (*self._columns, *(vols.names or ())):
            raise ValueError(
                f"world=True adds a {WORLD_KEY!r} entry to every record, but an array or a "
                f"column of columns= is named {WORLD_KEY!r}; rename it"
            )
        if not self._replacement and not (
            isinstance(volume_weights, str) and volume_weights == "uniform"
        ):
            raise ValueError(
                f"volume_weights={volume_weights!r} cannot be combined with replacement=False, "
                "which visits every position of every volume once"
            )
        self._volume_weights, self._cumulative = parse_volume_weights(
            vols, volume_weights, self._patch_size_arg, self._valid_volumes
        )
        if not self._replacement:
            if self._per_volume > 1:
                raise ValueError(
                    f"patches_per_volume={self._per_volume} cannot be combined with "
                    "replacement=False, which visits every position of every volume once"
                )
            self._positions = np.cumsum(
                [self._grid_size(v) for v in range(len(vols))], dtype=np.int64
            )
            if not len(self._positions) or self._positions[-1] < 1:
                raise ValueError("no volume of the collection can hold a patch")
        if num_patches is None and not self._replacement:
            self._num_patches = int(self._positions[-1])
        elif num_patches is None:
            raise TypeError(
                "num_patches=None must be an int (it may be left out only with "
                "replacement=False, where it defaults to the number of grid positions)"
            )
        else:
            self._num_patches = parse_int(num_patches, "num_patches")
            if self._num_patches < 0:
                raise ValueError(f"num_patches={num_patches} must be >= 0")
        self._volume_identity = self._identity()
        self._schema = parse_schema(schema)
        if self._schema is not None:
            if vols.names is not None:
                raise ValueError("schema= applies to single arrays; these volumes are dicts")
            spec = self._reference[PATCH_KEY]
            self._schema.check(spec.dtype, spec.shape, what="PatchSampler patch")

    # -- per-volume state (never pickled: rebuilt lazily where the sampler is used) ------
    def _init_cache(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()  # guards the dicts below, never held across I/O
        self._build_locks = [threading.Lock() for _ in range(_BUILD_LOCKS)]
        self._layouts: dict[int, PatchLayout | None] = {}
        self._valid: NDArray[np.int64] | None = None
        self._warned: set[int] = set()
        self._affines: dict[int, NDArray[np.float64]] = {}

    def _own(self) -> None:
        """In a forked child: new locks (a parent thread may have held one at the fork)."""
        if self._pid != os.getpid():
            with _FORK_LOCK:
                if self._pid != os.getpid():
                    self._lock = threading.RLock()
                    self._build_locks = [threading.Lock() for _ in range(_BUILD_LOCKS)]
                    self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_pid", "_lock", "_build_locks", "_layouts", "_valid", "_warned", "_affines"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    def _reference_array(self, volume: Any, nd: int | None) -> tuple[ArraySource, str]:
        """``(source, name)`` whose geometry stands for an open volume (dicts: the finest)."""
        if not isinstance(volume, Mapping):
            return volume, ""
        shapes = {name: src.shape for name, src in volume.items()}
        nd = min(len(s) for s in shapes.values()) if nd is None else nd
        name = finest_array(shapes, nd)
        return volume[name], f", array {name!r}"

    def _mm_patch_size(self, mm: SizeMm) -> tuple[int, ...]:
        """The one voxel patch size ``patch_size_mm=mm`` gives every volume (reads all)."""
        vols = self._volumes
        rows = []
        for v in range(len(vols)):
            with vols.lease(v) as volume:
                nd = None if isinstance(mm, float) else len(mm)
                src, array = self._reference_array(volume, nd)
                where = f"volume {v} ({vols.keys[v]!r}{array})"
                default = None
                if isinstance(volume, Mapping) and isinstance(mm, float):
                    default = min(s.ndim for s in volume.values())
                size = patch_size_from_mm(
                    mm, src.physical, src.ndim, where, default_nd=default, shape=src.shape
                )
                rows.append((where, src.spacing, size))
        sizes = {size for _, _, size in rows}
        if len(sizes) > 1:
            raise ValueError(
                f"patch_size_mm={mm} gives the volumes different voxel patch sizes, and a "
                f"batch stacks patches of one shape: {describe_sizes(rows)}. Resample the "
                "volumes to one spacing first (e.g. TorchIO's Resample, or when converting "
                "them), or pass patch_size= in voxels (the same voxels in every volume)"
            )
        return rows[0][2]

    def _world_affine(self, v: int) -> NDArray[np.float64]:
        """Volume ``v``'s spatial voxel-to-world affine (metadata; cached)."""
        try:
            return self._affines[v]
        except KeyError:
            pass
        nd = len(self.patch_size)
        with self._volumes.lease(v) as volume:
            src, array = self._reference_array(volume, nd)
            where = f"volume {v} ({self._volumes.keys[v]!r}{array})"
            size = self.patch_size
            affine = spatial_affine(src.physical, nd, where, shape=src.shape, size=size)
        self._own()
        with self._lock:
            self._affines[v] = affine
        return affine

    def _world_of(self, vols: NDArray[np.int64], corners: NDArray[np.int64]) -> NDArray[np.float64]:
        """World positions of ``corners``, each under its volume's affine."""
        width = self._world_width()
        out = np.empty((corners.shape[0], width), dtype=np.float64)
        for sel in group_by_volume(vols):
            v = int(vols[sel[0]])
            affine = self._world_affine(v)
            if affine.shape[0] - 1 != width:
                raise ValueError(
                    f"world=True: volume {v} ({self._volumes.keys[v]!r}) has "
                    f"{affine.shape[0] - 1} spatial axes but volume 0 has {width}; a batch "
                    "stacks world positions of one length (its axis names differ)"
                )
            out[sel] = world_positions(affine, corners[sel])
        return out

    def _world_width(self) -> int:
        """Values per world position: volume 0's spatial axes (metadata)."""
        return int(self._world_affine(0).shape[0]) - 1

    def _reference_specs(self) -> dict[str, ArraySpec]:
        """The patch spec every volume must give, from volume 0's metadata."""
        with self._volumes.lease(0) as first:
            specs = self._specs_of(first)
            self._spatial_ndim = self._spatial_ndim_of(first)
        cast = self._volumes.cast
        if cast is not None:
            if isinstance(cast, Mapping):
                specs = {
                    k: ArraySpec(s.shape, np.dtype(cast.get(k, s.dtype))) for k, s in specs.items()
                }
            else:
                specs = {k: ArraySpec(s.shape, np.dtype(cast)) for k, s in specs.items()}
        return specs

    def _identity(self) -> dict[str, Any]:
        """What the fingerprint knows of the volumes themselves, fixed at construction.

        Volume 0's shape and patch spec always; every shape (as a digest) when the sampler
        read them all to start (weighted volumes, ``replacement=False``), plus the draw
        tables they gave. Uniform sampling reads no other shape up front, so a volume other
        than 0 rewritten with another shape is not told apart.
        """
        ident: dict[str, Any] = {
            "shape0": self._volumes.shape(0),
            "specs": {k: (s.shape, str(s.dtype)) for k, s in self._reference.items()},
        }
        if self._cumulative is not None or not self._replacement:
            names = self._volumes.names or (None,)
            shapes = [self._volumes.shapes_array(n) for n in names]
            ident["shapes"] = fingerprint_digest("shapes", {"shapes": shapes})
            ident["table"] = self._positions if not self._replacement else self._cumulative
        return ident

    def _cast_fills(self, pad_value: Any) -> dict[str, Any]:
        """``{record key: fill}`` checked against the cast dtype (``{}``: no cast or fill)."""
        if self._volumes.cast is None or self._padding != "constant":
            return {}
        fills = {}
        for k, spec in self._reference.items():
            value = pad_value.get(k, 0) if isinstance(pad_value, Mapping) else pad_value
            name = f"pad_value[{k!r}]" if isinstance(pad_value, Mapping) else "pad_value"
            fills[k] = parse_pad_value(value, spec.dtype, name)
        return fills

    def _spatial_ndim_of(self, volume: Any) -> int:
        """How many trailing axes of an open volume are spatial."""
        if not isinstance(self._patch_size_arg, int):
            return len(self._patch_size_arg)
        if isinstance(volume, Mapping):
            ndims = {name: src.ndim for name, src in volume.items()}
            if len(set(ndims.values())) > 1:  # e.g. a 4x4 affine beside a 3-D image
                raise ValueError(
                    f"patch_size={self._patch_size_arg!r} is one int but the volumes' arrays "
                    f"have different numbers of axes {ndims}: give one size per spatial axis "
                    "(the trailing axes; leading ones are channels), or name the arrays with "
                    "read_volumes(..., table_columns=[...]) so the others become metadata"
                )
            return min(ndims.values())
        return int(volume.ndim)

    def _specs_of(self, volume: Any) -> dict[str, ArraySpec]:
        """``{record key: spec of one patch}`` of an open volume (source or dict of them)."""
        size = self._patch_size_arg
        if isinstance(volume, Mapping):
            spatial = None if isinstance(size, int) else len(size)
            arrays = AlignedArrays(volume, spatial_ndim=spatial, scales=self._layout_args["scales"])
            return arrays.element_specs(full_size(size, len(arrays.shape)))
        lead, shape = split_channels(size, volume.shape)
        return {PATCH_KEY: ArraySpec((*lead, *full_size(size, len(shape))), volume.dtype)}

    def _fits(self, v: int) -> bool:
        """Whether volume ``v`` can hold a patch; warns (once) when it cannot."""
        if self._padding != "none":
            return True
        shape = self._volumes.shape(v)
        spatial = spatial_shape(shape, self._patch_size_arg)
        size = full_size(self._patch_size_arg, len(spatial))
        if all(p <= d for p, d in zip(size, spatial)):
            return True
        self._warn(
            v,
            f"of shape {shape} is smaller than patch_size={self._patch_size_arg!r}; it is "
            "skipped (pass padding= to pad it instead)",
        )
        return False

    def _warn(self, v: int, what: str) -> None:
        """Warn once per volume: ``volume v ('key') <what>``."""
        self._own()
        with self._lock:
            if v in self._warned:
                return
            self._warned.add(v)
        warnings.warn(f"volume {v} ({self._volumes.keys[v]!r}) {what}", stacklevel=6)

    def _volume_layout(self, v: int) -> PatchLayout | None:
        """Volume ``v``'s placement (``None``: it cannot hold a patch), built once."""
        try:
            return self._layouts[v]
        except KeyError:
            pass
        self._own()
        with self._build_locks[v % _BUILD_LOCKS]:  # volumes build in parallel, each once
            if v in self._layouts:
                return self._layouts[v]
            lay = self._build_layout(v)
            with self._lock:
                self._layouts[v] = lay
            return lay

    def _build_layout(self, v: int) -> PatchLayout | None:
        key = self._volumes.keys[v]
        if not self._fits(v):
            return None
        with self._volumes.lease(v) as volume:
            specs = self._specs_of(volume)
            try:
                lay = parse_patch_layout(
                    volume, self._patch_size_arg, 0, absent_classes="drop", **self._layout_args
                )
            except NothingToSampleError as exc:
                self._warn(v, f"{exc}; it is skipped")
                return None
        dropped = [] if lay.weighted is None else lay.weighted.dropped_classes
        if dropped:
            self._warn(
                v,
                f"has no voxel of classes {dropped} where a patch can be centred; its "
                "patches draw the other classes of label_probabilities, renormalised",
            )
        want = self._reference
        cast = self._volumes.cast is not None
        same = specs.keys() == want.keys() and all(
            specs[k].shape == want[k].shape and (cast or specs[k].dtype == want[k].dtype)
            for k in want
        )
        if not same:
            got = {k: (s.shape, str(s.dtype)) for k, s in specs.items()}
            ref = {k: (s.shape, str(s.dtype)) for k, s in want.items()}
            raise ValueError(
                f"volume {v} ({key!r}) gives patches {got} but volume 0 gives {ref}: every "
                "volume must have the same dtype, channels and scale factors (pass "
                "read_volumes(..., dtype=) to cast differing dtypes)"
            )
        return lay

    def _grid_size(self, v: int) -> int:
        lay = self._volume_layout(v)
        return 0 if lay is None else math.prod(lay.counts)

    def _valid_volumes(self) -> NDArray[np.int64]:
        if self._valid is None:
            self._volumes.shapes()  # read every shape at once, in parallel
            weighted = self._layout_args["weights"] or self._layout_args["labels"]
            self._valid = np.asarray(
                [
                    v
                    for v in range(len(self._volumes))
                    if self._fits(v) and (not weighted or self._volume_layout(v) is not None)
                ],
                dtype=np.int64,
            )
        return self._valid

    # -- description --------------------------------------------------------------------
    @property
    def collection(self) -> VolumeCollection:
        """The collection patches are cut from."""
        return self._volumes

    @property
    def source(self) -> ArraySource:  # type: ignore[override]
        """Volume 0's source (the first array's for dict volumes)."""
        first = self._volumes[0]
        return next(iter(first.values())) if isinstance(first, Mapping) else first

    @property
    def sources(self) -> dict[str, ArraySource]:  # type: ignore[override]
        """Volume 0's ``{name: source}`` (``{"array": source}`` for single arrays)."""
        first = self._volumes[0]
        return dict(first) if isinstance(first, Mapping) else {"array": first}

    @property
    def arrays(self) -> None:  # type: ignore[override]
        """``None``: each volume has its own aligned arrays."""
        return None

    @property
    def patch_size(self) -> tuple[int, ...]:
        """Patch extent per spatial axis (the trailing axes of every volume)."""
        return full_size(self._patch_size_arg, self._spatial_ndim)

    @property
    def channel_shape(self) -> tuple[int, ...]:
        """Leading axes every patch holds whole (``()`` if none or for dict volumes)."""
        if self._volumes.names is not None:
            return ()
        spec = self._reference[PATCH_KEY]
        return spec.shape[: len(spec.shape) - self._spatial_ndim]

    @property
    def stride(self) -> tuple[int, ...]:
        nd = len(self.patch_size)
        stride = self._layout_args["stride"]
        return parse_stride(stride, nd)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def replacement(self) -> bool:
        return self._replacement

    @property
    def padding(self) -> str:
        return self._padding

    @property
    def patches_per_chunk(self) -> int:
        return self._per_region

    @property
    def region(self) -> tuple[int, ...]:  # type: ignore[override]
        raise AttributeError("each volume has its own region; see sampler.layout(v).region")

    @property
    def grid_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        raise AttributeError("each volume has its own corner grid; see sampler.layout(v).counts")

    @property
    def weighted(self) -> None:  # type: ignore[override]
        """``None``: each volume has its own weighted placement (:meth:`layout`)."""
        return None

    @property
    def patch_size_mm(self) -> SizeMm | None:
        """``patch_size_mm`` as given (:attr:`patch_size` holds its voxels), else ``None``."""
        return self._volumes_mm

    @property
    def world(self) -> bool:
        """Whether records carry each patch's world position (``world=True``)."""
        return self._world_on

    @property
    def world_affine(self) -> None:  # type: ignore[override]
        """``None``: each volume has its own affine (:meth:`world_affine_of`)."""
        return None

    def world_affine_of(self, v: int) -> NDArray[np.float64]:
        """Volume ``v``'s ``(ns + 1, nd + 1)`` voxel-to-world affine (metadata only).

        A row per spatial axis, a column per patched axis
        (:func:`~mixle.data.sampling.physical_patches.spatial_affine`).

        Raises
        ------
        ValueError
            The volume records no affine, or its spatial axes are not the patched ones.
        """
        return self._world_affine(parse_index(v, len(self._volumes), "the collection"))

    def world_array(self, indices: ArrayLike | None = None) -> NDArray[np.float64]:
        """World positions ``(N, ns)`` float64 of patches ``indices``, each in its volume.

        Raises
        ------
        ValueError
            The sampler was made without ``world=True``, a volume records no affine, or
            volumes have different numbers of spatial axes.
        """
        if not self._world_on:
            raise ValueError("world_array() needs a sampler made with world=True")
        return self._world_of(*self._placed(record_indices(indices, self._num_patches)))

    @property
    def patches_per_volume(self) -> int:
        """How many consecutive indices share one volume."""
        return self._per_volume

    @property
    def shuffle_block(self) -> int:
        """Records a shuffling :class:`~mixle.Loader` keeps together (``patches_per_volume``)."""
        return self._per_volume

    @property
    def volume_weights(self) -> Any:
        """``"uniform"``, ``"voxels"``, or ``(column name or "array", weights)``."""
        return self._volume_weights

    @property
    def columns(self) -> tuple[str, ...]:
        """Metadata columns added to every record."""
        return self._columns

    def layout(self, v: int) -> PatchLayout | None:
        """Volume ``v``'s placement (its corner grid, region...), ``None`` if it is skipped."""
        return self._volume_layout(parse_index(v, len(self._volumes), "the collection"))

    def element_spec(self) -> dict[str, ArraySpec]:  # type: ignore[override]
        """Spec of one record: the patch (or one per array), ``coords``, ``volume``, columns."""
        nd = len(self.patch_size)
        spec: dict[str, ArraySpec] = dict(self._reference)
        spec[COORDS_KEY] = ArraySpec((nd,), np.dtype(np.int64))
        spec[VOLUME_KEY] = ArraySpec((), np.dtype(np.int64))
        if self._world_on:
            spec[WORLD_KEY] = ArraySpec((self._world_width(),), np.dtype(np.float64))
        for c in self._columns:
            first = self._column(c, np.zeros(1, dtype=np.int64))
            spec[c] = ArraySpec(first.shape[1:], first.dtype)
        return spec

    def __len__(self) -> int:
        return self._num_patches

    def __repr__(self) -> str:
        extra = ""
        if self._per_volume > 1:
            extra += f", patches_per_volume={self._per_volume}"
        if self._volume_weights != "uniform":
            name = self._volume_weights
            extra += f", volume_weights={name if isinstance(name, str) else name[0]!r}"
        if self._per_region > 1:
            extra += f", patches_per_chunk={self._per_region}"
        if self._epoch:
            extra += f", epoch={self._epoch}"
        if not self._replacement:
            extra += ", replacement=False"
        if self._padding != "none":
            extra += f", padding={self._padding!r}"
        if self._volumes_mm is not None:
            extra += f", patch_size_mm={self._volumes_mm}"
        if self._world_on:
            extra += ", world=True"
        return (
            f"PatchSampler({self._volumes!r}, patch_size={self.patch_size}, "
            f"num_patches={self._num_patches}, seed={self._seed}{extra})"
        )

    def fingerprint(self) -> str:
        """A digest of everything that decides which patch an index means (no volume I/O).

        Covers the collection's own fingerprint, every placement argument, the current
        epoch, ``volume_weights`` and ``patches_per_volume``; ``columns``, ``structure``,
        ``schema`` and ``progress`` do not change which patch an index means.
        """
        args = {k: v for k, v in self._layout_args.items() if k not in ("progress", "epoch")}
        args["seed"] = self._seed & MASK64
        args["pad_value"] = self._pad_value
        return fingerprint_digest(
            "VolumePatchSampler",
            {
                "collection": self._volumes.fingerprint(),
                "patch_size": self._patch_size_arg,
                "num_patches": self._num_patches,
                "epoch": self._epoch,
                "replacement": self._replacement,
                "volume_weights": self._volume_weights,
                "patches_per_volume": self._per_volume,
                "args": args,
                "volumes": self._volume_identity,
                **({"world": True} if self._world_on else {}),
            },
        )

    # -- placement (reads the shapes of the volumes drawn only) -------------------------
    def volumes_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """The volume of each of patches ``indices`` (default: all), int64.

        Reads no voxel. With uniform ``volume_weights`` it reads the shapes (and, for
        ``weights=``/``labels=``, indexes the maps) of the volumes drawn, to redraw past the
        ones that are skipped; the other weightings read them when the sampler is made.
        """
        return self._volumes_of(record_indices(indices, self._num_patches))

    def field_values(self, name: str, indices: ArrayLike | None = None) -> NDArray[Any] | None:
        """Field ``name`` of records ``indices`` where it needs no voxel read, else ``None``.

        ``"volume"`` (:meth:`volumes_array`), ``"coords"`` (:meth:`coords_array`) and the
        metadata ``columns``; ``None`` for patches. Grouping records by ``"volume"``
        (``structure=partially_exchangeable("volume")``) uses it instead of reading them.
        """
        idx = record_indices(indices, self._num_patches)
        if name == VOLUME_KEY:
            return self._volumes_of(idx)
        if name == COORDS_KEY:
            return self._placed(idx)[1]
        if name == WORLD_KEY and self._world_on:
            return self._world_of(*self._placed(idx))
        if name in self._columns:
            return self._column(name, self._volumes_of(idx))
        return None

    def _column(self, name: str, vols: NDArray[np.int64]) -> NDArray[Any]:
        return self._volumes.metadata_batch(vols, [name])[name]

    def _volumes_of(self, idx: NDArray[np.int64]) -> NDArray[np.int64]:
        if not self._replacement:
            return permuted_positions(self._seed, idx, self._positions, epoch=self._epoch)[0]
        if self._cumulative is not None:
            return weighted_volumes(
                self._seed, idx, self._cumulative, self._per_volume, epoch=self._epoch
            )

        def valid(vs: NDArray[np.int64]) -> NDArray[np.bool_]:
            ok = {v: self._volume_layout(v) is not None for v in np.unique(vs).tolist()}
            return np.fromiter((ok[v] for v in vs.tolist()), dtype=bool, count=vs.size)

        return uniform_valid_volumes(
            self._seed,
            idx,
            len(self._volumes),
            valid,
            self._per_volume,
            epoch=self._epoch,
            all_valid=self._valid_volumes,
        )

    def _placed(self, idx: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(volumes, corners)`` of valid indices ``idx``."""
        corners = np.empty((idx.size, len(self.patch_size)), dtype=np.int64)
        if not self._replacement:
            vols, local = permuted_positions(self._seed, idx, self._positions, epoch=self._epoch)
        else:
            vols, local = self._volumes_of(idx), None
        for sel in group_by_volume(vols):
            v = int(vols[sel[0]])
            lay = self._volume_layout(v)
            assert lay is not None  # only valid volumes are drawn
            if local is None and lay.weighted is not None:
                with self._volumes.lease(v):  # a weighted map reads blocks of itself
                    corners[sel] = lay.corners(idx[sel], self._epoch)
            elif local is None:
                corners[sel] = lay.corners(idx[sel], self._epoch)
            else:
                multi = np.unravel_index(local[sel], lay.counts)
                for a, (m, st, o) in enumerate(zip(multi, lay.stride, lay.origin)):
                    corners[sel, a] = m * st + o
        return vols, corners

    def coords_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """Corners of patches ``indices`` (default: all), int64 ``(N, ndim)`` in each volume."""
        return self._placed(record_indices(indices, self._num_patches))[1]

    def coords(self) -> list[tuple[int, ...]]:
        """Corners of every patch as tuples of ints (each in its own volume)."""
        return [tuple(row) for row in self.coords_array().tolist()]

    # -- reading ------------------------------------------------------------------------
    def get_batch(self, indices: ArrayLike) -> dict[str, Any]:
        """Patches ``indices`` stacked: ``{"patch": (B, *ch, *patch), "coords", "volume", ...}``.

        The batch is grouped by volume; each volume's patches are read in one batched read
        (each stored chunk decoded once), the volumes in parallel on the decode pool.
        """
        idx = record_indices(indices, self._num_patches)
        vols, corners = self._placed(idx)
        out = {k: np.empty((idx.size, *s.shape), dtype=s.dtype) for k, s in self._reference.items()}
        run_all([self._read_task(int(vols[r[0]]), r, corners, out) for r in group_by_volume(vols)])
        batch: dict[str, Any] = {**out, COORDS_KEY: corners, VOLUME_KEY: vols}
        if self._world_on:
            batch[WORLD_KEY] = self._world_of(vols, corners)
        for c in self._columns:
            batch[c] = self._column(c, vols)
        return batch

    def _read_task(
        self, v: int, sel: NDArray[np.int64], corners: NDArray[np.int64], out: dict[str, np.ndarray]
    ) -> Any:
        def task() -> None:
            lay = self._volume_layout(v)
            assert lay is not None
            with self._volumes.lease(v):
                parts = lay.read(corners[sel])
                if lay.arrays is None:
                    parts = {PATCH_KEY: parts}
                for k, part in parts.items():
                    if k in self._fills:
                        part = part.astype(out[k].dtype)
                        self._fill(lay, k, part, corners[sel])
                    out[k][sel] = part

        return task

    def _fill(self, lay: PatchLayout, k: str, part: np.ndarray, corners: NDArray[np.int64]) -> None:
        """Put the cast fill where the read padded (with 0) outside the volume."""
        if lay.arrays is None:
            fill_outside(part, corners, lay.shape, lay.patch_size, self._fills[k])
            return
        f = np.asarray(lay.arrays.factors[k], dtype=np.int64)
        src = lay.arrays.sources[k]
        nd = len(lay.patch_size)
        size = tuple(p // int(m) for p, m in zip(lay.patch_size, f))
        fill_outside(part, corners // f, src.shape[src.ndim - nd :], size, self._fills[k])

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        """Record ``index``: ``{"patch": patch, "coords": corner, "volume": v, ...}``."""
        i = parse_index(index, self._num_patches, f"a sampler of {self._num_patches} patches")
        batch = self.get_batch(np.array([i], dtype=np.int64))
        return {k: v[0] for k, v in batch.items()}

    def records(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        """Yield the record of every index in order."""
        for i in range(self._num_patches):
            yield self[i]
