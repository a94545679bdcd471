"""An exact k-nearest-neighbour graph over unit vectors, maintained incrementally.

References:
    xMemory Sec. 3.2 "kNN graph for high-level navigation".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..arrays import grow, lookup, positions
from ..index import inner_products
from ..types import InvalidInputError

__all__ = ["KNNGraph"]


class KNNGraph:
    """Exact directed k-nearest-neighbour graph over unit vectors, maintained incrementally.

    ``rows[i]`` maps each of node ``i``'s k most similar other nodes to the cosine similarity (ties broken
    by smaller id). After :meth:`upsert` and :meth:`remove` the rows equal what :meth:`rebuild` would give
    on the same vectors: a changed node's row is recomputed; another node's row is recomputed when it
    listed a changed or removed node, and otherwise only gains a changed node that beats its k-th
    neighbour. Cost per update: one product of the changed rows against all vectors plus the recomputed
    rows, instead of the O(N^2) rebuild. Similarities are float32 inner products computed pair by pair
    by one kernel (:func:`~shared_core.index.inner_products`), so an update and a rebuild see bitwise the
    same values.

    Args:
        k: neighbours per node, default 10.

    References:
        xMemory Sec. 3.2 "kNN graph for high-level navigation" (top-k similarity edges per node).
    """

    def __init__(self, k: int = 10) -> None:
        if isinstance(k, bool) or int(k) < 1:
            raise InvalidInputError("k must be a positive integer.")
        self.k = int(k)
        self.rows: dict[int, dict[int, float]] = {}
        self._rev: dict[int, set[int]] = {}  # node id -> the rows that list it
        self._low = np.full(0, np.inf)  # by node id: a full row's smallest, -inf for a short row, inf: none
        self._high = np.full(0, -np.inf)  # by node id: the row's largest (the nearest), -inf: empty or none

    def neighbors(self, nid: int) -> dict[int, float]:
        """Neighbour id -> similarity of ``nid`` (empty when unknown)."""
        return self.rows.get(nid, {})

    def _row(self, j: int, ids_arr: np.ndarray, sims: np.ndarray) -> dict[int, float]:
        mask = ids_arr != j
        cand_ids, cand = ids_arr[mask], sims[mask]
        if len(cand) > self.k:  # only values at least the k-th largest can be in the row (ties kept whole)
            keep = cand >= np.partition(cand, len(cand) - self.k)[len(cand) - self.k]
            cand_ids, cand = cand_ids[keep], cand[keep]
        order = np.lexsort((cand_ids, -cand))[: self.k]
        return {int(cand_ids[o]): float(cand[o]) for o in order}

    def listed_by(self, nid: int) -> set[int]:
        """The nodes whose rows list ``nid`` (a copy; empty when none)."""
        return set(self._rev.get(nid, ()))

    def nearest(self, ids: np.ndarray) -> np.ndarray:
        """The similarity of each node's nearest neighbour (its row's largest), float64 ``(len(ids),)``;
        ``-inf`` for a node without neighbours or without a row.

        Args:
            ids: node ids, ``int64 (n,)``.
        """
        return lookup(self._high, ids, -np.inf)

    def _note_low(self, j: int) -> None:
        self._low = grow(self._low, j + 1, np.inf, minimum=64)
        self._high = grow(self._high, j + 1, -np.inf, minimum=64)
        row = self.rows.get(j)
        if row is None:
            self._low[j], self._high[j] = np.inf, -np.inf
        else:
            self._low[j] = min(row.values()) if len(row) >= self.k else -np.inf
            self._high[j] = max(row.values()) if row else -np.inf

    def _set(self, j: int, row: dict[int, float]) -> None:
        old = self.rows.get(j)
        for u in old or ():
            self._rev.get(u, set()).discard(j)
        self.rows[j] = row
        for u in row:
            self._rev.setdefault(u, set()).add(j)
        self._note_low(j)

    def _drop(self, j: int) -> None:
        for u in self.rows.pop(j, None) or ():
            self._rev.get(u, set()).discard(j)
        self._note_low(j)

    def rebuild(self, ids: Sequence[int] | np.ndarray, mat: np.ndarray) -> None:
        """Recompute every row from scratch.

        Args:
            ids: node ids (length N).
            mat: their unit vectors, float32 ``(N, d)``.
        """
        ids_arr = np.asarray(ids, dtype=np.int64)
        self.rows, self._rev = {}, {}
        self._low, self._high = np.full(0, np.inf), np.full(0, -np.inf)
        if len(ids_arr):
            X = np.ascontiguousarray(mat, dtype=np.float32)
            self._recompute(ids_arr.tolist(), ids_arr, X, positions(ids_arr))

    def upsert(self, ids: Sequence[int] | np.ndarray, mat: np.ndarray, changed: Iterable[int]) -> None:
        """Add new nodes or update nodes whose vectors changed.

        Args:
            ids: every current node id (length N), including the changed ones; an ``int64`` array
                avoids a conversion per call.
            mat: their unit vectors, float32 ``(N, d)``, in the order of ``ids``.
            changed: ids (within ``ids``) that are new or whose vector changed.
        """
        ids_arr = np.asarray(ids, dtype=np.int64)
        inv = positions(ids_arr)
        ch = [c for c in dict.fromkeys(int(c) for c in changed) if 0 <= c < len(inv) and inv[c] >= 0]
        if not ch:
            return
        X = np.ascontiguousarray(mat, dtype=np.float32)
        cross = inner_products(X, X[inv[ch]])  # (|ch|, N)
        # rows that list a changed node are recomputed
        redo = set(ch) | {j for c in ch for j in self._rev.get(c, ()) if j < len(inv) and inv[j] >= 0}
        # another row can only gain a changed node whose similarity reaches its smallest (which only
        # grows as nodes enter); rows with fewer than k neighbours take every changed node
        low = lookup(self._low, ids_arr, np.inf)
        low[inv[list(redo)]] = np.inf
        for r in np.nonzero(cross.max(axis=0) >= low)[0].tolist():
            j = int(ids_arr[r])
            row = self.rows[j]
            for ci, c in enumerate(ch):
                s = float(cross[ci, r])
                if len(row) < self.k:
                    row[c] = s
                    self._rev.setdefault(c, set()).add(j)
                    continue
                worst = min(row.items(), key=lambda kv: (kv[1], -kv[0]))
                if (s, -c) > (worst[1], -worst[0]):
                    del row[worst[0]]
                    self._rev.get(worst[0], set()).discard(j)
                    row[c] = s
                    self._rev.setdefault(c, set()).add(j)
            self._note_low(j)
        # a changed node's own row is its column of the cross product (ip is symmetric bitwise)
        for ci, c in enumerate(ch):
            self._set(c, self._row(c, ids_arr, cross[ci]))
        self._recompute(sorted(redo - set(ch)), ids_arr, X, inv)

    def remove(self, removed: Iterable[int], ids: Sequence[int] | np.ndarray, mat: np.ndarray) -> None:
        """Remove nodes; rows that listed one of them are recomputed over the remaining nodes.

        Args:
            removed: ids to drop.
            ids: the remaining node ids (an ``int64`` array avoids a conversion).
            mat: their unit vectors, float32 ``(len(ids), d)``.
        """
        gone = {int(g) for g in removed}
        for g in gone:
            self._drop(g)
        ids_arr = np.asarray(ids, dtype=np.int64)
        redo = {j for g in gone for j in self._rev.pop(g, ())} - gone
        X = np.ascontiguousarray(mat, dtype=np.float32)
        self._recompute(sorted(redo), ids_arr, X, positions(ids_arr))

    def _recompute(self, which: list[int], ids_arr: np.ndarray, X: np.ndarray, inv: np.ndarray) -> None:
        """Recompute the rows of ``which`` over every node, 256 rows per product."""
        which = [j for j in which if j < len(inv) and inv[j] >= 0]
        for a in range(0, len(which), 256):
            block = which[a : a + 256]
            S = inner_products(X, X[inv[block]])
            for r, j in enumerate(block):
                self._set(j, self._row(j, ids_arr, S[r]))
