"""Database connections for :mod:`mixle.data.sources.records.sql.sql_source`: what ``con=`` is.

:func:`connection_args` normalises ``con=`` (a SQLite path or ``sqlite:///`` URL, a
``sqlite3.Connection``, a SQLAlchemy URL or ``Engine``) to a reference a pickle can reopen;
:func:`open_backend` opens the backend for it (:mod:`~mixle.data.sources.records.sql.sqlite_backend`
or :mod:`~mixle.data.sources.records.sql.sql_backend`); :func:`show_connection` shows it without
credentials. Every statement mixle builds is run with bound parameters; values are never
written into SQL text. Identifiers (a table or key column name) are quoted by the dialect's
own rules.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from mixle.data.sources.records.sql.sql_backend import SQLAlchemyBackend, SQLBackend
from mixle.data.sources.records.sql.sqlite_backend import SQLiteBackend
from mixle.utils.optional_deps import require
from mixle.utils.redact import display_path

__all__ = [
    "ConnectionLike",
    "Params",
    "connection_args",
    "open_backend",
    "show_connection",
    "split_identifier",
    "sqlite_url_path",
]

#: What ``con=`` accepts: a SQLite file path, a ``sqlite3.Connection``, a SQLAlchemy URL
#: string (``postgresql+psycopg://...``) or a SQLAlchemy ``Engine``.
ConnectionLike = Any
#: Query parameters: a dict for ``:name`` placeholders, a sequence for ``?`` (SQLite only).
Params = Mapping[str, Any] | Sequence[Any] | None

_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


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
