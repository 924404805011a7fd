"""Options mixle gives the fsspec file systems it reads through: request timeouts, pools.

No request waits on a silent peer for long: over HTTP every request carries mixle's
timeout (:attr:`~mixle.reading.policy.RetryPolicy.timeout`: to connect, for the first byte,
between two bytes; :func:`request_options`), file systems fsspec makes from a URL get it in
their ``storage_options`` (:func:`timed_storage_options`), and s3fs file systems mixle reads
through get it as botocore's ``connect_timeout``/``read_timeout`` together with a
connection pool as wide as a batch's requests (:func:`widen_connection_pool`; s3fs's
default is 10). Timeouts set in ``storage_options`` win.
"""

from __future__ import annotations

import sys
import urllib.parse
from typing import Any

from mixle.reading.inflight import MAX_INFLIGHT_REQUESTS
from mixle.reading.policy import retry_policy
from mixle.utils.redact import display_path

__all__ = [
    "query_as_params",
    "is_http",
    "request_options",
    "session_timeout",
    "timed_storage_options",
    "widen_connection_pool",
]


def widen_connection_pool(fs: Any) -> Any:
    """``fs``, or for an s3fs file system a copy with mixle's pool size and timeouts.

    s3fs keeps at most ``max_pool_connections`` (default 10) requests in flight, so a batch of
    a hundred chunk requests would wait in rounds of ten, and its botocore client waits
    ``connect_timeout``/``read_timeout`` seconds of s3fs's choosing. An s3fs ``fs`` whose
    ``config_kwargs`` leave any of the three unset is reopened with the same options plus
    ``max_pool_connections=MAX_INFLIGHT_REQUESTS`` and both timeouts at the retry policy's
    :attr:`~mixle.reading.policy.RetryPolicy.timeout`; values the user set are kept, and
    any other file system is returned as it is.
    """
    if not type(fs).__module__.startswith("s3fs"):
        return fs
    config = dict(getattr(fs, "config_kwargs", None) or {})
    seconds = retry_policy().timeout
    wanted = {
        "max_pool_connections": MAX_INFLIGHT_REQUESTS,
        "connect_timeout": seconds,
        "read_timeout": seconds,
    }
    missing = {name: value for name, value in wanted.items() if name not in config}
    if not missing or not hasattr(fs, "storage_options"):
        return fs
    options = dict(fs.storage_options)
    options["config_kwargs"] = {**config, **missing}
    return type(fs)(**options)


_NO_TIMEOUT = object()
#: The session timeouts :func:`session_timeout` made, by seconds: mixle's, not the user's.
_OWN_SESSION_TIMEOUTS: dict[float, Any] = {}


def session_timeout(seconds: float) -> Any:
    """An aiohttp ``ClientTimeout(sock_connect=seconds, sock_read=seconds)`` for a session.

    For a file system mixle builds itself (opening a zarr URL): :func:`request_options`
    knows it as mixle's, so later requests still carry the retry policy's timeout of the
    moment instead of counting it as one the user chose.
    """
    import aiohttp  # fsspec's HTTP file system is built on it

    own = _OWN_SESSION_TIMEOUTS.get(seconds)
    if own is None:
        made = aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)
        own = _OWN_SESSION_TIMEOUTS.setdefault(seconds, made)
    return own


#: URL schemes served by fsspec's HTTP file system (aiohttp sessions).
_HTTP_SCHEMES = frozenset({"http", "https"})
#: URL schemes served by s3fs (botocore clients).
_S3_SCHEMES = frozenset({"s3", "s3a"})


