"""``mix``: a deterministic weighted interleaving of sources, exact over every window."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.index_math.hashing import parse_seed
from mixle.data.index_math.mixing import MixPlan, visit_records
from mixle.data.index_math.permutation import permute
from mixle.data.sources.compose.base import (
    ComposedSource,
    SourcesLike,
    child_structure,
    combined_structure,
)
from mixle.data.sources.compose.lineage import name_tag
from mixle.data.structure import SampleStructure
from mixle.utils.validation import parse_int

__all__ = [
    "TABLES_PER_SOURCE",
    "VISIT_TABLE_BYTES",
    "VISIT_TABLE_RECORDS",
    "MixSource",
    "WeightsLike",
    "mix",
    "parse_weights",
]

#: A source of at most this many records has each pass's visit order computed whole, once,
#: and looked up: a batch then makes no ``permute`` call, whose fixed cost (about 0.25 ms
#: for 256 indices: NumPy's per-call overhead over 8 to 24 rounds and their cycle walks)
#: dominates a fast read such as a ``.npy`` file's.
VISIT_TABLE_RECORDS = 1 << 20
#: Passes whose visit orders are kept per source (a batch touching more uses ``permute``).
TABLES_PER_SOURCE = 2
#: Bytes of visit orders one mix may keep in all (int32, 4 bytes a record): a mix whose
#: sources' :data:`TABLES_PER_SOURCE` tables would not all fit keeps none and permutes per
#: batch (a random batch touches every source, so a smaller cache would rebuild tables on
#: every batch).
VISIT_TABLE_BYTES = 64 << 20

WeightsLike = Sequence[float] | Mapping[str, float] | None
"""One weight per source, in the order of the sources or by name; ``None``: all equal."""


def _exact(value: object, where: str) -> Fraction:
    """One weight as the exact rational it stores."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}={value!r} must be a number, not a bool")
    if isinstance(value, (numbers.Rational, np.integer)):
        out = Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    elif isinstance(value, (numbers.Real, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{where}={value!r} must be finite")
        out = Fraction(float(value))
    else:
        raise TypeError(f"{where}={value!r} must be a real number (an int or a float)")
    if out < 0:
        raise ValueError(f"{where}={value!r} must be >= 0")
    return out


def parse_weights(weights: object, names: Sequence[str]) -> tuple[Fraction, ...]:
    """``weights`` for sources ``names`` as exact rationals (``None``: 1 each).

    Raises
    ------
    TypeError
        ``weights`` is not a sequence or mapping of numbers, or holds a bool.
    ValueError
        Not one weight per source (a mapping's keys differ from the names), a weight that
        is negative, NaN or infinite, or weights that sum to 0.
    """
    if weights is None:
        return tuple(Fraction(1) for _ in names)
    if isinstance(weights, Mapping):
        if set(weights) != set(names):
            missing = [n for n in names if n not in weights]
            extra = [k for k in weights if k not in names]
            raise ValueError(
                f"weights has keys {list(weights)!r}, but the sources are {list(names)!r} "
                f"(missing {missing!r}, unknown {extra!r}); give one weight per source name"
            )
        out = tuple(_exact(weights[n], f"weights[{n!r}]") for n in names)
    elif isinstance(weights, (Sequence, np.ndarray)) and not isinstance(weights, str):
        values = list(weights.tolist() if isinstance(weights, np.ndarray) else weights)
        if len(values) != len(names):
            raise ValueError(
                f"weights={values!r} has {len(values)} entries for {len(names)} sources; "
                "give one weight per source"
            )
        out = tuple(_exact(v, f"weights[{i}]") for i, v in enumerate(values))
    else:
        raise TypeError(
            f"weights={weights!r} must be None, a sequence of numbers (one per source) or "
            "a dict {name: weight}"
        )
    if not any(out):
        raise ValueError(f"weights={weights!r} sum to 0; at least one weight must be > 0")
    return out


def _float_above(value: Fraction) -> float:
    """The smallest float >= ``value``."""
    near = float(value)
    return near if Fraction(near) >= value else math.nextafter(near, math.inf)


class MixSource(ComposedSource):
    """A seeded, weighted interleaving of sources; built by :func:`mix` (see there)."""

    def __init__(
        self,
        sources: SourcesLike,
        weights: WeightsLike = None,
        *,
        seed: int = 0,
        length: int | None = None,
    ) -> None:
        super().__init__(sources)
        exact = parse_weights(weights, self._names)
        self._seed = parse_seed(seed)
        for name, w, n, child in zip(self._names, exact, self._lengths, self._children):
            if w > 0 and n == 0:
                raise ValueError(
                    f"sources[{name!r}] is empty but has weight {float(w)!r}; an empty "
                    "source can only be mixed with weight 0"
                )
            structure = child_structure(child)
            if w > 0 and structure is not None and not structure.shuffleable:
                raise ValueError(
                    f"sources[{name!r}] has structure {structure!r}, whose records may not "
                    f"be reordered, but mix reads each source in a seeded shuffled order; "
                    "give it weight 0, or concat it instead of mixing it"
                )
        self._weights = exact
        self._plan = MixPlan(exact, [name_tag(n) for n in self._names], self._seed)
        self._natural = self._plan.natural_length(self._lengths)
        if length is None:
            self._length: int | None = None
            self._len = self._natural
        else:
            self._length = parse_int(length, "length")
            if self._length < 0:
                raise ValueError(f"length={length!r} must be >= 0 (or None)")
            self._len = self._length
        self._visit_seeds = tuple(self._plan.visit_seed(k) for k in range(len(self._names)))
        self._tables: dict[tuple[int, int], NDArray[np.int32]] = {}  # (source, pass) -> order
        weighted = [n for n, w in zip(self._lengths, exact) if w > 0]
        self._use_tables = (
            max(weighted, default=0) <= VISIT_TABLE_RECORDS
            and TABLES_PER_SOURCE * 4 * sum(weighted) <= VISIT_TABLE_BYTES
        )

    def __len__(self) -> int:
        return self._len

    @property
    def seed(self) -> int:
        """The seed of the interleaving and of each source's visit order."""
        return self._seed

    @property
    def weights(self) -> dict[str, float]:
        """Each source's weight, by name."""
        return {n: float(w) for n, w in zip(self._names, self._weights)}

    @property
    def shares(self) -> dict[str, float]:
        """Each source's share of the records, ``weight / sum(weights)``."""
        return {n: float(p) for n, p in zip(self._names, self._plan.shares)}

    @property
    def max_deviation(self) -> dict[str, float]:
        """Per source, the bound of :func:`mix`'s window guarantee (a float at or above the
        exact rational :attr:`MixPlan.bounds`): in every window of ``w`` consecutive
        records, the source's count differs from ``w * share`` by strictly less, or not at
        all where the bound is 0 (a lone source, or one of weight 0)."""
        return {n: _float_above(b) for n, b in zip(self._names, self._plan.bounds)}

    @property
    def structure(self) -> SampleStructure | None:
        """The sources' ``structure`` when every source of weight > 0 reports the same
        (``IID`` or ``EXCHANGEABLE``); :data:`~mixle.EXCHANGEABLE` when they differ;
        ``None`` when none reports one. (A source whose records may not be reordered
        cannot be mixed.)"""
        return combined_structure([c for c, w in zip(self._children, self._weights) if w > 0])

    @property
    def natural_length(self) -> int:
        """The length with ``length=None``: the most records with none read twice."""
        return self._natural

    @property
    def plan(self) -> MixPlan:
        """The index math: exact shares and bounds (fractions), and the tree's walk."""
        return self._plan

    def counts(self, n: int) -> dict[str, int]:
        """How many of the first ``n`` records come from each source (exact, no reads)."""
        n = parse_int(n, "n")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        return dict(zip(self._names, self._plan.counts(n)))

    def _locate(
        self, idx: NDArray[np.int64]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        source, visit = self._plan.assign(idx)
        local = np.empty_like(visit)
        passes = np.empty_like(visit)
        for k in np.unique(source).tolist():
            sel = np.flatnonzero(source == k)
            n = self._lengths[k]
            local[sel] = self._visits(k, visit[sel])
            passes[sel] = visit[sel] // n
        return source, local, passes

    def _visits(self, k: int, visits: NDArray[np.int64]) -> NDArray[np.int64]:
        """The records of source ``k`` that ``visits`` read (:func:`visit_records`)."""
        n, seed = self._lengths[k], self._visit_seeds[k]
        passes, positions = np.divmod(visits, n)
        touched = np.unique(passes).tolist()
        if not self._use_tables or len(touched) > TABLES_PER_SOURCE:
            return visit_records(visits, n, seed)  # (a shuffled read of a many-pass mix)
        out = np.empty_like(visits)
        for p in touched:
            sel = np.flatnonzero(passes == p)
            out[sel] = self._table(k, p)[positions[sel]]
        return out

    def _table(self, k: int, p: int) -> NDArray[np.int32]:
        """Pass ``p``'s visit order of source ``k``, whole; the last
        :data:`TABLES_PER_SOURCE` of each source are kept.

        Two threads may both build one: the same array, so no lock is needed.
        """
        table = self._tables.get((k, p))
        if table is None:
            n = self._lengths[k]
            order = permute(np.arange(n, dtype=np.int64), n, seed=self._visit_seeds[k], epoch=p)
            table = order.astype(np.int32)
            mine = [key for key in list(self._tables) if key[0] == k]
            for key in mine[: max(0, len(mine) - TABLES_PER_SOURCE + 1)]:  # oldest first
                self._tables.pop(key, None)
            self._tables[(k, p)] = table
        return table

    def _arguments(self) -> dict[str, Any]:
        return {
            "weights": dict(zip(self._names, self._weights)),
            "seed": self._seed,
            "length": self._length,
        }

    def _header(self) -> str:
        length = "" if self._length is None else f", length={self._length}"
        return f"{super()._header()}, seed={self._seed}{length}"

    def _child_note(self, k: int) -> str:
        weight, share = float(self._weights[k]), float(self._plan.shares[k])
        return f"weight {weight:g} (share {share:.3g}), "


def mix(
    sources: SourcesLike,
    weights: WeightsLike = None,
    *,
    seed: int = 0,
    length: int | None = None,
) -> MixSource:
    """A deterministic weighted interleaving of ``sources``, exact over every window.

    Parameters
    ----------
    sources
        A non-empty list or tuple of sources (named ``"0"``, ``"1"``, ...) or a dict
        ``{name: source}``: anything :func:`mixle.concat` takes.
    weights
        One finite weight >= 0 per source (a sequence in the order of ``sources``, or a
        dict by name), not all 0; ``None`` (default): equal weights. Only the ratios
        matter. A source of weight 0 is never read.
    seed
        Any int. Record ``i`` of the mix is a pure function of ``(seed, i)``, the weights,
        the names and the sources' lengths: independent of batch size, threads, worker
        processes and who asks.
    length
        ``None`` (default): the mix ends just before the first source of weight > 0 would
        have to repeat a record (:attr:`MixSource.natural_length`), so every record is read
        at most once. An int >= 0: exactly that many records; past the natural length the
        shorter sources wrap (their records repeat, each pass in a fresh seeded order).

    Returns
    -------
    MixSource
        A source with the surface of :func:`mixle.concat`'s (``get_batch`` with one call
        per source touched, ``origins``, ``record_keys``, ``close``, small pickles), plus
        ``weights``, ``shares``, ``max_deviation``, ``natural_length`` and ``counts(n)``.

    Raises
    ------
    TypeError
        ``sources`` or ``weights`` of the wrong type, a bool weight, or ``seed`` or
        ``length`` that is not an int (bools and floats are refused).
    ValueError
        Not one weight per source, a negative, NaN or infinite weight, weights summing
        to 0, a negative ``length``, an empty source of weight > 0, or a source of weight
        > 0 whose ``structure`` forbids reordering (``SEQUENTIAL``, grouped): the mix
        reads each source in a shuffled order.
    SchemaMismatchError
        Sources that declare different element specs.

    Notes
    -----
    **Which source.** The sources of weight > 0 are the leaves of a binary tree built like
    a Huffman code (heavier sources nearer the root). A node whose heavier side has the
    exact share ``p = a / b`` sends its ``r``-th position there iff ``floor(((r + 1) a +
    c) / b) > floor((r a + c) / b)``, a Sturmian sequence with a phase ``c`` drawn from the
    seed; the position's rank on its side is the count of earlier positions that went
    there. Weights are taken as exact rationals (a float is the rational it stores) and
    all of this is integer arithmetic, so nothing drifts with the position.

    **The guarantee.** In *every* window of ``w`` consecutive records (any start, any
    ``w``, wrapped or not), the number from source ``k`` differs from ``w * share_k`` by
    strictly less than ``max_deviation[k]`` where that is above 0, and not at all where it
    is 0 (a lone source, and a source of weight 0, which is never read). The bound is 1
    for a source at the root's split and below its depth in the tree deeper down (below
    2 when every split under the root gives its side at most half). With two sources both
    bounds are exactly 1, so both deviations are below 1: the counts are ``floor`` or
    ``ceil`` of ``w * share``.

    **Which record.** The ``j``-th visit to a source of ``n`` records reads
    ``permute(j % n, n, seed=s_k, epoch=j // n)``
    (:func:`mixle.data.index_math.permutation.permute`), ``s_k`` hashed from ``seed`` and
    the source's name: each pass over the source is a fresh seeded order. The tree's
    tie-breaks and phases depend on names, not on their order, so listing the sources in
    another order gives the same mix. ``mix`` of one source is that source permuted.
    ``origins`` name each record's true source and index; ``record_keys`` identify a
    visit of a record: on pass ``p = j // n`` the key is the record's key in
    :func:`mixle.concat` for ``p = 0`` and that key hash-mixed with ``p`` for ``p >= 1``,
    so within the natural length a record has the same key as in a concat, and each
    repeat past it draws fresh randomness (the Loader's ``record_transform``, a
    ``map(..., fn(record, rng))`` above the mix).

    **With a Loader.** The mix already shuffles within each source, so iterate it with
    ``Loader(mix(...), shuffle=False)``: every batch is a window of the mix, and holds
    each source's share within ``max_deviation``. With shards (``num_shards > 1``) that
    holds for the *global* batch (the shards' batches of one step together); each shard's
    own batch is a window, and holds the shares, only with ``shard_layout="blocked"``.
    The default ``"interleaved"`` gives shard ``s`` every ``num_shards``-th record, and a
    stride of the interleaving can be far off the shares (with two equal weights and two
    shards, each shard may get one source only). ``shuffle=True`` permutes the mixed
    records, so the shares still hold exactly over the epoch, but per batch only in
    expectation.

    Examples
    --------
    >>> import numpy as np, mixle
    >>> m = mixle.mix({"web": np.zeros((90, 2)), "books": np.ones((30, 2))}, [3, 1])
    >>> len(m), m.counts(8)
    (120, {'web': 6, 'books': 2})
    """
    return MixSource(sources, weights, seed=seed, length=length)
