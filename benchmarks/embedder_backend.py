"""The embedded embedder on torch and on ONNX Runtime: agreement, CPU per message and start-up cost.

Both backends of :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2) on the LoCoMo dev
turns (conv-26 and conv-30, ``message.render()``), on one thread (``torch.set_num_threads(1)``, one ONNX
Runtime intra-op thread), in process CPU time (``time.process_time``):

* agreement: cosine between the two backends' vectors of every turn (batched), and of the first
  ``--turns`` turns embedded one per call;
* one per call: CPU ms per message over the first ``--turns`` turns, ``embed([text])`` each, as a chat
  adds them;
* batched: CPU ms per message over all turns with ``batch_size=32``;
* both measured ``--rounds`` times, interleaved (the order of the backends alternates by round);
* start-up, each in a fresh process: CPU seconds from process start to the first vector for torch, for
  ONNX exporting into an empty cache directory, for ONNX from that cache, and for ONNX when the cache
  cannot be written (exported in memory), with the peak resident memory.

Usage::

    python benchmarks/embedder_backend.py --locomo ../shared/data/locomo/locomo_dev.json \\
        --out benchmarks/results/embedder_backend.json

Prints a summary and writes JSON: ``{"machine", "settings", "agreement", "one_per_call", "batched",
"startup", "ratios"}``; per-call and batched figures are lists with one value per round, ratios are
torch over ONNX of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_CHILD = r"""
import json, os, resource, sys, time
backend, cache = sys.argv[1], sys.argv[2]
if backend == "torch":
    import torch
    torch.set_num_threads(1)
from shared_core.models.local import LocalEmbedder
emb = LocalEmbedder(backend=backend, cache_dir=cache, num_threads=1)
t = time.process_time()
emb.embed(["warm-up"])
load = time.process_time() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"backend": emb.active_backend, "cpu_s_to_first_vector": time.process_time(),
                  "cpu_s_load": load, "max_rss_mb": rss}))
"""


def _child(backend: str, cache: str) -> dict[str, Any]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, backend, cache], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_ms_per_msg(fn: Any, texts: list[str], one_per_call: bool) -> tuple[float, Any]:
    import numpy as np

    t = time.process_time()
    vecs = np.concatenate([fn([x]) for x in texts]) if one_per_call else fn(texts)
    return (time.process_time() - t) * 1000 / len(texts), vecs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=Path, default=Path("../shared/data/locomo/locomo_dev.json"))
    ap.add_argument("--turns", type=int, default=300, help="turns embedded one per call")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-startup", action="store_true", help="no fresh-process start-up measurements")
    ap.add_argument("--out", type=Path, default=Path("embedder_backend.json"))
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import onnxruntime
    import sentence_transformers
    import torch

    from shared_core.eval.data import load_locomo
    from shared_core.models.local import LocalEmbedder

    torch.set_num_threads(1)
    load0 = [round(x, 2) for x in os.getloadavg()]
    convs = [c for c in load_locomo(args.locomo) if c.id in ("conv-26", "conv-30")]
    texts = [m.render() for c in convs for m in c.messages]
    first = texts[: args.turns]

    doc: dict[str, Any] = {
        "settings": {
            "conversations": [c.id for c in convs],
            "turns": len(texts),
            "one_per_call_turns": len(first),
            "batch_size": 32,
            "rounds": args.rounds,
            "threads": 1,
        }
    }
    startup: dict[str, Any] = {}
    if not args.skip_startup:
        with tempfile.TemporaryDirectory() as tmp:
            blocker = Path(tmp) / "not-a-directory"
            blocker.write_text("")
            startup["torch"] = _child("torch", tmp)
            startup["onnx_export"] = _child("onnx", str(Path(tmp) / "cache"))
            startup["onnx_cached"] = _child("onnx", str(Path(tmp) / "cache"))
            startup["onnx_in_memory"] = _child("onnx", str(blocker / "cache"))
            graph = next((Path(tmp) / "cache").rglob("*.onnx"))
            startup["onnx_graph_mb"] = graph.stat().st_size / 1e6
    doc["startup"] = startup

    with tempfile.TemporaryDirectory() as cache:
        emb = {
            "torch": LocalEmbedder(backend="torch"),
            "onnx": LocalEmbedder(backend="onnx", cache_dir=cache, num_threads=1),
        }
        batched = {k: LocalEmbedder(batch_size=32, backend=k, cache_dir=cache, num_threads=1) for k in emb}
        for e in (*emb.values(), *batched.values()):
            e.embed(texts[:8])  # load and warm up
        per_call: dict[str, list[float]] = {k: [] for k in emb}
        batch: dict[str, list[float]] = {k: [] for k in emb}
        vecs1: dict[str, Any] = {}
        vecsb: dict[str, Any] = {}
        for r in range(args.rounds):
            order = ["torch", "onnx"] if r % 2 == 0 else ["onnx", "torch"]
            for k in order:
                ms, vecs1[k] = _cpu_ms_per_msg(emb[k].embed, first, True)
                per_call[k].append(ms)
            for k in order:
                ms, vecsb[k] = _cpu_ms_per_msg(batched[k].embed, texts, False)
                batch[k].append(ms)
            pc, bt = {k: v[-1] for k, v in per_call.items()}, {k: v[-1] for k, v in batch.items()}
            print(
                f"round {r + 1}: one per call torch {pc['torch']:.2f} onnx {pc['onnx']:.2f} ms/msg;"
                f" batched torch {bt['torch']:.2f} onnx {bt['onnx']:.2f} ms/msg"
            )
    cos_b = (vecsb["torch"] * vecsb["onnx"]).sum(axis=1)
    cos_1 = (vecs1["torch"] * vecs1["onnx"]).sum(axis=1)
    doc["agreement"] = {
        "batched_all_turns": {"min": float(cos_b.min()), "mean": float(cos_b.mean()), "n": len(cos_b)},
        "one_per_call": {"min": float(cos_1.min()), "mean": float(cos_1.mean()), "n": len(cos_1)},
    }
    doc["one_per_call"] = {"cpu_ms_per_msg": per_call}
    doc["batched"] = {"cpu_ms_per_msg": batch}
    med = statistics.median
    doc["ratios"] = {
        "one_per_call_torch_over_onnx": med(per_call["torch"]) / med(per_call["onnx"]),
        "batched_torch_over_onnx": med(batch["torch"]) / med(batch["onnx"]),
    }
    doc["machine"] = {
        "cores": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "load_average_start": load0,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    a, b = doc["agreement"]["batched_all_turns"], doc["agreement"]["one_per_call"]
    print(
        f"cosine torch/onnx: all {a['n']} turns min {a['min']:.7f} mean {a['mean']:.7f};"
        f" one per call ({b['n']} turns) min {b['min']:.7f}"
    )
    print(
        f"torch / onnx CPU: one per call {doc['ratios']['one_per_call_torch_over_onnx']:.2f}x, "
        f"batched {doc['ratios']['batched_torch_over_onnx']:.2f}x"
    )
    for k, v in startup.items():
        print(f"start-up {k}: {v}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
