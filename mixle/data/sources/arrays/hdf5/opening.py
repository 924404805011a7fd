"""Opening an HDF5 file read-only and finding its dataset, with errors that help.

A missing dataset lists the datasets in the file, a group lists those inside it, refused
``h5py.File`` options are named, and a remote file's errors are redacted (no password,
token or request header in the message or its chain).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.arrays.hdf5.access import (
    ACCESS,
    check_external,
    check_virtual,
    open_with_access,
)
from mixle.data.sources.arrays.hdf5.chunks import require_filters
from mixle.data.sources.arrays.hdf5.remote import (
    RemoteFile,
    choose_file_client,
    open_remote_object,
)
from mixle.errors import ArrayNotFoundError, NotAnArrayError
from mixle.reading.faults import RemoteReadError, retry_call
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path, redact_text

__all__ = [
    "h5py_module",
    "is_file_like",
    "list_hdf5_datasets",
    "open_dataset",
    "open_remote_dataset",
]


def h5py_module() -> Any:
    """h5py, imported on first use (an ``ImportError`` naming the ``hdf5`` extra)."""
    return require("h5py", "hdf5", feature="HDF5ArraySource")


def list_hdf5_datasets(group: Any) -> list[str]:
    """Describe every dataset below an h5py group as ``"name shape dtype"`` strings."""
    h5py = h5py_module()
    found: list[str] = []

    def visit(name: str, node: Any) -> None:
        if isinstance(node, h5py.Dataset):
            found.append(f"{node.name} {node.shape} {node.dtype}")

    group.visititems(visit)
    return found


def open_dataset(target: Any, path: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """Open the dataset of ``args`` in the HDF5 file ``target`` (a path or a file object).

    Returns the open ``h5py.File`` and the dataset; the file is closed again on any error.
    """
    h5py = h5py_module()
    name, options = args["dataset"], args["options"]
    try:
        file = h5py.File(target, **options)
    except RemoteReadError:
        raise  # the bytes could not be fetched: nothing is known of the file's format
    except OSError as exc:
        raise OSError(f"path={path!r} could not be opened as an HDF5 file: {exc}") from exc
    except TypeError as exc:
        raise TypeError(
            f"path={path!r}: h5py.File refused the options {_refused(h5py, options)} "
            f"({exc}); "
            f"dataset options are {', '.join(ACCESS)}, rdcc_nbytes, rdcc_nslots, rdcc_w0"
        ) from None
    try:
        kind = file.get(name, getclass=True)
        if kind is None:
            raise ArrayNotFoundError(
                f"dataset={name!r} does not exist in {path!r}; "
                f"{listing(list_hdf5_datasets(file), 'datasets')}"
            )
        if kind is not h5py.Dataset:
            inside = list_hdf5_datasets(file[name]) if kind is h5py.Group else []
            raise NotAnArrayError(
                f"dataset={name!r} in {path!r} is a group, not a dataset; pass one of "
                f"its {listing(inside, 'datasets')}"
            )
        node = open_with_access(h5py, file, name, options, args.get("access", {}))
        where = f"{name!r} in {path!r}"
        require_filters(node, where)
        local = file.filename if isinstance(target, str) else None
        check_external(node, local, where)
        check_virtual(node, local, where)
    except BaseException:
        file.close()
        raise
    return file, node


def open_remote_dataset(url: str, args: dict[str, Any]) -> tuple[RemoteFile, Any, Any]:
    """Open the dataset of the HDF5 file at ``url``; no error carries a secret.

    Returns ``(remote, file, dataset)``: the :class:`RemoteFile` (obstore or fsspec, by
    ``args["backend"]``, see :func:`choose_file_client`), the open ``h5py.File`` and the
    dataset.

    fsspec's, aiohttp's and obstore's errors hold the URL (password, ``?token=``) and the
    request headers: what is raised is redacted (:func:`_scrubbed`) and raised outside the
    ``except`` block, so that neither ``__cause__`` nor ``__context__`` keeps them.

    Raises
    ------
    ObstoreUnsupported
        ``backend="obstore"`` where obstore cannot read ``url`` (before any request).
    """
    secrets = args.get("storage_options")
    shown = display_path(url)
    chosen = choose_file_client(url, secrets, args.get("backend", "auto"))

    reached = [False]  # whether the object was found (its size known)

    def attempt() -> tuple[RemoteFile, Any, Any]:
        # h5py reads the superblock and object headers through the remote file while
        # opening: a transient failure there retries the whole open, file included
        reached[0] = False
        remote = open_remote_object(url, secrets, chosen)
        reached[0] = True
        try:
            file, node = open_dataset(remote.file, shown, args)
        except BaseException:
            remote.close()
            raise
        return remote, file, node

    failure: BaseException
    try:
        return retry_call(attempt, url=shown, key="(file)", secrets=secrets)
    except Exception as exc:
        if isinstance(exc, FileNotFoundError) and not reached[0]:  # not an external file's
            exc = FileNotFoundError(f"path={shown!r}: no such file")
        failure = _scrubbed(exc, secrets)
    raise failure  # out of the except block: nothing is chained to it


def _refused(h5py: Any, options: dict[str, Any]) -> list[str]:
    """The keys of ``options`` that are not named parameters of ``h5py.File``.

    h5py passes unknown keywords on to the file driver, so when every key is a named
    parameter the refusal came from a value: then every key is listed.
    """
    named = inspect.signature(h5py.File.__init__).parameters
    unknown = sorted(k for k in options if k not in named)
    return unknown or sorted(options)


def _scrubbed(exc: Exception, secrets: object) -> Exception:
    """``exc`` with its text redacted and its chain dropped, safe to raise.

    An error of a third-party library (fsspec, aiohttp...) becomes an ``OSError`` carrying
    its redacted text: such errors keep the request, headers included, in attributes.
    """
    if type(exc).__module__.split(".")[0] not in ("builtins", "mixle"):
        exc = OSError(redact_text(f"{type(exc).__name__}: {exc}", secrets))
    else:
        exc.args = tuple(redact_text(a, secrets) if isinstance(a, str) else a for a in exc.args)
        if isinstance(exc, OSError) and isinstance(exc.filename, str):
            exc.filename = redact_text(exc.filename, secrets)
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def is_file_like(path: object) -> bool:
    return not isinstance(path, (str, os.PathLike)) and all(
        callable(getattr(path, name, None)) for name in ("read", "seek", "tell")
    )
