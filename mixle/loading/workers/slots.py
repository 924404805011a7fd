"""Batches through shared memory: a worker writes a batch's arrays into a slot, the parent
maps them without a copy.

A slot is an anonymous shared mapping (``memfd_create`` on Linux, an unlinked temporary file
elsewhere) that the worker creates and passes to the parent as a file descriptor over their
socket; it has no name, so nothing is ever left in ``/dev/shm``, whoever dies first: the
memory goes back to the system once the last process maps it no more.

The parent's arrays are views of the slot (no copy). A slot is leased to the batch it
holds: it goes back to its worker for reuse only once every array of that batch (and every
view of them) has been collected, so a batch the caller keeps is never overwritten. A
worker reuses a free slot that is large enough and creates one when none is, so each worker
holds about ``prefetch + 1`` slots in a loop that drops each batch before the next.

Leaves that are not plain NumPy arrays (strings, objects, arrays of objects, NumPy
subclasses) and arrays under :data:`INLINE_MAX_BYTES` travel pickled in the batch's
message instead.
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import socket
import tempfile
import threading
import weakref
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "INLINE_MAX_BYTES",
    "SLOT_ALIGN",
    "SlotMaps",
    "SlotWriter",
    "Written",
    "fd_socket",
    "recv_fd",
    "send_fd",
]

#: Arrays smaller than this many bytes travel pickled with the batch's message.
INLINE_MAX_BYTES = 8192
#: Byte alignment of each array in a slot (a cache line; enough for any dtype and SIMD).
SLOT_ALIGN = 64
_PAGE = mmap.PAGESIZE
#: Use an unlinked temporary file even where ``memfd_create`` exists (tests set it).
FORCE_FILE_SLOTS = False


def _new_fd(size: int) -> int:
    """A file descriptor of ``size`` bytes of anonymous shared memory (no name anywhere)."""
    if hasattr(os, "memfd_create") and not FORCE_FILE_SLOTS:
        fd = os.memfd_create("mixle-batch", os.MFD_CLOEXEC)
    else:
        with tempfile.TemporaryFile() as file:  # unlinked already on POSIX
            fd = os.dup(file.fileno())
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_socket(fileno: int) -> socket.socket:
    """A blocking socket object over a duplicate of the connection's descriptor ``fileno``,
    for :func:`send_fd` and :func:`recv_fd`.

    Make it once per connection, before other threads use the connection: building a
    socket applies ``socket.getdefaulttimeout()``, which makes the descriptor (shared with
    the connection) non-blocking until ``setblocking(True)`` here restores it.
    """
    sock = socket.socket(fileno=os.dup(fileno))
    sock.setblocking(True)
    return sock


def send_fd(sock: socket.socket, fd: int) -> None:
    """Send the descriptor ``fd`` over the Unix socket ``sock`` (one marker byte with it)."""
    sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def recv_fd(sock: socket.socket) -> int:
    """Receive one descriptor :func:`send_fd` sent over the Unix socket ``sock``.

    Raises
    ------
    EOFError
        The other end closed (or sent no descriptor) before it arrived.
    """
    size = array.array("i").itemsize
    msg, ancdata, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(size))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(data) >= size:
            return array.array("i", data[:size])[0]
    raise EOFError(f"expected a file descriptor, got {msg!r}")


@dataclass(frozen=True)
class _Leaf:
    """Placeholder of an array leaf in a batch's skeleton: its place in the slot."""

    offset: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


#: Mappings walked leaf by leaf (other dict subclasses travel pickled whole).
_DICTS = (dict, OrderedDict, defaultdict)


def _rebuild_dict(like: Any, items: list[tuple[Any, Any]]) -> Any:
    """A mapping of ``like``'s type (and default factory) holding ``items``."""
    if type(like) is defaultdict:
        return defaultdict(like.default_factory, items)
    return type(like)(items)


def _goes_in_slot(leaf: Any) -> bool:
    return (
        type(leaf) in (np.ndarray, np.memmap)
        and not leaf.dtype.hasobject
        and leaf.nbytes >= INLINE_MAX_BYTES
    )


