"""PostgreSQL store: one memory per namespace of one database, shared by many processes and machines.

Every process that opens a namespace holds the memory in RAM (node store and FAISS index, rebuilt from
the database on first open) and keeps it in step with the database:

- **writes** (``add``, ``delete``, ``clear``, xMemory's ``flush``) run in one database transaction
  that first takes a transaction-level advisory lock keyed by the namespace
  (``pg_advisory_xact_lock``), so writers of one namespace are serialised by the database while
  writers of different namespaces run in parallel; under the lock the process applies what the others
  committed, computes the change, writes it and commits. Acknowledged means committed: ``add`` returns
  only after ``COMMIT``.
- **reads** (``retrieve``) first apply what other processes committed since the memory's change
  sequence, in a read-only ``REPEATABLE READ`` snapshot that takes no lock, so a retrieval never waits
  for a writer (of its own namespace or another one).
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
  broken connections are dropped from the pools and the next call connects again. When a ``COMMIT``
  may or may not have reached the server, ``txid_status`` tells whether it landed.

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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

from ..types import InvalidInputError, PersistenceError, VersionMismatchError
from . import pg_prune
from .base import Store
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

try:
    import psycopg
    from psycopg import IsolationLevel
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as _e:  # pragma: no cover - depends on the installed extras
    raise InvalidInputError(
        f"The PostgreSQL store needs psycopg 3 and psycopg_pool ({_e}); install them with "
        "pip install 'hiermem[postgres]'."
    ) from None

if TYPE_CHECKING:
    from ..base import HierarchicalMemory

__all__ = ["FORMAT", "LOCK_CLASS", "SCHEMA", "SCHEMA_VERSION", "PostgresDatabase", "PostgresStore"]

T = TypeVar("T")

#: Version of the namespace metadata layout (``format``).
FORMAT = 1
#: Version of the schema (``hiermem.version``); 2 added ``readers`` (version 1 is upgraded on open).
SCHEMA_VERSION = 2
#: The PostgreSQL schema holding the tables.
SCHEMA = "hiermem"
#: First key of hiermem's advisory locks (``pg_advisory_xact_lock(LOCK_CLASS, namespace id)``; the
#: namespace id 0 guards the schema setup). ASCII "hier".
LOCK_CLASS = 0x68696572

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
_DEFAULT_TIMEOUT = 10.0


def first_line(e: BaseException) -> str:
    """The first line of an error's message (a server's message can be long)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def parse_url(url: str) -> tuple[dict[str, Any], str]:
    """The libpq parameters of ``url`` and its name for messages (without the password).

    Raises:
        InvalidInputError: the URL is malformed.
    """
    if not isinstance(url, str):
        raise InvalidInputError(f"A PostgreSQL URL is a string, got {type(url).__name__}.")
    try:
        params = conninfo_to_dict(url.strip())
    except psycopg.ProgrammingError as e:
        raise InvalidInputError(
            f"Malformed PostgreSQL URL ({first_line(e)}); write it as "
            "postgresql://user:password@host:port/dbname (see the libpq connection URI syntax)."
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not port.strip().isdigit():
            raise InvalidInputError(
                f"Malformed PostgreSQL URL: the port {port!r} is not a number; write it as "
                "postgresql://user:password@host:5432/dbname."
            )
    if "connect_timeout" in params:
        try:
            float(params["connect_timeout"])
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"Malformed PostgreSQL URL: connect_timeout={params['connect_timeout']!r} is not a number."
            ) from None
    user = params.get("user")
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    where = f"postgresql://{user + '@' if user else ''}{host}:{port}/{params.get('dbname') or ''}"
    return params, where


class PostgresDatabase:
    """A PostgreSQL database holding hiermem namespaces: the connection pools and the schema.

    Several :class:`PostgresStore` (one per namespace, e.g. those of a ``MemoryStore``) share one
    database object and its pools. Writers and readers have separate pools, so a retrieval never waits
    for a connection that a long ``add`` holds.

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/dbname`` (``?host=/socket/dir`` for a
            Unix socket; ``connect_timeout=S`` also bounds the wait for a pooled connection, default 10).
        pool_size: most connections of each pool (writers, readers), default 8.
        setup: create the schema when absent and check it (default ``True``); ``False`` only checks
            that the schema is there (call :meth:`setup` later).

    Raises:
        InvalidInputError: a malformed URL or ``pool_size``.
        PersistenceError: the server cannot be reached, refuses the login, or the database has a
            ``hiermem`` schema that is not a hiermem store.
        VersionMismatchError: the schema has another version.
    """

    def __init__(self, url: str, *, pool_size: int = 8, setup: bool = True) -> None:
        params, self.location = parse_url(url)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidInputError(f"pool_size must be a positive integer, got {pool_size!r}.")
        self.timeout = float(params.get("connect_timeout") or _DEFAULT_TIMEOUT)
        kwargs: dict[str, Any] = {}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = int(_DEFAULT_TIMEOUT)
        if "application_name" not in params:
            kwargs["application_name"] = "hiermem"
        self._url = url.strip()
        self._kwargs = kwargs
        self._pool_size = pool_size
        self._closed = False
        self._broken = False
        self._lock = threading.Lock()
        self._lent: dict[int, tuple[psycopg.Connection[Any], ConnectionPool]] = {}
        self._probe()
        self._writers, self._readers = self._new_pools()
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

    # ------------------------------------------------------------------ connections
    def _probe(self, again: bool = False) -> None:
        """Connect once, to tell an unreachable server or a refused login apart from other errors."""
        try:
            psycopg.connect(self._url, **self._kwargs).close()
        except psycopg.Error as e:
            if again:
                raise PersistenceError(
                    f"The connection to PostgreSQL at {self.location} was lost and cannot be made again "
                    f"({first_line(e)}). Check that the server is running and reachable; nothing was "
                    "changed, and the next call connects again."
                ) from None
            raise PersistenceError(
                f"Cannot connect to PostgreSQL at {self.location}: {first_line(e)}. Check that the server "
                "is running and reachable and that the URL's host, port, database name, user and password "
                "are right (create the database first, e.g. createdb)."
            ) from None

    def _new_pools(self) -> tuple[ConnectionPool, ConnectionPool]:
        common: dict[str, Any] = {
            "kwargs": self._kwargs,
            "min_size": 1,
            "max_size": self._pool_size,
            "open": False,
            "timeout": self.timeout,
            "num_workers": 1,  # connections are made rarely: at open, on growth, after a failure
        }
        writers: ConnectionPool = ConnectionPool(self._url, name="hiermem-writers", **common)
        readers: ConnectionPool = ConnectionPool(
            self._url, name="hiermem-readers", configure=_configure_reader, **common
        )
        writers.open(wait=False)
        readers.open(wait=False)
        return writers, readers

    def _pool(self, write: bool) -> ConnectionPool:
        """The pool of writers or readers; after a connection failure both pools are replaced by new
        ones once the server answers again (a pool's own reconnection waits longer and longer)."""
        old: tuple[ConnectionPool, ...] = ()
        with self._lock:
            if self._closed:
                raise PersistenceError(f"The PostgreSQL store {self.location} is closed; open it again.")
            if self._broken:
                self._probe(again=True)  # raises while the server is away: the next call tries again
                old = (self._writers, self._readers)
                self._writers, self._readers = self._new_pools()
                self._broken = False
            pool = self._writers if write else self._readers
        for p in old:
            with suppress(Exception):
                p.close(timeout=0)
        return pool

    def _getconn(self, write: bool, what: str) -> psycopg.Connection[Any]:
        pool = self._pool(write)
        try:
            conn = pool.getconn(timeout=self.timeout)
        except PoolTimeout as e:
            self._broken = True
            raise PersistenceError(
                f"Could not {what} {self.location}: no connection to PostgreSQL within {self.timeout:g} s "
                f"({first_line(e)}). Check that the server is running and reachable; nothing was changed, "
                "and the next call connects again."
            ) from None
        except psycopg.Error as e:
            raise PersistenceError(f"Could not {what} {self.location}: {first_line(e)}.") from None
        with self._lock:
            self._lent[id(conn)] = (conn, pool)
        return conn

    def _putconn(self, conn: psycopg.Connection[Any], *, rollback: bool) -> None:
        """Give a connection back to the pool it came from (rolled back first when asked)."""
        if rollback and not conn.closed:
            with suppress(Exception):
                conn.rollback()
        with self._lock:
            _, pool = self._lent.pop(id(conn), (conn, None))
        try:
            if pool is None:
                raise ValueError("unknown connection")
            pool.putconn(conn)
        except Exception:
            with suppress(Exception):
                conn.close()

    def _recover(self) -> None:
        """After a connection failed: the next call replaces the pools (see :meth:`_pool`)."""
        self._broken = True

    def error(self, e: BaseException, what: str) -> PersistenceError:
        """The :class:`PersistenceError` for a database error ``e`` met while trying to ``what``."""
        if isinstance(e, PersistenceError):
            return e
        if isinstance(e, psycopg.OperationalError):
            self._recover()
            return PersistenceError(
                f"Could not {what} {self.location}: the connection to PostgreSQL failed "
                f"({first_line(e)}). Nothing was changed; the next call connects again."
            )
        if isinstance(e, psycopg.Error):
            return PersistenceError(f"Could not {what} {self.location}: PostgreSQL says {first_line(e)}.")
        if isinstance(e, (TypeError, ValueError)):
            return PersistenceError(
                f"Could not {what} {self.location}: the memory holds data that is not JSON-serialisable "
                f"({e}). Nothing was changed."
            )
        return PersistenceError(f"Could not {what} {self.location}: {type(e).__name__}: {e}")

    def read(self, fn: Callable[[psycopg.Cursor[Any]], T], what: str = "read") -> T:
        """Run ``fn(cursor)`` in a read-only ``REPEATABLE READ`` transaction (one snapshot, no locks).

        A connection found broken (e.g. after a server restart) is replaced and ``fn`` run once more.

        Raises:
            PersistenceError: the database cannot be read.
        """
        for attempt in (0, 1):
            conn = self._getconn(False, what)
            try:
                with conn.transaction(), conn.cursor() as cur:
                    out = fn(cur)
            except BaseException as e:
                broken = conn.broken or conn.closed
                self._putconn(conn, rollback=True)
                if isinstance(e, psycopg.OperationalError) and broken and attempt == 0:
                    self._recover()
                    continue
                if isinstance(e, Exception):
                    raise self.error(e, what) from None
                raise
            self._putconn(conn, rollback=False)
            return out
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def writing(self, what: str, lock: int | None = None) -> Iterator[psycopg.Cursor[Any]]:
        """A write transaction (``READ COMMITTED``), committed when the block ends without error.

        Args:
            what: what the transaction does, for error messages.
            lock: a namespace id whose advisory lock the transaction takes first, or ``None``.

        Raises:
            PersistenceError: the database failed (the transaction is rolled back).
        """
        conn = self._getconn(True, what)
        try:
            with conn.cursor() as cur:
                if lock is not None:
                    cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, lock))
                yield cur
            conn.commit()
        except BaseException as e:
            self._putconn(conn, rollback=True)
            if isinstance(e, Exception):
                raise self.error(e, what) from None
            raise
        self._putconn(conn, rollback=False)

    def write_connection(self, what: str) -> psycopg.Connection[Any]:
        """A writer connection for a transaction the caller ends (:meth:`release`)."""
        return self._getconn(True, what)

    def release(self, conn: psycopg.Connection[Any], *, rollback: bool) -> None:
        """Give back a connection of :meth:`write_connection` (rolled back first when asked)."""
        self._putconn(conn, rollback=rollback)

    def close(self) -> None:
        """Close both pools (idempotent). Open stores of this database fail from then on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pool in (getattr(self, "_writers", None), getattr(self, "_readers", None)):
            if pool is not None:
                with suppress(Exception):
                    pool.close(timeout=1.0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

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

    def namespaces(self) -> list[Namespace]:
        """Every namespace that holds a memory, sorted.

        Raises:
            PersistenceError: the database failed or holds a malformed namespace name.
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
                raise PersistenceError(
                    f"{self.location} holds a malformed namespace name {name!r}: {e}"
                ) from None
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
        with self.writing("delete the namespace from", lock=nid) as cur:
            cur.execute(f"DELETE FROM {SCHEMA}.namespaces WHERE id = %s", (nid,))
            return cur.rowcount > 0


