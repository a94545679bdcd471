"""A bulk ``add`` embeds each distinct text once: the messages, their sentences and the summaries together
(counted through the embedder)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.memory import KINDS, CountingEmbedder, SpanEmbedder, make_memory, message_text


@pytest.mark.parametrize("kind", KINDS)
def test_a_bulk_add_embeds_no_text_twice(kind):
    emb = CountingEmbedder()
    mem = make_memory(kind, emb)
    texts = [message_text(i) for i in range(60)] + ["Short one.", "Short one. And a second sentence."]
    report = mem.add(texts)
    assert len(emb.seen) == len(set(emb.seen)), [t for t in set(emb.seen) if emb.seen.count(t) > 1][:3]
    assert report.usage.embedded_texts == len(emb.seen)
    assert set(texts) <= set(emb.seen)  # every message embedded, once


@pytest.mark.parametrize("kind", ["segtree", "memtree", "hat"])
def test_the_defaults_embed_a_bulk_add_as_its_messages_once(kind):
    """With an embedder that pools sentence vectors from the message's pass (the embedded default), the
    default constructor embeds each message once and nothing else: no sentence, no summary."""
    emb = SpanEmbedder()
    mem = make_memory(kind, emb)
    texts = [message_text(i) for i in range(60)]
    report = mem.add(texts)
    assert emb.seen == texts and emb.span_calls == 1
    assert report.usage.embedded_texts == len(texts)
    assert len(mem._store) > len(texts)  # summaries were made, composed from the pooled vectors


class CutOffSpanEmbedder(SpanEmbedder):
    """SpanEmbedder whose model sees 40 characters: a sentence starting past them gets a row of zeros."""

    def embed_spans(self, texts, spans):
        vecs, parts = super().embed_spans(texts, spans)
        return vecs, [np.where(np.array([[a >= 40] for a, _ in sp]), 0.0, p) for p, sp in zip(parts, spans)]


@pytest.mark.parametrize("kind", ["segtree", "memtree"])
def test_a_message_longer_than_the_model_input_is_embedded_once(kind):
    """Its sentences past the input length are embedded alone; the message is not embedded again."""
    emb = CutOffSpanEmbedder()
    mem = make_memory(kind, emb)
    texts = [f"{message_text(i)} A third sentence about {i}." for i in range(20)]
    mem.add(texts)
    assert [t for t in texts if emb.seen.count(t) != 1] == []
    assert "A third sentence about 3." in emb.seen  # past the input: embedded alone
