"""Keep credentials out of reprs, logs and error messages."""

from __future__ import annotations

import os
import re

__all__ = ["display_path"]

_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@")
_QUERY = re.compile(r"\?.*$")


def display_path(path: object) -> str:
    """A path or URL safe to show: userinfo (``user:secret@``) and query strings removed."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    if "://" not in text:
        return text
    return _QUERY.sub("", _USERINFO.sub(r"\1***@", text))
