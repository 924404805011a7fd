"""Keep credentials out of reprs, logs and error messages."""

from __future__ import annotations

import os
import re

__all__ = ["display_path", "redact_text"]

_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@")
_QUERY = re.compile(r"\?.*$")
#: A URL anywhere in free text (up to whitespace or a quote).
_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]+")


def display_path(path: object) -> str:
    """A path or URL safe to show: userinfo (``user:secret@``) and query strings removed."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    if "://" not in text:
        return text
    return _QUERY.sub("", _USERINFO.sub(r"\1***@", text))


def redact_text(text: str, secrets: object = None) -> str:
    """``text`` with every URL passed through :func:`display_path` and ``secrets`` masked.

    ``secrets`` is any nest of dicts, lists and strings (such as ``storage_options``); every
    string of four or more characters in it is replaced by ``***`` wherever it occurs.
    """
    text = _URL_IN_TEXT.sub(lambda m: display_path(m.group(0)), text)
    for value in sorted(_strings(secrets), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value) >= 4 else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple, set)):
        return [s for v in value for s in _strings(v)]
    return []
