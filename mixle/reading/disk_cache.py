"""Fetched chunk bytes of remote stores, cached on local disk (:class:`ChunkDiskCache`).

A remote read pays a round trip and the network's bandwidth for every chunk; the next
epoch, or the next job on the same host, pays them again. This cache keeps the raw bytes a
fetch returned (before decoding) in a folder on local disk, under a byte budget, so that a
chunk fetched once is read from disk afterwards, by any process of the host.

Keys. An entry is named by a :class:`ContentKey`: the store root, the stored key, a
*version* (an ETag, ``f"{size}:{mtime_ns}"``, an object's VersionId: whatever changes when
the content does) and the byte span within the object. The version is required: an object
rewritten under the same key gets a new version, hence a new entry, and its old bytes are
never served (they age out by LRU). Keys hold no credentials: callers pass the store URL
already redacted (:func:`~mixle.utils.redact.display_path`, or the URL without user-info
and query); a store string with user-info (``scheme://user@host``) or a query (``?``) is
refused.

Entries. The file name is the SHA-256 of the whole key (:func:`entry_name`). The file holds
a header (format magic, key length, payload length, CRC-32 of the payload), the full key
and the payload. :meth:`ChunkDiskCache.get` serves an entry only when its size, key and
CRC-32 all match, so a hash collision, a torn write (a crash before the data reached the
disk: entries are not ``fsync``-ed) or a truncated or damaged file is a miss, and the bad
file is removed. CRC-32 guards against accidents (torn writes, truncation, flipped bits),
not against someone who can write to the folder (who could write a matching SHA-256 as
easily), and it is the cheaper of the two per byte.

Publication. A put writes a temporary file in the cache folder and publishes it with
:func:`~mixle.utils.files.publish_file` (``os.link``, which never replaces a file; a bad
entry already there is replaced), so a reader never sees a partial entry and concurrent
puts of one key from many processes leave one good entry. Entries are created readable by
their owner only (``0600``), and a folder the cache creates is ``0700``: the bytes of a
private bucket stay private to the user who fetched them.

Size bound and eviction. The folder holds about ``budget_bytes`` of entries (default
:data:`CHUNK_CACHE_BYTES`, or ``$MIXLE_CHUNK_CACHE_BYTES``). Recency is the entry file's
modification time, set on every put and every hit (``os.utime``; access times are not used,
as ``noatime``/``relatime`` mounts do not keep them). Each cache object keeps a running
estimate of the folder's size (one scan at its first put, then its own puts added). When
the estimate passes the budget, or its own puts since its last scan pass a tenth of the
budget (other processes put too), it rescans the folder, which counts every process's
entries, and if the folder is past the budget deletes the least recently used entries down
to :data:`EVICTION_LOW_WATER` of the budget. With N writing processes the folder may pass
the budget for a moment by what they put since their last scans: at most about N times (a
tenth of the budget and one entry). Sizes are file sizes (not disk blocks).
An entry larger than the budget is not stored. A file that vanishes between the listing
and its deletion or open (another process evicted it) is skipped, or a miss.

Safety. Nothing is written outside the folder. Unlinking an entry another process is
reading leaves that read intact (POSIX). Temporary files left by a killed process are
deleted by a later rescan once :data:`STALE_TEMP_SECONDS` old; files that are not the
cache's are never touched.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mixle.utils.files import cache_dir, env_byte_budget, open_regular_file, publish_file
from mixle.utils.redact import display_path
from mixle.utils.validation import parse_int

__all__ = [
    "CACHE_DIR_ENV",
    "CHUNK_CACHE_BYTES",
    "CHUNK_CACHE_BYTES_ENV",
    "CHUNK_CACHE_FOLDER",
    "EVICTION_LOW_WATER",
    "STALE_TEMP_SECONDS",
    "ChunkDiskCache",
    "ContentKey",
    "chunk_cache_budget",
    "default_chunk_cache_dir",
    "entry_name",
]

#: Environment variable naming mixle's cache root (the NIfTI, ``.npz`` and row-index caches'
#: too); unset: ``$XDG_CACHE_HOME/mixle``, else ``~/.cache/mixle``.
CACHE_DIR_ENV = "MIXLE_CACHE_DIR"
#: Sub-folder of the cache root holding fetched chunk bytes.
CHUNK_CACHE_FOLDER = "chunks"
#: Default most bytes of entries kept in the chunk cache folder (8 GiB).
CHUNK_CACHE_BYTES = 8 * 2**30
#: Environment variable overriding :data:`CHUNK_CACHE_BYTES` (a whole number of bytes >= 0).
CHUNK_CACHE_BYTES_ENV = "MIXLE_CHUNK_CACHE_BYTES"
#: An eviction deletes least recently used entries until the folder holds at most this
#: fraction of the budget, so that the next rescan comes only after a tenth of the budget
#: was put (a rescan lists and ``stat``-s every entry).
EVICTION_LOW_WATER = 0.9
#: Temporary files in the folder older than this (seconds) were left by a killed process and
#: are deleted by a rescan; younger ones (being written) count toward the budget.
STALE_TEMP_SECONDS = 3600

#: Entry format tag: in the magic and in every hashed key, so a new format never reads an old
#: entry (old entries age out by LRU).
_FORMAT = "mixle-chunk-v1"
_MAGIC = b"MXCHNK01"
#: magic, key length (u32), payload length (u64), CRC-32 of the payload (u32); little-endian.
_HEADER = struct.Struct("<8sIQI")
_SUFFIX = ".chunk"
_NAME_LENGTH = 64 + len(_SUFFIX)  # a SHA-256 in hex, then the suffix
_TEMP_PREFIX = "."
_TEMP_SUFFIX = ".tmp"


def default_chunk_cache_dir() -> Path:
    """The default folder of :class:`ChunkDiskCache`: ``<cache root>/chunks``.

    The cache root is ``$MIXLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixle``, else
    ``~/.cache/mixle`` (:func:`~mixle.utils.files.cache_dir`): the root the NIfTI and
    ``.npz`` caches use.
    """
    return cache_dir() / CHUNK_CACHE_FOLDER


def chunk_cache_budget() -> int:
    """The default budget: ``$MIXLE_CHUNK_CACHE_BYTES`` when set, else :data:`CHUNK_CACHE_BYTES`.

    Raises
    ------
    ValueError
        When the variable is set but is not a whole number of bytes >= 0.
    """
    return env_byte_budget(
        CHUNK_CACHE_BYTES_ENV, CHUNK_CACHE_BYTES, "fetched chunks kept on disk; 0 stores nothing"
    )


@dataclass(frozen=True)
class ContentKey:
    """What one cached byte string is: a span of one stored object at one version.

    Parameters
    ----------
    store
        The store root as a display-safe URL or path: no credentials, no query string. Pass
        it redacted (the URL without ``user:secret@`` and ``?...``); one with user-info or a
        ``?`` is refused.
    key
        The stored key within the store: a chunk or shard key, or for an HDF5 file a byte
        range such as ``"bytes=100-200"``.
    version
        What changes whenever the content does: an ETag, ``f"{size}:{mtime_ns}"`` or a
        VersionId. Required (not empty): without a validator a rewritten object would be
        served from its old bytes.
    span
        ``(start, stop)`` byte range within the object; ``stop=None`` means to its end.

    Raises
    ------
    TypeError
        When a field has the wrong type.
    ValueError
        When ``store`` is empty or has user-info or a query, ``version`` is empty, or
        ``span`` is not ``0 <= start <= stop``.
    """

    store: str
    key: str
    version: str
    span: tuple[int, int | None] = (0, None)

    def __post_init__(self) -> None:
        for name in ("store", "key", "version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"ContentKey {name}={value!r} must be a str")
        _check_store(self.store)
        if not self.version.strip():
            raise ValueError(
                f"ContentKey version={self.version!r} must not be empty: pass an ETag, "
                "f'{size}:{mtime_ns}' or a VersionId, what changes when the content does "
                "(without one, a rewritten object would be served from its old bytes)"
            )
        object.__setattr__(self, "span", _parse_span(self.span))


def _check_store(store: str) -> None:
    if not store:
        raise ValueError("ContentKey store='' must name the store root (a URL or a path)")
    if "?" in store:
        shown = display_path(store.split("?", 1)[0]) + "?***"
        raise ValueError(
            f"ContentKey store={shown!r} has a query string: pass the store root without "
            "its query (it may hold a signature or a token; its value is not shown here)"
        )
    scheme, sep, rest = store.partition("://")
    authority = rest.split("/", 1)[0]
    if sep and "@" in authority:
        # the host after the last '@': a raw '@' inside a password is not shown either
        shown = f"{scheme}://***@{authority.rsplit('@', 1)[1]}{rest[len(authority) :]}"
        raise ValueError(
            f"ContentKey store={shown!r} has user-info (credentials before an "
            "'@' in the host part): pass the store root without it (it is not shown here)"
        )


def _parse_span(span: object) -> tuple[int, int | None]:
    if not isinstance(span, tuple) or len(span) != 2:
        raise TypeError(f"ContentKey span={span!r} must be a tuple (start, stop or None)")
    start = parse_int(span[0], "ContentKey span start")
    stop = None if span[1] is None else parse_int(span[1], "ContentKey span stop")
    if start < 0 or (stop is not None and stop < start):
        raise ValueError(
            f"ContentKey span={span!r} must be (start, stop) with 0 <= start <= stop, "
            "or (start, None) for the rest of the object"
        )
    return start, stop


def _encode(key: ContentKey) -> bytes:
    """The canonical bytes of ``key`` (a JSON list): equal keys, equal bytes; else different."""
    start, stop = key.span
    fields = [_FORMAT, key.store, key.key, key.version, start, stop]
    return json.dumps(fields, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def entry_name(key: ContentKey) -> str:
    """The file name of ``key``'s entry in a cache folder: the SHA-256 of the key, in hex."""
    if not isinstance(key, ContentKey):
        raise TypeError(f"key={key!r} must be a ContentKey")
    return hashlib.sha256(_encode(key)).hexdigest() + _SUFFIX


