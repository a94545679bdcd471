"""A :class:`~langchain_hiermem.store.HierMemStore` that survives restarts: items and memories in a database.

Open it with ``HierMemStore.from_conn_string(conn)``: ``conn`` is the path of an SQLite file or a
``postgresql://`` URL. Two things are kept:

- **items** (namespace, key, value as JSON, timestamps, the order of insertion and the memory leaves that
  index each item) in three tables of this module, created by :meth:`DurableHierMemStore.setup` (also
  on first open) and versioned by their ``meta`` row ``format``; in the SQLite file itself, or in the
  PostgreSQL schema ``hiermem_langgraph``::

      meta(key PRIMARY KEY, value)             JSON values: kind, format, seq (one more per write)
      spaces(ns PRIMARY KEY, pos)              namespaces (ASCII JSON of the tuple), in order of creation
      items(ns, key, value, created_at, updated_at, pos, leaves)   PRIMARY KEY (ns, key); leaves is a
                                               JSON list of [leaf id, text] of the item's memory leaves

- **the memory of each namespace**, through :class:`~shared_core.namespaces.MemoryStore`: one SQLite
  store per namespace in the directory ``<file>.memories`` next to the SQLite file, or the ``hiermem``
  schema of the same PostgreSQL database. The memory of the LangGraph namespace ``("users", "ann")`` is
  the MemoryStore namespace ``("langgraph", "users", "ann")``, so a namespace has at most 7 labels.

A run of puts first adds the new texts to each namespace's memory (each add is committed by the
memory's store), then writes the items and their leaves in ONE transaction, then deletes the replaced
texts from the memories. If the item transaction fails, the new texts are deleted again: items and
memories are as before. A process killed between two of these steps leaves memory leaves that no item
records; they are deleted when the namespace's memory is next opened, so a reopened store has exactly
the items whose write was committed, each indexed by its own texts.

One process owns a store at a time (SQLite: an exclusive lock on the file; PostgreSQL: a session
advisory lock), so the items kept in RAM never go stale; a second opener gets :class:`PersistenceError`.
Values must be JSON-serialisable: they are stored and returned as JSON (tuples become lists).

References:
    LangGraph ``PostgresStore.from_conn_string`` / ``SqliteStore.from_conn_string``;
    :mod:`shared_core.namespaces`; :mod:`shared_core.stores`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from collections.abc import Iterable
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph.store.base import IndexConfig, InvalidNamespaceError, Item, Op, PutOp, Result

from shared_core.base import HierarchicalMemory
from shared_core.namespaces import MemoryStore
from shared_core.stores import is_postgres_url
from shared_core.stores.namespace import MAX_PARTS, namespace_key, normalize_namespace
from shared_core.types import (
    HierMemError,
    InvalidInputError,
    NodeNotFoundError,
    PersistenceError,
    VersionMismatchError,
)

from .retrievers import HierMemRetriever
from .store import HierMemStore, MemoryFactory, Namespace, _Added, _as_namespace, _Space

if TYPE_CHECKING:
    import psycopg

__all__ = ["FORMAT", "KIND", "MEMORY_PREFIX", "SCHEMA", "DurableHierMemStore"]

#: Version of the item tables (the ``format`` row of ``meta``).
FORMAT = 1
#: The ``kind`` row of ``meta``: what tells a hiermem LangGraph store from other databases.
KIND = "hiermem-langgraph-store"
#: First label of the MemoryStore namespace of every LangGraph namespace.
MEMORY_PREFIX = "langgraph"
#: The PostgreSQL schema of the item tables.
SCHEMA = "hiermem_langgraph"
#: First key of this module's PostgreSQL advisory locks ("hlgs"); second key 0 guards the schema setup,
#: 1 is held by the process that owns the store.
LOCK_CLASS = 0x686C6773
_SETUP_LOCK, _OWNER_LOCK = 0, 1

_TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "spaces": ("ns", "pos"),
    "items": ("ns", "key", "value", "created_at", "updated_at", "pos", "leaves"),
}
_DDL = (
    "CREATE TABLE {t}meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE {t}spaces (ns text PRIMARY KEY, pos bigint NOT NULL)",
    "CREATE TABLE {t}items (ns text NOT NULL, key text NOT NULL, value text NOT NULL, "
    "created_at text NOT NULL, updated_at text NOT NULL, pos bigint NOT NULL, leaves text NOT NULL, "
    "PRIMARY KEY (ns, key))",
)
_UPSERT_ITEM = (
    "INSERT INTO {t}items (ns, key, value, created_at, updated_at, pos, leaves) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, created_at = excluded.created_at, "
    "updated_at = excluded.updated_at, pos = excluded.pos, leaves = excluded.leaves"
)
_DELETE_ITEM = "DELETE FROM {t}items WHERE ns = ? AND key = ?"
_SET_LEAVES = "UPDATE {t}items SET leaves = ? WHERE ns = ? AND key = ?"
_ADD_SPACE = "INSERT INTO {t}spaces (ns, pos) VALUES (?, ?) ON CONFLICT (ns) DO NOTHING"

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


def _check_meta(rows: Iterable[tuple[Any, Any]], location: str) -> int:
    """The change sequence of a store's ``meta`` rows.

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
    if meta.get("format") != FORMAT:
        raise VersionMismatchError(
            f"The items in {location} have format {meta.get('format')!r}; this hiermem reads format "
            f"{FORMAT}. Use the hiermem version that created them, or another store."
        )
    seq = meta.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise PersistenceError(f"The change sequence of {location} is malformed; the store is corrupt.")
    return seq


