"""Reading HDF5 datasets without HDF5's global lock.

h5py serialises every call behind one process-wide lock, so threads cannot decode HDF5
chunks in parallel through it. For the common layouts mixle reads the file itself:

- **chunked**, filters among deflate (gzip) and shuffle: :class:`HDF5ChunkReader` looks up
  each chunk's byte range once through HDF5's chunk index (``get_chunk_info_by_coord``,
  a quick call under the lock), then reads the bytes with ``os.pread`` and decodes them
  with ``zlib`` and NumPy in the decode pool, all outside the lock;
- **contiguous**, no filters: :func:`contiguous_memmap` maps the dataset's bytes straight
  from the file.

Stored bytes that do not decode to exactly one chunk raise
:class:`~mixle.reading.CorruptChunkError`. Anything else (other filters such as lzf, szip
or fletcher32, external or virtual storage, in-memory files, files opened for writing) is
read through h5py.
"""

from __future__ import annotations

import os
import threading
import weakref
import zlib
from typing import Any

import numpy as np

from mixle.reading import CorruptChunkError, new_token

__all__ = [
    "FILTER_DEFLATE",
    "FILTER_SHUFFLE",
    "HDF5ChunkReader",
    "contiguous_memmap",
    "decodable_filters",
]

#: HDF5 filter ids mixle decodes itself (``H5Z_FILTER_DEFLATE``, ``H5Z_FILTER_SHUFFLE``).
FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
#: File drivers whose addresses are byte offsets in one ordinary file.
_PLAIN_DRIVERS = ("sec2", "stdio")


def _readable_file(dataset: Any) -> str | None:
    """The file path if mixle may read ``dataset``'s bytes itself, else ``None``."""
    file = dataset.file
    if file.mode != "r" or file.driver not in _PLAIN_DRIVERS:
        return None
    if dataset.dtype.kind not in "biufc" or dataset.is_virtual or dataset.external:
        return None
    return file.filename if os.path.isfile(file.filename) else None


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

    Use :meth:`for_dataset`, which returns ``None`` when the dataset needs h5py.
    """

    def __init__(self, dataset: Any, path: str, filters: list[tuple[int, tuple[int, ...]]]) -> None:
        self._setup(dataset, filters, f"{dataset.name!r} in {path!r}")
        # closed when the reader is garbage: reads still in flight keep it alive, so the
        # descriptor number is never reused under them
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)

    def _setup(self, dataset: Any, filters: list[tuple[int, tuple[int, ...]]], name: str) -> None:
        self.chunks: tuple[int, ...] = tuple(dataset.chunks)
        self.token = new_token()
        self._dsid = dataset.id
        self._dtype = np.dtype(dataset.dtype)
        self._count = int(np.prod(self.chunks, dtype=np.int64))
        self._filters = filters
        self._where: dict[tuple[int, ...], tuple[int, int, int] | None] = {}
        self._lock = threading.Lock()
        self._fill = np.full(self.chunks, dataset.fillvalue, dtype=self._dtype)
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
        where = self._locate(coords)
        if where is None:  # never written: HDF5's fill value
            return self._fill
        offset, size, mask = where
        raw = os.pread(self._fd, size, offset)
        if len(raw) != size:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is truncated: the file holds "
                f"{len(raw)} of its {size} bytes at offset {offset} (file cut short?)"
            )
        return self.decode_stored(coords, raw, mask)

    def decode_stored(self, coords: tuple[int, ...], raw: bytes, mask: int) -> np.ndarray:
        """Undo the filters on a chunk's stored bytes; anything but one whole chunk raises."""
        nbytes = self._count * self._dtype.itemsize
        data: bytes | np.ndarray = raw
        try:
            for i in range(len(self._filters) - 1, -1, -1):
                if mask & (1 << i):
                    continue  # HDF5 skipped this filter for this chunk
                code, values = self._filters[i]
                if code == FILTER_DEFLATE:
                    packed = data if isinstance(data, bytes) else data.tobytes()
                    inflate = zlib.decompressobj()
                    data = inflate.decompress(packed, nbytes + 1)
                    if not inflate.eof:
                        raise ValueError("the deflate stream ends early")
                else:
                    data = _unshuffle(data, values[0] if values else self._dtype.itemsize)
            got = len(data) if isinstance(data, bytes) else data.nbytes
            if got != nbytes:
                raise ValueError(f"decoded {got} bytes, a chunk has {nbytes}")
        except (ValueError, zlib.error) as exc:
            raise CorruptChunkError(
                f"chunk {coords} of HDF5 dataset {self._name} is corrupt ({len(raw)} stored "
                f"bytes: {exc})"
            ) from None
        return np.frombuffer(data, dtype=self._dtype, count=self._count).reshape(self.chunks)


def decodable_filters(dataset: Any) -> list[tuple[int, tuple[int, ...]]] | None:
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


def _unshuffle(data: bytes | np.ndarray, itemsize: int) -> np.ndarray:
    """Undo HDF5's shuffle filter: byte ``k`` of every element was stored together."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        return raw
    whole = raw.size // itemsize * itemsize
    out = np.empty_like(raw)
    out[:whole].reshape(-1, itemsize)[...] = raw[:whole].reshape(itemsize, -1).T
    out[whole:] = raw[whole:]  # a trailing partial element is stored unshuffled
    return out
