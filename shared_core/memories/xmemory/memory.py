"""The XMemory class: configuration, state, hits and statistics over the construction and retrieval
layers.

References:
    xMemory Sec. 3.2-3.3, Sec. 5.3, Appendix B and C.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...models.base import LLM, Embedder, Summarizer
from ...prompts import xmemory as P
from ...types import Hit, InvalidInputError, LLMRequiredError, check_finite
from ..base import check_choice, count_tokens
from ..registry import register_memory
from .construction import (
    BOUNDARY_MODES,
    EPISODE,
    LEVEL_NAMES,
    SEMANTIC,
    THEME,
    _cosine,
    _Derived,
    _pos_int,
)
from .forgetting import _XMemoryForgetting
from .retrieval import RETRIEVAL_CHECKS, _XMemoryRetrieval

__all__ = ["XMemory"]


@register_memory
class XMemory(_XMemoryForgetting, _XMemoryRetrieval):
    """xMemory: a four-level memory (message -> episode -> semantic -> theme) with two-stage retrieval.

    **Construction** (online, per message; Sec. 3.2). The boundary detector decides whether the new
    message opens a new episode. With an LLM (``boundary="llm"``, the default when ``llm`` is given) it
    answers the App. C boundary prompt as JSON, parsed strictly with one retry; an unusable answer falls
    back to the rule. The rule (``boundary="rule"``, the default without LLM) cuts when (a) the open
    episode already has ``max_episode_messages`` messages (also enforced with an LLM), (b) the time
    between the previous message and the new one exceeds ``time_gap_minutes`` (when both timestamps
    parse), or (c) the open episode has at least ``min_episode_messages`` messages and the cosine
    between the new message and the normalised mean of the open episode's message vectors is below
    ``drift_threshold``. A closed episode gets its record (LLM: title + third-person content with
    relative dates resolved against the timestamps; LLM-free: the rendered messages themselves), then
    semantics (LLM: a JSON list of facts; LLM-free: :func:`extract_facts_rule`). Each semantic records
    the messages it comes from (``messages``: the one message of a rule fact's sentence, every message
    of the episode for an LLM-written fact); a new fact whose cosine to an existing semantic is at least
    ``dedup_threshold`` merges into it (adding its episode and messages), else it is created and
    attached to the theme with the nearest centroid when its cosine is at least ``attach_threshold``,
    else to a new theme. A theme above ``theme_size_cap`` semantics is split into the candidate
    partition (:func:`candidate_splits`) with the highest ``f(P)``; a tiny theme (at most
    ``tiny_theme_size`` semantics) is merged into the neighbour theme (centroid cosine at least
    ``merge_threshold``, at most ``merge_candidates`` tried) whose merge gives the highest ``f(P)``.
    Theme summaries come from the summariser: with an LLM the App. C theme prompt; without one
    :func:`central_facts` (the theme's most central facts within ``summary_chars``); a given
    ``summarizer`` is always used. Deleting a message deletes every semantic that no longer has a
    message it comes from; a surviving semantic whose text was written from the deleted message is
    written again from a message still supporting it (its sentence, date, speaker and vector), and
    every episode record and theme summary that held the message's words is made again
    (:mod:`~shared_core.memories.xmemory.forgetting`).

    **Retrieval.** Every node is scored with the memory's ``relevance`` ``R`` (the base class's relevance
    layer: ``"dense"`` cosine, ``"bm25"`` or ``"hybrid"``, each part divided by its maximum over the
    nodes). Hits are ordered by score; ``retrieve(k=...)`` returns exactly ``k`` hits whenever the
    memory holds ``k`` distinct texts the policy may return (``max_tokens`` may skip some); every hit
    carries ``metadata["path"]`` (the theme, semantic and episode above it) and a semantic or theme hit
    reports as ``source_ids`` only the messages it comes from.

    * ``top_down`` (default): the evidence is the messages. A message scores its own relevance plus
      what flows down to it from the semantics distilled from it (and, when ``episode_weight > 0``,
      from its episode): ``score(m) = R(m) + fact_weight * max_{s from m} R(s) + episode_weight *
      R(episode(m))``; under a ``max_tokens`` budget a message that has no semantic only because it was
      not distilled (open episode, or cut by the ``max_facts`` cap) although the fact rule accepts one
      of its sentences counts its own relevance as ``max R(s)`` (``fact_fallback``). With
      ``admissible="all"`` a message that a ``max_tokens`` budget cannot hold is
      replaced by its most relevant semantic (a dated sentence of it) when that fits
      (``metadata["stands_for"]`` names the message); ``admissible="leaves"`` returns messages only.
      No model is called at query time. Past ``exact_search_max`` indexed nodes (and at least 48
      nodes per candidate: about 58k for k = 10) ``top_down`` scores candidates instead of every
      node: the ``32 (3k + 8)`` nearest nodes from an IVF index over every node (8-bit codes, about
      sqrt(n) lists, 32 visited) and as many best by BM25, with every message a candidate semantic
      comes from and every semantic of a candidate message; each candidate's score is the
      exhaustive one (``last_trace`` has ``candidates``). ``relevance="bm25"``, filters and budgets
      that too few candidates pass stay exhaustive.
    * ``adaptive`` (Sec. 3.3): Stage I picks themes, then semantics, by Eq. 4
      (:func:`greedy_representatives`) from the ``semantic_pool`` most relevant semantics; Stage II
      probes episodes (those linked to the chosen semantics plus the ``episode_pool`` most relevant
      ones; priority = episode relevance min-max scaled + ``support_weight`` x the best min-max scaled
      relevance of a chosen semantic linked to it; the ``episode_budget`` best are probed) and judges
      each alone against the coarse context: it is included when ``U(coarse) - U(coarse + e) >
      -tolerance``, brings its raw messages when the gain exceeds ``expand_gain``, a miss among the
      first ``strict_probes`` probes or the ``patience``-th miss stops probing, and the first probe is
      included when nothing else is. ``U`` is the reader's mean answer NLL (:meth:`uncertainty`), or
      without one a proxy. An LLM-free episode's record is its messages, so it is returned as them.
      ``retrieve(k=None)`` returns the whole selection (the paper's context).
    * ``representative``: Stage I only. ``collapsed``: every node by its own relevance.

    The pools, the Eq. 4 normalisation (``s~`` min-max scaled, ``Z`` the candidate graph's total
    weight), full coverage, the per-episode gate with its tolerance, early stop and fallback, and the
    episode priority follow the authors' code (HU-xiaobai/xMemory, ``xMemory_search_framework.py``)
    where the paper is silent.

    **Departures from the paper** (each measured in ``docs/evaluation.md``, "xMemory: departures from
    the paper, measured"):

    * the default policy is ``top_down`` (the evidence messages), not ``adaptive``;
    * ``relevance="hybrid"`` (dense + BM25), not cosine alone;
    * relevance flows from a semantic to the messages it comes from (``fact_weight``), not from the
      episode (``episode_weight`` 0); ``top_down`` does not gate by Stage II;
    * under a token budget a message that does not fit is replaced by its fact (``admissible="all"``),
      and an undistilled message whose sentence the fact rule accepts counts its own relevance as its
      fact term (``fact_fallback="budget"``);
    * hits are ordered by score and ``k`` is exact (``k=None`` keeps the paper's selection size);
    * without a reader the uncertainty is a proxy that never rises, so every probed episode passes;
    * LLM-free theme summaries are at most ``summary_chars`` = 200 characters.

    The paper's retrieval, exactly: ``XMemory(relevance="dense", policy="adaptive",
    admissible="all")`` with a ``reader`` that returns log-probabilities, ``retrieve(query)`` (``k=None``);
    saves made before these options existed load with ``relevance="dense"``, ``policy="adaptive"``,
    ``admissible="all"`` (:attr:`legacy_config`).

    Args:
        embedder: the embedder (default: the embedded all-MiniLM-L6-v2).
        llm: an LLM for boundaries, episode records, facts and theme summaries, or ``None`` (rules).
        reader: the LLM whose answer log-probabilities measure uncertainty in Stage II; default ``llm``.
            Without a reader, or when it returns no log-probabilities, a proxy is used (see
            :meth:`uncertainty`).
        boundary: ``"auto"`` (LLM when ``llm`` is given, else rule), ``"llm"`` or ``"rule"``.
        max_episode_messages: length cap of an episode in messages, default 12 (App. C: 10-15).
        min_episode_messages: messages before the drift rule may cut, default 2.
        drift_threshold: cosine below which the rule cuts, default 0.4 (for all-MiniLM-L6-v2: about
            the 5th percentile of a message's cosine to its session's previous messages; an embedder
            with another similarity scale needs its own value).
        time_gap_minutes: a gap above this cuts (rule), default 30 (App. C).
        max_facts: facts per episode at most, default 8.
        dedup_threshold: cosine at or above which a new fact merges into an existing semantic,
            default 0.9.
        attach_threshold: theme attach threshold, default 0.62 (the authors' code).
        merge_threshold: tiny-theme merge threshold, default 0.78 (the authors' code).
        theme_size_cap: split themes above this size, default 12 (App. B).
        tiny_theme_size: themes of at most this size are merge candidates, default 2.
        merge_candidates: nearest themes tried for a merge, default 3.
        split: enable theme splits, default ``True``.
        merge: enable tiny-theme merges, default ``True``.
        knn_k: neighbours per node in the theme and semantic kNN graphs, default 10.
        exact_search_max: the most semantics (themes) whose similarities to a new fact (theme) are all
            computed, default 8192; above it the nearest are looked for among candidates from an IVF
            index (:class:`~shared_core.search.ann.NeighbourSearch`: ``2 sqrt(n)`` lists, 8 visited): fact
            deduplication, theme attachment, merge candidates, the objective's nearest themes and the
            kNN graphs' rows. ``None``: every similarity at any size (the paper's exact construction,
            and what memories saved before this option do). The same size bounds ``top_down``
            retrieval: past it, candidates from an IVF index over every node are scored instead of
            every node (``top_down`` above). Costs at scale: ``docs/evaluation.md``, "xMemory past 8,192
            semantics or themes".
        eps: the MAD offset of Eq. 3, default 0.01.
        policy: default retrieval policy, ``"top_down"`` (default), ``"adaptive"``, ``"representative"``
            or ``"collapsed"``.
        relevance: local relevance of a node, ``"hybrid"`` (default), ``"dense"`` (the paper) or
            ``"bm25"``.
        hybrid_weight: weight of the dense part of ``"hybrid"``, in ``[0, 1]``, default 0.5.
        annotation_vectors: ``"composed"`` or ``"embedded"``: how a summary's vector is made (see
            :class:`~shared_core.memories.base.HierarchicalMemory`); default ``None`` = ``"composed"``,
            from the default extractive summariser's sentence vectors pooled from each message's own
            forward pass (``sentence_vectors="pooled"``; ``docs/evaluation.md``, "Sentence vectors from
            the message's own forward pass"). Memories saved before this default keep ``"embedded"``.
        admissible: what may be returned: ``"all"`` (default; ``top_down``: messages and, under a
            budget, their facts; the other policies: every level) or ``"leaves"`` (messages only).
        episode_weight: ``top_down`` weight of the episode's relevance in a message's score, >= 0,
            default 0.
        fact_weight: ``top_down`` weight of the best relevance of a semantic distilled from a message,
            >= 0, default 0.6.
        fact_fallback: when a message without a semantic whose text holds a sentence the fact rule
            accepts (:func:`~shared_core.memories.xmemory.rules.has_fact_sentence`: its episode is still open,
            or the ``max_facts`` cap of its episode kept other sentences) takes its own relevance as
            its ``top_down`` fact term: ``"budget"`` (default: under a ``max_tokens`` budget),
            ``"always"`` or ``"never"`` (such a message gets no fact term, as before the option).
        alpha: Eq. 4 coverage/relevance balance in [0, 1], default 0.7.
        coverage: Eq. 4 target covered ratio in (0, 1], default 1.0 (the authors' code).
        semantic_pool: semantics first retrieved by relevance (Stage I), default 40.
        theme_budget: themes selected at most, default 5.
        semantic_budget: semantics selected at most, default 20.
        episode_pool: episodes added to the Stage II pool by their own relevance, default 10.
        episode_budget: episodes probed at most in Stage II, default 10.
        support_weight: weight of semantic support in the episode priority, >= 0, default 0.5.
        tolerance: an episode is included when its uncertainty gain exceeds ``-tolerance``, default 0.4
            (nats with a reader).
        expand_gain: an included LLM-written episode brings its messages when its gain exceeds this,
            default 0.25.
        strict_probes: a miss among the first this many probes stops Stage II, default 3.
        patience: Stage II stops at this many misses, default 2.
        expand_messages: let included LLM-written episodes bring their raw messages, default ``True``.
        answer_tokens: completion cap of the reader in tokens, default 32.
        summarizer: theme summariser (default: LLM with the App. C theme prompt, or
            :func:`central_facts`).
        summary_chars: LLM-free theme summary budget in characters (>= 20), default 200.
        store: path of a durable SQLite store (see :class:`~shared_core.memories.base.HierarchicalMemory`).

    Hits carry ``metadata["level"]`` in ``{"theme", "semantic", "episode", "message"}``,
    ``metadata["tokens"]`` and ``metadata["path"]``.

    Raises:
        InvalidInputError: a parameter out of range.
        UnknownPolicyError: an unknown ``boundary``, ``policy``, ``relevance`` or ``admissible`` (the
            message names the choices).
        LLMRequiredError: ``boundary="llm"`` without ``llm``.

    References:
        xMemory (shared/seeds/xmemory-paper.txt): Sec. 3.2-3.3, Eq. (1)-(4), Sec. 5.3, App. B, App. C;
        the authors' code, HU-xiaobai/xMemory (``evaluation/locomo/xMemory_search_framework.py``) for
        the retrieval details the paper leaves open.
    """

    kind = "xmemory"
    policies = ("top_down", "adaptive", "representative", "collapsed")
    default_policy = "top_down"
    tree_policy: ClassVar[str | None] = "top_down"
    default_relevance = "hybrid"
    contiguous_spans = False
    default_k: ClassVar[int] = 10
    default_annotation_vectors: ClassVar[str] = "composed"
    default_sentence_vectors: ClassVar[str] = "pooled"
    #: names ``retrieve`` accepts as per-call options (adapters read them)
    retrieve_params: ClassVar[frozenset[str]] = frozenset(RETRIEVAL_CHECKS)
    #: saves made before these options existed load with the paper's retrieval (dense, adaptive)
    legacy_config: ClassVar[dict[str, Any]] = {
        "relevance": "dense",
        "hybrid_weight": 0.5,
        "admissible": "all",
        "policy": "adaptive",
        "episode_weight": 0.0,
        "fact_weight": 0.0,
        "fact_fallback": "never",
        "coverage": 1.0,
        "episode_pool": 10,
        "tolerance": 0.4,
        "expand_gain": 0.25,
        "strict_probes": 3,
        "exact_search_max": None,
    }
    #: configuration keys of earlier versions that no longer exist (dropped when a save loads)
    obsolete_config: ClassVar[frozenset[str]] = frozenset({"min_gain"})

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        reader: LLM | None = None,
        boundary: str = "auto",
        max_episode_messages: int = 12,
        min_episode_messages: int = 2,
        drift_threshold: float = 0.4,
        time_gap_minutes: float = 30.0,
        max_facts: int = 8,
        dedup_threshold: float = 0.9,
        attach_threshold: float = 0.62,
        merge_threshold: float = 0.78,
        theme_size_cap: int = 12,
        tiny_theme_size: int = 2,
        merge_candidates: int = 3,
        split: bool = True,
        merge: bool = True,
        knn_k: int = 10,
        exact_search_max: int | None = 8192,
        eps: float = 1e-2,
        policy: str = "top_down",
        relevance: str = "hybrid",
        hybrid_weight: float = 0.5,
        annotation_vectors: str | None = None,
        admissible: str = "all",
        episode_weight: float = 0.0,
        fact_weight: float = 0.6,
        fact_fallback: str = "budget",
        alpha: float = 0.7,
        coverage: float = 1.0,
        semantic_pool: int = 40,
        theme_budget: int = 5,
        semantic_budget: int = 20,
        episode_pool: int = 10,
        episode_budget: int = 10,
        support_weight: float = 0.5,
        tolerance: float = 0.4,
        expand_gain: float = 0.25,
        strict_probes: int = 3,
        patience: int = 2,
        expand_messages: bool = True,
        answer_tokens: int = 32,
        summarizer: Summarizer | None = None,
        summary_chars: int = 200,
        store: str | Path | None = None,
    ) -> None:
        self.boundary = check_choice(boundary, BOUNDARY_MODES, "boundary")
        if boundary == "llm" and llm is None:
            raise LLMRequiredError("boundary='llm' needs an LLM; pass llm=... or use boundary='rule'.")
        if reader is not None and not hasattr(reader, "complete"):
            raise InvalidInputError(
                f"reader must have a complete(prompt) method, got {type(reader).__name__}."
            )
        self.default_policy = check_choice(policy, self.policies, "policy")  # type: ignore[misc]
        self.max_episode_messages = _pos_int(max_episode_messages, "max_episode_messages")
        self.min_episode_messages = _pos_int(min_episode_messages, "min_episode_messages")
        self.drift_threshold = _cosine(drift_threshold, "drift_threshold")
        self.time_gap_minutes = check_finite(time_gap_minutes, "time_gap_minutes")
        if self.time_gap_minutes <= 0:
            raise InvalidInputError("time_gap_minutes must be > 0.")
        self.max_facts = _pos_int(max_facts, "max_facts")
        self.dedup_threshold = _cosine(dedup_threshold, "dedup_threshold")
        self.attach_threshold = _cosine(attach_threshold, "attach_threshold")
        self.merge_threshold = _cosine(merge_threshold, "merge_threshold")
        self.theme_size_cap = _pos_int(theme_size_cap, "theme_size_cap", minimum=2)
        self.tiny_theme_size = _pos_int(tiny_theme_size, "tiny_theme_size")
        self.merge_candidates = _pos_int(merge_candidates, "merge_candidates")
        self.split = bool(split)
        self.merge = bool(merge)
        self.knn_k = _pos_int(knn_k, "knn_k")
        self.exact_search_max = (
            None if exact_search_max is None else _pos_int(exact_search_max, "exact_search_max")
        )
        self.eps = check_finite(eps, "eps")
        if self.eps <= 0:
            raise InvalidInputError("eps must be > 0.")
        options = {
            "admissible": admissible,
            "episode_weight": episode_weight,
            "fact_weight": fact_weight,
            "fact_fallback": fact_fallback,
            "alpha": alpha,
            "coverage": coverage,
            "semantic_pool": semantic_pool,
            "theme_budget": theme_budget,
            "semantic_budget": semantic_budget,
            "episode_pool": episode_pool,
            "episode_budget": episode_budget,
            "support_weight": support_weight,
            "tolerance": tolerance,
            "expand_gain": expand_gain,
            "strict_probes": strict_probes,
            "patience": patience,
            "expand_messages": expand_messages,
        }
        for name, value in options.items():
            setattr(self, name, RETRIEVAL_CHECKS[name](value, name))
        self.answer_tokens = _pos_int(answer_tokens, "answer_tokens")
        self.reader = reader
        self._open: int | None = None
        self._counts: dict[str, int] = {}
        self._cache: _Derived | None = None
        #: retrieval's cached (semantic, message) pairs and the semantics whose ``messages`` changed since
        self._fact_cache: dict[str, Any] | None = None
        self._fact_dirty: set[int] = set()
        self._prefetch: list[str] | None = None
        self._custom_summarizer = summarizer is not None
        #: diagnostics of the last retrieval (policy, selected ids, Stage II probes)
        self.last_trace: dict[str, Any] = {}
        super().__init__(
            embedder,
            llm,
            summarizer=summarizer,
            summary_chars=summary_chars,
            store=store,
            relevance=relevance,
            hybrid_weight=hybrid_weight,
            annotation_vectors=annotation_vectors,
        )

    # ------------------------------------------------------------------ configuration and state
    @classmethod
    def stored_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """A saved configuration completed with :attr:`legacy_config`, without :attr:`obsolete_config`."""
        return {k: v for k, v in super().stored_config(config).items() if k not in cls.obsolete_config}

    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            from ...models.llm_summarizer import LLMSummarizer

            return LLMSummarizer(self.llm, template=P.THEME_USER, system=P.THEME_SYSTEM)
        return super()._default_summarizer()

    def _config(self) -> dict[str, Any]:
        return {
            "boundary": self.boundary,
            "max_episode_messages": self.max_episode_messages,
            "min_episode_messages": self.min_episode_messages,
            "drift_threshold": self.drift_threshold,
            "time_gap_minutes": self.time_gap_minutes,
            "max_facts": self.max_facts,
            "dedup_threshold": self.dedup_threshold,
            "attach_threshold": self.attach_threshold,
            "merge_threshold": self.merge_threshold,
            "theme_size_cap": self.theme_size_cap,
            "tiny_theme_size": self.tiny_theme_size,
            "merge_candidates": self.merge_candidates,
            "split": self.split,
            "merge": self.merge,
            "knn_k": self.knn_k,
            "exact_search_max": self.exact_search_max,
            "eps": self.eps,
            "policy": self.default_policy,
            **self._shared_config(),
            **{
                name: getattr(self, name)
                for name in RETRIEVAL_CHECKS
                if name not in ("relevance", "hybrid_weight")
            },
            "answer_tokens": self.answer_tokens,
            "summary_chars": self.summary_chars,
        }

    def _get_state(self) -> dict[str, Any]:
        # Small on purpose (deep-copied at every transaction): the open episode and counters. The kNN
        # graphs, centroids and vector caches are derived from the store and rebuilt after a rollback.
        return {"open": self._open, "counts": dict(self._counts)}

    def _set_state(self, state: dict[str, Any]) -> None:
        op = state.get("open")
        self._open = None if op is None else int(op)
        self._counts = {str(k): int(v) for k, v in (state.get("counts") or {}).items()}
        self._cache = None
        self._fact_cache = None

    def _initial_state(self) -> dict[str, Any]:
        return {"open": None, "counts": {}}

    def hit(self, nid: int, score: float = 0.0, meta: dict[str, Any] | None = None) -> Hit:
        """Build the :class:`Hit` of node ``nid``.

        ``metadata["level"]`` is the level name (``theme``, ``semantic``, ``episode``, ``message``),
        ``metadata["tokens"]`` the token count of the text and ``metadata["path"]`` the ids of the nodes
        above it that carry text, top first (theme, semantic, episode). A semantic's ``source_ids`` are
        those of the messages it was distilled from (an LLM-written fact: every message of its
        episodes; a rule fact: the message its sentence comes from), a theme's those of its semantics;
        ``metadata["episodes"]`` lists the episodes a semantic or theme is linked to.
        """
        h = super().hit(nid, score, meta)
        st = self._store
        node = st.nodes[nid]
        md = dict(h.metadata)
        md["level"] = LEVEL_NAMES.get(node.level, str(node.level))
        md["tokens"] = count_tokens(node.text)
        md.setdefault("path", self._path(nid))
        src = h.source_ids
        if node.level in (SEMANTIC, THEME):
            leaves = self._source_leaves(nid)
            src = list(dict.fromkeys(sid for lid in leaves for sid in st.source_ids_under(lid)))
            sems = [nid] if node.level == SEMANTIC else list(node.children)
            md["episodes"] = sorted(
                {e for s in sems for e in self._links(s, "episodes") if e in st.nodes},
                key=lambda e: st.nodes[e].span,
            )
        if node.level == EPISODE:
            md["open"] = bool(node.data.get("open", False))
            if node.data.get("title"):
                md["title"] = node.data["title"]
        return dataclasses.replace(h, source_ids=src, metadata=md)

    def _drawn_leaves(self, nid: int) -> list[int]:
        """A semantic's text draws on the messages it was distilled from (a filter checks them too)."""
        return self._fact_messages(nid) if self._store.nodes[nid].level == SEMANTIC else []

    def _source_leaves(self, nid: int) -> list[int]:
        """Leaf ids of the messages a semantic or theme comes from, in insertion order."""
        st = self._store
        node = st.nodes[nid]
        sems = (
            [nid] if node.level == SEMANTIC else [c for c in node.children if st.nodes[c].level == SEMANTIC]
        )
        out = {m for s in sems for m in self._fact_messages(s)}
        return sorted(out, key=lambda m: st.nodes[m].span[0])

    def reassignment_ratio(self) -> float:
        """Share of semantics whose theme changed at least once during construction (Sec. 5.3, Fig. 5).

        Returns:
            A float in [0, 1] (0 when there are no semantics).
        """
        sems = [n for n in self._store.nodes.values() if n.level == SEMANTIC and not n.is_leaf]
        if not sems:
            return 0.0
        return sum(1 for n in sems if int(n.data.get("moves", 0)) > 0) / len(sems)

    def objective(self) -> float | None:
        """``f(P)`` of the current theme partition, or ``None`` without semantics.

        Returns:
            ``SparsityScore + SemScore`` (float) over the themes' semantic vectors.

        References:
            xMemory Sec. 3.2, Eq. (1)-(3).
        """
        with self._lock:
            d = self._derived()
            if not d.theme_stats:
                return None
            return self._objective_with(d, {})

    def _extra_stats(self) -> dict[str, Any]:
        st = self._store
        d = self._derived()
        themes = self._ids_at(THEME)
        sizes = sorted((len(st.nodes[t].children) for t in themes), reverse=True)
        episodes = [e for e in self._ids_at(EPISODE) if not st.nodes[e].data.get("open")]
        open_msgs = len(st.nodes[self._open].children) if self._open in st.nodes else 0
        ep_sizes = [len(st.nodes[e].children) for e in episodes]
        return {
            "episodes": len(episodes),
            "open_episode_messages": open_msgs,
            "mean_episode_messages": float(np.mean(ep_sizes)) if ep_sizes else 0.0,
            "semantics": len(d.sem_ids),
            "themes": len(themes),
            "theme_sizes": sizes,
            "mean_theme_size": float(np.mean(sizes)) if sizes else 0.0,
            "max_theme_size": max(sizes, default=0),
            "reassignment_ratio": self.reassignment_ratio(),
            "objective": self._objective_with(d, {}) if d.theme_stats else None,
            "unfiled_episodes": sum(1 for e in episodes if not st.nodes[e].data.get("semantics")),
            "counts": dict(self._counts),
        }
