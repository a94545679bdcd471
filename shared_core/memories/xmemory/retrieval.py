"""xMemory retrieval over the base relevance layer: ``top_down`` (messages scored by their own relevance
and that of the semantics distilled from them), Stage I greedy representative selection (Eq. 4), Stage II
uncertainty-gated inclusion of episodes and messages (``adaptive``), ``representative`` and ``collapsed``.

References:
    xMemory Sec. 3.3 (Eq. 4, Stage I and II), Appendix C (reader prompt); the authors' code
    (HU-xiaobai/xMemory, ``evaluation/locomo/xMemory_search_framework.py``) for the pools, the Eq. 4
    normalisation and the Stage II gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...arrays import lookup, positions, unique_ints
from ...prompts import xmemory as P
from ...types import Hit, InvalidInputError, check_finite
from ..base import ADMISSIBLE, RELEVANCE_KINDS, check_choice, check_weight
from .construction import EPISODE, SEMANTIC, _pos_int, _XMemoryConstruction
from .rules import has_fact_sentence, query_terms

__all__ = ["greedy_representatives", "mean_nll"]

#: ``retrieve(k=None)`` for ``adaptive`` / ``representative``: no count cap, the selection decides
UNCAPPED = 1_000_000

#: ``top_down`` past ``exact_search_max`` nodes: nearest (and BM25) candidates per candidate the
#: ranking needs (3k + 8)
CANDIDATES_PER_HIT = 32

#: ... and only with at least this many indexed nodes per nearest candidate: the candidate path costs
#: about 7.7 ms at 25.6k nodes against 5.7 exhaustive, 17.4 against 32 at 254k (``hiermem bench
#: --conversation``, m = 1,216); the two cross at about 53k nodes, 44 per candidate
NODES_PER_CANDIDATE = 48

#: ``fact_fallback`` choices: when a message without a semantic, whose text holds a sentence the fact
#: rule accepts, takes its own relevance as its ``top_down`` fact term
FACT_FALLBACKS = ("budget", "always", "never")


def _coverage(x: Any, name: str) -> float:
    v = check_weight(x, name)
    if v == 0.0:
        raise InvalidInputError(f"{name} must be in (0, 1], got 0.")
    return v


def _nonnegative(x: Any, name: str) -> float:
    v = check_finite(x, name)
    if v < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {v}.")
    return v


def _count(x: Any, name: str) -> int:
    return _pos_int(x, name, minimum=0)


_BASE_OPTIONS = ("relevance", "hybrid_weight")  # kept by the base class (relevance_kind, hybrid_weight)

#: retrieval options (constructor defaults, per-call overrides) and their checks
RETRIEVAL_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "relevance": lambda v, n: check_choice(v, RELEVANCE_KINDS, n),
    "hybrid_weight": check_weight,
    "admissible": lambda v, n: check_choice(v, ADMISSIBLE, n),
    "episode_weight": _nonnegative,
    "fact_weight": _nonnegative,
    "fact_fallback": lambda v, n: check_choice(v, FACT_FALLBACKS, n),
    "alpha": check_weight,
    "coverage": _coverage,
    "semantic_pool": _pos_int,
    "theme_budget": _pos_int,
    "semantic_budget": _pos_int,
    "episode_pool": _count,
    "episode_budget": _pos_int,
    "support_weight": _nonnegative,
    "tolerance": check_finite,
    "expand_gain": check_finite,
    "strict_probes": _count,
    "patience": _pos_int,
    "expand_messages": lambda v, n: bool(v),
}


def mean_nll(logprobs: Sequence[float]) -> float:
    """Mean negative log-likelihood of answer tokens: ``-(1/T) * sum_t log p(y_t)``.

    Args:
        logprobs: natural-log probabilities of the T answer tokens (T >= 1), as
            :attr:`shared_core.types.Completion.logprobs` gives them.

    Returns:
        The mean NLL in nats per token (float >= 0 for valid log-probabilities).

    Raises:
        InvalidInputError: no log-probabilities, or a NaN / infinite value.

    References:
        xMemory Sec. 3.3, Stage II (the reader's predictive uncertainty).
    """
    lp = np.asarray(list(logprobs), dtype=np.float64)
    if lp.size == 0:
        raise InvalidInputError("mean_nll needs at least one log-probability.")
    if not np.isfinite(lp).all():
        raise InvalidInputError("log-probabilities must be finite numbers.")
    return float(-lp.mean())


# =========================================================================== Eq. 4
def greedy_representatives(
    candidates: Sequence[int],
    relevance: Mapping[int, float],
    neighbors: Mapping[int, Mapping[int, float]],
    *,
    alpha: float = 0.7,
    coverage: float = 1.0,
    budget: int = 5,
) -> list[tuple[int, float]]:
    """Query-aware greedy representative selection on a kNN graph (Eq. 4).

    ``V`` = ``candidates``; ``N(i)`` = i's graph neighbours inside V with edge weight ``w_iu > 0``; the
    node itself counts with ``w_ii = 1``. With ``C(R)`` the nodes covered by the selected set R and
    ``Delta(i; R) = ({i} u N(i)) \\ C(R)``, each step picks::

        i* = argmax_{i in V \\ R}  alpha * sum_{u in Delta(i;R)} w_iu / Z  +  (1 - alpha) * s~(q, i)

    The paper leaves ``Z`` and ``s~`` open; as in the authors' code, ``s~`` is the relevance min-max
    scaled over V (0.5 for every candidate when all are equal) and ``Z = sum_{i in V} sum_{u in {i} u
    N(i)} w_iu``, the total edge weight of the candidate graph, so the coverage term is a share of the
    whole candidate set and relevance decides the first picks. Ties go to the higher ``s~``, then to the
    earlier candidate. Selection stops when everything is covered, when ``|C(R)| / |V|`` reaches
    ``coverage`` (when below 1), when ``|R|`` reaches ``budget``, or when the best objective is not
    positive; it always returns at least one node.

    Args:
        candidates: candidate node ids V (order breaks ties).
        relevance: query-node relevance of each candidate (missing = 0).
        neighbors: kNN rows: node id -> {neighbour id: similarity}.
        alpha: weight of the coverage term, in [0, 1], default 0.7.
        coverage: target covered ratio in (0, 1], default 1.0 (the authors' code).
        budget: at most this many representatives (>= 1), default 5.

    Returns:
        ``(node id, objective value at selection)`` in selection order.

    Raises:
        InvalidInputError: ``alpha`` outside [0, 1], ``coverage`` outside (0, 1] or ``budget < 1``.

    References:
        xMemory Sec. 3.3 "Stage I", Eq. (4); the authors' code (HU-xiaobai/xMemory,
        ``LocomoSearcher._pick_representatives``) for ``Z``, ``s~`` and the stopping rule.
    """
    alpha = check_weight(alpha, "alpha")
    coverage = check_weight(coverage, "coverage")
    if coverage == 0.0:
        raise InvalidInputError("coverage must be in (0, 1], got 0.")
    budget = _pos_int(budget, "budget")
    V = list(dict.fromkeys(int(c) for c in candidates))
    if not V:
        return []
    Vset = set(V)
    nbr: dict[int, dict[int, float]] = {
        i: {int(u): float(w) for u, w in neighbors.get(i, {}).items() if u in Vset and u != i and w > 0}
        for i in V
    }
    rel = {i: float(relevance.get(i, 0.0)) for i in V}
    lo, hi = min(rel.values()), max(rel.values())
    s_t = {i: ((rel[i] - lo) / (hi - lo) if hi > lo else 0.5) for i in V}
    Z = sum(1.0 + sum(nbr[i].values()) for i in V)
    covered: set[int] = set()
    chosen: list[tuple[int, float]] = []
    in_R: set[int] = set()
    while len(covered) < len(V) and len(chosen) < budget:
        best, best_key = None, None
        for order, i in enumerate(V):
            if i in in_R:
                continue
            gain = (0.0 if i in covered else 1.0) + sum(w for u, w in nbr[i].items() if u not in covered)
            val = alpha * gain / Z + (1.0 - alpha) * s_t[i]
            key = (val, s_t[i], -order)
            if best_key is None or key > best_key:
                best, best_key = i, key
        if best is None or best_key is None or (best_key[0] <= 0.0 and chosen):
            break
        chosen.append((best, float(best_key[0])))
        in_R.add(best)
        covered.add(best)
        covered.update(nbr[best])
        if coverage < 1.0 and len(covered) / len(V) >= coverage:
            break
    return chosen


class _Relevance:
    """The relevance of every indexed node for one query (the base relevance layer), by node id."""

    def __init__(self, ids: np.ndarray, r: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.r = np.asarray(r, dtype=np.float64)
        #: node id -> its position in ``ids`` (``-1``: not indexed), for ids up to the largest indexed one
        self.row = positions(self.ids)
        #: the (semantic, message) row pairs of ``_fact_pairs``, once computed
        self.pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def rows(self, nids: np.ndarray) -> np.ndarray:
        """Positions in ``ids`` of the node ids ``nids`` (``-1`` for a node that is not indexed)."""
        return lookup(self.row, nids, -1)

    def get(self, nid: int, default: float = 0.0) -> float:
        nid = int(nid)
        j = int(self.row[nid]) if 0 <= nid < len(self.row) else -1
        return default if j < 0 else float(self.r[j])

    def __getitem__(self, nid: int) -> float:
        return self.get(nid)


def _relevance_of(ids: np.ndarray, rel: _Relevance) -> np.ndarray:
    """``rel[i]`` for every id (``0.0`` for a node that is not indexed), float64."""
    rows = rel.rows(ids)
    return np.where(rows >= 0, rel.r[np.maximum(rows, 0)], 0.0) if len(rel.r) else np.zeros(len(ids))


def _top_by_relevance(ids: Sequence[int] | np.ndarray, rel: _Relevance, m: int) -> list[int]:
    """``sorted(ids, key=lambda i: (-rel[i], i))[:m]``, vectorised (partition, then sort the head)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids) or m <= 0:
        return []
    neg = -_relevance_of(ids, rel)
    if len(ids) > m:  # only values at least the m-th best can be in the head (ties kept whole)
        keep = neg <= np.partition(neg, m - 1)[m - 1]
        ids, neg = ids[keep], neg[keep]
    return ids[np.lexsort((ids, neg))[:m]].tolist()


