"""Lazy zarr arrays (format 2 and 3, sharded or not) on local paths or URLs (obstore, fsspec)."""

from __future__ import annotations

import json
import math
import os
import urllib.parse
import warnings
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource, listing
from mixle.data.sources.arrays.cf import CFAttributes, zarr_cf_attributes
from mixle.data.sources.arrays.zarr.by_path import (
    open_by_path,
    parse_version,
    release_store,
    version_text,
)
from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.data.sources.arrays.zarr.local_files import (
    bad_metadata_file,
    check_local_metadata,
    local_root,
)
from mixle.data.sources.arrays.zarr.ome import ome_physical
from mixle.data.sources.arrays.zarr.readers import zarr_chunk_reader
from mixle.data.sources.arrays.zarr.stores import client_store
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import ArrayNotFoundError, NotAnArrayError
from mixle.reading.faults import retry_call
from mixle.reading.fs_options import query_as_params, timed_storage_options
from mixle.reading.object_client import check_backend, choose_client
from mixle.utils import optional_deps
from mixle.utils.optional_deps import imported, require
from mixle.utils.redact import display_path, from_network_client, redact_text

__all__ = ["ZARR_METADATA_LIMIT", "ZarrArraySource", "check_chunk_grid", "list_zarr_arrays"]

#: Errors zarr raises parsing malformed metadata (named with the store and file by mixle).
_PARSE_ERRORS = (TypeError, ValueError, AttributeError, json.JSONDecodeError, UnicodeDecodeError)
#: The largest extent (and byte size of a chunk) NumPy's ``intp`` indexing can address.
_MAX_EXTENT = 2**63 - 1


def _zarr() -> Any:
    return require("zarr", "zarr", feature="ZarrArraySource")


def list_zarr_arrays(group: Any, prefix: str = "") -> list[str]:
    """Describe every array below a zarr group as ``"component shape dtype"`` strings.

    ``prefix`` is the group's own component, so the names can be passed as ``component=``.
    """
    zarr = _zarr()
    prefix = f"{prefix.strip('/')}/" if prefix and prefix.strip("/") else ""
    return [
        f"{prefix}{name} {node.shape} {node.dtype}"
        for name, node in group.members(max_depth=None)
        if isinstance(node, zarr.Array)
    ]


def _arrays_text(group: Any, prefix: str = "") -> str:
    """``listing`` of the arrays below ``group``, or why they cannot be listed."""
    failed = None
    try:
        names = list_zarr_arrays(group, prefix)
    except Exception as exc:  # a store without listing: plain HTTP, no ListBucket
        if not (from_network_client(exc) or isinstance(exc, (OSError, NotImplementedError))):
            raise
        failed = type(exc).__name__
    if failed is not None:  # told out here: the store's error (its request) is not chained
        return f"its arrays cannot be listed over this store ({failed})"
    return listing(names, "arrays")


