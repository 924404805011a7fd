"""``src[key]`` on a local zarr array against zarr's own indexing, side by side in one run.

Run: python3 benchmarks/getitem.py [--edge 256] [--repeats 7]

``src[key]`` reads through mixle's chunk readers and plan executor (the same path as
``read_boxes``: only the chunks holding selected elements, each decoded once, on the decode
threads, straight into the output); ``zarr`` is ``np.asarray(zarr_array[key])`` on the same
array. The chunk cache is cleared before every timed read, so both decode every chunk.
Best of ``--repeats`` interleaved runs; ``ratio`` is zarr's time over mixle's (> 1: mixle
is faster). Every result is checked equal to zarr's before it is timed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

import mixle
from mixle.reading import chunk_cache

LAYOUTS: dict[str, dict[str, Any]] = {
    "v3 zstd, 64^3 chunks": {"chunks": (64, 64, 64), "compressors": ZstdCodec(level=1)},
    "v3 blosc-lz4, 32^3 chunks": {"chunks": (32, 32, 32), "compressors": BloscCodec()},
    "v2 zlib, 64^3 chunks": {
        "chunks": (64, 64, 64),
        "zarr_format": 2,
        "compressors": numcodecs.Zlib(level=1),
    },
    "v3 sharded 128^3 / 32^3": {
        "chunks": (32, 32, 32),
        "shards": (128, 128, 128),
        "compressors": ZstdCodec(level=1),
    },
}


def keys(edge: int) -> dict[str, tuple[Any, ...]]:
    """The keys timed: the whole array, a slab, a plane, a box and a strided plane."""
    q = edge // 4
    return {
        "[...]": (Ellipsis,),
        f"[{q}:{q + 64}]": (slice(q, q + 64),),
        "[:, 7]": (slice(None), 7),
        "3-D box": (slice(q, 3 * q), slice(q, q + 40), slice(3, edge - 3)),
        "[::2, ::3, 5]": (slice(None, None, 2), slice(None, None, 3), 5),
    }


def timed(read: Callable[[], object]) -> float:
    chunk_cache().clear()
    start = time.perf_counter()
    read()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edge", type=int, default=256, help="volume edge (float32 cube)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.edge,) * 3
    data = np.round(rng.standard_normal(shape) * 100).astype("float32")
    print(f"volume {shape} float32; times are the best of {args.repeats}, cache cleared")
    print(f"{'layout':26s} {'key':16s} {'zarr ms':>9s} {'mixle ms':>9s} {'ratio':>7s}")
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, options) in enumerate(LAYOUTS.items()):
            path = Path(tmp) / f"layout{number}.zarr"
            zarr.create_array(str(path), shape=shape, dtype=data.dtype, **options)[...] = data
            with mixle.read_zarr(str(path)) as src:
                z = zarr.open_array(str(path), mode="r")
                for label, key in keys(args.edge).items():
                    np.testing.assert_array_equal(src[key], np.asarray(z[key]))
                    old, new = [], []
                    for _ in range(args.repeats):  # interleaved: load hits both alike
                        old.append(timed(lambda: np.asarray(z[key])))  # noqa: B023
                        new.append(timed(lambda: src[key]))  # noqa: B023
                    o, n = min(old), min(new)
                    print(f"{name:26s} {label:16s} {o * 1e3:9.1f} {n * 1e3:9.1f} {o / n:6.2f}x")


if __name__ == "__main__":
    main()
