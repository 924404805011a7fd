"""Fetch many byte ranges at once: bounded in-flight bytes, and nearby ranges coalesced.

Object stores answer a request in tens of milliseconds whatever its size, so a batch that
needs a hundred chunks must not ask for them one by one. :func:`gather_bounded` runs every
request of a batch concurrently while at most :data:`MAX_INFLIGHT_BYTES` and
:data:`MAX_INFLIGHT_REQUESTS` are in flight; :func:`coalesce_ranges` merges byte ranges of
one object that lie close together (the inner chunks of a shard) into a few larger requests;
:func:`widen_connection_pool` lets s3fs open that many connections (its default is 10).

No request waits on a silent peer for long: over HTTP every request carries mixle's
timeout (:attr:`~mixle.reading.faults.RetryPolicy.timeout`: to connect, for the first byte,
between two bytes; :func:`request_options`), s3fs file systems mixle reads through get it
as botocore's ``connect_timeout``/``read_timeout``, and every batch of
:func:`gather_bounded` runs under the policy's deadline
(:func:`~mixle.reading.faults.batch_deadline`). Timeouts set in ``storage_options`` win.

Every byte range is checked before its bytes are used (:func:`fetch_range`,
:func:`read_range`, :func:`check_range`): over HTTP the status, the ``Content-Range``
(start, end, total) and the body length; on other backends the body length. A response that
is not the range asked raises :class:`~mixle.reading.faults.RangeMismatchError`, which the
retry layer retries like a dropped connection.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mixle.reading.faults import (
    CorruptChunkError,
    RangeMismatchError,
    RemoteReadError,
    retry_async,
    retry_call,
)
from mixle.reading.policy import batch_deadline, keep_deadline, retry_policy
from mixle.utils.redact import redact_text

__all__ = [
    "COALESCE_GAP_BYTES",
    "MAX_COALESCED_BYTES",
    "MAX_INFLIGHT_BYTES",
    "MAX_INFLIGHT_REQUESTS",
    "READ_BLOCK_BYTES",
    "ByteSpan",
    "Coalesced",
    "check_range",
    "coalesce_ranges",
    "fetch_range",
    "gather_bounded",
    "object_size",
    "range_header",
    "read_range",
    "request_options",
    "stream_bounded",
    "widen_connection_pool",
]

#: Most bytes of requests one batch keeps in flight at once (more wait for a slot).
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
#: Most requests one batch keeps in flight at once, and the connection pool size mixle gives
#: s3fs when ``storage_options`` do not choose one (aiobotocore's own default is 10).
MAX_INFLIGHT_REQUESTS = 64
#: Two byte ranges of one object closer than this are fetched in one request: reading a
#: gap this size costs less than the round trip of a second request.
COALESCE_GAP_BYTES = 1024 * 1024
#: A coalesced request never grows past this many bytes (unless one range alone is larger),
#: so big batches still spread over several concurrent requests.
MAX_COALESCED_BYTES = 16 * 1024 * 1024

T = TypeVar("T")

#: Bytes a capped response body is read in at a time (:func:`fetch_range` with ``limit``).
READ_BLOCK_BYTES = 1024 * 1024
#: How many objects' sizes, learnt from servers that ignore ``Range``, are remembered.
IGNORED_RANGE_MEMORY = 1024

#: A byte range of one object: ``(start, end)`` for bytes ``[start, end)``, ``(start, None)``
#: for everything from ``start`` on, ``(-n, None)`` for the last ``n`` bytes.
ByteSpan = tuple[int, int | None]

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$")


class _ByteBudget:
    """An asyncio semaphore counted in bytes; a request larger than the budget takes it all."""

    def __init__(self, budget: int) -> None:
        import asyncio  # built inside a running loop; ``import mixle`` stays asyncio-free

        self._free = budget
        self._budget = budget
        self._changed = asyncio.Condition()

    async def acquire(self, nbytes: int) -> int:
        take = max(1, min(nbytes, self._budget))
        async with self._changed:
            await self._changed.wait_for(lambda: self._free >= take)
            self._free -= take
        return take

    async def release(self, taken: int) -> None:
        async with self._changed:
            self._free += taken
            self._changed.notify_all()


async def gather_bounded(
    calls: Sequence[Callable[[], Awaitable[T]]],
    sizes: Sequence[int],
    *,
    max_inflight: int | None = None,
    max_requests: int | None = None,
    on_ready: Callable[[int, T], None] | None = None,
) -> list[T]:
    """Await every ``calls[k]()`` concurrently, holding ``sizes[k]`` bytes of budget each.

    Parameters
    ----------
    calls
        Coroutine factories; each is called once.
    sizes
        Expected bytes of each result (an estimate is fine).
    max_inflight
        Byte budget; default :data:`MAX_INFLIGHT_BYTES`.
    max_requests
        Most calls awaited at once; default :data:`MAX_INFLIGHT_REQUESTS`.
    on_ready
        Called as ``on_ready(k, result)`` on the event loop as soon as call ``k`` finishes
        (so a consumer can start on it while the others are still in flight).

    Returns
    -------
    list
        Results in the order of ``calls``.

    Raises
    ------
    Exception
        The first failure, after the other requests were cancelled.

    Notes
    -----
    The whole batch has one deadline (:func:`~mixle.reading.faults.batch_deadline`): a
    request (retried through :func:`~mixle.reading.faults.retry_async`) still unfinished
    when the policy's deadline passes raises
    :class:`~mixle.reading.faults.RemoteTimeoutError`.
    """
    import asyncio  # only ever awaited inside a running event loop

    end = batch_deadline()

    budget = _ByteBudget(MAX_INFLIGHT_BYTES if max_inflight is None else max_inflight)
    slots = asyncio.Semaphore(
        max(1, MAX_INFLIGHT_REQUESTS if max_requests is None else max_requests)
    )

    async def one(k: int, call: Callable[[], Awaitable[T]], size: int) -> T:
        keep_deadline(end)  # this task's own context: its retries end by the batch's deadline
        async with slots:
            taken = await budget.acquire(size)
            try:
                result = await call()
            finally:
                await budget.release(taken)
        if on_ready is not None:
            on_ready(k, result)
        return result

    tasks = [asyncio.ensure_future(one(k, c, s)) for k, (c, s) in enumerate(zip(calls, sizes))]
    try:
        return list(await asyncio.gather(*tasks))
    except GeneratorExit:  # closed unfinished (its loop is gone): nothing may be awaited
        for task in tasks:
            with contextlib.suppress(RuntimeError):  # a closed loop cannot cancel
                task.cancel()
        raise
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass(frozen=True)
class Coalesced:
    """One request ``[start, end)`` covering the input ranges ``members`` (their indices)."""

    start: int
    end: int
    members: tuple[int, ...]


def coalesce_ranges(
    starts: Sequence[int],
    ends: Sequence[int],
    *,
    gap: int = COALESCE_GAP_BYTES,
    max_bytes: int = MAX_COALESCED_BYTES,
) -> list[Coalesced]:
    """Merge byte ranges ``[starts[k], ends[k])`` of one object into few requests.

    Ranges are sorted by start; a range joins the current request when it begins at most
    ``gap`` bytes after the request's end and the request stays within ``max_bytes``.
    O(n log n) in the number of ranges.
    """
    lo = np.asarray(starts, dtype=np.int64)
    hi = np.asarray(ends, dtype=np.int64)
    order = np.argsort(lo, kind="stable").tolist()
    out: list[Coalesced] = []
    cur_start = cur_end = 0
    members: list[int] = []
    for k in order:
        a, b = int(lo[k]), int(hi[k])
        if members and a - cur_end <= gap and max(cur_end, b) - cur_start <= max_bytes:
            cur_end = max(cur_end, b)
            members.append(k)
            continue
        if members:
            out.append(Coalesced(cur_start, cur_end, tuple(members)))
        cur_start, cur_end, members = a, b, [k]
    if members:
        out.append(Coalesced(cur_start, cur_end, tuple(members)))
    return out


def widen_connection_pool(fs: Any) -> Any:
    """``fs``, or for an s3fs file system a copy with mixle's pool size and timeouts.

    s3fs keeps at most ``max_pool_connections`` (default 10) requests in flight, so a batch of
    a hundred chunk requests would wait in rounds of ten, and its botocore client waits
    ``connect_timeout``/``read_timeout`` seconds of s3fs's choosing. An s3fs ``fs`` whose
    ``config_kwargs`` leave any of the three unset is reopened with the same options plus
    ``max_pool_connections=MAX_INFLIGHT_REQUESTS`` and both timeouts at the retry policy's
    :attr:`~mixle.reading.faults.RetryPolicy.timeout`; values the user set are kept, and
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
    :attr:`~mixle.reading.faults.RetryPolicy.timeout`:

    - HTTP(S): ``client_kwargs={"timeout": session_timeout(t)}`` for the aiohttp session,
      so every request on it (zarr's own included) stops waiting on a silent peer after
      ``t`` seconds; known as mixle's, so :func:`request_options` still gives later
      requests the policy's timeout of the moment.
    - S3 (``s3://``, ``s3a://``): botocore's ``connect_timeout`` and ``read_timeout`` in
      ``config_kwargs``.

    A timeout the user set wins (``timeout=``, or one inside ``client_kwargs`` /
    ``config_kwargs``). Other locations (other schemes, store objects) get a copy of the
    options as they are (``{}`` for ``None``). The caller's dicts are never changed.
    """
    options = dict(storage_options or {})
    if not isinstance(location, str):
        return options
    scheme = location.partition("://")[0].lower() if "://" in location else ""
    seconds = retry_policy().timeout
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
    :attr:`~mixle.reading.faults.RetryPolicy.timeout` (no cap on the whole transfer, which
    the batch deadline bounds), unless the user's ``storage_options`` chose a timeout for
    requests (``timeout=``) or for the session (``client_kwargs={"timeout": ...}``): then
    theirs applies. Other file systems take their timeouts when they are made.
    """
    if not _is_http(fs):
        return {}
    if "timeout" in (getattr(fs, "kwargs", None) or {}):
        return {}
    session = (getattr(fs, "client_kwargs", None) or {}).get("timeout", _NO_TIMEOUT)
    if session is not _NO_TIMEOUT and not _is_own_session_timeout(session):
        return {}
    import aiohttp  # fsspec's HTTP file system is built on it

    seconds = retry_policy().timeout
    return {"timeout": aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)}


_END = object()


def stream_bounded(
    loop: Any, calls: Sequence[Callable[[], Awaitable[T]]], sizes: Sequence[int]
) -> Generator[list[tuple[int, T]], None, None]:
    """Start :func:`gather_bounded` on ``loop`` now; yield results in groups as they arrive.

    Each group is every ``(k, result)`` that arrived since the last one (at least one), so
    a consumer that falls behind gets larger groups to share out. Every ``k`` is yielded
    once; the first failure is raised after the results that arrived before it.

    Parameters
    ----------
    loop
        The running event loop (in another thread) that owns the store's connections.
    calls, sizes
        As for :func:`gather_bounded`.

    Notes
    -----
    The requests are in flight as soon as this returns. Closing the iterator early (or
    dropping it) cancels the requests still running.
    """
    import asyncio
    import queue

    ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
    future = asyncio.run_coroutine_threadsafe(
        gather_bounded(calls, sizes, on_ready=lambda k, r: ready.put((k, r))), loop
    )
    future.add_done_callback(lambda _: ready.put(_END))
    return _arrivals(ready, future)


def _arrivals(ready: Any, future: Any) -> Generator[list[tuple[int, Any]], None, None]:
    try:
        while True:
            group = [ready.get()]
            while not ready.empty():
                group.append(ready.get_nowait())
            items = [item for item in group if item is not _END]
            if items:
                yield items
            if len(items) != len(group):  # the end marker came: nothing more will arrive
                future.result()  # raises the first failure, if any
                return
    finally:
        future.cancel()


# -- checked byte ranges ----------------------------------------------------------------
def range_header(span: ByteSpan) -> str:
    """The HTTP ``Range`` header value asking for ``span`` (``bytes=a-b``, ``bytes=-n``)."""
    start, end = span
    if start < 0:
        return f"bytes={start}"
    return f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"


def _resolve(span: ByteSpan, total: int | None) -> tuple[int, int] | None:
    """``[first, end)`` that ``span`` means in an object of ``total`` bytes (HTTP's rules).

    ``None`` when that depends on an unknown ``total``.
    """
    start, end = span
    if start < 0:
        return None if total is None else (max(0, total + start), total)
    if end is None:
        return None if total is None else (start, max(start, total))
    return (start, end) if total is None else (start, max(start, min(end, total)))


def _parse_content_range(value: str | None) -> tuple[int | None, int | None, int | None] | None:
    """``(first, last, total)`` of a ``Content-Range`` header (``None`` for ``*``)."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None
    first, last, total = match.groups()
    return (
        None if first is None else int(first),
        None if last is None else int(last),
        None if total == "*" else int(total),
    )


def check_range(
    body: bytes,
    span: ByteSpan,
    *,
    size: int | None = None,
    status: int | None = None,
    content_range: str | None = None,
    content_type: str | None = None,
) -> bytes:
    """The bytes ``span`` asked for, out of one response, or :class:`RangeMismatchError`.

    Parameters
    ----------
    body
        The response body.
    span
        The range asked (see :data:`ByteSpan`).
    size
        The object's size when known; a range that ends past it may come back short.
    status, content_range, content_type
        The HTTP status and headers, where the backend shows them; ``status=None`` checks
        the body length alone.

    Returns
    -------
    bytes
        ``body``, or the asked bytes sliced out of a ``200`` that carried the whole object
        (accepted only when its length is ``size``; with ``size`` unknown, only for
        ``span=(0, None)``, which asks for the whole object).

    Raises
    ------
    RangeMismatchError
        When the response is not the range asked: another status, a ``Content-Range``
        whose start, end or total differs, or a body of another length.
    """
    if status is None:  # no headers to see: the length is all there is to check
        want = _resolve(span, size)
        if want is None:  # size unknown: a suffix must be whole, "from start on" anything
            want = (0, -span[0]) if span[0] < 0 else (0, len(body))
        if len(body) != want[1] - want[0]:
            raise _mismatch(span, f"{len(body)} bytes", size)
        return body
    if status == 206:
        return _check_partial(body, span, size, content_range, content_type)
    if status == 200 and span == (0, None) and size is None and _is_text(content_type):
        raise _mismatch(span, _answer(body, status, content_range, content_type), size)
    if status == 200 and span == (0, None) and (size is None or len(body) == size):
        return body  # the whole object was asked for, and came
    if status == 200 and size is not None and len(body) == size:
        first, end = _resolve(span, size) or (0, 0)
        return body[first:end]  # the server ignored Range and sent the whole object
    raise _mismatch(span, _answer(body, status, content_range, content_type), size)


def _check_partial(
    body: bytes,
    span: ByteSpan,
    size: int | None,
    content_range: str | None,
    content_type: str | None,
) -> bytes:
    parsed = _parse_content_range(content_range)
    what = _answer(body, 206, content_range, content_type)
    if parsed is None or parsed[0] is None or parsed[1] is None:
        raise _mismatch(span, what, size)
    first, last, total = parsed
    if size is not None and total is not None and total != size:
        raise _mismatch(span, what, size)
    want = _resolve(span, total if total is not None else size)
    if want is None:  # total unknown: only a start, or a suffix's length, can be checked
        start = span[0]
        want = (start, last + 1) if start >= 0 else (last + 1 + start, last + 1)
    if (first, last + 1) != want or len(body) != last + 1 - first:
        raise _mismatch(span, what, size)
    return body


def _answer(body: bytes, status: int, content_range: str | None, content_type: str | None) -> str:
    parts = [f"status {status}"]
    if content_range is not None:
        parts.append(f"Content-Range {content_range!r}")
    if content_type:
        parts.append(f"Content-Type {content_type!r}")
    parts.append(f"{len(body)} bytes")
    return ", ".join(parts)


def _mismatch(span: ByteSpan, what: str, size: int | None) -> RangeMismatchError:
    want = _resolve(span, size)
    expected = "" if want is None else f" ({want[1] - want[0]} bytes)"
    of = "" if size is None else f" of a {size}-byte object"
    return RangeMismatchError(f"asked {range_header(span)}{expected}{of}, the response was {what}")


def _is_http(fs: Any) -> bool:
    http = sys.modules.get("fsspec.implementations.http")  # loaded if fs is one
    return http is not None and isinstance(fs, http.HTTPFileSystem)


async def fetch_range(
    fs: Any, path: str, span: ByteSpan, *, size: int | None = None, limit: int | None = None
) -> bytes:
    """Bytes ``span`` of ``path`` on the async fsspec file system ``fs``, checked; one try.

    Over HTTP and S3 (s3fs) the status, ``Content-Range`` and body length are checked. A
    ``200`` is taken as the whole object (a server that ignores ``Range``) when its length
    is the object's size, learnt from a ``HEAD`` if ``size`` is not given (once per object:
    the size is remembered, for the last :data:`IGNORED_RANGE_MEMORY` objects, while the
    server's answers agree with it), with one
    exception that costs no ``HEAD``: for ``span=(0, None)`` a binary (not ``text/...``)
    body exactly as long as its ``Content-Length``. A text ``200`` for ``span=(0, None)``
    whose size cannot be learnt is refused. An honest ``206`` costs no ``HEAD``. Other
    backends show no headers, so the body length is checked, and a short body is accepted
    only when the object really ends there. ``span=(0, None)`` of an empty object (a
    ``416``) is ``b""``.

    ``limit`` is the most bytes one request may download (``None``: no cap); pass the
    largest size the object may have (a chunk's or shard's stored limit, the metadata
    limit). Over HTTP and S3 a ``Content-Length`` past it is refused before the body is
    read, and the body is read in blocks and refused once it passes ``limit``. A ``200``
    to a range ``(start, end)`` (a server that ignores ``Range``) is read only up to
    ``end`` and its connection dropped, not downloaded whole.

    Raises
    ------
    RangeMismatchError
        When the response is not the range asked (see :func:`check_range`).
    CorruptChunkError
        When the answer is larger than ``limit`` (not retried); names the URL, without
        credentials, and the limit.
    FileNotFoundError
        When the object does not exist.
    """
    start, end = span
    if start >= 0 and end is not None and end <= start:
        return b""
    try:
        if _is_http(fs):
            return await _fetch_http(fs, path, span, size, limit)
        if _is_s3(fs):
            return await _fetch_s3(fs, path, span, size, limit)
        body = bytes(await fs._cat_file(path, start=start, end=end))
        _check_limit(len(body), limit, fs, path, span)
    except Exception as exc:
        # "bytes=0-" of an empty object is unsatisfiable (416): the object is empty
        if span == (0, None) and _unsatisfiable(exc) and await _object_size(fs, path) == 0:
            return b""
        raise
    if size is None and _short(body, span):
        size = await _object_size(fs, path)  # only a short answer costs this probe
    return check_range(body, span, size=size)


def _unsatisfiable(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``416 Range Not Satisfiable`` (aiohttp's status, s3fs's text)."""
    return getattr(exc, "status", None) == 416 or "not satisfiable" in str(exc)


def _short(body: bytes, span: ByteSpan) -> bool:
    """Whether ``body`` is shorter than ``span`` asks (ranges ending past the object are)."""
    start, end = span
    want = -start if start < 0 else (None if end is None else end - start)
    return want is not None and len(body) < want


def object_size(fs: Any, path: str) -> int | None:
    """The size of ``path`` on ``fs`` (``None`` if not reported), asked with mixle's timeout."""
    if getattr(fs, "async_impl", False) and _is_http(fs):
        from fsspec.asyn import sync  # type: ignore[import-untyped]

        return sync(fs.loop, _object_size, fs, path)  # type: ignore[no-any-return]
    found = fs.size(path)
    return None if found is None else int(found)


async def _object_size(fs: Any, path: str) -> int | None:
    found = (await fs._info(path, **request_options(fs))).get("size")
    return None if found is None else int(found)


async def _fetch_http(
    fs: Any, path: str, span: ByteSpan, size: int | None, limit: int | None
) -> bytes:
    """One ranged GET through fsspec's aiohttp session, its status and headers checked."""
    kwargs = {**fs.kwargs, **request_options(fs)}
    headers = dict(kwargs.pop("headers", None) or {})
    headers["Range"] = range_header(span)
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), headers=headers, **kwargs) as response:
        fs._raise_not_found_for_status(response, path)
        status = response.status
        content_range = response.headers.get("Content-Range")
        content_type = response.headers.get("Content-Type")
        declared = response.headers.get("Content-Length")
        body, cut = await _read_capped(
            response.content.read, status, _length(declared), span, limit, (fs, path)
        )
        if cut:  # the rest of a whole object sent for a range: drop it with the connection
            response.close()
    return await _checked_answer(
        fs, path, span, size, body, status, content_range, content_type, declared
    )


