"""MemTree: hand-worked insertion (paper Sec. 3.1, App. A.1.3), invariants, concurrency, atomicity, the
A.1.2 aggregation prompt through the openai client, MemTreeModule configuration, retrieval, deletion."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core.memories.memtree import MemTree, MemTreeAggregator
from shared_core.models.extractive import ExtractiveSummarizer
from shared_core.prompts import memtree as P
from shared_core.types import (
    Completion,
    InvalidInputError,
    Message,
    ModelError,
    UnknownPolicyError,
    Usage,
)
from tests.support.vectors import check_node_vectors

VOCAB = ("pet", "dog", "cat", "walk", "vet", "food", "pizza", "pasta")


class KeywordEmbedder:
    """A text's vector is the sum of one-hot vectors of the VOCAB words it contains (``other`` if none).

    Cosine of two texts with keyword sets A and B is ``|A ∩ B| / sqrt(|A| |B|)``, so every similarity
    below can be worked out by hand, for messages and for aggregated texts alike.
    """

    dim = len(VOCAB) + 1

    def __init__(self) -> None:
        self.calls = 0

    @staticmethod
    def keywords(text: str) -> set[str]:
        return set(re.findall(r"[a-z]+", text.lower())) & set(VOCAB)

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for i, w in enumerate(VOCAB):
            if w in self.keywords(text):
                v[i] = 1.0
        if not v.any():
            v[-1] = 1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([self.vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class ConstantEmbedder:
    """Every text gets the same vector: every similarity is 1, so each insert follows the first child."""

    dim = 4

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32), (len(texts), 1))

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class RecordingSummarizer:
    """Wraps a summariser and records every call's texts and fields."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[list[str], dict]] = []

    def summarize(self, texts, **fields):
        self.calls.append((list(texts), dict(fields)))
        return self.inner.summarize(texts, **fields)

    async def asummarize(self, texts, **fields):
        return self.summarize(texts, **fields)


class SleepLLM:
    """An LLM (protocol: complete / acomplete) that sleeps ``delay`` seconds per call.

    ``fail_at`` makes the call with that 1-based number raise :class:`ModelError`.
    """

    def __init__(self, delay: float = 0.1, fail_at: int | None = None) -> None:
        self.delay = delay
        self.fail_at = fail_at
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def complete(self, prompt, *, system=None, max_tokens=None, logprobs=False) -> Completion:
        with self._lock:
            self.calls += 1
            n = self.calls
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.prompts.append(prompt)
        try:
            time.sleep(self.delay)
            if self.fail_at is not None and n == self.fail_at:
                raise ModelError("scripted failure of the fake LLM")
            return Completion(text=f"Summary number {n}.", usage=Usage(llm_calls=1, completion_tokens=3))
        finally:
            with self._lock:
                self.active -= 1

    async def acomplete(self, prompt, *, system=None, max_tokens=None, logprobs=False) -> Completion:
        return await asyncio.to_thread(self.complete, prompt, system=system, max_tokens=max_tokens)


# Six messages whose keyword sets make the worked example below.
M = [
    "Our pet dog is called Luna.",  # {pet, dog}
    "The pet cat sleeps all day.",  # {pet, cat}
    "We ordered pizza as comfort food.",  # {food, pizza}
    "Homemade pasta is my favourite food.",  # {food, pasta}
    "I walk the pet dog every morning.",  # {pet, dog, walk}
    "The vet saw a stray cat on our walk.",  # {vet, cat, walk}
]


#: the paper's retrieval: cosine over every node, collapsed (what MemTree.from_config builds)
PAPER = {"relevance": "dense", "policy": "collapsed", "admissible": "all"}


def build_worked(**kw) -> tuple[MemTree, list, RecordingSummarizer]:
    emb = KeywordEmbedder()
    rec = RecordingSummarizer(ExtractiveSummarizer(emb))
    mem = MemTree(emb, summarizer=rec, **{**PAPER, **kw})
    reports = [mem.add(Message(t, id=f"m{i + 1}")) for i, t in enumerate(M)]
    return mem, reports, rec


def children(mem: MemTree, nid: int) -> list[int]:
    return list(mem._store.nodes[nid].children)


# --------------------------------------------------------------------------- hand-worked insertion
def test_worked_example_shape_thresholds_and_aggregations():
    mem, reports, rec = build_worked()
    L = [r.leaf_ids[0] for r in reports]
    d = [r.details[0] for r in reports]
    st_ = mem._store
    root = st_.root

    # 1: empty tree -> the leaf hangs under the structural root.
    assert d[0]["action"] == "first" and d[0]["depth"] == 1
    # 2: h = 1; at the root θ(0) = 0.4; cos({pet,cat},{pet,dog}) = 1/2 = 0.5 >= 0.4 and L1 is a leaf:
    #    L1 is expanded into a new parent P1 = Aggregate(L1, L2 | n=1).
    assert d[1]["action"] == "expand" and d[1]["expanded_leaf"] == L[0]
    assert d[1]["thresholds"] == pytest.approx([0.4]) and d[1]["similarities"] == pytest.approx([0.5])
    P1 = d[1]["parent"]
    assert P1 not in L
    # 3: h = 2; cos({food,pizza}, P1={pet,dog,cat}) = 0 < 0.4 -> attach under the root.
    assert d[2]["action"] == "attach" and d[2]["parent"] == root
    assert d[2]["similarities"] == pytest.approx([0.0])
    # 4: cos({food,pasta}, L3={food,pizza}) = 0.5 >= 0.4 -> L3 expanded into P2.
    assert d[3]["action"] == "expand" and d[3]["expanded_leaf"] == L[2]
    P2 = d[3]["parent"]
    # 5: h = 2; root: cos({pet,dog,walk}, P1) = 2/3 >= 0.4 -> descend into P1 (on the path);
    #    at P1 (d=1): θ(1) = 0.4·exp(0.5·1/2) = 0.513610; cos(m5, L1={pet,dog}) = 2/√6 = 0.816497 (best;
    #    L2 gives 1/√6 = 0.408248) -> L1 expanded into P3.
    assert d[4]["height"] == 2 and d[4]["path"] == [P1]
    assert d[4]["thresholds"] == pytest.approx([0.4, 0.513610], abs=1e-6)
    assert d[4]["similarities"] == pytest.approx([2 / 3, 0.816497], abs=1e-6)
    assert d[4]["action"] == "expand" and d[4]["expanded_leaf"] == L[0]
    P3 = d[4]["parent"]
    # 6: h = 3; root: cos({vet,cat,walk}, P1={pet,dog,cat,walk}) = 2/√12 = 0.577350 -> P1;
    #    at P1: θ(1) = 0.4·exp(0.5/3) = 0.472544; best child L2: 1/√6 = 0.408248 < θ -> attach under P1.
    assert d[5]["height"] == 3 and d[5]["path"] == [P1]
    assert d[5]["thresholds"] == pytest.approx([0.4, 0.472544], abs=1e-6)
    assert d[5]["similarities"] == pytest.approx([0.577350, 0.408248], abs=1e-6)
    assert d[5]["action"] == "attach" and d[5]["parent"] == P1

    # exact final shape; expanded leaves keep their id, message and source id
    assert children(mem, root) == [P1, P2]
    assert children(mem, P1) == [P3, L[1], L[5]]
    assert children(mem, P3) == [L[0], L[4]]
    assert children(mem, P2) == [L[2], L[3]]
    assert st_.nodes[L[0]].message.id == "m1" and st_.nodes[L[0]].text == M[0]
    depth = {n: st_.depth(n) for n in st_.nodes}
    assert [depth[x] for x in (P1, P2, P3, *L)] == [1, 1, 2, 3, 2, 2, 2, 3, 2]
    assert all(st_.nodes[n].level == depth[n] for n in st_.nodes)
    assert mem.hit(P3).source_ids == ["m1", "m5"]
    assert mem.hit(P1).source_ids == ["m1", "m2", "m5", "m6"]
    assert st_.nodes[P1].span == (0, 5) and st_.nodes[P3].span == (0, 4)

    # aggregation calls: Aggregate(existing, new | n) with n = entries under the node before the insert
    got = [(texts, f["entries"]) for texts, f in rec.calls]
    assert got == [
        ([M[0], M[1]], 1),  # P1 from the expanded L1
        ([M[2], M[3]], 1),  # P2
        ([f"{M[0]} {M[1]}", M[4]], 2),  # P1 on the path of m5 (two entries below it)
        ([M[0], M[4]], 1),  # P3 from the expanded L1
        ([f"{M[0]} {M[1]} {M[4]}", M[5]], 3),  # P1 on the path of m6 (three entries)
    ]
    assert st_.nodes[P1].text == f"{M[0]} {M[1]} {M[4]} {M[5]}"
    assert st_.nodes[P1].data["entries"] == 4 and st_.nodes[P3].data["entries"] == 2
    assert st_.nodes[root].text == "" and root not in mem._index


def test_worked_example_fixed_height_and_max_depth():
    # h fixed at 1: θ(1) = 0.4·e^0.5 = 0.659489; insert 6 still attaches under P1 (0.408 < 0.659).
    mem, reports, _ = build_worked(height=1)
    assert mem.threshold_at(1) == pytest.approx(0.659489, abs=1e-6)
    assert reports[5].details[0]["thresholds"] == pytest.approx([0.4, 0.659489], abs=1e-6)
    # max_depth=2: m5 may descend into P1 (its leaf lands at depth 2), but expanding L1 there would put
    # m5 at depth 3 -> capped: m5 hangs under P1, which is still aggregated (n = 2).
    mem2, reports2, _ = build_worked(max_depth=2)
    d5 = reports2[4].details[0]
    P1 = reports2[1].details[0]["parent"]
    assert d5["capped"] and d5["action"] == "attach" and d5["parent"] == P1 and d5["depth"] == 2
    assert d5["path"] == [P1] and d5["aggregations"] == 1
    assert max(mem2._store.depths().values()) <= 2


