"""SegTreeMem: Algorithm 1 (online insertion through the rightmost frontier) and Algorithm 2
(structure-aware retrieval by relevance propagation), checked against the invariants of Sec. 4.1-4.2,
small cases worked by hand, Appendix C.3's worst case, atomicity and error paths.

Structural tests use a controlled embedder (vectors read off ``topicN`` tags in the text) and scripted
compatibility decisions; one end-to-end test uses the real local embedder.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import SegTreeMem
from shared_core.memories.base import count_tokens
from shared_core.models.extractive import ExtractiveSummarizer
from shared_core.types import (
    EmbeddingError,
    InvalidInputError,
    LLMRequiredError,
    Message,
    NodeNotFoundError,
    UnknownPolicyError,
    Usage,
)
from tests.support.segtree import TopicEmbedder, check_invariants, hit_key
from tests.support.vectors import own_vector

# --------------------------------------------------------------------------- test models


class FailingEmbedder(TopicEmbedder):
    """A TopicEmbedder that raises on its ``fail_on``-th call (1-based, counted from creation)."""

    def __init__(self, fail_on: int | None = None) -> None:
        super().__init__()
        self.fail_on = fail_on

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail_on is not None and self.calls + 1 == self.fail_on:
            self.calls += 1
            raise RuntimeError("embedder down")
        return super().embed(texts)


class ScriptedSegTree(SegTreeMem):
    """SegTreeMem whose compatibility model C is a callable ``decide(text, candidate_ids) -> ℓ* | None``.

    Like the real model, it is not consulted when there is no candidate (a single-leaf tree). A scripted
    ``None`` is a NONE (the paper's Algorithm 1) unless the test passes a ``branching``: then it is
    placed as a new segment while there is room, as the ``cosine`` model does.
    """

    decide: Callable[[str, list[int]], int | None] | None = None

    def __init__(self, *args, decide=None, **kw) -> None:
        kw.setdefault("branching", None)
        super().__init__(*args, **kw)
        self.decide = decide
        self.seen_candidates: list[list[int]] = []

    def _compatibility(self, text, leaf_id, cands, usage):
        self.seen_candidates.append(list(cands))
        if not cands:
            return None
        assert self.decide is not None
        ell = self.decide(text, list(cands))
        assert ell is None or 2 <= ell <= len(cands) + 1
        return ell


def scripted(decisions: Sequence[int | None], **kw) -> ScriptedSegTree:
    """A memory whose non-trivial compatibility calls answer ``decisions`` in order."""
    queue = list(decisions)
    kw.setdefault("embedder", TopicEmbedder())
    kw.setdefault("relevance", "dense")
    return ScriptedSegTree(decide=lambda text, cands: queue.pop(0) if queue else None, **kw)


# --------------------------------------------------------------------------- invariants


def tree_of(mem: SegTreeMem) -> dict:
    d = mem.to_dict()
    return {"tree": d["tree"], "state": d["state"], "config": d["config"]}


class ReferenceTree:
    """Algorithm 1 written out literally, every chain node stored: levels and intervals only.

    A node is ``[level, first, last, parent, children]``; ``insert(ell)`` adds leaf ``t`` with the
    decision ``ell`` (``None`` = NONE) exactly as lines 3-22 say.
    """

    def __init__(self) -> None:
        self.nodes: list[list] = []
        self.root: int | None = None
        self.t = 0

    def _new(self, level: int, t: int) -> int:
        self.nodes.append([level, t, t, None, []])
        return len(self.nodes) - 1

    def _attach(self, parent: int, child: int) -> None:
        self.nodes[parent][4].append(child)
        self.nodes[child][3] = parent

    def frontier(self) -> list[int]:
        path = [self.root]
        while self.nodes[path[-1]][4]:
            path.append(self.nodes[path[-1]][4][-1])
        return path[::-1]

    def _chain(self, leaf: int, length: int) -> int:
        top = leaf
        for j in range(length):
            c = self._new(2 + j, self.t)
            self._attach(c, top)
            top = c
        return top

    def insert(self, ell: int | None) -> None:
        leaf = self._new(1, self.t)
        if self.root is None:
            self.root = leaf
        else:
            F = self.frontier()
            if ell is not None:
                self._attach(F[ell - 1], self._chain(leaf, ell - 2))
                update = F[ell - 1 :]
            else:
                root = self._new(len(F) + 1, self.t)
                self._attach(root, self.root)
                self._attach(root, self._chain(leaf, len(F) - 1))
                self.root, update = root, [root]
            for u in update:
                ch = self.nodes[u][4]
                self.nodes[u][1], self.nodes[u][2] = self.nodes[ch[0]][1], self.nodes[ch[-1]][2]
        self.t += 1

    def n_nodes(self) -> int:
        return len(self.nodes)

    def edges(self) -> set[tuple[tuple[int, int, int], tuple[int, int, int]]]:
        """``((level, first, last) of a child, (level, first, last) of its parent)`` for every edge."""
        key = lambda n: (n[0], n[1], n[2])  # noqa: E731
        return {(key(n), key(self.nodes[n[3]])) for n in self.nodes if n[3] is not None}


def fanout_at(mem: SegTreeMem, F: Sequence[int], level: int) -> int:
    """Children of the frontier node at ``level`` (``F`` from :meth:`SegTreeMem.frontier`); a level held by
    an implicit single-child copy has one."""
    node = mem._store.nodes[F[level - 1]]
    return len(node.children) if node.level == level else 1


def levelled_edges(mem: SegTreeMem) -> set[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """The edges of the stored tree with each level gap written out as single-child copies."""
    st_ = mem._store
    out = set()
    for n in st_.nodes.values():
        if n.parent is None:
            continue
        p = st_.nodes[n.parent]
        chain = [(lv, *n.span) for lv in range(n.level, p.level)] + [(p.level, *p.span)]
        out |= set(zip(chain, chain[1:]))
    return out


# --------------------------------------------------------------------------- property tests


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 40), branching=st.sampled_from([None, 2, 3, 8]))
def test_invariants_hold_after_every_insert_for_any_decisions(data, n, branching):
    choice = lambda text, cands: data.draw(  # noqa: E731
        st.one_of(st.none(), st.integers(2, len(cands) + 1)), label="decision"
    )
    mem = ScriptedSegTree(
        embedder=TopicEmbedder(), relevance="dense", decide=choice, summary_chars=80, branching=branching
    )
    texts = [f"topic{i % 5} utterance {i}." for i in range(n)]
    ref = ReferenceTree()
    for i, t in enumerate(texts):
        before_frontier = mem.frontier()
        rep = mem.add(Message(t, id=f"m{i}"))
        if i:  # C sees F_t minus the leaf, ordered leaf -> root (never called on an empty tree)
            assert len(mem.seen_candidates) == i and mem.seen_candidates[-1] == before_frontier[1:]
        check_invariants(mem, texts[: i + 1])
        ell = rep.details[0]["attach_level"]
        leaf = rep.leaf_ids[0]
        ref.insert(ell)
        assert levelled_edges(mem) == ref.edges(), "the stored tree is Algorithm 1's tree"
        # the new leaf hangs under the chosen frontier node (level ℓ*: the node or a copy of it, now
        # stored), or under a new root
        parent = mem._store.nodes[mem._store.nodes[leaf].parent] if i else None
        if ell is not None:
            assert parent is not None and parent.level == ell
            assert parent.id == before_frontier[ell - 1] or parent.children[0] == before_frontier[ell - 1]
        elif before_frontier:
            assert mem._store.root not in before_frontier
            assert mem._store.nodes[mem._store.root].children[0] == before_frontier[-1]
        if rep.details[0]["decision"].startswith("segment_"):  # a new segment: NONE from C, room at ℓ*
            assert branching is not None and ell >= 3 and mem._store.nodes[leaf].level < parent.level - 1
            assert len(parent.children) <= branching
        if i and branching is not None and rep.details[0]["decision"] == "none":  # no room from level 3 up
            full = [
                fanout_at(mem, before_frontier, lv) >= branching for lv in range(3, len(before_frontier) + 1)
            ]
            assert all(full)
    # node count: leaves plus internal nodes; stats agree with the store and with Algorithm 1's tree
    s = mem.stats()
    assert s["nodes"] == len(mem._store.nodes) and s["leaves"] == n
    assert s["tree_nodes"] == ref.n_nodes() >= s["nodes"]
    assert s["frontier_size"] == s["height"]
    assert s["tree_nodes"] <= s["worst_case_nodes"] == n * (n + 1) // 2
    hits = mem.retrieve("topic1 utterance", k=50, policy="top_down", admissible="all")
    assert len({h.text for h in hits}) == len(hits)
    assert [h.components["rank"] for h in hits] == sorted((h.components["rank"] for h in hits), reverse=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(2, 30), k=st.integers(1, 6))
def test_retrieve_returns_k_distinct_texts_when_they_exist(data, n, k):
    choice = lambda text, cands: data.draw(  # noqa: E731
        st.one_of(st.none(), st.integers(2, len(cands) + 1)), label="decision"
    )
    mem = ScriptedSegTree(embedder=TopicEmbedder(), relevance="dense", decide=choice)
    mem.add([f"topic{data.draw(st.integers(0, 3), label='topic')} utterance {i}." for i in range(n)])
    policy = data.draw(st.sampled_from(["collapsed", "top_down", "bottom_up"]))
    for admissible in ("all", "leaves"):
        hits = mem.retrieve("topic1", k=k, policy=policy, admissible=admissible)
        pool = [x for x in mem._store.nodes.values() if admissible == "all" or x.is_leaf]
        assert len({h.text for h in hits}) == len(hits)
        assert len(hits) == min(k, len({x.text for x in pool}))


def test_long_chains_do_not_starve_top_k():
    # All-NONE insertions (App. C.3) build chains of single-child copies; the three last utterances
    # share a topic, so their chains (11, 10 and 9 copies of one text) fill the top of the ranking.
    texts = [f"topic{2 + i % 5} message {i}." for i in range(9)] + [f"topic1 late {i}." for i in range(9, 12)]
    mem = scripted([None] * 11, admissible="all")
    mem.add(texts)
    for k in (1, 2, 3, 4):
        hits = mem.retrieve("topic1", k=k, policy="collapsed")
        assert len(hits) == k
    assert {h.text for h in mem.retrieve("topic1", k=3, policy="collapsed")} == {
        "topic1 late 9.",
        "topic1 late 10.",
        "topic1 late 11.",
    }


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topics=st.lists(st.integers(0, 3), min_size=1, max_size=14),
    cut=st.integers(0, 14),
    threshold=st.sampled_from([0.3, 0.6, 0.9]),
)
def test_batched_add_equals_one_by_one(topics, cut, threshold):
    texts = [f"topic{t} note {i}." for i, t in enumerate(topics)]
    one = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=threshold, summary_chars=60)
    for t in texts:
        one.add(t)
    two = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=threshold, summary_chars=60)
    two.add(texts[:cut] or texts)
    if cut and cut < len(texts):
        two.add(texts[cut:])
    assert tree_of(one) == tree_of(two)
    ids = sorted(one._store.nodes)
    np.testing.assert_array_equal(one._index.get(ids), two._index.get(ids))
    check_invariants(two, texts)


# --------------------------------------------------------------------------- Algorithm 1 by hand


def test_algorithm1_worked_by_hand():
    """Seven utterances x0..x6; C answers NONE, 2, 3, NONE, 2 for x2..x6 (x1 has no candidate: NONE).

    Worked on paper (node ids in creation order, levels L, spans [l, r]). A chain node is a
    single-child copy of the node below it; it is stored only once it gets a second child, so a node
    whose parent is g + 1 levels up stands for itself and g copies:
      x0: leaf 0 is the tree.
      x1: F=(0), m=1, NONE: new root 2 (L2) with children (0, 1).
      x2: F=(1, 2), m=2, NONE: new root 4 (L3) = (2, leaf 3); leaf 3 has one copy (L2) above it.
      x3: F=(3, 3', 4), ℓ*=2 = the copy 3': it is stored as node 6 (L2) = (3, leaf 5) under 4.
      x4: F=(5, 6, 4), ℓ*=3: leaf 7 becomes the rightmost child of 4 (one copy between).
      x5: F=(7, 7', 4), m=3, NONE: new root 9 (L4) = (4, leaf 8); leaf 8 has two copies above it.
      x6: F=(8, 8', 8'', 9), ℓ*=2: the L2 copy of 8 is stored as node 11 = (8, leaf 10) under 9; its L3
          copy stays implicit.
    The same tree with every chain node stored has 14 nodes (Algorithm 1 as written).
    """
    texts = [f"topic{t} x{i}." for i, t in enumerate([1, 1, 2, 2, 3, 4, 4])]
    mem = scripted([None, 2, 3, None, 2], summary_chars=600)
    reports = [mem.add(Message(t, id=f"x{i}")) for i, t in enumerate(texts)]
    assert [r.leaf_ids[0] for r in reports] == [0, 1, 3, 5, 7, 8, 10]
    assert [r.details[0]["attach_level"] for r in reports] == [None, None, None, 2, 3, None, 2]
    assert [r.details[0]["decision"] for r in reports] == [
        "first",
        "none",
        "none",
        "merge_2",
        "merge_3",
        "none",
        "merge_2",
    ]
    assert mem.seen_candidates == [[], [2], [3, 4], [6, 4], [7, 4], [8, 8, 9]]
    expected = {  # id: (parent, children, level, span)
        9: (None, [4, 11], 4, (0, 6)),
        4: (9, [2, 6, 7], 3, (0, 4)),
        11: (9, [8, 10], 2, (5, 6)),
        2: (4, [0, 1], 2, (0, 1)),
        6: (4, [3, 5], 2, (2, 3)),
        0: (2, [], 1, (0, 0)),
        1: (2, [], 1, (1, 1)),
        3: (6, [], 1, (2, 2)),
        5: (6, [], 1, (3, 3)),
        7: (4, [], 1, (4, 4)),
        8: (11, [], 1, (5, 5)),
        10: (11, [], 1, (6, 6)),
    }
    st_ = mem._store
    assert st_.root == 9
    got = {i: (n.parent, n.children, n.level, n.span) for i, n in st_.nodes.items()}
    assert got == expected
    assert mem.frontier() == [10, 11, 11, 9]
    # annotations: single-child nodes copy their child; others summarise their children in order
    # (joined by newlines: a lower-case "topic..." after a full stop starts no sentence when spaced)
    assert st_.nodes[11].text == f"{texts[5]}\n{texts[6]}"
    assert st_.nodes[6].text == f"{texts[2]}\n{texts[3]}"
    assert st_.nodes[4].text == "\n".join(texts[:5])
    assert st_.nodes[9].text == "\n".join(texts)
    check_invariants(mem, texts)
    s = mem.stats()
    assert (s["nodes"], s["leaves"], s["internal_nodes"], s["height"]) == (12, 7, 5, 4)
    assert (s["tree_nodes"], s["chain_nodes"], s["implicit_chain_nodes"]) == (14, 2, 2)
    assert (s["max_depth"], s["mean_depth"]) == (3, 3)
    assert s["mean_branching"] == pytest.approx(13 / 7)  # the levelled tree: 13 edges, 7 internal nodes
    assert s["decisions"] == {"none": 3, "merge_2": 2, "merge_3": 1}
    # hits report the levelled depth, span and the source ids of the leaves below
    h = mem.hit(4)
    assert (h.depth, h.span, h.is_leaf, h.source_ids) == (1, (0, 4), False, ["x0", "x1", "x2", "x3", "x4"])
    assert h.metadata["level"] == 3
    h = mem.hit(10)
    assert (h.depth, h.span, h.is_leaf, h.source_ids, h.text) == (3, (6, 6), True, ["x6"], texts[6])
    assert mem.hit(7).depth == 3  # a leaf one copy below its parent


def test_extractive_annotations_keep_chronological_order():
    """Over the length budget, an annotation is a subsequence of its children's sentences, in order."""
    from shared_core.models.extractive import split_sentences

    mem = scripted([2, None, 2, 3, 2, 3], summary_chars=90)
    texts = [
        f"Alpha{i} topic{i % 3} spoke first. Beta{i} topic{(i + 1) % 3} answered then." for i in range(8)
    ]
    mem.add(texts)
    st_ = mem._store
    checked = 0
    for n in st_.nodes.values():
        if len(n.children) < 2:
            continue
        pool = [x for c in n.children for x in split_sentences(st_.nodes[c].text)]
        got = split_sentences(n.text)
        assert len(n.text) <= 90 and got
        pos = [pool.index(x) for x in got]
        assert pos == sorted(pos), n.text
        checked += len(got) > 1
    assert checked >= 2
    check_invariants(mem, texts)


def test_worst_case_all_none_is_quadratic():
    T = 10
    mem = scripted([None] * (T - 1), summary_chars=60)
    texts = [f"topic{i % 7} turn {i}." for i in range(T)]
    for t in texts:
        mem.add(t)
    check_invariants(mem, texts)
    s = mem.stats()
    # Algorithm 1's tree is quadratic; only the leaves and the T - 1 roots are stored
    assert s["tree_nodes"] == T * (T + 1) // 2 == s["worst_case_nodes"] == 55
    assert s["nodes"] == 2 * T - 1
    assert s["height"] == T and s["max_depth"] == T - 1 and s["frontier_size"] == T
    assert s["chain_nodes"] == s["implicit_chain_nodes"] == (T - 2) * (T - 1) // 2  # t-th insert: t-2
    edges = 2 * (T - 1) + (T - 2) * (T - 1) // 2
    assert s["mean_branching"] == pytest.approx(edges / (s["tree_nodes"] - T))
    assert s["decisions"] == {"none": T - 1}


# --------------------------------------------------------------------------- cosine compatibility


def test_cosine_compatibility_threshold_and_best_level():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=0.5, branching=None)
    r = mem.add(["topic1 one.", "topic1 two.", "topic1 three."])
    # x1 has no candidate -> new root; x2: the root (all topic1, cos 1) is compatible -> ℓ* = 2
    assert [d["attach_level"] for d in r.details] == [None, None, 2]
    root = mem._store.root
    assert len(mem._store.nodes[root].children) == 3
    # a new topic: cos 0 < 0.5 -> NONE, new root (level 3) over the old root and a chain
    r = mem.add("topic2 elsewhere.")
    assert r.details[0]["attach_level"] is None and r.details[0]["decision"] == "none"
    assert mem._store.nodes[mem._store.root].children[0] == root
    F = mem.frontier()
    # candidates now: the chain copy of the topic2 leaf (cos 0 with topic1) and the root (3 x topic1
    # + topic2: cos 3/sqrt(10) = 0.95) -> ℓ* = 3, attached under the root (one implicit copy between)
    assert F[:2] == [F[0], F[0]] and F[2] == mem._store.root and len(F) == 3
    r = mem.add("topic1 back again.")
    assert r.details[0]["attach_level"] == 3
    leaf = r.leaf_ids[0]
    assert mem._store.nodes[leaf].parent == F[2] and mem.frontier() == [leaf, leaf, F[2]]
    # candidates: the copy of that leaf (topic1, cos 1) and the root (cos 0.9x) -> ℓ* = 2: the copy is
    # stored as the parent of both leaves
    r = mem.add("topic1 more.")
    assert r.details[0]["attach_level"] == 2
    chain = mem._store.nodes[leaf].parent
    assert mem._store.nodes[chain].children == [leaf, r.leaf_ids[0]]
    assert mem._store.nodes[chain].parent == F[2] and mem._store.nodes[chain].level == 2
    check_invariants(
        mem,
        [
            "topic1 one.",
            "topic1 two.",
            "topic1 three.",
            "topic2 elsewhere.",
            "topic1 back again.",
            "topic1 more.",
        ],
    )


def test_cosine_threshold_is_inclusive_and_strict_threshold_always_splits():
    same = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=1.0)
    r = same.add(["topic3 a.", "topic3 b.", "topic3 c."])
    assert r.details[2]["attach_level"] == 2  # cos exactly 1 >= 1
    # nothing passes 1.01: with the paper's rule every utterance is a NONE (a cascade, App. C.3) ...
    never = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=1.01, branching=None)
    texts = [f"topic3 t{i}." for i in range(5)]
    never.add(texts)
    assert never.stats()["tree_nodes"] == 15 and never.stats()["decisions"] == {"none": 4}
    assert never.stats()["nodes"] == 9  # 5 leaves and 4 roots; the 6 chain nodes are implicit
    check_invariants(never, texts)
    # ... and by default x2 opens level 3 (no level >= 3 before it), then x3, x4 are new segments there
    seg = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", threshold=1.01)
    rep = seg.add(texts)
    assert [d["decision"] for d in rep.details] == ["first", "none", "none", "segment_3", "segment_3"]
    s = seg.stats()
    assert (s["height"], s["nodes"], s["tree_nodes"]) == (3, 7, 10)  # 3 segments keep a level-2 copy
    check_invariants(seg, texts)


# --------------------------------------------------------------------------- new segments (branching)

SEGMENT_TEXTS = [f"topic{t} {w}." for t, w in zip([1, 1, 2, 2, 3, 4, 4, 5, 6], "abcdefghi")]


def test_new_segments_worked_by_hand():
    """Nine utterances on topics 1 1 2 2 3 4 4 5 6 (a new topic has cosine 0 with every annotation
    before it, the same topic a cosine of 1 with its copy), cosine model, B = 2.

    Worked on paper (node ids in creation order, levels L, spans [l, r]):
      x0: leaf 0.  x1: no candidate: NONE, root 2 (L2) = (0, 1).
      x2: dissimilar, no frontier level >= 3: NONE, root 4 (L3) = (2, leaf 3); 3 keeps a copy at L2.
      x3: cos 1 with the copy of 3: ℓ*=2, the copy is stored as 6 (L2) = (3, 5).
      x4: dissimilar; F=(5, 6, 4) and 4 (L3) already has B = 2 children: NONE, root 8 (L4) = (4, 7).
      x5: dissimilar; F=(7, 7', 7'', 8): the L3 copy of 7 has one child: a new segment, ℓ*=3; the copy
          is stored as 10 (L3) = (7, 9), and 9 keeps a copy at L2, a segment of its own.
      x6: cos 1 with the copy of 9: ℓ*=2, the copy is stored as 12 (L2) = (9, 11).
      x7: dissimilar; F=(11, 12, 10, 8): 10 and 8 have two children each: NONE, root 14 (L5) = (8, 13).
      x8: dissimilar; F=(13, 13', 13'', 13''', 14): the L3 copy of 13 takes it: 16 (L3) = (13, 15)
          under 14, one implicit copy between.
    The paper's rule (``branching=None``) makes x5 and x8 NONEs as well: height 7 instead of 5.
    """
    texts = SEGMENT_TEXTS
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", branching=2)
    reps = [mem.add(Message(t, id=f"x{i}")) for i, t in enumerate(texts)]
    assert [r.leaf_ids[0] for r in reps] == [0, 1, 3, 5, 7, 9, 11, 13, 15]
    assert [r.details[0]["decision"] for r in reps] == [
        "first",
        "none",
        "none",
        "merge_2",
        "none",
        "segment_3",
        "merge_2",
        "none",
        "segment_3",
    ]
    expected = {  # id: (parent, children, level, span)
        14: (None, [8, 16], 5, (0, 8)),
        8: (14, [4, 10], 4, (0, 6)),
        16: (14, [13, 15], 3, (7, 8)),
        4: (8, [2, 6], 3, (0, 3)),
        10: (8, [7, 12], 3, (4, 6)),
        2: (4, [0, 1], 2, (0, 1)),
        6: (4, [3, 5], 2, (2, 3)),
        12: (10, [9, 11], 2, (5, 6)),
        0: (2, [], 1, (0, 0)),
        1: (2, [], 1, (1, 1)),
        3: (6, [], 1, (2, 2)),
        5: (6, [], 1, (3, 3)),
        7: (10, [], 1, (4, 4)),
        9: (12, [], 1, (5, 5)),
        11: (12, [], 1, (6, 6)),
        13: (16, [], 1, (7, 7)),
        15: (16, [], 1, (8, 8)),
    }
    st_ = mem._store
    assert st_.root == 14
    assert {i: (n.parent, n.children, n.level, n.span) for i, n in st_.nodes.items()} == expected
    assert mem.frontier() == [15, 15, 16, 16, 14]
    assert st_.nodes[10].text == "topic3 e.\ntopic4 f.\ntopic4 g."  # a group of two segments
    assert st_.nodes[16].text == "topic5 h.\ntopic6 i."
    check_invariants(mem, texts)
    s = mem.stats()
    assert (s["height"], s["nodes"], s["tree_nodes"], s["implicit_chain_nodes"]) == (5, 17, 21, 4)
    assert s["decisions"] == {"none": 4, "merge_2": 2, "segment_3": 2}
    assert mem.to_dict()["config"]["branching"] == 2

    paper = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", branching=None)
    reps = [paper.add(Message(t, id=f"x{i}")) for i, t in enumerate(texts)]
    assert [r.details[0]["decision"] for r in reps] == [
        "first",
        "none",
        "none",
        "merge_2",
        "none",
        "none",
        "merge_2",
        "none",
        "none",
    ]
    expected_paper = {  # x4, x5, x7, x8 each put a new root over the whole tree
        16: (None, [14, 15], 7, (0, 8)),
        14: (16, [10, 13], 6, (0, 7)),
        10: (14, [8, 12], 5, (0, 6)),
        8: (10, [4, 7], 4, (0, 4)),
        4: (8, [2, 6], 3, (0, 3)),
        2: (4, [0, 1], 2, (0, 1)),
        6: (4, [3, 5], 2, (2, 3)),
        12: (10, [9, 11], 2, (5, 6)),
        0: (2, [], 1, (0, 0)),
        1: (2, [], 1, (1, 1)),
        3: (6, [], 1, (2, 2)),
        5: (6, [], 1, (3, 3)),
        7: (8, [], 1, (4, 4)),
        9: (12, [], 1, (5, 5)),
        11: (12, [], 1, (6, 6)),
        13: (14, [], 1, (7, 7)),
        15: (16, [], 1, (8, 8)),
    }
    assert {
        i: (n.parent, n.children, n.level, n.span) for i, n in paper._store.nodes.items()
    } == expected_paper
    check_invariants(paper, texts)
    s = paper.stats()
    assert (s["height"], s["nodes"], s["tree_nodes"]) == (7, 17, 30)
    assert s["decisions"] == {"none": 6, "merge_2": 2}


class RandomEmbedder:
    """Mutually dissimilar random utterances: the token ``u<i>`` is a standard normal vector in 1,024
    dimensions drawn from ``(seed, i)``; a text is the sum of the vectors of its tokens (a summary, the sum
    of the utterances it keeps). Two different utterances have a cosine of standard deviation 1/32, so
    reaching the 0.25 threshold is an 8-sigma event."""

    dim = 1024

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim)
        for i in re.findall(r"u(\d+)", text):
            v += np.random.default_rng([self.seed, int(i)]).standard_normal(self.dim)
        return v.astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def log_height(n: int, branching: int) -> int:
    """``3 + floor(log_B(n - 2))`` for ``n >= 3`` (1 and 2 below), in integers."""
    if n < 3:
        return n
    h = 3
    while branching ** (h - 2) <= n - 2:
        h += 1
    return h


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), branching=st.integers(2, 6), n=st.integers(1, 50))
def test_dissimilar_stream_grows_like_a_b_tree(seed, branching, n):
    """Every utterance is dissimilar from everything before it: each one is a segment of its own, the
    tree is a complete B-ary tree over them, and its height is ``3 + floor(log_B(T - 2))``, the bound the
    class docstring claims, after every insert; the paper's rule makes the height ``T``."""
    texts = [f"u{i}." for i in range(n)]
    mem = SegTreeMem(embedder=RandomEmbedder(seed), relevance="dense", branching=branching)
    for i, t in enumerate(texts):
        rep = mem.add(t)
        assert rep.details[0]["decision"] == "first" or not rep.details[0]["decision"].startswith("merge")
        check_invariants(mem, texts[: i + 1])
        assert mem.stats()["height"] == log_height(i + 1, branching)
        assert max(len(x.children) for x in mem._store.nodes.values()) <= max(branching, 2)
    # x0 and x1 share the first root; every later utterance is a segment of its own (a level-2 copy)
    assert all(mem._store.nodes[mem._store.nodes[x].parent].level > 2 for x in mem._store.leaves()[2:])
    paper = SegTreeMem(embedder=RandomEmbedder(seed), relevance="dense", branching=None)
    paper.add(texts)
    assert paper.stats()["height"] == n and paper.stats()["decisions"].get("none", 0) == n - 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topics=st.lists(st.integers(0, 4), min_size=1, max_size=30),
    threshold=st.sampled_from([0.3, 0.6, 0.8]),
)
def test_paper_option_is_the_papers_cosine_rule(topics, threshold):
    """``branching=None``: every decision is the paper's cosine model computed here from the frontier's
    annotations (the most similar candidate, the lowest of equal ones, when at least ``threshold``; else
    NONE), and the tree is Algorithm 1's for those decisions."""
    emb = TopicEmbedder()
    mem = SegTreeMem(embedder=emb, relevance="dense", threshold=threshold, branching=None, summary_chars=80)
    texts = [f"topic{t} note {i}." for i, t in enumerate(topics)]
    ref = ReferenceTree()
    for text in texts:
        cands = mem.frontier()[1:]
        want = None
        if cands:
            nodes = mem._store.nodes
            vecs = np.stack([own_vector(mem, nodes[c].text, nodes[c].is_leaf, emb) for c in cands])
            sims = vecs @ own_vector(mem, text, True, emb)
            best = int(np.argmax(sims))
            want = best + 2 if sims[best] >= threshold else None
        rep = mem.add(text)
        assert rep.details[0]["attach_level"] == want
        assert rep.details[0]["decision"] in ("first", "none", f"merge_{want}")
        ref.insert(want)
        assert levelled_edges(mem) == ref.edges()
    check_invariants(mem, texts)


