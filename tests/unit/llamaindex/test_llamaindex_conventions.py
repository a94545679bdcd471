"""LlamaIndex conventions: every retrieved node carries ``span`` and ``source_ids`` (a docstore leaf as a
copy, the stored node left as it is), and ``MetadataFilters`` ``in`` / ``nin`` follow the core's ``$in`` /
``$nin`` rule on list-valued fields (differentially against the core's ``where``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llama_index.core.schema import MetadataMode, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from llamaindex_hiermem import HierMemIndex
from llamaindex_hiermem.retrievers import metadata_matcher
from shared_core import SegTreeMem
from shared_core.search.filters import where_matcher
from shared_core.types import InvalidInputError
from tests.support.llamaindex import TEXTS, HashEmbedder


def _index() -> HierMemIndex:
    nodes = [
        TextNode(id_=f"n{i}", text=t, metadata={"tags": ["pets", "q3"] if i < 2 else ["family"], "turn": i})
        for i, t in enumerate(TEXTS)
    ]
    return HierMemIndex(nodes, memory=SegTreeMem(embedder=HashEmbedder(), relevance="dense"))


@pytest.fixture(scope="module")
def index() -> HierMemIndex:
    return _index()


def test_every_node_carries_span_and_source_ids(index: HierMemIndex) -> None:
    q = "Where does Maria live?"
    got = index.as_retriever(policy="collapsed", similarity_top_k=8, admissible="all").retrieve(q)
    hits = index.memory.retrieve(q, k=8, policy="collapsed", admissible="all")
    assert any(h.is_leaf for h in hits) and any(not h.is_leaf for h in hits)
    for res, h in zip(got, hits, strict=True):
        md = res.node.metadata
        assert (md["span"], md["source_ids"], md["node_id"], md["is_leaf"]) == (
            list(h.span),
            h.source_ids,
            h.node_id,
            h.is_leaf,
        )
        if h.is_leaf:
            stored = index.docstore.get_node(h.source_ids[0])
            for mode in (MetadataMode.LLM, MetadataMode.EMBED):  # the structure keys stay hidden
                assert res.node.get_content(metadata_mode=mode) == stored.get_content(metadata_mode=mode)
            assert res.node.node_id == stored.node_id and res.node.text == stored.text
            assert md["tags"] == stored.metadata["tags"] and md["turn"] == stored.metadata["turn"]
            assert "span" not in stored.metadata  # the docstore's node is not changed
            assert res.node.relationships == stored.relationships


def _in(key: str, values: list[Any], op: FilterOperator) -> MetadataFilters:
    return MetadataFilters(filters=[MetadataFilter(key=key, value=values, operator=op)])


def test_in_and_nin_match_list_valued_metadata(index: HierMemIndex) -> None:
    def ids(flt: MetadataFilters) -> set[str]:
        return {r.node.node_id for r in index.as_retriever(similarity_top_k=20, filters=flt).retrieve("Luna")}

    assert ids(_in("tags", ["pets"], FilterOperator.IN)) == {"n0", "n1"}
    assert ids(_in("tags", ["pets"], FilterOperator.NIN)) == {"n2", "n3", "n4", "n5"}
    assert ids(_in("turn", [0, 4], FilterOperator.IN)) == {"n0", "n4"}


def test_in_takes_a_list_of_scalars() -> None:
    with pytest.raises(InvalidInputError, match="list of values"):
        metadata_matcher(MetadataFilters(filters=[MetadataFilter(key="tags", value="pets", operator="in")]))


tags = st.one_of(
    st.none(),
    st.sampled_from(["pets", "q3", "x"]),
    st.integers(0, 2),
    st.lists(st.sampled_from(["pets", "q3", "x"]), max_size=3),
)


@given(
    value=tags,
    absent=st.booleans(),
    values=st.lists(st.sampled_from(["pets", "q3", "y"]), min_size=1, max_size=3),
    op=st.sampled_from([FilterOperator.IN, FilterOperator.NIN]),
)
def test_in_and_nin_agree_with_the_core_where(value: Any, absent: bool, values: list[str], op: Any) -> None:
    md = {} if absent else {"tags": value}
    core = where_matcher({"tags": {f"${op.value}": values}})
    elems = [] if absent or value is None else value if isinstance(value, list) else [value]
    assert core(md) is (any(e in values for e in elems) == (op == FilterOperator.IN))  # the rule
    assert metadata_matcher(_in("tags", values, op))(md) is core(md)
    nested = MetadataFilters(filters=[_in("tags", values, op)], condition=FilterCondition.NOT)
    assert metadata_matcher(nested)(md) is (not core(md))


def test_as_of_and_min_score_reach_the_memory():
    from llamaindex_hiermem.retrievers import HierMemRetriever as LIRetriever
    from shared_core import Message, SegTreeMem
    from tests.support.memory import HashEmbedder

    mem = SegTreeMem(embedder=HashEmbedder())
    mem.add(
        [
            Message("I live in Lyon", timestamp="2024-01-01", id="a"),
            Message("I live in Bordeaux now", timestamp="2024-03-01", id="b"),
        ]
    )
    got = LIRetriever(mem, similarity_top_k=5, as_of="2024-02-01").retrieve("where do I live")
    assert [n.node.metadata["source_ids"] for n in got] == [["a"]]
    every = LIRetriever(mem, similarity_top_k=5).retrieve("where do I live")
    cut = max(n.score for n in every)
    kept = LIRetriever(mem, similarity_top_k=5, min_score=cut).retrieve("where do I live")
    assert [n.score for n in kept] == [n.score for n in every if n.score >= cut]


def test_nodes_carry_supersession_marks():
    from llamaindex_hiermem.retrievers import HierMemRetriever as LIRetriever
    from shared_core import Message, SegTreeMem
    from tests.support.memory import HashEmbedder

    mem = SegTreeMem(embedder=HashEmbedder())
    mem.add(
        [
            Message("I've watched 10 Crash Course videos so far this year.", timestamp="2024-01-05", id="a"),
            Message(
                "I just finished watching my 15th Crash Course video this year!",
                timestamp="2024-03-01",
                id="b",
            ),
        ]
    )
    got = LIRetriever(mem, similarity_top_k=2).retrieve("Crash Course videos watched")
    md = {n.node.metadata["source_ids"][0]: n.node.metadata for n in got}
    assert [n.node.metadata["source_ids"] for n in got] == [["b"], ["a"]]
    assert (md["a"]["superseded_by"], md["a"]["valid_from"], md["a"]["valid_to"]) == (
        ["b"],
        "2024-01-05",
        "2024-03-01",
    )
    assert (md["b"]["superseded_by"], md["b"]["valid_to"]) == ([], None)
    assert "superseded_by" in got[0].node.excluded_embed_metadata_keys
