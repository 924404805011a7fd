"""Keep a few batches in flight on the device while the caller's step runs.

A background thread draws items from an iterator, places each on the device (a host-to-device
copy JAX starts at once) and queues it. At most ``size`` placed items wait for the caller at
any time, so memory stays bounded on an endless stream. The thread is a daemon thread,
waited for at most :data:`~mixle.loading.prefetch.STOP_GRACE_S` when the prefetcher stops,
so one stuck in a read that does not return neither holds up Ctrl-C nor keeps the process
alive.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from mixle.jax.convert import DtypePolicy, check_target, parse_dtype_policy, to_jax
from mixle.loading.prefetch import STOP_GRACE_S
from mixle.utils.validation import parse_int

__all__ = [
    "THREAD_NAME",
    "DevicePrefetcher",
    "parse_prefetch",
    "place_each",
    "prefetch_to_device",
]

T = TypeVar("T")
R = TypeVar("R")

#: Name of the background thread (seen in ``threading.enumerate()``).
THREAD_NAME = "mixle-jax-prefetch"

_ITEM, _END, _ERROR = "item", "end", "error"


def _produce(
    items: Iterator[T],
    place: Callable[[T], R],
    out: queue.SimpleQueue[tuple[str, Any]],
    slots: threading.Semaphore,
    stop: threading.Event,
) -> None:
    """The thread body. It holds no reference to the prefetcher, so that can be collected."""
    try:
        while True:
            slots.acquire()
            if stop.is_set():
                return
            try:
                item = next(items)
            except StopIteration:
                out.put((_END, None))
                return
            out.put((_ITEM, place(item)))
    except BaseException as exc:  # re-raised in the caller's thread
        out.put((_ERROR, exc))
    finally:
        close = getattr(items, "close", None)
        if callable(close):  # a generator is closed by the thread that ran it
            try:
                close()
            except Exception as exc:
                out.put((_ERROR, exc))


def _shutdown(
    thread: threading.Thread,
    out: queue.SimpleQueue[tuple[str, Any]],
    slots: threading.Semaphore,
    stop: threading.Event,
    on_stop: Callable[[], None] | None,
) -> None:
    stop.set()
    if on_stop is not None:
        on_stop()  # e.g. wakes the thread if it waits for a Loader's reader threads
    slots.release()  # wake the thread if it waits for a free slot
    if thread is not threading.current_thread() and thread.ident is not None:
        thread.join(STOP_GRACE_S)  # one stuck in a read is a daemon, left to end by itself
    while not out.empty():  # drop device buffers nobody will take
        out.get_nowait()
    out.put((_END, None))  # ends a loop waiting in another thread


class DevicePrefetcher(Iterator[R], Generic[R]):
    """Iterator over ``place(item)`` for each item, computed ``size`` ahead in a thread.

    Build it with :func:`prefetch_to_device`. ``close()`` (also on ``with`` exit, the end of
    the stream, an error such as Ctrl-C, or garbage collection) stops the thread, calls
    ``on_stop`` (which may wake a thread blocked in ``items``), joins the thread for up to
    :data:`~mixle.loading.prefetch.STOP_GRACE_S` and drops the items not taken. The thread
    closes the source iterator itself; a thread still stuck in ``items`` or ``place`` after
    the grace is a daemon that ends once that call returns.
    """

    def __init__(
        self,
        items: Iterable[T],
        place: Callable[[T], R],
        size: int,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self._out: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._slots = threading.Semaphore(size)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce,
            args=(iter(items), place, self._out, self._slots, self._stop),
            name=THREAD_NAME,
            daemon=True,
        )
        self._finalizer = weakref.finalize(
            self, _shutdown, self._thread, self._out, self._slots, self._stop, on_stop
        )
        self._thread.start()

    def __iter__(self) -> DevicePrefetcher[R]:
        return self

    def __next__(self) -> R:
        if self._done:
            raise StopIteration
        kind, value = self._out.get()
        if kind == _ITEM:
            self._slots.release()
            return value  # type: ignore[no-any-return]
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop and join the thread (within the grace); items not yet taken are dropped,
        and a ``next()`` waiting in another thread raises ``StopIteration``."""
        self._done = True
        self._finalizer()

    def __enter__(self) -> DevicePrefetcher[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_prefetch(value: object, name: str = "size") -> int:
    """Validate a prefetch depth: an int ``>= 0``."""
    out = parse_int(value, name)
    if out < 0:
        raise ValueError(f"{name}={out} must be >= 0 (0 places batches in the caller's thread)")
    return out


def prefetch_to_device(
    iterator: Iterable[Any],
    size: int = 2,
    *,
    sharding: Any = None,
    device: Any = None,
    dtype_policy: DtypePolicy = "safe",
) -> Iterator[Any]:
    """Batches of ``iterator`` as ``jax.Array`` pytrees, ``size`` of them already on device.

    Parameters
    ----------
    iterator
        Batch pytrees of NumPy arrays, e.g. a :class:`mixle.Loader`; may be endless.
    size
        Placed batches waiting for the caller (``>= 0``); 0 places each batch in the
        caller's thread when it is asked for, with no thread.
    sharding, device, dtype_policy
        Where and how each batch is placed, as in :func:`mixle.jax.to_jax`.

    Returns
    -------
    An iterator with ``close()``; use it in a ``for`` loop or a ``with`` block.

    Raises
    ------
    ValueError
        ``size < 0``, both ``device`` and ``sharding``, or an unknown ``dtype_policy``.

    Notes
    -----
    The background thread draws from ``iterator`` and calls ``to_jax``; an exception in
    either is re-raised in the caller's loop with its traceback. The thread stops and is
    joined at the end of the stream, on ``close()``, ``with`` exit, an exception (Ctrl-C
    too), or when the iterator is garbage collected (e.g. after ``break``); the source
    iterator is closed from that thread. A thread stuck in ``iterator`` is waited for at
    most :data:`~mixle.loading.prefetch.STOP_GRACE_S`, then left (a daemon) to end by
    itself.
    """
    depth = parse_prefetch(size)
    check_target(device, sharding)
    policy = parse_dtype_policy(dtype_policy)

    def place(batch: Any) -> Any:
        return to_jax(batch, device=device, sharding=sharding, dtype_policy=policy)

    if depth == 0:
        return place_each(iterator, place)
    return DevicePrefetcher(iterator, place, depth)


def place_each(items: Iterable[T], place: Callable[[T], R]) -> Iterator[R]:
    """``place(item)`` for each item, in the caller's thread; closing it closes ``items``."""
    source = iter(items)
    try:
        for item in source:
            yield place(item)
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()