def test_stats_table5_quantities():
    mem, _, _ = build_worked()
    s = mem.stats()
    assert (s["nodes"], s["leaves"], s["content_nodes"], s["branching_nodes"]) == (10, 6, 9, 3)
    assert s["max_depth"] == 3 and s["height"] == 3 and s["width"] == 5
    assert s["nodes_per_depth"] == [2, 5, 2]
    assert s["mean_branching_factor"] == pytest.approx(7 / 3)
    assert s["mean_node_depth"] == pytest.approx(2.0)
    assert s["height_to_width"] == pytest.approx(3 / 5)
    assert s["inserts"] == 6 and s["llm_calls_per_insert_mean"] == 0.0


# --------------------------------------------------------------------------- invariants (hypothesis)
def check_invariants(mem: MemTree, texts: list[str], emb: KeywordEmbedder) -> None:
    st_ = mem._store
    st_.check_links()
    if not texts:
        assert st_.root is None and not st_.nodes
        return
    root = st_.root
    assert st_.nodes[root].text == ""
    non_root = [n for n in st_.nodes.values() if n.id != root]
    assert set(mem._index.ids.tolist()) == {n.id for n in non_root}
    check_node_vectors(mem, [n.id for n in non_root], emb, atol=1e-6)
    for n in non_root:
        assert n.text.strip()
        depth = st_.depth(n.id)
        assert n.level == depth
        if mem.max_depth != -1:
            assert depth <= mem.max_depth
        if not n.is_leaf:
            assert len(n.children) >= 2
            under = st_.leaves_under(n.id)
            assert n.data["entries"] == len(under)
            assert n.span == (
                min(st_.nodes[i].span[0] for i in under),
                max(st_.nodes[i].span[1] for i in under),
            )
    if mem.branching is not None and mem.max_depth == -1:  # the fan-out bound (the depth cap wins)
        assert max(len(n.children) for n in st_.nodes.values()) <= mem.branching
    assert {n.id for n in st_.nodes.values() if n.is_leaf} == set(st_.leaves())
    assert [st_.nodes[i].text for i in st_.leaves()] == texts
    assert st_.nodes[root].data["entries"] == len(texts)


message_kw = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3, unique=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kws=st.lists(message_kw, min_size=1, max_size=14),
    max_depth=st.sampled_from([-1, 1, 2, 3]),
    base=st.sampled_from([0.1, 0.4, 0.8]),
    chars=st.sampled_from([60, 600]),
    branching=st.sampled_from([None, 2, 3, 256]),
    data=st.data(),
)
def test_invariants_after_inserts_and_deletions(kws, max_depth, base, chars, branching, data):
    emb = KeywordEmbedder()
    mem = MemTree(emb, base_threshold=base, max_depth=max_depth, summary_chars=chars, branching=branching)
    texts = [f"Entry {i} mentions {' '.join(k)}." for i, k in enumerate(kws)]
    half = (len(texts) + 1) // 2
    mem.add(texts[:half])  # several messages in one transaction
    for t in texts[half:]:
        mem.add(t)
    check_invariants(mem, texts, emb)
    doomed = data.draw(st.sets(st.sampled_from(range(len(texts))), max_size=len(texts)))
    leaf_of = {mem._store.nodes[i].text: i for i in mem._store.leaves()}
    for i in sorted(doomed):
        assert mem.delete(leaf_of[texts[i]]) == 1
    kept = [t for i, t in enumerate(texts) if i not in doomed]
    check_invariants(mem, kept, emb)
    gone = [texts[i] for i in doomed]
    for n in mem._store.nodes.values():  # no deleted sentence survives in any summary
        assert not any(g in n.text for g in gone)


# --------------------------------------------------------------------------- concurrency and atomicity
def chain_memory(llm: SleepLLM, **kw) -> MemTree:
    """Five inserts with the constant embedder: insert i (i >= 2) expands the first leaf at depth i - 1,
    so the next insert walks a path of 4 internal nodes and expands a leaf: 5 aggregations."""
    delay, llm.delay = llm.delay, 0.0
    mem = MemTree(ConstantEmbedder(), llm, **kw)
    for i in range(5):
        mem.add(f"Message number {i}.")
    llm.delay = delay
    return mem


