"""Remote objects fetched through obstore (Rust ``object_store``), checked, capped, retried.

The fsspec path (:mod:`mixle.reading.fetch`) spends about 2 ms of Python per request on
aiobotocore's hooks, signing and date parsing, under the GIL. obstore builds, signs and
sends every request in Rust: a batch's requests are all in flight from one call, with no
per-request Python beyond the awaitable. :func:`choose_client` picks it for a URL when
obstore is installed (``pip install -e ".[obstore]"`` in the mixle checkout), the scheme is
``s3://``, ``gs://``, ``az://`` or ``http(s)://`` and every ``storage_options`` entry maps
to obstore's configuration; otherwise the fsspec path reads, as before.

:class:`ObjectClient` keeps the fsspec path's contract: every answer is checked before its
bytes are used (the range obstore reports against the one asked, the body's length
against that range, a server that ignores ``Range`` against a ``HEAD``'s size), a download
never passes its ``limit``, requests carry the retry policy's timeouts, and mixle retries
(obstore's own retries are off, so one policy counts the tries). Errors name the URL and
key, never credentials.

obstore runs on a tokio runtime whose threads do not survive ``fork``: a process forked
after the runtime ran would hang on its first request. There :func:`choose_client` gives
``None`` (the fsspec path reads the same bytes) with ``backend="auto"``, and raises with
``backend="obstore"``.
"""

from __future__ import annotations

import atexit
import contextvars
import datetime
import errno
import gc
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mixle.errors import ReadsStopped
from mixle.reading.faults import (
    CorruptChunkError,
    RangeMismatchError,
    RemoteReadError,
    retry_call,
)
from mixle.reading.policy import retry_policy
from mixle.reading.ranges import (
    ByteSpan,
    is_text,
    range_header,
    remember_size,
    remembered_size,
    resolve_span,
)
from mixle.utils.optional_deps import imported
from mixle.utils.processes import threads_named
from mixle.utils.redact import display_path, redact_text

__all__ = [
    "BACKENDS",
    "OBJECT_STORE_SCHEMES",
    "ObjectClient",
    "ObstoreUnsupported",
    "check_backend",
    "choose_client",
    "object_version",
    "obstore_usable",
    "run_batch",
]

#: The values of ``backend=``: ``"auto"`` (obstore where it can read the URL, else fsspec),
#: ``"obstore"`` (obstore or an error saying why not), ``"fsspec"`` (today's path).
BACKENDS = ("auto", "obstore", "fsspec")
#: URL schemes obstore reads, by the store class that reads them.
OBJECT_STORE_SCHEMES = {
    "s3": "S3Store",
    "s3a": "S3Store",
    "gs": "GCSStore",
    "gcs": "GCSStore",
    "az": "AzureStore",
    "abfs": "AzureStore",
    "abfss": "AzureStore",
    "http": "HTTPStore",
    "https": "HTTPStore",
}
#: Bytes of a whole-object answer (a server that ignores ``Range``) read at a time.
_STREAM_BLOCK_BYTES = 1024 * 1024
#: fsspec options that change nothing obstore does (caches, listings, block sizes).
_HARMLESS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",
        "asynchronous",
        "block_size",
        "simple_links",
        "same_scheme",
        "size_policy",
        "cache_type",
        "use_ssl",
    }
)
#: botocore ``config_kwargs`` obstore has no use for: the pool (reqwest's grows as needed),
#: botocore's own retries (mixle retries).
_S3_CONFIG_HARMLESS = frozenset({"max_pool_connections", "retries"})


T = TypeVar("T")


class ObstoreUnsupported(ValueError):
    """``backend="obstore"`` for a URL or ``storage_options`` obstore cannot read."""


