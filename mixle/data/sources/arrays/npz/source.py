"""Arrays inside ``.npz`` files, memory-mapped in place (or from a one-time decompressed copy)."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta
from mixle.data.sources.arrays.memmap.check import check_mapped_file, file_identity
from mixle.data.sources.arrays.memmap.source import MemmapArraySource
from mixle.data.sources.arrays.npz.cache import decompressed_member
from mixle.data.sources.arrays.npz.members import (
    NpyLayout,
    NpzMember,
    find_member,
    list_members,
    member_data_start,
    read_npy_layout,
)
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.utils.files import open_regular_file, require_regular_file

__all__ = ["NpzArraySource", "read_npz"]


class NpzArraySource(MemmapArraySource):
    """One array of a ``.npz`` file, memory-mapped read-only where it lies in the zip.

    Parameters
    ----------
    path
        Path of the ``.npz`` file (``np.savez``, ``np.savez_compressed``, or any zip of
        ``.npy`` files).
    name
        The array to read, as ``np.load(path).files`` lists it (``"x"``; ``"x.npy"`` works
        too), found as ``np.load(path)[name]`` finds it: a member named exactly ``name``
        first, else ``name + ".npy"``; of entries sharing a name (a zip updated with
        ``zipfile``'s append mode), the last. ``None`` reads the only array of a file that
        holds one.
    decompress
        A compressed member (``np.savez_compressed``) cannot be mapped: with ``True`` it is
        decompressed once into mixle's cache folder (``$MIXLE_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/mixle`` or ``~/.cache/mixle``, sub-folder ``npz``) and that copy
        is mapped; later opens of the same content reuse it. Default ``False``: refused.
        Stored members are mapped in place either way.
    structure, schema
        See :mod:`mixle.data.structure` and :class:`mixle.data.schema.Schema`.

    Raises
    ------
    TypeError
        When ``path`` is not a path, ``name`` not a str, or ``decompress`` not a bool.
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a zip archive or is cut short; when ``name`` is ``None`` and
        the file holds several arrays (they are listed); when the member is compressed and
        ``decompress`` is ``False`` (the message says both ways out); when the member is
        not a ``.npy`` array or holds Python objects (``allow_pickle`` data).
    ~mixle.errors.ArrayNotFoundError
        When no array has that ``name`` (the arrays are listed).
    ~mixle.reading.CorruptChunkError
        With ``decompress=True``, when the member does not decompress or fails its CRC-32.

    Notes
    -----
    An uncompressed member is mapped as it lies, without reading it: its CRC-32 is not
    checked (that would read the whole member at every open), so damaged bytes of a stored
    member read as they are, as from a ``.npy`` file. Reads check that the mapped file was
    not cut short or replaced (:class:`~mixle.errors.FileChangedError`). Finding the
    cache file of a compressed member hashes its stored bytes (one read of the compressed
    member per open).
    """

    _target: str | None = None
    _member: str | None = None

    def __init__(  # type: ignore[override]
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        decompress: bool = False,
        structure: SampleStructure = EXCHANGEABLE,
        schema: Schema | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path={path!r} must be a path to a .npz file")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name={name!r} must be a str (an array in the .npz file) or None")
        if not isinstance(decompress, bool):
            raise TypeError(f"decompress={decompress!r} must be True or False")
        args = {"path": os.fspath(path), "name": name, "decompress": decompress, "mode": "r"}
        self._init_state(args, structure, schema)
        self._live()

    @property
    def member(self) -> str | None:
        """The array's name in the file (as ``np.load`` lists it), once opened."""
        return self._member

    @property
    def mapped_path(self) -> str | None:
        """The file the array is mapped from: the ``.npz`` itself, or its cache file."""
        return self._target

    def _location(self) -> str:
        assert self._args is not None
        path = repr(self._args["path"])
        member = self._member or self._args["name"]
        return path if member is None else f"{path} member {member!r}"

    def _open(self) -> Any:
        a = self._args
        assert a is not None
        path = a["path"]
        try:
            require_regular_file(path, "path")
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"path={path!r}: no such file") from None
        member = find_member(list_members(path), a["name"], path)
        what = f"member {member.shown!r} of {path!r}"
        with open_regular_file(path, "path") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = member_data_start(fh, member, path, size)
            if member.flag_bits & 0x1:
                raise ValueError(f"{what} is encrypted: mixle reads unencrypted .npz files")
            if member.compress_type != 0:
                target, layout = self._decompressed(path, fh, member, start, a["decompress"])
            else:
                target = path
                layout = read_npy_layout(fh, start, member.compress_size, what)
        self._member = member.shown
        return self._map(target, layout)

    def _decompressed(
        self, path: str, fh: Any, member: NpzMember, start: int, decompress: bool
    ) -> tuple[str, NpyLayout]:
        if not decompress:
            raise ValueError(
                f"member {member.shown!r} of {path!r} is compressed ({member.method}, as "
                "np.savez_compressed writes), so it cannot be memory-mapped: pass "
                "decompress=True to decompress it once into mixle's cache folder and map "
                "that, or re-save the file uncompressed with np.savez"
            )
        target = str(decompressed_member(path, fh, member, start))
        with open_regular_file(target, "cache file") as cached:
            length = os.fstat(cached.fileno()).st_size
            what = f"the decompressed copy {target!r} of member {member.shown!r} of {path!r}"
            return target, read_npy_layout(cached, 0, length, what)

    def _map(self, target: str, layout: NpyLayout) -> Any:
        order = "F" if layout.fortran_order else "C"
        nbytes = math.prod(layout.shape) * layout.dtype.itemsize
        self._target = target
        if nbytes == 0:  # nothing to map: an empty, read-only array
            empty = np.empty(layout.shape, dtype=layout.dtype, order=order)
            empty.flags.writeable = False
            self._mapped_file = None
            return empty
        self._mapped_file = (file_identity(target), layout.data_offset + nbytes)
        return np.memmap(
            target,
            dtype=layout.dtype,
            mode="r",
            offset=layout.data_offset,
            shape=layout.shape,
            order=order,
        )

    def _describe(self, handle: Any) -> ArrayMeta:
        return ArrayMeta(shape=tuple(handle.shape), dtype=handle.dtype)

    def _check(self, handle: Any) -> None:
        mapped, target = self._mapped_file, self._target
        if mapped is not None and target is not None and isinstance(handle, np.memmap):
            check_mapped_file(target, mapped[1], mapped[0])


def read_npz(
    path: str | os.PathLike[str],
    name: str | None = None,
    *,
    decompress: bool = False,
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> NpzArraySource:
    """Open one array of a ``.npz`` file lazily (see :class:`NpzArraySource`).

    Examples
    --------
    >>> src = read_npz("volumes.npz", "image")  # doctest: +SKIP
    >>> src.read_boxes([[0, 0, 0]], (32, 32, 32)).shape  # doctest: +SKIP
    (1, 32, 32, 32)
    """
    return NpzArraySource(path, name, decompress=decompress, structure=structure, schema=schema)
