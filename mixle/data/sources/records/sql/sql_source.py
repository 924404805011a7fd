"""SQL tables and queries as lazy, index-addressable record sources (:func:`read_sql`)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.records.base import Batch, RecordSource, TableMeta
from mixle.data.sources.records.columns import (
    INFER_ROWS,
    infer_value_spec,
    parse_dtypes,
    values_to_array,
)
from mixle.data.sources.records.sql.sql_backend import SQLBackend
from mixle.data.sources.records.sql.sql_connect import (
    ConnectionLike,
    Params,
    connection_args,
    open_backend,
    show_connection,
)
from mixle.data.sources.records.sql.sql_statements import (
    ALIAS,
    Binder,
    SQLHandle,
    plain_params,
    relation_of,
    sa_error,
    select_by_keys,
    select_run,
    sqlite_rowid,
)
from mixle.data.spec import ArraySpec
from mixle.errors import ColumnNotFoundError
from mixle.utils import optional_deps

__all__ = ["IN_LIST_MAX", "RANGE_MIN_ROWS", "SQL_CHUNK_ROWS", "SQLSource", "read_sql"]

#: Rows fetched per round trip when streaming and when gathering keys.
SQL_CHUNK_ROWS = 10_000
#: Most bound values in one ``key IN (...)`` statement.
IN_LIST_MAX = 500
#: Runs of at least this many consecutive rows are read with one ``BETWEEN`` range.
RANGE_MIN_ROWS = 16


class SQLSource(RecordSource):
    """Rows of a SQL table or query; see :func:`read_sql`."""

    _connection: Any = None
    _connection_pid: int | None = None  # the process the caller's connection belongs to

    @property  # type: ignore[override]
    def _library(self) -> str | None:
        """``"sqlalchemy"`` for a URL or ``Engine`` (the repr says when it is missing)."""
        return "sqlalchemy" if self._args["kind"] == "sqlalchemy" else None

    def __init__(
        self,
        query_or_table: str,
        con: ConnectionLike,
        *,
        params: Params = None,
        key: str | None = None,
        chunk_size: int = SQL_CHUNK_ROWS,
        dtypes: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(query_or_table, str) or not query_or_table.strip():
            raise TypeError(f"query_or_table={query_or_table!r} must be a table name or a query")
        if params is not None and (
            isinstance(params, (str, bytes)) or not isinstance(params, (Mapping, Sequence))
        ):
            raise TypeError(f"params={params!r} must be a dict (:name), a list (?) or None")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key={key!r} must be a column name or None")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size!r} must be an int >= 1")
        kind, reference, live = connection_args(con)
        if kind == "sqlalchemy" and params is not None and not isinstance(params, Mapping):
            raise TypeError(
                f"params={params!r}: SQLAlchemy queries take named parameters; write :name in "
                "the query and pass params={'name': value}"
            )
        self._connection, self._connection_pid = live, os.getpid()
        self._init_state(
            {
                "query": query_or_table.strip().rstrip(";").strip(),
                "kind": kind,
                "con": reference,
                "params": None if params is None else plain_params(params),
                "key": key,
                "chunk_size": chunk_size,
                "dtypes": dtypes,
            }
        )
        if kind == "sqlite" or optional_deps.HAS_SQLALCHEMY:
            self._live()  # fail early: bad connection, table, query or key
        # (a URL without SQLAlchemy: at first use, in a process that has SQLAlchemy)

    def __reduce__(self) -> tuple[Any, ...]:
        if not self._args["con"]:
            raise TypeError(
                f"{self!r} reads an in-memory SQLite database, which another process cannot "
                "open; write it to a file and pass the path"
            )
        return super().__reduce__()

    def _location(self) -> str:
        query = self._args["query"]
        shown = query if len(query) <= 60 else query[:57] + "..."
        return f"{shown!r} on {show_connection(self._args['kind'], self._args['con'])}"

    def _binder(self, backend: SQLBackend) -> Binder:
        user = self._args["params"]
        positional = backend.positional and not isinstance(user, Mapping)
        return Binder(positional, user, self._args["query"])

    def _fetch(self, handle_or_backend: Any, sql: str, bind: Binder) -> tuple[list[str], list]:
        backend = getattr(handle_or_backend, "backend", handle_or_backend)
        try:
            return backend.fetch(sql, bind.values)  # type: ignore[no-any-return]
        except (sqlite3.Error, sa_error()) as exc:
            raise ValueError(f"{self._location()} failed: {exc}".split("\n")[0]) from exc

    # -- open ---------------------------------------------------------------------------
    def _open(self) -> tuple[SQLHandle, TableMeta]:
        args = self._args
        # a forked child never uses the caller's connection: it opens its own
        live = self._connection if self._connection_pid == os.getpid() else None
        if args["kind"] == "sqlite" and not args["con"] and live is None:
            raise TypeError("an in-memory SQLite database cannot be reopened in another process")
        backend = open_backend(args["kind"], args["con"], live)
        try:
            return self._describe(backend)
        except BaseException:
            backend.close()
            raise

    def _describe(self, backend: SQLBackend) -> tuple[SQLHandle, TableMeta]:
        args, query = self._args, self._args["query"]
        relation, parts = relation_of(query, backend)
        bind = self._binder(backend)
        names, sample = self._fetch(
            backend, f"SELECT * FROM {relation} LIMIT {bind(INFER_ROWS)}", bind
        )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"{self._location()} returns the column name(s) {duplicates} more than once; "
                "give them distinct aliases (SELECT a.id AS a_id, b.id AS b_id ...)"
            )
        key_expr: str | None = None
        if args["key"] is not None:
            if args["key"] not in names:
                raise ColumnNotFoundError(
                    f"key={args['key']!r} is not a column of {self._location()}; "
                    f"{listing(names, 'its columns')}"
                )
            key_expr = f"{ALIAS}.{backend.quote(args['key'])}"
        elif parts is not None and args["kind"] == "sqlite":
            key_expr = sqlite_rowid(backend, relation)
        overrides = parse_dtypes(args["dtypes"], names, self._location())
        specs: dict[str, ArraySpec] = {}
        for k, name in enumerate(names):
            values = [row[k] for row in sample]
            dtype, shape = infer_value_spec(values)
            if name in overrides:
                dtype, shape = overrides[name], ()
            values_to_array(values, dtype, shape, name, lambda j: j + 1, self._location(), "row")
            specs[name] = ArraySpec(shape, dtype)
        return SQLHandle(backend, relation, key_expr, names), TableMeta(specs)

    # -- addressing rows ----------------------------------------------------------------
    def _count(self, handle: SQLHandle) -> int:
        if handle.count is None:
            if handle.key_expr is None:
                bind = self._binder(handle.backend)
                _, rows = self._fetch(handle, f"SELECT COUNT(*) FROM {handle.relation}", bind)
                handle.count = int(rows[0][0])
            else:
                self._index_keys(handle)
        assert handle.count is not None
        return handle.count

    def _index_keys(self, handle: SQLHandle) -> None:
        """Count rows and learn the key of each position: a dense range, or gathered once."""
        k, rel = handle.key_expr, handle.relation
        bind = self._binder(handle.backend)
        sql = f"SELECT MIN({k}), MAX({k}), COUNT({k}), COUNT(DISTINCT {k}), COUNT(*) FROM {rel}"
        _, rows = self._fetch(handle, sql, bind)
        lo, hi, with_key, distinct, total = rows[0]
        shown = self._args["key"]
        if with_key != total and shown is None:
            raise ValueError(
                f"{self._location()}: its rowid is NULL in {total - with_key} of {total} rows, "
                "so rows cannot be addressed by it; pass key= a column with unique, non-NULL "
                "values"
            )
        shown = shown or "rowid"
        if with_key != total:
            raise ValueError(f"key={shown!r} is NULL in {total - with_key} rows; keys must be set")
        if distinct != total:
            raise ValueError(
                f"key={shown!r} has {distinct} distinct values in {total} rows; pass a key "
                "column whose values are unique (e.g. the primary key)"
            )
        handle.count = int(total)
        if isinstance(lo, int) and isinstance(hi, int) and hi - lo + 1 == total:
            handle.dense_start = lo
            return
        bind = self._binder(handle.backend)
        parts = [
            np.asarray([row[0] for row in chunk], dtype=None if isinstance(lo, int) else object)
            for chunk in handle.backend.stream(
                f"SELECT {k} FROM {rel} ORDER BY {k}", bind.values, self._args["chunk_size"]
            )
        ]
        handle.keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _keys_at(self, handle: SQLHandle, rows: NDArray[np.int64]) -> list[Any]:
        if handle.count is None:
            self._count(handle)
        if handle.dense_start is not None:
            return (rows + handle.dense_start).tolist()  # type: ignore[no-any-return]
        assert handle.keys is not None
        return handle.keys[rows].tolist()  # type: ignore[no-any-return]

    def _read_rows(self, handle: SQLHandle, rows: NDArray[np.int64]) -> Batch:
        """Read ``rows`` with one or more statements that all see one version of the data."""
        if handle.key_expr is None:
            fetched = handle.backend.snapshot(lambda: self._read_by_offset(handle, rows))
        else:
            keys = self._keys_at(handle, rows)  # the key index is read before the batch
            fetched = handle.backend.snapshot(lambda: self._read_by_key(handle, rows, keys))
        return self._to_columns(fetched, [int(r) + 1 for r in rows])

    def _read_by_offset(self, handle: SQLHandle, rows: NDArray[np.int64]) -> list[tuple]:
        out: list[tuple] = []
        for run in np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1):
            bind = self._binder(handle.backend)
            sql = select_run(handle.relation, bind, int(run.size), int(run[0]))
            out.extend(self._fetch(handle, sql, bind)[1])
        if len(out) != rows.size:
            raise RuntimeError(f"{self._location()} returned fewer rows than it counted")
        return out

    def _read_by_key(
        self, handle: SQLHandle, rows: NDArray[np.int64], keys: list[Any]
    ) -> list[tuple]:
        """The rows at sorted positions ``rows`` (whose keys are ``keys``), built afresh."""
        by_key: dict[Any, tuple] = {}
        singles: list[Any] = []
        for run in np.split(np.arange(rows.size), np.flatnonzero(np.diff(rows) != 1) + 1):
            if run.size >= RANGE_MIN_ROWS:
                self._select(handle, by_key, "{k} BETWEEN {a} AND {b}", keys[run[0]], keys[run[-1]])
            else:
                singles.extend(keys[int(j)] for j in run)
        for lo in range(0, len(singles), IN_LIST_MAX):
            self._select(handle, by_key, "{k} IN ({values})", *singles[lo : lo + IN_LIST_MAX])
        try:
            return [by_key[key] for key in keys]
        except KeyError as exc:
            raise RuntimeError(
                f"{self._location()} no longer has a row with key {exc.args[0]!r}: the data "
                "changed after the source counted its rows; open it again"
            ) from None

    def _select(self, handle: SQLHandle, into: dict, condition: str, *values: Any) -> None:
        bind = self._binder(handle.backend)
        sql = select_by_keys(handle, bind, condition, values)
        for row in self._fetch(handle, sql, bind)[1]:
            into[row[0]] = tuple(row[1:])

    def _to_columns(self, rows: list[tuple], numbers: Sequence[int]) -> Batch:
        meta = self._meta
        assert meta is not None
        where, out = self._location(), {}
        for k, (name, spec) in enumerate(meta.columns.items()):
            values = [row[k] for row in rows]
            out[name] = values_to_array(
                values, spec.dtype, spec.shape, name, numbers.__getitem__, where, "row"
            )
        return out

    def _stream(self, handle: SQLHandle, block_rows: int) -> Iterator[Batch]:
        order = "" if handle.key_expr is None else f" ORDER BY {handle.key_expr}"
        sql = f"SELECT * FROM {handle.relation}{order}"
        bind = self._binder(handle.backend)
        pending: list[tuple] = []
        done = 0
        for chunk in handle.backend.stream(sql, bind.values, self._args["chunk_size"]):
            pending.extend(chunk)
            while len(pending) >= block_rows:
                block, pending = pending[:block_rows], pending[block_rows:]
                yield self._to_columns(block, range(done + 1, done + 1 + len(block)))
                done += len(block)
        if pending:
            yield self._to_columns(pending, range(done + 1, done + 1 + len(pending)))

    def _release(self, handle: SQLHandle) -> None:
        handle.backend.close()

    def _forget(self, handle: SQLHandle) -> None:
        handle.backend.forget()


def read_sql(
    query_or_table: str,
    con: ConnectionLike,
    *,
    params: Params = None,
    key: str | None = None,
    chunk_size: int = SQL_CHUNK_ROWS,
    dtypes: Mapping[str, Any] | None = None,
) -> SQLSource:
    """Open a SQL table or query as a lazy, index-addressable source of records.

    Parameters
    ----------
    query_or_table
        A table name (``"labels"``, ``"schema.labels"``) or a ``SELECT`` query.
    con
        A SQLite file path or ``"sqlite:///path"`` URL string (opened read-only), a
        ``sqlite3.Connection``, a SQLAlchemy URL (``"postgresql+psycopg://user@127.0.0.1/db"``)
        or a SQLAlchemy ``Engine``. A SQLite ``Engine`` (``create_engine("sqlite:///x.db")``)
        is used as SQLAlchemy opens it, read-write: it creates ``-wal``/``-shm`` files beside
        a WAL-mode database. Pass the path or the URL string instead.
    params
        Values for the query's placeholders, always bound, never written into SQL: a dict
        for ``:name`` placeholders, or (SQLite) a list for ``?``. Any name may be used:
        mixle's own placeholders (``:_mixle_0``...) skip the names in ``params`` and in the
        query.
    key
        A column with unique, non-NULL values that addresses rows: row ``i`` is the row
        with the ``i``-th smallest key, read with ``WHERE key IN (...)`` or ``BETWEEN``.
    chunk_size
        Rows per round trip when streaming and when gathering keys.
    dtypes
        ``{"column": dtype}`` overrides of the types inferred from the first rows.

    Returns
    -------
    SQLSource
        The same interface as :func:`mixle.read_csv`'s source.

    Raises
    ------
    FileNotFoundError
        ``con`` is a path that is not a file.
    ImportError
        ``con`` is a URL that needs SQLAlchemy and SQLAlchemy is not installed: raised at
        first use (``len``, ``[i]``, ``get_batch``, ``records()``, ``element_spec()``...),
        not here, naming the ``sql`` extra. The source still builds and pickles, so it can
        be sent to workers that have SQLAlchemy; its repr says it is not opened and why.
        The checks below then also run at first use.
    ColumnNotFoundError
        ``key`` (or a name in ``dtypes``) is not a column.
    ValueError
        The table or query fails (the database's message is included), returns a column
        name twice, or ``key`` has NULL or repeated values.

    Notes
    -----
    How rows are addressed, and what ``len`` and ``[i]`` cost:

    - with ``key``: the first ``len``/``[i]`` runs one ``MIN/MAX/COUNT`` query. Integer keys
      without gaps need nothing more; otherwise the keys are gathered once, in key order,
      ``chunk_size`` at a time (8 bytes per row for integer keys). A batch is one query
      per ``IN_LIST_MAX`` keys.
    - a SQLite table without ``key`` uses its ``rowid`` the same way. A SQLite view has no
      rowid (it reads as ``NULL``): read by name without ``key``, it is addressed like a
      query, below; pass ``key=`` a unique column of it for stable positions and fast reads.
    - any other query: ``len`` is one ``COUNT(*)`` of the query; a batch runs ``LIMIT n
      OFFSET i`` per run of consecutive rows, which makes the server produce and skip ``i``
      rows, so a shuffled epoch costs O(rows^2 / batch) on the server. Positions are stable
      only if the query has an ``ORDER BY`` on unique columns; give a ``key`` instead.

    One ``get_batch`` reads one version of the data, however many statements it runs. A
    SQLite file: one read transaction (a live writer's commits during the batch are not
    seen; a rollback-journal writer waits for the batch), or, for a WAL-mode file opened
    ``immutable``, the whole batch is run again if the file changed while it ran (then
    :class:`~mixle.FileChangedError`). PostgreSQL: one ``REPEATABLE READ`` transaction.
    Other SQLAlchemy databases: one transaction at the engine's isolation level, which
    under ``READ COMMITTED`` may mix versions; so may a SQLite ``Engine``.

    ``records()`` and ``iter_batches()`` stream with ``fetchmany`` (a server-side cursor on
    PostgreSQL), in key order when rows are keyed. Pickling keeps the query, the parameters
    and the connection's path or URL (with its password: keep pickles private); an
    in-memory SQLite database cannot be pickled.
    """
    return SQLSource(
        query_or_table, con, params=params, key=key, chunk_size=chunk_size, dtypes=dtypes
    )
