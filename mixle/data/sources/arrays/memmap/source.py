"""Raw binary volumes and ``.npy`` files, memory-mapped and never loaded whole."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.memmap.check import check_mapped_file, file_identity
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.reading import read_strided
from mixle.utils.files import open_regular_file, require_regular_file

__all__ = ["NPY_HEADER_LIMIT", "MemmapArraySource", "NpyArraySource", "parse_memmap_mode"]

#: The most bytes of ``.npy`` header mixle reads: NumPy's own ``max_header_size`` (10,000
#: characters, which ``np.load`` checks too) at up to 4 bytes each (UTF-8, format 3).
NPY_HEADER_LIMIT = 4 * 10_000

_MODE_ALIASES = {
    "r": "r",
    "readonly": "r",
    "r+": "r+",
    "readwrite": "r+",
    "c": "c",
    "copyonwrite": "c",
}
_NPY_MAGIC = b"\x93NUMPY"
#: The largest extent (and element count) NumPy's ``intp`` indexing can address.
_MAX_EXTENT = 2**63 - 1
#: Bytes of the header length field per ``.npy`` format version.
_NPY_LENGTH_BYTES = {1: 2, 2: 4, 3: 4}


def parse_memmap_mode(mode: object) -> str:
    """Validate a memmap ``mode``; modes that would create or truncate a file are refused."""
    if mode in ("w+", "write"):
        raise ValueError(
            f"mode={mode!r} would truncate the file; use 'r' (read-only, the default), "
            "'r+' (read-write) or 'c' (copy-on-write, changes stay in memory)"
        )
    if mode not in _MODE_ALIASES:
        raise ValueError(f"mode={mode!r} is not one of 'r', 'r+', 'c'")
    return _MODE_ALIASES[str(mode)]


def _parse_shape(shape: object) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    if not isinstance(dims, Sequence) or isinstance(dims, str):
        raise TypeError(f"shape={shape!r} must be an int or a sequence of ints")
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ValueError(f"shape={shape!r} must hold non-negative ints")
        if d > _MAX_EXTENT:
            raise ValueError(
                f"shape={shape!r} has an extent past 2**63 - 1, more than NumPy indexes"
            )
        out.append(int(d))
    if math.prod(out) > _MAX_EXTENT:
        raise ValueError(
            f"shape={shape!r} holds {math.prod(out):,} elements, more than NumPy can address"
        )
    return tuple(out)


def _check_path(path: object) -> str:
    """``path`` as a str, refused unless a regular file (a FIFO or device: SpecialFileError)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a path to a file")
    path = os.fspath(path)
    try:
        require_regular_file(path, "path")
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"path={path!r}: no such file") from None
    return path


def _check_npy_header(path: str) -> None:
    """Refuse a file that is not ``.npy``, or whose header is longer than NumPy allows.

    Reads the magic string, the version and the header length only (at most 12 bytes), so a
    header claiming gigabytes costs nothing.
    """
    with open_regular_file(path, "path") as fh:
        head = fh.read(len(_NPY_MAGIC) + 2 + 4)
    if head[: len(_NPY_MAGIC)] != _NPY_MAGIC:
        raise ValueError(f"path={path!r} is not a .npy file (no NUMPY magic header)")
    major = head[len(_NPY_MAGIC)] if len(head) > len(_NPY_MAGIC) else None
    width = _NPY_LENGTH_BYTES.get(major) if major is not None else None
    start = len(_NPY_MAGIC) + 2
    if width is None or len(head) < start + width:
        raise ValueError(f"path={path!r} is not a .npy file NumPy reads (format version {major})")
    length = int.from_bytes(head[start : start + width], "little")
    if length > NPY_HEADER_LIMIT:
        raise ValueError(
            f"path={path!r}: its .npy header claims {length:,} bytes, more than the "
            f"{NPY_HEADER_LIMIT:,} NumPy allows (max_header_size): it is not a .npy file "
            "mixle maps"
        )


