"""Test helpers users can run against their own data: a source conformance suite, a
check that files on disk were left byte-identical, and HTTP and S3 servers on 127.0.0.1
(:mod:`mixle.testing_servers`) that count requests and fail on purpose.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.protocols import SupportsArrayRead, SupportsBatchRead, SupportsRecords
from mixle.data.sources.records.base import RecordSource
from mixle.errors import SourceClosedError

__all__ = ["assert_unchanged", "check_array_source", "check_record_source", "snapshot_tree"]

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
        keys.append([n - 1, 0, n // 2, 0])
        if len(shape) > 1:  # an index on axis 0 and a slice on the last: two axes
            keys.append((np.array([-1, 0]), Ellipsis, slice(None, None, -1)))
    keys += [[], np.arange(n) % 3 == 1]  # no rows; a boolean mask on axis 0
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
            ([n - 1, 0], *(s - 1 for s in shape[1:])),
        ]
    return keys


def check_array_source(
    source: ArraySource, expected: np.ndarray, *, max_pickle_bytes: int = MAX_PICKLE_BYTES
) -> None:
    """Check the source contract of ``source`` against the NumPy array ``expected``.

    Covers metadata, indexing with NumPy semantics (an integer array and a boolean mask on
    axis 0 included), box and batch reads, records, ``element_spec``, pickling by
    reference (small, lazy, rereads equal), the context manager and errors after close.
    Closes ``source`` at the end.
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

    _check_close(source, lambda: source.shape)


def _check_close(source: Any, metadata: Callable[[], object]) -> None:
    """``with`` closes ``source``, ``close()`` is idempotent, and reading, ``metadata()``
    and pickling then raise :class:`SourceClosedError`."""
    with source as entered:
        assert entered is source
    assert source.closed
    source.close()  # idempotent
    for action in (lambda: source[0], metadata, lambda: pickle.dumps(source)):
        try:
            action()
        except SourceClosedError:
            continue
        raise AssertionError(f"{source!r} did not raise SourceClosedError after close()")


def _assert_column_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype == object:
        assert got.tolist() == want.tolist(), what
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_record_source(
    source: RecordSource,
    expected: dict[str, np.ndarray],
    *,
    max_pickle_bytes: int = MAX_PICKLE_BYTES,
) -> None:
    """Check the record-source contract of ``source`` against NumPy columns ``expected``.

    Covers columns and ``element_spec``, ``len``, records by positive and negative index,
    slices, batch reads in any order with repeats (equal to per-record reads), streaming
    with ``records()`` and ``iter_batches()``, pickling (small unless ``max_pickle_bytes``
    says otherwise, lazy, rereads equal), the context manager and errors after close.
    Closes ``source`` at the end.
    """
    assert isinstance(source, RecordSource), type(source)
    for protocol in (SupportsRecords, SupportsBatchRead):
        assert isinstance(source, protocol), protocol.__name__
    names = list(expected)
    assert list(source.columns) == names, (source.columns, names)
    n = len(next(iter(expected.values()))) if expected else 0
    assert len(source) == n
    spec = source.element_spec()
    for name, column in expected.items():
        assert spec[name].shape == column.shape[1:] and spec[name].dtype == column.dtype, name
    assert type(source).__name__ in repr(source)

    if n:
        idx = np.array([n - 1, 0, n // 2, 0, -1], dtype=np.int64)
        batch = source.get_batch(idx)
        for name in names:
            _assert_column_equal(batch[name], expected[name][idx], f"get_batch[{name!r}]")
        for i in (0, n - 1, -1, n // 2):
            record = source[i]
            assert list(record) == names
            for name in names:
                got, want = np.asarray(record[name]), np.asarray(expected[name][i])
                if want.dtype == object:
                    assert got.tolist() == want.tolist(), (i, name)
                else:
                    np.testing.assert_array_equal(got, want, err_msg=f"[{i}][{name!r}]")
        part = source[1::2]
        for name in names:
            _assert_column_equal(part[name], expected[name][1::2], f"[1::2][{name!r}]")
    empty = source.get_batch([])
    for name in names:
        assert empty[name].shape == (0, *expected[name].shape[1:]), name
    streamed = list(source.records())
    assert len(streamed) == n
    blocks = list(source.iter_batches(max(1, n // 3)))
    for name in names:
        if blocks:
            whole = np.concatenate([b[name] for b in blocks])
            _assert_column_equal(whole, expected[name], f"iter_batches[{name!r}]")

    blob = pickle.dumps(source)
    assert len(blob) <= max_pickle_bytes, f"pickle of {source!r} is {len(blob)} bytes"
    clone = pickle.loads(blob)
    assert "not opened yet" in repr(clone), repr(clone)
    if n:
        again = clone.get_batch(np.arange(n))
        for name in names:
            _assert_column_equal(again[name], expected[name], f"unpickled[{name!r}]")
    clone.close()

    _check_close(source, lambda: source.columns)
