"""PostgreSQL namespaces shared by processes: a namespace deleted (or deleted and re-created) by another
process, and the pruning of the ``removed`` tombstones (shared_core/stores/pg_prune.py).

Two ``MemoryStore`` (or memory) instances on one database stand for two processes: each opens its own
``PostgresDatabase`` (pools, registrations); two tests use real child processes. Every test runs against
the private PostgreSQL server of tests/conftest.py and a fresh database.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'hiermem[postgres]')")

import shared_core.stores.postgres as pgstore  # noqa: E402
from shared_core import HierarchicalMemory, Message, SegTreeMem  # noqa: E402
from shared_core.namespaces import MemoryStore, NamespaceDeletedError  # noqa: E402
from shared_core.stores import pg_prune  # noqa: E402
from shared_core.stores.namespace import namespace_key  # noqa: E402
from shared_core.stores.postgres import LOCK_CLASS, PostgresDatabase  # noqa: E402
from shared_core.types import NodeNotFoundError, VersionMismatchError  # noqa: E402
from tests.support.faults import answers, index_snapshot  # noqa: E402
from tests.support.memory import KINDS, HashEmbedder, check_tree, memory_class, message_text, stripped  # noqa: E402

EMB = HashEmbedder()


def _store(url: str) -> MemoryStore:
    return MemoryStore(lambda: SegTreeMem(EMB), url=url)


def _texts(hits: list[Any]) -> list[str]:
    return sorted(h.text for h in hits)


def _leaf_texts(mem: HierarchicalMemory) -> list[str]:
    return [mem._store.nodes[i].text for i in mem._store.leaves()]


def _dbname(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(url)["dbname"])


class _Db:
    """What the database holds, read as the superuser (another connection than the stores')."""

    def __init__(self, cluster: Any, url: str) -> None:
        self.cluster, self.name = cluster, _dbname(url)

    def sql(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        return self.cluster.execute(self.name, sql, params)

    def ns_id(self, ns: Any) -> int | None:
        rows = self.sql("SELECT id FROM hiermem.namespaces WHERE name = %s", (namespace_key(ns),))
        return int(rows[0][0]) if rows else None

    def tombstones(self, ns: Any) -> list[int]:
        """The seq of every ``removed`` row of ``ns``."""
        return [
            int(r[0]) for r in self.sql("SELECT seq FROM hiermem.removed WHERE ns = %s", (self.ns_id(ns),))
        ]

    def all_tombstones(self) -> int:
        return int(self.sql("SELECT count(*) FROM hiermem.removed")[0][0])

    def readers(self, ns: Any) -> list[int]:
        """The seq of every registration of ``ns``."""
        rows = self.sql("SELECT seq FROM hiermem.readers WHERE ns = %s ORDER BY seq", (self.ns_id(ns),))
        return [int(r[0]) for r in rows]

    def seqs(self, ns: Any) -> tuple[int, int]:
        """The namespace's (seq, reset_seq)."""
        row = self.sql("SELECT seq, reset_seq FROM hiermem.namespaces WHERE id = %s", (self.ns_id(ns),))[0]
        return int(row[0]), int(row[1])

    def age(self, reg_id: int, seconds: float = 3600.0) -> None:
        """Make a registration's heartbeat ``seconds`` old (its process looks dead)."""
        self.sql(
            "UPDATE hiermem.readers SET heartbeat = now() - make_interval(secs => %s) WHERE id = %s",
            (seconds, reg_id),
        )


@pytest.fixture
def db(pg_cluster, pg_url) -> _Db:
    return _Db(pg_cluster, pg_url)


@pytest.fixture
def eager(monkeypatch):
    """Every catch-up and commit writes its registration, and every commit prunes."""
    monkeypatch.setattr(pg_prune.Registry, "heartbeat_interval", 0.0)
    monkeypatch.setattr(pg_prune.Registry, "prune_interval", 0.0)


@pytest.fixture
def full_loads(monkeypatch) -> list[str]:
    """Counts the full reloads of a namespace (a catch-up that applies changes does not count)."""
    loads: list[str] = []
    real = pgstore.restore_rows
    monkeypatch.setattr(pgstore, "restore_rows", lambda *a: (loads.append("full"), real(*a))[1])
    return loads


def _reg_id(mem: HierarchicalMemory) -> int:
    reg = mem._durable._registration
    assert reg.id is not None
    return int(reg.id)


# --------------------------------------------------------------------------- namespaces deleted elsewhere
def test_memory_store_notices_a_namespace_deleted_by_another(pg_url, db):
    a, b = _store(pg_url), _store(pg_url)
    a.add("alice", ["alice likes dogs", "alice likes music"])
    a.add("bob", "bob likes travel")
    assert _texts(b.retrieve("alice", "dogs", k=5, policy="collapsed")) == [
        "alice likes dogs",
        "alice likes music",
    ]
    assert b.list_namespaces() == [("alice",), ("bob",)]
    old_id = db.ns_id("alice")

    assert a.delete_namespace("alice")
    # b still holds its memory of alice, and learns of the deletion from the database
    assert ("alice",) in b._mems
    assert b.list_namespaces() == [("bob",)] and len(b) == 1
    assert ("alice",) not in b._mems  # the stale memory was forgotten
    assert "alice" not in b and b.get("alice") is None

    assert b.retrieve("alice", "dogs", policy="collapsed") == []
    assert ("alice",) not in b._mems and db.ns_id("alice") is None  # a read creates nothing
    assert old_id is not None
    a.close()
    b.close()


def test_a_malformed_namespace_row_is_skipped_with_on_invalid(pg_url, db):
    """A tampered namespace row (its name not a namespace) raises without ``on_invalid`` and is reported
    and left out with it: the other namespaces stay listable (the MCP server's list_namespaces)."""
    store = _store(pg_url)
    store.add("alice", "alice likes dogs")
    store.add("bob", "bob likes travel")
    tampered = '{"not": "a namespace"}'
    db.sql("UPDATE hiermem.namespaces SET name = %s WHERE id = %s", (tampered, db.ns_id("bob")))
    with pytest.raises(pgstore.PersistenceError, match="malformed namespace name"):
        store.list_namespaces()
    bad: list[Any] = []
    assert store.list_namespaces(on_invalid=lambda row, e: bad.append((row, e))) == [("alice",)]
    assert len(bad) == 1 and "not" in bad[0][0] and isinstance(bad[0][1], pgstore.PersistenceError)
    store.close()


@pytest.mark.parametrize("how", ["retrieve", "aretrieve", "delete", "get"])
def test_read_of_a_namespace_deleted_elsewhere_is_as_for_one_that_never_existed(pg_url, db, how):
    a, b = _store(pg_url), _store(pg_url)
    a.add("alice", [Message("alice likes dogs", id="d"), "alice likes music"])
    mem = b.get("alice")
    assert mem is not None and len(mem) == 2
    a.delete_namespace("alice")
    assert ("alice",) in b._mems  # b has not asked the database since
    if how == "retrieve":
        assert b.retrieve("alice", "dogs", policy="collapsed") == []
        assert b.retrieve("never", "dogs", policy="collapsed") == []
    elif how == "aretrieve":
        assert asyncio.run(b.aretrieve("alice", "dogs", policy="collapsed")) == []
    elif how == "delete":
        with pytest.raises(NodeNotFoundError, match="No namespace"):
            b.delete("alice", "d")
        with pytest.raises(NodeNotFoundError, match="No namespace"):
            b.delete("never", "d")
    else:
        assert b.get("alice") is None and b.get("never") is None
    assert ("alice",) not in b._mems
    assert db.ns_id("alice") is None  # a read never creates the namespace again
    # the memory object handed out before is stale: it says so rather than answering from old data
    with pytest.raises(NamespaceDeletedError, match="deleted"):
        mem.retrieve("dogs", policy="collapsed")
    a.close()
    b.close()


@pytest.mark.parametrize("first", ["add", "aadd", "retrieve", "get_or_create"])
def test_add_after_another_process_re_created_the_namespace(pg_url, db, first):
    a, b = _store(pg_url), _store(pg_url)
    a.add("alice", [f"old {message_text(i)}" for i in range(5)])
    assert len(b.get("alice")) == 5
    old_id = db.ns_id("alice")
    a.delete_namespace("alice")
    a.add("alice", "new alice likes dogs")  # re-created: another row, another id
    assert db.ns_id("alice") != old_id

    if first == "add":
        b.add("alice", "b adds about dogs")
    elif first == "aadd":
        asyncio.run(b.aadd("alice", "b adds about dogs"))
    elif first == "retrieve":
        assert _texts(b.retrieve("alice", "dogs", k=10, policy="collapsed")) == ["new alice likes dogs"]
        b.add("alice", "b adds about dogs")
    else:
        assert len(b.get_or_create("alice")) == 1
        b.add("alice", "b adds about dogs")
    want = ["b adds about dogs", "new alice likes dogs"]
    assert _texts(b.retrieve("alice", "dogs", k=10, policy="collapsed")) == want
    assert _texts(a.retrieve("alice", "dogs", k=10, policy="collapsed")) == want
    fresh = _store(pg_url)  # the same memory as one opened afresh
    assert stripped(b.get("alice").to_dict()) == stripped(fresh.get("alice").to_dict())
    check_tree(b.get("alice"), _leaf_texts(fresh.get("alice")))
    for s in (a, b, fresh):
        s.close()


def test_add_after_deletion_creates_the_namespace_anew(pg_url, db):
    a, b = _store(pg_url), _store(pg_url)
    a.add("alice", "old alice likes dogs")
    b.get("alice")
    a.delete_namespace("alice")
    b.add("alice", "b starts over about dogs")  # no error: as for a namespace never seen
    assert a.list_namespaces() == b.list_namespaces() == [("alice",)]
    assert _texts(a.retrieve("alice", "dogs", k=5, policy="collapsed")) == ["b starts over about dogs"]
    a.close()
    b.close()


def test_the_check_is_the_catch_up_itself(pg_url, monkeypatch):
    """An add or retrieval of an open namespace asks nothing more of the database than before: the
    catch-up that already reads the namespace's row (by id) tells that it was deleted."""
    a, b = _store(pg_url), _store(pg_url)
    a.add("alice", "alice likes dogs")
    b.retrieve("alice", "dogs", policy="collapsed")
    reads: list[str] = []
    real = PostgresDatabase.read
    monkeypatch.setattr(
        PostgresDatabase,
        "read",
        lambda self, fn, what="read", **kw: (reads.append(what), real(self, fn, what, **kw))[1],
    )
    b.retrieve("alice", "dogs", policy="collapsed")
    assert len(reads) == 1 and reads[0].startswith("catch up")
    reads.clear()
    b.add("alice", "b adds")  # an add catches up in a read-only snapshot before it computes, as a retrieval
    assert len(reads) == 1 and reads[0].startswith("catch up")
    a.close()
    b.close()


def test_two_memory_stores_in_turn_delete_and_re_create(pg_url):
    stores = [_store(pg_url), _store(pg_url)]
    for rnd in range(4):
        me, other = stores[rnd % 2], stores[(rnd + 1) % 2]
        me.add("team", f"round {rnd} about dogs")
        assert _texts(other.retrieve("team", "dogs", k=5, policy="collapsed")) == [f"round {rnd} about dogs"]
        other.add("team", f"round {rnd} reply about dogs")
        assert len(me.get("team")) == 2
        me.delete_namespace("team")
        assert other.list_namespaces() == []
    for s in stores:
        s.close()


def _child_store(url: str, conn: Any) -> None:
    """Child process: a MemoryStore that opens two namespaces, waits while the parent deletes both and
    re-creates one, then reports what it sees and adds."""
    store = MemoryStore(lambda: SegTreeMem(HashEmbedder()), url=url)
    store.add("shared", [f"old {message_text(i)}" for i in range(4)])
    store.add("gone", "gone about dogs")
    conn.send(("ready", store.list_namespaces()))
    assert conn.recv() == "go"
    out: dict[str, Any] = {"list": store.list_namespaces()}
    out["gone"] = store.retrieve("gone", "dogs", k=5, policy="collapsed")
    out["hits"] = sorted(h.text for h in store.retrieve("shared", "dogs", k=10, policy="collapsed"))
    store.add("shared", "child after the re-creation about dogs")
    out["len"] = len(store.get("shared"))
    conn.send(("done", out))
    store.close()


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.integration.test_pg_namespaces"])
    return ctx


def test_a_real_second_process_sees_the_deletion_and_re_creation(pg_url):
    ctx = _context()
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child_store, args=(pg_url, child), daemon=True)
    p.start()
    try:
        assert parent.poll(180), "the child did not start"
        assert parent.recv() == ("ready", [("gone",), ("shared",)])
        me = _store(pg_url)
        assert me.delete_namespace("gone") and me.delete_namespace("shared")
        me.add("shared", "parent re-created it about dogs")
        parent.send("go")
        assert parent.poll(180), "the child did not answer"
        tag, out = parent.recv()
    finally:
        if p.is_alive():
            p.join(30)
        if p.is_alive():
            p.kill()
    assert tag == "done"
    assert out == {
        "list": [("shared",)],
        "gone": [],
        "hits": ["parent re-created it about dogs"],
        "len": 2,
    }
    assert _texts(me.retrieve("shared", "dogs", k=5, policy="collapsed")) == [
        "child after the re-creation about dogs",
        "parent re-created it about dogs",
    ]
    me.close()


# --------------------------------------------------------------------------- tombstone pruning
def _open(url: str, ns: str = "p", kind: str = "segtree") -> HierarchicalMemory:
    return memory_class(kind).open(url, embedder=HashEmbedder(), namespace=ns)


def test_tombstones_are_pruned_once_every_live_reader_caught_up(pg_url, db, eager, full_loads):
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(8)])
    r = _open(pg_url)  # registers at its load
    full_loads.clear()
    s0 = w._durable.seq
    assert db.readers("p") == [s0, s0]

    w.delete("m1")
    s1 = w._durable.seq
    assert db.tombstones("p") and set(db.tombstones("p")) == {s1}  # r is behind: kept
    assert db.readers("p") == [s0, s1]

    r.retrieve("dogs", policy="collapsed")  # r catches up (applies the tombstones) and says so
    assert db.readers("p") == [s1, s1]
    w.delete("m2")
    s2 = w._durable.seq
    assert set(db.tombstones("p")) == {s2}  # s1's are gone: every live reader is past them
    assert db.seqs("p") == (s2, s1)  # the watermark: a process behind s1 reloads

    r.retrieve("dogs", policy="collapsed")  # r was past the watermark: an incremental catch-up
    w.add("one more about music")  # nobody behind s2 now
    assert db.tombstones("p") == []
    r.refresh()
    assert not full_loads
    assert stripped(r.to_dict()) == stripped(w.to_dict())
    assert answers(r) == answers(w)
    w.close_store()
    r.close_store()
    assert db.readers("p") == []  # closing deletes the registration


def test_a_reader_that_lags_keeps_the_tombstones(pg_url, db, eager, full_loads):
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(12)])
    r = _open(pg_url)
    full_loads.clear()
    start = r._durable.seq
    for i in range(0, 12, 2):
        w.delete(f"m{i}")
        w.add(f"again about dogs {i}")
    assert len(db.tombstones("p")) >= 6 and min(db.tombstones("p")) > start
    assert db.readers("p")[0] == start  # r never moved: nothing it needs was pruned
    assert db.seqs("p")[1] <= start
    r.retrieve("dogs", policy="collapsed")  # catches up incrementally, tombstones and all
    assert not full_loads
    assert stripped(r.to_dict()) == stripped(w.to_dict())
    fresh = _open(pg_url)
    assert answers(r) == answers(fresh)
    for m in (w, r, fresh):
        m.close_store()


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_considered_dead_reloads_fully_on_return(kind, pg_url, db, eager, full_loads):
    w = _open(pg_url, kind=kind)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(10)])
    r = _open(pg_url, kind=kind)
    behind = r._durable.seq
    db.age(_reg_id(r))  # r stays silent longer than dead_after: its process is considered dead
    for i in (1, 4, 7):
        w.delete(f"m{i}")
    w.add("after the deletions about dogs")
    assert db.readers("p") == [w._durable.seq]  # r's registration was deleted as dead
    assert db.tombstones("p") == []  # so nothing held the tombstones back
    assert db.seqs("p")[1] > behind  # and the watermark says r cannot catch up row by row

    loads = len(full_loads)
    hits = answers(r)  # r comes back: a full reload, then the same as a fresh open
    assert len(full_loads) == loads + 1
    fresh = _open(pg_url, kind=kind)
    assert hits == answers(fresh)
    assert stripped(r.to_dict()) == stripped(fresh.to_dict())
    assert sorted(index_snapshot(r)[0]) == sorted(index_snapshot(fresh)[0])
    check_tree(r, _leaf_texts(fresh), deleted=True)
    assert sorted(db.readers("p")) == [w._durable.seq] * 3  # r registered again
    for m in (w, r, fresh):
        m.close_store()


def test_without_the_watermark_the_dead_reader_would_keep_deleted_messages(pg_url, db, eager):
    """What the reload prevents: with the watermark taken back, the returning reader's incremental
    catch-up misses the pruned tombstones and keeps a deleted message."""
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(6)])
    r = _open(pg_url)
    db.age(_reg_id(r))
    w.delete("m2")
    w.add("after about dogs")
    assert db.tombstones("p") == []
    db.sql("UPDATE hiermem.namespaces SET reset_seq = 0")
    r.refresh()
    assert message_text(2) in _leaf_texts(r) and message_text(2) not in _leaf_texts(w)
    w.close_store()
    r.close_store()


def test_the_tables_stay_bounded_over_many_add_delete_cycles(pg_url, db, eager):
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(6)])
    r = _open(pg_url)
    written = most = 0
    for c in range(40):
        w.add([Message(f"cycle {c} about dogs {message_text(c)}", id=f"c{c}")])
        w.delete(f"c{c}")
        written += db.tombstones("p").count(w._durable.seq)  # kept: r has not seen them yet
        r.retrieve("dogs", policy="collapsed")  # an active reader
        if c % 10 == 9:  # now and then a short-lived reader comes and goes
            _open(pg_url).close_store()
        most = max(most, db.all_tombstones())
        assert len(db.readers("p")) == 2
    assert written >= 40  # at least one tombstone per cycle was written...
    assert most <= 2 * written / 40 + 2  # ...but the table holds about those of the last write
    assert stripped(r.to_dict()) == stripped(w.to_dict())
    w.close_store()
    r.close_store()


def test_pruning_runs_at_a_bounded_rate(pg_url, db, monkeypatch):
    monkeypatch.setattr(pg_prune.Registry, "prune_interval", 3600.0)
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(10)])
    reg = pg_prune.registry_of(w._durable.db)
    assert reg is not None and reg.prunings == 1  # the first commit of the store
    for i in range(5):
        w.delete(f"m{i}")
    assert reg.prunings == 1 and len(db.tombstones("p")) >= 5  # not again within the interval
    monkeypatch.setattr(pg_prune.Registry, "prune_interval", 0.0)
    w.add("one more")
    assert reg.prunings == 2 and db.tombstones("p") == []
    w.close_store()


def test_pruning_never_waits_for_a_writer(pg_url, db, eager):
    """The pruning only tries the namespace's lock: while a writer holds it, it is skipped."""
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(6)])
    w.delete("m1")
    r = _open(pg_url)
    w.delete("m2")
    r.refresh()
    assert db.tombstones("p")
    reg = pg_prune.registry_of(w._durable.db)
    assert reg is not None
    with psycopg.connect(pg_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, db.ns_id("p")))
        runs = reg.prunings
        reg.note(w._durable, wrote=True)  # as after a commit: returns at once
        assert reg.prunings == runs and db.tombstones("p")
        other.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, db.ns_id("p")))
    reg.note(w._durable, wrote=True)
    assert reg.prunings == runs + 1 and db.tombstones("p") == []
    w.close_store()
    r.close_store()


def _child_reader(url: str, conn: Any) -> None:
    """Child process: open namespace "p", report, then catch up whenever asked (writing its
    registration at every catch-up, as the parent's ``eager`` fixture does)."""
    pg_prune.Registry.heartbeat_interval = 0.0
    mem = SegTreeMem.open(url, embedder=HashEmbedder(), namespace="p")
    conn.send(("ready", mem._durable.seq, mem._durable._registration.id))
    while True:
        cmd = conn.recv()
        if cmd == "stop":
            break
        mem.refresh()
        conn.send(("at", mem._durable.seq, _leaf_texts(mem)))
    mem.close_store()
    conn.send(("closed",))


def test_a_reader_in_another_process_holds_back_pruning_until_caught_up_or_dead(pg_url, db, eager):
    w = _open(pg_url)
    w.add([Message(message_text(i), id=f"m{i}") for i in range(8)])
    ctx = _context()
    procs = []
    try:
        pipes = []
        for _ in range(2):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_child_reader, args=(pg_url, theirs), daemon=True)
            procs.append(p)
            p.start()
            pipes.append(mine)
        ids = []
        for c in pipes:
            assert c.poll(180)
            tag, seq, rid = c.recv()
            assert tag == "ready" and seq == w._durable.seq
            ids.append(rid)
        w.delete("m1")
        w.delete("m2")
        assert len(db.tombstones("p")) >= 2  # both children are behind

        pipes[0].send("refresh")  # one catches up; the other (killed below) never does
        assert pipes[0].poll(180)
        tag, seq, texts = pipes[0].recv()
        assert seq == w._durable.seq and texts == _leaf_texts(w)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join(30)
        w.add("more about dogs")
        assert db.tombstones("p"), "the killed reader's registration still holds them (not yet dead)"
        db.age(ids[1])  # ... until its heartbeat is older than dead_after
        w.add("and more about dogs")
        assert db.tombstones("p") == []
        assert sorted(db.readers("p")) == sorted([w._durable.seq, seq])

        pipes[0].send("refresh")
        assert pipes[0].poll(180)
        assert pipes[0].recv()[2] == _leaf_texts(w)
        pipes[0].send("stop")
        assert pipes[0].poll(180) and pipes[0].recv() == ("closed",)
        assert db.readers("p") == [w._durable.seq]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(30)
    w.close_store()


def test_the_registrations_connection_closes_with_the_store(pg_url, db, eager):
    store = _store(pg_url)
    store.add("a", "one about dogs")
    store.add("b", "two about music")
    database = store._db
    assert database is not None
    reg = pg_prune.registry_of(database, create=False)
    assert reg is not None and len(reg.ids) == 2 and reg._conn is not None
    store.close()
    assert pg_prune.registry_of(database, create=False) is None and reg._conn is None
    assert db.sql("SELECT count(*) FROM hiermem.readers")[0][0] == 0
    assert reg.errors == 0


def test_a_version_1_schema_is_upgraded_on_open(pg_cluster, pg_url, db):
    mem = _open(pg_url)
    mem.add([Message(message_text(i), id=f"m{i}") for i in range(5)])
    mem.close_store()
    db.sql("DROP TABLE hiermem.readers")  # as a version-1 hiermem left it
    db.sql("UPDATE hiermem.version SET version = 1")
    with pytest.raises(VersionMismatchError, match="setup=True"):
        PostgresDatabase(pg_url, setup=False)
    back = _open(pg_url)  # setup (the default) upgrades in place; the memory is intact
    assert db.sql("SELECT version FROM hiermem.version") == [(2,)]
    assert len(back) == 5 and db.readers("p") == [back._durable.seq]
    PostgresDatabase(pg_url, setup=False).close()
    back.close_store()
