"""The flat "sessions as documents" baseline: sessions chosen by their whole text, then their turns.

LongMemEval's session-granularity design (each session one key) without an LLM: a session is ranked by
the max-normalised fusion of a dense and a BM25 score of its whole text, the ``sessions`` best sessions are
chosen, and their turns are ranked by the turn-level fusion of :class:`~shared_core.eval.baselines.FlatFusion`
(over every stored turn); the turns of the other sessions follow, session by session in order of session
score, so ``k`` hits are returned whenever ``k`` distinct texts are stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..models.base import Embedder
from ..search.index import inner_products, unit_row_norm
from ..search.lexical import LexicalIndex
from ..search.relevance import DEFAULT_HYBRID_WEIGHT, check_weight, fuse
from ..search.selection import check_cap
from ..types import AddReport, Hit, MessageLike, as_messages
from .baselines import FlatFusion, _check_budget, _check_query, _Flat, _normalized
from .data import render_message

__all__ = ["FlatSessionDocs"]


class FlatSessionDocs(_Flat):
    """Sessions as documents: the best sessions by their whole text, then their turns by fusion.

    Per query: each session (``Message.metadata["session"]``; a message without one is a session of its
    own) scores ``w * dense / max + (1 - w) * bm25 / max`` (:func:`~shared_core.search.relevance.fuse`)
    with ``dense = max(cos(query, session vector), 0)``, the session vector being the normalised mean of
    its turns' unit vectors (no text embedded twice, none cut at the embedder's input limit), and ``bm25``
    the stemmed BM25 score of the session's turns joined by newlines, over the session documents. The
    ``sessions`` best sessions (ties: the earlier session) are chosen; their turns come first, ranked by
    :class:`~shared_core.eval.baselines.FlatFusion`'s turn score (ties by insertion order), then the turns
    of the other sessions, session by session in order of session score, each session's by the same turn
    score.

    Args:
        embedder: the dense embedder, default :class:`~shared_core.models.local.LocalEmbedder`.
        hybrid_weight: ``w``, the dense weight of both fusions, in ``[0, 1]``, default 0.5.
        sessions: how many sessions are chosen, an int >= 1, default 5.
        stem: stem in BM25, default ``True``. stopwords: BM25 stop-word list, default ``"en"``.

    Raises:
        InvalidInputError: ``hybrid_weight`` outside ``[0, 1]`` or ``sessions`` < 1.

    References:
        Wu et al. (ICLR 2025), LongMemEval, Sec. 5.2 and Table 3 (sessions as the value and key
        granularity); Bruch, Gai & Ingber (2023) (convex fusion of normalised scores).
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        hybrid_weight: float = DEFAULT_HYBRID_WEIGHT,
        sessions: int = 5,
        stem: bool = True,
        stopwords: str | None = "en",
    ) -> None:
        super().__init__()
        self.hybrid_weight = check_weight(hybrid_weight)
        self.sessions = int(check_cap(sessions, "sessions", optional=False))  # type: ignore[arg-type]
        self.turns = FlatFusion(embedder, hybrid_weight=self.hybrid_weight, stem=stem, stopwords=stopwords)
        self.docs = LexicalIndex(stem=stem, stopwords=stopwords)
        self._members: dict[Any, list[int]] = {}  # session key -> turn indices, in session order
        self._dirty: set[Any] = set()
        self._vectors: dict[Any, np.ndarray] = {}

    def _key(self, i: int) -> Any:
        s = self._session(i)
        return ("message", i) if s is None else s

    def add(self, messages: MessageLike | Iterable[MessageLike]) -> AddReport:
        """Add messages (turns) in order; their sessions' documents are refreshed at the next query.

        Returns:
            The turn fusion's :class:`AddReport` (one embedding call).

        Raises:
            InvalidInputError: invalid messages. EmbeddingError: bad vectors. The store is unchanged then.
        """
        msgs = as_messages(messages)
        with self._lock:
            rep = self.turns.add(msgs)
            start = len(self._messages)
            self._keep(msgs, [render_message(m) for m in msgs])
            for i in range(start, len(self._messages)):
                key = self._key(i)
                self._members.setdefault(key, []).append(i)
                self._dirty.add(key)
            self.usage += rep.usage
        return rep

    def _refresh(self) -> None:
        """Session vectors and BM25 documents of the sessions changed since the last query."""
        if not self._dirty:
            return
        index = self.turns.dense._index
        assert index is not None
        d = index.d
        keys = list(self._members)
        pos = {k: n for n, k in enumerate(keys)}
        dirty = [k for k in keys if k in self._dirty]
        for k in dirty:
            rows = np.stack([index.reconstruct(i) for i in self._members[k]])
            self._vectors[k] = _normalized(rows.mean(axis=0, keepdims=True).astype(np.float32))[0]
        self.docs.upsert(
            [pos[k] for k in dirty], ["\n".join(self._texts[i] for i in self._members[k]) for k in dirty]
        )
        self._dirty.clear()
        self._unit = unit_row_norm(d)

    def session_scores(self, query: str) -> tuple[list[Any], np.ndarray]:
        """The fused score of every session.

        Returns:
            ``(keys, scores)``: the session keys in order of their first turn and their ``float32`` fused
            scores in ``[0, 1]``.
        """
        with self._lock:
            keys = list(self._members)
            if not keys:
                return [], np.zeros(0, np.float32)
            self._refresh()
            q = self.turns.dense._embed_query(query)[0]
            mat = np.stack([self._vectors[k] for k in keys])
            dense = np.maximum(inner_products(mat, q, row_norm=self._unit), 0.0).astype(np.float32)
            lex = np.zeros(len(keys), np.float32)
            ids, sc = self.docs.scores(query)
            lex[ids] = sc
            return keys, fuse(dense, lex, self.hybrid_weight)

    def retrieve(self, query: str, k: int = 10, *, max_tokens: int | None = None) -> list[Hit]:
        """The turns of the best sessions, best turn first, then the other sessions' turns.

        Args:
            query: the query text.
            k: at most this many hits, default 10.
            max_tokens: optional budget of returned text in tokens, as in
                :meth:`~shared_core.eval.baselines.FlatDense.retrieve`.

        Returns:
            Leaf hits with distinct texts; ``Hit.score`` is the turn's fused score.

        Raises:
            InvalidInputError: empty query, ``k`` < 1 or ``max_tokens`` < 1.
        """
        k = _check_query(query, k)
        budget = _check_budget(max_tokens)
        with self._lock:
            if not self._messages:
                return []
            keys, ses = self.session_scores(query)
            turn = self.turns.scores(query)
            rank = np.lexsort((np.arange(len(keys)), -ses))
            chosen = [keys[j] for j in rank[: self.sessions]]
            first = sorted((i for key in chosen for i in self._members[key]), key=lambda i: (-turn[i], i))
            rest = [
                i
                for j in rank[self.sessions :]
                for i in sorted(self._members[keys[j]], key=lambda i: (-turn[i], i))
            ]
            order = first + rest
            return self._select(order, turn[order], k, budget)
