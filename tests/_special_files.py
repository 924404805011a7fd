"""Test helper: put a special file (FIFO, /dev/zero link, socket) where a file was or goes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: The kinds :func:`make_special` makes.
SPECIAL_KINDS = ("fifo", "/dev/zero", "socket")


def make_special(path: Path, kind: str, held: list[socket.socket]) -> None:
    """Replace ``path`` (if it exists) by a special file of ``kind``.

    Sockets stay bound while the caller keeps them in ``held`` (close them when done).
    """
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.append(sock)
        sock.bind(str(path))
    else:
        raise ValueError(f"kind={kind!r} must be one of {SPECIAL_KINDS}")