def check_backend(backend: object) -> str:
    """``backend`` checked: one of :data:`BACKENDS`.

    Raises
    ------
    ValueError
        Naming the value and the accepted ones.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}: 'auto' "
            "reads through obstore where it can, 'obstore' insists, 'fsspec' keeps fsspec"
        )
    return backend


# -- fork safety ----------------------------------------------------------------------------

#: Names (``/proc/self/task/*/comm``) of the threads of obstore's tokio runtime.
_RUNTIME_THREAD_PREFIXES = ("tokio-rt", "tokio-runtime")
#: Whether this process was forked (here or in an ancestor) while obstore's runtime ran.
_forked_after_runtime = False
#: Set just before each fork: whether the forking process has obstore's runtime running.
_runtime_at_fork = False
#: The pid of the process that started obstore's runtime through mixle, if any.
_runtime_pid: int | None = None


def _before_fork() -> None:
    # obstore imported but never used has no runtime, and works in the child. Where the
    # threads cannot be listed, a runtime mixle started counts as running.
    global _runtime_at_fork
    if imported("obstore") is None:
        _runtime_at_fork = False
        return
    threads = threads_named(_RUNTIME_THREAD_PREFIXES)
    _runtime_at_fork = threads is True or (threads is None and _runtime_pid is not None)


def _after_fork_in_child() -> None:
    global _forked_after_runtime
    _forked_after_runtime = _forked_after_runtime or _runtime_at_fork
    # the parent's stores belong to the parent's runtime: kept, never used again here
    _PARENTS_STORES.append(dict(_CLIENT_STORES))
    _CLIENT_STORES.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _collect_before_exit() -> None:
    # An obstore answer dropped unread (a refused oversized body) and left to the
    # interpreter's teardown was seen to abort the process at exit (SIGABRT) now and then:
    # its Rust side ran while Python finalised. Collected here, it is dropped while Python
    # still runs.
    gc.collect()


def obstore_usable() -> str | None:
    """``None`` when obstore can read here, else why not (not installed, forked)."""
    if _forked_after_runtime:
        return (
            "this process was forked from one where obstore's tokio runtime ran, and that "
            "runtime's threads do not survive fork (a request would hang); start worker "
            "processes with 'spawn' or 'forkserver'"
        )
    try:
        import obstore  # noqa: F401
    except ImportError:
        return 'obstore is not installed (pip install -e ".[obstore]" in the mixle checkout)'
    return None


# -- storage_options -> obstore configuration ----------------------------------------------


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def _header_safe(name: str, value: object) -> None:
    """Refuse a value an HTTP header cannot carry (object_store would panic on it)."""
    if not isinstance(value, str) or not all(32 <= ord(c) < 127 for c in value):
        raise ObstoreUnsupported(f"{name}= (a value an HTTP header cannot carry)")


def _seconds(name: str, value: object) -> datetime.timedelta:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ObstoreUnsupported(f"config_kwargs={{{name!r}: ...}} (not a number of seconds)")
    return _timedelta(value)


def _map_s3(options: dict[str, Any], config: dict[str, Any], client: dict[str, Any]) -> None:
    for name, value in options.items():
        if name in _HARMLESS or value is None:  # s3fs takes None as not given
            continue
        if name == "key":
            _header_safe(name, value)
            config["access_key_id"] = value
        elif name == "secret":
            _header_safe(name, value)
            config["secret_access_key"] = value
        elif name == "token":
            _header_safe(name, value)
            config["session_token"] = value
        elif name == "anon":
            if value:
                config["skip_signature"] = True
        elif name == "endpoint_url":
            config["endpoint"] = value
        elif name == "requester_pays":
            if value:
                config["request_payer"] = True
        elif name == "client_kwargs" and isinstance(value, dict):
            for inner, got in value.items():
                if got is None:
                    continue
                if inner == "endpoint_url":
                    config["endpoint"] = got
                elif inner == "region_name":
                    config["region"] = got
                else:
                    raise ObstoreUnsupported(f"client_kwargs={{{inner!r}: ...}}")
        elif name == "config_kwargs" and isinstance(value, dict):
            for inner, got in value.items():
                if got is None:
                    continue
                if inner in ("connect_timeout", "read_timeout"):
                    client[inner] = _seconds(inner, got)
                elif inner == "signature_version":
                    if type(got).__name__ == "UNSIGNED":  # botocore.UNSIGNED: anonymous
                        config["skip_signature"] = True
                    elif got not in ("s3v4", "v4"):
                        raise ObstoreUnsupported("config_kwargs={'signature_version': ...}")
                elif inner == "s3" and isinstance(got, dict) and set(got) <= {"addressing_style"}:
                    style = got.get("addressing_style")
                    if style not in ("path", "virtual", "auto", None):
                        raise ObstoreUnsupported("config_kwargs={'s3': {'addressing_style': ...}}")
                    config["virtual_hosted_style_request"] = style == "virtual"
                elif inner not in _S3_CONFIG_HARMLESS:
                    raise ObstoreUnsupported(f"config_kwargs={{{inner!r}: ...}}")
        else:
            raise ObstoreUnsupported(f"{name}=")
    endpoint = config.get("endpoint")
    if isinstance(endpoint, str) and endpoint.startswith("http://"):
        client["allow_http"] = True


def _map_gcs(options: dict[str, Any], config: dict[str, Any], client: dict[str, Any]) -> None:
    for name, value in options.items():
        if name in _HARMLESS or name == "project" or value is None:
            continue
        if name == "token" and value == "google_default":
            continue  # obstore's default credential chain
        if name == "token" and value == "anon":
            config["skip_signature"] = True
        elif name == "token" and value in ("cache", "browser", "cloud"):
            raise ObstoreUnsupported(f"token={value!r} (a gcsfs sign-in flow)")
        elif name == "token" and isinstance(value, (str, os.PathLike)):
            config["google_service_account"] = os.fspath(value)
        elif name == "endpoint_url":
            config["base_url"] = value
            if str(value).startswith("http://"):
                client["allow_http"] = True
        else:
            raise ObstoreUnsupported(f"{name}=")


def _map_azure(options: dict[str, Any], config: dict[str, Any], client: dict[str, Any]) -> None:
    names = {
        "account_name": "account_name",
        "account_key": "account_key",
        "sas_token": "sas_key",
        "client_id": "client_id",
        "client_secret": "client_secret",
        "tenant_id": "tenant_id",
    }
    for name, value in options.items():
        if name in _HARMLESS or value is None:
            continue
        if name in names:
            _header_safe(name, value)
            config[names[name]] = value
        elif name == "anon":
            if value:
                config["skip_signature"] = True
        else:
            raise ObstoreUnsupported(f"{name}=")


def _map_http(options: dict[str, Any], config: dict[str, Any], client: dict[str, Any]) -> None:
    del config  # HTTPStore has no configuration beyond its client options
    headers: dict[str, str] = {}
    for name, value in options.items():
        if name in _HARMLESS or name == "encoded" or value is None:
            continue
        if name == "headers" and isinstance(value, dict):
            headers.update({str(k): str(v) for k, v in value.items()})
        elif name == "client_kwargs" and isinstance(value, dict) and set(value) <= {"headers"}:
            headers.update({str(k): str(v) for k, v in (value.get("headers") or {}).items()})
        else:
            raise ObstoreUnsupported(f"{name}=")
    for header, text in headers.items():
        _header_safe(f"headers={{{header!r}: ...}}", text)
    if headers:
        client["default_headers"] = headers


_MAPPERS = {
    "S3Store": _map_s3,
    "GCSStore": _map_gcs,
    "AzureStore": _map_azure,
    "HTTPStore": _map_http,
}


def _split_root(url: str, kind: str) -> tuple[str, str]:
    """``(bucket or container or base URL, prefix)`` of the store root ``url``."""
    parts = urllib.parse.urlsplit(url)
    if kind == "HTTPStore":
        return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/"))), ""
    return parts.netloc, parts.path.strip("/")


# -- the client ------------------------------------------------------------------------------

#: ``(pid, client identity) -> obstore store``: one store (one connection pool) per process.
_CLIENT_STORES: dict[tuple[Any, ...], Any] = {}
_STORES_LOCK = threading.Lock()
#: Stores a forked child inherited (held, not dropped: their runtime is the parent's).
_PARENTS_STORES: list[dict[tuple[Any, ...], Any]] = []


@dataclass(frozen=True, eq=False)
class ObjectClient:
    """Checked, capped reads of the objects under one store root URL through obstore.

    Made by :func:`choose_client`. Pickles by its URL and options; each process builds its
    own obstore store on first use. ``secrets`` (the ``storage_options``) are masked in
    every message.

    Attributes
    ----------
    url
        The store root (``s3://bucket/prefix``, ``https://host/path``), no query string.
    kind
        The obstore store class that reads it (``"S3Store"``...).
    config, client_options
        obstore's configuration, mapped from the ``storage_options``.
    secrets
        The ``storage_options`` as given (masked in messages).
    """

    url: str
    kind: str
    config: Mapping[str, Any] = field(repr=False)
    client_options: Mapping[str, Any] = field(repr=False)
    secrets: Any = field(default=None, repr=False)

    @property
    def display(self) -> str:
        """The root URL, safe to show."""
        return display_path(self.url)

    @property
    def cache_store(self) -> str:
        """What names this store in a cache key: the root URL, and the endpoint (S3, GCS)
        or account (Azure) where one is set, so that two servers' ``bucket/key`` differ."""
        where = self.config.get("endpoint") or self.config.get("base_url")
        where = where or self.config.get("account_name")
        return self.display if not where else f"{self.display} at {display_path(str(where))}"

    def __repr__(self) -> str:
        return f"ObjectClient({self.display!r}, {self.kind})"

    def _timeouts(self) -> dict[str, Any]:
        policy = retry_policy()
        chosen = dict(self.client_options)
        chosen.setdefault("connect_timeout", _timedelta(policy.timeout))
        chosen.setdefault("read_timeout", _timedelta(policy.timeout))
        # obstore's whole-request timeout (30 s by default) would cut a slow large
        # download that still moves; the batch deadline bounds it instead
        total = policy.deadline if policy.deadline != float("inf") else 7 * 86400
        chosen.setdefault("timeout", _timedelta(total))
        return chosen

    def store(self) -> Any:
        """This process's obstore store for :attr:`url` (built on first use).

        Raises
        ------
        RuntimeError
            In a process forked after obstore's runtime ran (see :func:`obstore_usable`).
        """
        why = obstore_usable()
        if why is not None:
            raise RuntimeError(f"{self.display}: cannot read through obstore: {why}")
        client = self._timeouts()
        ident = (
            os.getpid(),
            self.url,
            self.kind,
            repr(sorted(self.config.items())),
            repr(sorted(client.items())),
        )
        with _STORES_LOCK:
            made = _CLIENT_STORES.get(ident)
            if made is None:
                made = self._build(client)
                _CLIENT_STORES[ident] = made
                while len(_CLIENT_STORES) > 256:  # clients of sources long gone
                    _CLIENT_STORES.pop(next(iter(_CLIENT_STORES)))
        return made

    def _build(self, client: dict[str, Any]) -> Any:
        global _runtime_pid
        from obstore import store as stores

        retry = {  # mixle retries: one try per call here
            "max_retries": 0,
            "backoff": {"init_backoff": _timedelta(0.01)},
            "retry_timeout": _timedelta(1),
        }
        base, prefix = _split_root(self.url, self.kind)
        cls = getattr(stores, self.kind)
        config = dict(self.config)
        failure = None
        try:
            if self.kind == "HTTPStore":
                made = cls.from_url(base, client_options=client, retry_config=retry)
            else:
                made = cls(
                    base,
                    prefix=prefix or None,
                    config=config,
                    client_options=client,
                    retry_config=retry,
                )
        except Exception as exc:  # told redacted, raised outside: no chain holds the options
            failure = redact_text(f"{type(exc).__name__}: {exc}", self.secrets)
        if failure is not None:
            raise ValueError(f"{self.display}: obstore refused the storage_options: {failure}")
        if _runtime_pid != os.getpid():
            atexit.register(_collect_before_exit)
        _runtime_pid = os.getpid()
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            ObjectClient,
            (self.url, self.kind, dict(self.config), dict(self.client_options), self.secrets),
        )

    # -- one request -----------------------------------------------------------------------
    async def fetch(
        self,
        key: str,
        span: ByteSpan,
        *,
        size: int | None = None,
        limit: int | None = None,
        seen: list[str | None] | None = None,
    ) -> bytes:
        """Bytes ``span`` of object ``key`` (relative to :attr:`url`), checked; one try.

        A range is asked as such (``(0, None)``, a whole object, as ``bytes=0-``, so no
        ``HEAD`` is sent); the answer's range must be the one asked (its end cut at the
        object's end) and its body that long. A server that ignores ``Range`` is asked the
        object's size once (a ``HEAD``, remembered) and its whole answer must be that long;
        only the bytes up to the range's end are read. ``limit`` caps one download: a
        longer answer raises :class:`CorruptChunkError` before its body is read. ``seen``,
        when given, gets the answer's version appended (:func:`object_version`: what a
        cache of these bytes is keyed by).

        Raises
        ------
        RangeMismatchError
            The answer is not the range asked (retried by the caller).
        CorruptChunkError
            The answer is longer than ``limit``.
        FileNotFoundError
            No such object.
        OSError
            Any other failure, with ``status`` (HTTP) or ``errno`` set so that
            :func:`~mixle.reading.faults.is_transient` can tell a transient one.
        """
        import obstore

        if _empty(span):
            return b""
        store = self.store()  # raises RuntimeError in a forked child: not a request error
        problem: BaseException | str | None = None
        try:
            result = await obstore.get_async(store, key, options=_options(span))
        except BaseException as exc:
            problem = self._translated(exc, key, span)
        # raised out here, not in the handler: no obstore error (its request, its URL) is
        # left on the chain of what mixle raises
        if problem == "not-partial":
            return await self._whole(store, key, span, size, limit, seen)
        if problem == "unsatisfiable" and await self._size(key) == 0:
            return b""  # bytes=0- of an empty object
        if problem is not None:
            raise self._error(problem, key, span)
        length = self._check_answer(key, span, result, limit)
        body = await self._body(result, length, key, span, more_is_error=True)
        _note(seen, result)
        return body

    async def _whole(
        self,
        store: Any,
        key: str,
        span: ByteSpan,
        size: int | None,
        limit: int | None,
        seen: list[str | None] | None,
    ) -> bytes:
        """``span`` out of a plain ``GET`` of ``key``, whose server ignored ``Range``."""
        import obstore

        problem: BaseException | str | None = None
        try:
            result = await obstore.get_async(store, key)
        except BaseException as exc:
            problem = self._translated(exc, key, span)
        if isinstance(problem, str):
            problem = RangeMismatchError(f"{self._where(key)}: the plain GET failed ({problem})")
        if problem is not None:
            raise problem
        declared = int(result.meta["size"])
        kind = _kind(result)
        known = self._known_size(key, size, declared)
        if known is None and span == (0, None) and not is_text(kind):
            known = declared  # a binary whole answer as long as it says: the object (no HEAD)
        if known is None:
            try:
                known = await self._size(key)
            except FileNotFoundError:  # a server refusing HEAD: obstore calls it not found
                raise RangeMismatchError(
                    f"{self._where(key)}: the server ignored Range and answered "
                    f"{range_header(span)} with the whole object, whose size a HEAD could "
                    "not learn"
                ) from None
            remember_size(self, self._where(key), known)
        want = self._whole_range(key, span, declared, known, limit, kind)
        body = await self._body(result, want[1], key, span, more_is_error=False)
        _note(seen, result)
        return self._cut(key, body, want, declared)

    async def _body(
        self, result: Any, length: int, key: str, span: ByteSpan, *, more_is_error: bool
    ) -> bytes:
        """The body of ``result``, read in blocks, never past ``length`` bytes and a block.

        ``more_is_error``: a body longer than ``length`` (a ranged answer whose body passes
        its ``Content-Range``) raises :class:`RangeMismatchError`, as a shorter one does;
        else reading stops at ``length`` (the rest is dropped with the connection).
        """
        parts: list[bytes] = []
        got = 0
        problem: BaseException | str | None = None
        try:
            async for part in result.stream(min_chunk_size=_STREAM_BLOCK_BYTES):
                got += len(part)
                if got > length and more_is_error:
                    break
                parts.append(part)
                if got >= length and not more_is_error:
                    break
        except BaseException as exc:  # the body failed (a stall, a dropped connection)
            problem = self._translated(exc, key, span)
        if isinstance(problem, str):
            where = f"{self._where(key)}: asked {range_header(span)}"
            problem = RangeMismatchError(f"{where}: {problem}")
        if problem is not None:
            raise problem
        if more_is_error and got != length:
            brought = "more" if got > length else str(got)
            raise RangeMismatchError(
                f"{self._where(key)}: asked {range_header(span)}, the answer claims {length} "
                f"bytes but brought {brought}"
            )
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def fetch_sync(
        self,
        key: str,
        span: ByteSpan,
        *,
        size: int | None = None,
        limit: int | None = None,
        seen: list[str | None] | None = None,
    ) -> bytes:
        """:meth:`fetch` from blocking code, on an event loop of the calling thread; one try.

        No other Python thread does the work while the caller waits (a cycle collection
        there could finalise h5py objects while the caller holds h5py's lock).
        """
        return run_batch(lambda: self.fetch(key, span, size=size, limit=limit, seen=seen))

    async def _size(self, key: str) -> int:
        import obstore

        store = self.store()
        problem: BaseException | str | None = None
        try:
            meta = await obstore.head_async(store, key)
        except BaseException as exc:
            problem = self._translated(exc, key, (0, None))
        if problem is not None:
            raise self._error(problem, key, (0, None))
        return int(meta["size"])

    def size_sync(self, key: str) -> int:
        """The size of object ``key`` (one ``HEAD``); one try."""
        return run_batch(lambda: self._size(key))

    def read(
        self,
        key: str,
        span: ByteSpan,
        *,
        url: str,
        name: str,
        size: int | None = None,
        limit: int | None = None,
    ) -> bytes:
        """:meth:`fetch_sync`, retried by the retry policy.

        ``url`` and ``name`` (the chunk or range) are what a
        :class:`~mixle.reading.faults.RemoteReadError` names.
        """
        return retry_call(
            lambda: self.fetch_sync(key, span, size=size, limit=limit),
            url=url,
            key=name,
            secrets=self.secrets,
        )

    # -- checks ------------------------------------------------------------------------------
    def _check_answer(self, key: str, span: ByteSpan, result: Any, limit: int | None) -> int:
        """The length the answer's range says, after checking it is the range asked."""
        got = tuple(result.range)
        total = int(result.meta["size"])
        want = resolve_span(span, total)
        if want is None or got != want:
            raise RangeMismatchError(
                f"{self._where(key)}: asked {range_header(span)}, the answer holds bytes "
                f"{got[0]}-{got[1] - 1} of {total}"
            )
        self._check_limit(got[1] - got[0], limit, key, span)
        return int(got[1] - got[0])

    def _known_size(self, key: str, size: int | None, declared: int) -> int | None:
        if size is not None:
            return size
        return remembered_size(self, self._where(key), b"", declared)

    def _whole_range(
        self,
        key: str,
        span: ByteSpan,
        declared: int,
        known: int,
        limit: int | None,
        kind: str = "",
    ) -> tuple[int, int]:
        """The part of a whole-object answer to keep (its server ignores ``Range``).

        ``kind`` is the answer's ``Content-Type`` (named in the error), if it has one.
        """
        if declared != known:
            raise RangeMismatchError(
                f"{self._where(key)}: asked {range_header(span)}, the server ignored Range "
                f"and sent {declared} bytes{kind and f' of {kind}'}, but the object has {known}"
            )
        want = resolve_span(span, known)
        if want is None:
            raise RangeMismatchError(
                f"{self._where(key)}: {range_header(span)} is past the end of the "
                f"{known}-byte object"
            )
        self._check_limit(want[1] - want[0], limit, key, span)
        return want

    def _cut(self, key: str, body: bytes, want: tuple[int, int], declared: int) -> bytes:
        if len(body) < want[1]:
            raise RangeMismatchError(
                f"{self._where(key)}: the server ignored Range and its {declared}-byte "
                f"answer ended after {len(body)} bytes"
            )
        return body[want[0] : want[1]]

    # -- errors ----------------------------------------------------------------------------
    def _where(self, key: str) -> str:
        return f"{self.display.rstrip('/')}/{key}" if key else self.display

    def _check_limit(self, nbytes: int, limit: int | None, key: str, span: ByteSpan) -> None:
        if limit is None or nbytes <= limit:
            return
        raise CorruptChunkError(
            f"{self._where(key)}: the answer to {range_header(span)} holds {nbytes} bytes, "
            f"more than the {limit} bytes this stored object may have: refused without "
            "reading it (the object is damaged or not what its metadata says)"
        )

    def _translated(self, exc: BaseException, key: str, span: ByteSpan) -> BaseException | str:
        """:meth:`_translate` of ``exc``; a ``KeyboardInterrupt``, a cancellation or any
        other ``BaseException`` but a Rust panic (pyo3's ``PanicException``) re-raised."""
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise exc
        return self._translate(exc, key, span)

    def _error(self, problem: BaseException | str, key: str, span: ByteSpan) -> BaseException:
        """``problem`` from :meth:`_translate` as the error to raise."""
        if isinstance(problem, BaseException):
            return problem
        return _with_status(
            OSError(f"{self._where(key)}: {range_header(span)} is not satisfiable"), 416
        )

    def _body_error(self, exc: BaseException, key: str, span: ByteSpan) -> BaseException:
        """mixle's error for ``exc``, raised while an answer's body was read."""
        problem = self._translate(exc, key, span)
        if isinstance(problem, BaseException):
            return problem
        return RangeMismatchError(f"{self._where(key)}: asked {range_header(span)}: {problem}")

    def _translate(self, exc: BaseException, key: str, span: ByteSpan) -> BaseException | str:
        """mixle's error for obstore's ``exc``, or ``"not-partial"``/``"unsatisfiable"``."""
        text = str(exc)
        where = self._where(key)
        told = redact_text(
            f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", self.secrets
        )
        if isinstance(exc, FileNotFoundError):
            return FileNotFoundError(f"{where}: no such object ({told})")
        if type(exc).__name__ == "PanicException":  # object_store refused what it was given
            return OSError(f"{where}: obstore failed ({told})")
        if "NotPartial" in text or "RangeNotSupported" in text or "non-partial" in text:
            return "not-partial"
        if "UnexpectedRange" in text or ("Requested " in text and ", got " in text):
            return RangeMismatchError(f"{where}: asked {range_header(span)}: {told}")
        status = _status(text)
        if status == 416:
            if span == (0, None):
                return "unsatisfiable"
            return _with_status(
                OSError(f"{where}: {range_header(span)} is not satisfiable ({told})"), 416
            )
        if status is not None:
            hint = ""
            if status == 301:
                hint = (
                    "; the bucket is in another region: set storage_options="
                    "{'client_kwargs': {'region_name': ...}} or AWS_REGION"
                )
            return _with_status(OSError(f"{where}: {told}{hint}"), status)
        if isinstance(exc, PermissionError) or type(exc).__name__ in (
            "PermissionDeniedError",
            "UnauthenticatedError",
        ):
            return PermissionError(f"{where}: {told}")
        lowered = text.lower()
        if _TIMED_OUT.search(text):
            return TimeoutError(errno.ETIMEDOUT, f"{where}: no answer in time ({told})")
        if any(word in lowered for word in _DROPPED):
            return ConnectionResetError(errno.ECONNRESET, f"{where}: connection failed ({told})")
        return OSError(f"{where}: {told}")


