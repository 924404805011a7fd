"""Regular files only: FIFOs, devices, sockets and directories are refused before any read.

A FIFO blocks a read for ever and ``/dev/zero`` never ends, so every reader that opens a
path a user (or a store's metadata) named goes through :func:`open_regular_file`,
:func:`open_regular_fd` or :func:`read_regular_file`. They open without blocking, check the
opened file with ``fstat`` (so a path swapped between a check and the open cannot slip
through) and follow symlinks: a link to ``/dev/zero`` is refused as the character device it
points to.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from mixle.errors import SpecialFileError

__all__ = [
    "READ_BUFFER_ALIGN",
    "READ_BUFFER_KEPT_BYTES",
    "cache_dir",
    "env_byte_budget",
    "file_kind",
    "open_regular_fd",
    "open_regular_file",
    "page_aligned_buffer",
    "publish_file",
    "read_fd",
    "read_fd_into",
    "read_regular_file",
    "require_regular_file",
    "thread_read_buffer",
]

#: A thread keeps its read buffer (:func:`thread_read_buffer`) for its next read only up
#: to this size; larger reads get a buffer of their own.
READ_BUFFER_KEPT_BYTES = 16 * 1024 * 1024

#: Where read buffers start (:func:`page_aligned_buffer`): a page.
READ_BUFFER_ALIGN = 4096

_read_buffers = threading.local()


def thread_read_buffer(size: int) -> memoryview:
    """``size`` writable bytes of this thread's reusable read buffer, starting on a page.

    What stored chunks are read into before they are decoded: no fresh allocation (and
    page faults) per chunk. Valid only until this thread's next call; grown as needed,
    kept up to :data:`READ_BUFFER_KEPT_BYTES`.
    """
    buffer: memoryview | None = getattr(_read_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = page_aligned_buffer(size)
        if size <= READ_BUFFER_KEPT_BYTES:
            _read_buffers.buffer = buffer
    return buffer[:size]


def page_aligned_buffer(size: int) -> memoryview:
    """``size`` writable bytes (zeroed) that start on a :data:`READ_BUFFER_ALIGN` boundary.

    A large ``bytearray``'s bytes start 16 bytes into a page (the allocator's header),
    and on some machines the kernel copies a file read into such a buffer several times
    slower than into one that starts on the page (measured in
    ``benchmarks/read_alignment.py``).
    """
    raw = bytearray(size + READ_BUFFER_ALIGN)
    address = ctypes.addressof(ctypes.c_char.from_buffer(raw))
    start = -address % READ_BUFFER_ALIGN
    return memoryview(raw)[start : start + size]


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` describes, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _refuse(path: str | os.PathLike[str], mode: int, what: str) -> SpecialFileError:
    return SpecialFileError(
        f"{what} {os.fspath(path)!r} is {file_kind(mode)}, not a regular file: "
        "mixle reads regular files only (a read from it could block or never end)"
    )


def _mode_or_none(path: str | os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


def require_regular_file(path: str | os.PathLike[str], what: str = "file") -> os.stat_result:
    """``os.stat(path)`` (following symlinks), or :class:`SpecialFileError` if not regular.

    ``what`` names the path in the message ("chunk", "zarr metadata", "path").
    ``FileNotFoundError`` and other ``OSError`` pass through.
    """
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, info.st_mode, what)
    return info


def open_regular_fd(path: str | os.PathLike[str], what: str = "file") -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path`` and its ``fstat``; refuses anything else.

    The open does not block on a FIFO (``O_NONBLOCK``, left set: a regular file ignores
    it, and :func:`read_fd_into` clears it if a read ever says it would block). The caller
    closes the descriptor.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:  # a socket cannot be opened at all (ENXIO): say what it is
        mode = _mode_or_none(path)
        if mode is not None and not stat.S_ISREG(mode):
            raise _refuse(path, mode, what) from None
        raise exc from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, info.st_mode, what)
        return fd, info
    except BaseException:
        os.close(fd)
        raise


def read_fd_into(fd: int, view: memoryview, expected: int) -> int:
    """Read ``fd`` from its offset into ``view`` until it ends, ``view`` is full or at
    least ``expected`` bytes came; returns how many came.

    ``expected`` is the size ``fstat`` gave: once that many bytes came no read is spent
    finding the end (a view one byte longer shows a file that grew before the read).
    """
    got = 0
    while got < len(view) and got < expected:
        try:
            n = os.readv(fd, [view[got:]])
        except BlockingIOError:  # a file system that honours O_NONBLOCK on regular files
            os.set_blocking(fd, True)
            continue
        if not n:
            break
        got += n
    return got


def read_fd(fd: int, most: int, expected: int) -> bytes:
    """:func:`read_fd_into` into new bytes: at most ``most`` bytes of ``fd``."""
    parts: list[bytes] = []
    got = 0
    while got < most and got < expected:
        try:
            part = os.read(fd, most - got)
        except BlockingIOError:
            os.set_blocking(fd, True)
            continue
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def open_regular_file(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """Open ``path`` for binary reading, refusing anything but a regular file.

    The open itself does not block on a FIFO (``O_NONBLOCK``), and the check is made on
    the opened descriptor; the returned file reads in normal, blocking mode.
    """
    fd, _ = open_regular_fd(path, what)
    try:
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(
    path: str | os.PathLike[str], what: str = "file", *, limit: int | None = None
) -> bytes:
    """The bytes of the regular file ``path``; at most ``limit`` bytes or ``ValueError``.

    With ``limit``, no more than ``limit + 1`` bytes are ever read, so a huge or growing
    file costs no more memory than the cap.
    """
    with open_regular_file(path, what) as file:
        if limit is None:
            return file.read()
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(
            f"{what} {os.fspath(path)!r} is larger than {limit:,} bytes, the most mixle "
            "reads for it: it is not what it claims to be"
        )
    return data


def publish_file(
    temp: str | os.PathLike[str],
    target: str | os.PathLike[str],
    keep_existing: Callable[[], bool],
) -> bool:
    """Put the finished file ``temp`` at ``target`` without replacing a good file there.

    ``os.link`` fails when ``target`` exists: another process published it first (and may
    have it mapped), and it is kept when ``keep_existing()`` says it is good. Only a bad
    ``target`` is replaced. Where the file system has no hard links, ``os.replace`` is used
    unless a good ``target`` exists. Returns whether ``target`` is now ``temp``'s file; the
    caller removes ``temp`` (linked or not).
    """
    try:
        os.link(temp, target)
        return True
    except FileExistsError:
        if keep_existing():
            return False
    except OSError:  # no hard links here (some network and FAT file systems)
        if os.path.exists(target) and keep_existing():
            return False
    os.replace(temp, target)
    return True


def cache_dir() -> Path:
    """mixle's cache root: ``$MIXLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixle``, else
    ``~/.cache/mixle`` (row indexes, NIfTI and ``.npz`` copies, fetched chunks)."""
    explicit = os.environ.get("MIXLE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mixle"


def env_byte_budget(name: str, default: int, what: str) -> int:
    """The byte budget environment variable ``name`` sets, else ``default``.

    ``what`` says what the bytes are, for the error.

    Raises
    ------
    ValueError
        When the variable is set but is not a whole number of bytes >= 0.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        budget = int(raw.strip())
    except ValueError:
        budget = -1
    if budget < 0:
        raise ValueError(
            f"{name}={raw!r} must be a whole number of bytes >= 0 (the most bytes of {what}; "
            f"unset: {default})"
        )
    return budget
