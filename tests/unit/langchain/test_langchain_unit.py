"""Unit tests of langchain_hiermem: model adapters, retriever, legacy BaseMemory classes and LangGraph store.

LangChain's fakes (FakeListChatModel, GenericFakeChatModel, FakeListLLM, DeterministicFakeEmbedding) stand
in for providers; the real local MiniLM embedder is used where semantic similarity matters.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.language_models import FakeListChatModel, FakeListLLM, GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from pydantic import Field, ValidationError

from langchain_hiermem import (
    AlgorithmUnavailableError,
    HATMemory,
    HierMemEmbeddings,
    HierMemMemory,
    HierMemRetriever,
    HierMemStore,
    LangChainEmbedder,
    LangChainLLM,
    MemTreeMemory,
    SegTreeMemory,
    XMemoryMemory,
)
from langchain_hiermem.models import as_core_embedder, as_core_llm
from shared_core import SegTreeMem
from shared_core.types import (
    EmbeddingError,
    HierMemError,
    Hit,
    InvalidInputError,
    Message,
    ModelError,
    UnknownPolicyError,
)
from tests.support.langgraph_store import FACTS
from tests.support.memory import HashEmbedder


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The local model embeds a few short texts per call here: one intra-op thread is fastest for that
    and does not compete with other processes for the cores."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FAKE_DIM = 256


def fake_embedder(size: int = FAKE_DIM) -> LangChainEmbedder:
    """Hash-seeded random vectors: identical texts get identical vectors, others are near-orthogonal."""
    return LangChainEmbedder(DeterministicFakeEmbedding(size=size))


def seg_memory(**kw: Any) -> SegTreeMem:
    return SegTreeMem(embedder=kw.pop("embedder", None) or fake_embedder(), relevance="dense", **kw)


# =========================================================================== model adapters
class BrokenEmbeddings(Embeddings):
    """Embeddings returning a configurable wrong answer or raising."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.mode == "raise":
            raise RuntimeError("provider down")
        if self.mode == "rows":
            return [[1.0, 0.0]] * (len(texts) + 1)
        if self.mode == "nan":
            return [[float("nan"), 1.0] for _ in texts]
        return [[1.0] * (2 + i) for i, _ in enumerate(texts)]  # ragged

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def test_langchain_embedder_matches_the_wrapped_embeddings_and_learns_dim():
    lc = DeterministicFakeEmbedding(size=12)
    emb = LangChainEmbedder(lc)
    out = emb.embed(["a", "b", "a"])
    assert out.dtype == np.float32 and out.shape == (3, 12)
    np.testing.assert_allclose(out, np.asarray(lc.embed_documents(["a", "b", "a"]), dtype=np.float32))
    assert emb.dim == 12
    assert emb.embed([]).shape == (0, 12)
    assert LangChainEmbedder(DeterministicFakeEmbedding(size=5)).dim == 5  # probe before any call
    assert asyncio.run(emb.aembed(["b"])).tolist() == out[1:2].tolist()


@pytest.mark.parametrize(
    ("mode", "err"), [("raise", ModelError), ("rows", EmbeddingError), ("nan", EmbeddingError)]
)
def test_langchain_embedder_errors_are_typed(mode, err):
    emb = LangChainEmbedder(BrokenEmbeddings(mode))
    with pytest.raises(err):
        emb.embed(["x", "y"])


