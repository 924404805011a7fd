"""SQLite files read-only, writing nothing beside them, through the standard ``sqlite3``.

:func:`sqlite_read_uri` chooses how a file is opened (``mode=ro``, or ``immutable`` for a
WAL-mode file with no log); :class:`SQLiteBackend` runs the statements of one batch on one
version of the file, and watches an ``immutable`` file's signature itself, reopening or
rereading when a writer changed it (then :class:`~mixle.errors.FileChangedError`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from mixle.data.sources.arrays.memmap.check import FileSignature, file_signature
from mixle.data.sources.records.sql.sql_backend import SQLBackend
from mixle.errors import FileChangedError, UncheckpointedWALError

__all__ = [
    "SQLITE_READ_TRIES",
    "SQLiteBackend",
    "TIMESTAMP_SLACK_NS",
    "UncheckpointedWALError",
    "sqlite_read_uri",
]

_T = TypeVar("_T")

#: The first bytes of every SQLite database file; header bytes 18 and 19 are 2 in WAL mode.
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: Runs of one batch (or lone statement) on an ``immutable`` SQLite connection (each discarded
#: when the file changed while it ran) before :class:`FileChangedError` is raised.
SQLITE_READ_TRIES = 5
#: A SQLite file changed less than this long (ns) before its signature was taken may change
#: again within the same coarse timestamp; until it is older, statements reopen the file.
TIMESTAMP_SLACK_NS = 2_000_000_000


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
      then takes no locks and never looks at the file again before reusing the pages it
      cached: :class:`SQLiteBackend` watches the file itself;
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


def _main_signature(path: str) -> tuple[FileSignature, bool]:
    """``path``'s :func:`file_signature`, and whether it is settled (see ``TIMESTAMP_SLACK_NS``).

    Raises
    ------
    FileChangedError
        ``path`` no longer exists.
    """
    now = time.time_ns()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileChangedError(
            f"con={path!r}: the SQLite file was deleted or moved after it was opened; open "
            "the source again"
        ) from None
    return file_signature(st), max(st.st_mtime_ns, st.st_ctime_ns) < now - TIMESTAMP_SLACK_NS


@dataclass
class _ReadConnection:
    """A read-only connection to a SQLite file, with what is needed to tell if it went stale."""

    con: sqlite3.Connection
    path: str
    #: The file's signature taken before the connection read anything, for an ``immutable``
    #: connection; ``None`` for ``mode=ro``, which SQLite's own locks keep consistent.
    signature: FileSignature | None
    #: Whether the file was last changed at least ``TIMESTAMP_SLACK_NS`` before ``signature``.
    settled: bool
    #: Whether a statement has run (and so may have cached pages).
    used: bool = False

    @property
    def immutable(self) -> bool:
        return self.signature is not None

    def changed(self) -> bool:
        """Whether the file's signature differs from the one this immutable connection took."""
        return self.signature is not None and _main_signature(self.path)[0] != self.signature

    def stale(self) -> bool:
        """Whether it may miss data: a change, a new ``-wal``, pages cached of an unsettled file."""
        if self.signature is None:
            return False
        unsure = self.used and not self.settled
        return unsure or os.path.exists(self.path + "-wal") or self.changed()


def _open_read(path: str) -> _ReadConnection:
    """``path`` opened with :func:`sqlite_read_uri`, its signature taken first.

    A ``-wal`` left for a moment without its ``-shm`` (a writer closing deletes the ``-shm``
    first, then the ``-wal`` it has checkpointed) is looked at again before it is refused.
    """
    for attempt in range(1, SQLITE_READ_TRIES + 1):
        signature, settled = _main_signature(path)
        try:
            uri, immutable = sqlite_read_uri(path)
        except UncheckpointedWALError:
            if attempt == SQLITE_READ_TRIES:
                raise
            _pause(attempt)
            continue
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        read = _ReadConnection(con, path, signature if immutable else None, settled)
        # a sqlite3.Connection is freed only by the cycle collector (its statement cache
        # refers back to it); closed as soon as its source is dropped instead
        weakref.finalize(read, con.close)
        return read
    raise AssertionError("unreachable")  # pragma: no cover


def _pause(attempt: int) -> None:
    """Wait a little before looking at a SQLite file's log again."""
    time.sleep(0.001 * attempt)


def _execute(con: sqlite3.Connection, sql: str, params: Any) -> sqlite3.Cursor:
    """``con.execute``: one seam for every query mixle runs on SQLite (not BEGIN/ROLLBACK)."""
    return con.execute(sql, params)


def _fetch_all(con: sqlite3.Connection, sql: str, params: Any) -> tuple[list[str], list]:
    cursor = _execute(con, sql, params)
    try:
        return [d[0] for d in cursor.description or ()], cursor.fetchall()
    finally:
        cursor.close()


class _BatchChanged(Exception):
    """A statement of a batch failed while its immutable file changed: run the batch again."""


def _changed_error(path: str, doing: str) -> FileChangedError:
    return FileChangedError(
        f"con={path!r}: the SQLite file changed {doing} (a writer checkpointed into it, with "
        "no -wal file open to coordinate through); mixle never returns a batch whose rows "
        "mix two versions of the file. Read again, or keep a writer connection open while "
        "reading so that reads go through its -wal"
    )


