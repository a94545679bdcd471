"""Facts, a word-hash LangChain embedder and store factories for the LangGraph store tests."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore

from langchain_hiermem import HierMemStore
from langchain_hiermem.store_durable import DurableHierMemStore
from shared_core.types import (
    ModelError,
    PersistenceError,
)
from tests.support.memory import HashEmbedder

DIM = 32


MEMORY_KWARGS = {"relevance": "dense"}


FACTS = [
    "My dog is called Luna and she is a beagle.",
    "I work as a night nurse at the city hospital.",
    "Last summer we hiked the Pyrenees for two weeks.",
    "My favourite dish is a spicy ramen with egg.",
    "The car broke down on the motorway on Tuesday.",
    "I am learning to play the cello on weekends.",
]


class WordHashEmbeddings(Embeddings):
    """``HashEmbedder`` (one seeded random vector per word, summed) as LangChain ``Embeddings``: the same
    vectors in every process, so stores built on it are deterministic."""

    def __init__(self, dim: int = DIM) -> None:
        self._emb = HashEmbedder(dim)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._emb.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


EMBEDDINGS = WordHashEmbeddings()


def index(embed: Any = EMBEDDINGS, fields: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"dims": DIM, "embed": embed}
    if fields is not None:
        out["fields"] = fields
    return out


def open_store(conn: Any, embed: Any = EMBEDDINGS, **kw: Any) -> Any:
    """``HierMemStore.from_conn_string`` with the deterministic embeddings and dense relevance."""
    return HierMemStore.from_conn_string(
        conn, index=index(embed, kw.pop("fields", None)), memory_kwargs=MEMORY_KWARGS, **kw
    )


def leaves(store: HierMemStore, ns: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(key, text)`` of every leaf of a namespace's memory, sorted."""
    mem = store.get_memory(ns)
    nodes = mem.to_dict()["tree"]["nodes"] if mem is not None else []
    return sorted((n["message"]["id"], n["text"]) for n in nodes if n["is_leaf"])


NAMESPACES = [("a",), ("b", "x"), ("b", "y")]


KEYS = ["k1", "k2", "k3"]


TEXTS = [
    "the dog runs on the beach",
    "my dog likes the cold sea",
    "jazz music on a rainy night",
    "cooking pasta with fresh basil",
    "music and cooking at the beach",
]


def _items(items: list[Any]) -> list[tuple[Any, ...]]:
    return [(tuple(i.namespace), i.key, i.value) for i in items]


def _prune(ref: InMemoryStore) -> None:
    """InMemoryStore lists a namespace once touched (a get, a delete), items or not; HierMemStore (like
    LangGraph's database stores) lists namespaces that hold items. Drop the empty ones from the reference."""
    for ns in [ns for ns, items in ref._data.items() if not items]:
        del ref._data[ns]


NS = ("memories", "ann")


class FailOn(WordHashEmbeddings):
    """Embeddings that fail when asked to embed a given text."""

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.bad in texts:
            raise ModelError("embedding service failed")
        return super().embed_documents(texts)


def snapshot(
    store: BaseStore, queries: tuple[str, ...] = ("dog", "hospital nurse", "ramen egg"), scores: bool = True
) -> Any:
    """Everything a client can read: namespaces, every item (with timestamps) in order, and query
    searches (keys, values and, with ``scores``, scores) per namespace prefix. A failed put deletes its
    new texts again, which can reshape the tree above the old ones: their scores may change, not the
    items or the leaves."""

    def rows(items: list[Any]) -> list[Any]:
        return [
            (i.namespace, i.key, i.value, i.created_at, i.updated_at, round(i.score or 0, 5) * scores)
            for i in items
        ]

    namespaces = store.list_namespaces()
    out: dict[str, Any] = {"namespaces": namespaces, "all": rows(store.search((), limit=1000))}
    for ns in [(), *namespaces]:
        for q in queries:
            out[f"{ns}:{q}"] = rows(store.search(ns, query=q, limit=4))
    return out


