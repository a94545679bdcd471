"""The ``hiermem eval`` and ``hiermem bench`` commands as plain typer-compatible functions.

Register them on a typer app with ``app.command("eval")(eval_command)`` and
``app.command("bench")(bench_command)``.
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

__all__ = ["bench_command", "eval_command"]

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
        help="A named split under --data: dev (LoCoMo conv-26, conv-30; RealMem Kenta_Tanaka) or validate "
        "(LoCoMo conv-49, conv-50; RealMem Pak_Budi, Oliver_Smith). Choose on dev, confirm on validate.",
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="Data root holding locomo/ and realmem/ for --split (default: $HIERMEM_DATA, else "
        "../shared/data from the current directory).",
    ),
    locomo: list[Path] = typer.Option([], "--locomo", help="LoCoMo JSON file (repeat for several)."),
    realmem: list[Path] = typer.Option([], "--realmem", help="RealMem persona JSON file (repeatable)."),
    jsonl: list[Path] = typer.Option([], "--jsonl", help="JSON Lines conversation (repeatable)."),
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
        "also gets its default policy, its collapsed policy (tree share) and its flat reference "
        "baseline (corpus share).",
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
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Evaluate memories and flat baselines online on LoCoMo / RealMem / JSONL conversations.

    One memory per conversation and method, messages added in arrival order, every policy of a memory
    asked each query at its position. Writes results.json (full configuration, per-method and
    per-category aggregates, each memory's margin over the best flat baseline, tree share and corpus
    share with paired bootstrap 95% intervals), results.md, results.png, queries.jsonl (one line per
    question and method) and per-conversation files to --out.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .report import RESULTS_JSON, RESULTS_MD, RESULTS_PNG
    from .runner import run_eval

    try:
        cats = _ints(categories, "--categories")
        chat = _make_llm(llm, base_url)
        emb = _make_embedder(embedder, base_url)
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
    mems = doc.get("comparison", {}).get("memories", {})
    if mems:
        share = Table(title=f"memory defaults against the flat baselines: evidence R@{k} (pooled)")
        for col in (
            "memory default",
            "relevance",
            "evidence R",
            "best flat",
            "margin",
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


def bench_command(
    sizes: str = typer.Option("1000,10000", "--sizes", help="Comma-separated tree sizes in leaves."),
    full: bool = typer.Option(False, "--full", help="Add 100000 leaves to --sizes."),
    memories: str = typer.Option(
        "all", "--memories", help="Comma-separated: segtree, memtree, hat, xmemory (default: all available)."
    ),
    queries: int = typer.Option(50, "--queries", min=1, help="Timed queries per size and policy."),
    window: int | None = typer.Option(
        None,
        "--window",
        min=1,
        help="Timed single inserts before each size (default 200); with --conversation, timed turns at "
        "each size (default 100).",
    ),
    throughput_turns: int = typer.Option(
        300,
        "--throughput-turns",
        min=0,
        help="RealMem excerpt turns ingested with the real embedder (0: skip).",
    ),
    isolate: bool = typer.Option(
        True, "--isolate/--no-isolate", help="Run each memory in its own process (clean peak memory)."
    ),
    trace_max: int = typer.Option(
        10_000, "--trace-max", min=0, help="Largest size whose Python allocations tracemalloc measures."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic vector stream."),
    size_cap: list[str] = typer.Option(
        [], "--size-cap", help="KIND=N: largest size for one memory (repeatable), e.g. segtree=10000."
    ),
    out: Path = typer.Option(Path("hiermem-bench"), "--out", help="Output directory."),
    postgres: str | None = typer.Option(
        None,
        "--postgres",
        metavar="URL",
        help="Run ONLY the many-processes benchmark on this PostgreSQL database "
        "(postgresql://user:password@host:port/dbname): --processes writers add --messages each into one "
        "shared namespace, then into one namespace each, next to one process on SQLite, then run "
        "--retrieves retrievals each; one kind from --memories ('all': segtree). Writes processes.json "
        "and processes.md to --out.",
    ),
    processes: str = typer.Option(
        "1,2,4", "--processes", help="With --postgres: comma-separated process counts."
    ),
    messages: int = typer.Option(
        50, "--messages", min=1, help="With --postgres: messages each process adds (one add each)."
    ),
    retrieves: int = typer.Option(
        20, "--retrieves", min=0, help="With --postgres: retrievals each process runs after its adds."
    ),
    conversation: bool = typer.Option(
        False,
        "--conversation",
        help="Run the conversation workload instead: stub models, each memory grown to each of --sizes, "
        "then --window turns of one add and one retrieve (default policy and relevance, k = 10) next to "
        "a flat FAISS add + search; p50/p99 CPU ms per turn. Writes workloads.json and workloads.md.",
    ),
    streams: str = typer.Option(
        "topical,random", "--streams", help="With --conversation: comma-separated streams (topical, random)."
    ),
    summariser: str = typer.Option(
        "default",
        "--summariser",
        help="With --conversation: 'default' (each memory's own summariser, the extractive one without an "
        "LLM) or 'standin' (free stand-in summaries: the algorithm's cost alone).",
    ),
    ingest: bool = typer.Option(
        False,
        "--ingest",
        help="Run the embedded ingest workload instead (can be combined with --conversation): real turns, "
        "one add per message, CPU per message as a multiple of embedding the message alone.",
    ),
    turns: int = typer.Option(200, "--turns", min=1, help="With --ingest: first turns of each conversation."),
    locomo: Path | None = typer.Option(
        None,
        "--locomo",
        help="With --ingest: a LoCoMo JSON file (conv-26 is used) besides the RealMem excerpt.",
    ),
    ingest_modes: str = typer.Option(
        "default",
        "--ingest-modes",
        help="With --ingest: comma-separated annotation_vectors runs: default (the constructor without "
        "options), composed, embedded.",
    ),
) -> None:
    """Algorithm overhead without model calls, next to flat FAISS and numpy search; embedded throughput.

    Stub models (precomputed vectors, free summaries) isolate each memory's own cost: insert time per
    message and retrieval time per query at each size, CPU time beside wall time, BLAS/FAISS pinned to one
    thread, peak memory; then messages per second with the real local embedder. Writes bench.json,
    bench.md and bench.png to --out.

    With --postgres URL only the many-processes benchmark runs instead (see docs/storage.md); with
    --conversation and/or --ingest only those workloads run (see docs/evaluation.md).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if postgres is not None:
        _process_bench(postgres, processes, messages, retrieves, memories, out)
        return
    from ..bench import render_markdown, run_bench

    size_list = _ints(sizes, "--sizes") or []
    if full and 100_000 not in size_list:
        size_list.append(100_000)
    caps: dict[str, int] = {}
    for item in size_cap:
        kind, _, n = item.partition("=")
        try:
            caps[kind.strip()] = int(n)
        except ValueError:
            raise typer.BadParameter(f"--size-cap takes KIND=N, e.g. segtree=10000; got {item!r}.") from None
    mems = (
        None if memories.strip().lower() == "all" else [m.strip() for m in memories.split(",") if m.strip()]
    )
    if conversation or ingest:
        _workloads_bench(
            conversation=conversation,
            ingest=ingest,
            sizes=size_list,
            memories=mems,
            streams=[x.strip() for x in streams.split(",") if x.strip()],
            summariser=summariser.strip().lower(),
            window=100 if window is None else window,
            seed=seed,
            size_caps=caps,
            turns=turns,
            locomo=locomo,
            modes=[x.strip() for x in ingest_modes.split(",") if x.strip()],
            isolate=isolate,
            out=out,
        )
        return
    try:
        doc = run_bench(
            sizes=size_list,
            memories=mems,
            queries=queries,
            window=200 if window is None else window,
            throughput_turns=throughput_turns,
            isolate=isolate,
            trace_max=trace_max,
            seed=seed,
            size_caps=caps,
            out=out,
            progress=lambda msg: _console.print(msg),
        )
    except HierMemError as e:
        raise _fail(e) from None
    _console.print(render_markdown(doc))
    _console.print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")


def _workloads_bench(*, out: Path, isolate: bool, **kw: Any) -> None:
    """``hiermem bench --conversation`` / ``--ingest``: progress bars, a summary, files in ``out``.

    Without isolation the measured code shares its process with the progress display, which then
    redraws only when a task advances.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench_workloads import run_workloads

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        auto_refresh=isolate,
    ) as bars:
        tasks: dict[str, Any] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=total)
            bars.update(tasks[label], completed=done, total=total, refresh=not isolate)

        try:
            doc = run_workloads(isolate=isolate, out=out, progress=progress, **kw)
        except HierMemError as e:
            raise _fail(e) from None
    _print_workloads_summary(doc)
    files = doc.get("files", {})
    _console.print(f"wrote {', '.join(str(out / f) for f in files.values())}")


def _print_workloads_summary(doc: dict[str, Any]) -> None:
    """Short rich tables of a workloads document: p50/p99 CPU ms per turn beside flat, CPU per message."""
    if doc.get("conversation"):
        t = Table(title="conversation: CPU ms per turn (add + retrieve)")
        for c in ("memory", "stream", "leaves", "p50", "p99", "flat p50", "flat p99", "p50 / flat"):
            t.add_column(c, justify="left" if c in ("memory", "stream") else "right")
        for kind, by_stream in doc["conversation"]["results"].items():
            for stream, r in by_stream.items():
                for s in r["sizes"]:
                    m, f = s["memory"]["turn"], s["flat"]["turn"]
                    t.add_row(
                        kind,
                        stream,
                        f"{s['leaves']:,}",
                        _num(m["p50_ms"]),
                        _num(m["p99_ms"]),
                        _num(f["p50_ms"]),
                        _num(f["p99_ms"]),
                        "—" if s["ratio_p50"]["turn"] is None else f"{s['ratio_p50']['turn']:.1f}",
                    )
        _console.print(t)
    if doc.get("ingest"):
        t = Table(title="ingest: CPU per message (one add each), x embedding it alone")
        for c in ("data", "memory", "vectors", "ms/msg", "x embedding", "texts/msg"):
            t.add_column(c, justify="left" if c in ("data", "memory", "vectors") else "right")
        for name, ds in doc["ingest"]["datasets"].items():
            for kind, by_mode in ds["results"].items():
                for mode, v in by_mode.items():
                    t.add_row(
                        name,
                        kind,
                        mode + (" (default)" if v["default"] else ""),
                        f"{v['cpu_ms_per_message']:.1f}",
                        "—" if v["ratio"] is None else f"{v['ratio']:.2f}",
                        f"{v['embedded_texts_per_message']:.2f}",
                    )
        _console.print(t)


def _process_bench(url: str, processes: str, messages: int, queries: int, memories: str, out: Path) -> None:
    """``hiermem bench --postgres URL``: the many-processes benchmark, written to ``out``."""
    import json

    from ..bench_processes import run_process_bench, to_markdown

    kinds = [m.strip() for m in memories.split(",") if m.strip()]
    if memories.strip().lower() == "all" or not kinds:
        kinds = ["segtree"]
    if len(kinds) != 1:
        raise typer.BadParameter(
            f"--postgres measures one memory: give one kind in --memories, got {memories!r}."
        )
    counts = _ints(processes, "--processes")
    if not counts:
        raise typer.BadParameter(f"--processes needs at least one process count, got {processes!r}.")
    try:
        doc = run_process_bench(
            url,
            processes=counts,
            messages=messages,
            queries=queries,
            memory=kinds[0],
            progress=lambda msg: _console.print(msg),
        )
    except HierMemError as e:
        raise _fail(e) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "processes.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    md = to_markdown(doc)
    (out / "processes.md").write_text(md, encoding="utf-8")
    _console.print(md, soft_wrap=True, markup=False, highlight=False)
    _console.print(f"wrote {out / 'processes.json'}, {out / 'processes.md'}")
