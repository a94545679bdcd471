"""Forgetting leaves no trace: after a deletion no node of any memory holds a text or a vector made only
from the forgotten message, in memory, in a save, or in a durable SQLite store.

- xMemory, by hand: a fact that a later repeat merged into keeps living on that repeat, and is written
  again from it (its sentence, date, speaker and vector), with its theme; the same through save / load
  and an SQLite store reopened; the summariser's sentence cache and the BM25 index forget too. With an
  LLM: a fact written from an episode that lost a message is distilled again from the episodes left.
- A property test over SegTreeMem, MemTree, HAT and xMemory (hashed embedder, no LLM): after any
  sequence of adds and deletes every node's text is derivable from the live messages only.
- The caches of the process, for all four memories: after a deletion nothing the memory reaches (the
  summariser's sentence cache, the lexical index and its stemmer's word cache, the node store and index,
  HAT's aggregate cache; extension objects through what the garbage collector says they hold) nor
  the fact rule's process-wide cache holds a word of the forgotten message, while a sentence a live
  message shares keeps its vector (it is not embedded again); ``clear()`` empties them; the
  summariser's ``forget`` / ``clear`` and summarisers without them; a property test of the same over
  random adds, deletes and clears.
"""

from __future__ import annotations

import gc
import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared_core import HierarchicalMemory, Message
from shared_core.memories.xmemory import XMemory, extract_facts_rule, render_messages, rules
from shared_core.models.extractive import ExtractiveSummarizer, holds_words, split_sentences
from shared_core.models.openai_models import OpenAIChat
from shared_core.prompts import xmemory as P
from shared_core.search.index import normalize_rows
from tests.support.forget import KINDS4, cache_memory, exercise, traces_of
from tests.support.memory import HashEmbedder, check_tree, make_memory, message_text

LOCKER = "My locker code at the big city gym downtown near the station is {}."
FILLER = "We should plan the weekend hike with the kids soon."


def unit(emb: HashEmbedder, text: str) -> np.ndarray:
    return normalize_rows(np.asarray(emb.embed([text]), dtype=np.float32))[0]


def locker_memory(**kw: Any) -> XMemory:
    """The report's memory (hashed embedder, defaults): a fact, a filler turn two months later, the same
    fact with another code, and ``flush`` so that the last episode is distilled too (the repeat merges
    into the first fact: its text stays the first message's)."""
    mem = XMemory(HashEmbedder(), **kw)
    mem.add(Message(LOCKER.format(4512), id="old", speaker="ann", timestamp="2024-01-05T10:00:00"))
    mem.add(Message(FILLER, id="fill", speaker="bob", timestamp="2024-03-05T10:00:00"))
    mem.add(Message(LOCKER.format(7731), id="new", speaker="ann", timestamp="2024-05-05T10:00:00"))
    mem.flush()
    return mem


def semantics(mem: XMemory) -> list[int]:
    return sorted(i for i, n in mem._store.nodes.items() if n.level == 2 and not n.is_leaf)


def assert_forgotten(mem: HierarchicalMemory, secret: str, forgotten_vectors: list[np.ndarray]) -> None:
    """No node text holds ``secret``; no indexed vector equals one made only from forgotten text."""
    st_ = mem._store
    assert all(secret not in n.text for n in st_.nodes.values())
    data = {k: v for k, v in mem.to_dict().items() if k != "usage"}  # timings may hold any digits
    assert secret not in json.dumps(data, ensure_ascii=False)
    ids = mem._index.ids.tolist()
    got = mem._index.get(ids)
    for nid, v in zip(ids, got):
        for f in forgotten_vectors:
            assert not np.allclose(v, f, atol=1e-5), f"node {nid} keeps a forgotten vector"


