"""SegTreeMem algorithm overhead with model calls taken out.

* Insertion: median wall time per insert around 1,000 and around 100,000 leaves, fed through a stub
  embedder that replays precomputed vectors and a summariser that costs nothing (returns the last child's
  text). Target: the median at 100k is at most 2x the median at 1k.
* Retrieval: ``bottom_up`` with H=2 over the whole tree (≈100k+ nodes), per query, next to one flat FAISS
  search over the same vectors in the same run. Target: under 50 ms per query.
* Model calls per insert for each compatibility model (embedding calls, LLM calls), from ``AddReport``.

The stream has topical structure: themes of 500-3,000 messages made of topics of 5-40 messages; a
message is a noisy copy of its topic vector, which leans towards its theme's vector. Annotations cost
nothing but behave like summaries: a node's vector is the mean of its first and
last child's, so it drifts from the newest message as its span grows.

The tree is built with the cosine model's ``branching`` (default 8; ``--branching none`` is the
paper's rule, a new root for every utterance unlike the frontier), and the shape is reported: height,
tree and stored nodes per leaf, mean branching and the widest node.

Usage: ``python benchmarks/bench_segtree.py [--leaves 100000] [--branching 8|none] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import faiss
import numpy as np

from shared_core import SegTreeMem
from shared_core.bench.core import (
    ReplayEmbedder,
    SpanEndsSummarizer,
    machine_description,
    pin_threads,
    topical_stream,
)
from shared_core.types import Usage

DIM = 384


def bench_insert_and_retrieve(
    n_leaves: int, window: int = 500, queries: int = 50, branching: int | None = 8
) -> dict[str, object]:
    texts, table = topical_stream(n_leaves + window)
    mem = SegTreeMem(
        embedder=ReplayEmbedder(table),
        summarizer=SpanEndsSummarizer(table),
        relevance="dense",
        branching=branching,
    )
    times: dict[int, float] = {}
    checkpoints = {1_000, n_leaves}
    t0 = time.perf_counter()
    for i, t in enumerate(texts):
        s = time.perf_counter()
        mem.add(t)
        times[i] = time.perf_counter() - s
    build_s = time.perf_counter() - t0
    med = {c: statistics.median(times[j] for j in range(c, min(c + window, len(texts)))) for c in checkpoints}
    stats = mem.stats()
    # retrieval over the full tree vs one flat FAISS search over the same vectors
    rng = np.random.default_rng(1)
    qs = [texts[int(j)] for j in rng.integers(0, len(texts), size=queries)]
    for q in qs[:3]:
        mem.retrieve(q, k=10, policy="bottom_up", horizon=2, admissible="all")  # warm caches
    s, c = time.perf_counter(), time.process_time()
    for q in qs:
        mem.retrieve(q, k=10, policy="bottom_up", horizon=2, admissible="all")
    tree_ms = (time.perf_counter() - s) / queries * 1e3
    tree_cpu_ms = (time.process_time() - c) / queries * 1e3
    assert mem._index is not None
    flat = faiss.IndexFlatIP(DIM)
    flat.add(mem._index.get(mem._index.ids.tolist()))
    qv = np.stack([table[q] for q in qs]).astype(np.float32)
    s, c = time.perf_counter(), time.process_time()
    for j in range(queries):
        flat.search(qv[j : j + 1], 10)
    flat_ms = (time.perf_counter() - s) / queries * 1e3
    flat_cpu_ms = (time.process_time() - c) / queries * 1e3
    return {
        "branching": branching,
        "leaves": len(texts),
        "nodes": stats["nodes"],
        "tree_nodes": stats["tree_nodes"],
        "stored_nodes_per_leaf": stats["nodes"] / len(texts),
        "tree_nodes_per_leaf": stats["tree_nodes"] / len(texts),
        "height": stats["height"],
        "mean_branching": stats["mean_branching"],
        "max_children": max(len(n.children) for n in mem._store.nodes.values()),
        "decisions": stats["decisions"],
        "build_seconds": build_s,
        "insert_median_ms": {str(c): med[c] * 1e3 for c in sorted(checkpoints)},
        "insert_growth_ratio": med[n_leaves] / med[1_000],
        "bottom_up_H2_ms_per_query": tree_ms,
        "flat_faiss_ms_per_query": flat_ms,
        "retrieval_ratio_to_flat": tree_ms / flat_ms,
        "bottom_up_H2_cpu_ms_per_query": tree_cpu_ms,
        "flat_faiss_cpu_ms_per_query": flat_cpu_ms,
        "retrieval_cpu_ratio_to_flat": tree_cpu_ms / flat_cpu_ms,
    }


def model_calls_per_insert(n: int = 200, branching: int | None = 8) -> dict[str, dict[str, float]]:
    """Embedding and LLM calls per insert for each compatibility model (LLM answers scripted locally)."""
    from shared_core.types import Completion

    class ScriptedLLM:
        def __init__(self) -> None:
            self.i = 0

        def complete(self, prompt: str, **kw: object) -> Completion:
            self.i += 1
            if "MERGE_1" in prompt:
                text = "MERGE_1" if self.i % 5 else "SPLIT"
            elif "CONTINUE" in prompt:
                text = "MERGE" if self.i % 3 else "CONTINUE"
            else:
                text = "summary " + str(self.i)
            return Completion(
                text, Usage(llm_calls=1, prompt_tokens=len(prompt.split()), completion_tokens=2)
            )

        async def acomplete(self, prompt: str, **kw: object) -> Completion:
            return self.complete(prompt, **kw)

    texts, table = topical_stream(n, seed=2)
    out: dict[str, dict[str, float]] = {}
    for compat in ("cosine", "pointwise_llm", "batch_llm"):
        llm = None if compat == "cosine" else ScriptedLLM()
        mem = SegTreeMem(
            embedder=ReplayEmbedder(table),
            llm=llm,
            compat=compat,
            summarizer=None if llm else SpanEndsSummarizer(table),
            relevance="dense",
            branching=branching,
        )
        tot = Usage()
        for t in texts:
            tot += mem.add(t).usage
        out[compat] = {
            "embed_calls_per_insert": tot.embed_calls / n,
            "llm_calls_per_insert": tot.llm_calls / n,
            "prompt_tokens_per_insert": tot.prompt_tokens / n,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leaves", type=int, default=100_000)
    ap.add_argument(
        "--branching",
        type=lambda v: None if v.lower() == "none" else int(v),
        default=8,
        help="the cosine model's branching factor B, or 'none' for the paper's rule (default 8)",
    )
    ap.add_argument("--out", type=str, default=None)
    args = ap.parse_args()
    pin_threads()  # one BLAS/FAISS thread: the flat search and the tree pay the same
    start = machine_description()
    res = {
        "machine": {"start": start},
        "insert_and_retrieve": bench_insert_and_retrieve(args.leaves, branching=args.branching),
        "model_calls": model_calls_per_insert(branching=args.branching),
    }
    res["machine"]["end"] = machine_description()
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
