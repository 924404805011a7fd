"""Stop signals: the reads of a thread whose consumer went away give up, soon and cleanly.

A reader thread runs its reads inside :func:`stop_when`; once its check says stop,
:func:`~mixle.reading.faults.retry_async` and :func:`~mixle.reading.faults.retry_call`
start no further try or wait, and a request in flight is cancelled within
:data:`STOP_POLL_S` seconds, raising :class:`~mixle.errors.ReadsStopped`. The waits here
(:func:`await_unless_stopped`, :func:`sleep_unless_stopped`, :func:`sleep_until_stopped`)
are the retry layer's.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from mixle.errors import ReadsStopped
from mixle.utils.redact import redact_text

__all__ = [
    "STOP_POLL_S",
    "await_unless_stopped",
    "sleep_unless_stopped",
    "sleep_until_stopped",
    "stop_requested",
    "stop_when",
    "stopped_error",
]

#: Seconds between two looks at the stop flag (:func:`stop_when`) while a request waits.
STOP_POLL_S = 0.1

T = TypeVar("T")


#: The "stop reading" check of the current thread or task (see :func:`stop_when`).
_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "mixle_stop_reading", default=None
)


@contextlib.contextmanager
def stop_when(requested: Callable[[], bool]) -> Iterator[None]:
    """Make the reads started inside this block give up once ``requested()`` is true.

    A reader thread whose consumer went away (Ctrl-C, ``close()``) runs its reads inside
    this block: once ``requested()`` returns true, :func:`~mixle.reading.faults.retry_async`
    and :func:`~mixle.reading.faults.retry_call` start no further try and no further wait,
    and a request in flight on an event loop is cancelled within :data:`STOP_POLL_S`
    seconds; they raise
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


def stopped_error(url: str, key: str, secrets: object) -> ReadsStopped:
    """The :class:`~mixle.errors.ReadsStopped` for chunk ``key`` of ``url`` (redacted)."""
    return ReadsStopped(
        f"reading {redact_text(url, secrets)} (chunk {key}) was stopped: the loop reading it "
        "stopped (Ctrl-C, close() or an error), so it was not tried again"
    )


async def await_unless_stopped(call: Awaitable[T], left: float) -> T:
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


async def sleep_unless_stopped(seconds: float) -> None:
    """``await asyncio.sleep(seconds)``, cut short when the reads are asked to stop."""
    import asyncio

    end = time.monotonic() + seconds
    while not stop_requested() and (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(left, STOP_POLL_S) if _STOP.get() is not None else left)


def sleep_until_stopped(seconds: float) -> None:
    """``time.sleep(seconds)``, cut short when the reads are asked to stop."""
    end = time.monotonic() + seconds
    while not stop_requested() and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, STOP_POLL_S) if _STOP.get() is not None else left)
