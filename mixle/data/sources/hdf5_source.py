"""Lazy HDF5 datasets through h5py, opened read-only with a chunk cache sized for patches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.base import ArrayMeta, ArraySource, listing
from mixle.data.sources.hdf5_chunks import HDF5ChunkReader, contiguous_memmap
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import ArrayNotFoundError, NotAnArrayError
from mixle.reading import read_strided
from mixle.utils.optional_deps import require

__all__ = [
    "HDF5_CHUNK_CACHE_BYTES",
    "HDF5_CHUNK_CACHE_SLOTS",
    "HDF5ArraySource",
    "list_hdf5_datasets",
]

#: Default per-dataset HDF5 chunk cache (``rdcc_nbytes``): room for the chunks a batch of
#: patches touches, where HDF5's own 1 MiB default holds at most one 64³ float32 chunk.
HDF5_CHUNK_CACHE_BYTES = 64 * 1024 * 1024
#: Default hash-table size of the chunk cache (``rdcc_nslots``), a prime well above the
#: number of chunks that fit.
HDF5_CHUNK_CACHE_SLOTS = 100_003
_MODES = ("r", "r+")


def _h5py() -> Any:
    return require("h5py", "hdf5", feature="HDF5ArraySource")


def list_hdf5_datasets(group: Any) -> list[str]:
    """Describe every dataset below an h5py group as ``"name shape dtype"`` strings."""
    h5py = _h5py()
    found: list[str] = []

    def visit(name: str, node: Any) -> None:
        if isinstance(node, h5py.Dataset):
            found.append(f"{node.name} {node.shape} {node.dtype}")

    group.visititems(visit)
    return found


class HDF5ArraySource(ArraySource):
    """An HDF5 dataset, opened read-only by default and read lazily.

    Parameters
    ----------
    path
        Path of the HDF5 file.
    dataset
        Name of the dataset inside the file (e.g. ``"volume"`` or ``"/scans/ct"``).
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.
    **h5py_options
        Passed to :class:`h5py.File`. ``mode`` may be ``"r"`` (default) or ``"r+"``; modes
        that create or truncate files are refused. The chunk cache defaults to
        ``rdcc_nbytes=HDF5_CHUNK_CACHE_BYTES`` and ``rdcc_nslots=HDF5_CHUNK_CACHE_SLOTS``.

    Raises
    ------
    ImportError
        When h5py is missing: ``pip install "mixle[hdf5]"``.
    FileNotFoundError
        When ``path`` does not exist.
    ArrayNotFoundError
        When ``dataset`` does not exist; the message lists the datasets that do.
    NotAnArrayError
        When ``dataset`` names a group; the message lists the datasets inside it.

    Notes
    -----
    HDF5 keeps one chunk cache per dataset per process, sized by whichever handle opened
    the dataset first; close other handles to the same dataset for ``rdcc_*`` to apply.
    The file stays open while anything derived from the source is alive: ``.array`` of a
    discarded source keeps working. :meth:`close` closes the file explicitly.
    """

    _h5file: Any = None
    _mapped: tuple[Any, np.memmap | None] | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        dataset: str,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
        **h5py_options: Any,
    ) -> None:
        self._init_state(_hdf5_args(path, dataset, h5py_options), structure, schema)
        self._live()

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> HDF5ArraySource:
        """Wrap an open ``h5py.Dataset``; pickling reopens its file by path, read-only.

        Closing the returned source does not close the caller's file.
        """
        file = dataset.file
        reopenable = file.driver not in ("core", "fileobj") and os.path.isfile(file.filename)
        obj = cls.__new__(cls)
        obj._init_state(
            _hdf5_args(file.filename, dataset.name, {}) if reopenable else None,
            structure,
            schema,
        )
        obj._adopt(dataset)
        return obj

    def _location(self) -> str:
        if self._args is None:
            return "<h5py dataset>"
        return f"{self._args['path']!r}, dataset={self._args['dataset']!r}"

    def _open(self) -> Any:
        h5py = _h5py()
        assert self._args is not None
        path, name, options = self._args["path"], self._args["dataset"], self._args["options"]
        if not os.path.exists(path):
            raise FileNotFoundError(f"path={path!r}: no such file")
        try:
            file = h5py.File(path, **options)
        except OSError as exc:
            raise OSError(f"path={path!r} could not be opened as an HDF5 file: {exc}") from exc
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
            node = _open_with_chunk_cache(h5py, file, name, options)
        except BaseException:
            file.close()
            raise
        self._h5file = file
        return node

    def _describe(self, handle: Any) -> ArrayMeta:
        chunks = handle.chunks
        return ArrayMeta(
            shape=tuple(handle.shape),
            dtype=handle.dtype,
            chunks=None if chunks is None else tuple(chunks),
        )

    def _chunk_reader(self, handle: Any) -> HDF5ChunkReader | None:
        return HDF5ChunkReader.for_dataset(handle)

    def _memmap_for(self, handle: Any) -> np.memmap | None:
        """A memmap of the dataset when it is contiguous and unfiltered (read-only files)."""
        state = self._mapped
        if state is None or state[0] is not handle:
            state = self._mapped = (handle, contiguous_memmap(handle))
        return state[1]

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        mapped = self._memmap_for(handle)
        if mapped is None:
            return np.asarray(handle[key])
        return np.array(mapped[key], copy=True, subok=False)

    def _read_boxes_into(
        self, handle: Any, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        mapped = self._memmap_for(handle)
        if mapped is None:
            super()._read_boxes_into(handle, starts, size, out)
        else:
            read_strided(mapped.view(np.ndarray), starts, size, out)

    def _release(self, handle: Any) -> None:
        self._mapped = None
        file, self._h5file = self._h5file, None
        if file is not None:
            file.close()


def _open_with_chunk_cache(h5py: Any, file: Any, name: str, options: dict[str, Any]) -> Any:
    """Open dataset ``name`` with this source's chunk cache.

    HDF5 keeps one chunk cache per open dataset in a process, set by whoever opens it first:
    a dataset already open elsewhere in the process keeps that opener's cache.
    """
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(
        options["rdcc_nslots"], options["rdcc_nbytes"], options.get("rdcc_w0", 0.75)
    )
    dsid = h5py.h5d.open(file.id, name.encode(), dapl=dapl)
    # readonly lets h5py cache shape/dtype lookups, as File.__getitem__ does: 3x faster reads
    return h5py.Dataset(dsid, readonly=file.mode == "r")


def _hdf5_args(path: Any, dataset: Any, options: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a path to an HDF5 file")
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
    return {"path": os.fspath(path), "dataset": dataset, "options": options}
