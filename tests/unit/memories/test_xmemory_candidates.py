"""xMemory ``top_down`` past ``exact_search_max`` nodes: candidates from the IVF index over every node.

Differential tests against the exhaustive path on the same memory: a candidate message's score is the
exhaustive one, the ranking is the exhaustive ranking of the candidates, and the index over every node
holds exactly the indexed vectors through adds, deletes, a failed add and a load. Also the pieces it is
made of (``fuse`` with given maxima, ``LexicalIndex.nonzero``, ``NodeIndex.rows``).
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core.memories.xmemory import XMemory
from shared_core.memories.xmemory import retrieval as R
from shared_core.memories.xmemory.retrieval import _Relevance
from shared_core.search.index import NodeIndex
from shared_core.search.relevance import fuse
from shared_core.types import InvalidInputError, Message, ModelError
from tests.support.xmemory import QUERIES, BowEmbedder, _messages


@pytest.fixture(scope="module")
def built() -> XMemory:
    """A memory built exhaustively (about 800 indexed nodes); tests switch retrieval to candidates."""
    mem = XMemory(embedder=BowEmbedder(), dedup_threshold=0.85, max_episode_messages=5, exact_search_max=None)
    msgs = _messages(300)
    for i in range(0, len(msgs), 10):
        mem.add(msgs[i : i + 10])
    return mem


def _ivf_contents(mem: XMemory) -> dict[int, np.ndarray]:
    """Every (id, decoded vector) the IVF index over every node holds."""
    ns = mem._node_search()
    assert ns is not None and ns._index is not None
    ivf = ns._index
    inv = ivf.invlists
    out: dict[int, np.ndarray] = {}
    for li in range(ivf.nlist):
        size = inv.list_size(li)
        if not size:
            continue
        ids = faiss.rev_swig_ptr(inv.get_ids(li), size).copy()
        for i in ids.tolist():
            assert i not in out
            out[i] = ivf.reconstruct(i)
    return out


def _exhaustive(mem: XMemory, query: str, k: int, **params):
    saved = mem.exact_search_max
    mem.exact_search_max = None
    try:
        return mem.retrieve(query, k=k, **params)
    finally:
        mem.exact_search_max = saved


@pytest.mark.parametrize("relevance", ["hybrid", "dense"])
def test_candidate_ranking_is_the_exhaustive_ranking_of_the_candidates(built, monkeypatch, relevance):
    mem = built
    n = len(mem._index)
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 2)  # m = 2 (3k + 8): a small part of the nodes
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    mem.exact_search_max = 64
    try:
        for q in QUERIES:
            for k in (1, 3):
                p = mem._params({"relevance": relevance})
                full = _Relevance(*mem.relevance(q, relevance))
                ref_scores, _ = mem._evidence_scores(full, p)
                ref = dict(zip(full.ids.tolist(), ref_scores.tolist()))
                m = 2 * (3 * k + 8)
                assert R.NODES_PER_CANDIDATE * m <= n
                c = mem._relevance_candidates(q, relevance, mem.hybrid_weight, m, mem._embed_query(q))
                assert c is not None
                # few lists: every one is visited, so the nearest are the m nearest by the 8-bit codes
                cos = np.maximum(mem._index.scores_all(c.qvec)[1], 0)
                nearest = set(full.ids[np.argsort(-cos, kind="stable")[:m]].tolist())
                assert len(nearest - set(c.ids.tolist())) <= 1  # a tie at the m-th may go either way
                scored = mem._evidence_closure(c.ids, False)
                hits = mem.retrieve(q, k=k, relevance=relevance)
                assert mem.last_trace["candidates"] == len(scored)
                msgs = [h for h in hits if h.is_leaf]
                assert msgs and len(hits) == k
                for h in msgs:  # each candidate message has its exhaustive score
                    assert h.components["rank"] == pytest.approx(ref[h.node_id], abs=1e-6)
                leaves = [i for i in scored.tolist() if mem._store.nodes[i].is_leaf]
                want = sorted(leaves, key=lambda i: (-ref[i], i))
                seen, top = set(), []
                for i in want:  # distinct texts, as the ranking returns them
                    if mem._store.nodes[i].text not in seen:
                        seen.add(mem._store.nodes[i].text)
                        top.append(i)
                assert [h.node_id for h in msgs] == top[: len(msgs)]
    finally:
        mem.exact_search_max = None


def test_enough_candidates_give_the_exhaustive_hits(built, monkeypatch):
    mem = built
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 5)  # m = 85: 4m under the 387 nodes
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    mem.exact_search_max = 64
    try:
        for q in QUERIES:
            got = mem.retrieve(q, k=3)
            assert "candidates" in mem.last_trace
            want = _exhaustive(mem, q, 3)
            assert "candidates" not in mem.last_trace
            assert [(h.node_id, h.text) for h in got] == [(h.node_id, h.text) for h in want]
            assert [h.components["rank"] for h in got] == pytest.approx(
                [h.components["rank"] for h in want], abs=1e-6
            )
    finally:
        mem.exact_search_max = None


def test_bm25_relevance_small_sizes_and_restrictive_filters_stay_exhaustive(built, monkeypatch):
    mem = built
    monkeypatch.setattr(R, "CANDIDATES_PER_HIT", 2)
    monkeypatch.setattr(R, "NODES_PER_CANDIDATE", 4)
    mem.exact_search_max = 64
    try:
        mem.retrieve("bees honey", k=3, relevance="bm25")
        assert "candidates" not in mem.last_trace
        mem.retrieve("bees honey", k=20)  # m = 2 (3k + 8) = 136: over a quarter of the nodes
        assert "candidates" not in mem.last_trace
        text = mem._store.nodes[mem._store.leaves()[0]].text
        got = mem.retrieve("bees honey", k=3, where=lambda msg: msg.text == text)
        assert [h.text for h in got if h.is_leaf] == [text]  # too few candidates pass: exhaustive
        assert "candidates" not in mem.last_trace
    finally:
        mem.exact_search_max = None


def test_node_search_holds_exactly_the_indexed_vectors_through_changes(tmp_path):
    emb = BowEmbedder()
    mem = XMemory(embedder=emb, max_episode_messages=4, exact_search_max=40)
    msgs = _messages(160, seed=5)

    def check(m: XMemory) -> None:
        held = _ivf_contents(m)
        idx = m._index
        assert set(held) == set(idx.ids.tolist())
        vecs = idx.get(sorted(held))
        stored = np.stack([held[i] for i in sorted(held)])  # 8-bit codes: the vectors decoded
        cos = (stored * vecs).sum(1) / np.linalg.norm(stored, axis=1)
        assert cos.min() > 0.97, cos.min()  # clipped where a vector came after the training ranges
        assert np.median(np.abs(stored - vecs)) < 1e-3

    for i in range(0, 80, 8):
        mem.add(msgs[i : i + 8])
        mem.retrieve("bees honey", k=1)
    check(mem)
    assert len(mem._index) > 40
    for leaf in mem._store.leaves()[3:9]:
        mem.delete(leaf)
    check(mem)

    class Boom(Exception):
        pass

    def fail(*a, **kw):
        raise Boom

    before = sorted(mem._index.ids.tolist())
    real = mem.embedder.embed
    mem.embedder.embed = fail
    with pytest.raises(ModelError) as e:
        mem.add(Message("a new message about the garden market"))
    assert isinstance(e.value.__cause__, Boom)
    mem.embedder.embed = real
    assert sorted(mem._index.ids.tolist()) == before
    check(mem)
    for i in range(80, 160, 8):
        mem.add(msgs[i : i + 8])
    check(mem)  # the index doubled since the first training: trained again
    mem.save(tmp_path / "m")
    loaded = XMemory.load(tmp_path / "m", embedder=emb)
    check(loaded)
    assert [h.node_id for h in loaded.retrieve("chess cup", k=3)] == [
        h.node_id for h in mem.retrieve("chess cup", k=3)
    ]


# --------------------------------------------------------------------------- the pieces


@settings(max_examples=60, deadline=None)
@given(
    d=st.lists(st.floats(0, 1, width=32), min_size=1, max_size=20),
    seed=st.integers(0, 10**6),
    w=st.floats(0, 1),
)
def test_fuse_with_the_maxima_of_a_superset_is_the_fusion_of_the_superset(d, seed, w):
    rng = np.random.default_rng(seed)
    dense = np.asarray(d, dtype=np.float32)
    bm = (rng.random(len(d)) * rng.integers(0, 2, len(d)) * 7).astype(np.float32)
    whole = fuse(dense, bm, w)
    assert np.array_equal(fuse(dense, bm, w, maxima=(dense.max(), bm.max())), whole)
    sub = rng.random(len(d)) < 0.5
    part = fuse(dense[sub], bm[sub], w, maxima=(float(dense.max()), float(bm.max())))
    assert np.array_equal(part, whole[sub])
    if dense.max() > 0:
        with pytest.raises(InvalidInputError, match="below the largest"):
            fuse(dense, bm, w, maxima=(float(dense.max()) / 2, float(bm.max())))


def test_node_index_rows_and_matrix():
    idx = NodeIndex(3)
    idx.upsert([7, 3, 9], np.eye(3, dtype=np.float32))
    assert idx.rows([9, 7, 5, 3]).tolist() == [2, 0, -1, 1]
    mat = idx.matrix()
    assert np.array_equal(mat[idx.rows([3])], idx.get([3]))
    with pytest.raises(ValueError):
        mat[0, 0] = 2.0  # a read-only view
    idx.remove([7])
    assert idx.rows([9, 7, 3]).tolist() == [1, -1, 0]


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "drop", "tx-put", "tx-drop"]),
            st.lists(
                st.one_of(st.integers(0, 40), st.integers(10**12, 10**12 + 5), st.integers(-3, -1)),
                min_size=1,
                max_size=4,
                unique=True,
            ),
        ),
        max_size=25,
    ),
    seed=st.integers(0, 10**6),
)
def test_node_index_rows_follow_every_change(ops, seed):
    # the array map of NodeIndex.rows agrees with the row order after upserts, removals and
    # rolled-back transactions, for small, huge and negative ids alike
    rng = np.random.default_rng(seed)
    idx = NodeIndex(4)
    want: dict[int, np.ndarray] = {}
    for op, ids in ops:
        if op.startswith("tx"):
            idx.begin()
        if op.endswith("put"):
            vecs = rng.standard_normal((len(ids), 4)).astype(np.float32) + 0.1
            idx.upsert(ids, vecs)
            if not op.startswith("tx"):
                want.update(zip(ids, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)))
        else:
            idx.remove(ids)
            if not op.startswith("tx"):
                for i in ids:
                    want.pop(i, None)
        if op.startswith("tx"):
            idx.rollback()
        order = idx.ids.tolist()
        assert sorted(order) == sorted(want)
        probe = sorted(want) + [41, 10**12 + 9, -7]
        assert idx.rows(probe).tolist() == [order.index(i) if i in want else -1 for i in probe]
        if want:
            np.testing.assert_allclose(
                idx.get(sorted(want)), np.stack([want[i] for i in sorted(want)]), rtol=1e-6
            )
        with pytest.raises(KeyError):
            idx.get([41])
