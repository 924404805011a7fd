"""Stores written once per module for the remote-read tests, and tiny retry delays."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

SHAPE = (24, 24, 20)
PATCH = (7, 9, 6)


def volume(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_normal(SHAPE) * 100).astype("float32")


def write_stores(root: Path) -> dict[str, np.ndarray]:
    """Plain and sharded zarr (v2, v3), sparse arrays, HDF5; returns name -> contents."""
    data = volume()
    sparse = np.full(SHAPE, 7, dtype="float32")
    sparse[:8, :8, :10] = data[:8, :8, :10]
    truth: dict[str, np.ndarray] = {}

    def make(name: str, values: np.ndarray, **kwargs: object) -> None:
        arr = zarr.create_array(
            str(root / name), shape=SHAPE, dtype="float32", overwrite=True, **kwargs
        )
        arr[: values.shape[0]] = values
        truth[name] = values

    make("v2.zarr", data, chunks=(8, 8, 10), zarr_format=2, compressors=numcodecs.Zlib())
    make("v3.zarr", data, chunks=(8, 8, 10), compressors=ZstdCodec(level=1))
    make("crc.zarr", data, chunks=(8, 8, 10), compressors=[ZstdCodec(), Crc32cCodec()])
    make("sharded.zarr", data, chunks=(4, 4, 5), shards=(12, 12, 10), compressors=BloscCodec())
    make(
        "sharded_start.zarr",
        data,
        chunks=(4, 4, 5),
        shards={"shape": (12, 12, 10), "index_location": "start"},
        compressors=ZstdCodec(),
    )
    make("sparse.zarr", sparse, chunks=(8, 8, 10), fill_value=7, compressors=ZstdCodec())
    make(
        "sparse_sharded.zarr",
        sparse,
        chunks=(4, 4, 5),
        shards=(12, 12, 10),
        fill_value=7,
        compressors=ZstdCodec(),
    )
    with h5py.File(root / "v.h5", "w") as f:
        f.create_dataset("gzip", data=data, chunks=(8, 8, 10), compression="gzip", shuffle=True)
        f.create_dataset("lzf", data=data, chunks=(8, 8, 10), compression="lzf")
        f.create_dataset("contiguous", data=data)
    truth["v.h5/gzip"] = truth["v.h5/lzf"] = truth["v.h5/contiguous"] = data
    return truth


def boxes(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, d - p + 1, size=count) for d, p in zip(SHAPE, PATCH)], 1)


def expected_boxes(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.stack(
        [values[tuple(slice(a, a + p) for a, p in zip(row, PATCH))] for row in starts.tolist()]
    )


@dataclass(frozen=True)
class ReadPaths:
    """The read paths remote tests compare with the writer: ``src[...]``, ``read_boxes`` of
    ``patch`` at ``starts`` and ``get_batch(rows)``."""

    starts: np.ndarray
    patch: tuple[int, ...]
    rows: list[int]

    def reads(self) -> dict[str, Callable[[Any], np.ndarray]]:
        """``name -> read`` of each path."""
        return {
            "getitem": lambda src: src[...],
            "read_boxes": lambda src: src.read_boxes(self.starts, self.patch),
            "get_batch": lambda src: src.get_batch(self.rows),
        }

    def expected(self, values: np.ndarray, read: str) -> np.ndarray:
        """What path ``read`` gives for the writer's ``values``."""
        if read == "getitem":
            return values
        if read == "get_batch":
            return values[self.rows]
        return np.stack(
            [values[tuple(slice(a, a + p) for a, p in zip(s, self.patch))] for s in self.starts]
        )


@contextmanager
def retries(**policy: Any) -> Iterator[None]:
    """The retry policy ``policy`` (tiny delays, short timeouts) and an empty chunk cache,
    both put back afterwards."""
    from mixle.reading import chunk_cache, set_retry_policy

    old = set_retry_policy(**policy)
    chunk_cache().clear()
    try:
        yield
    finally:
        set_retry_policy(**asdict(old))
        chunk_cache().clear()


def request_methods(faults: Any) -> dict[str, int]:
    """How many requests of each method (``GET``, ``HEAD``...) a ``FaultPlan`` logged."""
    counts: dict[str, int] = {}
    for method, _path, _range in faults.log:
        counts[method] = counts.get(method, 0) + 1
    return counts
