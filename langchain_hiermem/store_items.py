"""The item tables of a :class:`~langchain_hiermem.store_durable.DurableHierMemStore`.

The items of a durable LangGraph store (namespace, key, value as JSON, timestamps, the order of insertion
and the memory leaves that index each item) are kept in three tables, created by ``setup`` (also on first
open) and versioned by their ``meta`` row ``format``; in the SQLite file itself, or in the PostgreSQL
schema ``hiermem_langgraph``::

    meta(key PRIMARY KEY, value)             JSON values: kind, format, seq (one more per write)
    spaces(ns PRIMARY KEY, pos)              namespaces (ASCII JSON of the tuple), in order of creation
    items(ns, key, value, created_at, updated_at, pos, leaves, ttl_minutes, expires_at)
                                             PRIMARY KEY (ns, key); leaves is a JSON list of [leaf id,
                                             text] of the item's memory leaves; ttl_minutes and
                                             expires_at (ISO-8601 UTC) are NULL for an item without TTL
    changes(ns PRIMARY KEY, txid xid8)       PostgreSQL only: the transaction that last wrote each
                                             namespace (indexed by txid)

Formats 1 (without the two TTL columns) and 2 (without ``changes``) are migrated to format 3 by
``setup`` (on open): the columns are added, NULL for every item, and ``changes`` is created empty.
PostgreSQL's migration waits for a writer of an older version and then advances ``seq``, so such a
process reloads, finds a table it does not know and stops writing (PersistenceError): upgrade every
process.

:class:`_SQLiteItems` holds one connection, owned by one process (an exclusive lock on the file); a
second opener gets :class:`~shared_core.types.PersistenceError` naming PostgreSQL for several.
:class:`_PostgresItems` holds one connection per process and lets many processes use the store: a
writer takes the write lock of each namespace it writes (a session advisory lock keyed by the
namespace, :meth:`_PostgresItems.lock_namespaces`) for the whole of its write, so writers of different
namespaces never wait for each other; its transaction records itself in ``changes`` for every namespace
it writes, and it is refused unless this process still holds those locks on the connection it writes
with. Before each operation a process reads the ``changes`` rows of the transactions its last snapshot
did not see, and then the items of those namespaces only (:meth:`_PostgresItems.changes`, from one
REPEATABLE READ snapshot). SQLite's single owner writes ONE transaction that also advances ``seq``,
only when ``seq`` is still the one it last read. A file or schema that is not a hiermem LangGraph
store is refused before anything is written into it. When the connection breaks during a PostgreSQL
``COMMIT``, the server is asked on a fresh connection (``txid_status``) whether it landed: committed is
a successful write, aborted a failed one that changed nothing, and when the server cannot tell,
:class:`~shared_core.types.CommitUnknownError`.

References:
    LangGraph ``PostgresStore.from_conn_string`` / ``SqliteStore.from_conn_string``;
    :mod:`shared_core.stores`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared_core.stores import is_postgres_url
from shared_core.types import CommitUnknownError, InvalidInputError, PersistenceError, VersionMismatchError

if TYPE_CHECKING:
    import psycopg

__all__ = ["FORMAT", "KIND", "LOCK_CLASS", "SCHEMA", "Statement"]

#: Version of the item tables (the ``format`` row of ``meta``); formats 1 and 2 are migrated on open.
FORMAT = 3
_OLD_FORMAT = 1  # without the TTL columns
_OLDER = (1, 2)  # migrated by setup(); format 2 has no PostgreSQL table ``changes``
#: The ``kind`` row of ``meta``: what tells a hiermem LangGraph store from other databases.
KIND = "hiermem-langgraph-store"
#: The PostgreSQL schema of the item tables.
SCHEMA = "hiermem_langgraph"
#: First key of this module's PostgreSQL advisory locks ("hlgs"); second key 0 guards the schema setup,
#: 2 was the store-wide write lock of format 2 (taken once more by the migration to format 3, so it waits
#: for a writer of an older version), 1 the single owner's lock before several processes.
LOCK_CLASS = 0x686C6773
_SETUP_LOCK, _WRITE_LOCK = 0, 2
#: First key of the namespace write locks ("hlgn"); the second is ``hashtext`` of the namespace's key.
NS_LOCK_CLASS = 0x686C676E
#: Seconds a write waits for another process's write of the store, unless the URL gives lock_timeout=.
WRITE_WAIT = 60.0

_TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "spaces": ("ns", "pos"),
    "items": ("ns", "key", "value", "created_at", "updated_at", "pos", "leaves", "ttl_minutes", "expires_at"),
}
_OLD_ITEMS = _TABLES["items"][:-2]  # format 1
_MIGRATE = (
    "ALTER TABLE {t}items ADD COLUMN ttl_minutes double precision",
    "ALTER TABLE {t}items ADD COLUMN expires_at text",
)
_DDL = (
    "CREATE TABLE {t}meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE {t}spaces (ns text PRIMARY KEY, pos bigint NOT NULL)",
    "CREATE TABLE {t}items (ns text NOT NULL, key text NOT NULL, value text NOT NULL, "
    "created_at text NOT NULL, updated_at text NOT NULL, pos bigint NOT NULL, leaves text NOT NULL, "
    "ttl_minutes double precision, expires_at text, PRIMARY KEY (ns, key))",
)
_UPSERT_ITEM = (
    "INSERT INTO {t}items (ns, key, value, created_at, updated_at, pos, leaves, ttl_minutes, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, created_at = excluded.created_at, "
    "updated_at = excluded.updated_at, pos = excluded.pos, leaves = excluded.leaves, "
    "ttl_minutes = excluded.ttl_minutes, expires_at = excluded.expires_at"
)
_SET_EXPIRY = "UPDATE {t}items SET expires_at = ? WHERE ns = ? AND key = ? AND ttl_minutes IS NOT NULL"
_ITEM_COLUMNS = "ns, key, value, created_at, updated_at, pos, leaves, ttl_minutes, expires_at"
_DELETE_ITEM = "DELETE FROM {t}items WHERE ns = ? AND key = ?"
_SET_LEAVES = "UPDATE {t}items SET leaves = ? WHERE ns = ? AND key = ?"
_ADD_SPACE = "INSERT INTO {t}spaces (ns, pos) VALUES (?, ?) ON CONFLICT (ns) DO NOTHING"
#: Where each statement holds the namespace it writes (so a write can mark its namespaces changed).
_NS_AT = {_UPSERT_ITEM: 0, _DELETE_ITEM: 0, _ADD_SPACE: 0, _SET_LEAVES: 1, _SET_EXPIRY: 1}
# PostgreSQL only: the transaction (xid8) that last wrote each namespace, read by the other processes'
# catch-up (the namespaces changed since their last snapshot).
_CHANGES_DDL = (
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.changes (ns text PRIMARY KEY, txid xid8 NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS changes_txid ON {SCHEMA}.changes (txid)",
)
_MARK = (
    f"INSERT INTO {SCHEMA}.changes (ns, txid) SELECT unnest(%s::text[]), pg_current_xact_id() "
    "ON CONFLICT (ns) DO UPDATE SET txid = excluded.txid"
)
# One statement, so one snapshot, in no transaction block: that snapshot, the namespaces written by the
# transactions the previous snapshot did not see, and their spaces and items rows (as JSON arrays).
_CATCH_UP = (
    f"WITH ch AS (SELECT ns FROM {SCHEMA}.changes WHERE txid >= pg_snapshot_xmin(%s::pg_snapshot) "
    "AND NOT pg_visible_in_snapshot(txid, %s::pg_snapshot)) "
    "SELECT pg_current_snapshot()::text, ARRAY(SELECT ns FROM ch), "
    f"(SELECT json_agg(json_build_array(s.ns, s.pos) ORDER BY s.pos, s.ns) FROM {SCHEMA}.spaces s "
    "WHERE s.ns IN (SELECT ns FROM ch)), "
    "(SELECT json_agg(json_build_array(i.ns, i.key, i.value, i.created_at, i.updated_at, i.pos, i.leaves, "
    f"i.ttl_minutes, i.expires_at) ORDER BY i.pos) FROM {SCHEMA}.items i WHERE i.ns IN (SELECT ns FROM ch))"
)

Statement = tuple[str, tuple[Any, ...]]


def _dumps(value: Any) -> str:
    """Strict, ASCII JSON (NaN and infinity refused with ``ValueError``, lone surrogates escaped)."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _not_ours(location: str, why: str) -> PersistenceError:
    if location.startswith("the schema"):
        advice = "use another database, or drop that schema if it is a leftover"
    else:
        advice = "give the path of a new file, or of one that HierMemStore.from_conn_string created"
    return PersistenceError(f"{location} is not a hiermem LangGraph store ({why}); {advice}.")


