"""The memories' shared helpers: a cheap deterministic embedder (the same in every process), the memory
factories and the structural invariants read off ``to_dict()``."""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared_core import HAT, HierarchicalMemory, MemTree, SegTreeMem
from tests.support.vectors import check_node_vectors

KINDS = ["segtree", "memtree", "hat", "xmemory"]


LLM_FREE_POLICIES = {
    "segtree": ["collapsed", "top_down", "bottom_up"],
    "memtree": ["top_down", "collapsed", "traversal"],
    "hat": ["greedy", "collapsed"],
    "xmemory": ["adaptive", "representative", "collapsed"],
}


class HashEmbedder:
    """Cheap deterministic embedder (the same in every process): the sum of one pseudo-random vector per
    lower-cased word, seeded by BLAKE2b of the word, so texts sharing words are similar."""

    def __init__(self, dim: int = 32) -> None:
        self._dim = dim
        self._words: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return self._dim

    def _word(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            seed = int.from_bytes(hashlib.blake2b(w.encode("utf-8", "surrogatepass")).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self._dim).astype(np.float32)
            self._words[w] = v
        return v

    def vector(self, text: str) -> np.ndarray:
        words = re.findall(r"\w+", text.lower()) or [text]
        v = np.sum([self._word(w) for w in words], axis=0).astype(np.float32)
        if not np.any(v):
            v[0] = 1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), np.float32)
        return np.stack([self.vector(t) for t in texts])

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def memory_class(kind: str) -> type[HierarchicalMemory]:
    """The class of a memory kind; skips the test when XMemory is not available."""
    if kind == "xmemory":
        mod = pytest.importorskip("shared_core.memories.xmemory")
        return mod.XMemory
    return {"segtree": SegTreeMem, "memtree": MemTree, "hat": HAT}[kind]


def make_memory(kind: str, embedder: Any = None, **kw: Any) -> HierarchicalMemory:
    """A memory of ``kind`` with the cheap embedder and no LLM (extractive summaries)."""
    return memory_class(kind)(embedder if embedder is not None else HashEmbedder(), **kw)


