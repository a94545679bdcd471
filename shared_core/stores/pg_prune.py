"""Pruning the PostgreSQL store's ``removed`` tombstones: what every live process has caught up past.

**The problem.** A process catches up with a namespace incrementally (:mod:`shared_core.stores.postgres`):
it reads the node and vector rows whose ``seq`` is above the change sequence its memory reflects, and
the ids in ``removed`` (one row per removed node, a *tombstone*) above it. A tombstone is of no use to a
process that is past it, yet without pruning the table only grows: one row for every node any write
ever removed.

**Registrations** (table ``hiermem.readers``, one row ``(id, ns, seq, heartbeat)`` per open
:class:`~shared_core.stores.postgres.PostgresStore`): ``seq`` is a change sequence the store's memory
has reached (the row is written only after the memory applied it, so it is never ahead) and
``heartbeat`` the server's time of that write. A store writes its row after a load, a catch-up or a
commit, at most once per :attr:`Registry.heartbeat_interval` seconds (so the row may lag, which only
keeps tombstones longer), and deletes it when closed. The rows of a deleted namespace go with it
(``ON DELETE CASCADE``).

**Liveness.** A registration whose heartbeat is older than :attr:`Registry.dead_after` seconds (by the
server's clock: the machines' clocks do not matter) belongs to a process that crashed, lost its
connection or has been idle that long. It is considered dead and deleted by the next pruning.

**Pruning.** After a commit, at most once per :attr:`Registry.prune_interval` seconds per store, the
committing process runs one short transaction: it *tries* the namespace's advisory lock (the writers'
lock: when a writer holds it, the pruning is skipped until a later commit, so it never waits for a
writer's model calls, and it never runs inside one, the commit being over), writes its own registration,
deletes the namespace's dead registrations, takes the horizon = the least ``seq`` of the live
registrations (its own included), deletes the tombstones with ``seq <= horizon`` and raises the
namespace's ``reset_seq`` to the highest ``seq`` it deleted.

**The watermark is ``reset_seq``.** A process whose memory is behind ``reset_seq`` reloads the
namespace fully at its next catch-up instead of applying changes: the rule a ``clear`` (which deletes
every tombstone of its namespace) already relied on. The deletion and the new watermark commit in one
transaction, and a catch-up reads the watermark and the tombstones in one snapshot, so a process sees
either every tombstone it needs or a watermark above its sequence. A process that was considered dead
(its tombstones may be gone) therefore reloads, whatever the clocks, the heartbeats or a lost
registration say: registrations decide only how often a reload happens, never whether a catch-up is
right. (Processes of hiermem versions before the ``readers`` table follow the same rule.)

**Bound.** Every pruning deletes the tombstones that every live registration is past; a registration
stays live only while its process is active. So the table holds about the tombstones of the last
``dead_after`` seconds of writes, plus those written since the last pruning, whatever the history.

**Costs.** A process idle for longer than ``dead_after`` seconds may reload its namespaces on its next
call. Registrations and pruning use one connection of their own per
:class:`~shared_core.stores.postgres.PostgresDatabase` (autocommit, opened on first use, closed with the
last registration), never the pools, so a retrieval never waits for a writer's connection because of
them; like every hiermem connection it has the database object's lock timeout, so a table lock held by
another session (``LOCK TABLE``, ``VACUUM FULL``) delays a call by at most that. They are best effort:
when that connection is busy (another thread uses it) or fails (a lock waited out included), the step
is skipped and tried on a later call; no call fails because of them.

**Schema.** Version 2 of the ``hiermem`` schema added ``readers``; :func:`upgrade` brings a version-1
schema to version 2 in place when a process opens it with ``setup`` (the default).
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

from .pg_connection import LOCK_CLASS, SCHEMA, set_lock_timeout

if TYPE_CHECKING:  # psycopg is imported when used: postgres.py reports a missing extra itself
    import psycopg

    from .postgres import PostgresDatabase, PostgresStore

__all__ = [
    "COLUMNS",
    "DEAD_AFTER",
    "HEARTBEAT_INTERVAL",
    "PRUNE_INTERVAL",
    "TABLE",
    "Registry",
    "caught_up",
    "committed",
    "ddl",
    "leave",
    "registry_of",
    "shutdown",
    "upgrade",
]

T = TypeVar("T")

#: The registrations table and its columns.
TABLE = "readers"
COLUMNS = ("id", "ns", "seq", "heartbeat")
#: Defaults of :class:`Registry`'s rates and bound, in seconds.
HEARTBEAT_INTERVAL = 10.0
PRUNE_INTERVAL = 30.0
DEAD_AFTER = 900.0
#: How long closing waits for the registrations' connection when another thread uses it.
_CLOSE_WAIT = 5.0


def ddl(schema: str) -> tuple[str, ...]:
    """The statements creating the registrations table in ``schema`` (idempotent)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {schema}.{TABLE} (id bigserial PRIMARY KEY, ns integer NOT NULL "
        f"REFERENCES {schema}.namespaces (id) ON DELETE CASCADE, seq bigint NOT NULL, "
        "heartbeat timestamptz NOT NULL DEFAULT now())",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_ns ON {schema}.{TABLE} (ns, seq)",
    )


