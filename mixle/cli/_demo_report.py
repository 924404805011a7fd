"""What ``mixle demo`` prints and draws: the table of runs, the facts under it, the picture."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mixle.cli._demo_runs import MIB, RunStats
from mixle.cli._demo_volume import AXIAL_SLICE, CORONAL_SLICE
from mixle.data.sampling.grid import GridSampler
from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.inspection.formatting import count_text, format_bytes, shape_text
from mixle.utils.optional_deps import require

__all__ = [
    "DEFAULT_PNG",
    "PICTURE_CLIP",
    "PICTURE_PATCHES",
    "REPORT_WIDTH",
    "format_table",
    "layout_text",
    "mib_text",
    "report_lines",
    "save_picture",
]

#: The picture's file name in the current directory, unless ``--png`` says otherwise.
DEFAULT_PNG = "mixle-demo.png"
#: Footprints drawn over the axial slice, and the intensity percentiles the slices show.
PICTURE_PATCHES = 60
PICTURE_CLIP = (0.5, 99.9)
#: Width the sentences under the table are wrapped to.
REPORT_WIDTH = 88


def mib_text(mib: float) -> str:
    """A size given in MiB as text in binary units (``"256 MiB"``, ``"512 KiB"``)."""
    return format_bytes(mib * MIB)


def layout_text(backend: str, chunks: tuple[int, ...]) -> str:
    """How the demo volume is laid out on disk: ``"chunks (64, 64, 64)"``, ``"unchunked (raw)"``.

    A memmap volume is one raw file with no chunks (``chunks`` is then only the slab depth
    it was written in).
    """
    return "unchunked (raw)" if backend == "memmap" else f"chunks {shape_text(chunks)}"


def format_table(runs: list[RunStats]) -> list[str]:
    """An aligned table, one row per run: patches/s, MiB/s, batches, cache hit rate, RSS.

    The hit rate is ``-`` for a run that never looked in the chunk cache (memmaps copy
    straight from the file).
    """
    header = ("run", "patches", "batches", "patches/s", "MiB/s", "cache hits", "peak RSS MiB")
    rows = [
        (
            r.name,
            f"{r.patches}",
            f"{r.batches}",
            f"{r.patches_per_s:.0f}",
            f"{r.mib_per_s:.1f}",
            f"{100 * r.hit_rate:.0f}%" if r.cache_hits + r.cache_misses else "-",
            "?" if r.peak_rss_mib is None else f"{r.peak_rss_mib:.0f}",
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return "  ".join((first, *rest))

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def report_lines(
    runs: list[RunStats], *, volume_mib: float, cache_mib: float, backend: str, jax_note: str = ""
) -> list[str]:
    """The facts under the table: the grid's exactness, the JAX step, peak RSS.

    Parameters
    ----------
    runs
        The runs, as in the table.
    volume_mib, cache_mib
        The volume's size and the chunk cache budget.
    backend
        The backend read (memmap RSS counts mapped file pages: said so).
    jax_note
        Printed when there is no ``jax`` run (why not).
    """
    by_name = {r.name: r for r in runs}
    lines = []
    if "grid" in by_name:
        grid = by_name["grid"]
        verdict = "equals" if grid.facts["checksum_ok"] else "DIFFERS FROM"
        tiles = int(grid.facts["tiles"])
        lines.extend(
            textwrap.wrap(
                f"grid: {count_text(tiles, 'tile')} {'covers' if tiles == 1 else 'cover'} the "
                f"volume; {'its' if tiles == 1 else 'their'} voxel checksum "
                f"{verdict} the written volume's (the grid row's time includes computing it "
                "for every tile)",
                REPORT_WIDTH,
                subsequent_indent="  ",
            )
        )
    if "jax" in by_name:
        jax = by_name["jax"]
        lines.append(
            f"jax: {jax.batches_per_s:.1f} device batches/s on {jax.facts['device']} into a "
            f"jitted step (compiled in {jax.facts['compile_s']:.1f} s);"
        )
        lines.append(f"  mean patch intensity on the device: {jax.facts['mean_hu']:.1f} HU")
    elif jax_note:
        lines.append(f"jax: {jax_note}")
    peaks = [r.peak_rss_mib for r in runs if r.name != "jax" and r.peak_rss_mib is not None]
    if peaks:
        line = f"peak RSS {mib_text(max(peaks))} for a {mib_text(volume_mib)} volume"
        if backend == "memmap":
            line += (
                " (a memmap's RSS counts the file pages it touched: page cache the kernel can "
                "reclaim, not memory mixle allocated)"
            )
        elif cache_mib == 0:
            line += (
                ": a batch decodes the chunks its patches touch, and with the chunk cache off "
                "none is kept after the batch"
            )
        elif cache_mib < volume_mib:
            line += (
                f": a batch decodes the chunks its patches touch, and at most {cache_mib:.0f} MiB "
                "of decoded chunks are kept; the volume is never held in memory whole"
            )
        else:
            line += f" (the {cache_mib:.0f} MiB chunk cache holds all of it)"
        lines.extend(textwrap.wrap(line, REPORT_WIDTH, subsequent_indent="  "))
        jax_rss = by_name["jax"].peak_rss_mib if "jax" in by_name else None
        if jax_rss is not None:
            lines.append(f"  (with the JAX runtime loaded: {jax_rss:.0f} MiB)")
    return lines


def save_picture(png: Path, sampler: PatchSampler, grid: GridSampler) -> None:
    """Draw the random patches over an axial slice and the grid over a coronal one.

    Raises
    ------
    ImportError
        matplotlib is not installed (names the ``plot`` extra).
    """
    require("matplotlib", feature="mixle demo's picture")
    from matplotlib.figure import Figure

    from mixle.plot import plot_sampler

    fig = Figure(figsize=(12, 6.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    size = sampler.source.shape[0]
    plot_sampler(
        sampler,
        axis=0,
        index=round(AXIAL_SLICE * (size - 1)),
        ax=left,
        axis_names="zyx",
        max_patches=PICTURE_PATCHES,
        clip=PICTURE_CLIP,
        linewidth=1.5,
    )
    plot_sampler(
        grid,
        axis=1,
        index=round(CORONAL_SLICE * (size - 1)),
        ax=right,
        axis_names="zyx",
        color="tab:cyan",
        linewidth=0.6,
        clip=PICTURE_CLIP,
    )
    fig.suptitle(
        f"mixle demo: random {'x'.join(map(str, sampler.patch_size))} patches (left) and "
        f"the {len(grid)} grid tiles (right) over a synthetic CT volume"
    )
    fig.savefig(png, dpi=100)
