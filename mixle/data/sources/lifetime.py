"""The life of a source's one handle: opened lazily under a lock, reopened after ``fork``,
closed by ``close()`` or ``with``, a clear error after.

Array sources (:mod:`mixle.data.sources.arrays.base`) and record sources
(:mod:`mixle.data.sources.records.base`) both keep one live handle and the metadata read with
it; this mixin opens, reopens and closes it the same way for both.
"""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

from mixle.errors import SourceClosedError
from mixle.utils.forks import ForkLock

__all__ = ["SourceLifetime"]

S = TypeVar("S", bound="SourceLifetime")

#: Serialises the one reset of each source in a forked child (:meth:`SourceLifetime._own`).
_fork_lock = ForkLock(reentrant=True)


class SourceLifetime:
    """The live handle (:meth:`_live`), ``close()``, context manager, the closed-source error.

    Notes
    -----
    The handle is opened once under the source's lock; the metadata read with it is stored
    before the handle, so a thread that sees the handle without taking the lock also sees
    the metadata. ``close()`` takes the same lock, so a read racing with it opens no handle
    and keeps nothing derived from one (a chunk reader with an open descriptor, say).

    A read that uses OS resources of the handle (descriptors, connections) runs between
    :meth:`_begin_read` and :meth:`_end_read` (``try``/``finally``; cheaper than a context
    manager on a path taken once per row): ``close()`` then leaves the handle open until the
    last such read has ended, so no read ever goes through a descriptor whose number another
    file may have taken; reads that start after ``close()`` raise :class:`SourceClosedError`.

    :meth:`release_handle` gives the handle back without closing the source (a bounded pool
    of open volumes does): the next read reopens it; counted reads in flight keep the old
    handle until the last of them ends.

    In a forked child the first read or ``close()`` makes the source the child's
    (:meth:`_own`) exactly once, however many threads arrive at once; no thread gets a
    handle, or takes the source's lock, before that reset has finished.
    """

    _closed: bool
    _handle: Any
    _meta: Any
    _pid: int
    _lock: threading.RLock
    _readers: int
    _unreleased: list[Any]

    def _init_lifetime(self) -> None:
        """No handle yet, open, owned by this process."""
        self._handle = None
        self._meta = None
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.RLock()
        self._readers = 0  # reads between _begin_read() and _end_read() now
        self._unreleased = []  # handles close()/release_handle() left for the last of them

    def _open_described(self) -> tuple[Any, Any]:
        """Open the store: ``(handle, metadata)``."""
        raise NotImplementedError

    def _forked(self, handle: Any) -> Any:
        """What a forked child keeps of the parent's ``handle`` (default: nothing, reopen)."""
        return None

    def _live(self) -> Any:
        """The open handle, opened on first use and reopened after a fork."""
        if self._closed:
            raise self._closed_error()
        if self._pid != os.getpid():
            self._own()
        handle = self._handle
        if handle is None:
            with self._lock:
                if self._closed:  # closed while this thread waited: open nothing
                    raise self._closed_error()
                if self._handle is None:
                    opened, self._meta = self._open_described()
                    self._handle = opened  # published after its metadata
                handle = self._handle
        return handle

    def _own(self) -> None:
        """Make a source inherited through ``fork`` this process's, once.

        The parent's lock, read count, derived readers and handles are not this process's:
        a new lock, no reads, nothing derived, and the handles through :meth:`_forked`.
        Threads of the child that arrive at once wait here for the first to finish; the pid
        is stored last, so a thread that sees this process's pid sees the whole reset.
        """
        with _fork_lock:
            pid = os.getpid()
            if self._pid == pid:  # another thread of this process made the reset
                return
            self._lock = threading.RLock()
            self._readers = 0  # the parent's reading threads do not exist here
            self._drop_derived()  # chunk readers hold the parent's descriptors and locks
            kept = (self._forked(handle) for handle in self._unreleased)
            self._unreleased = [handle for handle in kept if handle is not None]
            if self._handle is not None:
                self._handle = self._forked(self._handle)
            self._pid = pid

    def _begin_read(self) -> Any:
        """Count a read in and return the open handle, kept open until :meth:`_end_read`.

        Call :meth:`_end_read` exactly once after it returns (``try``/``finally``), even if
        :meth:`close` runs meanwhile: the last read to end releases the handle.

        Raises
        ------
        SourceClosedError
            The source was closed before the read began (no :meth:`_end_read` then).
        """
        self._live()  # opens, or reopens after a fork, before the lock is taken
        with self._lock:
            if self._closed:
                raise self._closed_error()
            handle = self._handle
            if handle is None:  # release_handle() ran since _live(): open it again
                opened, self._meta = self._open_described()
                self._handle = handle = opened
            self._readers += 1
            return handle

    def _end_read(self) -> None:
        """Count a read out; the last one releases the handles close()/release_handle() left."""
        with self._lock:
            self._readers -= 1
            if self._readers or not self._unreleased:
                return
            left, self._unreleased = self._unreleased, []
            if not self._closed:  # release_handle(): before another thread can reopen
                self._release_all(left)
                return
        self._release_all(left)

    def _release_all(self, handles: list[Any]) -> None:
        if self._pid == os.getpid():
            for handle in handles:
                self._release(handle)

    def _location(self) -> str:
        raise NotImplementedError

    def _reopenable(self) -> bool:
        """Whether the store can be opened again from the source's arguments."""
        return getattr(self, "_args", None) is not None

    def _release(self, handle: Any) -> None:
        """Close OS resources held by ``handle`` (called by :meth:`close`)."""

    def _drop_derived(self) -> None:
        """Forget what was built from the handle (by :meth:`close` under the lock; after fork)."""

    def _closed_error(self, doing: str = "read it") -> SourceClosedError:
        return SourceClosedError(
            f"{type(self).__name__}({self._location()}) is closed; open it again to {doing}"
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def close(self) -> None:
        """Release the store's handles; later reads raise :class:`SourceClosedError`.

        Reads in flight (begun with :meth:`_begin_read`) finish first: the last of them
        releases the handle.
        """
        if self._closed:
            return
        if self._pid != os.getpid():  # the inherited lock may be held by a parent thread
            self._own()
        with self._lock:  # nothing is stored on the source once close() has taken it
            self._closed = True
            handle, self._handle = self._handle, None
            self._drop_derived()
            if handle is not None and self._readers:
                self._unreleased.append(handle)
                handle = None
        if handle is not None and self._pid == os.getpid():
            self._release(handle)

    def release_handle(self) -> None:
        """Drop the live handle and what was built from it; the source stays open.

        The next read (or metadata access) reopens the store, as after a fork: a bounded
        pool of open volumes (:class:`mixle.VolumeCollection`) calls this to give back a
        descriptor without closing the source its caller holds. Derived chunk readers and
        their cached chunks go with the handle, so a reopened store never sees the old
        handle's chunks. A closed source, one with no live handle, and one that cannot
        reopen from its arguments (wrapping an in-memory file object) are left as they are.

        Notes
        -----
        Thread-safe. Reads counted in with :meth:`_begin_read` (record sources) finish on
        the old handle, which the last of them releases; array reads are not counted, so
        a caller must not release a handle another thread is reading through (the
        collection's leases guarantee that). In a forked child the source is made the
        child's first, so the parent's handle is never released from the child.
        """
        if self._closed or not self._reopenable():
            return
        if self._pid != os.getpid():
            self._own()
        with self._lock:  # released under the lock: no thread reopens meanwhile
            if self._closed:
                return
            handle, self._handle = self._handle, None
            self._drop_derived()
            if handle is None:
                return
            if self._readers:
                self._unreleased.append(handle)
                return
            self._release(handle)

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
