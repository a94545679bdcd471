"""``top_down`` past ``exact_search_max`` nodes for SegTreeMem, MemTree and HAT: candidates, not every node.

Differential tests against the exhaustive path on the same memory. With an exact nearest-neighbour
first stage the hits are the exhaustive hits, in the same order, with scores one positive factor from
the exhaustive scores, for any decay and horizon (descendants of a strong candidate included); with
the IVF index, the hits of a memory of a few thousand nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import HAT, MemTree, SegTreeMem
from shared_core.search import candidates as R
from shared_core.search.candidates import ancestors, descendants, floor_of, relevance_bound
from shared_core.search.index import top_k
from shared_core.search.lexical import tokenize
from shared_core.types import InvalidInputError
from tests.support.xmemory import QUERIES, BowEmbedder, _messages

MORE_QUERIES = [*QUERIES, "garden", "I won the cup", "market by the river", "honey bees sunday boat"]


class ExactNearest:
    """A first stage that returns the exact ``m`` nearest (ties by id): the IVF index's ideal."""

    def __init__(self, mem) -> None:
        self.mem = mem

    def search(self, q: np.ndarray, m: int):
        idx = self.mem._index
        ids, cos = idx.scores_all(q)
        pos = top_k(ids, cos, m)
        return ids[pos][None, :], cos[pos][None, :]


def _build(kind: str, n: int = 240):
    emb = BowEmbedder()
    if kind == "segtree":  # top_down is the policy under test; collapsed is drawn below too
        mem = SegTreeMem(embedder=emb, max_children=8, policy="top_down")
    elif kind == "memtree":
        mem = MemTree(embedder=emb, policy="top_down")
    else:
        mem = HAT(embedder=emb, policy="top_down")
    msgs = _messages(n, seed=5)
    for i in range(0, n, 8):
        mem.add(msgs[i : i + 8])
    return mem


@pytest.fixture(scope="module", params=["segtree", "memtree", "hat"])
def built(request):
    return _build(request.param)


def _exhaustive(mem, query, **kw):
    saved = mem.exact_search_max
    mem.exact_search_max = None
    try:
        hits = mem.retrieve(query, **kw)
        assert mem.last_candidates is None
        return hits
    finally:
        mem.exact_search_max = saved


def _forced(mem, monkeypatch, per_hit: int = 2, exact: bool = True) -> None:
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", per_hit)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 1)
    monkeypatch.setattr(mem, "exact_search_max", 16)
    if exact:
        monkeypatch.setattr(mem, "_node_search", lambda: ExactNearest(mem))


def _same(got, want) -> None:
    assert [h.node_id for h in got] == [h.node_id for h in want]
    ratio = [g.score / w.score for g, w in zip(got, want) if w.score > 0]
    assert ratio and max(ratio) == pytest.approx(min(ratio), rel=1e-9)  # one factor for every hit


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    q=st.sampled_from(MORE_QUERIES),
    k=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    horizon=st.integers(0, 3),
    relevance=st.sampled_from(["hybrid", "dense"]),
    policy=st.sampled_from(["top_down", "top_down", "collapsed"]),
)
def test_hits_are_the_exhaustive_hits_with_an_exact_first_stage(
    built, monkeypatch, q, k, alpha, horizon, relevance, policy
):
    mem = built
    kw = {"k": k, "alpha": alpha, "horizon": horizon, "relevance": relevance, "policy": policy}
    with monkeypatch.context() as mp:
        _forced(mem, mp)
        got = mem.retrieve(q, **kw)
        used = mem.last_candidates
    want = _exhaustive(mem, q, **kw)
    _same(got, want)
    if used is not None:
        assert used < len(mem._index)


def test_the_candidate_path_is_taken_and_scores_a_part_of_the_nodes(built, monkeypatch):
    mem = built
    _forced(mem, monkeypatch)
    used = []
    for q in MORE_QUERIES:
        got = mem.retrieve(q, k=3)
        used.append(mem.last_candidates)
        _same(got, _exhaustive(mem, q, k=3))
    taken = [u for u in used if u is not None]
    assert len(taken) >= len(used) // 2  # the floor lets most rankings finish over the candidates
    assert all(u < len(mem._index) for u in taken)


