"""Execute read plans: decode each touched chunk once and scatter it into the output."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mixle.reading.cache import ChunkCache
from mixle.reading.plan import ChunkPlan, Piece, order_by_offset, plan_chunks
from mixle.reading.pool import decode_threads, run_all
from mixle.reading.process_cache import chunk_cache

__all__ = [
    "CLAIM_WAIT_S",
    "SCRATCH_KEPT_BYTES",
    "STRIDED_BYTES_PER_THREAD",
    "ChunkReader",
    "SupportsDecodeInto",
    "SupportsFetchMany",
    "execute_plan",
    "new_token",
    "read_chunked",
    "read_strided",
    "reader_threads",
]

#: Copies from a memory map are split across decode threads only in runs of at least this
#: many bytes: smaller copies cost more in thread hand-offs than they gain.
STRIDED_BYTES_PER_THREAD = 4 * 1024 * 1024

_tokens = itertools.count()


def new_token() -> int:
    """A process-unique cache token for a newly opened store handle."""
    return next(_tokens)


@runtime_checkable
class ChunkReader(Protocol):
    """Reads and decodes whole stored chunks of one array.

    Storage adapters implement this to plug into the read planner.

    Attributes
    ----------
    chunks
        Chunk extent per axis.
    token
        Distinguishes this open store in the shared cache (see :func:`new_token`).

    A reader may also set ``max_decode_threads`` (an int) to cap how many decode threads
    read from it at once (see :func:`reader_threads`).
    """

    chunks: tuple[int, ...]
    token: int

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray:
        """Chunk ``coords`` of the chunk grid, decoded.

        The result covers at least the part of the chunk inside the array (edge chunks may
        be returned whole or clipped). Called from several threads at once.
        """
        ...


@runtime_checkable
class SupportsFetchMany(Protocol):
    """A :class:`ChunkReader` whose store answers many concurrent requests (object stores).

    The executor asks for every chunk a batch misses in the cache with one
    :meth:`fetch_many` call, so the reader can issue the requests concurrently and merge
    requests for nearby bytes, then decodes each payload with :meth:`decode` on the pool.
    A reader may also offer ``fetch_each(coords)``: the same requests, as an iterator of
    ``(position in coords, payload)`` groups in the order they arrive (every position once;
    closing it cancels what is still in flight), so decoding overlaps the fetch.
    """

    chunks: tuple[int, ...]
    token: int

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray: ...

    def fetch_many(self, coords: Sequence[tuple[int, ...]]) -> list[Any]:
        """Stored payloads of chunks ``coords`` in order; ``None`` for a chunk never written."""
        ...

    def decode(self, coords: tuple[int, ...], raw: Any) -> np.ndarray:
        """Chunk ``coords`` decoded from its payload (``None``: the fill value)."""
        ...


@runtime_checkable
class SupportsDecodeInto(Protocol):
    """A :class:`ChunkReader` that decodes a chunk into a buffer the read planner gives it.

    The planner hands :meth:`decode_into` a function giving a buffer of the cache's (the
    pages of an evicted chunk, so nothing is allocated or copied to keep it) or, for a chunk
    that will not be kept, a scratch buffer of the decoding thread that its next chunk
    reuses. A reader that also has ``read_stored(coords)`` (the stored bytes, ``None`` for
    a chunk never written) gets its read and its decode timed apart; without it the
    planner reads with ``fetch_many`` (then decodes with :meth:`decode_into`) or
    ``read_chunk``.

    Attributes
    ----------
    decoded_nbytes
        Bytes of one decoded chunk: the size of every buffer handed to :meth:`decode_into`.
    """

    chunks: tuple[int, ...]
    token: int
    decoded_nbytes: int

    def read_chunk(self, coords: tuple[int, ...]) -> np.ndarray: ...

    def decode_into(
        self, coords: tuple[int, ...], raw: Any, out: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """Chunk ``coords`` decoded from ``raw``, into the buffer ``out()`` gives where it can.

        ``out()`` gives a writable ``uint8`` buffer of ``decoded_nbytes``: call it once, and
        only after the stored bytes were checked (a damaged chunk then allocates nothing;
        chunk metadata claiming a terabyte allocates nothing until the stored bytes say
        so). The result may be another array (a chunk never written, a codec that cannot
        write into a buffer) but never a view of ``raw``, which the caller may reuse at once.
        """
        ...


def read_chunked(
    reader: ChunkReader,
    starts: Sequence[Sequence[int]],
    size: Sequence[int],
    shape: Sequence[int],
    out: np.ndarray,
    *,
    cache: ChunkCache | None = None,
) -> ChunkPlan:
    """Fill ``out[b]`` with box ``b`` by decoding every chunk the boxes touch once.

    Boxes must lie inside ``shape`` (callers validate). Chunks come from ``cache`` (default:
    the process-wide :func:`~mixle.reading.process_cache.chunk_cache`) or are read with
    ``reader.read_chunk`` on the decode pool and kept there. A reader with ``fetch_many``
    (:class:`SupportsFetchMany`) gets every missing chunk in one call instead, and the pool
    only decodes. Returns the plan it executed.

    On ``KeyboardInterrupt`` no thread takes another chunk and running ones are waited for
    up to :data:`~mixle.reading.pool.INTERRUPT_GRACE_S`; a decode thread still in a chunk
    after that (a stalled store) copies its pieces into ``out`` after the interrupt was
    raised here: do not reuse an ``out`` array of an interrupted read.
    """
    plan = plan_chunks(starts, size, reader.chunks, shape)
    execute_plan(reader, plan, out, cache=cache)
    return plan


def execute_plan(
    reader: ChunkReader, plan: ChunkPlan, out: np.ndarray, *, cache: ChunkCache | None = None
) -> None:
    """Fill ``out`` as ``plan`` says, decoding each of its chunks once (see :func:`read_chunked`).

    ``out[(box, *region)] = chunk[inner]`` for every piece; a plan made by other means than
    :func:`~mixle.reading.plan.plan_chunks` (strided selections) runs the same way.
    """
    store = chunk_cache() if cache is None else cache
    if getattr(reader, "fetch_many", None) is not None:
        _read_fetched(reader, plan, store, out)  # type: ignore[arg-type]
        return
    token = reader.token
    # every chunk this batch finds cached is held until it is scattered: no decode of the
    # same batch can evict one before its turn
    found: list[np.ndarray | None] = [store.get((token, c)) for c in plan.chunks]
    load = _loader(reader, store)
    tickets = itertools.count()  # next() on a count is atomic: each job is taken once
    abandoned: list[bool] = []

    def drain() -> None:
        clock = [0.0, 0.0, 0.0, 0]
        later: list[tuple[int, threading.Event]] = []  # chunks another thread is decoding
        try:
            while not abandoned and (k := next(tickets)) < len(found):
                chunk = found[k]
                if chunk is None:
                    key = (token, plan.chunks[k])
                    got = store.claim(key)
                    if isinstance(got, threading.Event):
                        later.append((k, got))
                        continue
                    chunk = _load_claimed(load, store, key, clock) if got is None else got
                found[k] = None
                _scatter(out, plan.pieces[k], chunk, clock)
                del chunk
            for k, loading in later:  # what other threads were decoding: done by now, mostly
                if abandoned:
                    break
                chunk = _claimed_after_wait(load, store, (token, plan.chunks[k]), loading, clock)
                _scatter(out, plan.pieces[k], chunk, clock)
                del chunk
        finally:
            store.add_seconds(clock[0], clock[1], clock[2], int(clock[3]))

    _run_abandonable([drain] * min(reader_threads(reader), len(found)), abandoned)


def _load_claimed(
    load: _Load, store: ChunkCache, key: tuple[int, tuple[int, ...]], clock: list[float]
) -> np.ndarray:
    """``load`` a chunk this thread claimed; the claim ends whatever happens."""
    try:
        return _load(load, key, clock)
    finally:
        store.unclaim(key)


def _claimed_after_wait(
    load: _Load,
    store: ChunkCache,
    key: tuple[int, tuple[int, ...]],
    loading: threading.Event,
    clock: list[float],
) -> np.ndarray:
    """A chunk another thread was decoding: cached by it, or (not kept there) decoded here.

    Waits at most :data:`CLAIM_WAIT_S` for each claim, then decodes without one.
    """
    for _ in range(2):
        if not loading.wait(CLAIM_WAIT_S):
            break
        got = store.claim(key)
        if got is None:
            return _load_claimed(load, store, key, clock)
        if not isinstance(got, threading.Event):
            return got
        loading = got  # a third thread claimed it meanwhile: wait once more
    return _load(load, key, clock)  # do not wait again: decode it here


def _load(load: _Load, key: tuple[int, tuple[int, ...]], clock: list[float]) -> np.ndarray:
    clock[3] += 1
    return load(key[1], clock)


def _scatter(out: np.ndarray, pieces: list[Piece], chunk: np.ndarray, clock: list[float]) -> None:
    """``out[(box, *region)] = chunk[inner]`` for every piece, timed."""
    start = time.perf_counter()
    for box, region, inner in pieces:
        out[(box, *region)] = chunk[inner]
    clock[2] += time.perf_counter() - start


#: ``(coords, [read, decode, scatter seconds]) -> chunk``: reads, decodes and keeps a chunk.
_Load = Callable[[tuple[int, ...], list[float]], np.ndarray]

_scratch = threading.local()
#: A thread keeps its scratch buffer for the next chunk only up to this size.
SCRATCH_KEPT_BYTES = 16 * 1024 * 1024
#: A batch waits at most this long for a chunk another thread is decoding, then decodes it
#: itself (that thread may have been interrupted before it could say it was done).
CLAIM_WAIT_S = 10.0


def _scratch_buffer(nbytes: int) -> np.ndarray:
    """This thread's buffer for chunks that will not be kept (reused by its next chunk).

    Buffers larger than :data:`SCRATCH_KEPT_BYTES` are not kept for the next chunk.
    """
    buffer: np.ndarray | None = getattr(_scratch, "buffer", None)
    if buffer is not None and buffer.nbytes == nbytes:
        return buffer
    buffer = np.empty(nbytes, dtype=np.uint8)
    if nbytes <= SCRATCH_KEPT_BYTES:
        _scratch.buffer = buffer
    return buffer


class _Target:
    """The buffer a chunk is decoded into, asked for once its stored bytes were checked.

    A cache lease (the chunk is kept) or this thread's scratch (it is not).
    """

    __slots__ = ("_key", "_nbytes", "_store", "scratch")

    def __init__(self, store: ChunkCache, key: Hashable, nbytes: int) -> None:
        self._store, self._key, self._nbytes = store, key, nbytes
        self.scratch: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        leased = self._store.lease(self._key, self._nbytes)
        if leased is not None:
            return leased
        self.scratch = _scratch_buffer(self._nbytes)
        return self.scratch


def _decode_kept(
    reader: SupportsDecodeInto, store: ChunkCache, key: Hashable, coords: tuple[int, ...], raw: Any
) -> np.ndarray:
    """Chunk ``coords`` decoded into a cache buffer (kept), or into scratch (not kept)."""
    target = _Target(store, key, reader.decoded_nbytes)
    chunk = reader.decode_into(coords, raw, target)
    scratch = target.scratch
    borrowed = scratch is not None and np.may_share_memory(chunk, scratch)
    return store.put(key, chunk, borrowed=borrowed)


def _loader(reader: ChunkReader, store: ChunkCache) -> _Load:
    """How the drain loop gets a chunk the cache does not hold: timed, kept if it fits."""
    token = reader.token
    read_stored = getattr(reader, "read_stored", None)
    if read_stored is not None and getattr(reader, "decoded_nbytes", None) is not None:
        into: SupportsDecodeInto = reader  # type: ignore[assignment]

        def decoded(coords: tuple[int, ...], clock: list[float]) -> np.ndarray:
            start = time.perf_counter()
            raw = read_stored(coords)
            read = time.perf_counter()
            chunk = _decode_kept(into, store, (token, coords), coords, raw)
            clock[0] += read - start
            clock[1] += time.perf_counter() - read
            return chunk

        return decoded

    def loaded(coords: tuple[int, ...], clock: list[float]) -> np.ndarray:
        start = time.perf_counter()
        chunk = reader.read_chunk(coords)
        clock[1] += time.perf_counter() - start
        return store.put((token, coords), chunk)

    return loaded


def reader_threads(reader: object) -> int:
    """How many decode threads may read from ``reader`` at once.

    :func:`~mixle.reading.pool.decode_threads`, or fewer when the reader says so with a
    ``max_decode_threads`` attribute: a decoder that holds the GIL throughout (python-blosc2)
    gains nothing from a second thread and loses to the threads taking turns.
    """
    limit = getattr(reader, "max_decode_threads", None)
    threads = decode_threads()
    return threads if limit is None else max(1, min(int(limit), threads))


def _run_abandonable(tasks: list[Callable[[], None]], abandoned: list[bool]) -> None:
    """:func:`run_all`; on Ctrl-C the tasks still running take no further chunk."""
    try:
        run_all(tasks, on_interrupt=lambda: abandoned.append(True))
    except BaseException as exc:
        if not isinstance(exc, Exception):  # KeyboardInterrupt: the output is abandoned
            abandoned.append(True)
        raise


def _read_fetched(
    reader: SupportsFetchMany, plan: ChunkPlan, store: ChunkCache, out: np.ndarray
) -> None:
    """Look every chunk up in the cache, fetch all misses at once, decode and scatter.

    With ``fetch_each`` the chunks are decoded as their payloads arrive: one at a time in
    the calling thread while the others are in flight, or shared out over the decode pool
    when several arrived together; without it, after the whole fetch.
    """
    token = reader.token
    found: list[np.ndarray | None] = [store.get((token, c)) for c in plan.chunks]
    missing = [k for k, chunk in enumerate(found) if chunk is None]
    each = getattr(reader, "fetch_each", None)
    arrivals: Iterator[list[tuple[int, Any]]] = iter(())
    if missing:
        wanted = [plan.chunks[k] for k in missing]
        arrivals = (
            each(wanted) if each is not None else iter([list(enumerate(reader.fetch_many(wanted)))])
        )
    try:
        _place(
            reader,
            plan,
            store,
            out,
            [(k, chunk, True) for k, chunk in enumerate(found) if chunk is not None],
        )
        while True:
            start = time.perf_counter()
            group = next(arrivals, None)
            store.add_seconds(time.perf_counter() - start, 0.0, 0.0)
            if group is None:
                break
            _place(reader, plan, store, out, [(missing[j], raw, False) for j, raw in group])
    finally:
        getattr(arrivals, "close", lambda: None)()  # cancels requests still in flight


def _place(
    reader: SupportsFetchMany,
    plan: ChunkPlan,
    store: ChunkCache,
    out: np.ndarray,
    jobs: list[tuple[int, Any, bool]],
) -> None:
    """Scatter chunks ``(k, chunk or payload, decoded?)`` into ``out``, on the decode pool."""
    tickets = itertools.count()  # next() on a count is atomic: each job is taken once
    abandoned: list[bool] = []
    into = getattr(reader, "decoded_nbytes", None) is not None

    def drain() -> None:
        clock = [0.0, 0.0, 0.0, 0]
        try:
            while not abandoned and (n := next(tickets)) < len(jobs):
                k, chunk, decoded = jobs[n]
                if not decoded:
                    coords, key = plan.chunks[k], (reader.token, plan.chunks[k])
                    start = time.perf_counter()
                    if into:
                        chunk = _decode_kept(reader, store, key, coords, chunk)  # type: ignore[arg-type]
                    else:
                        chunk = store.put(key, reader.decode(coords, chunk))
                    jobs[n] = (k, None, True)  # free the stored bytes as soon as they are decoded
                    clock[1] += time.perf_counter() - start
                    clock[3] += 1
                _scatter(out, plan.pieces[k], chunk, clock)
                del chunk
        finally:
            store.add_seconds(clock[0], clock[1], clock[2], int(clock[3]))

    _run_abandonable([drain] * min(decode_threads(), len(jobs)), abandoned)


def read_strided(
    array: np.ndarray, starts: Sequence[Sequence[int]], size: Sequence[int], out: np.ndarray
) -> None:
    """Copy boxes of an unchunked (memory-mapped) array into ``out``, in file order.

    Boxes are visited by increasing byte offset; large batches are split into one
    contiguous run per decode thread, so each thread sweeps forward through its part of the
    file. ``array`` is best a plain ndarray view of the map (``np.memmap`` slicing costs
    microseconds per box).
    """
    if len(starts) == 1:  # one box (per-index reads): no ordering, no pool
        out[0] = array[tuple(slice(a, a + n) for a, n in zip(starts[0], size))]
        return
    order = order_by_offset(starts, array.strides).tolist()
    box_bytes = out[0].nbytes
    parts = max(1, min(decode_threads(), len(order) * box_bytes // STRIDED_BYTES_PER_THREAD))
    bounds = [len(order) * k // parts for k in range(parts + 1)]

    def copy(lo: int, hi: int) -> Callable[[], None]:
        def run() -> None:
            for b in order[lo:hi]:
                row = starts[b]
                out[b] = array[tuple(slice(a, a + n) for a, n in zip(row, size))]

        return run

    run_all([copy(bounds[k], bounds[k + 1]) for k in range(parts)])
