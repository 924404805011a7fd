"""``concat``: sources laid end to end, each record keeping its origin."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.mixing import locate_concat
from mixle.data.sources.compose.base import ComposedSource, SourcesLike

__all__ = ["ConcatSource", "concat"]


class ConcatSource(ComposedSource):
    """The records of each source in turn: all of the first, then all of the second, ...

    Built by :func:`concat`; see there for the contract.
    """

    def __init__(self, sources: SourcesLike) -> None:
        super().__init__(sources)
        self._len = sum(self._lengths)

    def __len__(self) -> int:
        return self._len

    def _locate(self, idx: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64], None]:
        child, local = locate_concat(idx, self._lengths)
        return child, local, None

    def _arguments(self) -> dict[str, Any]:
        return {}


def concat(sources: SourcesLike) -> ConcatSource:
    """The records of ``sources`` one source after another, as one lazy source.

    Parameters
    ----------
    sources
        A non-empty list or tuple of sources (named ``"0"``, ``"1"``, ...) or a dict
        ``{name: source}`` (names: non-empty strings without ``"/"``). A source is anything
        map-style with ``__len__``: a mixle source or sampler, an object with
        ``get_batch(indices)`` (:class:`mixle.Source`), or any ``__getitem__(int)`` object
        such as a NumPy array (read row by row, a NumPy array by one fancy index).
        Zero-length sources are allowed.

    Returns
    -------
    ConcatSource
        ``len`` is the sum of the lengths; index ``i`` is record ``i - offset_k`` of the
        source ``k`` whose range ``[offset_k, offset_k + len_k)`` holds ``i``.

    Raises
    ------
    TypeError, ValueError
        ``sources`` is not a non-empty list, tuple or dict of map-style sources, or a name
        is not a non-empty string without ``"/"``.
    SchemaMismatchError
        Two sources declare different ``element_spec()``; the message names both, the
        first field that differs and both specs. Sources that declare none are compared
        when a batch mixes them.

    Notes
    -----
    Building reads lengths and element specs only, no records, except that a
    :func:`mixle.map` source without ``spec=`` maps its record 0 once to find its spec.
    ``get_batch(indices)`` (any order, repeats, negative indices from the end) calls
    ``get_batch`` once per source it touches, with that source's indices in request order,
    checks each source's rows against the element spec, and scatters them into one
    preallocated batch. ``origins(indices)`` names each record's source and index there
    (``"name"``, or ``"name/inner"`` through a nested composition) and
    ``record_keys(indices)`` gives each record a uint64 key from the names on its path and
    its index (or its source's own ``record_keys``), so a record has the same origin and
    key in ``concat({"a": a, "b": b})``, ``concat({"b": b, "a": a})`` and
    ``mix({"a": a, "b": b})``. Record keys identify a visit of a record: where a record
    is read again (a wrapped :func:`mixle.mix`, a :func:`mixle.select` with repeated
    indices) the repeat gets its own key, so it draws fresh randomness; first visits
    keep the key above. ``structure`` is the sources' common
    :class:`~mixle.SampleStructure`, or ``SEQUENTIAL`` when any source's records may not
    be reordered (so ``Loader(shuffle=True)`` refuses the concat too). ``close()`` closes
    every source; reads, ``element_spec()`` and pickling then raise
    :class:`~mixle.SourceClosedError`. Pickling stores the sources (mixle sources by
    reference: paths and options) and their names, never data, so a Loader's worker
    processes get a small copy.

    Examples
    --------
    >>> import numpy as np, mixle
    >>> both = mixle.concat({"a": np.zeros((2, 3)), "b": np.ones((4, 3))})
    >>> len(both), both.origins([1, 2]).names
    (6, ('a', 'b'))
    """
    return ConcatSource(sources)
