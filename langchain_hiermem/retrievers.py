"""A LangChain retriever over any hiermem memory."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from shared_core.memories.base import HierarchicalMemory
from shared_core.types import Hit, InvalidInputError

__all__ = ["HierMemRetriever", "hit_to_document"]

# Keyword arguments LangChain's invoke() forwards that are not retrieval parameters.
_LANGCHAIN_KWARGS = frozenset({"verbose", "run_id", "run_name", "tags", "metadata", "callbacks"})


def hit_to_document(hit: Hit) -> Document:
    """Turn a core :class:`~shared_core.types.Hit` into a LangChain ``Document``.

    Returns:
        ``Document(page_content=hit.text, id=..., metadata=...)``: ``id`` is the caller's source id
        (``Message.id``) for a leaf that has one, else ``str(hit.node_id)``; the metadata holds the
        hit's own metadata (e.g. ``level``, ``kind``, ``policy``, ``role``, ``speaker``, ``timestamp`` and
        the message's metadata) and then ``score`` (float), ``depth`` (int), ``span`` (``[first, last]``
        insertion indices, 0-based), ``source_ids`` (list of str), ``node_id`` (int), ``is_leaf`` (bool).

    References:
        Core :class:`~shared_core.types.Hit`; LangChain ``Document``.
    """
    md: dict[str, Any] = dict(hit.metadata)
    md.update(
        score=float(hit.score),
        depth=int(hit.depth),
        span=[int(hit.span[0]), int(hit.span[1])],
        source_ids=list(hit.source_ids),
        node_id=int(hit.node_id),
        is_leaf=bool(hit.is_leaf),
    )
    doc_id = hit.source_ids[0] if hit.is_leaf and hit.source_ids else str(hit.node_id)
    return Document(page_content=hit.text, metadata=md, id=doc_id)


class HierMemRetriever(BaseRetriever):
    """Retrieve from a hiermem memory (MemTree, SegTreeMem, HAT, xMemory) as LangChain ``Document`` s.

    ``retriever.invoke(query, k=1, policy="top_down", alpha=0.2)`` overrides the defaults for one call;
    other keyword arguments are the policy's parameters (as in ``memory.retrieve``).

    Args:
        memory: any core :class:`~shared_core.memories.base.HierarchicalMemory`.
        k: documents per query, default 4 (LangChain retrievers' usual default); ``None`` = the memory's
            own default (10 for SegTreeMem).
        policy: retrieval policy, default ``None`` = the memory's default (e.g. SegTreeMem ``collapsed``;
            see ``memory.policies``).
        max_tokens: optional budget of returned text in tokens (as ``shared_core.memories.base.count_tokens``
            counts); default ``None`` (no budget).
        search_kwargs: the policy's parameters for every call, e.g. ``{"alpha": 0.1, "horizon": 2}``;
            default ``{}``. Keyword arguments of ``invoke`` override them. ``filter`` (LangChain's
            name; ``where`` is the core's) restricts hits to messages whose metadata match, e.g.
            ``{"user": "ann", "turn": {"$gte": 10}}``, and ``time_range=(start, end)`` to messages
            said in that range (ISO-8601 strings or datetimes); both apply before top-k, and a summary
            comes back only when every message under it passes (see ``shared_core.search.filters``).

    Returns (from ``invoke``):
        Documents best first, ``page_content`` = node text, metadata as :func:`hit_to_document` gives.

    Raises:
        InvalidInputError: empty query, ``k < 1``, ``max_tokens < 1``, an invalid ``filter`` or
            ``time_range``, or both ``filter`` and ``where``.
        UnknownPolicyError: a policy the memory does not have.
        LLMRequiredError: an LLM-only policy on a memory without an LLM.

    References:
        Core ``HierarchicalMemory.retrieve``; the retrieval policies of each paper (e.g. SegTreeMem
        Algorithm 2, MemTree collapsed retrieval).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: HierarchicalMemory
    k: int | None = 4
    policy: str | None = None
    max_tokens: int | None = None
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("k", "max_tokens")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and (isinstance(v, bool) or v < 1):
            raise ValueError(f"must be a positive integer or None, got {v!r}")
        return v

    def _params(self, k: int | None, policy: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        params = {**self.search_kwargs}
        params.update({n: v for n, v in kwargs.items() if n not in _LANGCHAIN_KWARGS})
        if "filter" in params:
            if params.get("where") is not None:
                raise InvalidInputError("Give filter= or where= (the same condition), not both.")
            params["where"] = params.pop("filter")
        if "max_tokens" not in params and self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        k = self.k if k is None else k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
        params["k"] = k
        params["policy"] = policy if policy is not None else self.policy
        return params

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        hits = self.memory.retrieve(query, **self._params(k, policy, kwargs))
        return [hit_to_document(h) for h in hits]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        hits = await self.memory.aretrieve(query, **self._params(k, policy, kwargs))
        return [hit_to_document(h) for h in hits]
