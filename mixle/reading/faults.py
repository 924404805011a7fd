"""Faults while reading: which errors are worth retrying, the retry policy, loud errors.

Remote stores fail now and then (a 503, a reset connection, a stall). Every request the
read layer makes is retried on its own with jittered exponential backoff, so a server that
fails one request in five still serves every read; a request that keeps failing raises
:class:`RemoteReadError` naming the URL (without credentials or query string) and the
chunk. A peer that stalls is cut off by the request timeout (:attr:`RetryPolicy.timeout`,
applied by :mod:`mixle.reading.fetch`) and retried, and every batch has a deadline
(:attr:`RetryPolicy.deadline`): no read waits on a silent server for ever. Errors raised
here carry no secret: no credentials, query strings or request headers in their text or in
their ``__cause__``/``__context__`` chain. A ranged response that does not answer the
range asked (wrong status, a shifted ``Content-Range``, a short body) raises
:class:`RangeMismatchError`, retried like a dropped connection. Data that arrives but is
wrong raises :class:`CorruptChunkError`: a patch is never silently filled with garbage.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import gc
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import NoReturn, TypeVar

from mixle.errors import ReadsStopped, RemoteReadError, RemoteTimeoutError
from mixle.utils.redact import from_network_client, redact_text, scrub_error
from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_BATCH_DEADLINE",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "CorruptChunkError",
    "RangeMismatchError",
    "RemoteReadError",
    "RemoteTimeoutError",
    "RetryPolicy",
    "batch_deadline",
    "is_transient",
    "keep_deadline",
    "retry_async",
    "retry_call",
    "retry_policy",
    "set_retry_policy",
    "stop_requested",
    "stop_when",
]

#: How many times one request is tried in all before :class:`RemoteReadError`.
DEFAULT_RETRY_ATTEMPTS = 5
#: Seconds before the first retry; each later retry waits twice as long...
DEFAULT_RETRY_BASE_DELAY = 0.1
#: ...but never longer than this many seconds (each wait is drawn in its upper half).
DEFAULT_RETRY_MAX_DELAY = 5.0
#: Seconds one request may wait to connect, for its first byte, or between two bytes.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Seconds one batch read (all its requests, tries and waits) may take in all.
DEFAULT_BATCH_DEADLINE = 300.0

#: Seconds between two looks at the stop flag (:func:`stop_when`) while a request waits.
STOP_POLL_S = 0.1

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
    """How remote requests are bounded and retried: tries, backoff, timeout, deadline.

    Attributes
    ----------
    attempts
        Tries per request in all (``1`` never retries).
    base_delay, max_delay
        Retry ``k`` (from 0) waits at most ``min(max_delay, base_delay * 2**k)`` seconds
        (:meth:`delay`), drawn at random in the upper half of that (:meth:`wait`), so the
        retries of requests that failed together do not go out together.
    timeout
        Seconds a request may wait to connect, for the first byte of its answer, and
        between two bytes; a request that stalls longer fails as a timeout and is retried.
        ``storage_options`` that set a timeout of their own keep it.
    deadline
        Seconds one batch read may take in all, every request, try and wait included;
        past it the batch raises :class:`RemoteTimeoutError`. ``math.inf``: no deadline.
    """

    attempts: int = DEFAULT_RETRY_ATTEMPTS
    base_delay: float = DEFAULT_RETRY_BASE_DELAY
    max_delay: float = DEFAULT_RETRY_MAX_DELAY
    timeout: float = DEFAULT_REQUEST_TIMEOUT
    deadline: float = DEFAULT_BATCH_DEADLINE

    def delay(self, retry: int) -> float:
        """The longest wait before retry number ``retry`` (0-based)."""
        return float(min(self.max_delay, self.base_delay * 2.0**retry))

    def wait(self, retry: int) -> float:
        """A wait before retry ``retry``: uniform in ``[delay(retry) / 2, delay(retry)]``."""
        bound = self.delay(retry)
        return bound * (0.5 + 0.5 * _JITTER.random())

    @property
    def budget(self) -> float:
        """The longest a failing request waits between its tries in all."""
        return sum(self.delay(k) for k in range(self.attempts - 1))


#: Jitter for retry waits: a private generator, so ``random``'s global state is untouched.
_JITTER = random.Random()
_policy = RetryPolicy()
#: The ``time.monotonic()`` by which the batch being fetched must be done (see
#: :func:`keep_deadline`); ``None`` outside a batch.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "mixle_batch_deadline", default=None
)


#: The "stop reading" check of the current thread or task (see :func:`stop_when`).
_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "mixle_stop_reading", default=None
)


@contextlib.contextmanager
def stop_when(requested: Callable[[], bool]) -> Iterator[None]:
    """Make the reads started inside this block give up once ``requested()`` is true.

    A reader thread whose consumer went away (Ctrl-C, ``close()``) runs its reads inside
    this block: once ``requested()`` returns true, :func:`retry_async` and
    :func:`retry_call` start no further try and no further wait, and a request in flight
    on an event loop is cancelled within :data:`STOP_POLL_S` seconds; they raise
    :class:`~mixle.errors.ReadsStopped`. The check is a context variable, so requests the
    block hands to an event loop (fsspec's, zarr's) carry it with them.
    """
    token = _STOP.set(requested)
    try:
        yield
    finally:
        _STOP.reset(token)


def stop_requested() -> bool:
    """Whether the reads of the current thread or task were asked to stop (:func:`stop_when`)."""
    requested = _STOP.get()
    return requested is not None and bool(requested())


def _stopped(url: str, key: str, secrets: object) -> ReadsStopped:
    return ReadsStopped(
        f"reading {redact_text(url, secrets)} (chunk {key}) was stopped: the loop reading it "
        "stopped (Ctrl-C, close() or an error), so it was not tried again"
    )


async def _await_unless_stopped(call: Awaitable[T], left: float) -> T:
    """``await call`` for at most ``left`` seconds (``TimeoutError`` past it), stoppable."""
    import asyncio

    if _STOP.get() is None:
        return await call if math.isinf(left) else await asyncio.wait_for(call, left)
    end = time.monotonic() + left
    task = asyncio.ensure_future(call)
    try:
        while not task.done():
            wait = min(STOP_POLL_S, max(0.0, end - time.monotonic()))
            await asyncio.wait({task}, timeout=wait)
            if task.done():
                break
            if stop_requested():
                raise ReadsStopped("stopped")
            if time.monotonic() >= end:
                raise TimeoutError(f"no answer within {left:g} s")
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _sleep_unless_stopped(seconds: float) -> None:
    import asyncio

    end = time.monotonic() + seconds
    while not stop_requested() and (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(left, STOP_POLL_S) if _STOP.get() is not None else left)


def retry_policy() -> RetryPolicy:
    """The process-wide retry policy every remote request follows."""
    return _policy


def set_retry_policy(
    attempts: int | None = None,
    base_delay: float | None = None,
    max_delay: float | None = None,
    timeout: float | None = None,
    deadline: float | None = None,
) -> RetryPolicy:
    """Change the process-wide retry policy (``None`` keeps a field); returns the old one.

    ``set_retry_policy(**dataclasses.asdict(old))`` restores a policy returned earlier.

    Raises
    ------
    ValueError
        For ``attempts < 1``, a negative delay, a ``timeout`` that is not a finite number
        of seconds above 0, or a ``deadline`` that is not a number of seconds above 0.
    TypeError
        For a ``timeout`` or ``deadline`` that is not a number.
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
    if timeout is not None:
        new = replace(new, timeout=_positive(timeout, "timeout", finite=True))
    if deadline is not None:
        new = replace(new, deadline=_positive(deadline, "deadline", finite=False))
    _policy = new
    return old