def test_langchain_embedder_rejects_other_dimension_and_bad_input():
    emb = LangChainEmbedder(DeterministicFakeEmbedding(size=4), dim=8)
    with pytest.raises(EmbeddingError, match="dimension 4"):
        emb.embed(["x"])
    with pytest.raises(InvalidInputError):
        LangChainEmbedder(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        LangChainEmbedder(DeterministicFakeEmbedding(size=4), dim=0)
    with pytest.raises(InvalidInputError):
        fake_embedder().embed(["ok", 3])  # type: ignore[list-item]


def test_hiermem_embeddings_round_trip_with_the_local_model(local_embedder):
    lc = HierMemEmbeddings(local_embedder)
    texts = ["a quiet evening", "the stock market fell"]
    docs = lc.embed_documents(texts)
    assert len(docs) == 2 and len(docs[0]) == 384
    np.testing.assert_allclose(docs, local_embedder.embed(texts), atol=1e-6)
    np.testing.assert_allclose(lc.embed_query(texts[1]), docs[1], atol=1e-6)
    np.testing.assert_allclose(asyncio.run(lc.aembed_query(texts[0])), docs[0], atol=1e-6)
    assert lc.embed_documents([]) == []
    # back again: LangChain -> core gives the same vectors, and wrapping twice unwraps
    np.testing.assert_allclose(LangChainEmbedder(lc).embed(texts), docs, atol=1e-6)
    assert as_core_embedder(lc) is local_embedder
    with pytest.raises(InvalidInputError):
        HierMemEmbeddings(object())


class RecordingChat(FakeListChatModel):
    """FakeListChatModel that records the messages and call kwargs it got (and has a max_tokens field)."""

    max_tokens: int | None = None
    seen: list[Any] = Field(default_factory=list)
    kwargs_seen: list[dict[str, Any]] = Field(default_factory=list)

    def _call(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.seen.append(list(messages))
        self.kwargs_seen.append(dict(kwargs))
        return super()._call(messages, stop, run_manager, **kwargs)


class RecordingLLM(FakeListLLM):
    seen: list[str] = Field(default_factory=list)

    def _call(self, prompt, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.seen.append(prompt)
        return super()._call(prompt, stop, run_manager, **kwargs)


def test_langchain_llm_chat_sends_system_and_prompt_and_max_tokens():
    chat = RecordingChat(responses=["first", "second"])
    llm = LangChainLLM(chat)
    c = llm.complete("the prompt", system="be brief", max_tokens=7)
    assert c.text == "first" and c.usage.llm_calls == 1 and c.logprobs is None
    msgs = chat.seen[0]
    assert [type(m) for m in msgs] == [SystemMessage, HumanMessage]
    assert [m.content for m in msgs] == ["be brief", "the prompt"]
    assert chat.kwargs_seen[0].get("max_tokens") == 7
    c2 = asyncio.run(llm.acomplete("again"))
    assert c2.text == "second" and [type(m) for m in chat.seen[1]] == [HumanMessage]
    assert "max_tokens" not in chat.kwargs_seen[1]
    assert llm.usage.llm_calls == 2


def test_langchain_llm_reads_usage_metadata_and_logprobs():
    answer = AIMessage(
        content="MERGE_1",
        usage_metadata={"input_tokens": 31, "output_tokens": 2, "total_tokens": 33},
        response_metadata={
            "logprobs": {"content": [{"token": "MERGE", "logprob": -0.5}, {"token": "_1", "logprob": -0.25}]}
        },
    )
    llm = LangChainLLM(GenericFakeChatModel(messages=iter([answer, answer])))
    c = llm.complete("pick one", logprobs=True)
    assert (c.text, c.usage.prompt_tokens, c.usage.completion_tokens) == ("MERGE_1", 31, 2)
    assert c.logprobs == [-0.5, -0.25]
    assert llm.complete("pick one").logprobs is None  # not asked for


def test_langchain_llm_text_llm_gets_system_prepended():
    base = RecordingLLM(responses=["done"])
    c = LangChainLLM(base).complete("question", system="rules")
    assert c.text == "done" and base.seen == ["rules\n\nquestion"]


def test_langchain_llm_errors_are_typed():
    class Boom(FakeListChatModel):
        def _call(self, *a, **k):  # type: ignore[override]
            raise RuntimeError("503 from provider")

    llm = LangChainLLM(Boom(responses=["x"]))
    with pytest.raises(ModelError, match="503 from provider"):
        llm.complete("hi")
    with pytest.raises(InvalidInputError):
        llm.complete("   ")
    with pytest.raises(InvalidInputError):
        llm.complete("hi", max_tokens=0)
    with pytest.raises(InvalidInputError):
        LangChainLLM("gpt-4o")  # type: ignore[arg-type]
    assert isinstance(as_core_llm(FakeListChatModel(responses=["x"])), LangChainLLM)
    assert as_core_llm(None) is None


class CompatChat(RecordingChat):
    """Answers SPLIT to compatibility prompts and a fixed annotation to everything else."""

    def _call(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.seen.append(list(messages))
        return "SPLIT" if "MERGE_1" in messages[-1].content else "Facts about work and a dog."


def test_core_memory_runs_on_langchain_models():
    """A SegTreeMem whose embedder and LLM are LangChain fakes: inserts call the chat model (batch_llm)."""
    chat = CompatChat(responses=["unused"])
    mem = SegTreeMem(embedder=fake_embedder(), llm=LangChainLLM(chat), compat="batch_llm", relevance="dense")
    report = mem.add(FACTS[:3])
    # 2nd message: no candidate, new root, 1 annotation; 3rd: 1 compatibility call (SPLIT), 1 annotation
    assert report.usage.llm_calls == len(chat.seen) == 3
    assert ["MERGE_1" in m[-1].content for m in chat.seen] == [False, True, False]
    assert mem.stats()["decisions"] == {"none": 2}
    root = mem.retrieve("work", k=20, admissible="all", policy="collapsed")
    assert "Facts about work and a dog." in [h.text for h in root if not h.is_leaf]
    assert mem.retrieve(FACTS[1], k=1)[0].text == FACTS[1]
    wrapped = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=8), llm=chat, compat="batch_llm")
    assert isinstance(wrapped.memory.llm, LangChainLLM) and wrapped.memory.llm.model is chat


# =========================================================================== retriever
@pytest.fixture
def filled() -> SegTreeMem:
    mem = seg_memory()
    mem.add(FACTS)
    return mem


def test_retriever_documents_carry_hit_fields(filled):
    r = HierMemRetriever(memory=filled)
    docs = r.invoke(FACTS[2])
    hits = filled.retrieve(FACTS[2], k=4)
    assert len(docs) == 4 == r.k
    assert [d.page_content for d in docs] == [h.text for h in hits]
    d, h = docs[0], hits[0]
    assert d.page_content == FACTS[2]
    assert d.metadata["score"] == pytest.approx(h.score)
    assert d.metadata["span"] == [2, 2] and isinstance(d.metadata["span"], list)
    assert (d.metadata["depth"], d.metadata["node_id"], d.metadata["is_leaf"]) == (h.depth, h.node_id, True)
    assert d.metadata["source_ids"] == [] and d.metadata["kind"] == "segtree"
    assert d.metadata["policy"] == "collapsed"  # the memory's default
    assert d.id == str(h.node_id)  # a leaf without a source id: the node id


def test_retriever_document_id_is_the_source_id_of_a_leaf():
    mem = SegTreeMem(embedder=HashEmbedder(), admissible="all")
    mem.add([Message(f"note {i} about {t}", id=f"msg-{i}") for i, t in enumerate(["tea", "tea", "sea"] * 4)])
    docs = HierMemRetriever(memory=mem, k=10, policy="collapsed").invoke("tea")
    assert any(not d.metadata["is_leaf"] for d in docs)
    for d in docs:
        if d.metadata["is_leaf"]:
            assert d.id == d.metadata["source_ids"][0] and d.id.startswith("msg-")
        else:
            assert d.id == str(d.metadata["node_id"])


def test_retriever_per_call_k_policy_and_params(filled):
    r = HierMemRetriever(memory=filled, k=3, search_kwargs={"alpha": 0.5})
    assert len(r.invoke(FACTS[0], k=1)) == 1
    docs = r.invoke(FACTS[0], policy="bottom_up")
    assert len(docs) == 3 and {d.metadata["policy"] for d in docs} == {"bottom_up"}
    want = filled.retrieve(FACTS[0], k=3, alpha=0.5)
    assert [d.metadata["score"] for d in r.invoke(FACTS[0])] == pytest.approx([h.score for h in want])
    want = filled.retrieve(FACTS[0], k=3, alpha=0.0)  # invoke kwargs override search_kwargs
    assert [d.metadata["score"] for d in r.invoke(FACTS[0], alpha=0.0)] == pytest.approx(
        [h.score for h in want]
    )
    assert len(HierMemRetriever(memory=filled, k=None).invoke(FACTS[0])) == len(FACTS)  # memory default 10


def test_retriever_errors(filled):
    r = HierMemRetriever(memory=filled)
    with pytest.raises(UnknownPolicyError):
        r.invoke("x", policy="agent")
    with pytest.raises(InvalidInputError):
        r.invoke("x", k=0)
    with pytest.raises(InvalidInputError):
        r.invoke("   ")
    with pytest.raises(ValidationError):
        HierMemRetriever(memory=filled, k=0)
    with pytest.raises(ValidationError):
        HierMemRetriever(memory="not a memory")  # type: ignore[arg-type]
    assert HierMemRetriever(memory=seg_memory()).invoke("anything") == []


class SlowEmbedder:
    """Wraps an embedder and sleeps ``delay`` seconds in every call (to see whether a loop is blocked)."""

    def __init__(self, base: Any) -> None:
        self.base, self.delay = base, 0.0

    @property
    def dim(self) -> int:
        return self.base.dim

    def embed(self, texts):
        time.sleep(self.delay)
        return self.base.embed(texts)

    async def aembed(self, texts):
        return await asyncio.to_thread(self.embed, texts)


async def test_retriever_ainvoke_does_not_block_the_event_loop():
    slow = SlowEmbedder(fake_embedder())
    mem = seg_memory(embedder=slow)
    mem.add(FACTS[:3])
    slow.delay = 0.5
    r = HierMemRetriever(memory=mem, k=2)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    docs = await r.ainvoke(FACTS[1])
    task.cancel()
    assert [d.page_content for d in docs][0] == FACTS[1]
    assert ticks >= 5  # a blocked loop would not tick at all during the 0.5 s query embedding


# =========================================================================== legacy BaseMemory
def turns(mem: HierMemMemory, pairs: list[tuple[str, str]]) -> None:
    for human, ai in pairs:
        mem.save_context({"input": human}, {"response": ai})


PAIRS = [
    ("Hi, I moved to Lisbon last month.", "Welcome to Lisbon!"),
    ("My daughter Ines turns seven in May.", "Seven is a fun age."),
    ("I am allergic to peanuts.", "Thanks, I will remember that."),
]


def test_save_context_stores_roles_and_speakers():
    m = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=FAKE_DIM), relevance="dense")
    assert isinstance(m.memory, SegTreeMem) and isinstance(m.memory.embedder, LangChainEmbedder)
    turns(m, PAIRS[:1])
    m.save_context({"input": "only me"}, {"response": "  "})  # empty AI output is not stored
    hits = m.memory.retrieve("x", k=10, admissible="leaves")
    got = sorted((h.span[0], h.text, h.metadata["role"], h.metadata["speaker"]) for h in hits)
    assert got == [  # the core stores and returns a message as "<speaker>: <text>" (Message.render)
        (0, f"Human: {PAIRS[0][0]}", "user", "Human"),
        (1, f"AI: {PAIRS[0][1]}", "assistant", "AI"),
        (2, "Human: only me", "user", "Human"),
    ]
    assert all(h.metadata["timestamp"] for h in hits)


def test_load_memory_variables_is_chronological_text_and_messages():
    m = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=FAKE_DIM), relevance="dense", k=6)
    turns(m, PAIRS)
    query = f"Human: {PAIRS[2][0]}"  # leaves are stored as "<speaker>: <text>"; fake embeddings hash text
    hits = m.memory.retrieve(query, k=6)
    assert hits[0].text == query and hits[0].span[0] == 4  # best first is not chronological ...
    history = m.load_memory_variables({"input": query})["history"]
    expected = [f"Human: {h}\nAI: {a}" for h, a in PAIRS]
    assert history == "\n".join(expected)  # ... the rendering is
    m.return_messages = True
    msgs = m.load_memory_variables({"input": query})["history"]
    assert [type(x) for x in msgs] == [HumanMessage, AIMessage] * 3
    assert [x.content for x in msgs] == [t for pair in PAIRS for t in pair]


def test_render_of_internal_nodes_and_unknown_speakers():
    m = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=FAKE_DIM), human_prefix="Ann", ai_prefix="Bot")
    summary = Hit(node_id=9, text="Talk about Lisbon.", score=1.0, depth=1, is_leaf=False, span=(2, 5))
    leaf = Hit(
        node_id=3, text="ok", score=2.0, depth=2, is_leaf=True, span=(4, 4), metadata={"role": "assistant"}
    )
    plain = Hit(node_id=4, text="raw note", score=0.5, depth=2, is_leaf=True, span=(0, 0))
    assert (
        m.render([leaf, summary, plain]) == "raw note\nSummary of messages 3-6: Talk about Lisbon.\nBot: ok"
    )
    m.return_messages = True
    out = m.render([leaf, summary])
    assert [type(x) for x in out] == [SystemMessage, AIMessage]
    assert out[0].content == "Summary of messages 3-6: Talk about Lisbon."


