"""The ``hiermem`` command line: ``demo``, ``viz``, ``mcp``, ``export`` / ``import`` / ``inspect``, ``eval``
and ``bench``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Hierarchical long-term memory for LLM apps.",
)
console = Console()


@app.callback()
def _main() -> None:
    """hiermem: hierarchical long-term memory (MemTree, SegTreeMem, HAT, xMemory)."""


@app.command()
def demo(
    out: Path = typer.Option(
        Path("hiermem-output"), help="Directory for the table (Markdown, JSON) and the PNG."
    ),
    k: int = typer.Option(10, min=1, help="Evidence budget: turns retrieved per query (recall@k)."),
    show: int = typer.Option(3, min=0, help="Evidence lines printed per query."),
) -> None:
    """Remember a real conversation with SegTreeMem and answer its memory queries.

    Ingests the bundled RealMem excerpt online (each query is answered from the turns before it) into a
    SegTreeMem on the embedded defaults (local MiniLM embedder, no LLM), prints the top evidence per
    query, then a table of session-level evidence recall@k for the collapsed, top_down and bottom_up
    policies against flat dense and BM25 baselines over the same turns and embedder, and writes a PNG
    of the tree's shape.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .eval.baselines import FlatBM25, FlatDense
    from .eval.data import load_realmem_excerpt
    from .eval.metrics import evidence_recall
    from .memories.segtree import SegTreeMem
    from .models.local import LocalEmbedder
    from .viz import plot_tree_shape

    t_start = time.perf_counter()
    conv = load_realmem_excerpt()
    console.print(
        f"[bold]hiermem demo[/bold]: {len(conv.messages)} turns of a RealMem persona "
        f"({len({m.id for m in conv.messages})} sessions), {len(conv.queries)} memory queries. "
        "Data: RealMemBench (Apache-2.0), see NOTICE."
    )
    embedder = LocalEmbedder()
    mem = SegTreeMem(embedder=embedder)
    methods: dict[str, Any] = {"flat dense": FlatDense(embedder), "flat BM25 (stemmed)": FlatBM25(stem=True)}
    policies = list(mem.policies)
    names = [f"SegTreeMem {p}" for p in policies] + list(methods)
    recall: dict[str, list[float]] = {n: [] for n in names}
    queries = sorted(conv.queries, key=lambda q: q.position)
    shown: list[tuple[Any, list[Any]]] = []
    pos = 0
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("ingesting turns", total=len(conv.messages))
        for q in [*queries, None]:
            end = len(conv.messages) if q is None else q.position
            step = 16
            while pos < end:
                batch = conv.messages[pos : min(end, pos + step)]
                mem.add(batch, allow_duplicate_ids=True)  # a RealMem session's turns share its id
                for m in methods.values():
                    m.add(batch)
                pos += len(batch)
                progress.update(task, completed=pos)
            if q is None:
                break
            for p in policies:
                hits = mem.retrieve(q.question, k=k, policy=p)
                recall[f"SegTreeMem {p}"].append(evidence_recall([h.source_ids for h in hits], q.evidence))
                if p == mem.default_policy:
                    shown.append((q, hits[:show]))
            for name, m in methods.items():
                hits = m.retrieve(q.question, k=k)
                recall[name].append(evidence_recall([h.source_ids for h in hits], q.evidence))
    dates = {m.id: m.timestamp for m in conv.messages}
    console.print(
        "[dim]Each line: ✓ when the turn is labelled evidence for the query, then its score (the cosine "
        "similarity of query and turn, 0 to 1), speaker, session date and text, in the memory's order.[/dim]"
    )
    for q, hits in shown:
        console.print(f"\n[bold cyan]Q:[/bold cyan] {q.question}")
        for h in hits:
            who = h.metadata.get("speaker") or h.metadata.get("role") or "?"
            when = h.metadata.get("timestamp") or dates.get(h.source_ids[0] if h.source_ids else "", "")
            ok = "[green]✓[/green]" if set(h.source_ids) & set(q.evidence) else " "
            text = h.text.replace("\n", " ")
            if text.startswith(f"{who}: "):  # leaves are stored as "<speaker>: <text>"
                text = text[len(who) + 2 :]
            console.print(
                f"  {ok} {h.score:.4f}  {who} · {when}: {text[:160]}{'…' if len(text) > 160 else ''}"
            )

    table = Table(title=f"Session-level evidence recall@{k} over {len(queries)} queries (RealMem excerpt)")
    table.add_column("method")
    table.add_column(f"recall@{k}", justify="right")
    rows = []
    for n in names:
        val = sum(recall[n]) / max(1, len(recall[n]))
        rows.append({"method": n, f"recall@{k}": round(val, 4)})
        table.add_row(n, f"{val:.3f}")
    console.print()
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_tree_shape(mem, out / "demo_tree.png", title="SegTreeMem over the RealMem excerpt")
    stats = mem.stats()
    md = [f"| method | recall@{k} |", "|---|---|"] + [
        f"| {r['method']} | {r[f'recall@{k}']:.3f} |" for r in rows
    ]
    (out / "demo_results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    (out / "demo_results.json").write_text(
        json.dumps(
            {"k": k, "queries": len(queries), "results": rows, "config": mem._config(), "stats": stats},
            indent=2,
        ),
        encoding="utf-8",
    )
    console.print(
        f"tree: {stats['leaves']} leaves, {stats['nodes']} nodes, height {stats['height']}, "
        f"mean branching {stats['mean_branching']:.2f}; embedding calls {stats['usage']['embed_calls']}"
    )
    console.print(f"wrote {out / 'demo_results.md'}, {out / 'demo_results.json'} and {png}")
    console.print(f"done in {time.perf_counter() - t_start:.1f} s")


@app.command()
def viz(
    path: Path = typer.Argument(..., help="Directory of a memory saved with .save() (any memory kind)."),
    query: str | None = typer.Option(
        None,
        "--query",
        "-q",
        help="Explain this query: shade the nodes by their cosine similarity to it and mark the top-k hits "
        "of the memory's retrieval policy with rank, score and path (needs the embedder).",
    ),
    k: int = typer.Option(10, "--k", "-k", help="With --query: how many hits to mark (a positive integer)."),
    policy: str | None = typer.Option(
        None, "--policy", help="With --query: the retrieval policy (default: the memory's default policy)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="HTML file to write (default: the save's path with '.html' appended)."
    ),
    png: Path | None = typer.Option(None, "--png", help="Also write a PNG of the tree's shape here."),
    x: str = typer.Option("index", "--x", help="PNG x axis: 'index' (leaf rank) or 'time' (timestamps)."),
) -> None:
    """Render a saved memory as a self-contained HTML page (click a node to read it), optionally a PNG.

    The save is loaded with HierarchicalMemory.load, which picks the class from the saved kind, with
    the embedded local embedder (used only to score --query). With --query, both pictures mark the
    top-k hits of the policy and carry a legend. Exit code 1 when the save cannot be read or an option
    is invalid (nothing is written then).
    """
    from rich.markup import escape

    from .memories.base import HierarchicalMemory
    from .types import HierMemError
    from .viz import plot_tree_shape, render_html

    try:
        mem = HierarchicalMemory.load(path)
    except HierMemError as e:
        console.print(f"[red]cannot load {escape(str(path))}:[/red] {escape(str(e))}")
        raise typer.Exit(1) from None
    html_path = out if out is not None else path.with_name(path.name + ".html")
    try:
        if png is not None:
            png = plot_tree_shape(mem, png, x=x, query=query, k=k, policy=policy)
        html_path = render_html(mem, html_path, query=query, k=k, policy=policy)
    except HierMemError as e:
        console.print(f"[red]cannot render {escape(str(path))}:[/red] {escape(str(e))}")
        raise typer.Exit(1) from None
    s = mem.stats()
    console.print(
        f"{type(mem).__name__}: {s['leaves']} leaves, {s['nodes']} nodes, depth {s['max_depth']}; "
        f"wrote {html_path}" + (f" and {png}" if png is not None else ""),
        markup=False,
    )


@app.command()
def mcp(
    store: str | None = typer.Option(
        None,
        "--store",
        help="Where the memories live: a directory (one durable SQLite store per namespace; created if "
        "missing) or a postgresql:// URL. Default: in memory only, lost when the server stops.",
    ),
    http: str | None = typer.Option(
        None,
        "--http",
        metavar="HOST:PORT",
        help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (e.g. 127.0.0.1:8000). A HOST "
        "other than loopback (127.0.0.0/8, ::1, localhost) needs --tokens.",
    ),
    tokens: str | None = typer.Option(
        None,
        "--tokens",
        metavar="FILE",
        help='With --http: a JSON file {"<bearer token>": ["<namespace>", ...]} ("*" = every namespace). '
        "Every request then needs 'Authorization: Bearer <token>' (HTTP 401 otherwise) and a token reaches "
        "only its namespaces. Tokens: at least 32 characters of A-Z a-z 0-9 - . _ ~ + / (and '=' at the "
        "end).",
    ),
    memory: str = typer.Option(
        "segtree", "--memory", help="Memory of new namespaces: segtree, memtree, hat or xmemory."
    ),
    max_resident: int = typer.Option(
        256,
        "--max-resident",
        metavar="N",
        help="Most namespaces kept open at once (a positive integer); the least recently used ones of a "
        "--store are closed and reopened from it on their next call (nothing is embedded again).",
    ),
) -> None:
    """Serve memories over the Model Context Protocol (tools: remember, recall, forget, list_namespaces,
    memory_stats).

    Speaks MCP on stdin/stdout by default (for an MCP client's configuration), or streamable HTTP with
    --http. Every namespace has its own memory; all share the embedded local embedder. Over HTTP,
    --tokens maps bearer tokens to the namespaces each may use; without it the server only listens on
    loopback, unauthenticated. Needs the "mcp" extra of hiermem. Exit code 1 when an option is invalid,
    the tokens file is malformed or not a regular file, --http is not loopback without --tokens, or the
    store cannot be opened.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rich.markup import escape

    from .types import HierMemError

    err = Console(stderr=True)  # stdout is the MCP channel in stdio mode
    try:
        from .serve.mcp_server import MEMORY_KINDS, serve
    except ImportError as e:
        err.print(f"[red]{escape(str(e))}[/red]")
        raise typer.Exit(1) from None
    if memory not in MEMORY_KINDS:
        err.print(f"[red]unknown --memory {escape(memory)!r}; choose one of {', '.join(MEMORY_KINDS)}[/red]")
        raise typer.Exit(1)
    try:
        serve(
            store,
            memory,
            http,
            tokens=tokens,
            on_ready=lambda line: err.print(line, markup=False, soft_wrap=True),
            on_notice=lambda line: err.print(line, style="yellow", markup=False, soft_wrap=True),
            max_resident=max_resident,
        )
    except HierMemError as e:
        err.print(f"[red]cannot serve:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # pragma: no cover - interactive stop of the HTTP server
        pass


def _open_existing(store: str, memory: str = "segtree", *, create: bool = False) -> Any:
    """The MemoryStore at ``store`` (a directory, which must exist unless ``create``, or a postgresql://
    URL); exit 1 else."""
    from rich.markup import escape

    from .serve.mcp_server import MEMORY_KINDS
    from .serve.transfer import open_stored_kinds, store_exists
    from .types import HierMemError

    err = Console(stderr=True)
    if memory not in MEMORY_KINDS:
        err.print(f"[red]unknown --memory {escape(memory)!r}; choose one of {', '.join(MEMORY_KINDS)}[/red]")
        raise typer.Exit(1)
    if not create and not store_exists(store):
        err.print(f"[red]no store at {escape(store)}: give a store directory or a postgresql:// URL[/red]")
        raise typer.Exit(1)
    try:
        return open_stored_kinds(store, memory)
    except HierMemError as e:
        err.print(f"[red]cannot open the store:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(1) from None


def _fail(what: str, e: Exception) -> NoReturn:
    from rich.markup import escape

    Console(stderr=True).print(f"[red]{what}:[/red] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(1) from None


_STORE_HELP = (
    "A store directory (one SQLite store per namespace, as hiermem mcp --store) or a postgresql:// URL."
)


@app.command("export")
def export_command(
    store: str = typer.Argument(..., help=_STORE_HELP),
    out: Path = typer.Argument(..., help="The JSON Lines file to write (one message per line)."),
    namespace: list[str] | None = typer.Option(
        None, "--namespace", help="Export only this namespace (repeat for each part of a tuple)."
    ),
) -> None:
    """Write every message of a store (or of one namespace) to a JSON Lines file.

    One line per message, namespaces sorted, each namespace in insertion order, with every field:
    namespace, text, role, speaker, timestamp, id, metadata. Exit code 1 when the store or the namespace
    does not exist or the file cannot be written.
    """
    from .serve.transfer import export_jsonl
    from .types import HierMemError

    mems = _open_existing(store)
    try:
        counts = export_jsonl(mems, out, namespace=tuple(namespace) if namespace else None)
    except HierMemError as e:
        _fail("cannot export", e)
    finally:
        mems.close()
    console.print(f"exported {sum(counts.values())} messages of {len(counts)} namespace(s) to {out}")


@app.command("import")
def import_command(
    src: Path = typer.Argument(..., help="A JSON Lines file written by hiermem export."),
    store: str = typer.Argument(..., help=_STORE_HELP + " A directory is created if missing."),
    memory: str = typer.Option(
        "segtree", "--memory", help="Memory of new namespaces: segtree, memtree, hat or xmemory."
    ),
    upsert: bool = typer.Option(False, "--upsert", help="Replace stored messages that have the same id."),
) -> None:
    """Add the messages of an export to a store, embedding them with the local models.

    The whole file is checked first: a malformed line is reported with its line number and nothing is
    added. Each namespace then gets all of its messages in one atomic add, or none. An id the namespace
    already holds is an error unless --upsert. Exit code 1 on any error.
    """
    from .eval.progress_bars import terminal_progress
    from .serve.transfer import import_jsonl, read_jsonl
    from .types import HierMemError

    try:
        total = sum(map(len, read_jsonl(src).values()))  # a malformed file adds nothing, not even a store
    except HierMemError as e:
        _fail("cannot import", e)
    mems = _open_existing(store, memory, create=True)
    bar = Console(stderr=True).is_terminal  # a bar over the messages; else a line per namespace

    try:
        with terminal_progress(total, "hiermem import", "messages") as advance:
            counts = import_jsonl(
                mems,
                src,
                upsert=upsert,
                progress=lambda ns, n: advance(n) if bar else console.print(f"{'/'.join(ns)}: {n} messages"),
            )
    except HierMemError as e:
        _fail("cannot import", e)
    finally:
        mems.close()
    console.print(f"imported {sum(counts.values())} messages into {len(counts)} namespace(s)")


@app.command("inspect")
def inspect_command(store: str = typer.Argument(..., help=_STORE_HELP)) -> None:
    """List a store's namespaces with their memory kind, messages, nodes, tree height and size on disk."""
    from .serve.transfer import inspect_store
    from .types import HierMemError

    mems = _open_existing(store)
    try:
        rows = inspect_store(mems)
    except HierMemError as e:
        _fail("cannot inspect", e)
    finally:
        mems.close()
    table = Table("namespace", "kind", "messages", "nodes", "height", "bytes")
    for r in rows:
        size = "-" if r["bytes"] is None else f"{r['bytes']:,}"
        table.add_row(
            "/".join(r["namespace"]), r["kind"], str(r["messages"]), str(r["nodes"]), str(r["height"]), size
        )
    console.print(table)


def _register_eval_and_bench() -> None:
    from .bench.command import bench_command
    from .eval.command import eval_command

    app.command("eval")(eval_command)
    app.command("bench")(bench_command)


_register_eval_and_bench()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