def fill(store: HierMemStore) -> None:
    """Puts of every kind: new keys, an update, a delete, unindexed items, text fields, a batch."""
    for i, fact in enumerate(FACTS[:4]):
        store.put(NS, f"k{i}", {"text": fact, "n": i})
    store.put(NS, "k0", {"text": "My dog is now called Nala.", "n": 0})  # update: replaces the text
    store.delete(NS, "k2")
    store.put(NS, "plain", {"n": 99}, index=False)
    store.put(("memories", "bob"), "note", {"note": FACTS[4], "tags": ["car"]}, index=["note"])
    store.batch(
        [
            PutOp(("other",), "a", {"text": FACTS[5], "nested": {"x": [1, 2.5, None, True]}}),
            PutOp(("other",), "b", {"content": "unicode: café ☕ \u00e9"}),
            PutOp(("other",), "a", {"text": FACTS[5] + " Again.", "nested": {"x": []}}),
        ]
    )


def mirrors(store: HierMemStore) -> None:
    """Each namespace's memory holds exactly the texts its items index, under their keys."""
    for ns in store.list_namespaces():
        want = []
        for item in store.search(ns, limit=1000):
            if item.namespace != ns:
                continue
            texts = [item.value[f] for f in ("text", "content", "note") if isinstance(item.value.get(f), str)]
            if item.key == "plain":
                texts = []
            want += [(item.key, t) for t in texts[:1]]
        assert leaves(store, ns) == sorted(want), ns


def round_trip(conn: Any) -> None:
    with open_store(conn) as s:
        assert isinstance(s, DurableHierMemStore) and isinstance(s, BaseStore)
        fill(s)
        before = snapshot(s)
        mirrors(s)
    assert s.closed
    with pytest.raises(PersistenceError, match="closed"):
        s.get(NS, "k0")
    with open_store(conn) as s:
        assert snapshot(s) == before
        assert s.get(NS, "k0").value == {"text": "My dog is now called Nala.", "n": 0}
        assert s.get(NS, "k2") is None
        mirrors(s)
        # the store goes on from where it was: updates keep the creation time and the insertion order
        created = s.get(NS, "k1").created_at
        s.put(NS, "k1", {"text": FACTS[1] + " Still.", "n": 1})
        s.put(NS, "k9", {"text": "A new fact about cellos and music.", "n": 9})
        assert s.get(NS, "k1").created_at == created
        assert [i.key for i in s.search(NS, limit=10)] == ["k0", "k1", "k3", "plain", "k9"]
        assert asyncio.run(s.aget(NS, "k9")).value["n"] == 9
        assert [i.key for i in asyncio.run(s.asearch(NS, query="cellos and music", limit=1))] == ["k9"]
        after = snapshot(s)
        mirrors(s)
    with open_store(conn) as s:
        assert snapshot(s) == after


