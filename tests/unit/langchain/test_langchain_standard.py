"""LangChain's standard tests (``langchain_tests``) on HierMemRetriever and HierMemEmbeddings.

The memories hold real all-MiniLM-L6-v2 embeddings of a dozen short texts, built once per session.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, RetrieversIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from langchain_hiermem import HierMemEmbeddings, HierMemRetriever
from shared_core.memories.base import HierarchicalMemory


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The local model embeds a few short texts per call here: one intra-op thread is fastest for that
    and does not compete with other processes for the cores."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TEXTS = [
    "I adopted a beagle puppy called Luna in March.",
    "Luna chewed through my running shoes yesterday.",
    "My sister Clara works as a marine biologist in Brest.",
    "We are planning a trip to Kyoto for the cherry blossoms.",
    "The flight to Osaka leaves on the 2nd of April.",
    "I have been baking sourdough bread every Sunday.",
    "My starter is called Bubbles and lives in the fridge.",
    "The quarterly report is due at the end of the month.",
    "My manager asked me to lead the new data project.",
    "I started learning the cello with a teacher downtown.",
    "Luna's vet appointment is on Thursday at 10am.",
    "Clara is visiting us for Easter with her two kids.",
]


@cache
def filled(kind: str) -> HierarchicalMemory:
    """A memory of ``kind`` holding TEXTS (built once per process)."""
    from shared_core.models.local import LocalEmbedder

    if kind == "segtree":
        from shared_core import SegTreeMem

        mem: HierarchicalMemory = SegTreeMem(embedder=LocalEmbedder())
    elif kind == "hat":
        from shared_core import HAT

        mem = HAT(embedder=LocalEmbedder())
    else:
        memtree = pytest.importorskip("shared_core.memories.memtree")
        mem = memtree.MemTree(embedder=LocalEmbedder(), threshold=0.0)
    mem.add(TEXTS)
    return mem


class TestSegTreeRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return HierMemRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": filled("segtree")}

    @property
    def retriever_query_example(self) -> str:
        return "What is the name of my dog?"


class TestMemTreeRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return HierMemRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": filled("memtree"), "policy": "collapsed"}

    @property
    def retriever_query_example(self) -> str:
        return "When does the flight to Japan leave?"


class TestHATRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return HierMemRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": filled("hat")}

    @property
    def retriever_query_example(self) -> str:
        return "Who is visiting for Easter?"


def test_the_standard_query_finds_the_fact():
    """Beyond the standard shape checks: the example query's best document is the right text."""
    docs = HierMemRetriever(memory=filled("segtree"), k=3).invoke("What is the name of my dog?")
    assert "Luna" in docs[0].page_content
    docs = HierMemRetriever(memory=filled("hat"), k=3).invoke("Who is visiting for Easter?")
    assert len(docs) == 3 and "Clara is visiting" in docs[0].page_content


# ---------------------------------------------------------------------------- XMemory (begin)
@cache
def filled_xmemory() -> HierarchicalMemory:
    """An XMemory holding TEXTS, its last episode closed (built once per process)."""
    from shared_core.memories.xmemory import XMemory
    from shared_core.models.local import LocalEmbedder

    mem = XMemory(embedder=LocalEmbedder())
    mem.add(TEXTS)
    mem.flush()
    return mem


class TestXMemoryRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return HierMemRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": filled_xmemory()}

    @property
    def retriever_query_example(self) -> str:
        return "Where does my sister work?"


def test_xmemory_returns_k_documents_with_the_fact_first():
    """Every xMemory policy gives exactly k documents; the default one puts the right message first."""
    docs = HierMemRetriever(memory=filled_xmemory(), k=3).invoke("Where does my sister work?")
    assert len(docs) == 3 and "marine biologist in Brest" in docs[0].page_content
    for policy in ("adaptive", "representative", "collapsed"):
        assert len(HierMemRetriever(memory=filled_xmemory(), k=3, policy=policy).invoke("my sister")) == 3


# ---------------------------------------------------------------------------- XMemory (end)


@cache
def _local_embedder() -> Any:
    from shared_core.models.local import LocalEmbedder

    return LocalEmbedder()


class TestHierMemEmbeddingsUnit(EmbeddingsUnitTests):
    """LangChain's standard unit tests on HierMemEmbeddings (the embedded all-MiniLM-L6-v2)."""

    @property
    def embeddings_class(self) -> type[HierMemEmbeddings]:
        return HierMemEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"embedder": _local_embedder()}


class TestHierMemEmbeddingsIntegration(EmbeddingsIntegrationTests):
    """LangChain's standard integration tests on HierMemEmbeddings (real model, offline)."""

    @property
    def embeddings_class(self) -> type[HierMemEmbeddings]:
        return HierMemEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"embedder": _local_embedder()}
