"""Flat baselines and the online evaluation loop. The evaluation data's reference figures, reproduced on
the whole data: tests/integration/test_eval_reference_figures.py.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shared_core.eval import (
    Conversation,
    FlatBM25,
    FlatDense,
    FlatFusion,
    FlatHybridRRF,
    Query,
    evaluate_online,
)
from shared_core.models.local import LocalEmbedder
from shared_core.search.lexical import tokenize
from shared_core.search.relevance import fuse, max_normalized
from shared_core.types import EmbeddingError, InvalidInputError, Message


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


PETS = [
    Message("I adopted a dog named Luna last spring", speaker="Caroline", id="D1:1"),
    Message("My favourite painting is a sunset over a lake", speaker="Melanie", id="D1:2"),
    Message("We went camping in the mountains", speaker="Melanie", id="D1:3"),
    Message("The weather was rainy all week"),
]


# --------------------------------------------------------------------------- baselines, small cases
def test_flat_dense_hits(embedder):
    mem = FlatDense(embedder)
    assert mem.retrieve("anything") == []
    rep = mem.add(PETS)
    assert rep.leaf_ids == [0, 1, 2, 3] and rep.usage.embed_calls == 1
    hits = mem.retrieve("What is the name of Caroline's dog?", k=2)
    assert len(hits) == 2
    top = hits[0]
    assert (top.node_id, top.span, top.source_ids, top.depth, top.is_leaf) == (0, (0, 0), ["D1:1"], 1, True)
    assert top.text == "Caroline: I adopted a dog named Luna last spring"
    assert top.metadata["speaker"] == "Caroline"
    assert hits[0].score >= hits[1].score
    assert len(mem.retrieve("weather", k=50)) == 4
    assert mem.retrieve("rain", k=1)[0].source_ids == []  # message without id
    with pytest.raises(InvalidInputError):
        mem.retrieve("", k=3)
    with pytest.raises(InvalidInputError):
        mem.retrieve("dog", k=0)


class _NaNEmbedder:
    dim = 384

    def embed(self, texts):
        return np.full((len(texts), 384), np.nan, dtype=np.float32)

    async def aembed(self, texts):
        return self.embed(texts)


def test_failed_add_leaves_baselines_unchanged(embedder):
    mem = FlatDense(embedder)
    mem.add(PETS[:2])
    good_embedder = mem.embedder
    mem.embedder = _NaNEmbedder()
    with pytest.raises(EmbeddingError):
        mem.add(PETS[2:])
    mem.embedder = good_embedder
    assert len(mem) == 2 and mem._index.ntotal == 2
    hybrid = FlatHybridRRF(_NaNEmbedder())
    with pytest.raises(EmbeddingError):
        hybrid.add(PETS)
    assert len(hybrid) == 0 and len(hybrid.bm25) == 0
    bm = FlatBM25()
    with pytest.raises(InvalidInputError):
        bm.add(["ok", ""])
    assert len(bm) == 0 and len(bm.index) == 0


def test_flat_bm25_stemming_and_ranking():
    stemmed, plain = FlatBM25(stem=True), FlatBM25(stem=False)
    for m in (stemmed, plain):
        m.add(PETS)
    assert stemmed.retrieve("paintings", k=1)[0].source_ids == ["D1:2"]
    assert plain.retrieve("paintings", k=1)[0].score == 0.0
    hits = plain.retrieve("Melanie", k=4)
    # the speaker name is indexed; the shorter turn scores higher; zero-score ties by insertion order
    assert [h.node_id for h in hits] == [2, 1, 0, 3]
    assert hits[0].score > hits[1].score > 0 == hits[2].score == hits[3].score


def test_rrf_is_reciprocal_rank_fusion_of_both_rankings(embedder):
    hybrid = FlatHybridRRF(embedder, stem=True, k_rrf=60)
    hybrid.add(PETS[:2])
    hybrid.add(PETS[2:])
    q = "Which painting does Melanie like?"
    d_idx, _ = hybrid.dense.ranking(q)
    b_idx, _ = hybrid.bm25.ranking(q)
    expected = np.zeros(4)
    for idx in (d_idx, b_idx):
        for r, i in enumerate(idx, 1):
            expected[i] += 1 / (60 + r)
    hits = hybrid.retrieve(q, k=4)
    assert [h.score for h in hits] == pytest.approx(sorted(expected, reverse=True))
    assert hits[0].node_id == int(np.argmax(expected))
    assert hits[0].score <= 2 / 61
    with pytest.raises(InvalidInputError):
        FlatHybridRRF(embedder, k_rrf=-1)


# --------------------------------------------------------------------------- max-normalised fusion
class TableEmbedder:
    """Returns the vector given for each text (not normalised: the baselines normalise); other texts
    (a memory's summaries) get a fixed vector made from the text's CRC32 when ``others`` is true."""

    def __init__(self, table: dict[str, Sequence[float]], others: bool = False) -> None:
        self.table = {t: np.asarray(v, dtype=np.float32) for t, v in table.items()}
        self.dim = len(next(iter(table.values())))
        self.others = others

    def _vec(self, text: str) -> np.ndarray:
        if text in self.table or not self.others:
            return self.table[text]
        rng = np.random.default_rng(zlib.crc32(text.encode()))
        return rng.normal(size=self.dim).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._vec(t) for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


# Four two-token messages (after stop words and stemming), so every length equals the average and BM25
# of a one-word query is idf * 1 / (1 + k1) in the messages holding the word, 0 elsewhere.
FRUIT = {
    "apple pie": [0.0, 1.0],  # cos with the query 0.6
    "banana split": [1.0, 0.0],  # cos 0.8
    "apple tart": [0.6, 0.8],  # cos 0.96, the dense maximum
    "cherry cake": [-1.0, 0.0],  # cos -0.8 -> 0
    "apple": [0.8, 0.6],
    "durian": [0.8, 0.6],  # no stored message has this word: BM25 is 0 everywhere
    "plum": [-1.0, 0.0],  # cos 0, -1, -0.6, 1: one positive cosine
    "apples": [0.0, 1.0],
}


def test_fusion_worked_by_hand():
    f = FlatFusion(TableEmbedder(FRUIT))
    assert f.retrieve("apple") == [] and f.scores("apple").shape == (0,)
    f.add(["apple pie", "banana split"])
    f.add(["apple tart", "cherry cake"])
    # dense / max = (0.6, 0.8, 0.96, 0) / 0.96 = (0.625, 0.8333, 1, 0); bm25 / max = (1, 0, 1, 0)
    expected = [0.5 * 0.625 + 0.5, 0.5 * 0.8 / 0.96, 1.0, 0.0]
    np.testing.assert_allclose(f.scores("apple"), expected, rtol=1e-6)
    hits = f.retrieve("apple", k=4)
    assert [h.node_id for h in hits] == [2, 0, 1, 3]
    assert [h.score for h in hits] == pytest.approx([1.0, 0.8125, 0.8 / 1.92, 0.0], rel=1e-6)
    assert (hits[0].text, hits[0].span, hits[0].depth, hits[0].is_leaf) == ("apple tart", (2, 2), 1, True)
    # weight 0.3 on the dense part
    g = FlatFusion(TableEmbedder(FRUIT), hybrid_weight=0.3)
    g.add(list(FRUIT)[:4])
    np.testing.assert_allclose(g.scores("apple"), [0.3 * 0.625 + 0.7, 0.3 * 0.8 / 0.96, 1.0, 0.0], rtol=1e-6)
    # a zero BM25 maximum leaves the lexical part at zero: the score is w * dense / max
    np.testing.assert_allclose(f.scores("durian"), [0.3125, 0.5 * 0.8 / 0.96, 0.5, 0.0], rtol=1e-6)
    # negative cosines count as 0; the zero scores tie and come in insertion order
    assert f.scores("plum").tolist() == [0.0, 0.0, 0.0, 0.5]
    assert [h.node_id for h in f.retrieve("plum", k=4)] == [3, 0, 1, 2]
    # w = 1 is max(cos, 0) alone, w = 0 stemmed BM25 alone
    dense_only = FlatFusion(TableEmbedder(FRUIT), hybrid_weight=1.0)
    dense_only.add(list(FRUIT)[:4])
    np.testing.assert_allclose(dense_only.scores("apple"), [0.625, 0.8 / 0.96, 1.0, 0.0], rtol=1e-6)
    lexical = FlatFusion(TableEmbedder(FRUIT), hybrid_weight=0)
    lexical.add(list(FRUIT)[:4])
    assert lexical.scores("apple").tolist() == [1.0, 0.0, 1.0, 0.0]
    assert lexical.scores("apples").tolist() == [1.0, 0.0, 1.0, 0.0]  # stemmed like FlatBM25


def test_fusion_distinct_texts_budget_and_errors():
    f = FlatFusion(TableEmbedder(FRUIT))
    f.add(["apple tart", "apple pie", "apple tart", "banana split"])
    hits = f.retrieve("apple", k=3)
    # the repeated text is skipped, the next message is taken: k hits with distinct texts
    assert [h.node_id for h in hits] == [0, 1, 3]
    assert [h.node_id for h in f.retrieve("apple", k=10)] == [0, 1, 3]
    # budget: "apple tart" is 2 tokens; a budget of 3 keeps it and skips "apple pie" (2 more)
    assert [h.text for h in f.retrieve("apple", k=3, max_tokens=3)] == ["apple tart"]
    with pytest.raises(InvalidInputError):
        f.retrieve("apple", k=0)
    with pytest.raises(InvalidInputError):
        f.retrieve(" ", k=1)
    with pytest.raises(InvalidInputError):
        f.retrieve("apple", k=1, max_tokens=0)
    for bad in (-0.1, 1.5, math.nan, True, "0.5"):
        with pytest.raises(InvalidInputError):
            FlatFusion(TableEmbedder(FRUIT), hybrid_weight=bad)
    broken = FlatFusion(_NaNEmbedder())
    with pytest.raises(EmbeddingError):
        broken.add(PETS)
    assert len(broken) == 0 and len(broken.bm25) == 0


def test_every_flat_baseline_returns_distinct_texts():
    texts = ["apple tart", "apple tart", "apple pie", "banana split", "apple tart"]
    for obj in (
        FlatDense(TableEmbedder(FRUIT)),
        FlatBM25(),
        FlatHybridRRF(TableEmbedder(FRUIT)),
        FlatFusion(TableEmbedder(FRUIT)),
    ):
        obj.add(texts)
        for budget in (None, 100):
            hits = obj.retrieve("apple", k=3, max_tokens=budget)
            assert len(hits) == 3 and len({h.text for h in hits}) == 3, type(obj).__name__
            assert hits[0].text == "apple tart"
            if isinstance(obj, (FlatBM25, FlatFusion)):  # exact ties in insertion order
                assert hits[0].node_id == 0


def test_fuse_by_hand_and_errors():
    np.testing.assert_allclose(fuse([0.5, 0.25, 0.0], [0.0, 2.0, 1.0], 0.5), [0.5, 0.75, 0.25])
    np.testing.assert_allclose(fuse([0.5, 0.25], [0.0, 0.0], 0.2), [0.2, 0.1])  # zero max stays zero
    assert fuse([], [], 0.5).shape == (0,) and fuse([1.0], [1.0]).dtype == np.float32
    np.testing.assert_array_equal(max_normalized([0.0, 0.0]), [0.0, 0.0])
    for dense, bm25, w in (
        ([1.0, 2.0], [1.0], 0.5),
        ([-0.1, 1.0], [1.0, 1.0], 0.5),
        ([math.nan, 1.0], [1.0, 1.0], 0.5),
        ([[1.0]], [[1.0]], 0.5),
        ([1.0], [1.0], 1.01),
        ([1.0], [1.0], math.inf),
    ):
        with pytest.raises(InvalidInputError):
            fuse(dense, bm25, w)


def test_fuse_is_the_memories_hybrid_relevance():
    from shared_core.memories.segtree import SegTreeMem

    emb = TableEmbedder({**FRUIT, "cherry pie": [0.2, 0.9], "banana bread": [0.9, 0.3]}, others=True)
    mem = SegTreeMem(emb, relevance="hybrid", hybrid_weight=0.3)
    mem.add(["apple pie", "banana split", "apple tart", "cherry pie", "banana bread"])
    for query in ("apple", "durian", "plum"):
        ids, hybrid = mem.relevance(query, "hybrid", 0.3)
        ids_d, dense = mem.relevance(query, "dense")
        ids_b, lex = mem.relevance(query, "bm25")
        assert ids.tolist() == ids_d.tolist() == ids_b.tolist()
        np.testing.assert_array_equal(hybrid, fuse(dense, lex, 0.3))


VOCAB = ["apple", "banana", "cherry", "dog", "cat", "sun", "rain", "lake"]


def _brute_force_fusion(
    texts: Sequence[str], vecs: np.ndarray, qtext: str, qvec: np.ndarray, w: float
) -> np.ndarray:
    """The fusion computed from its definition in float64: cosines from raw vectors, and Lucene BM25
    (k1 = 1.5, b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5))) over the tokens."""
    cos = vecs @ qvec / (np.linalg.norm(vecs, axis=1) * np.linalg.norm(qvec))
    dense = np.maximum(cos, 0.0)
    docs = tokenize(list(texts))
    (query,) = tokenize([qtext])
    n = len(docs)
    avg = sum(len(d) for d in docs) / n
    bm = np.zeros(n)
    if avg > 0:
        for term in dict.fromkeys(query):
            df = sum(term in d for d in docs)
            if df == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for i, d in enumerate(docs):
                tf = d.count(term)
                bm[i] += idf * tf / (tf + 1.5 * (1 - 0.75 + 0.75 * len(d) / avg))
    d = dense / dense.max() if dense.max() > 0 else dense
    b = bm / bm.max() if bm.max() > 0 else bm
    return w * d + (1 - w) * b


_vec = st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=3).filter(
    lambda v: float(np.linalg.norm(v)) > 0.05
)
_text = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4).map(" ".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(st.tuples(_text, _vec), min_size=1, max_size=12),
    query_words=st.lists(st.sampled_from([*VOCAB, "zebra"]), min_size=1, max_size=3, unique=True),
    qvec=_vec,
    w=st.floats(0, 1),
    k=st.integers(1, 14),
)
def test_fusion_matches_a_brute_force_implementation(docs, query_words, qvec, w, k):
    texts = [t for t, _ in docs]
    table = {}
    for t, v in docs:
        table.setdefault(t, v)  # one vector per distinct text
    qtext = "q " + " ".join(query_words)  # "q" is below bm25s' two-character token minimum
    table[qtext] = qvec
    f = FlatFusion(TableEmbedder(table), hybrid_weight=w)
    cut = max(1, len(texts) // 2)  # two add calls whenever there are two messages
    f.add(texts[:cut])
    if texts[cut:]:
        f.add(texts[cut:])
    vecs = np.array([table[t] for t in texts], dtype=np.float64)
    q64 = np.asarray(qvec, dtype=np.float64)
    top_cos = float(np.max(vecs @ q64 / (np.linalg.norm(vecs, axis=1) * np.linalg.norm(q64))))
    # dividing by the dense maximum is discontinuous at 0: float32 and float64 may disagree on its sign
    assume(top_cos > 1e-3 or top_cos < -1e-6)
    ref = _brute_force_fusion(texts, vecs, qtext, q64, w)
    np.testing.assert_allclose(f.scores(qtext), ref, atol=1e-5)
    hits = f.retrieve(qtext, k=k)
    ids = [h.node_id for h in hits]
    distinct = list(dict.fromkeys(texts))
    assert len(hits) == min(k, len(distinct))
    assert len({h.text for h in hits}) == len(hits)
    tol = 1e-5
    for h in hits:
        assert h.score == pytest.approx(ref[h.node_id], abs=tol)
        assert h.node_id == texts.index(h.text)  # the first message of a repeated text
    for x, y in zip(hits, hits[1:]):
        assert ref[x.node_id] >= ref[y.node_id] - tol
        if x.score == y.score:
            assert x.node_id < y.node_id  # exact ties in insertion order
    if hits:
        floor = min(ref[i] for i in ids)
        returned = {h.text for h in hits}
        for i, t in enumerate(texts):
            if t not in returned:
                assert ref[i] <= floor + tol, (i, t)


# --------------------------------------------------------------------------- online loop
class Recorder:
    """Records add batches and what was stored when each retrieve happened."""

    log: list = []

    def __init__(self) -> None:
        self.stored: list[Message] = []
        self.inner = FlatBM25(stem=False)

    def add(self, messages):
        Recorder.log.append(("add", [m.id for m in messages]))
        self.stored.extend(messages)
        self.inner.add(messages)

    def retrieve(self, query, k=10):
        Recorder.log.append(("retrieve", query, len(self.stored), k))
        return self.inner.retrieve(query, k=k)


def _conv() -> Conversation:
    msgs = [
        Message("I adopted a dog named Luna", speaker="Ann", id="m0"),
        Message("Luna loves the beach", speaker="Ann", id="m1"),
        Message("I paint sunsets", speaker="Bob", id="m2"),
        Message("Bob sold a painting of a lake", speaker="Bob", id="m3"),
        Message("Ann moved to Paris", speaker="Ann", id="m4"),
    ]
    qs = [
        Query("Where does Luna like to go?", "the beach", ["m1"], 1, 2, "q1"),
        Query("What did Bob paint and sell?", "painting of a lake", ["m2", "m3"], 2, 4, "q2"),
        Query("Cats?", "Luna", ["m3"], 1, 4, "q3"),
        Query("Anything?", "", [], None, 0, "q0"),
    ]
    return Conversation("c", msgs, qs)


def test_online_batches_and_exact_scores():
    Recorder.log = []
    res = evaluate_online(_conv(), {"rec": Recorder}, k=1, progress=False)
    assert Recorder.log == [
        ("retrieve", "Anything?", 0, 1),
        ("add", ["m0", "m1"]),
        ("retrieve", "Where does Luna like to go?", 2, 1),
        ("add", ["m2", "m3"]),
        ("retrieve", "What did Bob paint and sell?", 4, 1),
        ("retrieve", "Cats?", 4, 1),
    ]
    rows = {r.query_id: r for r in res.methods["rec"].queries}
    assert np.isnan(rows["q0"].evidence_recall) and rows["q0"].n_hits == 0
    assert rows["q1"].retrieved_source_ids == ["m1"] and rows["q1"].evidence_recall == 1.0
    assert rows["q1"].answer_token_recall == 1.0  # "beach" in "Ann: Luna loves the beach"
    assert rows["q1"].returned_tokens == 6  # Ann : Luna loves the beach
    assert rows["q2"].evidence_recall == 0.5 and rows["q2"].span_recall == 0.5
    assert rows["q2"].subtree_recall == 0.5  # leaf hits: every figure the same
    assert rows["q3"].retrieved_source_ids == ["m0"]  # no known token: first turn by insertion order
    assert rows["q3"].evidence_recall == 0.0 and rows["q3"].position == 4
    overall = res.methods["rec"].overall
    assert overall["evidence_recall"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    cats = res.methods["rec"].by_category
    assert cats["1"]["evidence_recall"] == pytest.approx(0.5) and cats["2"]["evidence_recall"] == 0.5
    d = res.to_dict()
    assert d["methods"]["rec"]["queries"][0]["evidence_recall"] is None
    assert d["methods"]["rec"]["n_queries"] == 4 and res.methods["rec"].messages == 4
    with pytest.raises(InvalidInputError):
        evaluate_online(_conv(), {}, progress=False)
    with pytest.raises(InvalidInputError):
        evaluate_online(_conv(), {"rec": Recorder}, k=0, progress=False)
