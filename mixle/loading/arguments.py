"""The Loader's constructor arguments, checked: source, shuffle, counts, callables, threads.

Each check raises the error the :class:`~mixle.loading.loader.Loader` documents, naming the
argument, the value and what would have been accepted. The reader-thread defaults are
named constants here, defined once.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from mixle.data.sources.records.hf import read_hf
from mixle.data.structure import SampleStructure
from mixle.utils.optional_deps import imported
from mixle.utils.validation import parse_choice, parse_int, parse_timeout

__all__ = [
    "DEFAULT_NUM_THREADS",
    "PREFETCH_PER_THREAD",
    "PREFETCH_PER_WORKER",
    "START_METHODS",
    "adopt_source",
    "check_source",
    "parse_callable",
    "parse_count",
    "parse_shuffle_block",
    "parse_threads",
    "parse_workers",
]

#: Reader threads when ``num_threads`` is not given (fewer on machines with fewer cores).
DEFAULT_NUM_THREADS = 4
#: Batches prefetched per reader thread when ``prefetch`` is not given.
PREFETCH_PER_THREAD = 2
#: Batches in flight per worker process when ``prefetch`` is not given (or one per reader
#: thread of the worker, when it has more threads).
PREFETCH_PER_WORKER = 2
#: How a Loader may start its worker processes.
START_METHODS = ("spawn", "forkserver", "fork")


#: ``datasets`` classes the Loader reads through :func:`mixle.read_hf`.
_HF_CLASSES = ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")


def _formatted(dataset: Any) -> bool:
    """Whether a ``datasets`` dataset (or any split of a dataset dict) has a format set:
    a type (``with_format("numpy")``), a column selection or ``output_all_columns``."""
    if hasattr(dataset, "values") and not hasattr(dataset, "format"):  # a DatasetDict
        return any(_formatted(split) for split in dataset.values())
    fmt = getattr(dataset, "format", None)
    if isinstance(fmt, dict):
        columns = fmt.get("columns")
        return (
            fmt.get("type") is not None
            or bool(fmt.get("output_all_columns"))
            or (columns is not None and list(columns) != list(dataset.column_names))
        )
    return getattr(dataset, "_formatting", None) is not None


def adopt_source(source: Any) -> Any:
    """``source``, or :func:`mixle.read_hf` of it for a Hugging Face ``datasets`` dataset.

    A ``datasets.Dataset`` read record by record gives Python lists and strings per row
    (fixed-width strings whose width changes from batch to batch, lists taken as
    structure); through ``read_hf`` it reads a batch at a time from Arrow, with the column
    rules of the other record sources. A dataset with a format set (``with_format(...)``)
    is the user's choice of row type and is read as it is. ``datasets`` is never imported
    here: only an object of an already imported ``datasets`` is recognised.
    """
    datasets = imported("datasets")
    if datasets is None:
        return source
    classes = [getattr(datasets, name, None) for name in _HF_CLASSES]
    splits = tuple(c for c in classes[2:] if isinstance(c, type))
    if _formatted(source) and not isinstance(source, splits):
        return source
    if isinstance(source, splits):
        if len(source) != 1 or _formatted(source):
            raise ValueError(
                f"source is a {type(source).__name__} of the splits "
                f"{', '.join(map(repr, source))}; pick one, e.g. Loader(dataset['train'], "
                "...) or Loader(mixle.read_hf(dataset, split='train'), ...)"
            )
        return read_hf(source)
    if isinstance(source, tuple(c for c in classes[:2] if isinstance(c, type))):
        return read_hf(source)
    return source


def check_source(source: object, shuffle: object) -> None:
    """Check that ``source`` is map-style and may be read in the order ``shuffle`` asks.

    Raises
    ------
    TypeError
        ``source`` has no ``__len__`` or ``__getitem__``, is a path (``str``, ``bytes``,
        ``os.PathLike``), or ``shuffle`` is not a bool.
    ValueError
        ``shuffle=True`` for a source whose ``structure`` forbids reordering.
    """
    if isinstance(source, (str, bytes, os.PathLike)):
        raise TypeError(
            f"source={source!r} is a path, not a source: open it first, e.g. "
            "mixle.read_zarr(path), mixle.read_npy(path) or mixle.read_parquet(path)"
        )
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


def parse_threads(num_threads: object, prefetch: object, num_workers: int = 0) -> tuple[int, int]:
    """``(num_threads, prefetch)`` with their defaults filled in and checked.

    ``num_threads=None`` is ``min(DEFAULT_NUM_THREADS, os.cpu_count())`` (``0`` reads in
    the caller's thread, or a worker's receiving thread); ``prefetch=None`` is
    ``PREFETCH_PER_THREAD`` per thread (at least one batch), or with worker processes
    ``max(PREFETCH_PER_WORKER, num_threads)`` per worker.
    """
    if num_threads is None:
        num_threads = min(DEFAULT_NUM_THREADS, os.cpu_count() or 1)
    threads = parse_count(num_threads, "num_threads", 0)
    if prefetch is None:
        workers = max(PREFETCH_PER_WORKER, threads)
        prefetch = workers if num_workers else PREFETCH_PER_THREAD * max(1, threads)
    return threads, parse_count(prefetch, "prefetch", 1)


def parse_workers(
    num_workers: object, start_method: object, timeout: object
) -> tuple[int, str, float | None]:
    """``(num_workers, worker_start_method, timeout)`` checked.

    Raises
    ------
    TypeError
        A value of the wrong type.
    ValueError
        ``num_workers < 0``; a start method that is not one of :data:`START_METHODS` or
        not available on this system; a ``timeout`` that is not a positive number of
        seconds, or given without worker processes (it bounds a worker's batch); worker
        processes on a system that cannot pass file descriptors between processes.
    """
    workers = parse_count(num_workers, "num_workers", 0)
    method = parse_choice(start_method, "worker_start_method", START_METHODS)
    available = multiprocessing.get_all_start_methods()
    if method not in available:
        raise ValueError(
            f"worker_start_method={method!r} is not available on this system; use one of "
            f"{', '.join(map(repr, available))}"
        )
    limit = parse_timeout(timeout)
    if limit is not None and not workers:
        raise ValueError(
            f"timeout={timeout!r} bounds how long a worker process may take per batch, but "
            "num_workers=0 reads in threads; pass num_workers >= 1 or leave timeout=None"
        )
    if workers and os.name != "posix":
        raise ValueError(
            f"num_workers={workers} needs a POSIX system (worker processes hand batches back "
            "through shared memory passed as file descriptors); use num_workers=0"
        )
    return workers, method, limit
