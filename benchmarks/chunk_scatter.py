"""Whole kept chunks copied into a batch: chunk pages starting half a page in, or on a page.

A batch array's data starts a few bytes past a page boundary (the allocator's header). A
chunk whose data starts on a page boundary is copied into it at (nearly) the same offset
within a page, and such copies stall on the CPU's load/store address checks (4K aliasing).
The cache therefore starts each chunk ``PAGE_OFFSET`` bytes into its pages. This prints,
measured side by side in interleaved rounds:

- scatter: microseconds per 32^3 float32 chunk (128 KiB) copied whole into a batch array
  from the cache's own kept chunks, with ``PAGE_OFFSET`` as shipped and set to 0;
- read_boxes: chunk-aligned 32^3 boxes of a zstd zarr array read with the cache on (each
  chunk decoded into the cache's pages, then scattered), both ways.

    python3 benchmarks/chunk_scatter.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import mixle
import mixle.reading.cache as cache_module
from mixle.reading import ChunkCache, chunk_cache, set_chunk_cache_bytes, set_decode_threads

EDGE = 32  # a chunk and a box: 32^3 float32 = 128 KiB
COUNT = 512


def scatter_us(offset: int) -> float:
    """Microseconds per chunk copied whole from kept chunks at ``offset`` into a batch."""
    shipped = cache_module.PAGE_OFFSET
    cache_module.PAGE_OFFSET = offset
    try:
        cache = ChunkCache((COUNT + 1) * EDGE**3 * 4)
        kept = [cache.put(k, np.full((EDGE,) * 3, k, dtype="f4")) for k in range(COUNT)]
    finally:
        cache_module.PAGE_OFFSET = shipped
    assert all(c.ctypes.data % 4096 == offset for c in kept)
    out = np.empty((COUNT, *(EDGE,) * 3), dtype="f4")
    out[...] = 0  # faulted in: only the copies are timed
    began = time.perf_counter()
    for k, chunk in enumerate(kept):
        out[k] = chunk
    seconds = time.perf_counter() - began
    assert out[7, 0, 0, 0] == 7
    return seconds / COUNT * 1e6


def read_boxes_us(path: Path, offset: int) -> float:
    """Microseconds per chunk-aligned box read with the cache on, chunks at ``offset``."""
    shipped = cache_module.PAGE_OFFSET
    cache_module.PAGE_OFFSET = offset
    try:
        set_chunk_cache_bytes(2 * COUNT * EDGE**3 * 4)
        chunk_cache().clear()  # no pages of the other layout kept
        src = mixle.read_zarr(path)
        grid = range(0, 8 * EDGE, EDGE)
        starts = np.array([(z, y, x) for z in grid for y in grid for x in grid])
        began = time.perf_counter()
        batch = src.read_boxes(starts, (EDGE,) * 3)
        seconds = time.perf_counter() - began
        src.close()
    finally:
        cache_module.PAGE_OFFSET = shipped
    assert batch[1, 0, 0, 0] == starts[1, 0]
    return seconds / len(starts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import zarr

    set_decode_threads(1)
    shipped = cache_module.PAGE_OFFSET
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.zarr"
        arr = zarr.create_array(
            str(path),
            shape=(8 * EDGE,) * 3,
            chunks=(EDGE,) * 3,
            dtype="f4",
            compressors=zarr.codecs.ZstdCodec(level=0),
        )
        ramp = np.arange(8 * EDGE, dtype="f4")[:, None, None]
        arr[...] = np.broadcast_to(ramp, arr.shape)
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for offset in (shipped, 0):
                rows.setdefault(f"scatter {offset}", []).append(scatter_us(offset))
                rows.setdefault(f"read {offset}", []).append(read_boxes_us(path, offset))
    print(
        f"{COUNT} chunks of {EDGE}^3 float32 (128 KiB), {args.rounds} interleaved rounds, "
        "1 decode thread; best round (median round), microseconds per chunk"
    )
    print(f"{'':38s} {'PAGE_OFFSET=' + str(shipped):>18s} {'PAGE_OFFSET=0':>16s} {'ratio':>12s}")
    for what, label in (("scatter", "scatter a kept chunk into a batch"),
                        ("read", "read_boxes, chunk-aligned, cache on")):  # fmt: skip
        mine, aligned = rows[f"{what} {shipped}"], rows[f"{what} 0"]
        pair = f"{min(mine):.1f} ({np.median(mine):.1f})"
        other = f"{min(aligned):.1f} ({np.median(aligned):.1f})"
        ratio = f"{min(aligned) / min(mine):.2f} ({np.median(aligned) / np.median(mine):.2f})"
        print(f"{label:38s} {pair:>18s} {other:>16s} {ratio:>12s}")
    print("  ratio: PAGE_OFFSET=0 time over the shipped offset's (above 1: the offset is faster)")


if __name__ == "__main__":
    main()
