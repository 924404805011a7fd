"""The demo's synthetic CT volume: generated slab by slab, written to zarr, HDF5 or raw.

The volume is int16 Hounsfield units: air around a body ellipsoid with a fat rim, lungs,
a spine, an aorta and a few contrast-enhanced organs, plus seeded noise. Every slab is a
pure function of ``(shape, seed, z)``, so the written volume is the same whatever the
backend, and an exact position-weighted checksum of it is computed while it is written.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import numpy as np

from mixle.cli._demo_disk import WriteGuard, disk_full_error, is_disk_full, settle_zarr_writes
from mixle.data.sources.array_source import read_hdf5, read_memmap, read_zarr
from mixle.data.sources.arrays.base import ArraySource
from mixle.utils.optional_deps import HAS_H5PY, HAS_ZARR, require

__all__ = [
    "AXIAL_SLICE",
    "BACKENDS",
    "CORONAL_SLICE",
    "DTYPE",
    "MIN_SIZE",
    "WRITE_BACKENDS",
    "WrittenVolume",
    "checksum",
    "checksum_weights",
    "ct_slab",
    "resolve_backend",
    "write_volume",
]

#: The volume's dtype: CT intensities in Hounsfield units.
DTYPE = np.dtype(np.int16)
#: Backends the demo writes (``auto`` is resolved before this).
WRITE_BACKENDS = ("zarr", "hdf5", "memmap")
#: ``--backend`` choices; ``auto`` is zarr when installed, else memmap.
BACKENDS = ("auto", *WRITE_BACKENDS)
#: Smallest volume edge the demo writes.
MIN_SIZE = 8
#: Standard deviation of the scanner noise, in HU.
NOISE_HU = 12.0
#: Planes generated at once (bounds the memory a slab takes while it is generated).
PIECE_PLANES = 8
#: Voxels :func:`checksum` widens to uint64 at once.
CHECKSUM_BLOCK_ELEMENTS = 1 << 20

# (centre, radii) as fractions of the shape (z, y, x), and HU (contrast-enhanced organs)
_ORGANS = (
    ((0.28, 0.47, 0.32), (0.22, 0.22, 0.13), -850.0),  # right lung
    ((0.28, 0.47, 0.68), (0.22, 0.22, 0.13), -850.0),  # left lung
    ((0.40, 0.42, 0.56), (0.09, 0.10, 0.10), 120.0),  # heart
    ((0.62, 0.50, 0.33), (0.14, 0.16, 0.15), 110.0),  # liver
    ((0.68, 0.64, 0.30), (0.07, 0.05, 0.045), 180.0),  # kidney
    ((0.68, 0.64, 0.70), (0.07, 0.05, 0.045), 180.0),  # kidney
)
# (y, x, radius y, radius x, HU): tubes along z inside the body
_TUBES = (
    (0.62, 0.52, 0.025, 0.025, 250.0),  # aorta
    (0.76, 0.50, 0.050, 0.045, 700.0),  # spine
)
#: Where the demo's picture slices the volume (fractions along z and y): through the
#: liver, kidneys, aorta and spine.
AXIAL_SLICE, CORONAL_SLICE = 0.68, 0.62


def resolve_backend(backend: str) -> str:
    """Turn ``auto`` into zarr (when installed) or memmap; check the others are usable.

    Raises
    ------
    ValueError
        ``backend`` is not one of :data:`BACKENDS`.
    ImportError
        zarr or h5py was asked for and is not installed (the message names the extra).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "zarr" if HAS_ZARR else "memmap"
    if backend == "zarr" and not HAS_ZARR:
        raise ImportError('backend="zarr" needs zarr: pip install -e ".[zarr]"')
    if backend == "hdf5" and not HAS_H5PY:
        raise ImportError('backend="hdf5" needs h5py: pip install -e ".[hdf5]"')
    return backend


def _inside(
    zz: np.ndarray,
    yy: np.ndarray,
    xx: np.ndarray,
    centre: tuple[float, ...],
    radii: tuple[float, ...],
) -> np.ndarray:
    distance = sum(((g - c) / r) ** 2 for g, c, r in zip((zz, yy, xx), centre, radii))
    return np.asarray(distance < 1.0)


