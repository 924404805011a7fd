"""One active iteration per loader: stopped by ``close()``, ``with`` exit or collection."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["ActiveRun"]

R = TypeVar("R", bound="ActiveRun")


class ActiveRun:
    """Holds a loader's running iterator by weak reference and stops it on ``close()``.

    Notes
    -----
    The loader keeps only a weak reference, so a loop that is abandoned (``break``, an
    exception) lets its iterator be collected, which closes it and stops its threads.
    """

    _active: weakref.ref[Iterator[Any]] | None = None

    def _start_run(self, run: Iterator[Any]) -> Iterator[Any]:
        """Make ``run`` the active iterator (after :meth:`close` stopped the last one)."""
        self._active = weakref.ref(run)
        return run

    def close(self) -> None:
        """Stop the active iterator and its threads (the cursor stays where it is)."""
        run = self._active() if self._active is not None else None
        self._active = None
        if run is not None:
            run.close()  # type: ignore[attr-defined]

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
