"""Options and storage checks of HDF5 datasets, done when one is opened.

:func:`hdf5_args` checks the arguments of
:class:`~mixle.data.sources.arrays.hdf5.source.HDF5ArraySource`;
:func:`open_with_access` opens a dataset with its chunk cache and prefixes;
:func:`check_external` and :func:`check_virtual` refuse storage HDF5 would block on (FIFOs,
devices) before any read: HDF5 opens those files itself.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.arrays.hdf5.plugin_sizes import PluginSizeCheck
from mixle.reading.object_client import check_backend
from mixle.utils.files import require_regular_file
from mixle.utils.redact import display_path

__all__ = [
    "PluginSizeCheck",
    "HDF5_CHUNK_CACHE_BYTES",
    "HDF5_CHUNK_CACHE_SLOTS",
    "check_external",
    "check_virtual",
    "hdf5_args",
    "is_url",
    "open_with_access",
]

#: Default per-dataset HDF5 chunk cache (``rdcc_nbytes``): room for the chunks a batch of
#: patches touches, where HDF5's own 1 MiB default holds at most one 64³ float32 chunk.
HDF5_CHUNK_CACHE_BYTES = 64 * 1024 * 1024
#: Default hash-table size of the chunk cache (``rdcc_nslots``), a prime well above the
#: number of chunks that fit.
HDF5_CHUNK_CACHE_SLOTS = 100_003
#: Dataset-access options, applied through HDF5's dataset access property list.
ACCESS = ("efile_prefix", "virtual_prefix")
#: How HDF5 names the prefix of an HDF5 file's own folder in ``efile_prefix``.
_ORIGIN = "${ORIGIN}"
_MODES = ("r", "r+")


def open_with_access(
    h5py: Any, file: Any, name: str, options: dict[str, Any], access: dict[str, str]
) -> Any:
    """Open dataset ``name`` with this source's chunk cache and ``access`` prefixes.

    HDF5 keeps one chunk cache per open dataset in a process, set by whoever opens it first:
    a dataset already open elsewhere in the process keeps that opener's cache (and refuses
    another ``efile_prefix`` or ``virtual_prefix``).
    """
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(
        options["rdcc_nslots"], options["rdcc_nbytes"], options.get("rdcc_w0", 0.75)
    )
    if "efile_prefix" in access:
        dapl.set_efile_prefix(os.fsencode(access["efile_prefix"]))
    if "virtual_prefix" in access:
        dapl.set_virtual_prefix(os.fsencode(access["virtual_prefix"]))
    try:
        dsid = h5py.h5d.open(file.id, name.encode(), dapl=dapl)
    except KeyError as exc:
        if "prefix" not in str(exc):
            raise
        raise ValueError(
            f"dataset={name!r} is already open in this process with another "
            f"{' or '.join(ACCESS)} ({exc}); close the other handle first"
        ) from None
    # readonly lets h5py cache shape/dtype lookups, as File.__getitem__ does: 3x faster reads
    return h5py.Dataset(dsid, readonly=file.mode == "r")


def check_external(dataset: Any, file_path: str | None, where: str) -> None:
    """Refuse a dataset whose external raw-data files are missing or special files.

    Names are resolved as HDF5 resolves them (``HDF5_EXTFILE_PREFIX``, else the dataset's
    ``efile_prefix``, else the current directory); ``file_path`` is the HDF5 file's path
    (``None``: not a local file, so ``${ORIGIN}`` cannot be resolved and nothing is checked).
    HDF5 reads these files itself: a FIFO among them would block the read for ever.
    """
    slots = dataset.external
    if not slots:
        return
    prefix = os.environ.get("HDF5_EXTFILE_PREFIX") or os.fsdecode(
        dataset.id.get_access_plist().get_efile_prefix()
    )
    origin = None if file_path is None else os.path.dirname(os.path.abspath(file_path))
    if prefix.startswith(_ORIGIN):
        if origin is None:
            return
        prefix = origin + prefix[len(_ORIGIN) :]
    base = None if prefix in ("", ".") else prefix
    missing = []
    for name in dict.fromkeys(os.fsdecode(slot[0]) for slot in slots):
        full = name if base is None or os.path.isabs(name) else os.path.join(base, name)
        try:
            require_regular_file(full, f"external raw-data file of HDF5 dataset {where}")
        except FileNotFoundError:
            missing.append(full)
    if not missing:
        return
    looked = f"in the current directory {os.getcwd()!r}" if base is None else f"under {prefix!r}"
    beside = origin is not None and all(
        os.path.isfile(os.path.join(origin, os.path.basename(m))) for m in missing
    )
    hint = f" (they are in the HDF5 file's folder: efile_prefix={_ORIGIN!r})" if beside else ""
    raise FileNotFoundError(
        f"HDF5 dataset {where} stores its data in external raw-data files that are "
        f"missing ({listing(missing, 'files')}); relative names are looked up {looked}: pass "
        f"efile_prefix= the folder that holds them{hint}, or {_ORIGIN!r} for the HDF5 "
        "file's own folder"
    )


def is_url(path: object) -> bool:
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def hdf5_args(
    path: Any,
    dataset: Any,
    options: dict[str, Any],
    storage_options: Any = None,
    access: dict[str, Any] | None = None,
    backend: Any = "auto",
) -> dict[str, Any]:
    """The checked arguments of a source: path, dataset, ``h5py.File`` options and the rest.

    ``backend`` (``"auto"``, ``"obstore"`` or ``"fsspec"``) is kept when it is not
    ``"auto"``; another value, or one other than ``"auto"`` for a path that is not a URL,
    raises ``ValueError``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path={path!r} must be a path to an HDF5 file, an fsspec URL or a binary "
            "file-like object"
        )
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError("storage_options must be a dict of fsspec options or None")
    if storage_options and not is_url(path):
        raise ValueError(
            "storage_options only apply to fsspec URLs (such as s3://bucket/x.h5); "
            f"path={display_path(path)!r} is not one"
        )
    check_backend(backend)
    if backend != "auto" and not is_url(path):
        raise ValueError(
            f"backend={backend!r} only applies to URLs (such as s3://bucket/x.h5); "
            f"path={display_path(path)!r} is not one: leave backend='auto'"
        )
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset={dataset!r} must be the name of a dataset in the file")
    options = dict(options)
    mode = options.setdefault("mode", "r")
    if mode not in _MODES:
        raise ValueError(
            f"mode={mode!r} could create or truncate the file; HDF5ArraySource accepts "
            f"{' or '.join(map(repr, _MODES))}"
        )
    options.setdefault("rdcc_nbytes", HDF5_CHUNK_CACHE_BYTES)
    options.setdefault("rdcc_nslots", HDF5_CHUNK_CACHE_SLOTS)
    _check_cache_options(options)
    args = {"path": os.fspath(path), "dataset": dataset, "options": options}
    if storage_options:
        args["storage_options"] = storage_options
    if backend != "auto":
        args["backend"] = backend
    prefixes = _parse_access(access or {})
    if prefixes:
        args["access"] = prefixes
    return args