def timed_storage_options(location: Any, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` for opening ``location``, plus the retry policy's request timeout.

    For a file system fsspec makes from a URL (zarr's, ``mixle inspect``'s), with ``t`` the
    :attr:`~mixle.reading.policy.RetryPolicy.timeout`:

    - HTTP(S): ``client_kwargs={"timeout": session_timeout(t)}`` for the aiohttp session,
      so every request on it (zarr's own included) stops waiting on a silent peer after
      ``t`` seconds; known as mixle's, so :func:`request_options` still gives later
      requests the policy's timeout of the moment.
    - S3 (``s3://``, ``s3a://``): botocore's ``connect_timeout`` and ``read_timeout`` in
      ``config_kwargs``.

    In a chained URL (``simplecache::s3://...``) they go to the target's own options, which
    fsspec takes keyed by its protocol (``{"s3": {...}}``). A timeout the user set wins
    (``timeout=``, or one inside ``client_kwargs`` / ``config_kwargs``). Other locations
    (other schemes, store objects) get a copy of the options as they are (``{}`` for
    ``None``). The caller's dicts are never changed.
    """
    options = dict(storage_options or {})
    if not isinstance(location, str):
        return options
    seconds = retry_policy().timeout
    if "::" in location:  # a chain (simplecache::s3://...): fsspec keys the target's by protocol
        target = location.rsplit("::", 1)[1]
        scheme = target.partition("://")[0].lower() if "://" in target else ""
        if scheme in _HTTP_SCHEMES or scheme in _S3_SCHEMES:
            options[scheme] = _with_timeout(scheme, dict(options.get(scheme) or {}), seconds)
        return options
    scheme = location.partition("://")[0].lower() if "://" in location else ""
    return _with_timeout(scheme, options, seconds)


def _with_timeout(scheme: str, options: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``options`` (a copy, changed in place) with ``seconds`` set for ``scheme``'s requests."""
    if scheme in _HTTP_SCHEMES:
        client = dict(options.get("client_kwargs") or {})
        if "timeout" not in options and "timeout" not in client:
            client["timeout"] = session_timeout(seconds)
            options["client_kwargs"] = client
    elif scheme in _S3_SCHEMES:
        config = dict(options.get("config_kwargs") or {})
        for name in ("connect_timeout", "read_timeout"):
            config.setdefault(name, seconds)
        options["config_kwargs"] = config
    return options


def _is_own_session_timeout(timeout: Any) -> bool:
    return any(timeout is own for own in list(_OWN_SESSION_TIMEOUTS.values()))


def request_options(fs: Any) -> dict[str, Any]:
    """Keyword arguments that give one request on ``fs`` mixle's timeout, or ``{}``.

    For fsspec's HTTP file system, ``{"timeout": aiohttp.ClientTimeout(sock_connect=t,
    sock_read=t)}`` with ``t`` the retry policy's
    :attr:`~mixle.reading.policy.RetryPolicy.timeout` (no cap on the whole transfer, which
    the batch deadline bounds), unless the user's ``storage_options`` chose a timeout for
    requests (``timeout=``) or for the session (``client_kwargs={"timeout": ...}``): then
    theirs applies. Other file systems take their timeouts when they are made.
    """
    if not is_http(fs):
        return {}
    if "timeout" in (getattr(fs, "kwargs", None) or {}):
        return {}
    session = (getattr(fs, "client_kwargs", None) or {}).get("timeout", _NO_TIMEOUT)
    if session is not _NO_TIMEOUT and not _is_own_session_timeout(session):
        return {}
    import aiohttp  # fsspec's HTTP file system is built on it

    seconds = retry_policy().timeout
    return {"timeout": aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)}


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP file system (never imports fsspec to find out)."""
    http = sys.modules.get("fsspec.implementations.http")  # loaded if fs is one
    return http is not None and isinstance(fs, http.HTTPFileSystem)


def query_as_params(path: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """An HTTP(S) URL with a query string as the URL without it, the query sent as ``params``.

    zarr appends each key to the store's URL, which would put ``/zarr.json`` inside the
    query of a presigned ``https://host/a.zarr?token=...``. fsspec's HTTP file system sends
    its ``params`` option (the query's decoded pairs, which aiohttp encodes again) with every
    request instead, so each key goes into the path and the query stays at the end, where
    the server reads it: the same names and values, in the same order, though a character
    the URL escaped needlessly (``%2F``) may travel unescaped.
    Other paths, and URLs without a query, are returned as they are.

    Raises
    ------
    ValueError
        When ``storage_options`` has ``params`` too (the URL is named without its query).
    """
    if not isinstance(path, str):
        return path, options
    parts = urllib.parse.urlsplit(path)
    if parts.scheme.lower() not in ("http", "https") or not parts.query:
        return path, options
    if "params" in options:
        raise ValueError(
            f"path={display_path(path)!r} has a query string and storage_options has "
            "params= as well: give the query once, in the URL or in params"
        )
    params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    return urllib.parse.urlunsplit(parts._replace(query="")), {**options, "params": params}
