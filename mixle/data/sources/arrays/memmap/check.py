"""Guard memory maps against files cut short or replaced while a source has them open.

Touching a mapped page past the end of a truncated file kills the process with ``SIGBUS``.
Sources that map files call :func:`check_mapped_file` before each read (one ``stat``,
about a microsecond) and raise :class:`FileChangedError` instead.

Sources that read a file through offsets computed earlier (the row index of a CSV or JSON
lines file) compare its :func:`file_signature` with the one taken at open
(:func:`check_file_unchanged`) and raise the same error.
"""

from __future__ import annotations

import os

from mixle.errors import FileChangedError

__all__ = [
    "FileChangedError",
    "FileSignature",
    "ROW_OFFSETS_RISK",
    "check_file_unchanged",
    "check_mapped_file",
    "file_identity",
    "file_signature",
]


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


#: ``(device, inode, size, mtime_ns, ctime_ns)`` of one version of a file.
FileSignature = tuple[int, int, int, int, int]


def file_signature(st: os.stat_result) -> FileSignature:
    """What changes when a file is replaced or written: ``(device, inode, size, mtime, ctime)``.

    The status-change time (``ctime``) moves on every write and cannot be set back (unlike
    the modification time, which ``rsync -t`` or ``touch -d`` restore), so a rewrite of the
    same size with the old modification time still changes the signature.
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: What a changed file would cost a row index (the text sources' reason to refuse).
ROW_OFFSETS_RISK = "row offsets read before the change would return wrong rows"


def check_file_unchanged(
    path: str,
    signature: FileSignature | None,
    now: FileSignature | None = None,
    *,
    needed: int | None = None,
    risk: str = ROW_OFFSETS_RISK,
) -> None:
    """Raise :class:`FileChangedError` unless ``path`` still has ``signature``.

    Parameters
    ----------
    path
        The file, named in the error.
    signature
        :func:`file_signature` when the file was opened; ``None`` checks only that the
        file still exists.
    now
        The signature of the open file now, if the caller has it (``os.fstat`` of a
        descriptor): when it equals ``signature`` nothing else is done; by default (or when
        it differs, to say what changed) ``path`` is stat-ed.
    needed
        Bytes a memory map of the file covers: a file cut below it is named as truncated
        (reading the map past the end would kill the process with ``SIGBUS``).
    risk
        What reading the changed file would do, for the message.

    Notes
    -----
    One ``stat``. Besides content changes it reports changes of permissions, owner or
    links (they move ``ctime`` too). A write within the timestamp granularity of the
    file system (a few milliseconds) of the moment the signature was taken, that keeps the
    size, is not seen.
    """
    if now is not None and now == signature:
        return
    try:  # the path is stat-ed in any case, to name the most telling change
        named = file_signature(os.stat(path))
    except FileNotFoundError:
        raise FileChangedError(
            f"path={path!r} was deleted after it was opened; open the source again"
        ) from None
    if now is None:
        now = named
    if signature is None or now == signature:
        return
    if needed is not None and now[2] < needed:
        raise FileChangedError(
            f"path={path!r} was truncated to {now[2]} bytes after it was opened, but the "
            f"array needs {needed}; reading it would crash the process (SIGBUS), so mixle "
            "refuses: restore the file or open the source again"
        )
    if named[:2] != signature[:2]:
        raise FileChangedError(
            f"path={path!r} was replaced by another file after it was opened; open the "
            "source again to read the new file"
        )
    if now[2] != signature[2]:
        change = f"changed size from {signature[2]} to {now[2]} bytes"
    else:
        change = "was written in place (or its permissions, owner or links changed)"
    raise FileChangedError(
        f"path={path!r} {change} after it was opened; {risk}, so mixle refuses: open the "
        "source again"
    )
