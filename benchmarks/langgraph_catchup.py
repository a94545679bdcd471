"""What a PostgreSQL LangGraph store pays to see another process's put: one ``get`` right after it.

Two stores (two connections, as two worker processes have) are opened on one database with
``HierMemStore.from_conn_string``; the writer fills ``--namespaces`` namespaces of ``--items`` items each
(stub vectors: :class:`~shared_core.bench.stubs.ReplayEmbedder`), then ``--reps`` times updates one item
of one namespace (round robin) and the reader gets that item at once, which must be the new value. The
reader's wall and CPU time (``time.process_time``) of that ``get`` are what catching up with the put
costs it, next to the writer's ``put``.

Usage::

    python benchmarks/langgraph_catchup.py --postgres postgresql://user@host/db --namespaces 2000 \\
        --out benchmarks/results/langgraph_catchup.json

Writes JSON: ``{"machine", "settings", "reader_get_after_put": {"wall_ms", "cpu_ms"} (median, p90),
"writer_put": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from langgraph.store.base import PutOp

from langchain_hiermem import HierMemStore
from shared_core.bench.stubs import ReplayEmbedder


def _summary(xs: list[float]) -> dict[str, float]:
    ms = sorted(1e3 * x for x in xs)
    return {"median": statistics.median(ms), "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))]}


def run(url: str, namespaces: int, items: int, reps: int) -> dict[str, Any]:
    """The measurement (see the module docstring)."""
    kw: dict[str, Any] = {"embedder": ReplayEmbedder({}), "fields": ["text"]}
    with HierMemStore.from_conn_string(url, **kw) as w, HierMemStore.from_conn_string(url, **kw) as r:
        w.batch(
            [
                PutOp(("tenants", f"u{i}"), f"k{j}", {"text": f"user {i} fact {j}", "n": j})
                for i in range(namespaces)
                for j in range(items)
            ]
        )
        assert r.get(("tenants", "u0"), "k0") is not None
        put_wall, put_cpu, get_wall, get_cpu = [], [], [], []
        for k in range(reps):
            ns = ("tenants", f"u{k % namespaces}")
            c0, t0 = time.process_time(), time.perf_counter()
            w.put(ns, "k0", {"text": f"update {k}", "n": -k - 1})
            put_wall.append(time.perf_counter() - t0)
            put_cpu.append(time.process_time() - c0)
            c0, t0 = time.process_time(), time.perf_counter()
            item = r.get(ns, "k0")
            get_wall.append(time.perf_counter() - t0)
            get_cpu.append(time.process_time() - c0)
            assert item is not None and item.value["n"] == -k - 1
    return {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": list(os.getloadavg()),
        },
        "settings": {"namespaces": namespaces, "items_per_namespace": items, "reps": reps},
        "reader_get_after_put": {"wall_ms": _summary(get_wall), "cpu_ms": _summary(get_cpu)},
        "writer_put": {"wall_ms": _summary(put_wall), "cpu_ms": _summary(put_cpu)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", required=True, metavar="URL", help="an empty PostgreSQL database")
    ap.add_argument("--namespaces", type=int, default=2000)
    ap.add_argument("--items", type=int, default=4, help="items per namespace")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    doc = run(args.postgres, args.namespaces, args.items, args.reps)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
