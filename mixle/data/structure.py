"""How the records of a source relate to each other, which says what a loader may do with them.

``IID`` and ``EXCHANGEABLE`` records may be shuffled and split freely; ``SEQUENTIAL`` records
carry meaning in their order; ``partially_exchangeable(by)`` records are exchangeable only
within groups named by ``by`` (whole groups stay together when data is sharded).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EXCHANGEABLE",
    "IID",
    "SEQUENTIAL",
    "SampleStructure",
    "StructureKind",
    "parse_structure",
    "partially_exchangeable",
]

StructureKind = Literal["iid", "exchangeable", "sequential", "partially_exchangeable"]
_KINDS: tuple[str, ...] = ("iid", "exchangeable", "sequential", "partially_exchangeable")

GroupKey = str | Callable[[int], Hashable]


@dataclass(frozen=True)
class SampleStructure:
    """The statistical structure of a source's records.

    Parameters
    ----------
    kind
        One of ``"iid"``, ``"exchangeable"``, ``"sequential"``, ``"partially_exchangeable"``.
    by
        For ``"partially_exchangeable"`` only: a field name, or a callable mapping a record
        index to its group key.
    """

    kind: StructureKind
    by: GroupKey | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {', '.join(map(repr, _KINDS))}")
        if self.kind == "partially_exchangeable":
            if not (isinstance(self.by, str) or callable(self.by)):
                raise TypeError(
                    f"by={self.by!r}: partially_exchangeable needs a field name (str) or a "
                    "callable mapping a record index to its group"
                )
        elif self.by is not None:
            raise ValueError(f"by={self.by!r} is only meaningful for partially_exchangeable")

    @property
    def shuffleable(self) -> bool:
        """Whether records may be reordered across the whole source."""
        return self.kind in ("iid", "exchangeable")

    @property
    def grouped(self) -> bool:
        """Whether records form groups that must stay together."""
        return self.kind == "partially_exchangeable"

    def __repr__(self) -> str:
        if self.kind == "partially_exchangeable":
            return f"partially_exchangeable(by={self.by!r})"
        return self.kind.upper()


#: Independent, identically distributed records: any order, any split.
IID = SampleStructure("iid")
#: Records whose joint distribution does not depend on their order (the default of every
#: source): the Loader may shuffle them and split them across shards freely.
EXCHANGEABLE = SampleStructure("exchangeable")
#: Records whose order carries meaning (a time series): the Loader refuses ``shuffle=True``.
SEQUENTIAL = SampleStructure("sequential")


def partially_exchangeable(by: GroupKey) -> SampleStructure:
    """Records exchangeable within the groups given by ``by`` (a field name or a callable)."""
    return SampleStructure("partially_exchangeable", by)


def parse_structure(structure: object) -> SampleStructure:
    """Validate a ``structure=`` argument."""
    if not isinstance(structure, SampleStructure):
        raise TypeError(
            f"structure={structure!r} must be a SampleStructure: IID, EXCHANGEABLE, "
            "SEQUENTIAL or partially_exchangeable(by) from mixle.data.structure"
        )
    return structure
