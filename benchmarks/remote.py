"""Patch reads from zarr over loopback S3 and HTTP: mixle (obstore, fsspec) vs tensorstore.

Writes a 192x192x96 float32 volume twice (32x32x16 zstd chunks; the same chunks inside
96x96x48 shards), serves both from a moto S3 server and a Range-honouring HTTP server on
127.0.0.1, and reads batches of random 32x32x16 patches, each method without a
decoded-chunk cache:

- mixle obstore: ``read_boxes`` through the read planner, chunks fetched through obstore
  (Rust ``object_store``; ``backend="obstore"``), sharded ranges coalesced;
- mixle fsspec: the same through s3fs/aiohttp (``backend="fsspec"``);
- naive zarr: one ``array[patch]`` slice per patch, as a per-sample Dataset does (S3 only);
- tensorstore: one ``read()`` future per patch, all awaited together (when installed).

Prints patches/s, each mixle row's ratio to tensorstore's (measured in the same run),
requests per batch and the most requests in flight at once (both counted at the server).
By default the servers run in this process, so their Python threads share the GIL with
Python clients but not with obstore's or tensorstore's native ones; ``--server-process``
runs them in a child process, as a real store would be. ``--latency-ms`` holds every
request that long before it is answered (a real object store answers in tens of
milliseconds; loopback in well under one).

    python3 benchmarks/remote.py [--batches 4] [--batch 32] [--server-process] [--latency-ms 0]
        [--stores s3,http]
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
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

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

    root = ""  # the folder a ChildHTTP serves

    def start(self) -> ChildS3:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        args = (child, type(self).__name__, self.root)
        self._child = context.Process(target=_serve_in_child, args=args, daemon=True)
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


class ChildHTTP(ChildS3):
    """A :class:`RangeHTTPServer` of ``root`` in a child process."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    @property
    def url(self) -> str:
        return self._url


def _serve_in_child(pipe: Connection, kind: str, root: str) -> None:
    made = RangeHTTPServer(root) if kind == "ChildHTTP" else MotoS3Server()
    with made as server:
        pipe.send(server.url if isinstance(server, RangeHTTPServer) else server.endpoint_url)
        while (message := pipe.recv()) != "stop":
            if message == "reset":
                server.faults.reset()
                pipe.send(None)
            elif isinstance(message, tuple):  # ("delay", seconds)
                server.faults.delay = message[1]
                pipe.send(None)
            else:
                pipe.send((server.requests, server.faults.peak_inflight))


Server = MotoS3Server | RangeHTTPServer


def counts(server: Server) -> tuple[int, int]:
    """Requests since the last reset, and the most in flight at once."""
    if isinstance(server, ChildS3):
        return server.counts()
    return server.requests, server.faults.peak_inflight


def reset(server: Server) -> None:
    if isinstance(server, ChildS3):
        server.reset()
    else:
        server.faults.reset()


def measure(
    server: Server, run: Callable[[np.ndarray], object], work: list[np.ndarray]
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


def tensorstore_reader(server: Server, url: str) -> Callable[[np.ndarray], object] | None:
    try:
        import tensorstore as ts
    except ImportError:
        return None
    if url.startswith("s3://"):
        bucket, _, path = url.removeprefix("s3://").partition("/")
        kvstore = {
            "driver": "s3",
            "bucket": bucket,
            "path": path + "/",
            "endpoint": getattr(server, "endpoint_url", ""),
            "aws_region": "us-east-1",
            "aws_credentials": {"type": "default"},
        }
    else:
        base, _, path = url.rpartition("/")
        kvstore = {"driver": "http", "base_url": base, "path": path + "/"}
    spec = {
        "driver": "zarr3",
        "kvstore": kvstore,
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


def set_delay(server: Server, seconds: float) -> None:
    if isinstance(server, ChildS3):
        server.set_delay(seconds)
    else:
        server.faults.delay = seconds


def rows_for(
    server: Server, base: str, options: dict[str, object] | None, work: list[np.ndarray]
) -> list[tuple[str, str, float, float, int]]:
    """``(layout, method, patches/s, requests/batch, peak in flight)`` for one store."""
    rows = []
    for layout in ("plain", "sharded"):
        url = f"{base}/{layout}.zarr"
        methods: list[tuple[str, Callable[[np.ndarray], object] | None]] = []
        for backend in ("obstore", "fsspec"):
            src = mixle.read_zarr(url, storage_options=options, backend=backend)

            def batched(starts: np.ndarray, src: mixle.ZarrArraySource = src) -> object:
                chunk_cache().clear()
                return src.read_boxes(starts, PATCH)

            methods.append((f"mixle {backend}", batched))
        if url.startswith("s3://"):
            arr = zarr.open_array(url, mode="r", storage_options=options)

            def naive(starts: np.ndarray, arr: zarr.Array = arr) -> object:
                return np.stack(
                    [arr[tuple(slice(a, a + p) for a, p in zip(r, PATCH))] for r in starts.tolist()]
                )

            methods.append(("naive zarr per patch", naive))
        methods.append(("tensorstore", tensorstore_reader(server, url)))
        for name, run in methods:
            if run is not None:
                rows.append((layout, name, *measure(server, run, work)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--server-process", action="store_true", help="servers in a child process")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="server delay per request")
    parser.add_argument("--stores", default="s3,http", help="comma-separated: s3, http")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"s3", "http"}:
        parser.error(f"--stores={args.stores!r}: give s3, http or both")
    work = corners(args.batches, args.batch)
    table: list[tuple[str, str, str, float, float, int]] = []
    os.environ.setdefault("AWS_ACCESS_KEY_ID", MotoS3Server.KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", MotoS3Server.SECRET)
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        for store in stores:
            server: Server
            if store == "s3":
                server = ChildS3(FaultPlan()) if args.server_process else MotoS3Server()
            else:
                server = ChildHTTP(tmp) if args.server_process else RangeHTTPServer(tmp)
            with server:
                if store == "s3":
                    assert isinstance(server, MotoS3Server)
                    base, options = server.upload(tmp, "bench"), server.storage_options()
                else:
                    base, options = str(server.url), None
                set_delay(server, args.latency_ms / 1000)
                table += [(store, *row) for row in rows_for(server, base, options, work)]
    where = "a child process" if args.server_process else "this process"
    print(f"\n{args.batches} batches of {args.batch} patches {PATCH}, volume {SHAPE} float32,")
    print(f"chunks {CHUNK}, shards {SHARD}; servers on 127.0.0.1 in {where},")
    print(f"{args.latency_ms:g} ms added to every request, cold decoded-chunk cache\n")
    print(
        f"| store | {'layout':<8} | {'method':<20} | {'patches/s':>9} | vs tensorstore "
        "| requests/batch | peak in flight |"
    )
    print(f"|-------|{'-' * 10}|{'-' * 22}|{'-' * 11}|{'-' * 16}|{'-' * 16}|{'-' * 16}|")
    for store, layout, name, rate, requests, peak in table:
        same = (store, layout, "tensorstore")
        reference = [r for s, lay, n, r, _, _ in table if (s, lay, n) == same]
        ratio = f"{rate / reference[0]:.2f}x" if reference and name != "tensorstore" else ""
        print(
            f"| {store:<5} | {layout:<8} | {name:<20} | {rate:>9.1f} | {ratio:>14} "
            f"| {requests:>14.1f} | {peak:>14} |"
        )


if __name__ == "__main__":
    main()
