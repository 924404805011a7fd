"""Faults while reading: which errors are worth retrying, the retry loops, loud errors.

Remote stores fail now and then (a 503, a reset connection, a stall). Every request the
read layer makes is retried on its own (:func:`retry_async`, :func:`retry_call`) with the
jittered exponential backoff of the retry policy (:mod:`mixle.reading.policy`), so a server
that fails one request in five still serves every read; a request that keeps failing raises
:class:`RemoteReadError` naming the URL (without credentials or query string) and the
chunk. A peer that stalls is cut off by the request timeout
(:attr:`~mixle.reading.policy.RetryPolicy.timeout`, applied by
:mod:`mixle.reading.fs_options`) and retried, and every batch has a deadline
(:attr:`~mixle.reading.policy.RetryPolicy.deadline`): no read waits on a silent server for
ever; reads asked to stop give up (:mod:`mixle.reading.stopping`). Errors raised here carry
no secret: no credentials, query strings or request headers in their text or in their
``__cause__``/``__context__`` chain. A ranged response that does not answer the range asked
(wrong status, a shifted ``Content-Range``, a short body) raises
:class:`RangeMismatchError`, retried like a dropped connection. Data that arrives but is
wrong raises :class:`CorruptChunkError`: a patch is never silently filled with garbage.
"""

from __future__ import annotations

import errno
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from mixle.errors import (
    CorruptChunkError,
    RangeMismatchError,
    ReadsStopped,
    RemoteReadError,
    RemoteTimeoutError,
)
from mixle.reading.policy import (  # the policy's public names were importable from here
    DEFAULT_BATCH_DEADLINE,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_BASE_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
    RetryPolicy,
    batch_deadline,
    keep_deadline,
    kept_deadline,
    retry_policy,
    set_retry_policy,
)
from mixle.reading.stopping import (
    STOP_POLL_S,
    await_unless_stopped,
    sleep_unless_stopped,
    sleep_until_stopped,
    stop_requested,
    stop_when,
    stopped_error,
)
from mixle.utils.redact import from_network_client, redact_text, scrub_error

__all__ = [
    "CorruptChunkError",
    "RangeMismatchError",
    "RemoteReadError",
    "RemoteTimeoutError",
    "is_transient",
    "retry_async",
    "retry_call",
    # before policy.py and stopping.py were split out, these were this module's own (the
    # docs named them here): they stay importable from it
    "DEFAULT_BATCH_DEADLINE",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "STOP_POLL_S",
    "RetryPolicy",
    "batch_deadline",
    "keep_deadline",
    "set_retry_policy",
    "stop_when",
]

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
    reason = _failure_reason(exc, secrets)
    status = getattr(exc, "status", None)
    if isinstance(status, int) and str(status) not in reason:
        reason += f" (status {status})"
    if _is_timeout(exc):
        reason += (
            f" (no answer within the {retry_policy().timeout:g} s request timeout; "
            "mixle.reading.set_retry_policy(timeout=...) changes it)"
        )
    return f"reading {redact_text(url, secrets)} (chunk {key}) failed after {tries} tries: {reason}"


