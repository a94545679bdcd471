"""Summary vectors composed from sentence vectors (``annotation_vectors="composed"``).

An extractive summary is made of its children's sentences, whose vectors the summariser already has, so
its vector is the normalised mean of theirs and an add embeds only its message (and the message's
sentences when it has several).
"""

from __future__ import annotations

import numpy as np
import pytest

from shared_core import HAT, MemTree, SegTreeMem
from shared_core.models.extractive import ExtractiveSummarizer
from shared_core.types import InvalidInputError, UnknownPolicyError
from tests.support.memory import CountingEmbedder, HashEmbedder, make_memory
from tests.support.vectors import check_node_vectors


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_compose_is_the_normalised_mean_of_the_sentence_vectors():
    emb = CountingEmbedder()
    s = ExtractiveSummarizer(emb)
    s.warm(["Dogs bark. Cats sleep."])
    assert emb.seen == ["Dogs bark.", "Cats sleep."]
    vecs, usage = s.compose(["Dogs bark. Cats sleep.", "Cats sleep."])
    a, b = (_unit(emb.embed([t])[0]) for t in ("Dogs bark.", "Cats sleep."))
    np.testing.assert_allclose(vecs[0], _unit(a + b), atol=1e-6)
    np.testing.assert_allclose(vecs[1], b, atol=1e-6)
    assert usage.embedded_texts == 0  # every sentence was cached
    emb.seen.clear()
    _, usage = s.compose(["Birds sing. Dogs bark."])
    assert emb.seen == ["Birds sing."] and usage.embedded_texts == 1  # only the unseen sentence
    with pytest.raises(InvalidInputError):
        s.compose(["  "])


def test_seeded_one_sentence_texts_are_not_embedded_again():
    emb = CountingEmbedder()
    s = ExtractiveSummarizer(emb)
    texts = ["Dogs bark.", "Cats sleep. Birds sing."]
    given = np.stack([_unit(emb.embed([t])[0]) for t in texts])
    emb.seen.clear()
    s.seed(texts, given)
    s.warm(texts)
    assert emb.seen == ["Cats sleep.", "Birds sing."]  # the one-sentence text was not embedded again


@pytest.mark.parametrize("cls", [SegTreeMem, HAT, MemTree])
def test_an_add_embeds_only_its_message(cls):
    emb = CountingEmbedder()
    mem = cls(embedder=emb, annotation_vectors="composed")
    texts = [f"Note {i} about {t}." for i, t in enumerate(["dogs", "cats", "dogs", "tea", "cats", "tea"] * 4)]
    for t in texts:
        mem.add(t)
    assert sorted(emb.seen) == sorted(texts)  # no summary text was embedded
    assert mem.stats()["nodes"] > len(texts)  # there are summaries, and they have vectors
    check_node_vectors(mem, sorted(mem._index.ids.tolist()), HashEmbedder())
    paper = cls(embedder=CountingEmbedder(), annotation_vectors="embedded")
    for t in texts:
        paper.add(t)
    assert len(paper.embedder.seen) > len(texts)  # the papers' construction embeds every summary
    check_node_vectors(paper, sorted(paper._index.ids.tolist()), HashEmbedder())


def test_choices_defaults_and_old_saves(tmp_path):
    with pytest.raises(UnknownPolicyError, match="annotation_vectors"):
        SegTreeMem(embedder=HashEmbedder(), annotation_vectors="mean")  # type: ignore[arg-type]
    # defaults: composed, which retrieves as well as the papers' embedded vectors (docs/performance.md)
    defaults = {k: make_memory(k).annotation_vectors for k in ("segtree", "memtree", "hat", "xmemory")}
    assert defaults == dict(segtree="composed", memtree="composed", hat="composed", xmemory="composed")
    x = make_memory("xmemory")
    x_old = {k: v for k, v in x._config().items() if k != "annotation_vectors"}
    assert type(x).stored_config(x_old)["annotation_vectors"] == "embedded"  # an xMemory saved before
    mem = make_memory("segtree", annotation_vectors="composed")
    mem.add(["Dogs bark.", "Cats sleep."])
    assert mem._config()["annotation_vectors"] == "composed"
    old = {k: v for k, v in mem._config().items() if k != "annotation_vectors"}
    assert SegTreeMem.stored_config(old)["annotation_vectors"] == "embedded"  # saved before the option
    mem.save(tmp_path / "m")
    back = SegTreeMem.load(tmp_path / "m", embedder=HashEmbedder())
    assert back.annotation_vectors == "composed"


def test_a_summariser_on_another_embedder_is_not_composed():
    emb = CountingEmbedder()
    mem = HAT(embedder=emb, summarizer=ExtractiveSummarizer(HashEmbedder()))
    for t in ["Dogs bark.", "Cats sleep.", "Dogs run.", "Tea is hot."]:
        mem.add(t)
    assert len(emb.seen) > 4  # summaries embedded by the memory's own embedder
