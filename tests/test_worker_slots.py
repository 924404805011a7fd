"""The shared-memory hand-off of Loader(num_workers=N): leases, views, odd leaves, bounds.

Guards of new behaviour (issue 19: batches come back from worker processes through memfd
slots, as views leased until collected): the code before it had no ``num_workers``. Every
worker run passes ``timeout=`` as a hang guard only (no test relies on timing).
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import sys
import tempfile
from collections import OrderedDict, defaultdict, namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _batch_checks import assert_same

import mixle
from mixle.loading.workers import slots
from mixle.loading.workers.slots import INLINE_MAX_BYTES, SLOT_ALIGN, SlotMaps, SlotWriter

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads /proc/self/maps and /proc/self/fd"
    ),
    pytest.mark.usefixtures("frozen_heap"),  # its gc.collect() calls scan this module only
]

#: Hang guard (seconds per batch) for every run with workers; never reached when it works.
T = 60
MEMFD = "memfd:mixle-batch"

Pair = namedtuple("Pair", ["image", "meta"])


# -- module-level sources (spawn workers import them as this module) ------------------------
class Frames:
    """Batches of big float32 frames: every leaf goes to a slot."""

    def __init__(self, n: int, shape: tuple[int, ...] = (48, 64)) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.get_batch([i])[0][0]

    def get_batch(self, indices: Any) -> Any:
        idx = np.asarray(indices, dtype=np.int64)
        size = int(np.prod(self.shape))
        frames = (idx[:, None] * 1000 + np.arange(size)).astype(np.float32)
        return frames.reshape(idx.size, *self.shape), idx * 3


class ManySmall:
    """Batches of many arrays under the inline bound plus one big one: a message of
    about 1 MiB (more than a socket buffer) that also names a slot."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)

    def get_batch(self, indices: Any) -> Any:
        idx = np.asarray(indices, dtype=np.int64)
        small = [np.full((len(idx), 128), k, np.float64) + idx[:, None] for k in range(256)]
        return small, np.repeat(idx[:, None].astype(np.float32), 65536, axis=1)


