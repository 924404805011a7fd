"""Database connections for :mod:`mixle.data.sources.sql_source`: SQLite and SQLAlchemy.

Every statement mixle builds is run with bound parameters; values are never written into
SQL text. Identifiers (a table or key column name) are quoted by the dialect's own rules.
"""

from __future__ import annotations

import abc
import os
import re
import sqlite3
import threading
import urllib.parse
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mixle.errors import UncheckpointedWALError
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = [
    "ConnectionLike",
    "Params",
    "SQLAlchemyBackend",
    "SQLBackend",
    "SQLiteBackend",
    "UncheckpointedWALError",
    "connection_args",
    "open_backend",
    "show_connection",
    "split_identifier",
    "sqlite_read_uri",
    "sqlite_url_path",
]

#: What ``con=`` accepts: a SQLite file path, a ``sqlite3.Connection``, a SQLAlchemy URL
#: string (``postgresql+psycopg://...``) or a SQLAlchemy ``Engine``.
ConnectionLike = Any
#: Query parameters: a dict for ``:name`` placeholders, a sequence for ``?`` (SQLite only).
Params = Mapping[str, Any] | Sequence[Any] | None

_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
#: The first bytes of every SQLite database file; header bytes 18 and 19 are 2 in WAL mode.
_SQLITE_MAGIC = b"SQLite format 3\x00"


class SQLBackend(abc.ABC):
    """One database: runs bound statements, streams results, quotes identifiers."""

    #: Whether parameters bind by position (``?``) rather than by name (``:name``).
    positional: bool = False

    @abc.abstractmethod
    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run ``sql`` with bound ``params``; return column names and all rows."""

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


def _standard_quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _is_wal_mode(path: str) -> bool:
    """Whether the SQLite file at ``path`` is in WAL mode, from its header."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return False  # sqlite3 reports the missing or unreadable file itself
    return head.startswith(_SQLITE_MAGIC) and 2 in head[18:20]


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def sqlite_read_uri(path: str) -> tuple[str, bool]:
    """The URI that opens SQLite file ``path`` read-only and writes nothing beside it.

    Returns
    -------
    tuple
        The ``file:`` URI, and whether it opens the file ``immutable`` (see Notes).

    Raises
    ------
    UncheckpointedWALError
        A WAL-mode file whose ``-wal`` holds data but has no ``-shm`` file.

    Notes
    -----
    ``mode=ro`` alone creates ``-wal`` and ``-shm`` files beside a WAL-mode database (and
    fails in a read-only folder), so the mode follows the files present:

    - not WAL mode (a rollback journal, SQLite's default): ``mode=ro``;
    - WAL mode with both ``-wal`` and ``-shm`` (a writer has the database open, or left
      them): ``mode=ro`` through them, seeing every committed transaction; SQLite keeps
      its read marks in that existing ``-shm``, and creates no file;
    - WAL mode with no ``-wal`` (or an empty one) and so no live writer:
      ``mode=ro&immutable=1``. With no log there is no transaction to miss, but SQLite
      then takes no locks and does not see later writers (:class:`SQLiteBackend` reopens
      ``mode=ro`` once a ``-wal`` appears);
    - WAL mode with a ``-wal`` holding data but no ``-shm``: refused, since ``mode=ro``
      would create the ``-shm`` and ``immutable`` would ignore the log's transactions.
    """
    absolute = os.path.abspath(path)
    base = "file:" + urllib.parse.quote(absolute)
    if not _is_wal_mode(absolute):
        return base + "?mode=ro", False
    wal, shm = absolute + "-wal", absolute + "-shm"
    wal_size = _size(wal)
    if wal_size is not None and os.path.exists(shm):
        return base + "?mode=ro", False
    if wal_size:
        raise UncheckpointedWALError(
            f"con={path!r} is a WAL-mode SQLite database whose log {wal!r} holds {wal_size} "
            f"bytes of transactions but has no {shm!r} file; reading it would create that "
            "file beside your data (or miss those transactions). Checkpoint it once with "
            f"write access, e.g. sqlite3 {path!r} 'PRAGMA wal_checkpoint(TRUNCATE)'"
        )
    return base + "?mode=ro&immutable=1", True