class MemmapArraySource(ArraySource):
    """A raw binary volume (no header), memory-mapped read-only by default.

    Every read first checks that the file still holds the mapped bytes and is the same
    file: a file truncated or replaced while open raises
    :class:`~mixle.data.sources.arrays.memmap.check.FileChangedError` rather than crashing.

    Parameters
    ----------
    path
        Path of the raw file.
    dtype, shape
        Element type and shape of the volume; ``offset + prod(shape) * itemsize`` must be
        exactly the file size.
    mode
        ``"r"`` (default), ``"r+"`` or ``"c"`` (copy-on-write). ``"w+"`` is refused: it
        would truncate the file.
    offset
        Bytes to skip at the start of the file (a header).
    order
        ``"C"`` (row-major, default) or ``"F"`` (column-major).
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file size disagrees with ``offset``, ``shape`` and ``dtype``, or for a bad
        ``mode`` or ``order``.
    """

    _mapped_file: tuple[tuple[int, int], int] | None = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        dtype: DTypeLike,
        shape: int | Sequence[int],
        *,
        mode: str = "r",
        offset: int = 0,
        order: str = "C",
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        self._init_state(_memmap_args(path, dtype, shape, mode, offset, order), structure, schema)
        self._live()

    @classmethod
    def from_memmap(
        cls,
        mm: np.memmap,
        *,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> MemmapArraySource:
        """Wrap an ``np.memmap`` that maps a whole file region; pickling reopens it read-only.

        The region may end before the file does (a trailer after the array); the copy
        reopens the same region.
        """
        order = "F" if mm.flags.f_contiguous and not mm.flags.c_contiguous else "C"
        args = _memmap_args(mm.filename, mm.dtype, mm.shape, "r", mm.offset, order)
        if os.path.getsize(args["path"]) != mm.offset + mm.nbytes:
            args["exact_size"] = False  # the size check on reopening allows the trailer
        obj = cls.__new__(cls)
        obj._init_state(args, structure, schema)
        obj._adopt(mm)
        return obj

    def _location(self) -> str:
        assert self._args is not None
        return repr(self._args["path"])

    def _open(self) -> Any:
        a = self._args
        assert a is not None
        path = _check_path(a["path"])
        dtype, shape, offset = a["dtype"], a["shape"], a["offset"]
        expected = offset + math.prod(shape) * dtype.itemsize  # Python ints: no wrap-around
        actual = os.path.getsize(path)
        if actual < expected or (actual != expected and a.get("exact_size", True)):
            raise ValueError(
                f"path={path!r} has {actual} bytes but offset={offset} + shape={shape} x "
                f"{dtype} ({dtype.itemsize} bytes each) needs {expected}; check dtype, "
                "shape and offset"
            )
        if expected == offset:  # nothing to map: an empty, read-only array
            empty = np.empty(shape, dtype=dtype, order=a["order"])
            empty.flags.writeable = False
            return empty
        return np.memmap(
            path, dtype=dtype, mode=a["mode"], offset=offset, shape=shape, order=a["order"]
        )

    def _describe(self, handle: Any) -> ArrayMeta:
        if isinstance(handle, np.memmap) and self._args is not None:
            self._mapped_file = (file_identity(self._args["path"]), handle.offset + handle.nbytes)
        return ArrayMeta(shape=tuple(handle.shape), dtype=handle.dtype)

    def _check(self, handle: Any) -> None:
        """Refuse to read a map whose file was truncated or replaced (SIGBUS otherwise)."""
        mapped = self._mapped_file
        if mapped is not None and isinstance(handle, np.memmap) and self._args is not None:
            check_mapped_file(self._args["path"], mapped[1], mapped[0])

    def _read(self, handle: Any, key: tuple[int | slice, ...]) -> np.ndarray:
        self._check(handle)
        return np.array(handle[key], copy=True, subok=False)

    def _read_into(self, handle: Any, key: tuple[int | slice, ...], out: np.ndarray) -> None:
        self._check(handle)
        out[...] = handle[key]  # one copy, from the page cache into the output

    def _read_boxes_into(
        self, handle: Any, starts: list[list[int]], size: list[int], out: np.ndarray
    ) -> None:
        self._check(handle)
        read_strided(handle.view(np.ndarray), starts, size, out)  # in file order


class NpyArraySource(MemmapArraySource):
    """A ``.npy`` file, memory-mapped; dtype, shape and order come from its header.

    Parameters
    ----------
    path
        Path of the ``.npy`` file.
    mode
        ``"r"`` (default), ``"r+"`` or ``"c"``; ``"w+"`` is refused.
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a ``.npy`` file or holds Python objects (cannot be mapped).
    """

    def __init__(  # type: ignore[override]
        self,
        path: str | os.PathLike[str],
        *,
        mode: str = "r",
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path={path!r} must be a path to a .npy file")
        args = {"path": os.fspath(path), "mode": parse_memmap_mode(mode)}
        self._init_state(args, structure, schema)
        self._live()

    def _open(self) -> Any:
        assert self._args is not None
        path = _check_path(self._args["path"])
        _check_npy_header(path)
        try:
            return np.load(path, mmap_mode=self._args["mode"], allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"path={path!r} cannot be memory-mapped: {exc}") from exc


def _memmap_args(
    path: Any, dtype: Any, shape: Any, mode: Any, offset: Any, order: Any
) -> dict[str, Any]:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a path to a file")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"dtype={dt} holds Python objects and cannot be memory-mapped")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset={offset!r} must be a non-negative int")
    if order not in ("C", "F"):
        raise ValueError(f"order={order!r} must be 'C' or 'F'")
    return {
        "path": os.fspath(path),
        "dtype": dt,
        "shape": _parse_shape(shape),
        "mode": parse_memmap_mode(mode),
        "offset": int(offset),
        "order": order,
    }