class Growing:
    """Each batch bigger than the one before: a free slot is always too small (retired)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("the Loader reads with get_batch")

    def get_batch(self, indices: Any) -> Any:
        k = int(np.asarray(indices)[0]) // 4
        return np.full((k + 1) * 3000, k, dtype=np.float64), {"k": np.full(2000, -k)}


class Structures:
    """Batches whose leaves are every kind of thing a batch may hold."""

    def __init__(self, n: int, memmap_path: str) -> None:
        self.n, self.memmap_path = n, memmap_path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("the Loader reads with get_batch")

    def get_batch(self, indices: Any) -> Any:
        idx = np.asarray(indices, dtype=np.int64)
        n = idx.size
        base = idx[:, None, None] + np.arange(32 * 40, dtype=np.float64).reshape(1, 32, 40) / 7
        structured = np.zeros(n * 300, dtype=[("a", "u1"), ("b", "<f8"), ("c", "S3")])
        structured["a"] = np.arange(n * 300) % 251
        structured["b"] = np.repeat(idx, 300) / 3
        structured["c"] = [b"x%d" % (i % 97) for i in range(n * 300)]
        aligned = np.zeros(n * 400, dtype=np.dtype([("u", "u1"), ("v", "f8")], align=True))
        aligned["u"], aligned["v"] = 7, np.arange(n * 400) * 0.5
        with_object = np.zeros(n * 400, dtype=[("k", "i4"), ("o", "O")])
        with_object["o"] = [f"o{i}" for i in range(n * 400)]
        big0d = np.zeros((), dtype=[("v", "f8", (1100,))])
        big0d["v"] = np.arange(1100) + idx[0]
        ragged = np.empty(n, dtype=object)
        ragged[:] = [np.arange(int(i) % 4 + 1) for i in idx]
        mm = np.memmap(self.memmap_path, dtype=np.int32, mode="r")
        start = int(idx.min())
        return {
            "pair": Pair(
                base.astype(np.float32), [idx.copy(), f"batch-{start}", None, 3.5, b"raw"]
            ),
            "nested": [
                (base[:, ::2, 1::3], np.asfortranarray(base), base.transpose(2, 0, 1)),
                {
                    "zero": np.zeros((n, 0, 3)),
                    "zero_rows": np.empty((0, 5000)),
                    "scalar": np.array(idx.sum()),
                    "big0d": big0d,
                    "small": idx.astype(np.int8),
                },
            ],
            "objects": np.array([f"s{i}" for i in idx], dtype=object),
            "ragged": ragged,
            "structured": structured,
            "aligned": aligned,
            "with_object": with_object,
            "masked": np.ma.masked_array(base, mask=(base.astype(np.int64) % 3 == 0)),
            "memmap": mm[start * 512 : start * 512 + n * 512],
            "dtypes": (
                base.astype(">f8"),
                base > 5,
                (base + 1j).astype(np.complex64),
                (idx[:, None] + np.arange(2000)).astype("datetime64[s]"),
                np.array([f"ü{i:05d}" for i in range(n * 100)]),
                base.astype(np.float16),
                np.broadcast_to(base[:, :1, :1], (n, 64, 40)),  # stride 0, read-only
                base[:, ::-1, ::-3],  # negative strides
                np.frombuffer(b"\0" + base.tobytes(), np.float64, offset=1),  # unaligned
            ),
            "ordered": OrderedDict(z=base.astype(np.float32), a=idx),  # a dict subclass
        }


@pytest.fixture
def memmap_file(tmp_path: Path) -> str:
    path = str(tmp_path / "ints.i32")
    np.arange(64 * 512, dtype=np.int32).tofile(path)
    return path


# -- helpers ---------------------------------------------------------------------------------
def leaves(batch: Any) -> list[Any]:
    if isinstance(batch, dict):
        return [x for v in batch.values() for x in leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [x for v in batch for x in leaves(v)]
    return [batch]


def reaches_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array``'s base chain ends in a mapping (a view of a slot, no copy)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def memfd_slots() -> int:
    """Distinct slot mappings (memfd inodes) in this process."""
    inodes = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if MEMFD in line:
                inodes.add(line.split()[4])
    return len(inodes)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def shm_files_held(pid: int) -> list[str]:
    """Paths under /dev/shm that process ``pid`` maps or holds open and that still have a
    name there (a POSIX semaphore of ``multiprocessing`` is unlinked at once: not counted)."""
    found = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            found += [line.split(maxsplit=5)[-1].strip() for line in f if "/dev/shm/" in line]
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/dev/shm/"):
                found.append(target)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return [path for path in found if not path.endswith("(deleted)")]


def child_pids() -> list[int]:
    """This process's children (read from /proc: holds no Process object, no descriptor)."""
    me = str(os.getpid())
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                pids.append(int(entry))
    return pids


def reference(source: Any, batch_size: int, **options: Any) -> list[Any]:
    return list(mixle.Loader(source, batch_size, num_threads=0, **options))


def worker_loader(source: Any, batch_size: int, **options: Any) -> mixle.Loader:
    options.setdefault("worker_start_method", "fork")
    return mixle.Loader(
        source, batch_size, num_workers=options.pop("num_workers", 2), timeout=T, **options
    )


# -- leases ----------------------------------------------------------------------------------
def test_batches_kept_alive_are_never_overwritten() -> None:
    """Every batch of 2 epochs kept in a list, compared only after the run ended: a slot
    leased to a live batch was never reused for another."""
    source = Frames(45)
    options = {"shuffle": True, "seed": 4, "num_epochs": 2, "prefetch": 2}
    kept = list(worker_loader(source, 4, **options))
    gc.collect()
    want = reference(source, 4, shuffle=True, seed=4, num_epochs=2)
    assert len(kept) == len(want) == 24
    for k, (got, w) in enumerate(zip(kept, want)):
        assert reaches_shared_memory(got[0])
        assert_same(got, w, f"batch {k}")
    assert memfd_slots() >= len(kept)  # each kept batch still holds its own slot


def test_a_view_of_a_batch_keeps_its_slot_leased() -> None:
    """Keeping only a slice of one leaf (the batch itself dropped) keeps the slot too."""
    source = Frames(60)
    want = reference(source, 3)
    kept = []
    for batch in worker_loader(source, 3, prefetch=1, num_threads=0):
        kept.append(batch[0][1:, 5:9])  # a view; the batch tuple and batch[1] are dropped
        del batch
        gc.collect()
    for k, view in enumerate(kept):
        np.testing.assert_array_equal(view, want[k][0][1:, 5:9], err_msg=f"batch {k}")


