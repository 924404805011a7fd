"""What a SQL source runs its statements through (:class:`SQLBackend`), and SQLAlchemy's.

:class:`SQLBackend` is what a source runs its statements through: bound parameters only
(values are never written into SQL text), identifiers quoted by the dialect's own rules,
one snapshot per batch where the database gives one. :class:`SQLAlchemyBackend` reaches any
database SQLAlchemy does; SQLite files have their own backend
(:mod:`mixle.data.sources.records.sql.sqlite_backend`). SQLAlchemy is imported only when a
backend is made (``mixle[sql]``).
"""

from __future__ import annotations

import abc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from mixle.utils.optional_deps import require

__all__ = ["SQLAlchemyBackend", "SQLBackend"]

_T = TypeVar("_T")


class SQLBackend(abc.ABC):
    """One database: runs bound statements, streams results, quotes identifiers."""

    #: Whether parameters bind by position (``?``) rather than by name (``:name``).
    positional: bool = False

    @abc.abstractmethod
    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run ``sql`` with bound ``params``; return column names and all rows."""

    def snapshot(self, read: Callable[[], _T]) -> _T:
        """Run ``read()``, whose :meth:`fetch` calls form one batch, on one version of the data.

        ``read`` may be run more than once (a backend that can only tell afterwards that the
        data changed runs it again), so it must build its result afresh each time. This base
        runs it as it is: each statement sees whatever version is current.
        """
        return read()

    @abc.abstractmethod
    def stream(self, sql: str, params: Any, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        """Run ``sql`` and yield its rows ``chunk`` at a time (a server-side cursor)."""

    @abc.abstractmethod
    def quote(self, identifier: str) -> str:
        """``identifier`` quoted for this dialect."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close connections this backend opened."""

    def forget(self) -> None:  # noqa: B027 - optional hook
        """Drop connections inherited over ``fork`` without closing the parent's."""


#: SQLAlchemy dialects whose batches run at ``REPEATABLE READ``: one snapshot per transaction,
#: no locks taken, set with the transaction's ``BEGIN`` by the usual drivers.
_SNAPSHOT_DIALECTS = frozenset({"postgresql"})


class SQLAlchemyBackend(SQLBackend):
    """Any database SQLAlchemy reaches (PostgreSQL, MySQL...), by URL or ``Engine``.

    Notes
    -----
    The statements of one batch (:meth:`snapshot`) run on one connection, in one transaction
    that is rolled back at the end. On PostgreSQL it runs at ``REPEATABLE READ``, so the batch
    reads one snapshot. Elsewhere it runs at the engine's isolation level: one snapshot where
    that level gives one (MySQL/InnoDB's default ``REPEATABLE READ``), but under ``READ
    COMMITTED`` a writer committing between two statements of a batch is seen by the second.
    A SQLite ``Engine`` starts no transaction for ``SELECT`` (the ``sqlite3`` driver's
    default), so its statements each see their own version: pass the path instead.
    """

    def __init__(self, engine: Any, own: bool) -> None:
        self._sa = require("sqlalchemy", "sql", feature="read_sql with a database URL")
        self._engine, self._own = engine, own
        self._preparer = engine.dialect.identifier_preparer
        self._batch = threading.local()  # .conn: the connection of this thread's batch
        # an engine mixle made is disposed when its source is collected without close()
        self._finalizer = weakref.finalize(self, engine.dispose) if own else None

    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        conn = getattr(self._batch, "conn", None)
        if conn is None:
            return self.snapshot(lambda: self.fetch(sql, params))
        result = conn.execute(self._sa.text(sql), params or {})
        return list(result.keys()), [tuple(row) for row in result]

    def snapshot(self, read: Callable[[], _T]) -> _T:
        """Run ``read()``, whose :meth:`fetch` calls form one batch, in one transaction."""
        if getattr(self._batch, "conn", None) is not None:
            return read()
        with self._engine.connect() as conn:  # rolled back (and its level reset) on return
            if self._engine.dialect.name in _SNAPSHOT_DIALECTS:
                conn.execution_options(isolation_level="REPEATABLE READ")
            self._batch.conn = conn
            try:
                return read()
            finally:
                self._batch.conn = None

    def stream(self, sql: str, params: Any, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        with self._engine.connect() as conn:
            options = conn.execution_options(stream_results=True, max_row_buffer=chunk)
            result = options.execute(self._sa.text(sql), params or {})
            try:
                while True:
                    rows = result.fetchmany(chunk)
                    if not rows:
                        return
                    yield [tuple(row) for row in rows]
            finally:
                result.close()

    def quote(self, identifier: str) -> str:
        return str(self._preparer.quote_identifier(identifier))

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def forget(self) -> None:
        self._batch = threading.local()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._engine.dispose(close=False)
