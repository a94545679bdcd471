"""Per-node arrays (parent, level, leaf flag) kept in step with a node store, for vectorised ranking.

A retrieval needs, for every indexed node, its parent's position among the indexed nodes and whether it
is a leaf (propagation operators, admissible sets, SegTreeMem's copy gaps). Reading them from the node
objects is a Python loop over the whole tree on every query after a change. :class:`NodeArrays` keeps
them as ``numpy`` arrays indexed by node id instead and re-reads only the nodes the store reports as
changed (:meth:`~shared_core.tree.nodes.NodeStore.take_changes`), so aligning them with the index rows is a
few vectorised operations: O(n) in numpy, no Python work per node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import grow, positions
from .nodes import SUPERSEDES, NodeStore

__all__ = ["NodeArrays"]


class NodeArrays:
    """Parent id, level and leaf flag of every node, as arrays indexed by node id.

    Attributes (valid after :meth:`sync`; entries of ids that are not nodes are ``-1`` / ``0`` /
    ``False``):
        parent: ``int64``: the parent's node id, ``-1`` for a root or a missing node.
        level: ``int64``: the node's ``level``.
        leaf: ``bool``: whether the node stores a message.
        supersedes: ``bool``: whether the node (a leaf) names earlier leaves it supersedes
            (``Node.data[SUPERSEDES]``, see :mod:`shared_core.memories.supersession`).

    The first :meth:`sync` with a store (and any sync with another store object, e.g. after a load or
    a reset) reads every node; later ones read only the ids the store reports as changed. One
    :class:`NodeArrays` per store: :meth:`~shared_core.tree.nodes.NodeStore.take_changes` has one consumer.
    """

    def __init__(self) -> None:
        self._store: NodeStore | None = None
        self.parent = np.full(0, -1, dtype=np.int64)
        self.level = np.zeros(0, dtype=np.int64)
        self.leaf = np.zeros(0, dtype=bool)
        self.supersedes = np.zeros(0, dtype=bool)

    def _read(self, store: NodeStore, ids: Any) -> None:
        n = store.next_id
        self.parent = grow(self.parent, n, -1)
        self.level = grow(self.level, n, 0)
        self.leaf = grow(self.leaf, n, False)
        self.supersedes = grow(self.supersedes, n, False)
        nodes = store.nodes
        for nid in ids:
            node = nodes.get(nid)
            if nid >= len(self.parent):  # an id a rolled-back transaction created and gave back
                continue
            if node is None:
                self.parent[nid], self.level[nid], self.leaf[nid] = -1, 0, False
                self.supersedes[nid] = False
            else:
                p = node.parent
                self.parent[nid] = -1 if p is None else p
                self.level[nid] = node.level
                self.leaf[nid] = node.is_leaf
                self.supersedes[nid] = bool(node.data.get(SUPERSEDES))

    def sync(self, store: NodeStore) -> None:
        """Bring the arrays up to date with ``store`` (O(changed nodes); O(n) for a new store)."""
        changed = store.take_changes()
        if store is not self._store:
            self._store = store
            self.parent = np.full(store.next_id, -1, dtype=np.int64)
            self.level = np.zeros(store.next_id, dtype=np.int64)
            self.leaf = np.zeros(store.next_id, dtype=bool)
            self.supersedes = np.zeros(store.next_id, dtype=bool)
            self._read(store, list(store.nodes))
        elif changed:
            self._read(store, changed)

    def aligned(self, store: NodeStore, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Structure of the nodes ``ids`` (e.g. index rows), aligned with them.

        Args:
            store: the memory's node store (synced first).
            ids: ``int64 (n,)`` node ids, distinct.

        Returns:
            ``(parent_pos, leaf, level_gap)``: ``int64 (n,)`` position in ``ids`` of each node's parent
            (``-1`` when it has none or its parent is not among ``ids``); ``bool (n,)`` leaf mask;
            ``int64 (n,)`` the parent's level minus the node's minus one (``0`` for a root).
        """
        self.sync(store)
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        if n == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, np.zeros(0, dtype=bool), z.copy()
        par = self.parent[ids]
        has = par >= 0
        row = positions(ids, len(self.parent))
        parent_pos = np.full(n, -1, dtype=np.int64)
        parent_pos[has] = row[par[has]]
        gap = np.zeros(n, dtype=np.int64)
        gap[has] = self.level[par[has]] - self.level[ids[has]] - 1
        return parent_pos, self.leaf[ids].copy(), gap
