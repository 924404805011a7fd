"""ArrayRecord files as one lazy source of records: bytes, or what ``decode`` makes of them.

:func:`read_array_record` opens one file or several (read as one source, in the order
given) with array_record's own reader; opening reads each file's footer and record count
only. A batch read asks each file it touches for all of its records in one call, which
array_record groups by chunk, so each chunk is read and decompressed once per batch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.sources.lifetime import SourceLifetime
from mixle.data.spec import ArraySpec, SpecTree
from mixle.errors import CorruptChunkError, FileChangedError, LeafMismatchError, SpecialFileError
from mixle.utils.files import require_regular_file
from mixle.utils.optional_deps import not_opened_note, require
from mixle.utils.redact import display_path

__all__ = ["ArrayRecordSource", "PathsLike", "parse_paths", "read_array_record"]

#: One path, or a sequence of paths read as one source in that order.
PathsLike = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

#: Reader options: no readahead, which array_record recommends for random access.
READER_OPTIONS = "readahead_buffer_size:0"
#: Bytes of the file buffer of each reader (array_record's data source uses the same).
FILE_BUFFER_BYTES = 32768
#: Records per call when ``records()`` streams a file.
STREAM_RECORDS = 1024
#: Threads that open files at once when a source has several.
OPEN_THREADS = 16
#: How many files of a directory an error message names.
SHOWN_FILES = 3

_OBJECT = np.dtype(object)
#: array_record's compiled module, the one that starts its C++ threads.
_MODULE = "array_record.python.array_record_module"


class _ForkState:
    """Whether array_record ran in this process, or in a parent before it forked this one.

    array_record's C++ core keeps process-wide background threads (riegeli's cleaner of
    recycled zstd contexts, a thread pool) that a forked child inherits without their
    threads: a read there crashes (SIGSEGV) or hangs. Reads in a child forked after this
    module opened a file, or after array_record's module was imported at all (its writer
    starts the same threads), are refused; readers the child inherited are kept, never
    closed or collected, since their clean-up runs the same code.
    """

    used: ClassVar[bool] = False  # this process opened a reader through this module
    inherited: ClassVar[bool] = False  # a parent had, or had imported array_record
    readers: ClassVar[list[Any]] = []  # readers inherited from a parent, kept alive

    @classmethod
    def after_fork_in_child(cls) -> None:
        cls.inherited = cls.inherited or cls.used or _MODULE in sys.modules


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ForkState.after_fork_in_child)


def parse_paths(paths: object) -> tuple[str, ...]:
    """``paths`` (one path or a sequence of them) as a non-empty tuple of strings.

    Raises
    ------
    TypeError
        ``paths`` or one of its items is not a ``str`` or ``os.PathLike``.
    ValueError
        An empty sequence.
    """
    if isinstance(paths, (str, os.PathLike)):
        return (os.fspath(paths),)
    if not isinstance(paths, Sequence) or isinstance(paths, (bytes, bytearray)):
        raise TypeError(
            f"paths={paths!r} must be a path (str or os.PathLike) or a list of paths of "
            "ArrayRecord files"
        )
    if not paths:
        raise ValueError(f"paths={paths!r} names no file; pass one or more ArrayRecord files")
    for i, item in enumerate(paths):
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"paths[{i}]={item!r} must be a path (str or os.PathLike) of an ArrayRecord file"
            )
    return tuple(os.fspath(item) for item in paths)


@dataclass(frozen=True)
class _Files:
    """What opening read: the files' record counts and where each starts globally."""

    counts: NDArray[np.int64]
    starts: NDArray[np.int64]  # first global index of every file, then the total
    signatures: tuple[tuple[int, int, int], ...]  # (size, mtime_ns, inode) of each file

    @property
    def total(self) -> int:
        return int(self.starts[-1])