def upgrade(cur: psycopg.Cursor[Any], schema: str, version: int, to: int) -> None:
    """Bring a checked hiermem schema of an older ``version`` to version ``to``, inside the caller's
    (setup) transaction. Version 2 added the registrations table."""
    if version < 2 <= to:
        for stmt in ddl(schema):
            cur.execute(stmt)
    cur.execute(f"UPDATE {schema}.version SET version = %s", (to,))


class _Registration:
    """One store's registration: the row id (``None`` until written) and when it last did what."""

    __slots__ = ("beat", "id", "ns", "pruned")

    def __init__(self, ns: int) -> None:
        self.ns = ns
        self.id: int | None = None
        self.beat = -math.inf  # time.monotonic() of the last heartbeat written (or failed)
        self.pruned = -math.inf  # ... of the last pruning


class Registry:
    """The registrations and pruning of one :class:`PostgresDatabase` (see the module docstring).

    Attributes:
        heartbeat_interval: least seconds between two writes of one store's registration.
        prune_interval: least seconds between two prunings by one store (after its commits).
        dead_after: seconds after which a registration's heartbeat is too old: the process is dead.
        prunings: prunings run; ``pruned``: tombstones they deleted; ``errors`` / ``last_error``:
            failed steps (for diagnostics and tests).
    """

    heartbeat_interval: float = HEARTBEAT_INTERVAL
    prune_interval: float = PRUNE_INTERVAL
    dead_after: float = DEAD_AFTER

    def __init__(self, db: PostgresDatabase) -> None:

        self._schema = SCHEMA
        self._lock_class = LOCK_CLASS
        self._url: str = db._url
        self._kwargs: dict[str, Any] = dict(db._kwargs)
        self._lock_timeout = db.lock_timeout
        self._db = weakref.ref(db)  # never a strong reference: the registry lives as long as the db
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._retry_at = 0.0
        self.ids: set[int] = set()  # the registrations this process holds
        self.prunings = 0
        self.pruned = 0
        self.errors = 0
        self.last_error = ""

    # ------------------------------------------------------------------ the connection
    def _connection(self) -> psycopg.Connection[Any]:
        import psycopg

        if self._pid != os.getpid():  # a forked child: the parent's socket is not ours to use or close
            self._conn, self._pid = None, os.getpid()
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = psycopg.connect(self._url, autocommit=True, **self._kwargs)
            try:
                set_lock_timeout(conn, self._lock_timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            with suppress(Exception):
                conn.close()

    def run(self, fn: Callable[[psycopg.Cursor[Any]], T], *, wait: bool = False) -> tuple[str, T | None]:
        """Run ``fn(cursor)`` in one transaction of the registry's connection.

        Returns:
            ``("ok", result)``; ``("skipped", None)`` when the connection is busy (and ``wait`` is
            false), the registry or its database is closed, or the server failed a moment ago;
            ``("failed", None)`` when ``fn`` failed (counted in :attr:`errors`; rolled back).
        """
        db = self._db()
        if self._closed or db is None or db.closed:
            return "skipped", None
        if not (self._lock.acquire(timeout=_CLOSE_WAIT) if wait else self._lock.acquire(blocking=False)):
            return "skipped", None
        try:
            if self._closed or time.monotonic() < self._retry_at:
                return "skipped", None
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                return "ok", fn(cur)
        except Exception as e:
            import psycopg

            self.errors += 1
            self.last_error = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if isinstance(e, psycopg.OperationalError) or self._conn is None or self._conn.broken:
                self._discard()  # the server is away: do not try again on every call
                self._retry_at = time.monotonic() + min(self.heartbeat_interval, 5.0)
            return "failed", None
        except BaseException:
            self._discard()  # interrupted mid-statement: the connection's state is unknown
            raise
        finally:
            if self._closed:
                self._discard()
            self._lock.release()

    def close(self) -> None:
        """Close the connection (idempotent); the registry does nothing after this."""
        self._closed = True
        if self._lock.acquire(timeout=_CLOSE_WAIT):
            try:
                self._discard()
            finally:
                self._lock.release()

    # ------------------------------------------------------------------ the steps
    def _beat(self, cur: psycopg.Cursor[Any], reg: _Registration, seq: int) -> None:
        """Write ``reg``'s row: this store has reached ``seq`` now (registered again when its row was
        deleted as dead)."""
        table = f"{self._schema}.{TABLE}"
        if reg.id is not None:
            cur.execute(
                f"UPDATE {table} SET seq = %s, heartbeat = now() WHERE id = %s AND ns = %s",
                (seq, reg.id, reg.ns),
            )
            if cur.rowcount:
                return
            self.ids.discard(reg.id)
        row = cur.execute(
            f"INSERT INTO {table} (ns, seq) VALUES (%s, %s) RETURNING id", (reg.ns, seq)
        ).fetchone()
        reg.id = int(row[0])  # type: ignore[index]
        self.ids.add(reg.id)

    def _prune(self, cur: psycopg.Cursor[Any], ns: int) -> int | None:
        """Prune namespace ``ns`` when no writer holds its lock; returns the tombstones deleted (``None``
        when skipped)."""
        s = self._schema
        got = cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (self._lock_class, ns)).fetchone()
        if not got or not got[0]:
            return None
        cur.execute(
            f"DELETE FROM {s}.{TABLE} WHERE ns = %s AND heartbeat < now() - make_interval(secs => %s)",
            (ns, float(self.dead_after)),
        )
        row = cur.execute(
            f"SELECT n.seq, (SELECT min(r.seq) FROM {s}.{TABLE} r WHERE r.ns = n.id) "
            f"FROM {s}.namespaces n WHERE n.id = %s",
            (ns,),
        ).fetchone()
        if row is None:  # deleted meanwhile
            return None
        horizon = int(row[0]) if row[1] is None else min(int(row[0]), int(row[1]))
        top, count = cur.execute(
            f"WITH gone AS (DELETE FROM {s}.removed WHERE ns = %s AND seq <= %s RETURNING seq) "
            "SELECT max(seq), count(*) FROM gone",
            (ns, horizon),
        ).fetchone()  # type: ignore[misc]
        if top is not None:
            cur.execute(
                f"UPDATE {s}.namespaces SET reset_seq = GREATEST(reset_seq, %s) WHERE id = %s", (int(top), ns)
            )
        return int(count)

    def note(self, store: PostgresStore, *, wrote: bool) -> None:
        """``store``'s memory reflects its namespace up to ``store.seq``: write its registration when
        due, and prune the namespace when ``wrote`` (after a commit) and due. Never raises."""
        ns, seq = store._ns, store._seq
        if ns < 0 or store._stale:
            return
        reg: _Registration | None = getattr(store, "_registration", None)
        if reg is None or reg.ns != ns:
            reg = _Registration(ns)
            store._registration = reg  # type: ignore[attr-defined]
        now = time.monotonic()
        prune = wrote and now - reg.pruned >= self.prune_interval
        if not prune and reg.id is not None and now - reg.beat < self.heartbeat_interval:
            return

        def step(cur: psycopg.Cursor[Any]) -> int | None:
            self._beat(cur, reg, seq)
            return self._prune(cur, ns) if prune else None

        status, deleted = self.run(step)
        if status == "skipped":  # busy or closed: the next call tries again
            return
        reg.beat = now  # done, or failed (e.g. the namespace was just deleted): not again at once
        if prune:
            reg.pruned = now
        if deleted is not None:
            self.prunings += 1
            self.pruned += deleted

    def forget(self, store: PostgresStore) -> None:
        """Delete ``store``'s registration (it is closing)."""
        reg: _Registration | None = store.__dict__.pop("_registration", None)
        if reg is None or reg.id is None:
            return
        rid = reg.id
        self.ids.discard(rid)
        self.run(
            lambda cur: cur.execute(f"DELETE FROM {self._schema}.{TABLE} WHERE id = %s", (rid,)), wait=True
        )


