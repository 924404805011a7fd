"""Patch reads from zarr over a loopback S3 server (moto): mixle vs naive zarr vs tensorstore.

Writes a 192x192x96 float32 volume twice (32x32x16 zstd chunks; the same chunks inside
96x96x48 shards), uploads both to a moto S3 server on 127.0.0.1 and reads batches of
random 32x32x16 patches, each method without a decoded-chunk cache:

- mixle batched: ``read_boxes`` through the read planner (one concurrent fetch per batch,
  sharded ranges coalesced);
- naive zarr: one ``array[patch]`` slice per patch, as a per-sample Dataset does;
- tensorstore: one ``read()`` future per patch, all awaited together (when installed).

Prints patches/s, S3 requests per batch and the most requests in flight at once (both
counted at the server). By default the server runs in this process, so its Python threads
share the GIL with Python clients (mixle's aiobotocore, zarr) but not with tensorstore's
C++ client; ``--server-process`` runs it in a child process, as a real store would be.
``--latency-ms`` holds every request that long before it is answered (a real object store
answers in tens of milliseconds; loopback in well under one).

    python3 benchmarks/remote.py [--batches 4] [--batch 32] [--server-process] [--latency-ms 0]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import mixle
from mixle.reading import chunk_cache
from mixle.testing_servers import FaultPlan, MotoS3Server

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


class ChildS3(MotoS3Server):
    """A :class:`MotoS3Server` in a child process (its GIL is not the client's)."""

    def start(self) -> ChildS3:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._child = context.Process(target=_serve_in_child, args=(child,), daemon=True)
        self._child.start()
        self._url: str = self._pipe.recv()
        return self

    def stop(self) -> None:
        self._pipe.send("stop")
        self._child.join()

    @property
    def endpoint_url(self) -> str:
        return self._url

    def counts(self) -> tuple[int, int]:
        self._pipe.send("counts")
        requests, peak = self._pipe.recv()
        return int(requests), int(peak)

    def reset(self) -> None:
        self._pipe.send("reset")
        self._pipe.recv()

    def set_delay(self, seconds: float) -> None:
        self._pipe.send(("delay", seconds))
        self._pipe.recv()


def _serve_in_child(pipe: Connection) -> None:
    with MotoS3Server() as server:
        pipe.send(server.endpoint_url)
        while (message := pipe.recv()) != "stop":
            if message == "reset":
                server.faults.reset()
                pipe.send(None)
            elif isinstance(message, tuple):  # ("delay", seconds)
                server.faults.delay = message[1]
                pipe.send(None)
            else:
                pipe.send((server.requests, server.faults.peak_inflight))


def counts(server: MotoS3Server) -> tuple[int, int]:
    """Requests since the last reset, and the most in flight at once."""
    if isinstance(server, ChildS3):
        return server.counts()
    return server.requests, server.faults.peak_inflight


def reset(server: MotoS3Server) -> None:
    if isinstance(server, ChildS3):
        server.reset()
    else:
        server.faults.reset()


def measure(
    server: MotoS3Server, run: Callable[[np.ndarray], object], work: list[np.ndarray]
) -> tuple[float, float, int]:
    run(work[0][:1])  # open/warm metadata outside the timing
    reset(server)
    start = time.perf_counter()
    for starts in work:
        run(starts)
    elapsed = time.perf_counter() - start
    patches = sum(len(s) for s in work)
    requests, peak = counts(server)
    return patches / elapsed, requests / len(work), peak


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
    parser.add_argument("--server-process", action="store_true", help="moto in a child process")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="server delay per request")
    args = parser.parse_args()
    work = corners(args.batches, args.batch)
    rows: list[tuple[str, str, float, float, int]] = []
    server_type = ChildS3 if args.server_process else MotoS3Server
    os.environ.setdefault("AWS_ACCESS_KEY_ID", MotoS3Server.KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", MotoS3Server.SECRET)
    with tempfile.TemporaryDirectory() as tmp, server_type(FaultPlan()) as server:
        write(Path(tmp))
        base = server.upload(tmp, "bench")
        if isinstance(server, ChildS3):
            server.set_delay(args.latency_ms / 1000)
        else:
            server.faults.delay = args.latency_ms / 1000
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
                rows.append((layout, name, *measure(server, run, work)))
    where = "a child process" if args.server_process else "this process"
    print(f"\n{args.batches} batches of {args.batch} patches {PATCH}, volume {SHAPE} float32,")
    print(f"chunks {CHUNK}, shards {SHARD}; moto S3 on 127.0.0.1 in {where},")
    print(f"{args.latency_ms:g} ms added to every request,")
    print("cold decoded-chunk cache\n")
    head = f"| {'layout':<8} | {'method':<22} | {'patches/s':>10} | {'requests/batch':>14} |"
    print(f"{head} peak in flight |")
    print(f"|{'-' * 10}|{'-' * 24}|{'-' * 12}|{'-' * 16}|{'-' * 16}|")
    for layout, name, rate, requests, peak in rows:
        print(f"| {layout:<8} | {name:<22} | {rate:>10.1f} | {requests:>14.1f} | {peak:>14} |")


if __name__ == "__main__":
    main()