def test_max_tokens_budget_of_the_rendered_history():
    metrics = pytest.importorskip("shared_core.eval.metrics")
    m = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=FAKE_DIM), relevance="dense", k=6)
    turns(m, PAIRS)
    full = m.load_memory_variables({"input": PAIRS[1][0]})["history"]
    budget = metrics.count_tokens(full) // 2
    m.max_tokens = budget
    part = m.load_memory_variables({"input": PAIRS[1][0]})["history"]
    assert 0 < metrics.count_tokens(part) <= budget
    assert f"Human: {PAIRS[1][0]}" in part  # the best hit fits and is kept
    assert set(part.split("\n")) < set(full.split("\n"))


def test_keys_clear_and_async_paths():
    m = SegTreeMemory(embedder=DeterministicFakeEmbedding(size=FAKE_DIM), relevance="dense")
    with pytest.raises(ValueError, match="One input key"):
        m.save_context({"input": "a", "other": "b"}, {"response": "c"})
    with pytest.raises(InvalidInputError, match="output_key"):
        m.save_context({"input": "a"}, {"x": "1", "y": "2"})
    m.input_key, m.output_key = "q", "y"
    m.save_context({"q": "question text", "lang": "en"}, {"x": "1", "y": "answer text"})
    assert m.load_memory_variables({"q": "question text", "lang": "en"})["history"] == (
        "Human: question text\nAI: answer text"
    )
    asyncio.run(m.asave_context({"q": "second question"}, {"y": "second answer"}))
    got = asyncio.run(m.aload_memory_variables({"q": "second question"}))["history"]
    assert got == m.load_memory_variables({"q": "second question"})["history"]
    assert len(m.memory) == 4
    m.clear()
    assert len(m.memory) == 0 and m.load_memory_variables({"q": "anything"}) == {"history": ""}
    m.return_messages = True
    assert m.load_memory_variables({"q": "anything"}) == {"history": []}
    assert m.memory_variables == ["history"]


def test_as_retriever_shares_the_core_memory():
    m = SegTreeMemory(
        embedder=DeterministicFakeEmbedding(size=FAKE_DIM), relevance="dense", policy="collapsed"
    )
    turns(m, PAIRS)
    r = m.as_retriever(k=2)
    assert r.memory is m.memory and r.policy == "collapsed"
    docs = r.invoke(f"AI: {PAIRS[1][1]}")
    assert len(docs) == 2 and docs[0].page_content == f"AI: {PAIRS[1][1]}"
    assert docs[0].metadata["speaker"] == "AI" and docs[0].metadata["policy"] == "collapsed"
    assert m.as_retriever(policy="bottom_up").policy == "bottom_up"


def test_memory_construction_errors():
    with pytest.raises(InvalidInputError, match="memory="):
        HierMemMemory()
    with pytest.raises(InvalidInputError, match="compat"):
        SegTreeMemory(memory=seg_memory(), compat="cosine")
    with pytest.raises(InvalidInputError):
        HierMemMemory(memory="nope")  # type: ignore[arg-type]
    with pytest.raises(UnknownPolicyError):
        SegTreeMemory(embedder=DeterministicFakeEmbedding(size=8), compat="nonsense")
    with pytest.raises(InvalidInputError, match="memory_ky.*memory_key.*threshold"):
        SegTreeMemory(embedder=DeterministicFakeEmbedding(size=8), memory_ky="h")
    wrapped = HierMemMemory(memory=seg_memory())
    assert wrapped.memory_key == "history" and wrapped.k is None

    class Missing(HierMemMemory):
        algorithm = ("shared_core.no_such_algorithm", "Nope")

    with pytest.raises(AlgorithmUnavailableError, match="no_such_algorithm") as e:
        Missing()
    assert isinstance(e.value, ImportError) and isinstance(e.value, HierMemError)


@pytest.mark.parametrize(
    ("cls", "module", "name"),
    [
        (MemTreeMemory, "shared_core.memories.memtree", "MemTree"),
        (HATMemory, "shared_core.memories.hat", "HAT"),
        (XMemoryMemory, "shared_core.memories.xmemory", "XMemory"),
    ],
)
def test_other_algorithms_as_conversation_memory(cls, module, name):
    mod = pytest.importorskip(module)
    m = cls(embedder=DeterministicFakeEmbedding(size=FAKE_DIM))
    assert isinstance(m.memory, getattr(mod, name))
    turns(m, PAIRS)
    history = m.load_memory_variables({"input": f"Human: {PAIRS[1][0]}"})["history"]
    assert "Ines turns seven" in history  # said at turn 2, found at turn 3
    docs = m.as_retriever(k=1).invoke(f"Human: {PAIRS[1][0]}")
    assert len(docs) == 1 and docs[0].metadata["kind"] == m.memory.kind
    with pytest.raises(InvalidInputError, match=name):
        cls(memory=seg_memory())


# =========================================================================== LangGraph store
NS = ("memories", "ann")


def make_store(**kw: Any) -> HierMemStore:
    return HierMemStore(
        embedder=kw.pop("embedder", None) or fake_embedder(), memory_kwargs={"relevance": "dense"}, **kw
    )


def leaf_texts(store: HierMemStore, ns: tuple[str, ...]) -> list[str]:
    mem = store.get_memory(ns)
    return sorted(h.text for h in mem.retrieve("x", k=1000, admissible="leaves")) if mem and len(mem) else []


def test_store_put_get_update_delete_keep_the_memory_in_step():
    s = make_store()
    s.put(NS, "dog", {"text": FACTS[0]})
    s.put(NS, "job", {"content": FACTS[1], "year": 2024})
    first = s.get(NS, "dog")
    assert first.value == {"text": FACTS[0]} and first.namespace == NS and first.key == "dog"
    assert leaf_texts(s, NS) == sorted(FACTS[:2])
    s.put(NS, "dog", {"text": "My dog is now called Nala."})
    again = s.get(NS, "dog")
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    assert leaf_texts(s, NS) == sorted([FACTS[1], "My dog is now called Nala."])  # replaced, not added
    s.delete(NS, "job")
    assert s.get(NS, "job") is None and leaf_texts(s, NS) == ["My dog is now called Nala."]
    assert [i.key for i in s.search(NS, query=FACTS[1])] == ["dog"]
    s.delete(NS, "dog")
    assert s.search(NS, query="dog") == [] and len(s.get_memory(NS)) == 0
    s.delete(NS, "never-there")  # deleting a missing key is a no-op