def _configure_reader(conn: psycopg.Connection[Any]) -> None:
    conn.isolation_level = IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    conn.commit()


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
        self._stale = True  # nothing loaded yet: the first catch-up is a full load
        self._conn: psycopg.Connection[Any] | None = None  # the open write transaction
        self._xid: int | None = None  # its transaction id, to ask txid_status after a failure
        self._attempt = 0  # the sequence number the open write is to get
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
        """Roll back an open write, and close the database when this store opened it (idempotent)."""
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
        rows = self.db.read(self._meta_rows, f"read {self._in}")
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

        snap = self.db.read(read, f"load {self._in}")
        if decode_meta(snap.meta, self.location, FORMAT) is None:
            raise PersistenceError(f"{self.location} holds no memory yet.")
        self._stale = True
        self._apply(mem, snap)
        pg_prune.caught_up(self)

    def sync(self, mem: HierarchicalMemory) -> None:
        """Apply the rows other processes committed since :attr:`seq` (read-only snapshot, no lock).

        Raises:
            PersistenceError: the database cannot be read (``mem`` is unchanged).
        """
        self._apply(mem, self.db.read(self._changes, f"catch up with {self._in}"))
        pg_prune.caught_up(self)  # the registration that keeps the tombstones this store needs

    # ------------------------------------------------------------------ writing
    def begin(self, mem: HierarchicalMemory) -> None:
        """Open the write transaction: take the namespace's advisory lock (waiting for the writer that
        holds it), then apply what other processes committed.

        Raises:
            PersistenceError: the database cannot be reached (nothing is held, ``mem`` is unchanged).
        """
        self.abort()
        for attempt in (0, 1):
            conn = self.db.write_connection(f"write to {self._in}")
            try:
                cur = conn.cursor()
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s), txid_current()", (LOCK_CLASS, self._ns))
                xid = int(cur.fetchone()[1])  # type: ignore[index]
                snap = self._changes(cur)
                cur.close()
                self._apply(mem, snap)
            except BaseException as e:
                broken = conn.broken or conn.closed
                self.db.release(conn, rollback=True)
                if isinstance(e, psycopg.OperationalError) and broken and attempt == 0:
                    self.db._recover()
                    continue
                if isinstance(e, Exception):
                    raise self.db.error(e, f"write to {self._in}") from None
                raise
            self._conn, self._xid = conn, xid
            return

    def abort(self) -> None:
        """Roll back the open write transaction and release its lock (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self.db.release(conn, rollback=True)

    def _write_meta(self, cur: psycopg.Cursor[Any], items: dict[str, Any]) -> None:
        cur.executemany(_UPSERT_META, [(self._ns, k, dumps(v)) for k, v in items.items()])

    def commit(self, mem: HierarchicalMemory) -> None:
        """Write the open transaction of ``mem`` and ``COMMIT`` (the change is acknowledged then).

        Raises:
            PersistenceError: no write transaction is open, or the write failed (rolled back; the
                caller rolls the memory back).
        """
        conn = self._conn
        if conn is None:
            raise PersistenceError(f"No write transaction is open on {self.location} (an internal error).")
        ns, seq = self._ns, self._seq + 1
        self._attempt = seq
        try:
            ch = pending_changes(mem)
            with conn.cursor() as cur:
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
            conn.commit()
        except BaseException as e:
            self.abort()
            if isinstance(e, Exception):
                raise self.db.error(e, f"commit the change to {self._in}") from None
            raise
        self._conn = None
        self.db.release(conn, rollback=False)
        self._seq = seq
        pg_prune.committed(self)  # registration and, now and then, pruning (never raises)

    def landed(self, seq: int) -> bool:
        """After :meth:`commit` or :meth:`clear` raised: whether the write was committed all the same,
        asked of the server with ``txid_status`` (on a fresh connection). Any failure to find out
        counts as not landed: the memory then rolls back and catches the change up on its next call.

        Args:
            seq: the number the caller expected the write to get (the store knows its own attempt).

        Returns:
            ``True`` when the database holds the write.
        """
        self.abort()
        xid, self._xid = self._xid, None
        if xid is None:
            return False
        try:
            status = self.db.read(lambda cur: cur.execute("SELECT txid_status(%s)", (xid,)).fetchone())
        except Exception:
            return False
        if status is None or status[0] != "committed":
            return False
        self._seq = self._attempt
        return True

    def _reset_write(self, what: str, rows: Callable[[psycopg.Cursor[Any], int], bool]) -> bool:
        """A write that replaces the whole namespace (first write, clear), under its lock."""
        self.abort()
        conn = self.db.write_connection(f"{what} {self._in}")
        try:
            cur = conn.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s), txid_current()", (LOCK_CLASS, self._ns))
            self._xid = int(cur.fetchone()[1])  # type: ignore[index]
            seq = self._ns_row(cur)[0] + 1
            self._attempt = seq
            if not rows(cur, seq):
                cur.close()
                self.db.release(conn, rollback=True)
                return False
            cur.execute(
                f"UPDATE {SCHEMA}.namespaces SET seq = %s, reset_seq = %s WHERE id = %s", (seq, seq, self._ns)
            )
            cur.close()
            conn.commit()
        except BaseException as e:
            self.db.release(conn, rollback=True)
            if isinstance(e, Exception):
                raise self.db.error(e, f"{what} {self._in}") from None
            raise
        self.db.release(conn, rollback=False)
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