def _map_leaves(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with each leaf replaced by ``fn(leaf)``: dicts (:data:`_DICTS`), lists,
    tuples and namedtuples are walked, everything else is a leaf."""
    kind = type(tree)
    if kind in _DICTS:
        return _rebuild_dict(tree, [(key, _map_leaves(item, fn)) for key, item in tree.items()])
    if kind is list:
        return [_map_leaves(item, fn) for item in tree]
    if isinstance(tree, tuple) and (kind is tuple or hasattr(tree, "_fields")):
        items = [_map_leaves(item, fn) for item in tree]
        return tuple(items) if kind is tuple else kind(*items)
    return fn(tree)


def _skeleton(batch: Any) -> tuple[Any, list[tuple[_Leaf, np.ndarray]], int]:
    """``batch`` with each slot-bound array replaced by its :class:`_Leaf`; the leaves with
    their arrays, in slot order; and the bytes they span."""
    placed: list[tuple[_Leaf, np.ndarray]] = []
    end = 0

    def place(leaf: Any) -> Any:
        nonlocal end
        if not _goes_in_slot(leaf):
            return leaf
        start = -(-end // SLOT_ALIGN) * SLOT_ALIGN
        end = start + leaf.nbytes
        placed.append((_Leaf(start, leaf.dtype, leaf.shape), leaf))
        return placed[-1][0]

    return _map_leaves(batch, place), placed, end


@dataclass(frozen=True)
class Written:
    """What the parent needs to map one written batch (pickled into the batch's message).

    ``slot`` is ``-1`` when no array went to a slot; ``new_size`` is the size of a slot
    created for this batch, whose file descriptor follows the message (0: a known slot);
    ``retired`` lists slots the worker dropped (too small), which the parent unmaps.
    """

    slot: int
    new_size: int
    used: int
    skeleton: Any
    retired: tuple[int, ...]


class SlotWriter:
    """A worker's slots: write a batch into a free one (creating it when needed).

    Thread-safe: the worker's reader threads write batches side by side, and its receiving
    thread frees slots as the parent lets them go.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[int, mmap.mmap] = {}
        self._free: set[int] = set()
        self._retired: list[int] = []
        self._next = 0

    def free(self, slots: list[int]) -> None:
        """Slots whose batch the parent has let go (ids it does not know are ignored)."""
        with self._lock:
            self._free.update(s for s in slots if s in self._maps)

    def write(self, batch: Any) -> tuple[Written, int | None]:
        """Copy ``batch``'s arrays into a slot: what to send, and the new slot's descriptor.

        The descriptor (``None`` for a slot the parent already maps) must be sent right
        after the message and then closed by the caller.
        """
        skeleton, placed, used = _skeleton(batch)
        if not placed:
            return Written(-1, 0, 0, skeleton, self._take_retired()), None
        slot, mm, fd = self._claim(used)
        try:
            for leaf, value in placed:
                out = np.ndarray(leaf.shape, leaf.dtype, buffer=mm, offset=leaf.offset)
                np.copyto(out, value, casting="no")
                del out  # an exported view would keep the slot from ever being closed
        except BaseException:
            self.abandon(slot, fd)
            raise
        size = len(mm) if fd is not None else 0
        return Written(slot, size, used, skeleton, self._take_retired()), fd

    def abandon(self, slot: int, fd: int | None) -> None:
        """Give back a slot :meth:`write` claimed for a batch that will not be sent: free
        again, or, when it is new (``fd``, closed here), dropped (the parent never saw it)."""
        if fd is None:
            self.free([slot])
            return
        os.close(fd)
        with self._lock:
            mm = self._maps.pop(slot, None)
        if mm is not None:
            _close(mm)

    def _claim(self, used: int) -> tuple[int, mmap.mmap, int | None]:
        with self._lock:
            fits = [s for s in self._free if len(self._maps[s]) >= used]
            if fits:
                slot = min(fits, key=lambda s: len(self._maps[s]))
                self._free.discard(slot)
                return slot, self._maps[slot], None
            for small in list(self._free):  # free but too small: a batch this size needs more
                self._free.discard(small)
                _close(self._maps.pop(small))
                self._retired.append(small)
            slot, self._next = self._next, self._next + 1
        size = max(_PAGE, -(-used // _PAGE) * _PAGE)
        fd = _new_fd(size)
        try:
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._maps[slot] = mm
        return slot, mm, fd

    def _take_retired(self) -> tuple[int, ...]:
        with self._lock:
            retired, self._retired = tuple(self._retired), []
        return retired

    def close(self) -> None:
        """Unmap every slot (the parent's mappings stay valid)."""
        with self._lock:
            for mm in self._maps.values():
                _close(mm)
            self._maps.clear()
            self._free.clear()


def _close(mm: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a view still exported: unmapped when collected
        mm.close()


class SlotMaps:
    """The parent's mappings of one worker's slots, and the batches leased from them.

    :meth:`batch` maps a written batch without copying; when every array of it is gone,
    its slot joins the released queue, which :meth:`take_released` hands back to be sent
    to the worker (finalizers run in whichever thread drops the last array, so they only
    append to a deque).
    """

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._released: deque[int] = deque()

    def add(self, slot: int, size: int, fd: int) -> None:
        """Map the new slot ``slot`` of ``size`` bytes from ``fd`` (closed here)."""
        try:
            self._maps[slot] = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def batch(self, written: Written) -> Any:
        """The batch ``written`` describes; its arrays are views of the worker's slot."""
        for slot in written.retired:
            self._maps.pop(slot, None)  # free, so no array of it is alive here
        if written.slot < 0:
            return written.skeleton
        root = np.frombuffer(self._maps[written.slot], np.uint8, count=written.used)
        weakref.finalize(root, self._released.append, written.slot)

        def view(leaf: Any) -> Any:
            if type(leaf) is not _Leaf:
                return leaf
            size = leaf.dtype.itemsize * int(np.prod(leaf.shape, dtype=np.int64))
            part = root[leaf.offset : leaf.offset + size]
            return part.view(leaf.dtype).reshape(leaf.shape)

        return _map_leaves(written.skeleton, view)

    def take_released(self) -> list[int]:
        """Slots whose batches are gone since the last call."""
        out = []
        while self._released:
            out.append(self._released.popleft())
        return out

    def close(self) -> None:
        """Drop the mappings; arrays still alive keep theirs until they are collected."""
        self._maps.clear()
        self._released.clear()