def _parse_directory(directory: object) -> Path:
    """The cache folder: ``directory``, or :func:`default_chunk_cache_dir` for ``None``."""
    if directory is None:
        return default_chunk_cache_dir()
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory={directory!r} must be a path (str or os.PathLike) or None")
    text = os.fspath(directory)
    if not isinstance(text, str) or not text:
        raise ValueError(f"directory={directory!r} must be a non-empty folder path")
    return Path(text)


def _parse_budget(budget: object) -> int:
    if budget is None:
        return chunk_cache_budget()
    value = parse_int(budget, "budget_bytes")
    if value < 0:
        raise ValueError(
            f"budget_bytes={budget!r} must be >= 0 (the most bytes of entries kept on disk; "
            f"0 stores nothing; None: ${CHUNK_CACHE_BYTES_ENV}, else {CHUNK_CACHE_BYTES})"
        )
    return value


def _folder_error(folder: Path, exc: OSError, doing: str) -> OSError:
    return OSError(  # OSError(errno, ...) is the errno's subclass (PermissionError, ...)
        exc.errno,
        f"the chunk disk cache folder {str(folder)!r} {doing} ({exc.strerror or exc}); "
        f"pass another directory, or set {CACHE_DIR_ENV} to a writable folder with room "
        f"(or {CHUNK_CACHE_BYTES_ENV} to a smaller budget)",
    )


