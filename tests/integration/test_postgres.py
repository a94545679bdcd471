"""PostgreSQL store on a real server: round trips, catch-up between memories and processes, serialised
writers, failed commits, server restarts, isolation of namespaces and typed errors for bad input.

Every test runs against a private PostgreSQL server (``pg_cluster`` in tests/conftest.py) and a fresh
database (``pg_url``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as wait_any
from typing import Any

import numpy as np
import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

import shared_core.stores.postgres as pgstore  # noqa: E402
from shared_core import HierarchicalMemory, MemTree, Message, SegTreeMem  # noqa: E402
from shared_core.namespaces import MemoryStore  # noqa: E402
from shared_core.stores.postgres import PostgresStore  # noqa: E402
from shared_core.types import InvalidInputError, PersistenceError, VersionMismatchError  # noqa: E402
from tests.support.faults import Fault, answers, index_snapshot  # noqa: E402
from tests.support.memory import KINDS, HashEmbedder, check_tree, memory_class, message_text, stripped  # noqa: E402
from tests.support.postgres import _dbname, _finish, _in_thread, _leaf_texts, _waiting_for_lock  # noqa: E402
from tests.support.structure import naive_structure  # noqa: E402

QUERY = "what about dogs and music"


def _open(kind: str, url: str, ns: Any = "ns", embedder: Any = None, **kw: Any) -> HierarchicalMemory:
    return memory_class(kind).open(url, embedder=embedder or HashEmbedder(), namespace=ns, **kw)


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(kind, pg_url):
    mem = _open(kind, pg_url, ("alice", "bot"))
    mem.add([Message(message_text(i), id=f"m{i}") for i in range(5)])
    for i in range(5, 12):
        mem.add(Message(message_text(i), id=f"m{i}"))
    mem.delete("m4")
    before = stripped(mem.to_dict())
    ids, vecs = index_snapshot(mem)
    hits = answers(mem)
    mem.close_store()

    back = HierarchicalMemory.open(pg_url, embedder=HashEmbedder(), namespace=["alice", "bot"])
    assert type(back) is type(mem)
    assert stripped(back.to_dict()) == before
    back_ids, back_vecs = index_snapshot(back)
    assert sorted(back_ids) == sorted(ids)
    order = {nid: r for r, nid in enumerate(back_ids)}
    np.testing.assert_allclose(back_vecs[[order[i] for i in ids]], vecs, atol=1e-6)
    assert answers(back) == hits
    check_tree(back, [message_text(i) for i in range(12) if i != 4], deleted=True)
    back.close_store()


def test_store_keyword_and_default_namespace(pg_cluster):
    db = pg_cluster.create_database()
    url = pg_cluster.url(db).replace("hiermem@", "hiermem:s3cret@")  # trust auth ignores the password
    mem = SegTreeMem(HashEmbedder(), store=url)
    assert mem.store_path is None
    assert "default" in mem.store_location and "s3cret" not in mem.store_location
    mem.add(["first about dogs", Message("second about travel", id="t")])
    other = HierarchicalMemory.open(url, embedder=HashEmbedder())  # the default namespace
    same = HierarchicalMemory.open(url, embedder=HashEmbedder(), namespace="default")
    assert len(other) == len(same) == 2
    with pytest.raises(PersistenceError, match="segtree") as err:
        MemTree.open(url, embedder=HashEmbedder())
    assert "s3cret" not in str(err.value)
    fresh = SegTreeMem.open(url, embedder=HashEmbedder(), namespace="another")
    assert len(fresh) == 0
    for m in (mem, other, same, fresh):
        m.close_store()
    assert pg_cluster.execute(db, "SELECT count(*) FROM hiermem.namespaces")[0][0] == 2


# --------------------------------------------------------------------------- catch-up
@pytest.mark.parametrize("kind", KINDS)
def test_two_memories_see_each_others_changes(kind, pg_url, monkeypatch):
    a = _open(kind, pg_url, "shared")
    b = _open(kind, pg_url, "shared")
    full_loads: list[str] = []
    real_restore = pgstore.restore_rows
    monkeypatch.setattr(
        pgstore, "restore_rows", lambda *args: (full_loads.append("full"), real_restore(*args))[1]
    )
    for i in range(13):
        (a if i % 2 == 0 else b).add(Message(message_text(i), id=f"m{i}"))
    texts = [message_text(i) for i in range(13)]
    assert _leaf_texts(b) == texts[:12]  # b has not caught up with a's last add yet
    assert b.retrieve(message_text(12), k=1, policy="collapsed")  # a retrieval catches up first
    assert _leaf_texts(b) == texts
    a.delete("m3")
    b.delete("m6")  # b applies a's deletion first
    a.refresh()
    assert stripped(a.to_dict()) == stripped(b.to_dict())
    assert not full_loads, "a catch-up reloaded the whole namespace"
    left = [t for i, t in enumerate(texts) if i not in (3, 6)]
    check_tree(a, left, deleted=True)
    check_tree(b, left, deleted=True)

    fresh = _open(kind, pg_url, "shared")  # a full load equals the memories kept up to date row by row
    assert stripped(fresh.to_dict()) == stripped(a.to_dict())
    assert sorted(index_snapshot(fresh)[0]) == sorted(index_snapshot(a)[0]) == sorted(index_snapshot(b)[0])
    assert answers(fresh) == answers(a) == answers(b)
    for m in (a, b, fresh):  # per-node arrays followed the rows applied from the other process
        ids = m._index.ids.copy()
        for got, want in zip(m._structure(ids), naive_structure(m._store, ids)):
            np.testing.assert_array_equal(got, want)

    a.clear()  # after a clear the others reload
    assert b.retrieve("dogs", policy="collapsed") == [] and len(b) == 0
    b.add("after the clear about dogs")
    assert [h.text for h in a.retrieve("dogs", k=1, policy="collapsed")] == ["after the clear about dogs"]
    for m in (a, b, fresh):
        m.close_store()


# --------------------------------------------------------------------------- failed commits
def _terminate_own_backend(cluster: Any, url: str) -> Callable[..., Any]:
    """A PostgresStore._write_meta (inside the write transaction, the node rows written) that first kills
    its own server process (a dropped connection)."""
    real = PostgresStore._write_meta

    def write_meta(self: PostgresStore, cur: Any, items: Any) -> None:
        cluster.execute(_dbname(url), "SELECT pg_terminate_backend(%s)", (cur.connection.info.backend_pid,))
        real(self, cur, items)

    return write_meta


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["add", "delete"])
@pytest.mark.parametrize("point", ["commit", "inside", "connection"])
def test_failed_commit_leaves_memory_and_database_unchanged(kind, op, point, pg_cluster, pg_url, monkeypatch):
    mem = _open(kind, pg_url, "f")
    for i in range(9):
        mem.add(message_text(i))
    before = stripped(mem.to_dict())
    idx = index_snapshot(mem)
    hits = answers(mem)
    seq = mem._durable.seq
    if point == "commit":  # before the first row is written
        monkeypatch.setattr(
            PostgresStore, "commit", Fault(RuntimeError("injected")).wrap(PostgresStore.commit)
        )
        expected: type[BaseException] = RuntimeError
    elif point == "inside":  # the node rows written, the transaction not committed
        fault = Fault(KeyboardInterrupt())
        monkeypatch.setattr(PostgresStore, "_write_meta", fault.wrap(PostgresStore._write_meta))
        expected = KeyboardInterrupt
    else:  # the server ends the connection: a real OperationalError
        monkeypatch.setattr(PostgresStore, "_write_meta", _terminate_own_backend(pg_cluster, pg_url))
        expected = PersistenceError

    def run(m: HierarchicalMemory) -> None:
        if op == "add":
            m.add([message_text(20), message_text(21)])
        else:
            m.delete(m._store.leaves()[3])

    with pytest.raises(expected):
        run(mem)
    monkeypatch.undo()
    assert stripped(mem.to_dict()) == before
    after = index_snapshot(mem)
    assert after[0] == idx[0]
    np.testing.assert_array_equal(after[1], idx[1])
    assert answers(mem) == hits
    assert mem._durable.seq == seq

    # nothing was written and the namespace lock is free: another memory opens and writes at once
    other = _open(kind, pg_url, "f")
    assert stripped(other.to_dict()) == before
    _finish(*_in_thread(lambda: other.add(message_text(30))))
    run(mem)  # the same call again: catches up with the other memory's add first
    other.refresh()
    assert stripped(other.to_dict()) == stripped(mem.to_dict())
    texts = [message_text(i) for i in range(9)] + [message_text(30)]
    if op == "add":
        check_tree(mem, [*texts, message_text(20), message_text(21)])
    else:
        check_tree(mem, texts[:3] + texts[4:], deleted=True)
    mem.close_store()
    other.close_store()


def test_interrupt_after_the_commit_keeps_the_change(pg_url, monkeypatch):
    """KeyboardInterrupt after COMMIT returned: the server says the transaction committed, so the change
    stays in memory too."""
    mem = _open("segtree", pg_url, "k")
    mem.add([message_text(i) for i in range(4)])
    seq = mem._durable.seq
    monkeypatch.setattr(
        PostgresStore, "commit", Fault(KeyboardInterrupt(), after=True).wrap(PostgresStore.commit)
    )
    with pytest.raises(KeyboardInterrupt):
        mem.add(message_text(4))
    monkeypatch.undo()
    assert mem._durable.seq == seq + 1
    assert _leaf_texts(mem) == [message_text(i) for i in range(5)]
    mem.add(message_text(5))
    back = _open("segtree", pg_url, "k")
    check_tree(back, [message_text(i) for i in range(6)])
    assert stripped(back.to_dict()) == stripped(mem.to_dict())
    mem.close_store()
    back.close_store()


# --------------------------------------------------------------------------- server restarts
def test_server_restart_gives_persistence_error_then_reconnects(pg_cluster, pg_url):
    mem = _open("hat", pg_url, "r")
    reader = _open("hat", pg_url, "r")
    mem.add([message_text(i) for i in range(5)])
    assert len(reader.retrieve("dogs", k=3, policy="collapsed")) > 0
    before = stripped(mem.to_dict())
    pg_cluster.stop("fast")
    try:
        with pytest.raises(PersistenceError, match="next call connects again"):
            mem.add("written while the server is down")
        assert stripped(mem.to_dict()) == before
        with pytest.raises(PersistenceError):
            reader.retrieve("dogs", policy="collapsed")
    finally:
        pg_cluster.start()
    mem.add("written after the restart about dogs")  # the next call reconnects
    assert "written after the restart about dogs" in [
        h.text for h in reader.retrieve("restart dogs", k=3, policy="collapsed")
    ]
    check_tree(reader, [*(message_text(i) for i in range(5)), "written after the restart about dogs"])
    mem.close_store()
    reader.close_store()


class _RestartingEmbedder(HashEmbedder):
    """Restarts the server (crash: ``immediate``) in the middle of the next add, inside its transaction."""

    def __init__(self, cluster: Any) -> None:
        super().__init__()
        self.cluster = cluster
        self.armed = False

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed:
            self.armed = False
            self.cluster.stop("immediate")
            self.cluster.start()
        return super().embed(texts)


def test_server_crash_in_the_middle_of_an_add(pg_cluster, pg_url):
    """The server crashes and restarts while an add calls its models: no transaction is open then, so
    the add writes its change on a new connection and succeeds."""
    emb = _RestartingEmbedder(pg_cluster)
    mem = _open("segtree", pg_url, "crash", embedder=emb)
    mem.add([message_text(i) for i in range(4)])
    emb.armed = True
    mem.add(message_text(4))
    assert not emb.armed
    mem.add(message_text(5))
    back = _open("segtree", pg_url, "crash")
    check_tree(back, [message_text(i) for i in range(6)])
    assert stripped(back.to_dict()) == stripped(mem.to_dict())
    mem.close_store()
    back.close_store()


# --------------------------------------------------------------------------- concurrency
class _GateEmbedder(HashEmbedder):
    """Blocks inside ``embed`` (inside an add, computing its change) when armed by :meth:`hold`, until
    that hold's ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self._next: tuple[threading.Event, threading.Event, Callable[[], bool]] | None = None

    def hold(self, when: Callable[[], bool] = lambda: True) -> tuple[threading.Event, threading.Event]:
        """Block the next call of ``embed`` made while ``when()`` is true; returns ``(entered, release)``
        of that call."""
        self._next = (threading.Event(), threading.Event(), when)
        return self._next[0], self._next[1]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        gate = self._next
        if gate is not None and gate[2]():
            self._next = None
            gate[0].set()
            assert gate[1].wait(120)
        return super().embed(texts)


def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_slow_writer_holds_no_lock_until_it_was_overtaken(pg_cluster, pg_url):
    """A writer computing its change (a slow model call) holds no lock and no connection: a writer of
    the same namespace, a reader and a writer of another namespace go ahead. Overtaken, the slow writer
    computes its change again holding the namespace's lock: a writer of its namespace then waits for it
    in the database (readers and other namespaces still do not), and every write is applied once, each
    computed from all the writes committed before it."""
    url = f"{pg_url}&lock_timeout=120"
    gate = _GateEmbedder()
    slow = SegTreeMem.open(url, embedder=gate, namespace="one")
    slow.add("first message about cooking")
    peer = SegTreeMem.open(url, embedder=HashEmbedder(), namespace="one")
    reader = SegTreeMem.open(url, embedder=HashEmbedder(), namespace="one")
    elsewhere = SegTreeMem.open(url, embedder=HashEmbedder(), namespace="two")

    entered, release = gate.hold()
    slow_add = _in_thread(lambda: slow.add("slow writer message about dogs"))
    assert entered.wait(120)  # slow computes its change (first attempt: no lock held)
    _finish(*_in_thread(lambda: peer.add("peer message about travel")), timeout=60)
    assert _waiting_for_lock(pg_cluster, pg_url) == 0
    hits = _finish(*_in_thread(lambda: reader.retrieve("message", k=5, policy="collapsed")))
    assert sorted(h.text for h in hits) == ["first message about cooking", "peer message about travel"]
    _finish(*_in_thread(lambda: elsewhere.add("another namespace, another writer")))
    assert slow_add[0].is_alive()

    # the second attempt blocks too, now holding the namespace's lock
    entered2, release2 = gate.hold(lambda: slow._durable._writes.holding)
    release.set()  # let the first attempt go on: its commit finds the peer's change
    assert entered2.wait(120)
    peer_add = _in_thread(lambda: peer.add("second peer message about music"))
    _wait_for(lambda: _waiting_for_lock(pg_cluster, pg_url) > 0, "the peer never waited for the lock")
    hits = _finish(*_in_thread(lambda: reader.retrieve("message", k=5, policy="collapsed")))
    assert len(hits) == 2
    _finish(*_in_thread(lambda: elsewhere.add("the other namespace again")))
    assert peer_add[0].is_alive() and slow_add[0].is_alive()

    release2.set()
    _finish(*slow_add)
    _finish(*peer_add)
    want = [
        "first message about cooking",
        "peer message about travel",
        "slow writer message about dogs",
        "second peer message about music",
    ]
    assert _leaf_texts(peer) == want
    slow.refresh()
    assert stripped(slow.to_dict()) == stripped(peer.to_dict())
    check_tree(slow, want)
    assert _leaf_texts(elsewhere) == ["another namespace, another writer", "the other namespace again"]
    for m in (slow, peer, reader, elsewhere):
        m.close_store()


# --------------------------------------------------------------------------- namespaces
def test_memory_store_on_postgres(pg_url, tmp_path):
    emb = HashEmbedder()
    store = MemoryStore(lambda: SegTreeMem(emb), url=pg_url)
    store.add("alice", "alice likes dogs")
    store.add(("bob", "x"), ["bob likes travel", "bob likes travel to Rome"])
    assert store.list_namespaces() == [("alice",), ("bob", "x")]
    assert [h.text for h in store.retrieve("alice", "travel", k=5, policy="collapsed")] == [
        "alice likes dogs"
    ]
    assert store.save() == []

    second = MemoryStore(lambda: SegTreeMem(emb), url=pg_url)  # as another process would
    assert ("bob", "x") in second and "carol" not in second
    assert second.retrieve("carol", "anything", policy="collapsed") == [] and "carol" not in second
    assert len(second.get(("bob", "x"))) == 2
    second.add("alice", "alice also likes music")
    assert "alice also likes music" in [
        h.text for h in store.retrieve("alice", "music", k=5, policy="collapsed")
    ]
    assert all(
        "alice" not in h.text
        for h in store.retrieve(("bob", "x"), "alice music dogs", k=5, policy="collapsed")
    )

    with pytest.raises(PersistenceError, match="segtree"):
        MemTree.open(pg_url, embedder=emb, namespace=("bob", "x"))
    with pytest.raises(PersistenceError, match="32-d"):
        SegTreeMem.open(pg_url, embedder=HashEmbedder(dim=16), namespace=("bob", "x"))

    assert store.delete_namespace("alice")
    assert not store.delete_namespace("alice")
    third = MemoryStore(lambda: SegTreeMem(emb), url=pg_url)
    assert third.list_namespaces() == [("bob", "x")]
    # the other "process" notices the deletion: its add creates the namespace anew (see
    # tests/integration/test_pg_namespaces.py)
    second.add("alice", "into a deleted namespace")
    assert [h.text for h in third.retrieve("alice", "deleted", k=5, policy="collapsed")] == [
        "into a deleted namespace"
    ]
    assert second.delete_namespace("alice")
    store.close()
    second.close()
    assert len(third.get(("bob", "x"))) == 2  # reopened after close
    third.close()
    assert third.retrieve(("bob", "x"), "travel", k=1, policy="collapsed")  # opens the database again
    third.close()

    with pytest.raises(InvalidInputError, match="not both"):
        MemoryStore(lambda: SegTreeMem(emb), tmp_path, url=pg_url)
    with pytest.raises(InvalidInputError, match="PostgreSQL URL"):
        MemoryStore(lambda: SegTreeMem(emb), url="sqlite:///x.db")


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "url", ["postgresql://[bad", "postgresql://host:notaport/db", "postgresql://u@host/db?nonsense=1"]
)
def test_malformed_url(url):
    with pytest.raises(InvalidInputError, match="Malformed PostgreSQL URL"):
        SegTreeMem.open(url, embedder=HashEmbedder())


