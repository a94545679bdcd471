"""MemTree's cached child matrices for routing: the same trees as reading every child from the index."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shared_core.memories.memtree_routes as routes_module
from shared_core import MemTree
from shared_core.types import EmbeddingError, Message, Usage
from tests.support.memory import HashEmbedder, message_text


class _NoRoutes(MemTree):
    """MemTree reading every child's vector from the index at each routing step (no cache)."""

    def _route(self, parent: int, ids: list[int]) -> Any:
        return None


class _FailingOnce(HashEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def embed(self, texts: Any) -> np.ndarray:
        if self.fail:
            self.fail = False
            raise EmbeddingError("embedder down")
        return super().embed(texts)


def _tree(mem: MemTree) -> list[tuple[int, int | None, list[int], str]]:
    nodes = mem._store.nodes
    return [(i, nodes[i].parent, list(nodes[i].children), nodes[i].text) for i in sorted(nodes)]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4)),
        st.tuples(st.just("delete"), st.integers(0, 200)),
        st.tuples(st.just("fail"), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None)
@given(
    ops=OPS, branching=st.sampled_from([3, 256]), log=st.sampled_from([1, 256]), walk=st.sampled_from([0, 16])
)
def test_cached_routes_build_the_tree_that_index_reads_build(ops, branching, log, walk, monkeypatch_session):
    # adds of one or several messages, deletes (re-aggregation, expansions undone) and failed adds
    # (rolled back) in any order; a log of 1 forces re-reads of stale matrices, a walk of 0 the scan of
    # each child's last write instead of the log
    monkeypatch_session.setattr(routes_module, "_VEC_LOG", log)
    monkeypatch_session.setattr(routes_module, "_WALK_MAX", walk)
    embs = [_FailingOnce(), _FailingOnce()]
    a = MemTree(embedder=embs[0], branching=branching, base_threshold=0.2)
    b = _NoRoutes(embedder=embs[1], branching=branching, base_threshold=0.2)
    n = 0
    for op, x in ops:
        for mem, emb in zip((a, b), embs):
            if op == "add":
                mem.add([message_text(n + j) for j in range(x)])
            elif op == "delete" and len(mem):
                mem.delete(mem._store.leaves()[x % len(mem._store.leaves())])
            elif op == "fail":
                emb.fail = True
                with pytest.raises(EmbeddingError):
                    mem.add([message_text(1000 + n + j) for j in range(x)])
        if op == "add":
            n += x
        assert _tree(a) == _tree(b)
    if len(a):
        assert [h.node_id for h in a.retrieve("travel and dogs", k=5)] == [
            h.node_id for h in b.retrieve("travel and dogs", k=5)
        ]


@pytest.fixture(scope="module")
def monkeypatch_session():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_routes_refresh_rows_that_commits_rewrite():
    mem = MemTree(embedder=HashEmbedder(), base_threshold=0.1)
    mem.add([message_text(i) for i in range(30)])
    mem.add(message_text(30))  # fills the root's matrix
    root = mem._store.root
    route = mem._routes[root]
    for i in range(31, 40):
        mem.add(message_text(i))
    mem._child_vectors(root, mem._store.nodes[root].children)
    children = mem._store.nodes[root].children
    np.testing.assert_allclose(
        route.mat if route.children == children else mem._routes[root].mat,
        mem._index.get(children),
        atol=1e-6,
    )


def test_routes_read_children_changed_in_the_open_transaction():
    # inside one add of several messages, a child re-aggregated by an earlier message of the same add
    # has a pending vector that the cached matrix must not hide
    mem = MemTree(embedder=HashEmbedder(), base_threshold=0.1)
    mem.add([message_text(i) for i in range(30)])
    mem.add(message_text(30))
    root = mem._store.root
    usage = Usage()
    mem._begin(usage)
    try:
        mem._insert(Message(message_text(31)), usage)
        mem._embed_pending(usage)
        children = list(mem._store.nodes[root].children)
        moved = [c for c in children if c in mem._pending]
        assert moved  # the first message rewrote a child of the root
        np.testing.assert_allclose(mem._child_vectors(root, children), mem._vectors(children), atol=1e-6)
    finally:
        mem._rollback()
    assert len(mem) == 31
