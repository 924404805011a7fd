"""``mixle demo``: write a synthetic CT volume, read patches from it, report what happened.

The demo writes a CT-like int16 volume slab by slab to a temporary folder (zarr, HDF5 or a
raw memmap), then reads it through :class:`mixle.Loader` in three runs: seeded random
patches (shuffled), every tile of a grid (checked voxel for voxel against what was
written) and, with JAX installed, batches on the device through
:class:`mixle.jax.JaxLoader` into a jitted reduction. It prints a table of throughput,
cache hit rate and peak memory, draws the patch locations over slices of the volume
(:mod:`mixle.plot`), and removes the folder, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from mixle.cli._demo_options import check_options, choose_png
from mixle.cli._demo_report import (
    DEFAULT_PNG,
    format_table,
    layout_text,
    mib_text,
    report_lines,
    save_picture,
)
from mixle.cli._demo_runs import MIB, RunStats, peak_rss_mib, run_grid, run_jax, run_random
from mixle.cli._demo_volume import (
    BACKENDS,
    DTYPE,
    MIN_SIZE,
    checksum_weights,
    resolve_backend,
    write_volume,
)
from mixle.data.sampling.grid import GridSampler
from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.reading import chunk_cache, default_chunk_cache_bytes, set_chunk_cache_bytes
from mixle.reading.pool import decode_threads
from mixle.utils.optional_deps import HAS_JAX, HAS_MATPLOTLIB
from mixle.utils.progress import progress_bar

__all__ = ["BACKENDS", "DEFAULT_PNG", "DemoResult", "register", "resolve_backend", "run_demo"]

#: Defaults of :func:`run_demo` and the command line: a 256 MiB volume, 2048 patches of
#: 32^3 in batches of 32, a 64 MiB chunk cache (a quarter of the volume).
DEFAULT_SIZE = 512
DEFAULT_PATCH = 32
DEFAULT_BATCH_SIZE = 32
DEFAULT_NUM_PATCHES = 2048
DEFAULT_CACHE_MIB = 64
#: Edge of the stored chunks (and of the slabs the volume is written in).
CHUNK = 64


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` did and measured.

    Attributes
    ----------
    backend
        The backend written (``auto`` resolved).
    shape, chunks
        The volume's shape and stored chunk shape.
    volume_mib, disk_mib
        Size of the volume in memory and of what was written to disk.
    write_seconds
        Time taken to write it.
    folder
        The temporary folder it was written to (removed unless ``kept``).
    kept
        Whether the folder was kept.
    decode_threads, cache_mib
        Decode threads and the chunk cache budget during the runs.
    runs
        One :class:`~mixle.cli._demo_runs.RunStats` per run: ``random``, ``grid`` and,
        when JAX ran, ``jax``.
    peak_rss_mib
        The process's peak RSS at the end (``None`` where unknown).
    png
        Where the picture was written, or ``None``.
    """

    backend: str
    shape: tuple[int, int, int]
    chunks: tuple[int, ...]
    volume_mib: float
    disk_mib: float
    write_seconds: float
    folder: Path
    kept: bool
    decode_threads: int
    cache_mib: int
    runs: tuple[RunStats, ...]
    peak_rss_mib: float | None
    png: Path | None

    def run(self, name: str) -> RunStats:
        """The run called ``name``.

        Raises
        ------
        KeyError
            No run of that name (``jax`` when JAX did not run).
        """
        for stats in self.runs:
            if stats.name == name:
                return stats
        raise KeyError(f"no run named {name!r}; ran {[r.name for r in self.runs]}")


def _check_ints(**values: tuple[object, int]) -> None:
    for name, (value, low) in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}")


def _disk_mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / MIB


