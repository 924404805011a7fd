"""Test helpers users can run against their own data: a source conformance suite and a
check that files on disk were left byte-identical.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mixle.data.sources.base import ArraySource
from mixle.data.sources.protocols import SupportsArrayRead, SupportsBatchRead, SupportsRecords
from mixle.errors import SourceClosedError

__all__ = ["assert_unchanged", "check_array_source", "snapshot_tree"]

#: Pickles of sources must stay below this many bytes whatever the data size.
MAX_PICKLE_BYTES = 2048


def snapshot_tree(*paths: str | os.PathLike[str]) -> dict[str, str]:
    """Map every file below ``paths`` (or the files themselves) to its SHA-256."""
    digests: dict[str, str] = {}
    for root in map(Path, paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def _diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    changes = [f"created {p}" for p in sorted(after.keys() - before.keys())]
    changes += [f"deleted {p}" for p in sorted(before.keys() - after.keys())]
    changes += [f"modified {p}" for p in sorted(before) if p in after and before[p] != after[p]]
    return changes


@contextmanager
def assert_unchanged(*paths: str | os.PathLike[str]) -> Iterator[None]:
    """Fail if any file below ``paths`` is created, deleted or modified inside the block."""
    before = snapshot_tree(*paths)
    yield
    changes = _diff(before, snapshot_tree(*paths))
    if changes:
        raise AssertionError("files changed on disk: " + "; ".join(changes))


def _sample_keys(shape: tuple[int, ...]) -> list[Any]:
    keys: list[Any] = [(), Ellipsis]
    if not shape:
        return keys
    n = shape[0]
    if n:
        keys += [0, -1, n // 2, (-1, Ellipsis)]
    keys += [
        slice(None),
        slice(None, None, -1),
        slice(1, None, 2),
        slice(-3, None),
        slice(n, n + 5),
        (Ellipsis, slice(None, None, -2)),
    ]
    if len(shape) > 1 and all(shape):
        keys += [
            tuple(s // 2 for s in shape),
            tuple(-1 for _ in shape),
            (slice(None, None, 3), *(s - 1 for s in shape[1:])),
            tuple(slice(s // 3, None, -1) for s in shape),
        ]
    return keys


def check_array_source(
    source: ArraySource, expected: np.ndarray, *, max_pickle_bytes: int = MAX_PICKLE_BYTES
) -> None:
    """Check the source contract of ``source`` against the NumPy array ``expected``.

    Covers metadata, indexing with NumPy semantics, box and batch reads, records,
    ``element_spec``, pickling by reference (small, lazy, rereads equal), the context
    manager and errors after close. Closes ``source`` at the end.
    """
    assert isinstance(source, ArraySource), type(source)
    for protocol in (SupportsRecords, SupportsBatchRead, SupportsArrayRead):
        assert isinstance(source, protocol), protocol.__name__
    assert source.shape == expected.shape, (source.shape, expected.shape)
    assert source.dtype == expected.dtype, (source.dtype, expected.dtype)
    assert source.ndim == expected.ndim
    assert source.nbytes == expected.nbytes
    assert tuple(source.array.shape) == expected.shape
    assert type(source).__name__ in repr(source)

    for key in _sample_keys(expected.shape):
        got, want = source[key], expected[key]
        assert np.shape(got) == np.shape(want), (key, np.shape(got), np.shape(want))
        np.testing.assert_array_equal(got, want, err_msg=f"key={key!r}")
        if isinstance(got, np.ndarray):
            assert type(got) is np.ndarray, type(got)
            assert not np.shares_memory(got, expected)

    if expected.ndim:
        n = len(expected)
        assert len(source) == n
        spec = source.element_spec()
        assert spec.shape == expected.shape[1:] and spec.dtype == expected.dtype
        if n:
            idx = np.array([n - 1, 0, n // 2, 0, -1], dtype=np.int64)
            np.testing.assert_array_equal(source.get_batch(idx), expected[idx])
            start = tuple(s // 4 for s in expected.shape)
            size = tuple(max(1, s // 2) if s else 0 for s in expected.shape)
            box = tuple(slice(a, a + b) for a, b in zip(start, size))
            np.testing.assert_array_equal(source.read_box(start, size), expected[box])
            starts = [
                start,
                (0,) * expected.ndim,
                tuple(s - b for s, b in zip(expected.shape, size)),
            ]
            boxes = source.read_boxes(starts, size)
            assert boxes.shape == (3, *size) and boxes.dtype == expected.dtype
            for got_box, corner in zip(boxes, starts):
                want = expected[tuple(slice(a, a + b) for a, b in zip(corner, size))]
                np.testing.assert_array_equal(got_box, want)
        assert source.get_batch([]).shape == (0, *expected.shape[1:])
        rows = list(source.records())
        assert len(rows) == n
        for got_row, want_row in zip(rows, expected):
            np.testing.assert_array_equal(got_row, want_row)

    blob = pickle.dumps(source)
    assert len(blob) <= max_pickle_bytes, f"pickle of {source!r} is {len(blob)} bytes"
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone), repr(clone)
    assert clone.shape == expected.shape
    np.testing.assert_array_equal(clone[...], expected)
    clone.close()

    with source as entered:
        assert entered is source
    assert source.closed
    source.close()  # idempotent
    for action in (lambda: source[0], lambda: source.shape, lambda: pickle.dumps(source)):
        try:
            action()
        except SourceClosedError:
            continue
        raise AssertionError(f"{source!r} did not raise SourceClosedError after close()")