class _ItemsDB:
    """The item tables of one store: one connection, owned by one process (see the module docstring)."""

    location: str
    prefix: str  # the tables' schema prefix in SQL ("" or "hiermem_langgraph.")

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
                f"The LangGraph store {self.path} is in use by another process (one process per store); "
                "close it there first."
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
        for table, cols in _TABLES.items():
            have = tuple(r[1] for r in self.conn.execute(f"PRAGMA table_info({table})").fetchall())
            if have != cols:
                raise _not_ours(self.location, f"table {table!r} has columns {have}, expected {cols}")
        _check_meta(self.conn.execute("SELECT key, value FROM meta").fetchall(), self.location)
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
            seq = _check_meta(self.conn.execute("SELECT key, value FROM meta").fetchall(), self.location)
            spaces = self.conn.execute("SELECT ns, pos FROM spaces ORDER BY pos").fetchall()
            items = self.conn.execute(
                "SELECT ns, key, value, created_at, updated_at, pos, leaves FROM items ORDER BY pos"
            ).fetchall()
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

    def close(self) -> None:
        """Close the connection (releases the lock; idempotent)."""
        c, self._conn = self._conn, None
        if c is not None:
            with suppress(sqlite3.Error):
                c.close()


class _PostgresItems(_ItemsDB):
    """The item tables in the schema ``hiermem_langgraph`` of a PostgreSQL database.

    One connection holds the store's session advisory lock (released when it closes, also when the
    process dies); after a lost connection the next call connects again and takes the lock again.
    """

    def __init__(self, url: str) -> None:
        from shared_core.stores.postgres import _parse_url  # InvalidInputError without psycopg

        params, self.location = _parse_url(url)
        self.prefix = f"{SCHEMA}."
        self._url = url.strip()
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
            self._lock_store(self._conn)
        except BaseException as e:
            self.close()
            if isinstance(e, PersistenceError):
                raise
            if isinstance(e, Exception):
                raise self._error(e, "open") from None
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        try:
            return psycopg.connect(self._url, **self._kwargs)
        except psycopg.Error as e:
            raise PersistenceError(
                f"Cannot connect to PostgreSQL at {self.location}: {_first_line(e)}. Check that the server "
                "is running and reachable and that the URL's host, port, database name, user and password "
                "are right (create the database first, e.g. createdb)."
            ) from None

    def _lock_store(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, _OWNER_LOCK)).fetchone()
        if not row or not row[0]:
            raise PersistenceError(
                f"The LangGraph store in {self.location} is in use by another process (one process per "
                "store); close it there first."
            )

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection; connected again (and the store locked again) after it was lost."""
        if self._closed:
            raise PersistenceError(f"The LangGraph store in {self.location} is closed; open it again.")
        c = self._conn
        if c is None or c.closed or c.broken:
            self._drop()
            c = self._connect()
            try:
                self._lock_store(c)
            except BaseException as e:
                with suppress(Exception):
                    c.close()
                if isinstance(e, PersistenceError):
                    raise
                if isinstance(e, Exception):
                    raise self._error(e, "lock") from None
                raise
            self._conn = c
        return c

    def _drop(self) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            with suppress(Exception):
                c.close()

    def _error(self, e: BaseException, what: str) -> PersistenceError:
        import psycopg

        if isinstance(e, PersistenceError):
            return e
        if isinstance(e, psycopg.OperationalError):
            self._drop()
            return PersistenceError(
                f"Could not {what} the LangGraph store in {self.location}: the connection to PostgreSQL "
                f"failed ({_first_line(e)}). Nothing was changed; the next call connects again."
            )
        return PersistenceError(
            f"Could not {what} the LangGraph store in {self.location}: PostgreSQL says {_first_line(e)}."
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
        extra = sorted(n for n, k in rels.items() if n not in _TABLES or k not in ("r", "p"))
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
        for table, want in _TABLES.items():
            if tuple(cols.get(table, ())) != want:
                raise _not_ours(where, f"table {table!r} has columns {tuple(cols.get(table, ()))}")
        cur.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (SCHEMA,),
        )
        triggers = [r[0] for r in cur.fetchall()]
        if triggers:
            raise _not_ours(where, f"it has triggers: {', '.join(triggers)}")
        _check_meta(cur.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall(), where)
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
                    return
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                for stmt in _DDL:
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
                self._check(cur, missing_ok=False)
                seq = _check_meta(
                    cur.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall(), self.location
                )
                spaces = cur.execute(f"SELECT ns, pos FROM {SCHEMA}.spaces ORDER BY pos").fetchall()
                items = cur.execute(
                    "SELECT ns, key, value, created_at, updated_at, pos, leaves "
                    f"FROM {SCHEMA}.items ORDER BY pos"
                ).fetchall()
        except Exception as e:
            raise self._error(e, "read") from None
        return seq, spaces, items

    def write(self, seq: int, statements: list[Statement]) -> int:
        """Run ``statements`` in one transaction (see :meth:`_ItemsDB.write`).

        A connection found dead by the transaction's first statement (e.g. after a server restart) is
        replaced and the transaction run once more; nothing of it had reached the server.
        """
        import psycopg

        for attempt in (0, 1):
            conn = self.conn
            started = False
            try:
                with conn.transaction(), conn.cursor() as cur:
                    row = cur.execute(
                        f"SELECT value FROM {SCHEMA}.meta WHERE key = 'seq' FOR UPDATE"
                    ).fetchone()
                    started = True
                    stored = json.loads(row[0]) if row is not None else None
                    if stored != seq:
                        raise self._changed(seq, stored)
                    for sql, params in statements:
                        cur.execute(self.sql(sql).replace("?", "%s"), params)
                    cur.execute(f"UPDATE {SCHEMA}.meta SET value = %s WHERE key = 'seq'", (str(seq + 1),))
            except Exception as e:
                if isinstance(e, psycopg.OperationalError) and not started and attempt == 0:
                    self._drop()
                    continue
                raise self._error(e, "write the items to") from None
            return seq + 1
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the connection, releasing the store's lock (idempotent)."""
        self._closed = True
        self._drop()


