"""PostgreSQL store: transactions around model calls, bounded lock waits, pools, lost COMMIT replies and
the writers' isolation level, on the private server of ``pg_cluster`` (tests/conftest.py).

- An add computes its change (model calls) with no transaction open and no connection held, so the
  server's ``idle_in_transaction_session_timeout`` never ends it, and slow adds in other namespaces
  never take the connections an add needs.
- A write waits for its namespace's lock at most the lock timeout, then raises ``NamespaceBusyError``
  naming the namespace; an exhausted pool says so and leaves the pools alone.
- Reads too: with another session holding ACCESS EXCLUSIVE on a hiermem table, the catch-up of a
  retrieve or an add raises ``NamespaceBusyError`` after the lock timeout and changes nothing, and the
  registration written after it gives up without failing the call.
- A ``COMMIT`` whose reply is lost: landed is a success (memory and database agree), not landed is an
  error that changed nothing, unknown is ``CommitUnknownError`` and a re-sync before the next
  operation; on the memory path and on the durable LangGraph store.
- The writers run ``READ COMMITTED`` even when the database's default is ``REPEATABLE READ``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

import shared_core.stores.pg_connection as pgconn  # noqa: E402
from langchain_hiermem import HierMemStore  # noqa: E402
from shared_core import HierarchicalMemory, SegTreeMem  # noqa: E402
from shared_core.stores import pg_prune  # noqa: E402
from shared_core.stores.namespace import namespace_key  # noqa: E402
from shared_core.stores.postgres import LOCK_CLASS, PostgresDatabase, PostgresStore  # noqa: E402
from shared_core.types import (  # noqa: E402
    CommitUnknownError,
    InvalidInputError,
    NamespaceBusyError,
    PersistenceError,
)
from tests.support.memory import HashEmbedder, check_tree, memory_class, message_text, stripped  # noqa: E402
from tests.support.postgres import _dbname, _finish, _in_thread, _leaf_texts, _waiting_for_lock  # noqa: E402

SLEEP = 2.5  # longer than the server's idle_in_transaction_session_timeout in the first test


def _open(kind: str, url: str, ns: Any, embedder: Any = None) -> HierarchicalMemory:
    return memory_class(kind).open(url, embedder=embedder or HashEmbedder(), namespace=ns)


class _SlowEmbedder(HashEmbedder):
    """Sleeps ``SLEEP`` seconds in the first ``embed`` of each armed add (a slow model)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed:
            self.armed = False
            time.sleep(SLEEP)
        return super().embed(texts)


