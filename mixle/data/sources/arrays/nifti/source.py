"""NIfTI-1 and NIfTI-2 images (``.nii``, ``.nii.gz``, ``.hdr``/``.img``), memory-mapped."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.memmap.check import (
    FileSignature,
    check_file_unchanged,
    file_signature,
)
from mixle.data.sources.arrays.nifti import gz_cache
from mixle.data.sources.arrays.nifti.files import NiftiFiles, locate, read_head
from mixle.data.sources.arrays.nifti.gz_cache import open_copy
from mixle.data.sources.arrays.nifti.header import NiftiHeader, physical_of
from mixle.data.sources.arrays.nifti.scaling import Scaling, scaling_of, warn_unscaled
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import FileChangedError
from mixle.reading import read_strided
from mixle.utils import optional_deps
from mixle.utils.files import open_regular_file

__all__ = ["NiftiArraySource", "read_nifti"]

#: Why a ``.nii`` (or ``.hdr``) changed since it was opened is refused.
_HEADER_RISK = "the header read at open may not describe the rewritten file"
#: Why a ``.nii.gz`` changed since its inflated copy was made is refused.
_COPY_RISK = "its inflated copy may not match the rewritten file"


@dataclass(eq=False)
class _Mapped:
    """One open image: the read-only map of its data block and what it was made from.

    Mutable only so that :meth:`NiftiArraySource._release` can drop the array before it
    closes the map.
    """

    array: np.ndarray
    map: mmap.mmap | None
    info: NiftiHeader
    scaling: Scaling
    files: NiftiFiles
    #: the decompressed copy that is mapped, for gzipped data
    cache: Path | None
    #: the gzipped data file's (device, inode, size, mtime, ctime) when its copy was keyed
    watched: FileSignature | None
    #: the uncompressed data file's (device, inode, size, mtime, ctime), from the mapped descriptor
    identity: FileSignature | None
    #: the header file's signature taken before its header was read
    header_signature: FileSignature | None = None
    #: unregisters the mapped cache copy from eviction's watch, once (close or collection)
    done: Callable[[], Any] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape


def _map_open(fh: BinaryIO, info: NiftiHeader, what: str) -> tuple[np.ndarray, mmap.mmap | None]:
    """Map the data block of ``info`` from the open file ``fh``, after checking its length."""
    size = os.fstat(fh.fileno()).st_size
    if size < info.end:
        raise ValueError(
            f"{what} holds {size} bytes, but its NIfTI header needs {info.end}: a data "
            f"block of {info.nbytes} bytes ({info.shape} x {info.dtype}) at offset "
            f"{info.offset}; the file is truncated"
        )
    if info.nbytes == 0:
        empty = np.empty(info.shape, dtype=info.dtype, order="F")
        empty.flags.writeable = False
        return empty, None
    mapped = mmap.mmap(fh.fileno(), info.end, access=mmap.ACCESS_READ)
    count = math.prod(info.shape)
    flat = np.frombuffer(mapped, dtype=info.dtype, count=count, offset=info.offset)
    return flat.reshape(info.shape, order="F"), mapped


class NiftiArraySource(ArraySource):
    """A NIfTI-1 or NIfTI-2 image, memory-mapped read-only; shape ``(X, Y, Z, ...)``.

    The axes are nibabel's: ``src[...]`` equals ``np.asanyarray(nibabel.load(path).dataobj)``
    (raw values and dtype, byte order included, with ``scale=False``; nibabel's scaled
    values and dtype with ``scale=True``).

    Parameters
    ----------
    path
        A ``.nii`` or ``.nii.gz`` file, or either file of a ``.hdr``/``.img`` pair (each of
        which may be gzipped). Compression is told from the bytes, not the name.
    scale
        ``False`` (default): the raw stored values, in the stored dtype. When the header
        has a non-trivial ``scl_slope``/``scl_inter`` a :class:`NiftiScalingWarning` says so
        once per path and process. ``True``: ``stored * scl_slope + scl_inter`` computed as
        nibabel does (same dtype and values; a slope of 0 or NaN means no scaling).
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    FileNotFoundError
        When ``path`` (or the other file of a pair) does not exist.
    ValueError
        When the file is not NIfTI (an Analyze 7.5 header included), its header is one
        nibabel refuses, or the file is shorter than its header says (naming both sizes).
    CorruptChunkError
        When a gzipped file does not decompress; nothing is left in the cache.
    ImportError
        When nibabel is missing (``pip install -e ".[nifti]"``), at first use.

    Notes
    -----
    - Opening a ``.nii`` reads its header only (544 bytes, plus header extensions up to
      16 MiB) and maps the data block at ``vox_offset``: no data is read until asked for.
    - gzip cannot seek: the first open of a ``.nii.gz`` decompresses the whole file once
      into mixle's cache directory (``$MIXLE_CACHE_DIR``, see
      :mod:`mixle.data.sources.arrays.nifti.gz_cache`); later opens, in any process, are a
      ``stat``, a few small reads and a map of that copy.
    - :attr:`physical` comes from nibabel's best affine (``img.affine``): for 3-D images
      :attr:`affine` equals it; 4-D and larger ones get the spatial 4x4 plus the pixdim
      spacing of the further axes. Axes are ``i, j, k, t, u, v, w``, units from
      ``xyzt_units``. :attr:`spacing` is nibabel's zooms. A 1-D or 2-D image in a plane of
      the world's axes gets the rows and columns of its axes (exact world coordinates);
      one in an oblique plane gets the plane's own in-plane coordinates (true distances,
      not world positions), and :attr:`nifti_affine` gives nibabel's 4x4 for its 3-D world
      positions (see :func:`~mixle.data.sources.arrays.nifti.header.physical_of`).
    - :meth:`close` unmaps the data (once no view of :attr:`array` is held).
    - Every read first checks (one ``stat`` per user file) that the user's files were not
      replaced, truncated or rewritten since they were opened (device, inode, size,
      modification and status-change times): :class:`~mixle.errors.FileChangedError`
      rather than a crash, stale values or values read with an outdated header. A
      ``.nii`` rewritten in place, even with the same size, must be opened again.
    - Nothing is ever written to the user's files.
    """

    _library = "nibabel"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scale: bool = False,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path={path!r} must be a path to a .nii, .nii.gz, .hdr or .img file")
        if not isinstance(scale, (bool, np.bool_)):
            raise TypeError(f"scale={scale!r} must be True or False")
        self._init_state({"path": os.fspath(path), "scale": bool(scale)}, structure, schema)
        if optional_deps.HAS_NIBABEL:  # else checked at first use, where nibabel is installed
            self._live()

    # -- opening ------------------------------------------------------------------------
    def _location(self) -> str:
        assert self._args is not None
        return repr(self._args["path"])

    def _open(self) -> Any:
        assert self._args is not None
        path = self._args["path"]
        files = locate(path)
        # taken before the header is read: a rewrite from then on fails the first read
        header_signature = file_signature(os.stat(files.header))
        info = read_head(files)
        scaling = scaling_of(info.header, info.dtype, f"path={files.header!r}")
        if files.data_gz:
            prefix = info.head if files.data == files.header else b""
            # mapped from the descriptor the copy was checked on: another process's
            # eviction may unlink the entry at any moment without changing this map
            cache, signature, fh = open_copy(files.data, info.end, prefix)
            with fh:
                what = f"the cached copy {str(cache)!r} of {files.data!r}"
                array, mapped = _map_open(fh, info, what)
            handle = _Mapped(array, mapped, info, scaling, files, cache, signature, None)
            gz_cache.mapped(cache)  # not evicted from the cache while this map is open
            handle.done = weakref.finalize(handle, gz_cache.unmapped, cache)
        else:
            with open_regular_file(files.data, "path") as fh:
                identity = file_signature(os.fstat(fh.fileno()))
                array, mapped = _map_open(fh, info, f"path={files.data!r}")
            handle = _Mapped(array, mapped, info, scaling, files, None, None, identity)
        handle.header_signature = header_signature
        if not self._args["scale"] and not scaling.trivial:
            warn_unscaled(path, scaling)
        return handle

    def _describe(self, handle: Any) -> ArrayMeta:
        assert self._args is not None
        info: NiftiHeader = handle.info
        dtype = handle.scaling.dtype if self._args["scale"] else info.dtype
        return ArrayMeta(
            shape=info.shape, dtype=np.dtype(dtype), physical=physical_of(info.header, info.shape)
        )

    def _release(self, handle: Any) -> None:
        """Unmap the data (on :meth:`close`); the copy may then be evicted from the cache.

        A view of :attr:`array` the caller still holds keeps its pages mapped (Python
        refuses to close a map with live views) until it is dropped: never a crash.
        """
        if handle.done is not None:
            handle.done()  # runs once
        mapped, handle.map = handle.map, None
        handle.array = np.empty((0,) * handle.array.ndim, dtype=handle.array.dtype)
        if mapped is not None:
            with contextlib.suppress(BufferError):  # views of the array are still alive
                mapped.close()

    # -- what the header says -----------------------------------------------------------
    @property
    def array(self) -> np.ndarray:
        """The read-only memory map of the stored (unscaled) data block, ``(X, Y, Z, ...)``."""
        return self._live().array

    @property
    def header(self) -> Any:
        """A copy of the nibabel header as stored in the file (``vox_offset`` included)."""
        return self._live().info.header.copy()

    @property
    def nifti_affine(self) -> np.ndarray:
        """nibabel's 4x4 voxel-to-world affine (``img.affine``), a read-only float64 copy.

        For 3-D and larger images its spatial part is in :attr:`affine`. A 1-D or 2-D
        image is voxels ``(i, 0, 0)``/``(i, j, 0)`` of it: its 3-D world positions are
        ``nifti_affine @ [i, j, 0, 1]``, which a ``(ndim + 1, ndim + 1)`` :attr:`affine`
        cannot always hold (see :func:`~mixle.data.sources.arrays.nifti.header.physical_of`).
        """
        out = np.array(self._live().info.header.get_best_affine(), dtype=np.float64)
        out.flags.writeable = False
        return out

    @property
    def scale(self) -> bool:
        """Whether reads apply ``scl_slope``/``scl_inter``."""
        assert self._args is not None
        return bool(self._args["scale"])

    @property
    def scl_slope(self) -> float:
        """The slope nibabel applies: the header's, or 1.0 when it is 0 or not finite."""
        return self._live().scaling.slope

    @property
    def scl_inter(self) -> float:
        """The intercept nibabel applies: the header's, or 0.0 when the slope is unused."""
        return self._live().scaling.inter

    @property
    def nifti_version(self) -> int:
        """1 (NIfTI-1) or 2 (NIfTI-2)."""
        return int(self._live().info.version)

    @property
    def cache_path(self) -> Path | None:
        """The decompressed copy that is mapped, for gzipped data; else ``None``."""
        return self._live().cache

    # -- reading ------------------------------------------------------------------------
    def _check(self, handle: _Mapped) -> None:
        """Refuse to read a map whose file was cut short, or a changed user file.

        One ``stat`` per file (two for a ``.hdr``/``.img`` pair), once per read call: the
        signature (device, inode, size, modification and status-change times) of each
        user file must be the one taken when it was opened, so a file rewritten in place,
        even at the same size and with a header that now says another dtype, raises
        :class:`~mixle.errors.FileChangedError` instead of being read with the old header.
        """
        files = handle.files
        if files.header != files.data:
            check_file_unchanged(files.header, handle.header_signature, risk=_HEADER_RISK)
        if handle.cache is None:
            if handle.map is not None:
                check_file_unchanged(
                    files.data, handle.identity, needed=handle.info.end, risk=_HEADER_RISK
                )
            if files.header == files.data and handle.identity != handle.header_signature:
                raise FileChangedError(
                    f"path={files.data!r} was rewritten while it was opened (between reading "
                    "its header and mapping its data); open the source again"
                )
            return
        check_file_unchanged(files.data, handle.watched, risk=_COPY_RISK)
        if handle.map is not None and handle.map.size() < handle.info.end:
            raise FileChangedError(
                f"the cached copy {str(handle.cache)!r} of path={files.data!r} was truncated "
                f"to {handle.map.size()} bytes after it was opened, but the image needs "
                f"{handle.info.end}; open the source again (it rebuilds the copy)"
            )

    def _scaled(self, handle: _Mapped, raw: np.ndarray) -> np.ndarray:
        assert self._args is not None
        if self._args["scale"]:
            return handle.scaling.apply(raw)
        return np.array(raw, copy=True)

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        self._check(handle)
        return self._scaled(handle, handle.array[key])

    def _read_into(self, handle: Any, key: tuple[int | slice, ...], out: np.ndarray) -> None:
        self._check(handle)
        assert self._args is not None
        if self._args["scale"] and not handle.scaling.trivial:
            out[...] = handle.scaling.apply(handle.array[key])
        else:
            out[...] = handle.array[key]

    def _read_boxes_into(
        self, handle: Any, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        self._check(handle)
        assert self._args is not None
        if not self._args["scale"] or handle.scaling.trivial:
            read_strided(handle.array, starts, size, out)  # in file order
            return
        raw = np.empty(out.shape, dtype=handle.info.dtype)
        read_strided(handle.array, starts, size, raw)
        out[...] = handle.scaling.apply(raw)


def read_nifti(
    path: str | os.PathLike[str],
    *,
    scale: bool = False,
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> NiftiArraySource:
    """Open a NIfTI image (``.nii``, ``.nii.gz``, ``.hdr``/``.img``); see :class:`NiftiArraySource`.

    ``scale=False`` (default) reads the raw stored values; ``scale=True`` applies
    ``scl_slope``/``scl_inter`` exactly as nibabel's ``img.dataobj`` does.
    """
    return NiftiArraySource(path, scale=scale, structure=structure, schema=schema)