def _first_line(e: BaseException) -> str:
    """The first line of an error's message (a server's message can be long)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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


class DurableHierMemStore(HierMemStore):
    """A :class:`HierMemStore` whose items and memories are kept in a database (see the module docstring).

    Open it with ``HierMemStore.from_conn_string(conn, ...)`` (closed at the end of the ``with``
    block), or construct it and call :meth:`close`. Everything else is :class:`HierMemStore`: the same
    text fields, search, filters and ordering, and the same results after a reopen.

    Args:
        conn: the path of an SQLite file (created when absent; the memories go to the directory
            ``<file>.memories`` next to it) or a ``postgresql://user:password@host:5432/dbname`` URL.
        index: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``).
        memory_factory: builds the memory of a namespace (see :class:`HierMemStore`); it must build the
            same configuration every time, since a stored memory is reopened with it.
        embedder: a core embedder or a LangChain ``Embeddings`` (instead of ``index``).
        fields: default text fields (instead of ``index``).
        memory_kwargs: keyword arguments of the default ``SegTreeMem``.
        policy: retrieval policy of query searches.
        search_kwargs: the policy's parameters.
        synchronous: SQLite's ``synchronous`` for the items and the memories: ``"FULL"`` (default; an
            acknowledged put survives power loss), ``"EXTRA"`` or ``"NORMAL"`` (survives a process crash).
            A PostgreSQL server decides its own durability; only ``"FULL"`` is accepted with a URL.
        pool_size: most connections of each of the memories' two PostgreSQL pools, default 8.

    Raises:
        InvalidInputError: a malformed path or URL, a bad argument (see :class:`HierMemStore`).
        PersistenceError: the file or database is not a hiermem LangGraph store, the store is in use by
            another process, the server cannot be reached or refuses the login.
        VersionMismatchError: the items or the memories were written by another layout version.
    """

    def __init__(
        self,
        conn: str | os.PathLike[str],
        *,
        index: IndexConfig | None = None,
        memory_factory: MemoryFactory | None = None,
        embedder: Any = None,
        fields: list[str] | None = None,
        memory_kwargs: dict[str, Any] | None = None,
        policy: str | None = None,
        search_kwargs: dict[str, Any] | None = None,
        synchronous: str = "FULL",
        pool_size: int = 8,
    ) -> None:
        super().__init__(
            memory_factory=memory_factory,
            embedder=embedder,
            fields=fields,
            memory_kwargs=memory_kwargs,
            policy=policy,
            search_kwargs=search_kwargs,
            index=index,
        )
        kind, where = _target(conn)
        if not isinstance(synchronous, str) or synchronous.upper() not in ("FULL", "EXTRA", "NORMAL"):
            raise InvalidInputError(f"synchronous must be 'FULL', 'EXTRA' or 'NORMAL', got {synchronous!r}.")
        if kind == "postgres" and synchronous.upper() != "FULL":
            raise InvalidInputError(
                "synchronous= applies to SQLite stores; a PostgreSQL server's durability is its "
                "synchronous_commit setting."
            )
        self._closed = True
        self._pending: Iterable[_Added] = ()
        self._created: list[tuple[Namespace, HierarchicalMemory]] = []
        self._probed: set[Namespace] = set()
        self._space_pos: dict[Namespace, int] = {}
        self._item_pos: dict[tuple[Namespace, str], int] = {}
        self._next_space = self._next_item = 0
        self._seq = 0
        self._db: _ItemsDB
        self._memories: MemoryStore | None = None
        if kind == "sqlite":
            memdir = where.with_name(where.name + ".memories")
            if memdir.exists() and not memdir.is_dir():
                raise PersistenceError(
                    f"{memdir} is a file; the store keeps its memories in a directory of that name. Move "
                    "the file away or give another path."
                )
            self._db = _SQLiteItems(where, synchronous.upper())
            self.location = str(where)
        else:
            self._db = _PostgresItems(where)
            self.location = self._db.location
        try:
            if kind == "sqlite":
                self._memories = MemoryStore(
                    self._memory_for, memdir, durable=True, synchronous=synchronous.upper()
                )
            else:
                self._memories = MemoryStore(self._memory_for, url=where, pool_size=pool_size)
            self._db.setup()
            self._load()
        except BaseException:
            self._shut()
            raise
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        """Create the item tables when absent, else check them (idempotent; also done on open).

        Raises:
            PersistenceError: the database is not a hiermem LangGraph store or cannot be written.
            VersionMismatchError: another item format.
        """
        with self._lock:
            self._check_open()
            self._db.setup()

    def close(self) -> None:
        """Close the memories' stores and the item database, releasing the store (idempotent)."""
        with self._lock:
            self._closed = True
            self._shut()

    def _shut(self) -> None:
        mems, self._memories = self._memories, None
        try:
            if mems is not None:
                mems.close()
        finally:
            self._db.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> DurableHierMemStore:
        """The store itself; :meth:`close` at the end of the ``with`` block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        return f"DurableHierMemStore({self.location!r}, namespaces={len(self._spaces)})"

    def _check_open(self) -> MemoryStore:
        """The MemoryStore; raises :class:`PersistenceError` once the store is closed."""
        if self._closed or self._memories is None:
            raise PersistenceError(f"The LangGraph store {self.location} is closed; open it again.")
        return self._memories

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        """Read every namespace and item (memories open on first use)."""
        seq, spaces, items = self._db.load()
        try:
            for ns_text, pos in spaces:
                ns = tuple(normalize_namespace(json.loads(ns_text)))
                self._spaces[ns] = _Space()
                self._space_pos[ns] = int(pos)
            for ns_text, key, value, created, updated, pos, leaves in items:
                ns = tuple(normalize_namespace(json.loads(ns_text)))
                space = self._spaces.get(ns)
                if space is None:  # never written without its namespace row; kept readable all the same
                    space = self._spaces[ns] = _Space()
                    self._space_pos[ns] = max(self._space_pos.values(), default=-1) + 1
                val = json.loads(value)
                if not isinstance(val, dict):
                    raise ValueError(f"the value of {key!r} is not an object")
                space.items[str(key)] = Item(
                    value=val,
                    key=str(key),
                    namespace=ns,
                    created_at=datetime.fromisoformat(created),
                    updated_at=datetime.fromisoformat(updated),
                )
                pairs = json.loads(leaves)
                if pairs:
                    space.leaves[str(key)] = [int(lid) for lid, _ in pairs]
                    space.texts[str(key)] = [str(text) for _, text in pairs]
                self._item_pos[(ns, str(key))] = int(pos)
        except (TypeError, ValueError, InvalidInputError) as e:
            raise PersistenceError(
                f"{self.location} holds a malformed row ({e}); the store is corrupt."
            ) from None
        self._seq = seq
        self._next_space = max(self._space_pos.values(), default=-1) + 1
        self._next_item = max(self._item_pos.values(), default=-1) + 1

    # ------------------------------------------------------------------ memories
    @staticmethod
    def _memory_ns(ns: Namespace) -> Namespace:
        """The MemoryStore namespace of a LangGraph namespace."""
        return (MEMORY_PREFIX, *ns)

    def _memory_for(self, memory_ns: Namespace) -> HierarchicalMemory:
        """The MemoryStore's factory: the store's checked factory, for the LangGraph namespace."""
        return self._build_memory(tuple(memory_ns[1:]), self._pending)

    def _memory(self, namespace: Namespace, space: _Space) -> HierarchicalMemory | None:
        """The namespace's memory, opened from the database on first use (then reconciled with the items)."""
        if space.memory is None and namespace not in self._probed:
            mems = self._check_open()
            mem = mems.get(self._memory_ns(namespace))
            self._reconcile(namespace, space, mem)
            space.memory = mem
            self._probed.add(namespace)
        return space.memory

    def _new_memory(self, namespace: Namespace, pending: Iterable[_Added] = ()) -> HierarchicalMemory:
        """The namespace's memory in the MemoryStore, created there (and recorded, so a failed run of puts
        drops it again); one found stored after all is reconciled with the items."""
        mems = self._check_open()
        mem_ns = self._memory_ns(namespace)
        existed = mem_ns in mems
        self._pending = pending
        try:
            mem = mems.get_or_create(mem_ns)
        finally:
            self._pending = ()
        if not existed:
            self._created.append((namespace, mem))
        elif len(mem):
            self._reconcile(namespace, self._spaces.get(namespace) or _Space(), mem)
        self._probed.add(namespace)
        return mem

    def _reconcile(self, ns: Namespace, space: _Space, mem: HierarchicalMemory | None) -> None:
        """Make the items' leaves and the memory agree after a reopen.

        An item keeps only the leaves that are in the memory under its key (the others are forgotten, in
        the database as well); leaves no item records (left by a process killed in the middle of a put)
        are deleted from the memory.

        Raises:
            PersistenceError: the corrected leaves cannot be written (nothing changes).
        """
        st = mem._store if mem is not None else None
        present = set(st.leaves()) if st is not None else set()
        by_source = st.by_source if st is not None else {}
        fixes: dict[str, list[tuple[int, str]]] = {}
        for key, lids in space.leaves.items():
            mine = set(by_source.get(key, ()))
            keep = [
                (lid, t) for lid, t in zip(lids, space.texts.get(key, [])) if lid in present and lid in mine
            ]
            if len(keep) != len(lids):
                fixes[key] = keep
        if fixes:
            nsk = namespace_key(ns)
            stmts = [
                (_SET_LEAVES, (_dumps([list(p) for p in keep]), nsk, key)) for key, keep in fixes.items()
            ]
            self._seq = self._db.write(self._seq, stmts)
            for key, keep in fixes.items():
                if keep:
                    space.leaves[key] = [lid for lid, _ in keep]
                    space.texts[key] = [t for _, t in keep]
                else:
                    space.leaves.pop(key, None)
                    space.texts.pop(key, None)
        if mem is None or st is None:
            return
        referenced = {lid for lids in space.leaves.values() for lid in lids}
        for lid in [lid for lid in st.leaves() if lid not in referenced]:
            try:
                mem.delete(lid)
            except NodeNotFoundError:
                continue
            except HierMemError as e:
                warnings.warn(
                    f"Could not remove a text no item of namespace {ns!r} holds any more ({e}); it is "
                    "removed when the store is next opened.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def get_memory(self, namespace: tuple[str, ...]) -> HierarchicalMemory | None:
        """The core memory of a namespace (``None`` until something was indexed in it).

        Raises:
            InvalidNamespaceError: a string or otherwise invalid namespace.
            PersistenceError: the store is closed, or the memory cannot be opened.
        """
        with self._lock:
            self._check_open()
            return super().get_memory(namespace)

    def as_retriever(self, namespace: tuple[str, ...], **kwargs: Any) -> HierMemRetriever:
        """A retriever over one namespace's memory (created, and the namespace recorded, when new).

        Args:
            namespace: the namespace.
            **kwargs: ``HierMemRetriever`` fields (``k``, ``policy``, ``max_tokens``, ``search_kwargs``).

        Returns:
            The retriever.

        Raises:
            InvalidNamespaceError: an invalid namespace, or one the memories cannot name.
            PersistenceError: the store is closed, or the memory cannot be opened or created.
        """
        ns = self._durable_namespace(_as_namespace(namespace))
        with self._lock:
            self._check_open()
            self._created = []
            retriever = super().as_retriever(ns, **kwargs)
            if ns not in self._space_pos:
                pos = self._next_space
                self._seq = self._db.write(self._seq, [(_ADD_SPACE, (namespace_key(ns), pos))])
                self._space_pos[ns], self._next_space = pos, pos + 1
            return retriever

    # ------------------------------------------------------------------ batches
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations in order, as :meth:`HierMemStore.batch`; every run of puts is committed to
        the database before the next operation runs.

        Raises:
            PersistenceError: the store is closed, or the database failed (a failed run of puts leaves
                the items and the memories as before).
            InvalidInputError: a put value that is not JSON-serialisable, a key with a NUL character; see
                :meth:`HierMemStore.batch`.
            InvalidNamespaceError: see :meth:`HierMemStore.batch`; also a namespace the memories cannot
                name (more than 7 labels, a blank label, control characters, over 256 characters).
        """
        with self._lock:
            self._check_open()
            return super().batch(ops)

    @staticmethod
    def _durable_namespace(ns: Namespace) -> Namespace:
        """``ns`` when the MemoryStore can name its memory, else :class:`InvalidNamespaceError`."""
        try:
            normalize_namespace((MEMORY_PREFIX, *ns))
        except InvalidInputError as e:
            raise InvalidNamespaceError(
                f"A namespace of a durable HierMemStore has 1 to {MAX_PARTS - 1} labels of printable text, "
                f"none blank or over 256 characters; {ns!r} is not one ({e})."
            ) from None
        return ns

    def _check_put(self, op: PutOp) -> PutOp:
        """Check the namespace and key, and turn the value into its JSON form (as a reopen returns it)."""
        self._durable_namespace(tuple(op.namespace))
        key = op.key
        if not isinstance(key, str) or "\x00" in key:
            raise InvalidInputError(f"A key is a string without NUL characters, got {key!r}.")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError(f"The key {key!r} holds a lone surrogate; use valid text.") from None
        if op.value is None:
            return op
        try:
            value = json.loads(_dumps(op.value))
        except (TypeError, ValueError, RecursionError) as e:
            raise InvalidInputError(
                f"The value of {key!r} cannot be stored as JSON ({e}); use dicts, lists, strings, numbers "
                "(not NaN or infinity), booleans and None."
            ) from None
        return op._replace(value=value)

    def _apply_puts(self, ops: list[PutOp]) -> None:
        """:meth:`HierMemStore._apply_puts`, recording the memories the run creates."""
        self._created = []
        try:
            super()._apply_puts(ops)
        finally:
            self._created = []

    def _add_texts(self, ns: Namespace, ops: list[PutOp], pending: list[_Added]) -> _Added:
        """:meth:`HierMemStore._add_texts`, telling the MemoryStore's factory which memories are pending."""
        self._pending = pending
        try:
            return super()._add_texts(ns, ops, pending)
        finally:
            self._pending = ()

    def _commit_puts(self, added: list[_Added], now: datetime) -> None:
        """Write the run's items, their leaves and new namespaces in one transaction."""
        stmts: list[Statement] = []
        space_pos: dict[Namespace, int] = {}
        next_space = self._next_space
        for a in added:
            if a.ns not in self._space_pos and a.ns not in space_pos:
                space_pos[a.ns], next_space = next_space, next_space + 1
                stmts.append((_ADD_SPACE, (namespace_key(a.ns), space_pos[a.ns])))
        item_pos: dict[tuple[Namespace, str], int] = {}
        gone: list[tuple[Namespace, str]] = []
        next_item = self._next_item
        stamp = now.isoformat()
        for a in added:  # the same moves as _finish_puts makes in RAM
            nsk = namespace_key(a.ns)
            final = {op.key: op for op in a.ops}
            for key in a.removed:
                gone.append((a.ns, key))
                if final[key].value is None:
                    stmts.append((_DELETE_ITEM, (nsk, key)))
            kept = [
                k
                for k, op in final.items()
                if op.value is not None and k in a.space.items and k not in a.removed
            ]
            kept_set = set(kept)
            for key in [*kept, *a.appended]:
                prev = a.space.items.get(key) if key in kept_set else None
                pos = self._item_pos.get((a.ns, key)) if prev is not None else None
                if pos is None:
                    pos, next_item = next_item, next_item + 1
                item_pos[(a.ns, key)] = pos
                leaves = [[lid, t] for lid, t in zip(a.leaves.get(key, []), a.texts.get(key, []))]
                created = prev.created_at.isoformat() if prev is not None else stamp
                value = _dumps(final[key].value)
                stmts.append((_UPSERT_ITEM, (nsk, key, value, created, stamp, pos, _dumps(leaves))))
        if not stmts:
            return
        self._seq = self._db.write(self._seq, stmts)
        self._space_pos.update(space_pos)
        self._next_space = next_space
        for k in gone:
            self._item_pos.pop(k, None)
        self._item_pos.update(item_pos)
        self._next_item = next_item

    def _undo_puts(self, added: list[_Added]) -> None:
        """Drop the memories this failed run created (the namespaces had none before)."""
        mems = self._memories
        for ns, mem in self._created:
            space = self._spaces.get(ns)
            if space is not None and space.memory is mem:
                space.memory = None
            if mems is not None:
                with suppress(Exception):
                    mems.delete_namespace(self._memory_ns(ns))
