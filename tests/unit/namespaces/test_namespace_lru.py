"""MemoryStore keeps a bounded set of namespaces resident (LRU) and reopens the others from their stores.

A process serving thousands of users must neither run out of file descriptors (two per open SQLite
namespace) nor keep every namespace it ever served in RAM; an evicted namespace answers exactly as before
(nothing is embedded again), and a memory a caller or another thread still uses is never broken. 3,000
users in one process and PostgreSQL namespaces: tests/integration/test_namespace_lru_processes.py.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import HAT, MemTree, Message, SegTreeMem, XMemory
from shared_core.namespaces import DEFAULT_MAX_RESIDENT, MemoryStore
from shared_core.stores.resident import EvictedStore
from shared_core.types import InvalidInputError, NodeNotFoundError
from tests.support.namespaces import EMB, CountingEmbedder, _msgs, _sources


class SlowEmbedder(CountingEmbedder):
    """Takes a millisecond per call, so that threads overlap inside memories."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.001)
        return super().embed(texts)


def _answers(hits: Any) -> list[tuple[str, float, tuple[int, int], tuple[str, ...]]]:
    return [(h.text, round(float(h.score), 5), tuple(h.span), tuple(h.source_ids)) for h in hits]


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


# --------------------------------------------------------------------------- the argument
def test_max_resident_is_validated(tmp_path: Path) -> None:
    f = lambda: SegTreeMem(EMB)  # noqa: E731
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(InvalidInputError, match="max_resident"):
            MemoryStore(f, tmp_path, durable=True, max_resident=bad)  # type: ignore[arg-type]
    assert MemoryStore(f, tmp_path, durable=True).max_resident == DEFAULT_MAX_RESIDENT == 256
    assert MemoryStore(f, tmp_path, durable=True, max_resident=None).stats()["max_resident"] is None


def test_the_mcp_server_store_uses_the_default(tmp_path: Path) -> None:
    from shared_core.serve.mcp_server import open_store

    for where in (tmp_path / "store", None):
        store = open_store(where, "segtree", EMB)
        assert store.max_resident == DEFAULT_MAX_RESIDENT
        store.close()


# --------------------------------------------------------------------------- same answers after a reopen
_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "retrieve", "delete"]), st.integers(0, 6), st.integers(0, 40)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, cls=st.sampled_from([SegTreeMem, MemTree, HAT, XMemory]))
def test_evicted_namespaces_answer_like_never_evicted_ones(
    ops: list[tuple[str, int, int]], cls: type
) -> None:
    words = ["otter", "falcon", "lynx", "heron", "bison", "gecko", "music", "garden", "code", "travel"]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        small = MemoryStore(lambda: cls(EMB), a, durable=True, synchronous="NORMAL", max_resident=3)
        whole = MemoryStore(lambda: cls(EMB), b, durable=True, synchronous="NORMAL", max_resident=None)
        added: dict[int, list[str]] = {}
        try:
            for step, (op, u, x) in enumerate(ops):
                ns = ("user", str(u))
                if op == "add":
                    mid = f"s{step}"
                    text = f"user {u} note {x}: {words[x % 10]} and {words[(x * 7 + u) % 10]}"
                    for s in (small, whole):
                        s.add(ns, Message(text, id=mid))
                    added.setdefault(u, []).append(mid)
                elif op == "delete":
                    ids = added.get(u)
                    if not ids:
                        for s in (small, whole):
                            with pytest.raises(NodeNotFoundError):
                                s.delete(ns, "nope")
                        continue
                    mid = ids.pop(x % len(ids))
                    assert small.delete(ns, mid) == whole.delete(ns, mid)
                else:
                    q = f"{words[x % 10]} {words[(x + u) % 10]}"
                    assert _answers(small.retrieve(ns, q, k=5)) == _answers(whole.retrieve(ns, q, k=5))
                assert small.resident <= 3
            for u in added:
                ns = ("user", str(u))
                for q in words[:3]:
                    assert _answers(small.retrieve(ns, q, k=8)) == _answers(whole.retrieve(ns, q, k=8))
            if len({u for op, u, _ in ops if op == "add"}) > 3:
                assert small.stats()["evictions"] > 0
        finally:
            small.close()
            whole.close()


