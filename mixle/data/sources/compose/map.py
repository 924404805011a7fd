"""``map``: a function applied to each record of a source, lazily, when the record is read.

A :class:`MapSource` reads its child, splits the batch into records, calls ``fn`` on each
(with a generator keyed on the record's identity when ``fn`` takes one) and stacks the
results. Records keep their identity (``record_keys``, ``origins``) when mapped.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.batches import stack_records, sub_spec, unstack_batch
from mixle.data.index_math.hashing import hash_int, parse_seed
from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.data.sources.compose.children import (
    child_fingerprint,
    child_spec,
    read_records,
    refuse_path,
)
from mixle.data.sources.compose.gather import empty_batch, record_spec
from mixle.data.sources.compose.lineage import leaf_keys, leaf_origins
from mixle.data.sources.custom import Source
from mixle.data.sources.origins import Origins
from mixle.data.spec import ArraySpec, SpecTree, batch_spec, spec_of
from mixle.errors import SourceClosedError
from mixle.utils.callables import takes_rng

__all__ = ["MapSource", "map", "map_rng"]

_MAP_STREAM = 0x4D415020  # "MAP ": keeps map's randomness apart from the Loader's streams


def map_rng(seed: int, key: int) -> np.random.Generator:
    """The generator ``fn(record, rng)`` gets for the record whose key is ``key``.

    A Philox generator keyed by the hash of ``(seed, "MAP ", key)``; ``key`` is the record's
    key in the mapped source (:func:`~mixle.data.sources.compose.lineage.leaf_keys`).
    """
    return np.random.Generator(np.random.Philox(key=hash_int(seed, _MAP_STREAM, int(key))))


def _strings_as_objects(batch: Any, spec: SpecTree | None) -> Any:
    """``batch`` with its fixed-width string leaves (``U``, ``S``) as object arrays of
    Python ``str``/``bytes``, except where ``spec`` (the user's ``spec=``) declares a
    string dtype itself.

    A fixed-width string batch has the width of its longest value, so two batches would
    differ in dtype; record sources give strings as object leaves, and so does a map.
    """
    if isinstance(batch, dict):
        return {k: _strings_as_objects(v, sub_spec(spec, k)) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_strings_as_objects(v, sub_spec(spec, i)) for i, v in enumerate(batch))
    if isinstance(batch, np.ndarray) and batch.dtype.kind in "US":
        if isinstance(spec, ArraySpec) and spec.dtype.kind in "US":
            return batch
        return batch.astype(object)
    return batch


def _stack_outputs(
    outputs: list[Any],
    indices: NDArray[np.int64],
    guide: SpecTree | None,
    declared: SpecTree | None,
) -> Any:
    """Stack ``fn``'s outputs by ``guide`` (object leaves hold one value each), strings as
    object arrays unless ``declared`` (``spec=``) gives them a string dtype; on a
    mismatch, name the first record that does not stack with the first.
    """
    try:
        batch = stack_records(outputs, guide)
    except ValueError as exc:
        for row in range(1, len(outputs)):
            try:
                stack_records([outputs[0], outputs[row]], guide)
            except ValueError as pair:
                raise ValueError(
                    f"map fn returned {spec_of(outputs[row])} for record {int(indices[row])} "
                    f"but {spec_of(outputs[0])} for record {int(indices[0])}: {pair}; fn "
                    "must return one structure (keys, lengths), leaf shape and leaf dtype "
                    "for every record"
                ) from exc
        raise
    return _strings_as_objects(batch, declared)


class MapSource(Source):
    """``fn`` applied to each record of ``source`` when it is read (see :func:`map`)."""

    def __init__(
        self,
        source: Any,
        fn: Callable[..., Any],
        seed: int,
        spec: SpecTree | None,
        computed: SpecTree | None = None,
    ) -> None:
        self._source = source
        self._fn = fn
        self._seed = seed
        self._spec = spec
        self._computed = computed
        self._with_rng = takes_rng(fn)
        self._lock = threading.Lock()

    @property
    def source(self) -> Any:
        """The source whose records are mapped."""
        return self._source

    @property
    def fn(self) -> Callable[..., Any]:
        """The function applied to each record."""
        return self._fn

    @property
    def seed(self) -> int:
        """The seed of ``fn``'s generators."""
        return self._seed

    def _live(self) -> None:
        if self._closed:
            raise SourceClosedError(f"{self!r} is closed")

    def _indices(self, indices: ArrayLike) -> NDArray[np.int64]:
        self._live()
        return parse_indices(indices, len(self._source))

    def __len__(self) -> int:
        self._live()
        return len(self._source)

    def get_batch(self, indices: ArrayLike) -> Any:
        """``fn`` of records ``indices`` (any order, repeats allowed, negative from the end),
        stacked: one ``get_batch`` call of the child, ``fn`` per record."""
        idx = self._indices(indices)
        if not idx.size:
            return empty_batch(self.element_spec())
        records = unstack_batch(read_records(self._source, idx), idx.size)
        fn = self._fn
        if self._with_rng:
            keys = leaf_keys(self._source, idx).tolist()
            rngs = [map_rng(self._seed, k) for k in keys]
        outputs = []
        for row, record in enumerate(records):
            try:
                outputs.append(fn(record, rngs[row]) if self._with_rng else fn(record))
            except Exception as exc:
                exc.add_note(f"in the fn of mixle.map, on record {int(idx[row])}")
                raise
        return _stack_outputs(outputs, idx, self._guide(), self._spec)

    def _guide(self) -> SpecTree | None:
        """The spec ``fn``'s outputs are stacked by: ``spec`` when given, else the child's
        declared spec (its object leaves: strings, lists, dicts held as one value each)."""
        return self._spec if self._spec is not None else child_spec(self._source)

    def element_spec(self) -> SpecTree:
        """``spec`` when given, else the spec of ``fn`` of record 0 (read once, then cached)."""
        self._live()
        if self._spec is not None:
            return self._spec
        computed = self._computed
        if computed is None:
            with self._lock:
                computed = self._computed
                if computed is None:
                    if len(self._source) == 0:
                        raise ValueError(
                            f"{self!r} has no records to compute element_spec from; pass "
                            "map(..., spec=...)"
                        )
                    computed = self._computed = record_spec(self.get_batch([0]))
        return computed

    def record_keys(self, indices: ArrayLike) -> NDArray[np.uint64]:
        """The child's record keys: a record keeps its identity when mapped."""
        return leaf_keys(self._source, self._indices(indices))

    def origins(self, indices: ArrayLike) -> Origins:
        """The child's origins (a plain child: the indices themselves)."""
        return leaf_origins(self._source, self._indices(indices))

    @property
    def structure(self) -> Any:
        """The child's ``structure`` (``None`` when it has none)."""
        return getattr(self._source, "structure", None)

    @property
    def shuffle_block(self) -> Any:
        """The child's ``shuffle_block`` (``None`` when it has none): records stay in place."""
        return getattr(self._source, "shuffle_block", None)

    def fingerprint(self) -> str:
        """A digest of the child's fingerprint, ``fn``'s name, the seed and the declared spec
        (the Loader's resume check)."""
        fn = self._fn
        name = getattr(fn, "__qualname__", type(fn).__qualname__)  # never a repr's address
        parts = {
            "type": type(self).__qualname__,
            "child": child_fingerprint(self._source),
            "fn": f"{getattr(fn, '__module__', '')}.{name}",
            "seed": self._seed,
            "spec": repr(self._spec),
        }
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close the map *and its child*: the map owns the source it was given."""
        self._closed = True
        close = getattr(self._source, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", None) or repr(self._fn)
        closed = ", closed" if self._closed else ""
        return f"MapSource({self._source!r}, fn={name}, seed={self._seed}{closed})"

    def __reduce__(self) -> tuple[Any, ...]:
        self._live()
        return (MapSource, (self._source, self._fn, self._seed, self._spec, self._computed))


def map(
    source: Any,
    fn: Callable[..., Any],
    *,
    seed: int = 0,
    spec: SpecTree | None = None,
) -> MapSource:
    """``fn`` applied to each record of ``source``, lazily, when the record is read.

    Parameters
    ----------
    source
        Any mixle source (``len`` and ``get_batch``, or ``len`` and ``source[i]``), or
        another composition.
    fn
        ``fn(record) -> record``, or ``fn(record, rng) -> record`` (two required positional
        parameters, or a second one named ``rng``): ``rng`` is a ``np.random.Generator``
        keyed on ``seed`` and the record's key (:func:`map_rng`). It must return one
        structure (keys, leaf shapes) for every record. For process workers
        (``Loader(num_workers=...)``) it must pickle: a module-level function, not a lambda.
    seed
        Seeds ``fn``'s generators.
    spec
        The spec of one mapped record (a tree of :class:`~mixle.ArraySpec`), if known; else
        ``element_spec()`` maps record 0 once to find it, with every string leaf (``U``,
        ``S``) as ``object``.

    Returns
    -------
    MapSource
        A mixle source: ``len``, ``[i]``, slices, ``get_batch`` (one ``get_batch`` call of
        ``source``, then ``fn`` per record), ``records()``, ``element_spec()``,
        ``record_keys`` and ``origins`` (``source``'s), ``close()`` (which closes ``source``
        too), a context manager.

    Raises
    ------
    TypeError
        ``source`` is a path (``str``, ``bytes``, ``PathLike``: open it first, e.g.
        ``mixle.read_npy(path)``); ``fn`` is not callable; ``spec`` is not a tree of
        ``ArraySpec``.
    ValueError
        At a read: ``fn`` returned different structures, leaf shapes or leaf dtypes for
        two records of one batch (the message names both records and the field).

    Notes
    -----
    **Stacking.** ``fn``'s outputs are stacked by ``spec``, or without it by ``source``'s
    element spec: where that declares an object leaf of shape ``()`` (a record source's
    string, list or struct column), the strings, bytes, ``None``, lists, tuples and dicts
    ``fn`` returns there are one value each (to return a structure in place of such a
    leaf, pass ``spec=``). Strings are given as object arrays of ``str``/``bytes``, as
    record sources give them (unless ``spec`` declares a fixed-width string dtype), so a
    batch's dtype never depends on its longest string.

    **Randomness.** The randomness follows the record, not its position: ``rng`` is keyed
    on the record's key in ``source`` (its own ``record_keys``, or its index), so
    ``select(map(s, fn))`` and ``map(select(s), fn)`` give a record the same draws.
    Record keys identify a visit of a record: a repeat in ``select`` or a wrapped ``mix``
    under the map draws anew, while ``select(map(...))`` reads the same mapped record
    again. It
    is the *same every epoch*; for fresh randomness per epoch use the Loader's
    ``record_transform``. Pickling stores ``source``, ``fn``, ``seed`` and the spec, never
    data.
    """
    refuse_path(source, "source")
    if not callable(fn):
        raise TypeError(
            f"fn={fn!r} ({type(fn).__name__}) must be callable: fn(record) or fn(record, rng)"
        )
    if spec is not None:
        try:
            batch_spec(spec, 1)
        except TypeError:
            raise TypeError(
                f"spec={spec!r} must be a tree (dicts, tuples, lists) of mixle.ArraySpec "
                "describing one mapped record, or None (map record 0 to find it)"
            ) from None
    return MapSource(source, fn, parse_seed(seed), spec)
