"""The demo's measured runs: random patches, grid tiles and JAX batches, through the Loader.

Each run reads through :class:`mixle.Loader`, shows a progress bar while it runs, and
returns a :class:`RunStats` with its throughput, the decoded-chunk cache's hits and misses
during the run, and the process's peak RSS after it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mixle.cli._demo_volume import checksum
from mixle.data.sampling.grid import GridSampler
from mixle.data.sampling.patch_sampler import PatchSampler
from mixle.loading import Loader
from mixle.reading import chunk_cache
from mixle.utils.optional_deps import require
from mixle.utils.progress import progress_bar

__all__ = ["MIB", "RunStats", "peak_rss_mib", "run_grid", "run_jax", "run_random"]

MIB = 2**20


def peak_rss_mib() -> float | None:
    """The process's peak resident memory so far, in MiB (``None`` where unknown)."""
    try:
        import resource  # Unix only
    except ImportError:
        return None
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / MIB


@dataclass(frozen=True)
class RunStats:
    """What one run read and how fast.

    Attributes
    ----------
    name
        ``"random"``, ``"grid"`` or ``"jax"``.
    patches, batches
        Patches (rows) and batches the loop received.
    nbytes
        Bytes of patch data received.
    seconds
        Wall time of the loop.
    cache_hits, cache_misses
        Decoded-chunk cache lookups during the run.
    peak_rss_mib
        The process's peak RSS after the run (``None`` where unknown).
    facts
        Run-specific results (``"checksum_ok"`` for grid, ``"mean_hu"`` for jax...).
    """

    name: str
    patches: int
    batches: int
    nbytes: int
    seconds: float
    cache_hits: int
    cache_misses: int
    peak_rss_mib: float | None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def patches_per_s(self) -> float:
        """Patches per second."""
        return self.patches / max(self.seconds, 1e-9)

    @property
    def batches_per_s(self) -> float:
        """Batches per second."""
        return self.batches / max(self.seconds, 1e-9)

    @property
    def mib_per_s(self) -> float:
        """MiB of patch data per second."""
        return self.nbytes / MIB / max(self.seconds, 1e-9)

    @property
    def hit_rate(self) -> float:
        """Cache hits over lookups during the run (0.0 when there were none)."""
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0


