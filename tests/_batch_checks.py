"""Batch comparison shared by the worker tests: same structure, leaf types and values."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same(got: Any, want: Any, where: str = "batch") -> None:
    """Same structure, leaf types, dtypes, shapes and values; a memmap leaf may come back
    as a plain array (workers hand back plain arrays)."""
    if type(want) is np.memmap:
        assert type(got) in (np.ndarray, np.memmap), f"{where}: {type(got).__name__}"
    else:
        assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, tuple) and hasattr(want, "_fields"):
        assert got._fields == want._fields, where
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: {len(got)} != {len(want)} items"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, np.ma.MaskedArray):
        np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want), where)
        np.testing.assert_array_equal(got.data, want.data, where)
        assert got.dtype == want.dtype, where
    elif isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert np.shape(got) == np.shape(want), f"{where}: shape"
        if want.dtype.hasobject and np.ndim(want):  # ragged: arrays inside objects
            for g, w in zip(np.ravel(got), np.ravel(want)):
                np.testing.assert_array_equal(g, w, err_msg=where)
        else:
            np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        assert got == want, where
