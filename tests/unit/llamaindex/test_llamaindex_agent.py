"""The LlamaIndex counterpart of HierMemMiddleware: ``HierMemBlock`` in ``llama_index.core.memory.Memory``
given to a ``FunctionAgent``.

A FunctionAgent needs a function-calling LLM: LlamaIndex's ``MockFunctionCallingLLMWithChatMemoryOfLastCall``
answers by echoing and records the messages of its last call, so the test sees what reaches the model. A
new ``Memory`` with the same ``session_id`` plays a new conversation of the same user (the block is shared);
only the messages ``Memory`` flushed from its short-term queue reach the block.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core.agent.workflow", reason="llama-index-core is not installed")
mock = pytest.importorskip("llama_index.core.llms.mock")
if not hasattr(mock, "MockFunctionCallingLLMWithChatMemoryOfLastCall"):  # pragma: no cover
    pytest.skip("this llama-index-core has no MockFunctionCallingLLM", allow_module_level=True)

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402

from llamaindex_hiermem import HierMemBlock  # noqa: E402
from shared_core import SegTreeMem  # noqa: E402
from shared_core.namespaces import MemoryStore  # noqa: E402
from tests.support.memory import HashEmbedder  # noqa: E402

FACTS = [
    "My dog is called Luna and she loves the beach.",
    "I live in Porto near the river.",
    "I work as a nurse at night.",
]


def test_a_function_agent_recalls_a_users_facts_in_a_new_conversation_never_another_users() -> None:
    emb = HashEmbedder()
    block = HierMemBlock(store=MemoryStore(lambda: SegTreeMem(embedder=emb)), max_tokens=200)
    llm = mock.MockFunctionCallingLLMWithChatMemoryOfLastCall()
    agent = FunctionAgent(llm=llm, tools=[], system_prompt="You are kind.")

    def memory(user: str) -> Memory:
        # a small short-term queue, so earlier turns are flushed into the block
        return Memory.from_defaults(
            session_id=user, token_limit=40, chat_history_token_ratio=0.5, memory_blocks=[block]
        )

    def texts() -> list[str]:
        return [str(m.content) for m in llm.last_chat_messages or []]

    async def scenario() -> tuple[list[str], list[str]]:
        first = memory("ann")
        for fact in FACTS:
            await agent.run(fact, memory=first)
        await agent.run("What is my dog called?", memory=memory("ann"))  # a new conversation
        ann = texts()
        await agent.run("What is my dog called?", memory=memory("bob"))
        return ann, texts()

    ann, bob = asyncio.run(scenario())
    assert block.sessions() == ["ann"]  # bob's one turn is still in his short-term queue
    recalled = [t for t in ann if "<hierarchical_memory>" in t]
    assert len(recalled) == 1 and f"user: {FACTS[0]}" in recalled[0]
    assert ann[-1] == "What is my dog called?"
    assert not any("Luna" in t for t in bob)
    assert bob == ["You are kind.", "What is my dog called?"]
