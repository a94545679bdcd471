"""Comparison of the hierarchical memories with the flat baselines, over per-method aggregates.

The flat baselines that count (:data:`~shared_core.eval.methods.COUNTED_BASELINES`) are dense, stemmed
BM25, RRF and ``fusion``. For every memory build, :func:`~shared_core.eval.runner.run_eval` also
evaluates its default policy and its *no-structure reference*
(:func:`~shared_core.eval.methods.reference_spec`: the flat baseline with the memory's own relevance);
:func:`compare_methods` reports per metric the memory default's margin over the best counted flat
baseline and its *tree share*, the default minus the reference (``results["comparison"]``). Also here:
the per-build facts the comparison reads (``_build_facts``) and the NaN-to-``None`` cleaning of plain
data (``_nan_to_none``) shared with the runner.

Every public name here is re-exported by :mod:`shared_core.eval.runner`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .methods import BASELINES, COUNTED_BASELINES, MethodSpec, memory_facts, reference_spec

__all__ = ["COMPARED_METRICS", "compare_methods"]

COMPARED_METRICS = ("evidence_recall", "span_recall", "answer_token_recall")
"""Metrics of the comparison with the flat baselines (plus
:data:`~shared_core.eval.runner.LLM_METRICS` when an LLM judged)."""


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def _diff(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else float(a) - float(b)


def compare_methods(
    methods: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    metrics: Sequence[str] = COMPARED_METRICS,
) -> dict[str, Any]:
    """Each memory's default policy against the flat baselines: margin over the best, and tree share.

    For every scope (``"overall"``, pooled over all queries, and each dataset) and metric:

    * best flat baseline: the highest value among the methods whose kind is in
      :data:`COUNTED_BASELINES` (ties: the first in ``methods`` order);
    * per memory build, with ``default`` = its default policy's value (``"<build>:<default_policy>"``)
      and ``reference`` = the value of its no-structure reference (:func:`reference_spec` of the
      build's relevance): ``tree_share = default - reference`` and
      ``margin_over_best_flat = default - best flat value``.

    A value is ``None`` when a side is missing (e.g. no evidence ids) and a memory whose default or
    reference was not evaluated gets a ``note``.

    Args:
        methods: per-method aggregates from :func:`~shared_core.eval.runner.aggregate_results`, in
            report order.
        facts: per memory build key, ``{"default_policy", "relevance", "hybrid_weight"}`` (from
            :func:`memory_facts` or the build itself).
        metrics: the metrics compared, default :data:`COMPARED_METRICS`.

    Returns:
        ``{"metrics": [...], "flat_baselines": [names], "best_flat": {"overall": {metric: {"method",
        "value"} or None}, "by_dataset": {label: {...}}}, "memories": {build: {"kind", "default",
        "policy", "relevance", "hybrid_weight" (None unless hybrid), "reference", "overall": {metric:
        {"default", "reference", "tree_share", "best_flat", "best_flat_method",
        "margin_over_best_flat"}}, "by_dataset": {label: {...}}}}}``.
    """
    metrics = list(metrics)
    labels = list(dict.fromkeys(lab for m in methods.values() for lab in m.get("by_dataset", {})))
    flats = [n for n, m in methods.items() if m.get("kind") in COUNTED_BASELINES]

    def value(name: str, scope: str | None, metric: str) -> Any:
        m = methods.get(name)
        if m is None:
            return None
        o = (
            m.get("overall", {})
            if scope is None
            else (m.get("by_dataset", {}).get(scope) or {}).get("overall", {})
        )
        return o.get(metric)

    def best(scope: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for metric in metrics:
            cands = [(n, value(n, scope, metric)) for n in flats]
            cands = [(n, v) for n, v in cands if v is not None]
            if not cands:
                out[metric] = None
                continue
            top = max(v for _, v in cands)
            n = next(n for n, v in cands if v == top)
            out[metric] = {"method": n, "value": float(top)}
        return out

    best_flat = {"overall": best(None), "by_dataset": {lab: best(lab) for lab in labels}}
    memories: dict[str, Any] = {}
    for m in methods.values():
        build = m.get("build")
        if m.get("kind") in BASELINES or build in memories or build not in facts:
            continue
        f = facts[build]
        default = f"{build}:{f['default_policy']}"
        ref = reference_spec(f["relevance"], f["hybrid_weight"]).name
        notes = [f"{n} was not evaluated" for n in (default, ref) if n not in methods]

        def cells(scope: str | None, default: str = default, ref: str = ref) -> dict[str, Any]:
            bf = best_flat["overall"] if scope is None else best_flat["by_dataset"][scope]
            out: dict[str, Any] = {}
            for metric in metrics:
                d, r = value(default, scope, metric), value(ref, scope, metric)
                b = bf.get(metric) or {}
                out[metric] = {
                    "default": d,
                    "reference": r,
                    "tree_share": _diff(d, r),
                    "best_flat": b.get("value"),
                    "best_flat_method": b.get("method"),
                    "margin_over_best_flat": _diff(d, b.get("value")),
                }
            return out

        memories[build] = {
            "kind": m.get("kind"),
            "default": default,
            "policy": f["default_policy"],
            "relevance": f["relevance"],
            "hybrid_weight": f["hybrid_weight"] if f["relevance"] == "hybrid" else None,
            "reference": ref,
            "overall": cells(None),
            "by_dataset": {lab: cells(lab) for lab in labels},
            **({"note": "; ".join(notes)} if notes else {}),
        }
    return _nan_to_none(
        {"metrics": metrics, "flat_baselines": flats, "best_flat": best_flat, "memories": memories}
    )


def _build_facts(
    results: Sequence[Mapping[str, Any]], specs: Sequence[MethodSpec], memory_llm: bool
) -> dict[str, dict[str, Any]]:
    """Per memory build: the facts recorded when it was built, else :func:`memory_facts`."""
    out: dict[str, dict[str, Any]] = {}
    for s in specs:
        if not s.is_memory or s.build in out:
            continue
        rec = next(
            (c["builds"][s.build]["memory"] for c in results if "memory" in c["builds"].get(s.build, {})),
            None,
        )
        out[s.build] = dict(rec) if rec is not None else memory_facts(s, memory_llm=memory_llm)
    return out
