"""MemTree algorithm overhead with model calls taken out, next to one flat FAISS search.

* Insertion: median wall time of one ``add`` into a tree of about N nodes (N = 1k, 10k, 100k), fed
  through a stub embedder that replays precomputed vectors and an aggregate function that costs nothing
  (it returns the first text, i.e. the node's existing content), as a ratio to one flat FAISS search
  (``IndexFlatIP``, k=3) over the same node vectors in the same run.
* Collapsed retrieval: median latency of ``retrieve(q, k=3, policy="collapsed")`` (query embedding by the
  stub, scoring every node, threshold, top-k, hits), as a ratio to the same flat FAISS search; traversal
  retrieval is reported beside it.
* Concurrency: an LLM that sleeps 100 ms per call; one insert whose path needs 5 aggregations, with the
  default thread pool and with ``max_workers=1``; ratio to 5 sequential calls (500 ms).

The stream has a two-level topical structure in 384-d (40 topics x 25 subtopics; a message is a noisy
copy of topic + subtopic; cosine about 0.92 within a subtopic, 0.62 within a topic, 0 across topics), in
random order, so the adaptive threshold builds a branching tree as a conversation does.

BLAS and FAISS run single-threaded (``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS``
default to 1 unless set): one query is too little work to share, and on a busy machine spinning worker
threads make both sides slower by orders of magnitude.

Wall-clock medians are the headline figures; the thread CPU time of the same calls is reported beside
them (``cpu``) because on a shared machine a sub-millisecond call is often descheduled for a whole time
slice, which inflates wall-clock tails but not CPU time.

Usage: ``python benchmarks/bench_memtree.py [--sizes 1000,10000,100000] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from shared_core.bench.core import FirstTextSummarizer, ReplayEmbedder, clustered_stream  # noqa: E402
from shared_core.memories.memtree import MemTree  # noqa: E402
from shared_core.types import Completion, Usage  # noqa: E402

DIM = 384


class SleepLLM:
    """LLM protocol; every call sleeps ``delay`` seconds and returns a short summary."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, prompt, *, system=None, max_tokens=None, logprobs=False) -> Completion:
        with self._lock:
            self.calls += 1
            n = self.calls
        time.sleep(self.delay)
        return Completion(text=f"Summary {n}.", usage=Usage(llm_calls=1))

    async def acomplete(self, prompt, *, system=None, max_tokens=None, logprobs=False) -> Completion:
        return await asyncio.to_thread(self.complete, prompt)


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


topical_stream = clustered_stream


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000.0


