"""What every source made of several named children shares: children, specs, reads, lineage.

:class:`ComposedSource` is the base of :class:`~mixle.data.sources.compose.concat.ConcatSource`
and :class:`~mixle.data.sources.compose.mix.MixSource`. A subclass says where its records
are (:meth:`ComposedSource._locate`: per index, a child and the index there); the base
reads each touched child once per request and gathers the rows in request order
(:mod:`~mixle.data.sources.compose.gather`), and answers ``origins``, ``record_keys``,
``element_spec``, ``close`` and the rest of a source's surface from the children.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.sources.compose.children import (
    child_fingerprint,
    child_spec,
    read_records,
    refuse_path,
)
from mixle.data.sources.compose.gather import check_part, empty_batch, gather, record_spec
from mixle.data.sources.compose.lineage import child_keys, child_origins, name_tag, visit_keys
from mixle.data.sources.custom import Source
from mixle.data.sources.origins import Origins
from mixle.data.spec import ArraySpec, SpecTree
from mixle.data.structure import EXCHANGEABLE, SEQUENTIAL, SampleStructure
from mixle.errors import SchemaMismatchError, SourceClosedError

__all__ = [
    "ComposedSource",
    "SourcesLike",
    "child_structure",
    "combined_structure",
    "common_spec",
    "parse_sources",
]

SourcesLike = Sequence[Any] | Mapping[str, Any]
"""Children of a composition: a non-empty list or tuple (named ``"0"``, ``"1"``, ...) or a
dict ``{name: source}``."""


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(
            f"sources has the key {name!r} ({type(name).__name__}); source names must be "
            "non-empty strings without '/'"
        )
    if not name or "/" in name:
        raise ValueError(
            f"sources has the key {name!r}; source names must be non-empty strings "
            "without '/' (a '/' separates the names of nested compositions)"
        )
    return name


def _child_length(name: str, child: Any) -> int:
    refuse_path(child, f"sources[{name!r}]")
    if not hasattr(child, "__len__") or not (
        hasattr(child, "get_batch") or hasattr(child, "__getitem__")
    ):
        raise TypeError(
            f"sources[{name!r}] is a {type(child).__name__}; a source must be map-style: a "
            "mixle source or sampler, an object with __len__ and get_batch(indices), or "
            "any object with __len__ and __getitem__(int) such as a NumPy array"
        )
    n = len(child)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TypeError(f"len(sources[{name!r}]) is {n!r}; it must be an int >= 0")
    return int(n)


def parse_sources(sources: object) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[int, ...]]:
    """``sources`` as names, children and their lengths.

    Raises
    ------
    TypeError
        ``sources`` is not a list, tuple or dict; a name is not a string; a child is not
        map-style or has no int length, or is a path (``str``, ``bytes``, ``PathLike``:
        open it first).
    ValueError
        ``sources`` is empty, or a name is empty or holds ``"/"``.
    """
    if isinstance(sources, Mapping):
        names = tuple(_check_name(name) for name in sources)
        children = tuple(sources[name] for name in names)
    elif isinstance(sources, (list, tuple)):
        names = tuple(str(k) for k in range(len(sources)))
        children = tuple(sources)
    else:
        refuse_path(sources, "sources")
        raise TypeError(
            f"sources={type(sources).__name__} must be a non-empty list or tuple of "
            "sources, or a dict {name: source}"
        )
    if not children:
        raise ValueError(f"sources={sources!r} is empty; give at least one source")
    lengths = tuple(_child_length(name, child) for name, child in zip(names, children))
    return names, children, lengths


def _first_difference(a: SpecTree, b: SpecTree, path: str) -> tuple[str, Any, Any] | None:
    """The first field where spec trees ``a`` and ``b`` differ: its path and both parts."""
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.keys() != b.keys():
            return path, a, b
        pairs = [(f"{path}[{key!r}]", a[key], b[key]) for key in a]
    elif isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if type(a) is not type(b) or len(a) != len(b):
            return path, a, b
        pairs = [(f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    else:
        return None if a == b else (path, a, b)
    for where, x, y in pairs:
        found = _first_difference(x, y, where)
        if found is not None:
            return found
    return None


def common_spec(names: Sequence[str], children: Sequence[Any]) -> SpecTree | None:
    """The one element spec of ``children`` (those that declare one), or ``None``.

    Empty children are left out: they give no records, and a lazily computed spec (a
    :func:`mixle.map`'s) may need one.

    Raises
    ------
    SchemaMismatchError
        Two children declare different specs; the message names both children, the first
        field that differs and what each declares there.
    """
    first: tuple[str, SpecTree] | None = None
    for name, child in zip(names, children):
        if len(child) == 0:
            continue
        spec = child_spec(child)
        if spec is None:
            continue
        if first is None:
            first = (name, spec)
            continue
        found = _first_difference(first[1], spec, "spec")
        if found is not None:
            where, mine, theirs = found
            raise SchemaMismatchError(
                f"sources {first[0]!r} and {name!r} have different element specs; they "
                f"differ at {where}: {mine!r} in {first[0]!r}, {theirs!r} in {name!r} "
                f"(full specs: {first[1]!r} and {spec!r}); "
                "every source of a composition must give records of one structure, shape "
                "and dtype"
            )
    return None if first is None else first[1]


def _signature(spec: SpecTree) -> SpecTree:
    """What batches of undeclared children must share: ``spec``'s structure, each leaf's
    dtype and number of axes; not the axes' lengths (a source may pad each batch to its
    own longest record) nor the width of fixed-width strings (they stack to the longest)."""
    if isinstance(spec, dict):
        return {key: _signature(item) for key, item in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(_signature(item) for item in spec)
    if isinstance(spec, ArraySpec):
        dtype = np.dtype(spec.dtype.kind) if spec.dtype.kind in "US" else spec.dtype
        return ArraySpec((0,) * len(spec.shape), dtype)
    return spec


def child_structure(child: Any) -> SampleStructure | None:
    """A child's ``structure`` when it reports a :class:`SampleStructure`, else ``None``."""
    structure = getattr(child, "structure", None)
    return structure if isinstance(structure, SampleStructure) else None


