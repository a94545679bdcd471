"""End to end: ConversationChain over a hierarchical memory, a LangChain ChatOpenAI driving SegTreeMem's
LLM compatibility model through the OpenAI-protocol test server, and a LangGraph agent with HierMemStore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_store
from pydantic import Field

from langchain_hiermem import HierMemStore, LangChainEmbedder, LangChainLLM, SegTreeMemory
from shared_core import SegTreeMem
from shared_core.prompts import segtree as P
from tests.support.openai_server import openai_server  # noqa: F401


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The local model embeds a few short texts per call here: one intra-op thread is fastest for that
    and does not compete with other processes for the cores."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class CachedEmbedder:
    """The real local embedder with the vectors of known texts computed up front in one batch.

    Texts outside the cache (e.g. new annotations) go to the real model; vectors are identical either way.
    """

    def __init__(self, base: Any, texts: Sequence[str]) -> None:
        self.base = base
        texts = list(dict.fromkeys(texts))
        self.cache = dict(zip(texts, base.embed(texts)))

    @property
    def dim(self) -> int:
        return self.base.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, self.base.embed(missing)))
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class RecordingChat(FakeListChatModel):
    """A fake chat model that records every message list it receives."""

    seen: list[Any] = Field(default_factory=list)

    def _call(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.seen.append(list(messages))
        return super()._call(messages, stop, run_manager, **kwargs)


# =========================================================================== ConversationChain
FACT = "My sister is called Clementine and she lives in Porto."
QUESTION = "Remind me, what is my sister's name and which city does she live in?"
FILLER = [
    "Good morning! I slept badly last night.",
    "Can you suggest a quick breakfast with oats?",
    FACT,
    "The weather here has been rainy all week.",
    "I need to renew my passport before summer.",
    "What is a good stretch for lower back pain?",
    "My laptop fan is making a strange noise.",
    "I finished reading a novel about lighthouse keepers.",
    "Any tips for keeping basil alive indoors?",
    "Our team moved the release to next Friday.",
    "I want to learn some basic Italian phrases.",
    "How long should I boil an egg for a soft yolk?",
    "The gym near my office opens at six.",
    "I am thinking about buying a second-hand bicycle.",
    "My phone battery drains very quickly lately.",
    "What board games work well for four players?",
    "I watched a documentary about octopuses.",
    "Should I water succulents every week?",
    "The train was delayed by forty minutes today.",
    "I am planning to repaint the kitchen blue.",
    "How do I make cold brew coffee at home?",
    "My neighbour's cat keeps visiting our garden.",
    "I signed up for a pottery class on Tuesdays.",
    "What is the difference between a crocodile and an alligator?",
    "I have a dentist appointment tomorrow morning.",
    "Our internet router needs a restart every day.",
    "I want to run a 10k race in the autumn.",
    "Any ideas for a vegetarian lasagne filling?",
    "I cleaned out the garage this weekend.",
    QUESTION,
]
REPLIES = [f"Understood, noted point {i + 1} of our chat." for i in range(len(FILLER))]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_conversation_chain_prompt_at_turn_30_contains_the_turn_3_fact(local_embedder):
    from langchain_classic.chains import ConversationChain

    assert len(FILLER) == 30 and FILLER[2] == FACT
    model = RecordingChat(responses=REPLIES)
    k = 4
    memory = SegTreeMemory(embedder=CachedEmbedder(local_embedder, FILLER + REPLIES), k=k)
    chain = ConversationChain(llm=model, memory=memory)
    for i, text in enumerate(FILLER):
        out = chain.invoke({"input": text})
        assert out["response"] == REPLIES[i]
    assert len(model.seen) == 30 and len(memory.memory) == 60
    prompt = model.seen[-1][-1].content  # what the model received at turn 30
    history = prompt.split("Current conversation:\n", 1)[1].rsplit(f"\nHuman: {QUESTION}", 1)[0]
    lines = [ln for ln in history.split("\n") if ln]
    assert f"Human: {FACT}" in lines  # the turn-3 fact reached the prompt ...
    assert len(lines) <= k  # ... through retrieval, not a full transcript (58 earlier messages)
    assert prompt.rstrip().endswith(f"Human: {QUESTION}\nAI:")
    assert "Clementine" not in model.seen[1][-1].content  # turn 2, before the fact was said


# =========================================================================== ChatOpenAI -> LangChainLLM
SUMMARY = "They talked about a dog and a trip."


def _scripted(req: dict[str, Any]) -> str:
    user = req["messages"][-1]["content"]
    return "MERGE_1" if "MERGE_1" in user else SUMMARY


def test_chat_openai_drives_segtree_batch_llm_through_the_test_server(openai_server):  # noqa: F811
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    openai_server.default_chat = _scripted
    chat = ChatOpenAI(model="test-model", base_url=openai_server.base_url, api_key="test", max_retries=0)
    emb = OpenAIEmbeddings(
        model="test-embedding",
        base_url=openai_server.base_url,
        api_key="test",
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    llm = LangChainLLM(chat)
    mem = SegTreeMem(embedder=LangChainEmbedder(emb), llm=llm, compat="batch_llm", relevance="dense")
    utterances = ["I adopted a dog named Luna.", "She loves the beach.", "We drive to Biarritz in June."]
    usage = [mem.add(u).usage for u in utterances]

    reqs = openai_server.chat_requests()
    assert len(reqs) == 3 == sum(u.llm_calls for u in usage)  # annotate, compatibility, annotate
    batch = [r for r in reqs if r["messages"][0]["content"] == P.BATCH_SYSTEM]
    assert len(batch) == 1 and utterances[2] in batch[0]["messages"][-1]["content"]
    assert "MERGE_1" in batch[0]["messages"][-1]["content"]
    assert all(r["model"] == "test-model" for r in reqs)
    # the server counts whitespace tokens; the counts arrive through usage_metadata
    sent = sum(len(m["content"].split()) for r in reqs for m in r["messages"])
    assert sum(u.prompt_tokens for u in usage) == sent
    assert sum(u.completion_tokens for u in usage) == 2 * len(SUMMARY.split()) + 1
    embedded = [t for r in openai_server.embed_requests() for t in r["input"]]
    assert set(utterances) <= set(embedded)
    root = mem.retrieve("dog", k=10, admissible="all", policy="collapsed")
    assert SUMMARY in [h.text for h in root if not h.is_leaf]
    assert mem.stats()["decisions"].get("merge_2") == 1

    c = llm.complete("Say two words", logprobs=True, max_tokens=5)
    last = openai_server.chat_requests()[-1]
    assert last["logprobs"] is True and last["messages"] == [{"role": "user", "content": "Say two words"}]
    assert last.get("max_completion_tokens", last.get("max_tokens")) == 5
    assert c.logprobs == [-0.1] * len(c.text.split())


# =========================================================================== agent + store
class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel that accepts bind_tools (create_agent binds the tools to the model)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:  # type: ignore[override]
        return self


USER_NS = ("memories", "user-1")


@tool
def remember(fact: str, runtime: ToolRuntime) -> str:
    """Store a fact about the user for later conversations."""
    n = len(runtime.store.search(USER_NS, limit=1000))
    runtime.store.put(USER_NS, f"fact-{n}", {"text": fact})
    return f"stored as fact-{n}"


@tool
def recall(query: str) -> str:
    """Look up the stored fact that best answers the query."""
    items = get_store().search(USER_NS, query=query, limit=1)
    return items[0].value["text"] if items else "nothing stored"


def _call(name: str, args: dict[str, Any], i: int) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}", "type": "tool_call"}]
    )


def test_create_agent_uses_hiermem_store(local_embedder):
    facts = ["My dog is called Luna.", "I work night shifts as a nurse.", "I am allergic to peanuts."]
    store = HierMemStore(embedder=CachedEmbedder(local_embedder, facts))
    store.put(("memories", "user-2"), "fact-0", {"text": "My dog is called Rex."})  # another user's memory
    script = [_call("remember", {"fact": f}, i) for i, f in enumerate(facts)]
    script += [_call("recall", {"query": "What is the name of my dog?"}, 9), AIMessage(content="Luna!")]
    agent = create_agent(model=ToolCallingFake(messages=iter(script)), tools=[remember, recall], store=store)
    result = agent.invoke({"messages": [HumanMessage(content="Remember these and tell me my dog's name.")]})

    tool_out = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert tool_out == ["stored as fact-0", "stored as fact-1", "stored as fact-2", "My dog is called Luna."]
    assert result["messages"][-1].content == "Luna!"
    assert [store.get(USER_NS, f"fact-{i}").value["text"] for i in range(3)] == facts
    assert len(store.get_memory(USER_NS)) == 3 and len(store.get_memory(("memories", "user-2"))) == 1