async def _read_capped(
    read: Callable[[int], Awaitable[bytes]],
    status: int,
    declared: int | None,
    span: ByteSpan,
    limit: int | None,
    where: tuple[Any, str],
) -> tuple[bytes, bool]:
    """The body to keep, read by ``read(n)`` calls, and whether bytes were left unread.

    A ``200`` to a range ``(start, end)`` is read up to ``end`` only; no body past
    ``limit`` is read (refused by its ``Content-Length`` first, when it has one).
    """
    upto = _range_end(span) if status == 200 else None
    expected = declared if upto is None or declared is None else min(declared, upto)
    if expected is not None:
        _check_limit(expected, limit, *where, span)
    most = upto
    if limit is not None:
        most = limit + 1 if most is None else min(most, limit + 1)
    if most is None:
        return bytes(await read(-1)), False
    parts: list[bytes] = []
    got = 0
    while got < most:
        part = await read(min(most - got, READ_BLOCK_BYTES))
        if not part:
            break
        parts.append(bytes(part))
        got += len(part)
    _check_limit(got, limit, *where, span)
    body = b"".join(parts)
    return body, upto is not None and got >= upto and (declared is None or declared > got)


def _range_end(span: ByteSpan) -> int | None:
    """``end`` of a range ``(start, end)`` that does not ask for the whole object, else ``None``."""
    start, end = span
    return end if start >= 0 and end is not None else None