def test_saves_without_branching_load_with_the_papers_rule(tmp_path):
    texts = ["topic1 a.", "topic1 b.", "topic2 c."]  # x2 is a NONE under either rule: height 3
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", branching=None)
    mem.add(texts)
    mem.save(tmp_path / "old")
    snap = tmp_path / "old" / (tmp_path / "old" / "CURRENT").read_text().strip()
    data = json.loads((snap / "memory.json").read_text())
    del data["config"]["branching"]  # what a save made before the option holds
    (snap / "memory.json").write_text(json.dumps(data))
    old = SegTreeMem.load(tmp_path / "old", embedder=TopicEmbedder())
    assert old.branching is None and old.to_dict()["config"]["branching"] is None
    assert tree_of(old)["tree"] == tree_of(mem)["tree"]
    # a dissimilar utterance: a new root, as when the save was made; a new memory starts a segment
    assert old.add("topic3 d.").details[0]["decision"] == "none"
    assert old.stats()["height"] == 4
    fresh = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    fresh.add(texts)
    assert fresh.add("topic3 d.").details[0]["decision"] == "segment_3"
    assert fresh.stats()["height"] == 3
    # saves made now keep their value, and the legacy value fills only a missing key
    fresh.save(tmp_path / "new")
    assert SegTreeMem.load(tmp_path / "new", embedder=TopicEmbedder()).branching == 8
    assert SegTreeMem.stored_config({"threshold": 0.25})["branching"] is None
    assert SegTreeMem.stored_config({"branching": 3})["branching"] == 3


