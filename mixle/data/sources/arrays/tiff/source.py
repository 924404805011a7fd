"""Lazy TIFF and OME-TIFF series through tifffile: tiles as chunks, contiguous data mapped."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.memmap.check import (
    FileSignature,
    check_file_unchanged,
    file_signature,
)
from mixle.data.sources.arrays.tiff.chunks import (
    SegmentLayout,
    TiffChunkReader,
    require_decodable,
)
from mixle.data.sources.arrays.tiff.imagej import imagej_physical
from mixle.data.sources.arrays.tiff.ome import ome_physical, warn_missing_planes
from mixle.data.sources.arrays.tiff.opening import (
    contiguous_memmap,
    level_files,
    open_tiff,
    pick_level,
    tiff_args,
    tifffile_module,
)
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import FileChangedError
from mixle.reading import ChunkReader, read_strided
from mixle.reading.process_cache import drop_cached_chunks
from mixle.utils import optional_deps

__all__ = ["TiffArraySource", "read_tiff"]


@dataclass(frozen=True)
class TiffHandle:
    """What an open TIFF source holds: the file, its series and level, and how to read it."""

    file: Any
    series: Any
    level: Any
    mapped: np.memmap | None
    layout: SegmentLayout | None
    #: the version of each file holding the level's pages at open, by tifffile's path
    files: dict[str, FileSignature]

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the level read."""
        return tuple(self.level.shape)


