"""Stored chunks read into a buffer that starts on a page, or 16 bytes into one.

mixle reads a stored chunk (a zarr chunk file, an HDF5 chunk's bytes) into a per-thread
buffer and decodes it from there. A large ``bytearray``'s bytes start 16 bytes into a page
(the allocator's header), and on some machines the kernel copies a read into such a
buffer several times slower than into one that starts on the page (seen on AMD EPYC, Linux
6.18: 3.7-5.6x over our runs, where it starts 4 to 28 bytes into a page; 0, and 32 on, were
fast). So
:func:`mixle.utils.files.thread_read_buffer` starts its buffer on a page. This prints,
measured side by side in interleaved rounds:

- read: microseconds per stored file (``--file-kib`` KiB of incompressible bytes) read
  through ``read_local_object(..., reuse=True)`` (zarr's local chunk read: open, fstat,
  one read, close), with the buffer as shipped, 16 bytes into a page, and 32 bytes in;
- read_boxes: chunk-aligned 64^3 boxes of a zstd zarr array on disk read with the cache
  off (each chunk read, decoded and scattered), the buffer as shipped and 16 bytes in.

The files are in the OS page cache (read once first), so the read is the kernel's copy.

    python3 benchmarks/read_alignment.py [--rounds 7] [--files 256] [--file-kib 900]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import mixle
import mixle.utils.files as files_module
from mixle.data.sources.arrays.zarr.local_files import read_local_object
from mixle.reading import set_chunk_cache_bytes, set_decode_threads

EDGE = 64  # a zarr chunk and a box: 64^3 float32 = 1 MiB
GRID = 4  # chunks an axis of the zarr array: 64 chunks


def _buffer_at(offset: int) -> Callable[[int], memoryview]:
    """A ``page_aligned_buffer`` stand-in whose buffers start ``offset`` bytes into a page."""
    shipped = files_module.page_aligned_buffer

    def make(size: int) -> memoryview:
        return shipped(size + offset)[offset:]

    return make


@contextmanager
def read_buffers_at(offset: int | None) -> Iterator[None]:
    """This thread's read buffers start ``offset`` bytes into a page (``None``: as shipped)."""
    shipped = files_module.page_aligned_buffer
    if offset is not None:
        files_module.page_aligned_buffer = _buffer_at(offset)
    files_module._read_buffers.__dict__.clear()  # the next read makes a new buffer
    try:
        yield
    finally:
        files_module.page_aligned_buffer = shipped
        files_module._read_buffers.__dict__.clear()


def where_reads_land() -> int:
    """The page offset of the buffer a read lands in, as shipped (0: on a page)."""
    with read_buffers_at(None):
        view = files_module.thread_read_buffer(1 << 20)
        return ctypes.addressof(ctypes.c_char.from_buffer(view)) % files_module.READ_BUFFER_ALIGN


def read_us(paths: list[str], limit: int, offset: int | None) -> float:
    """Microseconds per file read into this thread's buffer at ``offset`` into a page."""
    with read_buffers_at(offset):
        read_local_object(paths[0], "file", limit, reuse=True)  # the buffer made (untimed)
        began = time.perf_counter()
        for path in paths:
            data = read_local_object(path, "file", limit, reuse=True)
        seconds = time.perf_counter() - began
    assert data is not None and len(data) == os.path.getsize(paths[-1])
    return seconds / len(paths) * 1e6


def read_boxes_us(path: Path, offset: int | None, last: np.ndarray) -> float:
    """Microseconds per chunk-aligned box read with the cache off, read buffers at ``offset``
    (the last box checked against ``last``, zarr's own read of it)."""
    with read_buffers_at(offset):
        src = mixle.read_zarr(path)
        grid = range(0, GRID * EDGE, EDGE)
        starts = np.array([(z, y, x) for z in grid for y in grid for x in grid])
        src.read_boxes(starts[:1], (EDGE,) * 3)  # the buffer made (untimed)
        began = time.perf_counter()
        batch = src.read_boxes(starts, (EDGE,) * 3)
        seconds = time.perf_counter() - began
        src.close()
    assert np.array_equal(batch[-1], last)
    return seconds / len(starts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--files", type=int, default=256)
    parser.add_argument("--file-kib", type=int, default=900)
    args = parser.parse_args()
    import zarr

    set_decode_threads(1)
    set_chunk_cache_bytes(0)
    rng = np.random.default_rng(0)
    nbytes = args.file_kib * 1024
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = []
        for k in range(args.files):
            path = folder / f"f{k}"
            path.write_bytes(rng.bytes(nbytes))
            paths.append(str(path))
        for path in paths:  # into the page cache
            Path(path).read_bytes()
        arr = zarr.create_array(
            str(folder / "v.zarr"),
            shape=(GRID * EDGE,) * 3,
            chunks=(EDGE,) * 3,
            dtype="f4",
            compressors=zarr.codecs.ZstdCodec(level=0),
        )
        # a ramp plus noise: chunks of about 0.75 MiB stored
        ramp = np.arange(GRID * EDGE, dtype="f4")[None, None, :]
        noise = rng.random(arr.shape, dtype="f4").astype("f2").astype("f4")
        arr[...] = ramp + noise
        last = np.asarray(arr[(slice((GRID - 1) * EDGE, None),) * 3])  # zarr's own read
        read_boxes_us(folder / "v.zarr", None, last)  # the chunk files into the page cache
        offsets: list[int | None] = [None, 16, 32]
        rows: dict[str, list[float]] = {}
        for r in range(args.rounds):
            turn = offsets[r % 3 :] + offsets[: r % 3]
            for offset in turn:
                rows.setdefault(f"read {offset}", []).append(read_us(paths, nbytes, offset))
            for offset in (None, 16) if r % 2 == 0 else (16, None):
                rows.setdefault(f"boxes {offset}", []).append(
                    read_boxes_us(folder / "v.zarr", offset, last)
                )
    shipped = where_reads_land()
    print(
        f"{args.files} files of {args.file_kib} KiB read {args.rounds} interleaved rounds "
        f"(as shipped, the buffer starts {shipped} bytes into a page); {GRID**3} chunk-aligned "
        f"{EDGE}^3 boxes of a zstd zarr array, cache off, 1 decode thread; best round (median "
        "round), microseconds per file / box"
    )
    heads = ("as shipped", "16 bytes in", "32 bytes in")
    print(f"{'':34s} {heads[0]:>16s} {heads[1]:>16s} {heads[2]:>16s} {'ratio 16':>12s}")
    for what, label in (("read", "read a stored file (reuse=True)"),
                        ("boxes", "read_boxes, chunk-aligned, no cache")):  # fmt: skip
        mine, off16 = rows[f"{what} None"], rows[f"{what} 16"]
        cells = [f"{min(v):.0f} ({np.median(v):.0f})" for v in (mine, off16)]
        off32 = rows.get(f"{what} 32")
        cells.append(f"{min(off32):.0f} ({np.median(off32):.0f})" if off32 else "-")
        ratio = f"{min(off16) / min(mine):.2f} ({np.median(off16) / np.median(mine):.2f})"
        print(f"{label:34s} {cells[0]:>16s} {cells[1]:>16s} {cells[2]:>16s} {ratio:>12s}")
    print("  ratio 16: time 16 bytes into a page / time as shipped (above 1: as shipped is faster)")


if __name__ == "__main__":
    main()
