"""A lexical (BM25) index over short texts keyed by integer ids, built on bm25s.

The index keeps each text's tokens (tokenised once, at upsert) and rebuilds the bm25s model lazily:
upserts and removals only mark it dirty, and the next query rebuilds it once from the stored tokens, so
many queries after one build cost no rebuild.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import bm25s
import numpy as np

from .types import InvalidInputError

__all__ = ["LexicalIndex", "tokenize"]

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_SCORES = np.zeros(0, dtype=np.float32)


def _make_stemmer(stem: bool) -> Any:
    if not stem:
        return None
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("english")


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


class LexicalIndex:
    """BM25 index of texts keyed by integer ids (bm25s, Lucene variant, k1 = 1.5, b = 0.75).

    Defaults follow LlamaIndex's ``BM25Retriever``: bm25s' English stop words and PyStemmer's English
    Snowball stemmer applied to both documents and queries. ``LexicalIndex(stem=False)`` is bm25s with
    its default tokenisation (English stop words, no stemming); ``stopwords=None`` keeps every token.

    Args:
        stem: stem tokens with the English Snowball stemmer, default ``True``.
        stopwords: bm25s stop-word list name (``"en"``) or ``None`` for no stop words, default ``"en"``.

    Raises:
        InvalidInputError: ``stopwords`` is not a list name bm25s knows.

    Thread-safe: one lock guards the stored tokens, the stemmer and the lazily built model.

    References:
        Robertson & Zaragoza (2009), BM25 (Lucene scoring); bm25s (Lù, 2024); LlamaIndex
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
        self._tokens: dict[int, list[str]] = {}
        self._lock = threading.RLock()
        self._dirty = False
        self._model: bm25s.BM25 | None = None
        self._ids = _EMPTY_IDS
        self._pos: dict[int, int] = {}
        self.builds = 0  # number of bm25s rebuilds so far (for tests and benchmarks)

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
            toks = _tokenize(texts, self.stopwords, self._stemmer)
            for i, t in zip(clean, toks):
                self._tokens[i] = t
            self._dirty = True

    def remove(self, ids: Iterable[int]) -> None:
        """Remove ids; ids not present are ignored."""
        with self._lock:
            changed = False
            for i in ids:
                if self._tokens.pop(int(i), None) is not None:
                    changed = True
            if changed:
                self._dirty = True

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, i: object) -> bool:
        return isinstance(i, (int, np.integer)) and int(i) in self._tokens

    # ------------------------------------------------------------------ model
    def _build(self) -> None:
        ids = np.fromiter(self._tokens.keys(), dtype=np.int64, count=len(self._tokens))
        tokens = list(self._tokens.values())
        model: bm25s.BM25 | None = None
        if any(tokens):  # bm25s cannot index a corpus without a single token
            model = bm25s.BM25()
            model.index(tokens, show_progress=False)
        self._model = model
        self._ids = ids
        self._pos = {int(i): p for p, i in enumerate(ids)}
        self._dirty = False
        self.builds += 1

    def _ensure(self) -> None:
        if self._dirty:
            self._build()

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of ``query`` against every stored text.

        Args:
            query: the query string.

        Returns:
            ``(ids, scores)``: ``int64`` array ``(n,)`` of ids in insertion order and ``float32`` array
            ``(n,)`` of scores (0 where no query term occurs; all zeros when the query has no known
            token); two empty arrays when the index is empty.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}.")
        with self._lock:
            self._ensure()
            ids = self._ids
            if ids.size == 0:
                return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
            out = np.zeros(ids.size, dtype=np.float32)
            model = self._model
            if model is not None:
                q = _tokenize([query], self.stopwords, self._stemmer)[0]
                q = [t for t in q if t and t in model.vocab_dict]
                if q:
                    out = np.asarray(model.get_scores(q), dtype=np.float32)
            return ids.copy(), out

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
                pos = sorted({self._pos[int(i)] for i in subset if int(i) in self._pos})
                sel = np.asarray(pos, dtype=np.int64)
                ids, sc = ids[sel], sc[sel]
        if ids.size == 0:
            return _EMPTY_IDS.copy(), _EMPTY_SCORES.copy()
        order = np.argsort(-sc, kind="stable")[: int(k)]
        return ids[order], sc[order]

    def __repr__(self) -> str:
        return f"LexicalIndex(stem={self.stem}, stopwords={self.stopwords!r}, size={len(self)})"