def test_reopening_never_embeds_again(tmp_path: Path) -> None:
    emb = CountingEmbedder()
    store = MemoryStore(lambda: SegTreeMem(emb), tmp_path, durable=True, max_resident=2)
    for i in range(10):
        store.add(f"user{i}", _msgs(i))
    assert store.stats()["evictions"] == 8 and store.resident == 2
    before = len(emb.texts)
    for _round in range(2):
        for i in range(10):
            hits = store.retrieve(f"user{i}", f"w{i}x secret", k=3)
            assert f"m{i}a" in _sources(hits) and _sources(hits) <= {f"m{i}a", f"m{i}b"}
    assert len(emb.texts) - before == 20  # the queries, nothing else
    assert all("secret" in t for t in emb.texts[before:])
    assert store.resident == 2
    store.close()


def test_in_memory_namespaces_are_never_evicted() -> None:
    store = MemoryStore(lambda: SegTreeMem(EMB), max_resident=2)
    for i in range(6):
        store.add(f"user{i}", _msgs(i))
    assert store.resident == 6 and store.stats()["evictions"] == 0
    for i in range(6):
        assert f"m{i}a" in _sources(store.retrieve(f"user{i}", f"w{i}x secret", k=3))


def test_saved_namespaces_are_never_evicted(tmp_path: Path) -> None:
    """``root_dir`` without ``durable``: the memories live only in RAM until ``save()``."""
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, max_resident=2)
    for i in range(5):
        store.add(f"user{i}", _msgs(i))
    assert store.resident == 5
    assert len(store.save()) == 5


# --------------------------------------------------------------------------- handles held by callers
def test_a_held_memory_keeps_working_after_its_eviction(tmp_path: Path) -> None:
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True, max_resident=2)
    held = store.get_or_create("alice")
    held.add(_msgs(0))
    for i in range(1, 5):  # alice is evicted: her store is closed, the handle stays valid
        store.add(f"user{i}", _msgs(i))
    assert isinstance(held._durable, EvictedStore) and store.resident == 2
    fds = _open_fds()
    held.add(Message("alice adopted a beagle named Luna", id="luna"))  # reopens her store in place
    assert not isinstance(held._durable, EvictedStore)
    assert store.get("alice") is held  # one memory per namespace, never two
    assert store.resident == 2 and store.stats()["reopened"] == 1
    if fds is not None:
        assert _open_fds() == fds  # another namespace's store was closed to make room
    assert "luna" in _sources(store.retrieve("alice", "beagle Luna", k=3))
    store.close()
    again = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True)
    assert {"m0a", "m0b", "luna"} <= _sources(again.retrieve("alice", "beagle Luna secret w0x", k=5))
    again.close()


def test_an_unreferenced_evicted_memory_is_freed(tmp_path: Path) -> None:
    import gc

    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True, max_resident=1)
    store.add("alice", _msgs(0))
    ref = weakref.ref(store.get_or_create("alice"))
    store.add("bob", _msgs(1))
    gc.collect()
    assert ref() is None
    assert "m0a" in _sources(store.retrieve("alice", "w0x secret", k=3))
    store.close()


def test_deleting_an_evicted_namespace(tmp_path: Path) -> None:
    store = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True, max_resident=1)
    store.add("alice", _msgs(0))
    held = store.get_or_create("alice")
    store.add("bob", _msgs(1))
    assert "alice" in store and store.list_namespaces() == [("alice",), ("bob",)]
    assert store.delete_namespace("alice")
    assert "alice" not in store and store.retrieve("alice", "secret") == []
    assert held.store_location is None  # never reopens the deleted store: in memory only
    assert not (tmp_path / store.path_of("alice").name).exists()  # type: ignore[union-attr]
    store.close()


