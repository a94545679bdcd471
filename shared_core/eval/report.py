"""Reports of an evaluation run: the JSON document, Markdown tables and a PNG bar chart (headless)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["markdown_table", "plot_results", "write_report"]

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "results.png"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _datasets(doc: Mapping[str, Any]) -> list[str]:
    labels = list(doc.get("data", {}))
    seen = {lab for m in doc.get("methods", {}).values() for lab in m.get("by_dataset", {})}
    return [lab for lab in labels if lab in seen] or sorted(seen)


def markdown_table(doc: Mapping[str, Any]) -> str:
    """Markdown tables of a results document: one headline table and one per-category table per dataset.

    Headline columns: evidence recall@k (leaf level), span recall@k, answer-token recall, mean returned
    tokens, median retrieval latency (ms), construction CPU ms and embedding / LLM calls per message,
    plus LLM-judge accuracy and ROUGE-L recall when an LLM was configured.

    Args:
        doc: the document returned by :func:`~shared_core.eval.runner.run_eval`.

    Returns:
        The Markdown text (ends with a newline).
    """
    cfg = doc.get("config", {})
    k = cfg.get("k", "k")
    llm = cfg.get("llm")
    methods: Mapping[str, Any] = doc.get("methods", {})
    lines = ["# hiermem eval", ""]
    facts = [f"k = {k} hits per query"]
    if cfg.get("max_tokens"):
        facts.append(f"budget {cfg['max_tokens']} returned tokens per query")
    facts.append(f"embedder {cfg.get('embedder')}")
    facts.append(f"add batches: {cfg.get('add_batch')}")
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
            row = [
                name,
                _fmt(o.get("evidence_recall")),
                _fmt(o.get("span_recall")),
                _fmt(o.get("answer_token_recall")),
                _fmt(o.get("returned_tokens"), 0),
                _fmt(o.get("latency_ms_median"), 2),
                _fmt(c.get("cpu_ms_per_message"), 1),
                _fmt(c.get("embed_calls_per_message"), 2),
                _fmt(c.get("llm_calls_per_message"), 2),
            ]
            if llm:
                row += [_fmt(o.get("llm_accuracy")), _fmt(o.get("rouge_l_recall"))]
            lines.append("| " + " | ".join(row) + " |")
            cats += [cat for cat in ds.get("by_category", {}) if cat not in cats]
        lines.append("")
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
    lines.append(
        "Evidence recall counts leaf hits only; span recall counts every leaf under any hit. Latency "
        "excludes the query embedding when the embedding cache is on (shared by every method)."
    )
    return "\n".join(lines) + "\n"


def plot_results(doc: Mapping[str, Any], path: str | Path, metrics: Sequence[str] | None = None) -> Path:
    """Horizontal grouped bar chart: one panel per dataset, one group of bars per method.

    Args:
        doc: the results document.
        path: the PNG file to write (parent directories are created).
        metrics: metrics to draw, default evidence recall, span recall, answer-token recall (and
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
    labels = {
        "evidence_recall": f"evidence recall@{k}",
        "span_recall": f"span recall@{k}",
        "answer_token_recall": "answer-token recall",
        "llm_accuracy": "LLM-judge accuracy",
        "rouge_l_recall": "ROUGE-L recall",
    }
    datasets = _datasets(doc) or ["(no data)"]
    names = list(doc.get("methods", {}))
    height = max(3.0, 0.3 * len(names) * max(1, len(metrics)) / 2 + 2.0)
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), height), squeeze=False)
    bar_h = 0.8 / max(1, len(metrics))
    for ax, label in zip(axes[0], datasets):
        for j, m in enumerate(metrics):
            vals = []
            for n in names:
                ds = doc["methods"][n].get("by_dataset", {}).get(label) or {}
                v = (ds.get("overall") or {}).get(m)
                vals.append(0.0 if v is None else float(v))
            ys = [i + (j - (len(metrics) - 1) / 2) * bar_h for i in range(len(names))]
            ax.barh(ys, vals, height=bar_h, label=labels.get(m, m))
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles, names_ = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names_, loc="lower center", ncol=len(metrics), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
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
    doc["files"] = files
    (d / RESULTS_MD).write_text(markdown_table(doc), encoding="utf-8")
    plot_results(doc, d / RESULTS_PNG)
    tmp = d / (RESULTS_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    tmp.replace(d / RESULTS_JSON)
    return files
