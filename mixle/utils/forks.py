"""A process-wide lock that a forked child gets anew.

A thread of the parent may hold a lock at the moment of ``fork``; the child inherits it
held, by a thread that does not exist there, and would wait for ever. :class:`ForkLock`
replaces itself in the child (``os.register_at_fork``), so the one-time reset a child makes
of an inherited object can take it safely.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["ForkLock"]


class ForkLock:
    """A lock (``reentrant``: an ``RLock``) that is new and free in every forked child."""

    def __init__(self, *, reentrant: bool = False) -> None:
        self._factory: Any = threading.RLock if reentrant else threading.Lock
        self._lock = self._factory()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = self._factory()

    def __enter__(self) -> ForkLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
