"""A small schema a source or sampler is checked against when it opens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

from mixle.errors import SchemaMismatchError

__all__ = ["Schema", "parse_schema"]


@dataclass(frozen=True, init=False)
class Schema:
    """Expected dtype and shape; ``None`` anywhere means "any".

    Parameters
    ----------
    dtype
        The expected dtype, compared with ``==`` after :func:`numpy.dtype`.
    shape
        The expected shape; an axis given as ``None`` matches any length. The rank must match.

    Notes
    -----
    A source checks its schema against the whole array (``source.shape``); a sampler checks
    its schema against one record (the patch shape). A mismatch raises
    :class:`~mixle.errors.SchemaMismatchError` naming both sides.
    """

    dtype: np.dtype | None
    shape: tuple[int | None, ...] | None

    def __init__(
        self, dtype: DTypeLike | None = None, shape: Sequence[int | None] | None = None
    ) -> None:
        object.__setattr__(self, "dtype", None if dtype is None else np.dtype(dtype))
        if shape is not None:
            if isinstance(shape, (int, np.integer)) or not all(
                s is None or (isinstance(s, (int, np.integer)) and s >= 0) for s in shape
            ):
                raise TypeError(f"shape={shape!r} must be a sequence of non-negative ints or None")
            shape = tuple(None if s is None else int(s) for s in shape)
        object.__setattr__(self, "shape", shape)

    def check(self, dtype: DTypeLike, shape: Sequence[int], *, what: str) -> None:
        """Raise :class:`SchemaMismatchError` unless ``dtype`` and ``shape`` match."""
        problems = []
        if self.dtype is not None and np.dtype(dtype) != self.dtype:
            problems.append(f"dtype is {np.dtype(dtype)}, schema expects {self.dtype}")
        if self.shape is not None:
            shape = tuple(shape)
            if len(shape) != len(self.shape) or any(
                e is not None and e != s for e, s in zip(self.shape, shape)
            ):
                problems.append(f"shape is {shape}, schema expects {self.shape}")
        if problems:
            raise SchemaMismatchError(f"{what} does not match its schema: " + "; ".join(problems))


def parse_schema(schema: object) -> Schema | None:
    """Validate a ``schema=`` argument."""
    if schema is not None and not isinstance(schema, Schema):
        raise TypeError(f"schema={schema!r} must be a mixle.data.schema.Schema or None")
    return schema
