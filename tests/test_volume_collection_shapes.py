"""``VolumeCollection.shapes()`` threads and the default ``max_open`` from the descriptor limit.

Volumes are written with NumPy, zarr-python and h5py and their shapes compared with those
libraries' own; descriptors are counted in ``/proc/self/fd``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mixle
from mixle.data.sources.collection import DEFAULT_MAX_OPEN
from mixle.data.sources.collection import volumes as volumes_module
from mixle.data.sources.collection.volumes import (
    MAX_DEFAULT_MAX_OPEN,
    MIN_DEFAULT_MAX_OPEN,
    default_max_open,
)

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")


def _record_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each volume is opened in, appended as they open."""
    seen: list[str] = []
    real = volumes_module.open_volume

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(volumes_module, "open_volume", recording)
    return seen


def test_local_files_shapes_are_read_in_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local metadata is parsed under the GIL: no thread pool, no handoff per volume."""
    paths = []
    for i in range(30):
        path = tmp_path / f"v{i:02d}.npy"
        np.save(path, np.zeros((i + 1, 2, 3), dtype="int8"))
        paths.append(str(path))
    seen = _record_threads(monkeypatch)
    vols = mixle.read_volumes(paths, max_open=8)
    assert vols.shapes() == [np.load(p, mmap_mode="r").shape for p in paths]
    assert seen == [threading.current_thread().name] * 30
    assert len(vols._pool.live()) <= 8
    vols.close()


def test_remote_shapes_are_read_in_parallel_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("fsspec")
    urls = [f"memory://mixle-shapes/scan{i}.zarr" for i in range(12)]
    for i, url in enumerate(urls):
        data = np.zeros((i + 2, 3, 4), dtype="uint8")
        zarr.create_array(url, data=data, chunks=(2, 2, 2), overwrite=True)
    seen = _record_threads(monkeypatch)
    vols = mixle.read_volumes(urls, max_open=4)
    most = [0]
    real_acquire = vols._pool.acquire

    def acquire(i: int) -> None:
        real_acquire(i)
        most[0] = max(most[0], len(vols._pool.live()))

    monkeypatch.setattr(vols._pool, "acquire", acquire)
    assert vols.shapes() == [zarr.open_array(u, mode="r").shape for u in urls]
    assert len(seen) == 12
    assert all(name.startswith("mixle-shapes") for name in seen)
    assert most[0] <= 4
    vols.close()


def test_mixed_local_and_remote_volumes_give_every_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fsspec")
    paths: list[str] = []
    for i in range(6):
        url = f"memory://mixle-shapes-mixed/r{i}.zarr"
        zarr.create_array(url, data=np.zeros((i + 1, 2), dtype="f4"), overwrite=True)
        local = tmp_path / f"l{i}.zarr"
        zarr.create_array(str(local), data=np.zeros((2, i + 1), dtype="f4"))
        paths += [url, str(local)]
    seen = _record_threads(monkeypatch)
    vols = mixle.read_volumes(paths, max_open=3)
    assert vols.shapes() == [zarr.open_array(p, mode="r").shape for p in paths]
    me = threading.current_thread().name
    # the 6 local volumes in the calling thread (volume 0 maybe too, as the reference layout)
    assert seen.count(me) in (6, 7)
    assert all(name == me or name.startswith("mixle-shapes") for name in seen)
    assert len(vols._pool.live()) <= 3
    vols.close()


def test_an_interrupt_stops_the_remote_shape_reads_not_yet_begun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fsspec")
    paths = []
    for i in range(40):
        url = f"memory://mixle-shapes-stop/r{i}.zarr"
        zarr.create_array(url, data=np.zeros((2, 2), dtype="f4"), overwrite=True)
        paths.append(url)
    paths.append(str(tmp_path / "local.zarr"))  # read by the calling thread
    zarr.create_array(paths[-1], data=np.zeros((2, 2), dtype="f4"))
    vols = mixle.read_volumes(paths, max_open=3)  # 2 threads for the 40 remote volumes
    caller = threading.current_thread()
    started = threading.Event()
    remote_reads: list[int] = []
    real = volumes_module.open_volume

    def slow_or_interrupted(item: Any, *args: Any, **kwargs: Any) -> Any:
        if str(item).startswith("memory://"):
            remote_reads.append(1)
            started.set()
            threading.Event().wait(0.05)  # a slow store
        elif threading.current_thread() is caller and started.wait(timeout=30):
            raise KeyboardInterrupt  # Ctrl-C in the calling thread, remote reads running
        return real(item, *args, **kwargs)

    monkeypatch.setattr(volumes_module, "open_volume", slow_or_interrupted)
    with pytest.raises(KeyboardInterrupt):
        vols.shapes()
    done = len(remote_reads)
    threading.Event().wait(0.5)  # queued reads would go on without the caller
    assert len(remote_reads) <= done + 2 < 40  # only those already running finished


@pytest.mark.parametrize(
    ("soft", "expected"),
    [
        (1024, 128),
        (256, MIN_DEFAULT_MAX_OPEN),
        (0, MIN_DEFAULT_MAX_OPEN),
        (2048, MAX_DEFAULT_MAX_OPEN),
        (1_048_576, MAX_DEFAULT_MAX_OPEN),
        (-1, MAX_DEFAULT_MAX_OPEN),
    ],
)
def test_default_max_open_is_a_quarter_of_the_descriptor_limit(soft: int, expected: int) -> None:
    assert default_max_open(soft) == expected


def test_default_bound_is_this_process_limit() -> None:
    resource = pytest.importorskip("resource")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert default_max_open(soft if soft != resource.RLIM_INFINITY else -1) == DEFAULT_MAX_OPEN
    assert mixle.read_volumes([np.zeros(2)]).max_open == DEFAULT_MAX_OPEN


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_hdf5_volumes_at_the_default_bound_hold_two_descriptors_each(tmp_path: Path) -> None:
    """The default's arithmetic: a live HDF5 volume holds h5py's and the chunk reader's."""
    n = 12
    paths = []
    for i in range(n):
        path = tmp_path / f"v{i:02d}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.full((4, 4), i, dtype="i2"), chunks=(2, 2))
        paths.append(str(path))
    vols = mixle.read_volumes(paths, dataset="x", max_open=n)
    for i in range(n):
        with vols.lease(i) as src:
            assert int(src.read_box([0, 0], [2, 2])[0, 0]) == i
            src.read_boxes(np.zeros((2, 2), dtype=np.int64), (2, 2))
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(tmp_path)):
            held.append(target)
    assert len(held) <= volumes_module.DESCRIPTORS_PER_VOLUME * n
    vols.close()