def _length(value: object) -> int | None:
    try:
        return None if value is None else int(str(value))
    except ValueError:
        return None


def _check_limit(nbytes: int, limit: int | None, fs: Any, path: str, span: ByteSpan) -> None:
    """:class:`CorruptChunkError` when one answer brings more than ``limit`` bytes."""
    if limit is None or nbytes <= limit:
        return
    name = getattr(fs, "encode_url", None) or getattr(fs, "unstrip_protocol", None)
    url = redact_text(str(name(path) if callable(name) else path))
    raise CorruptChunkError(
        f"{url}: the answer to {range_header(span)} holds at least {nbytes} bytes, more than "
        f"the {limit} bytes this stored object may have: refused without reading the rest "
        "(the object is damaged or not what its metadata says)"
    )


async def _checked_answer(
    fs: Any,
    path: str,
    span: ByteSpan,
    size: int | None,
    body: bytes,
    status: int,
    content_range: str | None,
    content_type: str | None,
    declared: object,
) -> bytes:
    """:func:`check_range` of one HTTP or S3 answer, learning the object's size if needed."""
    if (
        status == 200
        and size is None
        and not _whole_as_declared(span, body, content_type, declared)
    ):
        # a 200 is the whole object only if it is this long; a server that ignored Range
        # once is asked the size once, not once per answer
        size = _remembered_size(fs, path, body, declared)
        if size is None:
            size = await _object_size(fs, path)
            _remember_size(fs, path, size)
    upto = _range_end(span)
    if (  # read up to the range's end only: the whole object's length is its Content-Length
        status == 200
        and upto is not None
        and size is not None
        and upto <= len(body) < size
        and _length(declared) == size
        and not _is_text(content_type)
    ):
        first, end = _resolve(span, size) or (0, 0)
        return body[first:end]
    return check_range(
        body,
        span,
        size=size,
        status=status,
        content_range=content_range,
        content_type=content_type,
    )


