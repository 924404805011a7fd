"""Optional progress bars for long operations: one facade over tqdm, silent without it.

Long operations (building a CSV/JSON lines row index, a weighted sampler's block index,
writing a stitched volume, building encoded shards) open a bar with :func:`progress_bar`
and advance it in coarse steps (a block, a slab, a shard), never per row.

Whether a bar shows is decided, first match wins, by:

1. the operation's ``progress=`` argument (``True``/``False``; ``None`` defers),
2. :func:`set_progress` (process-wide; ``None`` defers),
3. the environment variable ``MIXLE_PROGRESS`` (``1``/``0``; unset, empty or ``auto``
   defers),
4. automatic: a bar shows only when stderr is a terminal and the operation is still
   running after :data:`PROGRESS_DELAY_S` seconds, so tests, CI logs and fast calls print
   nothing.

Bars show only in the main process: a multiprocessing worker (``MPEncodedData``'s, a
``multiprocessing.Pool``'s, a PyTorch ``DataLoader``'s) never draws one, whatever the
setting, so N workers never print N interleaved bars.

Bars need tqdm (``pip install -e ".[progress]"``); without it every bar is a silent no-op.
tqdm is imported only when a bar may show, never by ``import mixle``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from mixle.utils.optional_deps import require

__all__ = [
    "PROGRESS_DELAY_S",
    "PROGRESS_ENV",
    "ProgressBar",
    "in_worker_process",
    "parse_progress",
    "progress_bar",
    "progress_setting",
    "set_progress",
]

#: Seconds an operation must run before an automatic bar appears (tqdm's ``delay=``).
PROGRESS_DELAY_S = 0.5
#: Environment variable that turns bars on (``1``) or off (``0``) for the whole process.
PROGRESS_ENV = "MIXLE_PROGRESS"

_ENV_VALUES: dict[str, bool | None] = {
    "1": True,
    "true": True,
    "on": True,
    "yes": True,
    "0": False,
    "false": False,
    "off": False,
    "no": False,
    "": None,
    "auto": None,
}
_override: bool | None = None


def parse_progress(value: object, name: str = "progress") -> bool | None:
    """Validate a progress setting: ``True``, ``False`` or ``None`` (automatic).

    Parameters
    ----------
    value
        The setting to check.
    name
        The argument's name, used in the error message.

    Returns
    -------
    bool or None
        The setting as a plain ``bool`` (NumPy booleans accepted), or ``None``.

    Raises
    ------
    TypeError
        ``value`` is anything else (e.g. the string ``"yes"``).
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(
        f"{name}={value!r} must be True (show a progress bar), False (never) or None "
        "(automatic: only on a terminal, for operations that take a while)"
    )


def set_progress(enabled: bool | None) -> None:
    """Turn progress bars on or off for the whole process, or back to the default.

    Parameters
    ----------
    enabled
        ``True`` shows every long operation's bar (even when stderr is not a terminal),
        ``False`` silences them all, ``None`` defers to ``$MIXLE_PROGRESS`` and then to the
        automatic choice. An operation's own ``progress=True``/``False`` still wins.

    Raises
    ------
    TypeError
        ``enabled`` is not ``True``, ``False`` or ``None``.
    """
    global _override
    _override = parse_progress(enabled, "enabled")


def _env_setting() -> bool | None:
    raw = os.environ.get(PROGRESS_ENV)
    if raw is None:
        return None
    key = raw.strip().lower()
    if key not in _ENV_VALUES:
        raise ValueError(
            f"{PROGRESS_ENV}={raw!r} is not a progress setting; use {PROGRESS_ENV}=1 (show "
            f"bars), {PROGRESS_ENV}=0 (never) or leave it unset (automatic)"
        )
    return _ENV_VALUES[key]


def progress_setting(enabled: object = None) -> bool | None:
    """Whether a bar shows: the explicit ``enabled``, else :func:`set_progress`, else the
    environment, else ``None`` (automatic).

    Raises
    ------
    TypeError
        ``enabled`` is not ``True``, ``False`` or ``None``.
    ValueError
        ``$MIXLE_PROGRESS`` holds something other than ``0``, ``1``, ``auto`` or nothing.
    """
    explicit = parse_progress(enabled, "enabled")
    if explicit is not None:
        return explicit
    if _override is not None:
        return _override
    return _env_setting()


class ProgressBar:
    """A progress bar that never fails: tqdm when shown, else a no-op with the same methods.

    Any error raised by the underlying bar (a closed stderr, say) silences the bar instead
    of reaching the operation it reports on. Safe to update from several threads.
    """

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar
        self._lock = threading.Lock()

    @property
    def shown(self) -> bool:
        """Whether a real bar backs this object (it may still wait out its delay)."""
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        """Advance the bar by ``n`` units (a no-op when no bar is shown)."""
        if self._bar is None:
            return
        with self._lock:
            bar = self._bar
            if bar is None:  # closed by another thread meanwhile
                return
            try:
                bar.update(n)
            except Exception:
                self._drop()

    def close(self) -> None:
        """Finish the bar (its last line stays on stderr); idempotent."""
        if self._bar is None:
            return
        with self._lock:
            with contextlib.suppress(Exception):
                self._bar.close()
            self._bar = None

    def _drop(self) -> None:
        bar, self._bar = self._bar, None
        with contextlib.suppress(Exception):
            bar.disable = True
            bar.close()


def in_worker_process() -> bool:
    """Whether this process was started by :mod:`multiprocessing` (fork, spawn, forkserver)."""
    return multiprocessing.parent_process() is not None


def _make_bar(total: int | None, desc: str, unit: str, setting: bool | None) -> ProgressBar:
    if setting is False or in_worker_process():
        return ProgressBar()
    try:
        tqdm = require("tqdm", "progress", feature="progress bars").tqdm
    except ImportError:
        return ProgressBar()
    options: dict[str, Any] = {
        "total": total,
        "desc": desc,
        "unit": unit,
        "file": sys.stderr,
        "leave": True,
        "dynamic_ncols": True,
    }
    if unit == "B":
        options.update(unit_scale=True, unit_divisor=1024)
    if setting is None:  # automatic: terminals only, and only once the delay has passed
        options.update(disable=None, delay=PROGRESS_DELAY_S)
    else:
        options.update(disable=False, delay=0)
    try:
        return ProgressBar(tqdm(**options))
    except Exception:
        return ProgressBar()


@contextlib.contextmanager
def progress_bar(
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool | None = None,
) -> Iterator[ProgressBar]:
    """A progress bar on stderr for a long operation, closed when the block ends.

    Parameters
    ----------
    total
        Units the operation will do, or ``None`` when unknown.
    desc
        What the operation is (``"writing volume"``), shown before the bar.
    unit
        The unit counted (``"slab"``, ``"shard"``); ``"B"`` shows bytes as KiB/MiB/GiB.
    enabled
        ``True``: always show (even when stderr is not a terminal); ``False``: never;
        ``None``: :func:`set_progress`, then ``$MIXLE_PROGRESS``, then automatic (only on
        a terminal, after :data:`PROGRESS_DELAY_S` seconds). In a multiprocessing worker
        no bar is ever shown.

    Yields
    ------
    ProgressBar
        Call ``bar.update(k)`` after each ``k`` units. Without tqdm, or when the bar is
        not shown, it does nothing.

    Raises
    ------
    TypeError
        ``enabled`` is not ``True``, ``False`` or ``None``.
    ValueError
        ``$MIXLE_PROGRESS`` holds an unknown value.
    """
    bar = _make_bar(total, desc, unit, progress_setting(enabled))
    try:
        yield bar
    finally:
        bar.close()