def test_arrays_are_writable_and_writes_never_show_in_later_batches() -> None:
    source = Frames(40)
    want = reference(source, 4, num_epochs=2)
    first = None
    for k, batch in enumerate(worker_loader(source, 4, num_epochs=2, prefetch=1)):
        for leaf in leaves(batch):
            assert leaf.flags.writeable
        assert_same(batch, want[k], f"batch {k}")
        if first is None:
            first = batch  # kept, and scribbled on while the run goes on
        batch[0][...] = -1.0  # dropped next: its slot is reused for a later batch
        batch[1][...] = -1
    assert first is not None
    assert (first[0] == -1).all()


def test_big_leaves_are_views_and_small_leaves_inline() -> None:
    small_rows = INLINE_MAX_BYTES // (4 * 4) - 1  # 4 rows of float32: just under the bound
    source = Frames(8, shape=(small_rows,))
    for batch in worker_loader(source, 4):
        assert batch[0].nbytes < INLINE_MAX_BYTES
        assert not reaches_shared_memory(batch[0])
    big = Frames(8, shape=(INLINE_MAX_BYTES // 16,))  # exactly the bound: a slot
    for batch in worker_loader(big, 4):
        assert batch[0].nbytes == INLINE_MAX_BYTES
        assert reaches_shared_memory(batch[0])
        assert not batch[0].flags.owndata
        assert not reaches_shared_memory(batch[1])  # 4 int64: inline


@pytest.mark.parametrize(("method", "threads"), [("fork", 2), ("spawn", 0)])
def test_every_kind_of_leaf_round_trips(memmap_file: str, method: str, threads: int) -> None:
    """namedtuple, nested dict/list/tuple, object arrays, structured dtypes (packed, aligned,
    with an object field), non-contiguous and Fortran-ordered arrays, zero-size and 0-d
    arrays, a memmap leaf, a masked array (its mask kept), and more dtypes."""
    source = Structures(20, memmap_file)
    want = reference(source, 4, shuffle=True, seed=2, drop_last="pad")
    got = list(
        worker_loader(
            source,
            4,
            shuffle=True,
            seed=2,
            drop_last="pad",
            worker_start_method=method,
            num_threads=threads,
        )
    )
    assert len(got) == len(want) == 5
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {k}")
        assert type(g["pair"]) is Pair
        assert isinstance(g["masked"], np.ma.MaskedArray)
        assert g["masked"].mask.any()
        assert reaches_shared_memory(g["structured"])
        assert reaches_shared_memory(g["nested"][0][1])
        assert reaches_shared_memory(g["nested"][1]["big0d"])
        assert not reaches_shared_memory(g["objects"])


# -- bounds and clean-up ---------------------------------------------------------------------
def test_slot_count_stays_bounded_and_everything_goes_back(tmp_path: Path) -> None:
    source = Frames(2000)
    workers, prefetch = 2, 2
    list(worker_loader(Frames(8), 4))  # the first run may open what lives for the session
    gc.collect()
    fds, shm = open_fds(), set(os.listdir("/dev/shm"))
    assert memfd_slots() == 0
    most = 0
    held: list[str] = []
    loader = worker_loader(source, 10, num_workers=workers, prefetch=prefetch)
    for k, batch in enumerate(loader):
        assert batch[0].shape == (10, 48, 64)
        del batch
        most = max(most, memfd_slots())
        if k % 50 == 0:
            for pid in (os.getpid(), *child_pids()):
                held += shm_files_held(pid)
    assert k == 199
    assert 1 <= most <= (prefetch + 2) * workers
    gc.collect()
    assert memfd_slots() == 0
    assert open_fds() == fds
    assert held == []
    new = set(os.listdir("/dev/shm")) - shm
    assert not [name for name in new if "mixle" in name or name.startswith("psm_")], new


def test_growing_batches_retire_small_slots_and_stay_bounded() -> None:
    """Batches that outgrow every free slot: the worker retires the small ones, the parent
    unmaps them, and the batches are still right."""
    want = reference(Growing(), 4, num_epochs=2)
    list(worker_loader(Frames(8), 4))
    gc.collect()
    fds = open_fds()
    workers, prefetch = 2, 1
    most = 0
    loader = worker_loader(Growing(), 4, num_epochs=2, num_workers=workers, prefetch=prefetch)
    for k, batch in enumerate(loader):
        assert_same(batch, want[k], f"batch {k}")
        del batch
        most = max(most, memfd_slots())
    assert k == 19
    assert most <= (prefetch + 2) * workers
    gc.collect()
    assert memfd_slots() == 0
    assert open_fds() == fds
    kept = list(worker_loader(Growing(), 4, num_epochs=2, prefetch=prefetch))
    for k, (g, w) in enumerate(zip(kept, want)):
        assert_same(g, w, f"kept batch {k}")


def test_break_and_close_release_every_slot() -> None:
    list(worker_loader(Frames(8), 4))
    gc.collect()
    fds = open_fds()
    loader = worker_loader(Frames(100), 5, prefetch=2)
    for k, _batch in enumerate(loader):
        if k == 3:
            break
    del _batch
    gc.collect()
    assert memfd_slots() == 0
    assert open_fds() == fds
    it = iter(loader)
    kept = next(it)
    loader.close()
    assert reaches_shared_memory(kept[0])
    np.testing.assert_array_equal(kept[0], reference(Frames(100), 5)[4][0])  # still valid
    del kept, it
    gc.collect()
    assert memfd_slots() == 0
    assert open_fds() == fds


def test_file_backed_slots_give_the_same_batches(
    monkeypatch: pytest.MonkeyPatch, memmap_file: str
) -> None:
    """Where memfd_create is missing the slots are unlinked temporary files (forced here;
    the fork child inherits the flag)."""
    monkeypatch.setattr(slots, "FORCE_FILE_SLOTS", True)
    tmp = os.path.realpath(tempfile.gettempdir())

    def deleted_tmp_mappings() -> set[str]:
        with open("/proc/self/maps") as f:
            lines = [line.split() for line in f if line.rstrip().endswith("(deleted)")]
        return {f"{fields[4]} {fields[-2]}" for fields in lines if fields[-2].startswith(tmp)}

    before = deleted_tmp_mappings()
    for source in (Frames(30), Structures(12, memmap_file)):
        want = reference(source, 4, num_epochs=2)
        got = []
        for batch in worker_loader(source, 4, num_epochs=2):
            got.append(batch)
            assert memfd_slots() == 0
        assert len(deleted_tmp_mappings() - before) >= 2  # the kept batches' slots
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"batch {k}")


# -- SlotWriter / SlotMaps in one process ---------------------------------------------------
def _fd_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_slot_writer_and_maps_hand_off_and_reuse() -> None:
    writer, maps = SlotWriter(), SlotMaps()
    a = np.arange(3000, dtype=np.float64).reshape(30, 100)
    batch = {"a": a, "b": (a[:, ::2].T, np.arange(5)), "s": "text"}
    written, fd = writer.write(batch)
    assert fd is not None
    assert written.slot == 0 and written.retired == ()
    assert written.new_size >= written.used and written.new_size % mmap.PAGESIZE == 0
    assert len(pickle.dumps(written)) < 2000  # a descriptor, not the data
    maps.add(written.slot, written.new_size, fd)
    assert _fd_closed(fd)
    got = maps.batch(written)
    assert_same(got, {"a": a, "b": (np.ascontiguousarray(a[:, ::2].T), np.arange(5)), "s": "text"})
    assert reaches_shared_memory(got["a"]) and reaches_shared_memory(got["b"][0])
    assert not reaches_shared_memory(got["b"][1])
    found: list[Any] = []
    slots._map_leaves(written.skeleton, found.append)
    offsets = [leaf.offset for leaf in found if type(leaf) is slots._Leaf]
    assert offsets and all(o % SLOT_ALIGN == 0 for o in offsets)

    # slot 0 is leased: the next batch gets a new slot
    written2, fd2 = writer.write({"a": a + 1})
    assert written2.slot == 1 and fd2 is not None
    maps.add(written2.slot, written2.new_size, fd2)
    got2 = maps.batch(written2)
    assert maps.take_released() == []

    del got
    gc.collect()
    assert maps.take_released() == [0]
    assert maps.take_released() == []
    writer.free([0, 99])  # an id the writer does not know is ignored
    written3, fd3 = writer.write({"a": a * 2})
    assert (written3.slot, written3.new_size, fd3) == (0, 0, None)  # reused, no descriptor
    got3 = maps.batch(written3)
    np.testing.assert_array_equal(got3["a"], a * 2)
    np.testing.assert_array_equal(got2["a"], a + 1)

    # slot 0 freed again but too small for a bigger batch: retired, a new slot made
    del got3
    gc.collect()
    writer.free(maps.take_released())
    bigger = np.ones(written.new_size // 8 + 1000)
    written4, fd4 = writer.write([bigger])
    assert written4.slot == 2 and fd4 is not None
    assert written4.retired == (0,)
    maps.add(written4.slot, written4.new_size, fd4)
    got4 = maps.batch(written4)
    assert 0 not in maps._maps and set(maps._maps) == {1, 2}
    np.testing.assert_array_equal(got4[0], bigger)
    assert writer._take_retired() == ()  # reported once

    # nothing that goes in a slot: no slot at all
    written5, fd5 = writer.write(("only", np.arange(3), {"x": None}))
    assert written5.slot == -1 and fd5 is None
    assert maps.batch(written5) == written5.skeleton

    writer.close()
    maps.close()
    np.testing.assert_array_equal(got4[0], bigger)  # live arrays keep their mapping
    np.testing.assert_array_equal(got2["a"], a + 1)


def test_send_fd_and_recv_fd_pass_a_descriptor() -> None:
    import socket

    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = slots.fd_socket(left.fileno()), slots.fd_socket(right.fileno())
    fd = os.memfd_create("mixle-test", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"hello")
        slots.send_fd(sender, fd)
        got = slots.recv_fd(receiver)
        try:
            assert got != fd and os.fstat(got).st_ino == os.fstat(fd).st_ino
            assert os.pread(got, 5, 0) == b"hello"
        finally:
            os.close(got)
        left.sendall(b"x")  # a byte without a descriptor
        with pytest.raises(EOFError, match="expected a file descriptor"):
            slots.recv_fd(receiver)
        left.close()
        sender.close()  # its own duplicate: the other end is closed only with both
        with pytest.raises(EOFError):
            slots.recv_fd(receiver)
        receiver.close()
        os.fstat(right.fileno())  # the connection keeps its own descriptor, still open
    finally:
        os.close(fd)
        for sock in (left, right, sender, receiver):
            sock.close()


def test_a_default_socket_timeout_does_not_break_the_workers() -> None:
    # building a socket over the connection's descriptor applied socket.getdefaulttimeout(),
    # which made the connection non-blocking: recv_bytes then raised BlockingIOError, taken
    # for EOF (the worker quit) or for a death (the parent)
    import socket

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5)
    try:
        for method, source in (("fork", Frames(64, (2048, 64))), ("spawn", ManySmall())):
            want = list(mixle.Loader(source, 4, num_threads=0))
            got = list(
                mixle.Loader(source, 4, num_workers=2, worker_start_method=method, timeout=60)
            )
            for k, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(g, w, f"{method} batch {k}")
    finally:
        socket.setdefaulttimeout(previous)


def test_a_parent_view_shares_the_workers_memory() -> None:
    """The parent's arrays are the slot itself (no copy): what makes the lease necessary."""
    writer, maps = SlotWriter(), SlotMaps()
    a = np.zeros(4096)
    written, fd = writer.write(a)
    assert fd is not None
    maps.add(written.slot, written.new_size, fd)
    view = maps.batch(written)
    writer._maps[written.slot][:8] = np.float64(5).tobytes()
    assert view[0] == 5.0
    writer.close()


class Mappings:
    """Batches in an OrderedDict and a defaultdict: walked leaf by leaf, not pickled whole."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)

    def get_batch(self, idx: np.ndarray) -> Any:
        rows = np.repeat(idx.astype(np.float64)[:, None], 4096, axis=1)
        return {
            "ordered": OrderedDict(a=rows, b="text"),
            "default": defaultdict(list, c=rows + 1),
        }


def test_ordered_and_default_dicts_keep_their_type_and_travel_in_slots() -> None:
    want = list(mixle.Loader(Mappings(), 4, num_threads=0))
    got = list(mixle.Loader(Mappings(), 4, num_workers=1, worker_start_method="fork", timeout=60))
    for a, b in zip(want, got, strict=True):
        assert type(b["ordered"]) is OrderedDict and list(b["ordered"]) == ["a", "b"]
        assert type(b["default"]) is defaultdict and b["default"].default_factory is list
        np.testing.assert_array_equal(b["ordered"]["a"], a["ordered"]["a"])
        np.testing.assert_array_equal(b["default"]["c"], a["default"]["c"])
        assert reaches_shared_memory(b["ordered"]["a"]) and reaches_shared_memory(b["default"]["c"])