def run_demo(
    *,
    size: int = DEFAULT_SIZE,
    backend: str = "auto",
    patch: int = DEFAULT_PATCH,
    batch_size: int = DEFAULT_BATCH_SIZE,
    num_patches: int = DEFAULT_NUM_PATCHES,
    seed: int = 0,
    png: str | os.PathLike[str] | None = None,
    overwrite_png: bool = False,
    use_jax: bool | None = None,
    keep: bool = False,
    cache_mib: int = DEFAULT_CACHE_MIB,
    progress: bool | None = None,
    out: TextIO | None = None,
) -> DemoResult:
    """Run the demo, printing a report to ``out`` (default stdout); returns the numbers.

    Parameters
    ----------
    size
        Edge of the cubic int16 volume (``2 * size**3`` bytes before compression).
    backend
        ``"auto"`` (zarr when installed, else memmap), ``"zarr"``, ``"hdf5"`` or
        ``"memmap"``.
    patch
        Edge of the random patches and of the grid tiles, ``1 <= patch <= size``.
    batch_size
        Patches per batch.
    num_patches
        Random patches to read (the JAX run reads as many).
    seed
        Seed of the volume's noise, the patch corners and the shuffles.
    png
        Where to write the picture (needs matplotlib); ``None``: no picture.
    overwrite_png
        Replace ``png`` if it exists; otherwise an existing ``png`` is an error.
    use_jax
        Feed batches to JAX; ``None``: when JAX is installed.
    keep
        Keep the temporary folder (its path is printed) instead of removing it.
    cache_mib
        Budget of the decoded-chunk cache during the demo; afterwards the old budget is
        restored and the cache is left empty (its hit and miss counters keep counting).
    progress
        Progress bars on stderr: ``True``, ``False`` or ``None`` (automatic: on a terminal).
    out
        Where the report goes.

    Returns
    -------
    DemoResult

    Raises
    ------
    ValueError
        An argument is out of range, or ``backend`` is unknown.
    FileExistsError
        ``png`` exists and ``overwrite_png`` is false.
    ImportError
        The backend's package, matplotlib (for ``png``) or JAX (``use_jax=True``) is
        missing; the message names the extra.
    DiskFullError
        The disk (or quota, or file-size limit) filled up while the volume was written
        (:mod:`mixle.cli._demo_disk`; an ``OSError``); the folder is removed first.
    """
    backend = resolve_backend(backend)
    _check_ints(
        size=(size, MIN_SIZE),
        patch=(patch, 1),
        batch_size=(batch_size, 1),
        num_patches=(num_patches, 1),
        cache_mib=(cache_mib, 0),
    )
    if patch > size:
        raise ValueError(f"patch={patch} must be at most size={size}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed={seed!r} must be an int")
    png_path = None if png is None else Path(png)
    if png_path is not None:
        if not HAS_MATPLOTLIB:
            raise ImportError('png= needs matplotlib: pip install -e ".[plot]"')
        if png_path.exists() and not overwrite_png:
            raise FileExistsError(f"png={str(png_path)!r} exists; pass overwrite_png=True")
    if use_jax and not HAS_JAX:
        raise ImportError('use_jax=True needs jax: pip install -e ".[jax]"')
    jax_run = HAS_JAX if use_jax is None else bool(use_jax)
    stream = sys.stdout if out is None else out

    def say(line: str = "") -> None:
        print(line, file=stream, flush=True)

    shape = (size, size, size)
    volume_mib = size**3 * DTYPE.itemsize / MIB
    # a budget equal to the default rule's is restored as the rule (None), not as a setting
    old_budget = chunk_cache().budget
    restore = None if old_budget == default_chunk_cache_bytes() else old_budget
    folder = Path(tempfile.mkdtemp(prefix="mixle-demo-"))
    runs: list[RunStats] = []
    written = None
    try:
        set_chunk_cache_bytes(cache_mib * MIB)
        say(f"writing a {size}^3 int16 CT-like volume ({mib_text(volume_mib)}) as {backend}")
        say(f"  to {folder}")
        t0 = time.perf_counter()
        with progress_bar(size, "writing volume", "plane", progress) as bar:
            volume = write_volume(
                folder, shape, backend, chunk=CHUNK, seed=seed, on_slab=bar.update
            )
        write_s = time.perf_counter() - t0
        disk = _disk_mib(volume.path)
        say(
            f"  {volume.path.name}: {mib_text(disk)} on disk, "
            f"{layout_text(volume.backend, volume.chunks)}, "
            f"{write_s:.1f} s"
        )
        say(f"reading with {decode_threads()} decode threads and a {cache_mib} MiB chunk cache")
        with volume.source as src:
            sampler = PatchSampler(src, patch, num_patches, seed=seed)
            runs.append(run_random(sampler, batch_size, seed=seed, progress=progress))
            grid = GridSampler(src, patch)
            weights = checksum_weights(shape, seed)
            runs.append(
                run_grid(
                    grid,
                    batch_size,
                    weights=weights,
                    expected_checksum=volume.checksum,
                    progress=progress,
                )
            )
            if jax_run:
                runs.append(run_jax(sampler, batch_size, seed=seed + 1, progress=progress))
            say()
            for line in format_table(runs):
                say("  " + line)
            say()
            if jax_run:
                jax_note = ""
            else:
                jax_note = (
                    "skipped (--no-jax)" if HAS_JAX else 'not installed (pip install -e ".[jax]")'
                )
            for line in report_lines(
                runs, volume_mib=volume_mib, cache_mib=cache_mib, backend=backend, jax_note=jax_note
            ):
                say(line)
            if png_path is not None:
                save_picture(png_path, sampler, grid)
                written = png_path
                say(f"picture of the patch locations: {png_path.resolve()}")
    finally:
        set_chunk_cache_bytes(0)  # drops the decoded chunks of a volume about to be removed
        set_chunk_cache_bytes(restore)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if keep:
        say(f"kept {folder}")
    elif folder.exists():
        say(f"could not remove {folder}: remove it by hand")
    else:
        say(f"removed {folder}")
    return DemoResult(
        backend=backend,
        shape=shape,
        chunks=volume.chunks,
        volume_mib=volume_mib,
        disk_mib=disk,
        write_seconds=write_s,
        folder=folder,
        kept=keep,
        decode_threads=decode_threads(),
        cache_mib=cache_mib,
        runs=tuple(runs),
        peak_rss_mib=peak_rss_mib(),
        png=written,
    )


