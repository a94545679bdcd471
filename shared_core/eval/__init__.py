"""Evaluation: data loaders, metrics, flat baselines and the online evaluation loop."""

from .baselines import FlatBM25, FlatDense, FlatFusion, FlatHybridRRF
from .data import (
    Conversation,
    Query,
    load_jsonl,
    load_locomo,
    load_realmem,
    load_realmem_excerpt,
    normalize_evidence_id,
    render_message,
)
from .longmemeval import LongMemEvalFormatError, load_longmemeval
from .metrics import answer_token_recall, content_words, count_tokens, evidence_recall, mean_by, span_recall
from .online import METRICS, EvalResult, MethodResult, QueryResult, evaluate_online
from .session_docs import FlatSessionDocs

__all__ = [
    "METRICS",
    "Conversation",
    "EvalResult",
    "FlatBM25",
    "FlatDense",
    "FlatFusion",
    "FlatHybridRRF",
    "FlatSessionDocs",
    "LongMemEvalFormatError",
    "MethodResult",
    "Query",
    "QueryResult",
    "answer_token_recall",
    "content_words",
    "count_tokens",
    "evaluate_online",
    "evidence_recall",
    "load_jsonl",
    "load_locomo",
    "load_longmemeval",
    "load_realmem",
    "load_realmem_excerpt",
    "mean_by",
    "normalize_evidence_id",
    "render_message",
    "span_recall",
]
