"""The evaluation data's reference figures (``shared/data/README.md``) reproduced by the flat baselines on the
whole LoCoMo dev split and the RealMem dialogue, with the real embedded embedder (minutes on 2 cores).

The figures were measured with all-MiniLM-L6-v2, bm25s and PyStemmer on messages rendered as
``"<speaker>: <text>"`` (LoCoMo image captions appended as ``" [shares a photo: <caption>]"``), bm25s'
English stop words in both BM25 variants, top-10 turns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from shared_core.eval import (
    FlatBM25,
    FlatDense,
    FlatFusion,
    FlatHybridRRF,
    evaluate_online,
    load_locomo,
    load_realmem,
    render_message,
)
from shared_core.models.local import LocalEmbedder
from tests.support import SHARED_DATA as DATA

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
        "fusion": lambda: FlatFusion(emb),
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
    methods = {
        "dense": lambda: FlatDense(emb),
        "bm25_stemmed": lambda: FlatBM25(stem=True),
        "rrf_stemmed": lambda: FlatHybridRRF(emb, stem=True),
        "fusion": lambda: FlatFusion(emb),
    }
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
        ("fusion", "evidence_recall", 0.621),
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
@pytest.mark.parametrize(
    "method, reference",
    [("dense", 0.492), ("bm25_stemmed", 0.500), ("rrf_stemmed", 0.551), ("fusion", 0.561)],
)
def test_realmem_reference_figures(realmem_result, method, reference):
    r = realmem_result.methods[method]
    assert len(r.queries) == 153
    assert r.overall["evidence_recall"] == pytest.approx(reference, abs=0.01)
