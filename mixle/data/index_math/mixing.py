"""Index math of composed sources: where a concatenation's index lands, and a weighted mix.

:func:`locate_concat` maps an index of sources laid end to end to ``(child, local index)``.

:class:`MixPlan` is the deterministic weighted interleaving behind :func:`mixle.mix`. The
sources with weight > 0 are the leaves of a binary split tree built like a Huffman code
(the two lightest subtrees merge first, so heavy sources sit near the root). An inner node
whose heavier side has the exact share ``p = a / b`` of the node's weight sends its ``r``-th
position (its rank among the positions that reach the node) to that side iff
``L(r + 1) > L(r)``, with ``L(r) = floor((r a + c) / b)`` and a phase ``c`` in ``[0, b)``
drawn from the seed: a Sturmian (Beatty) sequence of slope ``p``. The position's rank on
the side it goes to is the count of earlier positions that went there (``L(r)`` or
``r - L(r)``), so every node sees consecutive ranks and the whole walk is a closed form,
vectorised over positions. Leaf ``k`` receives its visits ``0, 1, 2, ...`` in position
order.

Exactness. The weights are exact rationals (a float weight is the rational it stores), and
so is every share; the arithmetic is integer arithmetic (int64 when it cannot overflow,
Python ints otherwise). Among any ``w`` consecutive positions a node sends ``L(s + w) -
L(s)`` to its heavier side, which differs from ``w p`` by less than 1. Through a path of
shares ``q_1 ... q_d`` (root first) to leaf ``k``, the count of visits to ``k`` in any
window of ``w`` positions therefore differs from ``w P_k`` (``P_k = q_1 ... q_d``, the
source's share of the total weight) by less than ``e_d``, where ``e_1 = 1`` and
``e_j = 1 + q_j e_{j-1}``: :attr:`MixPlan.bounds`. ``e_d < d`` (the leaf's depth) for
``d >= 2``, ``e_1 = 1``, and ``e_d < 2`` when every ``q_j`` below the root is at most 1/2
(two sources: both bounds are exactly 1, the deviations below 1). A single source, and
a source of weight 0, has bound 0 and deviation exactly 0: "less than" reads "at most"
there.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import hash_int, parse_seed
from mixle.data.index_math.permutation import permute

__all__ = ["MixNode", "MixPlan", "locate_concat", "visit_records"]

#: Hash streams of the mix: a node's phase, a node's identity, a source's visit order.
_PHASE_STREAM = 0x4D495850  # "MIXP"
_NODE_STREAM = 0x4D49584E  # "MIXN"
_VISIT_STREAM = 0x4D495856  # "MIXV"
_INT64_LIMIT = 1 << 63


def locate_concat(
    indices: ArrayLike, lengths: Sequence[int]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Child and local index of each of ``indices`` in sources of ``lengths`` laid end to end.

    Parameters
    ----------
    indices
        Non-negative int64 indices below ``sum(lengths)``, any order.
    lengths
        The children's lengths (zero-length children are allowed and never hit).

    Returns
    -------
    tuple of numpy.ndarray
        ``(child, local)``, int64 each: index ``i`` is record ``local`` of child ``child``.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
    child = np.searchsorted(offsets, idx, side="right").astype(np.int64) - 1
    return child, idx - offsets[child]


def visit_records(visits: ArrayLike, n: int, seed: int) -> NDArray[np.int64]:
    """The record of a source of ``n`` records each visit reads: a fresh order each pass.

    Visit ``j`` reads ``permute(j % n, n, seed=seed, epoch=j // n)``
    (:func:`~mixle.data.index_math.permutation.permute`): the first ``n`` visits read every
    record once, the next ``n`` again in another order, and so on.
    """
    j = np.asarray(visits, dtype=np.int64).reshape(-1)
    passes, positions = np.divmod(j, n)
    out = np.empty(j.size, dtype=np.int64)
    for k in np.unique(passes).tolist():
        sel = np.flatnonzero(passes == k)
        out[sel] = permute(positions[sel], n, seed=seed, epoch=k)
    return out


@dataclass(frozen=True)
class MixNode:
    """An inner node of the tree: its heavier side gets share ``a / b``, phase ``c``.

    ``heavy`` and ``light`` are codes: ``k >= 0`` is source ``k``, ``-1 - j`` is
    ``MixPlan.nodes[j]``.
    """

    heavy: int
    light: int
    a: int
    b: int
    c: int


def _split(
    r: NDArray[np.int64], a: int, b: int, c: int
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """Which of the node ranks ``r`` go to the heavy side, and their ranks on their side."""
    if r.size == 0:
        return np.zeros(0, dtype=np.bool_), r
    if (int(r.max()) + 1) * a + c < _INT64_LIMIT and b < _INT64_LIMIT:
        before = (r * a + c) // b
        after = (r * a + (a + c)) // b
    else:  # shares with large numerators or far positions: exact Python integers
        big = r.astype(object)
        before = ((big * a + c) // b).astype(np.int64)
        after = ((big * a + (a + c)) // b).astype(np.int64)
    heavy = after > before
    return heavy, np.where(heavy, before, r - before)


class MixPlan:
    """The weighted interleaving of sources: which source, and which visit, each position is.

    Parameters
    ----------
    weights
        One exact non-negative rational per source, at least one above 0. A source of
        weight 0 is never visited.
    tags
        One distinct 64-bit integer per source (e.g. a hash of its name). The tree's
        tie-breaks, the phases and the visit orders depend on the tags, never on the
        sources' order, so listing the sources in another order gives the same mix.
    seed
        Any int: it draws the phases (:meth:`visit_seed` also keys each source's visit
        order on it).

    Notes
    -----
    A pure function of ``(weights, tags, seed)`` and the position: independent of batch
    sizes, threads and processes. See the module docstring for the construction and the
    window guarantee, :attr:`bounds`.
    """

    def __init__(self, weights: Sequence[Fraction], tags: Sequence[int], seed: int) -> None:
        if len(weights) != len(tags):
            raise ValueError(f"got {len(weights)} weights for {len(tags)} tags")
        if len(set(tags)) != len(tags):
            raise ValueError("tags must be distinct")
        self.seed = parse_seed(seed)
        self.weights = tuple(Fraction(w) for w in weights)
        if any(w < 0 for w in self.weights) or not any(w > 0 for w in self.weights):
            raise ValueError(f"weights must be >= 0 with one > 0, got {list(self.weights)}")
        self.tags = tuple(int(t) for t in tags)
        total = sum(self.weights, Fraction(0))
        #: Each source's exact share of the positions, ``weight / sum(weights)``.
        self.shares = tuple(w / total for w in self.weights)
        self._nodes: list[MixNode] = []
        heap = [(w, t, k) for k, (w, t) in enumerate(zip(self.weights, self.tags)) if w > 0]
        heapq.heapify(heap)
        while len(heap) > 1:
            w_light, t_light, light = heapq.heappop(heap)
            w_heavy, t_heavy, heavy = heapq.heappop(heap)
            share = w_heavy / (w_light + w_heavy)
            a, b = share.numerator, share.denominator
            tag = hash_int(_NODE_STREAM, t_heavy, t_light)
            c = (hash_int(self.seed, _PHASE_STREAM, tag) * b) >> 64
            self._nodes.append(MixNode(heavy, light, a, b, c))
            heapq.heappush(heap, (w_light + w_heavy, tag, -len(self._nodes)))
        self._root = heap[0][2]
        #: The inner nodes (codes ``-1 - j``), and the root's code (a source for one source).
        self.nodes = tuple(self._nodes)
        self.root = self._root
        depths = [0] * len(self.weights)
        bounds = [Fraction(0)] * len(self.weights)
        self._walk_bounds(self._root, 0, Fraction(0), depths, bounds)
        #: Per source, its depth in the tree (0 for a lone source or a weight-0 one).
        self.depths = tuple(depths)
        #: Per source, the exact bound: in every window of ``w`` consecutive positions
        #: the source's visits differ from ``w * shares[k]`` by strictly less than it, or
        #: not at all where it is 0 (a lone source, or weight 0).
        self.bounds = tuple(bounds)

    def _walk_bounds(
        self, code: int, depth: int, error: Fraction, depths: list[int], bounds: list[Fraction]
    ) -> None:
        if code >= 0:
            depths[code], bounds[code] = depth, error
            return
        node = self._nodes[-1 - code]
        p = Fraction(node.a, node.b)
        self._walk_bounds(node.heavy, depth + 1, 1 + p * error, depths, bounds)
        self._walk_bounds(node.light, depth + 1, 1 + (1 - p) * error, depths, bounds)

    def visit_seed(self, source: int) -> int:
        """The permutation seed of source ``source``'s visits (from the seed and its tag)."""
        return hash_int(self.seed, _VISIT_STREAM, self.tags[source])

    def assign(self, positions: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Source and visit number of each of ``positions`` (non-negative ints, any order).

        Returns
        -------
        tuple of numpy.ndarray
            ``(source, visit)``, int64 each: position ``i`` is visit ``visit[i]`` (0 for
            the first) to source ``source[i]``.
        """
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.size and int(pos.min()) < 0:
            raise IndexError(f"positions contains {int(pos.min())}; positions are >= 0")
        source = np.empty(pos.size, dtype=np.int64)
        visit = np.empty(pos.size, dtype=np.int64)
        todo = [(self._root, np.arange(pos.size), pos)]
        while todo:
            code, rows, ranks = todo.pop()
            if code >= 0:
                source[rows], visit[rows] = code, ranks
                continue
            node = self._nodes[-1 - code]
            heavy, ranks = _split(ranks, node.a, node.b, node.c)
            todo.append((node.heavy, rows[heavy], ranks[heavy]))
            todo.append((node.light, rows[~heavy], ranks[~heavy]))
        return source, visit

    def counts(self, n: int) -> tuple[int, ...]:
        """Visits to each source among positions ``[0, n)`` (exact, O(number of sources))."""
        out = [0] * len(self.weights)
        todo = [(self._root, int(n))]
        while todo:
            code, m = todo.pop()
            if code >= 0:
                out[code] = m
                continue
            node = self._nodes[-1 - code]
            heavy = (m * node.a + node.c) // node.b
            todo += [(node.heavy, heavy), (node.light, m - heavy)]
        return tuple(out)

    def natural_length(self, lengths: Sequence[int]) -> int:
        """The most positions with no source visited more often than it has records.

        The largest ``n`` with ``counts(n)[k] <= lengths[k]`` for every source of weight >
        0 (the counts only grow with ``n``, so a binary search finds it).
        """
        live = [k for k, w in enumerate(self.weights) if w > 0]

        def fits(n: int) -> bool:
            got = self.counts(n)
            return all(got[k] <= lengths[k] for k in live)

        # n positions visit the live sources n times in all: past their total, one repeats
        lo, hi = 0, sum(int(lengths[k]) for k in live) + 1
        while hi - lo > 1:  # fits(lo) and not fits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo
