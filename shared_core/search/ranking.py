"""The ranking layer every memory shares: local relevance, propagation, filters and budgets over nodes.

:class:`Ranking` is a mixin of :class:`~shared_core.memories.base.HierarchicalMemory`: the one relevance layer
(``dense`` / ``bm25`` / ``hybrid``), relevance propagated over the memory's tree, the admissible,
filtered and budgeted candidate lists of a retrieval, and the hits made from them. Each memory adds its
own structure and policies on top.

Rankings do not depend on the CPU: every dense score is :func:`~shared_core.search.index.inner_products` (the
exact cosine rounded to float32, the same bits whichever rows are scored and whatever the SIMD width or
BLAS kernel), and every cut of a ranking (:func:`best_first`, :func:`~shared_core.search.index.top_k`) breaks
exact ties by node id, ascending. Only which nodes the approximate first stage
(:meth:`Ranking._relevance_candidates`) proposes can differ between machines, at its margin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models.base import call_embedder, unit_embeddings
from ..types import Hit, count_tokens, parse_timestamp
from .ann import NeighbourSearch
from .candidates import Candidates, CandidateSearch
from .filters import MessageFilter
from .index import inner_products, unit_row_norm
from .relevance import check_weight, fuse
from .selection import capped, with_neighbours
from .temporal import TimeCue, time_cue, time_rerank
from .walk import ADMISSIBLE, RELEVANCE_KINDS, TokenBudget, best_first, check_choice

if TYPE_CHECKING:
    from ..models.base import Embedder
    from ..tree.nodes import NodeStore
    from ..tree.structure import NodeArrays
    from ..types import Usage
    from .index import NodeIndex

__all__ = [
    "ADMISSIBLE",
    "Candidates",
    "RELEVANCE_KINDS",
    "Ranking",
    "TokenBudget",
    "best_first",
    "check_choice",
    "count_tokens",
]


class Ranking(CandidateSearch):
    """Mixin: the shared ranking of :class:`~shared_core.memories.base.HierarchicalMemory` (see the
    module)."""

    # set by HierarchicalMemory.__init__
    embedder: Embedder
    kind: str
    relevance_kind: str
    hybrid_weight: float
    _store: NodeStore
    _index: NodeIndex | None
    _lexical: Any
    _lex_dirty: set[int]
    _lex_removed: set[int]
    _query_usage: Usage
    _arrays: NodeArrays
    _structure_cache: tuple[tuple[int, int], Any] | None
    _max_tokens: int | None
    _allowed: set[int] | None
    _version: int
    _ns: NeighbourSearch | None
    _ns_of: NodeIndex | None
    _ns_dirty: set[int]

    #: at most this many hits from one segment before a second pass fills ``k`` (``None``: no cap);
    #: see :meth:`_shaped`
    segment_cap: int | None = None
    #: the depth below the root of the node that names a hit's segment for ``segment_cap`` (1: the
    #: root's child, a top-level segment)
    segment_depth: int = 1
    #: sibling leaves placed after each leaf hit (its segment neighbours, nearest in turn order first)
    neighbours: int = 0

    def _depth(self, nid: int) -> int:
        """Depth of a node below the root (root 0), as reported in hits."""
        return self._store.depth(nid)

    def hit(self, nid: int, score: float = 0.0, meta: dict[str, Any] | None = None) -> Hit:
        """Build the :class:`Hit` of node ``nid``."""
        st = self._store
        node = st.get(nid)
        md: dict[str, Any] = {"level": node.level, "kind": self.kind}
        if node.message is not None:
            m = node.message
            md.update({"role": m.role, "speaker": m.speaker, "timestamp": m.timestamp, **m.metadata})
        if meta:
            md.update(meta)
        return Hit(
            node_id=nid,
            text=node.text,
            score=score,
            depth=self._depth(nid),
            is_leaf=node.is_leaf,
            span=node.span,
            source_ids=st.source_ids_under(nid),
            metadata=md,
            valid_from=node.message.timestamp if node.message is not None else None,
        )

    #: bonus of a message inside a period the query names ("last Friday", "in June"), added to its
    #: ranking figure divided by the best candidate's (:func:`~shared_core.search.temporal.time_rerank`);
    #: 0 = time-blind
    time_weight: float = 0.3
    #: bonus of the newest (oldest) candidate when the query asks for the latest (first); 0 = none
    order_weight: float = 0.0
    #: ``(version, {leaf id: POSIX seconds or None}, sorted seconds)`` of :meth:`_message_times`
    _times_cache: tuple[int, dict[int, float | None], np.ndarray] | None = None

    def _time_cue(self, query: str, as_of: datetime | None, time_weight: Any) -> tuple[TimeCue, float] | None:
        """The query's time cue and the window weight to apply, or ``None`` when time can play no part:
        both weights 0, no cue in the query, no dated message within reach of a window the query names
        (a bonus under 0.001), fewer than two dated messages for an order word.

        Raises:
            InvalidInputError: ``time_weight`` outside ``[0, 1]``.
        """
        weight = self.time_weight if time_weight is None else check_weight(time_weight, "time_weight")
        if weight <= 0 and self.order_weight <= 0:
            return None
        cue = time_cue(query, as_of if as_of is not None else datetime.now())
        if not cue:
            return None
        times = self._message_times()
        near = False
        for start, end in cue.windows:
            a, b = (x.replace(tzinfo=timezone.utc).timestamp() for x in (start, end))
            near = near or _nearest_gap(times, a, b) < -math.log(1e-3) * max(b - a, 86400.0)
        near = near and weight > 0
        ordered = cue.order is not None and self.order_weight > 0 and len(np.unique(times)) > 1
        return (cue, weight) if near or ordered else None

    def _message_times(self) -> np.ndarray:
        """Sorted ``float64`` POSIX seconds (wall clock read as UTC) of every message with a readable
        timestamp, cached per tree version (only messages new to the version are parsed)."""
        cached = self._times_cache
        if cached is not None and cached[0] == self._version:
            return cached[2]
        old = cached[1] if cached is not None else {}
        nodes = self._store.nodes
        parsed: dict[int, float | None] = {}
        for nid in self._store.leaf_at.values():
            if nid in old:
                parsed[nid] = old[nid]
                continue
            m = nodes[nid].message
            t = None if m is None else parse_timestamp(m.timestamp)
            parsed[nid] = None if t is None else t.replace(tzinfo=timezone.utc).timestamp()
        arr = np.sort(np.array([t for t in parsed.values() if t is not None], dtype=np.float64))
        self._times_cache = (self._version, parsed, arr)
        return arr

    def _time_ranked(
        self, cands: list[tuple[int, float, dict[str, Any]]], cue: tuple[TimeCue, float]
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Candidates reordered by their ranking figure and the query's time cue."""
        nodes = self._store.nodes

        def when(nid: int) -> datetime | None:
            node = nodes.get(nid)
            return None if node is None or node.message is None else parse_timestamp(node.message.timestamp)

        return time_rerank(cands, when, cue[0], cue[1], self.order_weight)

    #: ``(query, vector)`` of the last query embedded: a query is embedded once per retrieval, however
    #: many of its steps read it, and :meth:`similarities` right after it reuses the vector
    _query_memo: tuple[str, np.ndarray] | None = None

    def _embed_query(self, query: str) -> np.ndarray:
        memo = self._query_memo
        if memo is not None and memo[0] == query:
            return memo[1]
        t0 = time.perf_counter()
        raw = call_embedder(self.embedder, self.embedder.embed, [query])
        dim = self._index.dim if self._index is not None else None
        v = unit_embeddings(raw, 1, dim)[0]
        self._query_usage.embed_calls += 1
        self._query_usage.embedded_texts += 1
        self._query_usage.seconds += time.perf_counter() - t0
        self._query_memo = (query, v)
        return v

    def _readable(self, query: str, hits: list[Hit], policy: str) -> list[Hit]:
        """The hits with a score a person can read: :attr:`Hit.score` becomes the query's cosine
        similarity to the hit's own text, clipped to ``[0, 1]`` (see :class:`~shared_core.types.Hit`).

        The policy's ranking figure moves to ``components["rank"]``; ``components`` also gets
        ``"dense"`` (the same cosine) and, when the memory's relevance reads BM25, ``"bm25"`` (the Okapi
        score of the hit's text over every indexed node, not normalised). Each hit also gets its
        ``rank`` (1-based, in the policy's order), ``policy`` and ``path`` (node ids, root first). The
        cosine is :func:`~shared_core.scores.inner_products` of the two normalised vectors, so it is
        the same on every CPU and does not depend on what else the memory holds (a leaf's vector is its
        message's embedding).
        """
        if not hits:
            return hits
        nids = [h.node_id for h in hits]
        qvec = self._embed_query(query)
        vecs = self._vectors(nids)
        cos = inner_products(vecs, qvec, row_norm=unit_row_norm(vecs.shape[1]))
        bm25 = None
        if self.relevance_kind in ("bm25", "hybrid") and self._index is not None:
            bm25 = self._lexical_index().scores_for(query, np.asarray(nids, dtype=np.int64))
        out = []
        for rank, (h, c) in enumerate(zip(hits, cos.tolist()), start=1):
            comp = {"rank": float(h.score), "dense": float(c)}
            if policy in ("top_down", "bottom_up"):  # the ranking figure is relevance propagated
                comp["propagated"] = float(h.score)
            if bm25 is not None:
                comp["bm25"] = float(bm25[rank - 1])
            path = [*reversed(self._store.ancestors(h.node_id)), h.node_id]
            out.append(
                replace(
                    h,
                    score=min(1.0, max(0.0, float(c))),
                    components=comp,
                    rank=rank,
                    policy=policy,
                    path=path,
                )
            )
        return out

    def _lexical_index(self) -> Any:
        """The BM25 index over node texts, brought up to date with the tree on demand."""
        from .lexical import LexicalIndex

        st = self._store
        if self._lexical is None:
            self._lexical = LexicalIndex()
            self._lex_dirty = {i for i, n in st.nodes.items() if n.text}
            self._lex_removed = set()
        if self._lex_removed:
            self._lexical.remove(sorted(self._lex_removed))
        up = sorted(i for i in self._lex_dirty if i in st.nodes and st.nodes[i].text)
        if up:
            self._lexical.upsert(up, [st.nodes[i].text for i in up])
        self._lex_dirty, self._lex_removed = set(), set()
        return self._lexical

    def relevance(
        self,
        query: str,
        kind: str | None = None,
        hybrid_weight: float | None = None,
        qvec: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Local relevance ``R(q, text(v)) >= 0`` of every indexed node: the one relevance layer of all
        memories (each adds its own structure on top).

        Args:
            query: the query text.
            kind: ``"dense"`` (``max(cos, 0)`` of query and node embeddings, the papers' scorer),
                ``"bm25"`` (BM25 over node texts, English stop words and Snowball stemming; the
                document frequencies and average length are those of every indexed node, summaries
                included, which is what ranks message leaves better than BM25 over the messages alone:
                docs/evaluation.md, "Corpus share, decomposed") or
                ``"hybrid"`` (each of the two divided by its maximum over the nodes, then mixed as
                ``w * dense + (1 - w) * bm25``); default ``None`` = the memory's ``relevance``.
            hybrid_weight: ``w`` for ``"hybrid"``, in [0, 1]; default ``None`` = the memory's.
            qvec: a precomputed normalised query vector (optional).

        Returns:
            ``(ids int64 (n,), r float32 (n,))`` over every node that has text, in index row order.

        Raises:
            UnknownPolicyError: an unknown ``kind``.
            InvalidInputError: ``hybrid_weight`` outside ``[0, 1]``.
        """
        kind = self.relevance_kind if kind is None else check_choice(kind, RELEVANCE_KINDS, "relevance")
        hybrid_weight = self.hybrid_weight if hybrid_weight is None else check_weight(hybrid_weight)
        if self._index is None or len(self._index) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        dense = None
        if kind in ("dense", "hybrid"):
            if qvec is None:
                qvec = self._embed_query(query)
            ids, cos = self._index.scores_all(qvec)  # the ids come back copied, in row order
            dense = np.maximum(cos, 0.0).astype(np.float32)
            if kind == "dense":
                return ids, dense
        else:
            ids = self._index.ids.copy()
        bm = self._lexical_index().scores_for(query, ids)
        if kind == "bm25":
            return ids, bm
        assert dense is not None
        return ids, fuse(dense, bm, hybrid_weight)

    def _propagated_scores(
        self,
        ids: np.ndarray,
        r: np.ndarray,
        direction: str,
        alpha: float,
        horizon: int,
        *,
        normalize: bool = False,
    ) -> np.ndarray:
        """Relevance propagated over this memory's tree (SegTreeMem's Algorithm 2 on any tree).

        The finite-horizon mixture ``sum_k alpha^k W^k s0 / sum_k alpha^k`` with ``s0 = r / sum(r)`` over
        the indexed nodes, where ``W`` moves a node's score to its children (``top_down``; whole with
        ``normalize=False``, split equally with ``True``) or to its parent (``bottom_up``). Nodes without
        text (e.g. MemTree's structural root) carry no score and are skipped: their children count as
        roots. Each step is a gather or a scatter-add over the parent positions (cached per tree version).

        Args:
            ids: indexed node ids ``int64 (n,)`` as :meth:`relevance` returns them.
            r: local relevance ``(n,)``, non-negative.
            direction: ``"top_down"`` or ``"bottom_up"``.
            alpha: decay in ``[0, 1)``. horizon: ``H >= 0``.
            normalize: split a parent's score among its children (the paper's operator).

        Returns:
            ``float64 (n,)`` propagated scores, aligned with ``ids``.

        Raises:
            InvalidInputError: ``alpha`` outside ``[0, 1)`` or a negative ``horizon``.
            UnknownPolicyError: an unknown direction.

        References:
            SegTreeMem paper, Sec. 4.3.1, Eq. (3)-(4), Appendix A Algorithm 2.
        """
        from ..tree.propagation import propagate_parents

        r = np.asarray(r, dtype=np.float64)
        total = float(r.sum())
        s0 = r / total if total > 0 else np.full(len(r), 1.0 / max(len(r), 1))
        if horizon == 0 or len(ids) == 0:
            return propagate_parents(np.full(len(r), -1), s0, direction, alpha, 0)
        parent = self._structure(ids)[0]
        return propagate_parents(parent, s0, direction, alpha, horizon, normalize=normalize)

    def _path(self, nid: int) -> list[int]:
        """Ids of the node's ancestors that carry text, from the top down (its path in the tree)."""
        nodes = self._store.nodes
        return [a for a in reversed(self._store.ancestors(nid)) if nodes[a].text]

    def _leaf_mask(self, ids: np.ndarray) -> np.ndarray:
        """``bool (n,)``: which of the node ids are message leaves."""
        self._arrays.sync(self._store)
        return self._arrays.leaf[np.asarray(ids, dtype=np.int64)]

    def _structure(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(parent_pos, leaf, level_gap)`` of the indexed node ids ``ids`` (in index row order).

        ``parent_pos[j]`` is the position in ``ids`` of node ``j``'s parent (``-1`` for a root or a
        parent without text, whose children then count as roots), ``leaf`` the leaf mask and
        ``level_gap[j]`` the parent's level minus the node's minus one (SegTreeMem: the single-child
        copies between them). Vectorised over :class:`~shared_core.tree.structure.NodeArrays`; cached per
        tree version.
        """
        if self._index is None or len(ids) != len(self._index):  # a part of the nodes: not cached
            return self._arrays.aligned(self._store, ids)
        key = (self._version, len(ids))
        cached = self._structure_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        out = self._arrays.aligned(self._store, ids)
        self._structure_cache = (key, out)
        return out

    def _drawn_leaves(self, nid: int) -> Iterable[int]:
        """Leaves outside a node's subtree whose messages its text draws on (none in a tree).

        Overridden where a node is written from messages that are not below it (xMemory's facts)."""
        return ()

    def _allowed_nodes(self, flt: MessageFilter) -> set[int]:
        """Ids of the nodes a filter lets through: a leaf whose message matches, or any other node whose
        every leaf below it (and every leaf of :meth:`_drawn_leaves`) matches. ``O(nodes)``."""
        nodes = self._store.nodes
        ok: dict[int, bool] = {}

        def leaf_ok(lid: int) -> bool:
            if lid not in ok:
                n = nodes.get(lid)
                ok[lid] = n is not None and n.is_leaf and flt.matches(n.message)
            return ok[lid]

        for start in nodes:
            stack = [start]
            while stack:
                nid = stack[-1]
                if nid in ok:
                    stack.pop()
                    continue
                node = nodes[nid]
                pending = [c for c in node.children if c not in ok and c in nodes]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                if node.is_leaf:
                    v = flt.matches(node.message) and all(ok.get(c, True) for c in node.children)
                else:
                    v = all(ok.get(c, True) for c in node.children)
                ok[nid] = v and all(leaf_ok(lid) for lid in self._drawn_leaves(nid))
        return {nid for nid, v in ok.items() if v}

    def _allowed_mask(self, ids: np.ndarray) -> np.ndarray | None:
        """``bool (n,)``: which node ids the filter of the retrieve under way lets through (``None``: all)."""
        allowed = self._allowed
        if allowed is None:
            return None
        return np.fromiter((int(i) in allowed for i in ids.tolist()), dtype=bool, count=len(ids))

    def _ranked(
        self,
        ids: np.ndarray,
        scores: np.ndarray,
        k: int,
        meta: dict[str, Any],
        admissible: np.ndarray | None = None,
        then: np.ndarray | None = None,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Candidates best first (ties by node id), one per distinct text, over the admissible positions.

        Returns at least ``3k + 8`` candidates when there are that many (room for repeated texts);
        under the ``max_tokens`` budget of the retrieve under way, as many more as it takes until ``k``
        of them fit in the budget together (walked as :meth:`_to_hits` does) or the budget is spent.

        Args:
            ids: node ids ``int64 (n,)``; scores: ``float (n,)``; k: the hit budget.
            meta: metadata given to every candidate (copied).
            admissible: ``bool (n,)`` mask of the positions that may be returned (default all).
            then: ``bool (n,)`` mask of fallback positions, ranked by a walk of their own and appended
                only when the admissible positions ran out first (a walk that stopped early already
                holds every hit :meth:`_to_hits` can take).
        """
        allowed = self._allowed_mask(ids)
        if allowed is not None:
            admissible = allowed if admissible is None else admissible & allowed
        pos = np.nonzero(admissible)[0] if admissible is not None else None
        nodes = self._store.nodes
        out: list[tuple[int, float, dict[str, Any]]] = []
        seen: set[str] = set()
        budget = TokenBudget(self._max_tokens)
        fitting = 0
        for j in best_first(ids, scores, pos):
            text = nodes[int(ids[j])].text
            if text in seen:  # e.g. a single-child node repeats its child's text
                continue
            seen.add(text)
            out.append((int(ids[j]), float(scores[j]), dict(meta)))
            fitting += budget.take(text)
            if len(out) >= 3 * k + 8 and (fitting >= k or budget.spent or budget.max_tokens is None):
                return out
        return out if then is None else out + self._ranked(ids, scores, k, meta, then)

    def _segment_of(self, nid: int) -> int:
        """The node naming ``nid``'s segment: its ancestor :attr:`segment_depth` levels below the root,
        or its parent when it is not deeper than that (the node itself for the root)."""
        path = [*reversed(self._store.ancestors(nid)), nid]
        return path[max(0, min(self.segment_depth, len(path) - 2))]

    def _sibling_leaves(self, nid: int) -> list[int]:
        """The other leaves of a leaf's parent, nearest in insertion order first (ties: the earlier)."""
        nodes = self._store.nodes
        node = nodes.get(nid)
        if node is None or not node.is_leaf or node.parent is None:
            return []
        at = node.span[0]
        sibs = [c for c in nodes[node.parent].children if c != nid and nodes[c].is_leaf]
        return sorted(sibs, key=lambda c: (abs(nodes[c].span[0] - at), nodes[c].span[0]))

    def _shaped(
        self, cands: list[tuple[int, float, dict[str, Any]]], k: int
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Candidates reordered by the structure-aware selection options (unchanged at their defaults).

        1. ``segment_cap`` (segment-diverse top-k, :func:`~shared_core.search.selection.capped`): at most
           that many candidates of one segment (:meth:`_segment_of`) come first, in rank order; the rest
           follow, taken only when those run out (``k`` hits whenever ``k`` distinct texts exist).
        2. ``neighbours`` (neighbourhood expansion, :func:`~shared_core.search.selection.with_neighbours`):
           each leaf candidate is followed by up to that many of its sibling leaves
           (:meth:`_sibling_leaves`), with the leaf's score and ``"neighbour_of"`` in their metadata; they
           count against the same ``k`` and ``max_tokens``.

        The cap counts candidates in rank order (a text repeated or over the budget still counts), so a
        segment is capped on what was ranked, not on what fitted.

        Args:
            cands: ``(node_id, score, metadata)`` best first. k: the hit budget (unused, for overrides).

        Returns:
            The reordered candidates (the same list when both options are off).
        """
        if self.segment_cap is None and not self.neighbours:
            return cands
        nodes = self._store.nodes
        out = cands
        if self.segment_cap is not None:
            out = capped(out, lambda c: self._segment_of(c[0]) if c[0] in nodes else None, self.segment_cap)
        if self.neighbours:

            def around(c: tuple[int, float, dict[str, Any]]) -> list[tuple[int, float, dict[str, Any]]]:
                return [(s, c[1], {**c[2], "neighbour_of": c[0]}) for s in self._sibling_leaves(c[0])]

            out = with_neighbours(out, around, self.neighbours, key=lambda c: c[0])
        return out

    def _to_hits(
        self, cands: Sequence[tuple[int, float, dict[str, Any]]], k: int, max_tokens: int | None
    ) -> list[Hit]:
        """Hits from ranked candidates: distinct texts, at most ``k``, within ``max_tokens``.

        A candidate whose metadata names the node it ``stands_for`` (e.g. xMemory's fact standing for
        its message) is taken only when that node was not (a budget had no room for it).
        """
        hits: list[Hit] = []
        seen: set[str] = set()
        taken: set[int] = set()
        budget = TokenBudget(max_tokens)
        for nid, score, meta in cands:
            node = self._store.nodes.get(int(nid))
            if node is None or not node.text or node.text in seen:
                continue
            if meta.get("stands_for") in taken:
                continue
            if self._allowed is not None and int(nid) not in self._allowed:
                continue
            if not budget.take(node.text):
                continue
            seen.add(node.text)
            taken.add(int(nid))
            hits.append(self.hit(int(nid), float(score), meta))
            if len(hits) >= k:
                break
        return hits


def _nearest_gap(times: np.ndarray, start: float, end: float) -> float:
    """Seconds from the window ``[start, end]`` to the nearest of the sorted ``times`` (0 inside;
    ``inf`` without times)."""
    if len(times) == 0:
        return math.inf
    i = int(np.searchsorted(times, start))
    if i < len(times) and times[i] <= end:
        return 0.0
    gaps = [start - times[i - 1]] if i > 0 else []
    if i < len(times):
        gaps.append(times[i] - end)
    return min(gaps)
