"""``top_down`` over candidates: which nodes to score so that the best scores are the exhaustive ones.

``top_down`` propagation over a horizon ``H`` gives node ``i`` the score

    G(i) = sum_{k=0..H} alpha^k r(a_k(i)) / sum_{k=0..H} alpha^k

where ``a_0(i) = i`` and ``a_k(i)`` is its ``k``-th ancestor (SegTreeMem paper, Sec. 4.3.1, Eq. (3)-(4), with
each child taking its parent's whole score; a memory's scores are ``G`` divided by the sum of the local
relevance, one positive factor for every node). So ``G(i)`` reads only ``i`` and its ancestors. Given
candidates ``C`` (the ``m`` nearest by cosine and the ``m`` best by BM25) every other node has a local
relevance of at most ``r_b`` (the relevance the ``m``-th cosine and the ``m``-th BM25 score would give
together), and:

* a node whose path (itself and its ``H`` ancestors) holds no candidate scores at most ``r_b``;
* a node ``j`` levels below its nearest candidate ancestor ``v`` (the nodes between them not candidates)
  scores at most ``U(v, j) = (r_b sum_{k<j} alpha^k + r_max(v) sum_{k=j..H} alpha^k) / sum_k alpha^k``,
  ``r_max(v)`` the largest relevance of ``v`` and its ``H`` ancestors.

``Ranking._top_down_over_candidates`` scores ``R`` = the candidates, their ``H`` ancestors and the
descendants of a candidate down to the depth where ``U`` falls below the ``N``-th best score of ``R``;
every node outside ``R`` then scores below its ``floor``, so a ranking of ``R`` whose walk ends above
the floor is the exhaustive ranking (only which nodes are candidates is approximate: an approximate
nearest-neighbour index may miss a node nearer than its ``m``-th).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import unique_ints
from ..scores import top_k
from ..types import InvalidInputError
from .ann import NeighbourSearch
from .relevance import check_weight, fuse
from .walk import RELEVANCE_KINDS, TokenBudget, check_choice

if TYPE_CHECKING:
    from ..tree.nodes import NodeStore
    from ..tree.structure import NodeArrays
    from .index import NodeIndex

__all__ = [
    "CANDIDATES_PER_HIT",
    "NODES_PER_CANDIDATE",
    "NODE_SEARCH_NPROBE",
    "CandidateScores",
    "CandidateSearch",
    "Candidates",
    "Propagator",
    "ancestor_mask",
    "ancestors",
    "descendants",
    "floor_of",
    "relevance_bound",
]

#: lists of the IVF index over every node visited per query (:meth:`Ranking._node_search`)
NODE_SEARCH_NPROBE = 32

#: ``top_down`` past a memory's exact-search size: nearest (and BM25) candidates per candidate the
#: ranking needs (3k + 8)
CANDIDATES_PER_HIT = 32

#: ... and only with at least this many indexed nodes per nearest candidate: the candidate path costs
#: about 7.7 ms at 25.6k nodes against 5.7 exhaustive, 17.4 against 32 at 254k (xMemory, ``hiermem bench
#: --conversation``, m = 1,216); the two cross at about 53k nodes, 44 per candidate
NODES_PER_CANDIDATE = 48

#: ``(parent_pos, gap, r) -> (scores, best, scale)``: a memory's ``top_down`` propagation over some nodes
Propagator = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, float]]


#: relative slack added to every bound (float32 relevance and float64 propagation round differently
#: from the real numbers the bounds are derived for)
SLACK = 1e-6


def ancestors(parent: np.ndarray, ids: np.ndarray, levels: int) -> np.ndarray:
    """``ids`` and their ancestors up to ``levels`` levels up, distinct, ascending.

    Args:
        parent: ``int64`` parent id per node id (``-1``: none), e.g. ``NodeArrays.parent``.
        ids: ``int64`` node ids. levels: ``>= 0``.
    """
    return np.flatnonzero(ancestor_mask(parent, ids, levels))


def ancestor_mask(parent: np.ndarray, ids: np.ndarray, levels: int) -> np.ndarray:
    """:func:`ancestors` as a ``bool`` mask over the node ids (``len(parent)``)."""
    mark = np.zeros(len(parent), dtype=bool)
    cur = np.asarray(ids, dtype=np.int64)
    mark[cur] = True
    for _ in range(levels):  # level by level: a node is first reached at its smallest distance
        cur = parent[cur]
        cur = cur[cur >= 0]
        cur = cur[~mark[cur]]
        if not len(cur):
            break
        mark[cur] = True
    return mark


def descendants(children: Callable[[int], Sequence[int]], roots: dict[int, int]) -> np.ndarray:
    """Every node below each root down to its depth (``roots``: node id -> depth ``>= 1``), ascending."""
    out: list[int] = []
    frontier = [(v, d) for v, d in roots.items() if d > 0]
    while frontier:
        nxt = []
        for v, d in frontier:
            kids = list(children(v))
            out.extend(kids)
            if d > 1:
                nxt.extend((c, d - 1) for c in kids)
        frontier = nxt
    return unique_ints(np.asarray(out, dtype=np.int64))


def relevance_bound(
    kind: str, weight: float, dense_m: float, max_dense: float, bm_m: float, max_bm: float
) -> float:
    """An upper bound of the local relevance of a node that is not a candidate.

    Args:
        kind: ``"dense"`` or ``"hybrid"``. weight: ``w`` of ``hybrid``.
        dense_m: the smallest cosine among the nearest candidates (``max(cos, 0)``).
        max_dense: the largest cosine of the scored nodes (``hybrid``'s normaliser).
        bm_m: the ``m``-th best BM25 score (0 when every node with a query term is a candidate).
        max_bm: the largest BM25 score of any node.
    """
    if kind == "dense":
        b = dense_m
    else:
        d = dense_m / max_dense if max_dense > 0 else 0.0
        lex = bm_m / max_bm if max_bm > 0 else 0.0
        b = weight * d + (1.0 - weight) * lex
    return float(b) * (1.0 + SLACK) + 1e-12


def floor_of(alpha: float, horizon: int, r_b: float, r_max: Any, depth: int) -> Any:
    """``U(v, depth)`` of the module docstring: the most a node ``depth`` levels below a candidate whose
    path holds relevance at most ``r_max`` (a float or an array) can score, the nodes in between scoring
    at most ``r_b``."""
    powers = alpha ** np.arange(horizon + 1, dtype=np.float64)
    near = float(powers[:depth].sum())
    far = float(powers[depth:].sum())
    return (r_b * near + np.maximum(r_max, r_b) * far) / float(powers.sum()) * (1.0 + SLACK)


@dataclasses.dataclass
class Candidates:
    """The first stage of one query's relevance over candidates (:meth:`Ranking._relevance_candidates`).

    ``ids`` are the approximate ``m`` nearest nodes by cosine (from the IVF index over every indexed
    node) and, for ``hybrid``, the ``m`` best by BM25 (ties by node id) among the nodes scoring above
    the query's common terms (:meth:`~shared_core.search.lexical.LexicalIndex.common_bound`: a node
    holding only a word of most texts, such as a speaker's name, is not a BM25 candidate). BM25
    itself is exact: ``bm_ids`` are the nodes scoring above that level, ``maxb`` the largest score of
    any node, and :meth:`bm25` reads any node's score from ``scorer``.
    """

    ids: np.ndarray  # int64 (c,), distinct
    qvec: np.ndarray  # float32 (d,), normalised
    kind: str  # "dense" or "hybrid"
    weight: float
    bm_ids: np.ndarray  # int64, ascending
    bm: np.ndarray  # float32, their BM25 scores
    maxb: float
    #: the nearest by cosine alone (a part of ``ids``)
    nearest: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    #: the best BM25 score of a node outside the BM25 candidates (the ``m``-th's when a tie is left
    #: out): no node outside ``ids`` scores more (0 when every node with a query term is among ``ids``)
    bm_floor: float = 0.0
    #: ``scorer(ids) -> float32`` BM25 scores of any node ids (``None``: 0 outside ``bm_ids``)
    scorer: Callable[[np.ndarray], np.ndarray] | None = None

    def bm25(self, nids: np.ndarray) -> np.ndarray:
        """BM25 scores of node ids (0 for a node without a query term), float32."""
        nids = np.asarray(nids, dtype=np.int64)
        if self.scorer is not None:
            return np.asarray(self.scorer(nids), dtype=np.float32)
        if not len(self.bm_ids):
            return np.zeros(len(nids), np.float32)
        j = np.minimum(np.searchsorted(self.bm_ids, nids), len(self.bm_ids) - 1)
        return np.where(self.bm_ids[j] == nids, self.bm[j], 0.0).astype(np.float32)


@dataclasses.dataclass
class CandidateScores:
    """``top_down`` scores over candidates (:meth:`Ranking._top_down_over_candidates`)."""

    ids: np.ndarray  # int64 (n,): the scored nodes, in index row order
    scores: np.ndarray  # float64 (n,): propagated scores (one positive factor from the exhaustive ones)
    best: np.ndarray  # float64 (n,): the best among each node and its copies (SegTreeMem), else scores
    leaf: np.ndarray  # bool (n,)
    ranked: np.ndarray  # bool (n,): the nodes whose score is the exhaustive one (up to the factor)
    floor: float  # every node outside ``ranked`` scores below this


class CandidateSearch:
    """Mixin of :class:`~shared_core.search.ranking.Ranking`: the first stage that proposes candidates
    (an IVF index over every node and BM25) and ``top_down`` over them (see the module)."""

    # set by HierarchicalMemory.__init__
    _store: NodeStore
    _index: NodeIndex | None
    _arrays: NodeArrays
    _max_tokens: int | None
    _allowed: set[int] | None
    _ns: NeighbourSearch | None
    _ns_of: NodeIndex | None
    _ns_dirty: set[int]
    segment_cap: int | None
    neighbours: int
    last_candidates: int | None

    #: the most indexed nodes a ``top_down`` retrieval scores exhaustively; past it (and past
    #: ``NODES_PER_CANDIDATE x CANDIDATES_PER_HIT (3k + 8)`` nodes) it scores candidates
    #: (:meth:`_top_down_over_candidates`); ``None``: every node at any size
    exact_search_max: int | None = None

    if TYPE_CHECKING:

        def _lexical_index(self) -> Any: ...

        def _ranked(
            self,
            ids: np.ndarray,
            scores: np.ndarray,
            k: int,
            meta: dict[str, Any],
            admissible: np.ndarray | None = None,
        ) -> list[tuple[int, float, dict[str, Any]]]: ...

    def _search_max(self) -> int | None:
        """The most indexed nodes a retrieval scores exhaustively (:attr:`exact_search_max`); past it,
        policies that can use :meth:`_relevance_candidates` do."""
        return self.exact_search_max

    @staticmethod
    def _check_search_max(value: Any) -> int | None:
        """``exact_search_max``: ``None`` or an int >= 1 (:class:`InvalidInputError` otherwise)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
            raise InvalidInputError(f"exact_search_max must be an integer >= 1 or None, got {value!r}.")
        return int(value)

    def _node_search(self) -> NeighbourSearch | None:
        """The IVF index over every indexed node, brought up to date, or ``None`` while the index holds
        at most :meth:`_search_max` nodes (or the memory searches exhaustively).

        Kept from the vectors committed since the last call (:meth:`_vectors_written`); trained again
        as :class:`~shared_core.search.ann.NeighbourSearch` decides; started afresh when the node index object
        changes (a load, a reset)."""
        idx = self._index
        limit = self._search_max()
        if idx is None or limit is None:
            self._ns = None
            return None
        ns = self._ns
        if ns is None or self._ns_of is not idx or ns.exact_max != limit:
            ns = self._ns = NeighbourSearch(limit, nprobe=NODE_SEARCH_NPROBE, codes="sq8", lists_per_sqrt=1.0)
            self._ns_of, self._ns_dirty = idx, set()
        dirty = sorted(self._ns_dirty)
        used = ns.sync(
            len(idx),
            lambda: (idx.ids, idx.matrix()),
            gone=[i for i in dirty if i not in idx],
            live=[i for i in dirty if i in idx],
            vectors=idx.get,
        )
        self._ns_dirty = set()
        return ns if used else None

    def _relevance_candidates(
        self, query: str, kind: str, weight: float, m: int, qvec: np.ndarray
    ) -> Candidates | None:
        """The first stage of a retrieval that scores candidates instead of every node.

        Args:
            query: the query text. kind: ``"dense"`` or ``"hybrid"`` (``"bm25"`` is exact and sparse
                already: ``None``). weight: ``w`` of ``hybrid``. m: candidates from each of the two lists.
            qvec: the normalised query vector, float32 ``(d,)``.

        Returns:
            :class:`Candidates`, or ``None`` when there is no node search (:meth:`_node_search`) or the
            kind is ``"bm25"``.
        """
        if kind == "bm25":
            return None
        ns = self._node_search()
        if ns is None:
            return None
        found = ns.search(qvec, m)[0]
        found = found[found >= 0]
        bm_ids, bm, rest, scorer = np.zeros(0, np.int64), np.zeros(0, np.float32), 0.0, None
        if kind == "hybrid":
            # the nodes scoring above what the query's common terms can add (0 without such terms);
            # every other node scores at most ``rest``
            lex = self._lexical_index()
            bm_ids, bm, rest = lex.above(query, lex.common_bound(query))
            scorer = partial(lex.scores_for, query)
        maxb = max(float(bm.max()) if len(bm) else 0.0, rest)
        top, floor = bm_ids, rest
        if len(bm) > m:  # the m best, ties by id: a tie left out scores the m-th's score, the floor
            pos = top_k(bm_ids, bm, m)
            out = np.ones(len(bm), dtype=bool)
            out[pos] = False
            top = np.sort(bm_ids[pos])
            floor = max(float(bm[out].max()), rest)  # the best BM25 score outside the candidates
        return Candidates(np.union1d(found, top), qvec, kind, weight, bm_ids, bm, maxb, found, floor, scorer)

    def _relevance_on(self, c: Candidates, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Relevance of the nodes ``ids`` (the candidates among them) for the query of ``c``.

        Cosines by :meth:`~shared_core.search.index.NodeIndex.scores_at` (bitwise the values of the exhaustive
        scan, :meth:`~shared_core.search.index.NodeIndex.scores_all`, on every CPU). ``hybrid`` divides the
        dense part by its maximum over ``ids`` (the nearest
        node is among them as far as the index finds it) and BM25 by its exact maximum over every
        node: the values :meth:`relevance` gives these nodes when the index finds the nearest.

        Returns:
            ``(ids int64 (the indexed ones) in index row order, r float32)``.
        """
        ids, dense = self._dense_on(c, ids)
        if c.kind == "dense":
            return ids, dense
        maxd = float(dense.max()) if len(dense) else 0.0
        return ids, fuse(dense, c.bm25(ids), c.weight, maxima=(maxd, c.maxb))

    def _dense_on(self, c: Candidates, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, max(cos, 0))`` of the indexed nodes among ``ids``, in index row order."""
        assert self._index is not None
        ids = np.asarray(ids, dtype=np.int64)
        rows = self._index.rows(ids.tolist())
        order = np.argsort(rows, kind="stable")
        order = order[rows[order] >= 0]
        ids, rows = ids[order], rows[order]
        cos = self._index.scores_at(rows, c.qvec)
        return ids, np.maximum(cos, 0.0).astype(np.float32)

    def _top_down_over_candidates(
        self,
        query: str,
        kind: str,
        weight: float,
        alpha: float,
        horizon: int,
        k: int,
        qvec: np.ndarray | None,
        propagate: Propagator,
        *,
        leaves_only: bool,
        use_best: bool = False,
    ) -> CandidateScores | None:
        """``top_down`` scores of the nodes that can rank first, past :meth:`_search_max` nodes.

        Scores the candidates of :meth:`_relevance_candidates` (``m = CANDIDATES_PER_HIT (3k + 8)``
        from each list), their ``horizon`` ancestors and, where a candidate could lift them into the
        best ``3k + 8``, its descendants (:mod:`shared_core.search.candidates`): every node outside
        ``ranked`` scores below ``floor``. A ranking of the ``ranked`` nodes is the exhaustive one down to
        the floor (:meth:`_exact_prefix`); the scores share one positive factor
        with the exhaustive scores (they are normalised over the scored nodes instead of every node).

        Args:
            query, kind, weight: the relevance (``"dense"`` or ``"hybrid"``) and ``w``.
            alpha, horizon: the propagation's decay and ``H``. k: the hit budget.
            qvec: the normalised query vector (``None``: no candidates).
            propagate: ``(parent_pos, gap, r) -> (scores, best, scale)`` over the scored nodes, where
                ``scores * scale`` is ``G`` of :mod:`~shared_core.search.candidates` (a child takes its
                parent's whole score).
            leaves_only: only leaves are admissible. use_best: nodes rank by ``best`` (SegTreeMem's
                copies) instead of ``scores``.

        Returns:
            :class:`CandidateScores`, or ``None`` (score every node): under the size, fewer than
            ``NODES_PER_CANDIDATE x m`` indexed nodes, ``relevance="bm25"`` or no relevance at all.
        """
        kind = check_choice(kind, RELEVANCE_KINDS, "relevance")
        weight = check_weight(weight)
        need = 3 * k + 8
        m = CANDIDATES_PER_HIT * need
        if qvec is None or self._index is None or NODES_PER_CANDIDATE * m > len(self._index):
            return None
        c = self._relevance_candidates(query, kind, weight, m, qvec)
        if c is None or not len(c.nearest):
            return None
        self._arrays.sync(self._store)
        parent = self._arrays.parent
        size = len(parent)
        ranked = ancestor_mask(parent, c.ids, horizon)
        is_cand = np.zeros(size, dtype=bool)
        is_cand[c.ids] = True
        is_near = np.zeros(size, dtype=bool)
        is_near[c.nearest] = True
        depth_of: dict[int, int] | None = None  # candidate -> depth down to which descendants are scored
        while True:
            ids, dense = self._dense_on(
                c, np.flatnonzero(ancestor_mask(parent, np.flatnonzero(ranked), horizon))
            )
            maxd = float(dense.max()) if len(dense) else 0.0
            r = dense if kind == "dense" else fuse(dense, c.bm25(ids), weight, maxima=(maxd, c.maxb))
            near = dense[is_near[ids]]
            if not len(near):
                return None
            r_b = relevance_bound(kind, weight, float(near.min()), maxd, c.bm_floor, c.maxb)
            parent_pos, leaf, gap = self._arrays.aligned(self._store, ids)
            s, best, scale = propagate(parent_pos, gap, r)
            if scale <= 0:
                return None
            inr = ranked[ids]
            key = best if use_best else s
            # r_max: the largest relevance of each candidate summary and its H ancestors
            cand = np.flatnonzero(is_cand[ids] & ~leaf)
            rmax = np.asarray(r, dtype=np.float64)[cand]
            up = cand.copy()
            for _ in range(horizon):
                up = np.where(up >= 0, parent_pos[np.maximum(up, 0)], -1)
                rmax = np.maximum(rmax, np.where(up >= 0, r[np.maximum(up, 0)], 0.0))
            bound = [floor_of(alpha, horizon, r_b, rmax, d) for d in range(1, horizon + 1)]
            if (
                depth_of is None
            ):  # which candidates' descendants could rank: decided once, on the first scores
                vals = key[inr & leaf if leaves_only else inr]  # t: the need-th best admissible score
                t = (
                    float(np.partition(vals, len(vals) - need)[len(vals) - need]) * scale
                    if len(vals) >= need
                    else 0.0
                )
                depth = np.zeros(len(cand), dtype=np.int64)
                alive = np.ones(len(cand), dtype=bool)
                for u in bound:  # U falls with the depth: the depths down to the last U >= t
                    alive &= u >= t
                    depth += alive
                depth_of = {int(v): int(d) for v, d in zip(ids[cand].tolist(), depth.tolist()) if d}
                if depth_of:
                    ranked[descendants(lambda v: self._store.nodes[v].children, depth_of)] = True
                    continue
            d = np.asarray([depth_of.get(v, 0) for v in ids[cand].tolist()], dtype=np.int64)
            floor = r_b
            for j, u in enumerate(bound):  # candidates scored down to depth j: U(v, j + 1) bounds the rest
                at = d == j
                if at.any():
                    floor = max(floor, float(np.max(u[at])))
            return CandidateScores(ids, s, best, leaf, inr, floor / scale)

    def _top_down_parents(
        self,
        query: str,
        kind: str,
        weight: float,
        alpha: float,
        horizon: int,
        k: int,
        qvec: np.ndarray | None,
        *,
        leaves_only: bool,
    ) -> CandidateScores | None:
        """:meth:`_top_down_over_candidates` with :meth:`_propagated_scores`' propagation (each child takes
        its parent's whole score; no single-child copies): MemTree's and HAT's ``top_down``."""
        if check_choice(kind, RELEVANCE_KINDS, "relevance") == "bm25" or self._search_max() is None:
            return None

        def propagate(
            parent: np.ndarray, gap: np.ndarray, r: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray, float]:
            from ..tree.propagation import propagate_parents

            r64 = np.asarray(r, dtype=np.float64)
            total = float(r64.sum())
            if total <= 0:
                return r64, r64, 0.0
            s = propagate_parents(parent, r64 / total, "top_down", alpha, horizon, normalize=False)
            return s, s, total

        return self._top_down_over_candidates(
            query, kind, weight, alpha, horizon, k, qvec, propagate, leaves_only=leaves_only
        )

    def _ranked_over(
        self, sc: CandidateScores, k: int, meta: dict[str, Any], *, leaves_only: bool, use_best: bool = False
    ) -> list[tuple[int, float, dict[str, Any]]] | None:
        """:meth:`_ranked` over the ``ranked`` nodes of ``sc`` (their leaves with ``leaves_only``, by
        ``best`` with ``use_best``), cut to :meth:`_exact_prefix`; ``None`` when that is not enough (the
        caller scores every node). Notes :attr:`last_candidates` when it is."""
        keep = sc.ranked & sc.leaf if leaves_only else sc.ranked
        out = self._ranked(sc.ids, sc.best if use_best else sc.scores, k, meta, keep)
        exact = self._exact_prefix(out, k, sc.floor)
        if exact is not None:
            self.last_candidates = len(sc.ids)
        return exact

    def _exact_prefix(
        self, out: list[tuple[int, float, dict[str, Any]]], k: int, floor: float
    ) -> list[tuple[int, float, dict[str, Any]]] | None:
        """The part of a ranking of candidates (:meth:`_ranked` over :class:`CandidateScores`' ``ranked``
        nodes) that the exhaustive ranking shares, when it is enough; ``None`` when it is not.

        Every node scoring above ``floor`` is among the candidates, so the candidates above it come in
        the exhaustive order. That prefix is enough when :meth:`_to_hits` takes ``k`` hits from it (the
        filter and ``max_tokens`` budget of the retrieve under way applied) or spends the budget; with
        ``segment_cap`` or ``neighbours`` (which reorder the whole list) the whole list must lie above
        the floor and hold ``3k + 8`` candidates.
        """
        n = 0
        while n < len(out) and out[n][1] > floor:
            n += 1
        if self.segment_cap is not None or self.neighbours:
            return out if n == len(out) >= 3 * k + 8 else None
        nodes = self._store.nodes
        budget = TokenBudget(self._max_tokens)
        taken, seen = 0, set()
        for nid, _, _ in out[:n]:
            text = nodes[nid].text
            if text in seen or (self._allowed is not None and nid not in self._allowed):
                continue
            if budget.take(text):
                seen.add(text)
                taken += 1
                if taken >= k:
                    return out[:n]
            elif budget.spent:
                return out[:n]
        return None
