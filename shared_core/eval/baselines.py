"""Flat retrieval baselines over single messages, with the memories' ``add`` / ``retrieve`` surface.

Every baseline indexes each message under :func:`~shared_core.eval.data.render_message`
(``"<speaker>: <text>"``) and returns leaf hits (``depth=1``, ``span=(i, i)``) with distinct texts, as the
memories' ``retrieve`` does: a message whose text repeats a better-ranked hit's is skipped and the next
one is taken, so ``k`` hits are returned whenever ``k`` distinct texts are stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import faiss
import numpy as np

from ..models.base import Embedder, validate_embeddings
from ..search.index import inner_products, top_k, unit_row_norm
from ..search.lexical import LexicalIndex
from ..search.relevance import DEFAULT_HYBRID_WEIGHT, check_weight, fuse
from ..search.selection import capped, check_cap, with_neighbours
from ..types import (
    AddReport,
    EmbeddingError,
    Hit,
    InvalidInputError,
    Message,
    MessageLike,
    Usage,
    as_messages,
)
from .data import render_message

__all__ = ["FlatBM25", "FlatDense", "FlatFusion", "FlatHybridRRF"]


def _check_query(query: Any, k: Any) -> int:
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty string.")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    return int(k)


def _check_budget(max_tokens: Any) -> int | None:
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    return int(max_tokens)


def _normalized(vecs: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise EmbeddingError("The embedder returned a zero vector; cosine similarity is undefined for it.")
    return np.ascontiguousarray(vecs / norms, dtype=np.float32)


def _default_embedder() -> Embedder:
    from ..models.local import LocalEmbedder

    return LocalEmbedder()


class _Flat:
    """Shared message store of the flat baselines."""

    #: at most this many hits of one session before the rest of the ranking fills ``k`` (``None``: off)
    session_cap: int | None = None
    #: adjacent turns of the same session placed after each hit (nearest first, the earlier on ties)
    neighbours: int = 0

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._texts: list[str] = []
        self._text_set: set[str] = set()
        self._n_repeats = 0  # stored texts equal to an earlier one
        self._lock = threading.RLock()
        self.usage = Usage()

    def __len__(self) -> int:
        return len(self._messages)

    def _keep(self, msgs: list[Message], texts: list[str]) -> None:
        """Append messages and their rendered texts (under the lock)."""
        for t in texts:
            if t in self._text_set:
                self._n_repeats += 1
            else:
                self._text_set.add(t)
        self._messages.extend(msgs)
        self._texts.extend(texts)

    def _hit(self, i: int, score: float) -> Hit:
        m = self._messages[i]
        meta: dict[str, Any] = {
            k: v
            for k, v in (("speaker", m.speaker), ("timestamp", m.timestamp), ("role", m.role))
            if v is not None
        }
        meta.update(m.metadata)
        return Hit(
            node_id=i,
            text=self._texts[i],
            score=float(score),
            depth=1,
            is_leaf=True,
            span=(i, i),
            source_ids=[m.id] if m.id is not None else [],
            metadata=meta,
        )

    def _session(self, i: int) -> Any:
        """The session of message ``i`` (``metadata["session"]``), else ``None`` (a session of its own)."""
        return self._messages[i].metadata.get("session")

    def _adjacent(self, i: int) -> list[int]:
        """The turns next to message ``i`` in insertion order within its session, nearest first (the
        earlier on ties), as far as :attr:`neighbours` reaches on each side."""
        ses = self._session(i)
        out: list[int] = []
        for d in range(1, self.neighbours + 1):
            for j in (i - d, i + d):
                if 0 <= j < len(self._messages) and self._session(j) == ses:
                    out.append(j)
        return out

    def _shaped(self, order: Iterable[int], scores: Iterable[Any]) -> tuple[list[int], list[float]]:
        """The ranking reordered by :attr:`session_cap` (:func:`~shared_core.search.selection.capped`)
        and :attr:`neighbours` (:func:`~shared_core.search.selection.with_neighbours`, a neighbour with
        the score of the hit it follows): the flat control of the memories' segment cap and sibling
        expansion (:meth:`~shared_core.search.ranking.Ranking._shaped`), over sessions and turn order
        instead of a tree."""
        items = [(int(i), float(sc)) for i, sc in zip(order, scores)]
        if self.session_cap is not None:
            items = capped(items, lambda it: self._session(it[0]), self.session_cap)
        if self.neighbours:
            items = with_neighbours(
                items,
                lambda it: [(j, it[1]) for j in self._adjacent(it[0])],
                self.neighbours,
                key=lambda it: it[0],
            )
        return [i for i, _ in items], [sc for _, sc in items]

    def _select(
        self, order: Iterable[int], scores: Iterable[Any], k: int, max_tokens: int | None
    ) -> list[Hit]:
        """The first ``k`` messages of ``order`` with distinct texts that fit in ``max_tokens`` together.

        A message whose text equals a hit's already taken is skipped; so is one that would exceed the
        budget, and the walk goes on, as the memories' ``retrieve(max_tokens=...)`` does. Tokens are
        counted by :func:`~shared_core.eval.metrics.count_tokens`.

        Args:
            order: insertion indices, best first.
            scores: their scores, aligned with ``order``.
            k: at most this many hits.
            max_tokens: the budget, or ``None`` for none.

        Returns:
            The hits, in the order of ``order``.
        """
        from .metrics import count_tokens

        hits: list[Hit] = []
        seen: set[str] = set()
        used = 0
        for i, s in zip(order, scores):
            i = int(i)
            text = self._texts[i]
            if text in seen:
                continue
            if max_tokens is not None:
                t = count_tokens(text)
                if used + t > max_tokens:
                    continue
                used += t
            seen.add(text)
            hits.append(self._hit(i, float(s)))
            if len(hits) >= k:
                break
        return hits

    def stats(self) -> dict[str, Any]:
        """Counts in the memories' ``stats()`` shape: every message is a leaf under a structural root."""
        n = len(self._messages)
        return {
            "nodes": n,
            "leaves": n,
            "max_depth": 1 if n else 0,
            "mean_depth": 1.0 if n else 0.0,
            "mean_branching": float(n),
            "usage": self.usage.to_dict(),
        }


