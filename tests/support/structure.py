"""A naive reference for the node arrays' structure (parent position, leaf flag, level gap)."""

from __future__ import annotations

import numpy as np

from shared_core.tree.nodes import NodeStore


def naive_structure(store: NodeStore, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pos = {int(i): j for j, i in enumerate(ids.tolist())}
    parent, leaf, gap = [], [], []
    for i in ids.tolist():
        n = store.nodes[i]
        parent.append(-1 if n.parent is None else pos.get(n.parent, -1))
        leaf.append(n.is_leaf)
        gap.append(0 if n.parent is None else store.nodes[n.parent].level - n.level - 1)
    return np.array(parent, np.int64), np.array(leaf, bool), np.array(gap, np.int64)
