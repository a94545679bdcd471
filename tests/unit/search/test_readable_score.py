"""``Hit.score`` a person can read: the query's cosine similarity to the hit's text in [0, 1], the same
whatever else the memory holds; the ranking's own figure in ``Hit.components``; ``min_score``;
``Hit.explain()``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import InvalidInputError, Message
from tests.support.memory import KINDS, HashEmbedder, make_memory, message_text

FACT = "My sister Maria moved to Oslo last spring."
QUERY = "Where does my sister Maria live?"


def _cosine(emb: HashEmbedder, a: str, b: str) -> float:
    x, y = emb.embed([a, b])
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))


def _fact_hit(mem, **kw):
    hits = mem.retrieve(QUERY, k=50, **kw)
    return next(h for h in hits if h.text == FACT)


@pytest.mark.parametrize("kind", KINDS)
def test_score_is_the_cosine_of_query_and_message_whatever_else_is_stored(kind):
    """The same fact and query score the same with 0, 30 and 120 other messages (the ranking's own
    figure moves as the memory grows: it is relative to every node)."""
    emb = HashEmbedder()
    want = min(1.0, max(0.0, _cosine(emb, QUERY, FACT)))
    scores, ranks = [], []
    for others in (0, 30, 120):
        mem = make_memory(kind, emb)
        before = [message_text(i) for i in range(others // 2)]
        after = [message_text(i) for i in range(others // 2, others)]
        mem.add([*before, Message(FACT, id="fact"), *after])
        h = _fact_hit(mem, policy="collapsed")
        scores.append(h.score)
        ranks.append(h.components["rank"])
        assert h.components["dense"] == pytest.approx(_cosine(emb, QUERY, FACT), abs=1e-5)
    assert scores[0] == scores[1] == scores[2]
    assert scores[0] == pytest.approx(want, abs=1e-5)
    assert kind != "segtree" or len(set(ranks)) > 1  # what the score was before: relative to the rest


@pytest.mark.parametrize("kind", KINDS)
def test_every_policy_scores_in_unit_interval_and_ranks_by_its_own_figure(kind):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(40)])
    for policy in mem.policies:
        if policy in mem.llm_policies:
            continue
        hits = mem.retrieve("dogs and travel detail", k=8, policy=policy)
        assert hits, policy
        for i, h in enumerate(hits, start=1):
            assert 0.0 <= h.score <= 1.0 and math.isfinite(h.score)
            assert h.rank == i and h.policy == policy
            assert h.path[-1] == h.node_id and len(h.path) == h.depth + 1
            assert set(h.components) >= {"rank", "dense"}
            assert h.score == min(1.0, max(0.0, h.components["dense"]))
            assert f"#{i} by {policy}" in h.explain()
            assert ("propagated" in h.components) == (policy in ("top_down", "bottom_up"))
        if policy == "collapsed":  # a ranking policy: its own figure is non-increasing
            ranks = [h.components["rank"] for h in hits]
            assert ranks == sorted(ranks, reverse=True)


@pytest.mark.parametrize("kind", KINDS)
def test_query_is_embedded_once_per_retrieve(kind):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(12)])
    before = mem.stats()["query_usage"]["embedded_texts"]
    mem.retrieve("dogs", k=5)
    assert mem.stats()["query_usage"]["embedded_texts"] - before == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(threshold=st.floats(0.0, 1.0), kind=st.sampled_from(["segtree", "memtree", "hat"]))
def test_min_score_keeps_exactly_the_top_k_at_or_above_it(threshold, kind):
    mem = make_memory(kind)
    mem.add([message_text(i) for i in range(20)])
    every = mem.retrieve("music and garden", k=6)
    kept = mem.retrieve("music and garden", k=6, min_score=threshold)
    assert [h.node_id for h in kept] == [h.node_id for h in every if h.score >= threshold]


@pytest.mark.parametrize("bad", [-0.01, 1.5, "0.5", True, float("nan"), [0.5]])
def test_min_score_out_of_range_is_refused_naming_it(bad):
    mem = make_memory("segtree")
    mem.add(["one message"])
    with pytest.raises(InvalidInputError, match="min_score"):
        mem.retrieve("one", min_score=bad)


def test_explain_names_path_policy_and_figures():
    mem = make_memory("segtree")
    mem.add([message_text(i) for i in range(10)])
    h = mem.retrieve("cooking", k=1, policy="top_down")[0]
    text = h.explain()
    assert text.startswith("#1 by top_down (rank score ")
    assert " > ".join(str(i) for i in h.path) in text
    assert f"cosine similarity to the query {h.components['dense']:.2f}" in text
