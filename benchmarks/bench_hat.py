"""HAT insertion cost without model calls: per-insert overhead and aggregation calls per insert.

The embedder returns precomputed vectors (a fixed pool of random unit vectors picked by a hash of the
text) and the summariser returns a short text built from its last child (no concatenation, so its cost
does not grow with the tree) that changes whenever the children change, so every ancestor of a new leaf
is re-aggregated: the worst case for aggregation calls. Both stubs time themselves; the overhead is the
wall time of ``add`` minus that model time (tree update, hashing, cache, transaction, index upsert).

One memory is grown by single-message ``add`` calls to the largest size; at each checkpoint the last
``window`` inserts are measured. At the end one batched ``add`` of ``window`` messages shows the
aggregation calls per message when an add aggregates each touched ancestor once.

Usage::

    python benchmarks/bench_hat.py                      # sizes 1000 10000 100000, M=4, JSON on stdout
    python benchmarks/bench_hat.py --sizes 1000 10000 --M 2 --out hat.json

Output (JSON): per checkpoint ``leaves``, ``layers``, ``log_M(n)``, ``us_per_insert_wall``,
``us_per_insert_models``, ``us_per_insert_overhead`` (wall minus model time), ``us_per_insert_cpu``
(process CPU time, models included: less sensitive to a busy machine), ``aggregation_calls_per_insert``,
``single_child_copies_per_insert``, ``cache_hits_per_insert``; plus ``batch`` and the configuration.

References:
    HAT paper Sec. 3.1 (insertion re-aggregates the ancestors of the new leaf: O(log_M n) of them).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared_core.bench.core import HashSummarizer as StubSummarizer  # noqa: E402
from shared_core.bench.core import PoolEmbedder  # noqa: E402
from shared_core.memories.hat import HAT  # noqa: E402


def run(sizes: list[int], M: int, window: int, dim: int) -> dict:
    emb, summ = PoolEmbedder(dim=dim), StubSummarizer()
    mem = HAT(emb, M=M, summarizer=summ)
    out: dict = {
        "config": {"M": M, "window": window, "dim": dim, "sizes": sizes},
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "checkpoints": [],
    }
    n = 0
    t_build = time.perf_counter()
    for size in sorted(sizes):
        start = max(n, size - window)
        while n < start:
            mem.add(f"message {n}")
            n += 1
        c0 = dict(mem._counters)
        model0 = emb.seconds + summ.seconds
        t0, cpu0 = time.perf_counter(), time.process_time()
        measured = 0
        while n < size:
            mem.add(f"message {n}")
            n += 1
            measured += 1
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        model = emb.seconds + summ.seconds - model0
        s = mem.stats()
        per = {
            k: (s[k] - c0[k]) / measured for k in ("aggregation_calls", "single_child_copies", "cache_hits")
        }
        out["checkpoints"].append(
            {
                "leaves": size,
                "nodes": s["nodes"],
                "layers": s["layers"],
                "log_M(n)": round(math.log(size, M), 3),
                "measured_inserts": measured,
                "us_per_insert_wall": round(1e6 * wall / measured, 1),
                "us_per_insert_models": round(1e6 * model / measured, 1),
                "us_per_insert_overhead": round(1e6 * (wall - model) / measured, 1),
                "us_per_insert_cpu": round(1e6 * cpu / measured, 1),
                "aggregation_calls_per_insert": round(per["aggregation_calls"], 3),
                "single_child_copies_per_insert": round(per["single_child_copies"], 3),
                "cache_hits_per_insert": round(per["cache_hits"], 3),
            }
        )
        print(json.dumps(out["checkpoints"][-1]), file=sys.stderr)
    out["build_seconds"] = round(time.perf_counter() - t_build, 2)
    calls0 = summ.calls
    t0 = time.perf_counter()
    mem.add([f"batched {i}" for i in range(window)])
    out["batch"] = {
        "messages": window,
        "leaves_before": n,
        "us_per_message_wall": round(1e6 * (time.perf_counter() - t0) / window, 1),
        "aggregation_calls_per_message": round((summ.calls - calls0) / window, 3),
    }
    mem.check_invariants()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--M", type=int, default=4)
    ap.add_argument("--window", type=int, default=500, help="inserts measured before each checkpoint")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (default: stdout)")
    args = ap.parse_args()
    result = run(args.sizes, args.M, args.window, args.dim)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
