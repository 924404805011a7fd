"""The SQL a :class:`~mixle.data.sources.records.sql.sql_source.SQLSource` runs: bound values only.

Values (the user's ``params`` and mixle's own: keys, limits, offsets) are always bound
through a :class:`Binder`, in the placeholder style the user's ``params`` use; the only text
mixle writes into a statement is the relation (:func:`relation_of`: a quoted table name or
the user's query as a subquery) and quoted column names.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.records.sql.sql_backend import SQLBackend
from mixle.data.sources.records.sql.sql_connect import Params, split_identifier

__all__ = [
    "ALIAS",
    "KEY",
    "Binder",
    "SQLHandle",
    "plain_params",
    "relation_of",
    "sa_error",
    "select_by_keys",
    "select_run",
    "sqlite_rowid",
]

#: The alias of the table or query in every statement (``... FROM <relation> AS _mixle_q``).
ALIAS = "_mixle_q"
#: The alias of the key column when rows are selected by key.
KEY = "_mixle_key"


class Binder:
    """Placeholders for bound values, in the style the user's ``params`` use.

    mixle's own named parameters (``:_mixle_0``, ``:_mixle_1``...) skip every name the
    user's ``params`` hold and every ``:name`` written in the query, so a user's value is
    never overwritten and a placeholder of the user's is never filled by mixle.
    """

    def __init__(self, positional: bool, user: Params, query: str = "") -> None:
        self.positional = positional
        self.values: Any = list(user or ()) if positional else dict(user or {})
        self._query = query
        self._n = 0

    def __call__(self, value: Any) -> str:
        if self.positional:
            self.values.append(value)
            return "?"
        name = f"_mixle_{self._n}"
        while name in self.values or f":{name}" in self._query:
            self._n += 1
            name = f"_mixle_{self._n}"
        self._n += 1
        self.values[name] = value
        return f":{name}"


@dataclass
class SQLHandle:
    """An open SQL source: its backend, the relation it reads and how rows are addressed."""

    backend: SQLBackend
    relation: str  # "<table> AS _mixle_q" or "(<query>) AS _mixle_q"
    key_expr: str | None  # None: rows are addressed by LIMIT/OFFSET
    names: list[str]
    count: int | None = None
    dense_start: int | None = None  # integer keys lo, lo + 1, ..., lo + count - 1
    keys: np.ndarray | None = None


def relation_of(query: str, backend: SQLBackend) -> tuple[str, list[str] | None]:
    """The relation rows are read from, and the table name's parts (``None`` for a query).

    A plain (``schema.``)``table`` name is quoted by the dialect; anything else is the
    user's query, read as a subquery.
    """
    parts = split_identifier(query)
    if parts is not None:
        return f"{'.'.join(backend.quote(p) for p in parts)} AS {ALIAS}", parts
    return f"({query}) AS {ALIAS}", None


def select_run(relation: str, bind: Binder, count: int, start: int) -> str:
    """``count`` rows of ``relation`` from position ``start`` on (``LIMIT``/``OFFSET``, bound)."""
    return f"SELECT * FROM {relation} LIMIT {bind(count)} OFFSET {bind(start)}"


def select_by_keys(handle: SQLHandle, bind: Binder, condition: str, values: Sequence[Any]) -> str:
    """The rows whose key meets ``condition``, each led by its key (aliased ``KEY``).

    ``condition`` is ``"{k} IN ({values})"`` (every value bound) or ``"{k} BETWEEN {a} AND
    {b}"`` (the first two values bound); ``{k}`` is the handle's key expression.
    """
    if "{values}" in condition:
        where = condition.format(k=handle.key_expr, values=", ".join(map(bind, values)))
    else:
        where = condition.format(k=handle.key_expr, a=bind(values[0]), b=bind(values[1]))
    return f"SELECT {handle.key_expr} AS {KEY}, {ALIAS}.* FROM {handle.relation} WHERE {where}"


def sqlite_rowid(backend: SQLBackend, relation: str) -> str | None:
    """``_mixle_q.rowid`` if the named SQLite relation has one, else ``None`` (LIMIT/OFFSET).

    Every table but ``WITHOUT ROWID`` ones has a rowid (selecting it fails on those); a
    view's ``rowid`` is ``NULL`` in every row, so a view is read like a query.
    """
    try:
        _, rows = backend.fetch(f"SELECT {ALIAS}.rowid FROM {relation} LIMIT 1", [])
    except sqlite3.Error:
        return None
    if rows and rows[0][0] is None:
        return None
    return f"{ALIAS}.rowid"


def plain_params(params: Mapping[str, Any] | Sequence[Any]) -> Any:
    """``params`` as a plain ``dict`` or ``list`` (what a source pickles)."""
    return dict(params) if isinstance(params, Mapping) else list(params)


def sa_error() -> type[BaseException]:
    """SQLAlchemy's base error when SQLAlchemy is imported, else a class nothing raises."""
    module = sys.modules.get("sqlalchemy.exc")
    return module.SQLAlchemyError if module is not None else _Never  # type: ignore[no-any-return]


class _Never(Exception):
    """Never raised: stands in for SQLAlchemy's error class when it is not imported."""
