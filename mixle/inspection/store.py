"""Open whatever lives at a path or URL and describe it: :func:`inspect_store`."""

from __future__ import annotations

import os
from typing import Any

from mixle.inspection.b2nd_files import inspect_b2nd, is_b2nd
from mixle.inspection.hdf5_files import inspect_hdf5
from mixle.inspection.icechunk_repos import inspect_icechunk, is_icechunk
from mixle.inspection.locations import (
    HDF5_MAGIC,
    NPY_MAGIC,
    ZARR_METADATA,
    is_remote,
    open_head,
    url_fs,
)
from mixle.inspection.n5_files import inspect_n5, is_n5
from mixle.inspection.nifti_files import inspect_nifti, is_nifti
from mixle.inspection.npy_files import inspect_npy
from mixle.inspection.npz_files import inspect_npz, is_npz
from mixle.inspection.patches import PatchLike, parse_patch
from mixle.inspection.remote import (
    child_url,
    give_up_if_late,
    redacted_warnings,
    timed_options,
    within_deadline,
)
from mixle.inspection.report import ArrayReport, GroupReport, StoreReport, UnsupportedStoreError
from mixle.inspection.tiff_files import inspect_tiff, is_tiff
from mixle.inspection.zarr_stores import inspect_zarr
from mixle.inspection.zip_stores import inspect_zarr_zip, is_zarr_zip
from mixle.utils.files import open_regular_file, require_regular_file
from mixle.utils.redact import display_path

__all__ = ["inspect_store"]


def inspect_store(
    path_or_url: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    patch: PatchLike | None = None,
) -> StoreReport:
    """Describe the arrays in a zarr store, an HDF5 file, a ``.npy`` file or another format.

    The formats: zarr folders and ``.zip`` files, icechunk repositories, N5 containers,
    HDF5 (netCDF-4 included), TIFF/OME-TIFF, NIfTI (``.nii``, ``.nii.gz``), blosc2
    ``.b2nd``, ``.npz`` and ``.npy`` files.

    Reads metadata and stored object sizes only; chunk data is never read or decoded, and
    everything is opened read-only. Warnings raised while inspecting are re-emitted with
    URLs and ``storage_options`` values masked.

    Parameters
    ----------
    path_or_url
        A local path (any of the formats above) or a URL (``file://``, ``http(s)://``,
        ``s3://``, ... through fsspec: zarr, HDF5 and ``.npy``).
    storage_options
        Passed to fsspec for URLs (credentials, endpoints); never shown in the report.
    patch
        A patch shape (one int for every axis) to cost for every array it fits: expected
        chunks touched and bytes decoded (:class:`PatchCost`). The warnings use it for their
        numbers too (else a cube of edge :data:`DEFAULT_PATCH_EDGE`).

    Returns
    -------
    StoreReport
        The tree of groups and arrays with their findings.

    Raises
    ------
    FileNotFoundError
        When nothing exists at ``path_or_url``.
    UnsupportedStoreError
        When it exists but is none of the formats above
        (:class:`NpyHeaderTooLargeError` for a ``.npy`` header over
        :data:`MAX_NPY_HEADER_BYTES`, refused before it is read).
    SpecialFileError
        When the path, or a file inside a local zarr store, is a FIFO, a device or a
        socket (found by ``stat``, before anything reads it: such a read could block or
        never end).
    MetadataLimitError
        When a zarr metadata file is larger than :data:`MAX_METADATA_BYTES` or nests
        deeper than :data:`MAX_METADATA_DEPTH`.
    InvalidMetadataError
        When a zarr metadata file is not a JSON object (``null``, a list, truncated, not
        UTF-8), naming it.
    RemoteTimeoutError
        Over a URL, when requests kept stalling past the retry policy's request timeout,
        or the whole inspection passed its deadline
        (:func:`~mixle.reading.set_retry_policy`; every file system made for the URL gets
        that timeout unless ``storage_options`` set one).
    TypeError, ValueError
        For a bad ``path_or_url``, ``storage_options`` or ``patch``.
    ImportError
        When the library the store needs (zarr, h5py, fsspec) is missing.
    """
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url={path_or_url!r} must be a path or a URL string")
    location = os.fspath(path_or_url)
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options={storage_options!r} must be a dict of fsspec options")
    edges = parse_patch(patch)
    if location.startswith("file://"):
        location = location[len("file://") :]
    if storage_options and not is_remote(location):
        raise ValueError(
            f"storage_options only apply to URLs (such as s3://bucket/x.zarr); "
            f"{display_path(location)!r} is not one"
        )
    with redacted_warnings(storage_options):
        if is_remote(location):
            kind, root = within_deadline(
                lambda: _inspect_remote(location, storage_options, edges), display_path(location)
            )
        else:
            kind = _detect(location, storage_options)
            root = _INSPECT[kind](location, storage_options, edges)
    return StoreReport(display_path(path_or_url), kind, root, edges)


