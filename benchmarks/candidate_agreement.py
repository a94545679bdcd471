"""``top_down`` over candidates against scoring every node: the same hits, and what each costs.

Past ``exact_search_max`` indexed nodes (and 48 x 32 (3k + 8)), SegTreeMem, MemTree and HAT score the
candidates of an IVF index over every node and BM25, their ancestors and the descendants that could rank
(docs/performance.md, "Retrieval past a size"). This script grows each memory with its default
summariser on the stub models of ``hiermem bench --conversation`` (the same streams and queries), then
asks each query twice: as the memory answers it, and with ``exact_search_max = None`` (every node).

Usage::

    python benchmarks/candidate_agreement.py --leaves 100000 --out agreement.json

Writes per memory and stream: the nodes, the queries, how many took the candidate path, how many gave
the same hits (node ids, in order) as every node, and the median CPU ms of a query each way.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leaves", type=int, default=100_000, help="messages added before the queries")
    ap.add_argument("--queries", type=int, default=60, help="queries per memory and stream (default 60)")
    ap.add_argument("--memories", default="segtree,memtree,hat", help="comma-separated (default all three)")
    ap.add_argument("--streams", default="topical,random", help="comma-separated (default both)")
    ap.add_argument("--out", default="agreement.json", help="JSON output path")
    args = ap.parse_args()

    from shared_core.bench.stubs import ReplayEmbedder, pin_threads
    from shared_core.bench.workloads import _query, conversation_memory, conversation_stream

    pin_threads()
    out: dict = {"leaves": args.leaves, "k": 10, "runs": {}}
    for stream in args.streams.split(","):
        for kind in args.memories.split(","):
            texts, table = conversation_stream(stream, args.leaves + 300, 0)
            mem = conversation_memory(kind, ReplayEmbedder(table), "default")
            for n in range(0, args.leaves, 500):
                mem.add(texts[n : min(n + 500, args.leaves)])
            rng = np.random.default_rng(7)
            mem.retrieve(_query(rng, table, texts, args.leaves, "warm"), k=10)  # trains the IVF index
            same = taken = 0
            t_cand: list[float] = []
            t_all: list[float] = []
            for i in range(args.queries):
                q = _query(rng, table, texts, args.leaves, f"a{i}")
                c = time.process_time()
                got = mem.retrieve(q, k=10)
                t_cand.append(time.process_time() - c)
                taken += mem.last_candidates is not None
                saved, mem.exact_search_max = mem.exact_search_max, None
                c = time.process_time()
                want = mem.retrieve(q, k=10)
                t_all.append(time.process_time() - c)
                mem.exact_search_max = saved
                same += [h.node_id for h in got] == [h.node_id for h in want]
            row = {
                "nodes": len(mem._index),
                "queries": args.queries,
                "candidate_path_taken": taken,
                "same_hits": same,
                "query_ms_p50_candidates": 1e3 * float(np.median(t_cand)),
                "query_ms_p50_exhaustive": 1e3 * float(np.median(t_all)),
            }
            out["runs"][f"{kind}/{stream}"] = row
            print(kind, stream, row, flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
