"""Lazy N5 datasets on local paths and fsspec URLs: mixle parses the block format itself."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource, listing
from mixle.data.sources.arrays.n5.attributes import (
    ATTRIBUTES_FILE,
    N5Metadata,
    check_version,
    find_datasets,
    is_dataset_attributes,
    parse_metadata,
    read_attributes,
)
from mixle.data.sources.arrays.n5.blocks import (
    Decompressor,
    decode_block,
    decompressor,
    stored_limit,
)
from mixle.data.sources.arrays.n5.remote import (
    RemoteN5BlockReader,
    open_remote,
    read_remote_attributes,
    url_secrets,
)
from mixle.data.sources.arrays.physical import Physical, physical_from_spacing
from mixle.data.sources.arrays.zarr.local_files import read_local_object
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import ArrayNotFoundError, NotAnArrayError
from mixle.reading import new_token
from mixle.reading.object_client import ObjectClient, check_backend, choose_client
from mixle.utils.redact import display_path

__all__ = ["N5ArraySource", "N5BlockReader", "N5Dataset", "read_n5"]


@dataclass(frozen=True)
class N5Dataset:
    """The live handle of an :class:`N5ArraySource`: the dataset's folder and metadata."""

    folder: str
    metadata: N5Metadata
    decode: Decompressor
    #: The fsspec file system of a dataset behind a URL; ``None`` on the local disk.
    fs: Any = None
    #: The obstore client of a dataset behind a URL read through obstore (``folder`` is then
    #: the dataset's key prefix under its root); ``None`` otherwise.
    client: ObjectClient | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """``dimensions``, in N5's order."""
        return self.metadata.shape

    @property
    def dtype(self) -> np.dtype:
        """The native-endian dtype of reads."""
        return self.metadata.dtype