@pytest.mark.parametrize("max_tokens", [12, 40, 400])
def test_budgets_and_filters_give_the_exhaustive_hits(built, monkeypatch, max_tokens):
    mem = built
    _forced(mem, monkeypatch, per_hit=4)
    for q in MORE_QUERIES:
        got = mem.retrieve(q, k=4, max_tokens=max_tokens)
        want = _exhaustive(mem, q, k=4, max_tokens=max_tokens)
        assert [h.node_id for h in got] == [h.node_id for h in want]
        flt = {"where": lambda m: "bees" in m.text}
        got = mem.retrieve(q, k=3, **flt)
        want = _exhaustive(mem, q, k=3, **flt)
        assert [h.node_id for h in got] == [h.node_id for h in want]
        assert all("bees" in h.text for h in got if h.is_leaf)


def test_ivf_first_stage_finds_the_exhaustive_hits(monkeypatch):
    mem = _build("segtree", n=1200)
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 8)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    mem.exact_search_max = 256
    same = taken = 0
    for q in MORE_QUERIES:
        for k in (2, 5):
            got = mem.retrieve(q, k=k)
            taken += mem.last_candidates is not None
            same += [h.node_id for h in got] == [h.node_id for h in _exhaustive(mem, q, k=k)]
    assert taken >= 12 and same >= 15  # of 16: the IVF index may miss a near node at its margin


def test_other_settings_score_every_node(built, monkeypatch):
    mem = built
    _forced(mem, monkeypatch)
    mem.retrieve("bees honey", k=3, relevance="bm25")
    assert mem.last_candidates is None  # BM25 is sparse and exact already
    if isinstance(mem, SegTreeMem):
        mem.retrieve("bees honey", k=3, policy="bottom_up")
        assert mem.last_candidates is None
    monkeypatch.setattr(mem, "exact_search_max", None)
    mem.retrieve("bees honey", k=3)
    assert mem.last_candidates is None
    monkeypatch.setattr(mem, "exact_search_max", 16)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 10_000)  # under the size
    mem.retrieve("bees honey", k=3)
    assert mem.last_candidates is None


def test_segtree_share_weights_score_every_node(monkeypatch):
    mem = SegTreeMem(embedder=BowEmbedder(), top_down_weights="share", policy="top_down")
    mem.add(_messages(120, seed=2))
    _forced(mem, monkeypatch)
    mem.retrieve("bees honey", k=3)
    assert mem.last_candidates is None


@pytest.mark.parametrize("cls", [SegTreeMem, MemTree, HAT])
def test_exact_search_max_is_checked_and_saved(cls, tmp_path):
    for bad in (0, -3, 1.5, "8", True):
        with pytest.raises(InvalidInputError, match="exact_search_max"):
            cls(embedder=BowEmbedder(), exact_search_max=bad)
    mem = cls(embedder=BowEmbedder(), exact_search_max=100)
    mem.add(_messages(20))
    mem.save(tmp_path / "m")
    assert cls.load(tmp_path / "m", embedder=BowEmbedder()).exact_search_max == 100
    assert cls(embedder=BowEmbedder()).exact_search_max == 8192
    assert cls.stored_config({})["exact_search_max"] is None  # saves made before the option


def test_ancestors_and_descendants():
    parent = np.array([-1, 0, 0, 1, 1, 2, 5], dtype=np.int64)
    assert ancestors(parent, np.array([6]), 0).tolist() == [6]
    assert ancestors(parent, np.array([6]), 2).tolist() == [2, 5, 6]
    assert ancestors(parent, np.array([6, 3]), 9).tolist() == [0, 1, 2, 3, 5, 6]
    kids = {0: [1, 2], 1: [3, 4], 2: [5], 5: [6]}
    assert descendants(lambda v: kids.get(v, []), {0: 1}).tolist() == [1, 2]
    assert descendants(lambda v: kids.get(v, []), {0: 2, 5: 1}).tolist() == [1, 2, 3, 4, 5, 6]


