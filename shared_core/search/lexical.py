"""A lexical (BM25) index over short texts keyed by integer ids: exact Lucene BM25, updated in place.

Tokenisation is bm25s' (English stop words, PyStemmer's Snowball stemmer); scoring is bm25s' default
(Lucene variant, k1 = 1.5, b = 0.75) computed from postings that an upsert or a removal updates in place,
so a query after an add costs what a query costs: no rebuild. Document frequencies, the number of
documents and the mean document length are kept exact, so the scores equal those of a bm25s model
built from scratch over the same texts (to float32 rounding; ``tests/unit/search/test_lexical.py`` checks it).

How: each text has a slot (its position); each term has a posting array of ``(slot, tf, generation)``.
Replacing a text bumps its slot's generation and appends new postings; the old ones no longer count.
Removing a text kills its slot. Dead postings are dropped by a compaction once they outnumber the live
ones, so the work stays proportional to the live texts (amortised O(tokens) per upsert). No word of a
removed text stays: its terms leave the vocabulary, and the stemmer keeps no word cache.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import bm25s
import numpy as np

from ..arrays import grow, unique_ints
from ..types import InvalidInputError

__all__ = ["COMMON_SHARE", "LexicalIndex", "tokenize"]

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_SCORES = np.zeros(0, dtype=np.float32)
K1 = 1.5
B = 0.75
_MIN_CAP = 4
_DENSE_IDS = 1 << 20  # ids below this (or 4x the texts) also get an array slot for scores_for
#: :meth:`LexicalIndex.common_bound`: a term held by more than this share of the texts is common
COMMON_SHARE = 0.5
_COMPACT_FLOOR = 4096  # dead postings tolerated before a compaction whatever the live count


def _make_stemmer(stem: bool) -> Any:
    """PyStemmer's English stemmer without its word cache (``maxCacheSize`` 0): a cache would keep the
    words of removed texts for the life of the process; bm25s stems each distinct word of a call once,
    so the cache saves no time (docs/performance.md, "The BM25 stemmer keeps no words")."""
    if not stem:
        return None
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("english", 0)


def _tokenize(texts: Sequence[str], stopwords: str | None, stemmer: Any) -> list[list[str]]:
    texts = list(texts)
    if not texts:
        return []
    out = bm25s.tokenize(texts, stopwords=stopwords, stemmer=stemmer, return_ids=False, show_progress=False)
    return [list(t) for t in out]


def tokenize(texts: Sequence[str], *, stem: bool = True, stopwords: str | None = "en") -> list[list[str]]:
    """Tokenise texts exactly as :class:`LexicalIndex` does.

    Lower-cases, keeps tokens of two or more word characters (bm25s' default pattern
    ``(?u)\\b\\w\\w+\\b``), drops stop words, and stems with PyStemmer's English Snowball stemmer when
    ``stem`` is true.

    Args:
        texts: the texts.
        stem: apply the English Snowball stemmer, default ``True``.
        stopwords: a bm25s stop-word list name (``"en"``: its 33 English stop words), or ``None`` for
            none; default ``"en"``.

    Returns:
        One list of string tokens per text (possibly empty).

    References:
        Robertson & Zaragoza (2009), The Probabilistic Relevance Framework: BM25 and Beyond; bm25s
        (Lù, 2024) tokenizer.
    """
    return _tokenize(texts, stopwords, _make_stemmer(stem))


@dataclasses.dataclass(frozen=True)
class _Sparse:
    """A query's scores at the slots holding one of its rare terms (:meth:`LexicalIndex._sparse`)."""

    slots: np.ndarray  # int64, ascending
    scores: np.ndarray  # float64, aligned: the values _score_slots gives these slots
    common: list[tuple[int, float]]  # (term id, times * idf) of its common terms, in query order
    bound: float  # their sum: every other slot scores below it


def _check_query(query: object) -> None:
    if not isinstance(query, str):
        raise InvalidInputError(f"query must be a str, got {type(query).__name__}.")


