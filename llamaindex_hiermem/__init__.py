"""LlamaIndex integration of hiermem: indices, a retriever, a memory block and model adapters.

* Indices (``BaseIndex[IndexGraph]``): :class:`SegTreeIndex`, :class:`MemTreeIndex`, :class:`HATIndex`,
  :class:`XMemoryIndex` (and :class:`HierMemIndex` around any given memory), reloaded with
  ``SegTreeIndex.from_persist_dir(d)`` or :func:`load_index_from_storage`.
* :class:`HierMemRetriever` (``BaseRetriever``) and :class:`HierMemBlock` (``BaseMemoryBlock`` for
  ``llama_index.core.memory.Memory``, one memory per session; :class:`SessionMismatchError`).
* Models: :class:`LlamaIndexEmbedder`, :class:`LlamaIndexLLM` (LlamaIndex models as core protocols),
  :class:`HierMemEmbedding` (a core embedder as a LlamaIndex ``BaseEmbedding``).
"""

from .base import (
    HATIndex,
    HierMemIndex,
    HierMemVectorStore,
    MemTreeIndex,
    SegTreeIndex,
    XMemoryIndex,
    load_index_from_storage,
)
from .memory import HierMemBlock, SessionMismatchError
from .models import HierMemEmbedding, LlamaIndexEmbedder, LlamaIndexLLM, resolve_embedder, resolve_llm
from .retrievers import HierMemRetriever

__all__ = [
    "HATIndex",
    "HierMemBlock",
    "HierMemEmbedding",
    "HierMemIndex",
    "HierMemRetriever",
    "HierMemVectorStore",
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "MemTreeIndex",
    "SegTreeIndex",
    "SessionMismatchError",
    "XMemoryIndex",
    "load_index_from_storage",
    "resolve_embedder",
    "resolve_llm",
]
