"""PostgreSQL store: one memory per namespace of one database, shared by many processes and machines.

Every process that opens a namespace holds the memory in RAM (node store and FAISS index, rebuilt from
the database on first open) and keeps it in step with the database:

- **writes** (``add``, ``delete``, xMemory's ``flush``) are computed with no transaction open and no
  connection held, then written in one short transaction (optimistic concurrency):

  1. *catch up*: apply what other processes committed since the memory's change sequence (a read-only
     snapshot, as for a retrieval) and remember that sequence number, ``s``;
  2. *compute*: the memory inserts the messages and calls its models (embedder, summariser, LLM) in
     RAM, however long they take;
  3. *write*: a ``READ COMMITTED`` transaction takes the namespace's advisory lock
     (``pg_advisory_xact_lock``, waiting at most the lock timeout, then
     :class:`~shared_core.types.NamespaceBusyError` naming the namespace), checks that the namespace's
     sequence is still ``s``, writes the rows the change touched, sets the sequence to ``s + 1`` and
     commits, which releases the lock. Acknowledged means committed: ``add`` returns only after
     ``COMMIT``.

  When another process committed to the namespace between 1 and 3, nothing is written (it was
  computed from an old state): the memory rolls its change back and runs it again, this time first
  taking the namespace's lock at *session* level (``pg_advisory_lock``, the same bounded wait) on a
  connection of its own, outside the pools and with no transaction open, which it holds through the
  catch-up, the model calls and the write; so the second attempt cannot be overtaken and a busy
  namespace makes progress (``write_attempts`` attempts in all, default :data:`WRITE_ATTEMPTS`, then
  ``NamespaceBusyError``). Writers of that namespace wait for it at their step 3, at most the lock
  timeout. While writers keep colliding (a conflict, or a wait for that lock, in the last
  :data:`CONTENTION_WINDOW` seconds) a store computes every write that way, which spares the attempts
  that would be overtaken (the lock connections are kept for reuse, at most ``pool_size``, a minute
  each). So, without contention, the lock is held only while rows are written: a slow model in one
  process does not make another process wait, ``idle_in_transaction_session_timeout`` never ends a
  write, a slow add holds no pooled connection (an add in another namespace never waits for it), and
  writers of one namespace are still serialised (each write is computed from every write committed
  before it). ``clear`` and the first write of a namespace write without computing and take the lock
  the same way as step 3.
- **reads** (``retrieve``) first apply what other processes committed since the memory's change
  sequence, in a read-only ``REPEATABLE READ`` snapshot. It takes no advisory lock and only
  ``ACCESS SHARE`` on the tables it reads, which no row written by hiermem conflicts with, so a
  retrieval never waits for a writer (of its own namespace or another one).
- **lock waits are bounded**: every statement, read or write, waits at most the lock timeout for any one
  lock, then the call fails with :class:`~shared_core.types.NamespaceBusyError` and changes nothing.
  That includes another session's ``ACCESS EXCLUSIVE`` table lock (``LOCK TABLE``, ``VACUUM FULL``,
  ``ALTER TABLE``): the catch-up that starts every ``retrieve``, ``add`` and ``delete`` fails after the
  lock timeout instead of waiting for it.
- **catching up** reads only the rows changed since the memory's change sequence: every namespace has a
  change sequence ``seq`` (one more per committed write); node and vector rows carry the ``seq`` of the
  write that last changed them and removed nodes leave an id in ``removed``. A ``clear`` (and the first
  write of a namespace) sets ``reset_seq``, after which a process behind it reloads the namespace.
- **pruning** (:mod:`shared_core.stores.pg_prune`): every open store registers in ``readers`` the
  sequence it has reached; after some commits the ``removed`` rows every live registration is past are
  deleted and ``reset_seq`` is raised past them, so a process that needed them reloads instead.
- **deleted namespaces**: a namespace is identified by its row's ``id`` (a deleted and re-created
  namespace gets a new one); a catch-up that finds its row gone raises
  :class:`~shared_core.stores.namespace.NamespaceDeletedError`.
- **failures**: a dropped connection, a server restart or any database error is a
  :class:`PersistenceError`; the memory is then unchanged (the base rolls its transaction back), the
  broken connections are dropped from the pools and the next call connects again.
- **a ``COMMIT`` without a reply** (the connection broke while it was on its way): the store asks the
  server on a fresh connection (``txid_status`` of the transaction) whether it landed. Committed: the
  write succeeded and the memory keeps the change (the call returns normally). Aborted: the memory rolls
  back and the error says nothing was changed. Cannot tell (the server is away):
  :class:`~shared_core.types.CommitUnknownError`; the memory rolls back and reloads the namespace from
  the database before its next operation, so it then holds whatever the database holds.

Connections, pools, the isolation level, the lock timeout and how errors are reported are in
:mod:`shared_core.stores.pg_connection`.

Schema (``hiermem``, created on first open or by :meth:`PostgresDatabase.setup`, versioned in
``hiermem.version``, :data:`SCHEMA_VERSION`: version 2 added ``readers``, and a version-1 schema is
upgraded on open; the node, vector and metadata rows are those of :mod:`shared_core.stores.encoding`)::

    version(version)
    namespaces(id serial, name text UNIQUE (ASCII JSON of the namespace tuple), seq, reset_seq)
    meta(ns, key, value)                                     PRIMARY KEY (ns, key)
    nodes(ns, id, parent, children, text bytea, span_first, span_last, is_leaf, level, data, message,
          seq)                                               PRIMARY KEY (ns, id), INDEX (ns, seq)
    vectors(ns, id, vec bytea, seq)                          PRIMARY KEY (ns, id), INDEX (ns, seq)
    removed(ns, id, seq)                                     PRIMARY KEY (ns, id), INDEX (ns, seq)
    readers(id bigserial, ns, seq, heartbeat timestamptz)    PRIMARY KEY (id), INDEX (ns, seq)

Nothing is unpickled: values are JSON text and float32 ``bytea``; the schema is checked on open (a
``hiermem`` schema with other tables, columns or triggers is refused).

References:
    PostgreSQL documentation: "Advisory Locks", "Transaction Isolation", "System Information
    Functions" (``txid_current``, ``txid_status``); psycopg 3 and psycopg_pool documentation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..types import CommitUnknownError, InvalidInputError, PersistenceError, VersionMismatchError
from . import pg_prune
from .base import Store, WriteConflictError
from .encoding import (
    NODE_COLUMNS,
    apply_changes,
    cleared_meta,
    decode_meta,
    dumps,
    full_rows,
    pending_changes,
    restore_rows,
)
from .namespace import Namespace, NamespaceDeletedError, NamespaceLike, namespace_key, normalize_namespace
from .pg_connection import (  # raises InvalidInputError without psycopg
    LOCK_CLASS,
    SCHEMA,
    PostgresConnections,
    first_line,
    parse_url,
)
from .pg_writes import NamespaceWrites

if TYPE_CHECKING:
    import psycopg

    from ..memories.base import HierarchicalMemory

__all__ = [
    "FORMAT",
    "LOCK_CLASS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "WRITE_ATTEMPTS",
    "PostgresDatabase",
    "PostgresStore",
    "first_line",
    "parse_url",
]

#: Version of the namespace metadata layout (``format``).
FORMAT = 1
#: Version of the schema (``hiermem.version``); 2 added ``readers`` (version 1 is upgraded on open).
SCHEMA_VERSION = 2
#: Seconds a store keeps computing its writes under the namespace's lock after it last met another writer
#: (a commit overtook its change, or it waited for the lock): while writers collide, computing first
#: without the lock would mostly be wasted.
CONTENTION_WINDOW = 2.0
#: How many times a write is computed, at most: first with no lock held; when another process committed
#: to the namespace meanwhile, again (after catching up) holding the namespace's lock, which no writer can
#: overtake (a third attempt only when that lock's connection was lost). Then
#: :class:`~shared_core.types.NamespaceBusyError`.
WRITE_ATTEMPTS = 3

_NODE_COLS = ", ".join(NODE_COLUMNS)
_TABLES: dict[str, tuple[str, ...]] = {
    "version": ("version",),
    "namespaces": ("id", "name", "seq", "reset_seq"),
    "meta": ("ns", "key", "value"),
    "nodes": ("ns", *NODE_COLUMNS, "seq"),
    "vectors": ("ns", "id", "vec", "seq"),
    "removed": ("ns", "id", "seq"),
    pg_prune.TABLE: pg_prune.COLUMNS,
}
_NS_REF = f"ns integer NOT NULL REFERENCES {SCHEMA}.namespaces (id) ON DELETE CASCADE"
_DDL = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE TABLE {SCHEMA}.version (version integer NOT NULL)",
    f"CREATE TABLE {SCHEMA}.namespaces (id serial PRIMARY KEY, name text NOT NULL UNIQUE, "
    "seq bigint NOT NULL DEFAULT 0, reset_seq bigint NOT NULL DEFAULT 0)",
    f"CREATE TABLE {SCHEMA}.meta ({_NS_REF}, key text NOT NULL, value text NOT NULL, PRIMARY KEY (ns, key))",
    f"CREATE TABLE {SCHEMA}.nodes ({_NS_REF}, id bigint NOT NULL, parent bigint, children text NOT NULL, "
    "text bytea NOT NULL, span_first bigint NOT NULL, span_last bigint NOT NULL, is_leaf smallint NOT NULL, "
    "level integer NOT NULL, data text NOT NULL, message text, seq bigint NOT NULL, PRIMARY KEY (ns, id))",
    f"CREATE INDEX nodes_changes ON {SCHEMA}.nodes (ns, seq)",
    f"CREATE TABLE {SCHEMA}.vectors ({_NS_REF}, id bigint NOT NULL, vec bytea NOT NULL, seq bigint NOT NULL, "
    "PRIMARY KEY (ns, id))",
    f"CREATE INDEX vectors_changes ON {SCHEMA}.vectors (ns, seq)",
    f"CREATE TABLE {SCHEMA}.removed ({_NS_REF}, id bigint NOT NULL, seq bigint NOT NULL, "
    "PRIMARY KEY (ns, id))",
    f"CREATE INDEX removed_changes ON {SCHEMA}.removed (ns, seq)",
    *pg_prune.ddl(SCHEMA),
)
_UPSERT_NODE = (
    f"INSERT INTO {SCHEMA}.nodes (ns, {_NODE_COLS}, seq) VALUES ({', '.join(['%s'] * 12)}) "
    "ON CONFLICT (ns, id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in (*NODE_COLUMNS[1:], "seq"))
)
_UPSERT_VECTOR = (
    f"INSERT INTO {SCHEMA}.vectors (ns, id, vec, seq) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (ns, id) DO UPDATE SET vec = EXCLUDED.vec, seq = EXCLUDED.seq"
)
_UPSERT_REMOVED = (
    f"INSERT INTO {SCHEMA}.removed (ns, id, seq) VALUES (%s, %s, %s) "
    "ON CONFLICT (ns, id) DO UPDATE SET seq = EXCLUDED.seq"
)
_UPSERT_META = (
    f"INSERT INTO {SCHEMA}.meta (ns, key, value) VALUES (%s, %s, %s) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value"
)


class PostgresDatabase(PostgresConnections):
    """A PostgreSQL database holding hiermem namespaces: the connection pools (see
    :class:`~shared_core.stores.pg_connection.PostgresConnections`) and the schema.

    Several :class:`PostgresStore` (one per namespace, e.g. those of a ``MemoryStore``) share one
    database object and its pools. A connection is lent only for one short transaction, never while a
    memory calls its models.

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/dbname`` (``?host=/socket/dir`` for a
            Unix socket; ``connect_timeout=S`` also bounds the wait for a pooled connection, default 10;
            ``lock_timeout=S``, read by hiermem, bounds every wait for a lock, default the connect
            timeout).
        pool_size: most connections of each pool (writers, readers), default 8.
        setup: create the schema when absent and check it (default ``True``); ``False`` only checks
            that the schema is there (call :meth:`setup` later).
        lock_timeout: seconds a statement (a read or a write) waits for any one lock, a namespace's
            writer lock or a table lock another session holds, before the call fails with
            :class:`~shared_core.types.NamespaceBusyError` (overrides the URL's ``lock_timeout``).
        write_attempts: how many times a write is computed when other processes keep committing to its
            namespace meanwhile, before it fails with :class:`~shared_core.types.NamespaceBusyError`
            (default :data:`WRITE_ATTEMPTS`).

    Raises:
        InvalidInputError: a malformed URL, ``pool_size``, ``lock_timeout`` or ``write_attempts``.
        PersistenceError: the server cannot be reached, refuses the login, or the database has a
            ``hiermem`` schema that is not a hiermem store.
        VersionMismatchError: the schema has another version.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        setup: bool = True,
        lock_timeout: float | None = None,
        write_attempts: int = WRITE_ATTEMPTS,
    ) -> None:
        if isinstance(write_attempts, bool) or not isinstance(write_attempts, int) or write_attempts < 1:
            raise InvalidInputError(f"write_attempts must be a positive integer, got {write_attempts!r}.")
        self.write_attempts = write_attempts
        super().__init__(url, pool_size=pool_size, lock_timeout=lock_timeout)
        try:
            if setup:
                self.setup()
            else:
                self.read(self._check_schema_cursor)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.location!r})"

    # ------------------------------------------------------------------ schema
    def setup(self) -> None:
        """Create the ``hiermem`` schema when it is absent, else check it (safe to call any time, from
        any number of processes at once).

        Raises:
            PersistenceError: the database has a ``hiermem`` schema that is not a hiermem store, or
                the user may not create it.
            VersionMismatchError: the schema has another version.
        """
        with self.writing("set up the schema in", lock=0) as cur:
            if self._check_schema_cursor(cur, missing_ok=True, upgrade=True):
                return
            for stmt in _DDL:
                cur.execute(stmt)
            cur.execute(f"INSERT INTO {SCHEMA}.version (version) VALUES (%s)", (SCHEMA_VERSION,))

    def _check_schema_cursor(
        self, cur: psycopg.Cursor[Any], missing_ok: bool = False, upgrade: bool = False
    ) -> bool:
        """Check the schema; returns whether it exists (raises when it is missing and not ``missing_ok``).
        A version-1 schema is upgraded when ``upgrade`` (in a write transaction), else refused."""
        cur.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (SCHEMA,),
        )
        rels = {str(name): str(kind) for name, kind in cur.fetchall()}
        if not rels:
            if missing_ok:
                return False
            raise PersistenceError(
                f"{self.location} has no hiermem schema yet; open it with setup=True or call setup() first."
            )
        not_ours = (
            f"The database {self.location} has a schema {SCHEMA!r} that is not a hiermem store; use another "
            f"database, or drop that schema if it is a leftover"
        )
        if "version" not in rels:
            raise PersistenceError(f"{not_ours} (it has no version table).")
        cur.execute(f"SELECT version FROM {SCHEMA}.version")
        versions = [r[0] for r in cur.fetchall()]
        if len(versions) != 1 or not isinstance(versions[0], int):
            raise PersistenceError(f"{not_ours} (its version table holds {versions!r}).")
        version = versions[0]
        if version not in (1, SCHEMA_VERSION):
            raise VersionMismatchError(
                f"The hiermem schema of {self.location} has version {version}; this hiermem reads "
                f"version {SCHEMA_VERSION}. Use the hiermem version that created it, or another database."
            )
        tables = _TABLES
        if version == 1 and pg_prune.TABLE not in rels:  # version 1 had no registrations table
            tables = {t: c for t, c in _TABLES.items() if t != pg_prune.TABLE}
        extra = sorted(n for n, k in rels.items() if n not in tables or k not in ("r", "p"))
        if extra:
            raise PersistenceError(f"{not_ours} (unexpected relations {', '.join(extra)}).")
        cur.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY table_name, ordinal_position",
            (SCHEMA,),
        )
        cols: dict[str, list[str]] = {}
        for table, col in cur.fetchall():
            cols.setdefault(str(table), []).append(str(col))
        for table, want in tables.items():
            if tuple(cols.get(table, ())) != want:
                raise PersistenceError(
                    f"{not_ours} (table {table!r} has columns {tuple(cols.get(table, ()))}, expected {want})."
                )
        cur.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (SCHEMA,),
        )
        triggers = [r[0] for r in cur.fetchall()]
        if triggers:
            raise PersistenceError(f"{not_ours} (refusing a store with triggers: {', '.join(triggers)}).")
        if version != SCHEMA_VERSION:
            if not upgrade:
                raise VersionMismatchError(
                    f"The hiermem schema of {self.location} has version {version}; open it once with "
                    f"setup=True (the default) to upgrade it to version {SCHEMA_VERSION}."
                )
            pg_prune.upgrade(cur, SCHEMA, version, SCHEMA_VERSION)
        return True

    # ------------------------------------------------------------------ namespaces
    def namespace_id(self, ns: NamespaceLike, *, create: bool = True) -> int | None:
        """The id of namespace ``ns`` (registered when new and ``create``), or ``None``.

        Raises:
            InvalidInputError: a bad namespace.
            PersistenceError: the database failed.
        """
        key = namespace_key(ns)
        if create:
            with self.writing("register the namespace in") as cur:
                cur.execute(
                    f"INSERT INTO {SCHEMA}.namespaces (name) VALUES (%s) ON CONFLICT (name) DO NOTHING",
                    (key,),
                )
        row = self.read(
            lambda cur: cur.execute(f"SELECT id FROM {SCHEMA}.namespaces WHERE name = %s", (key,)).fetchone()
        )
        return None if row is None else int(row[0])

    def has_namespace(self, ns: NamespaceLike) -> bool:
        """Whether ``ns`` holds a memory (it has been written at least once)."""
        key = namespace_key(ns)
        row = self.read(
            lambda cur: cur.execute(
                f"SELECT 1 FROM {SCHEMA}.namespaces n WHERE n.name = %s AND EXISTS "
                f"(SELECT 1 FROM {SCHEMA}.meta m WHERE m.ns = n.id)",
                (key,),
            ).fetchone()
        )
        return row is not None

    def namespaces(
        self, on_invalid: Callable[[str, PersistenceError], None] | None = None
    ) -> list[Namespace]:
        """Every namespace that holds a memory, sorted.

        Args:
            on_invalid: called with a description of the row and the error for each namespace row
                whose name cannot be read back (a tampered row); that row is then left out. Default
                ``None``: such a row raises.

        Raises:
            PersistenceError: the database failed; without ``on_invalid``, a malformed namespace name.
        """
        rows = self.read(
            lambda cur: cur.execute(
                f"SELECT n.name FROM {SCHEMA}.namespaces n WHERE EXISTS "
                f"(SELECT 1 FROM {SCHEMA}.meta m WHERE m.ns = n.id)"
            ).fetchall()
        )
        out = []
        for (name,) in rows:
            try:
                out.append(normalize_namespace(json.loads(name)))
            except (TypeError, ValueError, InvalidInputError) as e:
                err = PersistenceError(f"{self.location} holds a malformed namespace name {name!r}: {e}")
                if on_invalid is None:
                    raise err from None
                on_invalid(f"{self.location} namespace row {name!r}", err)
        return sorted(out)

    def drop_namespace(self, ns: NamespaceLike) -> bool:
        """Delete namespace ``ns`` and every row of its memory, under its writer lock.

        Returns:
            Whether it existed.

        Raises:
            PersistenceError: the database failed (nothing is deleted).
        """
        nid = self.namespace_id(ns, create=False)
        if nid is None:
            return False
        with self.writing("delete the namespace from", lock=nid, namespace=normalize_namespace(ns)) as cur:
            cur.execute(f"DELETE FROM {SCHEMA}.namespaces WHERE id = %s", (nid,))
            return cur.rowcount > 0


class _Snapshot:
    """Rows read for a catch-up: ``full`` (reload everything) or the changes since a sequence."""

    def __init__(self) -> None:
        self.seq = 0
        self.full = False
        self.meta: list[Any] = []
        self.nodes: list[Any] = []
        self.vectors: list[Any] = []
        self.removed: list[int] = []


class PostgresStore(Store):
    """The memory of one namespace of a PostgreSQL database (see the module docstring).

    Args:
        database: a :class:`PostgresDatabase`, or a ``postgresql://`` URL (the store then owns a
            database object of its own and closes it with the store).
        namespace: a string or a tuple of strings, default ``("default",)``.

    Raises:
        InvalidInputError: a malformed URL or namespace.
        PersistenceError: the server cannot be reached, or the database is not a hiermem store.
        VersionMismatchError: the schema has another version.
    """

    FORMAT = FORMAT

    def __init__(self, database: PostgresDatabase | str, namespace: NamespaceLike = ("default",)) -> None:
        self.namespace = normalize_namespace(namespace)
        self._owns_db = not isinstance(database, PostgresDatabase)
        self.db = PostgresDatabase(database) if isinstance(database, str) else database
        self.location = f"{self.db.location} namespace {list(self.namespace)!r}"
        self._in = f"namespace {list(self.namespace)!r} in"  # for "Could not <verb> <_in> <url>"
        self._seq = 0
        self._stale = True  # nothing loaded yet (or a commit's outcome is unknown): reload in full
        self._writes = NamespaceWrites(self.db, self.namespace, self._in)
        self._contended_until = 0.0  # until then, writes are computed under the lock (see begin)
        self._ns = -1  # the namespace's id; registered by the first write (initialize)
        try:
            self._lookup()
        except BaseException:
            self.close()
            raise

    def _lookup(self, create: bool = False) -> None:
        if self._ns < 0:
            nid = self.db.namespace_id(self.namespace, create=create)
            if nid is not None:
                self._ns = nid
            elif create:
                raise PersistenceError(f"Could not register {self.location}; open it again.")

    def __repr__(self) -> str:
        return f"PostgresStore({self.db.location!r}, namespace={self.namespace!r})"

    @property
    def url(self) -> str:
        """The database URL without its password."""
        return self.db.location

    @property
    def seq(self) -> int:
        """Number of the last committed write of the namespace that the memory reflects."""
        return self._seq

    def close(self) -> None:
        """Close the database when this store opened it (idempotent)."""
        self.abort()
        pg_prune.leave(self)
        if self._owns_db and getattr(self, "db", None) is not None:
            self.db.close()

    # ------------------------------------------------------------------ reading
    def _ns_row(self, cur: psycopg.Cursor[Any]) -> tuple[int, int]:
        row = cur.execute(
            f"SELECT seq, reset_seq FROM {SCHEMA}.namespaces WHERE id = %s", (self._ns,)
        ).fetchone()
        if row is None:
            raise NamespaceDeletedError(
                f"{self.location} was deleted (delete_namespace) by another process; open it again to start "
                "a new memory there."
            )
        return int(row[0]), int(row[1])

    def _meta_rows(self, cur: psycopg.Cursor[Any]) -> list[Any]:
        return cur.execute(f"SELECT key, value FROM {SCHEMA}.meta WHERE ns = %s", (self._ns,)).fetchall()

    def meta(self) -> dict[str, Any] | None:
        """The stored metadata of the namespace, or ``None`` when it holds no memory yet.

        Raises:
            PersistenceError: malformed metadata or an unreachable database.
            VersionMismatchError: another layout version.
        """
        self._lookup()
        if self._ns < 0:
            return None
        rows = self.db.read(self._meta_rows, f"read {self._in}", namespace=self.namespace)
        return decode_meta(rows, self.location, FORMAT)

    def _read_all(self, cur: psycopg.Cursor[Any], snap: _Snapshot) -> None:
        snap.full = True
        snap.meta = self._meta_rows(cur)
        snap.nodes = cur.execute(
            f"SELECT {_NODE_COLS} FROM {SCHEMA}.nodes WHERE ns = %s ORDER BY id", (self._ns,)
        ).fetchall()
        snap.vectors = cur.execute(
            f"SELECT id, vec FROM {SCHEMA}.vectors WHERE ns = %s", (self._ns,)
        ).fetchall()

    def _changes(self, cur: psycopg.Cursor[Any]) -> _Snapshot | None:
        """The rows changed since :attr:`seq` (``None`` when nothing changed)."""
        snap = _Snapshot()
        seq, reset = self._ns_row(cur)
        if seq == self._seq and not self._stale:
            return None
        snap.seq = seq
        if self._stale or reset > self._seq or seq < self._seq:
            self._read_all(cur, snap)
            return snap
        since = (self._ns, self._seq)
        snap.meta = self._meta_rows(cur)
        snap.nodes = cur.execute(
            f"SELECT {_NODE_COLS} FROM {SCHEMA}.nodes WHERE ns = %s AND seq > %s ORDER BY id", since
        ).fetchall()
        snap.vectors = cur.execute(
            f"SELECT id, vec FROM {SCHEMA}.vectors WHERE ns = %s AND seq > %s", since
        ).fetchall()
        snap.removed = [
            int(r[0])
            for r in cur.execute(
                f"SELECT id FROM {SCHEMA}.removed WHERE ns = %s AND seq > %s", since
            ).fetchall()
        ]
        return snap

    def _apply(self, mem: HierarchicalMemory, snap: _Snapshot | None) -> None:
        if snap is None:
            return
        meta = decode_meta(snap.meta, self.location, FORMAT)
        if meta is None:
            if snap.nodes or snap.vectors:
                raise PersistenceError(f"The store {self.location} is corrupt: rows without metadata.")
            if mem._store.nodes:  # the namespace holds nothing yet a memory does: never silently empty it
                raise PersistenceError(f"{self.location} holds no memory any more; open it again.")
            self._seq, self._stale = snap.seq, False
            return
        if meta["kind"] != mem.kind:
            raise PersistenceError(
                f"{self.location} now holds a {meta['kind']} memory, not a {mem.kind} one; open it again."
            )
        self._stale = True  # until the memory holds the snapshot
        if snap.full:
            restore_rows(mem, meta, snap.nodes, snap.vectors, self.location)
        else:
            apply_changes(mem, meta, snap.nodes, snap.removed, snap.vectors, self.location)
        self._seq, self._stale = snap.seq, False

    def load_into(self, mem: HierarchicalMemory) -> None:
        """Rebuild ``mem`` from one consistent snapshot of the namespace.

        Raises:
            PersistenceError: the rows are malformed, or the database cannot be read.
        """

        def read(cur: psycopg.Cursor[Any]) -> _Snapshot:
            snap = _Snapshot()
            snap.seq, _ = self._ns_row(cur)
            self._read_all(cur, snap)
            return snap

        snap = self.db.read(read, f"load {self._in}", namespace=self.namespace)
        if decode_meta(snap.meta, self.location, FORMAT) is None:
            raise PersistenceError(f"{self.location} holds no memory yet.")
        self._stale = True
        self._apply(mem, snap)
        pg_prune.caught_up(self)

    def sync(self, mem: HierarchicalMemory) -> None:
        """Apply the rows other processes committed since :attr:`seq` (a read-only snapshot: no advisory
        lock, ``ACCESS SHARE`` on the tables it reads, each waited for at most the lock timeout).

        Raises:
            NamespaceBusyError: another session held a conflicting table lock (``LOCK TABLE``,
                ``VACUUM FULL``, ``ALTER TABLE``) for longer than the lock timeout (``mem`` is unchanged).
            PersistenceError: the database cannot be read (``mem`` is unchanged).
        """
        self._apply(mem, self.db.read(self._changes, f"catch up with {self._in}", namespace=self.namespace))
        pg_prune.caught_up(self)  # the registration that keeps the tombstones this store needs

    # ------------------------------------------------------------------ writing
    @property
    def write_attempts(self) -> int:
        """How many times the memory computes a write that other processes' commits keep overtaking."""
        return self.db.write_attempts

    def begin(self, mem: HierarchicalMemory, exclusive: bool = False) -> None:
        """Before a write is computed: apply what other processes committed (a read-only snapshot).
        :meth:`commit` writes only if the namespace is still at the change sequence this leaves in
        :attr:`seq`.

        Args:
            mem: the memory.
            exclusive: ``False`` (a first attempt): no lock and no connection is held while the memory
                computes. ``True`` (after a conflict): first take the namespace's lock at session level
                (see :class:`~shared_core.stores.pg_writes.NamespaceWrites`) and hold it until the
                write ends, so no other writer can overtake this one. Within
                :data:`CONTENTION_WINDOW` seconds of meeting another writer, every write is exclusive.

        Raises:
            NamespaceBusyError: (exclusive) the lock was not free within the lock timeout, or the
                catch-up waited out a table lock (see :meth:`sync`; nothing is held, ``mem`` is unchanged).
            PersistenceError: the database cannot be reached (nothing is held, ``mem`` is unchanged).
        """
        self.abort()
        exclusive = exclusive or time.monotonic() < self._contended_until
        try:
            if exclusive and self._writes.hold(self._ns):  # it waited: writers still collide
                self._contended_until = time.monotonic() + CONTENTION_WINDOW
            self.sync(mem)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """The memory's write ended or failed: release the lock of an exclusive write (idempotent)."""
        self._writes.release()

    def _write_meta(self, cur: psycopg.Cursor[Any], items: dict[str, Any]) -> None:
        cur.executemany(_UPSERT_META, [(self._ns, k, dumps(v)) for k, v in items.items()])

    def commit(self, mem: HierarchicalMemory) -> None:
        """Write the change ``mem`` computed since :meth:`begin` and ``COMMIT`` (it is acknowledged then),
        unless another process committed to the namespace meanwhile.

        Raises:
            WriteConflictError: another process committed since :meth:`begin`; nothing was written (the
                memory rolls back, catches up and computes the change again).
            NamespaceBusyError: the namespace's lock was not free within the lock timeout.
            PersistenceError: the write failed (the caller asks :meth:`landed`, then rolls back).
        """
        try:
            ch = pending_changes(mem)
        except (TypeError, ValueError) as e:
            raise self.db.error(e, f"commit the change to {self._in}") from None
        ns, base = self._ns, self._seq

        def write(cur: psycopg.Cursor[Any]) -> int:
            stored, _ = self._ns_row(cur)
            if stored != base:
                self._contended_until = time.monotonic() + CONTENTION_WINDOW
                raise WriteConflictError(
                    f"Could not commit the change to {self._in} {self.db.location}: another process "
                    f"committed change {stored} to it while this process computed its change from change "
                    f"{base}. Nothing was written.",
                    namespace=self.namespace,
                )
            seq = base + 1
            if ch.gone:
                cur.executemany(
                    f"DELETE FROM {SCHEMA}.nodes WHERE ns = %s AND id = %s", [(ns, i) for i in ch.gone]
                )
                cur.executemany(_UPSERT_REMOVED, [(ns, i, seq) for i in ch.gone])
            if ch.rows:
                cur.executemany(_UPSERT_NODE, [(ns, *row, seq) for row in ch.rows])
            if ch.drop_vectors:
                cur.executemany(
                    f"DELETE FROM {SCHEMA}.vectors WHERE ns = %s AND id = %s",
                    [(ns, i) for i in ch.drop_vectors],
                )
            if ch.vectors:
                cur.executemany(_UPSERT_VECTOR, [(ns, i, blob, seq) for i, blob in ch.vectors])
            self._write_meta(cur, ch.meta)
            cur.execute(f"UPDATE {SCHEMA}.namespaces SET seq = %s WHERE id = %s", (seq, ns))
            return seq

        seq = self._writes.run(ns, "commit the change to", write)
        assert seq is not None
        self._seq = seq
        pg_prune.committed(self)  # registration and, now and then, pruning (never raises)

    def landed(self, seq: int) -> bool:
        """After :meth:`commit` or :meth:`clear` raised: whether the write was committed all the same
        (see :meth:`~shared_core.stores.pg_writes.NamespaceWrites.landed`: asked of the server with
        ``txid_status`` when its ``COMMIT`` got no reply).

        Args:
            seq: the number the caller expected the write to get (the store knows its own attempt).

        Returns:
            ``True`` when the database holds the write (:attr:`seq` then counts it), ``False`` when it
            does not.

        Raises:
            CommitUnknownError: the server cannot tell: the store reloads the namespace at its next
                catch-up, so the memory then holds what the database holds.
        """
        try:
            outcome = self._writes.landed()
        except CommitUnknownError:
            self._stale = True
            raise
        if outcome:
            self._seq = self._writes.attempt
        return outcome

    def _reset_write(self, what: str, rows: Callable[[psycopg.Cursor[Any], int], bool]) -> bool:
        """A write that replaces the whole namespace (first write, clear), under its lock."""

        def write(cur: psycopg.Cursor[Any]) -> int | None:
            seq = self._ns_row(cur)[0] + 1
            if not rows(cur, seq):
                return None
            cur.execute(
                f"UPDATE {SCHEMA}.namespaces SET seq = %s, reset_seq = %s WHERE id = %s", (seq, seq, self._ns)
            )
            return seq

        seq = self._writes.run(self._ns, what, write)
        if seq is None:
            return False
        self._seq, self._stale = seq, False
        return True

    def _delete_rows(self, cur: psycopg.Cursor[Any]) -> None:
        for table in ("nodes", "vectors", "removed"):
            cur.execute(f"DELETE FROM {SCHEMA}.{table} WHERE ns = %s", (self._ns,))

    def initialize(self, mem: HierarchicalMemory) -> bool:
        """Write the whole of ``mem`` into the namespace when it holds no memory yet.

        Returns:
            ``True`` when written; ``False`` when another process initialised the namespace first.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        try:
            rows, vrows, meta = full_rows(mem, FORMAT)
            dumps(meta)
        except (TypeError, ValueError) as e:
            raise self.db.error(e, f"write the memory to {self._in}") from None
        self._lookup(create=True)

        def write(cur: psycopg.Cursor[Any], seq: int) -> bool:
            if cur.execute(f"SELECT 1 FROM {SCHEMA}.meta WHERE ns = %s LIMIT 1", (self._ns,)).fetchone():
                return False
            self._delete_rows(cur)
            ns = self._ns
            cur.executemany(_UPSERT_NODE, [(ns, *row, seq) for row in rows])
            cur.executemany(_UPSERT_VECTOR, [(ns, i, blob, seq) for i, blob in vrows])
            self._write_meta(cur, meta)
            return True

        return self._reset_write("write the memory to", write)

    def clear(self, mem: HierarchicalMemory) -> None:
        """Forget every node and vector of the namespace; configuration and usage stay.

        Raises:
            PersistenceError: the write failed (nothing is written).
        """
        meta = cleared_meta(mem)

        def write(cur: psycopg.Cursor[Any], seq: int) -> bool:
            self._delete_rows(cur)
            self._write_meta(cur, meta)
            return True

        self._reset_write("clear", write)