def test_store_text_fields():
    s = make_store(fields=["note"])
    s.put(NS, "a", {"note": "from the store fields", "text": "ignored"})
    s.put(NS, "b", {"memory": "from the put index", "note": "not this"}, index=["memory"])
    s.put(NS, "c", {"items": [{"t": "first part"}, {"t": "second part"}]}, index=["items[*].t"])
    s.put(NS, "d", {"note": "not indexed"}, index=False)
    assert leaf_texts(s, NS) == sorted(
        ["from the store fields", "from the put index", "first part", "second part"]
    )
    assert [i.key for i in s.search(NS, query="second part", limit=1)] == ["c"]
    s.put(NS, "c", {"items": [{"t": "only one"}]}, index=["items[*].t"])
    assert "first part" not in leaf_texts(s, NS) and "only one" in leaf_texts(s, NS)
    d = make_store()
    d.put(NS, "t", {"text": "the text field", "content": "not this"})
    d.put(NS, "c", {"content": "the content field"})
    d.put(NS, "j", {"b": 2, "a": "x"})
    assert leaf_texts(d, NS) == sorted(
        ["the text field", "the content field", json.dumps({"a": "x", "b": 2})]
    )


def test_store_query_search_ranks_filters_paginates_and_appends_unindexed():
    s = make_store()
    for i, f in enumerate(FACTS):
        s.put(NS, f"k{i}", {"text": f, "n": i})
    s.put(NS, "plain", {"n": 99}, index=False)
    res = s.search(NS, query=FACTS[3], limit=3)
    assert [r.key for r in res][0] == "k3" and len(res) == 3
    assert all(r.score is not None for r in res) and res[0].score >= res[1].score
    everything = s.search(NS, query=FACTS[3], limit=50)
    assert len(everything) == 7 and everything[-1].key == "plain" and everything[-1].score is None
    assert [r.key for r in s.search(NS, query=FACTS[3], limit=2, offset=1)] == [
        r.key for r in everything[1:3]
    ]
    hi = s.search(NS, query=FACTS[3], filter={"n": {"$gte": 4}}, limit=10)
    assert sorted(r.key for r in hi) == ["k4", "k5", "plain"]
    assert [r.key for r in s.search(NS, filter={"n": 2})] == ["k2"]
    listed = s.search(NS, limit=3, offset=2)
    assert [r.key for r in listed] == ["k2", "k3", "k4"] and all(r.score is None for r in listed)
    assert s.search(NS, query=FACTS[0], limit=0) == []
    with pytest.raises(InvalidInputError):
        s.search(NS, filter={"n": {"$regex": "x"}})
    with pytest.raises(InvalidInputError):
        s.search(NS, limit=-1)


def test_store_namespaces_never_mix():
    s = make_store()
    s.put(("users", "ann", "facts"), "a", {"text": FACTS[0]})
    s.put(("users", "bob", "facts"), "a", {"text": FACTS[1]})
    s.put(("users", "bob", "todo"), "t", {"text": FACTS[2]})
    ann, bob = s.get_memory(("users", "ann", "facts")), s.get_memory(("users", "bob", "facts"))
    assert ann is not bob and len(ann) == 1 and len(bob) == 1
    assert [i.value["text"] for i in s.search(("users", "ann"), query=FACTS[1])] == [FACTS[0]]
    assert s.get(("users", "ann", "facts"), "a").value["text"] == FACTS[0]
    across = s.search(("users",), query=FACTS[1], limit=10)
    assert {(i.namespace, i.key) for i in across} == {
        (("users", "ann", "facts"), "a"),
        (("users", "bob", "facts"), "a"),
        (("users", "bob", "todo"), "t"),
    }
    assert s.list_namespaces() == [
        ("users", "ann", "facts"),
        ("users", "bob", "facts"),
        ("users", "bob", "todo"),
    ]
    assert s.list_namespaces(prefix=("users", "bob")) == [("users", "bob", "facts"), ("users", "bob", "todo")]
    assert s.list_namespaces(suffix=("facts",)) == [("users", "ann", "facts"), ("users", "bob", "facts")]
    assert s.list_namespaces(prefix=("users", "*", "todo")) == [("users", "bob", "todo")]
    assert s.list_namespaces(max_depth=2) == [("users", "ann"), ("users", "bob")]
    assert s.list_namespaces(limit=1, offset=1) == [("users", "bob", "facts")]
    s.delete(("users", "bob", "todo"), "t")
    assert ("users", "bob", "todo") not in s.list_namespaces()