class N5BlockReader:
    """Decoded blocks of one local N5 dataset, for the read planner (a ``ChunkReader``).

    Each read opens the block's file, reads at most :func:`stored_limit` bytes and closes
    it: no descriptor is held between reads, so the reader is safe after ``fork``. A block
    never written reads as 0, as tensorstore reads it.
    """

    def __init__(self, dataset: N5Dataset, where: str) -> None:
        meta = dataset.metadata
        self.chunks: tuple[int, ...] = meta.blocks
        self.token = new_token()
        self._dataset = dataset
        self._where = where
        self._limit = stored_limit(meta)

    def _extent(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        shape = self._dataset.metadata.shape
        return tuple(min(b, s - c * b) for c, b, s in zip(coords, self.chunks, shape))

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        dataset = self._dataset
        key = "/".join(map(str, coords)) if coords else "0"
        path = os.path.join(dataset.folder, *key.split("/"))
        what = f"block {key!r} (grid coordinates {coords}) of N5 dataset {self._where}"
        extent = self._extent(coords)
        raw = read_local_object(path, f"{what}: file", self._limit)
        if raw is None:  # never written: zeros, read-only, one element of memory
            return np.broadcast_to(np.zeros((), dtype=dataset.dtype), extent)
        return decode_block(raw, dataset.metadata, dataset.decode, extent, f"{what} ({path!r})")


class N5ArraySource(ArraySource):
    """An N5 dataset in a local folder or behind a URL, read lazily block by block.

    Axes are in the order N5 lists ``dimensions`` (fastest-varying first), as tensorstore's
    ``n5`` driver presents them: ``src.shape == tuple(dimensions)`` and ``src[i, j, k]`` is
    tensorstore's ``[i, j, k]``. Blocks are decoded by mixle (raw, gzip or zlib, bzip2, xz;
    blosc and zstd with numcodecs), each once per read through the read planner and cache.
    Nothing is ever written.

    Parameters
    ----------
    path
        The N5 container (or a dataset folder): a local path, or an fsspec URL
        (``http(s)://``, ``s3://``...; needs ``mixle[remote]``).
    dataset
        Path of the dataset inside ``path`` (``"volumes/raw"``); ``None`` when ``path`` is
        the dataset itself.
    storage_options
        Passed to fsspec for URLs (credentials, endpoints), or mapped to obstore's
        configuration (see ``backend``); never shown in reprs or errors.
    backend
        How a URL's objects are fetched: ``"auto"`` (default) through obstore
        (``mixle[obstore]``) when it is installed and can read the URL (``s3://``,
        ``gs://``, ``az://``, ``http(s)://`` without a query string, every
        ``storage_options`` entry one obstore has), else through fsspec; ``"obstore"``
        insists; ``"fsspec"`` always uses fsspec. The repr shows the one chosen; in a
        process forked after obstore ran, ``"auto"`` reads through fsspec.
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    TypeError
        When ``path`` is not a str or path, ``dataset`` not a str, or ``storage_options``
        not a dict.
    ValueError
        When ``storage_options`` is given for a local path, or ``backend`` is not
        ``"auto"``, ``"obstore"`` or ``"fsspec"`` (or not ``"auto"`` for a local path).
    ~mixle.reading.object_client.ObstoreUnsupported
        A ``ValueError``: ``backend="obstore"`` where obstore cannot read the URL.
    FileNotFoundError
        When ``path`` is not a folder (locally) or has no ``attributes.json``.
    NotAnArrayError
        When the folder is a group; the message lists the datasets below it (local only).
    ArrayNotFoundError
        When ``dataset`` does not exist; the message lists the datasets that do (local).
    InvalidMetadataError, MetadataLimitError
        When ``attributes.json`` is damaged or too large.
    UnsupportedStoreError
        When the compression is one mixle does not decode (named), or the container's
        ``"n5"`` version is newer than 4.x.
    RemoteReadError
        Over a URL, when the requests for its metadata kept failing.
    ImportError
        When numcodecs is needed (blosc, zstd) and missing: ``pip install -e ".[n5]"``.

    Notes
    -----
    A block smaller than ``blockSize`` fills the corner at its origin (the rest reads 0);
    a missing block reads 0. Damaged blocks raise :class:`~mixle.errors.CorruptChunkError`
    naming the file (or URL) and the block. ``resolution`` (a number per axis), when
    present, is reported as :attr:`spacing`. Over a URL, the blocks a batch misses in the
    cache are fetched concurrently, each request checked, capped and retried on its own.
    """

    _zero_d_chunk = True  # a 0-d dataset is one block, file "0"

    def __init__(
        self,
        path: str | os.PathLike[str],
        dataset: str | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        backend: str = "auto",
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        self._init_state(_n5_args(path, dataset, storage_options, backend), structure, schema)
        self._live()

    def __repr__(self) -> str:
        text = super().__repr__()
        args = self._args or {}
        if not _is_url(args.get("path", "")):
            return text
        handle = self._handle
        backend = args.get("backend", "auto")  # the one asked for, until it opens here
        if isinstance(handle, N5Dataset) and self._pid == os.getpid():
            backend = "fsspec" if handle.client is None else "obstore"
        where = self._location()
        return text.replace(where, f"{where}, backend={backend!r}", 1)

    def _location(self) -> str:
        args = self._args or {}
        where = repr(display_path(args.get("path", "?")))
        if args.get("dataset"):
            where += f", dataset={args['dataset']!r}"
        return where

    def _open(self) -> N5Dataset:
        args = self._args
        assert args is not None
        path, dataset = args["path"], args["dataset"]
        fs = client = None
        if _is_url(path):
            options = args["storage_options"]
            client = choose_client(path, options, args.get("backend", "auto"))
            if client is None:
                fs, root = open_remote(path, options)
            else:
                root = ""  # keys are relative to the client's root, the container
            folder, attrs = _remote_attributes(fs, root, path, dataset, options, client)
        else:
            folder, attrs = _dataset_attributes(path, dataset)
        meta = parse_metadata(attrs, self._location())
        decode = decompressor(meta.compression, self._location())
        return N5Dataset(folder, meta, decode, fs, client)

    def _describe(self, handle: N5Dataset) -> ArrayMeta:
        meta = handle.metadata
        return ArrayMeta(
            shape=meta.shape,
            dtype=meta.dtype,
            chunks=meta.blocks,
            physical=_physical(meta),
        )

    def _chunk_reader(self, handle: N5Dataset) -> N5BlockReader | RemoteN5BlockReader:
        if handle.fs is None and handle.client is None:
            return N5BlockReader(handle, self._location())
        args = self._args or {}
        url = display_path(args.get("path", ""))
        if args.get("dataset"):
            url = f"{url.rstrip('/')}/{args['dataset']}"
        return RemoteN5BlockReader(
            handle.fs,
            handle.folder,
            handle.metadata,
            handle.decode,
            self._location(),
            url,
            url_secrets(args.get("path", ""), args.get("storage_options")),
            handle.client,
        )

    def _read(self, handle: N5Dataset, key: tuple[int | slice, ...]) -> np.ndarray:
        reader = self._reader_for(handle)
        assert reader is not None
        return self._read_chunks(reader, key)


def _dataset_attributes(path: str, dataset: str | None) -> tuple[str, dict[str, Any]]:
    """``(folder, attributes)`` of ``dataset`` in the container ``path`` (``None``: itself).

    Raises
    ------
    FileNotFoundError, ArrayNotFoundError, NotAnArrayError, UnsupportedStoreError
        As :class:`N5ArraySource` says; the last two list the datasets found.
    """
    if not os.path.isdir(path):
        what = (
            "is not a folder (an N5 container is one)" if os.path.exists(path) else "no such folder"
        )
        raise FileNotFoundError(f"path={path!r}: {what}")
    folder = os.path.join(path, *dataset.split("/")) if dataset else path
    is_folder = os.path.isdir(folder)
    attrs = read_attributes(folder) if is_folder else None
    check_version(read_attributes(path) if dataset else attrs, repr(path))
    if is_dataset_attributes(attrs):
        assert attrs is not None
        return folder, attrs
    names, stopped = find_datasets(path if dataset and not is_folder else folder)
    found = listing(names, "datasets") + (" (search stopped early)" if stopped else "")
    if dataset and not is_folder:
        raise ArrayNotFoundError(
            f"dataset={dataset!r} does not exist in N5 container {path!r}; {found}"
        )
    where = f"dataset={dataset!r} in {path!r}" if dataset else f"path={path!r}"
    if attrs is None and not names and not dataset:
        raise FileNotFoundError(
            f"{where} is not an N5 dataset or group: no {ATTRIBUTES_FILE} there"
        )
    raise NotAnArrayError(
        f"{where} is an N5 group, not a dataset; pass dataset= to pick one of its {found}"
    )


def _remote_attributes(
    fs: Any,
    root: str,
    url: str,
    dataset: str | None,
    storage_options: Any,
    client: ObjectClient | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(path on fs, attributes)`` of ``dataset`` in the container at ``url``.

    With ``client`` (obstore, rooted at the container), ``root`` is ``""`` and the path a
    key prefix. Object stores and HTTP servers cannot always list folders: a group names no
    datasets.
    """
    secrets = url_secrets(url, storage_options)
    shown = display_path(url)
    folder = (f"{root}/{dataset}" if root else dataset) if dataset else root
    where = f"{shown.rstrip('/')}/{dataset}" if dataset else shown
    attrs = read_remote_attributes(fs, folder, where, secrets, client)
    top = read_remote_attributes(fs, root, shown, secrets, client) if dataset else attrs
    check_version(top, repr(shown))
    if is_dataset_attributes(attrs):
        assert attrs is not None
        return folder, attrs
    named = f"dataset={dataset!r} in {shown!r}" if dataset else f"path={shown!r}"
    if attrs is None:
        error = ArrayNotFoundError if dataset else FileNotFoundError
        raise error(f"{named}: no N5 dataset there (no {ATTRIBUTES_FILE} found)")
    raise NotAnArrayError(
        f"{named} is an N5 group, not a dataset; pass dataset= with the path of one of its "
        "datasets (datasets below a URL are not listed)"
    )


def _physical(meta: N5Metadata) -> Physical | None:
    """Spacing from ``resolution`` (one positive number per axis), else ``None``.

    ``axes`` and ``units`` (one string per axis, as tensorstore writes them) name the axes
    and the spacing's units when present; values of another form are left out.
    """
    res = meta.attributes.get("resolution")
    ndim = len(meta.shape)
    if not isinstance(res, list) or len(res) != ndim or not ndim:
        return None
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in res):
        return None
    if not all(math.isfinite(r) and r > 0 for r in res):
        return None
    return physical_from_spacing(
        [float(r) for r in res],
        axes=_strings(meta.attributes.get("axes"), ndim),
        units=_strings(meta.attributes.get("units"), ndim),
    )


def _strings(value: Any, ndim: int) -> list[str] | None:
    """``value`` if it is a list of ``ndim`` strings, else ``None``."""
    if isinstance(value, list) and len(value) == ndim and all(isinstance(v, str) for v in value):
        return value
    return None


def _is_url(path: str) -> bool:
    return "://" in path


def _n5_args(
    path: Any, dataset: Any, storage_options: Any = None, backend: Any = "auto"
) -> dict[str, Any]:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a local path or a URL of an N5 container")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"path={path!r} must be a str path, not bytes")
    if path.startswith("file://"):
        path = path[len("file://") :]
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError("storage_options must be a dict of fsspec options or None")
    if storage_options and not _is_url(path):
        raise ValueError(
            "storage_options only apply to fsspec URLs (such as s3://bucket/x.n5); "
            f"path={path!r} is not one"
        )
    check_backend(backend)
    if backend != "auto" and not _is_url(path):
        raise ValueError(
            f"backend={backend!r} only applies to URLs (such as s3://bucket/x.n5); "
            f"path={path!r} is not one: leave backend='auto'"
        )
    if dataset is not None and not isinstance(dataset, str):
        raise TypeError(f"dataset={dataset!r} must be a str (a path inside the container)")
    parts = [p for p in (dataset or "").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"dataset={dataset!r} must not contain '.' or '..' parts")
    args = {"path": path, "dataset": "/".join(parts) or None, "storage_options": storage_options}
    if backend != "auto":
        args["backend"] = backend
    return args


def read_n5(
    path: str | os.PathLike[str],
    dataset: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> N5ArraySource:
    """Open an N5 dataset lazily; see :class:`N5ArraySource` (blosc/zstd need ``mixle[n5]``).

    ``backend`` picks obstore or fsspec for URLs (default ``"auto"``: obstore where it can).
    """
    return N5ArraySource(
        path,
        dataset,
        storage_options=storage_options,
        backend=backend,
        structure=structure,
        schema=schema,
    )
