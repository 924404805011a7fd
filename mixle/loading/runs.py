"""One active iteration per loader: stopped by ``close()``, ``with`` exit or collection."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

from mixle.loading.prefetch import StopSignal

__all__ = ["ActiveRun", "workers_module"]

R = TypeVar("R", bound="ActiveRun")


def workers_module() -> Any:
    """:mod:`mixle.loading.workers.pool`, imported when a loader's run first uses worker
    processes, so that ``import mixle`` does not load ``multiprocessing.connection`` and
    sockets."""
    from mixle.loading.workers import pool

    return pool


class ActiveRun:
    """Holds a loader's running iterator by weak reference and stops it on ``close()``.

    Notes
    -----
    The loader keeps only a weak reference, so a loop that is abandoned (``break``, an
    exception) lets its iterator be collected, which closes it and stops its threads.
    A run started with a :class:`~mixle.loading.prefetch.StopSignal` is also told to stop
    through it, so ``close()`` stops a run that another thread is iterating: that loop
    raises :class:`~mixle.ReadsStopped` instead of its next batch.
    """

    _active: weakref.ref[Iterator[Any]] | None = None
    _signal: StopSignal | None = None

    def _start_run(self, run: Iterator[Any], signal: StopSignal | None = None) -> Iterator[Any]:
        """Make ``run`` the active iterator (after :meth:`close` stopped the last one)."""
        self._active = weakref.ref(run)
        self._signal = signal
        return run

    def close(self) -> None:
        """Stop the active iterator and its threads (the cursor stays where it is)."""
        run = self._active() if self._active is not None else None
        signal, self._active, self._signal = self._signal, None, None
        if signal is not None:
            signal.set()
        if run is None:
            return
        try:
            run.close()  # type: ignore[attr-defined]
        except ValueError:  # "generator already executing": a loop in progress (in this
            if signal is None:  # or another thread) stops at its next batch, as signalled
                raise

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