def test_path_aggregations_run_concurrently():
    llm = SleepLLM(delay=0.1)
    mem = chain_memory(llm)
    assert mem.stats()["max_depth"] == 5
    t0 = time.perf_counter()
    rep = mem.add("Message number 5.")
    elapsed = time.perf_counter() - t0
    det = rep.details[0]
    assert det["aggregations"] == 5 and len(det["path"]) == 4 and det["depth"] == 6
    assert rep.usage.llm_calls == 5
    assert elapsed < 0.35, f"5 concurrent 100 ms aggregations took {elapsed * 1000:.0f} ms"
    assert llm.max_active >= 2
    s = mem.stats()
    # calls per insert: 0, 1, 2, 3, 4, 5
    assert s["llm_calls_per_insert_mean"] == pytest.approx(2.5)
    assert s["llm_calls_per_insert_std"] == pytest.approx(math.sqrt(35 / 12))


def test_sequential_when_max_workers_is_one():
    llm = SleepLLM(delay=0.05)
    mem = chain_memory(llm, max_workers=1)
    llm.max_active = 0
    t0 = time.perf_counter()
    mem.add("Message number 5.")
    assert time.perf_counter() - t0 >= 0.25 and llm.max_active == 1


def test_llm_failure_on_third_call_leaves_tree_identical():
    llm = SleepLLM(delay=0.02)
    mem = chain_memory(llm)
    before = mem.to_dict()
    n_index = len(mem._index)
    llm.fail_at = llm.calls + 3
    with pytest.raises(ModelError, match="scripted failure"):
        mem.add("Message number 5.")
    assert mem.to_dict() == before
    assert len(mem._index) == n_index and mem.stats()["inserts"] == 5
    # the memory keeps working after the failure
    llm.fail_at = None
    rep = mem.add("Message number 5.")
    assert rep.details[0]["depth"] == 6 and len(mem) == 6


# --------------------------------------------------------------------------- real openai client
def test_aggregation_prompt_through_openai_client(openai_server):
    from shared_core.models.openai_models import OpenAIChat

    openai_server.default_chat = "Pet notes: a pet dog, a pet cat."
    llm = OpenAIChat("test-model", base_url=openai_server.base_url, max_retries=0)
    mem = MemTree(KeywordEmbedder(), llm)
    mem.supersession = "rule"  # the aggregation's calls alone (the judge's are tested apart)
    assert isinstance(mem.summarizer, MemTreeAggregator)
    r1 = mem.add(M[0])
    assert r1.usage.llm_calls == 0
    r2 = mem.add(M[1])  # expansion of L1: one aggregation with n = 1
    reqs = openai_server.chat_requests()
    assert len(reqs) == 1 and r2.usage.llm_calls == 1 and r2.usage.prompt_tokens > 0
    msgs = reqs[0]["messages"]
    assert msgs[0] == {"role": "system", "content": P.AGGREGATE_SYSTEM}
    prompt = msgs[-1]["content"]
    assert prompt == P.AGGREGATE_USER.format(existing=M[0], new=M[1], entries=1)
    assert M[0] in prompt and M[1] in prompt and "earlier entries it condenses: 1" in prompt
    # m5 = {pet, dog, walk}: cos with P1 "Pet notes: a pet dog, a pet cat." = 2/3 -> path [P1] (n = 2);
    # at P1 θ(1) = 0.5136 and L1 gives 0.8165 -> L1 expanded (n = 1): two calls, run concurrently.
    r3 = mem.add(M[4])
    assert r3.usage.llm_calls == 2 and r3.details[0]["aggregations"] == 2
    prompts = sorted(r["messages"][-1]["content"] for r in openai_server.chat_requests()[1:])
    assert prompts == sorted(
        [
            P.AGGREGATE_USER.format(existing="Pet notes: a pet dog, a pet cat.", new=M[4], entries=2),
            P.AGGREGATE_USER.format(existing=M[0], new=M[4], entries=1),
        ]
    )
    s = mem.stats()
    assert s["usage"]["llm_calls"] == 3 == llm.usage.llm_calls
    assert s["llm_calls_per_insert_mean"] == pytest.approx(1.0)
    assert s["llm_calls_per_insert_std"] == pytest.approx(math.sqrt(2 / 3))
    # tree: root -> P1 [P3 [L1, L5], L2]. Deleting L1 collapses P3 (L5 takes its place), then P1 is
    # rebuilt from its remaining children [L5, L2] with the rebuild prompt: one call.
    openai_server.requests.clear()
    mem.delete(r1.leaf_ids[0])
    rebuild = [r["messages"][-1]["content"] for r in openai_server.chat_requests()]
    assert len(rebuild) == 1
    assert f"[1] {M[4]}\n[2] {M[1]}" in rebuild[0] and "condense together: 2" in rebuild[0]
    assert M[0] not in rebuild[0]


