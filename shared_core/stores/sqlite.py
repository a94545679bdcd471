"""SQLite store: one memory in one embedded database file, owned by one process.

Every ``add`` / ``delete`` / ``clear`` is written in ONE transaction before it is acknowledged (before
``add`` returns). After a crash (even ``SIGKILL`` in the middle of a write), reopening the store gives
exactly the acknowledged messages: SQLite's write-ahead log makes every commit all-or-nothing.

Database layout (``PRAGMA journal_mode=WAL``, ``locking_mode=EXCLUSIVE``, ``synchronous=FULL`` by
default); the rows are those of :mod:`shared_core.stores.encoding`::

    meta(key TEXT PRIMARY KEY, value TEXT)      JSON values: format, memory_format, kind, config, dim,
                                                state, usage, root, next_id, n_inserted, seq (the
                                                change sequence: one more per committed write)
    nodes(id INTEGER PRIMARY KEY, parent, children (JSON list, ordered), text (UTF-8 BLOB),
          span_first, span_last, is_leaf, level, data (JSON), message (JSON or NULL))
    vectors(id INTEGER PRIMARY KEY, vec BLOB)   L2-normalised little-endian float32, dim * 4 bytes

One process (one memory) writes a store at a time: the connection holds SQLite's exclusive lock until
the store is closed, so a second opener gets :class:`PersistenceError` instead of silently diverging.
``synchronous="NORMAL"`` keeps every acknowledged change across a process crash but may lose the last
ones on power loss; ``"FULL"`` (default) survives both at one ``fsync`` per change.

A store is data, never code: values are JSON and float32 blobs (nothing is unpickled), the schema is
checked on open (a trigger, view or unknown table is refused), and ``trusted_schema`` is off.

Forgetting: ``secure_delete`` is on (removed rows are overwritten with zeros) and a transaction that
removed nodes (a ``delete``, a ``clear``) is followed by a ``wal_checkpoint(TRUNCATE)``, so a deleted
message's text does not stay in the database file or its write-ahead log.

References:
    SQLite documentation: "Write-Ahead Logging", "PRAGMA locking_mode", "PRAGMA synchronous",
    "Atomic Commit In SQLite".
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..types import InvalidInputError, PersistenceError
from .base import Store
from .encoding import (
    NODE_COLUMNS,
    cleared_meta,
    decode_meta,
    dumps,
    full_rows,
    pending_changes,
    restore_rows,
)

if TYPE_CHECKING:
    from ..memories.base import HierarchicalMemory

__all__ = ["FORMAT", "SYNCHRONOUS", "DurableStore", "SQLiteStore"]

#: Version of the database layout.
FORMAT = 1
#: Accepted values of ``synchronous``.
SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")

_TABLES = {
    "meta": ("key", "value"),
    "nodes": NODE_COLUMNS,
    "vectors": ("id", "vec"),
}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (id INTEGER PRIMARY KEY, parent INTEGER, children TEXT NOT NULL, "
    "text BLOB NOT NULL, span_first INTEGER NOT NULL, span_last INTEGER NOT NULL, is_leaf INTEGER NOT NULL, "
    "level INTEGER NOT NULL, data TEXT NOT NULL, message TEXT)",
    "CREATE TABLE IF NOT EXISTS vectors (id INTEGER PRIMARY KEY, vec BLOB NOT NULL)",
)
_INSERT_NODE = f"INSERT OR REPLACE INTO nodes ({', '.join(NODE_COLUMNS)}) VALUES ({', '.join('?' * 10)})"


class SQLiteStore(Store):
    """One SQLite database holding one memory (see the module docstring for the layout).

    Args:
        path: the database file (created with its parent directories when absent).
        synchronous: ``"FULL"`` (default; an acknowledged change survives power loss), ``"EXTRA"`` or
            ``"NORMAL"`` (survives a process crash; the last changes may be lost on power loss).
        timeout: seconds to wait for another connection's lock before giving up, default 2.0.

    Raises:
        InvalidInputError: an unknown ``synchronous`` value.
        PersistenceError: the path is a directory, not an SQLite database, not a hiermem store, or in
            use by another process.

    References:
        SQLite "Write-Ahead Logging" and "Atomic Commit In SQLite".
    """

    FORMAT = FORMAT

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", timeout: float = 2.0) -> None:
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS:
            raise InvalidInputError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}.")
        path = Path(path)
        if path.is_dir():
            raise PersistenceError(
                f"{path} is a directory; give the path of a database file, e.g. mem.sqlite."
            )
        self.path = path
        self.location = str(path)
        self.synchronous = synchronous.upper()
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                str(path), timeout=float(timeout), isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            raise PersistenceError(f"Cannot open the store {path}: {e}") from None
        try:
            self._setup()
            self._seq = self._stored_seq()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ connection
    @property
    def conn(self) -> sqlite3.Connection:
        """The open SQLite connection (raises :class:`PersistenceError` once closed)."""
        if self._conn is None:
            raise PersistenceError(f"The store {self.path} is closed; reopen it.")
        return self._conn

    def _setup(self) -> None:
        c = self.conn
        try:
            c.execute("PRAGMA trusted_schema=OFF")
            c.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PersistenceError(
                    f"Cannot use write-ahead logging on {self.path} (journal mode {mode})."
                )
            c.execute(f"PRAGMA synchronous={self.synchronous}")
            c.execute("PRAGMA secure_delete=ON")  # deleted rows are overwritten, not left in free space
            self._check_schema()
            with self._tx():  # the first write takes the exclusive lock, held until close()
                for stmt in _SCHEMA:
                    c.execute(stmt)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise PersistenceError(
                    f"The store {self.path} is in use by another memory or process (one writer per store); "
                    "close it there first (close_store())."
                ) from None
            raise PersistenceError(f"Cannot open the store {self.path}: {e}") from None
        except sqlite3.DatabaseError as e:
            raise PersistenceError(
                f"{self.path} is not a hiermem store (SQLite says: {e}); give a new path or a store made by "
                "attach_store() / open()."
            ) from None

    def _check_schema(self) -> None:
        rows = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        for kind, name in rows:
            if kind == "table" and name in _TABLES:
                continue
            if kind == "index" and str(name).startswith("sqlite_autoindex_"):
                continue
            raise PersistenceError(
                f"{self.path} holds an unexpected {kind} {name!r}; it is not a hiermem store "
                "(refusing to use a database with triggers, views or other tables)."
            )
        for table, cols in _TABLES.items():
            if any(name == table for _, name in rows):
                have = tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})").fetchall())
                if have != cols:
                    raise PersistenceError(
                        f"Table {table!r} of {self.path} has columns {have}, expected {cols}; "
                        "the store is corrupt or not a hiermem store."
                    )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            with suppress(sqlite3.Error):
                c.execute("ROLLBACK")
            raise
        try:
            c.execute("COMMIT")
        except BaseException:
            with suppress(sqlite3.Error):
                if c.in_transaction:  # a failed COMMIT can leave the transaction open
                    c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the connection (releases the lock; idempotent)."""
        with self._lock:
            c, self._conn = self._conn, None
        if c is not None:
            with suppress(sqlite3.Error):
                c.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r}, synchronous={self.synchronous!r})"

    # ------------------------------------------------------------------ change sequence
    def _stored_seq(self) -> int:
        """The committed change sequence number (``meta.seq``; 0 for a new store or one without it)."""
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        if row is None:
            return 0
        try:
            seq = json.loads(row[0])
        except (TypeError, ValueError):
            seq = None
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise PersistenceError(f"The change sequence of {self.path} is malformed; the store is corrupt.")
        return seq

    @property
    def seq(self) -> int:
        """Number of the last committed write (every ``add``, ``delete``, ``clear`` and initial write)."""
        return self._seq

    def landed(self, seq: int) -> bool:
        """After a write raised: whether the write numbered ``seq`` was committed all the same.

        An exception can arrive after SQLite's ``COMMIT`` returned (``KeyboardInterrupt`` between two
        bytecodes); the stored change sequence tells. A transaction still open is rolled back here. Any
        failure to read counts as not landed.

        Args:
            seq: the number the write was to get (:attr:`seq` + 1 before it started).

        Returns:
            ``True`` when the database holds that write.
        """
        try:
            c = self.conn
            if c.in_transaction:
                c.execute("ROLLBACK")
                return False
            done = self._stored_seq() == seq
        except Exception:
            return False
        if done:
            self._seq = seq
        return done

    # ------------------------------------------------------------------ reading
    def meta(self) -> dict[str, Any] | None:
        """The stored metadata (decoded JSON), or ``None`` for a new, empty store.

        Raises:
            PersistenceError: malformed metadata.
            VersionMismatchError: written by another layout version.
        """
        try:
            rows = self.conn.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        return decode_meta(rows, str(self.path), FORMAT)

    def load_into(self, mem: HierarchicalMemory, meta: dict[str, Any] | None = None) -> None:
        """Rebuild ``mem``'s node store, state and FAISS index from the database.

        Args:
            mem: an empty memory of the stored kind.
            meta: the metadata :meth:`meta` returned (read again when omitted).

        Raises:
            PersistenceError: the stored tree or vectors are malformed or inconsistent.
        """
        meta = meta if meta is not None else self.meta()
        if meta is None:
            raise PersistenceError(f"The store {self.path} holds no memory yet.")
        try:
            rows = self.conn.execute(f"SELECT {', '.join(NODE_COLUMNS)} FROM nodes ORDER BY id").fetchall()
            vrows = self.conn.execute("SELECT id, vec FROM vectors").fetchall()
        except sqlite3.Error as e:
            raise PersistenceError(f"Cannot read {self.path}: {e}") from None
        restore_rows(mem, meta, rows, vrows, str(self.path))

    # ------------------------------------------------------------------ writing
    def _write_meta(self, c: sqlite3.Connection, items: dict[str, Any]) -> None:
        c.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(k, dumps(v)) for k, v in items.items()],
        )

    def initialize(self, mem: HierarchicalMemory) -> bool:
        """Write the whole of ``mem`` (config, state, every node and vector) in one transaction.

        Returns:
            ``True`` (one process owns the store, so no other writer can have initialised it).

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        with self._guard("write the memory to"):
            rows, vrows, meta = full_rows(mem, FORMAT)
            seq = self._seq + 1
            with self._tx() as c:
                c.execute("DELETE FROM nodes")
                c.execute("DELETE FROM vectors")
                c.execute("DELETE FROM meta")
                c.executemany(_INSERT_NODE, rows)
                c.executemany("INSERT INTO vectors (id, vec) VALUES (?, ?)", vrows)
                self._write_meta(c, {**meta, "seq": seq})
            self._seq = seq
        return True

    def commit(self, mem: HierarchicalMemory) -> None:
        """Write the open transaction of ``mem`` (called by ``HierarchicalMemory._commit`` before the
        in-memory commit): nodes touched, created or removed, vectors of nodes whose text changed,
        state, usage and counters, in one SQLite transaction.

        Raises:
            PersistenceError: the write failed; nothing is written and the caller rolls back.
        """
        with self._guard("commit the change to"):
            ch = pending_changes(mem)
            meta = {**ch.meta, "seq": self._seq + 1}
            with self._tx() as c:
                c.executemany("DELETE FROM nodes WHERE id = ?", [(i,) for i in ch.gone])
                c.executemany(_INSERT_NODE, ch.rows)
                c.executemany("DELETE FROM vectors WHERE id = ?", [(i,) for i in ch.drop_vectors])
                c.executemany("INSERT OR REPLACE INTO vectors (id, vec) VALUES (?, ?)", ch.vectors)
                self._write_meta(c, meta)
            self._seq = meta["seq"]
        if ch.gone:
            self._forget_old_pages()

    def clear(self, mem: HierarchicalMemory) -> None:
        """Forget every node and vector (``HierarchicalMemory.clear``); config and usage stay.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        with self._guard("clear"):
            meta = {**cleared_meta(mem), "seq": self._seq + 1}
            with self._tx() as c:
                c.execute("DELETE FROM nodes")
                c.execute("DELETE FROM vectors")
                self._write_meta(c, meta)
            self._seq = meta["seq"]
        self._forget_old_pages()

    def _forget_old_pages(self) -> None:
        """After nodes were removed: move the log into the database and truncate it, so the old page
        images of forgotten texts do not linger in the ``-wal`` file. The commit is already durable; a
        failure here is not an error (the next checkpoint retries)."""
        with suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except PersistenceError:
            raise
        except sqlite3.Error as e:
            raise PersistenceError(
                f"Could not {what} the store {self.path}: {e}. The memory is unchanged; free disk space or "
                "check the file, then retry."
            ) from None
        except (TypeError, ValueError) as e:
            raise PersistenceError(
                f"Could not {what} the store {self.path}: the memory holds data that is not "
                f"JSON-serialisable ({e}). The memory is unchanged."
            ) from None


#: The name this store had before PostgreSQL joined it (``shared_core.durable.DurableStore``).
DurableStore = SQLiteStore
