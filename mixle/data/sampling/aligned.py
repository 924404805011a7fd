"""Several arrays cut at the same physical place: channels and integer scale factors.

An image and its label, two zarr components or two HDF5 datasets, a label volume at half
resolution: :class:`AlignedArrays` holds them as sources and turns one corner on the finest
grid into one box per array.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sampling.padding import parse_pad_value, read_spatial_boxes, spatial_box_keys
from mixle.data.sampling.patch_args import fingerprint_digest, per_axis, source_identity
from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource, listing
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.zarr.by_path import open_by_path, parse_version, release_store
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.data.spec import ArraySpec
from mixle.errors import ArrayNotFoundError
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = [
    "COORDS_KEY",
    "PATCH_KEY",
    "VOLUME_KEY",
    "AlignedArrays",
    "infer_scale",
    "read_hdf5_arrays",
    "read_zarr_arrays",
]

#: The record key that holds the corner; no array may use it as its name.
COORDS_KEY = "coords"
#: Record key of the patch (or tile) of a collection whose volumes are single arrays.
PATCH_KEY = "patch"
#: Record key of the volume (int64 index into the collection) a patch or tile comes from.
VOLUME_KEY = "volume"


def infer_scale(
    fine: Sequence[int],
    shape: Sequence[int],
    name: str,
    given: object = None,
    given_name: str = "scales",
) -> tuple[int, ...]:
    """Integer factors ``f`` with ``shape[a] == fine[a] // f[a]`` (rounded down or up).

    ``given`` (an int or one int per axis) is checked instead of inferred when passed;
    errors about it call it ``given_name``.

    Raises
    ------
    TypeError
        An entry of ``given`` is not an int.
    ValueError
        When no integer factor relates the shapes (or ``given`` does not), naming ``name``;
        or ``given`` has the wrong number of entries or one below 1.
    """
    stated = None if given is None else per_axis(given, len(fine), given_name, 1)
    factors = []
    for a, (d, s) in enumerate(zip(fine, shape)):
        if stated is not None:
            candidates = [stated[a]]
        elif s > 0:
            candidates = [d // s, -(-d // s)]
        else:
            candidates = []
        ok = [f for f in candidates if f >= 1 and s in (d // f, -(-d // f))]
        if not ok:
            want = "the given scale" if given is not None else "an integer factor"
            raise ValueError(
                f"{name} has spatial shape {tuple(shape)}, which is not the finest shape "
                f"{tuple(fine)} divided by {want} on axis {a} ({d} -> {s}); each spatial "
                "size must be the finest size divided by an integer, rounded down or up"
            )
        factors.append(ok[0])
    return tuple(factors)


class AlignedArrays:
    """Named arrays that share one physical grid, read together at one corner.

    Parameters
    ----------
    arrays
        ``{name: array or source}``; names are strings other than ``"coords"``.
    spatial_ndim
        How many trailing axes are spatial; leading axes beyond them are channel axes that
        every patch holds whole. Default: the smallest ``ndim`` among the arrays.
    scales
        Optional ``{name: int or per-axis ints}`` to state (and check) scale factors; the
        rest are inferred from the shapes.

    Notes
    -----
    The finest array (largest spatial size on each axis) defines the grid corners live on.
    An array at factor ``f`` reads the box ``[corner // f, (corner + patch) // f)``, so
    corners are multiples of :attr:`step` (the per-axis least common multiple of the
    factors) and patch extents multiples of every factor.
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        *,
        spatial_ndim: int | None = None,
        scales: Mapping[str, object] | None = None,
    ) -> None:
        if not isinstance(arrays, Mapping) or not arrays:
            raise ValueError(f"arrays={arrays!r} must be a non-empty dict of name -> array")
        sources: dict[str, ArraySource] = {}
        for name, arr in arrays.items():
            if not isinstance(name, str) or name == COORDS_KEY:
                raise ValueError(
                    f"array name {name!r} is not allowed: names must be strings other than "
                    f"{COORDS_KEY!r} (the record key of the corner)"
                )
            sources[name] = as_array_source(arr, name=f"arrays[{name!r}]")
        nd = min(s.ndim for s in sources.values()) if spatial_ndim is None else spatial_ndim
        if nd < 1 or any(s.ndim < nd for s in sources.values()):
            raise ValueError(
                f"spatial_ndim={nd} must be >= 1 and at most every array's ndim "
                f"({ {k: s.ndim for k, s in sources.items()} })"
            )
        scales = dict(scales or {})
        unknown = sorted(set(scales) - set(sources))
        if unknown:
            raise KeyError(f"scales names {unknown[0]!r}, which is not one of {sorted(sources)}")
        spatial = {k: s.shape[s.ndim - nd :] for k, s in sources.items()}
        self._fine = tuple(max(sh[a] for sh in spatial.values()) for a in range(nd))
        self._sources = sources
        self._lead = {k: s.shape[: s.ndim - nd] for k, s in sources.items()}
        self._factors = {
            k: infer_scale(self._fine, sh, f"arrays[{k!r}]", scales.get(k), f"scales[{k!r}]")
            for k, sh in spatial.items()
        }
        self._step = tuple(math.lcm(*(f[a] for f in self._factors.values())) for a in range(nd))

    @property
    def names(self) -> tuple[str, ...]:
        """Array names, in the order given."""
        return tuple(self._sources)

    @property
    def sources(self) -> dict[str, ArraySource]:
        """``{name: source}``."""
        return dict(self._sources)

    @property
    def shape(self) -> tuple[int, ...]:
        """Spatial shape of the finest grid (the one corners live on)."""
        return self._fine

    @property
    def factors(self) -> dict[str, tuple[int, ...]]:
        """``{name: per-axis scale factor}`` (1 for arrays at the finest resolution)."""
        return dict(self._factors)

    @property
    def channels(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape of the leading channel axes}`` (``()`` for none)."""
        return dict(self._lead)

    @property
    def step(self) -> tuple[int, ...]:
        """Per-axis spacing corners must keep: the lcm of the scale factors."""
        return self._step

    def fingerprint(self) -> str:
        """A digest of the names in order, the sources (type, shape, dtype, chunks), the scales."""
        return fingerprint_digest(
            "AlignedArrays",
            {
                "arrays": [
                    (name, source_identity(src), self._factors[name], self._lead[name])
                    for name, src in self._sources.items()
                ],
                "step": self._step,
            },
        )

    def check_patch_size(self, patch_size: Sequence[int]) -> None:
        """Raise ``ValueError`` unless every patch extent divides by every scale factor."""
        for name, f in self._factors.items():
            bad = [a for a, (p, k) in enumerate(zip(patch_size, f)) if p % k]
            if bad:
                a = bad[0]
                raise ValueError(
                    f"patch_size={tuple(patch_size)} does not divide by the scale factor {f[a]} "
                    f"of arrays[{name!r}] on axis {a}; use a multiple of {self._step[a]}"
                )

    def pad_values(self, pad_value: object) -> dict[str, Any]:
        """One validated fill value per array from a scalar or a ``{name: value}`` dict."""
        out = {}
        for name, src in self._sources.items():
            if isinstance(pad_value, Mapping):
                value, label = pad_value.get(name, 0), f"pad_value[{name!r}]"
            else:
                value, label = pad_value, "pad_value"
            out[name] = parse_pad_value(value, src.dtype, label)
        return out

    def element_specs(self, patch_size: Sequence[int]) -> dict[str, ArraySpec]:
        """``{name: spec of one patch}`` from metadata."""
        return {
            name: ArraySpec(
                (*self._lead[name], *(p // f for p, f in zip(patch_size, self._factors[name]))),
                src.dtype,
            )
            for name, src in self._sources.items()
        }

    def read(
        self,
        corners: NDArray[np.int64],
        patch_size: Sequence[int],
        *,
        padding: str = "none",
        pad_values: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """``{name: patches[B, *channels, *patch_size // factor]}`` at ``corners``.

        One batched read per array; ``corners`` are on the finest grid, multiples of
        :attr:`step`.
        """
        out = {}
        for name, src in self._sources.items():
            f = self._factors[name]
            size = tuple(p // k for p, k in zip(patch_size, f))
            fill = 0 if pad_values is None else pad_values[name]
            out[name] = read_spatial_boxes(
                src,
                corners // np.asarray(f, dtype=np.int64),
                self._lead[name],
                size,
                padding=padding,
                pad_value=fill,
            )
        return out

    def chunk_keys(self, corners: NDArray[np.int64], patch_size: Sequence[int]) -> list[Any]:
        """The decoded-chunk cache keys :meth:`read` reads, over every array."""
        keys: list[Any] = []
        for name, src in self._sources.items():
            f = self._factors[name]
            size = tuple(p // k for p, k in zip(patch_size, f))
            scaled = corners // np.asarray(f, dtype=np.int64)
            keys += spatial_box_keys(src, scaled, self._lead[name], size)
        return keys

    def __repr__(self) -> str:
        parts = [f"{k}: {s!r} x{self._factors[k]}" for k, s in self._sources.items()]
        return f"AlignedArrays({{{', '.join(parts)}}})"


def _pick(
    available: list[str], names: Sequence[str] | Mapping[str, str] | None, where: str
) -> dict[str, str]:
    if names is None:
        return {n: n for n in available}
    wanted = dict(names) if isinstance(names, Mapping) else {n: n for n in names}
    for key, path in wanted.items():
        if path.strip("/") not in available:
            raise ArrayNotFoundError(
                f"{key!r} -> {path!r} is not an array in {where}; {listing(available, 'arrays')}"
            )
    return {k: v.strip("/") for k, v in wanted.items()}


def read_zarr_arrays(
    path: str | os.PathLike[str] | Any,
    names: Sequence[str] | Mapping[str, str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    mask_and_scale: bool = False,
) -> dict[str, ZarrArraySource]:
    """``{name: source}`` for arrays of a zarr group, ready for aligned sampling.

    ``path`` is what :func:`~mixle.read_zarr` takes: a zarr folder, a URL, a store object,
    a zipped zarr store (``.zip``, read-only) or a local icechunk repository folder, with
    ``branch=``, ``tag=`` or ``snapshot=`` choosing the icechunk version (default: the
    head of ``"main"``); every array reads the snapshot the listing saw (their reprs name
    it), so a commit made meanwhile never mixes versions. ``names`` is a list of
    components, a ``{name: component}`` dict, or ``None`` (every array in the group, keyed
    by its component path). ``mask_and_scale`` unpacks CF-packed variables as in
    :func:`~mixle.read_zarr`.

    Raises
    ------
    ~mixle.errors.ArrayNotFoundError
        (a ``KeyError``) A name that is not an array of the group, listing what exists.
    ValueError
        ``branch=``/``tag=``/``snapshot=`` for something other than an icechunk repository,
        more than one of them, or a version the repository lacks (listing its branches and
        tags).
    ~mixle.errors.UnsupportedStoreError
        A zip file holding no zarr store, or a file of another format (naming its reader).
    """
    zarr = require("zarr", "zarr", feature="read_zarr_arrays")
    by_path = open_by_path(path, None, parse_version(branch, tag, snapshot))
    try:
        if by_path is None:
            where = os.fspath(path) if isinstance(path, os.PathLike) else path
            group = zarr.open_group(where, mode="r", storage_options=storage_options)
        else:
            group = zarr.open_group(store=by_path.store, mode="r")
        available = [n for n, node in group.members(max_depth=None) if isinstance(node, zarr.Array)]
    finally:
        if by_path is not None:
            release_store(by_path.store)
    picked = _pick(sorted(available), names, f"the zarr group {display_path(path)!r}")
    version: dict[str, Any] = {"branch": branch, "tag": tag, "snapshot": snapshot}
    if by_path is not None and by_path.version is not None:
        version = {"snapshot": by_path.version["snapshot"]}  # the listing's snapshot, for all
    return {
        k: ZarrArraySource(
            path, c, storage_options=storage_options, mask_and_scale=mask_and_scale, **version
        )
        for k, c in picked.items()
    }


def read_hdf5_arrays(
    path: str | os.PathLike[str],
    names: Sequence[str] | Mapping[str, str] | None = None,
    *,
    mask_and_scale: bool = False,
) -> dict[str, HDF5ArraySource]:
    """``{name: source}`` for datasets of an HDF5 file, ready for aligned sampling.

    ``names`` as in :func:`read_zarr_arrays` (dataset paths, leading ``/`` optional);
    ``mask_and_scale`` unpacks CF-packed variables (netCDF-4) as in :func:`~mixle.read_hdf5`.
    """
    h5py = require("h5py", "hdf5", feature="read_hdf5_arrays")
    found: list[str] = []
    with h5py.File(os.fspath(path), "r") as f:
        f.visititems(lambda n, node: found.append(n) if isinstance(node, h5py.Dataset) else None)
    picked = _pick(sorted(found), names, f"the HDF5 file {os.fspath(path)!r}")
    return {k: HDF5ArraySource(path, d, mask_and_scale=mask_and_scale) for k, d in picked.items()}