# --------------------------------------------------------------------------- configuration
def test_from_config_defaults_and_doc_example():
    emb = KeywordEmbedder()
    m = MemTree.from_config({}, embedder=emb)
    assert (m.k, m.max_depth, m.threshold, m.max_context) == (3, -1, 0.2, 10_000)
    assert m.embedder is emb and m.llm is None
    m = MemTree.from_config({"top": 5, "max_depth": 2, "threshold": 0.3, "max_context": 4000}, embedder=emb)
    assert (m.k, m.max_depth, m.threshold, m.max_context) == (5, 2, 0.3, 4000)
    entry = {"memory_name": "chat_history_memtree", "memory_class": "MemTreeModule", "config": {"top": 4}}
    m = MemTree.from_config(entry, embedder=emb, base_threshold=0.5)
    assert m.k == 4 and m.base_threshold == 0.5 and m.max_context == 10_000
    m = MemTree.from_config({"top": None, "threshold": None}, embedder=emb)
    assert (m.k, m.threshold) == (3, 0.2)


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"max_context": 0}, "max_context .*positive integer"),
        ({"max_context": -10}, "max_context .*positive integer"),
        ({"max_context": 1.5}, "max_context .*positive integer"),
        ({"max_context": "4000"}, "max_context .*positive integer"),
        ({"max_context": True}, "max_context .*positive integer"),
        ({"top": 0}, "top must be a positive integer"),
        ({"max_depth": 0}, "max_depth must be -1"),
        ({"max_depth": -2}, "max_depth must be -1"),
        ({"threshold": 1.5}, r"threshold must be in \[-1, 1\]"),
        ({"threshold": "high"}, "threshold must be a number"),
        ({"topk": 3}, "Unknown MemTreeModule config keys: topk; allowed: embedding_config, max_context"),
        ({"memory_class": "OtherModule"}, "MemTreeModule"),
        ({"embedding_config": {"model": "Qwen/Qwen3-Embedding-0.6B"}}, "base_url"),
        ({"embedding_config": {}}, "needs a 'model'"),
        ({"embedding_config": "minilm"}, "must be a mapping"),
        ({"embedding_config": {"model": "all-MiniLM-L6-v2", "dims": 3}}, "Unknown embedding_config keys"),
    ],
)
def test_from_config_validation(config, pattern):
    with pytest.raises(InvalidInputError, match=pattern):
        MemTree.from_config(config)


def test_from_config_embedding_models(openai_server):
    from shared_core.models.local import LocalEmbedder
    from shared_core.models.openai_models import OpenAIEmbedder

    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        m = MemTree.from_config({"embedding_config": {"model": name}})
        assert isinstance(m.embedder, LocalEmbedder)
    m = MemTree.from_config({"embedding_config": {"model": "text-embedding-3-small", "dimensions": 8}})
    assert isinstance(m.embedder, OpenAIEmbedder) and m.embedder.model == "text-embedding-3-small"
    with pytest.raises(InvalidInputError, match="only one of them"):
        MemTree.from_config({"embedding_config": {"model": "all-MiniLM-L6-v2"}}, embedder=KeywordEmbedder())
    # a non-OpenAI model behind an OpenAI-compatible server, used end to end
    cfg = {
        "top": 2,
        "embedding_config": {"model": "Qwen/Qwen3-Embedding-0.6B", "base_url": openai_server.base_url},
    }
    m = MemTree.from_config(cfg)
    m.add(["First note about the garden.", "Second note about taxes."])
    hits = m.retrieve("First note about the garden.", threshold=-1.0)
    assert hits[0].text == "First note about the garden." and len(hits) <= 2
    assert {r["model"] for r in openai_server.embed_requests()} == {"Qwen/Qwen3-Embedding-0.6B"}


def test_constructor_validation():
    emb = KeywordEmbedder()
    for kw, pat in [
        ({"k": 0}, "k must be"),
        ({"height": 0}, "height"),
        ({"max_workers": 0}, "max_workers"),
        ({"base_threshold": float("nan")}, "finite"),
        ({"max_context": 0}, "max_context"),
    ]:
        with pytest.raises(InvalidInputError, match=pat):
            MemTree(emb, **kw)


# --------------------------------------------------------------------------- retrieval
def test_collapsed_threshold_topk_and_max_context():
    mem, reports, _ = build_worked()
    L = [r.leaf_ids[0] for r in reports]
    P2 = reports[3].details[0]["parent"]
    # "pizza": L3 {food,pizza} 1/√2 = 0.7071, P2 {food,pizza,pasta} 1/√3 = 0.5774, every other node 0
    hits = mem.retrieve("pizza")
    assert [h.node_id for h in hits] == [L[2], P2]
    assert [h.components["rank"] for h in hits] == pytest.approx(
        [1 / math.sqrt(2), 1 / math.sqrt(3)], abs=1e-6
    )
    assert all(h.metadata["policy"] == "collapsed" for h in hits)
    assert [h.node_id for h in mem.retrieve("pizza", threshold=0.6)] == [L[2]]
    assert len(mem.retrieve("pizza", threshold=-1.0)) == 3  # k = 3 (MemTreeModule "top")
    assert len(mem.retrieve("pizza", k=5, threshold=-1.0)) == 5
    # "food pasta pizza": P2 1.0 (the longest text), L3 = L4 = 2/√6 (tie -> older node first)
    assert [h.node_id for h in mem.retrieve("food pasta pizza")] == [P2, L[2], L[3]]
    budget = len(M[2])  # P2 does not fit and is skipped; L3 fits; then L4 would exceed it
    hits = mem.retrieve("food pasta pizza", max_context=budget)
    assert [h.node_id for h in hits] == [L[2]]
    assert sum(len(h.text) for h in mem.retrieve("pet", k=10, max_context=80, threshold=-1.0)) <= 80
    with pytest.raises(InvalidInputError, match="max_context"):
        mem.retrieve("pizza", max_context=0)
    with pytest.raises(InvalidInputError, match="threshold"):
        mem.retrieve("pizza", threshold=2.0)
    with pytest.raises(InvalidInputError, match="Unknown MemTree retrieval parameters: beta"):
        mem.retrieve("pizza", beta=0.1)
    with pytest.raises(UnknownPolicyError):
        mem.retrieve("pizza", policy="bottom_up")