START = datetime(2025, 5, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    """A settable clock: ``clock()`` is the time, ``clock.tick(minutes)`` advances it."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def tick(self, minutes: float) -> None:
        self.now += timedelta(minutes=minutes)


def expiry_persists_across_reopen(conn: Any) -> None:
    """Expiry times and refreshes are written to the store: a reopened store expires and sweeps as before."""
    clock = Clock()
    with open_store(conn) as s:
        s._clock = clock
        s.put(NS, "a", {"text": FACTS[0]}, ttl=1)
        s.put(NS, "b", {"text": FACTS[1]}, ttl=1)
        s.put(NS, "c", {"text": FACTS[2]})
        clock.tick(0.5)
        assert s.get(NS, "a") is not None  # refreshed: until 1.5, written to the database
    clock.tick(0.6)
    with open_store(conn) as s:
        s._clock = clock
        assert s.get(NS, "b") is None and s.get(NS, "a", refresh_ttl=False) is not None
        assert s.sweep_ttl() == 1
    clock.tick(0.3)
    with open_store(conn) as s:
        s._clock = clock
        assert [i.key for i in s.search(NS, refresh_ttl=False)] == ["a", "c"]
        clock.tick(0.1)
        assert s.sweep_ttl() == 1
        assert [i.key for i in s.search(NS)] == ["c"] and leaves(s, NS) == [("c", FACTS[2])]


def a_store_before_ttls_is_migrated(conn: Any, run: Callable[[str], Any], t: str) -> None:
    """A store of format 1 (no TTL columns; ``run`` executes SQL on it, ``t`` prefixes its tables) opens
    with its items kept and takes TTLs."""
    with open_store(conn) as s:
        s.put(NS, "a", {"text": FACTS[0]})
    for sql in (
        "ALTER TABLE {t}items DROP COLUMN ttl_minutes",
        "ALTER TABLE {t}items DROP COLUMN expires_at",
    ):
        run(sql.format(t=t))  # the layout of format 1
    run(f"UPDATE {t}meta SET value = '1' WHERE key = 'format'")
    clock = Clock()
    with open_store(conn) as s:
        s._clock = clock
        assert s.get(NS, "a").value == {"text": FACTS[0]}
        s.put(NS, "b", {"text": FACTS[1]}, ttl=1)
    clock.tick(1)
    with open_store(conn) as s:
        s._clock = clock
        assert [i.key for i in s.search(NS)] == ["a"]


#: namespaces of the max_resident tests
SPACES = [("users", f"u{n}") for n in range(6)]


class CountingEmbeddings(WordHashEmbeddings):
    """Deterministic embeddings that count the documents they embed."""

    def __init__(self) -> None:
        super().__init__()
        self.documents = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents += len(texts)
        return super().embed_documents(texts)


def langgraph_bounds(conn: Any) -> None:
    """Puts and searches over six namespaces with ``max_resident=2``: at most two memories are open (and
    held) after every operation, evicted memories are freed, every namespace answers as a store without
    a bound does, and reopening an evicted namespace embeds no stored text again."""
    emb = CountingEmbeddings()
    with open_store(conn, embed=emb, max_resident=2, fields=["text"]) as store:
        mems = store._memories
        assert mems.max_resident == 2
        refs = []
        for n, ns in enumerate(SPACES):
            store.put(ns, "a", {"text": f"user {n} likes the colour number {n}"})
            store.put(ns, "b", {"text": f"user {n} walks a dog called dog{n}"})
            refs.append(weakref.ref(store.get_memory(ns)))
            assert mems.resident <= 2
            assert sum(sp.memory is not None for sp in store._spaces.values()) <= 2
        assert mems.stats()["evictions"] >= len(SPACES) - 2
        gc.collect()
        assert sum(r() is not None for r in refs) <= 2  # evicted memories are let go, not kept in RAM
        embedded = emb.documents
        for _ in range(2):
            for n, ns in enumerate(SPACES):
                hits = store.search(ns, query=f"dog{n}", limit=2)
                assert [h.key for h in hits][:1] == ["b"]
                assert {h.value["text"] for h in hits} == {
                    f"user {n} likes the colour number {n}",
                    f"user {n} walks a dog called dog{n}",
                }
                assert mems.resident <= 2
        queries = 2 * len(SPACES)
        assert emb.documents - embedded <= queries  # only the queries: no stored text embedded again
        assert store.list_namespaces() == sorted(SPACES)
        store.delete(SPACES[0], "a")  # a put on an evicted namespace reopens it and removes its text
        assert [h.key for h in store.search(SPACES[0], query="colour", limit=5)] == ["b"]
    with open_store(conn, embed=emb, max_resident=1, fields=["text"]) as store:
        assert [h.key for h in store.search(SPACES[0], query="colour", limit=5)] == ["b"]
        assert store._memories.resident <= 1
