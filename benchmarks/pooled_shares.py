"""Paired differences of two policies pooled over several ``hiermem eval`` runs (e.g. dev and validate).

``hiermem eval`` reports each memory's tree share (``top_down`` − ``collapsed``) per run. Pooling the
questions of several runs asks whether small shares of one sign add up to something measurable. Each run's
``queries.jsonl`` rows are matched by (dataset, conversation, question) within the run, the per-question
differences of the runs are concatenated and resampled together
(:func:`shared_core.eval.protocol.paired_bootstrap`, 10,000 resamples of the questions, seed 0).

Usage::

    python benchmarks/pooled_shares.py benchmarks/results/eval_defaults/dev \\
        benchmarks/results/eval_defaults/validate --memories segtree,memtree,hat

Prints one JSON object: per memory, the number of questions, the mean difference ``a − b`` and its 95%
interval, and the same per run.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="--out directories of hiermem eval runs")
    ap.add_argument(
        "--memories", default="segtree,memtree,hat", help="memory builds (default segtree,memtree,hat)"
    )
    ap.add_argument("--a", default="top_down", help="policy a (default top_down)")
    ap.add_argument("--b", default="collapsed", help="policy b (default collapsed)")
    ap.add_argument("--metric", default="evidence_recall", help="per-query field (default evidence_recall)")
    args = ap.parse_args()

    from shared_core.eval.protocol import QUERY_ROWS_JSONL, paired_bootstrap, paired_values

    rows: dict[str, dict[str, list[dict]]] = {}
    for run in args.runs:
        per: dict[str, list[dict]] = defaultdict(list)
        with (Path(run) / QUERY_ROWS_JSONL).open(encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                per[r["method"]].append(r)
        rows[run] = per

    def interval(a: np.ndarray, b: np.ndarray) -> dict:
        r = paired_bootstrap(a, b)
        return {"n": 0} if r is None else {k: r[k] for k in ("n", "mean", "low", "high")}

    out: dict[str, dict] = {}
    for mem in args.memories.split(","):
        xs, ys, by_run = [], [], {}
        for run, per in rows.items():
            x, y = paired_values(per[f"{mem}:{args.a}"], per[f"{mem}:{args.b}"], args.metric)
            xs.append(x)
            ys.append(y)
            by_run[Path(run).name] = interval(x, y)
        out[mem] = {"pooled": interval(np.concatenate(xs), np.concatenate(ys)), "runs": by_run}
    print(json.dumps({"a": args.a, "b": args.b, "metric": args.metric, "memories": out}, indent=1))


if __name__ == "__main__":
    main()