# -- the command line ---------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    """Add ``mixle demo`` to the command line."""
    demo = sub.add_parser(
        "demo",
        help="write a synthetic CT volume, read patches from it, report and draw what happened",
        description=(
            "Write a synthetic CT-like volume to a temporary folder, read random patches, "
            "grid tiles and (with JAX) device batches from it through mixle.Loader, print "
            "throughput, cache hit rate and peak memory, draw the patch locations, and "
            "remove the folder."
        ),
    )
    add = demo.add_argument
    add(
        "--size",
        type=int,
        default=DEFAULT_SIZE,
        metavar="N",
        help=f"edge of the cubic int16 volume (default {DEFAULT_SIZE}: 256 MiB)",
    )
    add(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="storage to write: zarr (zstd), hdf5 (gzip), memmap (raw); auto: zarr if installed",
    )
    add(
        "--patch",
        type=int,
        default=DEFAULT_PATCH,
        metavar="N",
        help=f"edge of the patches and grid tiles (default {DEFAULT_PATCH})",
    )
    add(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"patches per batch (default {DEFAULT_BATCH_SIZE})",
    )
    add(
        "--num-patches",
        type=int,
        default=DEFAULT_NUM_PATCHES,
        metavar="N",
        help=f"random patches to read (default {DEFAULT_NUM_PATCHES})",
    )
    add("--seed", type=int, default=0, help="seed of the volume, the patches and the shuffles")
    add(
        "--cache-mib",
        type=int,
        default=DEFAULT_CACHE_MIB,
        metavar="MIB",
        help=f"decoded-chunk cache budget (default {DEFAULT_CACHE_MIB}; 0 turns it off)",
    )
    picture = demo.add_mutually_exclusive_group()
    picture.add_argument(
        "--png",
        metavar="PATH",
        help=f"write the picture here, replacing the file (default: ./{DEFAULT_PNG}, never "
        "replacing an existing file)",
    )
    picture.add_argument("--no-png", action="store_true", help="draw no picture")
    add("--no-jax", action="store_true", help="skip the JAX run even when JAX is installed")
    add("--keep", action="store_true", help="keep the temporary folder and print its path")
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    check_options(args, parser)
    png, note = choose_png(args, parser)
    if note:
        print(note, flush=True)
    run_demo(
        size=args.size,
        backend=args.backend,
        patch=args.patch,
        batch_size=args.batch_size,
        num_patches=args.num_patches,
        seed=args.seed,
        png=png,
        overwrite_png=args.png is not None,
        use_jax=False if args.no_jax else None,
        keep=args.keep,
        cache_mib=args.cache_mib,
    )
    return 0