def test_top_down_worked_by_hand():
    """Top-down retrieval: each node's relevance flows whole to the nodes below it (alpha = 0.3, H = 2),
    message leaves are returned. Worked with dense relevance (cosines of keyword sets)."""
    mem, reports, _ = build_worked(relevance="dense", policy="top_down", admissible="leaves", alpha=0.3)
    L = [r.leaf_ids[0] for r in reports]
    P1, P2, P3 = (reports[i].details[0]["parent"] for i in (1, 3, 4))
    # "pizza": r(L3) = 1/sqrt(2), r(P2) = 1/sqrt(3) ({food, pizza, pasta}), every other node 0.
    # s0 = r / sum r; the structural root has no text, so P2 is a root of the propagation:
    # s(L3) = (s0(L3) + 0.3 s0(P2)) / 1.39, s(L4) = 0.3 s0(P2) / 1.39, and P2 is not admissible.
    a, b = 1 / math.sqrt(2), 1 / math.sqrt(3)
    hits = mem.retrieve("pizza", k=3)
    assert [h.node_id for h in hits[:2]] == [L[2], L[3]]
    assert [h.components["rank"] for h in hits[:2]] == pytest.approx(
        [(a + 0.3 * b) / (a + b) / 1.39, 0.3 * b / (a + b) / 1.39]
    )
    assert all(h.is_leaf for h in hits) and len(hits) == 3 and hits[2].components["rank"] == 0.0
    assert hits[0].metadata["path"] == [P2] and hits[0].metadata["policy"] == "top_down"
    # H = 0 is collapsed ranking over the leaves: L4 has no relevance of its own
    assert mem.retrieve("pizza", k=2, horizon=0)[1].components["rank"] == 0.0
    # "walk" reaches L5 {pet, dog, walk} and L6 {vet, cat, walk} (1/sqrt(3)); P3 and
    # P1 (its summary names walk) pass their scores down, so L1 (under P3) outranks L2 (under P1 only).
    order = [h.node_id for h in mem.retrieve("walk", k=6)]
    assert order.index(L[0]) < order.index(L[1]) and set(order[:2]) == {L[4], L[5]}
    assert mem.retrieve("walk", k=6)[-1].metadata["path"] in ([P1], [P1, P3], [P2])
    # admissible="all" lets summaries compete. "food pasta pizza": r(P2) = 1, r(L3) = r(L4) = 2/sqrt(6);
    # s(P2) = s0(P2) / 1.39 < s(L3) = s(L4) = (s0(L3) + 0.3 s0(P2)) / 1.39 (tie: older first)
    hits = mem.retrieve("food pasta pizza", k=3, admissible="all")
    assert [h.node_id for h in hits] == [L[2], L[3], P2]
    c = 2 / math.sqrt(6)
    assert hits[2].components["rank"] == pytest.approx(1 / (1 + 2 * c) / 1.39)
    assert hits[2].metadata["path"] == [] and not hits[2].is_leaf


def test_hybrid_relevance_finds_words_the_embedder_does_not_know():
    """The default relevance mixes BM25 in: "stray" is no keyword of the embedder (every cosine 0),
    BM25 finds the one message that says it."""
    mem, reports, _ = build_worked(relevance="hybrid", policy="top_down", admissible="leaves")
    L = [r.leaf_ids[0] for r in reports]
    assert mem.retrieve("stray", k=1)[0].node_id == L[5]
    dense = build_worked(relevance="dense", policy="top_down", admissible="leaves")[0]
    assert dense.retrieve("stray", k=1)[0].node_id != L[5]  # all ties at 0: the oldest leaf
    assert mem.retrieve("stray", k=1, relevance="dense")[0].node_id != L[5]  # per-call override


