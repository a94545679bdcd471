"""LangChain and LangGraph integration of hiermem.

Needs the ``langchain`` extra (``langchain-core`` and ``langgraph-checkpoint``):

* :class:`HierMemRetriever` — a ``BaseRetriever`` over any hiermem memory.
* :class:`HierMemStore` — a LangGraph ``BaseStore`` (``create_agent(..., store=HierMemStore())``), one
  memory per namespace.
* :class:`LangChainEmbedder`, :class:`LangChainLLM` — LangChain models as core models;
  :class:`HierMemEmbeddings` — a core embedder as LangChain ``Embeddings``.

Needs the ``legacy`` extra (``langchain-classic`` in addition), loaded on first access:

* :class:`SegTreeMemory`, :class:`MemTreeMemory`, :class:`HATMemory`, :class:`XMemoryMemory` (and their
  base :class:`HierMemMemory`) — legacy ``BaseMemory`` classes for ``ConversationChain`` (deprecated by
  LangChain; kept for users of that API). Without ``langchain-classic``, accessing one raises
  :class:`MissingExtraError` (an ``ImportError``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import AlgorithmUnavailableError, MissingExtraError
from .models import HierMemEmbeddings, LangChainEmbedder, LangChainLLM
from .retrievers import HierMemRetriever, hit_to_document
from .store import HierMemStore

if TYPE_CHECKING:
    from .memory import HATMemory, HierMemMemory, MemTreeMemory, SegTreeMemory, XMemoryMemory

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
    "MissingExtraError",
    "SegTreeMemory",
    "XMemoryMemory",
    "hit_to_document",
]

# Legacy ``BaseMemory`` classes: their module imports ``langchain_classic`` (the ``legacy`` extra).
_LEGACY = frozenset({"HATMemory", "HierMemMemory", "MemTreeMemory", "SegTreeMemory", "XMemoryMemory"})


def __getattr__(name: str) -> Any:
    """Import the legacy ``BaseMemory`` classes on first access (PEP 562).

    Raises:
        MissingExtraError: ``langchain-classic`` is not installed (``pip install "hiermem[legacy]"``).
        AttributeError: no attribute of that name.
    """
    if name in _LEGACY:
        value = getattr(importlib.import_module(".memory", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
