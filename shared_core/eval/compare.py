"""Comparison of the hierarchical memories with the flat baselines, over per-method aggregates.

The flat baselines that count (:data:`~shared_core.eval.methods.COUNTED_BASELINES`) are dense, stemmed
BM25, RRF and ``fusion``. For every memory build, :func:`~shared_core.eval.runner.run_eval` also
evaluates its default policy, its ``collapsed`` policy (the same relevance without the structure) and
its *flat reference* (:func:`~shared_core.eval.methods.reference_spec`: the flat baseline with the
memory's own relevance over single messages); :func:`compare_methods` reports per metric three
numbers (``results["comparison"]``): the default's *margin* over the best counted flat baseline, the
*tree share* (default minus ``collapsed``) and the *corpus share* (``collapsed`` minus the flat
reference), each with a paired bootstrap interval when the per-query rows are given. Also here:
the per-build facts the comparison reads (``_build_facts``) and the NaN-to-``None`` cleaning of plain
data (``_nan_to_none``) shared with the runner.

Every public name here is re-exported by :mod:`shared_core.eval.runner`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..search.relevance import DEFAULT_HYBRID_WEIGHT, check_weight
from .methods import BASELINES, COUNTED_BASELINES, MethodSpec, memory_facts, reference_spec
from .protocol import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, paired_bootstrap, paired_values

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


def _weight(m: Mapping[str, Any]) -> float:
    """The dense weight of a ``fusion`` method's aggregate (its ``hybrid_weight``, default 0.5)."""
    return float((m.get("params") or {}).get("hybrid_weight", DEFAULT_HYBRID_WEIGHT))


def _fusion_weights(
    methods: Mapping[str, Any], metrics: Sequence[str], labels: Sequence[str], value: Any
) -> dict[str, Any] | None:
    """The ``fusion`` weight sweep: per scope and metric each evaluated weight's value and the best."""
    fus = {n: m for n, m in methods.items() if m.get("kind") == "fusion"}
    if len(fus) < 2:
        return None

    def scope(s: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for metric in metrics:
            vals = [(n, _weight(m), value(n, s, metric)) for n, m in fus.items()]
            vals = [x for x in vals if x[2] is not None]
            if not vals:
                out[metric] = None
                continue
            top = max(v for _, _, v in vals)
            n, w, v = next(x for x in vals if x[2] == top)
            out[metric] = {
                "values": {f"{w_:g}": float(v_) for _, w_, v_ in vals},
                "best_weight": w,
                "best_method": n,
                "best_value": float(v),
            }
        return out

    return {"overall": scope(None), "by_dataset": {lab: scope(lab) for lab in labels}}


def compare_methods(
    methods: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    metrics: Sequence[str] = COMPARED_METRICS,
    rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    fusion_weight: float | None = None,
) -> dict[str, Any]:
    """Each memory's default policy against the flat baselines: three numbers, with intervals.

    For every scope (``"overall"``, pooled over all queries, and each dataset) and metric:

    * best flat baseline: the highest value among the methods whose kind is in
      :data:`COUNTED_BASELINES` (ties: the first in ``methods`` order); with ``fusion_weight`` the only
      ``fusion`` build that counts is the one with that weight (a weight chosen on dev: on validate the
      flat fusion is held at it, as every memory parameter is), the others are reported only;
    * per memory build, with ``default`` = its default policy's value (``"<build>:<default_policy>"``),
      ``tree`` = the value of its tree policy (``"<build>:<tree_policy>"``, the policy that ranks
      through the structure, e.g. ``top_down``; the default policy when the memory names none),
      ``collapsed`` = the value of the same build's ``collapsed`` policy (every node ranked by the
      memory's own relevance, no descent: the same relevance without the structure) and ``reference``
      = the value of the flat baseline with the memory's relevance over single messages
      (:func:`reference_spec`: ``fusion`` for ``hybrid``):

      - ``margin_over_best_flat = default - best flat value``;
      - ``tree_share = tree - collapsed`` (what the tree's structure earns; when the default is the
        tree policy, ``default - collapsed``);
      - ``corpus_share = collapsed - reference`` (what ranking the memory's nodes, summaries included,
        earns over ranking single messages with the same relevance);

      so ``tree_share + corpus_share = tree - reference``.

    With ``rows`` each cell also holds ``"ci95"``: per number a paired bootstrap interval
    (:func:`~shared_core.eval.protocol.paired_bootstrap`, questions resampled, ``n_resamples`` with
    ``seed``) as ``[low, high]``, ``None`` when undefined. The margin's interval holds the best flat
    baseline fixed (the one chosen on the point values of that scope).

    A value is ``None`` when a side is missing (e.g. no evidence ids); a memory whose default,
    ``collapsed`` or reference was not evaluated gets a ``note``. With two or more ``fusion`` builds (a
    weight sweep, e.g. ``fusion,fusion[weight=0.3]``), ``"fusion_weights"`` gives per scope and metric
    each weight's value and the best weight.

    Args:
        methods: per-method aggregates from :func:`~shared_core.eval.runner.aggregate_results`, in
            report order.
        facts: per memory build key, ``{"default_policy", "tree_policy", "relevance", "hybrid_weight"}``
            (from :func:`memory_facts` or the build itself; without ``tree_policy`` the default policy).
        metrics: the metrics compared, default :data:`COMPARED_METRICS`.
        rows: per method name its per-query rows (with ``dataset``, ``conversation``, ``query_id`` and
            the metrics), default ``None`` (no intervals).
        n_resamples: bootstrap resamples, default :data:`~shared_core.eval.protocol.BOOTSTRAP_RESAMPLES`
            (10,000).
        seed: bootstrap seed, default :data:`~shared_core.eval.protocol.BOOTSTRAP_SEED` (0).
        fusion_weight: the dense weight of the one ``fusion`` build that counts, in ``[0, 1]``, default
            ``None`` (every ``fusion`` weight counts: on dev the best of a sweep is the dev-best weight).

    Returns:
        ``{"metrics": [...], "flat_baselines": [names], "fusion_weight": weight or None, "best_flat":
        {"overall": {metric: {"method", "value"} or None}, "by_dataset": {label: {...}}}, "memories":
        {build: {"kind", "default", "policy", "tree", "tree_policy", "relevance", "hybrid_weight" (None
        unless hybrid), "collapsed", "reference", "overall": {metric: {"default", "tree", "collapsed",
        "reference", "best_flat",
        "best_flat_method", "margin_over_best_flat", "tree_share", "corpus_share"[, "ci95"]}},
        "by_dataset": {label: {...}}}}, "fusion_weights": {...} or None[, "bootstrap": {"resamples",
        "seed", "level", "unit"}]}``.

    Raises:
        InvalidInputError: ``n_resamples`` below 1 (with ``rows``).
    """
    metrics = list(metrics)
    labels = list(dict.fromkeys(lab for m in methods.values() for lab in m.get("by_dataset", {})))
    if fusion_weight is not None:
        fusion_weight = check_weight(fusion_weight)
    flats = [
        n
        for n, m in methods.items()
        if m.get("kind") in COUNTED_BASELINES
        and (m.get("kind") != "fusion" or fusion_weight is None or _weight(m) == fusion_weight)
    ]

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

    def interval(a: str | None, b: str | None, scope: str | None, metric: str) -> list[float] | None:
        if rows is None or a not in rows or b not in rows:
            return None
        x, y = paired_values(rows[a], rows[b], metric, scope)
        r = paired_bootstrap(x, y, n_resamples=n_resamples, seed=seed)
        return None if r is None else [r["low"], r["high"]]

    best_flat = {"overall": best(None), "by_dataset": {lab: best(lab) for lab in labels}}
    memories: dict[str, Any] = {}
    for m in methods.values():
        build = m.get("build")
        if m.get("kind") in BASELINES or build in memories or build not in facts:
            continue
        f = facts[build]
        default = f"{build}:{f['default_policy']}"
        tree_policy = f.get("tree_policy") or f["default_policy"]
        tree = f"{build}:{tree_policy}"
        collapsed = f"{build}:collapsed"
        ref = reference_spec(f["relevance"], f["hybrid_weight"]).name
        named = dict.fromkeys((default, tree, collapsed, ref))
        notes = [f"{n} was not evaluated" for n in named if n not in methods]

        def cells(
            scope: str | None,
            default: str = default,
            tree: str = tree,
            collapsed: str = collapsed,
            ref: str = ref,
        ) -> dict[str, Any]:
            bf = best_flat["overall"] if scope is None else best_flat["by_dataset"][scope]
            out: dict[str, Any] = {}
            for metric in metrics:
                d, t, c, r = (value(n, scope, metric) for n in (default, tree, collapsed, ref))
                b = bf.get(metric) or {}
                cell = {
                    "default": d,
                    "tree": t,
                    "collapsed": c,
                    "reference": r,
                    "best_flat": b.get("value"),
                    "best_flat_method": b.get("method"),
                    "margin_over_best_flat": _diff(d, b.get("value")),
                    "tree_share": _diff(t, c),
                    "corpus_share": _diff(c, r),
                }
                if rows is not None:
                    cell["ci95"] = {
                        "margin_over_best_flat": interval(default, b.get("method"), scope, metric),
                        "tree_share": interval(tree, collapsed, scope, metric),
                        "corpus_share": interval(collapsed, ref, scope, metric),
                    }
                out[metric] = cell
            return out

        memories[build] = {
            "kind": m.get("kind"),
            "default": default,
            "policy": f["default_policy"],
            "tree": tree,
            "tree_policy": tree_policy,
            "relevance": f["relevance"],
            "hybrid_weight": f["hybrid_weight"] if f["relevance"] == "hybrid" else None,
            "collapsed": collapsed,
            "reference": ref,
            "overall": cells(None),
            "by_dataset": {lab: cells(lab) for lab in labels},
            **({"note": "; ".join(notes)} if notes else {}),
        }
    doc: dict[str, Any] = {
        "metrics": metrics,
        "flat_baselines": flats,
        "fusion_weight": fusion_weight,
        "best_flat": best_flat,
        "memories": memories,
        "fusion_weights": _fusion_weights(methods, metrics, labels, value),
    }
    if rows is not None:
        doc["bootstrap"] = {
            "resamples": int(n_resamples),
            "seed": int(seed),
            "level": BOOTSTRAP_LEVEL,
            "unit": "question (paired; conversations are too few to resample as clusters)",
            "interval": "percentile",
        }
    return _nan_to_none(doc)


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
