"""What the test servers count and get wrong on purpose: the :class:`FaultPlan`.

A plan counts every request a server answers, fails or drops some, holds some (a slow or
stalled store) and answers some byte ranges wrongly (:data:`ERROR_PAGE`,
:func:`shifted`). Both servers of :mod:`mixle.testing_servers` take one.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

__all__ = ["ERROR_PAGE", "FaultPlan", "shifted"]

#: A single byte range of a ``Range`` request header (``bytes=a-b``, ``a-``, ``-n``).
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class FaultPlan:
    """Counts requests and decides which ones fail: thread-safe.

    Parameters
    ----------
    fail_every
        Every ``fail_every``-th request (1-based) gets ``fail_status`` (0: never).
    drop_every
        Every ``drop_every``-th request has its connection closed with no answer (0: never).
    fail_status
        The HTTP status of failed requests (a 5xx by default).
    delay
        Seconds each served request is held before it is answered (a slow store), so
        that :attr:`peak_inflight` shows how many requests a client keeps in flight.
    range_fault
        How ranged ``GET`` requests are answered wrongly (``None``: never):
        ``"shift"`` serves the range ``shift`` bytes later (earlier where it would pass the
        end) with an honest ``Content-Range``; ``"truncate"`` sends half the body under a
        ``Content-Range`` claiming all of it (a matching ``Content-Length``); ``"html"``
        answers ``200`` with an HTML error page; ``"whole"`` ignores ``Range`` and sends the
        whole object with ``200``.
    range_rate
        Fraction of ranged ``GET`` requests that get ``range_fault`` (``1.0``: all; ``0.25``:
        every fourth, counted, not drawn at random).
    range_once
        Answer each distinct request (path and ``Range``) wrongly at most once: its retry
        gets the right bytes, whatever the timing of other requests.
    shift
        Bytes a ``"shift"`` moves the range by.
    unranged
        Answer ``GET`` requests without ``Range`` with the ``"html"`` fault too (a whole
        object fetched as a plain ``GET``); the other faults only apply to ranges.
    stall
        How matching ``GET`` requests stall (``None``: never): ``"headers"`` holds the
        request before anything is sent; ``"body"`` sends the headers and half the body,
        then holds. A held request waits ``stall_for`` seconds or until :meth:`release`
        (or the server stops), then finishes its answer.
    stall_match
        Only ``GET`` requests whose path contains this text stall (``""``: every one).
    stall_for
        Seconds a stalled request is held at most.
    stall_once
        Stall each distinct request (path and ``Range``) at most once: its retry is served,
        whatever the timing of other requests.
    """

    RANGE_FAULTS = ("shift", "truncate", "html", "whole")
    STALLS = ("headers", "body")

    def __init__(
        self,
        fail_every: int = 0,
        drop_every: int = 0,
        fail_status: int = 503,
        delay: float = 0.0,
        range_fault: str | None = None,
        range_rate: float = 1.0,
        range_once: bool = False,
        shift: int = 4,
        unranged: bool = False,
        stall: str | None = None,
        stall_match: str = "",
        stall_for: float = 60.0,
        stall_once: bool = False,
    ) -> None:
        if stall is not None and stall not in self.STALLS:
            raise ValueError(f"stall={stall!r} must be one of {self.STALLS} or None")
        self._lock = threading.Lock()
        self.stall, self.stall_match, self.stall_for = stall, stall_match, stall_for
        self.stall_once = stall_once
        self.stalled = 0
        self._stalled_seen: set[tuple[str, str]] = set()
        self._released = threading.Event()
        self.fail_every, self.drop_every, self.fail_status = fail_every, drop_every, fail_status
        self.delay = delay
        self.dead = False
        self.range_fault, self.range_rate, self.range_once = range_fault, range_rate, range_once
        self.shift, self.unranged = shift, unranged
        self.range_faults = 0
        self._ranged = 0
        self._seen: set[tuple[str, str]] = set()
        self._count = 0
        self._inflight = 0
        self.peak_inflight = 0
        self.by_path: Counter[str] = Counter()
        self.log: list[tuple[str, str, str]] = []

    def record(self, method: str, path: str, byte_range: str) -> str | None:
        """Count one request; returns ``"fail"``, ``"drop"`` or ``None`` (serve it).

        Every call must be followed by :meth:`finished` once the request is answered.
        """
        with self._lock:
            self._count += 1
            n = self._count
            self._inflight += 1
            self.peak_inflight = max(self.peak_inflight, self._inflight)
            self.by_path[path] += 1
            self.log.append((method, path, byte_range))
        if self.dead:
            return "drop"
        if self.drop_every and n % self.drop_every == 0:
            return "drop"
        if self.fail_every and n % self.fail_every == 0:
            return "fail"
        if self.delay > 0:
            time.sleep(self.delay)
        return None

    def range_action(self, path: str, byte_range: str) -> str | None:
        """For one ranged ``GET``: the fault to answer it with, or ``None`` (serve it right)."""
        fault = self.range_fault
        if fault is None:
            return None
        if fault not in self.RANGE_FAULTS:
            raise ValueError(f"range_fault={fault!r} must be one of {self.RANGE_FAULTS} or None")
        with self._lock:
            self._ranged += 1
            n = self._ranged
            hit = int(n * self.range_rate) > int((n - 1) * self.range_rate)
            if self.range_once:
                first = (path, byte_range) not in self._seen
                self._seen.add((path, byte_range))
                hit = hit and first
            if hit:
                self.range_faults += 1
        return fault if hit else None

    def stall_action(self, method: str, path: str, byte_range: str = "") -> str | None:
        """For one request: ``"headers"``, ``"body"`` (stall there) or ``None``."""
        if self.stall is None or method != "GET" or self.stall_match not in path:
            return None
        with self._lock:
            if self.stall_once:
                if (path, byte_range) in self._stalled_seen:
                    return None
                self._stalled_seen.add((path, byte_range))
            self.stalled += 1
        return self.stall

    def hold(self) -> None:
        """Hold a stalled request: ``stall_for`` seconds or until :meth:`release`."""
        self._released.wait(self.stall_for)

    def release(self) -> None:
        """Let every held request (and every later stalled one) finish at once."""
        self._released.set()

    def finished(self) -> None:
        """One request recorded by :meth:`record` was answered (or dropped)."""
        with self._lock:
            self._inflight -= 1

    @property
    def requests(self) -> int:
        """Requests answered (or failed on purpose) since the last :meth:`reset`."""
        return self._count

    def reset(self) -> None:
        """Zero the counters (fault settings stay)."""
        with self._lock:
            self._count = 0
            self.peak_inflight = self._inflight
            self.by_path.clear()
            self.log.clear()
            self.range_faults = 0
            self._ranged = 0
            self._seen.clear()
            self._stalled_seen.clear()


#: What a ``"html"`` range fault answers with ``200``: an error page, as proxies send.
ERROR_PAGE = (
    b"<!DOCTYPE html><html><head><title>503 Service Unavailable</title></head><body>"
    b"<h1>Service Unavailable</h1><p>The server is temporarily unable to service your "
    b"request. Please try again later.</p></body></html>\n"
)


def shifted(start: int, end: int, size: int, by: int) -> tuple[int, int]:
    """``[start, end)`` moved ``by`` bytes later, or earlier where later passes ``size``."""
    if end + by <= size:
        return start + by, end + by
    step = min(by, start) or 1  # a range that fills the object moves by one byte at least
    return (start - step, end - step) if start >= step else (start + step, min(size, end + step))
