"""The shared surface of every lazy N-D array source.

A backend subclass says how to open its store (:meth:`ArraySource._open`), which
constructor arguments reopen it (:attr:`ArraySource._args`), and how to describe it. This
base class gives every backend the same contract: metadata-only opening, N-D basic
indexing with NumPy's semantics (plus an integer array or mask on axis 0), rows along
axis 0 as records, multi-row batch reads, pickling by reference, reopening after
``fork``, and a clear error after ``close()``.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.schema import Schema, parse_schema
from mixle.data.sources.arrays import box_reads
from mixle.data.sources.arrays.cf import (
    CFAttributes,
    CFDecoding,
    parse_mask_and_scale,
    warn_packed,
)
from mixle.data.sources.arrays.cf_reader import decoding_reader
from mixle.data.sources.arrays.physical import Physical
from mixle.data.sources.indexing import KeyLike, ReadItem, RowsKey, parse_key
from mixle.data.sources.lifetime import SourceLifetime
from mixle.data.spec import ArraySpec
from mixle.data.structure import SampleStructure, parse_structure
from mixle.errors import SourceClosedError
from mixle.reading import ChunkReader, read_chunked
from mixle.reading.plan import touched_chunks
from mixle.reading.process_cache import drop_cached_chunks, drop_chunks_when_collected
from mixle.utils.optional_deps import not_opened_note

__all__ = ["LISTED_NAMES", "ArrayMeta", "ArraySource", "listing"]

#: How many names an error message lists before it says "and N more".
LISTED_NAMES = 40


def listing(names: list[str], noun: str) -> str:
    """``"<noun>: a, b, c"`` for error messages, shortened past :data:`LISTED_NAMES`."""
    if not names:
        return f"it holds no {noun}"
    more = f" and {len(names) - LISTED_NAMES} more" if len(names) > LISTED_NAMES else ""
    return f"{noun}: {', '.join(names[:LISTED_NAMES])}{more}"


@dataclass(frozen=True)
class ArrayMeta:
    """Metadata read when a source opens."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None = None
    shards: tuple[int, ...] | None = None
    #: Voxel-to-world geometry, for formats that record it (NIfTI, OME-TIFF, OME-Zarr).
    physical: Physical | None = None
    #: How stored values become the values read (``mask_and_scale=True``); ``dtype`` is
    #: then the decoded dtype.
    cf: CFDecoding | None = None


