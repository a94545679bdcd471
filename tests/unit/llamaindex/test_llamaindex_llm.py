"""LlamaIndex integration with a real LlamaIndex ``OpenAI`` LLM talking to the OpenAI-protocol test server."""

from __future__ import annotations

import pytest
from llama_index.core import Settings
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from llama_index.llms.openai import OpenAI

from llamaindex_hiermem import HierMemEmbedding, LlamaIndexLLM, SegTreeIndex
from shared_core.types import ModelError
from tests.support.llamaindex import HashEmbedder
from tests.support.openai_server import Reply, hash_embedding, openai_server  # noqa: F401

TEXTS = [
    "I adopted a dog named Luna last spring.",
    "Luna loves running on the beach every morning.",
    "My sister Maria lives in Oslo.",
]


@pytest.fixture(autouse=True)
def li_settings():
    """Explicit Settings (no implicit OpenAI default, no API key needed), restored after each test."""
    saved = (Settings._llm, Settings._embed_model)
    Settings.llm = MockLLM()
    Settings.embed_model = HierMemEmbedding(HashEmbedder())
    yield
    Settings._llm, Settings._embed_model = saved


@pytest.fixture
def llm(openai_server):  # noqa: F811
    return OpenAI(
        model="gpt-4o-mini",
        api_base=openai_server.base_url,
        api_key="test",
        max_retries=0,
        timeout=10.0,
    )


def nodes() -> list[TextNode]:
    return [TextNode(id_=f"n{i}", text=t) for i, t in enumerate(TEXTS)]


def test_llm_adapter_sends_system_prompt_cap_and_reads_usage_and_logprobs(llm, openai_server):  # noqa: F811
    openai_server.script_chat(Reply(text="Luna it is", logprobs=[-0.5, -0.25, -0.125]))
    core = LlamaIndexLLM(llm)
    c = core.complete("What is the dog's name?", system="Answer briefly.", max_tokens=7, logprobs=True)
    assert c.text == "Luna it is"
    assert c.logprobs == [-0.5, -0.25, -0.125]
    (req,) = openai_server.chat_requests()
    assert req["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the dog's name?"},
    ]
    assert req["max_tokens"] == 7 and req["logprobs"] is True
    # the server counts whitespace tokens: 2 (system) + 5 (user) prompt, 3 completion
    assert (c.usage.llm_calls, c.usage.prompt_tokens, c.usage.completion_tokens) == (1, 7, 3)
    assert core.usage.completion_tokens == 3


async def test_llm_adapter_async_and_errors(llm, openai_server):  # noqa: F811
    openai_server.script_chat("async answer", Reply(status=500, text="server exploded"))
    core = LlamaIndexLLM(llm)
    c = await core.acomplete("hello")
    assert c.text == "async answer" and c.logprobs is None
    assert "logprobs" not in openai_server.chat_requests()[0]
    with pytest.raises(ModelError, match="OpenAI"):
        core.complete("hello again")


def test_index_annotations_and_query_engine_use_the_openai_llm(llm, openai_server):  # noqa: F811
    openai_server.default_chat = "ANNOTATION"
    index = SegTreeIndex(nodes(), llm=llm, threshold=-1.0, relevance="dense")
    internal = [n for n in index.memory.to_dict()["tree"]["nodes"] if not n["is_leaf"]]
    assert internal and all(n["text"] == "ANNOTATION" for n in internal)
    assert len(openai_server.chat_requests()) == index.memory.usage.llm_calls > 0
    annotate_prompt = openai_server.chat_requests()[0]["messages"][-1]["content"]
    assert TEXTS[0] in annotate_prompt and TEXTS[1] in annotate_prompt

    openai_server.reset()
    openai_server.script_chat("Your dog is called Luna.")
    qe = index.as_query_engine(llm=llm, policy="collapsed", similarity_top_k=1, admissible="leaves")
    q = "What is my dog's name?"
    answer = qe.query(q)
    assert str(answer) == "Your dog is called Luna."
    top = index.memory.retrieve(q, k=1, policy="collapsed", admissible="leaves")[0].text
    assert [n.node.get_content() for n in answer.source_nodes] == [top]
    (req,) = openai_server.chat_requests()
    sent = " ".join(m["content"] for m in req["messages"])
    assert top in sent and q in sent


def test_chat_engine_context_mode_with_openai_llm(llm, openai_server):  # noqa: F811
    index = SegTreeIndex(nodes(), llm=None, relevance="dense")
    assert index.memory.llm is None  # Settings.llm is the MockLLM placeholder: no LLM for the memory
    openai_server.script_chat("She lives in Oslo.")
    engine = index.as_chat_engine(chat_mode="context", llm=llm, policy="bottom_up", similarity_top_k=2)
    reply = engine.chat("Where does Maria live?")
    assert str(reply) == "She lives in Oslo."
    assert engine._retriever.policy == "bottom_up"
    (req,) = openai_server.chat_requests()
    system = req["messages"][0]
    assert system["role"] == "system"
    for n in reply.source_nodes:
        assert n.node.get_content() in system["content"]


def test_failed_llm_insert_leaves_the_index_unchanged(llm, openai_server):  # noqa: F811
    openai_server.default_chat = "ANNOTATION"
    index = SegTreeIndex(nodes(), llm=llm, threshold=-1.0, relevance="dense")
    before = (index.memory.to_dict()["tree"], set(index.docstore.docs), dict(index.index_struct.all_nodes))
    openai_server.script_chat(Reply(status=500, text="down"), Reply(status=500, text="down"))
    with pytest.raises(ModelError):
        index.insert_nodes([TextNode(id_="late", text="Luna turned two years old.")])
    after = (index.memory.to_dict()["tree"], set(index.docstore.docs), dict(index.index_struct.all_nodes))
    assert after == before