def test_bounds_by_hand():
    # alpha = 0.5, H = 2: weights 1, 0.5, 0.25 over 1.75
    assert floor_of(0.5, 2, 0.2, 0.8, 1) == pytest.approx((0.2 * 1 + 0.8 * 0.75) / 1.75, rel=1e-5)
    assert floor_of(0.5, 2, 0.2, 0.8, 2) == pytest.approx((0.2 * 1.5 + 0.8 * 0.25) / 1.75, rel=1e-5)
    assert floor_of(0.5, 2, 0.3, 0.1, 1) == pytest.approx(0.3, rel=1e-5)  # r_max below r_b: r_b
    assert relevance_bound("dense", 0.5, 0.4, 0.9, 3.0, 6.0) == pytest.approx(0.4, rel=1e-5)
    assert relevance_bound("hybrid", 0.25, 0.4, 0.8, 3.0, 6.0) == pytest.approx(
        0.25 * 0.5 + 0.75 * 0.5, rel=1e-5
    )
    assert relevance_bound("hybrid", 0.5, 0.4, 0.8, 0.0, 0.0) == pytest.approx(0.25, rel=1e-5)


class TaggedSummarizer:
    """Summaries that name a word no message holds: only summaries match ``"zebra"``, so the best
    ``top_down`` leaves inherit their scores and are found only below candidate summaries."""

    def summarize(self, texts, **fields):
        from shared_core.types import Usage

        return "zebra zebra " + " ".join(t.split(".")[0] for t in texts[:2]), Usage()

    async def asummarize(self, texts, **fields):
        return self.summarize(texts)


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_leaves_that_inherit_their_score_are_found_below_candidates(kind, alpha, monkeypatch):
    emb = BowEmbedder()
    cls = {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}[kind]
    mem = cls(embedder=emb, summarizer=TaggedSummarizer(), exact_search_max=16, policy="top_down")
    mem.add(_messages(160, seed=9))
    _forced(mem, monkeypatch)
    taken = 0
    for q in ["zebra", "zebra bees", "zebra river boat"]:
        for h in (1, 2):
            got = mem.retrieve(q, k=3, alpha=alpha, horizon=h)
            taken += mem.last_candidates is not None
            want = _exhaustive(mem, q, k=3, alpha=alpha, horizon=h)
            _same(got, want)
            assert all(h.is_leaf for h in want)
    assert taken >= 3


def _ivf_contents(ns) -> dict[int, np.ndarray]:
    """Every (id, decoded vector) the IVF index holds, read without bringing it up to date."""
    import faiss

    ivf, out = ns._index, {}
    for li in range(ivf.nlist):
        size = ivf.invlists.list_size(li)
        if size:
            for i in faiss.rev_swig_ptr(ivf.invlists.get_ids(li), size).copy().tolist():
                out[i] = ivf.reconstruct(i)
    return out


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_a_deletion_leaves_no_code_in_the_ivf_index(kind, monkeypatch):
    mem = _build(kind, n=160)
    _forced(mem, monkeypatch, exact=False)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 1)
    mem.retrieve("bees honey", k=2)  # trains the IVF index over every node
    assert mem._ns is not None and not mem._ns.exhaustive
    leaf = mem._store.leaves()[5]
    ids = mem._index.ids.tolist()
    before = dict(zip(ids, mem._index.get(ids)))
    mem.delete(leaf)
    held = _ivf_contents(mem._ns)  # no query since the deletion
    assert leaf not in held and set(held) == set(mem._index.ids.tolist())
    now = dict(zip(held, mem._index.get(list(held))))
    changed = [i for i in held if i in before and not np.array_equal(before[i], now[i])]
    for i in held:  # rewritten summaries are encoded again from their new vectors (8-bit codes)
        assert np.abs(held[i] - now[i]).max() < 0.05
    assert changed or kind == "hat"  # the deleted leaf's ancestors were rewritten


