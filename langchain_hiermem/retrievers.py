"""A LangChain retriever over any hiermem memory."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from pydantic import ConfigDict, Field, field_validator, model_validator

from shared_core.memories.base import HierarchicalMemory
from shared_core.search.filters import message_filter
from shared_core.search.walk import check_score
from shared_core.types import Hit, InvalidInputError, NodeNotFoundError

__all__ = ["SEARCH_TYPES", "HierMemRetriever", "hit_to_document"]

#: The ``search_type`` values the retriever takes (LangChain ``VectorStoreRetriever``'s).
SEARCH_TYPES = ("similarity", "similarity_score_threshold", "mmr")
#: LangChain's defaults of ``max_marginal_relevance_search``.
_FETCH_K, _LAMBDA_MULT = 20, 0.5

# Keyword arguments LangChain's invoke() forwards that are not retrieval parameters.
_LANGCHAIN_KWARGS = frozenset({"verbose", "run_id", "run_name", "tags", "metadata", "callbacks"})


def hit_to_document(hit: Hit) -> Document:
    """Turn a core :class:`~shared_core.types.Hit` into a LangChain ``Document``.

    Returns:
        ``Document(page_content=hit.text, id=..., metadata=...)``: ``id`` is the caller's source id
        (``Message.id``) for a leaf that has one, else ``str(hit.node_id)``; the metadata holds the
        hit's own metadata (e.g. ``level``, ``kind``, ``policy``, ``role``, ``speaker``, ``timestamp`` and
        the message's metadata) and then ``score`` (float), ``depth`` (int), ``span`` (``[first, last]``
        insertion indices, 0-based), ``source_ids`` (list of str), ``node_id`` (int), ``is_leaf`` (bool),
        and the supersession marks ``superseded_by`` (list of the newer source ids, empty while current),
        ``valid_from`` and ``valid_to`` (timestamps or ``None``; see :class:`~shared_core.types.Hit`).

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
        superseded_by=list(hit.superseded_by),
        valid_from=hit.valid_from,
        valid_to=hit.valid_to,
    )
    doc_id = hit.source_ids[0] if hit.is_leaf and hit.source_ids else str(hit.node_id)
    return Document(page_content=hit.text, metadata=md, id=doc_id)


