"""What a collection of volumes holds: counts, shapes, dtypes, chunkings, sizes, mismatches.

:func:`inspect_volumes` opens a glob of stores or a table of volume paths with
:func:`mixle.read_volumes`, reads every volume's metadata (never chunk data; each array
opened as a collection of one volume, so a broken or odd volume does not hide the others,
and at most ``min(max_open, SHAPE_THREADS)`` open at once) and returns a
:class:`CollectionReport`: one
:class:`VolumeFacts` per array of each volume, a :class:`ArraysSummary` per array name and
:class:`~mixle.inspection.report.LayoutFinding` s for volumes that do not fit together
(mixed dtypes, numbers of axes or channels) or could not be read.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mixle.data.sources.collection import DEFAULT_MAX_OPEN, VolumeCollection, read_volumes
from mixle.data.sources.collection.volumes import SHAPE_THREADS
from mixle.errors import UnsupportedStoreError
from mixle.inspection.formatting import count_text, shape_text
from mixle.inspection.locations import is_remote
from mixle.inspection.report import LayoutFinding
from mixle.utils.redact import display_path

__all__ = [
    "GLOB_CHARACTERS",
    "MAX_LISTED",
    "SPATIAL_AXES",
    "TABLE_SUFFIXES",
    "ArraysSummary",
    "CollectionReport",
    "VolumeFacts",
    "inspect_volumes",
    "is_collection",
    "open_table",
    "table_columns_hint",
]

#: How many entries a report line lists (most common shapes, dtypes, chunkings; volumes a
#: warning names) before it says "and N more".
MAX_LISTED = 5
#: Trailing axes counted as spatial; leading axes beyond them are channel axes, whose lengths
#: every volume must share (a 4-D ``(C, Z, Y, X)`` volume has one channel axis).
SPATIAL_AXES = 3
#: Characters that make a location a glob (as :func:`glob.glob` and fsspec read them).
GLOB_CHARACTERS = frozenset("*?[")
#: File suffixes read as a table of volumes, and how each is read.
TABLE_SUFFIXES: Mapping[str, str] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}

CollectionKind = Literal["glob", "table"]


@dataclass(frozen=True)
class VolumeFacts:
    """Metadata of one array of one volume, or why it could not be read.

    Attributes
    ----------
    index
        The volume's index in the collection (for a table, its row: 0 is the first row
        after the header).
    key
        The volume's key (:attr:`mixle.VolumeCollection.keys`: its path).
    name
        The array's name in a volume of several aligned arrays, else ``None``.
    shape, dtype, chunks, shards
        As the array's source reports them (``chunks`` is ``None`` when unchunked,
        ``shards`` when unsharded); ``None`` when it could not be read.
    nbytes
        Bytes of the whole array, decoded; ``None`` when unknown.
    error
        Why the volume could not be read (one line), else ``None``.
    """

    index: int
    key: str
    name: str | None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    chunks: tuple[int, ...] | None = None
    shards: tuple[int, ...] | None = None
    nbytes: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the metadata was read."""
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """The facts as a JSON-able dict."""
        return {
            "index": self.index,
            "key": self.key,
            "name": self.name,
            "shape": _listed(self.shape),
            "dtype": self.dtype,
            "chunks": _listed(self.chunks),
            "shards": _listed(self.shards),
            "nbytes": self.nbytes,
            "error": self.error,
        }


