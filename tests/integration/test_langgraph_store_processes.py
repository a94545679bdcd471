"""One durable LangGraph store on PostgreSQL, used by several real processes at once.

Each worker process opens ``HierMemStore.from_conn_string(pg_url)`` and runs the operations the test
sends it over a pipe. Checked: interleaved puts and deletes from two processes, read back by either one
without reopening, give what LangGraph's ``InMemoryStore`` gives replaying the same operations in their
global order; puts racing on one namespace never lose or duplicate an item or leave its text unindexed;
a worker SIGKILLed in the middle of a put (its texts in the memory, its items not committed) leaves a
store the other process keeps using, with every text of the killed put gone. SQLite keeps one process
per store, and says to use PostgreSQL for several.

The PostgreSQL server is the private one of ``pg_cluster`` / ``pg_url`` (tests/conftest.py); the tests
are skipped where no PostgreSQL binaries exist.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest
from langgraph.store.base import PutOp
from langgraph.store.memory import InMemoryStore

from shared_core.types import PersistenceError
from tests.support.langgraph_store import TEXTS, index, leaves, open_store

NS = ("memories", "shared")
WAIT = 300  # seconds a reply may take before the test gives up (a hung worker, never a timing check)


def _rows(items: list[Any]) -> list[tuple[Any, ...]]:
    return [(tuple(i.namespace), i.key, i.value) for i in items]


def _run(store: Any, msg: tuple[Any, ...]) -> Any:
    kind = msg[0]
    if kind == "put":
        store.put(msg[1], msg[2], msg[3])
        return None
    if kind == "delete":
        store.delete(msg[1], msg[2])
        return None
    if kind == "batch":
        store.batch([PutOp(*op) for op in msg[1]])
        return None
    if kind == "get":
        item = store.get(msg[1], msg[2])
        return None if item is None else _rows([item])[0]
    if kind == "search":
        return _rows(store.search(msg[1], query=msg[2], limit=100))
    if kind == "list":
        return store.list_namespaces()
    if kind == "leaves":
        return leaves(store, msg[1])
    raise ValueError(kind)


def _worker(url: str, conn: Any, hold_key: str | None = None) -> None:
    """Open the store and answer the parent's operations until ``("stop",)``. With ``hold_key``, a run
    of puts holding that key stops for good after its texts are in the memory, before its items are
    committed (and says so): the parent kills the process there."""
    from langchain_hiermem.store_durable import DurableHierMemStore

    if hold_key is not None:
        commit = DurableHierMemStore._commit_puts

        def held(self: Any, added: Any, now: Any) -> None:
            if any(op.key == hold_key for a in added for op in a.ops):
                conn.send(("holding", os.getpid()))
                while True:  # until SIGKILL
                    time.sleep(60)
            commit(self, added, now)

        DurableHierMemStore._commit_puts = held  # type: ignore[method-assign]
    try:
        opened = open_store(url, fields=["text"])
        store = opened.__enter__()
    except Exception as e:  # reported to the parent, which fails the test
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            try:
                conn.send(("ok", _run(store, msg)))
            except Exception as e:  # reported to the parent, which fails the test
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        opened.__exit__(None, None, None)


class Worker:
    """A worker process and its end of the pipe."""

    def __init__(self, url: str, hold_key: str | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(url, child, hold_key), daemon=True)
        self.proc.start()
        assert self.reply() == ("ready",)

    def reply(self) -> Any:
        for _ in range(WAIT):
            if self.conn.poll(1):
                return self.conn.recv()
            assert self.proc.is_alive(), f"the worker died (exit code {self.proc.exitcode})"
        raise AssertionError("the worker did not answer")

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def __call__(self, *msg: Any) -> Any:
        self.send(*msg)
        status, result = self.reply()
        assert status == "ok", result
        return result

    def stop(self) -> None:
        if self.proc.is_alive():
            self.send("stop")
            self.proc.join(WAIT)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(WAIT)


@pytest.fixture
def workers(pg_url):
    started: list[Worker] = []

    def start(hold_key: str | None = None) -> Worker:
        started.append(Worker(pg_url, hold_key))
        return started[-1]

    yield start
    for w in started:
        w.stop()


def _normalised(rows: list[Any]) -> list[Any]:
    return sorted((tuple(r[0]), r[1], r[2]) for r in rows)


def test_two_processes_see_each_others_puts_and_deletes(workers):
    """Interleaved puts, batches and deletes by two processes, each read back by both without reopening,
    match InMemoryStore replaying the operations in their global order."""
    a, b = workers(), workers()
    ref = InMemoryStore(index=index(fields=["text"]))
    spaces = [NS, ("memories", "other"), ("team", "x")]
    ops: list[tuple[Any, ...]] = []
    for n in range(24):
        ns, key = spaces[n % 3], f"k{n % 5}"
        if n % 7 == 6:
            ops.append(("delete", ns, key))
        elif n % 5 == 4:
            ops.append(("batch", [(ns, key, {"text": TEXTS[n % 5], "n": n}), (spaces[0], "b", {"n": n})]))
        else:
            ops.append(("put", ns, key, {"text": TEXTS[n % 5], "n": n}))
    for n, op in enumerate(ops):
        writer, reader = (a, b) if n % 2 == 0 else (b, a)
        writer(*op)
        if op[0] == "put":
            ref.put(op[1], op[2], op[3])
        elif op[0] == "delete":
            ref.delete(op[1], op[2])
        else:
            for put in op[1]:
                ref.put(*put)
        for ns in {op[1] if op[0] != "batch" else op[1][0][0], NS}:
            want = [(tuple(i.namespace), i.key, i.value) for i in ref.search(ns, limit=100)]
            assert [tuple(r) for r in reader("search", ns, None)] == [(tuple(r[0]), r[1], r[2]) for r in want]
            assert _normalised(reader("search", ns, "dog beach")) == _normalised(want)
        if op[0] != "batch":
            got = reader("get", op[1], op[2])
            item = ref.get(op[1], op[2])
            assert (got is None) == (item is None) and (item is None or got[2] == item.value)
        names = sorted(ns for ns in ref.list_namespaces() if ref.search(ns, limit=1))
        assert [tuple(x) for x in reader("list")] == names == [tuple(x) for x in writer("list")]
    for w in (a, b):
        for ns in spaces:
            texts = sorted((i.key, i.value["text"]) for i in ref.search(ns, limit=100) if "text" in i.value)
            assert [tuple(x) for x in w("leaves", ns)] == texts


def test_concurrent_puts_to_one_namespace_lose_and_duplicate_nothing(workers, pg_url):
    a, b = workers(), workers()
    shared = [f"s{i}" for i in range(3)]
    plan = {
        a: [("put", NS, f"a{i}", {"text": f"{TEXTS[i % 5]} from a {i}"}) for i in range(10)],
        b: [("put", NS, f"b{i}", {"text": f"{TEXTS[(i + 2) % 5]} from b {i}"}) for i in range(10)],
    }
    for w, name in ((a, "a"), (b, "b")):
        plan[w] += [("put", NS, key, {"text": f"{key} written by {name}", "by": name}) for key in shared]
        plan[w] += [("delete", NS, f"{name}{i}") for i in (1, 5)]
    for step in range(max(len(p) for p in plan.values())):  # both processes write at once
        for w, p in plan.items():
            if step < len(p):
                w.send(*p[step])
        for w, p in plan.items():
            if step < len(p):
                assert w.reply() == ("ok", None)
    want_keys = {f"{n}{i}" for n in "ab" for i in range(10) if i not in (1, 5)} | set(shared)
    for reader in (a, b):
        items = reader("search", NS, None)
        assert sorted(r[1] for r in items) == sorted(want_keys)  # none lost, none twice
        texts = sorted((r[1], r[2]["text"]) for r in items)
        assert [tuple(x) for x in reader("leaves", NS)] == texts  # each indexed by its own text, once
    with open_store(pg_url, fields=["text"]) as s:
        assert sorted(i.key for i in s.search(NS, limit=100)) == sorted(want_keys)
        assert leaves(s, NS) == sorted((i.key, i.value["text"]) for i in s.search(NS, limit=100))


def test_a_worker_killed_in_the_middle_of_a_put_leaves_a_consistent_store(workers, pg_url):
    a = workers()
    victim = workers(hold_key="doomed")
    a("put", NS, "k1", {"text": TEXTS[0]})
    victim("put", NS, "k2", {"text": TEXTS[1]})
    victim.send(
        "batch", [(NS, "doomed", {"text": "a secret the killed put was adding"}), (NS, "k1", {"text": "x"})]
    )
    status, pid = victim.reply()
    assert status == "holding"
    # the killed put's texts are in the memory, its items are not committed: nothing of it is read
    assert a("get", NS, "doomed") is None and a("get", NS, "k1")[2] == {"text": TEXTS[0]}
    os.kill(pid, signal.SIGKILL)
    victim.proc.join(WAIT)
    a("put", NS, "k3", {"text": TEXTS[2]})  # the write lock died with the victim; this repairs the memory
    items = a("search", NS, None)
    assert [r[1] for r in items] == ["k1", "k2", "k3"] and items[0][2] == {"text": TEXTS[0]}
    assert [tuple(x) for x in a("leaves", NS)] == [("k1", TEXTS[0]), ("k2", TEXTS[1]), ("k3", TEXTS[2])]
    with open_store(pg_url, fields=["text"]) as s:
        assert leaves(s, NS) == [("k1", TEXTS[0]), ("k2", TEXTS[1]), ("k3", TEXTS[2])]
        mem = s.get_memory(NS)
        assert not any("secret" in n["text"] for n in mem.to_dict()["tree"]["nodes"])


def test_an_sqlite_store_serves_one_process_and_names_postgresql(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_store(path) as s:
        s.put(NS, "a", {"text": TEXTS[0]})
        with pytest.raises(PersistenceError, match="one process at a time.*postgresql://"), open_store(path):
            pass
