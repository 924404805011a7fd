"""Options and storage checks of HDF5 datasets, done when one is opened.

:func:`hdf5_args` checks the arguments of
:class:`~mixle.data.sources.arrays.hdf5.source.HDF5ArraySource`;
:func:`open_with_access` opens a dataset with its chunk cache and prefixes;
:func:`check_external` and :func:`check_virtual` refuse storage HDF5 would block on (FIFOs,
devices) before any read: HDF5 opens those files itself.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.sources.arrays.base import listing
from mixle.reading import CorruptChunkError
from mixle.utils.files import require_regular_file
from mixle.utils.redact import display_path

__all__ = [
    "PluginSizeCheck",
    "HDF5_CHUNK_CACHE_BYTES",
    "HDF5_CHUNK_CACHE_SLOTS",
    "check_external",
    "check_virtual",
    "hdf5_args",
    "is_url",
    "open_with_access",
]

#: Default per-dataset HDF5 chunk cache (``rdcc_nbytes``): room for the chunks a batch of
#: patches touches, where HDF5's own 1 MiB default holds at most one 64³ float32 chunk.
HDF5_CHUNK_CACHE_BYTES = 64 * 1024 * 1024
#: Default hash-table size of the chunk cache (``rdcc_nslots``), a prime well above the
#: number of chunks that fit.
HDF5_CHUNK_CACHE_SLOTS = 100_003
#: Dataset-access options, applied through HDF5's dataset access property list.
ACCESS = ("efile_prefix", "virtual_prefix")
#: How HDF5 names the prefix of an HDF5 file's own folder in ``efile_prefix``.
_ORIGIN = "${ORIGIN}"
_MODES = ("r", "r+")


def open_with_access(
    h5py: Any, file: Any, name: str, options: dict[str, Any], access: dict[str, str]
) -> Any:
    """Open dataset ``name`` with this source's chunk cache and ``access`` prefixes.

    HDF5 keeps one chunk cache per open dataset in a process, set by whoever opens it first:
    a dataset already open elsewhere in the process keeps that opener's cache (and refuses
    another ``efile_prefix`` or ``virtual_prefix``).
    """
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(
        options["rdcc_nslots"], options["rdcc_nbytes"], options.get("rdcc_w0", 0.75)
    )
    if "efile_prefix" in access:
        dapl.set_efile_prefix(os.fsencode(access["efile_prefix"]))
    if "virtual_prefix" in access:
        dapl.set_virtual_prefix(os.fsencode(access["virtual_prefix"]))
    try:
        dsid = h5py.h5d.open(file.id, name.encode(), dapl=dapl)
    except KeyError as exc:
        if "prefix" not in str(exc):
            raise
        raise ValueError(
            f"dataset={name!r} is already open in this process with another "
            f"{' or '.join(ACCESS)} ({exc}); close the other handle first"
        ) from None
    # readonly lets h5py cache shape/dtype lookups, as File.__getitem__ does: 3x faster reads
    return h5py.Dataset(dsid, readonly=file.mode == "r")


def check_external(dataset: Any, file_path: str | None, where: str) -> None:
    """Refuse a dataset whose external raw-data files are missing or special files.

    Names are resolved as HDF5 resolves them (``HDF5_EXTFILE_PREFIX``, else the dataset's
    ``efile_prefix``, else the current directory); ``file_path`` is the HDF5 file's path
    (``None``: not a local file, so ``${ORIGIN}`` cannot be resolved and nothing is checked).
    HDF5 reads these files itself: a FIFO among them would block the read for ever.
    """
    slots = dataset.external
    if not slots:
        return
    prefix = os.environ.get("HDF5_EXTFILE_PREFIX") or os.fsdecode(
        dataset.id.get_access_plist().get_efile_prefix()
    )
    origin = None if file_path is None else os.path.dirname(os.path.abspath(file_path))
    if prefix.startswith(_ORIGIN):
        if origin is None:
            return
        prefix = origin + prefix[len(_ORIGIN) :]
    base = None if prefix in ("", ".") else prefix
    missing = []
    for name in dict.fromkeys(os.fsdecode(slot[0]) for slot in slots):
        full = name if base is None or os.path.isabs(name) else os.path.join(base, name)
        try:
            require_regular_file(full, f"external raw-data file of HDF5 dataset {where}")
        except FileNotFoundError:
            missing.append(full)
    if not missing:
        return
    looked = f"in the current directory {os.getcwd()!r}" if base is None else f"under {prefix!r}"
    beside = origin is not None and all(
        os.path.isfile(os.path.join(origin, os.path.basename(m))) for m in missing
    )
    hint = f" (they are in the HDF5 file's folder: efile_prefix={_ORIGIN!r})" if beside else ""
    raise FileNotFoundError(
        f"HDF5 dataset {where} stores its data in external raw-data files that are "
        f"missing ({listing(missing, 'files')}); relative names are looked up {looked}: pass "
        f"efile_prefix= the folder that holds them{hint}, or {_ORIGIN!r} for the HDF5 "
        "file's own folder"
    )


def is_url(path: object) -> bool:
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def hdf5_args(
    path: Any,
    dataset: Any,
    options: dict[str, Any],
    storage_options: Any = None,
    access: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path={path!r} must be a path to an HDF5 file, an fsspec URL or a binary "
            "file-like object"
        )
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError("storage_options must be a dict of fsspec options or None")
    if storage_options and not is_url(path):
        raise ValueError(
            "storage_options only apply to fsspec URLs (such as s3://bucket/x.h5); "
            f"path={display_path(path)!r} is not one"
        )
    if not isinstance(dataset, str) or not dataset:
        raise TypeError(f"dataset={dataset!r} must be the name of a dataset in the file")
    options = dict(options)
    mode = options.setdefault("mode", "r")
    if mode not in _MODES:
        raise ValueError(
            f"mode={mode!r} could create or truncate the file; HDF5ArraySource accepts "
            f"{' or '.join(map(repr, _MODES))}"
        )
    options.setdefault("rdcc_nbytes", HDF5_CHUNK_CACHE_BYTES)
    options.setdefault("rdcc_nslots", HDF5_CHUNK_CACHE_SLOTS)
    _check_cache_options(options)
    args = {"path": os.fspath(path), "dataset": dataset, "options": options}
    if storage_options:
        args["storage_options"] = storage_options
    prefixes = _parse_access(access or {})
    if prefixes:
        args["access"] = prefixes
    return args


def _check_cache_options(options: dict[str, Any]) -> None:
    """``rdcc_nbytes`` and ``rdcc_nslots`` are counts, ``rdcc_w0`` a number in [0, 1]."""
    for key in ("rdcc_nbytes", "rdcc_nslots"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{key}={value!r} must be a non-negative integer")
        if value < 0:
            raise ValueError(f"{key}={value!r} must be a non-negative integer")
    w0 = options.get("rdcc_w0", 0.75)
    if (
        isinstance(w0, bool)
        or not isinstance(w0, (int, float, np.integer, np.floating))
        or not 0 <= w0 <= 1
    ):
        raise ValueError(f"rdcc_w0={w0!r} must be a number from 0 to 1")


def _parse_access(access: dict[str, Any]) -> dict[str, str]:
    """The dataset-access prefixes that are set, as strings; refuse any other type."""
    parsed = {}
    for key, value in access.items():
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
            raise TypeError(f"{key}={value!r} must be a folder path (str or os.PathLike) or None")
        text = os.fspath(value)
        if "\0" in text:
            raise ValueError(f"{key}={text!r} contains a NUL character")
        parsed[key] = text
    return parsed


def check_virtual(dataset: Any, file_path: str | None, where: str) -> None:
    """Refuse a virtual dataset one of whose source files is a FIFO, a device or a folder.

    Each source name is looked up where HDF5 looks for it: as written, then (its base name
    when absolute) under ``HDF5_VDS_PREFIX`` or the dataset's ``virtual_prefix`` (``:``
    separated, ``${ORIGIN}`` the file's folder), then in the folder of ``file_path``. Every
    existing candidate must be a regular file: HDF5 would block opening a FIFO for ever.
    Missing sources are allowed (HDF5 reads the fill value there); names with ``%`` patterns
    are not checked.
    """
    if not dataset.is_virtual:
        return
    env = os.environ.get("HDF5_VDS_PREFIX")
    prefix = env or os.fsdecode(dataset.id.get_access_plist().get_virtual_prefix())
    origin = None if file_path is None else os.path.dirname(os.path.abspath(file_path))
    folders = []
    for part in prefix.split(":") if prefix else []:
        if part.startswith(_ORIGIN):
            if origin is None:
                continue
            part = origin + part[len(_ORIGIN) :]
        folders.append(part)
    if origin is not None:
        folders.append(origin)
    names = dict.fromkeys(os.fsdecode(vs.file_name) for vs in dataset.virtual_sources())
    for name in names:
        if name == "." or "%" in name:
            continue  # the file itself, or a pattern HDF5 expands per block
        stem = os.path.basename(name) if os.path.isabs(name) else name
        for candidate in dict.fromkeys([name, *(os.path.join(f, stem) for f in folders)]):
            try:
                require_regular_file(candidate, f"source file of HDF5 virtual dataset {where}")
            except FileNotFoundError:
                continue


#: Plugin filters whose stored chunks state their decoded size: zstd (the frame's content
#: size), blosc (its header's ``nbytes``), hdf5plugin's lz4 (an 8-byte big-endian total),
#: bitshuffle with lz4 or zstd (an 8-byte big-endian total, then the block size), blosc2 (the
#: ``uncompressed_size`` of its contiguous frame). bzip2 states none: its stream is decoded
#: (in bounded memory, the output dropped) to learn the size.
FILTER_ZSTD, FILTER_BLOSC, FILTER_LZ4 = 32015, 32001, 32004
FILTER_BZIP2, FILTER_BITSHUFFLE, FILTER_BLOSC2 = 307, 32008, 32026
_CHECKED_FILTERS = {
    FILTER_ZSTD: "zstd",
    FILTER_BLOSC: "blosc",
    FILTER_LZ4: "lz4",
    FILTER_BZIP2: "bzip2",
    FILTER_BITSHUFFLE: "bitshuffle",
    FILTER_BLOSC2: "blosc2",
}
_BITSHUFFLE_COMPRESSED = (2, 3)  # cd_values[4]: lz4, zstd (0: bitshuffle alone, no header)
_SIZE_KEEPING = (2,)  # shuffle: the decoded size of the stage below is the chunk's
_FLETCHER32 = 3  # appends a 4-byte checksum after the filtered bytes


class PluginSizeCheck:
    """Refuse plugin-filtered chunks whose stated decoded size is not their chunk's.

    HDF5's zstd, blosc, lz4, bitshuffle and blosc2 plugins allocate what the stored bytes
    say they decode to, and bzip2's grows its buffer until the stream ends, then silently
    keep the chunk's worth: a tiny chunk could allocate gigabytes. Each chunk a read touches
    is checked once, from its stored bytes (``read_direct_chunk``), before h5py reads it
    (bzip2's stream is decoded once more for it, its output dropped). Use
    :meth:`for_dataset`.
    """

    def __init__(
        self,
        dataset: Any,
        codes: list[int],
        where: str,
        values: list[tuple[int, ...]] | None = None,
    ) -> None:
        self._dsid = dataset.id
        self._chunks = tuple(dataset.chunks)
        self._nbytes = int(np.prod(self._chunks, dtype=np.int64)) * dataset.id.get_type().get_size()
        self._codes = codes
        self._values = values if values is not None else [() for _ in codes]
        self._where = where
        self._checked: set[tuple[int, ...]] = set()

    @classmethod
    def for_dataset(cls, dataset: Any, where: str) -> PluginSizeCheck | None:
        """A check for a chunked ``dataset`` with a filter it checks (see above), else ``None``."""
        if dataset.chunks is None or dataset.is_virtual:
            return None
        dcpl = dataset.id.get_create_plist()
        found = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
        codes = [int(f[0]) for f in found]
        if not set(codes) & set(_CHECKED_FILTERS):
            return None
        return cls(dataset, codes, where, [tuple(int(v) for v in f[2]) for f in found])

    def check(self, coords_list: list[tuple[int, ...]]) -> None:
        """Check each chunk of ``coords_list`` (grid coordinates) not checked before.

        Raises
        ------
        CorruptChunkError
            When a chunk states another decoded size than its chunk's, naming both.
        """
        for coords in coords_list:
            if coords in self._checked:
                continue
            offset = tuple(c * n for c, n in zip(coords, self._chunks))
            if self._dsid.get_chunk_info_by_coord(offset).byte_offset is not None:
                mask, raw = self._dsid.read_direct_chunk(offset)
                self._check_stored(coords, bytes(raw), mask)
            self._checked.add(coords)

    def _check_stored(self, coords: tuple[int, ...], raw: bytes, mask: int) -> None:
        active = [
            (c, v) for i, (c, v) in enumerate(zip(self._codes, self._values)) if not mask & (1 << i)
        ]
        while active and active[-1][0] == _FLETCHER32:  # outermost: the checksum is at the end
            active.pop()
            raw = raw[:-4]
        if not active or active[-1][0] not in _CHECKED_FILTERS:
            return
        code, values = active.pop()
        if code == FILTER_BITSHUFFLE and (
            len(values) < 5 or values[4] not in _BITSHUFFLE_COMPRESSED
        ):
            return  # bitshuffle alone keeps the size and writes no header
        bzip2 = code == FILTER_BZIP2
        stated = _bzip2_size(raw, self._nbytes) if bzip2 else _stated_size(code, raw)
        exact = all(c in _SIZE_KEEPING for c, _ in active)
        if stated is None or stated == self._nbytes or (not exact and stated < self._nbytes):
            return
        over = bzip2 and stated > self._nbytes  # its decoding stopped one byte past
        states = "decodes to" + (" more than" if over else "") if bzip2 else "states"
        shown = self._nbytes if over else stated
        raise CorruptChunkError(
            f"chunk {coords} of HDF5 dataset {self._where} is corrupt: its "
            f"{_CHECKED_FILTERS[code]} data ({len(raw)} stored bytes) {states} {shown} decoded "
            f"bytes, a chunk has {self._nbytes}; HDF5's plugin would allocate all of them"
        )


def _stated_size(code: int, raw: bytes) -> int | None:
    """The decoded size the stored bytes of filter ``code`` state, or ``None`` if none."""
    if code in (FILTER_LZ4, FILTER_BITSHUFFLE):  # 8-byte big-endian total, 4-byte block
        return int.from_bytes(raw[:8], "big") if len(raw) >= 12 else None
    if code == FILTER_BLOSC2:
        return _blosc2_frame_size(raw)
    if code == FILTER_BLOSC:
        return int.from_bytes(raw[4:8], "little") if len(raw) >= 16 else None
    if len(raw) < 6 or raw[:4] != b"\x28\xb5\x2f\xfd":  # not a zstd frame: HDF5 refuses it
        return None
    descriptor = raw[4]
    single = (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (single, 2, 4, 8)[descriptor >> 6]
    if size == 0 or len(raw) < at + size:
        return None  # no content size: the plugin decodes into the chunk's own size
    value = int.from_bytes(raw[at : at + size], "little")
    return value + 256 if size == 2 else value


#: The start of a blosc2 contiguous frame: a msgpack array, then the str ``"b2frame\\0"``.
_B2FRAME = b"\xa8b2frame\x00"


def _blosc2_frame_size(raw: bytes) -> int | None:
    """The ``uncompressed_size`` a blosc2 contiguous frame states, or ``None`` if not one.

    hdf5plugin's blosc2 filter stores each chunk as a frame (a super-chunk of one chunk):
    ``header_size`` (``0xd2`` int32) at 10, ``frame_size`` (``0xcf`` uint64) at 15, four
    flag bytes (``0xa4``) at 24, then ``uncompressed_size`` (``0xd3`` int64, big-endian)
    at 29. Anything else (a frame of another layout) is not checked.
    """
    if len(raw) < 38 or raw[1:10] != _B2FRAME or raw[10] != 0xD2 or raw[15] != 0xCF:
        return None
    if raw[24] != 0xA4 or raw[29] != 0xD3:
        return None
    return int.from_bytes(raw[30:38], "big", signed=True)


def _bzip2_size(raw: bytes, nbytes: int) -> int | None:
    """The size ``raw``'s bzip2 stream decodes to, up to ``nbytes + 1``; ``None`` if bad.

    Decoded in steps of at most 1 MiB whose output is dropped, so checking a chunk holds
    about 1 MiB however much its stream would decode to. A stream that is not bzip2 or is
    cut short is ``None``: HDF5's filter fails on it itself.
    """
    import bz2

    decoder = bz2.BZ2Decompressor()
    step = 1 << 20
    try:
        total = len(decoder.decompress(raw, max_length=min(step, nbytes + 1)))
        while not decoder.eof and total <= nbytes:
            part = decoder.decompress(b"", max_length=min(step, nbytes + 1 - total))
            if not part:
                return None  # cut short: no more output without more input
            total += len(part)
    except (OSError, ValueError, EOFError):
        return None
    return total