class ChunkDiskCache:
    """Fetched chunk bytes on local disk, keyed by :class:`ContentKey`, LRU under a budget.

    Parameters
    ----------
    directory
        The cache folder, created readable by its owner only (``0700``) if absent.
        ``None``: ``$MIXLE_CACHE_DIR/chunks`` (:func:`default_chunk_cache_dir`).
    budget_bytes
        Most bytes of entry files to keep (headers included); ``0`` stores nothing.
        ``None``: ``$MIXLE_CHUNK_CACHE_BYTES``, else :data:`CHUNK_CACHE_BYTES` (8 GiB).

    Raises
    ------
    TypeError, ValueError
        On a bad ``directory`` or ``budget_bytes`` (or ``$MIXLE_CHUNK_CACHE_BYTES``).
    NotADirectoryError
        When ``directory`` (or a folder above it) is a file.
    OSError
        When the folder cannot be created or written (a ``PermissionError`` for an
        unwritable one); the message names it. The cache is never silently disabled.

    Notes
    -----
    Thread- and process-safe: any number of threads and processes may share one folder
    (see the module notes). Pickling keeps the folder and the budget. :meth:`get` never
    returns bytes whose key, length and CRC-32 were not checked; :meth:`put` errors
    (a full disk) are raised as ``OSError`` naming the folder, and leave no file behind.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        budget_bytes: int | None = None,
    ) -> None:
        self._dir = _parse_directory(directory)
        self._budget = _parse_budget(budget_bytes)
        self._make_folder()
        self._lock = threading.Lock()  # the estimate and the recency stamp
        self._scanning = threading.Lock()  # held by the one thread rescanning the folder
        self._pid = os.getpid()
        self._estimate: int | None = None  # bytes in the folder as this object last knew
        self._since_scan = 0  # bytes this object put since its last scan
        self._last_stamp = 0  # the last recency time set by this object (ns)

    def _make_folder(self) -> None:
        """Create the folder (``0700``; folders above it as usual) and check it is writable."""
        folder = self._dir
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"directory={str(folder)!r} is a file, not a folder: the chunk disk cache "
                "needs a folder of its own (pass another directory)",
            )
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise _folder_error(folder, exc, "cannot be created") from None
        try:  # the honest test of writability (os.access is wrong for root and ACLs)
            handle, probe = tempfile.mkstemp(dir=folder, prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX)
        except OSError as exc:
            raise _folder_error(folder, exc, "is not writable") from None
        os.close(handle)
        os.unlink(probe)

    def __reduce__(self) -> tuple[Callable[..., ChunkDiskCache], tuple[str, int]]:
        return type(self), (str(self._dir), self._budget)

    def __repr__(self) -> str:
        return f"ChunkDiskCache(directory={str(self._dir)!r}, budget_bytes={self._budget})"

    @property
    def directory(self) -> Path:
        """The cache folder."""
        return self._dir

    @property
    def budget_bytes(self) -> int:
        """Most bytes of entry files kept (0: nothing is stored)."""
        return self._budget

    @property
    def used_bytes(self) -> int:
        """Bytes of entries and of temporary files being written, counted now (a scan)."""
        return self._scan(delete_stale=False)[1]

    def _guard(self) -> threading.Lock:
        """This object's lock, new in a forked child (a parent's thread may have held it)."""
        if self._pid != os.getpid():
            self._lock, self._scanning = threading.Lock(), threading.Lock()
            self._pid = os.getpid()
            self._estimate, self._since_scan = None, 0
        return self._lock

    def _stamp(self) -> int:
        """A recency time (ns): the wall clock, and strictly later than this object's last."""
        with self._guard():
            self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
            return self._last_stamp

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: ContentKey) -> bytes | None:
        """The bytes cached for ``key``, or ``None`` on a miss.

        A hit marks the entry used (its modification time). An entry whose size, key or
        CRC-32 does not match (torn, truncated, damaged, or a name collision) is a miss and
        is removed; an entry that vanishes meanwhile (evicted) is a miss.
        """
        encoded = _encode(_check_key(key))
        path = self._dir / (hashlib.sha256(encoded).hexdigest() + _SUFFIX)
        try:
            fh = open_regular_file(path, "chunk cache entry")
        except OSError:  # absent, evicted, or not a regular file: never read
            return None
        with fh:
            try:
                data = _read_entry(fh, encoded)
            except OSError:
                return None
            if data is None:
                _remove_if_same(path, fh.fileno())
                return None
            stamp = self._stamp()
            with contextlib.suppress(OSError, NotImplementedError):  # another user's entry
                os.utime(fh.fileno() if os.utime in os.supports_fd else path, ns=(stamp, stamp))
        return data

    # -- writes --------------------------------------------------------------------------
    def put(self, key: ContentKey, data: bytes) -> None:
        """Keep ``data`` (any contiguous bytes-like object) as the bytes of ``key``.

        An entry larger than the budget is not stored; a good entry already present is
        only marked used (a damaged one is replaced). After a put, the least recently used
        entries are evicted once the folder is past the budget.

        Raises
        ------
        TypeError
            When ``data`` is not a contiguous bytes-like object.
        OSError
            When writing fails (a full disk, a removed folder); the message names the
            folder. No temporary file is left behind.
        """
        encoded = _encode(_check_key(key))
        payload = _as_bytes(data)
        size = _HEADER.size + len(encoded) + payload.nbytes
        if size > self._budget:
            return
        name = hashlib.sha256(encoded).hexdigest() + _SUFFIX
        path = self._dir / name
        if _entry_is_good(path, encoded):  # an earlier or concurrent put: keep it
            stamp = self._stamp()
            with contextlib.suppress(OSError):
                os.utime(path, ns=(stamp, stamp))
            return
        header = _HEADER.pack(_MAGIC, len(encoded), payload.nbytes, zlib.crc32(payload))
        tmp = self._write_temp(header + encoded, payload)
        try:
            stamp = self._stamp()
            os.utime(tmp, ns=(stamp, stamp))
            published = publish_file(tmp, path, lambda: _entry_is_good(path, encoded))
        except OSError as exc:
            raise _folder_error(self._dir, exc, "could not take a new entry") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if published:
            self._account(size, name)

    def _write_temp(self, head: bytes, payload: memoryview) -> str:
        """A new temporary file in the folder holding ``head`` and ``payload``; its path."""
        for attempt in (0, 1):
            try:
                handle, tmp = tempfile.mkstemp(
                    dir=self._dir, prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX
                )
                break
            except FileNotFoundError as exc:  # the folder was removed: make it again, once
                if attempt:
                    raise _folder_error(self._dir, exc, "could not take a new entry") from None
                with contextlib.suppress(OSError):
                    self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise _folder_error(self._dir, exc, "could not take a new entry") from None
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(head)
                out.write(payload)
        except OSError as exc:  # a full disk
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _folder_error(self._dir, exc, "could not take a new entry") from None
        return tmp

    def _account(self, size: int, keep: str) -> None:
        """Add a published entry to the estimate; rescan and evict when past the budget."""
        lock = self._guard()
        with lock:
            self._since_scan += size
            if self._estimate is not None:
                self._estimate += size
                if self._estimate <= self._budget and self._since_scan <= self._rescan_bytes():
                    return
        # one rescan at a time: a thread that finds another one rescanning leaves it to it,
        # and puts and hits of other threads never wait for a scan
        if not self._scanning.acquire(blocking=False):
            return
        try:
            entries, total = self._scan(delete_stale=True)
            if total > self._budget:
                total = self._evict(entries, total, keep)
            with lock:
                self._estimate, self._since_scan = total, 0
        finally:
            self._scanning.release()

    def _rescan_bytes(self) -> int:
        """Bytes put after which this object rescans even under its estimate (others put too)."""
        return self._budget - int(self._budget * EVICTION_LOW_WATER)

    def _scan(self, *, delete_stale: bool) -> tuple[list[tuple[int, str, int]], int]:
        """``([(mtime_ns, name, size)] of entries, bytes of entries and young temp files)``."""
        entries: list[tuple[int, str, int]] = []
        total = 0
        stale = time.time_ns() - STALE_TEMP_SECONDS * 10**9
        try:
            listing = list(os.scandir(self._dir))
        except FileNotFoundError:  # the folder was removed: it holds nothing
            return entries, 0
        for item in listing:
            name = item.name
            is_entry = len(name) == _NAME_LENGTH and name.endswith(_SUFFIX)
            is_temp = name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX)
            if not (is_entry or is_temp):
                continue  # not the cache's: never counted, never deleted
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:  # deleted meanwhile
                continue
            if is_temp and delete_stale and st.st_mtime_ns < stale:
                with contextlib.suppress(OSError):
                    os.unlink(item.path)
                    continue
            total += st.st_size
            if is_entry:
                entries.append((st.st_mtime_ns, name, st.st_size))
        return entries, total

    def _evict(self, entries: list[tuple[int, str, int]], total: int, keep: str) -> int:
        """Delete least recently used entries (never ``keep``) to the low water; bytes left."""
        target = int(self._budget * EVICTION_LOW_WATER)
        for _, name, size in sorted(entries):
            if total <= target:
                break
            if name == keep:
                continue
            try:
                os.unlink(self._dir / name)
            except FileNotFoundError:  # evicted by another process meanwhile
                pass
            except OSError:  # cannot be removed (another user's, or open on Windows): kept
                continue
            total -= size
        return total

    def clear(self) -> None:
        """Delete every entry (and stale temporary files); others' files are left alone.

        Temporary files of puts still being written in other processes are kept (their
        entries appear when those puts publish them).
        """
        entries, _ = self._scan(delete_stale=True)
        for _, name, _size in entries:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                os.unlink(self._dir / name)
        with self._guard():
            self._estimate, self._since_scan = None, 0