# --------------------------------------------------------------------------- xMemory by hand
def test_a_merged_fact_is_written_again_from_the_message_left():
    mem = locker_memory()
    emb = HashEmbedder()
    (sem,) = [s for s in semantics(mem) if "locker" in mem._store.nodes[s].text]
    before = mem._store.nodes[sem]
    assert before.text == f"[5 January 2024] ann: {LOCKER.format(4512)}"
    assert [mem._store.nodes[m].message.id for m in before.data["messages"]] == ["old", "new"]
    hits = mem.retrieve("locker code gym station")
    assert any("4512" in h.text for h in hits)

    assert mem.delete("old") == 1
    node = mem._store.nodes[sem]
    assert node.text == f"[5 May 2024] ann: {LOCKER.format(7731)}"
    assert [mem._store.nodes[m].message.id for m in node.data["messages"]] == ["new"]
    np.testing.assert_allclose(mem._index.get([sem])[0], unit(emb, f"ann: {LOCKER.format(7731)}"), atol=1e-6)
    theme = mem._store.nodes[node.parent]
    assert theme.text == node.text  # a singleton theme is its fact
    for policy in mem.policies:
        for h in mem.retrieve("locker code gym station", k=20, policy=policy):
            assert "4512" not in h.text
            if h.metadata["level"] in ("semantic", "theme") and "locker" in h.text:
                assert h.source_ids == ["new"]
    forgotten = [
        unit(emb, f"ann: {LOCKER.format(4512)}"),
        unit(emb, f"[5 January 2024] ann: {LOCKER.format(4512)}"),
    ]
    assert_forgotten(mem, "4512", forgotten)
    assert mem.stats()["counts"]["semantics_rewritten"] == 1
    # the BM25 postings and the summariser's sentence cache forget the words too
    ids, scores = mem.relevance("4512", kind="bm25")
    assert not np.any(np.asarray(scores) > 0)
    assert not [s for s in mem.summarizer._cache if "4512" in s]
    # the memory goes on: a third repeat merges into the rewritten fact
    mem.add(Message(LOCKER.format(9999), id="third", speaker="ann", timestamp="2024-07-05T10:00:00"))
    mem.flush()
    assert [mem._store.nodes[m].message.id for m in mem._store.nodes[sem].data["messages"]] == [
        "new",
        "third",
    ]
    mem.delete("new")
    assert mem._store.nodes[sem].text == f"[5 July 2024] ann: {LOCKER.format(9999)}"
    assert_forgotten(mem, "7731", [unit(emb, f"ann: {LOCKER.format(7731)}")])


def test_a_fact_whose_other_supporter_is_forgotten_keeps_its_text():
    mem = locker_memory()
    (sem,) = [s for s in semantics(mem) if "locker" in mem._store.nodes[s].text]
    vec = mem._index.get([sem])[0].copy()
    mem.delete("new")
    assert mem._store.nodes[sem].text == f"[5 January 2024] ann: {LOCKER.format(4512)}"
    np.testing.assert_array_equal(mem._index.get([sem])[0], vec)
    assert "semantics_rewritten" not in mem.stats()["counts"]
    assert_forgotten(mem, "7731", [unit(HashEmbedder(), f"ann: {LOCKER.format(7731)}")])


def test_deleting_the_last_supporter_removes_the_fact_and_its_theme():
    mem = locker_memory()
    mem.delete("old")
    mem.delete("new")
    assert all("locker" not in n.text for n in mem._store.nodes.values())
    assert [n.text for n in mem._store.nodes.values() if n.level == 2] == [f"[5 March 2024] bob: {FILLER}"]


def test_a_save_after_a_deletion_and_a_deletion_after_a_load_forget(tmp_path):
    emb = HashEmbedder()
    forgotten = [
        unit(emb, f"ann: {LOCKER.format(4512)}"),
        unit(emb, f"[5 January 2024] ann: {LOCKER.format(4512)}"),
    ]
    mem = locker_memory()
    mem.delete("old")
    mem.save(tmp_path / "a")
    for f in (tmp_path / "a").rglob("*"):
        if f.is_file():
            assert b"4512" not in f.read_bytes(), f.name
    back = XMemory.load(tmp_path / "a", embedder=HashEmbedder())
    assert back.to_dict() == mem.to_dict()
    assert_forgotten(back, "4512", forgotten)
    # deleting from a loaded memory: the same result as deleting before the save
    mem2 = locker_memory()
    mem2.save(tmp_path / "b")
    loaded = XMemory.load(tmp_path / "b", embedder=HashEmbedder())
    loaded.delete("old")
    assert loaded.to_dict()["tree"] == mem.to_dict()["tree"]
    np.testing.assert_array_equal(loaded._index.get(loaded._index.ids), mem._index.get(mem._index.ids))
    assert_forgotten(loaded, "4512", forgotten)


def sqlite_rows(path: Path) -> list[tuple[str, tuple[Any, ...]]]:
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return [(t, row) for t in tables for row in con.execute(f"SELECT * FROM {t}")]  # noqa: S608
    finally:
        con.close()


