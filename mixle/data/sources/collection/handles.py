"""The bounded, least-recently-used set of volumes whose handles are open, with leases.

:class:`HandlePool` counts volumes, not files: a volume of aligned arrays keeps one handle
per array. It never opens anything itself; it tells its owner which volume to give back
(``release(i)``) before the volume asked for is opened, so the open count never passes
the bound except by volumes that are leased at that moment.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from mixle.utils.forks import ForkLock

__all__ = ["HandlePool"]

#: Serialises the one reset of each pool in a forked child.
_fork_lock = ForkLock()


class HandlePool:
    """At most ``max_open`` live volumes, least recently used given back first.

    Parameters
    ----------
    max_open
        The bound (an int >= 1, checked by the caller).
    release
        Called with a volume's index, under the pool's lock, to drop its handles (the volume
        is not leased then, and cannot be leased until it returns).

    Notes
    -----
    A leased volume is never given back. When every live volume is leased, a new lease
    goes over the bound (by the leases held then); the excess is given back as leases end.
    Thread-safe; in a forked child the pool starts empty (the child's sources reopen their
    own handles), and leases taken in the parent end without effect.
    """

    def __init__(self, max_open: int, release: Callable[[int], None]) -> None:
        self._max = max_open
        self._release = release
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._live: OrderedDict[int, None] = OrderedDict()
        self._leases: dict[int, int] = {}
        self._pid = os.getpid()

    def _own(self) -> None:
        if self._pid != os.getpid():
            with _fork_lock:
                if self._pid != os.getpid():
                    self._reset()

    @property
    def max_open(self) -> int:
        """The bound on live volumes."""
        return self._max

    def is_live_locked(self, i: int) -> bool:
        """Whether volume ``i`` is live; only from inside ``release`` (the lock is held)."""
        return i in self._live

    def live(self) -> tuple[int, ...]:
        """The live volumes, least recently used first."""
        self._own()
        with self._lock:
            return tuple(self._live)

    def acquire(self, i: int) -> None:
        """Lease volume ``i``: mark it live and most recent, giving back others past the bound."""
        self._own()
        with self._lock:
            self._leases[i] = self._leases.get(i, 0) + 1
            if i in self._live:
                self._live.move_to_end(i)
                return
            self._live[i] = None
            self._shrink()

    def release(self, i: int) -> None:
        """End one lease of volume ``i`` (taken with :meth:`acquire`)."""
        self._own()
        with self._lock:
            count = self._leases.get(i)
            if count is None:  # taken in the parent of this forked process
                return
            if count > 1:
                self._leases[i] = count - 1
                return
            del self._leases[i]
            self._shrink()

    def forget(self, i: int) -> None:
        """Drop volume ``i`` from the live set (its handles were given back by its owner)."""
        self._own()
        with self._lock:
            self._live.pop(i, None)

    def clear(self) -> tuple[int, ...]:
        """Forget every volume and lease; return the volumes that were live."""
        self._own()
        with self._lock:
            live = tuple(self._live)
            self._live.clear()
            self._leases.clear()
            return live

    def _shrink(self) -> None:
        """Give back unleased volumes, least recent first, until the bound holds (locked)."""
        excess = len(self._live) - self._max
        if excess <= 0:
            return
        for j in list(self._live):
            if j in self._leases:
                continue
            del self._live[j]
            self._release(j)
            excess -= 1
            if not excess:
                return