class ZarrArraySource(ArraySource):
    """A zarr array (format 2 or 3, sharded or not), opened read-only and read lazily.

    Parameters
    ----------
    path
        A local path, an fsspec URL (``memory://``, ``file://``, ``http://``, ``s3://``...),
        a zarr store object (``LocalStore``, ``MemoryStore``, tifffile's ``aszarr=True``
        store...) or an open ``zarr.Array`` (as :meth:`from_array`). A local ``.zip`` file
        holding a zarr store is opened read-only (zarr's ``ZipStore``, ``mode="r"``); a
        local icechunk repository folder through a read-only session (``mixle[icechunk]``).
    component
        Path of the array inside the store when ``path`` is a group.
    storage_options
        Passed to fsspec for URLs (credentials, endpoints), or mapped to obstore's
        configuration when obstore reads. Never shown in reprs or errors.
    backend
        How a URL is read: ``"auto"`` (default) through obstore
        (:mod:`mixle.reading.object_client`, ``mixle[obstore]``) when it is installed and
        usable here, the scheme is ``s3://``, ``gs://``, ``az://`` or ``http(s)://``, the URL
        has no query string and every ``storage_options`` entry maps to obstore, else
        through fsspec; ``"obstore"`` insists (an error says why it cannot); ``"fsspec"``
        keeps fsspec. The repr shows the one reading. Kept when pickled; a source reopened
        in a process forked after obstore ran reads through fsspec under ``"auto"`` and
        raises under ``"obstore"``.
    branch, tag, snapshot
        The version of an icechunk repository to read (at most one; default: the head of
        branch ``"main"``). The snapshot a source first opens is pinned: reopening it,
        after ``fork`` or unpickled, reads that same snapshot even if the branch moved on.
        icechunk does not survive ``fork`` once it ran: a forked child raises
        ``RuntimeError`` instead of hanging; start workers with ``"spawn"`` (the Loader's
        default) or ``"forkserver"``.
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.
    mask_and_scale
        ``True``: decode CF packing as xarray does (``scale_factor``, ``add_offset``,
        ``_FillValue``/``missing_value`` as NaN, ``_Unsigned``; format 2: the array's
        ``fill_value`` is the ``_FillValue``), chunk by chunk, and report the decoded dtype.
        ``False`` (default): the stored values; a packed array warns once
        (:class:`~mixle.data.sources.arrays.cf.PackedVariableWarning`). Times stay numbers.

    Raises
    ------
    TypeError, ValueError
        When an argument has the wrong type, ``storage_options`` is given for a path that
        is not a URL, or ``backend`` is not one of ``"auto"``, ``"obstore"``, ``"fsspec"``
        (always at construction).
    ObstoreUnsupported
        With ``backend="obstore"``, when obstore cannot read ``path`` (a local path, a
        ``file://`` or ``memory://`` URL, a query string, a ``storage_options`` entry it
        has no equivalent for, a process forked after obstore ran): a ``ValueError``.
    ValueError
        With ``mask_and_scale=True``, when a CF attribute cannot be decoded (a
        ``scale_factor``/``add_offset`` that is not one real number, fill values that are
        not numbers, CF attributes on a non-numeric dtype), naming the attribute, at open.
    ImportError
        At first use (``shape``, ``len``, a read, ``element_spec``...) when zarr is not
        installed here: ``pip install -e ".[zarr]"``. Construction itself succeeds without
        I/O, so a process without zarr can build a source and pickle it to workers that
        have it.
    FileNotFoundError
        When nothing exists at ``path``.
    NotAnArrayError
        When ``path``/``component`` is a group; the message lists the arrays inside it.
    UnsupportedStoreError
        When ``path`` is a zip file with no zarr store in it (the message lists members), an
        N5 container or an HDF5, TIFF, NIfTI or ``.npy`` file (it names the reader to use).
    ArrayNotFoundError
        When ``component`` does not exist; the message lists the arrays that do.

    Notes
    -----
    The last three are raised at construction when zarr is installed (the metadata is
    read eagerly), at first use when it is not (the repr then says so).
    """

    _library = "zarr"  # the module it needs (repr says when it is missing)

    _zero_d_chunk = True  # a 0-d zarr array is one stored chunk, read like any other

    def __init__(
        self,
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
    ) -> None:
        version = parse_version(branch, tag, snapshot)
        check_backend(backend)
        zarr = imported("zarr")  # a zarr.Array can only exist once zarr is imported
        if zarr is not None and isinstance(path, zarr.Array):
            given = storage_options is not None or version is not None or backend != "auto"
            if component is not None or given:
                raise ValueError(
                    f"path={display_path(path.store)!r} is an open zarr.Array: component=, "
                    "storage_options=, branch=, tag=, snapshot= and backend= only apply to "
                    "paths and URLs; pass the array alone"
                )
            self._init_state(_zarr_args(path.store, path.path or None, None), structure, schema)
            self._want_cf(mask_and_scale)
            self._adopt(path)
            return
        args = _zarr_args(path, component, storage_options)
        if version is not None:
            args["version"] = version
        if backend != "auto":
            args["backend"] = backend
        self._init_state(args, structure, schema)
        self._want_cf(mask_and_scale)
        if optional_deps.HAS_ZARR:  # else checked at first use, where zarr is installed
            self._live()

    @classmethod
    def from_array(
        cls,
        array: Any,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
        mask_and_scale: bool = False,
    ) -> ZarrArraySource:
        """Wrap an open ``zarr.Array``; pickling reopens it from its store, read-only."""
        return cls(array, structure=structure, schema=schema, mask_and_scale=mask_and_scale)

    def _location(self) -> str:
        args = self._args or {}
        where = repr(display_path(args.get("path", "?")))
        if args.get("component"):
            where += f", component={args['component']!r}"
        if args.get("version"):
            where += f", {version_text(args['version'])}"
        return where

    def __repr__(self) -> str:
        text = super().__repr__()
        backend = self._backend_shown()
        if backend is None:
            return text
        where = self._location()
        return text.replace(where, f"{where}, backend={backend!r}", 1)

    def _backend_shown(self) -> str | None:
        """The backend reading this URL (the one asked for until it opens); else ``None``."""
        args = self._args or {}
        path = args.get("path")
        if not (isinstance(path, str) and "://" in path):
            return None
        used = getattr(self, "_backend_used", None)
        if used is not None and self._meta is not None and self._pid == os.getpid():
            return str(used)
        return str(args.get("backend", "auto"))

    def _open(self) -> Any:
        zarr = _zarr()
        assert self._args is not None
        path, component = self._args["path"], self._args["component"]
        by_path = open_by_path(path, component, self._args.get("version"))
        if by_path is not None and by_path.version is not None:  # reopen the same snapshot
            self._args = {**self._args, "version": by_path.version}
        kwargs: dict[str, Any] = {"mode": "r"}
        secrets = _secrets(self._args)
        client = None
        backend = self._args.get("backend", "auto")
        if by_path is None or backend == "obstore":  # a zip or icechunk path: not obstore's
            client = choose_client(path, secrets[0], backend)
        if client is not None:  # every read, metadata too, through obstore
            store: Any = client_store(client)
        else:
            path, options = query_as_params(path, timed_storage_options(path, secrets[0]))
            store = path if by_path is None else by_path.store
            if options:
                kwargs["storage_options"] = options
        remote = isinstance(path, str) and "://" in path
        self._backend_used = "obstore" if client is not None else "fsspec" if remote else None
        if isinstance(path, str) and "://" not in path and not os.path.exists(path):
            raise FileNotFoundError(f"path={display_path(path)!r}: no such file or directory")
        local = local_root(path)
        if local is not None:
            check_local_metadata(local, component or "")
        try:
            node = retry_call(
                lambda: _open_redacted(zarr, store, component or "", kwargs, secrets),
                url=display_path(path),
                key="(metadata)",
                secrets=secrets,
            )
        except FileNotFoundError as exc:
            if component:
                try:
                    root = zarr.open_group(store=store, **kwargs)
                except FileNotFoundError:
                    pass
                else:
                    raise ArrayNotFoundError(
                        f"component={component!r} does not exist in zarr store "
                        f"{display_path(path)!r}; {_arrays_text(root)}"
                    ) from None
            raise FileNotFoundError(
                f"path={display_path(path)!r}: no zarr array or group found there"
                f" ({type(exc).__name__})"
            ) from None
        except RecursionError:
            raise ValueError(
                f"path={display_path(path)!r}: the zarr metadata is nested too deeply to "
                "parse (a JSON file of that depth is not zarr metadata)"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            if type(exc) not in _PARSE_ERRORS:
                raise  # zarr's own errors (a missing group...) and mixle's say enough
            # zarr's parse of malformed metadata: say which store (and file) it was
            bad = None if local is None else bad_metadata_file(local, component or "")
            kind = type(exc) if type(exc) is TypeError and bad is None else ValueError
            raise kind(
                f"path={display_path(path)!r}"
                + (f", component={component!r}" if component else "")
                + (f": zarr metadata file {bad!r} is not valid zarr metadata" if bad else "")
                + ": zarr cannot parse the array metadata: "
                + redact_text(f"{type(exc).__name__}: {exc}", secrets)
            ) from None
        if not isinstance(node, zarr.Array):
            where = f"component={component!r} in " if component else "path="
            arrays = _arrays_text(node, component or "")
            raise NotAnArrayError(
                f"{where}{display_path(path)!r} is a zarr group, not an array; pass "
                f"component= to pick one of its {arrays}"
            )
        return node

    def _release(self, handle: Any) -> None:
        if handle.store is not (self._args or {}).get("path"):
            release_store(handle.store)  # a zip file mixle opened: its descriptor

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        # the same chunk reader and plan executor as read_boxes, for every store and layout
        reader = self._reader_for(handle)
        assert reader is not None  # zarr_chunk_reader has a reader for every layout
        return self._read_chunks(reader, key)

    def _chunk_reader(self, handle: Any) -> Any:
        args = self._args or {}
        url = display_path(args.get("path", "")) if isinstance(args.get("path"), str) else ""
        if url and args.get("component"):
            url = f"{url.rstrip('/')}/{args['component']}"
        return zarr_chunk_reader(handle, self._location(), url, secrets=_secrets(args))

    def _cf_attributes(self, handle: Any) -> CFAttributes:
        return zarr_cf_attributes(handle)

    def _describe(self, handle: Any) -> ArrayMeta:
        shards = getattr(handle, "shards", None)
        shape, chunks = tuple(handle.shape), tuple(handle.chunks)
        check_chunk_grid(shape, chunks, np.dtype(handle.dtype).itemsize, self._location())
        if shards is not None:
            check_chunk_grid(shape, tuple(shards), 0, self._location(), "shards")
            if any(s % c for s, c in zip(shards, chunks)):
                raise ValueError(
                    f"zarr array {self._location()}: shards={tuple(shards)} are not a whole "
                    f"number of chunks={chunks} on every axis (damaged metadata)"
                )
        return ArrayMeta(
            shape=shape,
            dtype=handle.dtype,
            chunks=chunks,
            shards=None if shards is None else tuple(shards),
            physical=ome_physical(handle, self._location()),
        )


def check_chunk_grid(
    shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, where: str, name: str = "chunks"
) -> None:
    """Refuse metadata whose chunk grid cannot be read: clear ``ValueError``, early.

    Parameters
    ----------
    shape, chunks
        The array's shape and chunk (or shard) shape from its metadata.
    itemsize
        Bytes per element (``0``: do not check the bytes of one chunk).
    where
        How the message names the array.
    name
        What ``chunks`` is called in the message (``"chunks"``, ``"shards"``).

    Raises
    ------
    ValueError
        When an extent is not an int, is negative (``shape``) or below 1 (``chunks``),
        when an extent or one chunk's bytes pass ``2**63 - 1`` (NumPy cannot index it), or
        when ``chunks`` has not one entry per axis.
    """
    if len(chunks) != len(shape):
        raise ValueError(
            f"zarr array {where}: {name}={chunks} has {len(chunks)} axes but shape={shape} "
            f"has {len(shape)} (damaged metadata)"
        )
    for label, values, low in (("shape", shape, 0), (name, chunks, 1)):
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"zarr array {where}: {label}={values} must hold ints")
            if not low <= int(v) <= _MAX_EXTENT:
                raise ValueError(
                    f"zarr array {where}: {label}={values} must hold ints from {low} to "
                    f"2**63 - 1 (damaged metadata?)"
                )
    if itemsize and math.prod(chunks) * itemsize > _MAX_EXTENT:
        raise ValueError(
            f"zarr array {where}: one chunk of {name}={chunks} would hold "
            f"{math.prod(chunks) * itemsize:,} bytes, more than NumPy can address"
        )


