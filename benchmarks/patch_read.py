"""Random patch reads: naive slicing vs mixle per-index and batched vs tensorstore vs the
decode-bound limit, mixle's format readers vs each format library's own read, and a
Loader's pass of random patches against the decode-bound limit.

Run: python benchmarks/patch_read.py [--size 512] [--batches 12] [--only cubes|formats ...]
     python benchmarks/patch_read.py --only pass [--size 512] [--pass-patches 320] [--repeats 5]

Three tables; with no ``--only`` the cubes and formats tables run (the pass table runs only
when named). The cubes table:

Writes a float32 cube with 64^3 chunks (zstd zarr, gzip HDF5, uncompressed contiguous HDF5,
raw memmap) to a temporary folder, then reads random 32^3 patches in batches of 64 with a
warm page cache. Every measurement runs in its own fresh process so that its peak RSS is
its own. Each process first reads the whole volume once through its own handle (so memory
maps are populated and caches are full, as in a long training run), warms up on a few
batches, then times other, fresh batches. Peak RSS of memory-mapped rows (memmap, HDF5
raw in mixle) includes the file's pages mapped from the page cache, shared and reclaimable.

- naive: ``np.array(arr[slices])`` per patch in a Python loop on a plain zarr / h5py
  (default 1 MiB chunk cache) / np.memmap handle, stacked into the batch with ``np.stack``
  as a DataLoader collates it, as users write it today (every ratio is against this row).
  ``naive, no stack`` skips the stacking (the patches are dropped, never batched): shown for
  the memory-mapped stores, where copying is the whole cost.
- per-index: ``sampler[i]``; batched: ``sampler.get_batch`` (256 MiB decoded-chunk cache);
  batched, no cache: the same with the cache off (each batch decodes what it touches once).
- tensorstore: zarr3 driver, one ``ts.Batch`` per batch, the same 256 MiB cache (or none,
  beside mixle's no-cache row), as many copy threads as mixle has decode threads (where
  tensorstore is installed). ``x tstore`` compares each mixle row with the tensorstore row
  of the same cache setting.
- batched, 384 MiB cache: mixle with a cache as large as the memory tensorstore actually
  holds with its 256 MiB budget (compare the RSS columns), against tensorstore's row.
- locality: batched with ``patches_per_chunk=8`` (8 patches share one 64^3 chunk region).
- limit: decode threads x single-thread decode rate of one stored chunk / chunks touched
  per patch, measured in this run: what a reader that decodes every touched chunk once per
  patch, on every core, with no cache, could reach.

The formats table (``--only formats``; one to two minutes at the defaults) writes a 256^3
float32 cube as a tiled zlib TIFF (one page per z plane, 64x64 tiles; tifffile), NIfTI-1
``.nii`` and ``.nii.gz`` (nibabel), N5 with gzip 64^3 blocks (tensorstore) and ``.b2nd``
with 64^3 chunks (blosc2), then reads the same 256 random 32^3 patches a pass, in batches of
64, with mixle's reader (``read_boxes``) and with the library's own read of one patch:

- tifffile: ``zarr.open(tifffile.imread(path, aszarr=True))[box]``;
- nibabel: ``np.asarray(img.dataobj[box])``;
- tensorstore: its n5 driver, one ``ts.Batch`` of 64 ``[box].read()`` per batch,
  ``cache_pool`` 0, as many copy threads as mixle has decode threads;
- blosc2: ``blosc2.open(path)[box]``.

Rounds interleave the library, mixle with a 256 MiB cache and mixle with the cache off
(``.nii``: one mixle row, a memory map; ``.nii.gz``: mixle's inflated on-disk copy deleted
before every pass, or kept). Every pass opens a fresh handle (timed) and mixle's
decoded-chunk cache is emptied first, so each pass decodes what it reads; mixle's on-disk
cache (``MIXLE_CACHE_DIR``) is set inside the data folder. Each format runs in a fresh
process. ``x library`` is mixle's best pass over the library's best.
The pass table (``--only pass``; about four minutes on two cores at the defaults) writes
the cube as zarr (``ZstdCodec(level=0)``, zarr-python 3's default made explicit) and HDF5
gzip, both with 64^3 chunks, warms the page cache, and times passes of 320 random 32^3
patches (``PatchSampler(src, 32, 320, seed=repeat)``, 5 batches of 64), 5 passes a row with
seeds 0-4, best and median pass shown. The rows run side by side: every row of a backend
(the limit and each thread count included) has its own process, and they take turns pass by
pass (pass r of every row, then pass r + 1, the order rotated each round), so a ratio
never compares passes run minutes apart. Every pass opens a fresh handle (timed) and starts
with mixle's decoded-chunk cache emptied under a 256 MiB budget
(``chunk_cache().clear(keep_pages=True)``: no chunk carried over, the pages of the last pass's
chunks kept for the next ones, as evictions recycle them in a running job; the
``fresh pages`` row empties it with ``clear()``, so every kept chunk faults in new memory,
as in a new process). Rows per backend:

- naive: ``np.array(arr[box])`` per patch on zarr-python / a fresh h5py file (its default
  chunk cache), ``np.stack`` per batch;
- tensorstore (zarr only): a fresh ``ts.open`` per pass, ``cache_pool`` 256 MiB, as many
  copy threads as mixle has decode threads, one ``ts.Batch`` per batch;
- mixle: ``mixle.Loader(sampler, batch_size=64, shuffle=False, num_epochs=1,
  num_threads=0)``, as users read (the Loader tells the cache which chunks its next batches
  touch); ``mixle, get_batch (no plan)``: ``sampler.get_batch`` per batch (plain LRU).

Columns: patches/s (best, median pass); ``x naive`` (best over best), ``x tstore`` (best
over best, and median over median); ``x limit`` (the best limit over the best pass per
distinct chunk, and the median of the passes' own ratios), the pass against the limit =
one thread's time to decode each distinct chunk the same pass touches once, into a reused
buffer (zstd: ``numcodecs.Zstd().decode`` of the stored chunk files; gzip:
``zlib.decompress`` of ``read_direct_chunk``; the stored bytes read first, untimed; timed in
its turn of every round) / decode threads; decodes (``chunk_cache().stats().decodes``;
``.misses`` beside it) against distinct chunks (worst pass's ratio); the read / decode /
scatter seconds of ``chunk_cache().stats()`` (summed over threads) in ms. Then the Loader
row at 1, 2, 4, ... decode threads up to the core count (``set_decode_threads``): ms a pass,
speedup over one thread (best over best, median over median), the limit there; and ``bare``:
the limit's decodes shared out over the decode threads, against one thread, the machine's
own scaling for the same work (memory bandwidth and caches shared between cores).
Goal lines: zarr zstd >= 0.85x its limit and >= 1.3x tensorstore at the same budget, HDF5
gzip >= 0.85x its limit, decodes within 10% of distinct chunks. The machines are noisy:
compare the ratios of one run, never absolute times across runs.

``--quick`` runs every row of the tables chosen at a tiny size (a smoke test; ``--quick
--only pass`` for the pass table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

PATCH = 32
CHUNK = 64
BATCH = 64
WARM_BATCHES = 4
CACHE_BYTES = 256 * 2**20
#: A larger mixle cache for a row at tensorstore's own peak memory: tensorstore holds well
#: over its configured budget (its RSS column shows how much).
BIG_CACHE_BYTES = 384 * 2**20
MIB = 2**20


# -- the volume ---------------------------------------------------------------------------
def write_volumes(folder: Path, size: int, *, uncompressed: bool = True) -> None:
    """The same smooth float32 cube as zarr (zstd), HDF5 (gzip / contiguous) and raw.

    zarr: zarr-python 3's default codec made explicit (``ZstdCodec(level=0)``); HDF5 gzip:
    h5py's default level (4); both with 64^3 chunks. ``uncompressed=False`` writes neither
    the contiguous HDF5 dataset nor the raw file (the pass table reads only the two
    compressed stores).
    """
    import h5py
    import zarr

    shape = (size, size, size)
    z, y, x = np.ogrid[0:CHUNK, 0:size, 0:size]
    arr = zarr.create_array(
        str(folder / "v.zarr"),
        shape=shape,
        chunks=(CHUNK,) * 3,
        dtype="f4",
        compressors=zarr.codecs.ZstdCodec(level=0),
        overwrite=True,
    )
    with h5py.File(folder / "v.h5", "w") as f:
        gz = f.create_dataset(
            "gzip", shape=shape, dtype="f4", chunks=(CHUNK,) * 3, compression="gzip"
        )
        flat = f.create_dataset("raw", shape=shape, dtype="f4") if uncompressed else None
        with open(folder / "v.raw", "wb") if uncompressed else contextlib.nullcontext() as raw:
            for z0 in range(0, size, CHUNK):
                slab = (np.sin(0.05 * (z + z0)) * np.cos(0.03 * y) + 0.01 * x).astype("f4")
                arr[z0 : z0 + CHUNK] = slab
                gz[z0 : z0 + CHUNK] = slab
                if flat is not None and raw is not None:
                    flat[z0 : z0 + CHUNK] = slab
                    raw.write(slab.tobytes())


def corners(size: int, count: int, seed: int = 0) -> np.ndarray:
    """The random patch corners every method reads (mixle's own placement)."""
    import mixle

    return mixle.PatchSampler(
        np.empty((size,) * 3, np.uint8), PATCH, count, seed=seed
    ).coords_array()


# -- one measurement, in a fresh process -----------------------------------------------------
def measure(folder: Path, size: int, backend: str, method: str, batches: int) -> dict:
    """Patches/s and peak RSS of one (backend, method); runs inside the worker process."""
    import mixle
    from mixle.reading import set_chunk_cache_bytes

    shape = (size,) * 3
    n_warm, n_timed = WARM_BATCHES * BATCH, batches * BATCH
    where = corners(size, n_warm + n_timed)
    budgets = {"batched, no cache": 0, "batched, 384 MiB cache": BIG_CACHE_BYTES}
    set_chunk_cache_bytes(budgets.get(method, CACHE_BYTES))
    slabs = [(z0, y0) for z0 in range(0, size, CHUNK) for y0 in range(0, size, CHUNK)]

    if method.startswith("naive"):
        live = _naive_handle(folder, backend, shape)
        stack = method == "naive"

        def read_slab(z0: int, y0: int) -> None:
            np.array(live[z0 : z0 + CHUNK, y0 : y0 + CHUNK])

        def run(lo: int, hi: int) -> None:
            for b in range(lo, hi, BATCH):
                patches = [
                    np.array(live[zc : zc + PATCH, yc : yc + PATCH, xc : xc + PATCH])
                    for zc, yc, xc in where[b : b + BATCH].tolist()
                ]
                if stack:  # the batch a training step needs, as a DataLoader collates it
                    np.stack(patches)

    elif method.startswith("tensorstore"):
        budget = 0 if method.endswith("no cache") else CACHE_BYTES
        read_slab, run = _tensorstore_runner(folder, where, budget)
    else:
        src = _mixle_source(folder, backend, shape)
        local = 8 if method == "locality" else 1
        sampler = mixle.PatchSampler(src, PATCH, n_warm + n_timed, seed=0, patches_per_chunk=local)

        def read_slab(z0: int, y0: int) -> None:
            src.read_box((z0, y0, 0), (CHUNK, CHUNK, size))

        if method == "per-index":

            def run(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    sampler[i]

        else:

            def run(lo: int, hi: int) -> None:
                for b in range(lo, hi, BATCH):
                    sampler.get_batch(np.arange(b, b + BATCH))

    rss_ready = _peak_rss()
    for z0, y0 in slabs:  # every method first reads the whole volume through its own handle
        read_slab(z0, y0)
    run(0, n_warm)
    t0 = time.perf_counter()
    run(n_warm, n_warm + n_timed)
    elapsed = time.perf_counter() - t0
    return {
        "rate": n_timed / elapsed,
        "rss_ready": rss_ready,
        "rss_peak": _peak_rss(),
    }


def _naive_handle(folder: Path, backend: str, shape: tuple[int, ...]):
    import h5py
    import zarr

    if backend == "zarr zstd":
        return zarr.open_array(str(folder / "v.zarr"), mode="r")
    if backend in ("hdf5 gzip", "hdf5 raw"):
        return h5py.File(folder / "v.h5", "r")[backend.split()[1]]  # HDF5's default cache
    return np.memmap(folder / "v.raw", dtype="f4", mode="r", shape=shape)


def _mixle_source(folder: Path, backend: str, shape: tuple[int, ...]):
    import mixle

    if backend == "zarr zstd":
        return mixle.read_zarr(folder / "v.zarr")
    if backend in ("hdf5 gzip", "hdf5 raw"):
        return mixle.read_hdf5(folder / "v.h5", backend.split()[1])
    return mixle.read_memmap(folder / "v.raw", "float32", shape)


def _tensorstore_open(folder: Path, budget: int):
    """The zarr cube through tensorstore's zarr3 driver: a ``budget``-byte cache pool and as
    many copy threads as mixle has decode threads."""
    import tensorstore as ts

    from mixle.reading import decode_threads

    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(folder / "v.zarr")},
        "context": {
            "cache_pool": {"total_bytes_limit": budget},
            "data_copy_concurrency": {"limit": decode_threads()},
        },
    }
    return ts.open(spec, read=True).result()


