"""HAT's LLM-free retrieval policies (paper Sec. 3.2, Sec. 4.3 without the agent's LLM): ``greedy`` (a
beam descent), ``collapsed`` (every node by its own relevance) and ``top_down`` (message leaves
supported by the summaries above them), as a mixin of :class:`~shared_core.memories.hat.HAT`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import lookup, positions
from ..search.index import inner_products
from ..search.relevance import check_weight
from ..tree.propagation import check_alpha, check_horizon
from ..types import InvalidInputError
from .base import ADMISSIBLE, RELEVANCE_KINDS, check_choice
from .hat_agent import _positive_int

__all__ = ["BEAM_PER_HIT", "GREEDY_HITS", "HATSearch"]

#: What ``greedy`` returns: the leaves under its beam, or the nodes where the descent stops.
GREEDY_HITS = ("leaves", "peaks")
#: Default beam width of ``greedy`` in leaves mode, per requested hit (the beam holds ``4 * k`` nodes).
BEAM_PER_HIT = 4


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


class HATSearch:
    """Mixin of :class:`~shared_core.memories.hat.HAT`: its retrieval policies without an LLM."""

    def _greedy(
        self, sim: Callable[[list[int]], np.ndarray], beam: int, patience: int | None
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Beam descent by similarity; the hits are the peaks (nodes more similar than their parent on
        the path and than each of their children), by similarity.

        Args:
            sim: similarities of nodes to the query, ``sim(node ids) -> float (n,)``.
            beam: nodes kept per layer.
            patience: layers in a row without improvement before a path is dropped (``None``: never).
        """
        st = self._store
        assert st.root is not None
        nodes = st.nodes

        def settle(nid: int, path: list[int], acts: list[str]) -> tuple[int, list[int], list[str]]:
            # A one-child node holds its child's text: go on to the finest node with that text.
            while len(nodes[nid].children) == 1:
                nid = nodes[nid].children[0]
                path, acts = [*path, nid], [*acts, "down 1"]
            return nid, path, acts

        root, path0, acts0 = settle(st.root, [st.root], [])
        # beam entries: (node, similarity, parent's similarity on the path, misses, path, actions)
        frontier = [(root, float(sim([root])[0]), -np.inf, 0, path0, acts0)]
        peaks: list[tuple[int, float, list[int], list[str]]] = []
        while frontier:
            cands = []
            for nid, _s, _, misses, path, acts in frontier:
                for i, c in enumerate(nodes[nid].children, 1):
                    leaf, p, a = settle(c, [*path, c], [*acts, f"down {i}"])
                    cands.append((leaf, nid, misses, p, a))
            sims = dict(zip([c[0] for c in cands], sim([c[0] for c in cands]).tolist()))
            best_child: dict[int, float] = {}
            for leaf, parent, *_ in cands:
                best_child[parent] = max(best_child.get(parent, -np.inf), sims[leaf])
            for nid, s, s_up, _, path, acts in frontier:
                if s > s_up and best_child.get(nid, -np.inf) <= s:
                    peaks.append((nid, s, path, acts))
            s_of = {f[0]: f[1] for f in frontier}
            nxt = []
            for leaf, parent, misses, p, a in cands:
                s_parent = s_of[parent]
                m = misses if sims[leaf] > s_parent else misses + 1
                if patience is None or m <= patience:
                    nxt.append((leaf, sims[leaf], s_parent, m, p, a))
            nxt.sort(key=lambda t: (-t[1], t[0]))
            frontier = nxt[:beam]
        peaks.sort(key=lambda t: (-t[1], nodes[t[0]].level, t[0]))
        return [
            (nid, s, {"policy": "greedy", "path": path, "actions": acts, "similarity": s})
            for nid, s, path, acts in peaks
        ]

    def _beam_leaves(
        self, ids: np.ndarray, r: np.ndarray, beam: int, admissible: str
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Beam descent by relevance from the root to the leaves, ``beam`` nodes kept per layer (ties by
        node id); returns the leaves of the last layer (``admissible="leaves"``) or every node visited,
        best first."""
        st = self._store
        assert st.root is not None
        nodes = st.nodes
        row = positions(np.asarray(ids, dtype=np.int64))
        rel = np.asarray(r, dtype=np.float64)

        def ranked(c: list[int]) -> tuple[list[int], list[float]]:
            """``c`` by relevance (0 for a node without a row), ties by node id."""
            ca = np.asarray(c, dtype=np.int64)
            j = lookup(row, ca, -1)
            v = np.where(j >= 0, rel[np.maximum(j, 0)] if len(rel) else 0.0, 0.0)
            order = np.lexsort((ca, -v))
            return ca[order].tolist(), v[order].tolist()

        frontier = [st.root]
        visited = [st.root]
        while nodes[frontier[0]].children:  # every leaf of a HAT is in the bottom layer
            frontier = ranked([c for nid in frontier for c in nodes[nid].children])[0][:beam]
            visited += frontier
        pool, vals = ranked(frontier if admissible == "leaves" else visited)
        return [(nid, v, {"policy": "greedy", "path": self._path(nid)}) for nid, v in zip(pool, vals)]

    def _collapsed(self, q: np.ndarray, k: int) -> list[tuple[int, float, dict[str, Any]]]:
        """Cosine over every node, top ``3k + 8`` (ties by level, then id): the first version's
        ``collapsed``."""
        if self._index is None or len(self._index) == 0:
            return []
        ids, scores = self._index.search(q, min(len(self._index), 3 * k + 8))
        st = self._store
        rows = sorted(
            zip(ids.tolist(), scores.tolist()),
            key=lambda t: (-round(t[1], 6), st.nodes[t[0]].level, t[0]),
        )
        return [(nid, s, {"policy": "collapsed", "path": self._path(nid)}) for nid, s in rows]

    def _ranking(
        self,
        ids: np.ndarray,
        r: np.ndarray,
        policy: str,
        k: int,
        admissible: str,
        alpha: float,
        horizon: int,
        meta: dict[str, Any],
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """``top_down`` (relevance propagated from each summary to the nodes below it) or ``collapsed``
        (own relevance) candidates: the admissible nodes best first, then, in case the admissible nodes
        run out of distinct texts, the others."""
        if policy == "top_down":
            s = self._propagated_scores(ids, r, "top_down", alpha, horizon)
        else:
            s = np.asarray(r, dtype=np.float64)
        if admissible == "leaves":
            keep = self._leaf_mask(ids)
            out = self._ranked(ids, s, k, meta, keep, then=~keep)
        else:
            out = self._ranked(ids, s, k, meta)
        for nid, _, m in out:
            m["path"] = self._path(nid)
        return out

    def _retrieve(
        self,
        query: str,
        policy: str,
        k: int,
        max_steps: int | None = None,
        beam: int | None = None,
        patience: int | None = None,
        relevance: str | None = None,
        hybrid_weight: float | None = None,
        admissible: str | None = None,
        alpha: float | None = None,
        horizon: int | None = None,
        greedy_hits: str | None = None,
        fill: bool | None = None,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Candidates of one policy, best first (see :meth:`retrieve` and the class docstring).

        Args:
            query: the query. policy: one of :attr:`policies`. k: the hit budget.
            max_steps: LLM decisions of one traversal (default the memory's ``max_steps`` for the
                agent, ``search_steps`` for BFS / DFS).
            beam: ``greedy``'s beam width in nodes per layer (default the memory's ``beam``, else
                ``4 * k`` for leaves and ``k`` for peaks).
            patience: ``greedy`` peaks: ``None`` follows the beam to the leaves, ``0`` stops at the first
                peak.
            relevance, hybrid_weight, admissible, alpha, horizon, greedy_hits, fill: the memory's
                settings of the same name, for this call.

        Returns:
            ``(node_id, score, metadata)`` candidates. ``agent`` / ``bfs`` / ``dfs`` give the node
            judged sufficient (score 1.0; metadata ``path`` = the visited nodes, ``actions``,
            ``outcome``, ``steps``) or nothing; ``greedy`` peaks give the similarity; the others their
            score. With ``fill``, the ``top_down`` candidates follow (metadata ``fill: True``).

        Raises:
            InvalidInputError: a parameter out of range.
            UnknownPolicyError: an unknown ``relevance``, ``admissible`` or ``greedy_hits``.
        """
        relevance = (
            self.relevance_kind
            if relevance is None
            else check_choice(relevance, RELEVANCE_KINDS, "relevance")
        )
        hybrid_weight = self.hybrid_weight if hybrid_weight is None else check_weight(hybrid_weight)
        admissible = (
            self.admissible if admissible is None else check_choice(admissible, ADMISSIBLE, "admissible")
        )
        alpha = self.alpha if alpha is None else check_alpha(alpha)
        horizon = self.horizon if horizon is None else check_horizon(horizon)
        greedy_hits = (
            self.greedy_hits if greedy_hits is None else check_choice(greedy_hits, GREEDY_HITS, "greedy_hits")
        )
        fill = self.fill if fill is None else _check_bool(fill, "fill")
        if beam is not None:
            beam = _positive_int(beam, "beam")
        if patience is not None:
            if (
                isinstance(patience, bool)
                or not isinstance(patience, (int, float, np.integer, np.floating))
                or not float(patience).is_integer()
                or patience < 0
            ):
                raise InvalidInputError(f"patience must be None or an integer >= 0, got {patience!r}.")
            patience = int(patience)
        qvec: np.ndarray | None = None
        scored: tuple[np.ndarray, np.ndarray] | None = None

        def query_vector() -> np.ndarray:
            nonlocal qvec
            if qvec is None:
                qvec = self._embed_query(query)
            return qvec

        def scores() -> tuple[np.ndarray, np.ndarray]:
            nonlocal scored
            if scored is None:
                q = query_vector() if relevance != "bm25" else None
                scored = self.relevance(query, relevance, hybrid_weight, qvec=q)
            return scored

        cands: list[tuple[int, float, dict[str, Any]]]
        if policy == "collapsed" and relevance == "dense" and admissible == "all":
            cands = self._collapsed(query_vector(), k)  # the first version's cosine over every node
        elif policy in ("top_down", "collapsed"):  # every distinct text is a candidate: no fill needed
            if relevance != "bm25":  # collapsed: top_down with H = 0
                sc = self._top_down_parents(
                    query,
                    relevance,
                    hybrid_weight,
                    alpha,
                    horizon if policy == "top_down" else 0,
                    k,
                    query_vector(),
                    leaves_only=admissible == "leaves",
                )
                found = None
                if sc is not None:
                    found = self._ranked_over(sc, k, {"policy": policy}, leaves_only=admissible == "leaves")
                if found is not None:
                    for nid, _, m in found:
                        m["path"] = self._path(nid)
                    return found
            ids, r = scores()
            return self._ranking(ids, r, policy, k, admissible, alpha, horizon, {"policy": policy})
        elif policy == "greedy":
            if greedy_hits == "peaks":
                width = beam or self.beam or k
                if relevance == "dense":  # the cosine itself, as the first version
                    q = query_vector()
                    cands = self._greedy(lambda nids: inner_products(self._vectors(nids), q), width, patience)
                else:
                    ids, r = scores()
                    table = dict(zip(ids.tolist(), np.asarray(r, dtype=np.float64).tolist()))
                    cands = self._greedy(
                        lambda nids: np.array([table.get(n, 0.0) for n in nids]), width, patience
                    )
            else:
                ids, r = scores()
                cands = self._beam_leaves(ids, r, beam or self.beam or BEAM_PER_HIT * k, admissible)
        else:
            trace = self.traverse(query, policy, max_steps=max_steps)
            cands = []
            if trace.node_id is not None:
                meta = {
                    "policy": policy,
                    "path": list(trace.path),
                    "actions": list(trace.actions),
                    "outcome": trace.outcome,
                    "steps": trace.steps,
                }
                cands = [(trace.node_id, 1.0, meta)]
        if fill:
            ids, r = scores()
            extra = self._ranking(
                ids, r, "top_down", k, admissible, alpha, horizon, {"policy": policy, "fill": True}
            )
            cands = cands + extra
        return cands