def _secrets(args: dict[str, Any]) -> list[Any]:
    """What error messages mask: ``storage_options`` (first), a URL's query and its values."""
    path = args.get("path")
    query = urllib.parse.urlsplit(path).query if isinstance(path, str) else ""
    values = [v for _, v in urllib.parse.parse_qsl(query, keep_blank_values=True)]
    return [args.get("storage_options"), *([query] if query else []), *values]


def _open_redacted(
    zarr: Any, path: Any, component: str, kwargs: dict[str, Any], secrets: Any
) -> Any:
    """``zarr.open``, its warnings re-emitted without credentials (they carry the store URL)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return zarr.open(store=path, path=component, **kwargs)
    finally:  # outside catch_warnings: under the caller's filters, not recorded again
        for w in caught:
            message = redact_text(str(w.message), secrets)
            warnings.warn_explicit(message, w.category, w.filename, w.lineno)


def _zarr_args(path: Any, component: str | None, storage_options: Any) -> dict[str, Any]:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if path is None or isinstance(path, (bytes, int, float)):
        raise TypeError(f"path={path!r} must be a local path, an fsspec URL or a zarr store")
    if component is not None and not isinstance(component, str):
        raise TypeError(f"component={component!r} must be a str (a path inside the store)")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError("storage_options must be a dict of fsspec options or None")
    if storage_options and not (isinstance(path, str) and "://" in path):
        raise ValueError(
            "storage_options only apply to fsspec URLs (such as s3://bucket/x.zarr); "
            f"path={display_path(path)!r} is not one"
        )
    component = component.strip("/") if component else None
    return {"path": path, "component": component, "storage_options": storage_options}