@dataclass(frozen=True)
class ArraysSummary:
    """The arrays of one name across the collection (every array for single-array volumes).

    Attributes
    ----------
    name
        The array name (``None`` for single-array volumes).
    count
        Arrays whose metadata was read.
    shapes, dtypes, chunks
        ``(value, how many arrays)``, the most common first (ties in first-seen order);
        ``chunks`` holds ``None`` for unchunked arrays.
    min_shape, max_shape
        Smallest and largest length of each axis when every array has the same number of
        axes, else ``None``.
    nbytes
        Decoded bytes of all of them; ``None`` when one has a variable-size dtype.
    """

    name: str | None
    count: int
    shapes: tuple[tuple[tuple[int, ...], int], ...]
    dtypes: tuple[tuple[str, int], ...]
    chunks: tuple[tuple[tuple[int, ...] | None, int], ...]
    min_shape: tuple[int, ...] | None
    max_shape: tuple[int, ...] | None
    nbytes: int | None

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-able dict."""
        return {
            "name": self.name,
            "count": self.count,
            "shapes": [{"shape": list(s), "count": n} for s, n in self.shapes],
            "dtypes": [{"dtype": d, "count": n} for d, n in self.dtypes],
            "chunks": [{"chunks": _listed(c), "count": n} for c, n in self.chunks],
            "min_shape": _listed(self.min_shape),
            "max_shape": _listed(self.max_shape),
            "nbytes": self.nbytes,
        }


@dataclass(frozen=True)
class CollectionReport:
    """Everything :func:`inspect_volumes` found in a collection of volumes.

    Attributes
    ----------
    location
        The glob or table inspected, safe to show (no credentials, no query string).
    kind
        ``"glob"`` or ``"table"``.
    count
        Number of volumes.
    names
        Array names of volumes of several aligned arrays, else ``None``.
    columns
        The table's other columns (per-volume metadata); ``()`` for a glob.
    volumes
        One entry per array of every volume, in collection order.
    summaries
        One per array name (one for single-array volumes).
    findings
        Volumes that do not fit together or could not be read, each named.
    """

    location: str
    kind: CollectionKind
    count: int
    names: tuple[str, ...] | None
    columns: tuple[str, ...]
    volumes: tuple[VolumeFacts, ...]
    summaries: tuple[ArraysSummary, ...]
    findings: tuple[LayoutFinding, ...] = ()

    @property
    def nbytes(self) -> int | None:
        """Decoded bytes of every array read; ``None`` when one has a variable-size dtype."""
        sizes = [s.nbytes for s in self.summaries]
        return None if any(n is None for n in sizes) else sum(n for n in sizes if n is not None)

    @property
    def unreadable(self) -> tuple[VolumeFacts, ...]:
        """The volumes whose metadata could not be read."""
        return tuple(v for v in self.volumes if not v.ok)

    @property
    def warnings(self) -> tuple[LayoutFinding, ...]:
        """The findings of severity ``"warning"``."""
        return tuple(f for f in self.findings if f.severity == "warning")

    def to_dict(self) -> dict[str, Any]:
        """The whole report as a JSON-able dict (``"kind"`` is ``"glob"`` or ``"table"``)."""
        return {
            "location": self.location,
            "kind": self.kind,
            "count": self.count,
            "names": None if self.names is None else list(self.names),
            "columns": list(self.columns),
            "nbytes": self.nbytes,
            "summaries": [s.to_dict() for s in self.summaries],
            "findings": [f.to_dict() for f in self.findings],
            "volumes": [v.to_dict() for v in self.volumes],
        }


# -- what the location is ------------------------------------------------------------------
def is_collection(location: str, *, table: bool = False) -> bool:
    """Whether ``location`` names a collection: a glob (that is not itself a path) or a table.

    ``table=True`` (``--column`` given) makes any location a table; otherwise a local path
    with glob characters (``*?[``) is a glob unless a file or folder has exactly that name,
    and a URL is a glob when a ``*`` comes before its query string.
    """
    if table:
        return True
    if is_remote(location):  # "?" starts a query string, "[" an IPv6 host
        return "*" in location.split("?", 1)[0]
    return bool(GLOB_CHARACTERS.intersection(location)) and not os.path.exists(location)


def table_format(location: str) -> str:
    """``"csv"``, ``"tsv"``, ``"parquet"`` or ``"jsonl"``, from the file's suffix.

    Raises
    ------
    UnsupportedStoreError
        The suffix is not one of :data:`TABLE_SUFFIXES`.
    """
    path = location.split("?", 1)[0].rstrip("/")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TABLE_SUFFIXES:
        known = ", ".join(sorted(TABLE_SUFFIXES))
        raise UnsupportedStoreError(
            f"--column reads {display_path(location)!r} as a table of volumes, but its suffix "
            f"{suffix or '(none)'!r} is not one of {known}; give a table, or drop --column to "
            "inspect one store"
        )
    return TABLE_SUFFIXES[suffix]


def table_columns_hint(location: str) -> str | None:
    """For a table given without ``--column``: an error text listing its columns, else ``None``.

    ``None`` when ``location`` does not end in one of :data:`TABLE_SUFFIXES` or cannot be
    opened as a table (the caller then reports it as a store).
    """
    path = location.split("?", 1)[0].rstrip("/")
    if os.path.splitext(path)[1].lower() not in TABLE_SUFFIXES:
        return None
    try:
        table = open_table(location)
    except Exception:
        return None
    try:
        names = list(table.columns)
    finally:
        table.close()
    return (
        f"{display_path(location)!r} is a table: give --column naming its column of volume "
        f"paths (or NAME=COLUMN, repeated, for aligned arrays); its columns: {', '.join(names)}"
    )


def open_table(location: str) -> Any:
    """The table of volumes at ``location`` as a mixle record source (read by its suffix).

    Raises
    ------
    UnsupportedStoreError
        The suffix is not one of :data:`TABLE_SUFFIXES`.
    FileNotFoundError
        There is no such file.
    """
    kind = table_format(location)
    if kind in ("csv", "tsv"):
        from mixle.data.sources.records.text.csv_source import read_csv

        return read_csv(location, delimiter="\t" if kind == "tsv" else ",")
    if kind == "jsonl":
        from mixle.data.sources.records.text.jsonl_source import read_jsonl

        return read_jsonl(location)
    from mixle.data.sources.records.parquet_source import read_parquet

    return read_parquet(location)


# -- inspecting ----------------------------------------------------------------------------
def inspect_volumes(
    location: str,
    *,
    columns: str | Mapping[str, str] | Sequence[str] | None = None,
    dataset: str | Mapping[str, str] | None = None,
    component: str | Mapping[str, str] | None = None,
    storage_options: dict[str, Any] | None = None,
    max_open: int | None = None,
) -> CollectionReport:
    """Count, shapes, dtypes, chunkings and decoded size of a glob or a table of volumes.

    Parameters
    ----------
    location
        A glob of stores (``"scans/*.zarr"``, ``"data/*.h5"``) or, with ``columns``, a table
        of volumes (``.csv``, ``.tsv``, ``.parquet``, ``.jsonl``).
    columns
        The table's path column (one array per volume) or ``{name: column}`` (aligned arrays
        per volume), as :func:`mixle.read_volumes`'s ``table_columns``.
    dataset, component
        The HDF5 dataset / zarr array inside each file or group (a string, or
        ``{name: ...}`` for volumes of several arrays), as for :func:`mixle.read_volumes`.
    storage_options
        fsspec options for URLs.
    max_open
        As for :func:`mixle.read_volumes` (default ``DEFAULT_MAX_OPEN``); the metadata is
        read ``min(max_open, SHAPE_THREADS)`` arrays at a time, each open only while read.

    Returns
    -------
    CollectionReport
        Volumes that cannot be read are reported (``error``, an ``"unreadable"`` warning),
        not raised.

    Raises
    ------
    FileNotFoundError
        The glob matches nothing, the table does not exist or names a file that does not
        (with its row).
    KeyError
        The table has no column ``columns`` names.
    ValueError
        The table or glob is otherwise unusable (as :func:`mixle.read_volumes` says).
    """
    kind: CollectionKind = "glob" if columns is None else "table"
    table = None if columns is None else open_table(location)
    bound = DEFAULT_MAX_OPEN if max_open is None else max_open
    try:
        vols = read_volumes(
            location if table is None else table,
            dataset=dataset,
            component=component,
            table_columns=columns,
            storage_options=storage_options,
            max_open=bound,
        )
        try:
            keys, names, metadata = vols.keys, vols.names, tuple(vols.columns)
            count = len(vols)
        finally:
            vols.close()
        if table is None:
            arrays: list[list[tuple[str | None, str]]] = [[(None, k)] for k in keys]
        else:
            arrays = _table_paths(table, columns)
        open_one = _opener(dataset, component, storage_options)
        facts = _gather(arrays, keys, open_one, threads=min(bound, SHAPE_THREADS))
    finally:
        if table is not None:
            table.close()
    return build_report(
        display_path(location),
        kind,
        facts,
        count=count,
        names=names,
        columns=metadata,
        table=table is not None,
    )


def _table_paths(
    table: Any, columns: str | Mapping[str, str] | Sequence[str] | None
) -> list[list[tuple[str | None, str]]]:
    """``[(array name, path)]`` of every row (``None`` names a single array)."""
    if isinstance(columns, str):
        named: dict[str | None, str] = {None: columns}
    elif isinstance(columns, Mapping):
        named = dict(columns)
    else:
        named = {c: c for c in columns or ()}
    values: dict[str, list[Any]] = {c: [] for c in named.values()}
    for block in table.iter_batches():
        for column in values:
            values[column].extend(block[column].tolist())
    n = len(next(iter(values.values()), []))
    return [[(name, str(values[column][i])) for name, column in named.items()] for i in range(n)]


Opener = Callable[[str | None, str], VolumeCollection]


def _opener(
    dataset: str | Mapping[str, str] | None,
    component: str | Mapping[str, str] | None,
    storage_options: dict[str, Any] | None,
) -> Opener:
    """Opens one array as a collection of one volume, with that array's ``dataset=`` etc."""

    def pick(value: str | Mapping[str, str] | None, name: str | None) -> str | None:
        if isinstance(value, Mapping):
            return None if name is None else value.get(name)
        return value

    def open_one(name: str | None, path: str) -> VolumeCollection:
        return read_volumes(
            [path],
            dataset=pick(dataset, name),
            component=pick(component, name),
            storage_options=storage_options,
            max_open=1,
        )

    return open_one


