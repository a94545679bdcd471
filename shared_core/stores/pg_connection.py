"""Connections of the PostgreSQL store: the URL, the writer and reader pools, short transactions, how a
database error is reported, and whether a ``COMMIT`` whose reply was lost landed.

:class:`PostgresConnections` is the connection half of
:class:`~shared_core.stores.postgres.PostgresDatabase` (which adds the schema and the namespaces):

- **two pools** per database object, writers and readers, of 1 to ``pool_size`` connections each. A
  connection is lent only for one short transaction (a catch-up read, or the write of a change already
  computed): no connection and no transaction is held while models are called, so ``pool_size`` bounds
  the number of transactions running at once, not the number of adds in progress.
- **writers** run ``READ COMMITTED`` (set on every writer connection, whatever the database's
  ``default_transaction_isolation`` says); **readers** run read-only ``REPEATABLE READ`` (one snapshot
  per catch-up).
- **every lock wait is bounded**: every connection hiermem opens (writers, readers, the lock connections
  of :mod:`~shared_core.stores.pg_writes`, the registry of :mod:`~shared_core.stores.pg_prune`) has the
  server's ``lock_timeout`` set to this object's lock timeout, so no statement waits longer than that
  for any one lock: a namespace's advisory lock, or a table lock. A read takes ``ACCESS SHARE`` on the
  tables it reads, which hiermem's own writes never conflict with, but another session's ``LOCK
  TABLE``, ``VACUUM FULL`` or ``ALTER TABLE`` (``ACCESS EXCLUSIVE``) does.
- **errors**: a waited-out lock is a :class:`~shared_core.types.NamespaceBusyError`; a connection that
  broke (or a server that went away) makes the next call replace both pools once the server answers
  again; every pooled connection lent out at once is a "pool exhausted" error that leaves the pools as
  they are; any other server error is reported with the server's message and touches no pool.
- **commit outcome**: when a ``COMMIT`` was sent and no reply came back, :meth:`commit_outcome` asks
  the server on a fresh connection (``txid_status``) whether that transaction committed.

URL options read (and removed) by hiermem before the URL reaches libpq: ``lock_timeout=S`` (seconds, a
positive number, the bound of every lock wait above; the default is the connect timeout,
``connect_timeout`` or 10 s).

References:
    PostgreSQL documentation: "Client Connection Defaults" (``lock_timeout``), "Transaction
    Isolation", "System Information Functions" (``txid_status``), "PostgreSQL Error Codes"; psycopg 3
    and psycopg_pool documentation.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from ..types import InvalidInputError, NamespaceBusyError, PersistenceError

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

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOCK_CLASS",
    "PostgresConnections",
    "ask_commit_outcome",
    "connection_lost",
    "first_line",
    "set_lock_timeout",
    "parse_url",
    "split_url",
    "take_session_lock",
]

T = TypeVar("T")

#: First key of hiermem's advisory locks (``pg_advisory_xact_lock(LOCK_CLASS, namespace id)``; the
#: namespace id 0 guards the schema setup). ASCII "hier".
LOCK_CLASS = 0x68696572
#: The PostgreSQL schema holding the tables.
SCHEMA = "hiermem"
#: Seconds to wait for a connection (and, unless told otherwise, for a lock) when the URL has no
#: ``connect_timeout``.
DEFAULT_TIMEOUT = 10.0
#: URL query parameters that are hiermem's own, removed before the URL reaches libpq.
_OWN_PARAMS = ("lock_timeout",)
#: SQLSTATEs after which the connection is gone: class 08 (connection exception) and the server's
#: shutdown codes (admin_shutdown, crash_shutdown, cannot_connect_now).
_GONE_STATES = ("57P01", "57P02", "57P03")
_LOCK_NOT_AVAILABLE = "55P03"
#: Seconds a lock connection is kept unused for the next write that holds a namespace's lock.
_SPARE_SECONDS = 60.0


def first_line(e: BaseException) -> str:
    """The first line of an error's message (a server's message can be long)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without hiermem's own query parameters (see the module docstring), and those parameters.

    A URL that cannot be split is returned as it is (libpq reports what is wrong with it).
    """
    text = url.strip()
    if not text.lower().startswith(("postgresql://", "postgres://")) or "?" not in text:
        return text, {}
    try:
        parts = urlsplit(text)
    except ValueError:
        return text, {}
    own: dict[str, str] = {}
    rest: list[str] = []
    for item in parts.query.split("&"):  # the other parameters are kept exactly as written
        key, _, value = item.partition("=")
        if unquote(key) in _OWN_PARAMS:
            own[unquote(key)] = unquote(value)
        else:
            rest.append(item)
    if not own:
        return text, {}
    return urlunsplit(parts._replace(query="&".join(rest))), own


def parse_url(url: str) -> tuple[dict[str, Any], str]:
    """The libpq parameters of ``url`` (hiermem's own parameters removed) and its name for messages
    (without the password).

    Raises:
        InvalidInputError: the URL is malformed.
    """
    if not isinstance(url, str):
        raise InvalidInputError(f"A PostgreSQL URL is a string, got {type(url).__name__}.")
    clean, own = split_url(url)
    try:
        params = conninfo_to_dict(clean)
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
    if "lock_timeout" in own:
        _seconds(own["lock_timeout"], "the URL's lock_timeout")
    user = params.get("user")
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    where = f"postgresql://{user + '@' if user else ''}{host}:{port}/{params.get('dbname') or ''}"
    return params, where


def _seconds(value: Any, what: str) -> float:
    """``value`` as a positive, finite number of seconds (a string from a URL is parsed)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a positive number of seconds, got {value!r}.") from None
    if not math.isfinite(out) or out <= 0:
        raise InvalidInputError(f"{what} must be a positive number of seconds, got {value!r}.")
    return out


def connection_lost(e: BaseException, conn: psycopg.Connection[Any] | None = None) -> bool:
    """Whether ``e`` (met on ``conn``) means the connection is gone, rather than a server error on a
    connection that still works."""
    if conn is not None and (conn.closed or conn.broken):
        return True
    if not isinstance(e, psycopg.OperationalError):
        return False
    state = getattr(e, "sqlstate", None)
    return state is None or state.startswith("08") or state in _GONE_STATES


def lock_timed_out(e: BaseException) -> bool:
    """Whether ``e`` is the server's "canceling statement due to lock timeout"."""
    return isinstance(e, psycopg.Error) and getattr(e, "sqlstate", None) == _LOCK_NOT_AVAILABLE


def set_lock_timeout(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Set the server's ``lock_timeout`` of ``conn``'s session to ``seconds`` (rounded to whole
    milliseconds, at least 1 ms): every later statement on it waits at most that long for any one lock,
    then fails with SQLSTATE ``55P03``. Committed at once unless ``conn`` is in autocommit mode."""
    ms = max(1, round(seconds * 1000))
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{ms}ms",))
    if not conn.autocommit:
        conn.commit()


def take_session_lock(conn: psycopg.Connection[Any], lock: int) -> bool:
    """Take the advisory lock ``(LOCK_CLASS, lock)`` at session level on ``conn`` (idle, not in a
    transaction), waiting at most the connection's ``lock_timeout``.

    Returns:
        Whether it had to wait (another session held the lock).

    Raises:
        psycopg.Error: the lock timeout passed (``55P03``) or the connection failed.
    """
    conn.autocommit = True
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock)).fetchone()
        if row and row[0]:
            return False
        conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, lock))
        return True
    finally:
        if not (conn.closed or conn.broken):
            conn.autocommit = False


def ask_commit_outcome(connect: Callable[[], psycopg.Connection[Any]], xid: int, wait: float) -> bool | None:
    """Whether transaction ``xid`` (``txid_current()``) committed, asked on a new connection.

    A transaction the server still runs (its ``COMMIT`` not finished yet) is asked again for up to
    ``wait`` seconds.

    Returns:
        ``True`` (committed), ``False`` (aborted: nothing of it is stored) or ``None`` (the server cannot
        be reached, or cannot tell).
    """
    deadline = time.monotonic() + wait
    delay = 0.02
    try:
        with connect() as conn:
            while True:
                row = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()
                status = row[0] if row else None
                if status == "committed":
                    return True
                if status == "aborted":
                    return False
                if status != "in progress" or time.monotonic() >= deadline:
                    return None
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
    except Exception:
        return None


class PostgresConnections:
    """The writer and reader pools of one PostgreSQL database (see the module docstring).

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/dbname`` (``?host=/socket/dir`` for a
            Unix socket; ``connect_timeout=S`` also bounds the wait for a pooled connection, default 10;
            ``lock_timeout=S`` bounds every wait for a lock, default the connect timeout).
        pool_size: most connections of each pool (writers, readers).
        lock_timeout: seconds a statement waits for any one lock (a namespace's writer lock, or a table
            lock another session holds) before the call fails with :class:`NamespaceBusyError`
            (overrides the URL's ``lock_timeout``).

    Raises:
        InvalidInputError: a malformed URL, ``pool_size`` or ``lock_timeout``.
        PersistenceError: the server cannot be reached or refuses the login.
    """

    def __init__(self, url: str, *, pool_size: int = 8, lock_timeout: float | None = None) -> None:
        params, self.location = parse_url(url)
        clean, own = split_url(url)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise InvalidInputError(f"pool_size must be a positive integer, got {pool_size!r}.")
        self.timeout = float(params.get("connect_timeout") or DEFAULT_TIMEOUT)
        if lock_timeout is not None:
            self.lock_timeout = _seconds(lock_timeout, "lock_timeout")
        elif "lock_timeout" in own:
            self.lock_timeout = _seconds(own["lock_timeout"], "the URL's lock_timeout")
        else:
            self.lock_timeout = self.timeout
        kwargs: dict[str, Any] = {}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = int(DEFAULT_TIMEOUT)
        if "application_name" not in params:
            kwargs["application_name"] = "hiermem"
        self._url = clean
        self._kwargs = kwargs
        self._pool_size = pool_size
        self._closed = False
        self._broken = False
        self._lock = threading.Lock()
        self._lent: dict[int, tuple[psycopg.Connection[Any], ConnectionPool]] = {}
        self._spares: list[tuple[psycopg.Connection[Any], float]] = []  # see keep_lock_connection
        self._probe()
        self._writers, self._readers = self._new_pools()

    @property
    def pool_size(self) -> int:
        """Most connections of each pool."""
        return self._pool_size

    # ------------------------------------------------------------------ connections
    def connect(self) -> psycopg.Connection[Any]:
        """A new connection outside the pools (autocommit), for the caller to close."""
        return psycopg.connect(self._url, autocommit=True, **self._kwargs)

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

    def _configure_writer(self, conn: psycopg.Connection[Any]) -> None:
        conn.isolation_level = IsolationLevel.READ_COMMITTED
        set_lock_timeout(conn, self.lock_timeout)

    def _configure_reader(self, conn: psycopg.Connection[Any]) -> None:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        set_lock_timeout(conn, self.lock_timeout)

    def lock_connection(self, what: str) -> psycopg.Connection[Any]:
        """A connection outside the pools, configured as a writer (``READ COMMITTED``, the lock
        timeout), no transaction open, to hold a namespace's lock at session level (see
        :func:`take_session_lock`): one kept by :meth:`keep_lock_connection`, or a new one. The caller
        gives it back with :meth:`keep_lock_connection` or closes it.

        Raises:
            PersistenceError: the server cannot be reached.
        """
        now = time.monotonic()
        kept: psycopg.Connection[Any] | None = None
        with self._lock:
            stale = [c for c, t in self._spares if now - t >= _SPARE_SECONDS or c.closed or c.broken]
            self._spares = [(c, t) for c, t in self._spares if c not in stale]
            if self._spares:
                kept = self._spares.pop()[0]
        for c in stale:
            with suppress(Exception):
                c.close()
        if kept is not None:
            return kept
        try:
            conn = psycopg.connect(self._url, **self._kwargs)
        except psycopg.Error as e:
            raise self.error(e, what) from None
        try:
            self._configure_writer(conn)
        except BaseException as e:
            with suppress(Exception):
                conn.close()
            if isinstance(e, Exception):
                raise self.error(e, what, conn=conn) from None
            raise
        return conn

    def keep_lock_connection(self, conn: psycopg.Connection[Any]) -> None:
        """Keep a connection of :meth:`lock_connection` (idle, holding no lock) for the next one: at most
        ``pool_size`` are kept, each for at most a minute unused; others are closed."""
        if not (conn.closed or conn.broken):
            with self._lock:
                if not self._closed and len(self._spares) < self._pool_size:
                    self._spares.append((conn, time.monotonic()))
                    return
        with suppress(Exception):
            conn.close()

    def _new_pools(self) -> tuple[ConnectionPool, ConnectionPool]:
        common: dict[str, Any] = {
            "kwargs": self._kwargs,
            "min_size": 1,
            "max_size": self._pool_size,
            "open": False,
            "timeout": self.timeout,
            "num_workers": 1,  # connections are made rarely: at open, on growth, after a failure
        }
        writers: ConnectionPool = ConnectionPool(
            self._url, name="hiermem-writers", configure=self._configure_writer, **common
        )
        readers: ConnectionPool = ConnectionPool(
            self._url, name="hiermem-readers", configure=self._configure_reader, **common
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
            with self._lock:
                lent = sum(1 for _, p in self._lent.values() if p is pool)
            if lent >= self._pool_size:  # every connection is busy with this process's other calls
                kind = "writer" if write else "reader"
                raise PersistenceError(
                    f"Could not {what} {self.location}: all {lent} {kind} connections of this process's "
                    f"pool (pool_size={self._pool_size}) stayed in use by its other calls for "
                    f"{self.timeout:g} s. Nothing was changed; try again, or raise pool_size."
                ) from None
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

    def error(
        self,
        e: BaseException,
        what: str,
        *,
        conn: psycopg.Connection[Any] | None = None,
        namespace: tuple[str, ...] | None = None,
    ) -> PersistenceError:
        """The :class:`PersistenceError` for an error ``e`` met on ``conn`` while trying to ``what``.

        Args:
            e: the error.
            what: what was being done, for the message ("Could not <what> <location>").
            conn: the connection it was met on, when there was one (a broken one is a lost connection).
            namespace: the namespace being read or written, for :class:`NamespaceBusyError`.
        """
        if isinstance(e, PersistenceError):
            return e
        if lock_timed_out(e):
            return NamespaceBusyError(
                f"Could not {what} {self.location}: it is busy, another session (a writer holding the "
                "namespace's lock, or a LOCK TABLE, VACUUM FULL or ALTER TABLE on a hiermem table) held "
                f"a lock it needed for longer than the lock timeout ({self.lock_timeout:g} s). Nothing "
                "was changed; try again, or raise the lock timeout (lock_timeout= in the URL or the "
                "constructor).",
                namespace=namespace,
            )
        if connection_lost(e, conn):
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

    def read(
        self,
        fn: Callable[[psycopg.Cursor[Any]], T],
        what: str = "read",
        *,
        namespace: tuple[str, ...] | None = None,
    ) -> T:
        """Run ``fn(cursor)`` in a read-only ``REPEATABLE READ`` transaction (one snapshot). It takes
        ``ACCESS SHARE`` on the tables ``fn`` reads, waiting at most the lock timeout for each.

        A connection found broken (e.g. after a server restart) is replaced and ``fn`` run once more.

        Args:
            fn: the reads, given a cursor.
            what: what is read, for error messages.
            namespace: the namespace read, for :class:`NamespaceBusyError`.

        Raises:
            NamespaceBusyError: another session held a lock on a table ``fn`` reads for longer than the
                lock timeout (the connection goes back to the pool, rolled back).
            PersistenceError: the database cannot be read.
        """
        for attempt in (0, 1):
            conn = self._getconn(False, what)
            try:
                with conn.transaction(), conn.cursor() as cur:
                    out = fn(cur)
            except BaseException as e:
                lost = connection_lost(e, conn)
                self._putconn(conn, rollback=True)
                if lost and attempt == 0 and isinstance(e, psycopg.OperationalError):
                    self._recover()
                    continue
                if isinstance(e, Exception):
                    raise self.error(e, what, conn=conn, namespace=namespace) from None
                raise
            self._putconn(conn, rollback=False)
            return out
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def writing(
        self, what: str, lock: int | None = None, namespace: tuple[str, ...] | None = None
    ) -> Iterator[psycopg.Cursor[Any]]:
        """A write transaction (``READ COMMITTED``), committed when the block ends without error.

        Args:
            what: what the transaction does, for error messages.
            lock: a namespace id whose advisory lock the transaction takes first (waiting at most the
                lock timeout), or ``None``.
            namespace: that namespace, for :class:`NamespaceBusyError`.

        Raises:
            NamespaceBusyError: the lock was not free within the lock timeout (nothing was written).
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
                raise self.error(e, what, conn=conn, namespace=namespace) from None
            raise
        self._putconn(conn, rollback=False)

    def write_connection(self, what: str) -> psycopg.Connection[Any]:
        """A writer connection for a transaction the caller ends (:meth:`release`)."""
        return self._getconn(True, what)

    def release(self, conn: psycopg.Connection[Any], *, rollback: bool) -> None:
        """Give back a connection of :meth:`write_connection` (rolled back first when asked)."""
        self._putconn(conn, rollback=rollback)

    def commit_outcome(self, xid: int) -> bool | None:
        """Whether the transaction ``xid`` committed, asked on a new connection (see
        :func:`ask_commit_outcome`; a transaction still finishing is asked again for up to the connect
        timeout)."""
        if self._closed:
            return None
        return ask_commit_outcome(self.connect, xid, self.timeout)

    def close(self) -> None:
        """Close both pools (idempotent). Open stores of this database fail from then on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            spares, self._spares = self._spares, []
        for conn, _ in spares:
            with suppress(Exception):
                conn.close()
        for pool in (getattr(self, "_writers", None), getattr(self, "_readers", None)):
            if pool is not None:
                with suppress(Exception):
                    pool.close(timeout=1.0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed
