"""Writing N5 datasets with tensorstore (the reference writer) and reading them back with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

BLOCKS = (3, 4, 4)


def _spec(path: Path) -> dict[str, Any]:
    return {"driver": "n5", "kvstore": {"driver": "file", "path": str(path)}}


def ts_create(
    path: Path,
    shape: tuple[int, ...],
    blocks: tuple[int, ...],
    dtype: str = "uint16",
    compression: dict[str, Any] | None = None,
) -> Any:
    """A new tensorstore N5 dataset at ``path``."""
    metadata = {
        "dimensions": list(shape),
        "blockSize": list(blocks),
        "dataType": dtype,
        "compression": compression or {"type": "gzip"},
    }
    return ts.open({**_spec(path), "metadata": metadata, "create": True}).result()


def ts_read(path: Path, region: Any = ()) -> np.ndarray:
    """tensorstore's read of ``region`` (default: all) of the dataset at ``path``."""
    return ts.open(_spec(path)).result()[region].read().result()


def values(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Values across the dtype's whole range (random bytes; floats without NaN)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1e3).astype(dt)
    raw = rng.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def write_n5(
    path: Path,
    data: np.ndarray,
    blocks: tuple[int, ...] = BLOCKS,
    compression: dict[str, Any] | None = None,
    dtype: str | None = None,
) -> Path:
    store = ts_create(path, data.shape, blocks, dtype or data.dtype.name, compression)
    store[...] = data
    return path
