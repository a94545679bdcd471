"""A k-nearest-neighbour graph over unit vectors, maintained incrementally (exact, or from candidates).

References:
    xMemory Sec. 3.2 "kNN graph for high-level navigation".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ...arrays import grow, lookup, positions
from ...search.index import inner_products
from ...types import InvalidInputError

__all__ = ["KNNGraph", "Search"]

#: candidate search: ``search(queries float32 (q, d), k) -> int64 ids (q, k)``, ``-1`` padded
Search = Callable[[np.ndarray, int], np.ndarray]


class KNNGraph:
    """Exact directed k-nearest-neighbour graph over unit vectors, maintained incrementally.

    ``rows[i]`` maps each of node ``i``'s k most similar other nodes to the cosine similarity (ties broken
    by smaller id). After :meth:`upsert` and :meth:`remove` the rows equal what :meth:`rebuild` would give
    on the same vectors: a changed node's row is recomputed; another node's row is recomputed when it
    listed a changed or removed node, and otherwise only gains a changed node that beats its k-th
    neighbour. Cost per update: one product of the changed rows against all vectors plus the recomputed
    rows, instead of the O(N^2) rebuild. Similarities are float32 inner products computed pair by pair
    by one kernel (:func:`~shared_core.search.index.inner_products`), so an update and a rebuild see bitwise
    the
    same values.

    With a candidate ``search`` (e.g. :meth:`~shared_core.search.ann.NeighbourSearch.search`), every method
    looks at ``2k`` candidates per row instead of every node: a changed node's row is the best of its
    candidates, the rows that may gain it are its candidates', and recomputed rows are their candidates'
    best. Similarities stay exact; which nodes are considered is approximate (an approximate kNN graph
    in the manner of HNSW's neighbour updates). The ``search`` must already hold the current vectors.

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

    def rebuild(self, ids: Sequence[int] | np.ndarray, mat: np.ndarray, search: Search | None = None) -> None:
        """Recompute every row from scratch.

        Args:
            ids: node ids (length N).
            mat: their unit vectors, float32 ``(N, d)``.
            search: candidate search over these vectors, or ``None`` (exact).
        """
        ids_arr = np.asarray(ids, dtype=np.int64)
        self.rows, self._rev = {}, {}
        self._low, self._high = np.full(0, np.inf), np.full(0, -np.inf)
        if len(ids_arr):
            X = np.ascontiguousarray(mat, dtype=np.float32)
            self._recompute(ids_arr.tolist(), ids_arr, X, positions(ids_arr), search)

    def upsert(
        self,
        ids: Sequence[int] | np.ndarray,
        mat: np.ndarray,
        changed: Iterable[int],
        search: Search | None = None,
        inv: np.ndarray | None = None,
    ) -> None:
        """Add new nodes or update nodes whose vectors changed.

        Args:
            ids: every current node id (length N), including the changed ones; an ``int64`` array
                avoids a conversion per call.
            mat: their unit vectors, float32 ``(N, d)``, in the order of ``ids``.
            changed: ids (within ``ids``) that are new or whose vector changed.
            search: candidate search over the current vectors, or ``None`` (exact: every node).
            inv: the inverse of ``ids`` (``inv[ids[j]] == j``, ``-1`` for other ids; may be longer), when
                the caller keeps one; default ``None``: :func:`~shared_core.arrays.positions` of ``ids``,
                O(N) per call.
        """
        ids_arr = np.asarray(ids, dtype=np.int64)
        inv = positions(ids_arr) if inv is None else inv
        ch = [c for c in dict.fromkeys(int(c) for c in changed) if 0 <= c < len(inv) and inv[c] >= 0]
        if not ch:
            return
        X = np.ascontiguousarray(mat, dtype=np.float32)
        # rows that list a changed node are recomputed
        redo = set(ch) | {j for c in ch for j in self._rev.get(c, ()) if j < len(inv) and inv[j] >= 0}
        if search is not None:
            self._upsert_candidates(ch, redo, ids_arr, X, inv, search)
            return
        cross = inner_products(X, X[inv[ch]])  # (|ch|, N)
        # another row can only gain a changed node whose similarity reaches its smallest (which only
        # grows as nodes enter); rows with fewer than k neighbours take every changed node
        low = lookup(self._low, ids_arr, np.inf)
        low[inv[list(redo)]] = np.inf
        for r in np.nonzero(cross.max(axis=0) >= low)[0].tolist():
            j = int(ids_arr[r])
            for ci, c in enumerate(ch):
                self._offer(j, c, float(cross[ci, r]))
            self._note_low(j)
        # a changed node's own row is its column of the cross product (ip is symmetric bitwise)
        for ci, c in enumerate(ch):
            self._set(c, self._row(c, ids_arr, cross[ci]))
        self._recompute(sorted(redo - set(ch)), ids_arr, X, inv)

    def _offer(self, j: int, c: int, s: float) -> None:
        """Put ``c`` (similarity ``s``) in row ``j`` if it has room or ``c`` beats its worst entry."""
        row = self.rows[j]
        if len(row) < self.k:
            row[c] = s
            self._rev.setdefault(c, set()).add(j)
            return
        worst = min(row.items(), key=lambda kv: (kv[1], -kv[0]))
        if (s, -c) > (worst[1], -worst[0]):
            del row[worst[0]]
            self._rev.get(worst[0], set()).discard(j)
            row[c] = s
            self._rev.setdefault(c, set()).add(j)

    def _candidates(
        self, which: list[int], ids_arr: np.ndarray, X: np.ndarray, inv: np.ndarray, search: Search
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per node of ``which``: its candidate ids (itself and unknown ids left out) and the exact
        similarities to them."""
        found = search(X[inv[which]], 2 * self.k + 1)
        out = []
        for j, cand in zip(which, found):
            cand = cand[(cand >= 0) & (cand != j) & (cand < len(inv))]
            cand = cand[inv[cand] >= 0]
            out.append((cand, inner_products(X[inv[cand]], X[inv[j]]) if len(cand) else np.zeros(0)))
        return out

    def _upsert_candidates(
        self,
        ch: list[int],
        redo: set[int],
        ids_arr: np.ndarray,
        X: np.ndarray,
        inv: np.ndarray,
        search: Search,
    ) -> None:
        """:meth:`upsert` over candidates: a changed node's row from its candidates, which may gain it."""
        for c, (cand, sims) in zip(ch, self._candidates(ch, ids_arr, X, inv, search)):
            self._set(c, self._row(c, cand, sims))
            for j, s in zip(cand.tolist(), sims.tolist()):
                if j in redo or j not in self.rows or (j < len(self._low) and s < self._low[j]):
                    continue  # (a full row only takes a node at least as similar as its smallest)
                self._offer(j, c, s)
                self._note_low(j)
        self._recompute(sorted(redo - set(ch)), ids_arr, X, inv, search)

    def remove(
        self,
        removed: Iterable[int],
        ids: Sequence[int] | np.ndarray,
        mat: np.ndarray,
        search: Search | None = None,
    ) -> None:
        """Remove nodes; rows that listed one of them are recomputed over the remaining nodes.

        Args:
            removed: ids to drop.
            ids: the remaining node ids (an ``int64`` array avoids a conversion).
            mat: their unit vectors, float32 ``(len(ids), d)``.
            search: candidate search over the remaining vectors, or ``None`` (exact).
        """
        gone = {int(g) for g in removed}
        for g in gone:
            self._drop(g)
        ids_arr = np.asarray(ids, dtype=np.int64)
        redo = {j for g in gone for j in self._rev.pop(g, ())} - gone
        X = np.ascontiguousarray(mat, dtype=np.float32)
        self._recompute(sorted(redo), ids_arr, X, positions(ids_arr), search)

    def _recompute(
        self,
        which: list[int],
        ids_arr: np.ndarray,
        X: np.ndarray,
        inv: np.ndarray,
        search: Search | None = None,
    ) -> None:
        """Recompute the rows of ``which`` over every node (256 rows per product) or their candidates."""
        which = [j for j in which if j < len(inv) and inv[j] >= 0]
        for a in range(0, len(which), 256):
            block = which[a : a + 256]
            if search is not None:
                for j, (cand, sims) in zip(block, self._candidates(block, ids_arr, X, inv, search)):
                    self._set(j, self._row(j, cand, sims))
                continue
            S = inner_products(X, X[inv[block]])
            for r, j in enumerate(block):
                self._set(j, self._row(j, ids_arr, S[r]))
