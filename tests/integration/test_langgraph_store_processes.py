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

import os
import signal
from typing import Any

import pytest
from langgraph.store.memory import InMemoryStore

from shared_core.types import PersistenceError
from tests.support.langgraph_store import TEXTS, index, leaves, open_store
from tests.support.langgraph_workers import WAIT, Worker

NS = ("memories", "shared")


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