def test_branching_is_validated():
    for bad in (0, 1, -4, 2.5, "8", True, float("nan")):
        with pytest.raises(InvalidInputError, match="branching"):
            SegTreeMem(embedder=TopicEmbedder(), branching=bad)
    assert SegTreeMem(embedder=TopicEmbedder(), branching=np.int64(3)).branching == 3
    assert SegTreeMem(embedder=TopicEmbedder()).branching == 8
    assert SegTreeMem(embedder=TopicEmbedder(), branching=None).to_dict()["config"]["branching"] is None


# --------------------------------------------------------------------------- Algorithm 2 by hand


def _vec(first: float, rest: float, n_rest: int, dim: int = 18) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[0] = first
    v[1 : 1 + n_rest] = rest
    return v


class LookupEmbedder:
    """Exact vectors per text (dyadic components, so every cosine below is exact in float32)."""

    dim = 18

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        default = np.eye(self.dim, dtype=np.float32)[16]
        return np.stack([self.table.get(t, default) for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class BracketSummarizer:
    """Annotation S(children) = ``"S(" + ",".join(children) + ")"``."""

    def summarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        return "S(" + ",".join(texts) + ")", Usage()

    async def asummarize(self, texts: Sequence[str], **fields: object) -> tuple[str, Usage]:
        return self.summarize(texts)


@pytest.fixture
def figure3() -> ScriptedSegTree:
    """The tree R(P(a, b), C(c, d)) with local relevances chosen by hand.

    Built by Algorithm 1 with C = NONE, NONE, ℓ*=2: ids a=0, b=1, P=2, c=3, R=4, d=5, C=6 (C is the
    chain copy of c, stored when d joins it).
    Query "q" is e0; relevance r = max(cos, 0):
        a: e1 -> 0      b: 3/4      P: 1/2      c: 1/4      R: 1/4      C: 1/4      d: cos -1/2 -> 0
    Σr = 2, so s0 = (a 0, b 3/8, P 1/4, c 1/8, R 1/8, C 1/8, d 0).
    """
    table = {
        "q": np.eye(18, dtype=np.float32)[0],
        "nothing": np.eye(18, dtype=np.float32)[17],  # orthogonal to every node
        "a": np.eye(18, dtype=np.float32)[1],
        "b": _vec(0.75, 0.25, 7),
        "S(a,b)": _vec(0.5, 0.5, 3),
        "c": _vec(0.25, 0.25, 15),
        "S(c,d)": _vec(0.25, 0.25, 15),
        "S(S(a,b),S(c,d))": _vec(0.25, 0.25, 15),
        "d": _vec(-0.5, 0.5, 3),
    }
    mem = scripted(
        [None, 2],
        embedder=LookupEmbedder(table),
        summarizer=BracketSummarizer(),
        k=10,
        alpha=0.1,
        top_down_weights="share",  # the paper's column-normalised operator
    )
    mem.add(["a", "b", "c", "d"])
    st_ = mem._store
    assert st_.root == 4
    assert {i: (n.text, n.children) for i, n in st_.nodes.items()} == {
        0: ("a", []),
        1: ("b", []),
        2: ("S(a,b)", [0, 1]),
        3: ("c", []),
        4: ("S(S(a,b),S(c,d))", [2, 6]),
        5: ("d", []),
        6: ("S(c,d)", [3, 5]),
    }
    assert mem.stats()["implicit_chain_nodes"] == 0
    return mem


A, B, P_, C_, R_, CC, D = 0, 1, 2, 3, 4, 6, 5  # node ids of figure3


def _scores(mem, query="q", **kw) -> dict[int, float]:
    ids, s = mem.scores(query, **kw)
    assert len(ids) == 7
    return dict(zip(ids.tolist(), s.tolist()))


def _assert_scores(got: dict[int, float], want: dict[int, float]) -> None:
    assert set(got) == set(want)
    for nid in want:
        assert got[nid] == pytest.approx(want[nid], abs=1e-9), nid


S0 = {A: 0.0, B: 0.375, P_: 0.25, C_: 0.125, R_: 0.125, CC: 0.125, D: 0.0}


def test_figure3_collapsed_is_s0(figure3):
    _assert_scores(_scores(figure3, policy="collapsed"), S0)
    _assert_scores(_scores(figure3, policy="top_down", horizon=0), S0)
    _assert_scores(_scores(figure3, policy="bottom_up", horizon=0), S0)
    _assert_scores(_scores(figure3, policy="bottom_up", alpha=0.0, horizon=2), S0)
    hits = figure3.retrieve("q", k=7, policy="collapsed", admissible="all")
    # ties (c, R, C at 1/8; a, d at 0) are broken by node id
    assert [h.node_id for h in hits] == [B, P_, C_, R_, CC, A, D]
    assert [h.components["rank"] for h in hits] == [0.375, 0.25, 0.125, 0.125, 0.125, 0.0, 0.0]


def test_figure3_top_down_by_hand(figure3):
    # W: a parent's mass goes to its children in equal shares.
    # s1 = (R 0, P s0(R)/2 = 1/16, C 1/16, a s0(P)/2 = 1/8, b 1/8, c s0(C)/2 = 1/16, d 1/16)
    # s2 = (R 0, P 0, C 0, a s1(P)/2 = 1/32, b 1/32, c s1(C)/2 = 1/32, d 1/32)
    h1 = {
        R_: 0.125 / 1.1,
        P_: (0.25 + 0.1 * 0.0625) / 1.1,
        CC: (0.125 + 0.1 * 0.0625) / 1.1,
        A: (0.0 + 0.1 * 0.125) / 1.1,
        B: (0.375 + 0.1 * 0.125) / 1.1,
        C_: (0.125 + 0.1 * 0.0625) / 1.1,
        D: (0.0 + 0.1 * 0.0625) / 1.1,
    }
    _assert_scores(_scores(figure3, policy="top_down", alpha=0.1, horizon=1), h1)
    h2 = {
        R_: 0.125 / 1.11,
        P_: (0.25 + 0.1 * 0.0625) / 1.11,
        CC: (0.125 + 0.1 * 0.0625) / 1.11,
        A: (0.0 + 0.1 * 0.125 + 0.01 * 0.03125) / 1.11,
        B: (0.375 + 0.1 * 0.125 + 0.01 * 0.03125) / 1.11,
        C_: (0.125 + 0.1 * 0.0625 + 0.01 * 0.03125) / 1.11,
        D: (0.0 + 0.1 * 0.0625 + 0.01 * 0.03125) / 1.11,
    }
    assert h2[B] == pytest.approx(0.34938063063063063, abs=1e-15)
    got = _scores(figure3, policy="top_down", alpha=0.1, horizon=2)
    _assert_scores(got, h2)
    _assert_scores(_scores(figure3, policy="top_down"), h2)  # defaults α = 0.1, H = 2
    # Top-K over the admissible set: all nodes vs leaves only
    all_hits = figure3.retrieve("q", k=4, policy="top_down", admissible="all")
    assert [h.node_id for h in all_hits] == [B, P_, C_, CC]  # c (0.118525) just beats C (0.118243)
    assert [h.components["rank"] for h in all_hits] == pytest.approx(
        [h2[B], h2[P_], h2[C_], h2[CC]], abs=1e-9
    )
    leaf_hits = figure3.retrieve("q", k=4, policy="top_down", admissible="leaves")
    assert [h.node_id for h in leaf_hits] == [B, C_, A, D]
    assert all(h.is_leaf for h in leaf_hits)
    assert [h.node_id for h in figure3.retrieve("q", k=2, policy="top_down")] == [B, C_]  # default leaves


def test_figure3_top_down_inherit_by_hand(figure3):
    # top_down_weights="inherit": every child receives its parent's whole mass.
    # s1 = (R 0, P s0(R) = 1/8, C 1/8, a s0(P) = 1/4, b 1/4, c s0(C) = 1/8, d 1/8)
    # s2 = (R 0, P 0, C 0, a s1(P) = 1/8, b 1/8, c s1(C) = 1/8, d 1/8)
    figure3.top_down_weights = "inherit"
    h2 = {
        R_: 0.125 / 1.11,
        P_: (0.25 + 0.1 * 0.125) / 1.11,
        CC: (0.125 + 0.1 * 0.125) / 1.11,
        A: (0.0 + 0.1 * 0.25 + 0.01 * 0.125) / 1.11,
        B: (0.375 + 0.1 * 0.25 + 0.01 * 0.125) / 1.11,
        C_: (0.125 + 0.1 * 0.125 + 0.01 * 0.125) / 1.11,
        D: (0.0 + 0.1 * 0.125 + 0.01 * 0.125) / 1.11,
    }
    _assert_scores(_scores(figure3, policy="top_down", alpha=0.1, horizon=2), h2)
    # the leaves' order differs from "share": a (0.0236) now beats d (0.0124) by more, c stays above a
    leaf_hits = figure3.retrieve("q", k=4, policy="top_down", alpha=0.1, horizon=2, admissible="leaves")
    assert [h.node_id for h in leaf_hits] == [B, C_, A, D]


def test_figure3_bottom_up_by_hand(figure3):
    # W: a child's whole mass goes to its parent.
    # s1 = (R s0(P)+s0(C) = 3/8, P s0(a)+s0(b) = 3/8, C s0(c)+s0(d) = 1/8, leaves 0)
    # s2 = (R s1(P)+s1(C) = 1/2, everything else 0)
    h1 = {
        R_: (0.125 + 0.1 * 0.375) / 1.1,
        P_: (0.25 + 0.1 * 0.375) / 1.1,
        CC: (0.125 + 0.1 * 0.125) / 1.1,
        A: 0.0,
        B: 0.375 / 1.1,
        C_: 0.125 / 1.1,
        D: 0.0,
    }
    _assert_scores(_scores(figure3, policy="bottom_up", alpha=0.1, horizon=1), h1)
    h2 = {
        R_: (0.125 + 0.1 * 0.375 + 0.01 * 0.5) / 1.11,
        P_: (0.25 + 0.1 * 0.375) / 1.11,
        CC: (0.125 + 0.1 * 0.125) / 1.11,
        A: 0.0,
        B: 0.375 / 1.11,
        C_: 0.125 / 1.11,
        D: 0.0,
    }
    _assert_scores(_scores(figure3, policy="bottom_up", alpha=0.1, horizon=2), h2)
    hits = figure3.retrieve("q", k=5, policy="bottom_up", admissible="all", horizon=2)
    assert [h.node_id for h in hits] == [B, P_, R_, CC, C_]
    hits = figure3.retrieve("q", k=5, policy="bottom_up", admissible="leaves", horizon=2)
    assert [h.node_id for h in hits] == [B, C_, A, D]


def test_propagation_counts_implicit_chain_copies_by_hand():
    """R(P(a, b), c'(c)) where c' is c's chain copy (NONE, NONE): stored as R(P(a, b), c).

    r = max(cos, 0) with q = e0: a 0, b 3/4, P 1/2, c 1/4, c' 1/4 (c's text), R 1/4; Σr = 2 over the six
    nodes of Algorithm 1's tree, so s0 = (a 0, b 3/8, P 1/4, c 1/8, c' 1/8, R 1/8).
    """
    table = {
        "q": np.eye(18, dtype=np.float32)[0],
        "a": np.eye(18, dtype=np.float32)[1],
        "b": _vec(0.75, 0.25, 7),
        "S(a,b)": _vec(0.5, 0.5, 3),
        "c": _vec(0.25, 0.25, 15),
        "S(S(a,b),c)": _vec(0.25, 0.25, 15),
    }
    mem = scripted(
        [None], embedder=LookupEmbedder(table), summarizer=BracketSummarizer(), top_down_weights="share"
    )
    mem.add(["a", "b", "c"])
    st_ = mem._store
    a, b, P, c, R = 0, 1, 2, 3, 4
    assert st_.nodes[R].children == [P, c] and mem.stats()["implicit_chain_nodes"] == 1
    # top_down, shares: s1 = (P 1/16, c' 1/16, a 1/8, b 1/8, c s0(c') = 1/8); s2 = (a 1/32, b 1/32,
    # c s1(c') = 1/16)
    want = {
        R: 0.125 / 1.11,
        P: (0.25 + 0.1 / 16) / 1.11,
        a: (0.1 / 8 + 0.01 / 32) / 1.11,
        b: (0.375 + 0.1 / 8 + 0.01 / 32) / 1.11,
        c: (0.125 + 0.1 / 8 + 0.01 / 16) / 1.11,
    }
    _assert_scores(dict(zip(*(x.tolist() for x in mem.scores("q", "top_down", alpha=0.1, horizon=2)))), want)
    # bottom_up: s1 = (P 3/8, c' s0(c) = 1/8, R s0(P) + s0(c') = 3/8); s2 = (R s1(P) + s1(c') = 1/2)
    want = {
        R: (0.125 + 0.1 * 0.375 + 0.01 * 0.5) / 1.11,
        P: (0.25 + 0.1 * 0.375) / 1.11,
        a: 0.0,
        b: 0.375 / 1.11,
        c: 0.125 / 1.11,
    }
    _assert_scores(dict(zip(*(x.tolist() for x in mem.scores("q", "bottom_up", alpha=0.1, horizon=2)))), want)
    # over all nodes the text "c" ranks with its copy's score, (1/8 + 1/80) / 1.11, above its own
    hits = mem.retrieve("q", k=5, policy="bottom_up", alpha=0.1, horizon=2, admissible="all")
    assert [h.node_id for h in hits] == [b, P, R, c, a]
    assert hits[3].components["rank"] == pytest.approx(0.1375 / 1.11, abs=1e-9)
    leaf_hits = mem.retrieve("q", k=3, policy="bottom_up", alpha=0.1, horizon=2, admissible="leaves")
    assert [(h.node_id, round(h.components["rank"], 9)) for h in leaf_hits] == [
        (b, round(0.375 / 1.11, 9)),
        (c, round(0.125 / 1.11, 9)),
        (a, 0.0),
    ]


def test_figure3_all_relevances_zero_gives_uniform_start(figure3):
    # Σr = 0: s0 falls back to the uniform distribution 1/|V| = 1/7 (Algorithm 2, line 6, undefined).
    u = 1 / 7
    _assert_scores(_scores(figure3, query="nothing", policy="collapsed"), dict.fromkeys(range(7), u))
    # top_down, H=1: s1 = (R 0, every other node 1/14)
    td = {n: (u + 0.1 / 14) / 1.1 for n in range(7)}
    td[R_] = u / 1.1
    _assert_scores(_scores(figure3, query="nothing", policy="top_down", horizon=1), td)
    # bottom_up, H=1: s1 = (R 2/7, P 2/7, C 2/7, leaves 0)
    bu = {n: u / 1.1 for n in range(7)}
    for n in (R_, P_, CC):
        bu[n] = (u + 0.1 * 2 / 7) / 1.1
    _assert_scores(_scores(figure3, query="nothing", policy="bottom_up", horizon=1), bu)
    hits = figure3.retrieve("nothing", k=2, policy="collapsed")
    assert [h.node_id for h in hits] == [A, B]  # all tied: lowest ids first


# --------------------------------------------------------------------------- atomicity


def _build(embedder, **kw) -> SegTreeMem:
    mem = SegTreeMem(
        embedder=embedder, relevance="dense", summary_chars=60, annotation_vectors="embedded", **kw
    )
    mem.add([Message(f"topic{i % 3} early {i}. More words here {i}.", id=f"e{i}") for i in range(5)])
    return mem


NEW = [Message(f"topic{t} late {i}. Another sentence {i}.", id=f"l{i}") for i, t in enumerate([0, 0, 4, 1])]
QUERIES = [
    ("topic0", "top_down", "all"),
    ("topic1 late", "bottom_up", "leaves"),
    ("topic4", "collapsed", "all"),
]


def _observe(mem: SegTreeMem):
    hits = [hit_key(mem.retrieve(q, k=5, policy=p, admissible=a)) for q, p, a in QUERIES]
    return mem.to_dict(), hits, len(mem._index), len(mem)


def _calls_of_add(items) -> int:
    emb = TopicEmbedder()
    mem = _build(emb)
    before = emb.calls
    mem.add(items)
    return emb.calls - before


def test_failing_embedder_leaves_memory_unchanged():
    total = _calls_of_add(NEW)
    assert total >= 3  # the leaves, the summariser's sentences and the new annotations
    reference = _build(TopicEmbedder())
    reference.add(NEW)
    for n in range(1, total + 1):
        emb = FailingEmbedder()
        mem = _build(emb)
        before = _observe(mem)
        emb.fail_on = emb.calls + n
        with pytest.raises(RuntimeError, match="embedder down"):
            mem.add(NEW)
        assert _observe(mem) == before, f"failure at call {n} changed the memory"
        # the memory keeps working and ends up exactly where a memory that never failed is
        mem.add(NEW)
        assert tree_of(mem) == tree_of(reference)
        check_invariants(mem)


def test_failing_first_add_leaves_memory_empty():
    emb = FailingEmbedder(fail_on=2)
    mem = SegTreeMem(embedder=emb, relevance="dense", annotation_vectors="embedded")
    empty = mem.to_dict()
    with pytest.raises(RuntimeError):
        mem.add(["topic1 a.", "topic1 b.", "topic2 c."])
    assert mem.to_dict() == empty and len(mem) == 0
    assert mem.retrieve("topic1") == []
    mem.add(["topic1 a."])
    check_invariants(mem, ["topic1 a."])


class FailingSummarizer(ExtractiveSummarizer):
    def __init__(self, embedder, fail_on: int) -> None:
        super().__init__(embedder, max_chars=60)
        self.fail_on = fail_on
        self.n = 0

    def summarize(self, texts, **fields):
        self.n += 1
        if self.n == self.fail_on:
            raise RuntimeError("summariser down")
        return super().summarize(texts, **fields)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_failing_summarizer_leaves_memory_unchanged(n):
    emb = TopicEmbedder()
    summ = FailingSummarizer(emb, fail_on=10**9)
    mem = SegTreeMem(embedder=emb, relevance="dense", summarizer=summ)
    mem.add([f"topic{i % 3} early {i}." for i in range(5)])
    before = _observe(mem)
    n0 = summ.n
    summ.fail_on = n0 + n
    with pytest.raises(RuntimeError, match="summariser down"):
        mem.add([m.text for m in NEW])
    assert summ.n == n0 + n  # the add really reached its n-th annotation
    assert _observe(mem) == before
    mem.add([m.text for m in NEW])
    check_invariants(mem)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", ["", "   ", None, 5, ["ok", ""], ["ok", None], ["ok", 7], {"text": "x"}, []])
def test_bad_messages_add_nothing(bad):
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    mem.add("topic1 first.")
    before = _observe(mem)
    emb_calls = mem.embedder.calls
    with pytest.raises(InvalidInputError):
        mem.add(bad)
    assert _observe(mem) == before
    assert mem.embedder.calls == emb_calls + 3  # only the queries of _observe, no embedding of "ok"


class BadVectors(TopicEmbedder):
    """Returns broken vectors for any batch containing the word ``poison``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def embed(self, texts):
        out = super().embed(texts)
        if not any("poison" in t for t in texts):
            return out
        if self.how == "nan":
            out[0, 0] = np.nan
        elif self.how == "inf":
            out[-1, 1] = np.inf
        elif self.how == "rows":
            out = np.vstack([out, out[:1]])
        elif self.how == "width":
            out = out[:, :5]
        elif self.how == "flat":
            out = out.reshape(-1)
        elif self.how == "strings":
            out = [["x"] * self.dim for _ in texts]
        return out


@pytest.mark.parametrize("how", ["nan", "inf", "rows", "width", "flat", "strings"])
def test_broken_vectors_raise_embedding_error_and_change_nothing(how):
    mem = SegTreeMem(embedder=BadVectors(how), relevance="dense")
    mem.add(["topic1 a.", "topic1 b."])
    before = _observe(mem)
    with pytest.raises(EmbeddingError):
        mem.add(["topic2 fine.", "topic2 poison here."])
    assert _observe(mem) == before
    with pytest.raises(EmbeddingError):
        mem.retrieve("poison query", policy="collapsed")


def test_inconsistent_widths_inside_the_first_add_raise_embedding_error():
    class Shrinking(TopicEmbedder):  # 8-d vectors on the first call, 5-d afterwards
        def embed(self, texts):
            out = super().embed(texts)
            return out if self.calls == 1 else out[:, :5]

    mem = SegTreeMem(embedder=Shrinking(), relevance="dense", annotation_vectors="embedded")
    empty = mem.to_dict()
    with pytest.raises(EmbeddingError):
        mem.add(["topic1 a.", "topic2 b.", "topic3 c."])
    assert mem.to_dict() == empty and len(mem) == 0


def test_vectors_must_have_the_embedder_declared_dim():
    class Liar(TopicEmbedder):  # says 16, gives 8
        @property
        def dim(self) -> int:
            return 16

    mem = SegTreeMem(embedder=Liar(), relevance="dense")
    with pytest.raises(EmbeddingError):
        mem.add("topic1 a.")
    assert len(mem) == 0


def test_constructor_rejects_bad_options():
    emb = TopicEmbedder()
    for kw in ({"relevance": "sparse"}, {"compat": "magic"}, {"admissible": "roots"}):
        with pytest.raises(UnknownPolicyError):
            SegTreeMem(embedder=emb, **kw)
    for kw in (
        {"alpha": 1.0},
        {"alpha": -0.01},
        {"alpha": float("nan")},
        {"horizon": -1},
        {"horizon": 1.5},
        {"horizon": True},
        {"k": 0},
        {"k": True},
        {"threshold": float("nan")},
    ):
        with pytest.raises(InvalidInputError):
            SegTreeMem(embedder=emb, **kw)
    for compat in ("batch_llm", "pointwise_llm"):
        with pytest.raises(LLMRequiredError):
            SegTreeMem(embedder=emb, compat=compat)
    with pytest.raises(InvalidInputError):
        SegTreeMem(embedder=object())


def test_constructor_rejects_out_of_range_hybrid_weight():
    for w in (-0.1, 1.5, float("nan")):
        with pytest.raises(InvalidInputError):
            SegTreeMem(embedder=TopicEmbedder(), hybrid_weight=w)


def test_clear_forgets_everything_and_the_memory_keeps_working():
    mem, texts = _hand_tree()
    mem.retrieve("topic1", policy="top_down")  # fills the propagation caches
    mem.clear()
    assert len(mem) == 0 and mem.retrieve("topic1") == [] and mem.frontier() == []
    assert mem.stats()["decisions"] == {} and mem.stats()["nodes"] == 0
    mem.add([Message(t, id=f"y{i}") for i, t in enumerate(texts[:3])])
    check_invariants(mem, texts[:3])
    hits = mem.retrieve("topic2", k=3, policy="top_down", admissible="all")
    assert hits and all(h.node_id in mem._store.nodes for h in hits)
    assert hits[0].source_ids == ["y2"]


def test_retrieve_rejects_bad_parameters():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    mem.add(["topic1 a.", "topic2 b."])
    with pytest.raises(UnknownPolicyError):
        mem.retrieve("q", policy="sideways")
    with pytest.raises(UnknownPolicyError):
        mem.scores("q", policy="sideways")
    with pytest.raises(UnknownPolicyError):
        mem.retrieve("q", relevance="sparse")
    with pytest.raises(UnknownPolicyError):
        mem.retrieve("q", admissible="roots")
    for kw in (
        {"alpha": 1.0},
        {"alpha": -0.5},
        {"horizon": -1},
        {"horizon": 0.5},
        {"k": 0},
        {"k": -3},
        {"k": 2.5},
        {"k": True},
        {"max_tokens": 0},
        {"hybrid_weight": 1.5},
    ):
        with pytest.raises(InvalidInputError):
            mem.retrieve("topic1", **kw)
    for q in ("", "   ", None, 3):
        with pytest.raises(InvalidInputError):
            mem.retrieve(q)
    with pytest.raises(InvalidInputError):  # a misspelt parameter is a typed error, not a TypeError
        mem.retrieve("topic1", top_k=3)


def test_max_tokens_budget_is_respected():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", admissible="all")
    texts = [f"topic1 {'word ' * (3 + i)}end {i}." for i in range(8)]
    mem.add(texts)
    unbounded = mem.retrieve("topic1", k=20, policy="top_down")
    for budget in (5, 12, 30, 80):
        hits = mem.retrieve("topic1", k=20, policy="top_down", max_tokens=budget)
        assert sum(count_tokens(h.text) for h in hits) <= budget
        # greedy in rank order: every skipped hit would have overflowed the budget at its turn
        used = 0
        chosen = {h.node_id for h in hits}
        for h in unbounded:
            t = count_tokens(h.text)
            if h.node_id in chosen:
                used += t
            else:
                assert used + t > budget
    assert count_tokens("one two three") > 0
    # a budget the best hit fits exactly: it must be returned
    exact = count_tokens(unbounded[0].text)
    hits = mem.retrieve("topic1", k=20, policy="top_down", max_tokens=exact)
    assert hits[0].node_id == unbounded[0].node_id


def test_empty_memory_retrieves_nothing():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    assert mem.retrieve("anything") == []
    assert mem.frontier() == []
    s = mem.stats()
    assert (s["nodes"], s["leaves"], s["height"], s["worst_case_nodes"]) == (0, 0, 0, 0)


def test_scores_follow_structure_changes(tmp_path):
    """Cached propagation operators must not outlive the tree they were built for."""
    mem, _ = _hand_tree()
    for policy in ("top_down", "bottom_up"):
        mem.retrieve("topic4", policy=policy, admissible="all")  # caches W for 12 stored nodes
    mem.delete("x0")  # the first row of the index goes: every later row moves
    mem.decide = lambda text, cands: 2
    mem.add(Message("topic4 replacement.", id="x7"))  # back to 12 stored nodes, another tree
    assert len(mem._store.nodes) == 12
    mem.save(tmp_path / "s")
    fresh = ScriptedSegTree.load(tmp_path / "s", embedder=TopicEmbedder())
    for policy in ("top_down", "bottom_up"):
        for q in ("topic4", "topic1", "topic2"):
            a_ids, a = mem.scores(q, policy)
            b_ids, b = fresh.scores(q, policy)
            got, want = dict(zip(a_ids.tolist(), a.tolist())), dict(zip(b_ids.tolist(), b.tolist()))
            assert got.keys() == want.keys()
            for nid in want:
                assert got[nid] == pytest.approx(want[nid], abs=1e-6)
            for admissible in ("all", "leaves"):
                x = mem.retrieve(q, k=5, policy=policy, admissible=admissible)
                y = fresh.retrieve(q, k=5, policy=policy, admissible=admissible)
                assert [h.node_id for h in x] == [h.node_id for h in y]


# --------------------------------------------------------------------------- deletion


def _hand_tree() -> tuple[ScriptedSegTree, list[str]]:
    texts = [f"topic{t} x{i}." for i, t in enumerate([1, 1, 2, 2, 3, 4, 4])]
    mem = scripted([None, 2, 3, None, 2])
    for i, t in enumerate(texts):
        mem.add(Message(t, id=f"x{i}"))
    return mem, texts


def _assert_forgotten(mem: SegTreeMem, text: str, source_id: str | None = None) -> None:
    assert all(text not in n.text for n in mem._store.nodes.values())
    for policy in ("collapsed", "top_down", "bottom_up"):
        for admissible in ("all", "leaves"):
            for q in (text, "topic1", "topic3"):
                hits = mem.retrieve(q, k=50, policy=policy, admissible=admissible)
                assert all(text not in h.text for h in hits)
                assert all(source_id not in h.source_ids for h in hits)
                assert len({h.text for h in hits}) == len(hits)


@pytest.mark.parametrize("victim", range(7))
def test_delete_each_leaf_by_source_id(victim):
    mem, texts = _hand_tree()
    assert mem.delete(f"x{victim}") == 1
    assert len(mem) == 6 and f"x{victim}" not in mem._store.by_source
    check_invariants(mem, [t for i, t in enumerate(texts) if i != victim], contiguous=False)
    _assert_forgotten(mem, texts[victim], f"x{victim}")
    # the tree still grows correctly after the deletion
    mem.add(Message("topic4 after.", id="y"))
    check_invariants(mem, contiguous=False)
    assert mem._store.nodes[mem.frontier()[0]].text == "topic4 after."


def test_delete_by_node_id_and_subtree():
    mem, texts = _hand_tree()
    assert mem.delete(7) == 1  # leaf x4, one implicit chain copy below node 4: the chain goes too
    assert 7 not in mem._store
    assert mem._store.nodes[4].children == [2, 6]
    assert mem._store.nodes[4].span == (0, 3)
    _assert_forgotten(mem, texts[4])
    assert mem.delete(6) == 2  # internal node: its leaves x2, x3
    assert mem._store.nodes[4].children == [2]
    assert mem._store.nodes[4].text == mem._store.nodes[2].text  # single child: copies it
    check_invariants(mem, [texts[i] for i in (0, 1, 5, 6)], contiguous=False)
    for i in (2, 3):
        _assert_forgotten(mem, texts[i])
    assert mem.delete(mem._store.root) == 4
    assert len(mem) == 0 and mem._store.nodes == {} and mem.retrieve("topic1") == []
    mem.add(["topic1 again.", "topic1 and again."])
    check_invariants(mem)


def test_delete_unknown_ids():
    mem, _ = _hand_tree()
    before = _observe(mem)
    for key in (999, "nope", -1, "13"):
        with pytest.raises(NodeNotFoundError):
            mem.delete(key)
    with pytest.raises(InvalidInputError):
        mem.delete(True)
    assert _observe(mem) == before


def test_delete_shared_source_id_removes_every_leaf():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    mem.add(
        [Message("topic1 a.", id="s"), Message("topic2 b.", id="t"), Message("topic1 c.", id="s")],
        allow_duplicate_ids=True,
    )
    assert mem.delete("s") == 2
    assert [mem._store.nodes[i].text for i in mem._store.leaves()] == ["topic2 b."]
    check_invariants(mem, contiguous=False)


def test_failed_delete_rolls_back():
    emb = TopicEmbedder()
    summ = FailingSummarizer(emb, fail_on=10**9)
    mem = SegTreeMem(embedder=emb, relevance="dense", summarizer=summ)
    mem.add([Message(f"topic{i} m{i}.", id=f"m{i}") for i in range(6)])
    before = _observe(mem)
    summ.fail_on = summ.n + 1
    with pytest.raises(RuntimeError):
        mem.delete("m2")
    assert _observe(mem) == before


# --------------------------------------------------------------------------- async, threads


async def test_aadd_and_aretrieve_in_a_running_loop():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    rep = await mem.aadd(["topic1 a.", "topic2 b.", "topic1 c."])
    assert len(rep.leaf_ids) == 3
    hits = await mem.aretrieve("topic2", k=1, policy="collapsed")
    assert [h.text for h in hits] == ["topic2 b."]
    hits = await mem.aretrieve("topic1", 2, "top_down", admissible="leaves")
    assert {h.text for h in hits} == {"topic1 a.", "topic1 c."}


async def test_sync_calls_inside_a_running_loop():
    asyncio.get_running_loop()
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense")
    mem.add(["topic1 a.", "topic2 b."])
    assert [h.text for h in mem.retrieve("topic2", k=1)] == ["topic2 b."]


async def test_concurrent_aadds_are_atomic_batches():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", summary_chars=60)
    batches = [[f"topic{b} batch{b} item{i}." for i in range(3)] for b in range(5)]
    await asyncio.gather(*(mem.aadd(b) for b in batches))
    order = [mem._store.nodes[i].text for i in mem._store.leaves()]
    assert sorted(order) == sorted(t for b in batches for t in b)
    for b in batches:  # each batch's messages are consecutive, in their order
        start = order.index(b[0])
        assert order[start : start + 3] == b
    check_invariants(mem, order)


# --------------------------------------------------------------------------- real embedder, lexical


def test_end_to_end_with_the_local_embedder(local_embedder):
    mem = SegTreeMem(embedder=local_embedder, relevance="dense")
    texts = [
        "I adopted a dog last week, her name is Luna.",
        "Luna loves chasing tennis balls in the park.",
        "My sister is moving to Berlin in March for a new job.",
        "She will work as an architect at a large firm there.",
        "I started learning to play the piano this winter.",
        "My piano teacher says I should practise scales every day.",
    ]
    rep = mem.add([Message(t, id=f"d{i}") for i, t in enumerate(texts)])
    assert rep.usage.embed_calls >= 1 and rep.usage.embedded_texts >= len(texts)
    check_invariants(mem, texts)
    hits = mem.retrieve("What is the name of my dog?", k=2, policy="collapsed")
    assert hits[0].source_ids == ["d0"]
    hits = mem.retrieve("Where is my sister moving?", k=3, policy="top_down", admissible="leaves")
    assert hits[0].source_ids == ["d2"]
    hits = mem.retrieve("piano practice", k=2, policy="bottom_up", admissible="leaves")
    assert {h.source_ids[0] for h in hits} == {"d4", "d5"}


def test_bm25_and_hybrid_relevance():
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="hybrid")
    mem.add(["topic1 the dog is called Luna.", "topic2 my sister lives in Berlin.", "topic3 piano lessons."])
    hits = mem.retrieve("Berlin", k=1, policy="collapsed", relevance="bm25")
    assert hits[0].text == "topic2 my sister lives in Berlin."
    ids, r = mem.relevance("Luna", kind="bm25")
    best = int(ids[int(np.argmax(r))])
    assert mem._store.nodes[best].is_leaf and "Luna" in mem._store.nodes[best].text
    hits = mem.retrieve("Luna topic1", k=1, policy="collapsed")  # default: hybrid
    assert "Luna" in hits[0].text


def test_policy_option_default_errors_and_saves(tmp_path):
    texts = ["topic1 a.", "topic1 b.", "topic2 c.", "topic2 d.", "topic1 e."]
    mem = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", alpha=0.5)
    mem.add(texts)
    assert (mem.default_policy, SegTreeMem.default_policy, SegTreeMem.tree_policy) == (
        "collapsed",
        "collapsed",
        "top_down",
    )
    assert mem.retrieve("topic2", k=5) == mem.retrieve("topic2", k=5, policy="collapsed")
    prop = SegTreeMem(embedder=TopicEmbedder(), relevance="dense", alpha=0.5, policy="top_down")
    prop.add(texts)
    assert prop.retrieve("topic2", k=5) == prop.retrieve("topic2", k=5, policy="top_down")
    assert [h.metadata["policy"] for h in prop.retrieve("topic2", k=2)] == ["top_down"] * 2
    assert mem.retrieve("topic2", k=5) != prop.retrieve("topic2", k=5)  # the two policies score apart
    for bad in ("greedy", "TOP_DOWN", "", None, 3):
        with pytest.raises(UnknownPolicyError, match="policy"):
            SegTreeMem(embedder=TopicEmbedder(), policy=bad)
    # a save keeps its policy; a save made before the option retrieves with top_down, as it did
    prop.save(tmp_path / "p")
    assert SegTreeMem.load(tmp_path / "p", embedder=TopicEmbedder()).default_policy == "top_down"
    mem.save(tmp_path / "c")
    assert SegTreeMem.load(tmp_path / "c", embedder=TopicEmbedder()).default_policy == "collapsed"
    snap = tmp_path / "c" / (tmp_path / "c" / "CURRENT").read_text().strip()
    data = json.loads((snap / "memory.json").read_text())
    del data["config"]["policy"]
    (snap / "memory.json").write_text(json.dumps(data))
    old = SegTreeMem.load(tmp_path / "c", embedder=TopicEmbedder())
    assert old.default_policy == "top_down"
    assert old.retrieve("topic2", k=5) == old.retrieve("topic2", k=5, policy="top_down")