def test_a_durable_store_forgets_every_row_and_vector(tmp_path):
    emb = HashEmbedder()
    path = tmp_path / "m.sqlite"
    mem = XMemory.open(path, embedder=HashEmbedder())
    mem.add(Message(LOCKER.format(4512), id="old", speaker="ann", timestamp="2024-01-05T10:00:00"))
    mem.add(Message(FILLER, id="fill", speaker="bob", timestamp="2024-03-05T10:00:00"))
    mem.add(Message(LOCKER.format(7731), id="new", speaker="ann", timestamp="2024-05-05T10:00:00"))
    mem.flush()
    assert sum("4512" in n.text for n in mem._store.nodes.values()) == 4  # message, episode, fact, theme
    mem.delete("old")
    mem.close_store()
    rows = sqlite_rows(path)
    assert not [row for _, row in rows if "4512" in repr(row)]
    for f in tmp_path.iterdir():  # secure_delete: nor in the file's free pages
        assert b"4512" not in f.read_bytes(), f.name
    forgotten = [
        unit(emb, f"ann: {LOCKER.format(4512)}"),
        unit(emb, f"[5 January 2024] ann: {LOCKER.format(4512)}"),
    ]
    stored = [np.frombuffer(row[1], dtype="<f4") for t, row in rows if t == "vectors"]
    assert stored
    for v in stored:
        assert not any(np.allclose(v, f, atol=1e-5) for f in forgotten)
    back = XMemory.open(path, embedder=HashEmbedder())
    try:
        assert_forgotten(back, "4512", forgotten)
        hits = back.retrieve("locker code gym station", k=20)
        assert hits and all("4512" not in h.text for h in hits)
        facts = [back._store.nodes[s].text for s in semantics(back)]
        assert f"[5 May 2024] ann: {LOCKER.format(7731)}" in facts
    finally:
        back.close_store()


def test_an_episode_losing_its_first_message_takes_the_next_date():
    mem = XMemory(HashEmbedder(), drift_threshold=-1.0)
    mem.add(Message(LOCKER.format(4512), id="old", speaker="ann", timestamp="2024-01-05T10:00:00"))
    mem.add(Message(FILLER, id="fill", speaker="bob", timestamp="2024-01-05T10:05:00"))
    mem.flush()
    (ep,) = [i for i, n in mem._store.nodes.items() if n.level == 1]
    assert mem._store.nodes[ep].data["timestamp"] == "2024-01-05T10:00:00"
    mem.delete("old")
    node = mem._store.nodes[ep]
    assert node.data["timestamp"] == "2024-01-05T10:05:00"
    assert node.text == render_messages([Message(FILLER, speaker="bob", timestamp="2024-01-05T10:05:00")])


# --------------------------------------------------------------------------- xMemory with an LLM
FACT_LLM = "Ann said: my locker code at the big city gym downtown near the station is {}."
HIKE_LLM = "Bob wants to plan the weekend hike with the kids."


def llm_answer(req: dict[str, Any]) -> str:
    """A scripted model whose episode records, facts and theme summaries copy the codes they read."""
    system, user = req["messages"][0]["content"], req["messages"][-1]["content"]
    if system == P.EPISODE_SYSTEM:
        codes = [c for c in ("4512", "7731") if c in user]
        hike = "hike" in user
        content = " ".join(
            [*(f"Ann's locker code is {c}." for c in codes), *(["Bob plans a hike."] if hike else [])]
        )
        return json.dumps({"title": "Locker " + " ".join(codes) if codes else "Hike", "content": content})
    if system == P.SEMANTIC_SYSTEM:
        facts = [FACT_LLM.format(c) for c in ("4512", "7731") if c in user]
        if "hike" in user:
            facts.append(HIKE_LLM)
        return json.dumps({"facts": facts})
    if system == P.THEME_SYSTEM:
        return " ".join(c for c in ("4512", "7731") if c in user) or "hike"
    raise AssertionError(f"unexpected prompt: {system[:60]}")


