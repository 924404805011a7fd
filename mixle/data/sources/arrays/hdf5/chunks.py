"""Reading HDF5 datasets without HDF5's global lock.

h5py serialises every call behind one process-wide lock, so threads cannot decode HDF5
chunks in parallel through it. For the common layouts mixle reads the file itself:

- **chunked**, filters among deflate (gzip) and shuffle: :class:`HDF5ChunkReader` looks up
  each chunk's byte range once through HDF5's chunk index (``get_chunk_info_by_coord``,
  a quick call under the lock), then reads the bytes with ``os.pread`` and decodes them
  with ``zlib`` and NumPy in the decode pool, all outside the lock;
- **contiguous**, no filters: :func:`contiguous_memmap` maps the dataset's bytes straight
  from the file.

Both read only datasets whose stored elements are, bit for bit, the bytes of their NumPy
dtype (:func:`stores_numpy_bits`), and a chunk never written reads as what h5py gives for
it (:func:`unwritten_chunk_value`). Stored bytes that do not decode to exactly one chunk
raise :class:`~mixle.reading.CorruptChunkError`. Anything else (HDF5 types NumPy has no exact
match for, such as 12-bit integers or integers at a bit offset; other filters such as lzf,
szip or fletcher32; an undefined fill value; external or virtual storage; in-memory files;
files opened for writing) is read through h5py, which converts exactly as HDF5 does.

A dataset whose filters HDF5 cannot load here (:func:`require_filters`) is refused when it
is opened: h5py's own reads of it would fail, chunk after chunk, with HDF5's "can't open
directory" message. When ``hdf5plugin`` is installed it is imported (once) to register its
filters first.
"""

from __future__ import annotations

import importlib
import os
import threading
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from mixle.errors import FilterUnavailableError
from mixle.reading import CorruptChunkError, new_token
from mixle.utils.files import thread_read_buffer
from mixle.utils.optional_deps import require

__all__ = [
    "FILTER_DEFLATE",
    "FILTER_NAMES",
    "FILTER_SHUFFLE",
    "HDF5ChunkReader",
    "chunk_filters",
    "contiguous_memmap",
    "decodable_filters",
    "missing_filters",
    "require_filters",
    "stores_numpy_bits",
    "unwritten_chunk_value",
]

#: HDF5 filter ids mixle decodes itself (``H5Z_FILTER_DEFLATE``, ``H5Z_FILTER_SHUFFLE``).
FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
#: Names of HDF5 filter ids, built in and registered with the HDF Group, for error messages.
FILTER_NAMES: dict[int, str] = {
    1: "deflate",
    2: "shuffle",
    3: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    307: "bzip2",
    32000: "lzf",
    32001: "blosc",
    32003: "snappy",
    32004: "lz4",
    32008: "bitshuffle",
    32013: "zfp",
    32014: "fpzip",
    32015: "zstd",
    32017: "sz",
    32018: "fcidecomp",
    32024: "sz3",
    32026: "blosc2",
    32028: "sperr",
    32033: "htj2k",
}
#: File drivers whose addresses are byte offsets in one ordinary file.
_PLAIN_DRIVERS = ("sec2", "stdio")


def _readable_file(dataset: Any) -> str | None:
    """The file path if mixle may read ``dataset``'s bytes itself, else ``None``."""
    file = dataset.file
    if file.mode != "r" or file.driver not in _PLAIN_DRIVERS:
        return None
    if dataset.is_virtual or dataset.external or not stores_numpy_bits(dataset):
        return None
    return file.filename if os.path.isfile(file.filename) else None


def stores_numpy_bits(dataset: Any) -> bool:
    """Whether every stored element of ``dataset`` is, bit for bit, its NumPy dtype's bytes.

    Compares the stored HDF5 datatype with the standard HDF5 type of the NumPy dtype
    (``H5Tequal``: size, byte order, precision, bit offset, sign, padding, float fields and
    exponent bias, enum members). h5py reads other types through HDF5's conversion: an
    integer of 12 bits in 16, or one at a bit offset, reads as ``int16`` values that are
    not its stored bits.
    """
    dtype = np.dtype(dataset.dtype)
    if dtype.kind not in "biufc":
        return False
    h5t = _h5py().h5t
    try:
        standard = h5t.py_create(dtype, logical=True)
    except (TypeError, ValueError):  # no HDF5 type for it: let h5py decide
        return False
    return bool(dataset.id.get_type() == standard)


