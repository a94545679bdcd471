"""Online evaluation: ingest a conversation in order, ask each query when it comes, score the hits.

For every method a fresh object is built from its factory. Messages are added in batches — all messages
between two consecutive query positions in one ``add`` call — and each query is answered by
``retrieve(question, k=k)`` from exactly the messages before it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..types import InvalidInputError
from .data import Conversation, add_turns
from .metrics import (
    answer_token_recall,
    contained_recall,
    count_tokens,
    evidence_recall,
    mean_by,
    message_sentences,
)

__all__ = ["METRICS", "EvalResult", "MethodResult", "QueryResult", "evaluate_online"]

METRICS = (
    "evidence_recall",
    "span_recall",
    "subtree_recall",
    "answer_token_recall",
    "returned_tokens",
    "latency",
)
"""Per-query figures averaged in :attr:`MethodResult.overall` and :attr:`MethodResult.by_category`."""


@dataclass
class QueryResult:
    """The scores of one query for one method.

    Attributes:
        conversation: the conversation id.
        query_id: the query id.
        category: the query's category (or None).
        position: messages ingested before the query.
        evidence_recall: share of evidence ids among the leaf hits' ``source_ids`` (a summary counts for
            nothing here; NaN without evidence).
        span_recall: share of evidence ids whose message a hit's text shows: a leaf its own message, a
            summary the messages it quotes a sentence of, verbatim
            (:func:`~shared_core.eval.metrics.contained_recall`; NaN without evidence).
        subtree_recall: share of evidence ids among every hit's ``source_ids`` (a summary credited with
            every message below it, whether or not its text shows them; NaN without evidence).
        answer_token_recall: share of the answer's content words in the joined hit texts.
        returned_tokens: tokens of the returned texts (:func:`~shared_core.eval.metrics.count_tokens`).
        latency: seconds spent in ``retrieve``.
        n_hits: number of hits returned.
        retrieved_source_ids: the hits' source ids, flattened in hit order.
    """

    conversation: str
    query_id: str
    category: str | int | None
    position: int
    evidence_recall: float
    span_recall: float
    subtree_recall: float
    answer_token_recall: float
    returned_tokens: int
    latency: float
    n_hits: int
    retrieved_source_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (NaN becomes None)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def _means(rows: Sequence[QueryResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in METRICS:
        vals = [float(getattr(r, m)) for r in rows]
        vals = [v for v in vals if not math.isnan(v)]
        out[m] = float(np.mean(vals)) if vals else math.nan
    return out


@dataclass
class MethodResult:
    """All query results of one method.

    Attributes:
        name: the method's name.
        queries: per-query results, in evaluation order.
        ingest_seconds: total wall-clock seconds spent in ``add``.
        messages: messages ingested in total.
    """

    name: str
    queries: list[QueryResult] = field(default_factory=list)
    ingest_seconds: float = 0.0
    messages: int = 0

    @property
    def overall(self) -> dict[str, float]:
        """Mean of each metric in :data:`METRICS` over all queries (NaN entries ignored)."""
        return _means(self.queries)

    @property
    def by_category(self) -> dict[str, dict[str, float]]:
        """``{str(category): {metric: mean}}`` in order of first appearance."""
        keys = [str(r.category) for r in self.queries]
        out: dict[str, dict[str, float]] = {str(c): {} for c in dict.fromkeys(keys)}
        for m in METRICS:
            for c, v in mean_by([float(getattr(r, m)) for r in self.queries], keys).items():
                out[c][m] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form with aggregates and per-query rows (NaN becomes None)."""

        def clean(d: dict[str, float]) -> dict[str, float | None]:
            return {k: (None if math.isnan(v) else v) for k, v in d.items()}

        return {
            "name": self.name,
            "n_queries": len(self.queries),
            "messages": self.messages,
            "ingest_seconds": self.ingest_seconds,
            "overall": clean(self.overall),
            "by_category": {c: clean(v) for c, v in self.by_category.items()},
            "queries": [q.to_dict() for q in self.queries],
        }


@dataclass
class EvalResult:
    """The outcome of :func:`evaluate_online`.

    Attributes:
        k: the retrieval budget (hits per query).
        conversations: ids of the evaluated conversations.
        methods: ``{name: MethodResult}`` in the order given.
    """

    k: int
    conversations: list[str]
    methods: dict[str, MethodResult]

    def summary(self) -> dict[str, dict[str, float]]:
        """``{method: overall means}``."""
        return {name: r.overall for name, r in self.methods.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data."""
        return {
            "k": self.k,
            "conversations": list(self.conversations),
            "methods": {name: r.to_dict() for name, r in self.methods.items()},
        }


def _run(
    name: str, factory: Callable[[], Any], conv: Conversation, k: int, res: MethodResult, bar: Any
) -> None:
    obj = factory()
    sentences = message_sentences(conv.messages)
    done = 0
    for q in sorted(conv.queries, key=lambda q: q.position):
        if q.position > len(conv.messages) or q.position < 0:
            raise InvalidInputError(
                f"Query {q.id} is asked at position {q.position}, outside 0..{len(conv.messages)}."
            )
        if q.position > done:
            t0 = time.perf_counter()
            add_turns(obj, conv.messages[done : q.position])
            res.ingest_seconds += time.perf_counter() - t0
            res.messages += q.position - done
            done = q.position
        t0 = time.perf_counter()
        hits = list(obj.retrieve(q.question, k=k))
        latency = time.perf_counter() - t0
        ids = [s for h in hits for s in h.source_ids]
        leaf_ids = [s for h in hits if h.is_leaf for s in h.source_ids]
        shown = [(h.text, bool(h.is_leaf), h.source_ids) for h in hits]
        texts = [h.text for h in hits]
        has_ev = bool(q.evidence)
        res.queries.append(
            QueryResult(
                conversation=conv.id,
                query_id=q.id,
                category=q.category,
                position=q.position,
                evidence_recall=evidence_recall(leaf_ids, q.evidence) if has_ev else math.nan,
                span_recall=contained_recall(shown, q.evidence, sentences) if has_ev else math.nan,
                subtree_recall=evidence_recall(ids, q.evidence) if has_ev else math.nan,
                answer_token_recall=answer_token_recall(q.answer, texts),
                returned_tokens=count_tokens(texts),
                latency=latency,
                n_hits=len(hits),
                retrieved_source_ids=ids,
            )
        )
        if bar is not None:
            bar.update(1)


def evaluate_online(
    conversation: Conversation | Sequence[Conversation],
    methods: Mapping[str, Callable[[], Any]],
    k: int = 10,
    progress: bool = True,
) -> EvalResult:
    """Evaluate retrieval methods online on one or more conversations.

    For each method and conversation a fresh object is built with ``methods[name]()``; it must offer
    ``add(list[Message])`` and ``retrieve(question, k=k) -> list[Hit]`` (the memories and the flat
    baselines do; bind extra retrieval options with ``functools.partial`` or a small wrapper). Messages
    are added in order, one ``add`` call per stretch between consecutive query positions, so each query
    sees exactly the messages before it. Per query: evidence recall@k over the leaf hits'
    ``source_ids``, span recall (what the hits' texts show) and subtree recall (every message below a
    hit), as ``hiermem eval`` computes them, answer-token recall over the joined hit texts, returned
    tokens and ``retrieve`` latency (seconds). Results over several conversations are pooled per query.

    Args:
        conversation: a :class:`Conversation` or a sequence of them.
        methods: ``{name: zero-argument factory}``.
        k: hits per query, default 10.
        progress: show a progress bar per method (tqdm), default ``True``.

    Returns:
        An :class:`EvalResult`.

    Raises:
        InvalidInputError: no methods, ``k`` < 1, or a query position outside the conversation.

    References:
        Online protocol of SegTreeMem (each query answered from the turns before it) and RealMem
        (Bian et al., 2026); LoCoMo (Maharana et al., 2024) questions asked after the conversation.
    """
    convs = [conversation] if isinstance(conversation, Conversation) else list(conversation)
    if not methods:
        raise InvalidInputError("No methods to evaluate; pass {name: factory}.")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}.")
    out: dict[str, MethodResult] = {}
    total = sum(len(c.queries) for c in convs)
    for name, factory in methods.items():
        res = MethodResult(name=name)
        bar = tqdm(total=total, desc=name, leave=False) if progress else None
        try:
            for conv in convs:
                _run(name, factory, conv, k, res, bar)
        finally:
            if bar is not None:
                bar.close()
        out[name] = res
    return EvalResult(k=k, conversations=[c.id for c in convs], methods=out)
