"""LexicalIndex.above and common_bound: the BM25 scores above a level, and what a word of most texts adds.

Differential against the straightforward filter of ``scores`` on random corpora in which one word is in
every text (a speaker's name rendered into every message).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shared_core.search.lexical import LexicalIndex
from shared_core.types import InvalidInputError

WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron"]
NAME = "zelda"

corpora = st.lists(st.lists(st.sampled_from(WORDS), max_size=6), min_size=1, max_size=30)
queries = st.lists(st.sampled_from([*WORDS, NAME, "nowhere"]), min_size=1, max_size=5)


def _index(docs: list[list[str]], every: bool, removed: int) -> tuple[LexicalIndex, list[int]]:
    idx = LexicalIndex(stem=False, stopwords=None)
    ids = [3 * i + 1 for i in range(len(docs))]
    idx.upsert(ids, [" ".join(([NAME] if every else []) + d) for d in docs])
    gone = ids[:removed]
    idx.remove(gone)
    return idx, [i for i in ids if i not in gone]


@settings(max_examples=150, deadline=None)
@given(docs=corpora, query=queries, every=st.booleans(), removed=st.integers(0, 3), level=st.floats(0, 3))
def test_above_is_the_filter_of_every_score(docs, query, every, removed, level):
    idx, _ = _index(docs, every, removed)
    q = " ".join(query)
    ids, sc = idx.scores(q)
    for lv in (level, idx.common_bound(q), 0.0):
        assume(lv == 0.0 or not np.any(np.isclose(sc, lv, rtol=1e-5, atol=0)))  # float32 vs float64
        got_ids, got, rest = idx.above(q, lv)
        want = sorted((int(i), s) for i, s in zip(ids.tolist(), sc) if s > lv)
        assert got_ids.tolist() == [i for i, _ in want] and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.asarray([s for _, s in want], dtype=np.float32))
        others = sc[sc <= lv]
        best = float(others.max()) if len(others) else 0.0
        bound = idx.common_bound(q)
        # exact, or (scored at the rare words' texts only) the common words' bound above it
        assert rest == best or (0 < bound <= lv and len(got_ids) and rest == float(np.float32(bound)) >= best)
    assert idx.nonzero(q)[0].tolist() == sorted(i for i, s in zip(ids.tolist(), sc) if s > 0)


@settings(max_examples=150, deadline=None)
@given(docs=corpora, query=queries, every=st.booleans(), removed=st.integers(0, 3))
def test_common_bound_is_above_what_common_words_add(docs, query, every, removed):
    idx, live = _index(docs, every, removed)
    q = " ".join(query)
    N = len(live)
    held = {w: sum(w in d for d in docs[removed:]) + (N if every and w == NAME else 0) for w in set(query)}
    common = [w for w in query if held.get(w, 0) > N / 2 and N]
    bound = idx.common_bound(q)
    want = sum(math.log(1 + (N - held[w] + 0.5) / (held[w] + 0.5)) for w in common)
    assert bound == pytest.approx(want, rel=1e-9, abs=0.0)
    only = " ".join(common)
    if common:  # every text's score for the common words alone is below the bound
        assert np.all(idx.scores(only)[1] < np.float32(bound) * (1 + 1e-6))
        got_ids, _, _ = idx.above(q, bound)
        rare = set(query) - set(common)
        for i, d in zip(range(len(docs)), docs):
            if 3 * i + 1 in live and not rare & set(d):  # nothing but common words of the query
                assert 3 * i + 1 not in got_ids.tolist()


def test_a_word_in_every_text_adds_about_nothing():
    idx = LexicalIndex(stem=False, stopwords=None)
    n = 1000
    idx.upsert(list(range(n)), [f"{NAME} w{i}" for i in range(n)])
    bound = idx.common_bound(f"{NAME} w7")
    assert bound == pytest.approx(math.log(1 + 0.5 / (n + 0.5)))  # idf of a word of every text: ~0.5 / N
    ids, sc, rest = idx.above(f"{NAME} w7", bound)
    assert ids.tolist() == [7] and 0 < rest < bound
    assert idx.common_bound("w7") == 0.0 and idx.common_bound("") == 0.0
    assert LexicalIndex().common_bound(NAME) == 0.0 and LexicalIndex().above(NAME, 0.0)[2] == 0.0
    with pytest.raises(InvalidInputError):
        idx.common_bound(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        idx.above(3, 0.0)  # type: ignore[arg-type]


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "remove"]),
        st.integers(0, 12),
        st.lists(st.sampled_from(WORDS), max_size=5),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(ops=ops, query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), speakers=st.integers(1, 3))
def test_scores_over_common_words_read_sparsely_equal_every_score(ops, query, speakers):
    """Queries interleaved with replacements and removals: what ``above`` and ``scores_for`` give at the
    level of the query's common words (read at the slots of its rare words, the common words' counts
    kept per slot) is bitwise what scoring every text gives."""
    idx = LexicalIndex(stem=False, stopwords=None)
    names = [NAME, "yusuf", "xavia"][:speakers]
    q = " ".join([names[0], *query])
    for step, (op, i, words) in enumerate(ops):
        if op == "put":  # the name of one speaker in every text, most of them the first's
            idx.upsert([i], [" ".join([names[step % 5 % speakers], *words])])
        else:
            idx.remove([i])
        if step % 3:
            continue
        level = idx.common_bound(q)
        got_ids, got, rest = idx.above(q, level)
        ids, sc = idx.scores(q)  # every text's score, from scratch
        check = LexicalIndex(stem=False, stopwords=None)
        texts = {int(i): t for i, t in zip(*_texts(idx))}
        if texts:
            check.upsert(list(texts), list(texts.values()))
            np.testing.assert_array_equal(check.scores_for(q, ids), sc)
        want = [(int(i), s) for i, s in zip(ids.tolist(), sc) if s > level]
        assert got_ids.tolist() == sorted(i for i, _ in want)
        np.testing.assert_array_equal(got, np.asarray([s for _, s in sorted(want)], dtype=np.float32))
        others = sc[sc <= level]
        assert rest >= (float(others.max()) if len(others) else 0.0)
        idx.above(q, level)  # the memo of the sparse scores, then every id through it
        np.testing.assert_array_equal(idx.scores_for(q, ids), sc)


def _texts(idx: LexicalIndex) -> tuple[list[int], list[str]]:
    ids = list(idx._tokens)
    return ids, [" ".join(idx._tokens[i]) for i in ids]