def _gather(
    arrays: Sequence[Sequence[tuple[str | None, str]]],
    keys: Sequence[str],
    open_one: Opener,
    *,
    threads: int,
) -> list[VolumeFacts]:
    """Every array's metadata, ``threads`` at a time (each open only while it is read).

    Each array is opened on its own (a collection of one volume), so one that cannot be
    read, or differs from the others, is reported without hiding the rest.
    """
    jobs = [(i, name, path) for i, volume in enumerate(arrays) for name, path in volume]

    def read(job: tuple[int, str | None, str]) -> VolumeFacts:
        i, name, path = job
        return _array_facts(i, keys[i], name, path, open_one)

    if len(jobs) <= 1 or threads <= 1:
        return [read(job) for job in jobs]
    # arrays of each kind open alone until one opens: it imports its library (zarr, h5py),
    # and threads importing one library at once can see it half initialised
    found: dict[int, VolumeFacts] = {}
    opened: set[str] = set()
    for k, (_, _, path) in enumerate(jobs):
        kind = _kind(path)
        if kind not in opened:
            found[k] = read(jobs[k])
            if found[k].ok:
                opened.add(kind)
    rest = [k for k in range(len(jobs)) if k not in found]
    with ThreadPoolExecutor(max_workers=min(threads, max(1, len(rest)))) as pool:
        found.update(zip(rest, pool.map(lambda k: read(jobs[k]), rest), strict=True))
    return [found[k] for k in range(len(jobs))]


