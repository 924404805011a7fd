"""Find the arrays inside a ``.npz`` file: its zip directory, local headers and ``.npy`` headers.

The zip's central directory (ZIP64 too) is read with :mod:`zipfile`; each member's local
header is read for where its bytes start; an uncompressed (``ZIP_STORED``) member's ``.npy``
header is parsed with NumPy's own reader, within the bounds the ``.npy`` memmap source
keeps (:data:`~mixle.data.sources.arrays.memmap.source.NPY_HEADER_LIMIT`), so its array can
be memory-mapped in place. Nothing here reads array data.
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.arrays.memmap.source import NPY_HEADER_LIMIT
from mixle.errors import ArrayNotFoundError
from mixle.utils.files import open_regular_file

try:  # NumPy >= 2 keeps the general header parser (every format version) here
    from numpy.lib._format_impl import _read_array_header
except ImportError:  # pragma: no cover - NumPy 1.x
    from numpy.lib.format import _read_array_header  # type: ignore[attr-defined,no-redef]

__all__ = [
    "NpyLayout",
    "NpzMember",
    "find_member",
    "list_members",
    "member_data_start",
    "read_npy_layout",
    "readable_members",
    "shown_name",
    "zip_entry",
]

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"
#: Bytes of the header length field per ``.npy`` format version.
_LENGTH_BYTES = {1: 2, 2: 4, 3: 4}
#: Names of zip compression methods, for messages.
METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}


@dataclass(frozen=True)
class NpzMember:
    """One member of a ``.npz`` file, from the zip's central directory."""

    name: str  # as stored, e.g. "x.npy"
    compress_type: int
    header_offset: int
    compress_size: int
    file_size: int
    crc: int
    flag_bits: int

    @property
    def shown(self) -> str:
        """The name as ``np.load`` shows it (without ``.npy``)."""
        return shown_name(self.name)

    @property
    def method(self) -> str:
        """The compression method in words."""
        return METHODS.get(self.compress_type, f"method {self.compress_type}")