class _Gate(HashEmbedder):
    """Blocks in ``embed`` while armed (an add calling a slow model) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(60)
        return super().embed(texts)


def _ns_id(cluster: Any, url: str, ns: tuple[str, ...]) -> int:
    rows = cluster.execute(
        _dbname(url), "SELECT id FROM hiermem.namespaces WHERE name = %s", (namespace_key(ns),)
    )
    return int(rows[0][0])


def _seq(cluster: Any, url: str, ns: tuple[str, ...]) -> int:
    rows = cluster.execute(
        _dbname(url), "SELECT seq FROM hiermem.namespaces WHERE name = %s", (namespace_key(ns),)
    )
    return int(rows[0][0])


# --------------------------------------------------------------------------- Task A: model calls
def test_model_calls_run_with_no_transaction_open(pg_cluster, pg_url):
    """With the server ending every session idle in a transaction for 2 s, adds whose model calls take
    2.5 s succeed: no transaction is open while the models run."""
    db = _dbname(pg_url)
    pg_cluster.execute(db, f"ALTER DATABASE \"{db}\" SET idle_in_transaction_session_timeout = '2s'")
    emb = _SlowEmbedder()
    mem = _open("segtree", pg_url, "idle", emb)
    setting = mem._durable.db.read(
        lambda cur: cur.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    )
    assert setting[0] == "2s"
    mem.add(message_text(0))
    for i in (1, 2):
        emb.armed = True
        t0 = time.monotonic()
        mem.add(message_text(i))
        assert not emb.armed and time.monotonic() - t0 >= SLEEP
    other = _open("segtree", pg_url, "idle")
    check_tree(other, [message_text(i) for i in range(3)])
    assert stripped(other.to_dict()) == stripped(mem.to_dict())
    mem.close_store()
    other.close_store()


def test_lock_wait_is_bounded_and_names_the_busy_namespace(pg_cluster, pg_url):
    """Another connection holds the namespace's lock: a write waits at most the lock timeout (default:
    the URL's connect_timeout, 3 s here; or the URL's lock_timeout, or the constructor's), then fails
    with NamespaceBusyError naming the namespace; nothing changes, reads and other namespaces go on, and
    the write succeeds once the lock is free."""
    ns = ("team", "x")
    mem = _open("segtree", pg_url, ns)
    mem.add([message_text(0), message_text(1)])
    elsewhere = _open("segtree", pg_url, "elsewhere")
    before = stripped(mem.to_dict())
    seq = _seq(pg_cluster, pg_url, ns)

    def busy(call: Callable[[], Any], limit: float) -> None:
        t0 = time.monotonic()
        with pytest.raises(NamespaceBusyError) as err:
            _finish(*_in_thread(call), timeout=30)
        assert limit <= time.monotonic() - t0 < limit + 5
        assert err.value.namespace == ns
        assert "['team', 'x']" in str(err.value) and "busy" in str(err.value)
        assert "Nothing was changed" in str(err.value)

    holder = psycopg.connect(pg_cluster.url(_dbname(pg_url)), autocommit=True)
    try:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, _ns_id(pg_cluster, pg_url, ns)))
        busy(lambda: mem.add(message_text(2)), 3.0)  # the default: the URL's connect_timeout
        by_url = _open("segtree", f"{pg_url}&lock_timeout=1", ns)
        db = PostgresDatabase(pg_url, lock_timeout=0.5)
        by_arg = SegTreeMem(HashEmbedder())
        by_arg.attach_store(PostgresStore(db, ns))
        assert (by_url._durable.db.lock_timeout, db.lock_timeout) == (1, 0.5)
        busy(lambda: by_url.add(message_text(2)), 1.0)
        busy(lambda: by_arg.add(message_text(2)), 0.5)
        busy(lambda: by_arg.delete(by_arg._store.leaves()[0]), 0.5)
        busy(by_arg.clear, 0.5)
        for m in (mem, by_url, by_arg):
            assert stripped(m.to_dict()) == before
        assert _seq(pg_cluster, pg_url, ns) == seq
        assert mem.retrieve(message_text(1), k=1, policy="collapsed")  # a reader takes no advisory lock
        elsewhere.add("another namespace is not busy")
    finally:
        holder.close()
    mem.add(message_text(2))
    by_arg.add(message_text(3))
    mem.refresh()
    check_tree(mem, [message_text(i) for i in range(4)])
    for m in (mem, by_url, by_arg, elsewhere):
        m.close_store()
    db.close()


def _lock_table(cluster: Any, url: str, table: str) -> Any:
    """A connection of another session holding ACCESS EXCLUSIVE on ``hiermem.<table>`` (as
    ``VACUUM FULL`` or an ``ALTER TABLE`` would) until it is rolled back or closed."""
    holder = psycopg.connect(cluster.url(_dbname(url)))
    holder.execute(f"LOCK TABLE hiermem.{table} IN ACCESS EXCLUSIVE MODE")
    return holder


@pytest.mark.parametrize("table", ["nodes", "namespaces"])
def test_a_table_lock_bounds_the_catch_up_read(pg_cluster, pg_url, table):
    """Another session holds ACCESS EXCLUSIVE on a hiermem table: the catch-up read that starts a
    retrieve and an add waits at most the lock timeout, then fails with NamespaceBusyError naming the
    namespace; the memory and the database are unchanged, and once the lock is released the same pools
    serve the next calls."""
    ns = ("ops", "locked")
    url = f"{pg_url}&lock_timeout=0.5"
    mem = _open("segtree", url, ns)
    mem.add([message_text(0), message_text(1)])
    other = _open("segtree", url, ns)
    other.add(message_text(2))  # mem is behind: its catch-up reads the changed node rows
    before = stripped(mem.to_dict())
    seq = _seq(pg_cluster, pg_url, ns)
    db = mem._durable.db
    pools = (db._writers, db._readers)
    calls = {
        "retrieve": lambda: mem.retrieve(message_text(1), k=1, policy="collapsed"),
        "add": lambda: mem.add(message_text(3)),
    }
    holder = _lock_table(pg_cluster, pg_url, table)
    try:
        for call in calls.values():
            with pytest.raises(NamespaceBusyError) as err:
                _finish(*_in_thread(call), timeout=20)
            assert err.value.namespace == ns
            assert "busy" in str(err.value) and "Nothing was changed" in str(err.value)
            assert stripped(mem.to_dict()) == before
    finally:
        holder.close()
    assert _seq(pg_cluster, pg_url, ns) == seq
    assert (db._writers, db._readers) == pools and not db._broken
    assert mem.retrieve(message_text(2), k=1, policy="collapsed")
    mem.add(message_text(3))
    check_tree(mem, [message_text(i) for i in range(4)])
    assert (db._writers, db._readers) == pools
    mem.close_store()
    other.close_store()


def test_a_locked_readers_table_delays_no_call(pg_cluster, pg_url, monkeypatch):
    """The registration written after every catch-up and commit (``hiermem.readers``, see pg_prune)
    waits for a table lock at most the lock timeout, then gives up for now: retrieve and add succeed
    while another session holds ACCESS EXCLUSIVE on that table, and the registration is written once
    the lock is released."""
    monkeypatch.setattr(pg_prune.Registry, "heartbeat_interval", 0.0)
    monkeypatch.setattr(pg_prune.Registry, "prune_interval", 0.0)
    mem = _open("segtree", f"{pg_url}&lock_timeout=0.5", "registered")
    mem.add(message_text(0))
    reg = pg_prune.registry_of(mem._durable.db)
    assert reg is not None and reg.ids
    errors = reg.errors
    holder = _lock_table(pg_cluster, pg_url, "readers")
    try:
        assert _finish(
            *_in_thread(lambda: mem.retrieve(message_text(0), k=1, policy="collapsed")), timeout=20
        )
        _finish(*_in_thread(lambda: mem.add(message_text(1))), timeout=20)
        assert reg.errors > errors and "lock timeout" in reg.last_error
    finally:
        holder.close()
    check_tree(mem, [message_text(0), message_text(1)])
    reg._retry_at = 0.0  # the failed heartbeat postponed the next one
    mem.refresh()
    rows = pg_cluster.execute(_dbname(pg_url), "SELECT seq FROM hiermem.readers")
    assert rows == [(mem._durable.seq,)]
    mem.close_store()


@pytest.mark.parametrize("bad", ["lock_timeout=abc", "lock_timeout=0", "lock_timeout=-1"])
def test_a_malformed_lock_timeout_is_refused(pg_url, bad):
    with pytest.raises(InvalidInputError, match="lock_timeout"):
        SegTreeMem.open(f"{pg_url}&{bad}", embedder=HashEmbedder())
    with pytest.raises(InvalidInputError, match="lock_timeout"):
        PostgresDatabase(pg_url, lock_timeout=0)


def test_slow_adds_in_other_namespaces_never_fail_an_add(pg_url):
    """pool_size=2: two adds in namespaces a and c blocked in their model calls take no connection, so
    an add to namespace b goes ahead; the pools are never marked broken."""
    db = PostgresDatabase(pg_url, pool_size=2)
    gates = {"a": _Gate(), "c": _Gate()}
    mems = {}
    for name in "abc":
        mems[name] = SegTreeMem(gates.get(name) or HashEmbedder())
        mems[name].attach_store(PostgresStore(db, name))
        mems[name].add(f"first message of {name}")
    slow = []
    for name, gate in gates.items():
        gate.armed = True
        slow.append(_in_thread(lambda name=name: mems[name].add(f"slow message of {name}")))
        assert gate.entered.wait(60)
    t0 = time.monotonic()
    for i in range(3):
        _finish(*_in_thread(lambda i=i: mems["b"].add(f"message {i} of b")), timeout=30)
    assert time.monotonic() - t0 < db.timeout  # never waited for a connection
    assert not db._broken
    for gate in gates.values():
        gate.release.set()
    for t in slow:
        _finish(*t)
    assert _leaf_texts(mems["b"]) == ["first message of b", *(f"message {i} of b" for i in range(3))]
    for name in "ac":
        assert _leaf_texts(mems[name]) == [f"first message of {name}", f"slow message of {name}"]
    for m in mems.values():
        m.close_store()
    db.close()


def test_an_exhausted_pool_says_so_and_stays(pg_cluster):
    """Every writer connection lent out: the add fails with a pool message (not "check the server"),
    the pools are not marked broken, and the next add works."""
    url = pg_cluster.url(pg_cluster.create_database(), connect_timeout="1")
    db = PostgresDatabase(url, pool_size=1)
    mem = SegTreeMem(HashEmbedder())
    mem.attach_store(PostgresStore(db, "p"))
    mem.add(message_text(0))
    before = stripped(mem.to_dict())
    pools = (db._writers, db._readers)
    lent = db.write_connection("hold the only writer of")
    try:
        with pytest.raises(PersistenceError) as err:
            mem.add(message_text(1))
        msg = str(err.value)
        assert "pool_size=1" in msg and "in use" in msg and "Nothing was changed" in msg
        assert "Check that the server" not in msg
        assert not db._broken and stripped(mem.to_dict()) == before
    finally:
        db.release(lent, rollback=True)
    mem.add(message_text(1))
    assert (db._writers, db._readers) == pools
    check_tree(mem, [message_text(0), message_text(1)])
    mem.close_store()
    db.close()


# --------------------------------------------------------------------------- Task B: lost COMMIT replies
def _lose_commit_reply(monkeypatch: pytest.MonkeyPatch, *, landed: bool) -> list[int]:
    """The next COMMIT of a writer connection loses its reply: the connection breaks either after the
    server committed (``landed``) or before the COMMIT reached it. Returns a list that counts firings."""
    real = psycopg.Connection.commit
    fired: list[int] = []

    def commit(self: Any) -> None:
        if fired or self.read_only:
            return real(self)
        fired.append(1)
        if landed:
            real(self)
        self.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Connection, "commit", commit)
    return fired


def _run(mem: HierarchicalMemory, op: str) -> None:
    if op == "add":
        mem.add([message_text(20), message_text(21)])
    else:
        mem.delete(mem._store.leaves()[2])


def _after(op: str) -> list[str]:
    texts = [message_text(i) for i in range(6)]
    return [*texts, message_text(20), message_text(21)] if op == "add" else texts[:2] + texts[3:]


@pytest.mark.parametrize("kind", ["segtree", "hat"])
@pytest.mark.parametrize("op", ["add", "delete"])
def test_a_commit_that_landed_without_its_reply_is_a_success(kind, op, pg_cluster, pg_url, monkeypatch):
    mem = _open(kind, pg_url, "lost")
    mem.add([message_text(i) for i in range(6)])
    seq = mem._durable.seq
    fired = _lose_commit_reply(monkeypatch, landed=True)
    _run(mem, op)  # no error: the server says the transaction committed
    monkeypatch.undo()
    assert fired == [1]
    assert mem._durable.seq == seq + 1 == _seq(pg_cluster, pg_url, ("lost",))
    check_tree(mem, _after(op), deleted=op == "delete")
    fresh = _open(kind, pg_url, "lost")
    assert stripped(fresh.to_dict()) == stripped(mem.to_dict())  # memory and database agree
    mem.add("one more message about dogs")  # no retry needed, nothing stored twice
    fresh.refresh()
    check_tree(fresh, [*_after(op), "one more message about dogs"], deleted=op == "delete")
    mem.close_store()
    fresh.close_store()


def test_a_commit_that_did_not_land_changes_nothing(pg_cluster, pg_url, monkeypatch):
    mem = _open("segtree", pg_url, "lost")
    mem.add([message_text(i) for i in range(6)])
    before = stripped(mem.to_dict())
    seq = mem._durable.seq
    fired = _lose_commit_reply(monkeypatch, landed=False)
    with pytest.raises(PersistenceError, match="Nothing was changed") as err:
        _run(mem, "add")
    monkeypatch.undo()
    assert fired == [1] and not isinstance(err.value, CommitUnknownError)
    assert stripped(mem.to_dict()) == before
    assert mem._durable.seq == seq == _seq(pg_cluster, pg_url, ("lost",))
    _run(mem, "add")  # the retry stores the change once
    fresh = _open("segtree", pg_url, "lost")
    check_tree(fresh, _after("add"))
    mem.close_store()
    fresh.close_store()


def test_a_commit_whose_outcome_is_unknown_is_a_typed_error_then_a_resync(pg_url, monkeypatch):
    mem = _open("segtree", pg_url, "lost")
    mem.add([message_text(i) for i in range(6)])
    before = stripped(mem.to_dict())
    _lose_commit_reply(monkeypatch, landed=True)
    monkeypatch.setattr(pgconn, "ask_commit_outcome", lambda *a, **k: None)  # the server is away
    with pytest.raises(CommitUnknownError, match="may or may not"):
        _run(mem, "add")
    monkeypatch.undo()
    assert stripped(mem.to_dict()) == before  # rolled back in this process ...
    assert len(mem) == 8  # ... and re-synced from the database before the next operation
    check_tree(mem, _after("add"))
    fresh = _open("segtree", pg_url, "lost")
    assert stripped(fresh.to_dict()) == stripped(mem.to_dict())
    mem.close_store()
    fresh.close_store()


def test_a_clear_that_landed_without_its_reply_is_a_success(pg_url, monkeypatch):
    mem = _open("segtree", pg_url, "lost")
    mem.add([message_text(i) for i in range(4)])
    _lose_commit_reply(monkeypatch, landed=True)
    mem.clear()
    monkeypatch.undo()
    assert len(mem) == 0
    fresh = _open("segtree", pg_url, "lost")
    assert len(fresh) == 0
    mem.close_store()
    fresh.close_store()


# --------------------------------------------------------------------------- the durable LangGraph store
NS = ("users", "ann")


def _lose_items_commit_reply(monkeypatch: pytest.MonkeyPatch, store: Any, *, landed: bool) -> list[int]:
    """The next COMMIT of the LangGraph store's item transaction loses its reply (see
    :func:`_lose_commit_reply`)."""
    real = psycopg.Transaction.__exit__
    fired: list[int] = []
    items_conn = store._db._conn

    def exit_(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        if fired or exc_type is not None or self.connection is not items_conn:
            return real(self, exc_type, exc, tb)
        fired.append(1)
        if landed:
            real(self, exc_type, exc, tb)
        self.connection.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Transaction, "__exit__", exit_)
    return fired


def _lg_store(url: str) -> Any:
    return HierMemStore.from_conn_string(url, embedder=HashEmbedder())


def _scores(store: Any, query: str) -> dict[str, float | None]:
    return {i.key: i.score for i in store.search(NS, query=query, limit=10)}


def test_langgraph_store_takes_the_lock_timeout_from_its_url(pg_url):
    with _lg_store(f"{pg_url}&lock_timeout=2") as s:
        s.put(NS, "a", {"text": "My dog is called Luna."})
        assert s.get_memory(NS)._durable.db.lock_timeout == 2
        assert s.get(NS, "a").value == {"text": "My dog is called Luna."}


def test_langgraph_store_a_landed_item_commit_is_a_success(pg_url, monkeypatch):
    with _lg_store(pg_url) as s:
        s.put(NS, "a", {"text": "My dog is called Luna."})
        fired = _lose_items_commit_reply(monkeypatch, s, landed=True)
        s.put(NS, "b", {"text": "I work as a night nurse."})  # no error: it landed
        monkeypatch.undo()
        assert fired == [1]
        assert s.get(NS, "b").value == {"text": "I work as a night nurse."}
        s.put(NS, "c", {"text": "We hiked the Pyrenees."})  # not wedged
        scores = _scores(s, "night nurse")
        assert set(scores) == {"a", "b", "c"} and all(v is not None for v in scores.values())
    with _lg_store(pg_url) as s:  # reopened: every item there, each indexed by its text
        assert [i.key for i in s.search(NS, limit=10)] == ["a", "b", "c"]
        scores = _scores(s, "night nurse")
        assert all(v is not None for v in scores.values()) and max(scores, key=scores.get) == "b"
        s.put(NS, "d", {"text": "More."})


def test_langgraph_store_a_lost_item_commit_changes_nothing(pg_url, monkeypatch):
    with _lg_store(pg_url) as s:
        s.put(NS, "a", {"text": "My dog is called Luna."})
        fired = _lose_items_commit_reply(monkeypatch, s, landed=False)
        with pytest.raises(PersistenceError, match="Nothing was changed"):
            s.put(NS, "b", {"text": "I work as a night nurse."})
        monkeypatch.undo()
        assert fired == [1] and s.get(NS, "b") is None
        s.put(NS, "c", {"text": "We hiked the Pyrenees."})
        assert set(_scores(s, "nurse")) == {"a", "c"}
    with _lg_store(pg_url) as s:
        assert [i.key for i in s.search(NS, limit=10)] == ["a", "c"]
        mem = s.get_memory(NS)
        assert sorted(_leaf_texts(mem)) == ["My dog is called Luna.", "We hiked the Pyrenees."]


def test_langgraph_store_an_unknown_item_commit_resyncs(pg_url, monkeypatch):
    with _lg_store(pg_url) as s:
        s.put(NS, "a", {"text": "My dog is called Luna."})
        _lose_items_commit_reply(monkeypatch, s, landed=True)
        monkeypatch.setattr(pgconn, "ask_commit_outcome", lambda *a, **k: None)
        with pytest.raises(CommitUnknownError, match="may or may not"):
            s.put(NS, "b", {"text": "I work as a night nurse."})
        monkeypatch.undo()
        assert s.get(NS, "b").value == {"text": "I work as a night nurse."}  # re-synced: it landed
        scores = _scores(s, "night nurse")
        assert scores["b"] is not None and max(scores, key=scores.get) == "b"
        s.put(NS, "c", {"text": "We hiked the Pyrenees."})
    with _lg_store(pg_url) as s:
        assert [i.key for i in s.search(NS, limit=10)] == ["a", "b", "c"]
        assert all(v is not None for v in _scores(s, "nurse").values())


# --------------------------------------------------------------------------- isolation
class _StallFirstWrite:
    """Stalls the first ``_write_meta`` of one store (inside its write transaction, holding the
    namespace's lock) until released; :meth:`patched` is the method to install."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.entered = threading.Event()
        self.release = threading.Event()

    def patched(self) -> Any:
        real = PostgresStore._write_meta

        def write_meta(store: PostgresStore, cur: Any, items: Any) -> None:
            if store is self.store and not self.entered.is_set():
                self.entered.set()
                assert self.release.wait(60)
            real(store, cur, items)

        return write_meta


def test_writers_run_read_committed_whatever_the_database_default(pg_cluster, pg_url, monkeypatch):
    """With default_transaction_isolation = 'repeatable read' on the database, a writer that waited for
    the namespace's lock sees the write it waited for: contended writes succeed, no pool is reset."""
    db = _dbname(pg_url)
    pg_cluster.execute(db, f"ALTER DATABASE \"{db}\" SET default_transaction_isolation = 'repeatable read'")
    a = _open("segtree", pg_url, "iso")
    a.add(message_text(0))
    b = _open("segtree", pg_url, "iso")
    with a._durable.db.writing("check") as cur:
        assert cur.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
    stall = _StallFirstWrite(a._durable)
    monkeypatch.setattr(PostgresStore, "_write_meta", stall.patched())
    a_add = _in_thread(lambda: a.add(message_text(1)))
    assert stall.entered.wait(60)  # a holds the namespace's lock inside its write transaction
    b_add = _in_thread(lambda: b.add(message_text(2)))
    deadline = time.monotonic() + 60
    while _waiting_for_lock(pg_cluster, pg_url) == 0:
        assert time.monotonic() < deadline, "b never waited for the namespace lock"
        time.sleep(0.05)
    stall.release.set()
    _finish(*a_add)
    _finish(*b_add)
    monkeypatch.undo()
    for m in (a, b):
        assert not m._durable.db._broken
    a.refresh()
    want = [message_text(i) for i in range(3)]
    assert _leaf_texts(a) == _leaf_texts(b) == want
    check_tree(b, want)
    assert stripped(a.to_dict()) == stripped(b.to_dict())
    a.close_store()
    b.close_store()
