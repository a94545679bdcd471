"""Reports of an evaluation run: the JSON document, Markdown tables and a PNG bar chart (headless)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .aggregate import LLM_METRICS
from .compare import COMPARED_METRICS, compare_methods
from .longmemeval import longmemeval_lines
from .protocol import QUERY_ROWS_JSONL

__all__ = ["comparison_of", "markdown_table", "plot_results", "write_report"]

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "results.png"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _signed(v: Any) -> str:
    return "—" if v is None else f"{round(float(v), 3) + 0.0:+.3f}"  # + 0.0: no "-0.000"


_SHARES = ("margin_over_best_flat", "tree_share", "corpus_share")

_LABELS = {
    "evidence_recall": "evidence recall@{k}",
    "span_recall": "span recall@{k}",
    "subtree_recall": "subtree recall@{k}",
    "answer_token_recall": "answer-token recall",
    "llm_accuracy": "LLM-judge accuracy",
    "rouge_l_recall": "ROUGE-L recall",
}


def _label(metric: str, k: Any) -> str:
    return _LABELS.get(metric, metric).format(k=k)


def comparison_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document's ``comparison`` section, or one computed from its method aggregates.

    A document without the section (written before it existed) gets the best flat baselines only: the
    memories' relevance is not recorded there.

    Args:
        doc: a results document.

    Returns:
        The comparison (see :func:`~shared_core.eval.runner.compare_methods`).
    """
    comp = doc.get("comparison")
    if comp:
        return dict(comp)
    llm = doc.get("config", {}).get("llm")
    return compare_methods(doc.get("methods", {}), {}, [*COMPARED_METRICS, *(LLM_METRICS if llm else ())])


def _with_ci(c: Mapping[str, Any], key: str) -> str:
    """A signed difference with its 95% interval when there is one, e.g. ``+0.050 [+0.010, +0.090]``."""
    text = _signed(c.get(key))
    ci = (c.get("ci95") or {}).get(key)
    if ci and c.get(key) is not None:
        text += f" [{_signed(ci[0])}, {_signed(ci[1])}]"
    return text


def _comparison_lines(comp: Mapping[str, Any], scope: str | None, k: Any, title: str) -> list[str]:
    """The "against the flat baselines" table of one scope (``None`` = overall)."""
    mems = comp.get("memories", {})
    if not mems:
        return []
    lines = [
        f"### {title}",
        "",
        "| memory default | relevance | metric | default | best flat baseline | margin | tree policy | "
        "collapsed | tree share | flat reference | corpus share |",
        "|---|---|---|---:|---|---:|---|---:|---:|---|---:|",
    ]
    for build, m in mems.items():
        cells = m.get("overall", {}) if scope is None else m.get("by_dataset", {}).get(scope, {})
        rel = m.get("relevance", "?")
        if m.get("hybrid_weight") is not None:
            rel += f", w = {m['hybrid_weight']:g}"
        first = True
        for metric in comp.get("metrics", []):
            c = cells.get(metric) or {}
            best = "—"
            if c.get("best_flat") is not None:
                best = f"{c.get('best_flat_method')} {_fmt(c['best_flat'])}"
            ref = f"{m.get('reference')} {_fmt(c.get('reference'))}"
            lines.append(
                "| "
                + " | ".join(
                    [
                        m.get("default", build) if first else "",
                        rel if first else "",
                        _label(metric, k),
                        _fmt(c.get("default")),
                        best,
                        _with_ci(c, "margin_over_best_flat"),
                        f"{m.get('tree_policy', '?')} {_fmt(c.get('tree'))}",
                        _fmt(c.get("collapsed")),
                        _with_ci(c, "tree_share"),
                        ref,
                        _with_ci(c, "corpus_share"),
                    ]
                )
                + " |"
            )
            first = False
    notes = [f"{m.get('default', b)}: {m['note']}" for b, m in mems.items() if m.get("note")]
    lines.append("")
    if notes:
        lines += ["Not computable: " + "; ".join(notes) + ".", ""]
    return lines


def _fusion_lines(comp: Mapping[str, Any], split: Any) -> list[str]:
    """The fusion weight sweep (two or more ``fusion`` weights): each weight's value, the best one."""
    fw = comp.get("fusion_weights")
    if not fw:
        return []
    where = f"the {split} split" if split else "this run's data"
    lines = [f"### Flat fusion weight sweep (best weight on {where}, all queries pooled)", ""]
    if comp.get("fusion_weight") is not None:
        lines += [
            f"Reported only: the fusion weight that counts as a flat baseline is {comp['fusion_weight']:g}, "
            "chosen on dev.",
            "",
        ]
    lines += ["| metric | " + " | ".join(["values by dense weight w", "best w", "best value"]) + " |"]
    lines += ["|---|---|---:|---:|"]
    for metric, c in (fw.get("overall") or {}).items():
        if not c:
            continue
        vals = ", ".join(f"{w}: {_fmt(v)}" for w, v in c["values"].items())
        lines.append(f"| {metric} | {vals} | {c['best_weight']:g} | {_fmt(c['best_value'])} |")
    return [*lines, ""]


def _datasets(doc: Mapping[str, Any]) -> list[str]:
    labels = list(doc.get("data", {}))
    seen = {lab for m in doc.get("methods", {}).values() for lab in m.get("by_dataset", {})}
    return [lab for lab in labels if lab in seen] or sorted(seen)


def markdown_table(doc: Mapping[str, Any]) -> str:
    """Markdown tables of a results document: one headline table and one per-category table per dataset.

    Headline columns: evidence recall@k (leaf level), span recall@k, answer-token recall, mean returned
    tokens, median retrieval latency (ms), construction CPU ms and embedding / LLM calls per message,
    plus LLM-judge accuracy and ROUGE-L recall when an LLM was configured; the best flat baseline of
    each quality column is in bold. Per dataset (and pooled, with several datasets) a table of every
    memory's default policy against the flat baselines: margin over the best one, tree share and corpus
    share, with their 95% bootstrap intervals when computed; then the fusion weight sweep, if any.

    Args:
        doc: the document returned by :func:`~shared_core.eval.runner.run_eval`.

    Returns:
        The Markdown text (ends with a newline).
    """
    cfg = doc.get("config", {})
    k = cfg.get("k", "k")
    llm = cfg.get("llm")
    methods: Mapping[str, Any] = doc.get("methods", {})
    comp = comparison_of(doc)
    flats = comp.get("flat_baselines", [])
    lines = ["# hiermem eval", ""]
    facts = [f"k = {k} hits per query"]
    if cfg.get("max_tokens"):
        facts.append(f"budget {cfg['max_tokens']} returned tokens per query")
    facts.append(f"embedder {cfg.get('embedder')}")
    if cfg.get("split"):
        facts.append(f"split {cfg['split']} ({', '.join(cfg.get('split_files') or [])})")
    facts.append(f"add batches: {cfg.get('add_batch')}")
    if cfg.get("render") not in (None, "plain"):
        facts.append(f"returned texts rendered {cfg['render']} for every method")
    if cfg.get("max_queries"):
        facts.append(f"first {cfg['max_queries']} queries per conversation")
    if llm:
        facts.append(f"answers and judge: {llm}")
    lines += ["; ".join(facts) + ".", ""]
    for label in _datasets(doc):
        data = doc.get("data", {}).get(label, {})
        convs = data.get("conversations", {})
        n_eval = sum(int(c.get("queries_evaluated", 0)) for c in convs.values())
        lines.append(
            f"## {label} ({data.get('source', '?')}: {len(convs)} conversation(s), {n_eval} queries; "
            f"{data.get('skipped_evidence', 0)} evidence ids and {data.get('skipped_queries', 0)} queries "
            "left out as unresolvable)"
        )
        lines.append("")
        head = [
            "method",
            f"evidence recall@{k}",
            f"span recall@{k}",
            f"subtree recall@{k}",
            "answer-token recall",
            "returned tokens",
            "latency ms (median)",
            "build CPU ms/msg",
            "embed calls/msg",
            "LLM calls/msg",
        ]
        if llm:
            head += ["LLM-judge accuracy", "ROUGE-L recall"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|---" + "|---:" * (len(head) - 1) + "|")
        cats: list[str] = []
        for name, m in methods.items():
            ds = m.get("by_dataset", {}).get(label)
            if not ds:
                continue
            o, c = ds["overall"], ds["construction"]
            best = comp.get("best_flat", {}).get("by_dataset", {}).get(label, {})

            def cell(metric: str, o: Mapping[str, Any] = o, name: str = name, best: Any = best) -> str:
                text = _fmt(o.get(metric))
                b = best.get(metric) or {}
                tied = name in flats and o.get(metric) is not None and o.get(metric) == b.get("value")
                return f"**{text}**" if tied else text

            row = [
                name,
                cell("evidence_recall"),
                cell("span_recall"),
                _fmt(o.get("subtree_recall")),
                cell("answer_token_recall"),
                _fmt(o.get("returned_tokens"), 0),
                _fmt(o.get("latency_ms_median"), 2),
                _fmt(c.get("cpu_ms_per_message"), 1),
                _fmt(c.get("embed_calls_per_message"), 2),
                _fmt(c.get("llm_calls_per_message"), 2),
            ]
            if llm:
                row += [cell("llm_accuracy"), cell("rouge_l_recall")]
            lines.append("| " + " | ".join(row) + " |")
            cats += [cat for cat in ds.get("by_category", {}) if cat not in cats]
        lines.append("")
        if flats:
            lines += [
                "Bold: the best flat baseline(s) of the column (of "
                + ", ".join(flats)
                + "; the flat baselines that count are dense, stemmed BM25, RRF and fusion"
                + (" and sessions as documents" if any(f.startswith("session_docs") for f in flats) else "")
                + (
                    f", fusion only at the dev-chosen weight {comp['fusion_weight']:g}"
                    if comp.get("fusion_weight") is not None
                    else ""
                )
                + ").",
                "",
            ]
        if all(c.lstrip("-").isdigit() for c in cats):
            cats.sort(key=int)
        if len(cats) > 1:
            lines.append(f"Evidence recall@{k} by category ({label}):")
            lines.append("")
            lines.append("| method | " + " | ".join(cats) + " |")
            lines.append("|---" + "|---:" * len(cats) + "|")
            for name, m in methods.items():
                ds = m.get("by_dataset", {}).get(label)
                if not ds:
                    continue
                bc = ds.get("by_category", {})
                lines.append(
                    "| "
                    + name
                    + " | "
                    + " | ".join(_fmt((bc.get(cat) or {}).get("evidence_recall")) for cat in cats)
                    + " |"
                )
            lines.append("")
        lines += longmemeval_lines(doc, label)
        lines += _comparison_lines(comp, label, k, f"Memories against the flat baselines ({label})")
    if len(_datasets(doc)) > 1:
        lines += _comparison_lines(comp, None, k, "Memories against the flat baselines (all queries pooled)")
    lines += _fusion_lines(comp, cfg.get("split"))
    if comp.get("memories"):
        lines.append(
            "Margin: a memory's default policy minus the best flat baseline of the metric. Tree share: the "
            "memory's tree policy (the one that ranks through the structure, e.g. `top_down`) minus the "
            "same memory's `collapsed` policy (every node ranked by the same relevance, no structure). "
            "Corpus share: `collapsed` minus the flat reference, the flat baseline with the "
            "memory's own relevance (dense: flat_dense, bm25: bm25, hybrid: fusion with the same weight) "
            "over single messages. Tree share + corpus share = tree policy - flat reference; when the "
            "default is the tree policy, margin = tree share + corpus share + (flat reference - best flat), "
            "and when it is `collapsed`, margin = corpus share + (flat reference - best flat)."
        )
        boot = comp.get("bootstrap")
        if boot:
            lines.append(
                f"Brackets: {100 * boot['level']:g}% paired bootstrap intervals ({boot['resamples']:,} "
                f"resamples of the questions, seed {boot['seed']}, percentile); the margin's interval "
                "holds the best flat baseline fixed. Per-query rows: queries.jsonl."
            )
        lines.append("")
    lines.append(
        "Evidence recall counts leaf hits only; span recall counts the messages a hit's text shows (a "
        "summary: those whose sentences it quotes); subtree recall counts every leaf under any hit, "
        "whether or not its text shows it (reported, not compared). Latency excludes the query "
        "embedding when the embedding cache is on (shared by every method)."
    )
    return "\n".join(lines) + "\n"


def plot_results(doc: Mapping[str, Any], path: str | Path, metrics: Sequence[str] | None = None) -> Path:
    """Horizontal grouped bar charts, one column of panels per dataset.

    Top row: one group of bars per method, with a dashed line at the best flat baseline's evidence
    recall. Bottom row (when the run has memories): per memory default policy, its evidence-recall margin
    over the best flat baseline, its tree share (its tree policy minus ``collapsed``) and its corpus share
    (``collapsed`` minus the flat reference), with 95% bootstrap intervals as error bars when computed.

    Args:
        doc: the results document.
        path: the PNG file to write (parent directories are created).
        metrics: metrics of the top row, default evidence recall, span recall, answer-token recall (and
            LLM-judge accuracy when present).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = doc.get("config", {}).get("k", "k")
    if metrics is None:
        metrics = ["evidence_recall", "span_recall", "answer_token_recall"]
        if doc.get("config", {}).get("llm"):
            metrics.append("llm_accuracy")
    datasets = _datasets(doc) or ["(no data)"]
    names = list(doc.get("methods", {}))
    comp = comparison_of(doc)
    mems = comp.get("memories", {})
    top_h = max(3.0, 0.3 * len(names) * max(1, len(metrics)) / 2 + 1.5)
    bottom_h = max(1.8, 0.45 * len(mems) + 1.0) if mems else 0.0
    rows = 2 if mems else 1
    n_legend = len(metrics) + 1 + (3 if mems else 0)
    ncol = max(1, min(n_legend, 2 * len(datasets)))
    legend_h = 0.25 * -(-n_legend // ncol) + 0.2  # inches below the panels
    fig_h = top_h + bottom_h + legend_h + 0.4
    fig, axes = plt.subplots(
        rows,
        len(datasets),
        figsize=(6.5 * len(datasets), fig_h),
        squeeze=False,
        gridspec_kw={"height_ratios": [top_h, bottom_h] if mems else [top_h]},
    )
    bar_h = 0.8 / max(1, len(metrics))
    for ax, label in zip(axes[0], datasets):
        for j, m in enumerate(metrics):
            vals = []
            for n in names:
                ds = doc["methods"][n].get("by_dataset", {}).get(label) or {}
                v = (ds.get("overall") or {}).get(m)
                vals.append(0.0 if v is None else float(v))
            ys = [i + (j - (len(metrics) - 1) / 2) * bar_h for i in range(len(names))]
            ax.barh(ys, vals, height=bar_h, label=_label(m, k))
        best = (comp.get("best_flat", {}).get("by_dataset", {}).get(label) or {}).get("evidence_recall")
        if best:
            ax.axvline(
                best["value"],
                color="0.25",
                linestyle="--",
                linewidth=0.9,
                label="best flat evidence recall",
            )
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles, names_ = axes[0][0].get_legend_handles_labels()
    if mems:
        builds = list(mems)
        ylabels = [mems[b].get("default", b) for b in builds]
        span = 0.05
        for label in datasets:
            for b in builds:
                c = ((mems[b].get("by_dataset", {}).get(label) or {}).get("evidence_recall")) or {}
                for key in _SHARES:
                    if c.get(key) is not None:
                        span = max(span, abs(float(c[key])))
                    ci = (c.get("ci95") or {}).get(key)
                    if ci:
                        span = max(span, abs(float(ci[0])), abs(float(ci[1])))
        for ax, label in zip(axes[1], datasets):
            series = (
                ("margin over best flat", "margin_over_best_flat", "#8172b3"),
                ("tree share (tree policy - collapsed)", "tree_share", "#937860"),
                ("corpus share (collapsed - flat reference)", "corpus_share", "#55a868"),
            )
            for j, (text, key, color) in enumerate(series):
                vals, err = [], [[], []]
                for b in builds:
                    c = ((mems[b].get("by_dataset", {}).get(label) or {}).get("evidence_recall")) or {}
                    v = c.get(key)
                    vals.append(0.0 if v is None else float(v))
                    ci = (c.get("ci95") or {}).get(key)
                    err[0].append(0.0 if not ci or v is None else max(0.0, float(v) - ci[0]))
                    err[1].append(0.0 if not ci or v is None else max(0.0, ci[1] - float(v)))
                ys = [i + (j - 1) * 0.27 for i in range(len(builds))]
                ax.barh(ys, vals, height=0.27, color=color, label=text, xerr=err, capsize=2)
            ax.axvline(0.0, color="0.2", linewidth=0.8)
            ax.set_yticks(range(len(builds)))
            ax.set_yticklabels(ylabels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlim(-1.15 * span, 1.15 * span)
            ax.set_title(f"{label}: evidence recall@{k}, memory default minus flat", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
        h2, n2 = axes[1][0].get_legend_handles_labels()
        handles, names_ = handles + h2, names_ + n2
    fig.legend(handles, names_, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_h / fig_h, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_report(doc: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``results.json``, ``results.md`` and ``results.png`` into ``out_dir``.

    Sets ``doc["files"]`` to the written file names (relative to ``out_dir``) before writing the JSON.

    Args:
        doc: the results document.
        out_dir: the directory (created when missing).

    Returns:
        ``{"json": ..., "markdown": ..., "png": ...}`` file names.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "json": RESULTS_JSON,
        "markdown": RESULTS_MD,
        "png": RESULTS_PNG,
        "conversations": "conversations/",
    }
    if (d / QUERY_ROWS_JSONL).is_file():
        files["queries"] = QUERY_ROWS_JSONL
    doc["files"] = files
    (d / RESULTS_MD).write_text(markdown_table(doc), encoding="utf-8")
    plot_results(doc, d / RESULTS_PNG)
    tmp = d / (RESULTS_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    tmp.replace(d / RESULTS_JSON)
    return files
