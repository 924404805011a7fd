"""Record identity through compositions: each record's origin and its key.

A composed source (:func:`mixle.concat`, :func:`mixle.mix`, :func:`mixle.select`,
:func:`mixle.map`) knows, for each of its records, the underlying source and index it
reads. Two things follow from that, both pure functions of the composition's *names*
rather than positions:

- :func:`child_origins` — the :class:`~mixle.data.sources.origins.Origins` of a child's
  records, leaf names prefixed by the child's name (``"train/web"``);
- :func:`child_keys` — a uint64 key per record: the leaf's record key (its own
  ``record_keys`` or its index) folded with the names on the path to it. The Loader keys
  ``record_transform``'s randomness on it, so a record draws the same randomness in
  ``concat({"a": a, "b": b})``, ``concat({"b": b, "a": a})`` or ``mix({"a": a, ...})``.
- :func:`visit_keys` — record keys identify a *visit* of a record: where a composition
  reads a record again (a mix past its natural length, a select with repeated indices),
  the repeat's key is its first key hash-mixed with the visit number, so each repeat
  draws fresh randomness; a first visit keeps the key above.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.hashing import mix
from mixle.data.sources.origins import Origins
from mixle.data.sources.protocols import SupportsOrigins, SupportsRecordKeys

__all__ = [
    "child_keys",
    "child_origins",
    "leaf_keys",
    "leaf_origins",
    "name_tag",
    "visit_keys",
]

#: Hash stream of a repeat visit's key: keeps it apart from every name-folded key.
_VISIT_STREAM = 0x56495354  # "VIST"


def name_tag(name: str) -> int:
    """A stable 64-bit tag of a source name (BLAKE2b: the same in every process and run)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def leaf_keys(source: Any, indices: NDArray[np.int64]) -> NDArray[np.uint64]:
    """``source.record_keys(indices)`` when it has them, else the indices as uint64."""
    if isinstance(source, SupportsRecordKeys):
        keys = np.asarray(source.record_keys(indices))
        if keys.shape != indices.shape or keys.dtype.kind not in "iu":
            raise TypeError(
                f"{type(source).__name__}.record_keys returned {keys.dtype} of shape "
                f"{keys.shape} for {indices.size} indices; it must return one integer per index"
            )
        return keys.astype(np.uint64)
    return indices.astype(np.uint64)


def leaf_origins(source: Any, indices: NDArray[np.int64]) -> Origins:
    """``source.origins(indices)`` for a composed source; a plain source is its own origin,
    named ``""``."""
    if isinstance(source, SupportsOrigins):
        return source.origins(indices)
    return Origins(("",), np.zeros(indices.size, np.int64), indices)


def child_keys(name: str, source: Any, indices: NDArray[np.int64]) -> NDArray[np.uint64]:
    """Keys of ``source``'s records ``indices`` when it is the child called ``name``."""
    return mix(np.uint64(name_tag(name)), leaf_keys(source, indices))[: indices.size]


def child_origins(name: str, source: Any, indices: NDArray[np.int64]) -> Origins:
    """Origins of ``source``'s records ``indices`` with leaf names prefixed by ``name``."""
    inner = leaf_origins(source, indices)
    names = tuple(f"{name}/{leaf}" if leaf else name for leaf in inner.names)
    return Origins(names, inner.source, inner.index)


def visit_keys(
    keys: NDArray[np.uint64], visits: NDArray[np.int64], salt: int
) -> NDArray[np.uint64]:
    """``keys`` of records read for the ``visits``-th time: visit 0 (a first read) keeps its
    key, visit ``v >= 1`` gets the key hash-mixed with ``salt`` and ``v``.

    ``salt`` tells the compositions apart (a select's selection, a mix's arguments), so a
    record repeated at two levels (a select of a wrapped mix, a select of a select) does not
    get one key for two different visits."""
    again = visits > 0
    if not again.any():
        return keys
    out = keys.copy()
    out[again] = mix(keys[again], np.uint64(_VISIT_STREAM), np.uint64(salt), visits[again])
    return out
