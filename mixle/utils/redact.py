"""Keep credentials out of reprs, logs and error messages."""

from __future__ import annotations

import os
import re

__all__ = ["display_path", "from_network_client", "is_safe_error", "redact_text", "scrub_error"]

_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@")
_QUERY = re.compile(r"\?.*$")
#: Top-level packages of network clients: their errors keep the request they failed (URL,
#: headers), so none of them is left in a chain mixle raises.
_NETWORK_CLIENTS = frozenset(
    {"aiohttp", "aiobotocore", "botocore", "urllib3", "requests", "httpx", "obstore"}
)
#: Attributes of an error that hold the request or response it came from.
_REQUEST_ATTRS = ("request_info", "request", "response", "headers", "url", "real_url")
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


def scrub_error(exc: BaseException, secrets: object = None) -> BaseException:
    """``exc`` made safe to raise, in place: its text redacted, a chain with secrets dropped.

    The ``__cause__``/``__context__`` chain is dropped when any error in it comes from a
    network client (aiohttp, botocore...: they keep the failed request, ``Authorization``
    header included), holds request attributes, or has text that :func:`redact_text`
    changes. The string arguments (and an ``OSError``'s ``filename``) of a builtin or
    mixle error are redacted. Returns ``exc``.
    """
    if not (_safe_chain(exc.__cause__, secrets) and _safe_chain(exc.__context__, secrets)):
        exc.__cause__ = None
        exc.__context__ = None
        exc.__suppress_context__ = True
    module = type(exc).__module__
    if module == "builtins" or module.split(".")[0] == "mixle":
        args = tuple(redact_text(a, secrets) if isinstance(a, str) else a for a in exc.args)
        if args != exc.args:
            exc.args = args
        if isinstance(exc, OSError) and isinstance(exc.filename, str):
            exc.filename = redact_text(exc.filename, secrets)
    return exc


def is_safe_error(exc: BaseException, secrets: object = None) -> bool:
    """Whether ``exc`` and its chain show no secret (see :func:`scrub_error`)."""
    return _safe_chain(exc, secrets)


def _safe_chain(exc: BaseException | None, secrets: object) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if not _safe_one(exc, secrets) or not _safe_chain(exc.__cause__, secrets):
            return False
        exc = exc.__context__
    return True


def from_network_client(exc: BaseException) -> bool:
    """Whether ``exc`` is an error class of a network client (aiohttp, botocore...)."""
    return any(cls.__module__.split(".")[0] in _NETWORK_CLIENTS for cls in type(exc).__mro__)


def _safe_one(exc: BaseException, secrets: object) -> bool:
    if from_network_client(exc):
        return False
    if any(getattr(exc, name, None) is not None for name in _REQUEST_ATTRS):
        return False
    try:
        texts = [str(exc), repr(exc)]
    except Exception:  # an error that cannot even be shown is not shown
        return False
    return all(redact_text(text, secrets) == text for text in texts)
