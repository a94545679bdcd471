"""Aggregation of per-query rows into per-method figures (:func:`aggregate_results`), re-exported by
:mod:`shared_core.eval.runner`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..types import Usage
from .compare import _nan_to_none
from .longmemeval import LME_METRICS
from .methods import MethodSpec

__all__ = ["LLM_METRICS", "QUERY_METRICS", "aggregate_results", "pooled"]

QUERY_METRICS = (
    "evidence_recall",
    "span_recall",
    "subtree_recall",
    "answer_token_recall",
    "returned_tokens",
    "n_hits",
    "latency_ms",
    "latency_cpu_ms",
)
"""Per-query figures averaged per method (NaN/None entries ignored)."""

LLM_METRICS = ("llm_accuracy", "rouge_l_recall")
"""Per-query figures added when an LLM answers and judges (``llm_accuracy`` = the judge's 0/1)."""


def _mean(vals: Iterable[Any]) -> float | None:
    xs = [float(v) for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(xs)) if xs else None


def pooled(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows that pooled figures and intervals count: all but abstention questions' (LongMemEval,
    ``"abstention": true``), which are reported apart, under their own category."""
    return [r for r in rows if not r.get("abstention")]


def _summary(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"n_queries": len(rows)}
    for m in metrics:
        out[m] = _mean(r.get(m) for r in rows)
    lat = [r["latency_ms"] for r in rows if r.get("latency_ms") is not None]
    out["latency_ms_median"] = float(np.median(lat)) if lat else None
    out["latency_ms_p95"] = float(np.percentile(lat, 95)) if lat else None
    if "llm_accuracy" in metrics:
        out["judged"] = sum(1 for r in rows if r.get("llm_accuracy") is not None)
    return out


def _by_category(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get("category")), []).append(r)
    return {c: _summary(g, metrics) for c, g in groups.items()}


def _construction(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    n = sum(int(p.get("messages", 0)) for p in parts)
    tot = Usage()
    wall = cpu = r_wall = r_cpu = 0.0
    for p in parts:
        tot += Usage(**p.get("usage", {}))
        wall += float(p.get("wall_seconds", 0.0))
        cpu += float(p.get("cpu_seconds", 0.0))
        r_wall += float(p.get("refresh_wall_seconds", 0.0))
        r_cpu += float(p.get("refresh_cpu_seconds", 0.0))
    per = max(n, 1)
    return {
        "messages": n,
        "embed_calls_per_message": tot.embed_calls / per,
        "embedded_texts_per_message": tot.embedded_texts / per,
        "llm_calls_per_message": tot.llm_calls / per,
        "prompt_tokens_per_message": tot.prompt_tokens / per,
        "completion_tokens_per_message": tot.completion_tokens / per,
        "model_seconds_per_message": tot.seconds / per,
        "wall_ms_per_message": 1e3 * (wall + r_wall) / per,
        "cpu_ms_per_message": 1e3 * (cpu + r_cpu) / per,
        "refresh_cpu_ms_per_message": 1e3 * r_cpu / per,
        "total": {
            **tot.to_dict(),
            "wall_seconds": wall,
            "cpu_seconds": cpu,
            "refresh_wall_seconds": r_wall,
            "refresh_cpu_seconds": r_cpu,
        },
    }


def aggregate_results(
    conv_results: Sequence[Mapping[str, Any]], specs: Sequence[MethodSpec], *, with_llm: bool = False
) -> dict[str, Any]:
    """Pool per-conversation results into per-method aggregates.

    Args:
        conv_results: outputs of :func:`evaluate_conversation`.
        specs: the methods, in report order.
        with_llm: include :data:`LLM_METRICS`.

    Returns:
        ``{name: {"build", "kind", "policy", "overall", "by_category", "by_dataset": {label: {"overall",
        "by_category", "construction"}}, "construction"}}``; ``overall`` holds the mean of each metric
        (``None`` when undefined), ``n_queries``, ``latency_ms_median`` and ``latency_ms_p95``, over the
        :func:`pooled` rows (abstention questions only under their category);
        ``construction`` the build's cost per message (shared by the policies of one build). The
        LongMemEval metrics (:data:`~shared_core.eval.longmemeval.LME_METRICS`) are averaged when rows
        hold them.
    """
    metrics = list(QUERY_METRICS) + (list(LLM_METRICS) if with_llm else [])
    every = [r for c in conv_results for m in c["methods"].values() for r in m.get("queries", [])]
    metrics += [m for m in LME_METRICS if any(m in r for r in every)]
    out: dict[str, Any] = {}
    for s in specs:
        rows = [r for c in conv_results for r in c["methods"].get(s.name, {}).get("queries", [])]
        parts = [c["builds"][s.build] for c in conv_results if s.build in c["builds"]]
        by_ds: dict[str, Any] = {}
        for label in dict.fromkeys(c["dataset"] for c in conv_results):
            ds_rows = [r for r in rows if r.get("dataset") == label]
            ds_parts = [
                c["builds"][s.build] for c in conv_results if c["dataset"] == label and s.build in c["builds"]
            ]
            by_ds[label] = {
                "overall": _summary(pooled(ds_rows), metrics),
                "by_category": _by_category(ds_rows, metrics),
                "construction": _construction(ds_parts),
            }
        out[s.name] = {
            **s.to_dict(),
            "overall": _summary(pooled(rows), metrics),
            "by_category": _by_category(rows, metrics),
            "by_dataset": by_ds,
            "construction": _construction(parts),
        }
    return _nan_to_none(out)