def ct_slab(shape: tuple[int, int, int], z0: int, z1: int, seed: int = 0) -> np.ndarray:
    """Planes ``z0:z1`` of the synthetic CT volume of ``shape``, int16 HU.

    Parameters
    ----------
    shape
        ``(depth, height, width)`` of the whole volume.
    z0, z1
        The planes to generate, ``0 <= z0 < z1 <= depth``.
    seed
        Seed of the noise; plane ``z`` depends only on ``(shape, seed, z)``.

    Returns
    -------
    numpy.ndarray
        ``(z1 - z0, height, width)`` int16.
    """
    depth, height, width = shape
    out = np.empty((z1 - z0, height, width), dtype=DTYPE)
    yy = ((np.arange(height, dtype=np.float32) + 0.5) / height)[None, :, None]
    xx = ((np.arange(width, dtype=np.float32) + 0.5) / width)[None, None, :]
    tubes = [
        (((yy - y) / ry) ** 2 + ((xx - x) / rx) ** 2 < 1.0, value) for y, x, ry, rx, value in _TUBES
    ]
    for p0 in range(z0, z1, PIECE_PLANES):  # a few planes at a time: little memory
        p1 = min(z1, p0 + PIECE_PLANES)
        zz = ((np.arange(p0, p1, dtype=np.float32) + 0.5) / depth)[:, None, None]
        hu = np.full((p1 - p0, height, width), -1000.0, dtype=np.float32)  # air
        body = _inside(zz, yy, xx, (0.5, 0.5, 0.5), (0.48, 0.36, 0.44))
        hu[body] = -100.0  # fat
        hu[_inside(zz, yy, xx, (0.5, 0.5, 0.5), (0.46, 0.33, 0.41))] = 40.0  # soft tissue
        for centre, radii, value in _ORGANS:
            hu[_inside(zz, yy, xx, centre, radii)] = value
        for tube, value in tubes:
            hu[np.broadcast_to(tube, hu.shape) & body] = value
        for k, z in enumerate(range(p0, p1)):
            rng = np.random.default_rng([seed % 2**64, z])
            hu[k] += rng.standard_normal((height, width), dtype=np.float32) * np.float32(NOISE_HU)
        np.rint(hu, out=hu)
        out[p0 - z0 : p1 - z0] = hu
    return out


def checksum_weights(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, ...]:
    """One uint64 weight per position on each axis, for :func:`checksum`."""
    rng = np.random.default_rng([seed % 2**64, 0xC5])
    return tuple(rng.integers(0, 2**63, size=n, dtype=np.uint64) * 2 + 1 for n in shape)


