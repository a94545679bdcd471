"""TTLs of ``HierMemStore`` and its durable form, as LangGraph defines them (``put(ttl=...)``, ``TTLConfig``,
``refresh_ttl``, ``sweep_ttl`` / ``start_ttl_sweeper`` / ``stop_ttl_sweeper``).

Time is a settable clock (the store's ``_clock``): no test sleeps for minutes or asserts on durations. The
reference is LangGraph's ``InMemoryStore`` (which keeps no TTLs) with an expiry model: an item whose TTL
ran out is deleted from it, which is what a read of a TTL store must show.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.memory import InMemoryStore

from langchain_hiermem import HierMemStore
from shared_core.types import InvalidInputError
from tests.support.langgraph_store import (
    FACTS,
    KEYS,
    MEMORY_KWARGS,
    NAMESPACES,
    TEXTS,
    Clock,
    _items,
    _prune,
    a_store_before_ttls_is_migrated,
    expiry_persists_across_reopen,
    index,
    leaves,
    open_store,
)

NS = ("memories", "ann")


def ram_store(clock: Clock, **kw: Any) -> HierMemStore:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS, **kw)
    store._clock = clock
    return store


@pytest.fixture(params=["ram", "sqlite"])
def make(request, tmp_path):
    """A function ``make(clock, **kw)`` opening the store under test (in RAM, or durable on SQLite)."""
    with ExitStack() as stack:

        def build(clock: Clock, **kw: Any) -> HierMemStore:
            if request.param == "ram":
                return ram_store(clock, **kw)
            store = stack.enter_context(open_store(tmp_path / "s.sqlite", **kw))
            store._clock = clock
            return store

        yield build


def texts_of(store: HierMemStore, ns: tuple[str, ...]) -> list[str]:
    """Every node text of a namespace's memory: leaves and summaries."""
    mem = store.get_memory(ns)
    return [n["text"] for n in mem.to_dict()["tree"]["nodes"]] if mem is not None else []


def test_stores_declare_ttl_support_and_take_a_ttl():
    clock = Clock()
    store = ram_store(clock)
    assert HierMemStore.supports_ttl and store.supports_ttl and store.ttl_config is None
    store.put(NS, "a", {"text": FACTS[0]}, ttl=1.5)  # was NotImplementedError
    assert store.get(NS, "a") is not None


def test_an_item_expires_for_get_search_and_list_namespaces(make):
    clock = Clock()
    store = make(clock)
    store.put(NS, "dog", {"text": FACTS[0]}, ttl=1)
    store.put(NS, "job", {"text": FACTS[1]})  # no TTL
    store.put(("other",), "x", {"text": FACTS[2]}, ttl=0.5)
    clock.tick(0.75)
    assert [i.key for i in store.search((), limit=10, refresh_ttl=False)] == ["dog", "job"]
    assert store.list_namespaces() == [NS]
    clock.tick(0.25)  # exactly at the expiry: expired
    assert store.get(NS, "dog") is None
    assert [i.key for i in store.search(NS, query="dog beagle", limit=10)] == ["job"]
    assert [i.key for i in store.search(NS, filter={"text": FACTS[0]})] == []
    assert store.get(NS, "job") is not None
    assert store.list_namespaces() == [NS]


def test_refresh_on_read_extends_the_expiry_when_asked(make):
    clock = Clock()
    store = make(clock)
    store.put(NS, "a", {"text": FACTS[0]}, ttl=1)
    store.put(NS, "b", {"text": FACTS[1]}, ttl=1)
    store.put(NS, "c", {"text": FACTS[2]}, ttl=1)
    clock.tick(0.9)
    assert store.get(NS, "a") is not None  # refresh_ttl defaults to True: a lives until 1.9
    assert store.get(NS, "b", refresh_ttl=False) is not None
    assert [i.key for i in store.search(NS, filter={"text": FACTS[2]})] == ["c"]  # c refreshed too
    clock.tick(0.2)
    assert store.get(NS, "b") is None
    assert store.get(NS, "a", refresh_ttl=False) is not None
    assert store.get(NS, "c", refresh_ttl=False) is not None
    clock.tick(0.8)
    assert store.get(NS, "a") is None and store.get(NS, "c") is None


def test_the_ttl_config_gives_defaults(make):
    clock = Clock()
    store = make(clock, ttl={"default_ttl": 2, "refresh_on_read": False})
    assert store.ttl_config == {"default_ttl": 2, "refresh_on_read": False}
    store.put(NS, "default", {"text": FACTS[0]})
    store.put(NS, "forever", {"text": FACTS[1]}, ttl=None)
    store.put(NS, "short", {"text": FACTS[2]}, ttl=1)
    clock.tick(1.5)
    assert store.get(NS, "short") is None
    assert store.get(NS, "default") is not None  # not refreshed: refresh_on_read is False
    assert store.get(NS, "forever", refresh_ttl=True) is not None
    clock.tick(0.5)
    assert store.get(NS, "default") is None and store.get(NS, "forever") is not None


