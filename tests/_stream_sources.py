"""Picklable streams for the stream Loader tests (spawned workers import them from here).

Light imports (NumPy and mixle's spec types), so spawn workers start fast. Record ``i`` of
a :class:`Counting` stream is ``{"x": float32 vector of 4 values i, "i": i}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from mixle.data.spec import ArraySpec

__all__ = ["WIDTH", "BadSpec", "Counting", "counting_factory", "noisy", "record"]

#: Length of each record's ``x`` vector.
WIDTH = 4


def record(i: int) -> dict[str, Any]:
    """Record ``i`` of a :class:`Counting` stream."""
    return {"x": np.full(WIDTH, i, dtype=np.float32), "i": np.int64(i)}


class Counting:
    """A re-iterable stream of ``n`` records (each ``iter()`` starts again) that counts its
    passes and reports an element spec."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.passes = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1
        return (record(i) for i in range(self.n))

    def element_spec(self) -> dict[str, ArraySpec]:
        return {
            "x": ArraySpec((WIDTH,), np.dtype(np.float32)),
            "i": ArraySpec((), np.dtype(np.int64)),
        }


def counting_factory() -> Iterator[dict[str, Any]]:
    """A generator factory: 23 records of :class:`Counting`."""
    return (record(i) for i in range(23))


class BadSpec(Counting):
    """Declares ``x`` as float32 of :data:`WIDTH`, but record ``bad`` and later ones have
    ``x`` of float64."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            rec = record(i)
            if i >= self.bad:
                rec["x"] = rec["x"].astype(np.float64)
            yield rec


def noisy(rec: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A record transform that adds ``rng``'s noise to ``x`` (its draws depend on the key)."""
    return {**rec, "x": rec["x"] + rng.random(WIDTH).astype(np.float32)}
