"""The public reads the adapters use: ``tree_view()`` (a consistent copy of the tree) and
``similarities()`` (the readable score's cosine for any nodes, the query embedded once)."""

from __future__ import annotations

import pytest

from shared_core import InvalidInputError, Message
from tests.support.memory import KINDS, make_memory, message_text


@pytest.mark.parametrize("kind", KINDS)
def test_tree_view_matches_to_dict_and_stays_as_it_was(kind):
    mem = make_memory(kind)
    mem.add([Message(message_text(i), id=f"m{i}", metadata={"n": i}) for i in range(15)])
    view = mem.tree_view()
    tree = mem.to_dict()["tree"]
    nodes = {int(n["id"]): n for n in tree["nodes"]} if isinstance(tree["nodes"], list) else tree["nodes"]
    assert set(view.nodes) == {int(i) for i in nodes}
    for nid, node in view.nodes.items():
        raw = nodes[nid] if nid in nodes else nodes[str(nid)]
        assert list(node.children) == [int(c) for c in raw["children"]]
        assert node.text == raw["text"] and node.is_leaf == raw["is_leaf"]
    assert [view.nodes[i].source_id for i in view.leaves] == [f"m{i}" for i in range(15)]
    assert dict(view.by_source) == {f"m{i}": (view.leaves[i],) for i in range(15)}
    # a copy: the memory changes, the view does not; its messages are not the memory's
    view.nodes[view.leaves[1]].message.metadata["n"] = 99
    mem.delete("m0")
    assert view.leaves[0] in view.nodes and len(view.leaves) == 15
    now = mem.tree_view()
    assert now.leaves == view.leaves[1:]
    assert now.nodes[now.leaves[0]].message.metadata["n"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_similarities_are_the_hits_cosines_and_embed_the_query_once(kind):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(20)])
    hits = mem.retrieve("dogs and travel", k=5)
    before = mem.stats()["query_usage"]["embedded_texts"]
    sims = mem.similarities("dogs and travel", [h.node_id for h in hits] + [10**9])
    assert mem.stats()["query_usage"]["embedded_texts"] == before  # the retrieval's embedding
    assert sims == {h.node_id: h.components["dense"] for h in hits}
    assert mem.similarities("dogs and travel", []) == {}
    with pytest.raises(InvalidInputError):
        mem.similarities("", [hits[0].node_id])
    with pytest.raises(InvalidInputError):
        mem.similarities("dogs", ["1"])