def test_a_put_sets_the_ttl_anew_and_an_expired_key_comes_back_new(make):
    clock = Clock()
    store = make(clock)
    store.put(NS, "a", {"text": FACTS[0]}, ttl=1)
    store.put(NS, "b", {"text": FACTS[1]})
    store.put(NS, "a", {"text": FACTS[0], "v": 2})  # no ttl: the TTL is removed
    clock.tick(5)
    assert store.get(NS, "a").value["v"] == 2
    store.put(NS, "a", {"text": FACTS[2]}, ttl=1)
    clock.tick(1)
    store.put(NS, "a", {"text": FACTS[3]})  # expired, not swept: a new item, listed last
    item = store.get(NS, "a")
    assert item.created_at == clock.now and [i.key for i in store.search(NS)] == ["b", "a"]
    assert leaves(store, NS) == sorted([("a", FACTS[3]), ("b", FACTS[1])])


def test_sweep_deletes_expired_items_and_every_trace_of_their_text(make):
    clock = Clock()
    store = make(clock)
    for i, fact in enumerate(FACTS):
        store.put(NS, f"k{i}", {"text": fact}, ttl=1 if i % 2 else None)
    clock.tick(1)
    assert any(FACTS[1] in t for t in texts_of(store, NS))
    assert store.sweep_ttl() == 3
    assert store.sweep_ttl() == 0
    assert [i.key for i in store.search(NS)] == ["k0", "k2", "k4"]
    assert leaves(store, NS) == sorted((f"k{i}", FACTS[i]) for i in (0, 2, 4))
    for gone in (FACTS[1], FACTS[3], FACTS[5]):  # no leaf, no summary keeps the text
        assert not any(gone in t for t in texts_of(store, NS))


def test_omit_expired_false_returns_expired_items_until_swept(make):
    clock = Clock()
    store = make(clock, ttl={"omit_expired": False})
    store.put(NS, "a", {"text": FACTS[0]}, ttl=1)
    clock.tick(2)
    assert store.get(NS, "a", refresh_ttl=False) is not None and store.list_namespaces() == [NS]
    assert store.sweep_ttl() == 1
    assert store.get(NS, "a") is None and store.list_namespaces() == []


def test_expiry_persists_across_reopen(tmp_path):
    expiry_persists_across_reopen(tmp_path / "s.sqlite")


def test_a_store_of_the_format_before_ttls_is_migrated(tmp_path):
    conn = tmp_path / "s.sqlite"

    def run(sql: str) -> Any:
        with sqlite3.connect(conn) as c:
            rows = c.execute(sql).fetchall()
        c.close()
        return rows

    a_store_before_ttls_is_migrated(conn, run, "")


def test_async_puts_and_reads_take_ttls():
    clock = Clock()
    store = ram_store(clock)

    async def run() -> None:
        await store.aput(NS, "a", {"text": FACTS[0]}, ttl=1)
        clock.tick(0.5)
        assert await store.aget(NS, "a") is not None  # refreshed until 1.5
        clock.tick(0.75)
        assert [i.key for i in await store.asearch(NS, refresh_ttl=False)] == ["a"]
        clock.tick(0.25)
        assert await store.aget(NS, "a") is None
        assert await store.asweep_ttl() == 1

    asyncio.run(run())


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), "5", True])
def test_bad_ttls_are_refused_and_change_nothing(ttl):
    store = ram_store(Clock())
    with pytest.raises(InvalidInputError, match="ttl"):
        store.put(NS, "a", {"text": FACTS[0]}, ttl=ttl)
    assert store.get(NS, "a") is None and store.get_memory(NS) is None


@pytest.mark.parametrize(
    "config",
    [{"default_tll": 5}, {"default_ttl": 0}, {"refresh_on_read": "yes"}, {"sweep_interval_minutes": -1}, 5],
)
def test_bad_ttl_configs_are_refused(config, tmp_path):
    with pytest.raises(InvalidInputError, match="(?i)ttl"):
        HierMemStore(ttl=config)
    with pytest.raises(InvalidInputError, match="(?i)ttl"), open_store(tmp_path / "s.sqlite", ttl=config):
        pass


def test_the_background_sweeper_sweeps_until_stopped(make):
    clock = Clock()
    store = make(clock, ttl={"sweep_interval_minutes": 1})
    store.put(NS, "a", {"text": FACTS[0]}, ttl=1)
    store.put(NS, "b", {"text": FACTS[1]})
    clock.tick(1)
    swept = threading.Event()
    sweep = store.sweep_ttl

    def counted() -> int:
        n = sweep()
        swept.set()
        return n

    store.sweep_ttl = counted  # type: ignore[method-assign]
    future = store.start_ttl_sweeper(sweep_interval_minutes=0.0005)
    assert swept.wait(60), "the sweeper never swept"
    assert store.stop_ttl_sweeper(timeout=60)
    assert future.result(timeout=60) is None
    assert [i.key for i in store.search(NS)] == ["b"] and leaves(store, NS) == [("b", FACTS[1])]
    assert store.stop_ttl_sweeper()  # idempotent


