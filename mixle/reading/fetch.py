"""Fetch one byte range of a remote object, checked, its download capped.

:func:`fetch_range` (on an event loop) and :func:`read_range` (from blocking code,
retried) ask for one byte range and check the answer before its bytes are used
(:func:`~mixle.reading.ranges.check_range`): over HTTP and S3 the status, the
``Content-Range`` and the body length; on other backends the body length. A response that
is not the range asked raises :class:`~mixle.reading.faults.RangeMismatchError`, which the
retry layer retries like a dropped connection. A download never grows past the most bytes
the object may have (``limit``), and a server that ignores ``Range`` is asked an object's
size once, not once per answer (the last
:data:`~mixle.reading.ranges.IGNORED_RANGE_MEMORY` objects are remembered). Many requests
at once go through :mod:`mixle.reading.inflight`; the requests'
timeouts come from :mod:`mixle.reading.fs_options`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mixle.reading.faults import CorruptChunkError, RemoteReadError, retry_async, retry_call
from mixle.reading.fs_options import is_http, request_options, widen_connection_pool
from mixle.reading.inflight import (  # importable from here, as before inflight.py was split out
    COALESCE_GAP_BYTES,
    MAX_COALESCED_BYTES,
    MAX_INFLIGHT_BYTES,
    MAX_INFLIGHT_REQUESTS,
    Coalesced,
    coalesce_ranges,
    gather_bounded,
    stream_bounded,
)
from mixle.reading.ranges import (
    ByteSpan,
    check_range,
    declared_length,
    is_short,
    is_text,
    range_end,
    range_header,
    remember_size,
    remembered_size,
    resolve_span,
)
from mixle.utils.redact import redact_text

__all__ = [
    "READ_BLOCK_BYTES",
    "fetch_range",
    "object_size",
    "read_range",
    # this module's own before inflight.py and fs_options.py were split out (the docs named
    # MAX_INFLIGHT_BYTES here): they stay importable from it
    "COALESCE_GAP_BYTES",
    "MAX_COALESCED_BYTES",
    "MAX_INFLIGHT_BYTES",
    "MAX_INFLIGHT_REQUESTS",
    "Coalesced",
    "coalesce_ranges",
    "gather_bounded",
    "stream_bounded",
    "widen_connection_pool",
]

#: Bytes a capped response body is read in at a time (:func:`fetch_range` with ``limit``).
READ_BLOCK_BYTES = 1024 * 1024


async def fetch_range(
    fs: Any, path: str, span: ByteSpan, *, size: int | None = None, limit: int | None = None
) -> bytes:
    """Bytes ``span`` of ``path`` on the async fsspec file system ``fs``, checked; one try.

    Over HTTP and S3 (s3fs) the status, ``Content-Range`` and body length are checked. A
    ``200`` is taken as the whole object (a server that ignores ``Range``) when its length
    is the object's size, learnt from a ``HEAD`` if ``size`` is not given (once per object:
    the size is remembered, for the last
    :data:`~mixle.reading.ranges.IGNORED_RANGE_MEMORY` objects, while the server's answers
    agree with it), with one
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
        When the response is not the range asked (see :func:`~mixle.reading.ranges.check_range`).
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
        if is_http(fs):
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
    if size is None and is_short(body, span):
        size = await _object_size(fs, path)  # only a short answer costs this probe
    return check_range(body, span, size=size)


def _unsatisfiable(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``416 Range Not Satisfiable`` (aiohttp's status, s3fs's text)."""
    return getattr(exc, "status", None) == 416 or "not satisfiable" in str(exc)


def object_size(fs: Any, path: str) -> int | None:
    """The size of ``path`` on ``fs`` (``None`` if not reported), asked with mixle's timeout."""
    if getattr(fs, "async_impl", False) and is_http(fs):
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
            response.content.read, status, declared_length(declared), span, limit, (fs, path)
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
    upto = range_end(span) if status == 200 else None
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
    """The checked bytes of one HTTP or S3 answer, learning the object's size if needed."""
    if (
        status == 200
        and size is None
        and not _whole_as_declared(span, body, content_type, declared)
    ):
        # a 200 is the whole object only if it is this long; a server that ignored Range
        # once is asked the size once, not once per answer
        size = remembered_size(fs, path, body, declared)
        if size is None:
            size = await _object_size(fs, path)
            remember_size(fs, path, size)
    upto = range_end(span)
    if (  # read up to the range's end only: the whole object's length is its Content-Length
        status == 200
        and upto is not None
        and size is not None
        and upto <= len(body) < size
        and declared_length(declared) == size
        and not is_text(content_type)
    ):
        first, end = resolve_span(span, size) or (0, 0)
        return body[first:end]
    return check_range(
        body,
        span,
        size=size,
        status=status,
        content_range=content_range,
        content_type=content_type,
    )


def _whole_as_declared(
    span: ByteSpan, body: bytes, content_type: str | None, declared: object
) -> bool:
    """Whether a ``200`` for ``bytes=0-`` is the whole object without asking its size.

    It is when the body is as long as its declared ``Content-Length`` and is not text (an
    error page served with ``200`` is ``text/html``; chunks are binary). Otherwise the
    caller probes the object's size, so servers that ignore ``Range`` cost no extra
    request per chunk.
    """
    if span != (0, None) or declared is None or is_text(content_type):
        return False
    try:
        return int(str(declared)) == len(body)
    except ValueError:
        return False


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
        if limit is None and (status != 200 or range_end(span) is None):
            body = bytes(await stream.read())  # as s3fs reads it (botocore checks checksums)
        else:
            body, _ = await _read_capped(
                stream.read, status, declared_length(declared), span, limit, (fs, path)
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
        known = fs.size(path) if size is None and is_short(body, span) else size
        return check_range(body, span, size=known)

    return retry_call(call, url=url, key=key, secrets=secrets)
