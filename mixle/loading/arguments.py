"""The Loader's constructor arguments, checked: source, shuffle, counts, callables, threads.

Each check raises the error the :class:`~mixle.loading.loader.Loader` documents, naming the
argument, the value and what would have been accepted. The reader-thread defaults are
named constants here, defined once.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from mixle.data.structure import SampleStructure
from mixle.utils.validation import parse_int

__all__ = [
    "DEFAULT_NUM_THREADS",
    "PREFETCH_PER_THREAD",
    "check_source",
    "parse_callable",
    "parse_count",
    "parse_shuffle_block",
    "parse_threads",
]

#: Reader threads when ``num_threads`` is not given (fewer on machines with fewer cores).
DEFAULT_NUM_THREADS = 4
#: Batches prefetched per reader thread when ``prefetch`` is not given.
PREFETCH_PER_THREAD = 2


def check_source(source: object, shuffle: object) -> None:
    """Check that ``source`` is map-style and may be read in the order ``shuffle`` asks.

    Raises
    ------
    TypeError
        ``source`` has no ``__len__`` or ``__getitem__``, or ``shuffle`` is not a bool.
    ValueError
        ``shuffle=True`` for a source whose ``structure`` forbids reordering.
    """
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        raise TypeError(
            f"source={type(source).__name__} must be map-style: a mixle source or "
            "sampler, or any object with __len__ and __getitem__(int)"
        )
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle={shuffle!r} must be True or False")
    structure = getattr(source, "structure", None)
    if shuffle and isinstance(structure, SampleStructure) and not structure.shuffleable:
        raise ValueError(
            f"shuffle=True, but the source's records are {structure!r} and may not be "
            "reordered; use shuffle=False"
        )


def parse_count(value: object, name: str, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (a ``TypeError`` or ``ValueError`` naming ``name``)."""
    out = parse_int(value, name)
    if out < minimum:
        raise ValueError(f"{name}={out} must be an int >= {minimum}")
    return out


def parse_shuffle_block(shuffle_block: object, source: object) -> int:
    """Records per block an epoch shuffle moves as a unit, an int ``>= 1``.

    ``None`` takes the source's ``shuffle_block`` attribute (a sampler that draws
    consecutive records from one volume has one), or ``1`` when it has none or it is
    ``None``; an int overrides it.

    Raises
    ------
    TypeError
        The value is not an int (a bool, a float, a str...); the message names
        ``shuffle_block`` or, for the default, the source's attribute.
    ValueError
        The value is ``< 1``.
    """
    value, name = shuffle_block, "shuffle_block"
    what = "an int >= 1 (records a shuffle moves as one block) or None (the source's own)"
    fix = ""
    if value is None:
        value = getattr(source, "shuffle_block", None)
        if value is None:
            return 1
        name = f"the source's {type(source).__name__}.shuffle_block"
        what = "an int >= 1 (records a shuffle moves as one block)"
        fix = "; pass Loader(..., shuffle_block=<int>) to override it"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be {what}, not a bool{fix}")
    try:
        block = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) must be {what}{fix}") from None
    if block < 1:
        raise ValueError(f"{name}={block} must be {what}{fix}")
    return block


def parse_callable(fn: object, name: str) -> Callable[..., Any] | None:
    """``fn`` if it is callable or ``None`` (else a ``TypeError`` naming ``name``)."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{name}={fn!r} must be a callable or None")
    return fn  # type: ignore[return-value]


def parse_threads(num_threads: object, prefetch: object) -> tuple[int, int]:
    """``(num_threads, prefetch)`` with their defaults filled in and checked.

    ``num_threads=None`` is ``min(DEFAULT_NUM_THREADS, os.cpu_count())`` (``0`` reads in
    the caller's thread); ``prefetch=None`` is ``PREFETCH_PER_THREAD`` per thread (at
    least one batch).
    """
    if num_threads is None:
        num_threads = min(DEFAULT_NUM_THREADS, os.cpu_count() or 1)
    threads = parse_count(num_threads, "num_threads", 0)
    if prefetch is None:
        prefetch = PREFETCH_PER_THREAD * max(1, threads)
    return threads, parse_count(prefetch, "prefetch", 1)