def test_unreachable_server(tmp_path):
    url = f"postgresql://nobody@/db?host={tmp_path}&port=5999&connect_timeout=2"
    with pytest.raises(PersistenceError, match="Check that the server is running"):
        SegTreeMem.open(url, embedder=HashEmbedder())
    with pytest.raises(PersistenceError, match="Check that the server is running"):
        MemoryStore(lambda: SegTreeMem(HashEmbedder()), url=url)


def test_missing_database(pg_cluster):
    with pytest.raises(PersistenceError, match="does not exist"):
        SegTreeMem.open(pg_cluster.url("no_such_db"), embedder=HashEmbedder())


def _relations(cluster: Any, db: str) -> list[tuple[object, ...]]:
    return cluster.execute(
        db,
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1, 2",
    )


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE hiermem.notes (id int)",
        "CREATE TABLE hiermem.version (version int); INSERT INTO hiermem.version VALUES (1); "
        "CREATE TABLE hiermem.namespaces (id int)",
    ],
)
def test_not_a_hiermem_database(pg_cluster, ddl):
    db = pg_cluster.create_database()
    pg_cluster.execute(db, "CREATE SCHEMA hiermem")
    for stmt in ddl.split("; "):
        pg_cluster.execute(db, stmt)
    rels = _relations(pg_cluster, db)
    with pytest.raises(PersistenceError, match="not a hiermem store"):
        SegTreeMem.open(pg_cluster.url(db), embedder=HashEmbedder())
    assert _relations(pg_cluster, db) == rels  # nothing written


