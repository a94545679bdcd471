"""A memory of each kind, its hits under every LLM-free policy as exact bits, and xMemory's two paths."""

from __future__ import annotations

import numpy as np

from shared_core.memories.xmemory import XMemory
from tests.support.memory import make_memory, message_text


def _hits(hits) -> list[tuple[int, str, int]]:
    return [(h.node_id, h.text, int(np.float64(h.score).view(np.uint64))) for h in hits]


def _both_paths(mem: XMemory, q: str, k: int, **params):
    mem.exact_search_max = 64
    try:
        got = mem.retrieve(q, k=k, **params)
        assert "candidates" in mem.last_trace
        mem.exact_search_max = None
        want = mem.retrieve(q, k=k, **params)
        assert "candidates" not in mem.last_trace
    finally:
        mem.exact_search_max = None
    return got, want


def _memory(kind: str):
    mem = make_memory(kind)
    texts = [message_text(i) for i in range(40)]
    texts += [f"we sold the {a} by the {b}" for a, b in (("boat", "river"), ("river", "boat"))]  # tie
    for i in range(0, len(texts), 7):
        mem.add(texts[i : i + 7])
    return mem


def _policies(kind: str) -> list[dict]:
    out = [
        {"policy": p}
        for p in {
            "segtree": ["collapsed", "top_down", "bottom_up"],
            "memtree": ["top_down", "collapsed", "traversal"],
            "hat": ["greedy", "collapsed"],
            "xmemory": ["top_down", "adaptive", "collapsed"],
        }[kind]
    ]
    return out + [{"relevance": "hybrid"}, {"relevance": "dense", "admissible": "leaves"}]


RETRIEVAL_QUERIES = ["what did we sell by the river", "dogs and travel plans", "garden on sunday"]


def _all_hits(mem) -> list:
    return [_hits(mem.retrieve(q, k=6, **p)) for p in _policies(mem.kind) for q in RETRIEVAL_QUERIES]
