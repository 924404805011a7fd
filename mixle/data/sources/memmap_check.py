"""Guard memory maps against files cut short or replaced while a source has them open.

Touching a mapped page past the end of a truncated file kills the process with ``SIGBUS``.
Sources that map files call :func:`check_mapped_file` before each read (one ``stat``,
about a microsecond) and raise :class:`FileChangedError` instead.
"""

from __future__ import annotations

import os

__all__ = ["FileChangedError", "check_mapped_file", "file_identity"]


class FileChangedError(OSError):
    """A mapped file was truncated, replaced or deleted after the source opened it."""


def file_identity(path: str) -> tuple[int, int]:
    """``(device, inode)`` of ``path``: which file a map was made from."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_mapped_file(path: str, needed: int, identity: tuple[int, int] | None) -> None:
    """Raise :class:`FileChangedError` unless ``path`` still holds ``needed`` bytes.

    Parameters
    ----------
    path
        The mapped file.
    needed
        Bytes the map covers from the start of the file (offset + mapped length).
    identity
        :func:`file_identity` when the map was made (``None`` skips the replaced check).

    Notes
    -----
    A check, not a lock: a file truncated between the check and the copy can still fault.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileChangedError(
            f"path={path!r} was deleted after it was opened; open the source again"
        ) from None
    if identity is not None and (st.st_dev, st.st_ino) != identity:
        raise FileChangedError(
            f"path={path!r} was replaced by another file after it was opened; open the "
            "source again to read the new file"
        )
    if st.st_size < needed:
        raise FileChangedError(
            f"path={path!r} was truncated to {st.st_size} bytes after it was opened, but the "
            f"array needs {needed}; reading it would crash the process (SIGBUS), so mixle "
            "refuses: restore the file or open the source again"
        )