def test_other_schema_version_and_tampered_rows(pg_cluster, pg_url):
    mem = _open("segtree", pg_url, "t")
    mem.add([message_text(i) for i in range(4)])
    mem.close_store()
    db = _dbname(pg_url)
    pg_cluster.execute(db, "UPDATE hiermem.version SET version = 99")
    with pytest.raises(VersionMismatchError, match="version 99"):
        _open("segtree", pg_url, "t")
    pg_cluster.execute(db, "UPDATE hiermem.version SET version = 1")
    pg_cluster.execute(db, "UPDATE hiermem.meta SET value = '7' WHERE key = 'format'")
    with pytest.raises(VersionMismatchError, match="layout"):
        _open("segtree", pg_url, "t")
    pg_cluster.execute(db, "UPDATE hiermem.meta SET value = '1' WHERE key = 'format'")

    reader = _open("segtree", pg_url, "t")
    writer = _open("segtree", pg_url, "t")
    before = stripped(reader.to_dict())
    writer.add("a new message about dogs")
    pg_cluster.execute(
        db, "UPDATE hiermem.nodes SET data = '[1]' WHERE seq = (SELECT max(seq) FROM hiermem.nodes)"
    )
    with pytest.raises(PersistenceError, match="corrupt"):
        reader.retrieve(
            "dogs", policy="collapsed"
        )  # the catch-up refuses the malformed row; the memory is unchanged
    assert stripped(reader.to_dict()) == before
    with pytest.raises(PersistenceError, match="corrupt"):
        _open("segtree", pg_url, "t")
    writer.close_store()
    reader.close_store()