#: ``(file system's protocol, path) -> size`` of objects whose server ignored ``Range``,
#: least recently used first; at most :data:`IGNORED_RANGE_MEMORY` entries.
_IGNORED_RANGE_SIZES: OrderedDict[tuple[str, str], int] = OrderedDict()
_IGNORED_RANGE_LOCK = threading.Lock()


def _size_key(fs: Any, path: str) -> tuple[str, str]:
    protocol = getattr(fs, "protocol", "")
    return (str(protocol if isinstance(protocol, str) else protocol[0]), str(path))


def _remembered_size(fs: Any, path: str, body: bytes, declared: object) -> int | None:
    """The size a ``HEAD`` gave for ``path`` when its server last ignored ``Range``, or ``None``.

    Trusted only while the answer agrees with it: its ``Content-Length`` (the whole
    object's) is that size, or with none declared the body is that long. An answer that
    disagrees (the object was replaced) is probed again.
    """
    key = _size_key(fs, path)
    with _IGNORED_RANGE_LOCK:
        size = _IGNORED_RANGE_SIZES.get(key)
        if size is None:
            return None
        length = _length(declared)
        if length != size and not (length is None and len(body) == size):
            del _IGNORED_RANGE_SIZES[key]
            return None
        _IGNORED_RANGE_SIZES.move_to_end(key)
        return size