def combined_structure(children: Sequence[Any]) -> SampleStructure | None:
    """The structure of records drawn from ``children`` in turn (see
    :attr:`ComposedSource.structure`)."""
    found = [child_structure(child) for child in children]
    if all(s is None for s in found):
        return None
    first = found[0]
    if all(s == first for s in found) and not (first is not None and callable(first.by)):
        return first
    if any(s is not None and not s.shuffleable for s in found):
        return SEQUENTIAL
    return EXCHANGEABLE


def _describe(child: Any) -> str:
    """A child for a ``repr``: mixle sources by their own repr, plain containers by shape."""
    if isinstance(child, np.ndarray):
        return f"ndarray(shape={child.shape}, dtype={child.dtype})"
    if isinstance(child, (list, tuple)):
        return f"{type(child).__name__} of {len(child)}"
    try:
        return repr(child)
    except Exception as exc:  # a repr never raises
        return f"{type(child).__name__}(repr failed: {type(exc).__name__})"


class ComposedSource(Source):
    """A source of records read from named child sources (the base of concat and mix).

    Notes
    -----
    - ``get_batch(indices)`` calls ``get_batch`` once on each child the request touches,
      with that child's indices in request order (repeats kept), and scatters the rows
      into one preallocated batch.
    - ``origins(indices)`` and ``record_keys(indices)`` are keyed on the children's
      *names*: a record has the same origin and key wherever a composition puts it.
      ``record_keys`` identify a visit of a record: a mix's pass ``p >= 1`` over a child
      (past its natural length) hash-mixes the key with ``p``; a first visit keeps it.
    - ``close()`` closes every child (a child used elsewhere too is closed there as well);
      reads, ``element_spec()`` and pickling then raise :class:`~mixle.SourceClosedError`.
    - Pickling stores the children (mixle sources pickle by reference: path and options)
      and the composition's few arguments, never data.
    """

    def __init__(self, sources: SourcesLike) -> None:
        self._names, self._children, self._lengths = parse_sources(sources)
        self._spec = common_spec(self._names, self._children)
        #: Without a declared spec: the record spec of the first batch this process read,
        #: and the child that gave it (later batches are checked against it).
        self._seen: tuple[str, SpecTree] | None = None

    @abc.abstractmethod
    def _locate(
        self, idx: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64] | None]:
        """Per index (non-negative, in range): the child's position, the index there, and
        which visit of that record it is (0: the first; ``None``: every one a first)."""

    @abc.abstractmethod
    def _arguments(self) -> dict[str, Any]:
        """Keyword arguments that rebuild the composition with its children (pickling)."""

    @property
    def names(self) -> tuple[str, ...]:
        """The children's names, in order."""
        return self._names

    @property
    def sources(self) -> Mapping[str, Any]:
        """The children by name (read-only)."""
        return MappingProxyType(dict(zip(self._names, self._children)))

    @property
    def lengths(self) -> dict[str, int]:
        """Each child's length, by name."""
        return dict(zip(self._names, self._lengths))

    @property
    def structure(self) -> SampleStructure | None:
        """How the records relate (:class:`~mixle.data.structure.SampleStructure`), from
        the children's ``structure``: theirs when they all report one and the same (and a
        grouping by a callable, which maps a child's own indices, is not among them);
        else :data:`~mixle.SEQUENTIAL` when any child's records may not be reordered (so
        ``Loader(shuffle=True)`` is refused), else :data:`~mixle.EXCHANGEABLE`.
        ``None`` when no child reports one."""
        return combined_structure(self._children)

    def element_spec(self) -> SpecTree | None:
        """The children's common element spec (``None`` when no child declares one)."""
        self._check_open()
        return self._spec

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(
                f"{type(self).__name__} is closed, and so are its sources; open them "
                "again and compose them anew to read"
            )

    def _grouped(
        self, indices: ArrayLike
    ) -> tuple[int, list[tuple[int, NDArray[np.int64], NDArray[np.int64]]], Any]:
        """The request size; per child touched: its position, request rows, indices; and
        per request row its visit number (``None``: all first visits)."""
        self._check_open()
        idx = parse_indices(indices, len(self))
        child, local, visits = self._locate(idx)
        order = np.argsort(child, kind="stable")  # rows of a child stay in request order
        starts = np.flatnonzero(np.diff(child[order], prepend=-1))
        groups = []
        for rows in np.split(order, starts[1:]) if order.size else []:
            k = int(child[rows[0]])
            groups.append((k, rows, local[rows]))
        return idx.size, groups, visits

    def get_batch(self, indices: ArrayLike) -> Any:
        """The records at ``indices`` (int64, any order, repeats, negatives from the end).

        Raises
        ------
        IndexError, TypeError
            An index out of range, or indices that are not integers.
        SchemaMismatchError
            A child's batch differs from the composition's element spec (the children's
            common declared spec) in structure, shape or dtype; when none declares one,
            from the first batch this process read in structure, dtype or number of axes
            (the axes' lengths may vary). The message names the child and the field.
        SourceClosedError
            After :meth:`close`.
        """
        n, groups, _ = self._grouped(indices)
        if not groups:
            if self._spec is not None:
                return empty_batch(self._spec)
            return read_records(self._children[0], np.zeros(0, dtype=np.int64))
        parts = [
            (self._names[k], rows, read_records(self._children[k], local))
            for k, rows, local in groups
        ]
        if self._spec is not None:
            spec, whose = self._spec, "the element spec its sources declare"
        else:
            if self._seen is None:
                self._seen = (parts[0][0], record_spec(parts[0][2]))
            first, spec = self._seen
            whose = f"the first batch this process read (from source {first!r})"
        for name, rows, batch in parts:
            if self._spec is None and _signature(record_spec(batch)) == _signature(spec):
                continue  # undeclared: axes' lengths and string widths may vary
            check_part(name, batch, rows.size, spec, whose)
        return gather(parts, n)

    def origins(self, indices: ArrayLike) -> Origins:
        """Which leaf source and index each of ``indices`` is, names joined by ``"/"``."""
        n, groups, _ = self._grouped(indices)
        names: list[str] = []
        source = np.zeros(n, dtype=np.int64)
        index = np.zeros(n, dtype=np.int64)
        for k, rows, local in groups:
            inner = child_origins(self._names[k], self._children[k], local)
            ids = []
            for name in inner.names:
                if name not in names:
                    names.append(name)
                ids.append(names.index(name))
            source[rows] = np.asarray(ids, dtype=np.int64)[inner.source]
            index[rows] = inner.index
        return Origins(tuple(names), source, index)

    def record_keys(self, indices: ArrayLike) -> NDArray[np.uint64]:
        """A uint64 key per record of ``indices``: its leaf key folded with the names above
        (record keys identify a visit of a record: a repeat read is hash-mixed with its
        visit number, :func:`~mixle.data.sources.compose.lineage.visit_keys`)."""
        n, groups, visits = self._grouped(indices)
        keys = np.zeros(n, dtype=np.uint64)
        for k, rows, local in groups:
            keys[rows] = child_keys(self._names[k], self._children[k], local)
        if visits is None:
            return keys
        salt = getattr(self, "_salt", None)
        if salt is None:  # once: the composition's arguments tell its repeats apart
            salt = name_tag(repr((type(self).__qualname__, self._names, self._arguments())))
            self._salt = salt
        return visit_keys(keys, visits, salt)

    def fingerprint(self) -> str:
        """A digest of the composition and its children's fingerprints (Loader resume check)."""
        parts = {
            "type": type(self).__qualname__,
            "len": len(self),
            "arguments": repr(sorted(self._arguments().items())),
            "children": [[n, child_fingerprint(c)] for n, c in zip(self._names, self._children)],
        }
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close every child that has ``close()``, then this source."""
        for child in self._children:
            close = getattr(child, "close", None)
            if callable(close):
                close()
        self._closed = True

    def __reduce__(self) -> tuple[Any, ...]:
        self._check_open()
        return _rebuild_composed, (type(self), dict(self.sources), self._arguments())

    def _child_note(self, k: int) -> str:
        """What the ``repr`` says of child ``k`` before its length (a mix: its weight)."""
        return ""

    def _child_lines(self) -> list[str]:
        return [
            f"{name!r}: {self._child_note(k)}{n} records, {_describe(child)}"
            for k, (name, child, n) in enumerate(zip(self._names, self._children, self._lengths))
        ]

    def _header(self) -> str:
        closed = ", closed" if self._closed else ""
        return f"{len(self)} records from {len(self._names)} sources{closed}"

    def __repr__(self) -> str:
        try:
            lines = [self._header(), *self._child_lines()]
        except Exception as exc:  # a repr never raises
            return f"{type(self).__name__}(repr failed: {type(exc).__name__})"
        body = "\n".join(lines[1:]).replace("\n", "\n  ")
        return f"{type(self).__name__}({lines[0]}\n  {body})"


def _rebuild_composed(cls: type, sources: dict[str, Any], arguments: dict[str, Any]) -> Any:
    """Unpickle a composition: build it again (the children's specs are compared again)."""
    return cls(sources, **arguments)
