"""LangChain and LangGraph integration of hiermem.

Needs the ``langchain`` extra (``langchain-core`` and ``langgraph-checkpoint``):

* :class:`HierMemRetriever` — a ``BaseRetriever`` over any hiermem memory.
* :class:`HierMemStore` — a LangGraph ``BaseStore`` (``create_agent(..., store=HierMemStore())``), one
  memory per namespace.
* :class:`LangChainEmbedder`, :class:`LangChainLLM` — LangChain models as core models;
  :class:`HierMemEmbeddings` — a core embedder as LangChain ``Embeddings``.

Needs the ``agents`` extra (``langchain`` and ``langgraph`` in addition), loaded on first access:

* :class:`HierMemMiddleware` — ``create_agent(..., middleware=[HierMemMiddleware()])``: each user's turns
  remembered, and recalled for the model (fenced as data, within a token budget) in later threads.
* :func:`create_memory_tools` — ``remember`` / ``recall`` tools over the same per-user memories.

Without them, accessing one raises :class:`MissingExtraError` naming ``hiermem[agents]`` (the tools need
only ``langgraph``); a run that names no user raises :class:`MissingUserError`.

Needs the ``legacy`` extra (``langchain-classic`` in addition), loaded on first access:

* :class:`SegTreeMemory`, :class:`MemTreeMemory`, :class:`HATMemory`, :class:`XMemoryMemory` (and their
  base :class:`HierMemMemory`) — legacy ``BaseMemory`` classes for ``ConversationChain`` (deprecated by
  LangChain; kept for users of that API). Without ``langchain-classic``, accessing one raises
  :class:`MissingExtraError` (an ``ImportError``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import AlgorithmUnavailableError, MissingExtraError, MissingUserError
from .models import HierMemEmbeddings, LangChainEmbedder, LangChainLLM
from .retrievers import HierMemRetriever, hit_to_document
from .store import HierMemStore
from .store_durable import DurableHierMemStore

if TYPE_CHECKING:
    from .memory import HATMemory, HierMemMemory, MemTreeMemory, SegTreeMemory, XMemoryMemory
    from .middleware import HierMemMiddleware
    from .tools import create_memory_tools

__all__ = [
    "AlgorithmUnavailableError",
    "DurableHierMemStore",
    "HATMemory",
    "HierMemEmbeddings",
    "HierMemMemory",
    "HierMemMiddleware",
    "HierMemRetriever",
    "HierMemStore",
    "LangChainEmbedder",
    "LangChainLLM",
    "MemTreeMemory",
    "MissingExtraError",
    "MissingUserError",
    "SegTreeMemory",
    "XMemoryMemory",
    "create_memory_tools",
    "hit_to_document",
]

# Loaded on first access: the legacy ``BaseMemory`` classes import ``langchain_classic`` (the ``legacy``
# extra), the middleware and the tools import ``langchain`` and ``langgraph`` (the ``agents`` extra).
_LAZY = {
    **dict.fromkeys(
        ("HATMemory", "HierMemMemory", "MemTreeMemory", "SegTreeMemory", "XMemoryMemory"), ".memory"
    ),
    "HierMemMiddleware": ".middleware",
    "create_memory_tools": ".tools",
}


def __getattr__(name: str) -> Any:
    """Import the legacy ``BaseMemory`` classes, the middleware and the tools on first access (PEP 562).

    Raises:
        MissingExtraError: ``langchain-classic`` (``pip install "hiermem[legacy]"``) or ``langchain``
            (``pip install "hiermem[agents]"``) is not installed.
        AttributeError: no attribute of that name.
    """
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
