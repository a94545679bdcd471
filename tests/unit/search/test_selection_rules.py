"""Structure-aware selection (issue 31 B): segment-diverse top-k and neighbourhood expansion, in the
library (SegTreeMem's ``segment_cap`` / ``neighbours``) and as the flat control (``FlatFusion``'s
``session_cap`` / ``neighbours``). Hand-worked tiny cases."""

from __future__ import annotations

import pytest

from shared_core.eval.baselines import FlatFusion
from shared_core.memories.segtree import SegTreeMem
from shared_core.search.selection import capped, check_cap, with_neighbours
from shared_core.types import InvalidInputError, Message
from tests.support.eval import BowEmbedder


def test_capped_keeps_rank_order_within_both_passes():
    items = ["a1", "a2", "a3", "b1", "a4", "c1", "b2"]
    assert capped(items, lambda s: s[0], 1) == ["a1", "b1", "c1", "a2", "a3", "a4", "b2"]
    assert capped(items, lambda s: s[0], 2) == ["a1", "a2", "b1", "c1", "b2", "a3", "a4"]
    assert capped(items, lambda s: s[0], None) == items
    # a None group is never capped
    assert capped(["x", "y", "z"], lambda s: None, 1) == ["x", "y", "z"]
    with pytest.raises(InvalidInputError):
        capped(items, lambda s: s[0], 0)


def test_with_neighbours_inserts_nearest_unlisted_once():
    nb = {1: [2, 0], 5: [4, 6], 2: [1, 3]}
    assert with_neighbours([1, 5, 2], lambda i: nb.get(i, []), 1) == [1, 2, 5, 4]
    assert with_neighbours([1, 5, 2], lambda i: nb.get(i, []), 2) == [1, 2, 0, 5, 4, 6]
    assert with_neighbours([1, 5], lambda i: nb.get(i, []), 0) == [1, 5]
    # an item already placed as a neighbour keeps its earlier place; its own neighbours are not added
    assert with_neighbours([1, 2], lambda i: nb.get(i, []), 1) == [1, 2]
    with pytest.raises(InvalidInputError):
        with_neighbours([1], lambda i: [], -1)
    assert check_cap(None, "x") is None and check_cap(3, "x") == 3
    for bad in (True, 1.5, "2", 0):
        with pytest.raises(InvalidInputError):
            check_cap(bad, "x")


def _sessions() -> list[Message]:
    """Three sessions of three turns; the word "lisbon" is in turns 0, 1, 2 (session 1) and 4 (session 2)."""
    texts = [
        ["Lisbon trip planned.", "Lisbon flight booked.", "Lisbon hotel found."],
        ["Bananas are ripe.", "Lisbon tram ride.", "Mangoes too."],
        ["Kent apples grow.", "Pears in Kent.", "Plums in Kent."],
    ]
    return [
        Message(t, speaker="Ann", id=f"D{s + 1}:{i + 1}", metadata={"session": s + 1})
        for s, turns in enumerate(texts)
        for i, t in enumerate(turns)
    ]


def test_flat_fusion_session_cap_and_adjacent_turns():
    plain = FlatFusion(BowEmbedder(), hybrid_weight=0.0)  # BM25 alone: only the "lisbon" turns score
    plain.add(_sessions())
    top = [h.source_ids[0] for h in plain.retrieve("lisbon", k=4)]
    assert set(top) == {"D1:1", "D1:2", "D1:3", "D2:2"}
    capped_f = FlatFusion(BowEmbedder(), hybrid_weight=0.0, session_cap=1)
    capped_f.add(_sessions())
    hits = [h.source_ids[0] for h in capped_f.retrieve("lisbon", k=3)]
    # one turn per session first, in rank order: the best of session 1, session 2's lisbon turn, then
    # session 3's first turn (no lisbon: zero score, ties by insertion order) before session 1's others
    assert hits[0].startswith("D1:") and hits[1] == "D2:2" and hits[2] == "D3:1"
    near = FlatFusion(BowEmbedder(), hybrid_weight=0.0, session_cap=1, neighbours=1)
    near.add(_sessions())
    hits = near.retrieve("lisbon", k=4)
    ids = [h.source_ids[0] for h in hits]
    # D2:2 is followed by its nearest turn of the same session (D2:1, the earlier on a tie)
    j = ids.index("D2:2")
    assert ids[j + 1] == "D2:1" and hits[j + 1].score == hits[j].score
    # a neighbour never crosses a session: the last turn of session 1 is not followed by D2:1
    assert all(not (a == "D1:3" and b == "D2:1") for a, b in zip(ids, ids[1:]))
    with pytest.raises(InvalidInputError):
        FlatFusion(BowEmbedder(), session_cap=0)
    with pytest.raises(InvalidInputError):
        FlatFusion(BowEmbedder(), neighbours=-1)


def test_segtree_options_default_off_and_saved():
    base = SegTreeMem(BowEmbedder())
    assert (base.segment_cap, base.segment_depth, base.neighbours) == (None, 1, 0)
    m = SegTreeMem(BowEmbedder(), segment_cap=1, segment_depth=2, neighbours=1)
    cfg = m._config()
    assert (cfg["segment_cap"], cfg["segment_depth"], cfg["neighbours"]) == (1, 2, 1)
    for bad in ({"segment_cap": 0}, {"segment_depth": 0}, {"neighbours": -1}, {"neighbours": True}):
        with pytest.raises(InvalidInputError):
            SegTreeMem(BowEmbedder(), **bad)


def test_segtree_neighbours_follow_their_leaf_and_cap_spreads_segments():
    msgs = _sessions()
    plain = SegTreeMem(BowEmbedder())
    plain.add(msgs)
    ranked = plain.retrieve("lisbon", k=9)
    near = SegTreeMem(BowEmbedder(), neighbours=1)
    near.add(msgs)
    hits = near.retrieve("lisbon", k=9)
    nodes = near._store.nodes
    # every expanded hit is a sibling leaf of the hit it follows, with that hit's score
    for a, b in zip(hits, hits[1:]):
        if b.metadata.get("neighbour_of") is not None:
            assert b.metadata["neighbour_of"] == a.node_id or any(
                h.node_id == b.metadata["neighbour_of"] for h in hits
            )
            assert nodes[b.node_id].parent == nodes[b.metadata["neighbour_of"]].parent
    assert hits[0].node_id == ranked[0].node_id  # the best hit stays first
    assert {h.node_id for h in hits} == {h.node_id for h in ranked}  # k = all leaves: same set
    # the cap: with one hit per top-level segment first, the first hits come from distinct segments
    cap = SegTreeMem(BowEmbedder(), segment_cap=1)
    cap.add(msgs)
    hits = cap.retrieve("lisbon", k=9)
    segs = [cap._segment_of(h.node_id) for h in hits]
    n_segs = len(set(segs))
    assert len(set(segs[:n_segs])) == n_segs  # the first n_segs hits: one per segment
    assert {h.node_id for h in hits} == {h.node_id for h in ranked}
