"""A topic embedder and SegTreeMem's invariants (used by every structural check of a SegTreeMem)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from shared_core import SegTreeMem
from tests.support.vectors import check_node_vectors


class TopicEmbedder:
    """Deterministic embedder: component ``N mod (dim-1)`` counts the ``topicN`` tags of a text; text
    without a tag maps to the last axis. Summaries of several topics get mixed vectors."""

    def __init__(self, dim: int = 8) -> None:
        self._dim = dim
        self.calls = 0
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return self._dim

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self._dim, dtype=np.float32)
        tags = re.findall(r"topic(\d+)", text)
        if not tags:
            v[-1] = 1.0
        for t in tags:
            v[int(t) % (self._dim - 1)] += 1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        self.texts.extend(texts)
        return np.stack([self.vector(t) for t in texts]) if texts else np.zeros((0, self._dim), np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def dfs_leaves(mem: SegTreeMem) -> list[int]:
    st_ = mem._store
    if st_.root is None:
        return []
    out, stack = [], [st_.root]
    while stack:
        n = st_.nodes[stack.pop()]
        if n.is_leaf:
            out.append(n.id)
        stack.extend(reversed(n.children))
    return out


def check_invariants(mem: SegTreeMem, texts: Sequence[str] | None = None, *, contiguous: bool = True) -> None:
    """The Segment Tree invariants of Sec. 4.1-4.2 and DESIGN.md, plus index consistency.

    ``contiguous=False`` (after deletions) only asks for increasing, non-overlapping child intervals.
    """
    st_ = mem._store
    st_.check_links()
    if st_.root is None:
        assert not st_.nodes
        assert mem.frontier() == []
        return
    depths = st_.depths()
    assert len(depths) == len(st_.nodes), "every node is reachable from the root"
    # 1. leaves left -> right = insertion order
    leaves = dfs_leaves(mem)
    assert leaves == st_.leaves()
    idx = [st_.nodes[i].span[0] for i in leaves]
    assert idx == sorted(idx) and len(set(idx)) == len(idx)
    if texts is not None:
        assert [st_.nodes[i].text for i in leaves] == list(texts)
        if contiguous:
            assert idx == list(range(len(texts)))
    for i in leaves:
        n = st_.nodes[i]
        assert n.span == (n.span[0], n.span[0]) and n.level == 1 and n.message is not None
        render = getattr(n.message, "render", None)  # "<speaker>: <text>" when the message has a speaker
        assert n.text == (render() if render is not None else n.message.text)
    # 2. every internal interval is the union of its children's, children consecutive
    for n in st_.nodes.values():
        assert n.text, f"node {n.id} has no annotation"
        if n.is_leaf:
            continue
        assert n.children, f"internal node {n.id} has no children"
        ch = [st_.nodes[c] for c in n.children]
        assert n.span == (ch[0].span[0], ch[-1].span[1])
        for left, right in zip(ch, ch[1:]):
            if contiguous:
                assert left.span[1] + 1 == right.span[0]
            else:
                assert left.span[1] < right.span[0]
        # levelled tree: a node is above each child; a gap of g levels stands for g single-child copies
        assert all(c.level < n.level for c in ch), f"node {n.id} level {n.level}"
        # a single-child node carries exactly its child's annotation
        if len(ch) == 1:
            assert n.text == ch[0].text
    # 3. all leaves at one depth of the levelled tree (stored depth + copies above each node on the
    # path); root level = height = leaf depth + 1
    root = st_.nodes[st_.root]
    for i in leaves:
        path = [i, *st_.ancestors(i)]
        levelled = sum(st_.nodes[p].level - st_.nodes[c].level for c, p in zip(path, path[1:]))
        assert levelled == root.level - 1 == mem.stats()["height"] - 1
    assert mem.stats()["max_depth"] == root.level - 1
    implicit = sum(
        st_.nodes[n.parent].level - n.level - 1 for n in st_.nodes.values() if n.parent is not None
    )
    assert mem.stats()["tree_nodes"] == len(st_.nodes) + implicit
    # 4. the frontier has one entry per level, 1..m from the rightmost leaf to the root; a level held by
    # a copy repeats the id of the stored node it copies
    F = mem.frontier()
    assert len(F) == root.level
    for lv, f in enumerate(F, start=1):
        node = st_.nodes[f]
        top = st_.nodes[node.parent].level - 1 if node.parent is not None else node.level
        assert node.level <= lv <= top
    assert F[0] == leaves[-1] and F[-1] == st_.root
    last = st_.nodes[leaves[-1]].span[1]
    assert set(F) == {n.id for n in st_.nodes.values() if n.span[1] == last}, "Eq. (2)"
    # the leaves under a node (read off its span on this contiguous store) are its subtree's leaves
    for n in st_.nodes.values():
        sub = sorted((x.id for x in st_.iter_subtree(n.id) if x.is_leaf), key=lambda i: st_.nodes[i].span[0])
        assert st_.leaves_under(n.id) == sub
        ids_ = [st_.nodes[i].message.id for i in sub if st_.nodes[i].message.id is not None]
        assert st_.source_ids_under(n.id) == list(dict.fromkeys(ids_))
    # the vector index holds exactly the nodes, each with the vector of its current text
    assert mem._index is not None
    assert sorted(mem._index.ids.tolist()) == sorted(st_.nodes)
    ids = sorted(st_.nodes)
    ref = TopicEmbedder(mem.embedder.dim) if isinstance(mem.embedder, TopicEmbedder) else mem.embedder
    check_node_vectors(mem, ids, ref)


def hit_key(hits):
    return [(h.node_id, h.text, h.score, h.span, h.depth, h.is_leaf, tuple(h.source_ids)) for h in hits]