def unwritten_chunk_value(dataset: Any) -> Any:
    """The value h5py reads for every element of a chunk that was never written, or ``None``.

    HDF5 writes the fill value into the read buffer unless the fill time is
    ``FILL_TIME_NEVER``; then it leaves the buffer alone and h5py (which reads into zeroed
    memory since h5py 3.7) gives 0. ``None`` means the fill value is undefined: HDF5 then
    either leaves the buffer alone or refuses the read, so such datasets are read through
    h5py.
    """
    h5d = _h5py().h5d
    dcpl = dataset.id.get_create_plist()
    if dcpl.fill_value_defined() == h5d.FILL_VALUE_UNDEFINED:
        return None
    if dcpl.get_fill_time() == h5d.FILL_TIME_NEVER:
        return 0
    return dataset.fillvalue


def _stored_type(tid: Any) -> str:
    """A stored HDF5 atomic type in words: ``"12-bit values at bit offset 4 in 2 bytes"``."""
    if hasattr(tid, "get_precision"):
        return (
            f"{tid.get_precision()}-bit values at bit offset {tid.get_offset()} in "
            f"{tid.get_size()} bytes"
        )
    return f"{type(tid).__name__} values of {tid.get_size()} bytes"


def _h5py() -> Any:
    return require("h5py", "hdf5", feature="HDF5 chunk reading")


def contiguous_memmap(dataset: Any) -> np.memmap | None:
    """A read-only memmap of a contiguous, unfiltered dataset, or ``None`` if it is not one."""
    path = _readable_file(dataset)
    if path is None or dataset.chunks is not None or dataset.compression is not None:
        return None
    if dataset.size == 0:
        return None
    # never written: no storage allocated. Check the storage size, not only the offset:
    # with a user block HDF5 reports "undefined address + user block size" as the offset
    if dataset.id.get_storage_size() != dataset.nbytes:
        return None
    offset = dataset.id.get_offset()
    if offset is None:
        return None
    return np.memmap(path, dtype=dataset.dtype, mode="r", offset=offset, shape=dataset.shape)


