"""Lazy N-D array sources (zarr, HDF5, raw memmap, ``.npy``) and the patch sampler.

This module is the stable import path for the array family; the implementations live in
one module per backend beside it.

Notes
-----
Every connector constructs even where its library is not installed: without zarr (h5py)
:func:`read_zarr` (:func:`read_hdf5`) stores its arguments, does no I/O, says
``(not opened: zarr is not installed here)`` in its repr and pickles by reference, so a
driver can build sources for Dask or ``MPEncodedData`` workers that have the library. The
first use (``shape``, ``len``, a read, ``element_spec``...) then raises the ``ImportError``
of :func:`mixle.utils.optional_deps.require`, naming the ``pip install -e ".[extra]"``
command. Argument checks that need no library (types, modes, ``storage_options``) always
run at construction; where the library is installed, the metadata is read at construction
too, so a missing file or array fails there. Memmap and ``.npy`` sources need no extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from numpy.typing import DTypeLike

from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.data.schema import Schema
from mixle.data.sources.arrays.adopt import ArrayLikeSource, as_array_source
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.memmap.source import MemmapArraySource, NpyArraySource
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.data.structure import EXCHANGEABLE, SampleStructure

__all__ = [
    "ArrayLikeSource",
    "ArraySource",
    "HDF5ArraySource",
    "MemmapArraySource",
    "NpyArraySource",
    "PatchSampler",
    "ZarrArraySource",
    "as_array_source",
    "read_hdf5",
    "read_memmap",
    "read_npy",
    "read_zarr",
]


def read_zarr(
    path: str | os.PathLike[str] | Any,
    component: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
    mask_and_scale: bool = False,
    backend: str = "auto",
) -> ZarrArraySource:
    """Open a zarr array lazily; see :class:`ZarrArraySource` (needs ``mixle[zarr]`` to read).

    ``path`` may also be a local ``.zip`` file holding a zarr store, or a local icechunk
    repository folder read at ``branch=`` (default ``"main"``), ``tag=`` or ``snapshot=``
    (needs ``mixle[icechunk]``). ``mask_and_scale=True`` decodes CF packing (``scale_factor``,
    ``add_offset``, fill values as NaN) as xarray does; default: the stored values.
    ``backend`` picks how a URL is read: ``"auto"`` (obstore where it can, ``mixle[obstore]``,
    else fsspec), ``"obstore"`` (or an error saying why not) or ``"fsspec"``.
    """
    return ZarrArraySource(
        path,
        component,
        storage_options=storage_options,
        branch=branch,
        tag=tag,
        snapshot=snapshot,
        structure=structure,
        schema=schema,
        mask_and_scale=mask_and_scale,
        backend=backend,
    )


def read_hdf5(
    path: str | os.PathLike[str],
    dataset: str,
    *,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
    mask_and_scale: bool = False,
    **h5py_options: Any,
) -> HDF5ArraySource:
    """Open an HDF5 dataset lazily; see :class:`HDF5ArraySource` (needs ``mixle[hdf5]`` to read).

    ``mask_and_scale=True`` decodes CF packing (netCDF-4 ``scale_factor``, ``add_offset``,
    fill values as NaN) as xarray does; default: the stored values. For URLs,
    ``storage_options`` go to obstore or fsspec, and ``backend`` picks which reads:
    ``"auto"`` (obstore where it can read the URL, else fsspec), ``"obstore"`` or
    ``"fsspec"`` (see the remote stores guide).
    """
    return HDF5ArraySource(
        path,
        dataset,
        storage_options=storage_options,
        backend=backend,
        structure=structure,
        schema=schema,
        mask_and_scale=mask_and_scale,
        **h5py_options,
    )


def read_memmap(
    path: str | os.PathLike[str],
    dtype: DTypeLike,
    shape: int | Sequence[int],
    *,
    mode: str = "r",
    offset: int = 0,
    order: str = "C",
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> MemmapArraySource:
    """Memory-map a raw binary volume; see :class:`MemmapArraySource`."""
    return MemmapArraySource(
        path,
        dtype,
        shape,
        mode=mode,
        offset=offset,
        order=order,
        structure=structure,
        schema=schema,
    )


def read_npy(
    path: str | os.PathLike[str],
    *,
    mode: str = "r",
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> NpyArraySource:
    """Memory-map a ``.npy`` file using its header; see :class:`NpyArraySource`."""
    return NpyArraySource(path, mode=mode, structure=structure, schema=schema)