def test_an_llm_fact_is_distilled_again_from_the_episodes_left(openai_server):
    emb = HashEmbedder()
    assert float(unit(emb, FACT_LLM.format(4512)) @ unit(emb, FACT_LLM.format(7731))) >= 0.9  # they merge
    openai_server.default_chat = llm_answer
    llm = OpenAIChat("test-model", base_url=openai_server.base_url, api_key="test", max_retries=0)
    mem = XMemory(HashEmbedder(), llm=llm, boundary="rule")
    mem.add(Message(LOCKER.format(4512), id="old", speaker="ann", timestamp="2024-01-05T10:00:00"))
    mem.add(Message(FILLER, id="fill", speaker="bob", timestamp="2024-01-05T10:01:00"))
    mem.add(Message(LOCKER.format(7731), id="new", speaker="ann", timestamp="2024-05-05T10:00:00"))
    mem.flush()
    st_ = mem._store
    texts = {st_.nodes[s].text: s for s in semantics(mem)}
    assert set(texts) == {FACT_LLM.format(4512), HIKE_LLM}  # the 7731 fact merged into the 4512 one
    fact = texts[FACT_LLM.format(4512)]
    assert any("4512" in n.text for n in st_.nodes.values() if n.level == 1 and n.data.get("title"))
    mem.delete("old")
    assert st_.nodes[fact].text == FACT_LLM.format(7731)
    assert [st_.nodes[m].message.id for m in st_.nodes[fact].data["messages"]] == ["new"]
    assert st_.nodes[texts[HIKE_LLM]].text == HIKE_LLM
    assert [st_.nodes[m].message.id for m in st_.nodes[texts[HIKE_LLM]].data["messages"]] == ["fill"]
    episodes = [n for n in st_.nodes.values() if n.level == 1]
    assert all("4512" not in (n.data.get("title") or "") for n in episodes)
    assert_forgotten(mem, "4512", [unit(emb, FACT_LLM.format(4512))])


def test_llm_written_texts_leave_the_sentence_cache_too(openai_server):
    """xMemory with an LLM and an extractive theme summariser: the LLM's records and facts (which
    paraphrase the message) are cached sentence by sentence; a deletion forgets those it rewrote."""
    openai_server.default_chat = llm_answer
    llm = OpenAIChat("test-model", base_url=openai_server.base_url, api_key="test", max_retries=0)
    emb = HashEmbedder()
    mem = XMemory(emb, llm=llm, boundary="rule", summarizer=ExtractiveSummarizer(emb))
    mem.add(Message(LOCKER.format(4512), id="old", speaker="ann", timestamp="2024-01-05T10:00:00"))
    mem.add(Message(FILLER, id="fill", speaker="bob", timestamp="2024-01-05T10:01:00"))
    mem.add(Message(LOCKER.format(7731), id="new", speaker="ann", timestamp="2024-05-05T10:00:00"))
    mem.flush()
    summ: Any = mem.summarizer
    assert "Ann's locker code is 4512." in summ._cache  # a sentence of an LLM-written record
    mem.delete("old")
    assert not [k for k in summ._cache if "4512" in k]
    assert traces(mem, "4512") == []


# --------------------------------------------------------------------------- property: all four memories
TEMPLATES = [
    "My locker code at the big city gym downtown near the station is {}.",
    "I keep bees in the garden behind the old house on {} street.",
    "We talked about dogs today and the vault code is {}.",
    "Bob said the train to Paris leaves from platform {} tonight.",
    "Thanks, that sounds great {}!",
]
ADD = st.tuples(
    st.just("add"),
    st.lists(st.sampled_from([0, 0, 0, 1, 1, 2, 3, 4]), min_size=1, max_size=2),  # repeats merge
    st.sampled_from(["ann", "bob"]),
    st.sampled_from([1, 4320]),  # minutes since the previous message: same episode, or a new one
    st.booleans(),  # xMemory: flush after it (its episode is distilled now)
)
DELETE = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 50) | st.just(0)),  # the i-th live message, oldest first
    st.tuples(st.just("delete_node"), st.integers(0, 50)),  # a subtree
)
# a few messages first (so that repeats merge into older facts), then adds and deletes mixed
OPS = st.tuples(
    st.lists(ADD, min_size=2, max_size=8), st.lists(st.one_of(ADD, DELETE, DELETE), min_size=1, max_size=8)
).map(lambda p: p[0] + p[1])


def secret(i: int, j: int) -> str:
    return f"zq{i}k{j}x"


def sentences_come_from(text: str, sources: list[str]) -> bool:
    """``text`` is sentences of ``sources`` joined by spaces or newlines, as an extractive summary is (the
    last one may be cut at a word and end in "…")."""
    sents = {x for src in sources for x in split_sentences(src)}
    cut = text.endswith("…")
    body = text[:-1].rstrip() if cut else text
    todo, seen = [0], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p == len(body) or (cut and any(x.startswith(body[p:]) for x in sents)):
            return True
        for x in sents:
            q = p + len(x)
            if body.startswith(x, p) and (q == len(body) or body[q] in " \n"):
                todo.append(min(q + 1, len(body)))
    return False