def _name(paths: tuple[str, ...], k: int) -> str:
    """How an error message names file ``k``: ``paths='a.ar'`` or ``paths[2]='c.ar'``."""
    where = "paths" if len(paths) == 1 else f"paths[{k}]"
    return f"{where}={display_path(paths[k])!r}"


def _check_file(paths: tuple[str, ...], k: int) -> None:
    """Refuse a missing path, a directory (naming files in it) or another special file."""
    path = paths[k]
    try:
        require_regular_file(path, _name(paths, k).split("=")[0])
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{_name(paths, k)} does not exist (looked in {os.path.abspath(path)!r}); pass "
            "the paths of ArrayRecord files"
        ) from None
    except SpecialFileError:
        if not os.path.isdir(path):
            raise
        inside = sorted(name for name in os.listdir(path) if not name.startswith("."))
        shown = ", ".join(repr(name) for name in inside[:SHOWN_FILES])
        more = f" and {len(inside) - SHOWN_FILES} more" if len(inside) > SHOWN_FILES else ""
        listing = f"it holds {shown}{more}" if inside else "it is empty"
        raise SpecialFileError(
            f"{_name(paths, k)} is a directory ({listing}); pass the ArrayRecord files in it, "
            f"e.g. paths=sorted(glob.glob({os.path.join(path, '*.array_record')!r}))"
        ) from None


def _open_reader(module: Any, paths: tuple[str, ...], k: int) -> Any:
    """Open file ``k`` with array_record's reader, refusing what is not an ArrayRecord file."""
    _check_file(paths, k)
    reader = module.ArrayRecordReader(
        paths[k], READER_OPTIONS, file_reader_buffer_size=FILE_BUFFER_BYTES
    )
    if not reader.ok():
        _close_reader(reader)
        size = os.path.getsize(paths[k])
        raise ValueError(
            f"{_name(paths, k)} is not an ArrayRecord file: array_record cannot read its "
            f"footer ({size} bytes; truncated, or another format); pass files written by "
            "array_record's ArrayRecordWriter"
        )
    return reader