#: Words of obstore's (reqwest's, hyper's) messages for a dropped or refused connection.
_DROPPED = (
    "error sending request",
    "connection",
    "body error",
    "incompletemessage",
    "broken pipe",
    "reset by peer",
    "unexpected eof",
    "decoding response body",
)
_STATUS = re.compile(r"status code: (\d{3})")
#: How reqwest says a request timed out (obstore's message holds its debug form).
_TIMED_OUT = re.compile(r"kind: Timeout|TimedOut|timed out|deadline has elapsed")


#: An object modified less than this long ago has no size-and-mtime version
#: (``Last-Modified`` counts whole seconds: a same-size rewrite could keep it).
_RACY_SECONDS = 2.0


def object_version(meta: Mapping[str, Any]) -> str | None:
    """What identifies the content of an object with obstore's ``meta``, or ``None``.

    Its ETag where the store gives one (S3, GCS and Azure always do), else its size and
    modification time where the server sent a ``Last-Modified`` (obstore reports the epoch
    when none came) at least :data:`_RACY_SECONDS` old; ``None`` when neither tells one
    version of the object from another.
    """
    tag = meta.get("e_tag")
    if tag:  # W/"abc", "abc" and abc are one version (listings and answers quote apart)
        return f"etag:{str(tag).removeprefix('W/').strip(chr(34))}"
    modified = meta.get("last_modified")
    if isinstance(modified, datetime.datetime) and modified.timestamp() > 0:
        if modified.timestamp() > time.time() - _RACY_SECONDS:
            return None  # a rewrite within the same second would keep this version
        return f"size-mtime:{meta.get('size')}:{modified.isoformat()}"
    return None


