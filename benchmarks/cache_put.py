"""Cost of one ChunkCache.put: page-backed (the default) against page_backed=False.

Prints microseconds per put of a 128 KiB chunk, measured side by side in one run, while
the cache fills (fresh pages) and once it is full (evictions, reused pages), and the ratio.

    python3 benchmarks/cache_put.py [--puts 2000] [--chunk-kib 128]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mixle.reading import ChunkCache


def per_put_us(cache: ChunkCache, chunks: list[np.ndarray], start: int) -> float:
    began = time.perf_counter()
    for k, chunk in enumerate(chunks):
        cache.put(("bench", start + k), chunk)
    return (time.perf_counter() - began) / len(chunks) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--chunk-kib", type=int, default=128)
    args = parser.parse_args()
    size = args.chunk_kib * 1024
    chunks = [np.full(size, k % 251, dtype=np.uint8) for k in range(args.puts)]
    budget = size * args.puts // 4  # fills after a quarter of the puts, then evicts
    print(f"{args.puts} puts of {args.chunk_kib} KiB chunks, budget {budget >> 20} MiB")
    print(f"{'cache':28s} {'filling us/put':>15s} {'full us/put':>12s}")
    results = {}
    for name, backed in (("page_backed=True (default)", True), ("page_backed=False", False)):
        cache = ChunkCache(budget, page_backed=backed)
        quarter = args.puts // 4
        filling = per_put_us(cache, chunks[:quarter], 0)
        full = per_put_us(cache, chunks[quarter:], quarter)
        results[backed] = (filling, full)
        print(f"{name:28s} {filling:15.1f} {full:12.1f}")
    (fill_on, full_on), (fill_off, full_off) = results[True], results[False]
    ratios = f"filling {fill_on / fill_off:.1f}x, full {full_on / full_off:.1f}x"
    print(f"ratio (default / no copy): {ratios}")


if __name__ == "__main__":
    main()