def _remember_size(fs: Any, path: str, size: int | None) -> None:
    """Remember ``size`` for ``path`` (its server ignores ``Range``); the oldest goes first."""
    if size is None:
        return
    key = _size_key(fs, path)
    with _IGNORED_RANGE_LOCK:
        _IGNORED_RANGE_SIZES[key] = size
        _IGNORED_RANGE_SIZES.move_to_end(key)
        while len(_IGNORED_RANGE_SIZES) > IGNORED_RANGE_MEMORY:
            _IGNORED_RANGE_SIZES.popitem(last=False)


def _whole_as_declared(
    span: ByteSpan, body: bytes, content_type: str | None, declared: object
) -> bool:
    """Whether a ``200`` for ``bytes=0-`` is the whole object without asking its size.

    It is when the body is as long as its declared ``Content-Length`` and is not text (an
    error page served with ``200`` is ``text/html``; chunks are binary). Otherwise the
    caller probes the object's size, so servers that ignore ``Range`` cost no extra
    request per chunk.
    """
    if span != (0, None) or declared is None or _is_text(content_type):
        return False
    try:
        return int(str(declared)) == len(body)
    except ValueError:
        return False


def _is_text(content_type: str | None) -> bool:
    """Whether a response says it is text: an error page, never a stored chunk."""
    return (content_type or "").strip().lower().startswith("text/")


