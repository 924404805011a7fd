"""blosc2 ``.b2nd`` arrays (nnU-Net's preprocessed data), memory-mapped and read by block."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.b2nd.blocks import B2ndChunkReader
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.memmap.check import (
    FileSignature,
    check_file_unchanged,
    file_signature,
)
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.errors import FileChangedError
from mixle.reading import ChunkReader
from mixle.reading.process_cache import drop_cached_chunks
from mixle.utils import optional_deps
from mixle.utils.files import require_regular_file

__all__ = ["SPARSE_FRAME_INDEX", "B2ndArraySource", "read_b2nd"]

#: The file blosc2 writes in the folder of a sparse (non-contiguous) frame, beside one
#: ``NNNNNNNN.chunk`` file per chunk.
SPARSE_FRAME_INDEX = "chunks.b2frame"


def _blosc2() -> Any:
    return optional_deps.require("blosc2", "blosc2", feature="read_b2nd")


class B2ndArraySource(ArraySource):
    """A blosc2 ``.b2nd`` array, opened read-only and memory-mapped, read block by block.

    Parameters
    ----------
    path
        Path of the ``.b2nd`` file (a local file).
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    TypeError
        When ``path`` is not a path.
    ImportError
        At first use when python-blosc2 is not installed: ``pip install -e ".[blosc2]"``.
        Construction then succeeds without I/O, so a process without blosc2 can build a
        source and pickle it to workers that have it.
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not one blosc2 opens, or holds something other than an N-D array
        (a bare super-chunk, a store, a lazy expression), or ``path`` is the folder of a
        sparse blosc2 frame (``contiguous=False``): only contiguous ``.b2nd`` files are read.
    ~mixle.reading.CorruptChunkError
        On a read, when blosc2 cannot decode a block or chunk it needs; the message names
        the file, the chunk and the block.

    Notes
    -----
    Opening reads the frame's metadata only. Reads go through the read planner: when the
    blocks tile the chunks (``chunks`` a multiple of ``blocks`` on every axis) its unit is
    the block, so a patch decodes only the blocks it touches; otherwise, when a filter
    makes a block's decoding depend on other blocks (``DELTA``), and when blocks are small
    (under 64 KiB) in chunks small enough to decode whole faster (at most 4 MiB; see
    :mod:`mixle.data.sources.arrays.b2nd.blocks`), the whole chunk. Each
    decode uses one blosc2 thread (mixle's pool runs decodes in parallel; blosc2's own
    threads would hang a forked child); blosc2's global settings are left alone.
    The file is mapped read-only (``mmap_mode="r"``) and checked once per read call (before
    any of its chunks is decoded, or served from the chunk cache): a file
    cut short, replaced or rewritten in place (its size, modification or status-change time
    moved) raises :class:`~mixle.errors.FileChangedError` instead of crashing the process
    or mixing chunks of two files, and its cached chunks are dropped. blosc2 frames carry
    no checksum: a damaged block whose bytes still decode reads as what they decode to.
    """

    _library = "blosc2"
    _signature: FileSignature | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path={path!r} must be a path to a .b2nd file")
        self._init_state({"path": os.fspath(path)}, structure, schema)
        if optional_deps.HAS_BLOSC2:  # else at first use, where blosc2 is installed
            self._live()

    @property
    def blocks(self) -> tuple[int, ...]:
        """Shape of one blosc2 block, the unit a chunk's decoding can be cut down to."""
        return tuple(int(b) for b in self._live().blocks)

    def _location(self) -> str:
        assert self._args is not None
        return repr(self._args["path"])

    def _open(self) -> Any:
        assert self._args is not None
        path = self._args["path"]
        blosc2 = _blosc2()
        if os.path.isfile(os.path.join(path, SPARSE_FRAME_INDEX)):
            raise ValueError(
                f"path={path!r} is a sparse blosc2 frame folder (an array saved with "
                "contiguous=False): read_b2nd reads contiguous .b2nd files only; save it as "
                "one with blosc2.open(path).copy(urlpath='a.b2nd', contiguous=True)"
            )
        try:
            st = require_regular_file(path, "path")
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"path={path!r}: no such file") from None
        try:
            # one decoding thread: mixle's pool decodes chunks in parallel, and blosc2's
            # thread pool hangs a forked child (each process, the child too, opens anew)
            array = blosc2.open(path, mode="r", mmap_mode="r", dparams={"nthreads": 1})
        except (RuntimeError, ValueError, OSError, TypeError) as exc:
            raise ValueError(
                f"path={path!r} is not a blosc2 file blosc2 can open ({type(exc).__name__}: "
                f"{exc}); read_b2nd reads .b2nd arrays written by blosc2"
            ) from None
        if not isinstance(array, blosc2.NDArray):
            raise ValueError(
                f"path={path!r} holds a blosc2 {type(array).__name__}, not an N-D array "
                "(.b2nd): read it with blosc2.open"
            )
        self._signature = file_signature(st)
        return array

    def _describe(self, handle: Any) -> ArrayMeta:
        return ArrayMeta(
            shape=tuple(int(s) for s in handle.shape),
            dtype=np.dtype(handle.dtype),
            chunks=tuple(int(c) for c in handle.chunks) if handle.shape else None,
        )

    def _check(self) -> None:
        """Refuse a file changed since it was opened (truncated: SIGBUS; rewritten: torn).

        The whole :func:`~mixle.data.sources.arrays.memmap.check.file_signature` is compared
        (device, inode, size, modification and status-change times): a file rewritten in
        place (``cp new.b2nd old.b2nd``: same inode, same or larger size) would otherwise
        decode its new bytes with the old frame's metadata.
        """
        signature, args = self._signature, self._args
        if signature is None or args is None:
            return
        check_file_unchanged(
            args["path"],
            signature,
            risk="its blocks would be decoded with the frame metadata read then",
        )

    def _chunk_reader(self, handle: Any) -> ChunkReader | None:
        if 0 in handle.shape:
            return None
        return B2ndChunkReader(handle, self._location())

    def _reader_for(self, handle: Any) -> ChunkReader | None:
        """The chunk reader, once the mapped file is checked (once per read call)."""
        reader = super()._reader_for(handle)
        if reader is not None:
            try:
                self._check()
            except FileChangedError:  # chunks decoded from the old file never serve again
                drop_cached_chunks(reader.token)
                raise
        return reader

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        reader = self._reader_for(handle)
        if reader is not None:
            return self._read_chunks(reader, key)
        self._check()  # 0-d or empty: nothing to decode block by block
        return np.array(handle[key] if key else handle[()], dtype=self.dtype)


def read_b2nd(
    path: str | os.PathLike[str],
    *,
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> B2ndArraySource:
    """Open a blosc2 ``.b2nd`` file lazily (see :class:`B2ndArraySource`).

    Examples
    --------
    >>> src = read_b2nd("case_00000.b2nd")  # doctest: +SKIP
    >>> src.read_boxes([[0, 10, 20, 30]], (1, 64, 64, 64)).shape  # doctest: +SKIP
    (1, 1, 64, 64, 64)
    """
    return B2ndArraySource(path, structure=structure, schema=schema)