def test_store_batch_runs_in_order_and_adds_once_per_namespace():
    calls: list[tuple[str, ...]] = []

    def factory(namespace):
        calls.append(namespace)
        return seg_memory()

    s = HierMemStore(memory_factory=factory)
    out = s.batch(
        [
            PutOp(NS, "a", {"text": FACTS[0]}),
            PutOp(NS, "b", {"text": FACTS[1]}),
            PutOp(NS, "a", {"text": FACTS[2]}),  # the last put of a key wins
            PutOp(("other",), "z", {"text": FACTS[3]}),
            GetOp(NS, "a"),
            SearchOp(NS, query=FACTS[1], limit=1),
            PutOp(NS, "b", None),
            GetOp(NS, "b"),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("other",)),)),
        ]
    )
    assert calls == [NS, ("other",)]
    assert out[:4] == [None] * 4 and out[4].value == {"text": FACTS[2]}
    assert [i.key for i in out[5]] == ["b"] and out[6] is None and out[7] is None
    assert out[8] == [("other",)]
    assert leaf_texts(s, NS) == [FACTS[2]]
    with pytest.raises(InvalidNamespaceError):
        s.batch([PutOp((), "k", {"text": "x"})])
    with pytest.raises(InvalidNamespaceError):
        s.put(("a.b",), "k", {"text": "x"})
    with pytest.raises(InvalidInputError):
        s.batch([PutOp(NS, "k", ["not", "a", "mapping"])])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        HierMemStore(memory_factory=factory, memory_kwargs={"k": 3})


def test_store_one_add_call_per_namespace_in_a_batch():
    mem = seg_memory()
    adds: list[int] = []
    real_add = mem.add

    def counting_add(items, **kw):
        adds.append(len(items))
        return real_add(items, **kw)

    mem.add = counting_add  # type: ignore[method-assign]
    s = HierMemStore(memory_factory=lambda: mem)
    s.batch([PutOp(NS, f"k{i}", {"text": f}) for i, f in enumerate(FACTS[:4])])
    assert adds == [4] and len(mem) == 4


