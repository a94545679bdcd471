"""The vector every indexed node must have, computed independently of the memory's code paths.

A leaf's vector is its text embedded. A summary's is, with ``annotation_vectors="composed"`` (the
default, when the summariser composes with the memory's embedder), the normalised mean of its
sentences' embeddings, else its text embedded. A node whose text repeats its only child's (SegTreeMem's
chain copies) may carry the child's vector instead. A MemTree summary with an anchor (``reembed_cosine``,
see :mod:`shared_core.memories.memtree_vectors`) may carry its anchor's embedded vector moved by the
change of the composed vector, ``normalise(e_a + c - c_a)``, when ``cos(c, c_a)`` reaches the threshold.
Anchors are not saved: once a load or a rollback dropped them (``mem._anchors_lost``), a summary without
an anchor is only checked to hold a unit vector.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shared_core.models.extractive import split_sentences
from shared_core.search.index import normalize_rows


def composes(mem: Any) -> bool:
    """Whether the memory composes its summaries' vectors."""
    s = mem.summarizer
    return (
        mem.annotation_vectors == "composed"
        and callable(getattr(s, "compose", None))
        and getattr(s, "embedder", None) is mem.embedder
    )


def own_vector(mem: Any, text: str, is_leaf: bool, embedder: Any) -> np.ndarray:
    """The vector of a node with ``text``: embedded (leaf, or no composition) or composed."""
    if is_leaf or not composes(mem):
        return normalize_rows(np.asarray(embedder.embed([text]), dtype=np.float32))[0]
    return composed_vector(text, embedder)


def composed_vector(text: str, embedder: Any) -> np.ndarray:
    """The normalised mean of the unit vectors of ``text``'s sentences."""
    v = normalize_rows(np.asarray(embedder.embed(split_sentences(text)), dtype=np.float32)).mean(axis=0)
    return (v / (np.linalg.norm(v) or 1.0)).astype(np.float32)


def anchored_vector(mem: Any, nid: int, text: str, embedder: Any, atol: float) -> np.ndarray | None:
    """A MemTree summary's vector moved from its anchor (``None`` without an anchor, or when the composed
    vector of ``text`` is below the re-embedding cosine of the anchor's)."""
    anchor = getattr(mem, "_anchors", {}).get(nid)
    if anchor is None or mem.reembed_cosine is None:
        return None
    c_a, e_a = anchor
    c = composed_vector(text, embedder)
    if float(c @ c_a) < mem.reembed_cosine - atol:
        return None
    v = e_a.astype(np.float64) + c - c_a
    return (v / np.linalg.norm(v)).astype(np.float32)


def check_node_vectors(mem: Any, ids: list[int], embedder: Any, atol: float = 1e-4) -> None:
    """Assert that each node in ``ids`` has in the index the vector its text and kind call for."""
    st = mem._store
    got = mem._index.get(ids)
    for row, nid in zip(got, ids):
        node = st.nodes[nid]
        want = [own_vector(mem, node.text, node.is_leaf, embedder)]
        moved = None if node.is_leaf else anchored_vector(mem, nid, node.text, embedder, atol)
        if moved is not None:
            want.append(moved)
        kid = st.nodes[node.children[0]] if len(node.children) == 1 else None
        if kid is not None and kid.text == node.text:
            want.append(mem._index.get([kid.id])[0])
        if unverifiable(mem, node):
            assert abs(float(np.linalg.norm(row)) - 1.0) < 1e-3, f"vector of node {nid}"
            continue
        assert any(np.allclose(row, w, atol=atol) for w in want), f"vector of node {nid}"


def unverifiable(mem: Any, node: Any) -> bool:
    """A MemTree summary without an anchor after a load or a rollback: its vector may have been moved from
    an anchor that is gone (see the module)."""
    return (
        getattr(mem, "reembed_cosine", None) is not None
        and not node.is_leaf
        and node.id not in getattr(mem, "_anchors", {})
        and getattr(mem, "_anchors_lost", False)
    )
