"""Faults while reading: which errors are worth retrying, the retry policy, loud errors.

Remote stores fail now and then (a 503, a reset connection, a timeout). Every request the
read layer makes is retried on its own with exponential backoff, so a server that fails
one request in five still serves every read; a request that keeps failing raises
:class:`RemoteReadError` naming the URL (without credentials or query string) and the
chunk. A ranged response that does not answer the range asked (wrong status, a shifted
``Content-Range``, a short body) raises :class:`RangeMismatchError`, retried like a dropped
connection. Data that arrives but is wrong raises :class:`CorruptChunkError`: a patch is
never silently filled with garbage.
"""

from __future__ import annotations

import errno
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from mixle.utils.redact import redact_text
from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "CorruptChunkError",
    "RangeMismatchError",
    "RemoteReadError",
    "RetryPolicy",
    "is_transient",
    "retry_async",
    "retry_call",
    "retry_policy",
    "set_retry_policy",
]

#: How many times one request is tried in all before :class:`RemoteReadError`.
DEFAULT_RETRY_ATTEMPTS = 5
#: Seconds before the first retry; each later retry waits twice as long...
DEFAULT_RETRY_BASE_DELAY = 0.1
#: ...but never longer than this many seconds.
DEFAULT_RETRY_MAX_DELAY = 5.0

#: HTTP statuses that say "try again": timeouts, throttling and server errors.
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Exception class names (anywhere in the MRO) of aiohttp, botocore and urllib3 that mean a
#: dropped connection, a timeout or a body damaged in transit (botocore's check of S3's
#: checksum); matched by name so that none of them must be installed.
_TRANSIENT_NAMES = frozenset(
    {
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ProtocolError",
        "FlexibleChecksumError",
    }
)
_TRANSIENT_ERRNO = frozenset(
    {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE}
)
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

T = TypeVar("T")


class RemoteReadError(OSError):
    """A request kept failing after every retry; the message names the URL and the chunk."""


class RangeMismatchError(OSError):
    """A response to a byte-range request is not that range: retried, then a RemoteReadError.

    Raised for a status other than 206 (or a 200 carrying the whole object), a
    ``Content-Range`` whose start, end or total differs from the range asked, or a body
    whose length differs from it; the message says what was asked and what came back.
    """


class CorruptChunkError(ValueError):
    """Stored bytes of a chunk do not decode to a chunk (bad checksum, truncated, wrong size)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried: ``attempts`` tries, waits doubling from ``base_delay``.

    Attributes
    ----------
    attempts
        Tries per request in all (``1`` never retries).
    base_delay, max_delay
        Retry ``k`` (from 0) waits ``min(max_delay, base_delay * 2**k)`` seconds.
    """

    attempts: int = DEFAULT_RETRY_ATTEMPTS
    base_delay: float = DEFAULT_RETRY_BASE_DELAY
    max_delay: float = DEFAULT_RETRY_MAX_DELAY

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        return float(min(self.max_delay, self.base_delay * 2.0**retry))

    @property
    def budget(self) -> float:
        """The longest a failing request waits in all before its error is raised."""
        return sum(self.delay(k) for k in range(self.attempts - 1))


_policy = RetryPolicy()


def retry_policy() -> RetryPolicy:
    """The process-wide retry policy every remote request follows."""
    return _policy


def set_retry_policy(
    attempts: int | None = None, base_delay: float | None = None, max_delay: float | None = None
) -> RetryPolicy:
    """Change the process-wide retry policy (``None`` keeps a field); returns the old one.

    Raises
    ------
    ValueError
        For ``attempts < 1`` or a negative delay.
    """
    global _policy
    old = _policy
    new = old
    if attempts is not None:
        count = parse_int(attempts, "attempts")
        if count < 1:
            raise ValueError(f"attempts={attempts} must be >= 1 (1 means no retries)")
        new = replace(new, attempts=count)
    if base_delay is not None:
        new = replace(new, base_delay=_seconds(base_delay, "base_delay"))
    if max_delay is not None:
        new = replace(new, max_delay=_seconds(max_delay, "max_delay"))
    _policy = new
    return old