def _signature(path: str) -> tuple[int, int, int]:
    info = os.stat(path)
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def _close_reader(reader: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a reader that failed to open cannot close cleanly
        reader.close()


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {list(value)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    array = np.asarray(value) if not isinstance(value, (bytes, str)) else None
    if array is None:
        return f"a {type(value).__name__}"
    return f"a {type(value).__name__} of shape {array.shape} and dtype {array.dtype}"


def stack_decoded(values: Sequence[Any], rows: Sequence[int], path: str = "") -> Any:
    """Stack decoded records of one structure: every leaf gains a new leading axis.

    Dicts stay dicts, tuples tuples, lists lists; ``bytes`` and ``str`` leaves become an
    ``object`` array (fixed-width NumPy strings would drop trailing zero bytes); any other
    leaf is stacked as ``np.asarray`` makes it, so every record must give it one shape and
    dtype.

    Parameters
    ----------
    values
        The decoded records, at least one.
    rows
        The global index of each record, for error messages.
    path
        Where in the record these values sit (``"['image']"``), for error messages.

    Raises
    ------
    ValueError
        Records of different structure (keys, lengths, types).
    LeafMismatchError
        (a ``ValueError``) a leaf differs from record ``rows[0]``'s in shape or dtype.
    """
    first = values[0]
    if isinstance(first, (dict, tuple, list)):
        for value, row in zip(values, rows):
            same = type(value) is type(first) and (
                list(value) == list(first) if isinstance(first, dict) else len(value) == len(first)
            )
            if not same:
                raise ValueError(
                    f"decode(record {row}){path} is {_describe(value)}, but decode(record "
                    f"{rows[0]}){path} is {_describe(first)}; decode must return records of "
                    "one structure"
                )
        if isinstance(first, dict):
            return {
                key: stack_decoded([v[key] for v in values], rows, f"{path}[{key!r}]")
                for key in first
            }
        parts = (
            stack_decoded([v[i] for v in values], rows, f"{path}[{i}]") for i in range(len(first))
        )
        return type(first)(parts)
    if isinstance(first, (bytes, str)):
        out = np.empty(len(values), dtype=_OBJECT)
        out[:] = values
        return out
    arrays = [np.asarray(value) for value in values]
    model = arrays[0]
    for array, value, row in zip(arrays, values, rows):
        if array.shape != model.shape or array.dtype != model.dtype:
            raise LeafMismatchError(
                f"decode(record {row}){path} is {_describe(value)}, but decode(record "
                f"{rows[0]}){path} is {_describe(first)}; the records of one batch must share "
                "each leaf's shape and dtype (pad or cast them in decode)",
                column=path,
                index=int(row),
            )
    if model.dtype == _OBJECT:  # np.stack would unpack sequences held in object scalars
        out = np.empty((len(arrays), *model.shape), dtype=_OBJECT)
        for i, array in enumerate(arrays):
            out[i] = array
        return out
    return np.stack(arrays)


def _spec_of_batch(batch: Any) -> SpecTree:
    """The spec of one record of ``batch``: each leaf's shape without its leading axis."""
    if isinstance(batch, dict):
        return {key: _spec_of_batch(item) for key, item in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_spec_of_batch(item) for item in batch)
    return ArraySpec(batch.shape[1:], batch.dtype)


def _empty_of(spec: SpecTree) -> Any:
    """A batch of no records with the structure and leaves of ``spec``."""
    if isinstance(spec, dict):
        return {key: _empty_of(item) for key, item in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(_empty_of(item) for item in spec)
    return np.empty((0, *spec.shape), dtype=spec.dtype)


def _callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{name}" if module else name


class ArrayRecordSource(SourceLifetime):
    """One or more ArrayRecord files as one lazy source; see :func:`read_array_record`."""

    _library = "array_record"
    _meta: _Files | None

    def __init__(self, paths: PathsLike, decode: Callable[[bytes], Any] | None = None) -> None:
        files = parse_paths(paths)
        if decode is not None and not callable(decode):
            raise TypeError(
                f"decode={decode!r} must be None (records are bytes) or a callable "
                "decode(bytes) -> record, e.g. pickle.loads"
            )
        self._init(files, decode)
        self._live()  # fail early: a missing file, a directory, not an ArrayRecord file

    def _init(self, paths: tuple[str, ...], decode: Callable[[bytes], Any] | None) -> None:
        """Store the arguments and reset handles; no I/O."""
        self._args = {"paths": paths, "decode": decode}
        self._decode = decode
        self._spec: SpecTree | None = None
        self._init_lifetime()

    # -- handles ------------------------------------------------------------------------
    def _open_described(self) -> tuple[tuple[Any, ...], _Files]:
        module = require(_MODULE, feature="read_array_record")
        if _ForkState.inherited:
            raise RuntimeError(
                f"{type(self).__name__}({self._location()}) cannot be read in a process forked "
                "after array_record was imported or used in its parent: its C++ background "
                "threads do not survive fork, and reads there crash. Use "
                "Loader(worker_start_method='spawn') (the default) or 'forkserver', or fork "
                "before opening any ArrayRecord file (a pickled copy of the source opens "
                "nothing until it is read)"
            )
        _ForkState.used = True
        paths: tuple[str, ...] = self._args["paths"]
        opened: list[Any] = []
        try:
            if len(paths) == 1:
                opened.append(_open_reader(module, paths, 0))
            else:
                with ThreadPoolExecutor(min(OPEN_THREADS, len(paths))) as pool:
                    futures = [
                        pool.submit(_open_reader, module, paths, k) for k in range(len(paths))
                    ]
                    failure = None
                    for future in futures:  # every reader that opened is kept, to close it
                        try:
                            opened.append(future.result())
                        except Exception as exc:  # the first failure is re-raised below
                            failure = failure or exc
                    if failure is not None:
                        raise failure
            counts = np.array([reader.num_records() for reader in opened], dtype=np.int64)
            signatures = tuple(_signature(path) for path in paths)
        except BaseException:
            for reader in opened:
                _close_reader(reader)
            raise
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return tuple(opened), _Files(counts, starts, signatures)

    def _forked(self, handle: tuple[Any, ...]) -> None:
        _ForkState.readers.append(handle)  # closing them here would crash (see _ForkState)

    def _release(self, handle: tuple[Any, ...]) -> None:
        for reader in handle:
            _close_reader(reader)

    def _location(self) -> str:
        paths: tuple[str, ...] = self._args["paths"]
        first = repr(display_path(paths[0]))
        if len(paths) == 1:
            return first
        return f"{len(paths)} files: {first} ... {display_path(paths[-1])!r}"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise self._closed_error("pickle it")
        return (_reopen, (self._args["paths"], self._decode))

    # -- metadata -----------------------------------------------------------------------
    def _files(self) -> _Files:
        self._live()
        assert self._meta is not None
        return self._meta

    @property
    def paths(self) -> tuple[str, ...]:
        """The files, in the order their records are numbered."""
        return tuple(self._args["paths"])

    @property
    def decode(self) -> Callable[[bytes], Any] | None:
        """The function that turns a record's bytes into a record, or ``None``."""
        return self._decode

    @property
    def file_lengths(self) -> tuple[int, ...]:
        """Records in each file, in the order of :attr:`paths`."""
        return tuple(int(n) for n in self._files().counts)

    def __len__(self) -> int:
        return self._files().total

    def element_spec(self) -> SpecTree | None:
        """Shape and dtype of one record; with ``decode``, read from record 0 once.

        Without ``decode`` a record is ``bytes``: ``ArraySpec((), object)``, from metadata.
        With ``decode`` the spec is that of ``get_batch([0])`` without its leading axis
        (this reads and decodes record 0, once per process: the answer is cached), or
        ``None`` when the source has no records.
        """
        if self._decode is None:
            self._live()  # raises once closed
            return ArraySpec((), _OBJECT)
        spec = self._spec
        if spec is None:
            if not len(self):
                return None
            spec = self._spec = _spec_of_batch(self.get_batch([0]))
        return spec

    # -- reading ------------------------------------------------------------------------
    def _read_sorted(
        self, readers: tuple[Any, ...], files: _Files, rows: NDArray[np.int64]
    ) -> list[bytes]:
        """The bytes of sorted, unique, in-range ``rows``: one read call per file touched."""
        owner = np.searchsorted(files.starts[:-1], rows, side="right") - 1
        cuts = np.flatnonzero(np.diff(owner)) + 1
        out: list[bytes] = []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)]):
            k = int(owner[lo])
            local = (rows[lo:hi] - files.starts[k]).tolist()
            try:
                got = readers[k].read(local)
            except RuntimeError as exc:
                self._check_unchanged(files, k)  # a file rewritten since: FileChangedError
                raise CorruptChunkError(
                    f"{_name(self._args['paths'], k)}: array_record could not read records "
                    f"{local[:3]}{'...' if len(local) > 3 else ''} of that file: {exc}"
                ) from exc
            if not all(got):  # array_record reads b"" past the end of a file truncated since
                self._check_unchanged(files, k)
            out.extend(got)
        return out

    def _check_unchanged(self, files: _Files, k: int) -> None:
        """Raise :class:`FileChangedError` if file ``k`` is not the file opened."""
        try:
            now: tuple[int, int, int] | None = _signature(self._args["paths"][k])
        except OSError:
            now = None
        then = files.signatures[k]
        if now != then:
            shown = "deleted" if now is None else f"now {now[0]} bytes, was {then[0]}"
            raise FileChangedError(
                f"{_name(self._args['paths'], k)} changed after it was opened ({shown}); "
                "array_record would read its lost records as b''. Open the source again"
            )

    def _decoded(self, raw: Sequence[bytes], rows: Sequence[int]) -> list[Any]:
        decode = self._decode
        assert decode is not None
        out = []
        for data, row in zip(raw, rows):
            try:
                out.append(decode(data))
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python >= 3.11
                    exc.add_note(f"while decoding record {row} of {self!r}")
                raise
        return out

    def get_batch(self, indices: ArrayLike) -> Any:
        """Records ``indices`` (any order, repeats allowed, negative from the end) stacked.

        Each distinct record is read and decoded once, with one read call per file the
        batch touches. Without ``decode`` the batch is a 1-D ``object`` array of ``bytes``;
        with it, the records ``decode`` returned stacked on a new leading axis (dicts stay
        dicts, tuples tuples; ``bytes`` and ``str`` leaves become ``object`` arrays).

        Raises
        ------
        IndexError, TypeError
            An index out of range, or indices that are not integers.
        CorruptChunkError
            array_record could not read a record (the message names the file).
        FileChangedError
            A file was truncated, rewritten or deleted after the source opened it, found
            when array_record reads a record as empty (as it does past a new end of file)
            or fails to read it; a file rewritten in place with the same layout is read as
            it now is.
        """
        readers = self._begin_read()
        try:  # close() defers releasing the readers until _end_read
            files = self._meta
            assert files is not None
            idx = parse_indices(indices, files.total)
            unique, inverse = np.unique(idx, return_inverse=True)
            raw = self._read_sorted(readers, files, unique) if unique.size else []
        finally:
            self._end_read()
        if not idx.size:
            return self._empty()
        rows = unique.tolist()
        values: list[Any] = raw if self._decode is None else self._decoded(raw, rows)
        if unique.size != idx.size or (unique != idx).any():
            order = inverse.reshape(-1).tolist()
            values = [values[j] for j in order]
            rows = idx.tolist()
        if self._decode is None:
            out = np.empty(len(values), dtype=_OBJECT)
            out[:] = values
            return out
        return stack_decoded(values, rows)

    def _empty(self) -> Any:
        spec = self.element_spec()
        return np.empty(0, dtype=_OBJECT) if spec is None else _empty_of(spec)

    def __getitem__(self, key: int | np.integer | slice) -> Any:
        """``src[i]``: one record (negative from the end); ``src[a:b:c]``: a batch."""
        if isinstance(key, slice):
            return self.get_batch(np.arange(*key.indices(len(self)), dtype=np.int64))
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            readers = self._begin_read()
            try:
                files = self._meta
                assert files is not None
                row = parse_indices([int(key)], files.total, name="index")
                raw = self._read_sorted(readers, files, row)
            finally:
                self._end_read()
            return raw[0] if self._decode is None else self._decoded(raw, row.tolist())[0]
        raise TypeError(
            f"{type(self).__name__} index must be an int or a slice, got "
            f"{type(key).__name__}; use get_batch(indices) for many records"
        )

    def records(self) -> Iterator[Any]:
        """Yield every record in order, reading :data:`STREAM_RECORDS` at a time per file.

        A block asked for after :meth:`close` raises :class:`~mixle.SourceClosedError`.
        """
        files = self._files()
        for k, count in enumerate(files.counts.tolist()):
            for lo in range(0, count, STREAM_RECORDS):
                hi = min(count, lo + STREAM_RECORDS)
                readers = self._begin_read()
                try:
                    raw = readers[k].read(lo, hi)
                except RuntimeError as exc:
                    self._check_unchanged(files, k)
                    raise CorruptChunkError(
                        f"{_name(self._args['paths'], k)}: array_record could not read "
                        f"records {lo}..{hi - 1} of that file: {exc}"
                    ) from exc
                finally:
                    self._end_read()
                if not all(raw):
                    self._check_unchanged(files, k)
                if self._decode is None:
                    yield from raw
                else:
                    start = int(files.starts[k])
                    yield from self._decoded(raw, range(start + lo, start + hi))

    def __iter__(self) -> Iterator[Any]:
        return self.records()

    # -- lifetime -----------------------------------------------------------------------
    def __repr__(self) -> str:
        name = type(self).__name__
        if self._closed:
            return f"<{name} {self._location()} (closed)>"
        if self._meta is None:
            return f"<{name} {self._location()} ({not_opened_note(self._library)})>"
        decode = "" if self._decode is None else f", decode={_callable_name(self._decode)}"
        return f"{name}({self._location()}, records={self._meta.total}{decode})"


