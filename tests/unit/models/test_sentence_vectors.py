"""Sentence vectors pooled from the message's own forward pass (``ExtractiveSummarizer(sentence_vectors=)``).

A memory that embeds a message with an embedder offering ``embed_spans`` gets its sentences' vectors
from the same call, so the extractive summariser never embeds a message's sentences again. The plumbing
is checked with a deterministic stub whose span vectors are the spans embedded alone (so every node
vector can be recomputed independently); the pooling itself with the real model.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core import HAT, MemTree, SegTreeMem
from shared_core.eval.runner import CachingEmbedder
from shared_core.models.extractive import (
    _SENT_RE,
    ExtractiveSummarizer,
    join_sentences,
    sentence_spans,
    split_sentences,
)
from shared_core.models.local import pool_spans
from shared_core.types import InvalidInputError, UnknownPolicyError
from tests.support.memory import CountingEmbedder, HashEmbedder, SpanEmbedder
from tests.support.vectors import check_node_vectors

TEXT = st.text(alphabet=st.sampled_from(list("aB7 .!?\n\t\"'([")), max_size=60)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_sentence_spans_locate_the_split_sentences(text):
    reference = [s.strip() for s in _SENT_RE.split(text) if s and s.strip()]  # the former splitter
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == reference == split_sentences(text)
    assert all(a < b for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # in order, disjoint


def test_pool_spans_by_hand():
    # tokens: [CLS] "Dogs" "bark" "." "Cats" "." [SEP] [PAD]; text "Dogs bark. Cats."
    states = np.array([[9, 9], [1, 0], [3, 0], [2, 0], [0, 4], [0, 2], [9, 9], [7, 7]], dtype=np.float32)
    offsets = [(0, 0), (0, 4), (5, 9), (9, 10), (11, 15), (15, 16), (0, 0), (0, 0)]
    got = pool_spans(states, offsets, [(0, 10), (11, 16), (20, 25)])
    np.testing.assert_allclose(got[0], [1.0, 0.0])  # mean (2, 0): special tokens left out
    np.testing.assert_allclose(got[1], [0.0, 1.0])  # mean (0, 3)
    assert not np.any(got[2])  # no token inside: a row of zeros


@pytest.mark.parametrize("cls", [SegTreeMem, HAT, MemTree])
def test_an_add_embeds_its_message_once(cls):
    emb = SpanEmbedder()
    pooled = ExtractiveSummarizer(emb, sentence_vectors="pooled")
    mem = cls(embedder=emb, summarizer=pooled, annotation_vectors="composed")
    topics = ["dogs", "cats", "dogs", "tea", "cats", "tea"] * 4
    texts = [f"Note {i} about {t}. It was long! More on {t} later." for i, t in enumerate(topics)]
    for t in texts:
        mem.add(t)
    assert emb.seen == texts  # one embedding per message: no sentence, no summary embedded alone
    assert emb.span_calls == len(texts)
    # the stub's pooled sentence vectors are the sentences embedded alone: every vector recomputable
    check_node_vectors(mem, sorted(mem._index.ids.tolist()), HashEmbedder())
    emb2 = SpanEmbedder()
    summ2 = ExtractiveSummarizer(emb2, sentence_vectors="pooled")
    batch = cls(embedder=emb2, summarizer=summ2, annotation_vectors="composed")
    batch.add(texts)
    assert batch.embedder.seen == texts  # a batched add: one call for every message and sentence


def test_embedded_sentence_vectors_embed_each_sentence_alone():
    emb = SpanEmbedder()
    embedded = ExtractiveSummarizer(emb)  # the summariser's default: sentences embedded alone
    mem = SegTreeMem(embedder=emb, summarizer=embedded, annotation_vectors="composed")
    assert mem.summarizer.sentence_vectors == "embedded"
    texts = [f"Note {i} about dogs. It was long! More on dogs later." for i in range(6)]
    for t in texts:
        mem.add(t)
    assert emb.span_calls == 0
    assert "It was long!" in emb.seen  # the sentences were embedded on their own
    check_node_vectors(mem, sorted(mem._index.ids.tolist()), HashEmbedder())


def test_defaults_per_memory():
    from shared_core import XMemory

    emb = SpanEmbedder()
    got = {
        c.__name__: (c(embedder=emb).summarizer.sentence_vectors, c(embedder=emb).annotation_vectors)
        for c in (SegTreeMem, MemTree, HAT, XMemory)
    }
    assert got == {
        "SegTreeMem": ("pooled", "composed"),
        "MemTree": ("pooled", "composed"),
        "HAT": ("pooled", "composed"),
        "XMemory": ("pooled", "composed"),
    }
    assert ExtractiveSummarizer(emb).sentence_vectors == "embedded"
    x = XMemory(embedder=emb)
    texts = [
        f"Day {i}: I walked the dog in Paris. It rained on Monday! We met Anna at 5 pm." for i in range(8)
    ]
    for t in texts:
        x.add(t)
    assert emb.seen[: len(texts)] == texts and emb.span_calls >= len(texts)
    assert not any(t in emb.seen for t in ("It rained on Monday!", "We met Anna at 5 pm."))


def test_warm_pools_when_it_can():
    emb = SpanEmbedder()
    s = ExtractiveSummarizer(emb, sentence_vectors="pooled")
    usage = s.warm(["Dogs bark. Cats sleep.", "Dogs bark. Cats sleep."])
    assert emb.seen == ["Dogs bark. Cats sleep."] and usage.embed_calls == 1
    assert s.warm(["Cats sleep."]).embed_calls == 0  # cached from the first text's pass
    plain = CountingEmbedder()
    ExtractiveSummarizer(plain).warm(["Dogs bark. Cats sleep."])
    assert plain.seen == ["Dogs bark.", "Cats sleep."]  # no embed_spans: each sentence alone


def test_seed_checks_its_rows_and_skips_cut_off_sentences():
    emb = CountingEmbedder()
    s = ExtractiveSummarizer(emb, sentence_vectors="pooled")
    text = "Dogs bark. Cats sleep."
    with pytest.raises(InvalidInputError, match="2 sentences"):
        s.seed([text], emb.embed([text]), [np.ones((3, emb.dim))])
    rows = np.zeros((2, emb.dim), dtype=np.float32)
    rows[0, 0] = 1.0
    s.seed([text], emb.embed([text]), [rows])
    emb.seen.clear()
    s.warm([text])
    assert emb.seen == ["Cats sleep."]  # the zero row (cut off) was not cached
    with pytest.raises(UnknownPolicyError, match="sentence_vectors"):
        ExtractiveSummarizer(emb, sentence_vectors="mean")


def test_caching_embedder_memoises_spans():
    base = SpanEmbedder()
    cache = CachingEmbedder(base)
    cache.prime(["Dogs bark. Cats sleep."])
    vecs, parts = cache.embed_spans(["Dogs bark. Cats sleep."], [sentence_spans("Dogs bark. Cats sleep.")])
    assert base.span_calls == 1 and cache.hits == 1
    np.testing.assert_allclose(
        parts[0][1], base.vector("Cats sleep.") / np.linalg.norm(base.vector("Cats sleep."))
    )
    np.testing.assert_allclose(vecs[0], cache.embed(["Dogs bark. Cats sleep."])[0])
    plain = CachingEmbedder(HashEmbedder())
    v, p = plain.embed_spans(["a b."], [[(0, 4)]])
    assert p is None and v.shape == (1, 32)


def test_xmemory_theme_summaries_reuse_their_facts_vectors(tmp_path):
    """A theme's summary is made of its facts' stored texts ("[date] speaker: sentence"); composing its
    vector takes each fact's own vector (its "speaker: sentence" key's) instead of embedding the dated
    text again."""
    from shared_core import XMemory
    from shared_core.memories.xmemory.memory import SEMANTIC, THEME
    from shared_core.types import Message

    emb = SpanEmbedder()
    x = XMemory(embedder=emb, max_episode_messages=3, dedup_threshold=1.0)  # every fact its own semantic
    for i in range(9):
        day = f"2024-01-0{1 + i // 3}T10:00"
        x.add(Message(f"I walked the dog in Paris on day {i} with Anna.", speaker="Ben", timestamp=day))
    x.flush()
    nodes = x._store.nodes.values()
    facts = {n.text: n.id for n in nodes if n.level == SEMANTIC}
    assert len(facts) == 9 and all(t.startswith("[") for t in facts)
    assert not any(t in emb.seen for t in facts)  # the dated fact texts were never embedded
    themes = [n for n in nodes if n.level == THEME and len(n.children) > 1]
    assert themes
    for th in themes:
        parts = split_sentences(th.text)
        assert set(parts) <= set(facts)
        want = x._index.get([facts[p] for p in parts]).mean(axis=0)
        assert np.allclose(x._index.get([th.id])[0], want / np.linalg.norm(want), atol=1e-5)
    # a memory loaded from a save composes its themes the same way as one that was never saved
    path = x.save(tmp_path / "x")
    # (these attach to the themes above, whose summaries are then composed again)
    more = [
        Message(
            f"I walked the dog in Paris on day {i} with Anna today.",
            speaker="Ben",
            timestamp="2024-02-01T10:00",
        )
        for i in range(4)
    ]
    y = XMemory.load(path, embedder=emb)
    for mem in (x, y):
        mem.add(more)
        mem.flush()
    assert not any(t in emb.seen for t in facts)
    for th in (n for n in x._store.nodes.values() if n.level == THEME):
        assert np.allclose(x._index.get([th.id])[0], y._index.get([th.id])[0], atol=1e-6)


@settings(max_examples=400, deadline=None)
@given(st.lists(TEXT, max_size=6))
def test_joined_sentences_split_back_into_themselves(texts):
    sentences = [s for t in texts for s in split_sentences(t)]
    assert split_sentences(join_sentences(sentences)) == sentences


def test_a_summary_of_summaries_embeds_no_run_on_sentence():
    """Unpunctuated list items and lower-case turns joined in a summary split back into themselves, so a
    parent's summary needs no vector of a sentence that no message holds."""
    emb = CountingEmbedder()
    s = ExtractiveSummarizer(emb, max_chars=80)
    kids = [
        ["user: what to pack for the trip\nwarm socks and boots", "assistant: Take a coat?\nuser: yes do"],
        ["user: which train to take\nthe early one", "assistant: Book seats?\nuser: yes two seats"],
    ]
    s.summarize([s.summarize(k)[0] for k in kids])
    assert set(emb.seen) <= {x for k in kids for t in k for x in split_sentences(t)}
