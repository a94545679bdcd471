"""MemTree's path summaries re-embedded only when drifted (``reembed_cosine``, memories/memtree_vectors.py).

- By hand: a rewritten summary whose composed vector stays within ``reembed_cosine`` of its anchor's is
  not embedded; its vector is ``normalise(e_a + c - c_a)``, computed here from the embedder directly;
  ``reembed_cosine=None`` (and 1.0 for a changed text) embeds it, as the paper does.
- A property test over random adds and deletes (hashed embedder): every summary's stored vector is its
  text embedded or its anchor moved by the composed change (with the cosine at or above the threshold),
  and every anchor is the composed and the embedded vector of one text the embedder was given.
- A deletion embeds every rewritten ancestor exactly and keeps no anchor of it; a failed add, a load
  and ``clear()`` drop the anchors; the option round-trips through save / load, old saves and
  ``from_config`` get ``None``; out-of-range values are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_core import InvalidInputError, Message
from shared_core.memories.memtree import MemTree
from shared_core.memories.memtree_vectors import anchored_vector
from shared_core.models.extractive import ExtractiveSummarizer, split_sentences
from tests.support.memory import HashEmbedder, check_tree, message_text


class RecordingEmbedder(HashEmbedder):
    """:class:`HashEmbedder` that records every text it embeds; fails on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.fail_on: str | None = None

    def embed(self, texts: Any) -> np.ndarray:
        texts = list(texts)
        if self.fail_on is not None and any(self.fail_on in t for t in texts):
            raise RuntimeError("embedder down")
        self.seen.extend(texts)
        return super().embed(texts)


def unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return (v / np.linalg.norm(v)).astype(np.float32)


def embedded(emb: HashEmbedder, text: str) -> np.ndarray:
    return unit(HashEmbedder(emb.dim).vector(text))


def composed(emb: HashEmbedder, text: str) -> np.ndarray:
    ref = HashEmbedder(emb.dim)
    return unit(np.mean([unit(ref.vector(s)) for s in split_sentences(text)], axis=0))


def three_about_dogs(mem: MemTree) -> int:
    """Adds three dog messages so that the third rewrites the summary made by the second; returns its id."""
    mem.add("Dogs bark at night. The dog park is busy.")
    mem.add("Dogs bark at the mailman. The dog park opens at nine.")
    (summary,) = [n.id for n in mem._store.nodes.values() if n.text and not n.is_leaf]
    mem.add("Dogs bark at cats. The dog park has a pond.")
    return summary


def test_a_rewritten_summary_within_the_cosine_is_moved_not_embedded():
    emb = RecordingEmbedder()
    mem = MemTree(
        emb, base_threshold=-1.0, summary_chars=600, reembed_cosine=0.01, annotation_vectors="embedded"
    )
    summary = three_about_dogs(mem)
    node = mem._store.nodes[summary]
    # the first two messages fit the budget: the summary they made was their concatenation
    old = "Dogs bark at night. The dog park is busy. Dogs bark at the mailman. The dog park opens at nine."
    assert node.text != old and node.text not in emb.seen  # rewritten, and not embedded
    c_a, e_a = composed(emb, old), embedded(emb, old)
    want = anchored_vector((c_a, e_a), composed(emb, node.text))
    np.testing.assert_allclose(mem._index.get([summary])[0], want, atol=1e-5)
    # by hand: the same vector from the definition
    by_hand = unit(e_a.astype(np.float64) + composed(emb, node.text) - c_a)
    np.testing.assert_allclose(want, by_hand, atol=1e-6)
    assert float(composed(emb, node.text) @ c_a) >= 0.01


@pytest.mark.parametrize("cosine", [None, 1.0])
def test_the_papers_rule_embeds_every_rewritten_summary(cosine):
    emb = RecordingEmbedder()
    mem = MemTree(
        emb, base_threshold=-1.0, summary_chars=600, reembed_cosine=cosine, annotation_vectors="embedded"
    )
    summary = three_about_dogs(mem)
    text = mem._store.nodes[summary].text
    assert text in emb.seen
    np.testing.assert_allclose(mem._index.get([summary])[0], embedded(emb, text), atol=1e-5)


TEXTS = st.lists(st.integers(0, 40), min_size=2, max_size=14)