def _check_meta(rows: Iterable[tuple[Any, Any]], location: str) -> tuple[int, int]:
    """The change sequence and the format (this one, or format 1 to migrate) of a store's ``meta`` rows.

    Raises:
        PersistenceError: the rows are not those of a hiermem LangGraph store.
        VersionMismatchError: another ``format``.
    """
    try:
        meta = {str(k): json.loads(v) for k, v in rows}
    except (TypeError, ValueError) as e:
        raise _not_ours(location, f"unreadable meta table: {e}") from None
    if meta.get("kind") != KIND:
        raise _not_ours(location, f"its meta table names the kind {meta.get('kind')!r}")
    fmt = meta.get("format")
    if fmt not in (FORMAT, *_OLDER) or isinstance(fmt, bool):
        raise VersionMismatchError(
            f"The items in {location} have format {meta.get('format')!r}; this hiermem reads format "
            f"{FORMAT}. Use the hiermem version that created them, or another store."
        )
    seq = meta.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise PersistenceError(f"The change sequence of {location} is malformed; the store is corrupt.")
    return seq, fmt


def _check_columns(have: dict[str, tuple[str, ...]], fmt: int, where: str) -> None:
    """The tables' columns are those of format ``fmt``.

    Raises:
        PersistenceError: they are not (the tables are not a hiermem LangGraph store's).
    """
    for table, want in _TABLES.items():
        if table == "items" and fmt == _OLD_FORMAT:
            want = _OLD_ITEMS
        if have.get(table, ()) != want:
            raise _not_ours(where, f"table {table!r} has columns {have.get(table, ())}, expected {want}")


