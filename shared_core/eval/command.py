"""The ``hiermem eval`` command as a plain typer-compatible function.

Register it on a typer app with ``app.command("eval")(eval_command)``; ``hiermem bench`` is
:func:`shared_core.bench.command.bench_command`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from ..types import HierMemError

__all__ = ["eval_command"]

_console = Console(stderr=False)


def _fail(e: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/bold red] {e}")
    return typer.Exit(code=2)


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None or not text.strip() or text.strip().lower() in ("all", "none"):
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}.") from None


def _num(v: Any, signed: bool = False) -> str:
    return "—" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")


def _ci(c: Any, key: str) -> str:
    """A signed difference and its 95% interval, e.g. ``+0.050 [+0.010, +0.090]``."""
    ci = (c.get("ci95") or {}).get(key)
    text = _num(c.get(key), True)
    return text + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci and c.get(key) is not None else "")


def _make_llm(spec: str | None, base_url: str | None) -> Any:
    if spec is None:
        return None
    from ..models.openai_models import OpenAIChat
    from .judge import parse_llm_spec

    _, model = parse_llm_spec(spec)
    return OpenAIChat(model, base_url=base_url)


def _make_embedder(spec: str, base_url: str | None) -> Any:
    spec = (spec or "local").strip()
    if spec.lower() == "local":
        return None  # run_eval's default: the embedded LocalEmbedder
    from ..models.openai_models import OpenAIEmbedder
    from .judge import parse_llm_spec

    try:
        _, model = parse_llm_spec(spec)
    except HierMemError:
        raise typer.BadParameter(
            "--embedder must be 'local' or 'openai:MODEL' (e.g. openai:text-embedding-3-small), "
            f"got {spec!r}."
        ) from None
    return OpenAIEmbedder(model, base_url=base_url)


def _recorded_command(argv: list[str]) -> str:
    """The command line as recorded in results.json: absolute paths reduced to their last part."""
    words = []
    for a in argv:
        name, eq, val = a.partition("=")
        if eq and name.startswith("--") and Path(val).is_absolute():
            a = f"{name}={Path(val).name}"
        elif Path(a).is_absolute():
            a = Path(a).name
        words.append(shlex.quote(a))
    return " ".join(["hiermem", "eval", *words])


def eval_command(
    split: str | None = typer.Option(
        None,
        "--split",
        help="A named split under --data: dev (LoCoMo conv-26, conv-30; RealMem Kenta_Tanaka; LongMemEval_S "
        "dev) or validate (LoCoMo conv-49, conv-50; RealMem Pak_Budi, Oliver_Smith; LongMemEval_S validate). "
        "Choose on dev, confirm on validate.",
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="Data root holding locomo/, realmem/ and longmemeval/ for --split (default: $HIERMEM_DATA, else "
        "../shared/data from the current directory).",
    ),
    locomo: list[Path] = typer.Option([], "--locomo", help="LoCoMo JSON file (repeat for several)."),
    realmem: list[Path] = typer.Option([], "--realmem", help="RealMem persona JSON file (repeatable)."),
    jsonl: list[Path] = typer.Option([], "--jsonl", help="JSON Lines conversation (repeatable)."),
    longmemeval: list[Path] = typer.Option(
        [],
        "--longmemeval",
        help="LongMemEval file (longmemeval_s format; repeatable): each question's haystack in one add per "
        "method, then the question; turn recall, session recall_any/all at 5 and 10, NDCG@10 per type.",
    ),
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=1,
        help="Evaluate only N questions of each LongMemEval file, spread over the question types (quick "
        "runs; pick questions by id with --conversations).",
    ),
    realmem_excerpt: bool = typer.Option(
        False, "--realmem-excerpt", help="Also evaluate the RealMem excerpt bundled with the package."
    ),
    methods: str = typer.Option(
        "all",
        "--methods",
        help="Comma-separated: segtree, memtree, hat, xmemory (every policy), kind:policy "
        "(e.g. segtree:top_down), kind[option=value]:policy, flat_dense, bm25 (stemmed), "
        "bm25_unstemmed, hybrid (RRF), fusion (max-normalised dense + stemmed BM25, "
        "fusion[weight=W], several weights make a sweep); or all / memories / baselines. Each memory "
        "also gets its default policy, its tree policy and its collapsed policy (tree share) and its "
        "flat reference baseline (corpus share).",
    ),
    k: int = typer.Option(10, "--k", min=1, help="Hits retrieved per query (recall@k)."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Budget of returned tokens per query (default: none)."
    ),
    conversations: str | None = typer.Option(
        None, "--conversations", help="Comma-separated conversation ids to evaluate (default: all)."
    ),
    max_queries: int | None = typer.Option(
        None, "--max-queries", min=1, help="Evaluate only the first N queries of each conversation."
    ),
    categories: str = typer.Option(
        "1,2,3,4", "--categories", help="LoCoMo QA categories ('all' keeps category 5 too)."
    ),
    add_batch: str = typer.Option(
        "session", "--add-batch", help="Messages per add call: session, query (between queries) or message."
    ),
    out: Path = typer.Option(Path("hiermem-eval"), "--out", help="Output directory."),
    llm: str | None = typer.Option(
        None,
        "--llm",
        help="openai:MODEL: generate answers from the hits and judge them (API key from OPENAI_API_KEY).",
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", help="Endpoint of an OpenAI-compatible server for --llm."
    ),
    embedder: str = typer.Option(
        "local",
        "--embedder",
        help="Embedder of every method: local (all-MiniLM-L6-v2, offline) or openai:MODEL (uses --base-url).",
    ),
    llm_memories: bool = typer.Option(
        False, "--llm-memories/--no-llm-memories", help="Give the --llm to the memories too."
    ),
    embed_cache: bool = typer.Option(
        True, "--embed-cache/--no-embed-cache", help="Share embeddings between methods (same vectors)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Skip conversations whose results are already in --out."
    ),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", help="Show a progress bar on stderr (when it is a terminal)."
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Processes evaluating questions side by side, each with one thread (default: the number of "
        "CPUs, at most 8; 1 with --llm or an OpenAI embedder). The results do not depend on it.",
    ),
    embed_cache_dir: Path | None = typer.Option(
        None,
        "--embed-cache-dir",
        help="Keep each conversation's embeddings here and reuse them on re-runs (default: eval-embeddings "
        "under $HIERMEM_CACHE_DIR, else ~/.cache/hiermem). The results do not depend on it.",
    ),
    disk_cache: bool = typer.Option(
        True, "--disk-cache/--no-disk-cache", help="Keep embeddings on disk between runs (--embed-cache-dir)."
    ),
    fusion_weight: float | None = typer.Option(
        None,
        "--fusion-weight",
        min=0.0,
        max=1.0,
        help="The flat fusion weight chosen on dev: fusion[weight=W] is added and is the only fusion weight "
        "counted as a flat baseline (default: the dev-chosen weight with --split validate, else every "
        "fusion weight evaluated counts).",
    ),
    render: str = typer.Option(
        "plain",
        "--render",
        help="Returned texts as scored, for every method alike: plain (as stored) or dated (message "
        "leaves as '[8 May 2023] speaker: text', the form of xMemory's facts).",
    ),
) -> None:
    """Evaluate memories and flat baselines online on LoCoMo / RealMem / LongMemEval / JSONL conversations.

    One memory per conversation and method, messages added in arrival order, every policy of a memory
    asked each query at its position. Writes results.json (full configuration, per-method and
    per-category aggregates, each memory's margin over the best flat baseline, tree share and corpus
    share with paired bootstrap 95% intervals), results.md, results.png, queries.jsonl (one line per
    question and method) and per-conversation files to --out.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .embed_store import default_embed_cache_dir
    from .parallel import default_workers
    from .report import RESULTS_JSON, RESULTS_MD, RESULTS_PNG
    from .runner import run_eval

    try:
        cats = _ints(categories, "--categories")
        chat = _make_llm(llm, base_url)
        emb = _make_embedder(embedder, base_url)
        if workers is None:
            workers = 1 if chat is not None or emb is not None else default_workers()
        doc = run_eval(
            locomo=locomo,
            realmem=realmem,
            jsonl=jsonl,
            realmem_excerpt=realmem_excerpt,
            methods=methods,
            k=k,
            max_tokens=max_tokens,
            conversations=[c.strip() for c in conversations.split(",") if c.strip()]
            if conversations
            else None,
            max_queries=max_queries,
            categories=cats,
            add_batch=add_batch,
            out=out,
            llm=chat,
            llm_name=llm,
            llm_memories=llm_memories,
            embedder=emb,
            embed_cache=embed_cache,
            resume=resume,
            progress=progress,
            command=_recorded_command(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "eval" else None,
            split=split,
            data_root=data,
            fusion_weight=fusion_weight,
            render=render,
            longmemeval=longmemeval,
            limit=limit,
            workers=workers,
            cache_dir=(embed_cache_dir or default_embed_cache_dir()) if disk_cache else None,
        )
    except HierMemError as e:
        raise _fail(e) from None
    table = Table(title=f"hiermem eval: recall@{k} (pooled over {len(doc['data'])} input(s))")
    for col in ("method", f"evidence R@{k}", f"span R@{k}", "answer-token R", "tokens", "ms"):
        table.add_column(col, justify="left" if col == "method" else "right")
    if llm:
        table.add_column("LLM acc", justify="right")
    for name, m in doc["methods"].items():
        o = m["overall"]
        cells = [
            name,
            *(
                "—" if o.get(x) is None else f"{o[x]:.3f}"
                for x in ("evidence_recall", "span_recall", "answer_token_recall")
            ),
            "—" if o.get("returned_tokens") is None else f"{o['returned_tokens']:.0f}",
            "—" if o.get("latency_ms_median") is None else f"{o['latency_ms_median']:.2f}",
        ]
        if llm:
            cells.append("—" if o.get("llm_accuracy") is None else f"{o['llm_accuracy']:.3f}")
        table.add_row(*cells)
    _console.print(table)
    lme_cols = ("turn_recall@5", "turn_recall@10", "session_recall_all@5", "session_recall_all@10", "ndcg@10")
    if any(m["overall"].get("turn_recall@10") is not None for m in doc["methods"].values()):
        lme = Table(title="LongMemEval (pooled; abstention questions apart, see results.md)")
        for col in ("method", *lme_cols):
            lme.add_column(col, justify="left" if col == "method" else "right")
        for name, m in doc["methods"].items():
            lme.add_row(name, *(_num(m["overall"].get(c)) for c in lme_cols))
        _console.print(lme)
    mems = doc.get("comparison", {}).get("memories", {})
    if mems:
        share = Table(title=f"memory defaults against the flat baselines: evidence R@{k} (pooled)")
        for col in (
            "memory default",
            "relevance",
            "evidence R",
            "best flat",
            "margin",
            "tree policy",
            "collapsed",
            "tree share",
            "reference",
            "corpus share",
        ):
            share.add_column(
                col,
                justify="left"
                if col in ("memory default", "relevance", "best flat", "reference")
                else "right",
            )
        for m in mems.values():
            c = m["overall"].get("evidence_recall") or {}
            share.add_row(
                m["default"],
                m["relevance"],
                _num(c.get("default")),
                f"{c.get('best_flat_method') or '—'} {_num(c.get('best_flat'))}",
                _ci(c, "margin_over_best_flat"),
                f"{m.get('tree_policy', '?')} {_num(c.get('tree'))}",
                _num(c.get("collapsed")),
                _ci(c, "tree_share"),
                f"{m['reference']} {_num(c.get('reference'))}",
                _ci(c, "corpus_share"),
            )
        _console.print(share)
    if doc.get("resumed_conversations"):
        _console.print(f"resumed: {', '.join(doc['resumed_conversations'])}")
    _console.print(
        f"wrote {out / RESULTS_JSON}, {out / RESULTS_MD}, {out / RESULTS_PNG}, {out / 'queries.jsonl'}"
    )