def _kind(path: str) -> str:
    """The suffix of ``path`` (which library opens it), ``""`` for none."""
    return os.path.splitext(path.split("?", 1)[0].rstrip("/"))[1].lower()


def _array_facts(
    index: int, key: str, name: str | None, path: str, open_one: Opener
) -> VolumeFacts:
    try:
        one = open_one(name, path)
        try:
            with one.lease(0) as src:
                shape = tuple(int(s) for s in src.shape)
                dtype = np.dtype(src.dtype)
                chunks = src.chunks
                shards = src.shards
        finally:
            one.close()
    except Exception as exc:  # reported per volume; the others are still inspected
        return VolumeFacts(index, key, name, error=_one_line(exc))
    variable = dtype.kind == "O" or (dtype.kind in "SUV" and dtype.itemsize == 0)
    return VolumeFacts(
        index,
        key,
        name,
        shape=shape,
        dtype=str(dtype),
        chunks=None if chunks is None else tuple(int(c) for c in chunks),
        shards=None if shards is None else tuple(int(s) for s in shards),
        nbytes=None if variable else math.prod(shape) * dtype.itemsize,
    )


def _one_line(exc: BaseException) -> str:
    """The error as one line, without the ``volumes[0] (key ...)`` lead of a one-volume open."""
    cause = exc.__cause__
    if cause is not None and str(exc).endswith(str(cause)):
        exc = cause
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(text.split()) or type(exc).__name__
    if isinstance(exc, (OSError, ValueError, KeyError)):
        return text
    return f"{type(exc).__name__}: {text}"


def build_report(
    location: str,
    kind: CollectionKind,
    facts: Sequence[VolumeFacts],
    *,
    count: int,
    names: Sequence[str] | None = None,
    columns: Sequence[str] = (),
    table: bool = False,
) -> CollectionReport:
    """The report of ``facts`` (every array's metadata): summaries and findings.

    ``table=True`` names volumes with their row as well as their key.
    """
    label = _labeler(table)
    groups: list[str | None] = [None] if names is None else list(names)
    summaries = tuple(
        _summary(name, [f for f in facts if f.ok and f.name == name]) for name in groups
    )
    findings: list[LayoutFinding] = []
    for name in groups:
        findings.extend(_mismatches(name, [f for f in facts if f.ok and f.name == name], label))
    bad = [f for f in facts if not f.ok]
    if bad:
        listed = "; ".join(
            f"{label(f)}{'' if f.name is None else f', array {f.name!r}'}: {f.error}"
            for f in bad[:MAX_LISTED]
        )
        more = f"; and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        findings.append(
            LayoutFinding(
                "unreadable",
                "warning",
                f"{count_text(len(bad), 'volume')} of {count} could not be read: {listed}{more}",
            )
        )
    return CollectionReport(
        location=location,
        kind=kind,
        count=count,
        names=None if names is None else tuple(names),
        columns=tuple(columns),
        volumes=tuple(facts),
        summaries=summaries,
        findings=tuple(findings),
    )


