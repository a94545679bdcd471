"""What ``import langchain_hiermem`` loads: the retriever and the store need only ``langchain-core`` and
``langgraph-checkpoint`` (the ``langchain`` extra); the legacy ``BaseMemory`` classes load
``langchain_classic`` (the ``legacy`` extra) on first access, with a clear error when it is missing.

Here the public names and errors; what a fresh interpreter loads:
tests/integration/test_langchain_imports_fresh.py.
"""

from __future__ import annotations

import pytest

import langchain_hiermem
from langchain_hiermem import AlgorithmUnavailableError, MissingExtraError
from shared_core.types import HierMemError


def test_legacy_names_are_public_and_resolve_to_the_memory_module() -> None:
    from langchain_hiermem import (
        HATMemory,
        HierMemMemory,
        MemTreeMemory,
        SegTreeMemory,
        XMemoryMemory,
        memory,
    )

    assert (HierMemMemory, SegTreeMemory, MemTreeMemory, HATMemory, XMemoryMemory) == (
        memory.HierMemMemory,
        memory.SegTreeMemory,
        memory.MemTreeMemory,
        memory.HATMemory,
        memory.XMemoryMemory,
    )
    for name in langchain_hiermem.__all__:
        assert getattr(langchain_hiermem, name) is not None
        assert name in dir(langchain_hiermem)
    assert memory.AlgorithmUnavailableError is AlgorithmUnavailableError


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        langchain_hiermem.no_such_name  # noqa: B018
    assert not hasattr(langchain_hiermem, "ConversationChain")


def test_adapter_errors_are_hiermem_import_errors() -> None:
    for cls in (AlgorithmUnavailableError, MissingExtraError):
        assert issubclass(cls, HierMemError)
        assert issubclass(cls, ImportError)
    e = MissingExtraError("needs x", extra="legacy", name="langchain_classic")
    assert (str(e), e.extra, e.name) == ("needs x", "legacy", "langchain_classic")