@dataclass(frozen=True)
class NpyLayout:
    """Where a ``.npy`` array's data sits and what it is."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    data_offset: int  # from the start of the file that holds it
    header_bytes: int  # magic, version, length field and header text


def shown_name(name: str) -> str:
    """``name`` without its ``.npy`` suffix, as ``np.load(...).files`` lists it."""
    return name[:-4] if name.endswith(".npy") else name


def list_members(path: str) -> list[NpzMember]:
    """The members of the zip archive at ``path``, in directory order.

    Raises
    ------
    ValueError
        When ``path`` is not a zip archive (or its directory is damaged or cut short).
    """
    with open_regular_file(path, "path") as fh:
        try:
            with zipfile.ZipFile(fh) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
            raise ValueError(
                f"path={path!r} is not a .npz file: its zip directory cannot be read "
                f"({type(exc).__name__}: {exc}); a file cut short loses its directory, "
                "which sits at the end"
            ) from None
    return [
        NpzMember(
            name=i.filename,
            compress_type=i.compress_type,
            header_offset=i.header_offset,
            compress_size=i.compress_size,
            file_size=i.file_size,
            crc=i.CRC,
            flag_bits=i.flag_bits,
        )
        for i in infos
        if not i.is_dir()
    ]


def readable_members(members: list[NpzMember]) -> list[NpzMember]:
    """The members ``np.load`` can read: of entries sharing a name, the last one.

    A zip updated with ``zipfile.ZipFile(path, "a")`` can hold one name twice; zipfile (and
    so ``np.load``) reads the entry written last. Order: where each name first appears.
    """
    last: dict[str, NpzMember] = {}
    for member in members:
        last[member.name] = member
    return list(last.values())


def find_member(members: list[NpzMember], name: str | None, path: str) -> NpzMember:
    """The member ``np.load(path)[name]`` reads (``"x"`` or ``"x.npy"``); the only one.

    The lookup is NumPy's (``NpzFile.__getitem__``): a member whose stored name is exactly
    ``name`` first, else the last member named ``name + ".npy"``; of entries sharing a
    stored name, the last (zipfile's ``NameToInfo``). ``None`` reads the only array of a
    file holding one.

    Raises
    ------
    TypeError
        When ``name`` is not a str or ``None``.
    ValueError
        When ``name`` is ``None`` and the file holds several members (they are listed), or
        none.
    ArrayNotFoundError
        When no member has that name (the members are listed).
    """
    readable = readable_members(members)
    shown = [m.shown for m in readable]
    if name is None:
        if len(readable) == 1:
            return readable[0]
        raise ValueError(
            f"path={path!r} holds {len(readable)} arrays, so name= must say which to read; "
            f"{listing(shown, 'arrays')}"
        )
    if not isinstance(name, str):
        raise TypeError(f"name={name!r} must be a str (a member of the .npz file) or None")
    by_name = {m.name: m for m in readable}
    if name in by_name:
        return by_name[name]
    if name + ".npy" in by_name:
        return by_name[name + ".npy"]
    raise ArrayNotFoundError(f"name={name!r} is not in {path!r}; {listing(shown, 'arrays')}")


def zip_entry(zf: zipfile.ZipFile, member: NpzMember) -> zipfile.ZipInfo:
    """The directory entry of ``member`` itself in ``zf`` (found by offset: names can repeat).

    Raises
    ------
    zipfile.BadZipFile
        When ``zf`` has no such entry (the file changed since ``member`` was listed).
    """
    for info in zf.infolist():
        if info.header_offset == member.header_offset and info.filename == member.name:
            return info
    raise zipfile.BadZipFile(f"no entry {member.name!r} at offset {member.header_offset}")


def member_data_start(fh: BinaryIO, member: NpzMember, path: str, size: int) -> int:
    """Offset of ``member``'s stored bytes in the file, from its local header.

    Raises
    ------
    ValueError
        When the local header is missing, names another member, or the member's bytes run
        past the end of the file (cut short).
    """
    what = f"member {member.shown!r} of {path!r}"
    fh.seek(member.header_offset)
    head = fh.read(_LOCAL_HEADER.size)
    if len(head) < _LOCAL_HEADER.size or head[:4] != _LOCAL_MAGIC:
        raise ValueError(
            f"{what}: no zip local header at offset {member.header_offset}: the file is "
            "damaged (or was changed after the directory was written)"
        )
    fields = _LOCAL_HEADER.unpack(head)
    name_len, extra_len = fields[9], fields[10]
    stored = fh.read(name_len)
    encoding = "utf-8" if member.flag_bits & 0x800 else "cp437"
    if stored.decode(encoding, "replace") != member.name:
        raise ValueError(f"{what}: its local header names another member: the file is damaged")
    start = member.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if start + member.compress_size > size:
        raise ValueError(
            f"{what} needs bytes up to offset {start + member.compress_size:,} but the file "
            f"has {size:,}: it is cut short"
        )
    return start


def read_npy_layout(fh: BinaryIO, start: int, length: int, what: str) -> NpyLayout:
    """Parse the ``.npy`` header at ``start`` of a region of ``length`` bytes of ``fh``.

    The header length field is checked against ``NPY_HEADER_LIMIT`` before the header is
    read, and the header against NumPy's own ``max_header_size`` by NumPy's parser.

    Raises
    ------
    ValueError
        When the region is not a ``.npy`` array NumPy reads, holds Python objects (cannot
        be mapped), or holds fewer bytes than its header promises.
    """
    fh.seek(start)
    head = fh.read(min(length, len(_NPY_MAGIC) + 2 + 4))
    major = head[len(_NPY_MAGIC)] if len(head) > len(_NPY_MAGIC) else None
    width = _LENGTH_BYTES.get(major) if major is not None else None
    fixed = len(_NPY_MAGIC) + 2 + (width or 0)
    if not head.startswith(_NPY_MAGIC) or width is None or len(head) < fixed:
        raise ValueError(f"{what} is not a .npy array NumPy reads (no NUMPY magic header)")
    text_len = int.from_bytes(head[len(_NPY_MAGIC) + 2 : fixed], "little")
    if text_len > NPY_HEADER_LIMIT or fixed + text_len > length:
        raise ValueError(
            f"{what}: its .npy header claims {text_len:,} bytes, more than the member holds "
            f"or the {NPY_HEADER_LIMIT:,} NumPy allows: it is not a .npy array mixle maps"
        )
    fh.seek(start)
    raw = io.BytesIO(fh.read(fixed + text_len))
    try:
        version = npy_format.read_magic(raw)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(raw)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(raw)
        else:  # 3.0 (utf-8 field names): NumPy reads it with its general parser
            shape, fortran, dtype = _read_array_header(raw, version)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise ValueError(f"{what} has a broken .npy header: {exc}") from None
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError(
            f"{what} holds Python objects ({dtype}), which only np.load(allow_pickle=True) "
            "reads (running code from the file): it cannot be memory-mapped"
        )
    header_bytes = fixed + text_len
    nbytes = math.prod(shape) * dtype.itemsize
    if header_bytes + nbytes > length:
        raise ValueError(
            f"{what} holds {length - header_bytes:,} bytes of array data but its header "
            f"promises {nbytes:,} ({shape} x {dtype}): it is cut short"
        )
    return NpyLayout(tuple(shape), bool(fortran), dtype, start + header_bytes, header_bytes)