def _labeler(table: bool) -> Callable[[VolumeFacts], str]:
    def label(f: VolumeFacts) -> str:
        return f"{f.key!r} (row {f.index})" if table else repr(f.key)

    return label


def _ranked(values: Iterable[Any]) -> tuple[tuple[Any, int], ...]:
    """``(value, count)``, the most common first; ties keep first-seen order."""
    return tuple(Counter(values).most_common())


def _summary(name: str | None, facts: Sequence[VolumeFacts]) -> ArraysSummary:
    shapes = [f.shape for f in facts if f.shape is not None]
    ndims = {len(s) for s in shapes}
    lo = hi = None
    if len(ndims) == 1:
        lo = tuple(int(x) for x in np.min(np.array(shapes, dtype=np.int64), axis=0))
        hi = tuple(int(x) for x in np.max(np.array(shapes, dtype=np.int64), axis=0))
    sizes = [f.nbytes for f in facts]
    return ArraysSummary(
        name=name,
        count=len(facts),
        shapes=_ranked(shapes),
        dtypes=_ranked(f.dtype for f in facts),
        chunks=_ranked(f.chunks for f in facts),
        min_shape=lo,
        max_shape=hi,
        nbytes=None if any(n is None for n in sizes) else sum(n for n in sizes if n is not None),
    )


def _mismatches(
    name: str | None, facts: Sequence[VolumeFacts], label: Callable[[VolumeFacts], str]
) -> list[LayoutFinding]:
    """Warnings for arrays of one name whose dtype, number of axes or channels differ."""
    where = "" if name is None else f"array {name!r}: "
    found: list[LayoutFinding] = []
    dtype_text = _odd_ones(facts, lambda f: f.dtype, label, lambda d: str(d))
    if dtype_text:
        found.append(
            LayoutFinding(
                "mixed-dtypes",
                "warning",
                f"{where}dtypes differ: {dtype_text}; sampling them together needs a cast "
                "(read_volumes(..., dtype=...))",
            )
        )
    ndim_text = _odd_ones(
        facts, lambda f: len(f.shape or ()), label, lambda n: count_text(n, "axis", "axes")
    )
    if ndim_text:
        found.append(
            LayoutFinding(
                "mixed-ndim",
                "warning",
                f"{where}numbers of axes differ: {ndim_text}; every volume needs the same axes",
            )
        )
    elif facts and len(facts[0].shape or ()) > SPATIAL_AXES:
        lead = len(facts[0].shape or ()) - SPATIAL_AXES
        channel_text = _odd_ones(
            facts, lambda f: tuple((f.shape or ())[:lead]), label, lambda c: shape_text(c)
        )
        if channel_text:
            found.append(
                LayoutFinding(
                    "mixed-channels",
                    "warning",
                    f"{where}channel axes (the {count_text(lead, 'axis', 'axes')} before the "
                    f"last {SPATIAL_AXES}) differ: {channel_text}; every volume needs the same "
                    "channels",
                )
            )
    return found


def _odd_ones(
    facts: Sequence[VolumeFacts],
    value: Callable[[VolumeFacts], Any],
    label: Callable[[VolumeFacts], str],
    spell: Callable[[Any], str],
) -> str:
    """``""`` when every fact has the same value; else the counts and the odd volumes named.

    The most common value is counted; the volumes of every other value are named (the
    first :data:`MAX_LISTED` of each value, then how many more).
    """
    ranked = _ranked(value(f) for f in facts)
    if len(ranked) <= 1:
        return ""
    common, n_common = ranked[0]
    parts = [f"{spell(common)} in {count_text(n_common, 'volume')}"]
    for other, n in ranked[1:]:
        odd = [f for f in facts if value(f) == other]
        named = ", ".join(label(f) for f in odd[:MAX_LISTED])
        more = f" and {n - MAX_LISTED} more" if n > MAX_LISTED else ""
        parts.append(f"{spell(other)} in {count_text(n, 'volume')}: {named}{more}")
    return "; ".join(parts)


def _listed(value: tuple[int, ...] | None) -> list[int] | None:
    return None if value is None else list(value)
