"""Sources made of sources: concatenate, mix, select and map, keeping each record's origin.

Each combinator is itself a lazy, index-addressable mixle source that pickles by reference
to its children: :func:`concat`, :func:`mix` (a deterministic weighted interleaving with
exact proportions over every window), :func:`select` (indices, a mask, or the rows where a
column equals a value) and :func:`map` (a function per record). Their records report where
they come from (``origins``) and keep one identity however they are composed
(``record_keys``, which identify a visit of a record: a repeat read by a wrapped mix or a
repeated select index gets its own key); see ``docs/composing.md``.
"""

from mixle.data.sources.compose.concat import ConcatSource, concat
from mixle.data.sources.compose.map import MapSource, map
from mixle.data.sources.compose.mix import MixSource, mix
from mixle.data.sources.compose.select import SelectSource, select

__all__ = [
    "ConcatSource",
    "MapSource",
    "MixSource",
    "SelectSource",
    "concat",
    "map",
    "mix",
    "select",
]