def message_text(i: int) -> str:
    """Deterministic message ``i``: a few topic words shared with nearby messages, two sentences."""
    topics = ["dogs", "travel", "cooking", "music", "work", "garden"]
    a, b = topics[i % 6], topics[(i // 3) % 6]
    return f"Message {i} talks about {a} and {b}. It adds detail number {i * 7 % 13} on {a}."


def check_tree(mem: HierarchicalMemory, texts: Sequence[str] | None = None, *, deleted: bool = False) -> None:
    """Structural invariants read off ``to_dict()`` plus each algorithm's own invariants.

    Links are mutual, every node is reachable from the root, leaves are in insertion order (and in
    left-to-right order for segment-style trees), spans cover the children, the vector index holds
    exactly the nodes with text (with the vectors of their texts), and: SegTreeMem's four invariants,
    HAT's layer rule, MemTree's entry counts and branching.
    """
    tree = mem.to_dict()["tree"]
    nodes = {n["id"]: n for n in tree["nodes"]}
    root = tree["root"]
    leaves = check_tree_dict(tree, contiguous=mem.contiguous_spans)
    if root is None:
        assert mem._index is None or len(mem._index) == 0
        if texts is not None:
            assert list(texts) == []
        return
    assert [mem._store.nodes[i].text for i in mem._store.leaves()] == [n["text"] for n in leaves]
    if texts is not None:
        assert [n["text"] for n in leaves] == list(texts)
    for n in nodes.values():
        if n["children"] and mem.kind != "xmemory":
            spans = [nodes[c]["span"] for c in n["children"]]
            assert n["span"] == [min(s[0] for s in spans), max(s[1] for s in spans)], f"span of {n['id']}"
    with_text = sorted(i for i, n in nodes.items() if n["text"])
    assert mem._index is not None or not with_text
    if mem._index is not None:
        assert sorted(mem._index.ids.tolist()) == with_text, "index and tree disagree"
        if mem.kind != "xmemory" and with_text:
            check_node_vectors(mem, with_text, mem.embedder)
    if isinstance(mem, SegTreeMem):
        from tests.support.segtree import check_invariants

        check_invariants(mem, contiguous=not deleted)
    if isinstance(mem, MemTree):
        assert nodes[root]["text"] == ""
        for n in nodes.values():
            if not n["is_leaf"] and n["id"] != root:
                assert len(n["children"]) >= 2
                assert n["data"]["entries"] == len(mem._store.leaves_under(n["id"]))
        assert nodes[root]["data"]["entries"] == len(leaves)
    check = getattr(mem, "check_invariants", None)
    if callable(check):
        check()


def check_tree_dict(tree: dict[str, Any], contiguous: bool = False) -> list[dict[str, Any]]:
    """Invariants of a ``to_dict()["tree"]`` snapshot: mutual links, one root, every node reachable,
    leaves with distinct insertion indices (and, for ``contiguous`` trees, left to right in insertion
    order). Returns the leaves in insertion order."""
    json.dumps(tree)  # plain data
    nodes = {n["id"]: n for n in tree["nodes"]}
    root = tree["root"]
    if root is None:
        assert not nodes, "nodes without a root"
        return []
    assert nodes[root]["parent"] is None
    for n in nodes.values():
        assert len(set(n["children"])) == len(n["children"])
        for c in n["children"]:
            assert nodes[c]["parent"] == n["id"], f"child link {n['id']}->{c} not mutual"
        if n["parent"] is not None:
            assert n["id"] in nodes[n["parent"]]["children"], f"parent link of {n['id']} not mutual"
        if n["is_leaf"]:
            assert not n["children"] and n["message"] is not None
            assert n["span"][0] == n["span"][1]
    seen, queue = set(), deque([root])
    while queue:
        i = queue.popleft()
        seen.add(i)
        queue.extend(nodes[i]["children"])
    assert seen == set(nodes), "unreachable nodes"
    dfs_leaves: list[int] = []
    stack = [root]
    while stack:
        i = stack.pop()
        if nodes[i]["is_leaf"]:
            dfs_leaves.append(i)
        stack.extend(reversed(nodes[i]["children"]))
    leaves = sorted((n for n in nodes.values() if n["is_leaf"]), key=lambda n: n["span"][0])
    first = [n["span"][0] for n in leaves]
    assert first == sorted(set(first)), "leaf insertion indices repeat"
    assert all(0 <= f < tree["n_inserted"] for f in first)
    if contiguous:
        assert dfs_leaves == [n["id"] for n in leaves], "leaves left to right are not in insertion order"
    return leaves


def stripped(d: dict[str, Any]) -> dict[str, Any]:
    """``to_dict()`` without the wall-clock seconds of its usage (not part of the memory's content)."""
    d = json.loads(json.dumps(d))
    d["usage"].pop("seconds", None)
    return d


class CountingEmbedder(HashEmbedder):
    """HashEmbedder that records every text it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def embed(self, texts):
        self.seen.extend(texts)
        return super().embed(texts)


class SpanEmbedder(CountingEmbedder):
    """CountingEmbedder with ``embed_spans``: a span's vector is the span's text embedded (unit rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.span_calls = 0

    def embed_spans(self, texts, spans):
        self.span_calls += 1
        vecs = self.embed(texts)
        parts = []
        for t, sp in zip(texts, spans):
            rows = np.stack([self.vector(t[a:b]) for a, b in sp]) if sp else np.zeros((0, self.dim))
            parts.append(rows / np.linalg.norm(rows, axis=1, keepdims=True))
        return vecs, parts


def open_memory(kind: str, path: Path) -> HierarchicalMemory:
    return memory_class(kind).open(path, embedder=HashEmbedder())
