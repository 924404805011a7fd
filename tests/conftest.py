"""Shared fixtures: stores written by other tools (zarr, h5py, NumPy), and a check that
every test that reads them leaves them byte-identical."""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from mixle.testing import snapshot_tree

# CI runs a fixed sequence of examples so a landing never depends on luck; locally the
# examples vary from run to run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@dataclass
class Stores:
    """Files written once per session, with the NumPy arrays they hold."""

    root: Path
    truth: dict[str, np.ndarray] = field(default_factory=dict)
    snapshot: dict[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return str(self.root / name)


def _volume(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _write_zarr(stores: Stores) -> None:
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    v3 = _volume((21, 34, 17), "float32", 1)
    arr = zarr.create_array(
        stores.path("v3.zarr"),
        shape=v3.shape,
        chunks=(8, 10, 7),
        dtype=v3.dtype,
        compressors=ZstdCodec(level=3),
    )
    arr[:] = v3
    stores.truth["v3.zarr"] = v3

    v2 = _volume((30, 12), "int16", 2)
    arr = zarr.create_array(
        stores.path("v2.zarr"),
        shape=v2.shape,
        chunks=(7, 5),
        dtype=v2.dtype,
        zarr_format=2,
        compressors=numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
    )
    arr[:] = v2
    stores.truth["v2.zarr"] = v2

    sharded = _volume((24, 24, 20), "float64", 3)
    arr = zarr.create_array(
        stores.path("sharded.zarr"),
        shape=sharded.shape,
        chunks=(4, 4, 5),
        shards=(12, 8, 10),
        dtype=sharded.dtype,
        compressors=BloscCodec(cname="zstd"),
    )
    arr[:] = sharded
    stores.truth["sharded.zarr"] = sharded

    group = zarr.open_group(stores.path("group.zarr"), mode="w")
    image = _volume((10, 11, 12), "uint8", 4)
    group.create_array("image", shape=image.shape, chunks=(5, 5, 5), dtype=image.dtype)[:] = image
    nested = group.create_group("labels")
    mask = _volume((10, 11, 12), "int32", 5)
    nested.create_array("mask", shape=mask.shape, chunks=(5, 5, 5), dtype=mask.dtype)[:] = mask
    stores.truth["group.zarr/image"] = image
    stores.truth["group.zarr/labels/mask"] = mask


def _write_hdf5(stores: Stores) -> None:
    import h5py

    with h5py.File(stores.path("volumes.h5"), "w") as f:
        gz = _volume((19, 23, 16), "float32", 6)
        f.create_dataset("gzip", data=gz, chunks=(8, 8, 8), compression="gzip", shuffle=True)
        lzf = _volume((40, 9), "int64", 7)
        f.create_dataset("lzf", data=lzf, chunks=(16, 9), compression="lzf")
        contiguous = _volume((13, 14), "float64", 8)
        f.create_dataset("contiguous", data=contiguous)
        nested = _volume((6, 5, 4, 3), "uint16", 9)
        f.create_group("scans").create_dataset("ct", data=nested, chunks=(2, 5, 4, 3))
        f.create_dataset("scalar", data=np.float32(2.5))
    for name, arr in [("gzip", gz), ("lzf", lzf), ("contiguous", contiguous), ("scans/ct", nested)]:
        stores.truth[f"volumes.h5/{name}"] = arr


def _write_numpy(stores: Stores) -> None:
    c = _volume((17, 6, 5), "float32", 10)
    np.save(stores.path("c.npy"), c)
    f = np.asfortranarray(_volume((9, 8, 7), "int32", 11))
    np.save(stores.path("fortran.npy"), f)
    stores.truth["c.npy"] = c
    stores.truth["fortran.npy"] = f

    raw = _volume((12, 10, 8), "uint16", 12)
    with open(stores.path("header.raw"), "wb") as fh:
        fh.write(b"HDR!" * 16)  # a 64-byte header to skip
        fh.write(raw.tobytes())
    stores.truth["header.raw"] = raw
    raw_f = np.asfortranarray(_volume((5, 7, 3), "float64", 13))
    raw_f.T.tofile(stores.path("fortran.raw"))  # column-major bytes
    stores.truth["fortran.raw"] = raw_f


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    """Stores of every backend, written by zarr, h5py and NumPy themselves."""
    result = Stores(tmp_path_factory.mktemp("stores"))
    _write_zarr(result)
    _write_hdf5(result)
    _write_numpy(result)
    result.snapshot = snapshot_tree(result.root)
    return result


@pytest.fixture(autouse=True)
def _stores_left_unchanged(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that reads the shared stores, check they are byte-identical."""
    yield
    if "stores" in request.fixturenames:
        shared: Stores = request.getfixturevalue("stores")
        assert snapshot_tree(shared.root) == shared.snapshot, "a test changed the shared stores"


@pytest.fixture(autouse=True)
def _jax_stays_out_of_this_process() -> Iterator[None]:
    """A started JAX backend makes every later ``os.fork()`` in the process warn (an error
    here) and risks deadlocks, so JAX tests run in a child interpreter (tests/test_jax.py)."""
    yield
    bridge = sys.modules.get("jax._src.xla_bridge")  # importing jax alone starts nothing
    started = bridge is not None and (
        getattr(bridge, "_at_fork_handler_installed", False) or getattr(bridge, "_backends", None)
    )
    if started and os.environ.get("MIXLE_TEST_JAX_CHILD") != "1":
        pytest.fail(
            "this test started a JAX backend in the main pytest process, which breaks the "
            "fork tests after it; put JAX checks in tests/_jax_cases.py (run in a child)"
        )


@pytest.fixture(scope="session")
def _test_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mixle-cache")


@pytest.fixture(autouse=True)
def _cache_dir_in_temp(monkeypatch: pytest.MonkeyPatch, _test_cache_dir: Path) -> None:
    """mixle's on-disk caches (row indexes, inflated ``.nii.gz`` and ``.npz`` members) stay
    in a temporary folder, never in the user's ``~/.cache``; a test may point it elsewhere."""
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(_test_cache_dir))


@pytest.fixture(autouse=True)
def _chunk_cache_rule_restored() -> Iterator[None]:
    """A budget a test sets (or puts back as a number, which counts as set) ends with it.

    Otherwise a later test of the default rule (worker shares, DataLoader splits) would
    see a budget "set by the user" and pass or fail by test order.
    """
    from mixle.reading.process_cache import set_chunk_cache_bytes, user_chunk_cache_bytes

    before = user_chunk_cache_bytes()
    yield
    if user_chunk_cache_bytes() != before:
        set_chunk_cache_bytes(before)


@pytest.fixture
def fast_retries() -> Iterator[None]:
    """Remote tests: retries in milliseconds instead of seconds, and an empty chunk cache."""
    from mixle.reading import chunk_cache, set_retry_policy

    old = set_retry_policy(attempts=5, base_delay=0.001, max_delay=0.01)
    chunk_cache().clear()
    yield
    set_retry_policy(**asdict(old))  # every field, timeouts included


def pytest_collectstart(collector: pytest.Collector) -> None:
    """Collection imports every test module: its full collections skip what came before.

    Each ``gc.freeze()`` sets the objects made so far aside (imports make next to no
    garbage), so an automatic full collection scans only the newest imports instead of the
    whole heap again (seconds in all).
    """
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _earlier_modules_frozen() -> None:
    """Every module's full gc collections scan only the objects made since it started.

    Late in a full run the heap holds millions of objects from earlier modules (imports,
    hypothesis, caches), and each full collection, automatic or a ``gc.collect()``, scans
    all of them (most of a second). One collection here, in the main thread, takes what the
    module before left (its fixtures are torn down by now); ``gc.freeze()`` then sets the
    survivors aside. Frozen objects are still freed when their last reference goes, and
    every object this module makes stays collectable.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module")
def frozen_heap() -> Iterator[None]:
    """For modules that call ``gc.collect()`` often, or leave cycles that must be collected
    in the main thread: one collection when the module ends.

    Their collections see only the module's own objects (``_earlier_modules_frozen``). The
    collection at the end runs here, in the main thread: a cycle that holds an h5py object,
    collected on fsspec's I/O thread, can deadlock (h5py issue 2019). Also for modules whose
    remote reads retry or open HDF5 over URLs: mixle collects before each (see
    mixle.reading.faults). Use it with ``pytestmark = pytest.mark.usefixtures("frozen_heap")``.
    """
    gc.collect()
    try:
        yield
    finally:
        gc.collect()


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint on 127.0.0.1 that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()