def test_defaults_options_and_bad_values():
    mem = MemTree(KeywordEmbedder())
    assert (mem.default_policy, mem.relevance_kind, mem.admissible, mem.alpha, mem.horizon) == (
        "collapsed",
        "hybrid",
        "leaves",
        0.1,
        2,
    )
    paper = MemTree.from_config({}, embedder=KeywordEmbedder())
    assert (paper.default_policy, paper.relevance_kind, paper.admissible) == ("collapsed", "dense", "all")
    for kw, err, pat in [
        ({"relevance": "cosine"}, UnknownPolicyError, "relevance must be one of 'dense', 'bm25', 'hybrid'"),
        ({"admissible": "some"}, UnknownPolicyError, "admissible must be one of 'all', 'leaves'"),
        (
            {"policy": "greedy"},
            UnknownPolicyError,
            "policy must be one of 'collapsed', 'top_down', 'traversal'",
        ),
        ({"alpha": 1.0}, InvalidInputError, "alpha"),
        ({"horizon": -1}, InvalidInputError, "horizon"),
        ({"hybrid_weight": 1.5}, InvalidInputError, "hybrid_weight"),
    ]:
        with pytest.raises(err, match=pat):
            MemTree(KeywordEmbedder(), **kw)
    mem.add(M)
    with pytest.raises(UnknownPolicyError, match="relevance"):
        mem.retrieve("pet", relevance="sparse")
    with pytest.raises(UnknownPolicyError, match="admissible"):
        mem.retrieve("pet", admissible="none")
    with pytest.raises(InvalidInputError, match="alpha"):
        mem.retrieve("pet", alpha=-0.1)


def test_saves_from_before_the_options_retrieve_as_the_paper(tmp_path):
    """A save whose config lacks the retrieval options loads with the behaviour it was built with."""
    mem, _, _ = build_worked()
    new = MemTree(KeywordEmbedder())
    new.add(M)
    new.save(tmp_path / "mt")
    path = tmp_path / "mt" / (tmp_path / "mt" / "CURRENT").read_text().strip() / "memory.json"
    data = json.loads(path.read_text())
    for key in ("relevance", "hybrid_weight", "alpha", "horizon", "admissible", "policy"):
        del data["config"][key]
    path.write_text(json.dumps(data))
    back = MemTree.load(tmp_path / "mt", embedder=KeywordEmbedder())
    assert (back.default_policy, back.relevance_kind, back.admissible) == ("collapsed", "dense", "all")
    assert [h.text for h in back.retrieve("pizza")] == [h.text for h in mem.retrieve("pizza")]


def test_branching_bounds_the_fan_out_worked_by_hand():
    """Five messages that resemble nothing (disjoint keywords: every cosine 0 < θ). The paper hangs
    each under the root; with ``branching=3`` the root takes three, then the fourth goes down into the
    most similar child (all tie at 0: the oldest, leaf L1, which is expanded into P = {L1, L4}), and the
    fifth into the most similar root child again (P, 0 like the others, oldest) where it hangs (P has
    fewer than 3 children and its child L1 is below θ(1))."""
    texts = [f"About the {w}." for w in ("pet", "dog", "cat", "walk", "vet")]
    paper = MemTree(KeywordEmbedder(), branching=None)
    paper_reports = [paper.add(t) for t in texts]
    root = paper._store.root
    assert children(paper, root) == [r.leaf_ids[0] for r in paper_reports]
    assert all(r.details[0]["forced"] == 0 for r in paper_reports)
    mem = MemTree(KeywordEmbedder(), branching=3)
    reports = [mem.add(t) for t in texts]
    L = [r.leaf_ids[0] for r in reports]
    root = mem._store.root
    assert [r.details[0]["forced"] for r in reports] == [0, 0, 0, 1, 1]
    P = reports[3].details[0]["parent"]
    assert reports[3].details[0]["action"] == "expand" and reports[3].details[0]["expanded_leaf"] == L[0]
    assert children(mem, root) == [P, L[1], L[2]]
    assert children(mem, P) == [L[0], L[3], L[4]]
    assert reports[4].details[0]["path"] == [P] and mem._store.nodes[P].data["entries"] == 3
    # the paper's retrieval options and its insertion come back together from the module config
    assert MemTree.from_config({}, embedder=KeywordEmbedder()).branching is None
    for bad in (1, 0, True, 2.5, "8"):
        with pytest.raises(InvalidInputError, match="branching must be an int >= 2 or None"):
            MemTree(KeywordEmbedder(), branching=bad)


def test_saves_from_before_branching_keep_the_papers_insertion(tmp_path):
    mem = MemTree(KeywordEmbedder(), branching=3)
    mem.add(M)
    assert mem.branching == 3
    mem.save(tmp_path / "mt")
    assert MemTree.load(tmp_path / "mt", embedder=KeywordEmbedder()).branching == 3
    path = tmp_path / "mt" / (tmp_path / "mt" / "CURRENT").read_text().strip() / "memory.json"
    data = json.loads(path.read_text())
    del data["config"]["branching"]
    path.write_text(json.dumps(data))
    assert MemTree.load(tmp_path / "mt", embedder=KeywordEmbedder()).branching is None


