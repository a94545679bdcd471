"""The write transactions of one namespace of the PostgreSQL store: the lock, the ``COMMIT`` and, when
the ``COMMIT`` got no reply, whether it landed.

:class:`NamespaceWrites` is what a :class:`~shared_core.stores.postgres.PostgresStore` writes through
(the design is in the docstring of :mod:`shared_core.stores.postgres`):

- :meth:`NamespaceWrites.run` runs one short ``READ COMMITTED`` transaction on a pooled writer: the
  namespace's advisory lock first (``pg_advisory_xact_lock``, waiting at most the lock timeout, then
  :class:`~shared_core.types.NamespaceBusyError`), then the caller's statements, then ``COMMIT``.
  It records the transaction's id (``txid_current()``) and whether the ``COMMIT`` was sent and
  returned.
- :meth:`NamespaceWrites.hold` takes the same lock at session level on a connection of its own (outside
  the pools, no transaction open) for a write computed while holding it (after a conflict); the next
  :meth:`~NamespaceWrites.run` writes on that connection and then releases the lock. The connection is
  kept for the next such write (:meth:`PostgresConnections.keep_lock_connection`), or closed on any error.
- :meth:`NamespaceWrites.landed` tells, after :meth:`~NamespaceWrites.run` raised, whether the write is
  in the database: not if its ``COMMIT`` was never sent, yes if it returned, else the server is asked
  on a fresh connection (``txid_status``); when the server cannot tell,
  :class:`~shared_core.types.CommitUnknownError`.

References:
    PostgreSQL documentation: "Advisory Locks", "System Information Functions" (``txid_current``,
    ``txid_status``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ..types import CommitUnknownError
from .pg_connection import LOCK_CLASS, PostgresConnections, connection_lost, take_session_lock

if TYPE_CHECKING:
    import psycopg

__all__ = ["NamespaceWrites"]

#: A write's first statement: the namespace's lock (bounded by the writers' lock_timeout) and the
#: transaction's id (for txid_status when its COMMIT gets no reply).
_LOCK = "SELECT pg_advisory_xact_lock(%s, %s), txid_current()"


class NamespaceWrites:
    """The write transactions of one namespace (see the module docstring).

    Args:
        db: the database's connections.
        namespace: the namespace, for :class:`~shared_core.types.NamespaceBusyError`.
        label: ``"namespace [...] in"``, for messages ("Could not <what> <label> <url>").
    """

    def __init__(self, db: PostgresConnections, namespace: tuple[str, ...], label: str) -> None:
        self.db = db
        self.namespace = namespace
        self.label = label
        self.attempt = 0  # the change sequence the last write whose COMMIT was sent was to get
        self._xid: int | None = None  # that write's transaction id
        self._committed: bool | None = False  # whether its COMMIT returned (None: no reply)
        self._held: psycopg.Connection[Any] | None = None  # holds the namespace's lock (see hold)

    @property
    def holding(self) -> bool:
        """Whether the namespace's lock is held at session level (see :meth:`hold`)."""
        return self._held is not None

    def hold(self, ns_id: int) -> bool:
        """Take the namespace's lock at session level until the next :meth:`run` ends (or :meth:`release`).

        Returns:
            Whether it had to wait for the lock (another writer held it).

        Raises:
            NamespaceBusyError: the lock was not free within the lock timeout.
            PersistenceError: the server cannot be reached.
        """
        self.release()
        what = f"write to {self.label}"
        conn = self.db.lock_connection(what)
        try:
            waited = take_session_lock(conn, ns_id)
        except BaseException as e:
            _close(conn)
            if isinstance(e, Exception):
                raise self.db.error(e, what, conn=conn, namespace=self.namespace) from None
            raise
        self._held = conn
        return waited

    def release(self) -> None:
        """Forget the last write and release a lock :meth:`hold` took (idempotent)."""
        self._xid, self._committed = None, False
        conn, self._held = self._held, None
        if conn is not None:
            self._keep(conn, rollback=True)

    def _keep(self, conn: psycopg.Connection[Any], *, rollback: bool) -> None:
        """Release the session lock of a held connection and keep it for the next :meth:`hold` (closed
        instead when anything fails: closing ends the session, which releases its lock)."""
        try:
            if rollback:
                conn.rollback()
            conn.autocommit = True
            conn.execute("SELECT pg_advisory_unlock_all()")
            conn.autocommit = False
        except Exception:
            _close(conn)
            return
        except BaseException:
            _close(conn)
            raise
        self.db.keep_lock_connection(conn)

    def _give_back(self, conn: psycopg.Connection[Any], held: bool, *, rollback: bool) -> None:
        if held:
            self._held = None
            self._keep(conn, rollback=rollback)
        else:
            self.db.release(conn, rollback=rollback)

    def run(self, ns_id: int, what: str, body: Callable[[psycopg.Cursor[Any]], int | None]) -> int | None:
        """Run ``body(cursor)`` in one write transaction that first takes the namespace's lock, and
        commit it.

        ``body`` returns the change sequence the write gets, or ``None`` to write nothing (rolled back).
        A connection found dead by the first statement is replaced and the transaction run once more
        (nothing of it had reached the server; a write that held the lock goes on without it, its
        change sequence check still guards it). After a failure, :meth:`landed` tells whether it landed.

        Returns:
            The committed change sequence, or ``None``.

        Raises:
            NamespaceBusyError: the lock was not free within the lock timeout (nothing was written).
            PersistenceError: the write failed (rolled back, or its ``COMMIT`` had no reply).
        """
        what = f"{what} {self.label}"
        self._xid, self._committed = None, False
        for attempt in (0, 1):
            held = self._held is not None
            conn = self._held if self._held is not None else self.db.write_connection(what)
            started = sent = False
            try:
                with conn.cursor() as cur:
                    cur.execute(_LOCK, (LOCK_CLASS, ns_id))
                    xid = int(cur.fetchone()[1])  # type: ignore[index]
                    started = True
                    seq = body(cur)
                if seq is None:
                    self._give_back(conn, held, rollback=True)
                    return None
                self._xid, self.attempt, self._committed = xid, seq, None
                sent = True
                conn.commit()
                self._committed = True
            except BaseException as e:
                lost = connection_lost(e, conn)
                self._give_back(conn, held, rollback=True)
                if not sent:
                    self._xid = None  # never committed: nothing to ask
                if isinstance(e, Exception) and lost and not started and attempt == 0:
                    if not held:
                        self.db._recover()
                    continue
                if isinstance(e, Exception):
                    raise self.db.error(e, what, conn=conn, namespace=self.namespace) from None
                raise
            self._give_back(conn, held, rollback=False)
            return seq
        raise AssertionError("unreachable")  # pragma: no cover

    def landed(self) -> bool:
        """After :meth:`run` raised: whether its write is in the database (then :attr:`attempt` is the
        change sequence it got).

        A write whose ``COMMIT`` was never sent did not land; one whose ``COMMIT`` returned (an interrupt
        came after it) did. Otherwise the server is asked on a fresh connection (``txid_status`` of the
        write's transaction; one still finishing is asked again for up to the connect timeout).

        Raises:
            CommitUnknownError: the server cannot tell (it cannot be reached).
        """
        xid, committed = self._xid, self._committed
        self._xid, self._committed = None, False
        if xid is None:
            return False
        outcome = True if committed else self.db.commit_outcome(xid)
        if outcome is None:
            raise CommitUnknownError(
                f"The connection to PostgreSQL was lost during the COMMIT of a change to {self.label} "
                f"{self.db.location}, and the server cannot be asked whether it landed: the change may or "
                "may not be stored. This memory is as before the call and reloads the namespace from the "
                "database before its next operation; check there before retrying (a retry may store "
                "the change twice)."
            )
        return outcome


def _close(conn: psycopg.Connection[Any]) -> None:
    with suppress(Exception):
        conn.close()