class _ItemsDB:
    """The item tables of one store: one connection, owned by one process (see the module docstring)."""

    location: str
    prefix: str  # the tables' schema prefix in SQL ("" or "hiermem_langgraph.")
    format: int = FORMAT  # the format of the tables found (format 1 until setup() migrated them)

    def sql(self, text: str) -> str:
        """A statement of this module in the backend's dialect."""
        return text.format(t=self.prefix)

    def setup(self) -> None:
        """Create the tables when absent, else check them (idempotent)."""
        raise NotImplementedError

    def load(self) -> tuple[int, list[Any], list[Any]]:
        """``(seq, spaces rows, item rows)``, both in ``pos`` order, from one snapshot."""
        raise NotImplementedError

    def write(self, seq: int, statements: list[Statement]) -> int:
        """Run ``statements`` in one transaction when the stored sequence is ``seq``; returns ``seq + 1``.

        Raises:
            PersistenceError: the write failed (nothing is written) or another process wrote the store.
        """
        raise NotImplementedError

    def stored_seq(self) -> int:
        """The stored change sequence (what this process compares with its own to see others' writes).

        Raises:
            PersistenceError: the database cannot be read.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection, releasing the store (idempotent)."""
        raise NotImplementedError

    def _changed(self, seq: int, stored: Any) -> PersistenceError:
        """The error of a write that found the store changed behind this process's back."""
        return PersistenceError(
            f"The LangGraph store {self.location} was changed by another process (change {stored}, this "
            f"process knows {seq}); nothing was written. Close this store and open it again."
        )