_OPS = st.lists(
    st.tuples(
        st.sampled_from([("a",), ("b", "x")]),
        st.sampled_from(["k1", "k2", "k3"]),
        st.one_of(st.none(), st.sampled_from(FACTS)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, batched=st.booleans())
def test_store_memory_always_mirrors_the_items(ops, batched):
    """After any puts / deletes, each namespace's memory holds exactly its items' texts, keyed right."""
    s = make_store()
    ref: dict[tuple[str, ...], dict[str, str]] = {}
    if batched:
        s.batch([PutOp(ns, key, None if text is None else {"text": text}) for ns, key, text in ops])
    for ns, key, text in ops:
        if not batched:
            s.put(ns, key, {"text": text}) if text is not None else s.delete(ns, key)
        if text is None:
            ref.get(ns, {}).pop(key, None)
        else:
            ref.setdefault(ns, {})[key] = text
    for ns in [("a",), ("b", "x")]:
        want = ref.get(ns, {})
        assert {i.key: i.value["text"] for i in s.search(ns, limit=100)} == want
        mem = s.get_memory(ns)
        nodes = mem.to_dict()["tree"]["nodes"] if mem is not None else []
        leaves = [(n["message"]["id"], n["text"]) for n in nodes if n["is_leaf"]]
        assert sorted(leaves) == sorted(want.items())
        for text in set(want.values()):  # keys sharing a text are all found (hits never repeat a text)
            keys = {i.key for i in s.search(ns, query=text, limit=10)}
            assert {k for k, t in want.items() if t == text} <= keys
    assert s.list_namespaces() == sorted(ns for ns, items in ref.items() if items)


def test_store_filter_is_applied_before_top_k():
    """``limit`` matching items come back even when far more non-matching ones rank above them.

    400 non-matching items share three words with the query, the 3 matching ones none. The old search
    retrieved ``k = 3, 6, ..., 384`` hits (8 doublings) and dropped the non-matching ones: 384 < 400, so
    it found none of the 3. The filter now goes to the memory as ``where=``, before its top-k.
    """
    s = make_store(embedder=HashEmbedder())
    near = [PutOp(NS, f"near{i}", {"text": f"alpha beta gamma n{i}", "kind": "near"}) for i in range(400)]
    far = [PutOp(NS, f"far{i}", {"text": f"zeta eta theta f{i}", "kind": "far"}) for i in range(3)]
    s.batch([*near, *far])
    query = "alpha beta gamma"
    top = s.get_memory(NS).retrieve(query, k=384)  # what the old loop saw last: no matching item
    assert len(top) == 384 and not any(k.startswith("far") for h in top for k in h.source_ids)
    res = s.search(NS, query=query, filter={"kind": "far"}, limit=3)
    assert sorted(r.key for r in res) == ["far0", "far1", "far2"]
    everything = s.search(NS, query=query, limit=1000)  # the filter keeps the unfiltered order and scores
    want = [(r.key, r.score) for r in everything if r.value["kind"] == "far"]
    assert [(r.key, r.score) for r in res] == want
    assert [(r.key, r.score) for r in s.search(NS, query=query, filter={"kind": "far"}, limit=2)] == want[:2]
    assert [r.key for r in s.search(NS, query=query, filter={"kind": "far"}, limit=3, offset=1)] == [
        k for k, _ in want[1:]
    ]
    assert s.search(NS, query=query, filter={"kind": "none"}, limit=3) == []


def test_store_filter_finds_a_key_that_shares_its_text_with_a_filtered_out_key():
    """Hits never repeat a text: the hit of a shared text stands for every key that indexed it, so the
    matching key is found at the score the shared text has without the filter."""
    s = make_store()
    s.put(NS, "a", {"text": FACTS[0], "n": 1})
    s.put(NS, "b", {"text": FACTS[0], "n": 2})
    s.put(NS, "c", {"text": FACTS[1], "n": 2})
    everything = {r.key: r.score for r in s.search(NS, query=FACTS[0], limit=10)}
    for n, key in ((1, "a"), (2, "b")):
        hit = s.search(NS, query=FACTS[0], filter={"n": n}, limit=1)
        assert [(r.key, r.score) for r in hit] == [(key, everything[key])]
    both = s.search(NS, query=FACTS[0], filter={"n": {"$gte": 1}}, limit=10)
    assert {r.key: r.score for r in both} == everything


class FailOn:
    """An embedder that raises when asked to embed a given text."""

    def __init__(self, bad: str) -> None:
        self.base, self.bad = fake_embedder(), bad

    @property
    def dim(self) -> int:
        return self.base.dim

    def embed(self, texts):
        if self.bad in texts:
            raise ModelError("embedding service failed")
        return self.base.embed(texts)

    async def aembed(self, texts):
        return self.embed(texts)


def test_store_failed_put_leaves_items_and_memory_unchanged():
    s = make_store(embedder=FailOn("poison"))
    s.put(NS, "a", {"text": FACTS[0]})
    before = s.get(NS, "a")
    with pytest.raises(ModelError):
        s.batch([PutOp(NS, "a", {"text": "poison"}), PutOp(NS, "b", {"text": FACTS[1]})])
    assert s.get(NS, "a") == before and s.get(NS, "b") is None
    assert leaf_texts(s, NS) == [FACTS[0]]
    other = ("other",)  # a run of puts over two namespaces: the first one's add is undone
    s.put(other, "o", {"text": FACTS[2]})
    with pytest.raises(ModelError):
        s.batch([PutOp(other, "o", {"text": FACTS[3]}), PutOp(NS, "a", {"text": "poison"})])
    assert s.get(other, "o").value == {"text": FACTS[2]} and leaf_texts(s, other) == [FACTS[2]]
    assert s.get(NS, "a") == before and leaf_texts(s, NS) == [FACTS[0]]


async def test_store_async_api_and_retriever_view():
    s = make_store()
    await s.aput(NS, "a", {"text": FACTS[0]})
    await s.aput(NS, "b", {"text": FACTS[4]})
    assert (await s.aget(NS, "b")).value == {"text": FACTS[4]}
    res = await s.asearch(NS, query=FACTS[4], limit=1)
    assert [r.key for r in res] == ["b"]
    assert await s.alist_namespaces() == [NS]
    await s.adelete(NS, "b")
    assert await s.aget(NS, "b") is None
    docs = s.as_retriever(NS, k=1).invoke(FACTS[0])
    assert docs[0].page_content == FACTS[0] and docs[0].metadata["source_ids"] == ["a"]
    assert docs[0].metadata["namespace"] == list(NS) and docs[0].metadata["key"] == "a"


def test_store_semantic_search_with_the_local_model(local_embedder):
    s = HierMemStore(embedder=local_embedder, memory_kwargs={"relevance": "dense"})
    for i, f in enumerate(FACTS):
        s.put(NS, f"k{i}", {"text": f})
    assert s.search(NS, query="What breed is my pet?", limit=1)[0].key == "k0"
    assert s.search(NS, query="Which instrument am I practising?", limit=1)[0].key == "k5"
