"""LangChain and LangGraph integration of hiermem (the ``langchain`` extra).

* :class:`HierMemRetriever` — a ``BaseRetriever`` over any hiermem memory.
* :class:`HierMemStore` — a LangGraph ``BaseStore`` (``create_agent(..., store=HierMemStore())``), one
  memory per namespace.
* :class:`SegTreeMemory`, :class:`MemTreeMemory`, :class:`HATMemory`, :class:`XMemoryMemory` (and their
  base :class:`HierMemMemory`) — legacy ``BaseMemory`` classes for ``ConversationChain`` (deprecated by
  LangChain; kept for users of that API).
* :class:`LangChainEmbedder`, :class:`LangChainLLM` — LangChain models as core models;
  :class:`HierMemEmbeddings` — a core embedder as LangChain ``Embeddings``.
"""

from __future__ import annotations

from .memory import (
    AlgorithmUnavailableError,
    HATMemory,
    HierMemMemory,
    MemTreeMemory,
    SegTreeMemory,
    XMemoryMemory,
)
from .models import HierMemEmbeddings, LangChainEmbedder, LangChainLLM
from .retrievers import HierMemRetriever, hit_to_document
from .store import HierMemStore

__all__ = [
    "AlgorithmUnavailableError",
    "HATMemory",
    "HierMemEmbeddings",
    "HierMemMemory",
    "HierMemRetriever",
    "HierMemStore",
    "LangChainEmbedder",
    "LangChainLLM",
    "MemTreeMemory",
    "SegTreeMemory",
    "XMemoryMemory",
    "hit_to_document",
]
