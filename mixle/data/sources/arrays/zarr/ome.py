"""Voxel spacing and origin of an OME-Zarr image (NGFF 0.4 and 0.5), from its metadata.

An OME-Zarr image is a zarr group whose attributes hold ``multiscales``: the axes (names,
units) and, per resolution level (a ``dataset``, an array of the group named by its
``path``), the ``coordinateTransformations`` (a ``scale``, then optionally a
``translation``) that take its voxel indices to world coordinates. The multiscale itself
may carry transformations too, applied after the dataset's. NGFF 0.4 stores the
attributes in zarr v2's ``.zattrs``, NGFF 0.5 in zarr v3's ``zarr.json`` under
``attributes["ome"]``.

:func:`ome_physical` reads the one metadata document of the group that holds an array
(a bounded read: at most :data:`~mixle.data.sources.arrays.zarr.limits.ZARR_METADATA_LIMIT`
bytes, a regular file for local stores) and returns the array's
:class:`~mixle.data.sources.arrays.physical.Physical`, or ``None`` when the array is not a
dataset of a multiscale image. Metadata that is malformed (not a list where one is due, a
transformation mixle does not apply) gives an :class:`OmeZarrMetadataWarning` and ``None``,
never a guessed spacing; a transformation or axis list whose length does not match the
array's axes raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import warnings
from typing import Any

import numpy as np

from mixle.data.sources.arrays.physical import Physical, physical_from_affine
from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.data.sources.arrays.zarr.local_files import local_dir, read_local_object
from mixle.data.sources.arrays.zarr.stores import CheckedRangeStore
from mixle.errors import OmeZarrMetadataWarning
from mixle.reading import CorruptChunkError
from mixle.utils.redact import display_path

__all__ = ["OmeZarrMetadataWarning", "ome_physical", "physical_from_ngff"]

#: NGFF versions before coordinate transformations (their scale is implicit: none recorded).
_NO_TRANSFORMS = ("0.1", "0.2", "0.3")


class _Malformed(Exception):
    """Metadata mixle cannot apply: warned about, the array gets ``physical=None``."""


def ome_physical(array: Any, where: str) -> Physical | None:
    """The :class:`Physical` an OME-Zarr image's metadata gives the open ``zarr.Array``.

    Parameters
    ----------
    array
        An open ``zarr.Array``. The group holding it (its parent inside the store, or for an
        array at the root of a local store, the folder above) is read for ``multiscales``;
        the array counts when it is one of their datasets. A remote (or in-memory) store is
        never read outside its root: open a remote image's level with ``component=``
        (``read_zarr("s3://bucket/img.ome.zarr", component="0")``).
    where
        How messages name the array.

    Returns
    -------
    Physical or None
        ``None`` when the group records no multiscale image with this array, records one of
        NGFF 0.1 to 0.3 (no transformations), or records one mixle cannot apply (then with
        an :class:`OmeZarrMetadataWarning`).

    Raises
    ------
    ValueError
        A ``scale``, ``translation`` or ``axes`` whose length is not the array's number of
        axes, naming the metadata file.
    ~mixle.errors.CorruptChunkError, ~mixle.errors.SpecialFileError
        The group's metadata file is larger than the metadata limit, or not a regular file.
    """
    found = _group_document(array)
    if found is None:
        return None
    raw, label, name = found
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None  # not this module's to judge: zarr reads (and refuses) the group itself
    if not isinstance(doc, dict):
        return None
    if array.metadata.zarr_format == 3:
        if doc.get("node_type") != "group":
            return None
        attrs = doc.get("attributes")
    else:
        attrs = doc
    if not isinstance(attrs, dict):
        return None
    try:
        return physical_from_ngff(attrs, name, len(array.shape), label)
    except _Malformed as exc:
        warnings.warn(
            f"zarr array {where}: the OME-Zarr metadata in {label!r} cannot be applied "
            f"({exc}); the array gets no spacing (physical=None)",
            OmeZarrMetadataWarning,
            stacklevel=2,
        )
        return None


def physical_from_ngff(attrs: dict[str, Any], path: str, ndim: int, label: str) -> Physical | None:
    """The :class:`Physical` of dataset ``path`` of the NGFF group attributes ``attrs``.

    ``attrs`` are the group's attributes (NGFF 0.5: ``{"ome": {"multiscales": ...}}``;
    0.4: ``{"multiscales": ...}``); ``ndim`` is the array's number of axes; ``label`` names
    the metadata file in messages. ``None`` when no multiscale lists ``path``.

    Raises
    ------
    ValueError
        A transformation or axis list of the wrong length (naming ``label``).
    _Malformed
        Metadata that cannot be applied (the caller warns).
    """
    ome = attrs.get("ome")
    version: object = None
    if isinstance(ome, dict) and "multiscales" in ome:
        multiscales, version = ome["multiscales"], ome.get("version")
    elif "multiscales" in attrs:
        multiscales = attrs["multiscales"]
    else:
        return None
    if not isinstance(multiscales, list):
        raise _Malformed(f"multiscales is a {type(multiscales).__name__}, not a list")
    for i, ms in enumerate(multiscales):
        if not isinstance(ms, dict):
            raise _Malformed(f"multiscales[{i}] is not an object")
        datasets = ms.get("datasets")
        if not isinstance(datasets, list):
            raise _Malformed(f"multiscales[{i}].datasets is not a list")
        for j, ds in enumerate(datasets):
            if not isinstance(ds, dict):
                raise _Malformed(f"multiscales[{i}].datasets[{j}] is not an object")
            if _same_path(ds.get("path"), path):
                what = f"multiscales[{i}]"
                return _dataset_physical(ms, ds, version, ndim, label, what, f"datasets[{j}]")
    return None


def _same_path(given: object, path: str) -> bool:
    if not isinstance(given, str):
        return False
    return posixpath.normpath(given.strip("/") or ".") == posixpath.normpath(path or ".")


def _dataset_physical(
    ms: dict[str, Any],
    ds: dict[str, Any],
    outer_version: object,
    ndim: int,
    label: str,
    what: str,
    which: str,
) -> Physical | None:
    version = ms.get("version", outer_version)
    if isinstance(version, str) and version in _NO_TRANSFORMS:
        return None  # these versions record no spacing
    names, units = _axes(ms.get("axes"), ndim, label, what)
    if "coordinateTransformations" not in ds:
        raise _Malformed(f"{what}.{which} has no coordinateTransformations")
    affine = _compose(ds["coordinateTransformations"], ndim, label, f"{what}.{which}")
    if "coordinateTransformations" in ms:
        outer = _compose(ms["coordinateTransformations"], ndim, label, what)
        affine = outer @ affine
    try:
        return physical_from_affine(affine, axes=names, units=units)
    except ValueError as exc:  # a zero scale: singular
        raise _Malformed(f"{what}.{which}: {exc}") from None


def _axes(
    axes: object, ndim: int, label: str, what: str
) -> tuple[tuple[str, ...] | None, tuple[str | None, ...] | None]:
    """``(names, units)`` of NGFF ``axes`` (objects, or plain names before 0.4)."""
    if axes is None:
        return None, None
    if not isinstance(axes, list):
        raise _Malformed(f"{what}.axes is not a list")
    if len(axes) != ndim:
        raise ValueError(
            f"OME-Zarr metadata {label!r}: {what}.axes has {len(axes)} entries but the "
            f"array has {ndim} axes (damaged metadata)"
        )
    names: list[str] = []
    units: list[str | None] = []
    for k, axis in enumerate(axes):
        if isinstance(axis, str):
            names.append(axis)
            units.append(None)
            continue
        if not isinstance(axis, dict) or not isinstance(axis.get("name"), str):
            raise _Malformed(f"{what}.axes[{k}] has no name")
        unit = axis.get("unit")
        if unit is not None and not isinstance(unit, str):
            raise _Malformed(f"{what}.axes[{k}].unit={unit!r} is not a string")
        names.append(axis["name"])
        units.append(unit)
    return tuple(names), tuple(units)


def _compose(transforms: object, ndim: int, label: str, what: str) -> np.ndarray:
    """The affine of a list of NGFF transformations applied in order (scale, translation)."""
    if not isinstance(transforms, list):
        raise _Malformed(f"{what}.coordinateTransformations is not a list")
    affine = np.eye(ndim + 1)
    for k, t in enumerate(transforms):
        name = f"{what}.coordinateTransformations[{k}]"
        if not isinstance(t, dict):
            raise _Malformed(f"{name} is not an object")
        kind = t.get("type")
        if kind == "identity":
            continue
        if kind not in ("scale", "translation"):
            raise _Malformed(f"{name} has type {kind!r}; mixle applies scale and translation")
        if kind not in t:
            detail = "stored in an array (path=)" if "path" in t else "missing"
            raise _Malformed(f"{name}: its {kind} values are {detail}")
        values = _numbers(t[kind], name, kind)
        if len(values) != ndim:
            raise ValueError(
                f"OME-Zarr metadata {label!r}: {name} is a {kind} of {len(values)} values "
                f"but the array has {ndim} axes (damaged metadata)"
            )
        step = np.eye(ndim + 1)
        if kind == "scale":
            step[:-1, :-1] = np.diag(values)
        else:
            step[:-1, -1] = values
        affine = step @ affine
    return affine


def _numbers(values: object, name: str, kind: str) -> list[float]:
    if not isinstance(values, list):
        raise _Malformed(f"{name}: {kind} is not a list")
    out = []
    for x in values:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise _Malformed(f"{name}: {kind}={values!r} must hold finite numbers")
        out.append(float(x))
    return out


# -- the group's metadata document (one bounded read) ---------------------------------------
def _group_document(array: Any) -> tuple[bytes, str, str] | None:
    """``(bytes, label, dataset path)`` of the metadata document of the group holding ``array``.

    ``None`` when there is no such group (or it has no attributes document), or the array
    is the root of a store that is not a local folder.
    """
    filename = "zarr.json" if array.metadata.zarr_format == 3 else ".zattrs"
    path = array.path.strip("/")
    folder = local_dir(array)
    if folder is not None:
        folder = os.path.normpath(folder)
        if os.path.dirname(folder) == folder:
            return None  # the file system's root has no parent
        name = os.path.basename(folder)
        file = os.path.join(os.path.dirname(folder), filename)
        if not os.path.lexists(file):
            return None  # a stat, not an open: most stores have no group above them
        try:
            raw = read_local_object(file, "OME-Zarr metadata file", ZARR_METADATA_LIMIT)
        except (CorruptChunkError, OSError) as exc:
            if path:  # inside the store: zarr's own checks refused this file already
                raise
            # the folder above the store is not the user's store: its file is skipped
            warnings.warn(
                f"zarr array at {folder!r}: the folder above it has a {filename} that is "
                f"not read for OME-Zarr metadata ({exc})",
                OmeZarrMetadataWarning,
                stacklevel=3,
            )
            return None
        return None if raw is None else (raw, file, name)
    if not path:  # a remote store is never read outside the prefix it was given
        return None
    store = array.store
    parent, _, name = path.rpartition("/")
    key = f"{parent}/{filename}" if parent else filename
    raw = _store_get(store, key)
    if raw is None:
        return None
    return raw, _store_label(store, key), name


def _store_get(store: Any, key: str) -> bytes | None:
    """Stored key ``key`` of ``store``, at most :data:`ZARR_METADATA_LIMIT` bytes."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    checked = CheckedRangeStore(store, ZARR_METADATA_LIMIT)  # fsspec: capped before download
    try:
        buf = sync(checked.get(key, default_buffer_prototype()))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, KeyError):
        return None  # KeyError: a store answering a key it has no such name for (tifffile's)
    if buf is None:
        return None
    raw = buf.to_bytes()
    if len(raw) > ZARR_METADATA_LIMIT:
        raise CorruptChunkError(
            f"OME-Zarr metadata {key!r} has {len(raw):,} bytes, more than the "
            f"{ZARR_METADATA_LIMIT:,} mixle parses (ZARR_METADATA_LIMIT)"
        )
    return bytes(raw)


def _store_label(store: Any, key: str) -> str:
    root = getattr(store, "path", None)
    if isinstance(root, str) and root:
        protocol = getattr(getattr(store, "fs", None), "protocol", None)
        if isinstance(protocol, (tuple, list)):
            protocol = protocol[0]
        base = f"{protocol}://{root.rstrip('/')}" if isinstance(protocol, str) else root
        return display_path(f"{base}/{key}")
    return key
