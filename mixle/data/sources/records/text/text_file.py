"""The file under a CSV or JSON lines source: opened read-only, its descriptor owned.

:func:`open_text_file` opens a regular file (a FIFO, device or directory is refused before
any byte is read); :class:`Descriptor` closes its descriptor once, at ``close()`` or when it
is collected; :class:`TextHandle` is what a source holds while the file is open, and
:class:`LineLookup` finds the line of a row only when an error message needs it.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.arrays.memmap.check import FileSignature
from mixle.data.sources.records.text.row_index import RowIndex
from mixle.data.sources.records.text.row_scan import line_number
from mixle.utils.files import open_regular_file

__all__ = ["BOM", "Descriptor", "LineLookup", "TextHandle", "open_text_file"]

#: The UTF-8 byte-order mark, skipped at the start of a file.
BOM = b"\xef\xbb\xbf"


def open_text_file(path: str | os.PathLike[str], what: str) -> tuple[int, str]:
    """Open the regular file ``path`` read-only; return the descriptor and the real path.

    A FIFO, device, socket or directory is refused by ``fstat`` of the opened descriptor
    (the open itself does not block on a FIFO), before any byte is read.

    Raises
    ------
    FileNotFoundError, SpecialFileError, TypeError
        With the argument, the value and what would have been accepted.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path={path!r} must be a str or os.PathLike naming a {what} file")
    text = os.fspath(path)
    try:
        with open_regular_file(text, f"{what} path") as raw:
            fd = os.dup(raw.fileno())  # non-inheritable, like the original
    except FileNotFoundError:
        raise FileNotFoundError(
            f"path={text!r} does not exist (looked in {os.path.abspath(text)!r}); pass the "
            f"path of a {what} file"
        ) from None
    return fd, os.path.realpath(text)


def _close_fd(fd: int) -> None:
    """Close ``fd`` (a finalizer), ignoring one already closed."""
    with contextlib.suppress(OSError):
        os.close(fd)


class Descriptor:
    """Owns one open descriptor: :meth:`close` closes it once, and so does garbage collection.

    The finalizer holds the number, never the source or its handle, so a source dropped
    without ``close()`` releases its descriptor as soon as it is collected (in a forked
    child too: the child's copy of the number is closed, the parent's is its own).
    """

    __slots__ = ("__weakref__", "close", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.close = weakref.finalize(self, _close_fd, fd)


@dataclass
class TextHandle:
    """An open text file: its descriptor, where rows start, and the format's parse state."""

    fd: int
    real_path: str
    data_start: int
    skip_rows: int
    names: list[str]
    selected: list[str]
    index: RowIndex | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: :func:`~mixle.data.sources.arrays.memmap.check.file_signature` of the file when opened.
    signature: FileSignature = (0, 0, 0, 0, 0)
    #: Owns ``fd``: closes it once, at ``close()`` or when the handle is garbage-collected.
    owner: Descriptor | None = None


class LineLookup:
    """Line numbers of rows by their position in a batch, computed only when asked (errors)."""

    def __init__(
        self, fd: int, offsets: Sequence[int] | NDArray[np.int64], lone_cr: bool = False
    ) -> None:
        self._fd = fd
        self._offsets = offsets
        self._lone_cr = lone_cr

    def __call__(self, j: int) -> int:
        return line_number(self._fd, int(self._offsets[j]), lone_cr=self._lone_cr)
