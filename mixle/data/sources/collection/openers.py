"""Open one volume of a collection by its format: zarr, HDF5, TIFF, NIfTI, N5, blosc2, npz...

The format is told from the path alone (its suffix, or a local folder for zarr), so a
collection of 10,000 files knows every volume's format without reading one.
"""

from __future__ import annotations

import importlib
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.memmap.source import MemmapArraySource, NpyArraySource
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.errors import UnsupportedStoreError
from mixle.utils.files import open_regular_file
from mixle.utils.redact import display_path

__all__ = [
    "HDF5_SUFFIXES",
    "NETCDF_SUFFIXES",
    "NIFTI_SUFFIXES",
    "RAW_SUFFIXES",
    "TIFF_SUFFIXES",
    "VOLUME_SUFFIXES",
    "ZARR_SUFFIXES",
    "Format",
    "OpenOptions",
    "is_url",
    "open_volume",
    "suffix_format",
    "volume_format",
]

Format = Literal["zarr", "hdf5", "npy", "raw", "tiff", "nifti", "n5", "b2nd", "npz"]

#: Suffixes read as HDF5 files (``dataset=`` names the array inside).
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
#: Suffixes of netCDF-4 files, read as the HDF5 files they are (``dataset=`` names the
#: variable); a netCDF-3 (classic) file of that name is refused when opened.
NETCDF_SUFFIXES = (".nc", ".nc4")
#: Suffixes read as zarr stores: folders (or URLs), and local zipped stores.
ZARR_SUFFIXES = (".zarr.zip", ".zarr")
#: Suffixes read as raw binary volumes (``raw_dtype=`` and ``raw_shape=`` describe them).
RAW_SUFFIXES = (".raw", ".bin", ".dat")
#: Suffixes read as TIFF files, OME-TIFF too (:func:`mixle.data.sources.arrays.tiff.read_tiff`).
TIFF_SUFFIXES = (".ome.tiff", ".ome.tif", ".tiff", ".tif")
#: Suffixes read as NIfTI-1/2 files (:func:`mixle.data.sources.arrays.nifti.read_nifti`).
NIFTI_SUFFIXES = (".nii.gz", ".nii")
#: Every suffix a volume's format is told by (names ending so are volumes, not metadata).
VOLUME_SUFFIXES = (
    *ZARR_SUFFIXES,
    ".npy",
    ".npz",
    ".n5",
    ".b2nd",
    *HDF5_SUFFIXES,
    *NETCDF_SUFFIXES,
    *RAW_SUFFIXES,
    *TIFF_SUFFIXES,
    *NIFTI_SUFFIXES,
)
#: What an "unknown format" error lists as accepted.
_ACCEPTED = (
    "a zarr store (a folder, a path or URL ending in .zarr, a local zipped store ending "
    "in .zarr.zip, or a URL without a suffix), "
    f"an HDF5 file ({', '.join(HDF5_SUFFIXES)}, with dataset=), "
    f"a netCDF-4 file ({', '.join(NETCDF_SUFFIXES)}, with dataset= naming the variable), "
    f"a TIFF file ({', '.join(TIFF_SUFFIXES)}), a NIfTI file ({', '.join(NIFTI_SUFFIXES)}), "
    "an N5 container (.n5, local or a URL, with dataset= for a dataset inside it), "
    "a blosc2 file (.b2nd), "
    "a .npz file (with dataset= naming the member when it holds several arrays), "
    "a .npy file, or a raw file "
    f"({', '.join(RAW_SUFFIXES)}, or any other name when raw_dtype= and raw_shape= are given)"
)
#: Format of each multi-letter suffix, longest first (``.nii.gz`` before ``.gz``).
_BY_SUFFIX: tuple[tuple[str, Format], ...] = (
    *((x, "tiff") for x in TIFF_SUFFIXES),
    *((x, "nifti") for x in NIFTI_SUFFIXES),
    *((x, "hdf5") for x in HDF5_SUFFIXES),
    *((x, "hdf5") for x in NETCDF_SUFFIXES),
    (".npy", "npy"),
    (".npz", "npz"),
    (".b2nd", "b2nd"),
    (".n5", "n5"),
    *((x, "zarr") for x in ZARR_SUFFIXES),
)


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``s3://``, ``http://``...) rather than a local path."""
    return "://" in path


