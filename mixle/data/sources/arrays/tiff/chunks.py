"""TIFF tiles and strips as the read planner's chunks, each read with one ``pread``.

A series of TIFF pages is an N-D array whose leading axes step through the pages and whose
last axes are one page. :class:`SegmentLayout` maps that array onto tifffile's normalised
page shape ``(separate samples, depth, length, width, contig samples)``: one chunk is one
stored segment (a tile or a strip) of one page, ``(1, ..., tile_y, tile_x[, samples])``
like tifffile's own zarr store. :class:`TiffChunkReader` reads a segment's bytes at its
offset, in the file that holds its page (a multi-file OME-TIFF's planes lie in the other
files its OME-XML names), and decodes them with tifffile's decode function of the series'
key page, so compression, predictors, fill order and byte order are undone exactly as
tifffile does.
It is also the fast path (tifffile picks libdeflate for zlib); ``benchmarks/patch_read.py
--only tiff`` measures the reads against tifffile's own zarr store.

Decoding is bounded by the segment's size: zlib, deflate, zstd and packbits refuse output
past one segment; LZW and LZMA stop there (a longer stream is cut at one segment, the values
tifffile reads too). A segment that decodes to fewer bytes, bytes the codec refuses, a byte
count past the end of the file, or a file cut short inside a segment raise
:class:`~mixle.reading.CorruptChunkError` naming the file, the series, the page and the
segment.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from mixle.data.sources.arrays.memmap.check import FileSignature, file_signature
from mixle.data.sources.arrays.tiff.opening import page_file
from mixle.errors import FileChangedError
from mixle.reading import CorruptChunkError, new_token
from mixle.utils import optional_deps

__all__ = ["SegmentLayout", "TiffChunkReader", "require_decodable"]


def require_decodable(tifffile: Any, keyframe: Any, where: str) -> None:
    """Refuse a series whose compression or predictor tifffile cannot undo here.

    Raises
    ------
    ImportError
        When the compression needs imagecodecs and it is not installed: the message names
        the compression and ``pip install -e ".[tiff]"``.
    ValueError
        When neither tifffile nor the installed imagecodecs decode it (an unknown or
        proprietary compression or predictor), naming it.
    """
    tiff = tifffile.TIFF
    checks = (
        ("compression", keyframe.compression, tiff.DECOMPRESSORS),
        ("predictor", keyframe.predictor, tiff.UNPREDICTORS),
    )
    for what, code, table in checks:
        if int(code) == 1:
            continue
        try:
            table[code]
        except KeyError:
            name = getattr(code, "name", None)
            spelled = f"{int(code)} ({name})" if name else f"{int(code)}"
            if not optional_deps.HAS_IMAGECODECS:
                raise ImportError(
                    f"{where} is stored with TIFF {what} {spelled}, which needs imagecodecs, "
                    'which is not installed: pip install -e ".[tiff]" in a clone of the mixle '
                    "repository (the name mixle on the package index belongs to an unrelated "
                    "project)"
                ) from None
            raise ValueError(
                f"{where} is stored with TIFF {what} {spelled}, which neither tifffile nor "
                "the installed imagecodecs decodes; a newer imagecodecs may (upgrade it, "
                'or pip install -e ".[tiff]" in a clone of the mixle repository)'
            ) from None


class SegmentLayout:
    """Where each chunk of a series' N-D array sits among its pages' stored segments.

    Parameters
    ----------
    shape
        Shape of the series (tifffile's ``series.shape``).
    keyframe
        The series' key page (``series.keyframe``): every page has its shape and storage.
    pages
        Number of pages in the series.

    Raises
    ------
    NotImplementedError
        When the series' shape is not the pages stacked on leading axes (a layout tifffile
        reshapes some other way).

    Notes
    -----
    The page's own axes are the series' last axes when they are tifffile's page shape
    (``keyframe.shape``, axes ``keyframe.axes``: ``YX``, ``ZYX``, ``SYX``, ``YXS``...), so
    an axis of length 1 (a one-row image, one slice of a volumetric tile) is still the
    row, column or slice axis its tiles cut. A chunk spans a whole segment on the page's
    axes (a tile longer than a one-row image is a chunk of the tile's length, as zarr's
    chunks may be longer than the array); a segment's slices on a normalised axis the
    page lacks (the depth of a volumetric tile when the image is one slice deep) are cut
    to the first.
    """

    def __init__(self, shape: tuple[int, ...], keyframe: Any, pages: int) -> None:
        norm = tuple(int(n) for n in keyframe.shaped)  # (S, D, L, W, C)
        s, d, length, width, c = norm
        if keyframe.is_tiled:
            seg = (int(keyframe.tiledepth), int(keyframe.tilelength), int(keyframe.tilewidth))
            self.stored = (seg[0], seg[1], seg[2], c)
        else:
            rows = int(keyframe.rowsperstrip)
            if rows < 1:
                raise CorruptChunkError(f"RowsPerStrip is {rows}, not a positive number")
            seg = (1, min(rows, length), width)
            self.stored = (1, rows, width, c)  # what tifffile's decode pads a strip to
        #: chunk extent per normalised axis (S, D, L, W, C)
        self.norm_chunk = (1, *seg, c)
        found = _page_axes_by_letter(shape, keyframe, pages)
        if found is None:
            found = _page_axes_by_size(shape, norm, pages)
        if found is None:
            raise NotImplementedError(
                f"series shape {shape} is not {pages} pages of {keyframe.shape} stacked on "
                "leading axes: mixle cannot map its chunks to the stored tiles"
            )
        split, mapping = found
        #: segments per page along (S, D, L, W), in tifffile's segment order
        self.grid = (s, *(math.ceil(n / k) for n, k in zip((d, length, width), seg)))
        self.shape = shape
        self.split = split
        self.mapping = mapping
        self.chunks: tuple[int, ...] = (1,) * split + tuple(
            1 if m is None else self.norm_chunk[m] for m in mapping
        )
        kept = set(mapping)
        #: extent of a chunk on each axis of a decoded segment (D, L, W, C): the segment's
        #: slices on an axis the array lacks are cut to the first
        self._cut = tuple(slice(0, self.norm_chunk[m] if m in kept else 1) for m in range(1, 5))
        #: elements one stored segment decodes to (padding included)
        self.segment_size = math.prod(self.stored)

    def locate(self, coords: tuple[int, ...]) -> tuple[int, int]:
        """``(page index in the series, segment index in the page)`` of chunk ``coords``."""
        lead = coords[: self.split]
        page = int(np.ravel_multi_index(lead, self.shape[: self.split])) if lead else 0
        norm = [0, 0, 0, 0]
        for c, m in zip(coords[self.split :], self.mapping):
            if m is not None and m < 4:
                norm[m] = c
        return page, int(np.ravel_multi_index(norm, self.grid))

    def fits(self, decoded: np.ndarray) -> np.ndarray | None:
        """``decoded`` (tifffile's ``(depth, length, width, samples)``) as one chunk, or ``None``.

        ``None`` when it is not exactly one stored segment.
        """
        if decoded.shape != self.stored:
            return None
        return decoded[self._cut].reshape(self.chunks)


#: Normalised axis (S, D, L, W, C) of each letter of tifffile's page axes.
_PAGE_LETTERS = {"Z": 1, "Y": 2, "X": 3}


def _page_axes_by_letter(
    shape: tuple[int, ...], keyframe: Any, pages: int
) -> tuple[int, list[int | None]] | None:
    """``(split, mapping)`` when ``shape`` ends in the key page's shape, else ``None``.

    ``mapping`` names the normalised axis of each page axis from tifffile's letters.
    """
    page = tuple(int(n) for n in keyframe.shape)
    letters = str(keyframe.axes)
    n = len(page)
    if n == 0 or len(letters) != n or len(shape) < n or tuple(shape[len(shape) - n :]) != page:
        return None
    split = len(shape) - n
    if math.prod(shape[:split]) != pages:
        return None
    mapping: list[int | None] = []
    for k, letter in enumerate(letters):
        if letter == "S":  # samples before the rows are separate planes, after them contig
            mapping.append(0 if "Y" in letters[k:] else 4)
        elif letter in _PAGE_LETTERS:
            mapping.append(_PAGE_LETTERS[letter])
        else:
            return None
    if mapping != sorted(mapping) or len(set(mapping)) != n:
        return None
    return split, mapping


def _page_axes_by_size(
    shape: tuple[int, ...], norm: tuple[int, ...], pages: int
) -> tuple[int, list[int | None]] | None:
    """``(split, mapping)`` matching ``shape``'s last axes to ``norm`` by their lengths."""
    split = _page_axes_start(shape, math.prod(norm))
    if split is None or math.prod(shape[:split]) != pages:
        return None
    mapping = _map_page_axes(shape[split:], norm)
    return None if mapping is None else (split, mapping)


def _page_axes_start(shape: tuple[int, ...], size: int) -> int | None:
    """Index of the first axis of one page in ``shape``: the product from there is ``size``."""
    p = 1
    for k in range(len(shape) - 1, -1, -1):
        p *= shape[k]
        if p == size:
            return k
        if p > size:
            return None
    return None


def _map_page_axes(page: tuple[int, ...], norm: tuple[int, ...]) -> list[int | None] | None:
    """The normalised axis each axis of ``page`` is (``None``: an added length-1 axis)."""
    mapping: list[int | None] = [None] * len(page)
    j, m = len(page) - 1, len(norm) - 1
    while j >= 0:
        if page[j] == 1:
            j -= 1
        elif m >= 0 and norm[m] == page[j]:
            mapping[j] = m
            j, m = j - 1, m - 1
        elif m >= 0 and norm[m] == 1:
            m -= 1
        else:
            return None
    if any(norm[k] != 1 for k in range(m + 1)):
        return None
    return mapping


class _Page(NamedTuple):
    """Where one page's segments are stored."""

    file: str
    offsets: tuple[int, ...]
    counts: tuple[int, ...]
    tables: Any


class TiffChunkReader:
    """Whole tiles or strips of one TIFF series, read with ``pread`` and decoded by tifffile.

    Parameters
    ----------
    files
        :func:`~mixle.data.sources.arrays.memmap.check.file_signature` of each file holding
        the series' pages, by tifffile's absolute path (the file opened first): a multi-file
        OME-TIFF's planes are read from the file tifffile found them in.
    series
        The tifffile ``TiffPageSeries`` (one pyramid level) to read.
    layout
        Its :class:`SegmentLayout`.
    name
        How errors name the series (file, series and level).

    Notes
    -----
    Each file is opened (read-only) when a chunk is first read from it and closed when the
    reader is collected. A file that is no longer the version ``files`` describes when it
    is opened raises :class:`~mixle.errors.FileChangedError`; checking the files before a
    read is the source's job (one ``stat`` per file per read, not per tile).
    """

    def __init__(
        self, files: Mapping[str, FileSignature], series: Any, layout: SegmentLayout, name: str
    ) -> None:
        keyframe = series.keyframe
        keyframe.init_decode()  # tifffile's decode is a cached property: make it here, once
        self.chunks = layout.chunks
        self.token = new_token()
        self._files = dict(files)
        self._root = next(iter(self._files), "")
        self._keyframe = keyframe
        self._decode = keyframe.decode
        self._jpegheader = keyframe.jpegheader
        self._layout = layout
        self._series = series
        self._dtype = np.dtype(series.dtype)
        self._name = name
        self._nodata = keyframe.nodata
        self._lock = threading.Lock()
        self._pages: dict[int, _Page | None] = {}
        # path -> (descriptor, size): opened on first use, closed when the reader is
        # garbage (reads still in flight keep it alive)
        self._fds: dict[str, tuple[int, int]] = {}
        weakref.finalize(self, _close_all, self._fds)

    def _page(self, index: int) -> _Page | None:
        """Where page ``index`` is stored; ``None``: a page the file lacks."""
        if index in self._pages:
            return self._pages[index]
        with self._lock:  # tifffile seeks its own file handle to parse the page's IFD
            if index not in self._pages:
                try:
                    page = self._series[index]
                except Exception as exc:
                    raise CorruptChunkError(
                        f"page {index} of {self._name} cannot be parsed "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                self._pages[index] = None if page is None else self._stored(index, page)
        return self._pages[index]

    def _stored(self, index: int, page: Any) -> _Page:
        file = page_file(page)
        keyframe = getattr(page, "keyframe", None)
        if keyframe is not self._keyframe and getattr(page, "hash", None) != self._keyframe.hash:
            raise CorruptChunkError(
                f"page {index} of {self._name} (in {file!r}) is stored unlike the series' "
                "key page (another shape, tiling, sample format or compression), so the "
                "series' decoding does not apply to it"
            )
        return _Page(
            file,
            tuple(page.dataoffsets),
            tuple(page.databytecounts),
            getattr(page, "jpegtables", None),
        )

    def _fd(self, file: str) -> tuple[int, int]:
        """``(descriptor, size)`` of ``file``, opened on first use."""
        found = self._fds.get(file)
        if found is not None:
            return found
        with self._lock:
            found = self._fds.get(file)
            if found is None:
                fd = os.open(file, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                st = os.fstat(fd)
                expected = self._files.get(file)
                if expected is not None and file_signature(st) != expected:
                    os.close(fd)
                    raise FileChangedError(
                        f"path={file!r} was replaced or written after {self._name} was "
                        "opened; its tile offsets may no longer hold its tiles, so mixle "
                        "refuses: open the source again"
                    )
                found = self._fds[file] = (fd, int(st.st_size))
        return found

    def _fill(self, value: Any) -> np.ndarray:
        one = np.full((), value, dtype=self._dtype)
        return np.broadcast_to(one, self.chunks)  # read-only, one element of memory

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        page_index, segment = self._layout.locate(coords)
        page = self._page(page_index)
        if page is None:  # a page the metadata names but the file lacks: tifffile reads 0
            return self._fill(0)
        offsets, counts, tables = page.offsets, page.counts, page.tables
        stored = "" if page.file == self._root else f", stored in {page.file!r}"
        where = f"tile {segment} of page {page_index} of {self._name} (chunk {coords}{stored})"
        expected = math.prod(self._layout.grid)
        if len(offsets) != expected or len(counts) != expected:
            raise CorruptChunkError(
                f"{where} cannot be found: page {page_index} lists {len(offsets)} offsets and "
                f"{len(counts)} byte counts, its shape and tiling need {expected} of each (a "
                "page unlike the series' first)"
            )
        offset, count = int(offsets[segment]), int(counts[segment])
        if offset == 0 or count == 0:  # never written: tifffile reads the nodata value
            return self._fill(self._nodata)
        fd, size = self._fd(page.file)
        # a byte count past the end of the file (cut short, or hostile) allocates nothing
        raw = os.pread(fd, max(0, min(count, size - offset)), offset)
        if len(raw) != count:
            raise CorruptChunkError(
                f"{where} is truncated: the file holds {len(raw)} of its {count} bytes at "
                f"offset {offset} (file cut short?)"
            )
        return self.decode_stored(segment, where, raw, tables)

    def decode_stored(self, segment: int, where: str, raw: bytes, tables: Any) -> np.ndarray:
        """A segment's stored bytes decoded by tifffile; anything but one whole segment raises."""
        kwargs: dict[str, Any] = {"_fullsize": True}
        if tables is not None:
            kwargs["jpegtables"] = tables
        if self._jpegheader is not None:
            kwargs["jpegheader"] = self._jpegheader
        try:
            decoded = self._decode(raw, segment, **kwargs)[0]
        except Exception as exc:
            raise CorruptChunkError(
                f"{where} is corrupt ({len(raw)} stored bytes do not decode to a tile: "
                f"{type(exc).__name__}: {exc})"
            ) from None
        chunk = None if decoded is None else self._layout.fits(np.asarray(decoded))
        if chunk is None:
            got = None if decoded is None else np.shape(decoded)
            raise CorruptChunkError(
                f"{where} is corrupt: it decodes to shape {got}, the tags say {self._layout.stored}"
            )
        if chunk.dtype != self._dtype:
            chunk = chunk.astype(self._dtype)
        return chunk


def _close_all(fds: dict[str, tuple[int, int]]) -> None:
    """Close every descriptor in ``fds`` (a collected reader's files)."""
    for fd, _ in fds.values():
        os.close(fd)
    fds.clear()