def _check_key(key: object) -> ContentKey:
    if not isinstance(key, ContentKey):
        raise TypeError(f"key={key!r} must be a ContentKey (store, key, version, span)")
    return key


def _as_bytes(data: object) -> memoryview:
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"data of type {type(data).__name__} must be bytes or another bytes-like object"
        ) from None
    if not view.contiguous:
        raise TypeError("data must be a contiguous bytes-like object (a C-contiguous buffer)")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _read_entry(fh: BinaryIO, encoded: bytes) -> bytes | None:
    """The payload of the open entry ``fh`` if it is a good entry of ``encoded``, else ``None``."""
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(_HEADER.size + len(encoded))
    if len(head) != _HEADER.size + len(encoded):
        return None
    magic, key_length, length, crc = _HEADER.unpack_from(head)
    if (
        magic != _MAGIC
        or key_length != len(encoded)
        or size != _HEADER.size + key_length + length
        or head[_HEADER.size :] != encoded
    ):
        return None
    payload = fh.read(length)
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


def _entry_is_good(path: Path, encoded: bytes) -> bool:
    """Whether ``path`` is a good entry of ``encoded`` (read in full and checked)."""
    try:
        with open_regular_file(path, "chunk cache entry") as fh:
            return _read_entry(fh, encoded) is not None
    except OSError:
        return False


def _remove_if_same(path: Path, fd: int) -> None:
    """Unlink ``path`` if it still is the file open as ``fd`` (not a newer good entry)."""
    try:
        mine, now = os.fstat(fd), os.stat(path)
        if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
            os.unlink(path)
    except OSError:
        pass