class LexicalIndex:
    """BM25 index of texts keyed by integer ids (Lucene BM25 as bm25s computes it, k1 = 1.5, b = 0.75).

    Defaults follow LlamaIndex's ``BM25Retriever``: bm25s' English stop words and PyStemmer's English
    Snowball stemmer applied to both documents and queries. ``LexicalIndex(stem=False)`` is bm25s with
    its default tokenisation (English stop words, no stemming); ``stopwords=None`` keeps every token.

    For a query with terms ``t`` (repeated terms count again, as in bm25s), a text ``d`` of ``|d|``
    tokens scores ``sum_t idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))`` with
    ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))`` over the ``N`` stored texts (texts without
    tokens count in ``N`` and ``avgdl``, as they do in a bm25s model built over them).

    Updates are in place: :meth:`upsert` and :meth:`remove` cost O(tokens of the texts touched)
    (amortised; dead postings are compacted away once they outnumber the live ones), and a query costs
    O(postings of its terms + stored texts), never a rebuild.

    Args:
        stem: stem tokens with the English Snowball stemmer, default ``True``.
        stopwords: bm25s stop-word list name (``"en"``) or ``None`` for no stop words, default ``"en"``.

    Raises:
        InvalidInputError: ``stopwords`` is not a list name bm25s knows.

    Thread-safe: one lock guards the postings, the stemmer and the statistics.

    References:
        Robertson & Zaragoza (2009), BM25; Kamphuis et al. (ECIR 2020), "Which BM25 do you mean?"
        (Lucene variant); bm25s (Lù, 2024) ``method="lucene"``; LlamaIndex
        ``llama_index.retrievers.bm25.BM25Retriever`` defaults.
    """

    def __init__(self, stem: bool = True, stopwords: str | None = "en") -> None:
        if stopwords is not None:
            try:
                bm25s.tokenize(["x"], stopwords=stopwords, show_progress=False, return_ids=False)
            except ValueError:
                raise InvalidInputError(
                    f"Unknown stop-word list {stopwords!r}; pass 'en' (English) or None."
                ) from None
        self.stem = bool(stem)
        self.stopwords = stopwords
        self._stemmer = _make_stemmer(self.stem)
        self._tokens: dict[int, list[str]] = {}  # id -> tokens, in first-insertion order
        self._lock = threading.RLock()
        self.compactions = 0  # times the postings were compacted (for tests and benchmarks)
        self._clear_postings()

    def _clear_postings(self) -> None:
        #: ``(query, scores)`` of the last query scored (every slot's, or :class:`_Sparse`); every change
        #: of the texts drops it
        self._slot_memo: tuple[str, np.ndarray | _Sparse] | None = None
        #: term -> float64 (>= slots,): its count in each slot's live text, for the common terms a query
        #: held (:meth:`_tf_of`), kept up to date by every change
        self._tf_map: dict[int, np.ndarray] = {}
        self._vocab: dict[str, int] = {}
        # term -> its postings, one array per column (contiguous for scoring): slot, tf, generation
        self._post_slot: list[np.ndarray] = []  # int64 (cap,)
        self._post_tf: list[np.ndarray] = []  # float64 (cap,): the term's count in the text
        self._post_gen: list[np.ndarray] = []  # int64 (cap,): the slot's generation when posted
        self._post_n: list[int] = []  # term -> postings used
        self._post_dead: list[int] = []  # term -> postings of replaced or removed texts among them
        self._df = np.zeros(0, dtype=np.int64)  # term -> live texts holding it
        self._slot_id = np.zeros(0, dtype=np.int64)  # slot -> id
        self._slot_len = np.zeros(0, dtype=np.float64)  # slot -> tokens
        self._slot_gen = np.zeros(0, dtype=np.int64)  # slot -> generation (-1: dead)
        self._n_slots = 0
        self._slot_of: dict[int, int] = {}
        self._slot_by_id = np.full(0, -1, dtype=np.int64)  # id -> slot for ids in [0, len)
        self._total_len = 0
        self._live_postings = 0
        self._dead_postings = 0

    # ------------------------------------------------------------------ updates
    def upsert(self, ids: Sequence[int], texts: Sequence[str]) -> None:
        """Add texts, or replace the texts of ids already present (they keep their position).

        Args:
            ids: integer ids, one per text, distinct.
            texts: strings.

        Raises:
            InvalidInputError: lengths differ, an id is not an integer or repeats, a text is not a str.
                Nothing is changed in that case.
        """
        ids = list(ids)
        texts = list(texts)
        if len(ids) != len(texts):
            raise InvalidInputError(
                f"upsert got {len(ids)} ids and {len(texts)} texts; pass one id per text."
            )
        clean: list[int] = []
        for i, t in zip(ids, texts):
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise InvalidInputError(f"Lexical ids must be integers, got {type(i).__name__}.")
            if not isinstance(t, str):
                raise InvalidInputError(f"Lexical texts must be strings, got {type(t).__name__}.")
            clean.append(int(i))
        if len(set(clean)) != len(clean):
            raise InvalidInputError("upsert got the same id twice; pass each id once.")
        if not clean:
            return
        with self._lock:  # PyStemmer stemmers are not thread-safe: tokenise under the lock
            self._slot_memo = None
            toks = _tokenize(texts, self.stopwords, self._stemmer)
            for i, t in zip(clean, toks):
                self._put(i, t)
            self._maybe_compact()

    def remove(self, ids: Iterable[int]) -> None:
        """Remove ids; ids not present are ignored."""
        with self._lock:
            self._slot_memo = None
            for i in ids:
                i = int(i)
                if i in self._tokens:
                    slot = self._slot_of.pop(i)
                    tokens = self._tokens.pop(i)
                    self._retire(slot, tokens)
                    self._drop_unused(tokens)
                    self._slot_gen[slot] = -1
                    if 0 <= i < len(self._slot_by_id):
                        self._slot_by_id[i] = -1
            self._maybe_compact()

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, i: object) -> bool:
        return isinstance(i, (int, np.integer)) and int(i) in self._tokens

    # ------------------------------------------------------------------ postings
    def _retire(self, slot: int, tokens: list[str]) -> None:
        """Take a slot's current text out of the statistics (its postings become dead)."""
        terms = set(tokens)
        for t in terms:
            tid = self._vocab[t]
            self._df[tid] -= 1
            self._post_dead[tid] += 1
            if tid in self._tf_map:
                self._tf_map[tid][slot] = 0.0
        self._total_len -= len(tokens)
        self._live_postings -= len(terms)
        self._dead_postings += len(terms)

    def _put(self, i: int, tokens: list[str]) -> None:
        slot = self._slot_of.get(i)
        if slot is None:
            slot = self._n_slots
            self._n_slots += 1
            self._slot_id = grow(self._slot_id, self._n_slots)
            self._slot_len = grow(self._slot_len, self._n_slots)
            self._slot_gen = grow(self._slot_gen, self._n_slots)
            self._slot_id[slot] = i
            self._slot_gen[slot] = 0
            self._slot_of[i] = slot
            if 0 <= i < max(_DENSE_IDS, 4 * self._n_slots):  # sparse or huge ids stay in the dict only
                self._slot_by_id = grow(self._slot_by_id, i + 1, fill=-1)
                self._slot_by_id[i] = slot
            old = None
        else:
            old = self._tokens[i]
            self._retire(slot, old)
            self._slot_gen[slot] += 1
        self._tokens[i] = tokens
        self._slot_len[slot] = len(tokens)
        self._total_len += len(tokens)
        self._post_text(slot, int(self._slot_gen[slot]), tokens)
        if old:
            self._drop_unused(old)

    def _drop_unused(self, tokens: list[str]) -> None:
        """Take terms no live text holds any more out of the vocabulary, so that no word of a removed
        or replaced text stays in the index (their dead postings go at the next compaction; the term
        gets a fresh id if it comes back)."""
        vocab = self._vocab
        for t in set(tokens):
            tid = vocab.get(t)
            if tid is not None and self._df[tid] == 0:
                del vocab[t]
                self._tf_map.pop(tid, None)

    def _post_text(self, slot: int, gen: int, tokens: list[str]) -> None:
        counts = Counter(tokens)
        vocab = self._vocab
        for t, tf in counts.items():
            tid = vocab.get(t)
            if tid is None:
                tid = vocab[t] = len(self._post_slot)
                self._post_slot.append(np.empty(_MIN_CAP, dtype=np.int64))
                self._post_tf.append(np.empty(_MIN_CAP, dtype=np.float64))
                self._post_gen.append(np.empty(_MIN_CAP, dtype=np.int64))
                self._post_n.append(0)
                self._post_dead.append(0)
                self._df = grow(self._df, tid + 1, fill=0)
            n = self._post_n[tid]
            if n >= len(self._post_slot[tid]):
                self._post_slot[tid] = grow(self._post_slot[tid], n + 1, minimum=_MIN_CAP)
                self._post_tf[tid] = grow(self._post_tf[tid], n + 1, minimum=_MIN_CAP)
                self._post_gen[tid] = grow(self._post_gen[tid], n + 1, minimum=_MIN_CAP)
            self._post_slot[tid][n] = slot
            self._post_tf[tid][n] = tf
            self._post_gen[tid][n] = gen
            self._post_n[tid] = n + 1
            self._df[tid] += 1
            tfm = self._tf_map.get(tid)
            if tfm is not None:
                if slot >= len(tfm):
                    tfm = self._tf_map[tid] = grow(tfm, slot + 1, fill=0.0)
                tfm[slot] = tf
        self._live_postings += len(counts)

    def _maybe_compact(self) -> None:
        if self._dead_postings > max(self._live_postings, _COMPACT_FLOOR):
            self._compact()

    def _compact(self) -> None:
        """Rebuild the postings from the live texts, in their order (drops dead slots and postings)."""
        tokens = self._tokens
        self._clear_postings()
        for i, t in tokens.items():
            self._put(i, t)
        self.compactions += 1

    # ------------------------------------------------------------------ scoring
    def _slot_scores(self, query: str) -> np.ndarray:
        """``float64 (n_slots,)`` BM25 scores of every slot (dead slots score 0), read-only: the same
        query scored again before the texts change (a retrieval's ranking, then its hits' figures) is
        not scored twice."""
        memo = self._slot_memo
        if memo is not None and memo[0] == query and isinstance(memo[1], np.ndarray):
            return memo[1]
        out = self._score_slots(query)
        out.setflags(write=False)
        self._slot_memo = (query, out)
        return out

    def _terms(self, query: str) -> list[tuple[int, float, bool]]:
        """The query's known terms in query order: ``(term id, times * idf, common)``, ``common`` when
        more than :data:`COMMON_SHARE` of the texts hold the term."""
        N = len(self._tokens)
        out = []
        for t, times in Counter(x for x in _tokenize([query], self.stopwords, self._stemmer)[0] if x).items():
            tid = self._vocab.get(t)
            if tid is None or self._df[tid] == 0:
                continue
            df = float(self._df[tid])
            out.append((tid, times * math.log(1.0 + (N - df + 0.5) / (df + 0.5)), df > COMMON_SHARE * N))
        return out

    def _live(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, tf)`` of a term's live postings (its dead ones dropped once, not at every query)."""
        m = self._post_n[tid]
        if self._post_dead[tid]:
            slots = self._post_slot[tid][:m]
            keep = self._post_gen[tid][:m] == self._slot_gen[slots]
            live = int(keep.sum())
            for col in (self._post_slot, self._post_tf, self._post_gen):
                col[tid][:live] = col[tid][:m][keep]
            self._dead_postings -= m - live
            self._post_n[tid], self._post_dead[tid] = live, 0
            m = live
        return self._post_slot[tid][:m], self._post_tf[tid][:m]

    def _part(self, slots: np.ndarray, tf: np.ndarray, weight: float) -> np.ndarray:
        """One term's BM25 part at ``slots``: ``weight * tf / (tf + K1 * (1 - B + B * dl / avgdl))``
        with ``weight = times * idf``, computed in that order, elementwise (the same value wherever a
        slot is scored from)."""
        d = self._slot_len[slots]
        d *= B
        d /= self._total_len / len(self._tokens)
        d += 1.0 - B
        d *= K1
        d += tf
        x = tf * weight
        x /= d
        return x

    def _score_slots(self, query: str) -> np.ndarray:
        out = np.zeros(self._n_slots, dtype=np.float64)
        if not self._tokens or self._total_len == 0:
            return out
        for tid, weight, _ in self._terms(query):
            slots, tf = self._live(tid)
            out[slots] += self._part(slots, tf, weight)
        return out

    def _tf_of(self, tid: int) -> np.ndarray:
        """``float64 (>= n_slots,)``: the term's count in every slot's live text (0: not held), kept
        from now on by every change of the texts."""
        tfm = self._tf_map.get(tid)
        if tfm is None:
            tfm = np.zeros(self._n_slots, dtype=np.float64)
            slots, tf = self._live(tid)
            tfm[slots] = tf
        elif len(tfm) < self._n_slots:
            tfm = grow(tfm, self._n_slots, fill=0.0)
        self._tf_map[tid] = tfm
        return tfm

    def _sparse(self, query: str, level: float) -> _Sparse | None:
        """The query's scores at the slots holding one of its rare terms, when the query holds common
        terms whose :meth:`common_bound` is at most ``level`` (every other slot scores below it);
        ``None`` otherwise. O(postings of the rare terms x common terms): the common terms' postings,
        which cover most slots, are read only at those slots."""
        memo = self._slot_memo
        if memo is not None and memo[0] == query and isinstance(memo[1], _Sparse):
            return memo[1] if memo[1].bound <= level else None
        if not self._tokens or self._total_len == 0:
            return None
        terms = self._terms(query)
        bound = sum(w for _, w, common in terms if common)
        if not 0.0 < bound <= level or all(common for _, _, common in terms):
            return None
        rare = {tid: self._live(tid) for tid, _, common in terms if not common}
        slots = unique_ints(np.concatenate([sl for sl, _ in rare.values()]))
        out = np.zeros(len(slots), dtype=np.float64)
        for tid, weight, common in terms:  # in query order, as _score_slots adds them
            if common:
                out += self._part(slots, self._tf_of(tid)[slots], weight)
            else:
                at, tf = rare[tid]
                out[np.searchsorted(slots, at)] += self._part(at, tf, weight)
        N = len(self._tokens)
        for tid in [t for t in self._tf_map if self._df[t] * 4 <= COMMON_SHARE * N]:
            del self._tf_map[tid]  # common no longer
        sp = _Sparse(slots, out, [(tid, w) for tid, w, common in terms if common], bound)
        self._slot_memo = (query, sp)
        return sp

    def _at(self, query: str, slots: np.ndarray) -> np.ndarray:
        """``float64`` scores of the query at the given live slots: from the memo when it holds them,
        else from every slot's scores (the same values either way)."""
        memo = self._slot_memo
        if memo is None or memo[0] != query or not isinstance(memo[1], _Sparse):
            return self._slot_scores(query)[slots]
        sp = memo[1]
        pos = np.minimum(np.searchsorted(sp.slots, slots), max(len(sp.slots) - 1, 0))
        inside = sp.slots[pos] == slots if len(sp.slots) else np.zeros(len(slots), dtype=bool)
        out = np.zeros(len(slots), dtype=np.float64)
        out[inside] = sp.scores[pos[inside]]
        rest = slots[~inside]  # slots holding common terms only (or none)
        part = np.zeros(len(rest), dtype=np.float64)
        for tid, weight in sp.common:
            part += self._part(rest, self._tf_of(tid)[rest], weight)
        out[~inside] = part
        return out

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of ``query`` against every stored text.

        Args:
            query: the query string.

        Returns:
            ``(ids, scores)``: ``int64`` array ``(n,)`` of ids in insertion order (a replaced text keeps
            its place) and ``float32`` array ``(n,)`` of scores (0 where no query term occurs; all
            zeros when the query has no known token); two empty arrays when the index is empty.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        _check_query(query)
        with self._lock:
            if not self._tokens:
                return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
            n = self._n_slots
            live = self._slot_gen[:n] >= 0
            return self._slot_id[:n][live].copy(), self._slot_scores(query)[live].astype(np.float32)

    def scores_for(self, query: str, ids: np.ndarray) -> np.ndarray:
        """BM25 scores of ``query`` for the given ids, aligned with them (0 for ids not stored).

        The vectorised form of :meth:`scores` for a caller that holds its own id order (e.g. the rows
        of a vector index): O(postings of the query terms + len(ids)) with no Python loop over ids.

        Args:
            query: the query string.
            ids: ``int64`` array ``(n,)`` of ids.

        Returns:
            ``float32`` array ``(n,)``.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        _check_query(query)
        ids = np.asarray(ids, dtype=np.int64)
        with self._lock:
            out = np.zeros(len(ids), dtype=np.float32)
            if not self._tokens or len(ids) == 0:
                return out
            m = self._slot_by_id
            if int(ids.min()) >= 0 and int(ids.max()) < len(m):
                slots = m[ids]
            else:
                inside = (ids >= 0) & (ids < len(m))
                slots = np.full(len(ids), -1, dtype=np.int64)
                slots[inside] = m[ids[inside]]
            for j in np.flatnonzero(slots < 0).tolist():  # ids kept only in the dict, or not stored
                slots[j] = self._slot_of.get(int(ids[j]), -1)
            ok = slots >= 0
            out[ok] = self._at(query, slots[ok])
            return out

    def nonzero(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids whose BM25 score for ``query`` is above 0 and their scores, ids ascending.

        The same scores as :meth:`scores` (O(postings of the query terms + stored texts)), without the
        ids that score 0 (:meth:`above` at level 0).

        Returns:
            ``(ids int64 (m,), scores float32 (m,))``.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        return self.above(query, 0.0)[:2]

    def common_bound(self, query: str) -> float:
        """An upper bound of what the query's common terms add to any text's score.

        A term held by more than :data:`COMMON_SHARE` (half) of the stored texts (``idf < ln 2``; a
        speaker's name rendered into every message has ``idf`` near 0) adds less than ``times * idf``
        to any text (``tf / (tf + K) < 1``), ``times`` its count in the query. A text whose score is at
        most the returned sum holds nothing of the query but such terms, or very little else.

        Args:
            query: the query string.

        Returns:
            ``sum(times * idf)`` over those terms, ``0.0`` when there is none.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        _check_query(query)
        with self._lock:
            return sum(w for _, w, common in self._terms(query) if common) if self._tokens else 0.0

    def above(self, query: str, level: float) -> tuple[np.ndarray, np.ndarray, float]:
        """The ids scoring above ``level`` for ``query``, ids ascending, and the best score of the rest.

        The same scores as :meth:`scores`; ``above(query, 0.0)`` is :meth:`nonzero` (with 0 for the
        rest). O(postings of the query terms + stored texts); when ``level`` is at least the query's
        :meth:`common_bound` (above 0), O(postings of its other terms x its common terms): only the
        texts holding one of its other terms can score above ``level``, and the common terms' counts
        are read at those texts alone (from a per-text count kept for each common term a query held).

        Args:
            query: the query string. level: a score ``>= 0``.

        Returns:
            ``(ids int64 (m,), scores float32 (m,), rest)``: no stored text that is not returned scores
            above ``rest`` (a float32 value, as a float). It is their largest score (``0.0`` when there
            is none), or, when the texts were read sparsely and some are returned, the query's
            :meth:`common_bound` if that is larger.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        _check_query(query)
        with self._lock:
            if not self._tokens:
                return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy(), 0.0
            sp = self._sparse(query, level)
            if sp is not None and bool(np.any(sp.scores > level)):
                over = sp.scores > level
                slots = sp.slots[over]
                rest = float(np.float32(max(np.max(sp.scores, where=~over, initial=0.0), sp.bound)))
                return self._ids_of(slots, sp.scores[over]) + (rest,)
            s = self._slot_scores(query)
            over = s > level
            slots = np.flatnonzero(over)  # a dead slot scores 0
            rest = float(np.float32(np.max(s, where=~over, initial=0.0)))
            return self._ids_of(slots, s[slots]) + (rest,)

    def _ids_of(self, slots: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids ascending, float32 scores)`` of slots and their float64 scores."""
        ids = self._slot_id[slots]
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):  # slots mostly follow the ids
            order = np.argsort(ids, kind="stable")
            ids, scores = ids[order], scores[order]
        return ids, scores.astype(np.float32)

    def top_k(self, query: str, k: int, subset: Iterable[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best-scoring ids for ``query``, best first.

        Ties (including zero scores) are broken by insertion order, earliest first, so ``k`` ids are
        returned whenever at least ``k`` texts are admissible.

        Args:
            query: the query string.
            k: how many ids (>= 1).
            subset: restrict to these ids (unknown ids are ignored); ``None`` = all.

        Returns:
            ``(ids, scores)``: ``int64`` and ``float32`` arrays of length ``min(k, admissible)``.

        Raises:
            InvalidInputError: ``k`` < 1 or ``query`` is not a string.
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
        with self._lock:
            ids, sc = self.scores(query)
            if subset is not None:
                keep = {int(i) for i in subset}
                sel = np.fromiter((int(i) in keep for i in ids.tolist()), dtype=bool, count=len(ids))
                ids, sc = ids[sel], sc[sel]
        if ids.size == 0:
            return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
        order = np.argsort(-sc, kind="stable")[: int(k)]
        return ids[order], sc[order]

    def __repr__(self) -> str:
        return f"LexicalIndex(stem={self.stem}, stopwords={self.stopwords!r}, size={len(self)})"
