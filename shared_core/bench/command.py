"""The ``hiermem bench`` command as a plain typer-compatible function.

Register it on a typer app with ``app.command("bench")(bench_command)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ..eval.command import _console, _fail, _ints, _num
from ..types import HierMemError

__all__ = ["bench_command"]


def bench_command(
    sizes: str = typer.Option("1000,10000", "--sizes", help="Comma-separated tree sizes in leaves."),
    full: bool = typer.Option(False, "--full", help="Add 100000 leaves to --sizes."),
    memories: str = typer.Option(
        "all", "--memories", help="Comma-separated: segtree, memtree, hat, xmemory (default: all available)."
    ),
    queries: int = typer.Option(
        50,
        "--queries",
        min=1,
        help="Timed queries per size and policy; with --llm-cost, questions asked per conversation.",
    ),
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
    messages: int | None = typer.Option(
        None,
        "--messages",
        min=1,
        help="With --postgres: messages each process adds, one add each (default 50). With --llm-cost: "
        "turns added per conversation (default all).",
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
        "topical,random,speaker",
        "--streams",
        help="With --conversation: comma-separated streams (topical, random, speaker: a speaker's name in "
        "every message and every query).",
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
    cold_open: bool = typer.Option(
        False,
        "--cold-open",
        help="Run ONLY the evicted-namespace workload: for each memory and each of --sizes messages per "
        "namespace, the cold open of an evicted namespace (rows and vectors read back, nothing embedded "
        "again) and the RSS per resident message, on SQLite and, with --postgres URL, on PostgreSQL too. "
        "Writes namespaces.json and namespaces.md to --out.",
    ),
    ingest_modes: str = typer.Option(
        "default",
        "--ingest-modes",
        help="With --ingest: comma-separated annotation_vectors runs: default (the constructor without "
        "options), composed, embedded.",
    ),
    bulk: bool = typer.Option(
        False,
        "--bulk",
        help="Run ONLY the bulk ingest workload: one add of the first LongMemEval_S dev haystack and one of "
        "the first --bulk-turns LoCoMo dev+validate turns ($HIERMEM_DATA or ../shared/data), CPU over one "
        "embed of the same texts per memory. Writes bulk.json and bulk.md.",
    ),
    bulk_turns: int = typer.Option(2000, "--bulk-turns", min=1, help="With --bulk: LoCoMo turns."),
    llm_cost: bool = typer.Option(
        False,
        "--llm-cost",
        help="Run ONLY the LLM cost count: each memory's LLM mode (SegTreeMem pointwise_llm and batch_llm, "
        "MemTree, HAT with its agent, xMemory with adaptive retrieval) through an in-process "
        "OpenAI-protocol server answered by a deterministic stand-in model, over the LoCoMo dev turns "
        "($HIERMEM_DATA or ../shared/data; else the bundled RealMem excerpt). Prints LLM calls, prompt and "
        "completion tokens per message and per query. Writes llm_cost.json and llm_cost.md.",
    ),
    price_in: float | None = typer.Option(
        None, "--price-in", min=0.0, help="With --llm-cost: USD per 1M prompt tokens (prices per 1,000)."
    ),
    price_out: float | None = typer.Option(
        None,
        "--price-out",
        min=0.0,
        help="With --llm-cost: USD per 1M completion tokens (default --price-in).",
    ),
    tokenizer: str = typer.Option(
        "auto",
        "--tokenizer",
        help="With --llm-cost: how tokens are counted: auto (o200k_base when bundled offline, else "
        "whitespace), whitespace, o200k_base, cl100k_base.",
    ),
) -> None:
    """Algorithm overhead without model calls, next to flat FAISS and numpy search; embedded throughput.

    Stub models (precomputed vectors, free summaries) isolate each memory's own cost: insert time per
    message and retrieval time per query at each size, CPU time beside wall time, BLAS/FAISS pinned to one
    thread, peak memory; then messages per second with the real local embedder. Writes bench.json,
    bench.md and bench.png to --out.

    With --cold-open only the evicted-namespace workload runs (SQLite, and PostgreSQL with --postgres);
    with --postgres URL alone only the many-processes benchmark runs instead (see docs/storage.md); with
    --conversation and/or --ingest only those workloads run (see docs/evaluation.md); with --llm-cost
    only the LLM cost count runs (see docs/performance.md).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cold_open:
        _cold_open_bench(sizes, memories, postgres, seed, out)
        return
    if postgres is not None:
        _process_bench(postgres, processes, 50 if messages is None else messages, retrieves, memories, out)
        return
    if bulk:
        _bulk_bench(memories, bulk_turns, out)
        return
    if llm_cost:
        _llm_cost_bench(memories, messages, queries, price_in, price_out, tokenizer, out)
        return
    from .core import render_markdown, run_bench

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


@contextmanager
def _progress_bars(
    auto_refresh: bool = True, unit: str = "messages"
) -> Iterator[Callable[[str, int, int], None]]:
    """Rich progress bars, one per label, shown while the block runs; yields the
    ``progress(label, done, total)`` callback the benchmarks report to. Without ``auto_refresh`` the
    display redraws only when a task advances (it then shares its process with the measured code)."""
    from rich.progress import Progress

    from ..eval.progress_bars import bar_columns

    with Progress(
        *bar_columns(unit),
        console=_console,
        auto_refresh=auto_refresh,
    ) as bars:
        tasks: dict[str, Any] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=total)
            bars.update(tasks[label], completed=done, total=total, refresh=not auto_refresh)

        yield progress


def _workloads_bench(*, out: Path, isolate: bool, **kw: Any) -> None:
    """``hiermem bench --conversation`` / ``--ingest``: progress bars, a summary, files in ``out``.

    Without isolation the measured code shares its process with the progress display, which then
    redraws only when a task advances.
    """
    from .workloads import run_workloads

    with _progress_bars(auto_refresh=isolate) as progress:
        try:
            doc = run_workloads(isolate=isolate, out=out, progress=progress, **kw)
        except HierMemError as e:
            raise _fail(e) from None
    _print_workloads_summary(doc)
    files = doc.get("files", {})
    _console.print(f"wrote {', '.join(str(out / f) for f in files.values())}")


def _llm_cost_bench(
    memories: str,
    messages: int | None,
    queries: int,
    price_in: float | None,
    price_out: float | None,
    tokenizer: str,
    out: Path,
) -> None:
    """``hiermem bench --llm-cost``: a progress bar per memory, the Markdown report, files in ``out``."""
    from .llm_cost import render_llm_cost_markdown, run_llm_cost

    mems = None if memories.strip().lower() == "all" else [m for m in memories.split(",") if m.strip()]
    with _progress_bars(unit="steps") as progress:
        try:
            doc = run_llm_cost(
                memories=mems,
                messages=messages,
                queries=queries,
                price_in=price_in,
                price_out=price_out,
                tokenizer=tokenizer.strip().lower(),
                out=out,
                progress=progress,
            )
        except HierMemError as e:
            raise _fail(e) from None
    _console.print(render_llm_cost_markdown(doc), soft_wrap=True, markup=False, highlight=False)
    _console.print(f"wrote {out / 'llm_cost.json'}, {out / 'llm_cost.md'}")


def _bulk_bench(memories: str, turns: int, out: Path) -> None:
    """``hiermem bench --bulk``: the bulk ingest workload (:mod:`shared_core.bench.bulk`) into ``out``."""
    from ..eval.protocol import default_data_root
    from .bulk import bulk_markdown, run_bulk

    mems = (
        None if memories.strip().lower() == "all" else [m.strip() for m in memories.split(",") if m.strip()]
    )
    with _progress_bars() as progress:
        try:
            doc = run_bulk(mems, default_data_root(), turns, out, progress)
        except HierMemError as e:
            raise _fail(e) from None
    _console.print(bulk_markdown(doc))
    _console.print(f"wrote {out / 'bulk.json'}, {out / 'bulk.md'}")


def _ratio_cell(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _print_workloads_summary(doc: dict[str, Any]) -> None:
    """Short rich tables of a workloads document: p50/p99 CPU ms per turn beside flat, CPU per message."""
    if doc.get("conversation"):
        t = Table(title="conversation: CPU ms per turn (add + retrieve)")
        cols = (
            "memory",
            "stream",
            "leaves",
            "p50",
            "p99",
            "flat p50",
            "flat p99",
            "p50 / flat",
            "p99 / flat",
        )
        for c in cols:
            t.add_column(c, justify="left" if c in ("memory", "stream") else "right", no_wrap="/" in c)
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
                        *(_ratio_cell(s.get(r, {}).get("turn")) for r in ("ratio_p50", "ratio_p99")),
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

    from .processes import run_process_bench, to_markdown

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


def _cold_open_bench(sizes: str, memories: str, postgres: str | None, seed: int, out: Path) -> None:
    """``hiermem bench --cold-open``: evicted namespaces reopened, written to ``out``."""
    import json

    from .namespaces import cold_open_bench, cold_open_markdown

    kinds = [m.strip() for m in memories.split(",") if m.strip()]
    if memories.strip().lower() == "all" or not kinds:
        kinds = ["segtree", "memtree", "hat", "xmemory"]
    size_list = _ints(sizes, "--sizes") or []
    if not size_list:
        raise typer.BadParameter(f"--sizes needs at least one size, got {sizes!r}.")
    try:
        doc = cold_open_bench(
            kinds, size_list, postgres=postgres, seed=seed, progress=lambda msg: _console.print(msg)
        )
    except HierMemError as e:
        raise _fail(e) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "namespaces.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    md = cold_open_markdown(doc)
    (out / "namespaces.md").write_text(md, encoding="utf-8")
    _console.print(md, soft_wrap=True, markup=False, highlight=False)
    _console.print(f"wrote {out / 'namespaces.json'}, {out / 'namespaces.md'}")