def _tensorstore_batch(store, starts: np.ndarray, out: np.ndarray) -> None:
    """The patches at ``starts`` into ``out``: one ``ts.Batch`` of ``[box].read()``."""
    import tensorstore as ts

    with ts.Batch() as batch:
        futures = [store[_box(s)].read(batch=batch) for s in starts.tolist()]
    for k, future in enumerate(futures):
        out[k] = future.result()


def _tensorstore_runner(folder: Path, where: np.ndarray, budget: int):
    store = _tensorstore_open(folder, budget)

    def read_slab(z0: int, y0: int) -> None:
        store[z0 : z0 + CHUNK, y0 : y0 + CHUNK].read().result()

    def run(lo: int, hi: int) -> None:
        for b in range(lo, hi, BATCH):
            out = np.empty((BATCH, PATCH, PATCH, PATCH), dtype="f4")
            _tensorstore_batch(store, where[b : b + BATCH], out)

    return read_slab, run


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_isolated(folder: Path, size: int, backend: str, method: str, batches: int) -> dict:
    """Run :func:`measure` in a fresh process (through ``sh`` so its peak RSS is its own)."""
    cmd = [sys.executable, __file__, "--worker", str(folder), str(size), backend, method,
           str(batches)]  # fmt: skip
    out = subprocess.run(
        ["sh", "-c", '"$0" "$@"; exit $?', *cmd], capture_output=True, text=True, timeout=1800
    )
    if out.returncode:
        raise RuntimeError(f"{backend} / {method} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the decode-bound limit ------------------------------------------------------------------
def decode_rates(folder: Path, size: int) -> dict[str, float]:
    """Single-thread decoded chunks per second, for zstd (zarr) and gzip (HDF5) chunks."""
    import h5py
    import numcodecs

    rng = np.random.default_rng(1)
    grid = size // CHUNK
    picks = [tuple(int(v) for v in rng.integers(0, grid, 3)) for _ in range(24)]
    zstd = numcodecs.Zstd()
    blobs = [(folder / "v.zarr" / "c" / "/".join(map(str, c))).read_bytes() for c in picks]
    out = np.empty(CHUNK**3, dtype="f4")
    rates = {"zarr zstd": _rate(lambda: [zstd.decode(b, out=out) for b in blobs], len(blobs))}
    with h5py.File(folder / "v.h5", "r") as f:
        ds = f["gzip"]
        raw = [ds.id.read_direct_chunk(tuple(v * CHUNK for v in c))[1] for c in picks]
    nbytes = CHUNK**3 * 4
    rates["hdf5 gzip"] = _rate(lambda: [zlib.decompress(b, bufsize=nbytes) for b in raw], len(raw))
    return rates


def _rate(fn, n: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def chunks_per_patch(size: int, count: int) -> float:
    where = corners(size, count)
    spans = (where + PATCH - 1) // CHUNK - where // CHUNK + 1
    return float(np.prod(spans, axis=1).mean())


def zarr_reader_rates(folder: Path) -> tuple[float, float]:
    """Chunks/s through numcodecs directly vs through zarr's codec pipeline (one thread)."""
    import mixle
    from mixle.data.sources.arrays.zarr.chunks import ZarrCodecReader
    from mixle.data.sources.arrays.zarr.pipeline import ZarrPipelineReader

    src = mixle.read_zarr(folder / "v.zarr")
    direct = src._reader_for(src.array)  # what mixle picks for this array
    assert isinstance(direct, ZarrCodecReader)
    pipeline = ZarrPipelineReader(src.array)
    grid = src.shape[0] // CHUNK
    coords = [(i % grid, (i // grid) % grid, 0) for i in range(16)]
    return (
        _rate(lambda: [direct.read_chunk(c) for c in coords], len(coords), 3),
        _rate(lambda: [pipeline.read_chunk(c) for c in coords], len(coords), 3),
    )


# -- formats: mixle's readers vs each format library's own read -----------------------------
#: Edge of the cube each format stores (float32: 64 MiB at 256).
FORMAT_SIZE = 256
#: Random patches read in one timed pass.
FORMAT_PATCHES = 256
#: Interleaved rounds (library, mixle, mixle without a cache); the best pass of each is shown.
FORMAT_ROUNDS = 5
#: A library pass stops at the first patch (tensorstore: batch) past this many seconds:
#: nibabel reads a gzip NIfTI at a few patches a second, and a rate needs no more.
PASS_SECONDS = 3.0
#: Patches of the first batch compared with the library's own read before timing.
CHECKED_PATCHES = 8
#: mixle's batched read against the library's own read, on every row.
GOAL = 1.5

Box = tuple[slice, ...]


class Opened(NamedTuple):
    """A library's open handle: one patch per call, or a whole batch into ``out``."""

    patch: Callable[[Box], Any] | None
    batch: Callable[[np.ndarray, np.ndarray], None] | None
    close: Callable[[], None]


class Variant(NamedTuple):
    """One mixle row: its label, the decoded-chunk cache budget, what runs before a pass."""

    label: str
    cache_bytes: int
    before_pass: Callable[[], None] | None = None


#: mixle's rows for a chunked format: the cache on (emptied per pass) and off.
CHUNKED = (Variant("mixle", CACHE_BYTES), Variant("mixle, no cache", 0))


@dataclass(frozen=True)
class Format:
    """One stored volume, the library's own read of it and mixle's reader for it.

    ``cached`` says what mixle keeps between or within passes, for the table's notes;
    ``chunked``: whether mixle reads it through the decoded-chunk cache.
    """

    name: str
    stored: str
    library: str
    open_library: Callable[[], Opened]
    open_mixle: Callable[[], Any]
    variants: tuple[Variant, ...] = CHUNKED
    chunked: bool = True
    cached: str = ""


def format_volume(size: int) -> np.ndarray:
    """The cube every format stores: the same smooth float32 field as the zarr cube."""
    z, y, x = np.ogrid[0:size, 0:size, 0:size]
    return (np.sin(0.05 * z) * np.cos(0.03 * y) + 0.01 * x).astype("f4")


def _write_once(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` (a file or a folder) through a scratch name, unless it is there."""
    if path.exists():
        return
    scratch = path.parent / ".partial"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    write(scratch / path.name)
    (scratch / path.name).rename(path)
    scratch.rmdir()


def _box(start: list[int]) -> Box:
    return tuple(slice(c, c + PATCH) for c in start)


def tiff_format(folder: Path, vol: np.ndarray) -> Format:
    """A tiled zlib TIFF (one page per z plane, 64x64 tiles) and tifffile's zarr store."""
    import tifffile
    import zarr

    path = folder / f"v{len(vol)}.tif"
    _write_once(path, lambda p: tifffile.imwrite(p, vol, tile=(CHUNK, CHUNK), compression="zlib"))

    def library() -> Opened:
        store = tifffile.imread(path, aszarr=True)
        arr = zarr.open_array(store, mode="r")
        return Opened(lambda box: arr[box], None, store.close)

    def mixle_reader():
        from mixle.data.sources.arrays.tiff import read_tiff

        return read_tiff(path)

    return Format(
        "tiff",
        f"{path.name}: {len(vol)} pages, zlib, {CHUNK}x{CHUNK} tiles",
        "zarr.open(tifffile.imread(path, aszarr=True))[box]",
        library,
        mixle_reader,
    )


def nifti_format(folder: Path, vol: np.ndarray, suffix: str) -> Format:
    """A NIfTI-1 file (``.nii`` or gzip ``.nii.gz``) and nibabel's ``img.dataobj[box]``.

    mixle memory-maps a ``.nii``; a ``.nii.gz`` it inflates once into its on-disk cache
    (``$MIXLE_CACHE_DIR/nifti``) and memory-maps that copy. The ``mixle`` row of a
    ``.nii.gz`` deletes the copy before every pass (each pass inflates the whole file, in
    the timed open); ``mixle, copy kept`` reads through the copy a first open left.
    """
    import nibabel as nib

    from mixle.data.sources.records.text.row_index import cache_dir

    path = folder / f"v{len(vol)}{suffix}"
    _write_once(path, lambda p: nib.save(nib.Nifti1Image(vol, np.eye(4)), p))

    def library() -> Opened:
        img = nib.load(path)
        return Opened(lambda box: np.asarray(img.dataobj[box]), None, lambda: None)

    def mixle_reader():
        from mixle.data.sources.arrays.nifti import read_nifti

        return read_nifti(path)

    def forget_copies() -> None:
        shutil.rmtree(cache_dir() / "nifti", ignore_errors=True)

    if suffix.endswith(".gz"):
        how, cached = (
            "gzip, one stream",
            (
                "mixle: 'mixle' deletes its inflated on-disk copy before every pass (the timed "
                "open inflates the whole file), 'mixle, copy kept' maps the copy of an earlier "
                "open; nibabel inflates from the file's start up to each patch"
            ),
        )
        variants = (
            Variant("mixle", CACHE_BYTES, forget_copies),
            Variant("mixle, copy kept", CACHE_BYTES),
        )
    else:
        how, cached = "uncompressed", "mixle memory-maps the file (nothing decoded to cache)"
        variants = (Variant("mixle", CACHE_BYTES),)
    return Format(
        suffix[1:],
        f"{path.name}: NIfTI-1, {how}",
        "np.asarray(nibabel img.dataobj[box])",
        library,
        mixle_reader,
        variants,
        chunked=False,
        cached=cached,
    )


def n5_format(folder: Path, vol: np.ndarray) -> Format:
    """An N5 dataset (gzip, 64^3 blocks) written and read by tensorstore's n5 driver."""
    import tensorstore as ts

    from mixle.reading import decode_threads

    path = folder / f"v{len(vol)}.n5"

    def write(root: Path) -> None:
        root.mkdir()
        (root / "attributes.json").write_text(json.dumps({"n5": "2.0.0"}))
        spec = {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(root / "vol")},
            "metadata": {
                "dimensions": list(vol.shape),
                "blockSize": [CHUNK] * vol.ndim,
                "dataType": "float32",
                "compression": {"type": "gzip"},
            },
            "create": True,
        }
        ts.open(spec).result()[...].write(vol).result()

    _write_once(path, write)

    def library() -> Opened:
        spec = {
            "driver": "n5",
            "kvstore": {"driver": "file", "path": str(path / "vol")},
            "context": {
                "cache_pool": {"total_bytes_limit": 0},
                "data_copy_concurrency": {"limit": decode_threads()},
            },
        }
        store = ts.open(spec, read=True).result()

        def batch(starts: np.ndarray, out: np.ndarray) -> None:
            with ts.Batch() as b:
                futures = [store[_box(s)].read(batch=b) for s in starts.tolist()]
            for k, future in enumerate(futures):
                out[k] = future.result()

        return Opened(None, batch, lambda: None)

    def mixle_reader():
        from mixle.data.sources.arrays.n5 import read_n5

        return read_n5(path, "vol")

    return Format(
        "n5",
        f"{path.name}/vol: gzip, {CHUNK}^3 blocks",
        "tensorstore n5 [box].read(), one ts.Batch",
        library,
        mixle_reader,
    )


def b2nd_format(folder: Path, vol: np.ndarray) -> Format:
    """A ``.b2nd`` array (blosc2's defaults: zstd + shuffle) with 64^3 chunks; ``arr[box]``."""
    import blosc2

    path = folder / f"v{len(vol)}.b2nd"
    _write_once(path, lambda p: blosc2.asarray(vol, urlpath=str(p), mode="w", chunks=(CHUNK,) * 3))
    blocks = blosc2.open(str(path)).blocks

    def library() -> Opened:
        arr = blosc2.open(str(path))
        return Opened(lambda box: arr[box], None, lambda: None)

    def mixle_reader():
        from mixle.data.sources.arrays.b2nd import read_b2nd

        return read_b2nd(path)

    blocks_text = "x".join(map(str, blocks))
    return Format(
        "b2nd",
        f"{path.name}: blosc2 defaults (zstd, shuffle), {CHUNK}^3 chunks, {blocks_text} blocks",
        "blosc2.open(path)[box]",
        library,
        mixle_reader,
    )


def write_formats(folder: Path, size: int, names: list[str]) -> list[Format]:
    """Every format named, written into ``folder`` (kept there for the next run)."""
    vol = format_volume(size)
    makers: dict[str, Callable[[], Format]] = {
        "tiff": lambda: tiff_format(folder, vol),
        "nii": lambda: nifti_format(folder, vol, ".nii"),
        "nii.gz": lambda: nifti_format(folder, vol, ".nii.gz"),
        "n5": lambda: n5_format(folder, vol),
        "b2nd": lambda: b2nd_format(folder, vol),
    }
    return [makers[name]() for name in names]


def warm_page_cache(folder: Path) -> None:
    """Read every file under ``folder`` once, so that no pass pays the first disk read."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def library_pass(fmt: Format, starts: np.ndarray, seconds: float) -> tuple[int, float]:
    """Patches read and seconds taken by one pass of the library's own read (open timed)."""
    out = np.empty((BATCH, *(PATCH,) * 3), dtype="f4")
    t0 = time.perf_counter()
    opened = fmt.open_library()
    done = 0
    try:
        if opened.batch is not None:
            for b in range(0, len(starts), BATCH):
                chunk = starts[b : b + BATCH]
                opened.batch(chunk, out[: len(chunk)])
                done += len(chunk)
                if time.perf_counter() - t0 > seconds:
                    break
        else:
            assert opened.patch is not None
            for k, start in enumerate(starts.tolist()):
                out[k % BATCH] = opened.patch(_box(start))  # the batch a training step needs
                done += 1
                if time.perf_counter() - t0 > seconds:
                    break
        return done, time.perf_counter() - t0
    finally:
        opened.close()


def mixle_pass(fmt: Format, starts: np.ndarray, variant: Variant) -> tuple[int, float, int]:
    """Patches, seconds and chunks decoded by one pass of ``read_boxes`` (open timed).

    The decoded-chunk cache is emptied first, then holds ``variant.cache_bytes`` within
    the pass.
    """
    from mixle.reading import chunk_cache, set_chunk_cache_bytes

    set_chunk_cache_bytes(variant.cache_bytes)
    chunk_cache().clear()
    if variant.before_pass is not None:
        variant.before_pass()
    out = np.empty((BATCH, *(PATCH,) * 3), dtype="f4")
    t0 = time.perf_counter()
    src = fmt.open_mixle()
    try:
        for b in range(0, len(starts), BATCH):
            chunk = starts[b : b + BATCH]
            src.read_boxes(chunk, (PATCH,) * 3, out=out[: len(chunk)])
        elapsed = time.perf_counter() - t0
    finally:
        src.close()
    return len(starts), elapsed, chunk_cache().stats().misses


def same_patches(fmt: Format, starts: np.ndarray, vol: np.ndarray) -> bool:
    """mixle's first batch equals the volume written, and the library's read of it."""
    first = starts[:BATCH]
    src = fmt.open_mixle()
    try:
        got = src.read_boxes(first, (PATCH,) * 3)
    finally:
        src.close()
    if not all(np.array_equal(got[k], vol[_box(s)]) for k, s in enumerate(first.tolist())):
        return False
    lib = np.empty((CHECKED_PATCHES, *(PATCH,) * 3), dtype="f4")
    opened = fmt.open_library()
    try:
        if opened.batch is not None:
            opened.batch(first[:CHECKED_PATCHES], lib)
        else:
            assert opened.patch is not None
            for k, s in enumerate(first[:CHECKED_PATCHES].tolist()):
                lib[k] = opened.patch(_box(s))
    finally:
        opened.close()
    return bool(np.array_equal(got[:CHECKED_PATCHES], lib))


def format_rows(fmt: Format, size: int, patches: int, rounds: int) -> list[dict[str, Any]]:
    """The library's row and mixle's of one format, interleaved over ``rounds`` rounds.

    Each row shows its best pass; ``x_library`` is that over the library's best pass, and
    ``x_library_low``/``_high`` the range of the rounds' own ratios.
    """
    where = corners(size, patches, seed=3)
    row: dict[str, Any] = {"table": "formats", "format": fmt.name, "stored": fmt.stored}
    try:
        same = same_patches(fmt, where, format_volume(size))  # also the warm-up
    except ImportError as exc:
        return [{**row, "contender": "mixle", "missing": str(exc)}]
    lib_rates: list[float] = []
    passes: dict[str, list[tuple[float, float]]] = {v.label: [] for v in fmt.variants}
    for _ in range(rounds):
        done, seconds = library_pass(fmt, where, PASS_SECONDS)
        lib_rates.append(done / seconds)
        for variant in fmt.variants:
            done, seconds, decoded = mixle_pass(fmt, where, variant)
            passes[variant.label].append((done / seconds, decoded / done))
    best = max(lib_rates)
    rows = [
        {**row, "contender": "library", "read": fmt.library, "rate": best, "x_library": 1.0,
         "x_library_low": 1.0, "x_library_high": 1.0, "chunks_per_patch": None,
         "same": same, "rounds": rounds}
    ]  # fmt: skip
    for label, got in passes.items():
        rates = [rate for rate, _ in got]
        ratios = [r / lib for r, lib in zip(rates, lib_rates)]
        rows.append({
            **row,
            "contender": label,
            "read": "read_boxes",
            "rate": max(rates),
            "x_library": max(rates) / best,
            "x_library_low": min(ratios),
            "x_library_high": max(ratios),
            "chunks_per_patch": got[0][1] if fmt.chunked else None,
            "same": same,
            "rounds": rounds,
        })  # fmt: skip
    return rows


def format_isolated(
    folder: Path, name: str, size: int, patches: int, rounds: int
) -> list[dict[str, Any]]:
    """:func:`format_rows` of one written format, run in a fresh process."""
    cmd = [sys.executable, __file__, "--format-worker", str(folder), name, str(size),
           str(patches), str(rounds)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"format {name} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_formats(
    rows: list[dict[str, Any]], stored: list[Format], size: int, patches: int, rounds: int
) -> None:
    """The formats table, what each pass caches, and one goal line per mixle row kind."""
    from mixle.reading import decode_threads

    print()
    print(
        f"formats: {size}^3 float32 ({size**3 * 4 / MIB:.0f} MiB), random {PATCH}^3 patches, "
        f"{patches} a pass in batches of {BATCH}, {rounds} interleaved rounds (best pass "
        f"shown, [range] of the rounds' ratios), {decode_threads()} decode threads, each "
        "format in a fresh process"
    )
    print(
        "  cached: the OS page cache is warm (every file read once first). Every pass opens "
        "a fresh handle (timed) and keeps nothing decoded from the pass before: mixle's "
        f"decoded-chunk cache is emptied before each pass (chunk_cache().clear()), then holds "
        f"up to {CACHE_BYTES // MIB} MiB within the pass ('mixle') or nothing ('mixle, no "
        "cache': each batch decodes what it touches once); tensorstore runs with cache_pool "
        "0; tifffile's zarr store, nibabel and blosc2 keep no decoded data between reads."
    )
    for fmt in stored:
        if fmt.cached:
            print(f"  cached ({fmt.name}): {fmt.cached}")
    print(
        f"  a library pass stops at the first patch (tensorstore: batch) past {PASS_SECONDS:g} s;"
        f" 'same': mixle's first batch equals the written volume and the library's read of "
        f"its first {CHECKED_PATCHES} patches; chunks/patch: chunks mixle decoded per patch"
    )
    print(
        f"{'format':<7} {'contender':<52} {'patches/s':>10} {'x library':>22} "
        f"{'chunks/patch':>13} {'same':>5}"
    )
    shown = None
    for r in rows:
        if r["format"] != shown:
            shown = r["format"]
            print(f"{shown:<7} stored: {r['stored']}")
        if "missing" in r:
            print(f"{r['format']:<7} {'mixle':<52} reader not available: {r['missing']}")
            continue
        label = r["read"] if r["contender"] == "library" else f"{r['contender']} read_boxes"
        ratio = f"{r['x_library']:.2f} [{r['x_library_low']:.2f}-{r['x_library_high']:.2f}]"
        per = "-" if r["chunks_per_patch"] is None else f"{r['chunks_per_patch']:.2f}"
        print(
            f"{r['format']:<7} {label:<52} {r['rate']:>10.0f} {ratio:>22} {per:>13} "
            f"{r['same']!s:>5}"
        )
    missing = [r["format"] for r in rows if "missing" in r]
    labels = dict.fromkeys(r["contender"] for r in rows if r["contender"] != "library")
    for label in labels:
        mine = [r for r in rows if r["contender"] == label and "rate" in r]
        if not mine:
            continue
        worst = min(mine, key=lambda r: r["x_library"])
        met = worst["x_library"] >= GOAL and (label != "mixle" or not missing)
        names = ", ".join(r["format"] for r in mine)
        print(
            f"goal ({label}): >= {GOAL:g}x the library's own read ({names}): worst "
            f"{worst['x_library']:.2f} ({worst['format']})"
            + (f"; no reader for {', '.join(missing)}" if missing and label == "mixle" else "")
            + (" -- met" if met else " -- NOT met")
        )


# -- pass: a Loader's pass of random patches against the decode-bound limit ----------------
#: Random patches in one pass (5 batches of 64), and passes per row (seeds 0, 1, ...).
PASS_PATCHES = 320
PASS_REPEATS = 5
#: Seed of the untimed warm-up batch every row reads first (no timed pass reads it).
WARM_SEED = 1000
#: Each backend's rows; "mixle" is the Loader, as users read; "naive" is the first.
PASS_ROWS = {
    "zarr zstd": (
        "naive",
        "tensorstore",
        "mixle",
        "mixle, fresh pages",
        "mixle, get_batch (no plan)",
    ),
    "hdf5 gzip": ("naive", "mixle", "mixle, fresh pages", "mixle, get_batch (no plan)"),
}
#: The pass table's goals for the "mixle" row (against the limit and tensorstore), and the
#: most chunk decodes a pass may take per distinct chunk it touches.
PASS_GOAL_LIMIT = {"zarr zstd": 0.85, "hdf5 gzip": 0.85}
PASS_GOAL_TSTORE = 1.3
PASS_GOAL_DECODES = 1.10
#: A pass row that answers nothing for this long (its warm-up or one pass) is killed.
PASS_ROW_TIMEOUT_S = 1800.0


def pass_chunks(starts: np.ndarray) -> np.ndarray:
    """Grid coordinates of the distinct 64^3 chunks the 32^3 boxes at ``starts`` touch."""
    lo, hi = starts // CHUNK, (starts + PATCH - 1) // CHUNK
    keys = []
    for offset in np.ndindex(*(2,) * starts.shape[1]):  # a box spans at most 2 chunks an axis
        ids = lo + np.asarray(offset)
        inside = (ids <= hi).all(axis=1)
        keys.append(ids[inside])
    return np.unique(np.concatenate(keys), axis=0)


def distinct_chunks(starts: np.ndarray) -> int:
    """How many distinct 64^3 chunks the 32^3 boxes at ``starts`` touch together."""
    return len(pass_chunks(starts))


def thread_counts() -> list[int]:
    """1, 2 and every power of two up to the core count (and the core count itself)."""
    cores = os.cpu_count() or 1
    counts = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    return sorted({*counts, 2, cores}) if cores >= 2 else [1]


def _warm_files(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            warm_page_cache(path)
        else:
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def _pass_reader(folder: Path, size: int, backend: str, contender: str, count: int):
    """``read(seed, where)``: one pass (its handle opened in it) over the patches at
    ``where``, the first ``len(where)`` of ``count`` placed by ``seed``; returns the first
    batch. mixle's rows place them with their own sampler (checked against ``where``)."""
    import h5py
    import zarr

    import mixle

    shape = (size,) * 3

    if contender == "naive":

        def read(seed: int, where: np.ndarray) -> np.ndarray:
            if backend == "zarr zstd":
                arr = zarr.open_array(str(folder / "v.zarr"), mode="r")
                handle = None
            else:  # a fresh file: h5py's default chunk cache, empty
                handle = h5py.File(folder / "v.h5", "r")
                arr = handle["gzip"]
            try:
                for b in range(0, len(where), BATCH):
                    batch = np.stack(
                        [np.array(arr[_box(s)]) for s in where[b : b + BATCH].tolist()]
                    )
                    if b == 0:
                        first = batch
            finally:
                if handle is not None:
                    handle.close()
            return first

    elif contender == "tensorstore":

        def read(seed: int, where: np.ndarray) -> np.ndarray:
            store = _tensorstore_open(folder, CACHE_BYTES)  # a fresh, empty cache pool
            out = np.empty((BATCH, *(PATCH,) * 3), dtype="f4")
            for b in range(0, len(where), BATCH):
                chunk = where[b : b + BATCH]
                _tensorstore_batch(store, chunk, out[: len(chunk)])
                if b == 0:
                    first = out[: len(chunk)].copy()
            return first

    else:
        planned = contender in ("mixle", "mixle, fresh pages")

        def read(seed: int, where: np.ndarray) -> np.ndarray:
            src = _mixle_source(folder, backend, shape)
            try:
                sampler = mixle.PatchSampler(src, PATCH, count, seed=seed)
                stop = len(where)
                if planned:
                    loader = mixle.Loader(
                        sampler, batch_size=BATCH, shuffle=False, num_epochs=1, num_threads=0
                    )
                    for k, (patches, coords) in enumerate(loader):
                        if k == 0:
                            first = patches
                            assert np.array_equal(coords, where[: len(coords)])
                        if (k + 1) * BATCH >= stop:
                            break
                else:
                    for b in range(0, stop, BATCH):
                        patches, coords = sampler.get_batch(np.arange(b, min(b + BATCH, stop)))
                        if b == 0:
                            first = patches
                            assert np.array_equal(coords, where[: len(coords)])
            finally:
                src.close()
            return first

    return read


def pass_serve(
    folder: Path, size: int, backend: str, contender: str, threads: int, count: int
) -> None:
    """One row's process: after an untimed warm-up pass it answers every seed read from
    stdin with one timed pass (a JSON line), until stdin ends.

    The rows of a backend each have such a process and take turns pass by pass, so every
    ratio compares passes run side by side (a noisy machine shifts them all alike).
    ``contender="limit"`` times the decode-bound limit of each pass instead.
    """
    from mixle.reading import chunk_cache, set_chunk_cache_bytes, set_decode_threads

    if threads:
        set_decode_threads(threads)
    files = [folder / "v.zarr"] if backend == "zarr zstd" else [folder / "v.h5"]
    _warm_files(files)
    if contender == "limit":
        limit = _limit_meter(folder, size, backend, count)
        print(json.dumps({"same": True}), flush=True)
        for line in sys.stdin:
            print(json.dumps(limit(int(line))), flush=True)
        return
    read = _pass_reader(folder, size, backend, contender, count)

    def fresh() -> None:  # every pass starts with mixle's decoded-chunk cache empty
        set_chunk_cache_bytes(CACHE_BYTES)
        # its pages kept for the next chunks (as a running job's evictions are), or given
        # back to the system ("fresh pages": every kept chunk faults in new memory)
        chunk_cache().clear(keep_pages=contender != "mixle, fresh pages")

    fresh()
    warm = corners(size, count, WARM_SEED)[:BATCH]
    first = read(WARM_SEED, warm)  # warm-up: imports, pools, handles (untimed)
    same = bool(np.array_equal(first, _expected_patches(folder, backend, warm)))
    print(json.dumps({"same": same}), flush=True)
    mine = contender.startswith("mixle")
    for line in sys.stdin:
        seed = int(line)
        where = corners(size, count, seed)
        fresh()
        t0 = time.perf_counter()
        read(seed, where)
        seconds = time.perf_counter() - t0
        stats = chunk_cache().stats()
        print(json.dumps({
            "seed": seed,
            "seconds": seconds,
            "decodes": stats.decodes if mine else None,
            "misses": stats.misses if mine else None,
            "read_s": stats.read_seconds if mine else None,
            "decode_s": stats.decode_seconds if mine else None,
            "scatter_s": stats.scatter_seconds if mine else None,
        }), flush=True)  # fmt: skip


def _limit_meter(folder: Path, size: int, backend: str, count: int):
    """``limit(seed)``: one thread's seconds to decode every distinct chunk of that pass once
    into a reused buffer (its stored bytes read first, untimed), and the seconds the decode
    threads take for the same decodes shared out (the machine's own scaling)."""
    import threading

    import h5py
    import numcodecs

    from mixle.reading import decode_threads

    nbytes = CHUNK**3 * 4
    if backend == "zarr zstd":
        zstd = numcodecs.Zstd()

        def stored(c: tuple[int, ...]) -> bytes:
            return (folder / "v.zarr" / "c" / "/".join(map(str, c))).read_bytes()

        def decode(blob: bytes, out: np.ndarray) -> None:
            zstd.decode(blob, out=out)
    else:
        ds = h5py.File(folder / "v.h5", "r")["gzip"]

        def stored(c: tuple[int, ...]) -> bytes:
            return ds.id.read_direct_chunk(tuple(v * CHUNK for v in c))[1]

        def decode(blob: bytes, out: np.ndarray) -> None:
            zlib.decompress(blob, bufsize=nbytes)

    def limit(seed: int) -> dict[str, Any]:
        blobs = [stored(tuple(c)) for c in pass_chunks(corners(size, count, seed)).tolist()]
        out = np.empty(nbytes, dtype=np.uint8)
        t0 = time.perf_counter()
        for blob in blobs:
            decode(blob, out)
        one = time.perf_counter() - t0
        n = decode_threads()
        start = threading.Barrier(n + 1)

        def share(k: int) -> None:
            mine = np.empty(nbytes, dtype=np.uint8)
            start.wait()
            for blob in blobs[k::n]:
                decode(blob, mine)

        workers = [threading.Thread(target=share, args=(k,)) for k in range(n)]
        for w in workers:
            w.start()
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        return {"seed": seed, "seconds": one, "shared_seconds": time.perf_counter() - t0}

    return limit


class _PassRow:
    """The process of one row (:func:`pass_serve`), asked for one pass at a time."""

    def __init__(
        self, folder: Path, size: int, backend: str, contender: str, threads: int, count: int
    ) -> None:
        self.name = f"{backend} / {contender} / {threads or 'default'} threads"
        cmd = [sys.executable, __file__, "--pass-server", str(folder), str(size), backend,
               contender, str(threads), str(count)]  # fmt: skip
        # stderr to a file: a pipe nobody drains would stop a row that warns a lot
        self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True
        )
        self.same = bool(self._answer()["same"])
        self.passes: list[dict[str, Any]] = []

    def run(self, seed: int) -> dict[str, Any]:
        """One timed pass of ``seed``; kept in :attr:`passes`."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{seed}\n")
        self._proc.stdin.flush()
        got = self._answer()
        self.passes.append(got)
        return got

    def _answer(self) -> dict[str, Any]:
        """The row's next line; a row silent for :data:`PASS_ROW_TIMEOUT_S` is killed."""
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], PASS_ROW_TIMEOUT_S)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            self._proc.kill()
            self._proc.wait()
            self._err.seek(0)
            why = "failed" if ready else f"gave no answer in {PASS_ROW_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"pass row {self.name} {why}:\n{self._err.read()[-4000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._err.close()


def run_side_by_side(rows: list[_PassRow], repeats: int) -> None:
    """Round ``r`` runs pass ``r`` (seed ``r``) of every row, their order rotated a place
    each round, so no row always runs first or right after another."""
    for seed in range(repeats):
        shift = seed % len(rows)
        for row in rows[shift:] + rows[:shift]:
            row.run(seed)


def _expected_patches(folder: Path, backend: str, starts: np.ndarray) -> np.ndarray:
    """The patches at ``starts`` as the format library reads them (the 'same' check)."""
    import h5py
    import zarr

    if backend == "zarr zstd":
        arr = zarr.open_array(str(folder / "v.zarr"), mode="r")
        return np.stack([np.array(arr[_box(s)]) for s in starts.tolist()])
    with h5py.File(folder / "v.h5", "r") as f:
        return np.stack([np.array(f["gzip"][_box(s)]) for s in starts.tolist()])


def _pass_summary(
    passes: list[dict[str, Any]], same: bool, count: int, limit_s: dict[int, float],
    distinct: dict[int, int],
) -> dict[str, Any]:  # fmt: skip
    """Best and median pass of one row, its ratio to the limit of the same passes, and its
    decodes."""
    seconds = [p["seconds"] for p in passes]
    limits = [limit_s[p["seed"]] for p in passes]
    x_limit = [lim / s for lim, s in zip(limits, seconds)]
    # best: the fastest limit against the fastest pass, both per distinct chunk of their
    # seed (not the best of the passes' own ratios, which a slow limit round would lift)
    chunks = [distinct[p["seed"]] for p in passes]
    best_limit = min(lim / n for lim, n in zip(limits, chunks))
    best_pass = min(s / n for s, n in zip(seconds, chunks))
    row: dict[str, Any] = {
        "rate": count / min(seconds),
        "rate_median": count / float(np.median(seconds)),
        "ms_best": 1e3 * min(seconds),
        "ms_median": 1e3 * float(np.median(seconds)),
        "limit_ms": 1e3 * float(np.median(limits)),
        "x_limit": best_limit / best_pass,
        "x_limit_median": float(np.median(x_limit)),
        "distinct": float(np.median([distinct[p["seed"]] for p in passes])),
        "same": same,
        "passes": len(passes),
    }
    if passes[0]["decodes"] is not None:
        row["decodes"] = float(np.median([p["decodes"] for p in passes]))
        row["misses"] = float(np.median([p["misses"] for p in passes]))
        row["x_distinct_worst"] = max(p["decodes"] / distinct[p["seed"]] for p in passes)
        for stage in ("read_s", "decode_s", "scatter_s"):
            row[stage.replace("_s", "_ms")] = 1e3 * float(np.median([p[stage] for p in passes]))
    return row


def pass_rows(folder: Path, size: int, count: int, repeats: int) -> list[dict[str, Any]]:
    """The pass table: each backend's rows and its thread scaling, run side by side."""
    from mixle.reading import decode_threads
    from mixle.utils.optional_deps import has

    t0 = time.perf_counter()
    done = folder / "written"
    if not done.exists():
        write_volumes(folder, size, uncompressed=False)
        done.touch()
    _warm_files([folder / "v.zarr", folder / "v.h5"])
    threads = decode_threads()
    distinct = {seed: distinct_chunks(corners(size, count, seed)) for seed in range(repeats)}
    spread = sorted(distinct.values())
    print(
        f"\npass: {size}^3 float32 ({size**3 * 4 / MIB:.0f} MiB), {CHUNK}^3 chunks; a pass = "
        f"{count} random {PATCH}^3 patches in batches of {BATCH}; {repeats} passes a row "
        f"(seeds 0-{repeats - 1}), best and median shown; {threads} decode threads; written "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    print(
        "  side by side: every row of a backend has its own process and the rows take turns "
        "pass by pass (pass r of every row, then pass r+1; the order rotated each round), so "
        "each ratio compares passes run next to each other, the limit included"
    )
    print(
        "  cached: the OS page cache is warm (every file read once first). Every pass opens "
        "a fresh handle (timed) and starts with mixle's decoded-chunk cache emptied "
        "(chunk_cache().clear(keep_pages=True): the last pass's pages reused, as evictions "
        "reuse them in a running job; 'fresh pages': clear(), new memory for every kept "
        f"chunk), then holding up to {CACHE_BYTES // MIB} MiB; tensorstore: "
        f"a fresh ts.open per pass, cache_pool {CACHE_BYTES // MIB} MiB, data_copy_concurrency "
        "= decode threads, one ts.Batch per batch; naive: zarr-python / h5py (a fresh file, "
        "its default 1 MiB chunk cache) np.array(arr[box]) per patch, np.stack per batch"
    )
    print(
        "  mixle: mixle.Loader(PatchSampler(src, 32, n, seed), batch_size=64, shuffle=False, "
        "num_epochs=1, num_threads=0) (the Loader tells the cache which chunks its next "
        "batches touch); 'get_batch (no plan)': sampler.get_batch(np.arange(b, b + 64)) "
        "(plain LRU)"
    )
    print(
        f"  distinct chunks a pass touches: {spread[0]}-{spread[-1]} "
        f"(of {(size // CHUNK) ** 3}); decodes / misses: chunk_cache().stats().decodes (chunks "
        "the read planner decoded) / .misses after the pass (median pass)"
    )
    how = {
        "zarr zstd": "numcodecs.Zstd().decode(blob, out=buffer) of the stored chunk files",
        "hdf5 gzip": "zlib.decompress(raw, bufsize=nbytes) of read_direct_chunk",
    }
    for name in PASS_ROWS:
        print(
            f"  limit ({name}): the pass's distinct chunks, each decoded once by one thread "
            f"({how[name]}; stored bytes read first, untimed), / {threads} threads; timed in "
            "its turn of every round"
        )
    print(
        "  stage ms: chunk_cache().stats() read_seconds / decode_seconds / scatter_seconds of "
        "a pass, summed over threads (median pass)"
    )
    print()
    head = (
        f"{'backend':<10} {'contender':<27} {'patches/s':>10} {'median':>7} {'x naive':>8} "
        f"{'x tstore':>13} {'x limit':>13} {'decodes':>8} {'misses':>7} {'distinct':>8} "
        f"{'worst':>6} {'read ms':>8} {'decode ms':>9} {'scatter ms':>10} {'same':>5}"
    )
    rows: list[dict[str, Any]] = []
    mixle_rows: dict[str, dict[str, Any]] = {}
    scaling: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    bare: dict[str, tuple[float, float]] = {}
    for backend, contenders in PASS_ROWS.items():
        named = [c for c in contenders if c != "tensorstore" or has("tensorstore")]
        others = [n for n in thread_counts() if n != threads]
        procs: list[_PassRow] = []
        try:
            for contender in ["limit", *named]:
                procs.append(_PassRow(folder, size, backend, contender, 0, count))
            for n in others:
                procs.append(_PassRow(folder, size, backend, "mixle", n, count))
            run_side_by_side(procs, repeats)
        finally:
            for proc in procs:
                proc.close()
        limit_row, by_name = procs[0], dict(zip(named, procs[1 : 1 + len(named)]))
        limit_s = {p["seed"]: p["seconds"] / threads for p in limit_row.passes}
        shared = [p["shared_seconds"] for p in limit_row.passes]
        one = [p["seconds"] for p in limit_row.passes]
        bare[backend] = (min(one) / min(shared), float(np.median(one) / np.median(shared)))
        if backend == next(iter(PASS_ROWS)):
            print(head, flush=True)
        found: dict[str, dict[str, Any]] = {}
        for contender in contenders:
            if contender not in by_name:
                print(f"{backend:<10} {contender:<27} {'not installed':>10}")
                continue
            proc = by_name[contender]
            r = found[contender] = _pass_summary(proc.passes, proc.same, count, limit_s, distinct)
            r["x_naive"] = r["rate"] / found["naive"]["rate"]
            peer = found.get("tensorstore") if contender.startswith("mixle") else None
            r["x_tstore"] = r["rate"] / peer["rate"] if peer else None
            r["x_tstore_median"] = r["rate_median"] / peer["rate_median"] if peer else None
            rows.append({"table": "pass", "backend": backend, "contender": contender,
                         "threads": threads, **r})  # fmt: skip
            _print_pass_row(backend, contender, r)
        mixle_rows[backend] = found["mixle"]
        counted = {threads: found["mixle"]}
        for n, proc in zip(others, procs[1 + len(named) :]):
            limit_n = {seed: v * threads / n for seed, v in limit_s.items()}
            counted[n] = _pass_summary(proc.passes, proc.same, count, limit_n, distinct)
        scaling[backend] = sorted(counted.items())
    print()
    print(
        f"{'backend':<10} {'threads':>7} {'ms/pass':>8} {'median':>7} {'speedup':>13} "
        f"{'limit ms':>9} {'x limit':>13} {'decodes':>8}  (the mixle Loader row; at "
        f"{threads} threads: the row above)",
        flush=True,
    )
    for backend, counted in scaling.items():
        one_row = counted[0][1]
        for n, r in counted:
            r = dict(r)
            r["speedup"] = one_row["ms_best"] / r["ms_best"]
            r["speedup_median"] = one_row["ms_median"] / r["ms_median"]
            rows.append({"table": "pass threads", "backend": backend, "contender": "mixle",
                         "threads": n, **r})  # fmt: skip
            print(
                f"{backend:<10} {n:>7} {r['ms_best']:>8.0f} {r['ms_median']:>7.0f} "
                f"{_pair(r['speedup'], r['speedup_median']):>13} {r['limit_ms']:>9.0f} "
                f"{_pair(r['x_limit'], r['x_limit_median']):>13} {r['decodes']:>8.0f}",
                flush=True,
            )
        best, median = bare[backend]
        rows.append({"table": "pass bare decode", "backend": backend, "threads": threads,
                     "speedup": best, "speedup_median": median, "x_limit": best / threads,
                     "x_limit_median": median / threads})  # fmt: skip
        ceiling = _pair(best / threads, median / threads)
        print(
            f"{backend:<10} {threads:>7} {'bare':>8} {'':>7} {_pair(best, median):>13} "
            f"{'':>9} {ceiling:>13}  (the limit's decodes shared out over {threads} threads: "
            "the machine's own scaling, and the most x limit a pass can reach here)",
            flush=True,
        )
    print_pass_goals(mixle_rows, {b: (x / threads, m / threads) for b, (x, m) in bare.items()})
    return rows


def _pair(best: float, median: float) -> str:
    return f"{best:.2f} ({median:.2f})"


def _print_pass_row(backend: str, contender: str, r: dict[str, Any]) -> None:
    def num(key: str, spec: str) -> str:
        return "-" if r.get(key) is None else format(r[key], spec)

    tstore = "-" if r["x_tstore"] is None else _pair(r["x_tstore"], r["x_tstore_median"])

    print(
        f"{backend:<10} {contender:<27} {r['rate']:>10.0f} {r['rate_median']:>7.0f} "
        f"{r['x_naive']:>8.2f} {tstore:>13} "
        f"{_pair(r['x_limit'], r['x_limit_median']):>13} {num('decodes', '.0f'):>8} "
        f"{num('misses', '.0f'):>7} {r['distinct']:>8.0f} {num('x_distinct_worst', '.2f'):>6} "
        f"{num('read_ms', '.0f'):>8} "
        f"{num('decode_ms', '.0f'):>9} {num('scatter_ms', '.0f'):>10} {r['same']!s:>5}",
        flush=True,
    )


def print_pass_goals(
    mixle_rows: dict[str, dict[str, Any]], ceilings: dict[str, tuple[float, float]]
) -> None:
    """One line per goal of the pass table's Loader row, met or not; a limit goal's line
    also says what the bare decodes reach against the limit (``ceilings``: best, median),
    since the limit divides one thread's time by the threads as if they scaled perfectly."""
    print(
        "  x naive: best pass over best; x tstore: best over best (median over median); "
        "x limit: the best limit over the best pass, per distinct chunk (the median of "
        "the passes' own ratios)"
    )
    print(
        "  worst: the most decodes per distinct chunk of any pass (misses may exceed "
        "decodes: a miss on a chunk another thread is decoding waits for it)"
    )

    def verdict(ok: bool) -> str:
        return " -- met" if ok else " -- NOT met"

    for backend, goal in PASS_GOAL_LIMIT.items():
        r = mixle_rows.get(backend)
        if r is not None:
            best, median = ceilings[backend]
            print(f"goal ({backend}): mixle >= {goal:g}x limit: {r['x_limit']:.3f}"
                  f" (median {r['x_limit_median']:.3f})" + verdict(r["x_limit"] >= goal)
                  + f"; the bare decodes on these threads reach {best:.3f} (median "
                  f"{median:.3f})")  # fmt: skip
    zarr_row = mixle_rows.get("zarr zstd")
    if zarr_row is not None and zarr_row.get("x_tstore") is not None:
        x = zarr_row["x_tstore"]
        print(f"goal (zarr zstd): mixle >= {PASS_GOAL_TSTORE:g}x tensorstore at an equal "
              f"cache budget: {x:.3f} (median passes: {zarr_row['x_tstore_median']:.3f})"
              + verdict(x >= PASS_GOAL_TSTORE))  # fmt: skip
    for backend, r in mixle_rows.items():
        worst = r["x_distinct_worst"]
        print(
            f"goal ({backend}): mixle decodes within {PASS_GOAL_DECODES - 1:.0%} of the "
            f"distinct chunks: worst pass {worst:.3f}x" + verdict(worst <= PASS_GOAL_DECODES)
        )


# -- the tables ------------------------------------------------------------------------------
METHODS = {
    "zarr zstd": [
        "naive",
        "tensorstore",
        "tensorstore, no cache",
        "per-index",
        "batched",
        "batched, no cache",
        "batched, 384 MiB cache",
        "locality",
    ],
    "hdf5 gzip": ["naive", "per-index", "batched", "batched, no cache"],
    "hdf5 raw": ["naive", "naive, no stack", "per-index", "batched"],
    "memmap": ["naive", "naive, no stack", "per-index", "batched"],
}
FORMATS = ("tiff", "nii", "nii.gz", "n5", "b2nd")
#: ``--only`` names for a whole table.
GROUPS = {"cubes": tuple(METHODS), "formats": FORMATS, "pass": ("pass",)}
#: The tables run when ``--only`` is not given (``pass`` runs only when named).
DEFAULT_GROUPS = ("cubes", "formats")
#: ``--quick``: a smoke run of every row at a tiny size.
QUICK = {
    "size": 64,
    "batches": 2,
    "format_size": 48,
    "format_patches": BATCH,
    "rounds": 2,
    "pass_patches": 2 * BATCH,
    "repeats": 2,
}


def cube_rows(folder: Path, size: int, batches: int, backends: list[str]) -> list[dict]:
    """The cube table (zarr, HDF5, memmap against naive slicing), printed as it runs."""
    from mixle.reading import decode_threads
    from mixle.utils.optional_deps import has

    t0 = time.perf_counter()
    write_volumes(folder, size)
    print(
        f"{size}^3 float32 ({size**3 * 4 / MIB:.0f} MiB), {CHUNK}^3 chunks, "
        f"random {PATCH}^3 patches, batch {BATCH}, {decode_threads()} decode threads, "
        f"cache {CACHE_BYTES // MIB} MiB (written in {time.perf_counter() - t0:.0f} s)"
    )
    rates = decode_rates(folder, size)
    touched = chunks_per_patch(size, 4096)
    limit = {k: decode_threads() * r / touched for k, r in rates.items()}
    for name, r in rates.items():
        print(
            f"  {name}: one thread decodes {r:.0f} chunks/s; {touched:.2f} chunks per "
            f"patch -> limit {limit[name]:.0f} patches/s"
        )
    direct, pipeline = zarr_reader_rates(folder)
    print(
        f"  zarr chunk read+decode, one thread: numcodecs direct {direct:.0f} chunks/s, "
        f"zarr codec pipeline {pipeline:.0f} chunks/s ({direct / pipeline:.2f}x)"
    )
    patch_mib = PATCH**3 * 4 / MIB
    print()
    print(
        f"{'backend':<10} {'method':<23} {'patches/s':>10} {'MiB/s':>8} {'x naive':>8} "
        f"{'x tstore':>9} {'x limit':>8} {'RSS MiB':>8} {'+RSS':>6}",
        flush=True,
    )
    rows = []
    for backend in backends:
        results: dict[str, dict] = {}
        for method in METHODS[backend]:
            if method.startswith("tensorstore") and not has("tensorstore"):
                print(f"{backend:<10} {method:<23} {'not installed':>10}")
                continue
            results[method] = r = run_isolated(folder, size, backend, method, batches)
            naive = results["naive"]["rate"]
            peer = "tensorstore, no cache" if method.endswith("no cache") else "tensorstore"
            ts_rate = results.get(peer, {}).get("rate")
            mine = not method.startswith(("tensorstore", "naive"))
            vs_ts = f"{r['rate'] / ts_rate:.2f}" if ts_rate and mine else "-"
            vs_limit = f"{r['rate'] / limit[backend]:.2f}" if backend in limit else "-"
            print(
                f"{backend:<10} {method:<23} {r['rate']:>10.0f} "
                f"{r['rate'] * patch_mib:>8.0f} {r['rate'] / naive:>8.2f} {vs_ts:>9} "
                f"{vs_limit:>8} {r['rss_peak'] / MIB:>8.0f} "
                f"{(r['rss_peak'] - r['rss_ready']) / MIB:>6.0f}",
                flush=True,
            )
            rows.append(
                {
                    "table": "cubes",
                    "backend": backend,
                    "method": method,
                    **r,
                    "x_naive": r["rate"] / naive,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512, help="cube edge (512: 512 MiB)")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per method")
    parser.add_argument(
        "--format-size", type=int, default=FORMAT_SIZE, help="formats' cube edge (256: 64 MiB)"
    )
    parser.add_argument(
        "--format-patches", type=int, default=FORMAT_PATCHES, help="patches per formats pass"
    )
    parser.add_argument(
        "--rounds", type=int, default=FORMAT_ROUNDS, help="interleaved rounds per format"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[*METHODS, *FORMATS, *GROUPS],
        help="backends and formats to measure, or a table: cubes, formats, pass "
        "(default: cubes and formats)",
    )
    parser.add_argument(
        "--pass-patches", type=int, default=PASS_PATCHES, help="patches per pass (pass table)"
    )
    parser.add_argument(
        "--repeats", type=int, default=PASS_REPEATS, help="passes per row (pass table)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run at a tiny size")
    parser.add_argument("--json", action="store_true", help="also print rows as JSON lines")
    parser.add_argument("--data-dir", help="keep the data files in this folder and reuse them")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--format-worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--pass-server", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pass_server:
        folder, size, backend, contender, threads, patches = args.pass_server
        pass_serve(Path(folder), int(size), backend, contender, int(threads), int(patches))
        return
    if args.worker:
        folder, size, backend, method, batches = args.worker
        print(json.dumps(measure(Path(folder), int(size), backend, method, int(batches))))
        return
    if args.format_worker:
        folder, name, size, patches, rounds = args.format_worker
        (fmt,) = write_formats(Path(folder), int(size), [name])  # written: opens only
        print(json.dumps(format_rows(fmt, int(size), int(patches), int(rounds))))
        return
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.format_size < PATCH:
        parser.error(f"--format-size={args.format_size} is smaller than a patch ({PATCH})")
    chosen = [n for name in args.only or DEFAULT_GROUPS for n in GROUPS.get(name, (name,))]
    backends = [b for b in METHODS if b in chosen]
    formats = [f for f in FORMATS if f in chosen]

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data_dir) if args.data_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if backends:
            cubes = folder / f"cubes-{args.size}"
            cubes.mkdir(exist_ok=True)
            rows += cube_rows(cubes, args.size, args.batches, backends)
        if formats:
            where = folder / f"formats-{args.format_size}"
            where.mkdir(exist_ok=True)
            # mixle's on-disk caches (a .nii.gz's inflated copy) live beside the data
            os.environ["MIXLE_CACHE_DIR"] = str(folder / "mixle-cache")
            t0 = time.perf_counter()
            stored = write_formats(where, args.format_size, formats)
            warm_page_cache(where)
            print(f"\nformats written in {time.perf_counter() - t0:.1f} s", flush=True)
            found = []
            for fmt in stored:  # each in a fresh process: no format's reads shape another's
                found += format_isolated(
                    where, fmt.name, args.format_size, args.format_patches, args.rounds
                )
            rows += found
            print_formats(found, stored, args.format_size, args.format_patches, args.rounds)
        if "pass" in chosen:
            cubes = folder / f"pass-{args.size}"
            cubes.mkdir(exist_ok=True)
            rows += pass_rows(cubes, args.size, args.pass_patches, args.repeats)
    if args.json:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