#: HTTP status of a byte range past the end of an object ("416 Range Not Satisfiable").
_UNSATISFIABLE = 416
#: How each kind of store is inspected.
_INSPECT = {
    "zarr": inspect_zarr,
    "hdf5": inspect_hdf5,
    "npy": inspect_npy,
    "tiff": inspect_tiff,
    "nifti": inspect_nifti,
    "n5": inspect_n5,
    "b2nd": inspect_b2nd,
    "npz": inspect_npz,
    "zarr-zip": inspect_zarr_zip,
    "icechunk": inspect_icechunk,
}
#: What :func:`inspect_store` reads, for messages about what it does not.
_KINDS = (
    "a zarr store (a folder or a .zip), an icechunk repository, an N5 container, an HDF5 "
    "file, a TIFF, a NIfTI, a .b2nd, a .npz or a .npy file"
)


def _inspect_remote(
    location: str, storage_options: dict[str, Any] | None, edges: tuple[int, ...] | None
) -> tuple[str, GroupReport | ArrayReport]:
    """``(kind, root)`` of the store at the URL ``location``, every request timed."""
    from mixle.reading.faults import retry_call

    options = timed_options(location, storage_options)
    kind = _detect(location, options)
    inspect = _INSPECT[kind]
    shown = display_path(location)

    def walk() -> GroupReport | ArrayReport:
        give_up_if_late(shown)
        return inspect(location, options, edges)

    # a transient server failure anywhere in the metadata reads retries the whole walk
    root = retry_call(walk, url=shown, key="(metadata)", secrets=storage_options)
    return kind, root


def _detect(location: str, storage_options: dict[str, Any] | None) -> str:
    """What lives at ``location``: a key of ``_INSPECT`` (``"zarr"``, ``"hdf5"``...)."""
    shown = display_path(location)
    expected = f"is not {_KINDS}"
    if not is_remote(location):
        if not os.path.exists(location):
            raise FileNotFoundError(f"{shown!r} does not exist")
        if os.path.isdir(location):
            # lexists: metadata that is a FIFO or a link to /dev/zero is still zarr's, and
            # refused as such when the store is checked (a plain "not a store" would mislead)
            if any(os.path.lexists(os.path.join(location, m)) for m in ZARR_METADATA):
                return "zarr"
            if is_n5(location):
                return "n5"
            if is_icechunk(location):
                return "icechunk"
            raise UnsupportedStoreError(
                f"{shown!r} {expected} (a folder with no zarr.json, .zarray, .zgroup or N5 "
                "attributes.json, and not an icechunk repository)"
            )
        require_regular_file(location, "path")  # a FIFO or /dev/zero: refused, nothing read
        with open_regular_file(location, "path") as fh:
            head = fh.read(8)
        if head.startswith(NPY_MAGIC):
            return "npy"
        from mixle.utils.optional_deps import HAS_H5PY

        if head == HDF5_MAGIC or (HAS_H5PY and _is_hdf5_local(location)):
            return "hdf5"
        if is_tiff(head):
            return "tiff"
        if is_b2nd(location):
            return "b2nd"
        if is_zarr_zip(location):
            return "zarr-zip"
        if is_npz(location):
            return "npz"
        if is_nifti(location):
            return "nifti"
        raise UnsupportedStoreError(f"{shown!r} {expected}")
    # over a URL: the formats read remotely (TIFF is recognised, to say it is local only)
    expected = "is not a zarr store, an HDF5 file or a .npy file (the formats read over a URL)"
    from mixle.reading.faults import retry_call

    fs, path = url_fs(location, storage_options)

    def probe() -> bytes | None:
        # fsspec answers info() and open() with FileNotFoundError when the server fails (a
        # 503, a timeout): the whole probe is retried, so a flaky server is not reported as
        # a missing store
        give_up_if_late(shown)
        if any(_exists(fs, child_url(path, name)) for name in ("zarr.json", ".zarray", ".zgroup")):
            return None
        with open_head(fs, path) as fh:
            return bytes(fh.read(8))

    try:
        head = retry_call(probe, url=shown, key="(store type)", secrets=storage_options)
    except (FileNotFoundError, IsADirectoryError):
        raise FileNotFoundError(
            f"{shown!r} does not exist (no file there, and no zarr.json, .zarray or .zgroup "
            "below it)"
        ) from None
    if head is None:
        return "zarr"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head == HDF5_MAGIC:
        return "hdf5"
    if is_tiff(head):
        return "tiff"  # inspect_tiff says it reads local files only
    raise UnsupportedStoreError(f"{shown!r} {expected}")


def _exists(fs: Any, key: str) -> bool:
    """Whether ``key`` exists on ``fs``; a failed or timed-out request raises (to be retried).

    Asks for its first byte, one request. fsspec's own ``exists`` answers ``False`` for any
    client error, a timeout included, so a stalling server would be reported as a missing
    store.
    """
    from mixle.reading.faults import is_transient

    try:
        fs.cat_file(key, start=0, end=1)
    except FileNotFoundError as exc:
        if is_transient(exc):
            raise
        return False
    except Exception as exc:
        if getattr(exc, "status", None) == _UNSATISFIABLE:  # an empty object: it exists
            return True
        raise
    return True


def _is_hdf5_local(path: str) -> bool:
    import h5py

    return bool(h5py.is_hdf5(path))  # also finds the signature after a user block