def _check_cache_options(options: dict[str, Any]) -> None:
    """``rdcc_nbytes`` and ``rdcc_nslots`` are counts, ``rdcc_w0`` a number in [0, 1]."""
    for key in ("rdcc_nbytes", "rdcc_nslots"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{key}={value!r} must be a non-negative integer")
        if value < 0:
            raise ValueError(f"{key}={value!r} must be a non-negative integer")
    w0 = options.get("rdcc_w0", 0.75)
    if (
        isinstance(w0, bool)
        or not isinstance(w0, (int, float, np.integer, np.floating))
        or not 0 <= w0 <= 1
    ):
        raise ValueError(f"rdcc_w0={w0!r} must be a number from 0 to 1")


def _parse_access(access: dict[str, Any]) -> dict[str, str]:
    """The dataset-access prefixes that are set, as strings; refuse any other type."""
    parsed = {}
    for key, value in access.items():
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
            raise TypeError(f"{key}={value!r} must be a folder path (str or os.PathLike) or None")
        text = os.fspath(value)
        if "\0" in text:
            raise ValueError(f"{key}={text!r} contains a NUL character")
        parsed[key] = text
    return parsed


def check_virtual(dataset: Any, file_path: str | None, where: str) -> None:
    """Refuse a virtual dataset one of whose source files is a FIFO, a device or a folder.

    Each source name is looked up where HDF5 looks for it: as written, then (its base name
    when absolute) under ``HDF5_VDS_PREFIX`` or the dataset's ``virtual_prefix`` (``:``
    separated, ``${ORIGIN}`` the file's folder), then in the folder of ``file_path``. Every
    existing candidate must be a regular file: HDF5 would block opening a FIFO for ever.
    Missing sources are allowed (HDF5 reads the fill value there); names with ``%`` patterns
    are not checked.
    """
    if not dataset.is_virtual:
        return
    env = os.environ.get("HDF5_VDS_PREFIX")
    prefix = env or os.fsdecode(dataset.id.get_access_plist().get_virtual_prefix())
    origin = None if file_path is None else os.path.dirname(os.path.abspath(file_path))
    folders = []
    for part in prefix.split(":") if prefix else []:
        if part.startswith(_ORIGIN):
            if origin is None:
                continue
            part = origin + part[len(_ORIGIN) :]
        folders.append(part)
    if origin is not None:
        folders.append(origin)
    names = dict.fromkeys(os.fsdecode(vs.file_name) for vs in dataset.virtual_sources())
    for name in names:
        if name == "." or "%" in name:
            continue  # the file itself, or a pattern HDF5 expands per block
        stem = os.path.basename(name) if os.path.isabs(name) else name
        for candidate in dict.fromkeys([name, *(os.path.join(f, stem) for f in folders)]):
            try:
                require_regular_file(candidate, f"source file of HDF5 virtual dataset {where}")
            except FileNotFoundError:
                continue