def bench_size(target_nodes: int, n_inserts: int, n_queries: int, seed: int) -> dict:
    max_leaves = target_nodes + n_inserts + 16
    texts, table, rng = topical_stream(max_leaves, seed)
    emb = ReplayEmbedder(table, unknown="fixed")
    mem = MemTree(emb, summarizer=FirstTextSummarizer())
    t0 = time.perf_counter()
    i = 0
    chunk = 500
    while len(mem._store.nodes) < target_nodes and i < len(texts) - n_inserts:
        step = max(1, min(chunk, (target_nodes - len(mem._store.nodes)) // 2 or 1))
        mem.add(texts[i : i + step])
        i += step
    build_s = time.perf_counter() - t0
    # single inserts into a tree of ~target_nodes nodes
    ins, ins_cpu = [], []
    for t in texts[i : i + n_inserts]:
        c1, t1 = time.thread_time(), time.perf_counter()
        mem.add(t)
        ins.append(time.perf_counter() - t1)
        ins_cpu.append(time.thread_time() - c1)
    nodes = len(mem._store.nodes)
    # the same node vectors in a flat FAISS index
    ids = mem._index.ids.copy()
    X = mem._index.get(ids.tolist())
    flat = faiss.IndexFlatIP(DIM)
    flat.add(X)
    picks = rng.integers(0, len(ids), size=n_queries)
    qs = []
    for j, p in enumerate(picks):
        q = X[p] + 0.3 * _unit(rng, 1)[0]
        q = (q / np.linalg.norm(q)).astype(np.float32)
        table[f"query {j}"] = q
        qs.append(q)
    for q in qs[:3]:  # warm-up
        flat.search(q[None, :], 3)
        mem.retrieve("query 0", k=3)
    fs, cs, ts, fs_cpu, cs_cpu = [], [], [], [], []
    for j, q in enumerate(qs):
        c1, t1 = time.thread_time(), time.perf_counter()
        flat.search(q[None, :], 3)
        fs.append(time.perf_counter() - t1)
        fs_cpu.append(time.thread_time() - c1)
        c1, t1 = time.thread_time(), time.perf_counter()
        mem.retrieve(f"query {j}", k=3, policy="collapsed")
        cs.append(time.perf_counter() - t1)
        cs_cpu.append(time.thread_time() - c1)
        t1 = time.perf_counter()
        mem.retrieve(f"query {j}", k=3, policy="traversal")
        ts.append(time.perf_counter() - t1)
    s = mem.stats()
    flat_ms = _median_ms(fs)
    return {
        "target_nodes": target_nodes,
        "nodes": nodes,
        "leaves": s["leaves"],
        "build_seconds": round(build_s, 2),
        "tree": {
            k: s[k]
            for k in (
                "max_depth",
                "mean_depth",
                "branching_nodes",
                "root_children",
                "mean_branching_factor",
                "width",
            )
        },
        "flat_faiss_search_ms": round(flat_ms, 4),
        "insert_ms_median": round(_median_ms(ins), 4),
        "insert_ms_p90": round(float(np.percentile(ins, 90)) * 1000, 4),
        "insert_over_flat_search": round(_median_ms(ins) / flat_ms, 2),
        "collapsed_ms_median": round(_median_ms(cs), 4),
        "collapsed_over_flat_search": round(_median_ms(cs) / flat_ms, 2),
        "traversal_ms_median": round(_median_ms(ts), 4),
        "traversal_over_flat_search": round(_median_ms(ts) / flat_ms, 2),
        "cpu": {
            "flat_faiss_search_ms_median": round(_median_ms(fs_cpu), 4),
            "insert_ms_median": round(_median_ms(ins_cpu), 4),
            "insert_ms_p90": round(float(np.percentile(ins_cpu, 90)) * 1000, 4),
            "collapsed_ms_median": round(_median_ms(cs_cpu), 4),
        },
    }


def bench_concurrency(delay: float = 0.1) -> dict:
    """One insert whose path needs 5 aggregations (constant vectors: every insert follows the first child)."""
    out = {}
    for workers in (8, 1):
        llm = SleepLLM(0.0)
        emb = ReplayEmbedder({}, dim=4, unknown="fixed")
        mem = MemTree(emb, llm, max_workers=workers)
        for i in range(5):
            mem.add(f"Message {i}.")
        llm.delay = delay
        t0 = time.perf_counter()
        rep = mem.add("Message 5.")
        el = time.perf_counter() - t0
        out[f"max_workers_{workers}"] = {
            "aggregations": rep.details[0]["aggregations"],
            "llm_calls": rep.usage.llm_calls,
            "seconds": round(el, 4),
            "over_sequential_calls": round(el / (rep.usage.llm_calls * delay), 3),
        }
    return {"llm_delay_s": delay, **out}


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated node counts")
    ap.add_argument("--inserts", type=int, default=200, help="timed single inserts per size")
    ap.add_argument("--queries", type=int, default=100, help="timed queries per size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result = {
        "benchmark": "memtree",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "threads": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "sizes": [],
    }
    for n in sizes:
        r = bench_size(n, args.inserts, args.queries, args.seed)
        result["sizes"].append(r)
        print(f"{n}: {r}", file=sys.stderr)
    result["concurrency"] = bench_concurrency()
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