def _is_s3(fs: Any) -> bool:
    return type(fs).__module__.startswith("s3fs") and hasattr(fs, "_call_s3")


async def _fetch_s3(
    fs: Any, path: str, span: ByteSpan, size: int | None, limit: int | None
) -> bytes:
    """One ranged ``GetObject`` through s3fs (as its ``_cat_file`` sends it), checked."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=range_header(span), **extra
    )
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    status = 206 if status is None else int(status)
    declared = response.get("ContentLength")
    try:
        stream = response["Body"]
        if limit is None and (status != 200 or _range_end(span) is None):
            body = bytes(await stream.read())  # as s3fs reads it (botocore checks checksums)
        else:
            body, _ = await _read_capped(
                stream.read, status, _length(declared), span, limit, (fs, path)
            )
    finally:
        response["Body"].close()
    return await _checked_answer(
        fs,
        path,
        span,
        size,
        body,
        status,
        response.get("ContentRange"),
        response.get("ContentType"),
        declared,
    )


def read_range(
    fs: Any,
    path: str,
    span: ByteSpan,
    *,
    url: str,
    key: str,
    size: int | None = None,
    secrets: object = None,
    limit: int | None = None,
) -> bytes:
    """:func:`fetch_range` from blocking code, retried; sync file systems supported too.

    Parameters
    ----------
    fs, path, span, size, limit
        As for :func:`fetch_range` (on a sync file system the body's length is checked
        against ``limit`` once read).
    url, key, secrets
        Name the object and the piece in a :class:`~mixle.reading.faults.RemoteReadError`
        (``secrets`` are masked there).

    Raises
    ------
    RemoteReadError
        When every try failed or the responses kept not matching the range asked.
    """
    if getattr(fs, "async_impl", False):
        from fsspec.asyn import sync  # type: ignore[import-untyped]

        def fetch() -> Awaitable[bytes]:
            return fetch_range(fs, path, span, size=size, limit=limit)

        try:
            return bytes(sync(fs.loop, retry_async, fetch, url=url, key=key, secrets=secrets))
        except (RemoteReadError, FileNotFoundError, CorruptChunkError) as exc:
            kind, text = type(exc), str(exc)
        # fsspec's sync() re-raises from a frame that holds the exception, a reference
        # cycle; raised on from the caller's frames (h5py's, holding h5py objects) it would
        # leave them to the cycle collector, whose run on fsspec's I/O thread then
        # deadlocks on h5py's lock (h5py issue 2019). A fresh error, raised outside the
        # handler and bound to no name, has no cycle and no chain (retry_async tells its
        # upstream error in the message).
        raise kind(text) from None

    def call() -> bytes:
        body = bytes(fs.cat_file(path, start=span[0], end=span[1]))
        _check_limit(len(body), limit, fs, path, span)
        known = fs.size(path) if size is None and _short(body, span) else size
        return check_range(body, span, size=known)

    return retry_call(call, url=url, key=key, secrets=secrets)
