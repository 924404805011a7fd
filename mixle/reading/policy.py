"""The retry policy every remote request follows: tries, backoff, request timeout, deadline.

One process-wide :class:`RetryPolicy` (:func:`retry_policy`, :func:`set_retry_policy`) says
how often a failing request is tried (:func:`~mixle.reading.faults.retry_async`), how long
it waits between tries (jittered exponential backoff), how long one request may wait on a
silent peer (:attr:`RetryPolicy.timeout`, applied by :mod:`mixle.reading.fs_options`) and
how long one batch may take in all (:attr:`RetryPolicy.deadline`; :func:`batch_deadline`,
:func:`keep_deadline`).
"""

from __future__ import annotations

import contextvars
import math
import random
import time
from dataclasses import dataclass, replace

from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_BATCH_DEADLINE",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETRY_ATTEMPTS",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "RetryPolicy",
    "batch_deadline",
    "keep_deadline",
    "kept_deadline",
    "retry_policy",
    "set_retry_policy",
]

#: How many times one request is tried in all before :class:`~mixle.errors.RemoteReadError`.
DEFAULT_RETRY_ATTEMPTS = 5
#: Seconds before the first retry; each later retry waits twice as long...
DEFAULT_RETRY_BASE_DELAY = 0.1
#: ...but never longer than this many seconds (each wait is drawn in its upper half).
DEFAULT_RETRY_MAX_DELAY = 5.0
#: Seconds one request may wait to connect, for its first byte, or between two bytes.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Seconds one batch read (all its requests, tries and waits) may take in all.
DEFAULT_BATCH_DEADLINE = 300.0


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
        past it the batch raises :class:`~mixle.errors.RemoteTimeoutError`. ``math.inf``:
        no deadline.
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
    """Make ``retry_async`` in the current task, and the tasks it starts, end by ``end``.

    Call it first thing in a task of its own (such as one request of a batch): the setting
    is a context variable and lasts as long as the task's context.
    """
    _DEADLINE.set(end)


def kept_deadline() -> float | None:
    """The ``time.monotonic()`` set by :func:`keep_deadline` in this context; ``None`` outside."""
    return _DEADLINE.get()