class HDF5ChunkReader:
    """Whole chunks of a chunked HDF5 dataset, read with ``pread`` and decoded in Python.

    Use :meth:`for_dataset`, which returns ``None`` when the dataset needs h5py. The read
    planner reads a chunk with :meth:`read_stored` and decodes it into a buffer of its own
    with :meth:`decode_into` (:class:`~mixle.reading.executor.SupportsDecodeInto`).

    Attributes
    ----------
    decoded_nbytes
        Bytes of one decoded chunk (the remote subclass, whose stored bytes come from
        ``fetch_many``, decodes into the planner's buffers with its own ``decode_into``).
    """

    decoded_nbytes: int

    def __init__(self, dataset: Any, path: str, filters: list[tuple[int, tuple[int, ...]]]) -> None:
        self._setup(dataset, filters, f"{dataset.name!r} in {path!r}")
        self.decoded_nbytes = self._count * self._dtype.itemsize
        # closed when the reader is garbage: reads still in flight keep it alive, so the
        # descriptor number is never reused under them
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)

    def _setup(self, dataset: Any, filters: list[tuple[int, tuple[int, ...]]], name: str) -> None:
        """Prepare to decode chunks of ``dataset``; refuse one whose bytes need h5py.

        Raises
        ------
        TypeError
            When the stored datatype is not bit for bit the NumPy dtype
            (:func:`stores_numpy_bits`).
        ValueError
            When the fill value is undefined (:func:`unwritten_chunk_value`).
        """
        if not stores_numpy_bits(dataset):
            raise TypeError(
                f"HDF5 dataset {name} stores {_stored_type(dataset.id.get_type())}, which "
                f"are not the bytes of NumPy {dataset.dtype}: read it through h5py"
            )
        fill = unwritten_chunk_value(dataset)
        if fill is None:
            raise ValueError(
                f"HDF5 dataset {name} has an undefined fill value, so what its unwritten "
                "chunks read as is up to HDF5: read it through h5py"
            )
        self.chunks: tuple[int, ...] = tuple(dataset.chunks)
        self.token = new_token()
        self._dsid = dataset.id
        self._dtype = np.dtype(dataset.dtype)
        self._count = int(np.prod(self.chunks, dtype=np.int64))
        self._filters = filters
        self._where: dict[tuple[int, ...], tuple[int, int, int] | None] = {}
        self._lock = threading.Lock()
        self._fill = np.full(self.chunks, fill, dtype=self._dtype)
        self._fill.flags.writeable = False
        self._name = name

    @classmethod
    def for_dataset(cls, dataset: Any) -> HDF5ChunkReader | None:
        """A reader for ``dataset`` if every filter on it is one mixle decodes, else ``None``."""
        path = _readable_file(dataset)
        if path is None or dataset.chunks is None or not hasattr(os, "pread"):
            return None
        filters = decodable_filters(dataset)
        return None if filters is None else cls(dataset, path, filters)

    def _locate(self, coords: tuple[int, ...]) -> tuple[int, int, int] | None:
        where = self._where.get(coords, ())
        if where != ():
            return where  # type: ignore[return-value]
        offset = tuple(c * n for c, n in zip(coords, self.chunks))
        with self._lock:  # h5py takes its own global lock inside; this one guards the dict
            info = self._dsid.get_chunk_info_by_coord(offset)
        found = (
            None if info.byte_offset is None else (info.byte_offset, info.size, info.filter_mask)
        )
        self._where[coords] = found
        return found

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        stored = self._read(coords, reuse=False)
        if stored is None:  # never written: what h5py reads there
            return self._fill
        return self.decode_stored(coords, *stored)

    def read_stored(self, coords: tuple[int, ...]) -> tuple[bytes | memoryview, int] | None:
        """Chunk ``coords``'s stored bytes and filter mask, for :meth:`decode_into`.

        ``None`` for a chunk never written. The bytes are in this thread's reusable buffer:
        valid until this thread's next :meth:`read_stored`.
        """
        return self._read(coords, reuse=True)

    def _read(
        self, coords: tuple[int, ...], *, reuse: bool
    ) -> tuple[bytes | memoryview, int] | None:
        where = self._locate(coords)
        if where is None:
            return None
        offset, size, mask = where
        raw = _pread_reused(self._fd, size, offset) if reuse else os.pread(self._fd, size, offset)
        if len(raw) != size:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is truncated: the file holds "
                f"{len(raw)} of its {size} bytes at offset {offset} (file cut short?)"
            )
        return raw, mask

    def decode_into(
        self, coords: tuple[int, ...], raw: tuple[Any, int] | None, out: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """Chunk ``coords`` from :meth:`read_stored`'s ``raw``, in the buffer ``out()`` gives.

        ``out()`` gives a writable ``uint8`` buffer of :attr:`decoded_nbytes`; it is asked
        for once the stored bytes decoded to exactly one chunk. A chunk never
        written is the fill chunk; any other is written into ``out`` (unshuffled straight
        there; inflated last, or stored without filters, copied there). The chunk never
        views ``raw``, which the caller may reuse at once.
        """
        if raw is None:
            return self._fill
        stored, mask = raw
        return self._undo_filters(coords, stored, mask, out)

    def decode_stored(self, coords: tuple[int, ...], raw: bytes, mask: int) -> np.ndarray:
        """Undo the filters on a chunk's stored bytes; anything but one whole chunk raises.

        A chunk stored without filters views ``raw``.
        """
        return self._undo_filters(coords, raw, mask, None)

    def _undo_filters(
        self, coords: tuple[int, ...], raw: Any, mask: int, out: Callable[[], np.ndarray] | None
    ) -> np.ndarray:
        """Undo the filters on ``raw``; the last writes into ``out()`` (if given) where it can.

        With ``out`` the chunk is always in ``out()``'s buffer (asked for once), never a
        view of ``raw``: one stored without filters (or with every filter skipped), or
        inflated last, is copied there.
        """
        nbytes = self._count * self._dtype.itemsize
        # HDF5 applied filter 0 first; a set bit of the mask: HDF5 skipped it for this chunk
        stages = [i for i in range(len(self._filters) - 1, -1, -1) if not mask & (1 << i)]
        data: Any = raw
        dest: np.ndarray | None = None  # out()'s buffer, once asked for
        try:
            for n, i in enumerate(stages):
                code, values = self._filters[i]
                if code == FILTER_DEFLATE:
                    inflate = zlib.decompressobj()
                    data = inflate.decompress(data, nbytes + 1)
                    if len(data) > nbytes:  # before eof: a bomb never reaches its end
                        raise ValueError(f"the deflate stream inflates past {nbytes} bytes")
                    if not inflate.eof:
                        raise ValueError("the deflate stream ends early")
                else:
                    into = None
                    if out is not None and n == len(stages) - 1:
                        _check_decoded(data, nbytes)  # shuffling keeps the size
                        into = dest = out()
                    data = _unshuffle(data, values[0] if values else self._dtype.itemsize, into)
            _check_decoded(data, nbytes)
        except (ValueError, zlib.error) as exc:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is corrupt ({len(raw)} stored "
                f"bytes: {exc})"
            ) from None
        if out is not None and (dest is None or data is not dest):
            # stored as is (never view raw), or inflated last: a copy into out costs about
            # what keeping zlib's bytes would (the cache copies a chunk it keeps into pages)
            if dest is None:
                dest = out()
            dest[...] = np.frombuffer(data, dtype=np.uint8, count=nbytes)
            data = dest
        if dest is not None and data is dest:
            return dest.view(self._dtype).reshape(self.chunks)
        return np.frombuffer(data, dtype=self._dtype, count=self._count).reshape(self.chunks)


def _check_decoded(data: Any, nbytes: int) -> None:
    got = memoryview(data).nbytes
    if got != nbytes:
        raise ValueError(f"decoded {got} bytes, a chunk has {nbytes}")


def _pread_reused(fd: int, size: int, offset: int) -> bytes | memoryview:
    """Up to ``size`` bytes of ``fd`` at ``offset``, in this thread's reusable buffer.

    Valid until this thread's next call. Without ``os.preadv``: a fresh ``os.pread``.
    """
    if not hasattr(os, "preadv"):
        return os.pread(fd, size, offset)
    view = thread_read_buffer(size)
    got = 0
    while got < size:  # a short read before the end of the file: read on
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return view[:got]


def decodable_filters(dataset: Any) -> list[tuple[int, tuple[int, ...]]] | None:
    """``(filter id, values)`` of a chunked dataset if mixle decodes its chunks, else ``None``.

    ``None`` unless every filter is one mixle decodes (:func:`chunk_filters`), the stored
    elements are the bytes of the NumPy dtype (:func:`stores_numpy_bits`) and the fill value
    is defined (:func:`unwritten_chunk_value`). Every chunk reader is gated on this.
    """
    filters = chunk_filters(dataset)
    if filters is None or not stores_numpy_bits(dataset):
        return None
    return None if unwritten_chunk_value(dataset) is None else filters


def chunk_filters(dataset: Any) -> list[tuple[int, tuple[int, ...]]] | None:
    """``(filter id, values)`` of a chunked dataset if mixle decodes them all, else ``None``."""
    if dataset.chunks is None or dataset.dtype.kind not in "biufc":
        return None
    if dataset.is_virtual or dataset.external:
        return None
    dcpl = dataset.id.get_create_plist()
    filters = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, values, _name = dcpl.get_filter(i)
        if code not in (FILTER_DEFLATE, FILTER_SHUFFLE):
            return None
        filters.append((int(code), tuple(int(v) for v in values)))
    return filters


def missing_filters(dataset: Any) -> list[tuple[int, str]]:
    """``(filter id, name)`` of each filter HDF5 cannot load here that ``dataset`` needs.

    ``h5z.filter_avail`` also looks in ``HDF5_PLUGIN_PATH``, so a plugin found there counts
    as available. A filter is needed when a stored chunk went through it: an optional
    filter skipped on every chunk (h5py's ``allow_unknown_filter=True``) reads without it.
    The name comes from :data:`FILTER_NAMES`, else from the file.
    """
    if dataset.chunks is None:
        return []  # filters need chunked storage
    h5z = _h5py().h5z
    dcpl = dataset.id.get_create_plist()
    missing = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, _values, stored = dcpl.get_filter(i)
        if not h5z.filter_avail(code) and _filter_applied(dataset.id, i):
            name = FILTER_NAMES.get(int(code)) or _stored_name(stored)
            missing.append((int(code), name))
    return missing


def _filter_applied(dsid: Any, index: int) -> bool:
    """Whether some stored chunk went through filter ``index``; stops at the first such."""
    bit = 1 << index
    if hasattr(dsid, "chunk_iter"):  # h5py >= 3.8: one walk of the chunk index
        return dsid.chunk_iter(lambda info: None if info.filter_mask & bit else True) is True
    return any(not dsid.get_chunk_info(k).filter_mask & bit for k in range(dsid.get_num_chunks()))


def _stored_name(stored: bytes) -> str:
    """A filter name as written in the file, shortened (a hostile file may write anything)."""
    text = stored.decode("utf-8", "replace").split(";")[0].strip()
    text = "".join(c if c.isprintable() else "?" for c in text)
    return (text[:60] + "...") if len(text) > 60 else (text or "an unregistered filter")


def require_filters(dataset: Any, where: str) -> None:
    """Make sure HDF5 can apply every filter of ``dataset``, importing ``hdf5plugin`` if needed.

    ``where`` names the dataset and its file in the message.

    Raises
    ------
    FilterUnavailableError
        When a filter is still unavailable: the message names each filter (id and name)
        and how to get it (the ``hdf5plugin`` extra, or ``HDF5_PLUGIN_PATH``).
    """
    missing = missing_filters(dataset)
    if not missing:
        return
    try:  # registers its filters with HDF5; Python imports it once per process
        plugin: Any = importlib.import_module("hdf5plugin")
    except ImportError:
        plugin = None
    else:
        missing = missing_filters(dataset)
        if not missing:
            return
    needs = ", ".join(f"{code} ({name})" for code, name in missing)
    if plugin is None:
        fix = (
            'pip install -e ".[hdf5plugin]" in a clone of the mixle repository (it installs '
            "the hdf5plugin package, which mixle then loads by itself), or set HDF5_PLUGIN_PATH "
            "to a folder holding the plugin before starting Python"
        )
    else:
        fix = (
            f"hdf5plugin {getattr(plugin, 'version', '')} is loaded but does not provide it: "
            "install the filter's HDF5 plugin and set HDF5_PLUGIN_PATH to its folder before "
            "starting Python"
        )
    raise FilterUnavailableError(
        f"HDF5 dataset {where} is stored with the filter{'s' if len(missing) > 1 else ''} "
        f"{needs}, which HDF5 cannot load here, so its chunks cannot be read: {fix}"
    )


def _unshuffle(data: Any, itemsize: int, out: np.ndarray | None = None) -> np.ndarray:
    """Undo HDF5's shuffle filter: byte ``k`` of every element was stored together.

    Written into ``out`` (a ``uint8`` buffer of the same size) when given, which is then
    returned; without it the result is a new array, or a view of ``data`` for 1-byte items.
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        if out is None:
            return raw
        out[...] = raw
        return out
    whole = raw.size // itemsize * itemsize
    if out is None:
        out = np.empty_like(raw)
    elements, planes = out[:whole].reshape(-1, itemsize), raw[:whole].reshape(itemsize, -1)
    if itemsize <= 32:
        # one strided copy per byte of an element: 3x faster than one copy of the transpose
        # for 4-byte items (NumPy walks a transpose's short inner axis element by element)
        for k in range(itemsize):
            elements[:, k] = planes[k]
    else:  # the element size is the file's word: never a Python loop as long as a chunk
        elements[...] = planes.T
    out[whole:] = raw[whole:]  # a trailing partial element is stored unshuffled
    return out
