"""Many volumes as one lazy, index-addressable collection: :func:`read_volumes`."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from mixle.data.sources.arrays.adopt import ArrayLikeSource
from mixle.data.sources.arrays.base import ArraySource
from mixle.data.sources.arrays.physical import Physical
from mixle.data.sources.collection.handles import HandlePool
from mixle.data.sources.collection.inputs import (
    ParsedVolumes,
    TableColumnsLike,
    VolumesLike,
    parse_volumes,
)
from mixle.data.sources.collection.openers import (
    OpenOptions,
    is_url,
    open_volume,
    volume_format,
)
from mixle.errors import ColumnNotFoundError, SourceClosedError, VolumeMismatchError
from mixle.utils.forks import ForkLock

__all__ = ["DEFAULT_MAX_OPEN", "VolumeCollection", "VolumeMismatchError", "read_volumes"]

#: Descriptors one live volume may hold: an HDF5 volume keeps h5py's and its chunk reader's.
DESCRIPTORS_PER_VOLUME = 2
#: The default bound lets live volumes use at most ``1 / DESCRIPTOR_SHARE`` of the
#: process's descriptor limit (``RLIMIT_NOFILE``), between these two numbers of volumes.
DESCRIPTOR_SHARE = 4
#: The default bound's floor (also the default where the limit cannot be read) and its cap
#: (a live volume also holds memory: its metadata and chunk reader).
MIN_DEFAULT_MAX_OPEN = 64
MAX_DEFAULT_MAX_OPEN = 256


def default_max_open(soft_limit: int | None = None) -> int:
    """The default ``max_open`` for a descriptor limit (default: this process's soft one).

    A quarter of the limit, at :data:`DESCRIPTORS_PER_VOLUME` descriptors a volume, clamped
    to ``[MIN_DEFAULT_MAX_OPEN, MAX_DEFAULT_MAX_OPEN]``; an unlimited limit gives the cap,
    one that cannot be read (no ``resource`` module) the floor.
    """
    if soft_limit is None:
        try:
            import resource
        except ImportError:  # Windows
            return MIN_DEFAULT_MAX_OPEN
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft_limit == resource.RLIM_INFINITY:
            return MAX_DEFAULT_MAX_OPEN
    if soft_limit < 0:  # RLIM_INFINITY on some platforms
        return MAX_DEFAULT_MAX_OPEN
    share = soft_limit // (DESCRIPTOR_SHARE * DESCRIPTORS_PER_VOLUME)
    return max(MIN_DEFAULT_MAX_OPEN, min(MAX_DEFAULT_MAX_OPEN, share))


#: Default bound on volumes with a live handle at once (``max_open=``), from this process's
#: descriptor limit when mixle is imported (:func:`default_max_open`; 128 at the common
#: limit of 1,024, 256 from 2,048 up).
DEFAULT_MAX_OPEN = default_max_open()
#: Most threads :meth:`VolumeCollection.shapes` reads metadata with (and never past ``max_open``).
SHAPE_THREADS = 16
#: Locks guarding the creation of volume sources, shared by index modulo this.
_CREATE_LOCKS = 64

#: Serialises the one reset of each collection in a forked child.
_fork_lock = ForkLock()


#: A volume: its source, or its sources by array name.
Volume = ArraySource | dict[str, ArraySource]
Shape = tuple[int, ...]


class _Lease:
    """``with vols.lease(i) as src``: the volume, kept open until the block ends."""

    __slots__ = ("_i", "_owner")

    def __init__(self, owner: VolumeCollection, i: int) -> None:
        self._owner = owner
        self._i = i

    def __enter__(self) -> Any:
        owner, i = self._owner, self._i
        owner._reference_layout(i)
        owner._pool.acquire(i)
        try:
            return owner._volume(i)
        except BaseException:
            if owner._sources[i] is None:  # nothing opened: it holds no handle
                owner._pool.forget(i)
            owner._pool.release(i)
            raise

    def __exit__(self, *exc: object) -> None:
        self._owner._pool.release(self._i)


class VolumeCollection:
    """A lazy collection of N-D volumes (one array, or aligned arrays by name, each).

    Build one with :func:`mixle.read_volumes`. Nothing is read until a volume is used.

    Notes
    -----
    - ``vols[i]`` is volume ``i``'s :class:`~mixle.ArraySource` (or ``{name: source}``),
      created on first use and the same object every time after.
    - ``with vols.lease(i) as src:`` gives the same object, marked in use: at most
      ``max_open`` volumes keep live handles (descriptors, stores), least recently used
      given back first, and a leased volume is never given back. Giving back does not close
      the source: it drops its handle (:meth:`~mixle.ArraySource.release_handle`) and the
      next read reopens it, with chunks cached under a new identity (never stale). When
      every live volume is leased a new lease goes over the bound by those leases. A volume
      of aligned arrays counts once and holds one handle per array.
      The bound holds for reads made inside leases: a source kept from ``vols[i]`` and read
      later reopens outside the count (and another thread may give back its handle while it
      reads, so read through :meth:`lease` whenever threads share the collection).
    - Shapes and dtypes are metadata: :meth:`shape`, :meth:`shapes` (local files in turn,
      remote volumes in parallel, within ``max_open``), :meth:`dtype_of`; shapes are cached
      and pickled. So is each volume's geometry: :meth:`physical`, :meth:`spacing` (cached,
      not pickled).
    - On first use volume ``i``'s dtype and number of dimensions are compared with volume
      0's; a difference raises :class:`VolumeMismatchError` naming the volume, unless
      ``dtype=`` was given (then only the number of dimensions must agree; the samplers
      cast every patch to :attr:`dtype`).
    - Pickling stores the entries (paths, or the sources' own by-reference pickles), the
      table's reference, the options and the cached shapes; never an open handle. Its size
      does not depend on how many volumes were opened. A copy, or the collection in a forked
      child, opens each volume again on first use.
    - Thread-safe.
    """

    def __init__(
        self,
        parsed: ParsedVolumes,
        options: OpenOptions,
        *,
        dtype: DTypeLike | None = None,
        max_open: int = DEFAULT_MAX_OPEN,
        shapes: dict[str, NDArray[np.int64]] | None = None,
        known: NDArray[np.bool_] | None = None,
        layout: dict[str | None, tuple[np.dtype, int]] | None = None,
    ) -> None:
        self._parsed = parsed
        self._options = options
        self._cast = None if dtype is None else np.dtype(dtype)
        self._max_open = _check_max_open(max_open)
        n = len(parsed.entries)
        self._shape_cache = {} if shapes is None else dict(shapes)
        self._known = np.zeros(n, dtype=bool) if known is None else known.copy()
        self._layout = layout  # volume 0's {name: (dtype, ndim)}, None until read
        self._dtypes: dict[int, Any] = {}  # stored dtypes of opened volumes (not pickled)
        self._physical: dict[int, Any] = {}  # geometry of volumes asked for (not pickled)
        self._closed = False
        self._reset_live()

    def _reset_live(self) -> None:
        """No source created yet, this process's locks and pool."""
        n = len(self._parsed.entries)
        self._sources: list[Volume | None] = [None] * n
        self._locks = [threading.RLock() for _ in range(min(n, _CREATE_LOCKS))]
        self._lock = threading.RLock()
        self._pool = HandlePool(self._max_open, self._give_back)
        #: id of a source handed in for more than one volume -> those volumes
        self._holders = _shared_sources(self._parsed.entries)
        self._pid = os.getpid()

    # -- what it holds ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._parsed.entries)

    @property
    def keys(self) -> tuple[str, ...]:
        """One unique key per volume: its path (dicts: the first array's), ``"#i"``, or ``key=``."""
        return self._parsed.keys

    @property
    def names(self) -> tuple[str, ...] | None:
        """The array names of volumes of aligned arrays, ``None`` for one array per volume."""
        return self._parsed.names

    @property
    def columns(self) -> tuple[str, ...]:
        """The per-volume metadata columns (a table's other columns, dicts' other entries)."""
        return self._parsed.columns

    @property
    def max_open(self) -> int:
        """The most volumes with a live handle at once (see the class notes)."""
        return self._max_open

    @property
    def cast(self) -> np.dtype | None:
        """The ``dtype=`` every volume is cast to, or ``None``."""
        return self._cast

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _index(self, i: object) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"volume index {i!r} must be an int")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"volume index {int(i)} is out of range for {n} volumes [-{n}, {n})")
        return j

    def _check_open(self, doing: str = "read it") -> None:
        if self._closed:
            raise SourceClosedError(f"{self!r} is closed; open it again to {doing}")
        if self._pid != os.getpid():
            # the first thread of a forked child resets what it inherited; not under
            # self._lock, which a thread of the parent may have held at the fork
            with _fork_lock:
                if self._pid != os.getpid():
                    sources = self._sources
                    self._reset_live()
                    self._sources = sources  # kept: each reopens its own handle here

    # -- volumes ------------------------------------------------------------------------
    def __getitem__(self, i: int) -> Volume:
        """Volume ``i``'s source (``{name: source}`` for aligned arrays); negative ``i`` ok."""
        with self.lease(i) as volume:
            return volume  # type: ignore[no-any-return]

    def lease(self, i: int) -> _Lease:
        """``with vols.lease(i) as src:`` volume ``i``, not given back until the block ends."""
        self._check_open()
        return _Lease(self, self._index(i))

    def _volume(self, i: int) -> Volume:
        """Volume ``i``'s source(s), created and checked on first use (leased by the caller)."""
        volume = self._sources[i]
        if volume is not None:
            self._reopen(i, volume)
            return volume
        with self._locks[i % len(self._locks)]:
            volume = self._sources[i]
            if volume is None:
                volume = self._open(i)
                if self._closed:  # closed while it opened: keep nothing
                    self._close_volume(i, volume)
                    self._check_open()
                self._sources[i] = volume
        return volume

    def _reopen(self, i: int, volume: Volume) -> None:
        """Reopen handles given back earlier, naming the volume if that fails (file gone)."""
        items = volume.items() if isinstance(volume, dict) else [(None, volume)]
        for name, src in items:
            if src._handle is None and not src.closed:
                try:
                    src._live()
                except Exception as exc:
                    raise _named(exc, self._where(i, name)) from exc

    def _open(self, i: int) -> Volume:
        entry = self._parsed.entries[i]
        if isinstance(entry, dict):
            volume: Volume = {}
            try:
                for name, item in entry.items():
                    volume[name] = self._open_array(i, item, name)
            except BaseException:
                self._close_volume(i, volume)
                raise
        else:
            volume = self._open_array(i, entry, None)
        try:
            self._check_layout(i, volume)
        except BaseException:
            self._close_volume(i, volume)
            raise
        return volume

    def _open_array(self, i: int, item: Any, name: str | None) -> ArraySource:
        if isinstance(item, ArraySource):
            try:
                item._live()  # reopens a given-back handle: counted by the lease
            except Exception as exc:
                raise _named(exc, self._where(i, name)) from exc
            return item
        what = self._where(i, name)
        fmt = volume_format(item, self._options, what)
        try:
            return open_volume(item, fmt, name, self._options)
        except Exception as exc:
            raise _named(exc, what) from exc

    def _where(self, i: int, name: str | None = None) -> str:
        lead = "volumes= " if self._parsed.origin == "row" else ""
        where = f"{lead}{self._parsed.where(i)} (key {self.keys[i]!r}"
        return where + (f", array {name!r})" if name is not None else ")")

    def _layout_of(self, volume: Volume) -> dict[str | None, tuple[np.dtype, int]]:
        if isinstance(volume, dict):
            return {name: (src.dtype, src.ndim) for name, src in volume.items()}
        return {None: (volume.dtype, volume.ndim)}

    def _reference_layout(self, i: int) -> None:
        """Read volume 0's layout (before volume ``i`` is leased, so one lease at a time)."""
        if self._layout is None and i != 0:
            with self.lease(0):
                pass

    def _check_layout(self, i: int, volume: Volume) -> None:
        layout = self._layout_of(volume)
        self._dtypes[i] = (
            {name: dt for name, (dt, _) in layout.items()}
            if isinstance(volume, dict)
            else layout[None][0]
        )
        with self._lock:
            if self._layout is None and i == 0:
                self._layout = layout
            reference = self._layout
        if reference is None or reference is layout:
            return
        for name, (dt, ndim) in layout.items():
            ref_dtype, ref_ndim = reference[name]
            array = "" if name is None else f" array {name!r}"
            if ndim != ref_ndim:
                raise VolumeMismatchError(
                    f"{self._where(i)}{array} has {ndim} dimensions but volume 0 "
                    f"({self.keys[0]!r}) has {ref_ndim}: every volume needs the same axes "
                    "(channels included)"
                )
            if self._cast is None and dt != ref_dtype:
                raise VolumeMismatchError(
                    f"{self._where(i)}{array} has dtype {dt} but volume 0 ({self.keys[0]!r}) "
                    f"has {ref_dtype}: pass dtype= (e.g. dtype='float32') to read every "
                    "volume cast to one dtype"
                )

    def _give_back(self, i: int) -> None:
        """Drop volume ``i``'s handles (the pool's ``release``; the sources stay usable).

        A source handed in for several volumes (one mask in every dict) keeps its handle
        while another of those volumes is live: it may be reading through it.
        """
        volume = self._sources[i]
        if volume is None:  # not created (yet, or its opening failed)
            return
        for src in volume.values() if isinstance(volume, dict) else (volume,):
            others = self._holders.get(id(src), ())
            if any(j != i and self._pool.is_live_locked(j) for j in others):
                continue
            src.release_handle()

    def _owns(self, i: int, name: str | None) -> bool:
        """Whether the collection made volume ``i``'s source (from a path) or was handed it."""
        entry = self._parsed.entries[i]
        item = entry[name] if isinstance(entry, dict) and name is not None else entry
        return isinstance(item, str)

    def _close_volume(self, i: int, volume: Volume) -> None:
        items = volume.items() if isinstance(volume, dict) else ((None, volume),)
        for name, src in items:
            if self._owns(i, name):
                src.close()
            else:
                src.release_handle()

    # -- metadata -----------------------------------------------------------------------
    def shape(self, i: int) -> Shape | dict[str, Shape]:
        """Volume ``i``'s full shape (``{name: shape}`` for aligned arrays); cached."""
        self._check_open()
        j = self._index(i)
        if not self._known[j]:
            with self.lease(j) as volume:
                self._remember(j, volume)
        return self._cached_shape(j)

    def _remember(self, i: int, volume: Volume) -> None:
        shapes = (
            {name: src.shape for name, src in volume.items()}
            if isinstance(volume, dict)
            else {"": volume.shape}
        )
        with self._lock:
            for name, shape in shapes.items():
                table = self._shape_cache.get(name)
                if table is None:
                    table = np.full((len(self), len(shape)), -1, dtype=np.int64)
                    self._shape_cache[name] = table
                table[i] = shape
            self._known[i] = True

    def _cached_shape(self, i: int) -> Shape | dict[str, Shape]:
        if self.names is None:
            return tuple(int(n) for n in self._shape_cache[""][i])
        return {name: tuple(int(n) for n in self._shape_cache[name][i]) for name in self.names}

    def shapes(self) -> list[Any]:
        """Every volume's shape, in order (see :meth:`shape`); unknown remote ones in parallel.

        Volumes that may be remote (URLs, sources handed in that are not local files) are
        read by at most ``min(max_open, SHAPE_THREADS)`` threads while the calling thread
        reads the local ones in turn: a local file's metadata is parsed in Python under the
        GIL, so threads would only contend for it. The bound on live handles holds
        throughout. An interrupt (Ctrl-C) or an error stops the remote reads not yet begun;
        the ones in flight end within the store's own timeouts.
        """
        self._check_open()
        missing = np.flatnonzero(~self._known).tolist()
        remote = [i for i in missing if self._may_be_remote(i)]
        local = [i for i in missing if not self._may_be_remote(i)] if remote else missing
        threads = min(self._max_open - 1, SHAPE_THREADS, len(remote))
        if threads < 2:  # one remote volume, or max_open too small to share
            local, remote = missing, []
        if remote:
            pool = ThreadPoolExecutor(threads, thread_name_prefix="mixle-shapes")
            try:
                done = pool.map(self.shape, remote)
                for i in local:
                    self.shape(i)
                list(done)
            finally:  # on Ctrl-C or an error: the shapes not yet asked for are not read
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            for i in local:
                self.shape(i)
        return [self._cached_shape(i) for i in range(len(self))]

    def _may_be_remote(self, i: int) -> bool:
        """Whether opening volume ``i`` may wait on a network (a URL, a store object)."""
        entry = self._parsed.entries[i]
        items = entry.values() if isinstance(entry, dict) else (entry,)
        for item in items:
            if isinstance(item, str):
                if is_url(item):
                    return True
            elif isinstance(item, ArraySource) and item._meta is None:
                path = (item._args or {}).get("path")
                if path is not None and not (isinstance(path, str) and not is_url(path)):
                    return True
        return False

    def shapes_array(self, name: str | None = None) -> NDArray[np.int64]:
        """Every volume's shape as an ``(n, ndim)`` int64 array (``name``: one aligned array)."""
        if self.names is None:
            if name is not None:
                raise ValueError(f"name={name!r}: the volumes hold one array each (no names)")
            key = ""
        else:
            if name not in self.names:
                raise ColumnNotFoundError(
                    f"name={name!r} is not an array of the volumes; their arrays: "
                    f"{', '.join(self.names)}"
                )
            key = name
        self.shapes()
        return self._shape_cache[key].copy()

    def dtype_of(self, i: int) -> np.dtype | dict[str, np.dtype]:
        """Volume ``i``'s stored dtype (``{name: dtype}`` for aligned arrays), before any cast."""
        self._check_open()
        j = self._index(i)
        if j not in self._dtypes:
            with self.lease(j):
                pass
        return self._dtypes[j]  # type: ignore[no-any-return]

    def physical(self, i: int) -> Physical | dict[str, Physical | None] | None:
        """Volume ``i``'s voxel-to-world geometry (``{name: ...}`` for aligned arrays).

        Metadata only (:attr:`~mixle.ArraySource.physical`: spacing, origin, affine, axis
        names and units where the format records them, else ``None``); cached.
        """
        self._check_open()
        j = self._index(i)
        if j not in self._physical:
            with self.lease(j) as volume:
                if isinstance(volume, dict):
                    found: Any = {name: src.physical for name, src in volume.items()}
                else:
                    found = volume.physical
            with self._lock:
                self._physical[j] = found
        return self._physical[j]  # type: ignore[no-any-return]

    def spacing(self, i: int) -> tuple[float, ...] | dict[str, tuple[float, ...] | None] | None:
        """Volume ``i``'s voxel spacing per axis, ``None`` if unrecorded (see :meth:`physical`)."""
        found = self.physical(i)
        if isinstance(found, dict):
            return {name: None if p is None else p.spacing for name, p in found.items()}
        return None if found is None else found.spacing

    @property
    def dtype(self) -> np.dtype | dict[str, np.dtype]:
        """The dtype patches come in: ``dtype=`` if given, else volume 0's (``{name: dtype}``)."""
        layout = self._reference()
        if self.names is None:
            return self._cast if self._cast is not None else layout[None][0]
        cast = self._cast
        return {name: layout[name][0] if cast is None else cast for name in self.names}

    @property
    def ndim(self) -> int | dict[str, int]:
        """Volume 0's number of dimensions (``{name: ndim}``); every volume has the same."""
        layout = self._reference()
        if self.names is None:
            return layout[None][1]
        return {name: layout[name][1] for name in self.names}

    def _reference(self) -> dict[str | None, tuple[np.dtype, int]]:
        if self._layout is None:
            self._check_open()
            with self.lease(0):
                pass
        assert self._layout is not None
        return self._layout

    def metadata(self, i: int) -> dict[str, Any]:
        """Volume ``i``'s metadata: its table row (path columns left out) or dict entries."""
        self._check_open()
        j = self._index(i)
        table = self._parsed.table
        if table is None:
            return {}
        row = table[j]
        return {column: row[column] for column in self.columns}

    def metadata_batch(
        self, indices: ArrayLike, columns: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The metadata ``columns`` (default: all) of volumes ``indices``, one array each."""
        self._check_open()
        wanted = list(self.columns if columns is None else columns)
        for column in wanted:
            if column not in self.columns:
                raise ColumnNotFoundError(
                    f"columns= names {column!r}, not a metadata column of the volumes; "
                    f"their columns: {', '.join(self.columns) or '(none)'}"
                )
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        table = self._parsed.table
        if table is None or not wanted:
            return {}
        batch = table.get_batch(idx)
        return {column: batch[column] for column in wanted}

    def fingerprint(self) -> str:
        """A digest of what the collection is (count, keys, names, cast, options); no I/O."""
        options = self._options
        described = {
            "n": len(self),
            "keys": list(self.keys),
            "names": None if self.names is None else list(self.names),
            "dtype": None if self._cast is None else self._cast.str,
            "dataset": options.dataset,
            "component": options.component,
            "raw": [
                None if options.raw_dtype is None else options.raw_dtype.str,
                options.raw_shape,
                options.raw_offset,
            ],
            "given": [_given_identity(entry) for entry in self._parsed.entries],
        }
        if options.mask_and_scale:  # only when on: digests made before it existed still match
            described["mask_and_scale"] = True
        text = json.dumps(described, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the volumes the collection opened; release the handles of sources given.

        Sources passed in ``volumes=`` are the caller's: their handles are dropped, they are
        not closed. Later reads raise :class:`~mixle.SourceClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        self._pool.clear()
        for i, volume in enumerate(self._sources):
            if volume is not None:
                self._close_volume(i, volume)
        self._sources = [None] * len(self)

    def __enter__(self) -> VolumeCollection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        n = len(self)
        first = self.keys[0] if n else ""
        parts = [f"{n} volume{'s' if n != 1 else ''}", f"first={first!r}"]
        if self.names is not None:
            parts.append(f"names={self.names}")
        if self._cast is not None:
            parts.append(f"dtype={self._cast}")
        if self.columns:
            parts.append(f"columns={self.columns}")
        if self._closed:
            return f"<VolumeCollection {', '.join(parts)} (closed)>"
        return f"VolumeCollection({', '.join(parts)}, max_open={self._max_open})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise SourceClosedError(f"{self!r} is closed; open it again to pickle it")
        state = {
            "parsed": self._parsed,
            "options": self._options,
            "dtype": self._cast,
            "max_open": self._max_open,
            "shapes": self._shape_cache,
            "known": self._known,
            "layout": self._layout,
        }
        return (_rebuild, (state,))


def _given_identity(entry: Any) -> Any:
    """What tells a source handed in apart without reading it: type and location.

    In-memory arrays add their shape and dtype (in memory, no I/O); paths give ``None``
    (the key is the path).
    """
    items = entry.items() if isinstance(entry, dict) else [(None, entry)]
    out = []
    for name, item in items:
        if not isinstance(item, ArraySource):
            out.append(None)
            continue
        ident = [name, type(item).__qualname__, item._location()]
        if isinstance(item, ArrayLikeSource) and not item.closed:
            ident += [list(item.shape), str(item.dtype)]
        out.append(ident)
    return out


def _shared_sources(entries: list[Any]) -> dict[int, tuple[int, ...]]:
    """``{id(source): volumes}`` for sources handed in that more than one volume holds."""
    holders: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        items = entry.values() if isinstance(entry, dict) else (entry,)
        for item in {id(x): x for x in items if isinstance(x, ArraySource)}.values():
            holders.setdefault(id(item), []).append(i)
    return {k: tuple(v) for k, v in holders.items() if len(v) > 1}


def _rebuild(state: dict[str, Any]) -> VolumeCollection:
    """Unpickle a collection: nothing is opened until a volume is used."""
    parsed = state.pop("parsed")
    options = state.pop("options")
    return VolumeCollection(parsed, options, **state)


def _check_max_open(max_open: object) -> int:
    if isinstance(max_open, (bool, np.bool_)) or not isinstance(max_open, (int, np.integer)):
        raise TypeError(f"max_open={max_open!r} must be an int >= 1")
    if max_open < 1:
        raise ValueError(f"max_open={max_open!r} must be an int >= 1")
    return int(max_open)


def _named(exc: Exception, where: str) -> Exception:
    """``exc`` again, of the same type, its message led by the volume it happened to."""
    try:
        named = type(exc)(f"{where}: {exc}")
    except Exception:
        return exc
    return named if str(named).startswith(where) else exc


def _parse_options(
    dataset: Any,
    component: Any,
    raw_dtype: DTypeLike | None,
    raw_shape: int | Sequence[int] | None,
    raw_offset: int,
    storage_options: Mapping[str, Any] | None,
    mask_and_scale: bool = False,
) -> OpenOptions:
    for argument, value in (("dataset", dataset), ("component", component)):
        ok = value is None or isinstance(value, str)
        if isinstance(value, Mapping):
            ok = all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        if not ok:
            raise TypeError(f"{argument}={value!r} must be a string or {{array name: string}}")
    shape: tuple[int, ...] | None = None
    if raw_shape is not None:
        items = [raw_shape] if isinstance(raw_shape, (int, np.integer)) else list(raw_shape)
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in items):
            raise TypeError(f"raw_shape={raw_shape!r} must be an int or a sequence of ints")
        if any(s < 0 for s in items):
            raise ValueError(f"raw_shape={raw_shape!r} must hold non-negative extents")
        shape = tuple(int(s) for s in items)
    if isinstance(raw_offset, bool) or not isinstance(raw_offset, (int, np.integer)):
        raise TypeError(f"raw_offset={raw_offset!r} must be a non-negative int")
    if raw_offset < 0:
        raise ValueError(f"raw_offset={raw_offset!r} must be a non-negative int")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError("storage_options= must be a dict of fsspec options")
    if not isinstance(mask_and_scale, (bool, np.bool_)):
        raise TypeError(f"mask_and_scale={mask_and_scale!r} must be True or False")
    return OpenOptions(
        dataset=dict(dataset) if isinstance(dataset, Mapping) else dataset,
        component=dict(component) if isinstance(component, Mapping) else component,
        raw_dtype=None if raw_dtype is None else np.dtype(raw_dtype),
        raw_shape=shape,
        raw_offset=int(raw_offset),
        storage_options=None if storage_options is None else dict(storage_options),
        mask_and_scale=bool(mask_and_scale),
    )


def read_volumes(
    volumes: VolumesLike,
    *,
    dataset: str | Mapping[str, str] | None = None,
    component: str | Mapping[str, str] | None = None,
    table_columns: TableColumnsLike = None,
    key: str | Sequence[str] | None = None,
    raw_dtype: DTypeLike | None = None,
    raw_shape: int | Sequence[int] | None = None,
    raw_offset: int = 0,
    dtype: DTypeLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_open: int = DEFAULT_MAX_OPEN,
    mask_and_scale: bool = False,
) -> VolumeCollection:
    """Open many N-D volumes as one lazy :class:`VolumeCollection`; no volume is read.

    Parameters
    ----------
    volumes
        One of:

        - a list of paths or URLs: zarr stores (folders, ``*.zarr``, OME-Zarr too; local
          zipped stores ``*.zarr.zip``, read-only, with ``component=`` for the array inside
          them, as :func:`~mixle.read_zarr`), HDF5 files (``.h5``/``.hdf5``/``.hdf``/``.he5``
          with ``dataset=``) and netCDF-4 files (``.nc``/``.nc4``: HDF5 files, ``dataset=``
          naming the variable; netCDF-3 files are refused), ``.npy`` files, raw
          files (``.raw``/``.bin``/``.dat``, or any name with ``raw_dtype=``), N5
          containers (``.n5``, ``dataset=`` for a dataset inside); and local TIFF files
          (``.tif``/``.tiff``, OME-TIFF too), NIfTI files (``.nii``/``.nii.gz``), blosc2
          files (``.b2nd``) and ``.npz`` files (``dataset=`` naming the member when there
          are several);
        - a glob string (``"scans/*.zarr"``, ``**`` recursive), matched sorted;
        - a list of open mixle sources or array-likes (NumPy, zarr, h5py arrays);
        - a list of dicts, one per volume, ``{"image": path, "label": path, "age": 41}``:
          the array entries (``table_columns=``, or by default the entries holding a source,
          an array, a folder or a path with a volume suffix) are read as aligned arrays,
          the others become metadata;
        - a table: a mixle record source (``read_csv``, ``read_parquet``, ``read_sql``,
          ``read_dataframe``) or a pandas/polars DataFrame, with ``table_columns=`` naming
          its path column(s); its other columns become per-volume metadata.
    dataset, component
        The HDF5 dataset, N5 dataset or ``.npz`` member / zarr array inside each file or
        store; ``{name: ...}`` per array name for aligned arrays.
    table_columns
        A table's (or dicts') path column: a name (one array per volume), a list of names,
        or ``{array name: column}`` (aligned arrays per volume).
    key
        The column (table) or entry (dicts) holding each volume's key, or for a list one key
        string per volume. Default: each volume's path (aligned arrays: the first array's
        path), ``"#i"`` for sources and arrays.
    raw_dtype, raw_shape, raw_offset
        Layout of raw files (:func:`mixle.read_memmap`).
    dtype
        Cast every volume to this dtype (volumes may then differ in dtype).
    storage_options
        fsspec options for URLs (never shown in reprs or errors).
    max_open
        The most volumes with a live handle at once (an int >= 1). The default,
        :data:`DEFAULT_MAX_OPEN`, is a quarter of the process's descriptor limit at two
        descriptors a volume (an HDF5 volume holds two, others one, a local zarr store none
        between reads), at least 64 and at most 256.
    mask_and_scale
        ``True``: zarr and HDF5/netCDF-4 volumes decode CF packing (``scale_factor``,
        ``add_offset``, fill values as NaN), as ``read_zarr(..., mask_and_scale=True)``;
        ``False`` (default): the stored values. Other formats are read as their readers
        read them. Kept when the collection is pickled.

    Raises
    ------
    TypeError
        ``volumes`` or an option of the wrong kind; a table without ``table_columns=``.
    ValueError
        No volumes, duplicate keys, a dict without an array entry, a table row without a
        path, an HDF5 file without ``dataset=``, a bad ``max_open``.
    FileNotFoundError
        A glob matching nothing, a local path that does not exist (named with its row).
    ~mixle.UnsupportedStoreError
        (a ``ValueError``) A path whose format cannot be told from its name.
    ~mixle.ColumnNotFoundError
        (a ``KeyError``) ``table_columns=`` or ``key=`` names a column the table lacks.

    Examples
    --------
    >>> vols = mixle.read_volumes("scans/*.zarr", max_open=16)  # doctest: +SKIP
    >>> with vols.lease(3) as src:  # doctest: +SKIP
    ...     patch = src.read_box([0, 0, 0], [32, 32, 32])
    """
    options = _parse_options(
        dataset, component, raw_dtype, raw_shape, raw_offset, storage_options, mask_and_scale
    )
    max_open = _check_max_open(max_open)
    cast = None if dtype is None else np.dtype(dtype)
    parsed = parse_volumes(volumes, table_columns=table_columns, key=key, options=options)
    return VolumeCollection(parsed, options, dtype=cast, max_open=max_open)