def check_anchored(mem: MemTree, emb: RecordingEmbedder) -> None:
    """Each summary's vector is its text embedded or its anchor moved; each anchor is an embedded text's."""
    st_ = mem._store
    assert set(mem._anchors) <= {n.id for n in st_.nodes.values() if not n.is_leaf}
    seen = {t: (composed(emb, t), embedded(emb, t)) for t in dict.fromkeys(emb.seen) if split_sentences(t)}
    for c_a, e_a in mem._anchors.values():
        assert any(
            np.allclose(c_a, c, atol=1e-5) and np.allclose(e_a, e, atol=1e-5) for c, e in seen.values()
        ), "an anchor that is no text's"
    for n in st_.nodes.values():
        if not n.text or n.is_leaf:
            continue
        row = mem._index.get([n.id])[0]
        if np.allclose(row, embedded(emb, n.text), atol=1e-5):
            continue
        anchor = mem._anchors.get(n.id)
        assert anchor is not None, f"summary {n.id}: neither embedded nor anchored"
        c = composed(emb, n.text)
        assert float(c @ anchor[0]) >= mem.reembed_cosine - 1e-5  # type: ignore[operator]
        np.testing.assert_allclose(row, anchored_vector(anchor, c), atol=1e-5)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    adds=TEXTS,
    deletes=st.lists(st.integers(0, 100), max_size=4),
    cosine=st.sampled_from([0.3, 0.8, 0.95]),
    chars=st.sampled_from([80, 200]),
)
def test_every_vector_is_embedded_or_moved_from_an_embedded_anchor(adds, deletes, cosine, chars):
    emb = RecordingEmbedder()
    mem = MemTree(
        emb, base_threshold=0.1, summary_chars=chars, reembed_cosine=cosine, annotation_vectors="embedded"
    )
    for i, k in enumerate(adds):
        mem.add(Message(message_text(k), id=f"m{i}"))
    check_anchored(mem, emb)
    live = [f"m{i}" for i in range(len(adds))]
    for d in deletes:
        if not live:
            break
        key = live.pop(d % len(live))
        leaf = mem._store.by_source[key][0]
        above = [a for a in mem._store.ancestors(leaf) if a != mem._store.root]
        mem.delete(key)
        for a in above:  # every ancestor left is rewritten from the live children and embedded exactly
            if a in mem._store.nodes and mem._store.nodes[a].text:
                assert a not in mem._anchors
                np.testing.assert_allclose(
                    mem._index.get([a])[0], embedded(emb, mem._store.nodes[a].text), atol=1e-5
                )
        check_anchored(mem, emb)
    check_tree(mem, [message_text(k) for i, k in enumerate(adds) if f"m{i}" in live], deleted=bool(deletes))


def test_a_failed_add_leaves_the_tree_and_drops_the_anchors():
    emb = RecordingEmbedder()
    mem = MemTree(
        emb, base_threshold=-1.0, summary_chars=600, reembed_cosine=0.01, annotation_vectors="embedded"
    )
    summary = three_about_dogs(mem)
    assert summary in mem._anchors
    before = mem.to_dict()
    vec = mem._index.get([summary])[0].copy()
    emb.fail_on = "walrus"
    with pytest.raises(Exception, match="embedder down"):
        mem.add("Dogs bark at a walrus. The dog park is closed.")
    assert mem.to_dict() == before and np.array_equal(mem._index.get([summary])[0], vec)
    assert mem._anchors == {}  # the next rewrite of each summary embeds it
    emb.fail_on = None
    mem.add("Dogs bark at ducks. The dog park is open.")
    text = mem._store.nodes[summary].text
    assert text in emb.seen
    np.testing.assert_allclose(mem._index.get([summary])[0], embedded(emb, text), atol=1e-5)


def test_options_round_trip_old_saves_and_errors(tmp_path):
    mem = MemTree(HashEmbedder(), reembed_cosine=0.8)
    three_about_dogs(mem)
    mem.save(tmp_path / "m")
    back = MemTree.load(tmp_path / "m", embedder=HashEmbedder())
    assert back.reembed_cosine == 0.8 and back._anchors == {}  # anchors are not saved
    assert MemTree(HashEmbedder()).reembed_cosine == 0.95
    old = {k: v for k, v in mem._config().items() if k != "reembed_cosine"}
    assert MemTree.stored_config(old)["reembed_cosine"] is None  # saved before the option: the paper's
    assert MemTree.from_config({}, embedder=HashEmbedder()).reembed_cosine is None
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), True, "0.9"):
        with pytest.raises(InvalidInputError, match="reembed_cosine"):
            MemTree(HashEmbedder(), reembed_cosine=bad)
    mem.clear()
    assert mem._anchors == {}


@pytest.mark.parametrize("kind", ["other_embedder", "composed"])
def test_without_composition_on_the_memorys_embedder_every_summary_is_embedded(kind):
    """A summariser that does not compose with the memory's embedder (as an LLM aggregate), or composed
    summary vectors: no anchors, every summary's vector its rule's own."""
    emb = RecordingEmbedder()
    if kind == "other_embedder":
        mem = MemTree(emb, base_threshold=-1.0, summarizer=ExtractiveSummarizer(HashEmbedder()))
    else:
        mem = MemTree(emb, base_threshold=-1.0, annotation_vectors="composed")
    summary = three_about_dogs(mem)
    text = mem._store.nodes[summary].text
    assert mem._anchors == {}
    want = embedded(emb, text) if kind == "other_embedder" else composed(emb, text)
    np.testing.assert_allclose(mem._index.get([summary])[0], want, atol=1e-5)
    assert (text in emb.seen) == (kind == "other_embedder")