def _seconds(value: object, name: str) -> float:
    seconds = float(value) if isinstance(value, (int, float)) else float("nan")
    if not seconds >= 0:
        raise ValueError(f"{name}={value!r} must be a number of seconds >= 0")
    return seconds


def _positive(value: object, name: str, *, finite: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} must be a number of seconds, such as 30")
    seconds = float(value)
    if not seconds > 0 or (finite and not math.isfinite(seconds)):
        what = "a finite number of seconds > 0" if finite else "a number of seconds > 0"
        hint = "" if finite else " (math.inf: no deadline)"
        raise ValueError(f"{name}={value!r} must be {what}, such as 30{hint}")
    return seconds


def batch_deadline(seconds: float | None = None) -> float:
    """The ``time.monotonic()`` by which a batch that starts now must be done.

    ``seconds`` defaults to :attr:`RetryPolicy.deadline`; inside a batch already under a
    deadline (:func:`keep_deadline`), the earlier of the two.
    """
    end = time.monotonic() + (_policy.deadline if seconds is None else seconds)
    outer = _DEADLINE.get()
    return end if outer is None else min(end, outer)


def keep_deadline(end: float) -> None:
    """Make :func:`retry_async` in the current task, and the tasks it starts, end by ``end``.

    Call it first thing in a task of its own (such as one request of a batch): the setting
    is a context variable and lasts as long as the task's context.
    """
    _DEADLINE.set(end)


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
            f" (no answer within the {_policy.timeout:g} s request timeout; "
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
    seconds = _policy.deadline
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
    """Await ``call()``, retrying transient failures by :func:`retry_policy`.

    Stalled tries (the request timeout, applied by the caller's client) count as transient.
    Every try, and every wait between tries, ends by the deadline of the batch this runs
    in (:func:`keep_deadline`; outside one, :attr:`RetryPolicy.deadline` from now).

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
    policy = _policy
    end = _DEADLINE.get()
    if end is None:
        end = time.monotonic() + policy.deadline
    last: str | None = None  # what the last try failed with (no exception kept: no cycle)
    for attempt in range(policy.attempts):
        left = end - time.monotonic()
        if left <= 0:
            _raise_clean(RemoteTimeoutError(_late(url, key, attempt, last, secrets)))
        if stop_requested():
            _raise_clean(_stopped(url, key, secrets))
        try:
            return await _await_unless_stopped(call(), left)
        except ReadsStopped:
            _raise_clean(_stopped(url, key, secrets))
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
        await _sleep_unless_stopped(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def retry_call(call: Callable[[], T], *, url: str, key: str, secrets: object = None) -> T:
    """:func:`retry_async` for a blocking ``call`` (opening a store, reading metadata).

    A permanent failure of a remote ``url`` is raised with its secrets scrubbed
    (:func:`~mixle.utils.redact.scrub_error`): a missing object as a redacted
    ``FileNotFoundError``, a network client's error as :class:`RemoteReadError`, any other
    error as it is, its text redacted and a chain holding secrets dropped.
    """
    policy = _policy
    for attempt in range(policy.attempts):
        if stop_requested():
            _raise_clean(_stopped(url, key, secrets))
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
        _sleep_until_stopped(policy.wait(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _sleep_until_stopped(seconds: float) -> None:
    """``time.sleep(seconds)``, cut short when the reads are asked to stop."""
    end = time.monotonic() + seconds
    while not stop_requested() and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, STOP_POLL_S) if _STOP.get() is not None else left)


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