class ArraySource(SourceLifetime, abc.ABC):
    """Base class of lazy N-D array sources (zarr, HDF5, memmap, ``.npy``, in-memory).

    Notes
    -----
    - Opening reads metadata only. ``src[key]`` reads exactly the region asked for and
      returns a new NumPy array (never a view into the user's file).
    - Records are rows along axis 0: ``len(src) == src.shape[0]``.
    - Pickling stores the constructor arguments, never data; the copy reopens lazily on
      first use. A source used in a forked child reopens its handles there.
    - Reads are safe from several threads.
    """

    #: The optional module a backend needs, named in its repr when missing.
    _library: str | None = None

    _args: dict[str, Any] | None
    _structure: SampleStructure
    _schema: Schema | None
    _meta: ArrayMeta | None
    _reader: tuple[Any, ChunkReader | None] | None
    #: Whether a 0-d array is stored as one chunk the backend's chunk reader can read.
    _zero_d_chunk: bool = False
    #: Whether CF packing is decoded (``mask_and_scale=True``); kept in ``_args`` to pickle.
    _cf_wanted: bool = False

    # -- construction -------------------------------------------------------------------
    def _init_state(self, args: dict[str, Any] | None, structure: object, schema: object) -> None:
        """Store arguments and reset handles; no I/O."""
        self._args = args
        self._structure = parse_structure(structure)
        self._schema = parse_schema(schema)
        self._reader = None
        self._cf_wanted = bool(args and args.get("mask_and_scale"))
        self._init_lifetime()

    def _want_cf(self, mask_and_scale: object) -> None:
        """Record ``mask_and_scale`` (checked to be a bool) in the state and the arguments."""
        self._cf_wanted = parse_mask_and_scale(mask_and_scale)
        if self._args is not None and self._cf_wanted:
            self._args = {**self._args, "mask_and_scale": True}

    @abc.abstractmethod
    def _open(self) -> Any:
        """Open the store and return the live array object."""

    @abc.abstractmethod
    def _describe(self, handle: Any) -> ArrayMeta:
        """Read metadata from the live array object."""

    @abc.abstractmethod
    def _location(self) -> str:
        """Where the data lives, safe to show (no credentials)."""

    def _drop_derived(self) -> None:
        state, self._reader = self._reader, None
        reader = None if state is None else state[1]
        if reader is not None:  # its chunks can never be asked for again: free them now
            drop_cached_chunks(reader.token)

    def _chunk_reader(self, handle: Any) -> ChunkReader | None:
        """A reader of whole decoded chunks for the read planner, or ``None`` (no chunks)."""
        return None

    def _cf_attributes(self, handle: Any) -> CFAttributes | None:
        """The CF packing attributes of the live array, or ``None`` (the format has none)."""
        return None

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        """Read a region given as non-negative ints and positive-step slices."""
        return self._decoded(np.asarray(handle[key]))

    def _decoded(self, raw: np.ndarray) -> np.ndarray:
        """``raw`` stored values as read: CF-decoded when the source decodes them.

        Backends call it on every read that does not go through the chunk reader (whose
        chunks come decoded).
        """
        meta = self._meta
        cf = None if meta is None else meta.cf
        return raw if cf is None else cf.decode(raw)

    # -- handles ------------------------------------------------------------------------
    def _open_described(self) -> tuple[Any, ArrayMeta]:
        handle = self._open()
        meta = self._describe(handle)
        try:
            meta = self._with_cf(handle, meta)
        except ValueError:  # attributes mask_and_scale cannot decode: nothing stays open
            self._release(handle)
            raise
        if self._schema is not None:
            self._schema.check(meta.dtype, meta.shape, what=self._location())
        return handle, meta

    def _forked(self, handle: Any) -> Any:
        # never share the parent's handle, unless it cannot be reopened (an in-memory file)
        return handle if self._args is None else None

    def _metadata(self) -> ArrayMeta:
        self._live()
        assert self._meta is not None
        return self._meta

    def _adopt(self, handle: Any) -> None:
        """Use an already-open array object as this source's live handle."""
        self._handle = handle
        self._meta = self._with_cf(handle, self._describe(handle))
        if self._schema is not None:
            self._schema.check(self._meta.dtype, self._meta.shape, what=self._location())

    def _with_cf(self, handle: Any, meta: ArrayMeta) -> ArrayMeta:
        """``meta`` with the CF decoding asked for, or a warning that packed values read raw."""
        found = self._cf_attributes(handle)
        if found is None or not found.values:
            return meta
        where = f"{type(self).__name__}({self._location()})"
        if not self._cf_wanted:
            warn_packed(found, meta.dtype, where)
            return meta
        cf = CFDecoding.from_attributes(found.values, meta.dtype, where=where)
        return meta if cf is None else replace(meta, dtype=cf.dtype, cf=cf)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise self._closed_error("pickle it")
        if self._args is None:
            raise TypeError(
                f"{self!r} cannot be pickled by reference: it wraps an object that cannot "
                "be reopened from a path; open it with a mixle read_* function instead"
            )
        return (_reopen, (type(self), self._args, self._structure, self._schema))

    # -- metadata -----------------------------------------------------------------------
    @property
    def array(self) -> Any:
        """The live lazy array object (zarr ``Array``, h5py ``Dataset``, ``np.memmap``...)."""
        return self._live()

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the whole array."""
        return self._metadata().shape

    @property
    def dtype(self) -> np.dtype:
        """Element dtype."""
        return self._metadata().dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array, decoded."""
        return self.size * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...] | None:
        """Shape of one stored chunk (the unit of decoding), or ``None`` if unchunked."""
        return self._metadata().chunks

    @property
    def shards(self) -> tuple[int, ...] | None:
        """Shape of one shard for sharded zarr arrays, else ``None``."""
        return self._metadata().shards

    @property
    def physical(self) -> Physical | None:
        """Voxel-to-world geometry the format records (:class:`Physical`), else ``None``."""
        return self._metadata().physical

    @property
    def spacing(self) -> tuple[float, ...] | None:
        """World distance between neighbouring voxels per axis, or ``None`` if not recorded."""
        physical = self.physical
        return None if physical is None else physical.spacing

    @property
    def origin(self) -> tuple[float, ...] | None:
        """World coordinates of voxel ``(0, ..., 0)``, or ``None`` if not recorded."""
        physical = self.physical
        return None if physical is None else physical.origin

    @property
    def affine(self) -> NDArray[np.float64] | None:
        """``(ndim + 1, ndim + 1)`` voxel-to-world matrix (read-only), or ``None``."""
        physical = self.physical
        return None if physical is None else physical.affine

    @property
    def structure(self) -> SampleStructure:
        """How the records (rows along axis 0) relate to each other."""
        return self._structure

    @property
    def schema(self) -> Schema | None:
        """The schema checked at open, if any."""
        return self._schema

    def element_spec(self) -> ArraySpec:
        """Shape and dtype of one record (a row along axis 0), from metadata."""
        shape = self.shape
        if not shape:
            raise TypeError(f"{self!r} is 0-dimensional and has no records")
        return ArraySpec(shape[1:], self.dtype)

    # -- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        shape = self.shape
        if not shape:
            raise TypeError(f"len() of a 0-dimensional source: {self!r}")
        return shape[0]

    def __getitem__(self, key: KeyLike) -> Any:
        """Read ``key`` with NumPy's semantics for the keys :func:`parse_key` takes.

        Ints, negative ints, slices with any step, ``...`` and tuples of those, plus one 1-D
        integer array (or list) or boolean mask on axis 0: ``src[[3, 1], 2:5]``. Rows asked
        for by an array are each read once, like :meth:`get_batch`. ``None``, arrays on
        other axes and multidimensional arrays raise ``TypeError`` naming what to use.
        """
        handle = self._live()
        parsed = parse_key(key, self.shape)
        try:
            if isinstance(parsed, RowsKey):
                return box_reads.owned(parsed.finish(self._read_rows(handle, parsed)))
            block = parsed.finish(self._read(handle, parsed.read))
        except Exception as exc:
            self._raise_if_closed(exc)
            raise
        if parsed.scalar:
            return block[()]
        return box_reads.owned(block)

    def _read_rows(self, handle: Any, key: RowsKey) -> np.ndarray:
        """The distinct rows of ``key`` with its basic key on the other axes, unflipped.

        Chunked stores read them through the read planner (each chunk once); others read
        each run of consecutive rows in one :meth:`_read`.
        """
        reader = self._reader_for(handle)
        if reader is not None:
            return self._read_chunks(reader, key.read)
        return box_reads.read_row_runs(partial(self._read, handle), key, self.dtype)

    def read_box(self, start: ArrayLike, size: ArrayLike) -> np.ndarray:
        """Read the box ``[start, start + size)``; it must lie inside the array."""
        ext = box_reads.int_list(size, "size")
        box = np.empty(ext if all(n >= 0 for n in ext) else 0, dtype=self.dtype)
        self.read_boxes([box_reads.int_list(start, "start")], ext, out=box[np.newaxis])
        return box

    def read_boxes(
        self, starts: ArrayLike, size: ArrayLike, *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Read boxes of one ``size`` at each row of ``starts`` into ``out[B, *size]``.

        ``starts`` is ``(B, ndim)``; every box must lie inside the array. ``out`` (optional)
        must have shape ``(B, *size)`` and this source's dtype.
        """
        handle = self._live()
        shape = self.shape
        rows, ext = box_reads.parse_boxes(starts, size, shape)
        out = box_reads.box_output(out, (len(rows), *ext), self.dtype)
        if rows and all(ext):
            try:
                self._read_boxes_into(handle, rows, ext, out)
            except Exception as exc:
                self._raise_if_closed(exc)
                raise
        return out

    def _read_boxes_into(
        self, handle: Any, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        """Fill ``out`` with validated boxes: by chunk when the store has a chunk reader."""
        reader = self._reader_for(handle) if self.shape else None
        if reader is not None:
            read_chunked(reader, starts, size, self.shape, out)
            return
        box_reads.read_each_box(partial(self._read_into, handle), starts, size, out)

    def _reader_for(self, handle: Any) -> ChunkReader | None:
        """The chunk reader of the current handle, made on first use."""
        state = self._reader
        if state is None or state[0] is not handle:
            chunked = bool(self.shape) or self._zero_d_chunk  # most 0-d arrays have no chunks
            with self._lock:
                state = self._reader
                if state is None or state[0] is not handle:
                    state = (handle, self._decoding_reader(handle) if chunked else None)
                    if state[1] is not None:
                        drop_chunks_when_collected(state[1])
                    if not self._closed:  # a reader made after close() is not kept
                        self._reader = state
        return state[1]

    def _decoding_reader(self, handle: Any) -> ChunkReader | None:
        """The backend's chunk reader, its chunks CF-decoded when the source decodes them."""
        reader = self._chunk_reader(handle)
        meta = self._meta
        cf = None if meta is None else meta.cf
        return reader if reader is None or cf is None else decoding_reader(reader, cf)

    def _read_planned(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray | None:
        """Read ``key`` through the read planner when the chunk reader fetches in batches.

        Remote stores read this way get the same concurrent, retried, checked fetches as
        batch reads. Returns ``None`` (read some other way) for other readers.
        """
        reader = self._reader_for(handle)
        if reader is None or getattr(reader, "fetch_many", None) is None:
            return None
        return self._read_chunks(reader, key)

    def _read_chunks(self, reader: ChunkReader, key: tuple[ReadItem, ...]) -> np.ndarray:
        """Read ``key`` chunk by chunk through the read planner, as ``read_boxes`` does."""
        return box_reads.read_by_chunks(reader, key, self.dtype)

    def _read_into(self, handle: Any, key: tuple[int | slice, ...], out: np.ndarray) -> None:
        """Write a region into ``out``; backends that can skip the temporary override this."""
        out[...] = self._read(handle, key)

    def box_chunk_keys(self, starts: ArrayLike, size: ArrayLike) -> list[Hashable]:
        """The decoded-chunk cache keys ``read_boxes(starts, size)`` reads, each once.

        Boxes may hang over the edges: the chunks of their part inside the array are
        listed (what a padded read reads, except that a reflected box hanging out by more
        than its inside part also mirrors voxels beyond it, not listed). ``[]`` when the
        store has no chunk reader (a memory map reads nothing through the cache). What a
        read plan (:meth:`mixle.reading.ChunkCache.read_ahead`) is made of.
        """
        handle = self._live()
        reader = self._reader_for(handle) if self.shape else None
        if reader is None:
            return []
        rows = np.asarray(starts, dtype=np.int64).reshape(-1, len(self.shape))
        ext = box_reads.int_list(size, "size")
        token = reader.token
        return [(token, c) for c in touched_chunks(rows, ext, reader.chunks, self.shape)]

    def chunk_keys(self, indices: ArrayLike) -> list[Hashable]:
        """The decoded-chunk cache keys ``get_batch(indices)`` reads (as :meth:`box_chunk_keys`)."""
        shape = self.shape
        if not shape:
            return []
        idx = box_reads.parse_indices(indices, shape[0])
        starts = np.zeros((idx.size, len(shape)), dtype=np.int64)
        starts[:, 0] = idx
        return self.box_chunk_keys(starts, (1, *shape[1:]))

    def get_batch(self, indices: ArrayLike) -> np.ndarray:
        """Rows ``indices`` stacked on axis 0.

        Chunked stores read the rows through the read planner (each chunk the rows touch is
        decoded once, from the shared cache when it is there); others read each contiguous
        run of rows in one call.
        """
        handle = self._live()
        shape = self.shape
        if not shape:
            raise TypeError(f"{self!r} is 0-dimensional and has no records")
        idx = box_reads.parse_indices(indices, shape[0])
        out = np.empty((idx.size, *shape[1:]), dtype=self.dtype)
        if not idx.size or 0 in shape:
            return out
        try:
            return self._get_rows(handle, shape, idx, out)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise

    def _get_rows(
        self, handle: Any, shape: tuple[int, ...], idx: NDArray[np.int64], out: np.ndarray
    ) -> np.ndarray:
        """Fill ``out`` with rows ``idx`` (validated, non-negative) of ``handle``."""
        reader = self._reader_for(handle)
        if reader is not None:
            return box_reads.read_rows_by_chunks(reader, idx, shape, out)
        return box_reads.take_rows(partial(self._read, handle), idx, shape, out)

    def records(self) -> Iterator[np.ndarray]:
        """Yield rows along axis 0 in order, reading a block of rows at a time."""
        n, step = len(self), box_reads.rows_per_block(self.shape, self.chunks, self.dtype)
        for lo in range(0, n, step):
            yield from self[lo : lo + step]

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.records()

    def _raise_if_closed(self, exc: Exception) -> None:
        """Raise :class:`SourceClosedError` from ``exc`` if :meth:`close` ran during the read.

        Closing a source while another thread reads it makes the backend fail in its own
        words (h5py: "identifier is not of specified type"); the reader gets the same
        error as a read started after ``close()``.
        """
        if self._closed and not isinstance(exc, SourceClosedError):
            raise SourceClosedError(
                f"{type(self).__name__}({self._location()}) was closed by another thread "
                f"while this read was in flight ({type(exc).__name__}: {exc}); open it again "
                "to read it"
            ) from exc

    # -- lifetime -----------------------------------------------------------------------
    def __repr__(self) -> str:
        name = type(self).__name__
        if self._closed:
            return f"<{name} {self._location()} (closed)>"
        meta = self._meta
        if meta is None:
            return f"<{name} {self._location()} ({not_opened_note(self._library)})>"
        parts = [self._location(), f"shape={meta.shape}", f"dtype={meta.dtype}"]
        if meta.chunks is not None:
            parts.append(f"chunks={meta.chunks}")
        if meta.shards is not None:
            parts.append(f"shards={meta.shards}")
        if meta.physical is not None:
            parts.append(f"spacing={meta.physical.spacing}")
        if meta.cf is not None:
            parts.append(f"mask_and_scale=True (stored {meta.cf.stored})")
        return f"{name}({', '.join(parts)})"


def _reopen(
    cls: type[ArraySource],
    args: dict[str, Any],
    structure: SampleStructure,
    schema: Schema | None,
) -> ArraySource:
    """Rebuild a pickled source without opening it; it opens on first use."""
    obj = cls.__new__(cls)
    obj._init_state(args, structure, schema)
    return obj
