"""Ingest cost on the embedded defaults: CPU per message as a multiple of embedding the message alone.

Real turns (the first ``--turns`` of LoCoMo conv-26, or of the bundled RealMem excerpt) are added one
``add`` per message, as a chat adds them; the baseline embeds the same messages one per call with the same
embedder in the same process. Every memory is measured with both ways of making its summary vectors
(``annotation_vectors="composed"`` and ``"embedded"``). One torch thread, process CPU time.

Usage::

    python benchmarks/ingest_cost.py --turns 200 --locomo ../shared/data/locomo/locomo_dev.json
    python benchmarks/ingest_cost.py --turns 150            # the bundled RealMem excerpt

Prints one line per run and writes JSON (``--out``, default ``ingest_cost.json``):
``{"data", "turns", "embed_only_cpu_ms_per_msg", "runs": {"<kind>/<mode>": {"cpu_ms_per_msg", "ratio",
"texts_per_msg"}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--locomo", type=Path, default=None, help="LoCoMo JSON (conv-26 is used)")
    ap.add_argument("--memories", default="segtree,memtree,hat,xmemory")
    ap.add_argument("--modes", default="composed,embedded")
    ap.add_argument("--out", type=Path, default=Path("ingest_cost.json"))
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    from shared_core import HAT, MemTree, SegTreeMem
    from shared_core.eval.data import load_locomo, load_realmem_excerpt
    from shared_core.models.local import LocalEmbedder
    from shared_core.xmemory import XMemory

    conv = load_locomo(args.locomo)[0] if args.locomo else load_realmem_excerpt()
    msgs = conv.messages[: args.turns]
    emb = LocalEmbedder()
    emb.embed(["warm-up"])
    t0 = time.process_time()
    for m in msgs:
        emb.embed([m.render()])
    base = (time.process_time() - t0) / len(msgs)
    classes = {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT, "xmemory": XMemory}
    runs: dict[str, dict[str, float]] = {}
    for kind in args.memories.split(","):
        for mode in args.modes.split(","):
            mem = classes[kind](embedder=emb, annotation_vectors=mode)
            t0 = time.process_time()
            for m in msgs:
                mem.add(m)
            cpu = (time.process_time() - t0) / len(msgs)
            runs[f"{kind}/{mode}"] = {
                "cpu_ms_per_msg": cpu * 1000,
                "ratio": cpu / base,
                "texts_per_msg": mem.usage.embedded_texts / len(msgs),
            }
            print(kind, mode, {k: round(v, 2) for k, v in runs[f"{kind}/{mode}"].items()}, flush=True)
    doc = {
        "data": "locomo conv-26" if args.locomo else "realmem excerpt",
        "turns": len(msgs),
        "embed_only_cpu_ms_per_msg": base * 1000,
        "runs": runs,
    }
    args.out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