def _is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` says a peer did not answer in time (aiohttp's, botocore's, asyncio's)."""
    asyncio = sys.modules.get("asyncio")
    timeouts = (TimeoutError,) if asyncio is None else (TimeoutError, asyncio.TimeoutError)
    names = {"ServerTimeoutError", "ReadTimeoutError", "ConnectTimeoutError", "FSTimeoutError"}
    return isinstance(exc, timeouts) or any(c.__name__ in names for c in type(exc).__mro__)


def _raise_clean(error: BaseException) -> NoReturn:
    """Raise ``error`` with no ``__cause__``/``__context__``: the chain holds secrets.

    The upstream error a retry gave up on keeps the request it failed (aiohttp's
    ``request_info``: the URL with its query string, the ``Authorization`` header); the
    message of ``error`` says what it was, redacted.
    """
    error.__cause__ = None
    error.__suppress_context__ = True
    try:
        raise error
    finally:
        error.__context__ = None
        del error  # this frame is on the error's traceback: holding it would be a cycle


def _not_found(exc: BaseException, url: str, key: str, secrets: object) -> FileNotFoundError:
    """fsspec's "not found" (its text the full URL, query string included), redacted."""
    return FileNotFoundError(
        f"{redact_text(url, secrets)} (chunk {key}): no such object "
        f"({redact_text(f'{type(exc).__name__}: {exc}', secrets)})"
    )


def _late(url: str, key: str, tries: int, last: str | None, secrets: object) -> str:
    seconds = retry_policy().deadline
    after = "" if last is None else f"; the last try failed with {last}"
    return (
        f"reading {redact_text(url, secrets)} (chunk {key}) gave up after {tries} tries: its "
        f"batch passed its {seconds:g} s deadline (mixle.reading.set_retry_policy(deadline=...) "
        f"changes it){after}"
    )


def _failure_reason(exc: BaseException, secrets: object) -> str:
    """``Type: message`` of ``exc``, redacted; just ``Type`` when its message is empty."""
    text = str(exc)
    return redact_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, secrets)


async def retry_async(
    call: Callable[[], Awaitable[T]], *, url: str, key: str, secrets: object = None
) -> T:
    """Await ``call()``, retrying transient failures by the process-wide retry policy.

    Stalled tries (the request timeout, applied by the caller's client) count as transient.
    Every try, and every wait between tries, ends by the deadline of the batch this runs
    in (:func:`~mixle.reading.policy.keep_deadline`; outside one,
    :attr:`~mixle.reading.policy.RetryPolicy.deadline` from now).

    Raises
    ------
    RemoteReadError
        When every try failed with a transient error, or at once for a permanent one
        (such as a 403); names ``url`` and ``key``, never credentials. Its chain is empty:
        the upstream error (whose request info holds credentials) is summarised, redacted,
        in the message.
    RemoteTimeoutError
        When the last try timed out, or the deadline passed (a :class:`RemoteReadError`).
    FileNotFoundError
        At once, its text redacted: the caller decides whether a missing object is a fill
        value.
    """
    policy = retry_policy()
    end = kept_deadline()
    if end is None:
        end = time.monotonic() + policy.deadline
    last: str | None = None  # what the last try failed with (no exception kept: no cycle)
    for attempt in range(policy.attempts):
        left = end - time.monotonic()
        if left <= 0:
            _raise_clean(RemoteTimeoutError(_late(url, key, attempt, last, secrets)))
        if stop_requested():
            _raise_clean(stopped_error(url, key, secrets))
        try:
            return await await_unless_stopped(call(), left)
        except ReadsStopped:
            _raise_clean(stopped_error(url, key, secrets))
        except Exception as exc:
            if isinstance(exc, CorruptChunkError):
                raise
            if isinstance(exc, FileNotFoundError) and not is_transient(exc):
                _raise_clean(_not_found(exc, url, key, secrets))
            if _is_timeout(exc) and time.monotonic() >= end:  # wait_for gave up: the deadline
                _raise_clean(RemoteTimeoutError(_late(url, key, attempt + 1, last, secrets)))
            if not is_transient(exc):  # such as 403: not retried, but told without secrets
                _raise_clean(RemoteReadError(_failure(exc, url, key, attempt + 1, secrets)))
            if attempt + 1 == policy.attempts:
                kind = RemoteTimeoutError if _is_timeout(exc) else RemoteReadError
                _raise_clean(kind(_failure(exc, url, key, policy.attempts, secrets)))
            last = _failure_reason(exc, secrets)
        pause = min(policy.wait(attempt), max(0.0, end - time.monotonic()))
        await sleep_unless_stopped(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def retry_call(call: Callable[[], T], *, url: str, key: str, secrets: object = None) -> T:
    """:func:`retry_async` for a blocking ``call`` (opening a store, reading metadata).

    A permanent failure of a remote ``url`` is raised with its secrets scrubbed
    (:func:`~mixle.utils.redact.scrub_error`): a missing object as a redacted
    ``FileNotFoundError``, a network client's error as :class:`RemoteReadError`, any other
    error as it is, its text redacted and a chain holding secrets dropped.
    """
    policy = retry_policy()
    for attempt in range(policy.attempts):
        if stop_requested():
            _raise_clean(stopped_error(url, key, secrets))
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                if "://" not in url or _scrub_in_place(exc, secrets):
                    raise  # as it is (scrubbed in place where it was remote)
                _raise_clean(_replacement(exc, url, key, attempt + 1, secrets))
            if attempt + 1 == policy.attempts:
                kind = RemoteTimeoutError if _is_timeout(exc) else RemoteReadError
                _raise_clean(kind(_failure(exc, url, key, policy.attempts, secrets)))
        # The failed try's objects can sit in reference cycles (through its traceback).
        # Free them now, in this thread: collected later on fsspec's I/O thread, an h5py
        # object's finalizer would wait there for h5py's global lock while the next try
        # holds that lock waiting for the same I/O thread, a deadlock (h5py issue 2019).
        gc.collect()
        sleep_until_stopped(policy.wait(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _scrub_in_place(exc: BaseException, secrets: object) -> bool:
    """Scrub ``exc`` (see :func:`retry_call`) if it can be raised as it is; else ``False``."""
    if isinstance(exc, FileNotFoundError) and not isinstance(exc, RemoteReadError):
        return False
    if from_network_client(exc):
        return False
    scrub_error(exc, secrets)
    return True


def _replacement(
    exc: BaseException, url: str, key: str, tries: int, secrets: object
) -> BaseException:
    """What :func:`retry_call` raises for a permanent failure it cannot scrub in place."""
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(redact_text(str(exc), secrets) or redact_text(url, secrets))
    return RemoteReadError(_failure(exc, url, key, tries, secrets))
