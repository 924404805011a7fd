"""Seeded random N-D patches cut from a lazy volume, addressable by index."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sampling.aligned import COORDS_KEY, AlignedArrays
from mixle.data.sampling.patch_args import (
    fingerprint_digest,
    parse_epoch,
    parse_index,
    parse_patch_size,
    parse_stride,
    record_indices,
)
from mixle.data.sampling.patch_layout import PatchLayout, parse_patch_layout
from mixle.data.sampling.physical_patches import (
    WORLD_KEY,
    SizeMm,
    parse_patch_size_mm,
    patch_size_from_mm,
    spatial_affine,
    world_positions,
)
from mixle.data.sampling.weighted import WeightedPlacement
from mixle.data.schema import Schema, parse_schema
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.spec import ArraySpec
from mixle.data.structure import EXCHANGEABLE, SampleStructure, parse_structure

__all__ = ["PatchSampler", "parse_patch_size", "parse_stride"]

Patch = tuple[np.ndarray, tuple[int, ...]]
Record = Patch | tuple[np.ndarray, tuple[int, ...], np.ndarray] | dict[str, Any]


def check_size_args(patch_size: object, patch_size_mm: object) -> None:
    """Refuse ``patch_size`` and ``patch_size_mm`` both given, or neither (``TypeError``)."""
    if patch_size is None and patch_size_mm is None:
        raise TypeError(
            "PatchSampler needs a patch size: pass patch_size= (voxels) or patch_size_mm= "
            "(millimetres, converted with each volume's spacing)"
        )
    if patch_size is not None and patch_size_mm is not None:
        raise TypeError(
            f"patch_size={patch_size!r} and patch_size_mm={patch_size_mm!r} both given: pass "
            "one of them (voxels or millimetres)"
        )


def parse_world(world: object) -> bool:
    """``world=`` as a bool (``TypeError`` for anything but ``True``/``False``)."""
    if not isinstance(world, (bool, np.bool_)):
        raise TypeError(f"world={world!r} must be True or False")
    return bool(world)


class PatchSampler:
    """``num_patches`` seeded random patches of ``patch_size`` from an N-D array (or several).

    Parameters
    ----------
    array
        A mixle source, or any N-D array-like with ``.shape`` and basic ``__getitem__``
        (ndarray, ``np.memmap``, zarr array, h5py dataset). h5py datasets, zarr arrays and
        memmaps are wrapped so that the sampler pickles by reference. A dict
        ``{name: array}`` samples all of them at the same physical place (see Notes).
    patch_size
        An int (same on every axis) or one int per spatial axis, each in
        ``[1, shape[axis]]`` (any size >= 1 with padding). Its length sets the spatial
        axes: they are the trailing ones, and leading axes beyond them are channels that
        every patch holds whole (see Notes). Give it or ``patch_size_mm``, not both.
    num_patches
        How many patches the sampler addresses (``len(sampler)``); with
        ``replacement=False`` it defaults to the number of grid positions.
    seed
        Any int, taken modulo 2**64; patch corners are a pure function of
        ``(seed, epoch, index)``.
    epoch
        The epoch whose corners are drawn (:meth:`set_epoch` changes it).
    stride
        Corners lie on the grid ``0, stride, 2*stride, ...`` (int or per spatial axis);
        ``None`` allows every position (every multiple of the scale factors for a dict).
    replacement
        ``False`` visits each stride-grid position once per epoch (a Feistel permutation
        of the grid) instead of drawing corners independently.
    patches_per_chunk
        Locality: every ``patches_per_chunk`` consecutive indices share one region of the
        array (``1``, the default, draws every patch independently from the whole array).
    region
        Extent of those regions (int or per spatial axis, at least ``patch_size``);
        default: the store's chunk shape on the spatial axes grown to ``patch_size``, or
        ``2 * patch_size`` when unchunked.
    padding
        ``"none"`` keeps patches inside the volume. ``"constant"``, ``"reflect"`` or
        ``"edge"`` let a patch hang over the edge (its centre voxel anywhere in the volume)
        and pad what lies outside (:mod:`mixle.data.sampling.padding`).
    pad_value
        Fill value for ``padding="constant"`` (a dict of them for a dict of arrays).
    weights
        A weight map (array, source, or the name of one of the dict's arrays): patches are
        centred on voxels drawn with probability proportional to the weight. It may be at
        a coarser integer scale than the patches.
    labels, label_probabilities
        A label volume (array, source or name) and ``{label value: probability}``: each
        patch picks a class with that probability and is centred on a voxel of that class,
        uniformly among them. Probabilities must be finite, ``>= 0`` and not all zero;
        they are divided by their sum (``{0: 1, 1: 3}`` means ``{0: 0.25, 1: 0.75}``;
        ``sampler.weighted.label_probabilities`` shows the values used).
    scales
        For a dict: ``{name: factor}`` to state scale factors instead of inferring them.
    structure
        How patches relate (see :mod:`mixle.data.structure`).
    schema
        When given, checked against one patch: ``patch_size`` and the array's dtype.
    progress
        Show a progress bar while a ``weights``/``labels`` map is indexed: ``True``,
        ``False`` or ``None`` (automatic; see :mod:`mixle.utils.progress`).
    patch_size_mm
        The patch size in millimetres instead of ``patch_size``: a number or one per
        spatial axis (the trailing axes), each ``> 0``. One number covers the spatial
        axes the array's recorded axis names give (``z, y, x`` of a ``c, z, y, x``
        OME-Zarr: every channel in each patch; see
        :func:`~mixle.data.sampling.physical_patches.spatial_axes`), or every axis where it
        records no names. It becomes ``round(mm / spacing)`` voxels (halves up, at least 1;
        quotients within a relative ``1e-6`` below a half count as one, for float32
        spacings) on each spatial axis with the array's own spacing
        (:attr:`~mixle.ArraySource.spacing`, converted from its recorded unit; no unit:
        millimetres); :attr:`patch_size` is the result. An array without a recorded
        spacing raises ``ValueError``, as do entries that are not its spatial axes (a
        NIfTI ``i, j, k, t`` with several time points keeps time last, which a patch
        cannot hold whole). Axes that are not spatial but have length 1, among or after
        the spatial ones, get extent 1: a single-volume NIfTI ``(X, Y, Z, 1)`` with
        ``patch_size_mm=(16, 16, 16)`` gets ``patch_size=(px, py, pz, 1)``. For a dict:
        the spacing of the finest array.
    world
        ``True`` adds each patch's world position: records ``(patch, coords, world)``
        (dicts: a ``"world"`` entry), ``world`` being ``affine @ [*coords, 1]`` (the
        spatial axes) as float64, from the array's :attr:`~mixle.ArraySource.affine`
        (for a dict, the finest array's), in the units the format records. The patched
        axes must be the spatial ones where the array records axis names (``patch_size``
        of 3 entries for ``c, z, y, x``; a NIfTI ``i, j, k, t`` with several time points
        or an RGB ``z, y, x, s`` OME-TIFF, whose spatial axes are not last, raises
        ``ValueError`` naming them). Axes that are not spatial but have length 1 among or
        after the spatial ones may be patched with extent 1 (``patch_size=(32, 32, 32,
        1)`` on a NIfTI ``(X, Y, Z, 1)``): ``coords`` keeps one entry per patched axis,
        ``world`` one per spatial axis. Without names the trailing axes are taken as
        spatial. An array without a recorded
        affine raises ``ValueError``: mixle does not assume an identity geometry. On JAX
        with x64 off a float64 leaf needs ``dtype_policy="cast"`` (float32 on the device)
        or x64 on (:mod:`mixle.jax`).

    Raises
    ------
    TypeError, ValueError, KeyError
        On bad arguments, naming the argument, the value and what is accepted.

    Notes
    -----
    Channels first: with fewer ``patch_size`` entries than the array has axes, a
    ``(C, Z, Y, X)`` array with ``patch_size=(pz, py, px)`` gives patches
    ``(C, pz, py, px)`` (``vol[:, z:z+pz, y:y+py, x:x+px]``, as torchio and MONAI cut
    them). ``coords`` holds the corner on the spatial axes only, ``(z, y, x)`` (one row
    of ``coords[B, len(patch_size)]`` per patch, as for :class:`~mixle.GridSampler` and
    dict samplers); ``stride``, ``region``, ``padding`` and a ``weights``/``labels`` map
    (given without channel axes) all refer to the spatial axes. Channel axes are never
    padded. An int ``patch_size`` covers every axis, channels included.

    Corner ``i`` on each axis is a grid position drawn exactly uniformly from the in-bounds
    positions with a counter-based hash of ``(seed, epoch, i, axis)``: O(1) memory for any
    ``num_patches``, the same in every process, on every NumPy release and whatever order
    patches are asked for in. Returned patches are new arrays, never views into the file.

    With ``patches_per_chunk=k > 1`` the array is tiled by regions and indices
    ``[b*k, (b+1)*k)`` draw their corners inside one region chosen uniformly for block
    ``b``; with the default region (one stored chunk) a batch of those patches decodes
    about one chunk per ``k`` patches instead of several per patch. The trade: patches of a
    block are correlated (same neighbourhood), and a patch never straddles two regions
    (except in the last, partial region of an axis), so voxels near region borders are
    drawn less often than with independent placement. Keep blocks together in a batch
    (no per-record shuffle) to get the speed.

    With a dict, records are ``{name: patch, ..., "coords": corner}``. Trailing
    ``len(patch_size)`` axes are spatial; leading extra axes of an array are channels, read
    whole. Arrays may be coarser than the finest one by integer factors (a label at half
    resolution); corners are on the finest grid and each array reads
    ``[corner // f, (corner + patch_size) // f)``.

    Weighted and label sampling build a per-block index of the map once, at construction,
    reading it one block at a time; it is pickled with the sampler. Without padding a
    map voxel can centre a patch only where the patch fits inside the volume, so a class
    (or weight) found only near the edge is an error that suggests ``padding=``.

    Pickling (to worker processes, Dask, :class:`~mixle.MPEncodedData`) carries a map
    given as an in-memory ndarray whole, as it carries an in-memory ``array``: a
    ``(300, 300, 200)`` float32 map adds 72 MB to every pickle. Save it once and pass a
    source that pickles by reference (path and options, a few KB), e.g.
    ``labels=mixle.read_npy("labels.npy")`` or ``mixle.read_zarr(...)``.

    :meth:`fingerprint` (kept in a Loader's resume state) covers every argument that
    changes which patch an index means; ``structure``, ``schema`` and ``progress`` do not.

    Given a :class:`~mixle.VolumeCollection` (:func:`~mixle.read_volumes`), it samples
    across all its volumes and returns a
    :class:`~mixle.data.sampling.volume_patches.VolumePatchSampler`, which also takes
    ``volume_weights=``, ``patches_per_volume=`` and ``columns=`` (see there).
    """

    #: ``(collection type, subclass)``: ``PatchSampler(collection, ...)`` makes the subclass
    #: (it registers itself with ``class ...(PatchSampler, collections=<collection type>)``).
    _over_collections: ClassVar[tuple[type, type[PatchSampler]] | None] = None

    def __init_subclass__(cls, collections: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if collections is not None:
            PatchSampler._over_collections = (collections, cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> PatchSampler:
        array = args[0] if args else kwargs.get("array")
        over = PatchSampler._over_collections
        if cls is PatchSampler and over is not None and isinstance(array, over[0]):
            return super().__new__(over[1])
        return super().__new__(cls)

    #: The voxel-to-world affine of the spatial axes (``world=True``), else ``None``.
    _world: NDArray[np.float64] | None = None
    #: ``patch_size_mm`` as given (``None``: the patch size was given in voxels).
    _patch_size_mm: SizeMm | None = None

    def __init__(
        self,
        array: Any,
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
        world = parse_world(world)
        given = {
            "volume_weights": (volume_weights, "uniform"),
            "patches_per_volume": (patches_per_volume, 1),
            "columns": (columns, None),
        }
        for name, (value, default) in given.items():
            if not (value is default or (isinstance(value, type(default)) and value == default)):
                raise TypeError(
                    f"{name}={value!r} applies to a collection of volumes "
                    "(mixle.read_volumes(...)), not to one array"
                )
        if patch_size_mm is not None:
            self._patch_size_mm = parse_patch_size_mm(patch_size_mm)
            array, patch_size = _mm_patch_size(array, self._patch_size_mm, scales)
        assert patch_size is not None
        try:
            self._layout = parse_patch_layout(
                array,
                patch_size,
                num_patches,
                seed=seed,
                epoch=epoch,
                stride=stride,
                replacement=replacement,
                patches_per_chunk=patches_per_chunk,
                region=region,
                padding=padding,
                pad_value=pad_value,
                weights=weights,
                labels=labels,
                label_probabilities=label_probabilities,
                scales=scales,
                progress=progress,
            )
        except ValueError as exc:
            if self._patch_size_mm is None or type(exc) is not ValueError:
                raise
            raise ValueError(
                f"patch_size_mm={self._patch_size_mm} is patch_size={patch_size} voxels: {exc}"
            ) from exc
        self._epoch = self._layout.epoch  # set_epoch changes it
        self._structure = parse_structure(structure)
        self._schema = parse_schema(schema)
        if self._schema is not None:
            if self._layout.arrays is not None:
                raise ValueError("schema= applies to a single array; pass one array, not a dict")
            patch = (*self._layout.lead, *self._layout.patch_size)
            self._schema.check(self._layout.source.dtype, patch, what="PatchSampler patch")
        if world:
            self._world = _world_affine(self._layout)

    # -- description --------------------------------------------------------------------
    @property
    def source(self) -> ArraySource:
        """The source patches are cut from (the first array's for a dict)."""
        return self._layout.source

    @property
    def sources(self) -> dict[str, ArraySource]:
        """``{name: source}`` of a dict sampler (``{"array": source}`` otherwise)."""
        lay = self._layout
        return {"array": lay.source} if lay.arrays is None else lay.arrays.sources

    @property
    def arrays(self) -> AlignedArrays | None:
        """The aligned arrays of a dict sampler (scale factors, channels), else ``None``."""
        return self._layout.arrays

    @property
    def patch_size(self) -> tuple[int, ...]:
        """Patch extent per (spatial) axis."""
        return self._layout.patch_size

    @property
    def patch_size_mm(self) -> SizeMm | None:
        """``patch_size_mm`` as given (:attr:`patch_size` holds its voxels), else ``None``."""
        return self._patch_size_mm

    @property
    def world(self) -> bool:
        """Whether records carry each patch's world position (``world=True``)."""
        return self._world is not None

    @property
    def world_affine(self) -> NDArray[np.float64] | None:
        """The voxel-to-world affine of the patched axes (``world=True``), else ``None``.

        ``(ns + 1, nd + 1)``: a row per spatial axis, a column per patched axis (a column
        of zeros for a non-spatial axis of length 1, such as a NIfTI's single time point);
        square when the patched axes are the spatial ones. ``affine @ [*coords, 1]`` is a
        corner's world position.
        """
        return self._world

    def world_array(self, indices: ArrayLike | None = None) -> NDArray[np.float64]:
        """World positions ``(N, ns)`` float64 of the corners of patches ``indices`` (no I/O).

        One value per spatial axis (``ns``), from :attr:`world_affine`.

        Raises
        ------
        ValueError
            The sampler was made without ``world=True``.
        """
        if self._world is None:
            raise ValueError("world_array() needs a sampler made with world=True")
        return world_positions(self._world, self.coords_array(indices))

    @property
    def channel_shape(self) -> tuple[int, ...]:
        """Leading axes of the array every patch holds whole (``()`` if none or for a dict)."""
        return self._layout.lead

    @property
    def stride(self) -> tuple[int, ...]:
        """Spacing of the corner grid per axis."""
        return self._layout.stride

    @property
    def seed(self) -> int:
        """The seed corners are derived from."""
        return self._layout.seed

    @property
    def epoch(self) -> int:
        """The epoch whose corners are drawn."""
        return self._epoch

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickle, also one made before the layout had a class of its own.

        Those kept each layout field as an attribute (``_patch_size``, ``_counts``...).
        """
        if "_layout" not in state:
            names = [f.name for f in dataclasses.fields(PatchLayout) if f.name != "epoch"]
            fields = {name: state.pop(f"_{name}") for name in names}
            state["_layout"] = PatchLayout(epoch=state["_epoch"], **fields)
        self.__dict__.update(state)

    def set_epoch(self, epoch: int) -> None:
        """Draw the corners of ``epoch`` from now on (a fresh, deterministic set per epoch)."""
        self._epoch = parse_epoch(epoch)

    @property
    def replacement(self) -> bool:
        """Whether corners are drawn independently (``False``: each grid position once)."""
        return self._layout.replacement

    @property
    def padding(self) -> str:
        """The edge policy (``"none"``: patches stay inside the volume)."""
        return self._layout.padding

    @property
    def patches_per_chunk(self) -> int:
        """How many consecutive indices share one region (1: independent placement)."""
        return self._layout.per_region

    @property
    def region(self) -> tuple[int, ...]:
        """Extent of the regions that locality sampling tiles the array with."""
        return self._layout.region

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of possible corner positions per axis."""
        return self._layout.counts

    @property
    def weighted(self) -> WeightedPlacement | None:
        """The weighted or label placement (its index), if any."""
        return self._layout.weighted

    @property
    def structure(self) -> SampleStructure:
        """How patches relate to each other."""
        return self._structure

    @property
    def schema(self) -> Schema | None:
        """The schema one patch was checked against, if any."""
        return self._schema

    def element_spec(self) -> Any:
        """Spec of one record, from metadata: ``(patch, coords)`` or a dict for a dict.

        With ``world=True``: ``(patch, coords, world)`` (a dict: a ``"world"`` entry).
        """
        lay = self._layout
        nd = len(lay.patch_size)
        coords = ArraySpec((nd,), np.dtype(np.int64))
        world = {}
        if self._world is not None:
            ns = self._world.shape[0] - 1
            world = {WORLD_KEY: ArraySpec((ns,), np.dtype(np.float64))}
        if lay.arrays is not None:
            return {**lay.arrays.element_specs(lay.patch_size), COORDS_KEY: coords, **world}
        return (ArraySpec((*lay.lead, *lay.patch_size), lay.source.dtype), coords, *world.values())

    def __len__(self) -> int:
        return self._layout.num_patches

    def __repr__(self) -> str:
        lay = self._layout
        extra = ""
        if lay.per_region > 1:
            extra += f", patches_per_chunk={lay.per_region}, region={lay.region}"
        if self._epoch:
            extra += f", epoch={self._epoch}"
        if not lay.replacement:
            extra += ", replacement=False"
        if lay.padding != "none":
            extra += f", padding={lay.padding!r}"
        if lay.weighted is not None:
            extra += ", weighted"
        if self._patch_size_mm is not None:
            extra += f", patch_size_mm={self._patch_size_mm}"
        if self._world is not None:
            extra += ", world=True"
        what = lay.arrays if lay.arrays is not None else lay.source
        return (
            f"PatchSampler({what!r}, patch_size={lay.patch_size}, "
            f"num_patches={lay.num_patches}, seed={lay.seed}, stride={lay.stride}{extra})"
        )

    def fingerprint(self) -> str:
        """A digest of everything that decides which patch an index means (no I/O).

        The Loader's resume state stores it (:func:`mixle.loading.state.source_fingerprint`).
        It covers the arrays (type, shape, dtype, chunks; names and scale factors of a
        dict), ``patch_size``, ``num_patches``, ``seed``, the current ``epoch``, ``stride``,
        ``replacement``, ``patches_per_chunk`` (and ``region`` when it is above 1),
        ``padding`` and the fill values, and the weighted or label placement (the map's
        identity and a hash of its voxels taken while it was indexed). Paths are left out
        (a moved store resumes), and so is the volume's content (it is never read here).
        With ``world=True`` it also covers the voxel-to-world affine (``patch_size_mm``
        is covered by the voxel ``patch_size`` it gives).
        """
        base = self._layout.fingerprint(self._epoch)
        if self._world is None:
            return base
        return fingerprint_digest("PatchSampler+world", {"base": base, "world": self._world})

    # -- placement (no I/O) -------------------------------------------------------------
    def coords_array(self, indices: ArrayLike | None = None) -> NDArray[np.int64]:
        """Corners of patches ``indices`` (default: all) as an int64 ``(N, ndim)`` array."""
        return self._corners(record_indices(indices, self._layout.num_patches))

    def _corners(self, idx: ArrayLike) -> NDArray[np.int64]:
        return self._layout.corners(idx, self._epoch)

    def coords(self) -> list[tuple[int, ...]]:
        """Corners of every patch as tuples of ints (no I/O)."""
        return [tuple(row) for row in self.coords_array().tolist()]

    # -- reading ------------------------------------------------------------------------
    def _read(self, corners: NDArray[np.int64]) -> Any:
        return self._layout.read(corners)

    def __getitem__(self, index: int) -> Record:
        """Patch ``index`` and its corner: ``(patch, coords)``, or a dict for a dict.

        With ``world=True``: ``(patch, coords, world)`` (a dict: a ``"world"`` entry), the
        world position a float64 array of one value per spatial axis.
        """
        lay = self._layout
        n = lay.num_patches
        i = parse_index(index, n, f"a sampler of {n} patches")
        corners = self._corners((i,))
        corner = tuple(corners[0].tolist())
        world: tuple[np.ndarray, ...] = ()
        if self._world is not None:
            world = (world_positions(self._world, corners)[0],)
        if lay.arrays is None and lay.padding == "none":
            start = (0,) * len(lay.lead) + corner
            return (lay.source.read_box(start, (*lay.lead, *lay.patch_size)), corner, *world)
        patches = self._read(np.array([corner], dtype=np.int64))
        if lay.arrays is None:
            return (patches[0], corner, *world)
        named = dict(zip([WORLD_KEY], world))
        return {**{k: v[0] for k, v in patches.items()}, COORDS_KEY: corner, **named}

    def get_batch(self, indices: ArrayLike) -> Any:
        """Patches ``indices`` stacked: ``(patches[B, *channels, *patch_size], coords[B, ndim])``.

        ``ndim`` is ``len(patch_size)`` (the spatial axes). For a dict:
        ``{name: patches[B, *channels, *patch_size // factor], "coords": ...}``. With
        ``world=True`` a third entry ``world[B, ns]`` float64, one value per spatial axis
        (a dict: ``"world"``).
        """
        corners = self.coords_array(indices)
        patches = self._read(corners)
        world = () if self._world is None else (world_positions(self._world, corners),)
        if self._layout.arrays is None:
            return (patches, corners, *world)
        return {**patches, COORDS_KEY: corners, **dict(zip([WORLD_KEY], world))}

    def chunk_keys(self, indices: ArrayLike) -> list[Hashable]:
        """The decoded-chunk cache keys ``get_batch(indices)`` reads.

        What the Loader tells the cache of its next batches
        (:meth:`mixle.reading.ChunkCache.read_ahead`); ``[]`` for arrays read without the
        cache (memory maps).
        """
        return self._layout.chunk_keys(self.coords_array(indices))

    def records(self) -> Iterator[Record]:
        """Yield the record of every index in order."""
        for i in range(self._layout.num_patches):
            yield self[i]

    def __iter__(self) -> Iterator[Record]:
        return self.records()


def _mm_patch_size(
    array: Any, mm: SizeMm, scales: Mapping[str, object] | None
) -> tuple[Any, tuple[int, ...]]:
    """``(array as a source or dict of sources, voxel patch size)`` of ``patch_size_mm=mm``."""
    if isinstance(array, Mapping):
        spatial = None if isinstance(mm, float) else len(mm)
        while True:  # one number: the finest array's spatial axes, which may set how many
            arrays = AlignedArrays(array, spatial_ndim=spatial, scales=scales)
            nd = len(arrays.shape)
            name = next(k for k, f in arrays.factors.items() if all(x == 1 for x in f))
            src = arrays.sources[name]
            size = patch_size_from_mm(
                mm, src.physical, src.ndim, repr(src), default_nd=nd, shape=src.shape
            )
            if len(size) == nd or spatial is not None:
                return arrays.sources, size
            spatial = len(size)
    source = as_array_source(array, name="array")
    if not source.shape:
        raise ValueError("array is 0-dimensional; patches need at least one axis")
    return source, patch_size_from_mm(
        mm, source.physical, source.ndim, repr(source), shape=source.shape
    )


def _world_affine(lay: PatchLayout) -> NDArray[np.float64]:
    """The spatial voxel-to-world affine of a layout's array (a dict: its finest array)."""
    nd = len(lay.patch_size)
    if lay.arrays is None:
        src = lay.source
        return spatial_affine(src.physical, nd, repr(src), shape=src.shape, size=lay.patch_size)
    if WORLD_KEY in lay.arrays.names:
        raise ValueError(
            f"world=True adds a {WORLD_KEY!r} entry to every record, but one of the arrays "
            f"is named {WORLD_KEY!r}; rename it"
        )
    name = next(k for k, f in lay.arrays.factors.items() if all(x == 1 for x in f))
    src = lay.arrays.sources[name]
    what = f"array {name!r} ({src!r})"
    return spatial_affine(src.physical, nd, what, shape=src.shape, size=lay.patch_size)


# ``inspect.signature(PatchSampler)`` (help(), the docs) shows the constructor, not ``__new__``
_init = inspect.signature(PatchSampler.__init__)
PatchSampler.__signature__ = _init.replace(  # type: ignore[attr-defined]
    parameters=list(_init.parameters.values())[1:]
)