class HierMemRetriever(BaseRetriever):
    """Retrieve from a hiermem memory (MemTree, SegTreeMem, HAT, xMemory) as LangChain ``Document`` s.

    Configured as LangChain's ``VectorStoreRetriever`` (``vectorstore.as_retriever(search_type=...,
    search_kwargs=...)``): ``search_kwargs`` holds ``k``, ``filter``, ``fetch_k`` and ``lambda_mult``.
    ``retriever.invoke(query, k=1, policy="top_down", alpha=0.2)`` overrides them for one call; other
    keyword arguments are the policy's parameters (as in ``memory.retrieve``).

    Args:
        memory: any core :class:`~shared_core.memories.base.HierarchicalMemory`.
        search_type: ``"similarity"`` (default: the memory's ranking, best first) or ``"mmr"`` (maximal
            marginal relevance, Carbonell & Goldstein 1998, as langchain_core's
            ``maximal_marginal_relevance`` computes it: the memory's ``fetch_k`` best hits, then ``k`` of
            them picked one by one for ``lambda_mult * cos(query, hit) - (1 - lambda_mult) * max cos(hit,
            picked)``, over the memory's own vectors (``memory.embed_query``, ``memory.node_vectors``);
            returned in the order picked) or ``"similarity_score_threshold"`` (the memory's ranking, only
            the hits whose :attr:`~shared_core.types.Hit.score`, the cosine similarity of query and text
            in ``[0, 1]``, is at least ``search_kwargs["score_threshold"]``, which it requires).
        k: documents per query, default 4 (LangChain retrievers' usual default); ``None`` = the memory's
            own default (10 for SegTreeMem). ``search_kwargs["k"]`` sets it too (the two must agree when
            both are given).
        policy: retrieval policy, default ``None`` = the memory's default (e.g. SegTreeMem ``collapsed``;
            see ``memory.policies``).
        max_tokens: optional budget of returned text in tokens (as ``shared_core.memories.base.count_tokens``
            counts); default ``None`` (no budget).
        search_kwargs: for every call, default ``{}``: ``k`` (int >= 1); ``filter`` (LangChain's name;
            ``where`` is the core's) restricting hits to messages whose metadata match, e.g.
            ``{"user": "ann", "tags": {"$in": ["finance"]}}`` (the filter language of
            ``shared_core.search.filters``, docs/filters.md); ``time_range=(start, end)`` to messages said
            in that range (ISO-8601 strings or datetimes); both apply before top-k, and a summary comes
            back only when every message under it passes. ``fetch_k`` (int >= 1, default 20) and
            ``lambda_mult`` (float in [0, 1], default 0.5: 1 = relevance only, 0 = diversity only) for
            ``"mmr"`` (ignored by ``"similarity"``, as vector stores ignore them). Anything else is a
            policy parameter, e.g. ``{"alpha": 0.1, "horizon": 2}``. ``score_threshold`` (float in
            [0, 1]) keeps only the hits scoring at least that (``memory.retrieve(min_score=...)``), under
            any search type.

    Returns (from ``invoke``):
        Documents, best first (``"mmr"``: in the order picked), ``page_content`` = node text, metadata as
        :func:`hit_to_document` gives (``score`` is :attr:`Hit.score`).

    Raises:
        pydantic.ValidationError: at construction, a ``search_type`` other than :data:`SEARCH_TYPES`
            (named), or a bad ``k``, ``fetch_k``, ``lambda_mult`` or ``filter`` in ``search_kwargs``, or a
            ``k`` field that disagrees with ``search_kwargs["k"]``.
        InvalidInputError: on a call, empty query, ``k < 1``, ``max_tokens < 1``, bad ``fetch_k`` /
            ``lambda_mult``, an invalid ``filter`` or ``time_range``, or both ``filter`` and ``where``.
        UnknownPolicyError: a policy the memory does not have.
        LLMRequiredError: an LLM-only policy on a memory without an LLM.

    References:
        Core ``HierarchicalMemory.retrieve``; the retrieval policies of each paper (e.g. SegTreeMem
        Algorithm 2, MemTree collapsed retrieval); LangChain ``VectorStoreRetriever`` and
        ``VectorStore.max_marginal_relevance_search``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: HierarchicalMemory
    search_type: str = "similarity"
    k: int | None = 4
    policy: str | None = None
    max_tokens: int | None = None
    search_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("search_type")
    @classmethod
    def _known_search_type(cls, v: str) -> str:
        if v not in SEARCH_TYPES:
            raise ValueError(
                f"search_type {v!r} is not supported; choose one of {', '.join(map(repr, SEARCH_TYPES))}."
            )
        return v

    @field_validator("k", "max_tokens")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and (isinstance(v, bool) or v < 1):
            raise ValueError(f"must be a positive integer or None, got {v!r}")
        return v

    @model_validator(mode="after")
    def _check_search_kwargs(self) -> HierMemRetriever:
        kw = self.search_kwargs
        if "k" in kw:
            _check_k(kw["k"])
            if "k" in self.model_fields_set and self.k != kw["k"]:
                raise ValueError(f"k={self.k!r} and search_kwargs['k']={kw['k']!r} disagree; give one.")
        _pop_mmr_params(dict(kw))
        if self.search_type == "similarity_score_threshold" and kw.get("score_threshold") is None:
            raise ValueError(
                "search_type 'similarity_score_threshold' needs search_kwargs['score_threshold'] "
                "(a number in [0, 1])."
            )
        _check_threshold(kw.get("score_threshold"))
        if kw.get("filter") is not None and kw.get("where") is not None:
            raise ValueError("Give search_kwargs filter= or where= (the same condition), not both.")
        message_filter(
            kw.get("time_range"), kw["filter"] if kw.get("filter") is not None else kw.get("where")
        )
        return self

    def _params(self, k: int | None, policy: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        params = {**self.search_kwargs}
        params.update({n: v for n, v in kwargs.items() if n not in _LANGCHAIN_KWARGS})
        if "filter" in params:
            if params.get("where") is not None:
                raise InvalidInputError("Give filter= or where= (the same condition), not both.")
            params["where"] = params.pop("filter")
        if "score_threshold" in params:
            params["min_score"] = _check_threshold(params.pop("score_threshold"))
        if "max_tokens" not in params and self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if k is None:
            k = params.get("k", self.k)
        if k is not None:
            _check_k(k)
        params["k"] = k
        params["policy"] = policy if policy is not None else self.policy
        return params

    def _search(self, query: str, params: dict[str, Any]) -> list[Document]:
        fetch_k, lambda_mult = _pop_mmr_params(params)
        if self.search_type != "mmr":
            hits = self.memory.retrieve(query, **params)
            return [hit_to_document(h) for h in hits]
        k = self.memory.default_k if params["k"] is None else params["k"]
        params["k"] = fetch_k
        try:
            hits, vectors = self._hits_and_vectors(query, params)
        except NodeNotFoundError:  # a hit deleted by another thread since the retrieval: once more
            hits, vectors = self._hits_and_vectors(query, params)
        if not hits:
            return []
        qvec = self.memory.embed_query(query)
        picked = maximal_marginal_relevance(qvec, vectors, lambda_mult=lambda_mult, k=k)  # type: ignore[arg-type]
        return [hit_to_document(hits[i]) for i in picked]

    def _hits_and_vectors(self, query: str, params: dict[str, Any]) -> tuple[list[Hit], np.ndarray]:
        hits = self.memory.retrieve(query, **params)
        return hits, self.memory.node_vectors([h.node_id for h in hits]) if hits else np.zeros((0, 0))

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        return self._search(query, self._params(k, policy, kwargs))

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        policy: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        params = self._params(k, policy, kwargs)
        if self.search_type == "mmr":
            return await asyncio.to_thread(self._search, query, params)
        _pop_mmr_params(params)
        hits = await self.memory.aretrieve(query, **params)
        return [hit_to_document(h) for h in hits]


def _check_threshold(v: Any) -> float | None:
    return check_score(v, "score_threshold")


def _check_k(k: Any) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")


def _pop_mmr_params(params: dict[str, Any]) -> tuple[int, float]:
    """Take ``fetch_k`` and ``lambda_mult`` out of ``params`` (LangChain's defaults 20 and 0.5), checked."""
    fetch_k = params.pop("fetch_k", _FETCH_K)
    if isinstance(fetch_k, bool) or not isinstance(fetch_k, (int, np.integer)) or fetch_k < 1:
        raise InvalidInputError(f"fetch_k must be a positive integer, got {fetch_k!r}.")
    lam = params.pop("lambda_mult", _LAMBDA_MULT)
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= float(lam) <= 1.0:
        raise InvalidInputError(f"lambda_mult must be a number in [0, 1], got {lam!r}.")
    return int(fetch_k), float(lam)
