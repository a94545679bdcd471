"""``HierMemBlock``: a hiermem memory as a long-term block of LlamaIndex's ``Memory``."""

from __future__ import annotations

import uuid
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import Field
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.utils import get_tokenizer

from shared_core.base import HierarchicalMemory
from shared_core.types import Hit, InvalidInputError, Message

from .models import resolve_embedder, resolve_llm
from .retrievers import HierMemRetriever

__all__ = ["HierMemBlock"]


def _text(message: ChatMessage) -> str:
    return "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text).strip()


class HierMemBlock(BaseMemoryBlock[str]):
    """A hierarchical memory as a block of ``llama_index.core.memory.Memory``.

    Messages flushed from the short-term queue (when the chat history passes ``Memory``'s token limit)
    are added to the memory in order, one leaf per message with text (role kept; a random id; the
    session id in the metadata). When the memory is read, the block retrieves for the latest user
    message and renders the hits best first, one line each (newlines inside a text become spaces):
    ``"<role>: <text>"`` for a stored message and ``"(summary of messages i-j) <text>"`` for an internal
    node (``i``, ``j``: 1-based positions of the first and last message under it). Lines are kept while
    they fit ``max_tokens``, counted with LlamaIndex's global tokenizer (the one ``Memory`` uses by
    default); when ``Memory`` asks a block with ``priority > 0`` to shrink, the lowest-ranked lines go first.

    One block holds one conversation's long-term memory: use one block (and memory) per session.

    Args:
        name: block name in the memory template, default ``"hierarchical_memory"``.
        memory: the core memory; default ``None`` = a new :class:`~shared_core.segtree.SegTreeMem` with
            ``embed_model`` / ``llm`` resolved as by the indices (explicit, else ``Settings`` when set, else
            the local embedder and no LLM).
        embed_model: embedding model of the default memory (only without ``memory``), default ``None``.
        llm: LLM of the default memory (only without ``memory``), default ``None``.
        policy: retrieval policy, default ``None`` = the memory's default.
        similarity_top_k: at most this many hits per read, default 5.
        max_tokens: budget of the rendered block in tokens, default 512; ``None`` = no budget.
        policy_params: the policy's parameters, default ``{}``.
        priority: ``Memory`` truncation priority, default 0 (never truncated).
        description, accept_short_term_memory: as for every ``BaseMemoryBlock``.

    Raises:
        InvalidInputError: ``memory`` is not a hiermem memory, or given with ``embed_model`` / ``llm``;
            a bad ``similarity_top_k``, ``max_tokens`` or policy parameter.
        UnknownPolicyError: a policy the memory does not have.

    References:
        LlamaIndex ``Memory`` / ``BaseMemoryBlock``; the memories' papers (e.g. SegTreeMem Sec. 4,
        Algorithms 1-2).
    """

    name: str = Field(default="hierarchical_memory", description="The name of the memory block.")
    memory: Any = Field(default=None, exclude=True, description="The core hiermem memory.")
    embed_model: Any = Field(default=None, exclude=True, description="Embedding model of the default memory.")
    llm: Any = Field(default=None, exclude=True, description="LLM of the default memory.")
    policy: str | None = Field(default=None, description="Retrieval policy (default: the memory's).")
    similarity_top_k: int = Field(default=5, description="At most this many hits per read.")
    max_tokens: int | None = Field(default=512, description="Token budget of the rendered block.")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Retrieval policy parameters.")

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._build_memory()

    def _build_memory(self) -> None:
        if self.memory is None:
            from shared_core.segtree import SegTreeMem

            self.memory = SegTreeMem(embedder=resolve_embedder(self.embed_model), llm=resolve_llm(self.llm))
        elif self.embed_model is not None or self.llm is not None:
            raise InvalidInputError(
                "memory= already carries its models; do not also pass embed_model or llm."
            )
        # validates the memory type, policy, top-k, budget and policy parameters
        HierMemRetriever(
            self.memory,
            policy=self.policy,
            similarity_top_k=self.similarity_top_k,
            max_tokens=self.max_tokens,
            **self.policy_params,
        )

    @property
    def core(self) -> HierarchicalMemory:
        """The core memory."""
        return self.memory

    # ------------------------------------------------------------------ rendering
    @staticmethod
    def render_hit(hit: Hit) -> str:
        """One line for a hit: ``"<role>: <text>"`` (message) or ``"(summary of messages i-j) <text>"``."""
        text = " ".join(hit.text.split())
        if hit.is_leaf:
            role = hit.metadata.get("role")
            return f"{role}: {text}" if role else text
        first, last = hit.span[0] + 1, hit.span[1] + 1
        where = f"message {first}" if first == last else f"messages {first}-{last}"
        return f"(summary of {where}) {text}"

    def _render(self, hits: list[Hit]) -> str:
        tok = get_tokenizer()
        lines: list[str] = []
        used = 0
        for h in hits:
            line = self.render_hit(h)
            n = len(tok(line)) + (1 if lines else 0)
            if self.max_tokens is not None and used + n > self.max_tokens:
                continue
            lines.append(line)
            used += n
        return "\n".join(lines)

    # ------------------------------------------------------------------ BaseMemoryBlock
    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        """Retrieve for the latest user message; ``""`` when there is none or the memory is empty."""
        query = next((t for m in reversed(messages or []) if m.role == "user" and (t := _text(m))), "")
        if not query or len(self.memory) == 0:
            return ""
        hits = await self.memory.aretrieve(query, self.similarity_top_k, self.policy, **self.policy_params)
        return self._render(hits)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Add the messages with text to the memory, in order, in one atomic ``aadd``."""
        items = []
        for m in messages:
            text = _text(m)
            if not text:
                continue
            sid = m.additional_kwargs.get("session_id")
            meta = {"session_id": str(sid)} if sid is not None else {}
            role = m.role.value if hasattr(m.role, "value") else str(m.role)
            items.append(Message(text=text, role=role, id=uuid.uuid4().hex, metadata=meta))
        if items:
            await self.memory.aadd(items)

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Drop the lowest-ranked lines until at least ``tokens_to_truncate`` tokens are gone.

        Returns:
            The shortened block, or ``None`` when nothing is left.
        """
        if not content:
            return None
        tok = get_tokenizer()
        lines = content.split("\n")
        removed = 0
        while lines and removed < tokens_to_truncate:
            removed += len(tok(lines.pop())) + 1
        return "\n".join(lines) or None