def check_derivable(
    mem: HierarchicalMemory, live: dict[str, Message], dead: set[str], emb: HashEmbedder
) -> None:
    """Every node's text (and an xMemory fact's vector) is made of live messages only."""
    st_ = mem._store
    for n in st_.nodes.values():
        assert not any(sec in n.text for sec in dead), f"node {n.id} ({n.level}) keeps a forgotten token"
    if not isinstance(mem, XMemory):
        for n in st_.nodes.values():
            if n.text and not n.is_leaf:
                leaves = [st_.nodes[lid].text for lid in st_.leaves_under(n.id)]
                assert sentences_come_from(n.text, leaves), f"node {n.id}: {n.text!r}"
        return
    for n in st_.nodes.values():
        if n.is_leaf or not n.text:
            continue
        if n.level == 1:  # an LLM-free episode record is its messages
            assert n.text == render_messages(mem._messages(n.id))
        elif n.level == 2:  # a fact is a sentence of a live message it comes from, with its vector
            sources = mem._fact_messages(n.id)
            assert sources and all(st_.nodes[m].message.id in live for m in sources)
            rendered = {t: k for m in sources for t, k, _ in extract_facts_rule([st_.nodes[m].message], 99)}
            assert n.text in rendered, f"fact {n.text!r} is no sentence of {sources}"
            np.testing.assert_allclose(mem._index.get([n.id])[0], unit(emb, rendered[n.text]), atol=1e-5)
        elif n.level == 3:  # a theme summary quotes its facts
            facts = [st_.nodes[c].text for c in n.children]
            assert sentences_come_from(n.text, facts), f"theme {n.id}: {n.text!r}"


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat", "xmemory"])
def test_every_text_is_derivable_from_live_messages_only(kind):
    emb = HashEmbedder()

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ops=OPS)
    # SegTreeMem: a stored single-child copy of a leaf whose second child leaves its summary unchanged
    # (the 160-character budget holds only the first child's sentences) once kept the leaf's vector
    @example(
        ops=[
            ("add", [0], "ann", 1, False),
            ("add", [0, 0], "ann", 1, False),
            ("add", [1], "bob", 1, False),
            ("add", [4], "ann", 1, False),
            ("add", [0, 0], "ann", 1, False),
            ("add", [0, 3], "bob", 1, False),
            ("delete", 0),
        ]
    )
    def run(ops: list[tuple[Any, ...]]) -> None:
        mem = make_memory(kind, HashEmbedder(), **({"summary_chars": 160} if kind != "xmemory" else {}))
        live: dict[str, Message] = {}
        dead: set[str] = set()
        when = datetime(2024, 1, 1, 9, 0)
        for i, op in enumerate(ops):
            if op[0] == "add":
                _, tpl, who, gap, flush = op
                when += timedelta(minutes=gap)
                text = " ".join(TEMPLATES[t].format(secret(i, j)) for j, t in enumerate(tpl))
                m = Message(text, id=f"m{i}", speaker=who, timestamp=when.isoformat())
                mem.add(m)
                live[m.id] = m
                if flush and isinstance(mem, XMemory):
                    mem.flush()
            elif op[0] in ("delete", "delete_node"):
                if not live:
                    continue
                if op[0] == "delete":
                    key: int | str = list(live)[op[1] % len(live)]
                    ids = [key]
                else:  # a whole subtree: any node by id
                    nodes = sorted(mem._store.nodes)
                    key = nodes[op[1] % len(nodes)]
                    ids = [mem._store.nodes[lid].message.id for lid in mem._store.leaves_under(key)]
                assert mem.delete(key) == len(ids)
                for sid in ids:
                    words = live.pop(sid).text.replace(".", " ").replace("!", " ").split()
                    dead |= {w for w in words if w.startswith("zq")}
                check_derivable(mem, live, dead, emb)
            elif isinstance(mem, XMemory):
                mem.flush()
        check_derivable(mem, live, dead, emb)
        check_tree(mem, [m.render() for m in live.values()], deleted=True)

    run()


# --------------------------------------------------------------------------- caches of the process