def checksum(block: np.ndarray, weights: tuple[np.ndarray, ...]) -> int:
    """Sum of ``value * w0[z] * w1[y] * w2[x]`` over a 3-D block, modulo 2**64.

    ``weights`` are the axis weights sliced to the block's position, so the checksums of
    blocks that partition a volume add up (modulo 2**64) to the volume's checksum, and a
    value read from the wrong place changes it.
    """
    plane = max(1, block[:1].size)
    step = max(1, CHECKSUM_BLOCK_ELEMENTS // plane)  # bounds the uint64 copy's size
    total = np.zeros((), dtype=np.uint64)
    for z0 in range(0, block.shape[0], step):
        values = block[z0 : z0 + step].astype(np.int64).view(np.uint64)
        # contract x, then y, then z; uint64 arithmetic wraps modulo 2**64
        per_plane = np.einsum("zyx,y,x->z", values, weights[1], weights[2])
        total += np.einsum("z,z->", per_plane, weights[0][z0 : z0 + step])
    return int(total)


#: Signals :func:`_deferred_interrupt` holds: Ctrl-C, and the ``kill`` that ``mixle demo``
#: turns into an exception to clean up.
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends.

    zarr writes chunks on its own event-loop thread; interrupting the call that waits for
    them would leave that thread writing into a folder being removed (and recreating it).
    In the main thread, a SIGINT or SIGTERM received inside the block is delivered to the
    handler it would have reached (the first of each kind) when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: dict[int, FrameType | None] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        received.setdefault(signum, frame)

    previous = {signum: signal.signal(signum, hold) for signum in DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum, frame in received.items():
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_IGN:
                continue
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:  # the default action (SIGTERM: end the process), now the block is over
                signal.raise_signal(signum)


@dataclass(frozen=True)
class WrittenVolume:
    """A volume the demo wrote: where, how, and the checksum of what it holds."""

    source: ArraySource
    path: Path
    backend: str
    chunks: tuple[int, ...]
    checksum: int


#: The file (or folder) each backend writes inside the demo's folder.
_FILE_NAMES = {"zarr": "volume.zarr", "hdf5": "volume.h5", "memmap": "volume.raw"}
#: ``generate(z0, z1)``: planes ``z0:z1`` of the volume (and adds them to its checksum).
Generate = Callable[[int, int], np.ndarray]


def _write_zarr(
    path: Path,
    shape: tuple[int, int, int],
    chunks: tuple[int, ...],
    generate: Generate,
    on_slab: Callable[[int], None] | None,
) -> None:
    zarr = require("zarr", feature="mixle demo --backend zarr")
    try:
        arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=DTYPE, fill_value=0)
        for z0, z1 in _slabs(shape[0], chunks[0]):
            slab = generate(z0, z1)
            with _deferred_interrupt():
                arr[z0:z1] = slab
            if on_slab is not None:
                on_slab(z1 - z0)
    except OSError:
        settle_zarr_writes()  # the slab's other chunks may still be writing
        raise


def _write_hdf5(
    path: Path,
    shape: tuple[int, int, int],
    chunks: tuple[int, ...],
    generate: Generate,
    on_slab: Callable[[int], None] | None,
) -> None:
    h5py = require("h5py", feature="mixle demo --backend hdf5")
    with open(path, "w+b", buffering=0) as raw:
        guard = WriteGuard(raw)  # a full disk must not leave HDF5 unable to close the file
        with h5py.File(guard, "w") as f:
            ds = f.create_dataset(
                "ct",
                shape=shape,
                dtype=DTYPE,
                chunks=chunks,
                compression="gzip",
                compression_opts=1,
                shuffle=True,
            )
            for z0, z1 in _slabs(shape[0], chunks[0]):
                if guard.error is not None:
                    break
                ds[z0:z1] = generate(z0, z1)
                if on_slab is not None:
                    on_slab(z1 - z0)
        if guard.error is not None:
            raise guard.error


def _write_raw(
    path: Path,
    shape: tuple[int, int, int],
    chunks: tuple[int, ...],
    generate: Generate,
    on_slab: Callable[[int], None] | None,
) -> None:
    with open(path, "wb") as fh:
        for z0, z1 in _slabs(shape[0], chunks[0]):
            fh.write(generate(z0, z1).tobytes())
            if on_slab is not None:
                on_slab(z1 - z0)


def _slabs(depth: int, step: int) -> list[tuple[int, int]]:
    return [(z0, min(depth, z0 + step)) for z0 in range(0, depth, step)]


def write_volume(
    folder: Path,
    shape: tuple[int, int, int],
    backend: str,
    *,
    chunk: int = 64,
    seed: int = 0,
    on_slab: Callable[[int], None] | None = None,
) -> WrittenVolume:
    """Write the synthetic CT volume slab by slab into ``folder`` and open it read-only.

    Parameters
    ----------
    folder
        An existing directory; the volume is written as ``volume.zarr``, ``volume.h5`` or
        ``volume.raw`` inside it.
    shape
        ``(depth, height, width)``.
    backend
        ``"zarr"`` (zstd chunks), ``"hdf5"`` (gzip chunks, via h5py) or ``"memmap"`` (raw
        C-order bytes).
    chunk
        Edge of the stored chunks (clipped to the shape); also the slab depth.
    seed
        Seed of the noise.
    on_slab
        Called with the number of planes after each slab is written (a progress bar).

    Returns
    -------
    WrittenVolume

    Raises
    ------
    ValueError
        ``backend`` is not one of :data:`WRITE_BACKENDS`.
    ImportError
        The backend's optional dependency is not installed (the message names the extra).
    DiskFullError
        The disk (or the quota, or the file-size limit) filled up while writing; every
        write has ended, so ``folder`` can be removed (:mod:`mixle.cli._demo_disk`).
    """
    if backend not in WRITE_BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(WRITE_BACKENDS)}")
    chunks = tuple(min(chunk, s) for s in shape)
    weights = checksum_weights(shape, seed)
    total = 0

    def generate(z0: int, z1: int) -> np.ndarray:
        nonlocal total
        slab = ct_slab(shape, z0, z1, seed)
        total = (total + checksum(slab, (weights[0][z0:z1], *weights[1:]))) % 2**64
        return slab

    writers = {"zarr": _write_zarr, "hdf5": _write_hdf5, "memmap": _write_raw}
    path = folder / _FILE_NAMES[backend]
    try:
        writers[backend](path, shape, chunks, generate, on_slab)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full_error(path, exc) from None
    if backend == "zarr":
        source: ArraySource = read_zarr(path)
    elif backend == "hdf5":
        source = read_hdf5(path, "ct")
    else:
        source = read_memmap(path, DTYPE, shape)
    return WrittenVolume(source, path, backend, chunks, total)