def _note(seen: list[str | None] | None, result: Any) -> None:
    if seen is not None:
        seen.append(object_version(result.meta))


def _kind(result: Any) -> str:
    """The ``Content-Type`` of obstore's answer ``result`` (``""``: none), safe to show."""
    try:
        kind = (result.attributes or {}).get("Content-Type") or ""
    except Exception:  # an obstore without attributes on its results
        return ""
    return redact_text(str(kind)[:100], None)


def _empty(span: ByteSpan) -> bool:
    start, end = span
    return start >= 0 and end is not None and end <= start


def _options(span: ByteSpan) -> dict[str, Any]:
    """obstore's ``GetOptions`` asking ``span`` (``bytes=start-``, ``bytes=-n``, a range)."""
    start, end = span
    if start < 0:
        return {"range": {"suffix": -start}}
    if end is None:
        return {"range": {"offset": start}}
    return {"range": (start, end)}


def _status(text: str) -> int | None:
    found = _STATUS.search(text)
    return None if found is None else int(found.group(1))


def _with_status(error: OSError, status: int) -> OSError:
    error.status = status  # type: ignore[attr-defined]  # read by faults.is_transient
    return error


def run_batch(make: Callable[[], Awaitable[T]]) -> T:
    """Await ``make()`` on an event loop of its own, from blocking code; its result.

    The loop runs in the calling thread, so no other Python thread does the work while the
    caller waits (h5py waits holding its global lock: a collection on another thread could
    finalise an h5py object and wait for that lock for ever), and ``Ctrl-C`` cancels the
    requests in flight. Where the calling thread runs a loop already (a notebook's), the
    loop runs in a helper thread, in a copy of the caller's context (its
    :func:`~mixle.reading.stopping.stop_when` check included). mixle's read errors are
    raised as fresh errors of the same kind and text, without the event loop's frames and
    chain (no reference cycle through them holding h5py objects).
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runs_loop = False
    else:
        runs_loop = True
    try:
        if not runs_loop:
            return _run_own_loop(make)
        context = contextvars.copy_context()
        with ThreadPoolExecutor(1, thread_name_prefix="mixle-batch") as pool:
            return pool.submit(context.run, _run_own_loop, make).result()
    except _FRESH as exc:
        kind, text = type(exc), str(exc)
    raise kind(text) from None


#: Errors :func:`run_batch` raises afresh (each takes its message as its one argument).
_FRESH = (RemoteReadError, FileNotFoundError, CorruptChunkError, RangeMismatchError, ReadsStopped)


def _run_own_loop(make: Callable[[], Awaitable[T]]) -> T:
    """``make()`` run to its end on a new loop; the thread's current event loop is kept.

    ``asyncio.run`` sets the thread's event loop to ``None`` when it ends, which would break
    a caller that set one (``asyncio.set_event_loop``) and uses it later.
    """
    import asyncio

    # the result is handed over beside the task, not as its result: in the main thread the
    # runner's Ctrl-C handler holds the task, and restoring the handler makes CPython's
    # signal module repr() it, result included (14 ms for a 512 KiB block)
    results: list[T] = []

    async def main() -> None:
        results.append(await make())

    runner = getattr(asyncio, "Runner", None)
    if runner is not None:  # Python 3.11+: a loop factory keeps the thread's loop untouched
        with runner(loop_factory=asyncio.new_event_loop) as run:
            run.run(main())
        return results[0]
    loop = asyncio.new_event_loop()  # pragma: no cover (Python 3.10)
    try:
        loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
    return results[0]  # pragma: no cover


def choose_client(
    url: str, storage_options: Mapping[str, Any] | None, backend: str = "auto"
) -> ObjectClient | None:
    """The :class:`ObjectClient` that reads the store root ``url``, or ``None`` for fsspec.

    ``backend="auto"`` gives a client when obstore is installed and usable here, the
    scheme is one of :data:`OBJECT_STORE_SCHEMES`, the URL has no query string (presigned
    URLs keep fsspec, which sends the query with every key) and every ``storage_options``
    entry maps to obstore's configuration; ``"fsspec"`` always gives ``None``.

    Raises
    ------
    ValueError
        ``backend`` is not one of :data:`BACKENDS`.
    ObstoreUnsupported
        ``backend="obstore"`` where obstore cannot read ``url``; says why.
    """
    check_backend(backend)
    if backend == "fsspec":
        return None
    try:
        return _client_for(url, dict(storage_options or {}))
    except ObstoreUnsupported as exc:
        if backend == "auto":
            return None
        raise ObstoreUnsupported(
            f"backend='obstore' cannot read {display_path(url)!r}: {exc}; use "
            "backend='auto' or 'fsspec'"
        ) from None


def _client_for(url: str, options: dict[str, Any]) -> ObjectClient:
    if not isinstance(url, str) or "://" not in url or "::" in url:
        raise ObstoreUnsupported("not a URL obstore reads (a local path, a store or a chain)")
    parts = urllib.parse.urlsplit(url)
    kind = OBJECT_STORE_SCHEMES.get(parts.scheme.lower())
    if kind is None:
        raise ObstoreUnsupported(
            f"the scheme {parts.scheme!r} is not one obstore reads "
            f"({', '.join(sorted(OBJECT_STORE_SCHEMES))})"
        )
    if "#" in url:  # urlsplit would cut the key there; fsspec reads it as part of the key
        raise ObstoreUnsupported("a '#' in the URL")
    if parts.query or "params" in options:
        raise ObstoreUnsupported("a query string (presigned URLs are read through fsspec)")
    if parts.username or parts.password:
        raise ObstoreUnsupported("user info in the URL")
    segments = parts.path.strip("/")
    if segments and any(p in ("", ".", "..") for p in segments.split("/")):
        raise ObstoreUnsupported("path segments obstore cannot address ('//', '.', '..')")
    why = obstore_usable()
    if why is not None:
        raise ObstoreUnsupported(why)
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    try:
        _MAPPERS[kind](options, config, client)
    except ObstoreUnsupported as exc:
        raise ObstoreUnsupported(
            f"storage_options {exc} has no obstore equivalent mixle knows"
        ) from None
    if kind == "S3Store" and _aws_profile_only(config):
        raise ObstoreUnsupported(
            "the AWS credentials would come from a profile (AWS_PROFILE, ~/.aws/credentials "
            "or ~/.aws/config), which obstore does not read; give key= and secret= in "
            "storage_options or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    if kind == "HTTPStore" and parts.scheme.lower() == "http":
        client["allow_http"] = True
    root = urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/")))
    return ObjectClient(root, kind, config, client, options or None)


def _aws_profile_only(config: Mapping[str, Any]) -> bool:
    """Whether S3 credentials would come only from an AWS profile, which botocore (s3fs)
    reads and obstore does not: none in the options or the environment, and a profile
    named or a shared credentials or config file present."""
    if config.get("skip_signature") or config.get("access_key_id"):
        return False
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return False
    if os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE"):
        return True
    home = os.path.expanduser("~")
    files = (
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
        os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
    )
    return any(os.path.isfile(f) for f in files)
