"""Flat baselines and the online evaluation loop; reproduction of the evaluation data's reference figures.

The reference figures (``shared/data/README.md``) were measured with all-MiniLM-L6-v2, bm25s and
PyStemmer on messages rendered as ``"<speaker>: <text>"`` (LoCoMo image captions appended as
``" [shares a photo: <caption>]"``), bm25s' English stop words in both BM25 variants, top-10 turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from shared_core.eval import (
    Conversation,
    FlatBM25,
    FlatDense,
    FlatHybridRRF,
    Query,
    evaluate_online,
    load_locomo,
    load_realmem,
    render_message,
)
from shared_core.models.local import LocalEmbedder
from shared_core.types import EmbeddingError, InvalidInputError, Message

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LOCOMO = DATA / "locomo" / "locomo_dev.json"
REALMEM = DATA / "realmem" / "Kenta_Tanaka_dialogues_256k.json"


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


class PrecomputedEmbedder:
    """LocalEmbedder outputs computed once for a known set of texts (others are embedded on demand)."""

    dim = 384

    def __init__(self, base: LocalEmbedder, texts: Sequence[str]) -> None:
        self.base = base
        uniq = list(dict.fromkeys(texts))
        self.table = dict(zip(uniq, base.embed(uniq)))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            self.table.update(zip(missing, self.base.embed(missing)))
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


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


# --------------------------------------------------------------------------- reference figures
@pytest.fixture(scope="module")
def locomo_result(embedder):
    if not LOCOMO.is_file():
        pytest.skip(f"LoCoMo dev data not found at {LOCOMO}")
    convs = load_locomo(LOCOMO)
    emb = PrecomputedEmbedder(
        embedder,
        [render_message(m) for c in convs for m in c.messages]
        + [q.question for c in convs for q in c.queries],
    )
    methods = {
        "dense": lambda: FlatDense(emb),
        "bm25": lambda: FlatBM25(stem=False),
        "bm25_stemmed": lambda: FlatBM25(stem=True),
        "rrf": lambda: FlatHybridRRF(emb, stem=False),
        "rrf_stemmed": lambda: FlatHybridRRF(emb, stem=True),
    }
    return evaluate_online(convs, methods, k=10, progress=False)


@pytest.fixture(scope="module")
def realmem_result(embedder):
    if not REALMEM.is_file():
        pytest.skip(f"RealMem data not found at {REALMEM}")
    conv = load_realmem(REALMEM)
    emb = PrecomputedEmbedder(
        embedder, [render_message(m) for m in conv.messages] + [q.question for q in conv.queries]
    )
    methods = {"dense": lambda: FlatDense(emb), "bm25_stemmed": lambda: FlatBM25(stem=True)}
    return evaluate_online(conv, methods, k=10, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, metric, reference",
    [
        ("dense", "evidence_recall", 0.456),
        ("bm25", "evidence_recall", 0.511),
        ("bm25_stemmed", "evidence_recall", 0.580),
        ("rrf", "evidence_recall", 0.532),
        ("rrf_stemmed", "evidence_recall", 0.552),
        ("dense", "answer_token_recall", 0.367),
        ("bm25", "answer_token_recall", 0.377),
    ],
)
def test_locomo_reference_figures(locomo_result, method, metric, reference):
    r = locomo_result.methods[method]
    assert len(r.queries) == 231
    assert r.overall[metric] == pytest.approx(reference, abs=0.01)
    assert all(q.n_hits == 10 for q in r.queries)


@pytest.mark.slow
@pytest.mark.parametrize("method, reference", [("dense", 0.492), ("bm25_stemmed", 0.500)])
def test_realmem_reference_figures(realmem_result, method, reference):
    r = realmem_result.methods[method]
    assert len(r.queries) == 153
    assert r.overall["evidence_recall"] == pytest.approx(reference, abs=0.01)
