"""What every source does at the end of its life: ``close()``, ``with``, a clear error after.

Array sources (:mod:`mixle.data.sources.base`) and record sources
(:mod:`mixle.data.sources.records`) keep one live handle, opened lazily under a lock and
reopened after ``fork``; this mixin closes it the same way for both.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from mixle.errors import SourceClosedError

__all__ = ["SourceLifetime"]

S = TypeVar("S", bound="SourceLifetime")


class SourceLifetime:
    """``close()`` (idempotent, thread-safe), context manager, and the closed-source error.

    Notes
    -----
    ``close()`` takes the source's lock, so a read racing with it opens no handle and keeps
    nothing derived from one (a chunk reader with an open descriptor, say) afterwards.
    """

    _closed: bool
    _handle: Any
    _pid: int
    _lock: Any

    def _location(self) -> str:
        raise NotImplementedError

    def _release(self, handle: Any) -> None:
        """Close OS resources held by ``handle`` (called by :meth:`close`)."""

    def _drop_derived(self) -> None:
        """Forget what was built from the handle (called by :meth:`close`, under the lock)."""

    def _closed_error(self, doing: str = "read it") -> SourceClosedError:
        return SourceClosedError(
            f"{type(self).__name__}({self._location()}) is closed; open it again to {doing}"
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def close(self) -> None:
        """Release the store's handles; later reads raise :class:`SourceClosedError`."""
        if self._closed:
            return
        with self._lock:  # nothing is stored on the source once close() has taken it
            self._closed = True
            handle, self._handle = self._handle, None
            self._drop_derived()
        if handle is not None and self._pid == os.getpid():
            self._release(handle)

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