# =========================================================================== differential test
_put = st.tuples(
    st.just("put"),
    st.sampled_from(NAMESPACES),
    st.sampled_from(KEYS),
    st.fixed_dictionaries({"n": st.integers(0, 3)}, optional={"text": st.sampled_from(TEXTS)}),
    st.sampled_from([None, None, 1, 2.5]),
)
_ops = st.lists(
    st.one_of(
        _put,
        _put,
        st.tuples(st.just("delete"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS)),
        st.tuples(st.just("get"), st.sampled_from(NAMESPACES), st.sampled_from(KEYS), st.booleans()),
        st.tuples(
            st.just("search"),
            st.sampled_from([(), ("a",), ("b",)]),
            st.one_of(st.none(), st.sampled_from(["dog", "music cooking"])),
            st.booleans(),
        ),
        st.tuples(st.just("list")),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1, 1.25])),
        st.tuples(st.just("sweep")),
        st.tuples(st.just("reopen")),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_differential_against_in_memory_store_with_expiry(ops):
    """Random puts with and without TTLs, reads that refresh or not, clock ticks, sweeps and reopens of
    the durable store give the items LangGraph's InMemoryStore gives when each item is deleted from it
    as its TTL runs out; each memory holds exactly the texts of the live and not yet swept items."""
    ref = InMemoryStore(index=index(fields=["text"]))
    clock = Clock()
    expiry: dict[tuple[Any, str], tuple[float, datetime]] = {}  # items with a TTL, until swept
    dead: set[tuple[Any, str]] = set()  # expired, deleted from the reference, not yet swept
    texts: dict[tuple[Any, str], str] = {}  # the indexed text of every item not yet swept

    def expire() -> None:
        for k, (_, at) in expiry.items():
            if at <= clock.now and k not in dead:
                ref.delete(*k)
                dead.add(k)

    def refresh(found: list[Any]) -> None:
        for item in found:
            k = (tuple(item.namespace), item.key)
            if k in expiry:
                expiry[k] = (expiry[k][0], clock.now + timedelta(minutes=expiry[k][0]))

    def forget(k: tuple[Any, str]) -> None:
        expiry.pop(k, None)
        dead.discard(k)
        texts.pop(k, None)

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        path = Path(tmp) / "s.sqlite"

        def reopen() -> Any:
            s = stack.enter_context(open_store(path, fields=["text"], synchronous="NORMAL"))
            s._clock = clock
            return s

        dur = reopen()
        for op in ops:
            expire()
            kind = op[0]
            if kind == "put":
                _, ns, key, value, ttl = op
                dur.put(ns, key, value, ttl=ttl)
                ref.put(ns, key, value)
                forget((ns, key))
                if ttl is not None:
                    expiry[(ns, key)] = (ttl, clock.now + timedelta(minutes=ttl))
                if "text" in value:
                    texts[(ns, key)] = value["text"]
            elif kind == "delete":
                dur.delete(op[1], op[2])
                ref.delete(op[1], op[2])
                forget((op[1], op[2]))
            elif kind == "get":
                got, want = dur.get(op[1], op[2], refresh_ttl=op[3]), ref.get(op[1], op[2])
                assert (got is None) == (want is None)
                if got is not None:
                    assert _items([got]) == _items([want])
                    if op[3]:
                        refresh([got])
            elif kind == "search":
                _, prefix, query, fresh = op
                got = dur.search(prefix, query=query, limit=100, refresh_ttl=fresh)
                want = ref.search(prefix, query=query, limit=100)
                assert sorted(_items(got), key=repr) == sorted(_items(want), key=repr)
                if fresh:
                    refresh(got)
            elif kind == "list":
                _prune(ref)
                assert dur.list_namespaces() == ref.list_namespaces()
            elif kind == "tick":
                clock.tick(op[1])
            elif kind == "sweep":
                due = set(dead)
                assert dur.sweep_ttl() == len(due)
                for k in due:
                    forget(k)
            else:
                stack.close()
                dur = reopen()
        expire()
        _prune(ref)
        for ns in NAMESPACES:
            assert _items(dur.search(ns, limit=100)) == _items(ref.search(ns, limit=100))
        assert dur.list_namespaces() == ref.list_namespaces()
        assert dur.sweep_ttl() == len(dead)
        for k in set(dead):
            forget(k)
        for ns in NAMESPACES:
            assert leaves(dur, ns) == sorted((key, t) for (n, key), t in texts.items() if n == ns)