class FlatDense(_Flat):
    """Dense cosine retrieval over single messages (L2-normalised vectors held in a FAISS ``IndexFlatIP``).

    Scores are the memories' dense score (:func:`~shared_core.search.index.inner_products`: the exact cosine
    rounded to float32, the same on every CPU); exact ties go to the earlier message.

    Args:
        embedder: any :class:`~shared_core.models.base.Embedder`; default the embedded
            :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2, 384-d).

    References:
        SegTreeMem paper, RQ4 "flat retrieval" baselines (Dense); MemTree paper, the MemoryStream
        baseline (Park et al., 2023: a flat embedding table of the history); FAISS (Johnson et al., 2019).
    """

    def __init__(self, embedder: Embedder | None = None) -> None:
        super().__init__()
        self.embedder = embedder if embedder is not None else _default_embedder()
        self._index: faiss.IndexFlatIP | None = None

    def add(self, messages: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages in order; all of one call are embedded in one batch.

        Args:
            messages: a string, a :class:`Message`, or an iterable of them.

        Returns:
            An :class:`AddReport` (leaf ids = insertion indices; one embedding call).

        Raises:
            InvalidInputError: invalid messages. EmbeddingError: bad vectors. The store is unchanged then.
        """
        msgs = as_messages(messages)
        texts = [render_message(m) for m in msgs]
        t0 = time.perf_counter()
        vecs = validate_embeddings(self.embedder.embed(texts), len(texts), None)
        vecs = _normalized(vecs)
        usage = Usage(embed_calls=1, embedded_texts=len(texts), seconds=time.perf_counter() - t0)
        with self._lock:
            if self._index is None:
                self._index = faiss.IndexFlatIP(vecs.shape[1])
            elif vecs.shape[1] != self._index.d:
                raise EmbeddingError(
                    f"Embedding dimension changed from {self._index.d} to {vecs.shape[1]}; use one embedder."
                )
            start = len(self._messages)
            self._index.add(vecs)
            self._keep(msgs, texts)
            self.usage += usage
        return AddReport(leaf_ids=list(range(start, start + len(msgs))), usage=usage)

    def _embed_query(self, query: str) -> np.ndarray:
        q = validate_embeddings(self.embedder.embed([query]), 1, self._index.d if self._index else None)
        return _normalized(q)

    def ranking(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """All messages ranked by cosine similarity to ``query`` (exact ties by insertion order).

        Returns:
            ``(indices, scores)``: ``int64`` insertion indices best first and their ``float32`` cosines,
            both of length ``len(self)``.
        """
        with self._lock:
            n = len(self._messages)
            if n == 0 or self._index is None:
                return np.zeros(0, np.int64), np.zeros(0, np.float32)
            scores = self._scores(self._embed_query(query))
        order = np.lexsort((np.arange(n), -scores))  # ties by insertion order
        return order.astype(np.int64), scores[order]

    def _scores(self, q: np.ndarray) -> np.ndarray:
        """Cosine of the normalised query ``q`` (1, d) with every stored message, insertion order:
        :func:`~shared_core.search.index.inner_products`, the memories' dense score (exact, then rounded to
        float32: the same bits on every CPU)."""
        assert self._index is not None
        n, d = self._index.ntotal, self._index.d
        mat = faiss.rev_swig_ptr(self._index.get_xb(), n * d).reshape(n, d)
        return inner_products(mat, q[0], row_norm=unit_row_norm(d))

    def retrieve(self, query: str, k: int = 10, *, max_tokens: int | None = None) -> list[Hit]:
        """The ``k`` messages most similar to ``query`` (cosine), best first.

        Args:
            query: the query text.
            k: at most this many hits, default 10.
            max_tokens: optional budget of returned text in tokens
                (:func:`~shared_core.eval.metrics.count_tokens`); a message that would exceed it is
                skipped and the next one in rank order is tried. Default ``None`` (no budget).

        Raises:
            InvalidInputError: empty query, ``k`` < 1 or ``max_tokens`` < 1.
        """
        k = _check_query(query, k)
        budget = _check_budget(max_tokens)
        with self._lock:
            n = len(self._messages)
            if n == 0 or self._index is None:
                return []
            if budget is not None:
                idx, sc = self.ranking(query)
                return self._select(idx, sc, k, budget)
            scores = self._scores(self._embed_query(query))
            # the best k + (repeated texts) messages hold k distinct texts whenever k exist; exact
            # ties by insertion order
            top = top_k(np.arange(n), scores, min(k + self._n_repeats, n))
            return self._select(top, scores[top], k, None)


class FlatBM25(_Flat):
    """BM25 over single messages (bm25s via :class:`~shared_core.search.lexical.LexicalIndex`).

    Args:
        stem: English Snowball stemming, default ``True`` (LlamaIndex ``BM25Retriever`` defaults);
            ``stem=False`` is bm25s with its default tokenisation.
        stopwords: bm25s stop-word list (``"en"``) or ``None``, default ``"en"``.

    References:
        SegTreeMem paper, RQ4 "flat retrieval" baselines (BM25); Robertson & Zaragoza (2009), BM25;
        bm25s (Lù, 2024).
    """

    def __init__(self, stem: bool = True, stopwords: str | None = "en") -> None:
        super().__init__()
        self.index = LexicalIndex(stem=stem, stopwords=stopwords)

    def add(self, messages: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages in order (the BM25 model is rebuilt lazily at the next query).

        Raises:
            InvalidInputError: invalid messages; the store is unchanged then.
        """
        msgs = as_messages(messages)
        texts = [render_message(m) for m in msgs]
        with self._lock:
            start = len(self._messages)
            ids = list(range(start, start + len(msgs)))
            self.index.upsert(ids, texts)
            self._keep(msgs, texts)
        return AddReport(leaf_ids=ids, usage=Usage())

    def ranking(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """All messages ranked by BM25 score (ties by insertion order): ``(indices, scores)``."""
        with self._lock:
            ids, sc = self.index.scores(query)
        order = np.argsort(-sc, kind="stable")
        return ids[order], sc[order]

    def retrieve(self, query: str, k: int = 10, *, max_tokens: int | None = None) -> list[Hit]:
        """The ``k`` best BM25 matches, best first (zero-score messages fill up in insertion order).

        Args:
            query: the query text.
            k: at most this many hits, default 10.
            max_tokens: optional budget of returned text in tokens, as in :meth:`FlatDense.retrieve`.

        Raises:
            InvalidInputError: empty query, ``k`` < 1 or ``max_tokens`` < 1.
        """
        k = _check_query(query, k)
        budget = _check_budget(max_tokens)
        with self._lock:
            if not self._messages:
                return []
            if budget is not None:
                idx, sc = self.ranking(query)
                return self._select(idx, sc, k, budget)
            ids, sc = self.index.top_k(query, k + self._n_repeats)
            return self._select(ids, sc, k, None)


class FlatHybridRRF(_Flat):
    """Reciprocal-rank fusion of dense cosine and BM25 rankings over all messages.

    Fused score of message d: ``1 / (k_rrf + rank_dense(d)) + 1 / (k_rrf + rank_bm25(d))`` with 1-based
    ranks over every stored message (BM25 ties, including zero scores, ranked by insertion order).

    Args:
        embedder: the dense embedder, default :class:`~shared_core.models.local.LocalEmbedder`.
        stem: stem in BM25, default ``True``.
        k_rrf: the RRF constant, default 60.
        stopwords: BM25 stop-word list, default ``"en"``.

    Raises:
        InvalidInputError: ``k_rrf`` < 0.

    References:
        Cormack, Clarke & Büttcher (2009), "Reciprocal Rank Fusion outperforms Condorcet and individual
        rank learning methods" (RRF score, k = 60).
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        stem: bool = True,
        k_rrf: int = 60,
        stopwords: str | None = "en",
    ) -> None:
        super().__init__()
        if k_rrf < 0:
            raise InvalidInputError("k_rrf must be >= 0 (60 is the usual value).")
        self.k_rrf = k_rrf
        self.dense = FlatDense(embedder)
        self.bm25 = FlatBM25(stem=stem, stopwords=stopwords)

    def add(self, messages: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages to both rankers (dense first: if embedding fails, nothing changes)."""
        msgs = as_messages(messages)
        with self._lock:
            rep = self.dense.add(msgs)
            self.bm25.add(msgs)
            self._keep(msgs, [render_message(m) for m in msgs])
            self.usage += rep.usage
        return rep

    def retrieve(self, query: str, k: int = 10, *, max_tokens: int | None = None) -> list[Hit]:
        """The ``k`` messages with the highest fused score, best first (ties by insertion order).

        Args:
            query: the query text.
            k: at most this many hits, default 10.
            max_tokens: optional budget of returned text in tokens, as in :meth:`FlatDense.retrieve`.

        Raises:
            InvalidInputError: empty query, ``k`` < 1 or ``max_tokens`` < 1.
        """
        k = _check_query(query, k)
        budget = _check_budget(max_tokens)
        with self._lock:
            n = len(self._messages)
            if n == 0:
                return []
            fused = np.zeros(n, dtype=np.float64)
            for idx, _ in (self.dense.ranking(query), self.bm25.ranking(query)):
                fused[idx] += 1.0 / (self.k_rrf + np.arange(1, idx.size + 1))
            order = np.argsort(-fused, kind="stable")
            return self._select(order, fused[order], k, budget)


class FlatFusion(_Flat):
    """Max-normalised convex fusion of dense cosine and stemmed BM25 over all messages.

    What a memory's ``hybrid`` relevance amounts to over message leaves with no structure. Per query,
    over every stored message: ``dense = max(cos, 0)``, ``bm25`` = BM25 score (English stop words and
    Snowball stemming by default, as :class:`FlatBM25`); each is divided by its maximum over the
    messages (a zero maximum leaves it zero) and the score is ``w * dense + (1 - w) * bm25``
    (:func:`shared_core.search.relevance.fuse`, the formula of the memories' ``hybrid`` relevance). Hits are
    the best scores first, ties by insertion order.

    Args:
        embedder: the dense embedder, default :class:`~shared_core.models.local.LocalEmbedder`.
        hybrid_weight: ``w``, the weight of the dense part, in ``[0, 1]``; default 0.5 (the memories'
            default ``hybrid_weight``). ``1.0`` ranks by ``max(cos, 0)`` alone, ``0.0`` by BM25 alone.
        stem: stem in BM25, default ``True``.
        stopwords: BM25 stop-word list, default ``"en"``.
        session_cap: at most this many hits of one session (``Message.metadata["session"]``) before
            the rest of the ranking fills ``k``, an int >= 1 or ``None`` (default, off): the flat control
            of the memories' ``segment_cap``.
        neighbours: each hit followed by up to this many adjacent turns of its session (nearest first),
            within the same ``k`` and ``max_tokens``, an int >= 0, default 0 (off): the flat control of
            the memories' ``neighbours`` (sibling leaves).

    Raises:
        InvalidInputError: ``hybrid_weight`` is not a number in ``[0, 1]``, an unknown stop-word
            list, or a bad ``session_cap`` / ``neighbours``.

    References:
        Bruch, Gai & Ingber (2023), "An Analysis of Fusion Functions for Hybrid Retrieval" (convex
        combination of normalised scores); SegTreeMem paper, RQ4 flat retrieval baselines.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        hybrid_weight: float = DEFAULT_HYBRID_WEIGHT,
        stem: bool = True,
        stopwords: str | None = "en",
        session_cap: int | None = None,
        neighbours: int = 0,
    ) -> None:
        super().__init__()
        self.hybrid_weight = check_weight(hybrid_weight)
        self.session_cap = check_cap(session_cap, "session_cap")
        self.neighbours = check_cap(neighbours, "neighbours", minimum=0, optional=False)  # type: ignore[assignment]
        self.dense = FlatDense(embedder)
        self.bm25 = FlatBM25(stem=stem, stopwords=stopwords)

    def add(self, messages: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages to both scorers (dense first: if embedding fails, nothing changes).

        Args:
            messages: a string, a :class:`Message`, or an iterable of them.

        Returns:
            The dense part's :class:`AddReport` (leaf ids = insertion indices; one embedding call).

        Raises:
            InvalidInputError: invalid messages. EmbeddingError: bad vectors. The store is unchanged then.
        """
        msgs = as_messages(messages)
        with self._lock:
            rep = self.dense.add(msgs)
            self.bm25.add(msgs)
            self._keep(msgs, [render_message(m) for m in msgs])
            self.usage += rep.usage
        return rep

    def scores(self, query: str) -> np.ndarray:
        """The fused score of every stored message.

        Args:
            query: the query text.

        Returns:
            ``float32`` array ``(len(self),)`` in insertion order, values in ``[0, 1]``.

        Raises:
            InvalidInputError: ``query`` is not a string.
        """
        with self._lock:
            n = len(self._messages)
            if n == 0:
                return np.zeros(0, dtype=np.float32)
            dense = np.zeros(n, dtype=np.float32)
            idx, cos = self.dense.ranking(query)
            dense[idx] = np.maximum(cos, 0.0)
            lex = np.zeros(n, dtype=np.float32)
            ids, bm = self.bm25.index.scores(query)
            lex[ids] = bm
            return fuse(dense, lex, self.hybrid_weight)

    def retrieve(self, query: str, k: int = 10, *, max_tokens: int | None = None) -> list[Hit]:
        """The ``k`` messages with the highest fused score, best first (ties by insertion order).

        Args:
            query: the query text.
            k: at most this many hits, default 10.
            max_tokens: optional budget of returned text in tokens, as in :meth:`FlatDense.retrieve`.

        Returns:
            Leaf hits with distinct texts; ``Hit.score`` is the fused score.

        Raises:
            InvalidInputError: empty query, ``k`` < 1 or ``max_tokens`` < 1.
        """
        k = _check_query(query, k)
        budget = _check_budget(max_tokens)
        with self._lock:
            fused = self.scores(query)
            order = np.argsort(-fused, kind="stable")
            if self.session_cap is None and not self.neighbours:
                return self._select(order, fused[order], k, budget)
            return self._select(*self._shaped(order, fused[order]), k, budget)
