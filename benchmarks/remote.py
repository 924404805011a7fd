"""Patch reads from zarr over a loopback S3 server (moto): mixle vs naive zarr vs tensorstore.

Writes a 192x192x96 float32 volume twice (32x32x16 zstd chunks; the same chunks inside
96x96x48 shards), uploads both to a moto S3 server on 127.0.0.1 and reads batches of
random 32x32x16 patches, each method without a decoded-chunk cache:

- mixle batched: ``read_boxes`` through the read planner (one concurrent fetch per batch,
  sharded ranges coalesced);
- naive zarr: one ``array[patch]`` slice per patch, as a per-sample Dataset does;
- tensorstore: one ``read()`` future per patch, all awaited together (when installed).

Prints patches/s and S3 requests per batch (counted at the server).

    python3 benchmarks/remote.py [--batches 4] [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import mixle
from mixle.reading import chunk_cache
from mixle.testing_servers import MotoS3Server

SHAPE = (192, 192, 96)
CHUNK = (32, 32, 16)
SHARD = (96, 96, 48)
PATCH = (32, 32, 16)


def write(root: Path) -> None:
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(SHAPE) * 100).astype("float32").round()
    zarr.create_array(
        str(root / "plain.zarr"), shape=SHAPE, chunks=CHUNK, dtype="float32",
        compressors=ZstdCodec(level=1),
    )[:] = data  # fmt: skip
    zarr.create_array(
        str(root / "sharded.zarr"), shape=SHAPE, chunks=CHUNK, shards=SHARD, dtype="float32",
        compressors=ZstdCodec(level=1),
    )[:] = data  # fmt: skip


def corners(batches: int, batch: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    high = [d - p + 1 for d, p in zip(SHAPE, PATCH)]
    return [np.stack([rng.integers(0, h, batch) for h in high], 1) for _ in range(batches)]


def measure(
    server: MotoS3Server, run: Callable[[np.ndarray], object], work: list[np.ndarray]
) -> tuple[float, float]:
    run(work[0][:1])  # open/warm metadata outside the timing
    server.faults.reset()
    start = time.perf_counter()
    for starts in work:
        run(starts)
    elapsed = time.perf_counter() - start
    patches = sum(len(s) for s in work)
    return patches / elapsed, server.requests / len(work)


def tensorstore_reader(server: MotoS3Server, url: str) -> Callable[[np.ndarray], object] | None:
    try:
        import tensorstore as ts
    except ImportError:
        return None
    bucket, _, path = url.removeprefix("s3://").partition("/")
    spec = {
        "driver": "zarr3",
        "kvstore": {
            "driver": "s3",
            "bucket": bucket,
            "path": path + "/",
            "endpoint": server.endpoint_url,
            "aws_region": "us-east-1",
            "aws_credentials": {"type": "default"},
        },
        "context": {"cache_pool": {"total_bytes_limit": 0}},
    }
    try:
        store = ts.open(spec, read=True).result()
    except Exception as exc:  # credentials or driver missing in this build
        print(f"tensorstore: could not open ({type(exc).__name__}); row skipped")
        return None

    def run(starts: np.ndarray) -> object:
        futures = [
            store[tuple(slice(a, a + p) for a, p in zip(row, PATCH))].read()
            for row in starts.tolist()
        ]
        return [f.result() for f in futures]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    work = corners(args.batches, args.batch)
    rows: list[tuple[str, str, float, float]] = []
    os.environ.setdefault("AWS_ACCESS_KEY_ID", MotoS3Server.KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", MotoS3Server.SECRET)
    with tempfile.TemporaryDirectory() as tmp, MotoS3Server() as server:
        write(Path(tmp))
        base = server.upload(tmp, "bench")
        opts = server.storage_options()
        for layout in ("plain", "sharded"):
            url = f"{base}/{layout}.zarr"
            src = mixle.read_zarr(url, storage_options=opts)
            arr = zarr.open_array(url, mode="r", storage_options=opts)

            def batched(starts: np.ndarray, src: mixle.ZarrArraySource = src) -> object:
                chunk_cache().clear()
                return src.read_boxes(starts, PATCH)

            def naive(starts: np.ndarray, arr: zarr.Array = arr) -> object:
                return np.stack(
                    [arr[tuple(slice(a, a + p) for a, p in zip(r, PATCH))] for r in starts.tolist()]
                )

            methods: list[tuple[str, Callable[[np.ndarray], object] | None]] = [
                ("mixle batched", batched),
                ("naive zarr per patch", naive),
                ("tensorstore", tensorstore_reader(server, url)),
            ]
            for name, run in methods:
                if run is None:
                    continue
                rate, requests = measure(server, run, work)
                rows.append((layout, name, rate, requests))
    print(f"\n{args.batches} batches of {args.batch} patches {PATCH}, volume {SHAPE} float32,")
    print(f"chunks {CHUNK}, shards {SHARD}; moto S3 on 127.0.0.1, cold decoded-chunk cache\n")
    print(f"| {'layout':<8} | {'method':<22} | {'patches/s':>10} | {'requests/batch':>14} |")
    print(f"|{'-' * 10}|{'-' * 24}|{'-' * 12}|{'-' * 16}|")
    for layout, name, rate, requests in rows:
        print(f"| {layout:<8} | {name:<22} | {rate:>10.1f} | {requests:>14.1f} |")


if __name__ == "__main__":
    main()
