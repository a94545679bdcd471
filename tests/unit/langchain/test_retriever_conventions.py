"""``HierMemRetriever`` configured as LangChain's ``VectorStoreRetriever``: ``search_kwargs`` (``k``,
``filter``, ``fetch_k``, ``lambda_mult``), ``search_type`` (``similarity``, ``mmr`` checked against
LangChain's own ``InMemoryVectorStore`` MMR over the same candidates), refusals at construction; and the
LangGraph store's ``embeddings`` beside ``index_config``, as LangGraph's ``InMemoryStore`` has it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.store.memory import InMemoryStore
from pydantic import ValidationError

from langchain_hiermem import HierMemEmbeddings, HierMemRetriever, HierMemStore, LangChainEmbedder
from shared_core import MemTree, SegTreeMem
from shared_core.types import InvalidInputError, Message, NodeNotFoundError
from tests.support.langgraph_store import EMBEDDINGS, FACTS, MEMORY_KWARGS, index
from tests.support.memory import HashEmbedder

EMB = DeterministicFakeEmbedding(size=64)
TOPICS = ["tea", "sea", "pea", "tea", "tea", "sea"]


def _memory(cls: Any = SegTreeMem) -> Any:
    mem = cls(embedder=LangChainEmbedder(EMB))
    mem.add(
        [
            Message(f"note {i} about {t}", id=f"m{i}", metadata={"tags": ["finance", t] if i % 3 else [t]})
            for i, t in enumerate(TOPICS * 3)
        ]
    )
    return mem


@pytest.fixture(scope="module")
def mem() -> SegTreeMem:
    return _memory()


# ---------------------------------------------------------------------------------------------- k
def test_search_kwargs_k_sets_the_number_of_documents(mem: SegTreeMem) -> None:
    r = HierMemRetriever(memory=mem, search_kwargs={"k": 1})
    assert len(r.invoke("tea")) == 1
    assert len(r.invoke("tea", k=3)) == 3  # a call's k overrides
    assert len(HierMemRetriever(memory=mem, k=2, search_kwargs={"k": 2}).invoke("tea")) == 2


def test_k_and_search_kwargs_k_that_disagree_are_refused(mem: SegTreeMem) -> None:
    with pytest.raises(ValidationError, match=r"k=2 and search_kwargs\['k'\]=1"):
        HierMemRetriever(memory=mem, k=2, search_kwargs={"k": 1})


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"k": 0}, "k must be a positive integer, got 0"),
        ({"k": True}, "got True"),
        ({"fetch_k": 0}, "fetch_k must be a positive integer, got 0"),
        ({"fetch_k": 2.5}, "got 2.5"),
        ({"lambda_mult": 1.5}, r"lambda_mult must be a number in \[0, 1\], got 1.5"),
        ({"lambda_mult": "high"}, "got 'high'"),
        ({"lambda_mult": float("nan")}, "got nan"),
        ({"filter": {"tags": {"$in": "finance"}}}, "takes a list of values"),
        ({"filter": {"tags": {"$regex": "x"}}}, r"\$regex"),
        ({"filter": {"a": 1}, "where": {"a": 1}}, "not both"),
    ],
)
def test_bad_search_kwargs_are_refused_at_construction(mem: SegTreeMem, kwargs: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        HierMemRetriever(memory=mem, search_kwargs=kwargs)


# ---------------------------------------------------------------------------------------------- search_type
@pytest.mark.parametrize("search_type", ["similarity_score", "MMR", "hybrid", ""])
def test_an_unsupported_search_type_is_refused_at_construction_by_name(
    mem: SegTreeMem, search_type: str
) -> None:
    with pytest.raises(ValidationError, match=f"search_type {search_type!r} is not supported"):
        HierMemRetriever(memory=mem, search_type=search_type)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.6, 0.9, 1.0])
def test_similarity_score_threshold_keeps_the_hits_scoring_at_least_it(
    mem: SegTreeMem, threshold: float
) -> None:
    r = HierMemRetriever(
        memory=mem,
        search_type="similarity_score_threshold",
        search_kwargs={"k": 6, "score_threshold": threshold},
    )
    want = [h.node_id for h in mem.retrieve("note about tea", k=6) if h.score >= threshold]
    got = r.invoke("note about tea")
    assert [d.metadata["node_id"] for d in got] == want
    assert all(d.metadata["score"] >= threshold for d in got)


@pytest.mark.parametrize(
    "kwargs", [{}, {"score_threshold": None}, {"score_threshold": 1.5}, {"score_threshold": "x"}]
)
def test_similarity_score_threshold_needs_a_threshold_in_the_unit_interval(
    mem: SegTreeMem, kwargs: dict
) -> None:
    with pytest.raises(ValidationError, match="score_threshold"):
        HierMemRetriever(memory=mem, search_type="similarity_score_threshold", search_kwargs=kwargs)


def test_similarity_is_the_default_and_the_memory_ranking(mem: SegTreeMem) -> None:
    r = HierMemRetriever(memory=mem, search_kwargs={"k": 3, "fetch_k": 5, "lambda_mult": 0.1})
    assert r.search_type == "similarity"
    assert [d.metadata["node_id"] for d in r.invoke("tea")] == [h.node_id for h in mem.retrieve("tea", k=3)]


@pytest.mark.parametrize("cls", [SegTreeMem, MemTree])
@pytest.mark.parametrize("lambda_mult", [0.0, 0.25, 1.0])
async def test_mmr_is_langchains_mmr_over_the_fetched_hits(cls: Any, lambda_mult: float) -> None:
    """The reference: LangChain's ``InMemoryVectorStore`` holding the same ``fetch_k`` hits under the same
    embeddings, asked for its own ``max_marginal_relevance_search``."""
    memory = _memory(cls)
    k, fetch_k, query = 4, 9, "note about tea"
    fetched = memory.retrieve(query, k=fetch_k)
    ref = InMemoryVectorStore(EMB)
    ref.add_texts([h.text for h in fetched])
    want = [d.page_content for d in ref.max_marginal_relevance_search(query, k, fetch_k, lambda_mult)]
    r = HierMemRetriever(
        memory=memory,
        search_type="mmr",
        search_kwargs={"k": k, "fetch_k": fetch_k, "lambda_mult": lambda_mult},
    )
    assert [d.page_content for d in r.invoke(query)] == want
    assert [d.page_content for d in await r.ainvoke(query)] == want
    if lambda_mult == 0.0:  # diversity only: not the ranking's own top k
        assert want != [h.text for h in fetched[:k]]


def test_mmr_defaults_are_langchains_and_filters_apply(mem: SegTreeMem) -> None:
    r = HierMemRetriever(
        memory=mem, search_type="mmr", search_kwargs={"filter": {"tags": {"$in": ["finance"]}}}
    )
    docs = r.invoke("tea")
    assert len(docs) == 4  # k 4, from fetch_k 20
    assert all("finance" in d.metadata["tags"] for d in docs)
    assert (
        len(HierMemRetriever(memory=mem, search_type="mmr", search_kwargs={"fetch_k": 2}).invoke("tea")) == 2
    )


def test_mmr_retrieves_again_when_a_hit_is_deleted_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = _memory()
    r = HierMemRetriever(memory=memory, search_type="mmr", search_kwargs={"fetch_k": 6})
    want = [d.id for d in r.invoke("tea")]
    real, calls = memory.node_vectors, []

    def racing(ids: list[int]) -> Any:  # the first read finds a node gone (fault injection)
        calls.append(list(ids))
        if len(calls) == 1:
            raise NodeNotFoundError(f"No node with id {ids[0]} in this memory.")
        return real(ids)

    monkeypatch.setattr(memory, "node_vectors", racing)
    assert [d.id for d in r.invoke("tea")] == want and len(calls) == 2
    monkeypatch.setattr(memory, "node_vectors", _gone)  # gone again: the error is not hidden
    with pytest.raises(NodeNotFoundError):
        r.invoke("tea")


def _gone(ids: list[int]) -> Any:
    raise NodeNotFoundError(f"No node with id {ids[0]} in this memory.")


def test_mmr_on_an_empty_memory_returns_nothing() -> None:
    empty = SegTreeMem(embedder=HashEmbedder())
    assert HierMemRetriever(memory=empty, search_type="mmr").invoke("anything") == []


def test_filter_in_matches_a_list_valued_field(mem: SegTreeMem) -> None:
    r = HierMemRetriever(memory=mem, search_kwargs={"k": 50, "filter": {"tags": {"$in": ["finance"]}}})
    ids = {d.id for d in r.invoke("note")}
    assert ids == {f"m{i}" for i in range(len(TOPICS) * 3) if i % 3}
    r = HierMemRetriever(memory=mem, search_kwargs={"k": 50, "filter": {"tags": {"$nin": ["finance"]}}})
    assert {d.id for d in r.invoke("note")} == {f"m{i}" for i in range(len(TOPICS) * 3) if not i % 3}


# ---------------------------------------------------------------------------------------------- store
def test_store_embeddings_are_the_index_embed_as_in_langgraph() -> None:
    assert HierMemStore().embeddings is None
    assert InMemoryStore().embeddings is None
    assert HierMemStore(index=index()).embeddings is EMBEDDINGS
    assert InMemoryStore(index=index()).embeddings is EMBEDDINGS

    def embed(texts: list[str]) -> list[list[float]]:
        return EMBEDDINGS.embed_documents(texts)

    ours, theirs = HierMemStore(index=index(embed)).embeddings, InMemoryStore(index=index(embed)).embeddings
    assert type(ours) is type(theirs)
    assert ours.embed_query("dog") == theirs.embed_query("dog") == EMBEDDINGS.embed_query("dog")
    core = HashEmbedder()
    wrapped = HierMemStore(index={"dims": core.dim, "embed": core}).embeddings
    assert isinstance(wrapped, HierMemEmbeddings)
    assert np.allclose(wrapped.embed_query("dog"), core.embed(["dog"])[0])


def test_store_filter_in_and_nin_on_list_and_scalar_fields() -> None:
    store = HierMemStore(index=index(), memory_kwargs=MEMORY_KWARGS)
    ns = ("t",)
    for i, fact in enumerate(FACTS):
        store.put(ns, f"k{i}", {"text": fact, "tags": ["finance", "q3"] if i % 2 else ["health"], "n": i})
    for query in (None, "dog hospital"):
        got = {
            it.key for it in store.search(ns, query=query, filter={"tags": {"$in": ["finance"]}}, limit=10)
        }
        assert got == {"k1", "k3", "k5"}
        got = {
            it.key for it in store.search(ns, query=query, filter={"tags": {"$nin": ["finance"]}}, limit=10)
        }
        assert got == {"k0", "k2", "k4"}
        got = {it.key for it in store.search(ns, query=query, filter={"n": {"$in": [0, 5]}}, limit=10)}
        assert got == {"k0", "k5"}
    assert store.search(ns, filter={"tags": "finance"}) == []  # equality is of the whole value
    either = {"$or": [{"n": {"$in": [0]}}, {"$and": [{"tags": {"$in": ["q3"]}}, {"n": {"$gte": 4}}]}]}
    assert {it.key for it in store.search(ns, query="dog", filter=either, limit=10)} == {"k0", "k5"}
    with pytest.raises(InvalidInputError, match="got None"):
        store.search(ns, filter={"tags": {"$in": [None]}})


def test_documents_carry_supersession_and_the_retriever_passes_as_of() -> None:
    """A replaced statement's Document names the newer one and when it was replaced; as_of reads it as
    current before then (and leaves the newer one out)."""
    mem = SegTreeMem(HashEmbedder())
    mem.add(
        [
            Message(
                "I've watched 10 Crash Course videos so far this year.", id="old", timestamp="2024-01-05"
            ),
            Message(
                "I just finished watching my 15th Crash Course video this year!",
                id="new",
                timestamp="2024-03-01",
            ),
        ]
    )
    docs = HierMemRetriever(memory=mem, search_kwargs={"k": 2}).invoke("Crash Course videos watched")
    assert [d.id for d in docs] == ["new", "old"]
    assert (docs[1].metadata["superseded_by"], docs[1].metadata["valid_to"]) == (["new"], "2024-03-01")
    assert (docs[0].metadata["superseded_by"], docs[0].metadata["valid_from"]) == ([], "2024-03-01")
    then = HierMemRetriever(memory=mem, search_kwargs={"k": 2}).invoke(
        "Crash Course videos", as_of="2024-02-01"
    )
    assert [(d.id, d.metadata["superseded_by"]) for d in then] == [("old", [])]