class _Meter:
    """Counts what a loop receives; times it and diffs the cache counters from creation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.patches = self.batches = self.nbytes = 0
        self._before = chunk_cache().stats()
        self._start = time.perf_counter()

    def add(self, rows: int, nbytes: int) -> None:
        self.patches += rows
        self.batches += 1
        self.nbytes += nbytes

    def finish(self, facts: dict[str, Any]) -> RunStats:
        seconds = time.perf_counter() - self._start
        after = chunk_cache().stats()
        return RunStats(
            self.name,
            self.patches,
            self.batches,
            self.nbytes,
            seconds,
            max(0, after.hits - self._before.hits),
            max(0, after.misses - self._before.misses),
            peak_rss_mib(),
            facts,
        )


def run_random(
    sampler: PatchSampler, batch_size: int, *, seed: int = 0, progress: bool | None = None
) -> RunStats:
    """Read every patch of ``sampler`` through a shuffling :class:`~mixle.Loader`.

    Parameters
    ----------
    sampler
        The patches to read.
    batch_size
        Patches per batch.
    seed
        The Loader's shuffle seed.
    progress
        Show a progress bar (``None``: automatic, see :mod:`mixle.utils.progress`).

    Returns
    -------
    RunStats
    """
    loader = Loader(sampler, batch_size, shuffle=True, seed=seed)
    with progress_bar(len(loader), "random patches", "batch", progress) as bar, loader:
        meter = _Meter("random")
        for patches, _coords in loader:
            meter.add(len(patches), patches.nbytes)
            bar.update(1)
        return meter.finish({})


def _owned(starts: np.ndarray, patch: int) -> dict[int, tuple[int, int]]:
    """For each tile start on one axis, the part of the axis only that tile counts."""
    owned = {}
    previous_end = 0
    for start in starts.tolist():
        owned[start] = (max(start, previous_end), start + patch)
        previous_end = start + patch
    return owned


def run_grid(
    grid: GridSampler,
    batch_size: int,
    *,
    weights: tuple[np.ndarray, ...],
    expected_checksum: int,
    progress: bool | None = None,
) -> RunStats:
    """Read every tile of ``grid`` through a :class:`~mixle.Loader` and check the volume.

    Every voxel is counted once (overlapping parts of tiles by the first tile only) in a
    position-weighted checksum (:func:`mixle.cli._demo_volume.checksum`); the run's
    ``facts["checksum_ok"]`` says whether it equals ``expected_checksum``, the checksum of
    what was written: the tiles cover the volume exactly, every voxel in its place.

    Parameters
    ----------
    grid
        A 3-D grid over the volume.
    batch_size
        Tiles per batch.
    weights
        The volume's checksum weights (:func:`mixle.cli._demo_volume.checksum_weights`).
    expected_checksum
        The checksum of the written volume.
    progress
        Show a progress bar (``None``: automatic).

    Returns
    -------
    RunStats
    """
    loader = Loader(grid, batch_size, shuffle=False)
    owned = [_owned(s, p) for s, p in zip(grid.starts, grid.patch_size)]
    total = 0
    with progress_bar(len(loader), "grid tiles", "batch", progress) as bar, loader:
        meter = _Meter("grid")
        for tiles, corners in loader:
            for tile, corner in zip(tiles, corners.tolist()):
                spans = [axis[c] for axis, c in zip(owned, corner)]
                block = tile[tuple(slice(lo - c, hi - c) for (lo, hi), c in zip(spans, corner))]
                w = tuple(axis_w[lo:hi] for axis_w, (lo, hi) in zip(weights, spans))
                total = (total + checksum(block, w)) % 2**64
            meter.add(len(tiles), tiles.nbytes)
            bar.update(1)
        return meter.finish({"tiles": len(grid), "checksum_ok": total == expected_checksum})


def run_jax(
    sampler: PatchSampler, batch_size: int, *, seed: int = 0, progress: bool | None = None
) -> RunStats:
    """Feed ``sampler``'s patches to a jitted reduction with :class:`mixle.jax.JaxLoader`.

    The step (compiled before the loop from the loader's element spec) adds up the mean
    intensity of the real rows of each padded batch; ``facts`` holds the device, the
    mean HU over all patches and the compile time (not part of ``seconds``).

    Raises
    ------
    ImportError
        JAX is not installed (the message names the ``jax`` extra).
    """
    jax = require("jax", feature="mixle demo's JAX run")
    jnp = jax.numpy
    from mixle.jax import JaxLoader

    loader = JaxLoader(sampler, batch_size, shuffle=True, seed=seed, drop_last="pad")

    def step(total: Any, batch: Any) -> Any:
        patches, _coords, mask = batch
        per_patch = patches.astype(jnp.float32).mean(axis=tuple(range(1, patches.ndim)))
        return total + jnp.where(mask, per_patch, 0.0).sum()

    t0 = time.perf_counter()
    zero = jnp.zeros((), jnp.float32)
    compiled = jax.jit(step).lower(zero, loader.element_spec()).compile()
    facts: dict[str, Any] = {
        "device": str(jax.devices()[0]),
        "compile_s": time.perf_counter() - t0,
    }
    with progress_bar(len(loader), "jax batches", "batch", progress) as bar, loader:
        meter = _Meter("jax")
        total = zero
        for batch in loader:
            total = compiled(total, batch)
            rows = int(batch[0].shape[0])
            real = min(rows, len(sampler) - meter.patches)  # the last batch is padded
            meter.add(real, int(batch[0].nbytes) * real // max(rows, 1))
            bar.update(1)
        facts["mean_hu"] = float(jax.block_until_ready(total)) / max(len(sampler), 1)
        return meter.finish(facts)
