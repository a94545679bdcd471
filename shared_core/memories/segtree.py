"""SegTreeMem: a temporally ordered segment tree over a conversation.

Online insertion through the rightmost frontier (paper Sec. 4.2, Appendix A Algorithm 1) and
structure-aware retrieval by relevance propagation (Sec. 4.3, Algorithm 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..models.base import LLM, Embedder, Summarizer
from ..models.extractive import ExtractiveSummarizer, SummaryPool
from ..models.parsing import complete_parsed, parse_label
from ..prompts import fence
from ..prompts import segtree as P
from ..search.index import inner_products
from ..search.relevance import check_weight
from ..search.selection import check_cap
from ..tree.nodes import ChildTexts
from ..tree.propagation import propagate_levelled
from ..types import (
    InvalidInputError,
    LLMRequiredError,
    Message,
    UnknownPolicyError,
    Usage,
    check_branching,
    check_finite,
)
from .base import ADMISSIBLE, RELEVANCE_KINDS, HierarchicalMemory, check_choice
from .registry import register_memory

__all__ = ["SegTreeMem"]

COMPAT_MODELS = ("cosine", "pointwise_llm", "batch_llm")
TOP_DOWN_WEIGHTS = ("inherit", "share")


@register_memory
class SegTreeMem(HierarchicalMemory):
    """Segment-tree memory (SegTreeMem).

    Every node covers a contiguous interval of the conversation; leaves are utterances in arrival
    order, all at one depth; internal nodes carry an annotation of their span. A new utterance becomes
    the rightmost leaf and is attached, through a chain of single-child nodes, to the frontier node the
    compatibility model picks, or under a new root when none is compatible.

    A single-child chain node is an exact copy of the node below it (annotation, span, vector), so it
    is not stored: a node whose parent is ``g + 1`` levels up stands for itself and ``g`` copies, and a
    copy is stored only when it receives a second child. The tree is Algorithm 1's node for node
    (``stats()["tree_nodes"]`` counts the copies, ``stats()["nodes"]`` the stored nodes), retrieval
    propagates over the copies too, and inserting costs time and memory in the stored nodes on the
    frontier rather than in the height, which grows with every NONE decision (App. C.3).

    New segments instead of new roots (``compat="cosine"``, departure from the paper). In the paper an
    utterance that resembles no frontier annotation is a NONE: a new root over the whole tree. Where
    sessions change subject, that is most session openings, and the tree becomes a staircase of nested
    prefixes (App. C.3's cascade). Here such an utterance starts a new segment, as a B-tree
    appends at its right edge: it attaches, over its own chain (so that the turns that follow it can
    join it at level 2), to the lowest frontier node from level 3 up that has fewer than ``branching``
    (B) children; NONE happens only when every one of them has B. An utterance the model finds
    compatible attaches where the paper puts it. On a stream of mutually dissimilar utterances the tree
    is a complete B-ary tree over one-utterance segments, of height ``3 + floor(log_B(T - 2))`` after
    ``T >= 3`` utterances (the paper's rule: height ``T``). ``branching=None`` restores the paper's rule
    exactly; saves made before this option load with it. Measured heights and recall:
    ``docs/evaluation.md``, "SegTreeMem: departures and settings, measured".

    Args:
        embedder: the embedder (default: the embedded all-MiniLM-L6-v2).
        llm: an LLM for annotations and LLM compatibility models, or ``None`` (extractive annotations).
        compat: compatibility model: ``"cosine"`` (default; the annotation of a frontier node whose
            cosine with the utterance is highest and at least ``threshold``, else a new segment, see
            ``branching``), ``"pointwise_llm"`` or ``"batch_llm"`` (need ``llm``; as in the paper, SPLIT
            or no MERGE is NONE, and an answer that cannot be parsed after one retry falls back to the
            paper's cosine model over the candidates not yet rejected).
        threshold: cosine threshold of the ``cosine`` model, a float, default 0.25 (chosen on the dev
            split; the paper gives no value). It sets the tree's shape, because every NONE adds a root
            level (App. C.3).
        branching: the branching factor ``B`` (B-tree order) of the ``cosine`` model, an int >= 2,
            default 8, or ``None``. An utterance below ``threshold`` with every candidate starts a new
            segment under the lowest frontier node from level 3 up with fewer than ``B`` children, and
            is a NONE (new root) only when every such node has ``B``. ``None`` makes it a NONE always:
            the paper's rule, and the value of saves made before this option. The LLM models do not use
            it. 8 sits inside the mean branching of the paper's trees (Table 5: 3.8-9.2).
        max_children: the most children a node may have, an int >= 2, default 64, or ``None`` (no bound:
            the paper's rule, and the value of saves made before this option). An utterance the
            compatibility model attaches to a node that has ``max_children`` children goes one level up
            instead (the lowest frontier node from there with room, else a new root), over its own
            chain, so it starts a new segment right after the full one, which the following compatible
            utterances join: a long run of compatible utterances becomes consecutive segments of at most
            ``max_children``. A departure from Algorithm 1, which bounds neither a segment's length nor
            the work of re-annotating it on every insert; with the bound an insert costs the same at
            any length of conversation. Applies to every compatibility model (``docs/evaluation.md``,
            "SegTreeMem insert cost in a long segment").
        alpha: propagation decay ``α`` in ``[0, 1)``, default 0.1 (the paper's). Saves keep the ``α``
            they were made with.
        horizon: propagation horizon ``H``, default 2.
        k: default evidence budget ``K`` (top-k), default 10.
        relevance: local relevance ``R(q, A(v))``: ``"dense"`` (the paper), ``"bm25"`` or ``"hybrid"``.
        hybrid_weight: weight of the dense part of ``"hybrid"``, default 0.5.
        annotation_vectors: ``"composed"`` or ``"embedded"``: how a summary's vector is made (see
            :class:`~shared_core.memories.base.HierarchicalMemory`); default ``None`` = ``"composed"``
            from sentence vectors pooled from their message's forward pass, so an add costs about one
            embedding of its messages; ``"embedded"`` is the paper's (and saves made before
            the default changed keep it). docs/performance.md, "Bulk add".
        admissible: the admissible set ``𝒢`` of retrieval, ``"all"`` nodes or ``"leaves"`` (default).
        top_down_weights: how ``top_down`` moves a parent's score to its children: ``"share"`` splits it
            equally (the paper's column-normalised ``W_P``) and ``"inherit"`` (default) gives every child
            the whole score, so a leaf scores its own relevance plus ``α`` times its segment's (in a large
            segment ``"share"`` leaves each child almost nothing).
        summarizer: the annotation model S (default: LLM with the App. G prompt, or extractive).
        summary_chars: extractive annotation budget in characters, default 600.
        annotation_words: word budget given to an LLM annotator, default 120.
        segment_cap: segment-diverse top-k, an int >= 1 or ``None`` (default, off): at most this many
            hits from one segment (the hit's ancestor ``segment_depth`` levels below the root) come
            before the rest of the ranking fills ``k``; every policy
            (:meth:`~shared_core.search.ranking.Ranking._shaped`). Not in the paper.
        segment_depth: the depth below the root of the node naming a segment for ``segment_cap``, an
            int >= 1, default 1 (the root's children); a hit not deeper than that is grouped by its
            parent (so a large value groups every leaf by its parent, the lowest segment).
        neighbours: neighbourhood expansion, an int >= 0, default 0 (off): each leaf hit is followed by
            up to this many of its sibling leaves, nearest in turn order first, within the same ``k``
            and ``max_tokens``. Not in the paper.
        exact_search_max: the most indexed nodes ``top_down`` and ``collapsed`` score exhaustively, default
            8192; past it (and past ``48 x 32 (3k + 8)`` nodes, 58,368 for ``k = 10``) they score the
            ``32 (3k + 8)`` nearest nodes from an IVF index over every node and as many best by BM25, their
            ``H`` ancestors and the descendants that could rank among the best (a documented departure:
            docs/performance.md, "Retrieval past a size"). The hits are the exhaustive ones whenever the index
            finds the nearest nodes; their scores are normalised over the scored nodes. ``None``: every node
            at any size (and saves made before the option).

        policy: the default retrieval policy: ``"collapsed"`` (default; Algorithm 2 with ``H = 0``: the
            ``admissible`` nodes ranked by their own relevance), ``"top_down"`` (Algorithm 2: relevance
            propagated from the annotations down to the nodes below them, the paper's retrieval and the
            value of saves made before this option) or ``"bottom_up"``. ``collapsed`` is the default
            because propagation's share of recall is not measurably above 0 on the dev or the validate
            split (docs/evaluation.md, "Validate, on this protocol").

    Policies: ``collapsed`` (H = 0, default), ``top_down`` (parent to children), ``bottom_up`` (child to
    parent).

    Raises:
        InvalidInputError: a parameter out of range (e.g. ``branching`` or ``max_children`` not ``None``
            or an int >= 2).
        UnknownPolicyError: an unknown ``compat``, ``relevance``, ``admissible`` or ``policy``.
        LLMRequiredError: an LLM compatibility model without ``llm``.

    References:
        "SegTreeMem" paper (shared/seeds/segtreemem-paper.txt): Sec. 4.1-4.3; Appendix A, Algorithms 1-2;
        Appendix G.1 prompts; Appendix C.1 Table 5 (tree shapes), C.3 worst case. B-trees: Bayer and
        McCreight, "Organization and maintenance of large ordered indexes" (1972).
    """

    kind = "segtree"
    policies = ("collapsed", "top_down", "bottom_up")
    default_policy = "collapsed"
    tree_policy: ClassVar[str | None] = "top_down"
    contiguous_spans = True
    prefetch_messages = True
    #: saves made before ``branching`` existed put every dissimilar utterance under a new root, those
    #: made before ``max_children`` existed bound no segment, and those made before ``policy`` existed
    #: retrieve with ``top_down``
    default_annotation_vectors: ClassVar[str] = "composed"
    default_sentence_vectors: ClassVar[str] = "pooled"
    legacy_config: ClassVar[dict[str, Any]] = {
        "branching": None,
        "max_children": None,
        "exact_search_max": None,
        "policy": "top_down",
    }

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        compat: str = "cosine",
        threshold: float = 0.25,
        branching: int | None = 8,
        max_children: int | None = 64,
        alpha: float = 0.1,
        horizon: int = 2,
        k: int = 10,
        relevance: str = "hybrid",
        hybrid_weight: float = 0.5,
        annotation_vectors: str | None = None,
        admissible: str = "leaves",
        top_down_weights: str = "inherit",
        summarizer: Summarizer | None = None,
        summary_chars: int = 600,
        annotation_words: int = 120,
        store: str | Path | None = None,
        segment_cap: int | None = None,
        segment_depth: int = 1,
        neighbours: int = 0,
        exact_search_max: int | None = 8192,
        policy: str = "collapsed",
    ) -> None:
        self.default_policy = check_choice(policy, self.policies, "policy")  # type: ignore[misc]
        if compat not in COMPAT_MODELS:
            raise UnknownPolicyError(f"compat must be one of {COMPAT_MODELS}, got {compat!r}.")
        if compat != "cosine" and llm is None:
            raise LLMRequiredError(f"compat={compat!r} needs an LLM; pass llm=... or use compat='cosine'.")
        self.compat = compat
        self.threshold = check_finite(threshold, "threshold")
        self.branching = check_branching(branching, "the paper's new root for every dissimilar utterance")
        if max_children is not None and (
            isinstance(max_children, bool) or not hasattr(max_children, "__index__") or int(max_children) < 2
        ):
            raise InvalidInputError(f"max_children must be an int >= 2 or None, got {max_children!r}.")
        self.max_children = None if max_children is None else int(max_children)
        self.alpha = self._check_alpha(alpha)
        self.horizon = self._check_horizon(horizon)
        if isinstance(k, bool) or int(k) < 1:
            raise InvalidInputError("k must be a positive integer.")
        self.k = int(k)
        self.admissible = check_choice(admissible, ADMISSIBLE, "admissible")
        if top_down_weights not in TOP_DOWN_WEIGHTS:
            raise UnknownPolicyError(
                f"top_down_weights must be one of {TOP_DOWN_WEIGHTS}, got {top_down_weights!r}."
            )
        self.top_down_weights = top_down_weights
        self.exact_search_max = self._check_search_max(exact_search_max)
        self.annotation_words = int(annotation_words)
        self.segment_cap = check_cap(segment_cap, "segment_cap")
        self.segment_depth = check_cap(segment_depth, "segment_depth", optional=False)  # type: ignore[assignment]
        self.neighbours = check_cap(neighbours, "neighbours", minimum=0, optional=False)  # type: ignore[assignment]
        self._decisions: dict[str, int] = {}
        self._pools: dict[int, SummaryPool] = {}  # frontier nodes' annotation state (see _annotate)
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
        self.default_k = self.k  # type: ignore[misc]

    @staticmethod
    def _check_alpha(alpha: float) -> float:
        alpha = check_finite(alpha, "alpha")
        if not 0.0 <= alpha < 1.0:
            raise InvalidInputError(f"alpha must be in [0, 1), got {alpha}.")
        return alpha

    @staticmethod
    def _check_horizon(horizon: int) -> int:
        if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 0:
            raise InvalidInputError(f"horizon must be a non-negative integer, got {horizon!r}.")
        return int(horizon)

    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            from ..models.llm_summarizer import LLMSummarizer

            return LLMSummarizer(self.llm, template=P.ANNOTATION_USER, system=P.ANNOTATION_SYSTEM)
        return super()._default_summarizer()

    def _config(self) -> dict[str, Any]:
        return {
            "compat": self.compat,
            "threshold": self.threshold,
            "branching": self.branching,
            "max_children": self.max_children,
            "alpha": self.alpha,
            "horizon": self.horizon,
            "k": self.k,
            **self._shared_config(),
            "admissible": self.admissible,
            "top_down_weights": self.top_down_weights,
            "summary_chars": self.summary_chars,
            "annotation_words": self.annotation_words,
            "segment_cap": self.segment_cap,
            "segment_depth": self.segment_depth,
            "neighbours": self.neighbours,
            "exact_search_max": self.exact_search_max,
            "policy": self.default_policy,
        }

    def _get_state(self) -> dict[str, Any]:
        return {"decisions": dict(self._decisions)}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._decisions = dict(state.get("decisions", {}))
        self._pools = {}  # a rollback, a load or another process's commits: the tree changed under them

    # ------------------------------------------------------------------ construction (Algorithm 1)
    def frontier(self) -> list[int]:
        """The rightmost frontier ``F_t = (f_1, ..., f_m)``: one node id per level, from the rightmost leaf
        (level 1) up to the root (level ``m``).

        Single-child chain nodes are not stored: a node whose parent is more than one level above it
        stands for itself and for the single-child copies of it in between (same annotation, same span,
        same vector), so a level held by such a copy repeats the id of the node it copies.

        References:
            Sec. 4.2, Eq. (2); Appendix A, Algorithm 1 (chains, lines 10 and 15).
        """
        st = self._store
        if st.root is None:
            return []
        path = [st.root]
        while st.nodes[path[-1]].children:
            path.append(st.nodes[path[-1]].children[-1])
        out: list[int] = []
        for j in range(len(path) - 1, -1, -1):  # leaf first
            nid = path[j]
            top = st.nodes[path[j - 1]].level - 1 if j > 0 else st.nodes[nid].level
            out.extend([nid] * (top - st.nodes[nid].level + 1))
        return out

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        st = self._store
        text = message.render()
        leaf = st.new_node(text=text, is_leaf=True, message=message, level=1)  # line 3: A(z) = x
        self._set_vector(leaf.id, self._embed([text], usage)[0])
        if st.root is None:  # lines 4-6
            st.set_root(leaf.id)
            return {"attach_level": None, "decision": "first"}
        F = self.frontier()  # line 7
        m = len(F)
        ell = self._compatibility(text, leaf.id, F[1:], usage)  # line 8: None or 2..m
        kind = "merge"
        if ell is None and self.compat == "cosine" and self.branching is not None:
            ell = self._segment_level(F)  # a new segment rather than a new root, while there is room
            kind = "segment"
        if ell is not None and self.max_children is not None:
            up = self._room_from(F, ell)  # a full segment is continued by a new one after it
            if up != ell:
                ell, kind = up, "split"
        if ell is not None:  # lines 9-12; the chain of ell - 2 copies above the leaf is implicit
            target = self._stored_at(F[ell - 1], ell)
            st.add_child(target, leaf.id)
            update = [target, *st.ancestors(target)]
            decision = f"{kind}_{ell}"
        else:  # lines 13-17; the chain of m - 1 copies above the leaf is implicit
            old_root = st.root
            assert old_root is not None
            root = st.new_node(level=m + 1)
            st.add_child(root.id, old_root)
            st.set_root(root.id)
            st.add_child(root.id, leaf.id)
            update = [root.id]
            decision = "none"
        for u in update:  # lines 19-22, bottom-up (copies follow the node they copy)
            st.refresh_span(u, ordered=True)
            self._annotate(u, usage)
        # only frontier nodes change; the others' pools would only hold memory
        self._pools = {u: self._pools[u] for u in update if u in self._pools}
        self._decisions[decision] = self._decisions.get(decision, 0) + 1
        return {"attach_level": ell, "decision": decision, "frontier_size": m}

    def _segment_level(self, F: list[int]) -> int | None:
        """Where an utterance compatible with no frontier node starts a new segment, or ``None`` (NONE).

        The lowest level ``ℓ`` in ``3..m`` whose frontier node has fewer than ``branching`` children (a
        level held by an implicit single-child copy has one). Attaching at ``ℓ >= 3`` gives the new
        leaf its own chain, so its level-2 copy is a segment of its own that the following turns can
        join; the tree grows a level only when every frontier node from level 3 up is full, as a B-tree
        grows only when the root splits.

        Args:
            F: the frontier ``(f_1, ..., f_m)``, leaf first (:meth:`frontier`).

        Returns:
            ``ℓ`` in ``3..m``, or ``None`` when every frontier node from level 3 up has ``branching``
            children (or ``m < 3``).

        References:
            Sec. 4.2, Eq. (2); Appendix A, Algorithm 1, lines 9-17; App. C.3 (the cascade it avoids).
        """
        st = self._store
        assert self.branching is not None
        for level in range(3, len(F) + 1):
            node = st.nodes[F[level - 1]]
            fanout = len(node.children) if node.level == level else 1
            if fanout < self.branching:
                return level
        return None

    def _room_from(self, F: list[int], ell: int) -> int | None:
        """The lowest level from ``ell`` up whose frontier node has fewer than ``max_children`` children,
        or ``None`` (NONE) when every one of them is full.

        Attaching one level above a full segment gives the utterance its own chain, so its copy at the
        full segment's level starts the segment's continuation, next to it and contiguous with it, which
        the following compatible utterances join. A departure from Algorithm 1 (line 9 attaches at
        ``ℓ*`` whatever its size), so that no node has more than ``max_children`` children.

        References:
            Appendix A, Algorithm 1, lines 8-17.
        """
        st = self._store
        assert self.max_children is not None
        for level in range(ell, len(F) + 1):
            node = st.nodes[F[level - 1]]
            fanout = len(node.children) if node.level == level else 1
            if fanout < self.max_children:
                return level
        return None

    def _stored_at(self, nid: int, level: int) -> int:
        """The stored node for frontier level ``level``, held by ``nid`` or by a copy of it.

        When the level is one of ``nid``'s implicit single-child copies, that copy is stored now (it is
        about to get a second child): a node at ``level`` with ``nid`` as its only child takes ``nid``'s
        place under its parent, with ``nid``'s annotation and span. Its vector is made for its text when
        the insertion's vectors are (an internal node's, composed by default), not taken from ``nid``: a
        leaf's embedded vector would otherwise stay on a summary whose text its second child leaves
        unchanged.
        """
        st = self._store
        node = st.nodes[nid]
        if node.level == level:
            return nid
        parent = node.parent
        assert parent is not None and node.level < level < st.nodes[parent].level
        copy = st.new_node(text=node.text, level=level, span=node.span)
        st.detach(nid)
        st.add_child(parent, copy.id)
        st.add_child(copy.id, nid)
        return copy.id

    def _annotate(self, nid: int, usage: Usage) -> None:
        """Annotate ``nid`` from its children (Algorithm 1, line 21): ``A(v) = S(children)``.

        With the extractive summariser the node keeps a :class:`~shared_core.models.extractive.SummaryPool`
        while it is on the frontier: an insertion appends a child or changes the last one (the only
        children that change), so the annotation costs the changed child's sentences and one vectorised
        scoring instead of splitting and ranking every sentence of every child. The annotation is the
        one ``summarize`` makes from all the children. A pool that does not match the node's children
        (after a deletion, a rollback, a load, another process's commits) is rebuilt from them.
        """
        st = self._store
        children = st.nodes[nid].children
        if len(children) == 1:
            st.set_text(nid, st.nodes[children[0]].text)
            return
        if not self._pooled():
            text, u = self.summarizer.summarize(ChildTexts(st, nid), max_words=self.annotation_words)
        else:
            text, u = self._pool(nid, children).summary()
        usage += u
        st.set_text(nid, text)

    def _pooled(self) -> bool:
        """Whether annotations are kept incrementally: the summariser is an ``ExtractiveSummarizer`` whose
        ``summarize`` is the class's own (not overridden, nor replaced on the instance)."""
        fn = getattr(getattr(self.summarizer, "summarize", None), "__func__", None)
        return isinstance(self.summarizer, ExtractiveSummarizer) and fn is ExtractiveSummarizer.summarize

    def _pool(self, nid: int, children: list[int]) -> SummaryPool:
        """The pool of ``nid`` brought up to date with ``children``: the last child replaced when its id or
        text changed and a new child appended; any other difference rebuilds it from the children."""
        nodes = self._store.nodes
        pool = self._pools.get(nid)
        k = len(pool) if pool is not None else 0
        ok = pool is not None and k >= 1 and len(children) in (k, k + 1)
        if ok and k >= 2:
            before = pool.children[k - 2]  # type: ignore[union-attr]
            ok = before.key == children[k - 2] and before.text == nodes[children[k - 2]].text
        if not ok or pool is None:
            pool = self.summarizer.pool()  # type: ignore[attr-defined]
            for c in children:
                pool.append(nodes[c].text, c)
            self._pools[nid] = pool
            return pool
        last = pool.children[-1]
        if last.key != children[k - 1] or last.text != nodes[children[k - 1]].text:
            pool.pop()
            pool.append(nodes[children[k - 1]].text, children[k - 1])
        if len(children) == k + 1:
            pool.append(nodes[children[k]].text, children[k])
        return pool

    def _reannotate(self, nid: int, usage: Usage) -> None:
        self._pools = {}  # a deletion changes children anywhere: rebuild pools when next needed
        self._annotate(nid, usage)

    def _forget_texts(self, texts: Any, changed: set[int], gone: set[int]) -> None:
        self._pools = {}  # no deleted sentence stays in a pool
        super()._forget_texts(texts, changed, gone)

    def _forget_all(self, old: Any) -> None:
        self._pools = {}
        super()._forget_all(old)

    def _compatibility(self, text: str, leaf_id: int, cands: list[int], usage: Usage) -> int | None:
        """The compatibility model C: ``ℓ*`` in ``2..m`` (``cands[i]`` is level ``i + 2``) or ``None``.

        The LLM models are asked about distinct annotations only: a single-child chain node carries its
        child's annotation, so a tall frontier repeats the same text many times, and a repeated text gets
        the answer of its lowest occurrence (as ``argmax`` does for ``cosine``: the first of equal
        maxima). This keeps a pointwise insertion to one question per distinct candidate.

        An answer that cannot be parsed after one retry falls back to the paper's cosine model: over
        every candidate for ``batch_llm``, over the candidates from the unparsed one up for
        ``pointwise_llm`` (those below it were answered CONTINUE).
        """
        if not cands:
            return None
        if self.compat == "cosine":
            return self._cosine_compat(leaf_id, cands)
        assert self.llm is not None
        seen: set[str] = set()
        levels: list[int] = []  # the level of each distinct candidate, lowest occurrence
        distinct: list[int] = []
        for i, c in enumerate(cands):
            t = self._store.nodes[c].text
            if t not in seen:
                seen.add(t)
                levels.append(i + 2)
                distinct.append(c)
        if self.compat == "pointwise_llm":
            for level, c in zip(levels, distinct):
                prompt = P.POINTWISE_USER.format(
                    candidate=fence(self._store.nodes[c].text), utterance=fence(text)
                )
                res = complete_parsed(
                    self.llm,
                    prompt,
                    lambda s: parse_label(s, ("MERGE", "CONTINUE")),
                    system=P.POINTWISE_SYSTEM,
                    max_tokens=5,
                    fallback=None,
                )
                usage += res.usage
                if not res.ok:
                    self._decisions["parse_fallbacks"] = self._decisions.get("parse_fallbacks", 0) + 1
                    return self._cosine_compat(leaf_id, cands, first=level)
                if res.value == "MERGE":
                    return level
            return None
        labels = [f"MERGE_{i + 1}" for i in range(len(distinct))]
        block = "\n\n".join(
            P.BATCH_CANDIDATE.format(i=i + 1, text=fence(self._store.nodes[c].text))
            for i, c in enumerate(distinct)
        )
        prompt = P.BATCH_USER.format(candidates=block, utterance=fence(text), labels=", ".join(labels))
        res = complete_parsed(
            self.llm,
            prompt,
            lambda s: parse_label(s, (*labels, "SPLIT")),
            system=P.BATCH_SYSTEM,
            max_tokens=8,
            fallback=None,
        )
        usage += res.usage
        if not res.ok or res.value is None:
            self._decisions["parse_fallbacks"] = self._decisions.get("parse_fallbacks", 0) + 1
            return self._cosine_compat(leaf_id, cands)
        if res.value == "SPLIT":
            return None
        return levels[int(res.value.split("_")[1]) - 1]

    def _cosine_compat(self, leaf_id: int, cands: list[int], first: int = 2) -> int | None:
        """The paper's cosine model over the candidates at levels ``first..m``: the level of the most
        similar annotation (the lowest of equal maxima) when its cosine is at least ``threshold``, else
        ``None`` (NONE). ``cands[i]`` is level ``i + 2``."""
        pool = cands[first - 2 :]
        distinct = list(dict.fromkeys(pool))  # bottom-up; a repeated id is one node and its copies
        sims = inner_products(self._vectors(distinct), self._vector(leaf_id))
        best = int(np.argmax(sims))  # the first of equal maxima: the lowest level
        return pool.index(distinct[best]) + first if float(sims[best]) >= self.threshold else None

    # ------------------------------------------------------------------ retrieval (Algorithm 2)
    def scores(
        self,
        query: str,
        policy: str | None = None,
        *,
        alpha: float | None = None,
        horizon: int | None = None,
        relevance: str | None = None,
        hybrid_weight: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Final structure-aware scores ``s~_q`` of every stored node (Algorithm 2, lines 3-13).

        The propagation runs over Algorithm 1's whole tree, implicit single-child copies included
        (:func:`~shared_core.tree.propagation.propagate_levelled`); the scores of the stored nodes are
        returned.

        Args:
            query: the query text.
            policy: ``"collapsed"``, ``"top_down"`` or ``"bottom_up"`` (default: the memory's).
            alpha: overrides the memory's ``alpha`` for this call.
            horizon: overrides the memory's ``horizon``.
            relevance: overrides the memory's ``relevance``.
            hybrid_weight: overrides the memory's ``hybrid_weight``.

        Returns:
            ``(ids int64 (n,), scores float64 (n,))`` over the ``n`` stored nodes.

        Raises:
            UnknownPolicyError: an unknown policy or relevance.
            InvalidInputError: ``alpha`` outside ``[0, 1)`` or a negative ``horizon``.
        """
        ids, s, _, _ = self._propagated(query, policy, alpha, horizon, relevance, hybrid_weight, copies=False)
        return ids, s

    def _propagated(
        self,
        query: str,
        policy: str | None,
        alpha: float | None,
        horizon: int | None,
        relevance: str | None,
        hybrid_weight: float | None,
        copies: bool = True,
        qvec: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, scores, best, leaf)``: :meth:`scores`, the best score among each node and its copies
        (``scores`` itself when ``copies`` is false), and the leaf mask, all over the stored nodes."""
        policy = policy or self.default_policy
        if policy not in self.policies:
            raise UnknownPolicyError(f"SegTreeMem has no policy {policy!r}; choose one of {self.policies}.")
        alpha = self.alpha if alpha is None else self._check_alpha(alpha)
        horizon = self.horizon if horizon is None else self._check_horizon(horizon)
        if policy == "collapsed":  # H = 0; a bad horizon is still refused
            horizon = 0
        with self._lock:
            ids, r = self.relevance(query, relevance, hybrid_weight, qvec=qvec[0] if qvec else None)
            if len(ids) == 0:
                empty = np.zeros(0)
                return ids, empty, empty, np.zeros(0, dtype=bool)
            parent, leaf, gap = self._structure(ids)
        direction = "top_down" if policy == "collapsed" else policy
        s, best = propagate_levelled(
            parent,
            gap,
            r,
            direction,
            alpha,
            horizon,
            normalize=self.top_down_weights == "share",
            with_copies=copies,
        )
        return ids, s, best, leaf

    def _retrieve(
        self,
        query: str,
        policy: str,
        k: int,
        alpha: float | None = None,
        horizon: int | None = None,
        relevance: str | None = None,
        hybrid_weight: float | None = None,
        admissible: str | None = None,
    ) -> list[tuple[int, float, dict[str, Any]]]:
        admissible = (
            self.admissible if admissible is None else check_choice(admissible, ADMISSIBLE, "admissible")
        )
        qvec: list[np.ndarray] = []  # the query vector, once embedded
        found = self._over_candidates(
            query, policy, k, alpha, horizon, relevance, hybrid_weight, admissible, qvec
        )
        if found is not None:
            return found
        ids, s, best, leaf = self._propagated(
            query, policy, alpha, horizon, relevance, hybrid_weight, copies=admissible == "all", qvec=qvec
        )
        if len(ids) == 0:
            return []
        if admissible == "leaves":  # line 14: TopK over 𝒢
            return self._ranked(ids, s, k, {"policy": policy}, leaf)
        # a node's copies share its text: it ranks with the best score among them
        return self._ranked(ids, best, k, {"policy": policy})

    def _over_candidates(
        self,
        query: str,
        policy: str,
        k: int,
        alpha: float | None,
        horizon: int | None,
        relevance: str | None,
        hybrid_weight: float | None,
        admissible: str,
        qvec: list[np.ndarray],
    ) -> list[tuple[int, float, dict[str, Any]]] | None:
        """``top_down`` (and ``collapsed``, its ``H = 0``) over candidates past :attr:`exact_search_max`
        nodes (:meth:`~shared_core.search.ranking.Ranking._top_down_over_candidates`), or ``None``: the
        exhaustive path (``bottom_up``, ``top_down_weights="share"``, ``bm25``, a small memory, or a
        walk the candidates cannot finish; the query vector it embedded is left in ``qvec``)."""
        if policy not in ("top_down", "collapsed") or self._search_max() is None:
            return None
        if policy == "top_down" and self.top_down_weights != "inherit":
            return None
        kind = (
            self.relevance_kind
            if relevance is None
            else check_choice(relevance, RELEVANCE_KINDS, "relevance")
        )
        if kind == "bm25" or self._index is None:
            return None
        a = self.alpha if alpha is None else self._check_alpha(alpha)
        h = self.horizon if horizon is None else self._check_horizon(horizon)
        h = 0 if policy == "collapsed" else h
        w = self.hybrid_weight if hybrid_weight is None else check_weight(hybrid_weight)
        copies = admissible == "all"

        def propagate(
            parent: np.ndarray, gap: np.ndarray, r: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray, float]:
            total = float((np.asarray(r, dtype=np.float64) * (1.0 + gap)).sum())
            s, best = propagate_levelled(
                parent, gap, r, "top_down", a, h, normalize=False, with_copies=copies
            )
            return s, best, total

        with self._lock:
            qvec.append(self._embed_query(query))
            sc = self._top_down_over_candidates(
                query, kind, w, a, h, k, qvec[0], propagate, leaves_only=not copies, use_best=copies
            )
            if sc is None:
                return None
            return self._ranked_over(sc, k, {"policy": policy}, leaves_only=not copies, use_best=copies)

    def _depth(self, nid: int) -> int:
        """Depth in the levelled tree (single-child copies counted): root level minus the node's level."""
        st = self._store
        assert st.root is not None
        return st.nodes[st.root].level - st.nodes[nid].level

    # ------------------------------------------------------------------ statistics
    def _extra_stats(self) -> dict[str, Any]:
        st = self._store
        T = st.n_leaves
        root = st.nodes.get(st.root) if st.root is not None else None
        implicit = 0  # single-child copies that are not stored (see frontier())
        stored_chain = 0
        for n in st.nodes.values():
            if n.parent is not None:
                implicit += st.nodes[n.parent].level - n.level - 1
            if not n.is_leaf and len(n.children) == 1:
                stored_chain += 1
        tree_nodes = len(st.nodes) + implicit
        internal = tree_nodes - T
        height = root.level if root is not None else 0
        out: dict[str, Any] = {
            "height": height,
            "frontier_size": len(self.frontier()),
            "decisions": dict(self._decisions),
            "tree_nodes": tree_nodes,
            "chain_nodes": stored_chain + implicit,
            "implicit_chain_nodes": implicit,
            "nodes_per_leaf": (tree_nodes / T) if T else 0.0,
            "worst_case_nodes": T * (T + 1) // 2,
        }
        if root is not None:  # the levelled tree: every leaf at depth height - 1
            out["max_depth"] = height - 1
            out["mean_depth"] = float(height - 1)
            out["mean_branching"] = (tree_nodes - 1) / internal if internal else 0.0
        return out