def _seconds(value: object, name: str) -> float:
    seconds = float(value) if isinstance(value, (int, float)) else float("nan")
    if not seconds >= 0:
        raise ValueError(f"{name}={value!r} must be a number of seconds >= 0")
    return seconds


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: a 5xx/429/408, a dropped connection, a timeout.

    A :class:`RangeMismatchError` (a response that is not the range asked) counts too, and
    so does a body whose S3 checksum does not match (botocore's ``FlexibleChecksumError``).
    """
    if isinstance(exc, RemoteReadError):  # retried already: its retries are spent
        return False
    if isinstance(exc, RangeMismatchError):  # a proxy or server glitch: ask again
        return True
    if isinstance(exc, _PERMANENT):
        # fsspec's HTTP filesystem reports a failed size probe (a 503, a dropped connection)
        # as FileNotFoundError raised from the real error: that one is worth retrying
        cause = exc.__cause__
        return isinstance(exc, FileNotFoundError) and cause is not None and is_transient(cause)
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if status is None and isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int):
        return status in _TRANSIENT_STATUS
    asyncio = sys.modules.get("asyncio")  # not imported: none of its errors can occur
    timeouts = (TimeoutError,) if asyncio is None else (TimeoutError, asyncio.TimeoutError)
    if isinstance(exc, (*timeouts, ConnectionError)):
        return True
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO:
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)


def _failure(exc: BaseException, url: str, key: str, tries: int, secrets: object) -> str:
    if isinstance(exc, FileNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__  # fsspec's "not found" over the server error that caused it
    reason = redact_text(f"{type(exc).__name__}: {exc}", secrets)
    return f"reading {redact_text(url, secrets)} (chunk {key}) failed after {tries} tries: {reason}"


async def retry_async(
    call: Callable[[], Awaitable[T]], *, url: str, key: str, secrets: object = None
) -> T:
    """Await ``call()``, retrying transient failures by :func:`retry_policy`.

    Raises
    ------
    RemoteReadError
        When every try failed with a transient error, or at once for a permanent one
        (such as a 403); names ``url`` and ``key``, never credentials.
    FileNotFoundError
        Unchanged, at once: the caller decides whether a missing object is a fill value.
    """
    policy = _policy
    for attempt in range(policy.attempts):
        try:
            return await call()
        except Exception as exc:
            if isinstance(exc, CorruptChunkError) or (
                isinstance(exc, FileNotFoundError) and not is_transient(exc)
            ):
                raise
            if not is_transient(exc):  # such as 403: not retried, but told without secrets
                raise RemoteReadError(_failure(exc, url, key, attempt + 1, secrets)) from None
            if attempt + 1 == policy.attempts:
                raise RemoteReadError(_failure(exc, url, key, policy.attempts, secrets)) from None
            await _sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


async def _sleep(seconds: float) -> None:
    import asyncio  # only ever awaited inside a running event loop

    await asyncio.sleep(seconds)


def retry_call(call: Callable[[], T], *, url: str, key: str, secrets: object = None) -> T:
    """:func:`retry_async` for a blocking ``call`` (opening a store, reading metadata)."""
    policy = _policy
    for attempt in range(policy.attempts):
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt + 1 == policy.attempts:
                raise RemoteReadError(_failure(exc, url, key, policy.attempts, secrets)) from None
        # The failed try's objects can sit in reference cycles (through its traceback).
        # Free them now, in this thread: collected later on fsspec's I/O thread, an h5py
        # object's finalizer would wait there for h5py's global lock while the next try
        # holds that lock waiting for the same I/O thread, a deadlock (h5py issue 2019).
        gc.collect()
        time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover
