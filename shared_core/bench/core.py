"""``hiermem bench``: algorithm overhead with model calls taken out, and embedded-default throughput.

Overhead: each memory is fed a synthetic conversation-like stream of 384-d unit vectors through a stub
embedder that replays precomputed vectors (:class:`ReplayEmbedder`) and a summariser that costs O(1)
(:class:`SpanEndsSummarizer`: a node's vector is the mean of its first and last child's; MemTree gets
:class:`FirstTextSummarizer`, ``Aggregate(existing, new) = existing``). One memory grows through the
requested sizes; before each size the last ``window`` messages are inserted one ``add`` at a time and
timed (wall-clock ``time.perf_counter`` and process CPU ``time.process_time``); at each size every
LLM-free policy answers ``queries`` queries (noisy copies of stored vectors), next to one flat FAISS
``IndexFlatIP`` search and one numpy brute-force scan over the same leaf vectors, in the same process and
moment. BLAS and FAISS are pinned to one thread (threadpoolctl, ``faiss.omp_set_num_threads(1)``): one
query is too little work to share, and on a busy machine idle worker threads only add noise. Memory:
peak RSS of the memory's own process (``resource.getrusage``; each memory runs in a fresh process with
``isolate=True``), its RSS after the stream was generated, and — in a separate pass for sizes up to
``trace_max`` — the Python/numpy allocations ``tracemalloc`` sees (FAISS's C++ buffers are not traced).

Evicted namespaces (:func:`namespace_profile`): a ``MemoryStore`` of durable SQLite namespaces on the
same stubs; the time to open an evicted namespace again (its rows and vectors read back, its index
rebuilt; the texts embedded meanwhile are counted and must be none) and the RSS each resident message
costs.

Throughput: messages per second added (one ``add`` per session) into each memory built on the embedded
defaults — the real :class:`~shared_core.models.local.LocalEmbedder`, no LLM — over the first turns of
the bundled RealMem excerpt, with flat dense retrieval beside it.

The stub models and streams live in :mod:`shared_core.bench.stubs` (re-exported here), the evicted-namespace
profile in :mod:`shared_core.bench.namespaces`; ``benchmarks/bench_*.py`` use the stubs too.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..types import InvalidInputError
from .namespaces import namespace_profile
from .stubs import (
    BENCH_SCHEMA,
    DIM,
    FirstTextSummarizer,
    HashSummarizer,
    K,
    PoolEmbedder,
    ReplayEmbedder,
    SpanEndsSummarizer,
    _memory_classes,
    _peak_rss,
    _policies,
    _rss,
    _stats,
    _timed,
    _unit,
    clustered_stream,
    machine_description,
    pin_threads,
    stub_memory,
    topical_stream,
)

__all__ = [
    "DIM",
    "FirstTextSummarizer",
    "HashSummarizer",
    "PoolEmbedder",
    "ReplayEmbedder",
    "SpanEndsSummarizer",
    "bench_memory",
    "clustered_stream",
    "flat_search_timings",
    "machine_description",
    "memory_profile",
    "namespace_profile",
    "pin_threads",
    "render_markdown",
    "run_bench",
    "stub_memory",
    "throughput",
    "topical_stream",
]


def flat_search_timings(X: np.ndarray, Q: np.ndarray, k: int = K) -> dict[str, dict[str, dict[str, float]]]:
    """Per-query time of flat top-k search over ``X`` with FAISS ``IndexFlatIP`` and with numpy.

    Args:
        X: float32 ``(n, d)`` unit vectors. Q: float32 ``(q, d)`` queries. k: hits, default 10.

    Returns:
        ``{"faiss": {"wall": stats, "cpu": stats}, "numpy": {...}}`` with ``median_ms``, ``p90_ms``,
        ``mean_ms`` per query. numpy computes ``X @ q``, ``argpartition`` and sorts the top k.
    """
    import faiss

    index = faiss.IndexFlatIP(X.shape[1])
    index.add(X)
    kk = min(k, len(X))

    def np_search(q: np.ndarray) -> np.ndarray:
        s = X @ q
        top = np.argpartition(-s, kk - 1)[:kk]
        return top[np.argsort(-s[top])]

    for q in Q[:2]:  # warm-up
        index.search(q[None, :], kk)
        np_search(q)
    out: dict[str, dict[str, list[float]]] = {
        "faiss": {"wall": [], "cpu": []},
        "numpy": {"wall": [], "cpu": []},
    }
    for q in Q:
        w, c = _timed(lambda q=q: index.search(q[None, :], kk))
        out["faiss"]["wall"].append(w)
        out["faiss"]["cpu"].append(c)
        w, c = _timed(lambda q=q: np_search(q))
        out["numpy"]["wall"].append(w)
        out["numpy"]["cpu"].append(c)
    return {m: {t: _stats(v) for t, v in d.items()} for m, d in out.items()}


def bench_memory(
    kind: str, sizes: Sequence[int], *, window: int = 200, queries: int = 50, seed: int = 0, chunk: int = 500
) -> dict[str, Any]:
    """Grow one stub-model memory through ``sizes``, timing inserts and queries at each size.

    Before each size ``S`` the memory is filled up to ``S - window`` with batched adds of ``chunk``
    messages (untimed except in total), then the last ``window`` messages are added one ``add`` each and
    timed. At ``S`` every LLM-free policy answers ``queries`` queries (``k = 10``; each a noisy copy of a
    random stored leaf vector, embedded by the replaying stub), and flat FAISS and numpy search the
    ``S`` leaf vectors for the same query vectors. BLAS/FAISS are pinned to one thread.

    Args:
        kind: the memory kind. sizes: leaf counts (distinct, >= 2). window: timed inserts per size,
            default 200. queries: timed queries per policy, default 50. seed: stream seed, default 0.
        chunk: messages per untimed batched add, default 500.

    Returns:
        ``{"kind", "policies", "rss_before_bytes", "peak_rss_bytes", "sizes": [{"leaves", "nodes", "stats",
        "build_wall_s", "build_cpu_s", "insert": {"wall", "cpu", "measured"}, "retrieve": {policy: {"wall",
        "cpu"}}, "flat": {...}, "rss_bytes"}]}``; times as ``median_ms`` / ``p90_ms`` / ``mean_ms``.

    Raises:
        InvalidInputError: bad sizes or an unknown kind.

    References:
        Overhead targets of the SegTreeMem benchmark (insert median at 100k within 2x of 1k) and the
        MemTree benchmark (ratios to one flat FAISS search).
    """
    sizes = _check_sizes(sizes)
    limiter = pin_threads()
    try:
        texts, table = topical_stream(max(sizes), seed)
        emb = ReplayEmbedder(table)
        rss_before = _rss()
        mem = stub_memory(kind, emb)
        rng = np.random.default_rng(seed + 1)
        out: dict[str, Any] = {
            "kind": kind,
            "policies": _policies(mem),
            "rss_before_bytes": rss_before,
            "sizes": [],
        }
        n = 0
        build_w = build_c = 0.0
        for S in sizes:
            start = max(n, S - window)
            while n < start:
                step = min(chunk, start - n)
                w, c = _timed(lambda a=n, b=n + step: mem.add(texts[a:b], allow_duplicate_ids=True))
                build_w += w
                build_c += c
                n += step
            ins_w, ins_c = [], []
            while n < S:
                w, c = _timed(lambda i=n: mem.add(texts[i], allow_duplicate_ids=True))
                ins_w.append(w)
                ins_c.append(c)
                n += 1
            build_w += sum(ins_w)
            build_c += sum(ins_c)
            X = np.stack([table[t] for t in texts[:S]])
            picks = rng.integers(0, S, size=queries)
            Q = X[picks] + 0.3 * np.stack([_unit(rng) for _ in range(queries)])
            Q = (Q / np.linalg.norm(Q, axis=1, keepdims=True)).astype(np.float32)
            qtexts = []
            for j in range(queries):
                key = f"query {S}:{j}"
                table[key] = Q[j]
                qtexts.append(key)
            retr: dict[str, Any] = {}
            for p in out["policies"]:
                for qt in qtexts[:2]:  # warm caches (lexical/derived state built lazily)
                    mem.retrieve(qt, k=K, policy=p)
                ws, cs = [], []
                for qt in qtexts:
                    w, c = _timed(lambda qt=qt, p=p: mem.retrieve(qt, k=K, policy=p))
                    ws.append(w)
                    cs.append(c)
                retr[p] = {"wall": _stats(ws), "cpu": _stats(cs)}
            flat = flat_search_timings(X, Q)
            st = mem.stats()
            out["sizes"].append(
                {
                    "leaves": S,
                    "nodes": st.get("nodes"),
                    "stats": {
                        k: st[k]
                        for k in (
                            "internal_nodes",
                            "max_depth",
                            "mean_depth",
                            "mean_branching",
                            "height",
                            "tree_nodes",
                        )
                        if k in st
                    },
                    "build_wall_s": build_w,
                    "build_cpu_s": build_c,
                    "insert": {"wall": _stats(ins_w), "cpu": _stats(ins_c), "measured": len(ins_w)}
                    if ins_w
                    else None,
                    "retrieve": retr,
                    "flat": flat,
                    "rss_bytes": _rss(),
                }
            )
            del X
        out["peak_rss_bytes"] = _peak_rss()
        return out
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def memory_profile(kind: str, sizes: Sequence[int], *, seed: int = 0, chunk: int = 500) -> dict[str, Any]:
    """Python/numpy allocations of a stub-model memory grown through ``sizes``, traced by tracemalloc.

    The stream is generated before tracing starts, so only the memory's own allocations (nodes, index
    arrays, caches, summary vectors registered by the stub summariser) are counted; FAISS's C++ buffers
    are not visible to tracemalloc.

    Args:
        kind: the memory kind. sizes: leaf counts. seed: stream seed. chunk: messages per batched add.

    Returns:
        ``{"kind", "sizes": [{"leaves", "traced_bytes", "traced_peak_bytes", "bytes_per_leaf"}]}``.
    """
    sizes = _check_sizes(sizes)
    texts, table = topical_stream(max(sizes), seed)
    emb = ReplayEmbedder(table)
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        mem = stub_memory(kind, emb)
        out: dict[str, Any] = {"kind": kind, "sizes": []}
        n = 0
        for S in sizes:
            while n < S:
                step = min(chunk, S - n)
                mem.add(texts[n : n + step], allow_duplicate_ids=True)
                n += step
            cur, peak = tracemalloc.get_traced_memory()
            out["sizes"].append(
                {
                    "leaves": S,
                    "traced_bytes": cur - base,
                    "traced_peak_bytes": peak - base,
                    "bytes_per_leaf": (cur - base) / S,
                }
            )
        del mem
        return out
    finally:
        if not was:
            tracemalloc.stop()


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    try:
        out = sorted({int(s) for s in sizes})
    except (TypeError, ValueError):
        raise InvalidInputError(f"sizes must be integers, got {sizes!r}.") from None
    if not out or out[0] < 2 * K:
        raise InvalidInputError(f"sizes must be integers >= {2 * K} (leaves), got {list(sizes)!r}.")
    return out


# --------------------------------------------------------------------------- embedded throughput
def throughput(kinds: Sequence[str], turns: int = 300) -> dict[str, Any]:
    """Messages per second added into each memory built on the embedded defaults (real embedder, no LLM).

    The first ``turns`` turns of the bundled RealMem excerpt are added one ``add`` per session; every
    memory embeds its own texts (no cache). Flat dense retrieval over the same turns is measured beside:
    it embeds the same messages with the same batching and nothing else, so each memory's
    ``cpu_ratio_to_embedding`` (its CPU seconds over flat dense's) is what the memory costs per message
    as a multiple of embedding the message.

    Args:
        kinds: memory kinds. turns: number of turns (>= 1), default 300.

    Returns:
        ``{"turns", "sessions", "embedder", "results": {name: {"seconds", "cpu_seconds",
        "messages_per_second", "messages_per_cpu_second", "embed_calls_per_message",
        "embedded_texts_per_message", "cpu_ratio_to_embedding"}}}``.

    Raises:
        InvalidInputError: ``turns`` < 1.
    """
    if isinstance(turns, bool) or int(turns) < 1:
        raise InvalidInputError(f"turns must be >= 1, got {turns!r}.")
    from itertools import groupby

    from ..eval.baselines import FlatDense
    from ..eval.data import add_turns, load_realmem_excerpt
    from ..models.local import LocalEmbedder

    msgs = load_realmem_excerpt().messages[: int(turns)]
    sessions = [list(g) for _, g in groupby(msgs, key=lambda m: m.id)]
    emb = LocalEmbedder()
    emb.embed(["warm-up"])  # load the model before timing
    classes = _memory_classes()
    makers: dict[str, Callable[[], Any]] = {"flat_dense": lambda: FlatDense(emb)}
    makers.update({k: (lambda c=classes[k]: c(embedder=emb)) for k in kinds})
    res: dict[str, Any] = {}
    for name, make in makers.items():
        obj = make()
        w0, c0 = time.perf_counter(), time.process_time()
        for s in sessions:
            add_turns(obj, s)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        u = obj.usage
        res[name] = {
            "seconds": wall,
            "cpu_seconds": cpu,
            "messages_per_second": len(msgs) / wall if wall > 0 else None,
            "messages_per_cpu_second": len(msgs) / cpu if cpu > 0 else None,
            "embed_calls_per_message": u.embed_calls / len(msgs),
            "embedded_texts_per_message": u.embedded_texts / len(msgs),
            "cpu_ratio_to_embedding": _ratio(cpu, res["flat_dense"]["cpu_seconds"] if res else cpu),
        }
    res["flat_dense"] = res.pop("flat_dense")  # listed after the memories, as before
    return {"turns": len(msgs), "sessions": len(sessions), "embedder": emb.name, "results": res}


# --------------------------------------------------------------------------- the run
def _in_process(fn: Callable[..., Any], isolate: bool, *args: Any, **kw: Any) -> Any:
    if not isolate:
        return fn(*args, **kw)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args, **kw).result()


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _growth(
    rows: list[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]
) -> dict[str, float | None]:
    if not rows:
        return {}
    first = get(rows[0])
    return {str(r["leaves"]): _ratio(get(r), first) for r in rows[1:]}


def run_bench(
    sizes: Sequence[int] = (1_000, 10_000),
    *,
    memories: Sequence[str] | None = None,
    queries: int = 50,
    window: int = 200,
    throughput_turns: int = 300,
    isolate: bool = True,
    trace_max: int = 10_000,
    seed: int = 0,
    size_caps: dict[str, int] | None = None,
    namespace_messages: int | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the overhead benchmark for each memory, the tracemalloc pass and the throughput run.

    Args:
        sizes: leaf counts, default 1,000 and 10,000 (add 100,000 for the full run).
        memories: memory kinds, default every available one (SegTreeMem, MemTree, HAT, XMemory).
        queries: timed queries per size and policy, default 50.
        window: timed single inserts before each size, default 200.
        throughput_turns: RealMem excerpt turns for the embedded throughput run, 0 to skip; default 300.
        isolate: run each memory's timing and tracing in a fresh process (clean peak RSS), default ``True``.
        trace_max: largest size measured by tracemalloc (0 to skip), default 10,000.
        seed: stream seed, default 0.
        size_caps: ``{kind: largest size}`` for memories too costly at the largest sizes; the sizes left
            out are listed in ``doc["not_run"]``. Default none.
        namespace_messages: messages per namespace of :func:`namespace_profile` (cold open of an
            evicted SQLite namespace, RSS per resident message), run for each memory; default the
            smallest size capped at 1,000; 0 to skip.
        out: directory for ``bench.json``, ``bench.md`` and ``bench.png`` (``None``: nothing written).
        progress: callback receiving one line of text per finished step.

    Returns:
        ``{"schema", "machine": {"start", "end"}, "config", "memories": {kind: {...bench_memory...,
        "growth": {...}, "memory_profile": ..., "namespaces": ...namespace_profile...}}, "throughput"}``.

    Raises:
        InvalidInputError: bad sizes, an unknown memory, or non-positive counts.
    """
    sizes = _check_sizes(sizes)
    for name, v in (("queries", queries), ("window", window)):
        if isinstance(v, bool) or int(v) < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {v!r}.")
    available = _memory_classes()
    kinds = list(available) if memories is None else [str(m).strip().lower() for m in memories]
    unknown = [k for k in kinds if k not in available]
    if unknown or not kinds:
        raise InvalidInputError(
            f"Unknown memory {', '.join(unknown) or '(none)'}; choose from {', '.join(available)}."
        )
    ns_messages = min(sizes[0], 1_000) if namespace_messages is None else int(namespace_messages)
    if ns_messages < 0:
        raise InvalidInputError(f"namespace_messages must be >= 0, got {namespace_messages!r}.")
    caps = {str(k).lower(): int(v) for k, v in (size_caps or {}).items()}
    bad = [k for k in caps if k not in kinds]
    if bad:
        raise InvalidInputError(f"size cap for {', '.join(bad)}, which is not benchmarked in this run.")
    say = progress or (lambda s: None)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "machine": {"start": machine_description()},
        "config": {
            "sizes": sizes,
            "memories": kinds,
            "queries": int(queries),
            "window": int(window),
            "k": K,
            "dim": DIM,
            "seed": seed,
            "isolate": bool(isolate),
            "trace_max": int(trace_max),
            "throughput_turns": int(throughput_turns),
            "size_caps": caps,
            "namespace_messages": ns_messages,
            "threads": "BLAS and FAISS pinned to 1 thread for the overhead runs",
            "stubs": "ReplayEmbedder (precomputed vectors); SpanEndsSummarizer (SegTreeMem, HAT, XMemory), "
            "FirstTextSummarizer (MemTree); SegTreeMem relevance='dense'",
        },
        "memories": {},
        "not_run": [],
    }
    for kind in kinds:
        run_sizes = [s for s in sizes if s <= caps.get(kind, s)]
        doc["not_run"] += [
            {"memory": kind, "leaves": s, "reason": "size cap"} for s in sizes if s not in run_sizes
        ]
        if not run_sizes:
            continue
        say(f"bench {kind}: sizes {run_sizes} ...")
        r = _in_process(bench_memory, isolate, kind, run_sizes, window=window, queries=queries, seed=seed)
        rows = r["sizes"]
        r["growth"] = {
            "insert_wall": _growth(rows, lambda x: (x["insert"] or {}).get("wall", {}).get("median_ms")),
            "insert_cpu": _growth(rows, lambda x: (x["insert"] or {}).get("cpu", {}).get("median_ms")),
            "retrieve_cpu": {
                p: _growth(rows, lambda x, p=p: x["retrieve"][p]["cpu"]["median_ms"]) for p in r["policies"]
            },
            "flat_faiss_cpu": _growth(rows, lambda x: x["flat"]["faiss"]["cpu"]["median_ms"]),
            "flat_numpy_cpu": _growth(rows, lambda x: x["flat"]["numpy"]["cpu"]["median_ms"]),
        }
        for row in rows:
            fa = row["flat"]["faiss"]["cpu"]["median_ms"]
            row["retrieve_over_faiss_cpu"] = {
                p: _ratio(v["cpu"]["median_ms"], fa) for p, v in row["retrieve"].items()
            }
        traced = [s for s in run_sizes if s <= trace_max]
        if traced:
            r["memory_profile"] = _in_process(memory_profile, isolate, kind, traced, seed=seed)
        if ns_messages:
            r["namespaces"] = _in_process(namespace_profile, isolate, kind, ns_messages, seed=seed)
        doc["memories"][kind] = r
        if out is not None:  # partial results survive an interrupted run
            doc["machine"]["end"] = machine_description()
            write_bench(doc, out)
        last = rows[-1]
        say(
            f"  {kind} @ {last['leaves']}: insert median {last['insert']['cpu']['median_ms']:.3f} ms CPU, "
            + ", ".join(f"{p} {v['cpu']['median_ms']:.3f} ms" for p, v in last["retrieve"].items())
            + f"; flat FAISS {last['flat']['faiss']['cpu']['median_ms']:.3f} ms"
        )
    if throughput_turns:
        say(f"throughput: {throughput_turns} RealMem excerpt turns with the real embedder ...")
        doc["throughput"] = throughput(kinds, throughput_turns)
    doc["machine"]["end"] = machine_description()
    doc["seconds"] = time.perf_counter() - t0
    if out is not None:
        write_bench(doc, out)
    return doc


# --------------------------------------------------------------------------- reports
def _f(v: Any, d: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{d}f}" if isinstance(v, float) else str(v)


def render_markdown(doc: dict[str, Any]) -> str:
    """Markdown tables of a bench document: machine, inserts, retrieval, memory, evicted namespaces,
    throughput.

    Args:
        doc: the document returned by :func:`run_bench`.

    Returns:
        The Markdown text.
    """
    m0 = doc["machine"]["start"]
    m1 = doc["machine"].get("end", m0)
    cfg = doc["config"]
    lines = [
        "# hiermem bench",
        "",
        f"Machine: {m0.get('cpu_model')}, {m0.get('logical_cpus')} logical CPUs, {m0.get('memory_gib')} GiB; "
        f"load average {m0.get('load_average_1_5_15')} at the start and "
        f"{m1.get('load_average_1_5_15')} at the end (1/5/15 min). Wall times on a loaded machine "
        "include waiting for a CPU; CPU times do not.",
        "",
        f"Stub models (no model calls); {cfg['window']} timed single inserts before each size, "
        f"{cfg['queries']} queries per policy, k = {cfg['k']}; BLAS/FAISS on one thread.",
        "",
        *(
            [
                "Not run: "
                + "; ".join(f"{x['memory']} at {x['leaves']} leaves ({x['reason']})" for x in doc["not_run"])
                + ".",
                "",
            ]
            if doc.get("not_run")
            else []
        ),
        "## Insert time per message (ms)",
        "",
        "| memory | leaves | nodes | median wall | median CPU | p90 CPU | CPU growth vs smallest "
        "| peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in doc["memories"].items():
        g = r["growth"]["insert_cpu"]
        for row in r["sizes"]:
            ins = row["insert"] or {}
            lines.append(
                f"| {kind} | {row['leaves']} | {row['nodes']} | {_f(ins.get('wall', {}).get('median_ms'))} | "
                f"{_f(ins.get('cpu', {}).get('median_ms'))} | {_f(ins.get('cpu', {}).get('p90_ms'))} | "
                f"{_f(g.get(str(row['leaves'])), 2) if str(row['leaves']) in g else '1.00'} | "
                f"{_f(r['peak_rss_bytes'] / 2**20, 0) if row is r['sizes'][-1] else ''} |"
            )
    lines += [
        "",
        "## Retrieval time per query (ms, median CPU; wall in parentheses)",
        "",
        "| memory:policy | leaves | tree | flat FAISS | numpy brute force | tree / FAISS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, r in doc["memories"].items():
        for row in r["sizes"]:
            fa, nu = row["flat"]["faiss"], row["flat"]["numpy"]
            for p, v in row["retrieve"].items():
                lines.append(
                    f"| {kind}:{p} | {row['leaves']} | "
                    f"{_f(v['cpu']['median_ms'])} ({_f(v['wall']['median_ms'])}) | "
                    f"{_f(fa['cpu']['median_ms'])} ({_f(fa['wall']['median_ms'])}) | "
                    f"{_f(nu['cpu']['median_ms'])} ({_f(nu['wall']['median_ms'])}) | "
                    f"{_f(row['retrieve_over_faiss_cpu'][p], 1)} |"
                )
    prof = [(k, r["memory_profile"]) for k, r in doc["memories"].items() if r.get("memory_profile")]
    if prof:
        lines += [
            "",
            "## Traced Python/numpy memory (tracemalloc)",
            "",
            "| memory | leaves | traced MiB | peak MiB | bytes per leaf |",
            "|---|---:|---:|---:|---:|",
        ]
        for kind, p in prof:
            for s in p["sizes"]:
                lines.append(
                    f"| {kind} | {s['leaves']} | {_f(s['traced_bytes'] / 2**20, 1)} | "
                    f"{_f(s['traced_peak_bytes'] / 2**20, 1)} | {_f(s['bytes_per_leaf'], 0)} |"
                )
    nsp = [(k, r["namespaces"]) for k, r in doc["memories"].items() if r.get("namespaces")]
    if nsp:
        lines += [
            "",
            "## Evicted namespaces (MemoryStore on SQLite)",
            "",
            "| memory | messages per namespace | cold open median ms (CPU) | texts embedded on reopen "
            "| RSS bytes per resident message | SQLite bytes per message |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind, p in nsp:
            lines.append(
                f"| {kind} | {p['messages']} | {_f(p['cold_open']['wall']['median_ms'], 1)} "
                f"({_f(p['cold_open']['cpu']['median_ms'], 1)}) | {p['embedded_texts_on_reopen']} | "
                f"{_f(p['rss_per_resident_message_bytes'], 0)} | {_f(p['sqlite_bytes_per_message'], 0)} |"
            )
    tp = doc.get("throughput")
    if tp:
        lines += [
            "",
            f"## Embedded-default throughput ({tp['turns']} RealMem excerpt turns, "
            f"{tp['sessions']} sessions, "
            f"{tp['embedder']}, no LLM)",
            "",
            "| method | messages/s (wall) | messages per CPU-second | CPU per message, x embedding it "
            "| embedding calls/msg | embedded texts/msg |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, v in tp["results"].items():
            lines.append(
                f"| {name} | {_f(v['messages_per_second'], 1)} | {_f(v['messages_per_cpu_second'], 1)} | "
                f"{_f(v.get('cpu_ratio_to_embedding'), 2)} | "
                f"{_f(v['embed_calls_per_message'], 2)} | {_f(v['embedded_texts_per_message'], 2)} |"
            )
    return "\n".join(lines) + "\n"


def plot_bench(doc: dict[str, Any], path: str | Path) -> Path:
    """Log-log plot of time vs leaves: insert per message, and retrieval per query beside flat search.

    Args:
        doc: the bench document. path: the PNG to write.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    ax_i, ax_r = axes
    cmap = plt.get_cmap("tab10")
    for ci, (kind, r) in enumerate(doc["memories"].items()):
        xs = [row["leaves"] for row in r["sizes"] if row["insert"]]
        for t, style in (("cpu", "-"), ("wall", ":")):
            ys = [row["insert"][t]["median_ms"] for row in r["sizes"] if row["insert"]]
            ax_i.plot(xs, ys, style, marker="o", color=cmap(ci % 10), label=f"{kind} ({t})")
        for pi, p in enumerate(r["policies"]):
            ys = [row["retrieve"][p]["cpu"]["median_ms"] for row in r["sizes"]]
            ax_r.plot(
                [row["leaves"] for row in r["sizes"]],
                ys,
                ["-", "--", "-.", ":", "-"][pi % 5],
                marker="o",
                color=cmap(ci % 10),
                label=f"{kind}:{p}",
            )
    # flat search: the median over the memories' runs at each size
    by_size: dict[int, dict[str, list[float]]] = {}
    for r in doc["memories"].values():
        for row in r["sizes"]:
            d = by_size.setdefault(row["leaves"], {"faiss": [], "numpy": []})
            for m in d:
                d[m].append(row["flat"][m]["cpu"]["median_ms"])
    xs = sorted(by_size)
    for m, color in (("faiss", "black"), ("numpy", "gray")):
        ax_r.plot(
            xs,
            [statistics.median(by_size[x][m]) for x in xs],
            "-",
            lw=2.5,
            color=color,
            marker="s",
            label=f"flat {m} (floor)",
        )
    for ax, title, ylab in (
        (ax_i, "Insert: time per message (median; solid CPU, dotted wall)", "ms per message"),
        (ax_r, "Retrieval: CPU time per query (median), k = 10", "ms per query"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("leaves (messages stored)")
        ax.set_ylabel(ylab)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_bench(doc: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir`` (created when missing).

    Returns:
        The file names written.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {"json": "bench.json", "markdown": "bench.md", "png": "bench.png"}
    doc["files"] = files
    (d / files["markdown"]).write_text(render_markdown(doc), encoding="utf-8")
    plot_bench(doc, d / files["png"])
    (d / files["json"]).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return files