def _suffix(path: str) -> str:
    text = urllib.parse.urlsplit(path).path if is_url(path) else path
    return os.path.splitext(text.rstrip("/\\"))[1].lower()


def suffix_format(path: str) -> Format | None:
    """The format a path's name ends in (``scan.nii.gz`` -> ``"nifti"``), else ``None``."""
    text = urllib.parse.urlsplit(path).path if is_url(path) else path
    name = text.rstrip("/\\").lower()
    for suffix, fmt in _BY_SUFFIX:
        if name.endswith(suffix):
            return fmt
    return None


@dataclass(frozen=True)
class OpenOptions:
    """How to open each volume: the arrays inside containers, raw layouts, fsspec options."""

    dataset: str | Mapping[str, str] | None = None
    component: str | Mapping[str, str] | None = None
    raw_dtype: np.dtype | None = None
    raw_shape: tuple[int, ...] | None = None
    raw_offset: int = 0
    storage_options: Mapping[str, Any] | None = None
    #: CF unpacking of zarr and HDF5 (netCDF-4) volumes, as ``read_zarr(mask_and_scale=)``.
    mask_and_scale: bool = False

    def dataset_for(self, name: str | None) -> str | None:
        """The HDF5 dataset of the array ``name`` (``None``: single-array volumes)."""
        return _pick(self.dataset, name)

    def component_for(self, name: str | None) -> str | None:
        """The zarr component of the array ``name`` (``None``: single-array volumes)."""
        return _pick(self.component, name)


def _pick(option: str | Mapping[str, str] | None, name: str | None) -> str | None:
    if option is None or isinstance(option, str):
        return option
    return option.get(name) if name is not None else None


def volume_format(path: str, options: OpenOptions, what: str) -> Format:
    """The format of the volume at ``path``, from its name (a stat for suffix-less paths).

    ``what`` names the volume in errors (``"volumes[3]"``, ``"row 3 of <table>"``).

    Raises
    ------
    FileNotFoundError
        A local path that does not exist.
    UnsupportedStoreError
        (a ``ValueError``) A name mixle cannot tell the format of.
    ValueError
        An HDF5 file without ``dataset=``, a raw file without ``raw_dtype=``/``raw_shape=``.

    Notes
    -----
    Suffixes: :data:`VOLUME_SUFFIXES` (``.nii.gz``, ``.ome.tif`` as a whole); a local
    folder without one is a zarr store, a URL without one too.
    """
    shown = display_path(path)
    url = is_url(path)
    if not url and not os.path.exists(path):
        raise FileNotFoundError(f"{what}: path={shown!r}: no such file or directory")
    suffix = _suffix(path)
    fmt: Format
    named = suffix_format(path)
    if named is not None:
        fmt = named
    elif os.path.isdir(path) if not url else not suffix:
        fmt = "zarr"
    elif suffix in RAW_SUFFIXES or options.raw_dtype is not None:
        fmt = "raw"
    else:
        raise UnsupportedStoreError(
            f"{what}: path={shown!r} is not a volume format mixle can tell from "
            f"its name; pass {_ACCEPTED}"
        )
    if url and fmt in _LOCAL_ONLY:
        raise UnsupportedStoreError(
            f"{what}: path={shown!r} is a {fmt} file: those are read from local paths only; "
            "copy it locally, or convert it to zarr"
        )
    if url and "::" not in path and suffix_format(path) == "zarr" and suffix == ".zip":
        raise UnsupportedStoreError(
            f"{what}: path={shown!r} is a zipped zarr store: those are read from local paths "
            "only; copy it locally, or unzip it into a zarr store (a folder or bucket prefix)"
        )
    if fmt == "hdf5" and options.dataset is None:
        kind = "a netCDF-4 file" if path.lower().endswith(NETCDF_SUFFIXES) else "an HDF5 file"
        raise ValueError(
            f"{what}: path={shown!r} is {kind}: pass dataset= (the path of "
            "the array inside it, e.g. dataset='volume')"
        )
    if fmt == "raw" and (options.raw_dtype is None or options.raw_shape is None):
        raise ValueError(
            f"{what}: path={shown!r} is a raw file: pass raw_dtype= and raw_shape= "
            "(and raw_offset= for a header)"
        )
    return fmt