def test_traversal_follows_top_k_children():
    mem, reports, _ = build_worked()
    L = [r.leaf_ids[0] for r in reports]
    P1, P2, P3 = (reports[i].details[0]["parent"] for i in (1, 3, 4))
    # "pasta dog": collapsed ties L1 {pet,dog} and L4 {food,pasta} at 0.5 -> the older L1 first.
    assert mem.retrieve("pasta dog", k=1)[0].node_id == L[0]
    # traversal, k=1: root children P1 (1/√10 = 0.316) < P2 (1/√6 = 0.408) -> P2; then L4 (0.5) > L3 (0).
    hits = mem.retrieve("pasta dog", k=1, policy="traversal")
    assert [h.node_id for h in hits] == [L[3]] and hits[0].metadata["policy"] == "traversal"
    # k=2 keeps two nodes per level: visited P2, P1 | L4, P3 | L1, L5; ranked L1 = L4 (0.5) first.
    hits = mem.retrieve("pasta dog", k=2, policy="traversal", threshold=0.2)
    assert [h.node_id for h in hits] == [L[0], L[3]]
    # "cat", k=1: P1 (0.447) -> L2 (0.707, a leaf: the walk stops); the P2 subtree is never visited
    hits = mem.retrieve("cat", k=3, policy="traversal", threshold=-1.0)
    assert L[2] not in [h.node_id for h in hits] and L[3] not in [h.node_id for h in hits]
    assert [h.node_id for h in mem.retrieve("cat", k=1, policy="traversal")] == [L[1]]
    assert {P1, P2, P3} >= {h.node_id for h in hits if not h.is_leaf}


# --------------------------------------------------------------------------- deletion
def test_delete_collapses_single_child_and_reaggregates():
    mem, reports, _ = build_worked()
    L = [r.leaf_ids[0] for r in reports]
    P1, P2, P3 = (reports[i].details[0]["parent"] for i in (1, 3, 4))
    assert mem.delete("m5") == 1
    st_ = mem._store
    assert P3 not in st_.nodes and P3 not in mem._index and L[4] not in mem._index
    assert children(mem, P1) == [L[0], L[1], L[5]]  # L1 took P3's place, one level up
    assert st_.depth(L[0]) == 2 == st_.nodes[L[0]].level
    assert st_.nodes[P1].text == f"{M[0]} {M[1]} {M[5]}" and st_.nodes[P1].data["entries"] == 3
    assert not any(M[4] in n.text for n in st_.nodes.values())
    hit = mem.retrieve("walk", k=1)[0]
    assert hit.node_id == L[5] and "m5" not in mem.hit(P1).source_ids
    assert mem.delete(P2) == 2  # a whole subtree
    assert children(mem, st_.root) == [P1] and len(mem) == 3
    for key in ("m1", "m2", "m6"):
        mem.delete(key)
    assert st_.root is None and len(mem) == 0 and mem.retrieve("pet") == []
    mem.add("A pet dog again.")  # usable after being emptied
    assert mem.stats()["leaves"] == 1


def test_save_load_round_trip(tmp_path):
    mem, _, _ = build_worked()
    mem.save(tmp_path / "mt")
    back = MemTree.load(tmp_path / "mt", embedder=KeywordEmbedder())
    assert back.to_dict() == mem.to_dict()
    assert [h.node_id for h in back.retrieve("pizza")] == [h.node_id for h in mem.retrieve("pizza")]
    assert back.stats()["inserts"] == 6 and back.threshold_at(1) == pytest.approx(0.472544, abs=1e-6)


def test_local_embedder_end_to_end(local_embedder):
    mem = MemTree(local_embedder, **PAPER)
    mem.add(
        [
            Message("I adopted a dog named Luna last spring.", id="d1"),
            Message("Luna the dog loves long walks in the park.", id="d2"),
            Message("My sister is studying chemistry in Berlin.", id="s1"),
            Message("The quarterly tax return is due in April.", id="t1"),
        ]
    )
    hits = mem.retrieve("What is the name of my dog?")
    assert hits and any("d1" in h.source_ids for h in hits)
    assert all(h.components["rank"] >= 0.2 for h in hits) and len(hits) <= 3
    s = mem.stats()
    assert s["leaves"] == 4 and s["content_nodes"] == s["nodes"] - 1


async def test_async_add_and_retrieve():
    mem = MemTree(KeywordEmbedder())
    rep = await mem.aadd([Message(t, id=f"m{i + 1}") for i, t in enumerate(M)])
    assert [d["action"] for d in rep.details] == ["first", "expand", "attach", "expand", "expand", "attach"]
    hits = await mem.aretrieve("pizza", policy="traversal", k=1)
    assert hits[0].source_ids == ["m3"]
