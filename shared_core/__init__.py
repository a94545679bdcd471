"""hiermem core: hierarchical long-term memories for LLM applications, framework-neutral.

Memories: :class:`SegTreeMem`, :class:`MemTree`, :class:`HAT`, :class:`XMemory`.
Models: :class:`LocalEmbedder` (embedded default),
:class:`OpenAIEmbedder`, :class:`OpenAIChat`, :class:`ExtractiveSummarizer`, :class:`LLMSummarizer`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _compat
from .memories import HAT, HierarchicalMemory, MemTree, SegTreeMem, XMemory, memory_classes
from .types import (
    AddReport,
    Completion,
    DuplicateIdError,
    EmbeddingError,
    HierMemError,
    Hit,
    InvalidInputError,
    LLMRequiredError,
    MemoryClosedError,
    Message,
    ModelError,
    NodeNotFoundError,
    PersistenceError,
    UnknownPolicyError,
    Usage,
    VersionMismatchError,
)

if TYPE_CHECKING:
    from .models.extractive import ExtractiveSummarizer
    from .models.llm_summarizer import LLMSummarizer
    from .models.local import LocalEmbedder
    from .models.openai_models import OpenAIChat, OpenAIEmbedder

__version__ = "0.1.0"

_compat.install()  # old module paths (shared_core.segtree, ...) keep working with a DeprecationWarning

__all__ = [
    "AddReport",
    "Completion",
    "DuplicateIdError",
    "EmbeddingError",
    "ExtractiveSummarizer",
    "HAT",
    "HierMemError",
    "HierarchicalMemory",
    "Hit",
    "InvalidInputError",
    "LLMRequiredError",
    "LLMSummarizer",
    "LocalEmbedder",
    "MemTree",
    "MemoryClosedError",
    "Message",
    "ModelError",
    "NodeNotFoundError",
    "OpenAIChat",
    "OpenAIEmbedder",
    "PersistenceError",
    "SegTreeMem",
    "UnknownPolicyError",
    "Usage",
    "VersionMismatchError",
    "XMemory",
    "memory_classes",
]

_LAZY = {
    "LocalEmbedder": ".models.local",
    "OpenAIEmbedder": ".models.openai_models",
    "OpenAIChat": ".models.openai_models",
    "ExtractiveSummarizer": ".models.extractive",
    "LLMSummarizer": ".models.llm_summarizer",
}


def __getattr__(name: str) -> Any:  # model classes load their heavy dependencies only when used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'shared_core' has no attribute {name!r}")