class TiffArraySource(ArraySource):
    """One series (and pyramid level) of a TIFF or OME-TIFF file, read lazily.

    Parameters
    ----------
    path
        Path of a local TIFF, BigTIFF or OME-TIFF file. URLs are refused for now.
    series
        Which image series (tifffile's ``TiffFile.series``): 0 is the first.
    level
        Which pyramid level of the series (``series.levels``): 0 is full resolution.
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    TypeError
        When ``path`` is not a str or path, or ``series``/``level`` is not an int.
    ValueError
        When ``path`` is a URL, ``series`` or ``level`` is out of range (the message says
        how many exist), or the file is not a TIFF file.
    FileNotFoundError
        When ``path`` does not exist.
    ImportError
        At first use when tifffile is not installed, or at open when the compression
        needs imagecodecs and it is not: ``pip install -e ".[tiff]"``. A compression
        neither decodes is a ``ValueError`` naming it.
    NotImplementedError
        When the series' shape is not its pages stacked on leading axes, or tifffile
        transforms its data after decoding (MD Gel).
    ~mixle.reading.CorruptChunkError
        On a read, when a tile's or strip's stored bytes are cut short or do not decode to
        exactly one tile (naming the file, series, level, page and tile); at open, when
        uncompressed contiguous data runs past the end of the file.
    ~mixle.errors.FileChangedError
        On a read, when a file of the series was deleted, replaced, resized or written in
        place since it was opened (its tiles cached from before are dropped).

    Notes
    -----
    Opening parses the TIFF structure and metadata only (see
    :mod:`mixle.data.sources.arrays.tiff.opening` for what that costs on many-page files).
    The array is tifffile's ``series.shape`` (its ``axes`` give the axis letters, e.g.
    ``"ZCYX"``) with tifffile's native-byte-order dtype. Tiles (or strips) of each page are
    the chunks, ``(1, ..., tile_y, tile_x[, samples])``, read with one ``pread`` each and
    decoded by tifffile's own decode of the series, on the read planner's pool.
    Uncompressed contiguous data is memory-mapped instead. The planes of a multi-file
    OME-TIFF are read from the files its OME-XML names (opened when first read; never
    mapped); planes of files it names that are missing read as zeros, as tifffile reads
    them, with an :class:`~mixle.errors.OmeTiffMissingFilesWarning`
    at open naming those files. Every read first checks that each file is still the
    version opened (one ``stat`` per file per read: device, inode, size, modification and
    change times).
    OME-TIFF pixel sizes become :attr:`physical` (``spacing`` per axis, 1.0 on non-spatial
    axes).
    """

    _library = "tifffile"

    def __init__(
        self,
        path: str | os.PathLike[str],
        series: int = 0,
        level: int = 0,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        self._init_state(tiff_args(path, series, level), structure, schema)
        if optional_deps.HAS_TIFFFILE:  # else at first use, where tifffile is installed
            self._live()

    def _location(self) -> str:
        assert self._args is not None
        a = self._args
        return f"{a['path']!r}, series={a['series']}, level={a['level']}"

    def _where(self) -> str:
        """``series 0 (level 0) of 'path'``: how errors name what is read."""
        assert self._args is not None
        a = self._args
        return f"series {a['series']} (level {a['level']}) of {a['path']!r}"

    def _open(self) -> TiffHandle:
        assert self._args is not None
        path, index, level_index = self._args["path"], self._args["series"], self._args["level"]
        tif = open_tiff(path)
        try:
            # the version opened, before its series are parsed
            opened = file_signature(os.fstat(tif.filehandle.fileno()))
            series, level = pick_level(tif, index, level_index, path)
            if level.transform is not None:
                raise NotImplementedError(
                    f"series {index} of {path!r} ({series.kind}) is transformed by tifffile "
                    "after decoding; mixle does not read such series"
                )
            paths = level_files(tif, level)
            files = {p: opened if k == 0 else _signature(p) for k, p in enumerate(paths)}
            mapped = contiguous_memmap(path, level, tif.byteorder, paths)
            layout = None
            if mapped is None and level.size:
                require_decodable(tifffile_module(), level.keyframe, self._where())
                layout = SegmentLayout(tuple(level.shape), level.keyframe, len(level))
            handle = TiffHandle(tif, series, level, mapped, layout, files)
            if tif.is_ome:
                warn_missing_planes(tif.ome_metadata, level, path, self._where())
        except BaseException:
            tif.close()
            raise
        # a source dropped without close() closes its file when the handle is collected
        weakref.finalize(handle, tif.close)
        return handle

    def _describe(self, handle: TiffHandle) -> ArrayMeta:
        tif = handle.file
        if tif.is_ome:
            physical = ome_physical(tif.ome_metadata, handle.series, handle.level, self._where())
        else:
            physical = imagej_physical(tif.imagej_metadata, handle.level)
        return ArrayMeta(
            shape=handle.shape,
            dtype=np.dtype(handle.level.dtype),
            chunks=None if handle.layout is None else handle.layout.chunks,
            physical=physical,
        )

    @property
    def array(self) -> Any:
        """The tifffile ``TiffPageSeries`` of the level read (``.asarray()`` reads it whole)."""
        return self._live().level

    @property
    def axes(self) -> str:
        """tifffile's axis letters of the array, one per axis (``"TCZYX"``, ``"YXS"``...)."""
        return str(self._live().level.axes)

    @property
    def levels(self) -> list[tuple[int, ...]]:
        """Shape of every pyramid level of the series (``[shape]`` when not a pyramid)."""
        return [tuple(lv.shape) for lv in self._live().series.levels]

    def _chunk_reader(self, handle: TiffHandle) -> TiffChunkReader | None:
        if handle.layout is None or self._args is None:
            return None
        return TiffChunkReader(handle.files, handle.level, handle.layout, self._where())

    def _reader_for(self, handle: TiffHandle) -> ChunkReader | None:
        """The chunk reader, once the files are checked unchanged (once per read call)."""
        reader = super()._reader_for(handle)
        if reader is not None:
            try:
                _check_unchanged(handle.files, self._where())
            except FileChangedError:  # tiles decoded from the old version never serve again
                drop_cached_chunks(reader.token)
                raise
        return reader

    def _check_file(self, handle: TiffHandle) -> None:
        """Refuse to touch the map if the file was cut short, replaced or rewritten."""
        _check_unchanged(handle.files, self._where())

    def _read(self, handle: TiffHandle, key: tuple[int | slice, ...]) -> np.ndarray:
        mapped = handle.mapped
        if mapped is not None:
            self._check_file(handle)
            return np.array(mapped[key], dtype=self.dtype, copy=True, subok=False)
        reader = self._reader_for(handle)
        if reader is None:  # an empty array: nothing stored to read
            return np.empty(handle.shape, dtype=self.dtype)[key]
        return self._read_chunks(reader, key)

    def _read_boxes_into(
        self, handle: TiffHandle, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        mapped = handle.mapped
        if mapped is None:
            super()._read_boxes_into(handle, starts, size, out)
        else:
            self._check_file(handle)
            read_strided(mapped.view(np.ndarray), starts, size, out)

    def _release(self, handle: TiffHandle) -> None:
        handle.file.close()


def _signature(path: str) -> FileSignature:
    """The version of ``path`` now (a file a multi-file OME-TIFF names must exist)."""
    return file_signature(os.stat(path))


def _check_unchanged(files: dict[str, FileSignature], where: str) -> None:
    """Raise :class:`FileChangedError` when a file in ``files`` is not that version now.

    One ``stat`` per file: a file deleted, replaced, cut short, grown or written in place
    (``rsync --inplace``, a writer appending pages) since the source opened it would give
    tile offsets that no longer hold its tiles, or mix tiles decoded from the old version
    with bytes of the new one.
    """
    for path, signature in files.items():
        check_file_unchanged(
            path,
            signature,
            risk=f"{where}'s tags and tiles read before the change may not match the file now",
        )


def read_tiff(
    path: str | os.PathLike[str],
    series: int = 0,
    level: int = 0,
    *,
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> TiffArraySource:
    """Open series ``series``, pyramid level ``level`` of a TIFF or OME-TIFF file lazily.

    See :class:`TiffArraySource` for the parameters, what is read when, and the errors.

    Examples
    --------
    >>> src = read_tiff("stack.ome.tif")  # doctest: +SKIP
    >>> src.axes, src.shape, src.spacing  # doctest: +SKIP
    ('ZYX', (40, 512, 512), (2.0, 0.5, 0.5))
    """
    return TiffArraySource(path, series, level, structure=structure, schema=schema)