def open_volume(path: str, fmt: Format, name: str | None, options: OpenOptions) -> ArraySource:
    """Open the array ``name`` (``None``: the one array) of the volume at ``path``.

    Opening reads the volume's metadata, as the ``read_*`` functions do.
    """
    fsspec_options: dict[str, Any] = {}
    if options.storage_options is not None and is_url(path):
        fsspec_options["storage_options"] = dict(options.storage_options)
    unpack = options.mask_and_scale
    if fmt == "zarr":
        component = options.component_for(name)
        return ZarrArraySource(path, component, mask_and_scale=unpack, **fsspec_options)
    if fmt == "hdf5":
        dataset = options.dataset_for(name)
        if dataset is None:
            raise ValueError(
                f"dataset={options.dataset!r} names no dataset for the array {name!r} of "
                f"{display_path(path)!r}: give one for every array name"
            )
        _refuse_netcdf3(path)
        return HDF5ArraySource(path, dataset, mask_and_scale=unpack, **fsspec_options)
    if fmt == "npy":
        return NpyArraySource(path)
    if fmt in _READERS:
        return _open_new_format(path, fmt, name, options, fsspec_options)
    assert options.raw_dtype is not None and options.raw_shape is not None
    return MemmapArraySource(path, options.raw_dtype, options.raw_shape, offset=options.raw_offset)


#: The first bytes of a netCDF-3 file (classic, 64-bit offset, 64-bit data).
_NETCDF3_MAGICS = (b"CDF\x01", b"CDF\x02", b"CDF\x05")


def _refuse_netcdf3(path: str) -> None:
    """Refuse a local ``.nc`` file that is netCDF-3 (not HDF5), naming the conversion."""
    if is_url(path) or not path.lower().endswith(NETCDF_SUFFIXES):
        return
    try:
        with open_regular_file(path, "path") as fh:
            head = fh.read(4)
    except OSError:
        return  # the HDF5 reader says what is wrong with it (SpecialFileError too)
    if head in _NETCDF3_MAGICS:
        raise UnsupportedStoreError(
            f"path={display_path(path)!r} is a netCDF-3 (classic) file, not netCDF-4 (HDF5): "
            "mixle reads netCDF-4; convert it (nccopy -k nc4 in.nc out.nc, or xarray's "
            "to_netcdf(..., engine='h5netcdf')) or to zarr"
        )


#: ``(module, function)`` of the formats whose readers are imported when first used.
_READERS: dict[str, tuple[str, str]] = {
    "tiff": ("mixle.data.sources.arrays.tiff", "read_tiff"),
    "nifti": ("mixle.data.sources.arrays.nifti", "read_nifti"),
    "n5": ("mixle.data.sources.arrays.n5", "read_n5"),
    "b2nd": ("mixle.data.sources.arrays.b2nd", "read_b2nd"),
    "npz": ("mixle.data.sources.arrays.npz", "read_npz"),
}
#: Formats read from local paths only (a URL is refused when the format is told).
_LOCAL_ONLY = ("tiff", "nifti", "b2nd", "npz")


def _open_new_format(
    path: str, fmt: Format, name: str | None, options: OpenOptions, fsspec: dict[str, Any]
) -> ArraySource:
    """Open a TIFF, NIfTI, N5, blosc2 or npz volume (``dataset=`` for N5 and npz).

    N5 is read from URLs too (``fsspec`` holds the ``storage_options``); the others from
    local files only.
    """
    module, function = _READERS[fmt]
    reader = getattr(importlib.import_module(module), function)
    if fmt in ("n5", "npz"):
        inner = options.dataset_for(name)
        if inner is None and isinstance(options.dataset, Mapping):
            raise ValueError(
                f"dataset={options.dataset!r} names no {'dataset' if fmt == 'n5' else 'member'} "
                f"for the array {name!r} of {display_path(path)!r}: give one for every array name"
            )
        extra = fsspec if fmt == "n5" else {}
        return reader(path, inner, **extra)  # type: ignore[no-any-return]
    return reader(path)  # type: ignore[no-any-return]
