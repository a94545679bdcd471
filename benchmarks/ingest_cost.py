"""Ingest cost on the embedded defaults: CPU per message as a multiple of embedding the message alone.

The measurement of ``hiermem bench --ingest`` (:func:`shared_core.bench.workloads.ingest_workload`) on one
conversation — the first ``--turns`` of LoCoMo conv-26, or of the bundled RealMem excerpt — written in
this script's own format. Real turns are added one ``add`` per message, as a chat adds them; the baseline
embeds the same messages one per call with the same embedder in the same process, just before each run.
Every memory is measured with both ways of making its summary vectors (``annotation_vectors="composed"``
and ``"embedded"``) unless ``--modes`` says otherwise. One torch thread, process CPU time.

Usage::

    python benchmarks/ingest_cost.py --turns 200 --locomo ../shared/data/locomo/locomo_dev.json
    python benchmarks/ingest_cost.py --turns 150            # the bundled RealMem excerpt

Prints one line per run and writes JSON (``--out``, default ``ingest_cost.json``):
``{"data", "turns", "embed_only_cpu_ms_per_msg", "runs": {"<kind>/<mode>": {"cpu_ms_per_msg", "ratio",
"texts_per_msg", "embed_only_cpu_ms_per_msg", "default"}}}``; ``ratio`` is over the run's own baseline,
``embed_only_cpu_ms_per_msg`` at the top is the mean of the runs' baselines.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--locomo", type=Path, default=None, help="LoCoMo JSON (conv-26 is used)")
    ap.add_argument("--memories", default="segtree,memtree,hat,xmemory")
    ap.add_argument("--modes", default="composed,embedded", help="composed, embedded and/or default")
    ap.add_argument("--out", type=Path, default=Path("ingest_cost.json"))
    args = ap.parse_args()
    from shared_core.bench.workloads import ingest_workload

    doc = ingest_workload(
        args.memories.split(","),
        turns=args.turns,
        locomo=args.locomo,
        modes=args.modes.split(","),
        realmem_excerpt=args.locomo is None,
    )
    name, ds = next(iter(doc["datasets"].items()))
    runs: dict[str, dict[str, float | bool]] = {}
    for kind, by_mode in ds["results"].items():
        for mode, v in by_mode.items():
            runs[f"{kind}/{mode}"] = {
                "cpu_ms_per_msg": v["cpu_ms_per_message"],
                "ratio": v["ratio"],
                "texts_per_msg": v["embedded_texts_per_message"],
                "embed_only_cpu_ms_per_msg": v["embed_cpu_ms_per_message"],
                "default": v["default"],
            }
            print(
                kind,
                mode,
                {k: x if isinstance(x, bool) else round(x, 2) for k, x in runs[f"{kind}/{mode}"].items()},
                flush=True,
            )
    out = {
        "data": name,
        "turns": ds["turns"],
        "embed_only_cpu_ms_per_msg": statistics.mean(
            float(r["embed_only_cpu_ms_per_msg"]) for r in runs.values()
        ),
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