class _SQLiteItems(_ItemsDB):
    """The item tables in an SQLite file, exclusively locked while open."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.path = path
        self.location = str(path)
        self.prefix = ""
        self._conn: sqlite3.Connection | None = None
        if path.is_dir():
            raise PersistenceError(f"{path} is a directory; give the path of a file, e.g. agent.sqlite.")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(path), timeout=2.0, isolation_level=None, check_same_thread=False
            )
            c = self._conn
            c.execute("PRAGMA trusted_schema=OFF")
            self._check(missing_ok=True)  # read only: nothing is written into a database that is not ours
            c.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PersistenceError(f"Cannot use write-ahead logging on {path} (journal mode {mode}).")
            c.execute(f"PRAGMA synchronous={synchronous}")
            c.execute("PRAGMA secure_delete=ON")
            self.setup()  # its write takes the exclusive lock, held until close()
        except BaseException as e:
            self.close()
            if isinstance(e, sqlite3.Error):
                raise self._error(e, "open") from None
            if isinstance(e, OSError) and not isinstance(e, PersistenceError):
                raise PersistenceError(f"Cannot open the LangGraph store {path}: {e}") from None
            raise

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise PersistenceError(f"The LangGraph store {self.path} is closed; open it again.")
        return self._conn

    def _error(self, e: sqlite3.Error, what: str) -> PersistenceError:
        text = str(e)
        if "locked" in text or "busy" in text:
            return PersistenceError(
                f"The LangGraph store {self.path} is in use by another process: an SQLite store serves one "
                "process at a time. Close it there first, or keep the store in PostgreSQL "
                "(HierMemStore.from_conn_string('postgresql://...')), which many processes share."
            )
        if isinstance(e, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
            return _not_ours(self.location, f"SQLite says: {text}")
        return PersistenceError(
            f"Could not {what} the LangGraph store {self.path}: {text}. Nothing was changed; free disk "
            "space or check the file, then retry."
        )

    def _check(self, missing_ok: bool) -> bool:
        rows = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        tables = set()
        for kind, name in rows:
            if kind == "table" and name in _TABLES:
                tables.add(name)
            elif not (kind == "index" and str(name).startswith("sqlite_autoindex_")):
                raise _not_ours(self.location, f"it holds a {kind} {name!r}")
        if not tables and missing_ok:
            return False
        have = {
            table: tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})").fetchall())
            for table in _TABLES
        }
        if "meta" not in tables or have["meta"] != _TABLES["meta"]:
            raise _not_ours(self.location, f"table 'meta' has columns {have['meta']}")
        _, self.format = _check_meta(
            self.conn.execute("SELECT key, value FROM meta").fetchall(), self.location
        )
        _check_columns(have, self.format, self.location)
        return True

    def setup(self) -> None:
        """Create the tables when absent, else check them (idempotent).

        Raises:
            PersistenceError: the file is not a hiermem LangGraph store or cannot be written.
            VersionMismatchError: another item format.
        """
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                if not self._check(missing_ok=True):
                    for stmt in _DDL:
                        c.execute(self.sql(stmt))
                    c.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [("kind", _dumps(KIND)), ("format", _dumps(FORMAT)), ("seq", "0")],
                    )
                elif self.format in _OLDER:
                    if self.format == _OLD_FORMAT:
                        for stmt in _MIGRATE:
                            c.execute(self.sql(stmt))
                    c.execute("UPDATE meta SET value = ? WHERE key = 'format'", (_dumps(FORMAT),))
                self.format = FORMAT
                c.execute("COMMIT")
            except BaseException:
                with suppress(sqlite3.Error):
                    c.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise self._error(e, "set up") from None

    def load(self) -> tuple[int, list[Any], list[Any]]:
        """``(seq, spaces rows, item rows)`` in ``pos`` order.

        Raises:
            PersistenceError: the file cannot be read or is not a hiermem LangGraph store.
        """
        try:
            self._check(missing_ok=False)
            seq, fmt = _check_meta(self.conn.execute("SELECT key, value FROM meta").fetchall(), self.location)
            if fmt != FORMAT:
                raise PersistenceError(f"{self.location} holds format {fmt}; call setup() to migrate it.")
            spaces = self.conn.execute("SELECT ns, pos FROM spaces ORDER BY pos").fetchall()
            items = self.conn.execute(f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY pos").fetchall()
        except sqlite3.Error as e:
            raise self._error(e, "read") from None
        return seq, spaces, items

    def write(self, seq: int, statements: list[Statement]) -> int:
        """Run ``statements`` in one transaction (see :meth:`_ItemsDB.write`)."""
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
                stored = json.loads(row[0]) if row is not None else None
                if stored != seq:
                    raise self._changed(seq, stored)
                for sql, params in statements:
                    c.execute(self.sql(sql), params)
                c.execute("UPDATE meta SET value = ? WHERE key = 'seq'", (str(seq + 1),))
                c.execute("COMMIT")
            except BaseException:
                with suppress(sqlite3.Error):
                    if c.in_transaction:
                        c.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise self._error(e, "write the items to") from None
        if any(sql.startswith("DELETE") for sql, _ in statements):
            # a deleted item's value must not linger in the write-ahead log (as the memories' stores do)
            with suppress(sqlite3.Error):
                c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return seq + 1

    def stored_seq(self) -> int:
        """The stored change sequence (see :meth:`_ItemsDB.stored_seq`)."""
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
        except sqlite3.Error as e:
            raise self._error(e, "read") from None
        return int(json.loads(row[0])) if row is not None else -1

    def close(self) -> None:
        """Close the connection (releases the lock; idempotent)."""
        c, self._conn = self._conn, None
        if c is not None:
            with suppress(sqlite3.Error):
                c.close()


class _PostgresItems(_ItemsDB):
    """The item tables in the schema ``hiermem_langgraph`` of a PostgreSQL database.

    Many processes may open it. A writer holds the write lock of each namespace it writes (a session
    advisory lock ``(NS_LOCK_CLASS, hashtext(namespace key))``, released when it unlocks, its connection
    closes or its process dies) from before it catches up with the stored items until its last
    statement; two namespaces whose keys hash alike share a lock (they take turns, nothing else). After
    a lost connection the next call connects again.
    """

    def __init__(self, url: str) -> None:
        from shared_core.stores.pg_connection import parse_url, split_url  # InvalidInputError without psycopg

        params, self.location = parse_url(url)
        self.prefix = f"{SCHEMA}."
        self._url, own = split_url(url)  # without hiermem's own parameters (lock_timeout=)
        self.write_wait = float(own["lock_timeout"]) if "lock_timeout" in own else WRITE_WAIT
        self._held: set[str] = set()  # namespace keys whose write lock this process holds
        self._lock_conn: psycopg.Connection[Any] | None = None  # the session holding them
        self.snapshot = ""  # the snapshot of the last load or catch-up (pg_current_snapshot as text)
        self._timeout = float(params.get("connect_timeout") or 10)
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = 10
        if "application_name" not in params:
            self._kwargs["application_name"] = "hiermem-langgraph"
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._conn = self._connect()
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                self._check(cur, missing_ok=True)  # read only: nothing is written into a foreign schema
        except BaseException as e:
            self.close()
            if isinstance(e, PersistenceError):
                raise
            if isinstance(e, Exception):
                raise self._error(e, "open") from None
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        from shared_core.stores.pg_connection import first_line

        try:
            conn = psycopg.connect(self._url, **self._kwargs)
            # every lock this session waits for, reads included, for at most write_wait seconds
            ms = max(1, round(self.write_wait * 1000))
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{ms}ms",))
            return conn
        except psycopg.Error as e:
            raise PersistenceError(
                f"Cannot connect to PostgreSQL at {self.location}: {first_line(e)}. Check that the server "
                "is running and reachable and that the URL's host, port, database name, user and password "
                "are right (create the database first, e.g. createdb)."
            ) from None

    def lock_namespaces(self, keys: Iterable[str]) -> list[str]:
        """Take the write locks of the namespaces ``keys`` (their :func:`namespace_key` texts) that this
        process does not hold yet, in sorted order; each waits at most :attr:`write_wait` seconds.

        Returns:
            The keys locked by this call (give them to :meth:`unlock_namespaces`).

        Raises:
            NamespaceBusyError: another process kept one of them longer, or waiting would deadlock
                (nothing was done and no lock is kept; retry later).
            PersistenceError: the server cannot be reached, or the connection holding this process's
                other locks was lost.
        """
        import psycopg

        from shared_core.types import NamespaceBusyError

        new = sorted(set(keys) - self._held)
        if not new:
            return []
        conn = self.conn
        if self._held and conn is not self._lock_conn:
            raise PersistenceError(
                f"The connection holding this process's namespace locks of the LangGraph store in "
                f"{self.location} was lost; nothing was written. Retry the operation."
            )
        ms = max(1, round(self.write_wait * 1000))
        taken: list[str] = []
        try:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{ms}ms",))
            for key in new:
                conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (NS_LOCK_CLASS, key))
                taken.append(key)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            self._release(conn, taken)
            raise NamespaceBusyError(
                f"A namespace of the LangGraph store in {self.location} is being written by another "
                f"process for longer than {self.write_wait:g} s; nothing was changed. Try again, or raise "
                "the wait (lock_timeout= in the URL)."
            ) from None
        except Exception as e:
            self._release(conn, taken)
            raise self._error(e, "lock") from None
        self._lock_conn = conn
        self._held.update(new)
        return new

    def unlock_namespaces(self, keys: Iterable[str]) -> None:
        """Release locks taken by :meth:`lock_namespaces` (a lost connection released them already)."""
        keys = [k for k in keys if k in self._held]
        self._held.difference_update(keys)
        conn = self._lock_conn
        if not self._held:
            self._lock_conn = None
        if conn is not None and conn is self._conn:
            self._release(conn, keys)

    def holds(self, key: str) -> bool:
        """Whether this process holds the write lock of the namespace ``key``."""
        return key in self._held and self._lock_conn is not None and self._lock_conn is self._conn

    def _release(self, conn: psycopg.Connection[Any], keys: list[str]) -> None:
        if conn.closed or conn.broken:
            return
        try:
            for key in keys:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (NS_LOCK_CLASS, key))
        except Exception:
            self._drop()  # closing the session releases the locks

    def stored_seq(self) -> int:
        """The stored change sequence (see :meth:`_ItemsDB.stored_seq`)."""
        try:
            row = self.conn.execute(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'seq'").fetchone()
        except Exception as e:
            raise self._error(e, "read") from None
        return int(json.loads(row[0])) if row is not None else -1

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection; connected again after it was lost (a write lock it held is then released)."""
        if self._closed:
            raise PersistenceError(f"The LangGraph store in {self.location} is closed; open it again.")
        c = self._conn
        if c is None or c.closed or c.broken:
            self._drop()
            self._conn = c = self._connect()
        return c

    def _drop(self) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            with suppress(Exception):
                c.close()

    def _error(self, e: BaseException, what: str) -> PersistenceError:
        import psycopg

        from shared_core.stores.pg_connection import first_line
        from shared_core.types import NamespaceBusyError

        if isinstance(e, PersistenceError):
            return e
        if isinstance(e, psycopg.errors.LockNotAvailable):  # a table lock held longer than write_wait
            return NamespaceBusyError(
                f"Could not {what} the LangGraph store in {self.location}: a table of it stayed locked by "
                f"another session (e.g. VACUUM FULL, ALTER TABLE) for longer than {self.write_wait:g} s; "
                "nothing was changed. Try again, or raise the wait (lock_timeout= in the URL)."
            )
        if isinstance(e, psycopg.OperationalError):
            self._drop()
            return PersistenceError(
                f"Could not {what} the LangGraph store in {self.location}: the connection to PostgreSQL "
                f"failed ({first_line(e)}). Nothing was changed; the next call connects again."
            )
        return PersistenceError(
            f"Could not {what} the LangGraph store in {self.location}: PostgreSQL says {first_line(e)}."
        )

    def _check(self, cur: psycopg.Cursor[Any], missing_ok: bool) -> bool:
        cur.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (SCHEMA,),
        )
        rels = {str(name): str(kind) for name, kind in cur.fetchall()}
        where = f"the schema {SCHEMA!r} of {self.location}"
        if not rels:
            if missing_ok:
                return False
            raise PersistenceError(f"{where} holds no LangGraph store; call setup() first.")
        extra = sorted(
            n for n, k in rels.items() if (n not in _TABLES and n != "changes") or k not in ("r", "p")
        )
        if extra:
            raise _not_ours(where, f"unexpected relations {', '.join(extra)}")
        cur.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY table_name, ordinal_position",
            (SCHEMA,),
        )
        cols: dict[str, list[str]] = {}
        for table, col in cur.fetchall():
            cols.setdefault(str(table), []).append(str(col))
        if tuple(cols.get("meta", ())) != _TABLES["meta"]:
            raise _not_ours(where, f"table 'meta' has columns {tuple(cols.get('meta', ()))}")
        cur.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (SCHEMA,),
        )
        triggers = [r[0] for r in cur.fetchall()]
        if triggers:
            raise _not_ours(where, f"it has triggers: {', '.join(triggers)}")
        _, self.format = _check_meta(cur.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall(), where)
        _check_columns({t: tuple(c) for t, c in cols.items()}, self.format, where)
        if ("changes" in cols or self.format == FORMAT) and tuple(cols.get("changes", ())) != ("ns", "txid"):
            raise _not_ours(where, f"table 'changes' has columns {tuple(cols.get('changes', ()))}")
        return True

    def setup(self) -> None:
        """Create the schema ``hiermem_langgraph`` when absent, else check it (idempotent; concurrent
        setups are serialised by an advisory lock).

        Raises:
            PersistenceError: the schema is not a hiermem LangGraph store, the user may not create it, or
                the server cannot be reached.
            VersionMismatchError: another item format.
        """
        conn = self.conn
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, _SETUP_LOCK))
                if self._check(cur, missing_ok=True):
                    if self.format in _OLDER:
                        # after a writer of an older version (store-wide lock); the new seq makes such
                        # processes reload, which fails on the new format: they stop writing
                        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, _WRITE_LOCK))
                        if self.format == _OLD_FORMAT:
                            for stmt in _MIGRATE:
                                cur.execute(self.sql(stmt))
                        for stmt in _CHANGES_DDL:
                            cur.execute(stmt)
                        cur.execute(
                            f"UPDATE {SCHEMA}.meta SET value = %s WHERE key = 'format'", (_dumps(FORMAT),)
                        )
                        cur.execute(
                            f"UPDATE {SCHEMA}.meta SET value = (value::bigint + 1)::text WHERE key = 'seq'"
                        )
                        self.format = FORMAT
                    return
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                for stmt in (*_DDL, *_CHANGES_DDL):
                    cur.execute(self.sql(stmt))
                cur.executemany(
                    f"INSERT INTO {SCHEMA}.meta (key, value) VALUES (%s, %s)",
                    [("kind", _dumps(KIND)), ("format", _dumps(FORMAT)), ("seq", "0")],
                )
        except Exception as e:
            raise self._error(e, "set up") from None

    def load(self) -> tuple[int, list[Any], list[Any]]:
        """``(seq, spaces rows, item rows)`` in ``pos`` order, from one snapshot.

        Raises:
            PersistenceError: the schema cannot be read or is not a hiermem LangGraph store.
        """
        conn = self.conn
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                snapshot = str(cur.execute("SELECT pg_current_snapshot()::text").fetchone()[0])  # type: ignore[index]
                self._check(cur, missing_ok=False)
                seq, fmt = _check_meta(
                    cur.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall(), self.location
                )
                if fmt != FORMAT:
                    raise PersistenceError(f"{self.location} holds format {fmt}; call setup() to migrate it.")
                spaces = cur.execute(f"SELECT ns, pos FROM {SCHEMA}.spaces ORDER BY pos, ns").fetchall()
                items = cur.execute(f"SELECT {_ITEM_COLUMNS} FROM {SCHEMA}.items ORDER BY pos").fetchall()
        except Exception as e:
            raise self._error(e, "read") from None
        self.snapshot = snapshot
        return seq, spaces, items

    def changes(self) -> tuple[list[str], list[Any], list[Any]] | None:
        """What other processes (and this one) committed since the last :meth:`load` or call: ``None``
        when nothing, else ``(changed namespace keys, their spaces rows, their item rows in pos order)``,
        all from one snapshot, which becomes :attr:`snapshot`. Reads only the namespaces written since
        (the ``changes`` rows of transactions the previous snapshot did not see), never the others, in
        one statement outside any transaction block.

        Raises:
            PersistenceError: the database cannot be read (nothing changes; tried again next time).
        """
        try:
            row = self.conn.execute(_CATCH_UP, (self.snapshot, self.snapshot)).fetchone()
        except Exception as e:
            raise self._error(e, "read") from None
        snapshot, keys, spaces, items = row  # type: ignore[misc]
        keys = [str(k) for k in keys or ()]
        spaces, items = list(spaces or ()), list(items or ())
        self.snapshot = snapshot
        return (keys, spaces, items) if keys else None

    def write(self, seq: int, statements: list[Statement]) -> int:
        """Run ``statements`` in one transaction, marking their namespaces changed; returns ``seq + 1``
        (the sequence is not stored: each namespace's writers take turns on its lock instead).

        Every namespace written must be locked by this process (:meth:`lock_namespaces`), on the
        connection the write uses, so no other process wrote them since this one caught up. When the
        ``COMMIT`` fails, the server is asked on a fresh connection whether it landed (``txid_status``):
        if it did, the write succeeded.

        Raises:
            CommitUnknownError: the ``COMMIT`` got no reply and the server cannot tell whether it landed.
            PersistenceError: the write failed and changed nothing, or a namespace's lock is not held
                (never taken, or lost with its connection).
        """
        from shared_core.stores.pg_connection import ask_commit_outcome, first_line

        keys = sorted({str(params[_NS_AT[sql]]) for sql, params in statements})
        conn = self.conn
        if not all(self.holds(k) for k in keys):
            raise PersistenceError(
                f"The write lock of a namespace of the LangGraph store in {self.location} is not held (its "
                "connection was lost); nothing was written. Retry the operation."
            )
        committing = False
        xid = 0
        try:
            with conn.transaction(), conn.cursor() as cur:
                xid = int(cur.execute("SELECT txid_current()").fetchone()[0])  # type: ignore[index]
                for sql, params in statements:
                    cur.execute(self.sql(sql).replace("?", "%s"), params)
                cur.execute(_MARK, (keys,))
                committing = True  # leaving the block sends COMMIT
        except Exception as e:
            err = self._error(e, "write the items to")
            if not committing:
                raise err from None
            outcome = ask_commit_outcome(self._connect, xid, self._timeout)
            if outcome:
                return seq + 1  # the COMMIT landed; only its reply was lost
            if outcome is None:
                raise CommitUnknownError(
                    f"The connection to PostgreSQL was lost during the COMMIT of the items of the "
                    f"LangGraph store in {self.location}, and the server cannot be asked whether it "
                    f"landed ({first_line(e)}): the items may or may not be stored. The store reloads "
                    "its items before its next operation; check them before retrying."
                ) from None
            raise err from None
        return seq + 1

    def close(self) -> None:
        """Close the connection, releasing the store's lock (idempotent)."""
        self._closed = True
        self._drop()


def _target(conn: Any) -> tuple[str, Any]:
    """``("postgres", url)`` or ``("sqlite", path)`` for a connection string.

    Raises:
        InvalidInputError: neither a ``postgresql://`` URL nor a usable file path.
    """
    if isinstance(conn, os.PathLike):
        conn = os.fspath(conn)
    if not isinstance(conn, str):
        raise InvalidInputError(
            f"conn is the path of an SQLite file or a postgresql:// URL, got {type(conn).__name__}."
        )
    if is_postgres_url(conn):
        return "postgres", conn.strip()
    if not conn.strip():
        raise InvalidInputError("conn is empty; give the path of an SQLite file or a postgresql:// URL.")
    if "://" in conn:
        raise InvalidInputError(
            f"Unknown URL scheme {conn.split('://', 1)[0]!r}://; give a postgresql:// URL, or the path of an "
            "SQLite file itself (e.g. 'agent.sqlite', not 'sqlite:///agent.sqlite')."
        )
    if conn.strip() == ":memory:":
        raise InvalidInputError(
            "':memory:' keeps nothing across restarts; use HierMemStore() for a store in RAM, or give a file."
        )
    return "sqlite", Path(conn)