def traces(mem: HierarchicalMemory, secret: str) -> list[str]:
    """Where ``secret`` survives in the process: anything the memory reaches (its summariser's sentence
    cache, lexical index, node store, HAT's aggregate cache, ...; not the caller's embedder) and the
    fact rule's process-wide cache of answers by text."""
    return traces_of(mem, [secret])


def assert_caches_clean(mem: HierarchicalMemory, secret: str) -> None:
    """The named caches first (readable failures), then everything reachable."""
    summ: Any = mem.summarizer
    assert not [s for s in summ._cache if secret in s], "the summariser's sentence cache"
    lex = mem._lexical
    if lex is not None:
        low = secret.lower()
        assert not [t for t in lex._vocab if low in t], "the lexical vocabulary"
        assert not [t for ts in lex._tokens.values() for t in ts if low in t], "the lexical texts"
        stemmer = [lex._stemmer] if lex.stem else []
        held = [w for d in gc.get_referents(*stemmer) if isinstance(d, dict) for w in d]
        assert not [w for w in held if low.encode() in w], "the stemmer's word cache"
    if mem._index is not None:
        st_ = mem._store
        assert set(mem._index.ids.tolist()) == {i for i, n in st_.nodes.items() if n.text}, "node index"
    assert traces(mem, secret) == []