def test_options_of_the_other_backend(pg_cluster, pg_url, tmp_path):
    with pytest.raises(InvalidInputError, match="namespace= applies to PostgreSQL"):
        SegTreeMem.open(tmp_path / "m.sqlite", embedder=HashEmbedder(), namespace="a")
    with pytest.raises(InvalidInputError, match="synchronous"):
        SegTreeMem.open(pg_url, embedder=HashEmbedder(), synchronous="NORMAL")
    with pytest.raises(InvalidInputError, match="scheme"):
        SegTreeMem.open("mysql://u@h/db", embedder=HashEmbedder())
    with pytest.raises(InvalidInputError, match="Namespace part 1 is empty"):
        SegTreeMem.open(pg_url, embedder=HashEmbedder(), namespace=("a", ""))
    with pytest.raises(InvalidInputError, match="new store"):
        HierarchicalMemory.open(pg_url, embedder=HashEmbedder(), namespace="nothing here")
    assert pg_cluster.execute(_dbname(pg_url), "SELECT count(*) FROM hiermem.namespaces")[0][0] == 0


# --------------------------------------------------------------------------- many processes
def _pg_writer(kind: str, url: str, ns: tuple[str, ...], tag: str, n: int, conn: Any, stall_at: int) -> None:
    """Child: open ``ns``, wait for "go", add ``n`` messages and send each acknowledgement with the
    change sequence the add got; at message ``stall_at`` stop inside COMMIT (rows written, not
    committed) and tell the parent, which kills the process. At the end, on "final": catch up and send
    the memory and a retrieval."""
    mem = memory_class(kind).open(url, embedder=HashEmbedder(), namespace=ns)
    conn.send(("ready", len(mem)))
    assert conn.recv() == "go"
    for i in range(n):
        if i == stall_at:

            def stalled(self: Any, i: int = i) -> None:
                conn.send(("committing", i))
                time.sleep(300)

            psycopg.Connection.commit = stalled  # type: ignore[method-assign]
        mem.add(Message(f"{tag} says {i}: {message_text(i)}", id=f"{tag}-{i}"))
        conn.send(("ack", i, mem._durable.seq))
    conn.send(("done", n))
    assert conn.recv() == "final"
    mem.refresh()
    hits = [(h.text, round(h.score, 5)) for h in mem.retrieve(QUERY, k=5, policy="collapsed")]
    conn.send(("final", stripped(mem.to_dict()), hits))
    mem.close_store()