# --------------------------------------------------------------------------- threads
def test_threads_on_more_namespaces_than_resident_never_hit_a_closed_store(tmp_path: Path) -> None:
    n_ns, n_threads, per_thread = 12, 6, 40
    emb = SlowEmbedder()  # calls overlap: evictions are tried while other threads are inside memories
    store = MemoryStore(lambda: SegTreeMem(emb), tmp_path, durable=True, synchronous="NORMAL", max_resident=3)
    added: dict[int, list[str]] = {u: [] for u in range(n_ns)}
    guard = threading.Lock()
    errors: list[BaseException] = []

    def work(t: int) -> None:
        rnd = random.Random(t)
        try:
            for j in range(per_thread):
                u = rnd.randrange(n_ns)
                ns = f"user{u}"
                r = rnd.random()
                if r < 0.4:
                    mid = f"t{t}-{j}"
                    store.add(ns, Message(f"user{u} fact {mid} about topic{u}", id=mid))
                    with guard:
                        added[u].append(mid)
                elif r < 0.7:
                    hits = store.retrieve(ns, f"topic{u} fact", k=20)
                    assert all(s.startswith("t") for s in _sources(hits))
                    assert all(f"user{u} " in h.text for h in hits if h.is_leaf)
                else:  # a caller holding the memory itself, as HierMemStore and the MCP server do
                    mem = store.get_or_create(ns)
                    hits = mem.retrieve(f"topic{u}", k=5) if len(mem) else []
                    assert all(f"user{u} " in h.text for h in hits if h.is_leaf)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert store.stats()["evictions"] > 0
    store.retrieve("user0", "topic0")
    assert store.resident <= 3
    store.close()
    again = MemoryStore(lambda: SegTreeMem(EMB), tmp_path, durable=True, max_resident=None)
    for u, ids in added.items():
        mem = again.get(f"user{u}")
        got = set() if mem is None else {s for s, lids in mem._store.by_source.items() if lids}
        assert got == set(ids), u
    again.close()


def test_opening_a_namespace_does_not_block_the_others(tmp_path: Path) -> None:
    """A namespace is read from its store outside the table's lock: while one thread opens a namespace
    (here its factory waits), calls on other namespaces go on."""
    release, entered = threading.Event(), threading.Event()
    timed_out: list[bool] = []

    def factory(ns: tuple[str, ...]) -> SegTreeMem:
        if ns == ("slow",):
            entered.set()
            timed_out.append(not release.wait(20))  # times out only when the calls below were blocked
        return SegTreeMem(EMB)

    store = MemoryStore(factory, tmp_path, durable=True, max_resident=2)
    store.add("b", _msgs(1))
    store.add("c", _msgs(2))
    opener = threading.Thread(target=store.add, args=("slow", _msgs(0)))
    opener.start()
    assert entered.wait(30)
    assert "m1a" in _sources(store.retrieve("b", "w1x secret", k=3))  # resident
    store.add("d", _msgs(3))  # a new namespace, evicting one
    assert "m2a" in _sources(store.retrieve("c", "w2x secret", k=3))  # evicted: reopened
    release.set()
    opener.join()
    assert timed_out == [False]
    assert "m0a" in _sources(store.retrieve("slow", "w0x secret", k=3))
    assert store.resident <= 2
    store.close()


# --------------------------------------------------------------------------- hiermem bench
def test_bench_namespace_profile() -> None:
    from shared_core.bench.core import namespace_profile

    p = namespace_profile("segtree", 60, namespaces=3, reopens=3)
    assert p["embedded_texts_on_reopen"] == 0
    assert p["cold_open"]["cpu"]["median_ms"] > 0 and p["sqlite_bytes_per_message"] > 0
    rss = p["rss_per_resident_message_bytes"]
    assert rss is None or isinstance(rss, float)
    with pytest.raises(InvalidInputError):
        namespace_profile("segtree", 0)