class SQLiteBackend(SQLBackend):
    """A SQLite database, read-only, through the standard library's ``sqlite3``.

    Notes
    -----
    A database file is opened with :func:`sqlite_read_uri`, so reading writes nothing
    beside it, in a read-only folder too. The statements of one batch (:meth:`snapshot`)
    read one version of the file:

    - a ``mode=ro`` connection runs them in one read transaction (``BEGIN`` ... ``ROLLBACK``):
      a WAL-mode reader sees the snapshot its first statement took; in a rollback-journal
      database the shared lock makes a writer wait (its busy timeout) until the batch ends.
      Nothing is held between batches;
    - an ``immutable`` one (a WAL-mode file with no log) takes no locks and reuses its cached
      pages without looking at the file, so mixle watches the file's signature (device,
      inode, size, modification and status-change times; the header's change counter is not
      bumped by WAL checkpoints), taken before the connection reads. Before a batch the
      connection is reopened if the signature changed (a writer committed and closed,
      checkpointing into the file) or a ``-wal`` appeared (a writer is open: ``mode=ro``
      through its log from then on); a file changed less than ``TIMESTAMP_SLACK_NS`` before
      its signature was taken can change again without a new timestamp, so until it settles
      every batch reopens. A batch during which the file changed is discarded and run
      again, whole, up to ``SQLITE_READ_TRIES`` times, then
      :class:`~mixle.errors.FileChangedError`;
    - a stream (:meth:`stream`) checks the signature before and after each block it
      fetches; a change before the first block restarts it, a later one raises
      :class:`~mixle.errors.FileChangedError` (the blocks yielded were of one version);
    - an in-memory database read through the caller's connection: a batch runs under one
      lock, so mixle's own threads do not interleave, but writes made through that same
      connection are seen at once.

    A :meth:`fetch` outside a batch is a batch of one statement. Not seen: a change that
    keeps the size and lands within the file system's timestamp granularity of the previous
    change while a batch runs.
    """

    positional = True

    def __init__(self, path: str | None, connection: sqlite3.Connection | None = None) -> None:
        self._path = path
        self._lock = threading.RLock()  # held for a whole batch; its fetch calls reenter
        self._read: _ReadConnection | None = None
        #: The connection of the batch running (set and read under ``_lock``).
        self._batch: sqlite3.Connection | None = None
        if connection is not None:
            self._con, self._own = connection, False
        else:
            assert path is not None
            self._read = _open_read(path)
            self._con, self._own = self._read.con, True

    def _connection(self) -> _ReadConnection | None:
        """The shared connection, reopened first if it may be stale (under lock)."""
        read = self._read
        if read is not None and read.stale():
            fresh = _open_read(read.path)
            if fresh.immutable and read.settled and fresh.signature == read.signature:
                fresh.con.close()  # an empty -wal without a -shm: the cached pages are good
            else:
                read.con.close()
                self._read, self._con = fresh, fresh.con
        return self._read

    def fetch(self, sql: str, params: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            con = self._batch
            if con is None:
                return self.snapshot(lambda: self.fetch(sql, params))
            try:
                return _fetch_all(con, sql, params)
            except sqlite3.DatabaseError:
                if self._read is not None and self._read.changed():
                    raise _BatchChanged from None  # pages of two versions can look corrupt
                raise

    def snapshot(self, read: Callable[[], _T]) -> _T:
        """Run ``read()``, whose :meth:`fetch` calls form one batch, on one version of the file.

        Raises
        ------
        FileChangedError
            An ``immutable`` file changed during each of ``SQLITE_READ_TRIES`` runs.
        """
        with self._lock:
            if self._batch is not None:  # already inside a batch of this thread
                return read()
            if self._read is None:
                return self._run(self._con, read, transaction=False)
            for _ in range(SQLITE_READ_TRIES):
                conn = self._connection()
                assert conn is not None
                conn.used = True
                if not conn.immutable:
                    return self._run(conn.con, read, transaction=True)
                try:
                    result = self._run(conn.con, read, transaction=False)
                except _BatchChanged:
                    continue
                if not conn.changed():
                    return result
            raise _changed_error(self._path or "", f"during each of {SQLITE_READ_TRIES} reads")

    def _run(self, con: sqlite3.Connection, read: Callable[[], _T], transaction: bool) -> _T:
        """``read()`` with its statements on ``con``, in one read transaction if asked."""
        self._batch = con
        try:
            if transaction:
                con.execute("BEGIN")  # deferred: the first statement takes the snapshot
            try:
                return read()
            finally:
                if transaction:
                    con.rollback()  # reads only; a no-op if SQLite already ended it
        finally:
            self._batch = None

    def stream(self, sql: str, params: Any, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        if self._path is None:
            return self._stream_shared(sql, params, chunk)
        return self._stream_file(self._path, sql, params, chunk)

    def _stream_shared(self, sql: str, params: Any, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        """Stream through the caller's connection, one fetch at a time under the lock."""
        with self._lock:
            cursor = _execute(self._con, sql, params)
        while True:
            with self._lock:
                rows = cursor.fetchmany(chunk)
            if not rows:
                return
            yield rows

    def _stream_file(
        self, path: str, sql: str, params: Any, chunk: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        """Stream through a connection of its own, checked around each block when immutable."""
        for attempt in range(1, SQLITE_READ_TRIES + 1):
            read = _open_read(path)
            yielded = False
            try:
                try:
                    cursor = _execute(read.con, sql, params)
                    while True:
                        if read.changed():
                            break
                        rows = cursor.fetchmany(chunk)
                        if read.changed():
                            break
                        if not rows:
                            return
                        yielded = True
                        yield rows
                except sqlite3.DatabaseError:
                    if not read.changed():
                        raise
                if yielded or attempt == SQLITE_READ_TRIES:
                    raise _changed_error(path, "while its rows were streamed")
            finally:
                read.con.close()

    def quote(self, identifier: str) -> str:
        return _standard_quote(identifier)

    def close(self) -> None:
        if self._own:
            with self._lock:
                self._con.close()