def test_processes_share_a_namespace_and_one_is_killed_mid_add(pg_url):
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.integration.test_postgres"])
    n, stall_at = 50, 20
    jobs = [(("team",), f"s{k}", stall_at if k == 0 else -1) for k in range(4)]
    jobs += [((f"own{k}",), f"o{k}", -1) for k in range(4)]
    procs, conns = [], []
    for ns, tag, stall in jobs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_pg_writer, args=("segtree", pg_url, ns, tag, n, child, stall), daemon=True)
        p.start()
        procs.append(p)
        conns.append(parent)
    try:
        for c in conns:
            assert c.poll(180), "a writer did not open its namespace"
            assert c.recv()[0] == "ready"
        for c in conns:
            c.send("go")
        acks: dict[str, list[tuple[int, int]]] = {tag: [] for _, tag, _ in jobs}
        killed: set[int] = set()
        finished: set[int] = set()
        deadline = time.monotonic() + 600
        while len(killed | finished) < len(jobs):
            assert time.monotonic() < deadline, "the writers did not finish"
            live = [c for j, c in enumerate(conns) if j not in killed | finished]
            for c in wait_any(live, timeout=5):
                j = conns.index(c)
                msg = c.recv()
                if msg[0] == "ack":
                    acks[jobs[j][1]].append((msg[1], msg[2]))
                elif msg[0] == "committing":
                    os.kill(procs[j].pid, signal.SIGKILL)
                    killed.add(j)
                elif msg[0] == "done":
                    finished.add(j)
        assert killed == {0} and len(acks["s0"]) == stall_at
        finals = []
        for j in sorted(finished):
            conns[j].send("final")
        for j in sorted(finished):
            assert conns[j].poll(180)
            finals.append((jobs[j][0], conns[j].recv()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(30)

    texts = {tag: [f"{tag} says {i}: {message_text(i)}" for i in range(n)] for _, tag, _ in jobs}
    team = HierarchicalMemory.open(pg_url, embedder=HashEmbedder(), namespace="team")
    leaves = _leaf_texts(team)
    acked = {texts[tag][i]: seq for tag in ("s0", "s1", "s2", "s3") for i, seq in acks[tag]}
    assert len(leaves) == len(set(leaves)) == len(acked) == 3 * n + stall_at  # each once, nothing else
    assert set(leaves) == set(acked)
    assert texts["s0"][stall_at] not in leaves  # the killed add left nothing behind
    assert leaves == sorted(leaves, key=lambda t: acked[t])  # arrival (commit) order
    check_tree(team, leaves)
    want_hits = [(h.text, round(h.score, 5)) for h in team.retrieve(QUERY, k=5, policy="collapsed")]
    for k in range(4):
        own = HierarchicalMemory.open(pg_url, embedder=HashEmbedder(), namespace=f"own{k}")
        check_tree(own, texts[f"o{k}"])
        own.close_store()
    for ns, (_, data, hits) in finals:
        if ns == ("team",):
            assert data == stripped(team.to_dict())  # every process holds the same memory
            assert hits == want_hits  # and answers the same top-k
    team.close_store()


def test_len_and_stats_catch_up_with_other_processes(pg_url):
    a = _open("segtree", pg_url, "counts")
    b = _open("segtree", pg_url, "counts")
    a.add([message_text(i) for i in range(4)])
    assert len(b) == 4 and b.stats()["leaves"] == 4  # no refresh() needed
    a.delete(a._store.leaves()[0])
    assert b.stats()["leaves"] == len(b) == 3
    a.close_store()
    b.close_store()