def _speaker_memory(kind: str, n: int = 240):
    """Every message holds the speaker's name, as Message.render writes it."""
    emb = BowEmbedder()
    mem = {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}[kind](embedder=emb)
    msgs = [f"Caroline: {t}" for t in _messages(n, seed=6)]
    for i in range(0, n, 8):
        mem.add(msgs[i : i + 8])
    return mem


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_a_word_of_every_message_makes_no_bm25_candidate(kind, monkeypatch):
    """A query naming the speaker of every message: the BM25 candidates are the nodes holding another
    query word (a node holding only the name scores about nothing), and the hits over the candidates
    are still the exhaustive hits (the default policy, collapsed, and top_down)."""
    mem = _speaker_memory(kind)
    k = 3
    lex = mem._lexical_index()
    for q in ["What did Caroline say about chess?", "Caroline bees", "Caroline market river"]:
        words = set(tokenize([q])[0]) - {"carolin"}
        holders = {i for i, n in mem._store.nodes.items() if n.text and words & set(tokenize([n.text])[0])}
        per_hit = len(holders) // (3 * k + 8) + 2  # more BM25 candidates than nodes holding a word
        with monkeypatch.context() as mp:
            _forced(mem, mp, per_hit=per_hit)
            m = per_hit * (3 * k + 8)
            assert len(holders) < m < len(mem._index)
            qvec = mem._embed_query(q)
            c = mem._relevance_candidates(q, "hybrid", mem.hybrid_weight, m, qvec)
            assert set(c.ids.tolist()) - set(c.nearest.tolist()) <= holders
            assert set(c.bm_ids.tolist()) <= holders
            everything = dict(zip(*(a.tolist() for a in lex.scores(q))))
            assert c.maxb == pytest.approx(max(everything.values()), rel=1e-6)
            outside = [s for i, s in everything.items() if i not in set(c.ids.tolist())]
            assert c.bm_floor >= max(outside)  # no node outside the candidates scores more
            np.testing.assert_array_equal(
                c.bm25(np.asarray(sorted(everything))), lex.scores_for(q, sorted(everything))
            )
            for policy in ("collapsed", "top_down"):
                got = mem.retrieve(q, k=k, policy=policy)
                assert mem.last_candidates is not None
                _same(got, _exhaustive(mem, q, k=k, policy=policy))


@pytest.mark.parametrize("kind", ["segtree", "hat"])
def test_bm25_candidates_cut_a_tie_by_node_id(kind, monkeypatch):
    """Many messages of one length hold the query's word once: they tie in BM25. The BM25 candidates
    are the m best with ties by node id (not the whole tie), the floor is the tie's score, and the hits
    over the candidates are the exhaustive hits."""
    mem = _speaker_memory(kind)
    k, q = 3, "Caroline chess"
    with monkeypatch.context() as mp:
        _forced(mem, mp, per_hit=1)
        m = 3 * k + 8
        lex = mem._lexical_index()
        ids, sc = lex.above(q, lex.common_bound(q))[:2]
        cut = np.sort(sc)[::-1][m - 1]
        assert (sc == cut).sum() > 1 and (sc >= cut).sum() > m  # a tie across the m-th
        c = mem._relevance_candidates(q, "hybrid", mem.hybrid_weight, m, mem._embed_query(q))
        want = ids[np.lexsort((ids, -sc))[:m]]
        assert set(c.ids.tolist()) - set(c.nearest.tolist()) == set(want.tolist()) - set(c.nearest.tolist())
        assert set(want.tolist()) <= set(c.ids.tolist()) and c.bm_floor == pytest.approx(float(cut))
        for policy in ("collapsed", "top_down"):
            got = mem.retrieve(q, k=k, policy=policy)
            _same(got, _exhaustive(mem, q, k=k, policy=policy))
