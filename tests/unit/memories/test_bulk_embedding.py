"""A bulk ``add`` embeds each distinct text once: the messages, their sentences and the summaries together
(counted through the embedder)."""

from __future__ import annotations

import pytest

from tests.support.memory import KINDS, CountingEmbedder, make_memory, message_text


@pytest.mark.parametrize("kind", KINDS)
def test_a_bulk_add_embeds_no_text_twice(kind):
    emb = CountingEmbedder()
    mem = make_memory(kind, emb)
    texts = [message_text(i) for i in range(60)] + ["Short one.", "Short one. And a second sentence."]
    report = mem.add(texts)
    assert len(emb.seen) == len(set(emb.seen)), [t for t in set(emb.seen) if emb.seen.count(t) > 1][:3]
    assert report.usage.embedded_texts == len(emb.seen)
    assert set(texts) <= set(emb.seen)  # every message embedded, once