def _reopen(paths: tuple[str, ...], decode: Callable[[bytes], Any] | None) -> ArrayRecordSource:
    """Rebuild a pickled source without opening it; it opens on first use."""
    obj = ArrayRecordSource.__new__(ArrayRecordSource)
    obj._init(paths, decode)
    return obj


def read_array_record(
    paths: PathsLike, decode: Callable[[bytes], Any] | None = None
) -> ArrayRecordSource:
    """Open ArrayRecord files as one lazy, index-addressable source of records.

    Parameters
    ----------
    paths
        One path (``str`` or ``os.PathLike``) or a sequence of them, read as one source in
        the order given: record ``i`` of file ``k`` has global index ``offset_k + i``, where
        ``offset_k`` is the number of records in the files before it. Empty files are
        allowed (they hold no index).
    decode
        ``None``: each record is its ``bytes``, and a batch a 1-D NumPy ``object`` array of
        them. A callable ``decode(bytes) -> record`` (``pickle.loads``, ``np.frombuffer``, a
        function returning a dict of arrays...): records are what it returns and batches
        stack them (every leaf on a new leading axis; dicts stay dicts, tuples tuples;
        ``bytes`` and ``str`` leaves become ``object`` arrays). Pickled by reference, so
        with ``Loader(num_workers=..., worker_start_method="spawn")`` it must be a
        module-level function.

    Returns
    -------
    ArrayRecordSource
        ``len``, ``src[i]`` (negative from the end; a slice gives a batch),
        ``get_batch(indices)``, ``records()``, ``element_spec()``, ``close()`` and a
        context manager.

    Raises
    ------
    FileNotFoundError
        A path does not exist.
    SpecialFileError
        (an ``OSError``) a path is a directory (the message names files in it), a FIFO or
        a device.
    ValueError
        ``paths`` is empty, or a file is not an ArrayRecord file (truncated or another
        format).
    TypeError
        ``paths`` is not a path or sequence of paths, or ``decode`` is not callable.
    ImportError
        array_record is not installed (the message names the ``arrayrecord`` extra).
    RuntimeError
        Read in a process forked after array_record was imported or used in its parent
        (see Notes).

    Notes
    -----
    Opening reads each file's footer (record count and chunk index); no record is read.
    With ``decode``, :meth:`~ArrayRecordSource.element_spec` reads and decodes record 0
    once. Files written with ``group_size`` above 1 store that many records per compressed
    chunk: reading any of them decompresses the chunk, so random access is fastest with
    ``group_size:1``; a batch decompresses each chunk it touches once.

    The source is read-only and picklable by reference (paths and ``decode``, never data;
    the copy opens nothing until first used). array_record itself does not survive
    ``fork``: in a process forked after array_record was imported or used (by this source
    or by its writer), reads raise ``RuntimeError`` (they would crash); use
    ``Loader(worker_start_method="spawn")`` (the default) or ``"forkserver"``, or fork
    before the first read. Reads are safe
    from several threads at once: array_record's batched read of one reader is
    thread-safe, and ``close()`` waits for reads in flight. Each open file holds one
    descriptor until ``close()``.
    """
    return ArrayRecordSource(paths, decode)
