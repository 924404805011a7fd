"""Whether an object pickles, and how big, without keeping the pickle: O(1) memory.

Both process pools ask before they start workers: the Loader's (``num_workers``) to name an
argument that cannot travel, ``MPEncodedData`` to pick who reads (``read_in="auto"``).
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["pickled_size", "pickling_error"]


class _TooBig(Exception):
    pass


class _SizeSink:
    """A file that only counts what is written (and stops past ``limit`` bytes)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.size = 0

    def write(self, chunk: Any) -> int:
        n = memoryview(chunk).nbytes  # protocol 5 hands big buffers as PickleBuffer (no len)
        self.size += n
        if self.limit is not None and self.size > self.limit:
            raise _TooBig
        return n


def pickling_error(obj: Any) -> Exception | None:
    """The exception pickling ``obj`` raises, or ``None`` when it pickles."""
    try:
        pickle.Pickler(_SizeSink(None), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as exc:
        return exc
    return None


def pickled_size(obj: Any, limit: int) -> int | None:
    """Size of ``obj`` pickled, or ``None`` when it cannot be pickled or exceeds ``limit``.

    Stops pickling as soon as ``limit`` is passed, so asking about a big object is cheap.
    """
    sink = _SizeSink(limit)
    try:
        pickle.Pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:  # too big, or any failure: it cannot travel by reference
        return None
    return sink.size
