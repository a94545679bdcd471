"""LexicalIndex: BM25 scores worked by hand, stemming, stop words, lazy rebuilds, edge cases."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_core.search.lexical import LexicalIndex, tokenize
from shared_core.types import InvalidInputError


def _score_of(index: LexicalIndex, query: str) -> dict[int, float]:
    ids, sc = index.scores(query)
    return {int(i): float(s) for i, s in zip(ids, sc)}


def test_lucene_bm25_value_by_hand():
    # N = 2 docs, "dog" in one: idf = ln(1 + (2 - 1 + 0.5) / (1 + 0.5)) = ln 2.
    # Doc 0 has tf = 2, length 3, average length 2: tf / (k1 (1 - b + b * 3/2) + tf) = 2 / 4.0625.
    idx = LexicalIndex(stem=False, stopwords=None)
    idx.upsert([10, 11], ["dog dog cat", "cat"])
    s = _score_of(idx, "dog")
    assert s[10] == pytest.approx(math.log(2) * 2 / 4.0625, rel=1e-5)
    assert s[11] == 0.0


def test_term_in_one_doc_ranks_it_first():
    idx = LexicalIndex()
    idx.upsert([1, 2, 3], ["the cat sat on the mat", "a dog barked at night", "birds fly south"])
    ids, sc = idx.top_k("Which dog barked?", k=3)
    assert ids[0] == 2 and sc[0] > 0
    assert np.all(sc[1:] == 0)
    assert ids.dtype == np.int64 and sc.dtype == np.float32


def test_stemming_matches_plural_only_when_enabled():
    docs = ["I adopted a dog last year", "my cat sleeps all day"]
    stemmed = LexicalIndex(stem=True)
    stemmed.upsert([0, 1], docs)
    plain = LexicalIndex(stem=False)
    plain.upsert([0, 1], docs)
    assert _score_of(stemmed, "dogs")[0] > 0
    assert _score_of(plain, "dogs") == {0: 0.0, 1: 0.0}
    assert tokenize(["dogs running"], stem=True) == [["dog", "run"]]


def test_stop_words_ignored_only_with_a_list():
    docs = ["the the the the end", "a quiet lake"]
    with_sw = LexicalIndex(stem=False, stopwords="en")
    with_sw.upsert([0, 1], docs)
    assert _score_of(with_sw, "the") == {0: 0.0, 1: 0.0}
    without = LexicalIndex(stem=False, stopwords=None)
    without.upsert([0, 1], docs)
    assert _score_of(without, "the")[0] > 0
    # stop words in a query do not change the ranking or scores of its content words
    a = with_sw.scores("the lake")[1]
    b = with_sw.scores("lake")[1]
    np.testing.assert_array_equal(a, b)


def test_updates_in_place_reflect_upserts_and_removes():
    idx = LexicalIndex()
    idx.upsert([0, 1], ["apples are red", "bananas are yellow"])
    idx.upsert([2], ["cherries are red"])
    s = _score_of(idx, "cherries")
    assert s[2] > 0 and len(s) == 3
    idx.upsert([0], ["grapes are green"])  # replace in place
    s = _score_of(idx, "apples")
    assert all(v == 0 for v in s.values())
    assert _score_of(idx, "grapes")[0] > 0
    assert list(idx.scores("x")[0]) == [0, 1, 2]  # replaced id keeps its position
    idx.remove([2, 99])
    assert 2 not in idx and len(idx) == 2
    assert 2 not in _score_of(idx, "cherries")
    idx.upsert([2], ["cherries again"])  # a removed id comes back at the end
    assert list(idx.scores("x")[0]) == [0, 1, 2] and _score_of(idx, "cherries")[2] > 0
    assert idx.compactions == 0


def test_compaction_keeps_order_and_scores():
    idx = LexicalIndex(stem=False, stopwords=None)
    idx.upsert(list(range(5)), [f"w{i} common" for i in range(5)])
    before = idx.scores("common w3")
    for r in range(3000):  # every replacement leaves two dead postings behind
        idx.upsert([r % 5], [f"w{r % 5} common"])
    assert idx.compactions >= 1
    after = idx.scores("common w3")
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_allclose(after[1], before[1], rtol=1e-6)
    assert idx._dead_postings <= max(idx._live_postings, 4096)


def test_empty_index_and_unknown_tokens():
    idx = LexicalIndex()
    ids, sc = idx.scores("anything")
    assert ids.shape == (0,) and sc.shape == (0,) and ids.dtype == np.int64 and sc.dtype == np.float32
    ids, sc = idx.top_k("anything", k=5)
    assert ids.size == 0 and sc.size == 0
    idx.upsert([5, 6], ["alpha beta", "gamma"])
    assert _score_of(idx, "zeta omega") == {5: 0.0, 6: 0.0}
    assert _score_of(idx, "the of and") == {5: 0.0, 6: 0.0}  # only stop words
    assert _score_of(idx, "") == {5: 0.0, 6: 0.0}
    idx.remove([5, 6])
    assert idx.scores("alpha")[0].size == 0


def test_corpus_of_only_stop_words():
    idx = LexicalIndex()
    idx.upsert([0, 1], ["the and of", "a an"])
    assert _score_of(idx, "the") == {0: 0.0, 1: 0.0}
    ids, _ = idx.top_k("the", k=1)
    assert list(ids) == [0]


def test_top_k_subset_ties_and_k():
    idx = LexicalIndex(stem=False)
    idx.upsert([7, 3, 9], ["red car", "blue car", "red red car"])
    ids, sc = idx.top_k("red", k=10)
    assert list(ids) == [9, 7, 3] and sc[0] > sc[1] > sc[2] == 0
    ids, _ = idx.top_k("red", k=2, subset=[3, 7, 1000])
    assert list(ids) == [7, 3]
    ids, _ = idx.top_k("nothing", k=2)
    assert list(ids) == [7, 3]  # ties broken by insertion order
    with pytest.raises(InvalidInputError):
        idx.top_k("red", k=0)


def test_bad_input_leaves_index_unchanged():
    idx = LexicalIndex()
    idx.upsert([0], ["kept"])
    with pytest.raises(InvalidInputError):
        idx.upsert([1, 2], ["one"])
    with pytest.raises(InvalidInputError):
        idx.upsert([1, 1], ["a", "b"])
    with pytest.raises(InvalidInputError):
        idx.upsert(["x"], ["a"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        idx.upsert([1], [None])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        idx.scores(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        LexicalIndex(stopwords="klingon")
    assert len(idx) == 1 and list(idx.scores("kept")[0]) == [0]


def test_concurrent_upserts_and_queries():
    idx = LexicalIndex()

    def work(w: int) -> None:
        for j in range(40):
            idx.upsert([w * 1000 + j], [f"worker{w} item{j} running dogs"])
            idx.scores("dogs")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(idx) == 160
    ids, sc = idx.scores("worker2 run")
    assert ids.size == 160 and np.all(sc > 0)
    assert set(idx.top_k("worker2", k=40)[0].tolist()) == {2000 + j for j in range(40)}


WORDS = ["dog", "dogs", "cat", "running", "runs", "the", "a", "lake", "paint", "painted"]


@settings(max_examples=40, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=6), min_size=1, max_size=8),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
    stem=st.booleans(),
)
def test_positive_score_iff_shared_token(docs, query, stem):
    texts = [" ".join(d) for d in docs]
    idx = LexicalIndex(stem=stem)
    idx.upsert(list(range(len(texts))), texts)
    ids, sc = idx.scores(" ".join(query))
    assert list(ids) == list(range(len(texts)))
    qtok = set(tokenize([" ".join(query)], stem=stem)[0])
    for t, s in zip(tokenize(texts, stem=stem), sc):
        assert s >= 0
        assert (s > 0) == bool(qtok & set(t))
    top, tsc = idx.top_k(" ".join(query), k=3)
    assert np.all(np.diff(tsc) <= 0)
    assert tsc[0] == sc.max()


def _bm25s_reference(texts: dict[int, str], query: str, stem: bool) -> dict[int, float]:
    """A bm25s model built from scratch over the live texts (what the index must equal)."""
    import bm25s

    ids = list(texts)
    toks = tokenize([texts[i] for i in ids], stem=stem)
    if not any(toks):
        return {i: 0.0 for i in ids}
    model = bm25s.BM25()
    model.index(toks, show_progress=False)
    q = [t for t in tokenize([query], stem=stem)[0] if t in model.vocab_dict]
    sc = model.get_scores(q) if q else np.zeros(len(ids))
    return {i: float(s) for i, s in zip(ids, sc)}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "remove"]),
        st.integers(0, 12),
        st.lists(st.sampled_from(WORDS), min_size=0, max_size=7),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, queries=st.lists(st.lists(st.sampled_from(WORDS), max_size=4), min_size=1, max_size=3))
def test_in_place_updates_equal_a_bm25s_model_built_from_scratch(ops, queries):
    # differential: any sequence of upserts (new and replacing) and removals, queried at every step,
    # scores as a bm25s model indexed over the texts present at that step, in the same order
    idx = LexicalIndex(stem=True)
    live: dict[int, str] = {}
    for op, i, words in ops:
        if op == "put":
            idx.upsert([i], [" ".join(words)])
            live[i] = " ".join(words)
        else:
            idx.remove([i])
            live.pop(i, None)
        for q in queries:
            got = _score_of(idx, " ".join(q))
            want = _bm25s_reference(live, " ".join(q), stem=True)
            assert list(got) == list(want)
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6)
            arr = np.asarray(list(live) + [99, -3], dtype=np.int64)
            aligned = idx.scores_for(" ".join(q), arr)
            assert aligned[-2:].tolist() == [0.0, 0.0]
            np.testing.assert_allclose(aligned[:-2], [got[k] for k in live], rtol=1e-6)
            nz_ids, nz = idx.nonzero(" ".join(q))
            assert nz_ids.tolist() == sorted(k for k, v in got.items() if v > 0)
            assert nz.tolist() == [got[k] for k in nz_ids.tolist()]
        # the dead-posting counts (what compaction and the per-term pruning at query time go by)
        gen = idx._slot_gen
        dead = [
            int((g[:n] != gen[s[:n]]).sum()) for s, g, n in zip(idx._post_slot, idx._post_gen, idx._post_n)
        ]
        assert dead == idx._post_dead
        assert sum(dead) == idx._dead_postings


def test_huge_and_negative_ids_align_without_a_dense_map():
    # ids far apart (e.g. hashes) are kept in the dict only: no array of size max(id)
    idx = LexicalIndex()
    idx.upsert([10**12, 5, -7], ["dogs bark loudly", "cats sleep", "dogs run"])
    assert len(idx._slot_by_id) < 100
    s = _score_of(idx, "dogs")
    got = idx.scores_for("dogs", np.array([5, 10**12, -7, 3], dtype=np.int64))
    assert got.tolist() == pytest.approx([0.0, s[10**12], s[-7], 0.0])
    assert s[10**12] > 0 and s[-7] > s[10**12]  # the shorter text with the same term scores higher