class SQLiteBackend(SQLBackend):
    """A SQLite database, read-only, through the standard library's ``sqlite3``.

    Notes
    -----
    A database file is opened with :func:`sqlite_read_uri`, so reading writes nothing
    beside it, in a read-only folder too. When that open is ``immutable`` (a WAL-mode
    file with no log), each statement first checks whether a writer has since created a
    ``-wal`` and, if so, reopens ``mode=ro`` to see its transactions; a writer that starts
    and checkpoints while one statement runs is not seen by that statement.
    """

    positional = True

    def __init__(self, path: str | None, connection: sqlite3.Connection | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._immutable = False
        if connection is not None:
            self._con, self._own = connection, False
        else:
            assert path is not None
            (self._con, self._immutable), self._own = self._connect(path), True

    @staticmethod
    def _connect(path: str) -> tuple[sqlite3.Connection, bool]:
        uri, immutable = sqlite_read_uri(path)
        return sqlite3.connect(uri, uri=True, check_same_thread=False), immutable

    def _connection(self) -> sqlite3.Connection:
        """The shared connection, reopened ``mode=ro`` once a writer made a log (under lock)."""
        if self._immutable and self._path and os.path.exists(self._path + "-wal"):
            con, immutable = self._connect(self._path)
            if immutable:
                con.close()
            else:
                self._con.close()
                self._con, self._immutable = con, False
        return self._con

    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            cursor = self._connection().execute(sql, params)
            try:
                names = [d[0] for d in cursor.description or ()]
                return names, cursor.fetchall()
            finally:
                cursor.close()

    def stream(self, sql: str, params: Any, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        con = self._connect(self._path)[0] if self._path else self._con
        lock = threading.Lock() if self._path else self._lock
        try:
            with lock:
                cursor = con.execute(sql, params)
            while True:
                with lock:
                    rows = cursor.fetchmany(chunk)
                if not rows:
                    return
                yield rows
        finally:
            if con is not self._con:
                con.close()

    def quote(self, identifier: str) -> str:
        return _standard_quote(identifier)

    def close(self) -> None:
        if self._own:
            with self._lock:
                self._con.close()


class SQLAlchemyBackend(SQLBackend):
    """Any database SQLAlchemy reaches (PostgreSQL, MySQL...), by URL or ``Engine``."""

    def __init__(self, engine: Any, own: bool) -> None:
        self._sa = require("sqlalchemy", "sql", feature="read_sql with a database URL")
        self._engine, self._own = engine, own
        self._preparer = engine.dialect.identifier_preparer
        # an engine mixle made is disposed when its source is collected without close()
        self._finalizer = weakref.finalize(self, engine.dispose) if own else None

    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._engine.connect() as conn:
            result = conn.execute(self._sa.text(sql), params or {})
            return list(result.keys()), [tuple(row) for row in result]

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
        if self._finalizer is not None:
            self._finalizer.detach()
        self._engine.dispose(close=False)


def _sqlite_path(con: sqlite3.Connection) -> str | None:
    """The file of a connection's main database, or ``None`` for an in-memory one."""
    rows = con.execute("PRAGMA database_list").fetchall()
    path = next((row[2] for row in rows if row[1] == "main"), "")
    return path or None


#: SQLAlchemy URLs of a SQLite file that mixle opens itself (read-only, writing nothing).
_SQLITE_URL = re.compile(r"^sqlite(\+pysqlite)?:///(?P<path>[^?]+)$")


def sqlite_url_path(url: str) -> str | None:
    """The file of a plain ``sqlite:///path`` URL (no query options), else ``None``.

    SQLAlchemy would open such a file read-write (creating ``-wal``/``-shm`` beside a
    WAL-mode database); mixle reads it with its own read-only connection instead. The
    path is unquoted as SQLAlchemy unquotes it; ``sqlite:////abs/path`` is absolute.
    """
    match = _SQLITE_URL.match(url)
    if match is None or match["path"] == ":memory:":
        return None
    return urllib.parse.unquote(match["path"])


def connection_args(con: ConnectionLike) -> tuple[str, str, Any]:
    """Normalise ``con=``: ``(kind, reopenable reference, live object or None)``.

    ``kind`` is ``"sqlite"`` or ``"sqlalchemy"``; the reference is a file path or URL string
    (``""`` when the connection cannot be reopened, e.g. an in-memory SQLite database).
    """
    if isinstance(con, sqlite3.Connection):
        return "sqlite", _sqlite_path(con) or "", con
    if isinstance(con, (str, os.PathLike)):
        given = text = os.fspath(con)
        if "://" in text:
            path = sqlite_url_path(text)
            if path is None:
                return "sqlalchemy", text, None
            text = path
        if not os.path.isfile(text):
            raise FileNotFoundError(
                f"con={given!r} is not a SQLite file (looked in {os.path.abspath(text)!r}); "
                "pass a SQLite path, a sqlite3.Connection, a SQLAlchemy URL such as "
                "'postgresql+psycopg://user@host/db' or a SQLAlchemy Engine"
            )
        return "sqlite", text, None
    url = getattr(con, "url", None)
    if url is not None and hasattr(con, "dialect") and hasattr(url, "render_as_string"):
        return "sqlalchemy", url.render_as_string(hide_password=False), con
    raise TypeError(
        f"con={type(con).__name__} must be a SQLite path, a sqlite3.Connection, a SQLAlchemy "
        "URL string or a SQLAlchemy Engine"
    )


def open_backend(kind: str, reference: str, live: Any) -> SQLBackend:
    """Open the backend for :func:`connection_args`' result (``live`` may be ``None``)."""
    if kind == "sqlite":
        # a file is reopened read-only with our own connection (safe from reader threads);
        # an in-memory database can only be read through the caller's connection
        return SQLiteBackend(reference) if reference else SQLiteBackend(None, live)
    if live is not None:
        return SQLAlchemyBackend(live, own=False)
    sa = require("sqlalchemy", "sql", feature="read_sql with a database URL")
    return SQLAlchemyBackend(sa.create_engine(reference), own=True)


def show_connection(kind: str, reference: str) -> str:
    """The connection, safe to show: SQLite paths as given, URLs without credentials."""
    if kind == "sqlite":
        return reference or ":memory:"
    return display_path(reference)


def split_identifier(name: str) -> list[str] | None:
    """``"schema.table"`` as its parts when every part is a plain identifier, else ``None``."""
    parts = name.split(".")
    if 1 <= len(parts) <= 2 and all(_PART.match(p) for p in parts):
        return parts
    return None