class _XMemoryRetrieval(_XMemoryConstruction):
    """The retrieval half of :class:`~shared_core.memories.xmemory.XMemory` (see there)."""

    # ------------------------------------------------------------------ entry points
    def retrieve(
        self,
        query: str,
        k: int | None = None,
        policy: str | None = None,
        *,
        max_tokens: int | None = None,
        **params: Any,
    ) -> list[Hit]:
        """Retrieve for a query.

        Args:
            query: the query text (non-empty).
            k: the number of hits: exactly ``k`` when the memory holds at least ``k`` distinct texts
                the policy may return (fewer only when ``max_tokens`` skips some). Default: 10 for
                ``top_down`` and ``collapsed``; for ``adaptive`` and ``representative`` the selection
                itself (no count cap, no filling).
            policy: ``"top_down"``, ``"adaptive"``, ``"representative"`` or ``"collapsed"``; default the
                memory's ``policy``.
            max_tokens: optional budget of returned text in tokens; hits that would exceed it are skipped.
            **params: per-call overrides of the retrieval options of the class (``relevance``,
                ``hybrid_weight``, ``admissible``, ``episode_weight``, ``fact_weight``,
                ``fact_fallback``, ``alpha``,
                ``coverage``, ``semantic_pool``, ``theme_budget``, ``semantic_budget``, ``episode_pool``,
                ``episode_budget``, ``support_weight``, ``tolerance``, ``expand_gain``,
                ``strict_probes``, ``patience``, ``expand_messages``).

        Returns:
            Hits ordered by score (see the class for each policy's score); ``metadata`` has ``level``,
            ``tokens``, ``path``, ``policy`` and, for ``adaptive`` / ``representative``, ``stage``
            (``"I"``, ``"II"`` or ``"fill"`` for nodes added after the selection to reach ``k``).

        Raises:
            InvalidInputError: empty query, bad ``k`` / ``max_tokens`` or an unknown / out-of-range
                option.
            UnknownPolicyError: an unknown policy, ``relevance`` or ``admissible`` (naming the choices).

        References:
            xMemory Sec. 3.3 (Stage I, Eq. 4; Stage II).
        """
        name = policy or self.default_policy
        if k is None and name in ("adaptive", "representative"):
            k = UNCAPPED
        return super().retrieve(query, k, policy, max_tokens=max_tokens, **params)

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(set(params) - set(RETRIEVAL_CHECKS))
        if bad:
            raise InvalidInputError(
                f"Unknown retrieval parameter(s) {', '.join(bad)}; XMemory accepts "
                f"{', '.join(sorted(RETRIEVAL_CHECKS))}."
            )
        p = {name: getattr(self, name) for name in RETRIEVAL_CHECKS if name not in _BASE_OPTIONS}
        p["relevance"], p["hybrid_weight"] = self.relevance_kind, self.hybrid_weight
        for name, value in params.items():
            if value is not None:
                p[name] = RETRIEVAL_CHECKS[name](value, name)
        return p

    def _retrieve(
        self, query: str, policy: str, k: int, **params: Any
    ) -> list[tuple[int, float, dict[str, Any]]]:
        p = self._params(params)
        if self._index is None or len(self._index) == 0:
            return []
        meta = {"policy": policy}
        self.last_trace = {"policy": policy, "relevance": p["relevance"]}
        qvec = self._embed_query(query) if p["relevance"] != "bm25" else None
        if policy == "top_down":
            found = self._top_down_candidates(query, p, k, meta, qvec)
            if found is not None:
                return found
        ids, r = self.relevance(query, p["relevance"], p["hybrid_weight"], qvec=qvec)
        rel = _Relevance(ids, r)
        admissible = self._leaf_mask(ids) if p["admissible"] == "leaves" else None
        if policy == "collapsed":
            return self._ranked(ids, rel.r, k, meta, admissible)
        if policy == "top_down":
            return self._top_down(rel, p, k, meta)
        themes, sems = self._stage_one(rel, p)
        self.last_trace.update(themes=[t for t, _ in themes], semantics=[s for s, _ in sems])
        chosen: dict[int, dict[str, Any]] = {}
        for nid, val in [*themes, *sems]:
            chosen[nid] = {"policy": policy, "stage": "I", "eq4": val}
        if policy == "adaptive":
            for probe in self._stage_two(query, rel, themes, sems, p):
                e = probe["episode"]
                node = self._store.nodes[e]
                info = {"policy": policy, "stage": "II", "priority": probe["priority"], "gain": probe["gain"]}
                raw = bool(node.data.get("raw", True))  # an LLM-free episode is its messages, rendered
                if not raw:
                    chosen[e] = dict(info)
                if raw or (p["expand_messages"] and probe.get("expand")):
                    for m in self._leaves_of(e):
                        chosen[m] = {**info, "episode": e}
        out = [(nid, rel[nid], md) for nid, md in chosen.items()]
        if admissible is not None:
            out = [c for c in out if self._store.nodes[c[0]].is_leaf]
        out.sort(key=lambda c: (-c[1], c[0]))
        if k >= UNCAPPED:
            return out
        fill = self._ranked(ids, rel.r, k, {"policy": policy, "stage": "fill"}, admissible)
        return out + [c for c in fill if c[0] not in chosen]

    def _top_down_candidates(
        self, query: str, p: dict[str, Any], k: int, meta: dict[str, Any], qvec: np.ndarray | None
    ) -> list[tuple[int, float, dict[str, Any]]] | None:
        """``top_down`` over candidates, past ``exact_search_max`` indexed nodes; ``None`` below it.

        The candidates are the ``m = 32 (3k + 8)`` (``CANDIDATES_PER_HIT``) nearest nodes from an IVF
        index over every indexed node and the ``m`` best by BM25
        (:meth:`~shared_core.search.ranking.Ranking._relevance_candidates`), closed over the evidence links
        (:meth:`_evidence_closure`) so that every candidate message's score is the one the exhaustive
        path gives it. Only which messages are scored is approximate. ``None`` (the exhaustive path)
        below the size, with fewer than ``NODES_PER_CANDIDATE x m`` indexed nodes (where scoring every
        node costs less), for ``relevance="bm25"`` (sparse and exact already) and when the candidates
        hold fewer admissible messages than the ranking needs (a filter, a token budget).
        """
        m = CANDIDATES_PER_HIT * (3 * k + 8)
        if qvec is None or self._index is None or NODES_PER_CANDIDATE * m > len(self._index):
            return None
        c = self._relevance_candidates(query, p["relevance"], p["hybrid_weight"], m, qvec)
        if c is None:
            return None
        ids, r = self._relevance_on(c, self._evidence_closure(c.ids, p["episode_weight"] > 0))
        rel = _Relevance(ids, r)
        scores, best = self._evidence_scores(rel, p)
        leaves = self._leaf_mask(rel.ids)
        msgs = self._ranked(rel.ids, scores, k, meta, leaves)
        if len(msgs) < 3 * k + 8:
            return None  # e.g. a filter that few candidates pass
        if self._max_tokens is not None:  # the budget's walk must not have run out of candidates
            allowed = self._allowed_mask(rel.ids)
            adm = leaves if allowed is None else leaves & allowed
            if len(msgs) >= len({self._store.nodes[int(i)].text for i in rel.ids[adm].tolist()}):
                return None
        self.last_trace.update(candidates=len(rel.ids))
        return self._with_stand_ins(rel, p, k, meta, msgs, best, leaves)

    def _evidence_closure(self, ids: np.ndarray, episodes: bool) -> np.ndarray:
        """``ids`` with every message a semantic among them was distilled from (and, with ``episodes``,
        every message of an episode among them), then every semantic (and episode) of those messages:
        the nodes whose relevance the ``top_down`` scores of those messages read."""
        psem, pmsg = self._fact_links()
        leaf = self._leaf_mask(ids)  # brings the per-node arrays up to date
        mark = np.zeros(len(self._arrays.leaf), dtype=bool)
        mark[ids] = True
        msgs = [ids[leaf], pmsg[mark[psem]]]
        if episodes:
            eps = ids[(self._arrays.level[ids] == EPISODE) & ~leaf]
            msgs.append(np.asarray([m for e in eps.tolist() for m in self._leaves_of(e)], dtype=np.int64))
        m = unique_ints(np.concatenate(msgs))
        mark[:] = False
        mark[m] = True
        out = [ids, m, psem[mark[pmsg]]]
        if episodes:
            par = self._arrays.parent[m]
            out.append(par[par >= 0])
        return unique_ints(np.concatenate(out))

    def _top_down(
        self, rel: _Relevance, p: dict[str, Any], k: int, meta: dict[str, Any]
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Messages by evidence score; with ``admissible="all"`` each is followed by its stand-in.

        The stand-in of a message is the most relevant semantic distilled from it; :meth:`_to_hits`
        returns it only when a ``max_tokens`` budget has no room for the message itself. After the
        messages come the other nodes by relevance, used only when the messages are fewer than ``k``.
        """
        scores, best = self._evidence_scores(rel, p)
        leaves = self._leaf_mask(rel.ids)
        cands = self._ranked(rel.ids, scores, k, meta, leaves)
        return self._with_stand_ins(rel, p, k, meta, cands, best, leaves)

    def _with_stand_ins(
        self,
        rel: _Relevance,
        p: dict[str, Any],
        k: int,
        meta: dict[str, Any],
        cands: list[tuple[int, float, dict[str, Any]]],
        best: np.ndarray,
        leaves: np.ndarray,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        if p["admissible"] != "all":
            return cands
        out: list[tuple[int, float, dict[str, Any]]] = []
        for m, score, md in cands:
            out.append((m, score, md))
            b = int(best[rel.row[m]])
            if b >= 0:
                out.append((int(rel.ids[b]), score, {**md, "stands_for": m}))
        # fewer messages than k: the other nodes by their own relevance make up the number
        return out + self._ranked(rel.ids, rel.r, k, {**meta, "stage": "fill"}, ~leaves)

    def _evidence_scores(self, rel: _Relevance, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """``top_down`` scores of every indexed node: a message's own relevance plus what flows down to it.

        ``score(m) = R(m) + fact_weight * F(m) + episode_weight * R(episode of m)`` with ``F(m) =
        max_{s from m} R(s)`` over the semantics distilled from ``m``. A message with no semantic has
        ``F(m) = 0``, except when ``fact_fallback`` applies to the retrieval (``"always"``, or
        ``"budget"`` under a ``max_tokens`` budget) and its text holds a sentence the fact rule accepts
        (:func:`~shared_core.memories.xmemory.rules.has_fact_sentence`): such a message was not found
        uninformative, only not distilled (its episode is still open, or the ``max_facts`` cap of its
        episode kept other sentences), so ``F(m) = R(m)``. Other nodes keep their own relevance.
        Vectorised over the (semantic, message) pairs of :meth:`_fact_pairs`.

        Returns:
            ``(scores float64 (n,), best int64 (n,))`` aligned with rel.ids: ``best[j]`` is the position
            of message j's most relevant semantic (the lowest node id among equals), ``-1`` when
            it has none.
        """
        r = rel.r
        score = r.copy()
        we, wf = p["episode_weight"], p["fact_weight"]
        leaves = self._leaf_mask(rel.ids)
        if we:
            parent = self._structure(rel.ids)[0]
            lp = np.nonzero(leaves & (parent >= 0))[0]
            score[lp] += we * r[parent[lp]]
        fact = np.zeros(len(score))
        best = np.full(len(score), -1, dtype=np.int64)
        js, jm, starts = self._fact_pairs(rel)
        if len(js):
            # per message (a run of equal jm): the highest relevance, then the lowest semantic id
            v = r[js]
            top = np.maximum.reduceat(v, starts)
            hit = np.flatnonzero(v == np.repeat(top, np.diff(np.append(starts, len(v)))))
            msg = jm[starts]
            fact[msg] = top
            best[msg] = js[hit[np.searchsorted(hit, starts)]]
        fallback = p["fact_fallback"]
        if wf and (fallback == "always" or (fallback == "budget" and self._max_tokens is not None)):
            for j in np.nonzero(leaves & (best < 0))[0].tolist():
                if self._fact_ready(int(rel.ids[j])):
                    fact[j] = r[j]
        return score + wf * fact, best

    def _fact_links(self) -> tuple[np.ndarray, np.ndarray]:
        """``(semantic ids, message ids)``: every indexed semantic paired with each indexed message it
        was distilled from (:meth:`_fact_messages`), ``int64`` arrays of equal length.

        Cached per tree version and kept across versions: a rebuild reads only the new semantics, those
        whose ``messages`` changed (noted in ``_fact_dirty`` by construction and deletion) and those saved
        without that list (they depend on their episodes); it drops the pairs of the semantics that are
        gone. The pairs are dropped whole when the state is reset (a rollback, a load, another process's
        commits) or the store object changes.
        """
        st = self._store
        c = self._fact_cache
        if c is not None and c["store"] is st and c["version"] == self._version:
            return c["sem"], c["msg"]
        empty = np.zeros(0, np.int64)
        if c is None or c["store"] is not st:
            c = {"sems": empty, "sem": empty, "msg": empty, "legacy": set()}
        assert self._index is not None
        ids = self._index.ids
        leaf = self._leaf_mask(ids)  # brings the per-node arrays up to date
        sems = ids[(self._arrays.level[ids] == SEMANTIC) & ~leaf]
        old_sems = c["sems"]
        top = int(max(sems.max(initial=-1), old_sems.max(initial=-1))) + 1
        now, before = np.zeros(top, dtype=bool), np.zeros(top, dtype=bool)
        now[sems], before[old_sems] = True, True
        fresh = sems[~before[sems]].tolist()
        gone = old_sems[~now[old_sems]].tolist()
        live = set(sems.tolist()) if self._fact_dirty or c["legacy"] else set()
        redo = list(dict.fromkeys([*fresh, *sorted((self._fact_dirty | c["legacy"]) & live)]))
        self._fact_dirty = set()
        psem, pmsg = c["sem"], c["msg"]
        if redo or gone:
            keep = ~np.isin(psem, np.asarray([*gone, *redo], dtype=np.int64))
            psem, pmsg = psem[keep], pmsg[keep]
        legacy = set(c["legacy"]) - set(gone)
        if redo:
            nodes = st.nodes
            pairs = []
            for s in redo:
                if "messages" not in nodes[s].data:
                    legacy.add(s)
                pairs.extend((s, m) for m in self._fact_messages(s))
            add = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            psem, pmsg = np.concatenate([psem, add[:, 0]]), np.concatenate([pmsg, add[:, 1]])
        self._fact_cache = dict(store=st, version=self._version, sems=sems, sem=psem, msg=pmsg, legacy=legacy)
        return psem, pmsg

    def _fact_pairs(self, rel: _Relevance) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(semantic rows, message rows, starts)``: the rows in ``rel.ids`` of the pairs of
        :meth:`_fact_links` whose semantic and message are both in ``rel``, sorted by message row then
        semantic node id (the tie-break of a message's most relevant semantic); ``starts`` are the
        positions where each message's run begins. Cached with ``rel``.
        """
        if rel.pairs is not None:
            return rel.pairs
        psem, pmsg = self._fact_links()
        js, jm = rel.rows(psem), rel.rows(pmsg)
        ok = (js >= 0) & (jm >= 0)
        js, jm = js[ok], jm[ok]
        order = np.lexsort((rel.ids[js], jm))
        js, jm = js[order], jm[order]
        starts = np.flatnonzero(np.append(True, jm[1:] != jm[:-1])) if len(jm) else np.zeros(0, np.int64)
        rel.pairs = (js, jm, starts)
        return rel.pairs

    def _fact_ready(self, nid: int) -> bool:
        """Whether message leaf ``nid`` has a sentence the fact rule accepts (cached by message text)."""
        node = self._store.nodes[nid]
        return has_fact_sentence(node.message.text if node.message is not None else node.text)

    # ------------------------------------------------------------------ Stage I (Eq. 4)
    def _stage_one(
        self, rel: _Relevance, p: dict[str, Any]
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """Themes, then semantics, chosen by Eq. 4 (as the authors' code builds the candidate sets).

        The ``semantic_pool`` most relevant semantics give the theme candidates (their themes, most
        relevant first); Eq. 4 picks at most ``theme_budget`` themes on the theme kNN graph; the pool's
        semantics under those themes are the semantic candidates, and Eq. 4 picks at most
        ``semantic_budget`` of them on the semantic kNN graph (the pool when no theme was picked).
        """
        st = self._store
        d = self._derived()
        if not d.sem_ids:
            return [], []
        pool = _top_by_relevance(d.sem_id_array(), rel, p["semantic_pool"])
        theme_cands = list(dict.fromkeys(st.nodes[s].parent for s in pool if st.nodes[s].parent is not None))
        theme_cands.sort(key=lambda t: (-rel[t], t))
        themes = greedy_representatives(
            theme_cands,
            rel,
            d.theme_graph.rows,
            alpha=p["alpha"],
            coverage=p["coverage"],
            budget=p["theme_budget"],
        )
        chosen = {t for t, _ in themes}
        sem_cands = [s for s in pool if st.nodes[s].parent in chosen] or pool
        sems = greedy_representatives(
            sem_cands,
            rel,
            d.sem_graph.rows,
            alpha=p["alpha"],
            coverage=p["coverage"],
            budget=p["semantic_budget"],
        )
        return themes, sems

    # ------------------------------------------------------------------ Stage II
    def _episode_pool(
        self, rel: _Relevance, sems: Sequence[tuple[int, float]], p: dict[str, Any]
    ) -> list[tuple[int, float, list[int]]]:
        """Episodes to probe, best priority first: ``(episode, priority, selected semantics linked)``.

        The pool (as in the authors' code) is the episodes linked to the selected semantics plus the
        ``episode_pool`` episodes most relevant to the query directly; ``priority = v(e) + w * max_{s}
        u(s)`` with ``v`` the episode relevance min-max scaled over the pool, ``u`` the semantic relevance
        min-max scaled over all semantics, ``s`` over the selected semantics linked to ``e`` and ``w`` =
        ``support_weight``. The ``episode_budget`` best are probed.
        """
        st = self._store
        parents: dict[int, list[int]] = {}
        for s, _ in sems:
            for e in self._links(s, "episodes"):
                if e in st.nodes:
                    parents.setdefault(e, []).append(s)
        episodes = self._ids_at(EPISODE)
        direct = _top_by_relevance(episodes, rel, p["episode_pool"])
        pool = sorted(set(parents) | set(direct))
        if not pool:
            return []
        v = {e: rel[e] for e in pool}
        lo, hi = min(v.values()), max(v.values())
        sem_rel = _relevance_of(self._derived().sem_id_array(), rel)
        s_lo, s_hi = (float(sem_rel.min()), float(sem_rel.max())) if len(sem_rel) else (0.0, 0.0)

        def u(s: int) -> float:
            return (rel[s] - s_lo) / (s_hi - s_lo) if s_hi > s_lo else 0.5

        w = p["support_weight"]
        scored = []
        for e in pool:
            direct_part = (v[e] - lo) / (hi - lo) if hi > lo else 0.0
            support = max((u(s) for s in parents.get(e, [])), default=0.0)
            scored.append((e, direct_part + w * support, parents.get(e, [])))
        scored.sort(key=lambda x: (-x[1], x[0]))
        return scored[: p["episode_budget"]]

    def _stage_two(
        self,
        query: str,
        rel: _Relevance,
        themes: Sequence[tuple[int, float]],
        sems: Sequence[tuple[int, float]],
        p: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """Probe the episode pool with the per-episode uncertainty gate; return the included probes.

        Each probed episode is judged on its own against the coarse context (the selected themes and
        semantics): its gain is ``U(coarse) - U(coarse + episode)``. It is included when the gain exceeds
        ``-tolerance``; an included LLM-written episode also brings its messages when the gain exceeds
        ``expand_gain``. A gain at or below ``-tolerance`` is a miss: probing stops at a miss among the
        first ``strict_probes`` probes, or at the ``patience``-th miss. When nothing is included, the
        first probe is (the authors' fallback).
        """
        probes = self._episode_pool(rel, sems, p)
        coarse = [t for t, _ in themes] + [s for s, _ in sems]
        unc = _Uncertainty(self, query, rel)
        u0 = unc(coarse, [])
        trace: list[dict[str, Any]] = []
        misses = 0
        stopped_early = False
        for n, (e, prio, parents) in enumerate(probes, start=1):
            u_e = unc(coarse, [e])
            gain = u0 - u_e
            probe = {"episode": e, "priority": prio, "semantics": parents, "gain": gain, "included": False}
            trace.append(probe)
            if gain > -p["tolerance"]:
                probe["included"] = True
                probe["expand"] = gain > p["expand_gain"]
            else:
                misses += 1
                if (n <= p["strict_probes"] and misses >= 1) or misses >= p["patience"]:
                    stopped_early = True
                    break
        if trace and not any(t["included"] for t in trace):
            trace[0].update(included=True, expand=False, fallback=True)
        self.last_trace.update(probes=trace, uncertainty=unc.mode, u_coarse=u0, stopped_early=stopped_early)
        return [t for t in trace if t["included"]]

    def uncertainty(
        self, query: str, semantic_ids: Sequence[int] = (), episodic_ids: Sequence[int] = ()
    ) -> tuple[float, str]:
        """The reader's uncertainty about the answer to ``query`` given a context of nodes.

        With a reader LLM that returns log-probabilities: the mean negative log-likelihood of the answer
        tokens (:func:`mean_nll`) of the App. C answer prompt (semantic memories = themes and semantics,
        episodic memories = episodes and messages). Otherwise the proxy ``1 - (cov + top) / 2``: ``cov``
        is the share of the query's terms (:func:`query_terms`) found in the context and ``top`` the
        highest relevance of a context node (the memory's ``relevance``, divided by its maximum over
        the nodes when that exceeds 1, as BM25 may); both lie in [0, 1], so the proxy does too, and
        adding a node never raises it.

        Args:
            query: the question.
            semantic_ids: theme / semantic node ids of the context.
            episodic_ids: episode / message node ids of the context.

        Returns:
            ``(uncertainty, mode)`` with mode ``"logprobs"`` or ``"proxy"``.

        References:
            xMemory Sec. 3.3, Stage II.
        """
        with self._lock:
            rel = _Relevance(*self.relevance(query))
            unc = _Uncertainty(self, query, rel)
            value = unc(list(semantic_ids), list(episodic_ids))
            return value, unc.mode


# =========================================================================== uncertainty
class _Uncertainty:
    """Uncertainty of the reader for one query (LLM log-probabilities or the documented proxy)."""

    def __init__(self, mem: _XMemoryRetrieval, query: str, rel: _Relevance) -> None:
        self.mem = mem
        self.query = query
        self.rel = rel
        top = float(rel.r.max()) if len(rel.r) else 0.0
        self.scale = top if top > 1.0 else 1.0
        self.reader = mem.reader if mem.reader is not None else mem.llm
        self.mode = "logprobs" if self.reader is not None else "proxy"
        self.qwords = query_terms(query)

    def __call__(self, semantic: Sequence[int], episodic: Sequence[int]) -> float:
        if self.mode == "logprobs":
            value = self._llm(semantic, episodic)
            if value is not None:
                return value
            self.mode = "proxy"  # the reader gives no log-probabilities: use the proxy for this query
        return self._proxy([*semantic, *episodic])

    def _llm(self, semantic: Sequence[int], episodic: Sequence[int]) -> float | None:
        st = self.mem._store
        sem_txt = "\n".join(f"- {st.nodes[i].text}" for i in semantic) or "(none)"
        epi_txt = "\n\n".join(st.nodes[i].text for i in episodic) or "(none)"
        prompt = P.READER_USER.format(semantic=sem_txt, episodic=epi_txt, question=self.query)
        assert self.reader is not None
        c = self.reader.complete(
            prompt, system=P.READER_SYSTEM, max_tokens=self.mem.answer_tokens, logprobs=True
        )
        self.mem._query_usage += c.usage
        if not c.logprobs:
            return None
        return mean_nll(c.logprobs)

    def _proxy(self, nodes: Sequence[int]) -> float:
        if not nodes:
            return 1.0
        st = self.mem._store
        text = " ".join(st.nodes[i].text for i in nodes)
        cov = len(self.qwords & query_terms(text)) / len(self.qwords) if self.qwords else 0.0
        top = max(self.rel[i] for i in nodes) / self.scale
        return 1.0 - 0.5 * (cov + min(max(top, 0.0), 1.0))