class CountingEmbedder(HashEmbedder):
    """The hashed embedder, counting how often each text is embedded."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def embed(self, texts: Any) -> np.ndarray:
        texts = list(texts)
        for t in texts:
            self.counts[t] = self.counts.get(t, 0) + 1
        return super().embed(texts)


SHARED = "We met at the lake."
VAULT = "The vault code is {}."


@pytest.mark.parametrize("kind", KINDS4)
def test_a_deletion_leaves_no_trace_in_any_cache_and_keeps_shared_sentences(kind):
    emb = CountingEmbedder()
    mem = cache_memory(kind, emb)
    t0 = datetime(2024, 1, 1, 9, 0)
    for i in range(5):
        mem.add(
            Message(
                message_text(i), id=f"m{i}", speaker="ann", timestamp=(t0 + timedelta(minutes=i)).isoformat()
            )
        )
    mem.add(
        Message(
            f"{VAULT.format('zqvaultx')} {SHARED}",
            id="secret",
            speaker="ann",
            timestamp=(t0 + timedelta(minutes=6)).isoformat(),
        )
    )
    mem.add(
        Message(
            "hello zqhellox there",
            id="runon",
            speaker="bob",
            timestamp=(t0 + timedelta(minutes=7)).isoformat(),
        )
    )
    mem.add(
        Message(
            f"Bob likes tea. {SHARED}",
            id="keep",
            speaker="bob",
            timestamp=(t0 + timedelta(minutes=8)).isoformat(),
        )
    )
    for i in range(5, 9):
        mem.add(
            Message(
                message_text(i),
                id=f"m{i}",
                speaker="ann",
                timestamp=(t0 + timedelta(minutes=9 + i)).isoformat(),
            )
        )
    exercise(mem, "vault code zqvaultx hello zqhellox")
    summ: Any = mem.summarizer
    assert [s for s in summ._cache if "zqvaultx" in s] and SHARED in summ._cache  # the test proves something
    embedded = emb.counts.get(SHARED, 0)
    assert mem.delete("secret") == 1 and mem.delete("runon") == 1
    assert_caches_clean(mem, "zqvaultx")
    assert_caches_clean(mem, "zqhellox")
    # the sentence a live message still holds keeps its vector: never embedded again
    assert SHARED in summ._cache
    mem.add(
        Message(
            f"Ann agrees. {SHARED}",
            id="again",
            speaker="ann",
            timestamp=(t0 + timedelta(hours=1)).isoformat(),
        )
    )
    exercise(mem, "lake")
    assert emb.counts.get(SHARED, 0) == embedded
    assert_caches_clean(mem, "zqvaultx")


@pytest.mark.parametrize("kind", KINDS4)
def test_clear_empties_every_cache(kind):

    mem = cache_memory(kind)
    texts = [message_text(i) for i in range(6)] + ["I moved to Zqclearx street in May 2024.", "hi zqclearx"]
    mem.add([Message(t, id=f"c{i}", speaker="ann") for i, t in enumerate(texts)])
    exercise(mem, "street zqclearx")
    if kind == "xmemory":  # asked in any case (xMemory asks it under a budget for messages without a fact)
        rules.has_fact_sentence(texts[-2])
    summ: Any = mem.summarizer
    assert summ._cache
    mem.clear()
    assert len(summ._cache) == 0
    assert mem._lexical is None and mem._index is None
    assert traces(mem, "clearx") == []
    mem.add(message_text(0))  # usable after
    assert len(mem) == 1


def test_the_fact_rule_cache_is_bounded_and_forgets(monkeypatch):

    monkeypatch.setattr(rules, "FACT_CACHE_SIZE", 3)
    rules.forget_fact_sentences()
    for i in range(5):
        assert rules.has_fact_sentence(f"I paid {i} euros for the zqfact{i}x tickets.")
    assert len(rules._fact_cache) == 3 and not [k for k in rules._fact_cache if "zqfact0x" in k]
    rules.forget_fact_sentences(["I paid 4 euros for the zqfact4x tickets."])
    assert not [k for k in rules._fact_cache if "zqfact4x" in k] and len(rules._fact_cache) == 2
    assert rules.has_fact_sentence("I paid 4 euros for the zqfact4x tickets.")  # asked again: answered again
    rules.forget_fact_sentences()
    assert len(rules._fact_cache) == 0


def test_an_xmemory_deletion_forgets_the_fact_rule_answers():

    mem = XMemory(HashEmbedder(), fact_fallback="always")
    mem.add(Message("I moved to Zqrulex street in May 2024.", id="s", speaker="ann"))
    mem.add(Message(FILLER, id="f", speaker="bob"))
    mem.retrieve("street", k=5)  # the open episode's messages ask the fact rule
    assert [k for k in rules._fact_cache if "Zqrulex" in k]
    mem.delete("s")
    assert traces(mem, "Zqrulex") == []


# ---- the summariser's own API
class StubEmbedder:
    """Embeds with the hashed embedder; ``hook`` runs inside the next embed call (once)."""

    def __init__(self) -> None:
        self.inner = HashEmbedder()
        self.hook: Any = None
        self.dim = self.inner.dim

    def embed(self, texts: Any) -> np.ndarray:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.inner.embed(texts)


def test_extractive_forget_drops_sentences_quoting_forgotten_ones():
    emb = HashEmbedder()
    summ = ExtractiveSummarizer(emb, max_chars=40)
    long = "The zqlongx vault near the old station opens at nine on Mondays."
    summ.compose(
        ["hello zqrunx there Bob arrives at 9.", "Bob arrives at 9.", "ann: hello zqrunx there", long]
    )
    summ.compose([summ.summarize([long])[0]])  # the shortened form of the long sentence
    assert any(k.endswith("…") for k in summ._cache)
    before = set(summ._cache)
    kept = {k for k in before if "zqrunx" not in k and "zqlongx" not in k}
    assert summ.forget(["hello zqrunx there", long]) == len(before) - len(kept) == 4
    assert set(summ._cache) == kept and "Bob arrives at 9." in kept
    assert summ.forget([]) == 0 and summ.forget(["never seen."]) == 0
    assert summ.forget(["Bob arrives a"]) == 0 and summ.forget(["rrives at 9."]) == 0  # not whole words
    assert holds_words("Bob arrives at 9.", "arrives at") and not holds_words("Bob arrives at 9.", "rrives")
    summ.clear()
    assert len(summ._cache) == 0


def test_extractive_vectors_survive_a_concurrent_forget():
    emb = StubEmbedder()
    summ = ExtractiveSummarizer(emb)
    summ.compose(["Alpha is here."])
    emb.hook = lambda: summ.forget(["Alpha is here."])  # dropped while the missing sentence is embedded
    vecs, usage = summ.compose(["Alpha is here. Beta is there."])
    assert vecs.shape == (1, emb.dim) and usage.embedded_texts == 1


class PlainSummarizer:
    """A third-party summariser without forget or clear."""

    def summarize(self, texts: Any, **fields: Any) -> tuple[str, Any]:
        from shared_core.types import Usage

        return " ".join(texts)[:300], Usage()

    async def asummarize(self, texts: Any, **fields: Any) -> tuple[str, Any]:
        return self.summarize(texts)


class ForgetOnlySummarizer(PlainSummarizer):
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, texts: Any) -> None:
        self.forgotten += list(texts)


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_summarisers_without_the_cache_methods_still_delete_and_clear(kind):
    for summ in (PlainSummarizer(), ForgetOnlySummarizer()):
        mem = cache_memory(kind, summarizer=summ)
        mem.add([Message(message_text(i), id=f"p{i}") for i in range(6)])
        mem.add(Message("The zqplainx code.", id="s"))
        assert mem.delete("s") == 1
        mem.clear()
        assert len(mem) == 0
        if isinstance(summ, ForgetOnlySummarizer):
            assert "The zqplainx code." in summ.forgotten  # the deletion's dead sentence
            assert any(message_text(0) in t for t in summ.forgotten)  # clear() gave it every text


# ---- property: random adds, deletes, retrievals and clears
PIECES = [
    "My locker code at the big city gym is {}.",
    "hello {} there",  # no end mark: in a summary it runs on into the next text
    "and then {} happened.",  # a lower-case start: no sentence break before it either
    "The {} vault near the old railway station downtown opens at nine every Monday for the visitors.",
    "I moved to {} street in May 2024.",
    SHARED,  # shared by many messages, no secret
    "Bob likes tea.",
]
CACHE_ADD = st.tuples(
    st.just("add"),
    st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=3),
    st.sampled_from(["ann", "bob"]),
    st.sampled_from([1, 4320]),
    st.booleans(),
)
CACHE_OPS = st.tuples(
    st.lists(CACHE_ADD, min_size=2, max_size=6),
    st.lists(
        st.one_of(
            CACHE_ADD,
            st.tuples(st.just("delete"), st.integers(0, 50)),
            st.tuples(st.just("delete"), st.integers(0, 50)),
            st.tuples(st.just("delete_node"), st.integers(0, 50)),
            st.tuples(st.just("retrieve"), st.sampled_from(["code vault", "hello there street"])),
            st.tuples(st.just("clear")),
        ),
        min_size=2,
        max_size=10,
    ),
).map(lambda p: p[0] + p[1])


@pytest.mark.parametrize("kind", KINDS4)
def test_no_cache_keeps_a_forgotten_word_and_live_sentences_stay_cached(kind):
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ops=CACHE_OPS)
    # HAT: an add after a retrieval rewrites a parent whose indexed text (stale until the next query)
    # holds a message's secret; the deletion of that message must drop the stale text from BM25 too
    @example(
        ops=[
            *[("add", [0], "ann", 1, False)] * 3,
            ("add", [1], "ann", 1, False),
            ("add", [0], "ann", 1, False),
        ]
        + [("add", [0, 0], "ann", 1, False), ("delete", 0), ("retrieve", "code vault")]
        + [("add", [0], "ann", 1, False), ("delete", 14)]
    )
    def run(ops: list[tuple[Any, ...]]) -> None:
        rules.forget_fact_sentences()  # a previous example's memory may have asked about the same words
        mem = cache_memory(kind, summary_chars=90)
        summ: Any = mem.summarizer
        live: dict[str, list[str]] = {}  # source id -> its secrets
        dead: set[str] = set()
        when = datetime(2024, 1, 1, 9, 0)
        for i, op in enumerate(ops):
            if op[0] == "add":
                _, pieces, who, gap, flush = op
                when += timedelta(minutes=gap)
                secrets = [secret(i, j) for j in range(len(pieces))]
                text = " ".join(PIECES[p].format(x) for p, x in zip(pieces, secrets))
                mem.add(Message(text, id=f"m{i}", speaker=who, timestamp=when.isoformat()))
                live[f"m{i}"] = [x for p, x in zip(pieces, secrets) if "{}" in PIECES[p]]
                if flush and isinstance(mem, XMemory):
                    mem.flush()
                continue
            if op[0] == "retrieve":
                if live:
                    exercise(mem, op[1])
                continue
            if op[0] == "clear":
                mem.clear()
                assert len(summ._cache) == 0
                for xs in live.values():
                    dead.update(xs)
                live.clear()
            else:
                if not live:
                    continue
                if op[0] == "delete":
                    key: int | str = list(live)[op[1] % len(live)]
                else:
                    key = sorted(mem._store.nodes)[op[1] % len(mem._store.nodes)]
                ids = (
                    {mem._store.nodes[lid].message.id for lid in mem._store.leaves_under(key)}
                    if isinstance(key, int)
                    else {key}
                )
                cached = set(summ._cache)
                assert mem.delete(key) == len(ids)
                for sid in ids:
                    dead.update(live.pop(sid))
                # every sentence a live text still holds keeps its vector
                held = {x for n in mem._store.nodes.values() if n.text for x in split_sentences(n.text)}
                assert cached & held <= set(summ._cache)
            assert traces_of(mem, dead) == []

    run()
