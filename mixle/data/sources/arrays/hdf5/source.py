"""Lazy HDF5 datasets through h5py, opened read-only with a chunk cache sized for patches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.cf import CFAttributes, hdf5_cf_attributes
from mixle.data.sources.arrays.hdf5.access import (
    HDF5_CHUNK_CACHE_BYTES,
    HDF5_CHUNK_CACHE_SLOTS,
    check_external,
    check_virtual,
    hdf5_args,
    is_url,
)
from mixle.data.sources.arrays.hdf5.chunks import (
    HDF5ChunkReader,
    contiguous_memmap,
    require_filters,
)
from mixle.data.sources.arrays.hdf5.opening import (
    h5py_module,
    is_file_like,
    open_dataset,
    open_remote_dataset,
)
from mixle.data.sources.arrays.hdf5.plugin_sizes import PluginSizeCheck
from mixle.data.sources.arrays.hdf5.remote import RemoteFile, RemoteHDF5ChunkReader
from mixle.data.sources.arrays.memmap.check import check_mapped_file
from mixle.data.sources.key_plan import plan_key, read_extent
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.reading import read_strided
from mixle.utils import optional_deps
from mixle.utils.files import require_regular_file
from mixle.utils.redact import display_path

__all__ = [
    "HDF5_CHUNK_CACHE_BYTES",
    "HDF5_CHUNK_CACHE_SLOTS",
    "HDF5ArraySource",
]


class HDF5ArraySource(ArraySource):
    """An HDF5 dataset, opened read-only by default and read lazily.

    Parameters
    ----------
    path
        Path of the HDF5 file, an fsspec URL (``https://``, ``s3://``...) or an open binary
        file-like object (read through h5py; such a source cannot be pickled).
    dataset
        Name of the dataset inside the file (e.g. ``"volume"`` or ``"/scans/ct"``).
    storage_options
        Passed to fsspec for URLs (credentials, endpoints), or mapped to obstore's
        configuration (see ``backend``). Never shown in reprs or errors.
    backend
        How a URL's bytes are fetched: ``"auto"`` (default) through obstore (Rust
        ``object_store``, ``mixle[obstore]``) when it is installed and can read the URL
        (``s3://``, ``gs://``, ``az://``, ``http(s)://`` without a query string, every
        ``storage_options`` entry one obstore has), else through fsspec; ``"obstore"``
        insists (an error says why it cannot); ``"fsspec"`` always uses fsspec. The repr
        shows the one chosen. Metadata h5py reads goes through the same block cache either
        way; in a process forked after obstore ran (its runtime does not survive ``fork``)
        ``"auto"`` reads through fsspec.
    efile_prefix
        The folder where relative names of external raw-data files (datasets made with
        h5py's ``external=``) are looked up; ``"${ORIGIN}"`` (optionally followed by
        ``/sub/folder``) means the HDF5 file's own folder. Default: HDF5's, the current
        directory (or the ``HDF5_EXTFILE_PREFIX`` environment variable, which wins).
    virtual_prefix
        The same for the source files of virtual datasets (``HDF5_VDS_PREFIX`` wins).
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.
    mask_and_scale
        ``True``: decode CF packing (netCDF-4 files and others) as xarray does:
        ``scale_factor``, ``add_offset``, ``_FillValue``/``missing_value`` as NaN and
        ``_Unsigned`` from the dataset's attributes (HDF5's own fill value is not CF's), on
        every read path, and report the decoded dtype. ``False`` (default): the stored
        values; a packed dataset warns once
        (:class:`~mixle.data.sources.arrays.cf.PackedVariableWarning`). Times stay numbers.
    **h5py_options
        Passed to :class:`h5py.File`. ``mode`` may be ``"r"`` (default) or ``"r+"``; modes
        that create or truncate files are refused. The chunk cache defaults to
        ``rdcc_nbytes=HDF5_CHUNK_CACHE_BYTES`` and ``rdcc_nslots=HDF5_CHUNK_CACHE_SLOTS``.

    Raises
    ------
    TypeError, ValueError
        When an argument has the wrong type, ``mode`` could create or truncate the file, or
        ``storage_options`` is given for a path that is not a URL (always at construction).
    ValueError
        When ``backend`` is not ``"auto"``, ``"obstore"`` or ``"fsspec"``, or is not
        ``"auto"`` for a path that is not a URL (at construction).
    ~mixle.reading.object_client.ObstoreUnsupported
        A ``ValueError``: ``backend="obstore"`` where obstore cannot read the URL (not
        installed, a scheme or ``storage_options`` entry it lacks, a forked process), when
        the file is opened.
    ValueError
        With ``mask_and_scale=True``, when a CF attribute cannot be decoded (a
        ``scale_factor``/``add_offset`` that is not one real number, fill values that are
        not numbers, CF attributes on a non-numeric dtype), naming the attribute, at open.
    ImportError
        At first use (``shape``, ``len``, a read, ``element_spec``...) when h5py is not
        installed here: ``pip install -e ".[hdf5]"``. Construction from a path or URL
        succeeds without I/O, so a process without h5py can build a source and pickle it
        to workers that have it (a file-like ``path`` is opened at construction).
    FileNotFoundError
        When ``path`` does not exist.
    ArrayNotFoundError
        When ``dataset`` does not exist; the message lists the datasets that do.
    NotAnArrayError
        When ``dataset`` names a group; the message lists the datasets inside it.
    SpecialFileError
        When ``path``, an external raw-data file or a source file of a virtual dataset is a
        FIFO, a device or a directory.
    ~mixle.reading.CorruptChunkError
        On a read (``src[key]``, ``read_boxes``, ``get_batch`` alike), when a chunk's stored
        bytes do not decode to exactly one chunk: a deflate stream longer or shorter than
        the chunk, or zstd, blosc or lz4 data stating another decoded size (checked before
        HDF5's plugin would allocate it).
    FileNotFoundError
        When an external raw-data file of the dataset is missing: the message names each
        one and the ``efile_prefix`` that would find them.
    ~mixle.FilterUnavailableError
        An ``ImportError``: the dataset uses a filter HDF5 cannot load (such as blosc or
        zstd) and ``hdf5plugin`` is not installed, or does not provide it. Where it is
        installed, ``hdf5plugin`` is imported to register its filters before this check.

    Notes
    -----
    ``FileNotFoundError``, ``ArrayNotFoundError`` and ``NotAnArrayError`` are raised at
    construction when h5py is installed (the metadata is read eagerly), at first use when it
    is not (the repr then says so).

    HDF5 keeps one chunk cache per dataset per process, sized by whichever handle opened
    the dataset first; close other handles to the same dataset for ``rdcc_*`` to apply.
    The file stays open while anything derived from the source is alive: ``.array`` of a
    discarded source keeps working. :meth:`close` closes the file explicitly.
    """

    _library = "h5py"  # the module it needs (repr says when it is missing)

    _h5file: Any = None
    _remote: RemoteFile | None = None
    _mapped: tuple[Any, np.memmap | None] | None = None
    _stat: tuple[int, int] | None = None
    _sized: tuple[Any, PluginSizeCheck | None] | None = None

    def __init__(
        self,
        path: str | os.PathLike[str] | Any,
        dataset: str,
        *,
        storage_options: dict[str, Any] | None = None,
        backend: str = "auto",
        efile_prefix: str | os.PathLike[str] | None = None,
        virtual_prefix: str | os.PathLike[str] | None = None,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
        mask_and_scale: bool = False,
        **h5py_options: Any,
    ) -> None:
        access = {"efile_prefix": efile_prefix, "virtual_prefix": virtual_prefix}
        if is_file_like(path):
            self._init_state(None, structure, schema)
            self._want_cf(mask_and_scale)
            self._file_like = (path, hdf5_args("<file-like>", dataset, h5py_options, None, access))
            self._adopt(self._open_file_like())
            return
        args = hdf5_args(path, dataset, h5py_options, storage_options, access, backend)
        self._init_state(args, structure, schema)
        self._want_cf(mask_and_scale)
        if optional_deps.HAS_H5PY:  # else checked at first use, where h5py is installed
            self._live()

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
        mask_and_scale: bool = False,
    ) -> HDF5ArraySource:
        """Wrap an open ``h5py.Dataset``; pickling reopens its file by path, read-only.

        Closing the returned source does not close the caller's file. ``mask_and_scale`` as
        for the constructor.
        """
        file = dataset.file
        reopenable = file.driver not in ("core", "fileobj") and os.path.isfile(file.filename)
        obj = cls.__new__(cls)
        obj._init_state(
            hdf5_args(file.filename, dataset.name, {}) if reopenable else None,
            structure,
            schema,
        )
        obj._want_cf(mask_and_scale)
        where = f"{dataset.name!r} in {display_path(file.filename)!r}"
        require_filters(dataset, where)
        check_external(dataset, file.filename if reopenable else None, where)
        check_virtual(dataset, file.filename if reopenable else None, where)
        obj._adopt(dataset)
        return obj

    def _location(self) -> str:
        if self._args is None:
            file_like = getattr(self, "_file_like", None)
            if file_like is not None:
                kind, name = type(file_like[0]).__name__, file_like[1]["dataset"]
                return f"<file-like {kind}>, dataset={name!r}"
            return "<h5py dataset>"
        return f"{display_path(self._args['path'])!r}, dataset={self._args['dataset']!r}"

    def _open_file_like(self) -> Any:
        fileobj, args = self._file_like
        return self._open_in(fileobj, "<file-like>", args)

    def _open(self) -> Any:
        assert self._args is not None
        h5py_module()  # a missing h5py is the first thing to say, before any file check
        args = self._args
        path = args["path"]
        if is_url(path):
            return self._open_remote(path, args)
        try:  # a FIFO would block h5py's open for ever, a device never ends
            require_regular_file(path, "HDF5 file")
        except FileNotFoundError:
            raise FileNotFoundError(f"path={path!r}: no such file") from None
        handle = self._open_in(path, path, args)
        st = os.stat(path)
        self._stat = (st.st_dev, st.st_ino)
        return handle

    def _open_remote(self, url: str, args: dict[str, Any]) -> Any:
        """Open the dataset of the HDF5 file at ``url``; no error carries a secret."""
        self._remote, self._h5file, node = open_remote_dataset(url, args)
        return node

    def _open_in(self, target: Any, path: str, args: dict[str, Any]) -> Any:
        """Open the dataset of ``args`` in the HDF5 file ``target`` (a path or a file object)."""
        self._h5file, node = open_dataset(target, path, args)
        return node

    def _describe(self, handle: Any) -> ArrayMeta:
        chunks = handle.chunks
        return ArrayMeta(
            shape=tuple(handle.shape),
            dtype=handle.dtype,
            chunks=None if chunks is None else tuple(chunks),
        )

    def _cf_attributes(self, handle: Any) -> CFAttributes:
        return hdf5_cf_attributes(handle)

    def _chunk_reader(self, handle: Any) -> HDF5ChunkReader | None:
        remote = self._remote
        if remote is not None and self._args is not None:
            url = display_path(self._args["path"])
            return RemoteHDF5ChunkReader.for_remote(
                handle,
                remote.fs,
                remote.path if remote.client is None else remote.key,
                self._location(),
                url,
                self._args.get("storage_options"),
                client=remote.file.reads,  # the client, or the disk cache over it
                size=remote.file.size,
            )
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
            # chunks mixle decodes go through the read planner, as read_boxes does: one
            # bounded, checked decode per chunk, the same answer on every path
            reader = self._reader_for(handle)
            if reader is not None:
                return self._read_chunks(reader, key)
            self._check_plugin_sizes(handle, key)
            return self._decoded(np.asarray(handle[key]))
        self._check_file(mapped)
        return self._decoded(np.array(mapped[key], copy=True, subok=False))

    def _check_plugin_sizes(self, handle: Any, key: tuple[int | slice, ...]) -> None:
        """Refuse chunks of ``key`` whose zstd/blosc/lz4 data would decode past the chunk."""
        state = self._sized
        if state is None or state[0] is not handle:
            path = "<file-like>" if self._args is None else display_path(self._args["path"])
            where = f"{handle.name!r} in {path!r}"
            state = self._sized = (handle, PluginSizeCheck.for_dataset(handle, where))
        whole = tuple(slice(0, n) for n in handle.shape[len(key) :])  # get_batch: axis 0 only
        read = tuple(  # read_boxes passes slices without a step
            slice(k.start, k.stop, k.step or 1) if isinstance(k, slice) else k
            for k in (*key, *whole)
        )
        if state[1] is not None and all(read_extent(read)):
            state[1].check(plan_key(read, handle.chunks).chunks)

    def _check_file(self, mapped: np.memmap) -> None:
        """Refuse to touch the map if the file was cut short or replaced since opening."""
        assert self._args is not None
        check_mapped_file(self._args["path"], mapped.offset + mapped.nbytes, self._stat)

    def _read_boxes_into(
        self, handle: Any, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        mapped = self._memmap_for(handle)
        if mapped is None:
            super()._read_boxes_into(handle, starts, size, out)
        else:
            self._check_file(mapped)
            cf = None if self._meta is None else self._meta.cf
            if cf is None:
                read_strided(mapped.view(np.ndarray), starts, size, out)
                return
            raw = np.empty(out.shape, dtype=mapped.dtype)  # stored values, decoded at once
            read_strided(mapped.view(np.ndarray), starts, size, raw)
            out[...] = cf.decode(raw)

    def _release(self, handle: Any) -> None:
        self._mapped = self._sized = None
        file, self._h5file = self._h5file, None
        if file is not None:
            file.close()
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.close()

    def __repr__(self) -> str:
        text = super().__repr__()
        args = self._args
        if args is None or not is_url(args["path"]):
            return text
        remote = self._remote  # the choice made at open here; before it, the one asked for
        backend = args.get("backend", "auto")
        if remote is not None and self._pid == os.getpid():
            backend = remote.backend
        location = self._location()
        return text.replace(location, f"{location}, backend={backend!r}", 1)
