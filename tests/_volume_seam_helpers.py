"""Picklable helpers for the collection seam tests; light imports so workers start fast.

:func:`write_mixed` writes tiny volumes with zarr-python, h5py and NumPy and returns the
writers' own reads; :class:`OpenRecorder` wraps a sampler and logs, per process, every file
under a folder that the process opens (Python-level opens through an audit hook, files held
open by C libraries such as HDF5 through ``/proc/self/fd``).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Shapes of the mixed volumes (all hold a (4, 5, 3) patch).
SHAPES: tuple[tuple[int, int, int], ...] = (
    (12, 9, 7),
    (7, 13, 6),
    (9, 9, 9),
    (10, 6, 11),
    (8, 12, 5),
    (11, 7, 8),
    (6, 10, 9),
    (9, 11, 6),
)
#: The writer of volume ``i`` is ``BACKENDS[i % 3]``.
BACKENDS: tuple[str, ...] = ("zarr", "hdf5", "npy")
DATASET = "img"


def volume(shape: Sequence[int], seed: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=tuple(shape)).astype(dtype)


def write_mixed(
    root: str | Path, count: int = len(SHAPES), dtypes: Sequence[str] | None = None
) -> tuple[list[str], list[np.ndarray]]:
    """Write ``count`` volumes (zarr, HDF5, .npy in turn) under ``root``.

    Returns their paths and each volume as its writer reads it back whole.
    """
    import h5py
    import zarr

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    truth: list[np.ndarray] = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        dtype = "float32" if dtypes is None else dtypes[i % len(dtypes)]
        data = volume(shape, i, dtype)
        kind = BACKENDS[i % 3]
        if kind == "zarr":
            path = str(root / f"v{i}.zarr")
            z = zarr.create_array(path, shape=shape, chunks=(4, 4, 4), dtype=dtype)
            z[:] = data
            truth.append(zarr.open_array(path, mode="r")[...])
        elif kind == "hdf5":
            path = str(root / f"v{i}.h5")
            with h5py.File(path, "w") as f:
                f.create_dataset(DATASET, data=data, chunks=(3, 4, 3), compression="gzip")
            with h5py.File(path, "r") as f:
                truth.append(f[DATASET][...])
        else:
            path = str(root / f"v{i}.npy")
            np.save(path, data)
            truth.append(np.load(path))
        paths.append(path)
    return paths, truth


def check_batch(batch: dict[str, Any], truth: Sequence[np.ndarray], size: Sequence[int]) -> int:
    """Assert every patch of ``batch`` is NumPy slicing of its volume; returns the count."""
    patches = np.asarray(batch["patch"])
    coords = np.asarray(batch["coords"])
    vols = np.asarray(batch["volume"])
    assert patches.shape[0] == coords.shape[0] == vols.shape[0]
    for patch, corner, v in zip(patches, coords, vols):
        box = tuple(slice(c, c + p) for c, p in zip(corner.tolist(), size))
        want = truth[int(v)][box]
        assert want.shape == tuple(size), (int(v), corner, want.shape)
        np.testing.assert_array_equal(patch, want.astype(patch.dtype))
    return int(vols.shape[0])


# -- which volumes a process opens ---------------------------------------------------------
#: ``(folder prefix, log)`` pairs this process records opens under; one hook serves them all.
_ACTIVE: set[tuple[str, str]] = set()
_HOOKED = False


def _note(log: str, path: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()}\t{path}\n".encode())
    finally:
        os.close(fd)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not args or not _ACTIVE:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    elif isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        return
    path = os.path.abspath(path)
    for prefix, log in tuple(_ACTIVE):
        if path.startswith(prefix):
            _note(log, path)


def record_opens(root: str | Path, log: str | Path) -> None:
    """Log ``pid<TAB>path`` to ``log`` for every Python-level open under ``root`` here."""
    global _HOOKED
    _ACTIVE.add((os.path.abspath(root).rstrip(os.sep) + os.sep, os.path.abspath(log)))
    if not _HOOKED:  # an audit hook cannot be removed: one for the process, idle when unused
        _HOOKED = True
        sys.addaudithook(_hook)


def stop_recording() -> None:
    """Stop every :func:`record_opens` of this process."""
    _ACTIVE.clear()


def open_files(root: str | Path) -> set[str]:
    """Paths under ``root`` this process holds open (``/proc/self/fd``; HDF5 opens in C)."""
    prefix = os.path.abspath(root).rstrip(os.sep) + os.sep
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            out.add(target)
    return out


def _scan_fds(root: str, log: str) -> None:
    for path in open_files(root):
        _note(log, path)


class OpenRecorder:
    """Wraps a sampler; once unpickled, logs ``pid<TAB>path`` for files it opens under ``root``.

    The wrapper is the data handed to a worker backend; in the process that built it
    nothing is logged (the hook is installed on unpickling only).
    """

    def __init__(self, data: Any, root: str | Path, log: str | Path) -> None:
        self.data = data
        self.root = os.path.abspath(root)
        self.log = os.path.abspath(log)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        record_opens(self.root, self.log)

    @property
    def structure(self) -> Any:
        """The sampler's own (how backends shard it)."""
        return getattr(self.data, "structure", None)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        out = self.data[index]
        _scan_fds(self.root, self.log)
        return out

    def get_batch(self, indices: Any) -> Any:
        out = self.data.get_batch(indices)
        _scan_fds(self.root, self.log)
        return out


def opened_volumes(log: str | Path, root: str | Path) -> dict[int, set[str]]:
    """``{pid: names of the volumes (entries right under root) that process opened}``."""
    root = Path(os.path.abspath(root))
    out: dict[int, set[str]] = {}
    path = Path(log)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        pid, _, name = line.partition("\t")
        out.setdefault(int(pid), set()).add(Path(name).relative_to(root).parts[0])
    return out


class VolumeOf:
    """``by(i)``: the volume of index ``i`` of ``sampler`` (index math; no patch is read).

    For ``partially_exchangeable(by)``: set ``by.sampler`` once the sampler exists.
    """

    sampler: Any = None

    def __call__(self, index: int) -> int:
        return int(self.sampler.volumes_array([index])[0])


def pid_of(shard: Any) -> int:
    return os.getpid()


def identity(shard: Any) -> Any:
    return shard


def patch_sums(shard: Any) -> list[float]:
    """Per-patch float64 sums of a stacked dict shard (a list when the shard is empty)."""
    if isinstance(shard, list):
        return []
    return [float(np.sum(p, dtype=np.float64)) for p in shard["patch"]]


def record_sums(records: list[Any]) -> np.ndarray:
    """An encoder: the float64 sum of each dict record's patch."""
    return np.array([float(np.sum(r["patch"], dtype=np.float64)) for r in records])


def batches_in_child(payload: bytes, batch_size: int, options: dict[str, Any]) -> list[Any]:
    """Run in a fresh process: unpickle a sampler and read its Loader's batches."""
    import mixle

    sampler = pickle.loads(payload)
    return list(mixle.Loader(sampler, batch_size, **options))