# --------------------------------------------------------------------------- one registry per database
_registries: weakref.WeakKeyDictionary[PostgresDatabase, Registry] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def registry_of(db: PostgresDatabase, *, create: bool = True) -> Registry | None:
    """The registry of ``db`` (made on first use unless ``create`` is false; ``None`` once ``db`` is
    closed)."""
    with _guard:
        reg = _registries.get(db)
        if reg is None and create and not db.closed:
            reg = _registries[db] = Registry(db)
            weakref.finalize(db, reg.close)
        return reg


def shutdown(db: PostgresDatabase) -> None:
    """Close ``db``'s registry (its connection); a later registration opens a new one."""
    with _guard:
        reg = _registries.pop(db, None)
    if reg is not None:
        reg.close()


# The hooks never raise (an exception of theirs would reach a caller whose change is committed or whose
# catch-up succeeded); a failure is counted in the registry when there is one.
def caught_up(store: PostgresStore) -> None:
    """Hook: ``store`` loaded or caught up with its namespace (see :meth:`Registry.note`)."""
    _hook(store, wrote=False)


def committed(store: PostgresStore) -> None:
    """Hook: ``store`` committed a write (see :meth:`Registry.note`); may prune the namespace."""
    _hook(store, wrote=True)


def _hook(store: PostgresStore, *, wrote: bool) -> None:
    reg = None
    try:
        reg = registry_of(store.db)
        if reg is not None:
            reg.note(store, wrote=wrote)
    except Exception as e:  # pragma: no cover - a bug here must not fail an acknowledged call
        if reg is not None:
            reg.errors += 1
            reg.last_error = f"{type(e).__name__}: {e}"


def leave(store: PostgresStore) -> None:
    """Hook: ``store`` is closing. Deletes its registration; closes the registry with the last
    registration of this process, or with a database the store owns."""
    db = getattr(store, "db", None)
    try:
        reg = registry_of(db, create=False) if db is not None else None
        if reg is None:
            return
        reg.forget(store)
        if getattr(store, "_owns_db", False) or not reg.ids:
            shutdown(db)  # type: ignore[arg-type]
    except Exception:  # pragma: no cover - closing goes on; a dead registration expires by itself
        pass
