"""Module-level helpers of the select/map tests: they pickle, so spawned workers can use them."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

import mixle


class CountingSource(mixle.Source):
    """Dict records held in memory, counting the ``get_batch`` calls and the rows read."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns
        self.reads: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def get_batch(self, indices: ArrayLike) -> dict[str, np.ndarray]:
        idx = self._indices(indices)
        self.reads.append(idx.copy())
        return {name: column[idx] for name, column in self.columns.items()}

    def element_spec(self) -> dict[str, mixle.ArraySpec]:
        return {n: mixle.ArraySpec(c.shape[1:], c.dtype) for n, c in self.columns.items()}


class RecordsOnly:
    """A map-style source with ``len`` and ``[i]`` only: no ``get_batch``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"v": self.values[i]}


def scaled(record: dict[str, Any]) -> dict[str, Any]:
    """A record transform without randomness."""
    return {"x": np.asarray(record["x"], np.float32) * 2, "label": record["label"]}


def noisy(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A record transform drawing from its generator."""
    return {
        "x": np.asarray(record["x"], np.float64) + rng.standard_normal(),
        "label": record["label"],
    }


def row_noise(row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An array-record transform drawing from its generator."""
    return row + rng.integers(0, 1000, size=row.shape)


def widen(record: dict[str, Any]) -> dict[str, Any]:
    """A Parquet row ``{"x0", "label"}`` as ``{"x": [x0, x0], "label"}``."""
    return {"x": np.array([record["x0"]] * 2), "label": record["label"]}
