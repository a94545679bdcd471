"""MemTree: a semantic tree memory with online top-down insertion and collapsed retrieval.

A new message descends from the structural root towards the most similar child while that child's
cosine similarity passes the depth-adaptive threshold ``θ(d) = base_threshold · exp(rate · d / h)``;
it expands the leaf it reaches into a parent of the old and the new message, or hangs under the last
node whose children are all too dissimilar. Every node on the path is re-aggregated with the new content
(``Aggregate(c_v, c_new | n)``) and re-embedded. Retrieval scores every node at once (``collapsed``) or
descends the tree keeping the top-k children per level (``traversal``).

References:
    "From Isolated Conversations to Hierarchical Schemas: Dynamic Tree Memory Representation for LLMs"
    (MemTree; shared/seeds/memtree-paper.txt): Sec. 3.1 (update), Sec. 3.2 (collapsed retrieval),
    App. A.1.1 (Algorithm 1), A.1.2 (aggregate prompt), A.1.3 (adaptive threshold), A.3.4 (LLM calls per
    insertion), A.3.5 (traversal retrieval), A.3.6 Table A.3 (tree statistics); the MemTreeModule
    configuration page (shared/seeds/memtree-module-config-doc.txt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..models.base import LLM, Embedder, Summarizer
from ..search.index import inner_products
from ..search.ranking import best_first
from ..search.relevance import check_weight
from ..tree.propagation import check_alpha, check_horizon
from ..types import InvalidInputError, Message, ModelError, Usage, check_branching, check_finite
from .base import ADMISSIBLE, HierarchicalMemory, TokenBudget, check_choice
from .memtree_config import (
    _RETRIEVE_PARAMS,
    MemTreeAggregator,
    _check_max_depth,
    _check_threshold,
    _positive_int,
    module_arguments,
)
from .memtree_routes import RouteCache
from .memtree_vectors import AnchoredSummaryVectors, check_reembed_cosine
from .registry import register_memory

__all__ = ["MemTree", "MemTreeAggregator"]


@register_memory
class MemTree(AnchoredSummaryVectors, RouteCache, HierarchicalMemory):
    """MemTree: a dynamic semantic tree of aggregated memories.

    The root is structural (text ``""``, never indexed or returned). Leaves hold the messages; every
    other node holds an aggregate of the entries below it, and its embedding.

    **Insertion** (Sec. 3.1; App. A.1.1, A.1.3). At node ``v`` of depth ``d`` (root 0) the new embedding
    is compared with ``v``'s children; ``θ(d) = base_threshold · exp(rate · d / h)``. If the most similar
    child reaches ``θ(d)`` (``s_max >= θ(d)``, ties to the older child) it is on the path: an internal
    child is descended into; a leaf child is expanded into a new internal node whose children are that
    leaf (unchanged: its id, message and source id stay) and the new leaf, with text
    ``Aggregate(old, new | n=1)``. If no child reaches ``θ(d)`` the new leaf hangs under ``v`` — unless
    ``v`` already has ``branching`` children: then the most similar child is on the path all the same
    (see below); if descending would put a node deeper than ``max_depth``, the leaf hangs under ``v`` in
    any case. Every internal node on the path except the root (including the one the leaf hangs under)
    gets ``Aggregate(c_v, c_new | n)`` with the raw new content and ``n`` = the number of entries
    (leaves) under ``v`` before this insert, then a new embedding.
    All aggregations (independent of each other) run first — concurrently in a thread pool of
    ``max_workers`` when an LLM is configured, so an insert costs about one LLM round-trip of wall time —
    then all new texts are embedded in one batch, and only then is the tree changed; any error leaves the
    memory as it was.

    Algorithm 1 (lines 5-7) turns the reached leaf itself into the parent and creates a new child holding
    the original content; this class builds the same shape but keeps the leaf node as the leaf (node ids
    stay attached to their messages, so hits, source ids and deletion by id stay right) and puts a new
    internal node in its place. Algorithm 1 (line 12) also aggregates the root and not the node the leaf
    is finally attached to; Sec. 3.1 ("all parent nodes along the traversal path") is followed instead.

    **Aggregation without an LLM**: the extractive summariser over ``[existing text, new text]`` (the most
    central sentences of both within ``summary_chars``), so a node's text only ever holds sentences of the
    messages below it; ``n`` is passed as the field ``entries`` and ignored.

    **Retrieval.** Every node is scored with the memory's ``relevance`` (the base class's one relevance
    layer: ``"dense"`` cosine, ``"bm25"`` or ``"hybrid"``, each part divided by its maximum over the
    nodes). ``collapsed`` (default; Sec. 3.2; App. A.3.5) ranks the ``admissible`` nodes by their own
    relevance, best first — message leaves by default, so the evidence is the messages themselves; with
    ``relevance="dense"`` it is the paper's collapsed retrieval: cosine of the query with every node, drop
    nodes below ``threshold``. ``top_down`` first lets every summary pass its score down to the nodes below
    it (SegTreeMem's relevance propagation, Algorithm 2, with each child inheriting its parent's whole
    score: ``s = sum_{k<=H} alpha^k W^k s0 / sum alpha^k``), so a leaf ranks higher when the topic
    summaries above it match the query too. Both keep at
    most ``k`` hits and at most ``max_context`` characters of returned text (a hit that would exceed the
    budget is skipped; later, shorter ones may still fit; repeated texts are returned once); the
    cosine ``threshold`` applies to ``collapsed`` and ``traversal`` with ``relevance="dense"`` only (a
    hybrid or BM25 score is not a cosine, and ``top_down`` ranks a message by the summaries above it
    as well as by its own text). ``traversal``: from the root, keep the ``k`` children with the highest
    cosine among the children of the nodes kept at the previous level, down to the leaves; the visited
    nodes are ranked by cosine and the same ``threshold`` / ``k`` / ``max_context`` selection applies.
    Every hit carries its ``path`` (the ids of the summaries above it, top first) in its metadata.
    ``retrieve(query, k=..., threshold=..., max_context=..., alpha=..., horizon=..., relevance=...,
    hybrid_weight=..., admissible=...)`` overrides them per call.

    **Departure from the paper, and why.** The paper ranks summaries and messages together by cosine
    alone (``collapsed``, dense, every node); with the embedded defaults (no LLM) that returns summaries
    that cost the ``k`` budget without naming the evidence turns, and MiniLM alone misses names and dates.
    The default is ``collapsed`` over ``hybrid`` relevance with message leaves as the admissible set;
    ``top_down`` (propagation from the summaries) is not measurably better on the dev or the validate
    split (docs/evaluation.md, "Validate, on this protocol", and "MemTree: departures and settings,
    measured"). ``MemTree(relevance="dense", admissible="all")`` (what :meth:`from_config` builds, and
    what saves made before these options load as) is the paper's retrieval exactly.

    **Departure: a bounded fan-out** (``branching``, default 256). The paper attaches every message that
    reaches no child's ``θ(d)`` under ``v``, so a node's fan-out has no bound: the root gathers a fixed
    share of the messages, and every insert compares the new message with all of them. With a bound, a
    node that has ``branching`` children takes no more: the message goes down into its most similar
    child as if that child had reached ``θ(d)`` (``report.details[0]["forced"]`` counts such steps), so
    fan-outs stay at most ``branching``. ``max_depth`` wins over the bound (a node at the depth cap takes
    the leaf). ``branching=None`` is the paper's rule; saves made before this option load with it.

    **Departure: summary vectors are composed** (``annotation_vectors="composed"``, the default: the mean of
    the summary's sentences' vectors, pooled from their messages' forward pass; docs/performance.md, "Bulk
    add"). **With ``annotation_vectors="embedded"``, a path summary is embedded again only when its text
    has drifted** (``reembed_cosine``, default 0.95; the paper embeds every rewritten summary, Sec. 3.1).
    With the extractive aggregate a
    rewritten summary whose composed vector (mean of its sentences' cached vectors) keeps a cosine of at
    least ``reembed_cosine`` with that of the text it was last embedded with gets that embedding moved by
    the change of the composed vector, ``normalise(e_a + c - c_a)``
    (:mod:`~shared_core.memories.memtree_vectors`); otherwise it is embedded (docs/evaluation.md, "MemTree:
    re-embedding drifted summaries only"). An LLM
    aggregate, ``annotation_vectors="composed"`` or ``reembed_cosine=None`` (what :meth:`from_config` and
    saves made before this option use) embed as before.

    **Deletion**. Deleting a leaf removes it; an internal node left with a single child is collapsed
    (the child takes its place, one level up, so every internal node but the root keeps at least two
    children, as insertion guarantees); then every remaining ancestor is re-aggregated bottom-up from its
    children's texts (``summarize(children, entries=n, rebuild=True)``; with the extractive summariser no
    sentence of a deleted message survives) and re-embedded (exactly, whatever ``reembed_cosine``).

    Args:
        embedder: the embedder (default: the embedded all-MiniLM-L6-v2, 384-d).
        llm: an LLM for the aggregate function (A.1.2 prompt), or ``None`` (extractive aggregation).
        base_threshold: ``θ_0`` of the adaptive threshold, default 0.4 (App. A.1.3).
        rate: ``λ`` of the adaptive threshold, default 0.5 (App. A.1.3).
        height: ``h`` in ``θ(d)``; ``None`` (default) = the current tree height (the depth of the deepest
            node, at least 1); an int >= 1 fixes it.
        max_depth: deepest allowed node depth (root 0), ``-1`` (default) for unlimited; ``1`` gives a flat
            list under the root.
        k: default number of hits (MemTreeModule ``top``), default 3.
        threshold: retrieval cosine cut-off in ``[-1, 1]``, default 0.2 (applies with
            ``relevance="dense"``).
        max_context: budget of returned text in characters, default 10,000.
        max_workers: threads for concurrent aggregations when an LLM is used, default 8 (1 = sequential).
        summarizer: the aggregate function, called as ``summarize([existing, new], entries=n)``; default
            :class:`MemTreeAggregator` with ``llm``, else :class:`ExtractiveSummarizer`.
        summary_chars: extractive summary budget in characters, default 600.
        relevance: local relevance of a node, ``"hybrid"`` (default), ``"dense"`` (the paper) or
            ``"bm25"``.
        hybrid_weight: weight of the dense part of ``"hybrid"``, in ``[0, 1]``, default 0.5.
        annotation_vectors: ``"composed"`` or ``"embedded"``: how a summary's vector is made (see
            :class:`~shared_core.memories.base.HierarchicalMemory`); default ``None`` = ``"composed"``
            from sentence vectors pooled from their message's forward pass, so an add costs about one
            embedding of its messages; ``"embedded"`` is the paper's (and saves made before
            the default changed keep it). docs/performance.md, "Bulk add".
        alpha: ``top_down`` propagation decay in ``[0, 1)``, default 0.1 (SegTreeMem's, the paper's
            value).
        horizon: ``top_down`` propagation horizon ``H >= 0``, default 2 (SegTreeMem's default).
        admissible: what ``top_down`` and ``collapsed`` may return: ``"leaves"`` (messages, default) or
            ``"all"`` nodes (summaries too).
        policy: default retrieval policy, ``"collapsed"`` (default), ``"top_down"`` or ``"traversal"``;
            saves made while ``"top_down"`` was the default keep it.
        branching: the most children a node takes before new messages are sent down into its most
            similar child, an int >= 2, default 256; ``None`` = no bound (the paper's rule).
        reembed_cosine: a rewritten summary is embedded when the cosine of its composed vector with its
            anchor's falls below this, a float in ``(0, 1]``, default 0.95; ``None`` = always (the paper's).
        exact_search_max: the most indexed nodes ``top_down`` and ``collapsed`` score exhaustively, default
            8192; past it (and past ``48 x 32 (3k + 8)`` nodes, 58,368 for ``k = 10``) they score candidates,
            their ancestors and the descendants that could rank (as SegTreeMem; docs/performance.md,
            "Retrieval past a size"). ``None``: every node at any size (and saves made before the option).

    Policies: ``collapsed`` (default), ``top_down``, ``traversal``.

    Raises:
        InvalidInputError: a parameter out of range (the message names the accepted values).
        UnknownPolicyError: an unknown ``relevance``, ``admissible`` or ``policy``.

    References:
        MemTree paper Sec. 3.1-3.2; App. A.1.1 Algorithm 1, A.1.2, A.1.3, A.1.4, A.3.4, A.3.5, Table A.3;
        SegTreeMem paper Sec. 4.3.1 and Algorithm 2 (relevance propagation).
    """

    kind = "memtree"
    prefetch_messages = True
    policies = ("collapsed", "top_down", "traversal")
    default_policy = "collapsed"
    tree_policy: ClassVar[str | None] = "top_down"
    default_relevance = "hybrid"
    default_annotation_vectors: ClassVar[str] = "composed"
    default_sentence_vectors: ClassVar[str] = "pooled"
    legacy_config = {  # saves made before these options existed retrieve as they did
        "relevance": "dense",
        "hybrid_weight": 0.5,
        "alpha": 0.3,
        "horizon": 2,
        "admissible": "all",
        "policy": "collapsed",
        "branching": None,
        "reembed_cosine": None,
        "exact_search_max": None,
    }

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        base_threshold: float = 0.4,
        rate: float = 0.5,
        height: int | None = None,
        max_depth: int = -1,
        k: int = 3,
        threshold: float = 0.2,
        max_context: int = 10_000,
        max_workers: int = 8,
        summarizer: Summarizer | None = None,
        summary_chars: int = 600,
        store: str | Path | None = None,
        relevance: str = "hybrid",
        hybrid_weight: float = 0.5,
        annotation_vectors: str | None = None,
        alpha: float = 0.1,
        horizon: int = 2,
        admissible: str = "leaves",
        policy: str = "collapsed",
        branching: int | None = 256,
        reembed_cosine: float | None = 0.95,
        exact_search_max: int | None = 8192,
    ) -> None:
        self.default_policy = check_choice(policy, self.policies, "policy")  # type: ignore[misc]
        self.branching = check_branching(branching, "no bound: the paper's rule")
        self.reembed_cosine = check_reembed_cosine(reembed_cosine)
        self.exact_search_max = self._check_search_max(exact_search_max)
        self.alpha = check_alpha(alpha)
        self.horizon = check_horizon(horizon)
        self.admissible = check_choice(admissible, ADMISSIBLE, "admissible")
        self.base_threshold = check_finite(base_threshold, "base_threshold")
        self.rate = check_finite(rate, "rate")
        if height is not None:
            height = _positive_int(height, "height (None = the current tree height)")
        self.height = height
        self.max_depth = _check_max_depth(max_depth)
        self.k = _positive_int(k, "k")
        self.threshold = _check_threshold(threshold)
        self.max_context = _positive_int(max_context, "max_context (characters)")
        self.max_workers = _positive_int(max_workers, "max_workers")
        self._init_routes()
        self._init_anchors()
        self._set_state({})
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

    # ------------------------------------------------------------------ configuration
    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | None = None,
        *,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        **kwargs: Any,
    ) -> MemTree:
        """Build a MemTree from a MemTreeModule configuration.

        Accepts the module's ``config`` mapping (``top``, ``max_depth``, ``threshold``, ``max_context``,
        ``embedding_config``) or a whole module entry (``memory_name``, ``memory_class:
        MemTreeModule``, ``config``). Missing or ``None`` values take the page's defaults: ``top`` 3,
        ``max_depth`` -1 (unlimited), ``threshold`` 0.2, ``max_context`` 10,000 characters.
        ``embedding_config.model`` naming all-MiniLM-L6-v2 gives :class:`LocalEmbedder` (extra keys
        ``batch_size``, ``device``); an OpenAI embedding model (``text-embedding-*``), or any model with a
        ``base_url``, gives :class:`OpenAIEmbedder` (extra keys ``api_key``, ``base_url``,
        ``dimensions``, ``dim``, ``timeout``, ``max_retries``, ``batch_size``). Without
        ``embedding_config`` the ``embedder`` argument (the "global" embedder) or the embedded default
        is used.

        Args:
            config: the configuration mapping (``None`` = all defaults).
            embedder: the global embedder, used when ``embedding_config`` is absent.
            llm: the LLM for aggregation, or ``None``.
            **kwargs: further constructor arguments (``base_threshold``, ``rate``, ``height``,
                ``max_workers``, ``summarizer``, ``summary_chars``, ...). Unless given, ``relevance`` is
                ``"dense"``, ``policy`` ``"collapsed"`` and ``admissible`` ``"all"``: the module's
                retrieval (cosine over every node).

        Returns:
            A new, empty :class:`MemTree`.

        Raises:
            InvalidInputError: an unknown key, a value of the wrong type or range (e.g. ``max_context``
                not a positive integer), a ``memory_class`` other than ``MemTreeModule``, both
                ``embedding_config`` and ``embedder`` given, or an embedding model it cannot map.

        References:
            MemTreeModule configuration page (shared/seeds/memtree-module-config-doc.txt), "Parameters".
        """
        args = module_arguments(config, embedder, kwargs)
        return cls(args.pop("embedder"), llm, **args)

    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            return MemTreeAggregator(self.llm)
        return super()._default_summarizer()

    def _config(self) -> dict[str, Any]:
        return {
            "base_threshold": self.base_threshold,
            "rate": self.rate,
            "height": self.height,
            "max_depth": self.max_depth,
            "k": self.k,
            "threshold": self.threshold,
            "max_context": self.max_context,
            "max_workers": self.max_workers,
            "summary_chars": self.summary_chars,
            **self._shared_config(),
            "alpha": self.alpha,
            "horizon": self.horizon,
            "admissible": self.admissible,
            "policy": self.default_policy,
            "branching": self.branching,
            "reembed_cosine": self.reembed_cosine,
            "exact_search_max": self.exact_search_max,
        }

    def _get_state(self) -> dict[str, Any]:
        return {
            "height": self._height,
            "inserts": self._n_inserts,
            "llm_calls_sum": self._calls_sum,
            "llm_calls_sumsq": self._calls_sumsq,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        height = state.get("height")
        store = getattr(self, "_store", None)
        if height is None:
            height = max(store.depths().values(), default=0) if store is not None else 0
        self._height = int(height)
        self._n_inserts = int(state.get("inserts", 0))
        self._calls_sum = float(state.get("llm_calls_sum", 0.0))
        self._calls_sumsq = float(state.get("llm_calls_sumsq", 0.0))
        self._routes = {}  # a reset, a load, a rollback or another process's commits: read anew
        self._forget_anchors()  # the summaries' vectors may be others now: embed each when next rewritten
        self._anchors_lost = store is not None and store.n_leaves > 1

    # ------------------------------------------------------------------ insertion (Sec. 3.1)
    def threshold_at(self, depth: int, height: int | None = None) -> float:
        """The adaptive similarity threshold ``θ(d) = base_threshold · exp(rate · d / h)``.

        Args:
            depth: ``d``, the depth of the node whose children are compared (root 0).
            height: ``h``; default the fixed ``height`` option, else the current tree height (min 1).

        Returns:
            ``θ(d)`` (float).

        References:
            Sec. 3.1 ``θ(d) = θ_0 e^{λd}``; App. A.1.3 (``rate · current_depth / max_depth``).
        """
        h = height if height is not None else self._h()
        return self.base_threshold * math.exp(self.rate * depth / h)

    def _h(self) -> int:
        return self.height if self.height is not None else max(1, self._height)

    def _entries(self, nid: int) -> int:
        node = self._store.nodes[nid]
        return 1 if node.is_leaf else int(node.data.get("entries", 0))

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        st = self._store
        calls_before = usage.llm_calls
        e_new = self._embed([message.render()], usage)[0]
        h = self._h()
        # 1. route (read only)
        target, d = st.root, 0
        path: list[int] = []
        sims: list[float] = []
        thetas: list[float] = []
        expand: int | None = None
        capped = False
        forced = 0
        if target is not None:
            while True:
                children = st.nodes[target].children
                if not children:
                    break
                s = inner_products(self._child_vectors(target, children), e_new)
                best = int(np.argmax(s))
                theta = self.threshold_at(d, h)
                sims.append(float(s[best]))
                thetas.append(theta)
                full = self.branching is not None and len(children) >= self.branching
                if float(s[best]) < theta and not full:
                    break
                if self.max_depth != -1 and d + 2 > self.max_depth:
                    capped = True
                    break
                forced += float(s[best]) < theta
                child = children[best]
                if st.nodes[child].is_leaf:
                    expand = child
                    break
                path.append(child)
                target, d = child, d + 1
        # 2. aggregate and embed (no mutation yet)
        jobs = [(st.nodes[u].text, message.render(), self._entries(u)) for u in path]
        if expand is not None:
            jobs.append((st.nodes[expand].text, message.render(), 1))
        texts = self._aggregate_all(jobs, usage)
        nids = [*path, *([None] if expand is not None else [])]
        vecs, anchors = self._summary_vecs(nids, texts, usage) if texts else (None, [])
        # 3. mutate
        if target is None:
            root = st.new_node(level=0, data={"entries": 0})
            st.set_root(root.id)
            target = root.id
        leaf_depth = d + 2 if expand is not None else d + 1
        leaf = st.new_node(text=message.render(), is_leaf=True, message=message, level=leaf_depth)
        idx = leaf.span[0]
        self._set_vector(leaf.id, e_new)
        if expand is not None:
            assert vecs is not None
            pos = st.nodes[target].children.index(expand)
            first = st.nodes[expand].span[0]
            parent = st.new_node(text=texts[-1], level=d + 1, span=(first, idx), data={"entries": 2})
            st.detach(expand)
            st.add_child(target, parent.id, index=pos)
            st.add_child(parent.id, expand)
            st.add_child(parent.id, leaf.id)
            st.set_level(expand, leaf_depth)
            self._set_vector(parent.id, vecs[-1])
            self._forget_anchors([parent.id])
            if anchors[-1] is not None:
                self._anchors[parent.id] = anchors[-1]
            holder = parent.id
        else:
            st.add_child(target, leaf.id)
            holder = target
        for j, u in enumerate(path):
            assert vecs is not None
            st.set_text(u, texts[j])
            self._set_vector(u, vecs[j])
            if anchors[j] is not None:
                self._anchors[u] = anchors[j]
        root_id = st.root
        assert root_id is not None
        for u in [*path, root_id]:
            node = st.nodes[u]
            n_before = int(node.data.get("entries", 0))
            st.set_data(u, "entries", n_before + 1)
            st.set_span(u, (node.span[0] if n_before else idx, idx))
        # 4. bookkeeping
        self._height = max(self._height, leaf_depth)
        calls = usage.llm_calls - calls_before
        self._n_inserts += 1
        self._calls_sum += calls
        self._calls_sumsq += calls * calls
        if expand is not None:
            action = "expand"
        elif not sims:
            action = "first"
        else:
            action = "attach"
        return {
            "action": action,
            "parent": holder,
            "expanded_leaf": expand,
            "path": list(path),
            "depth": leaf_depth,
            "height": h,
            "similarities": sims,
            "thresholds": thetas,
            "capped": capped,
            "forced": forced,
            "aggregations": len(jobs),
            "llm_calls": calls,
        }

    def _aggregate(self, existing: str, new: str, n: int) -> tuple[str, Usage]:
        text, usage = self.summarizer.summarize([existing, new], entries=n)
        if not isinstance(text, str) or not text.strip():
            raise ModelError(
                "The summariser returned an empty aggregate; check the summariser (it must return "
                "non-empty text)."
            )
        return text, usage

    def _aggregate_all(self, jobs: list[tuple[str, str, int]], usage: Usage) -> list[str]:
        """Run ``Aggregate(existing, new | n)`` for every job; concurrently when an LLM is used."""
        if not jobs:
            return []
        if self.llm is not None and self.max_workers > 1 and len(jobs) > 1:
            ex = ThreadPoolExecutor(
                max_workers=min(self.max_workers, len(jobs)), thread_name_prefix="memtree-aggregate"
            )
            try:
                futures = [ex.submit(self._aggregate, *job) for job in jobs]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in futures:
                    if f in done and f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
                results = [f.result() for f in futures]
            finally:
                ex.shutdown(wait=True, cancel_futures=True)
        else:
            results = [self._aggregate(*job) for job in jobs]
        out = []
        for text, u in results:
            usage += u
            out.append(text)
        return out

    # ------------------------------------------------------------------ deletion
    def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None:
        """Remove leaves, collapse single-child internal nodes, re-aggregate the ancestors bottom-up."""
        st = self._store
        touched: set[int] = set()
        for lid in leaves:
            if lid not in st.nodes or not st.nodes[lid].is_leaf:
                continue
            for a in st.ancestors(lid):
                st.set_data(a, "entries", self._entries(a) - 1)
            parent = st.nodes[lid].parent
            st.detach(lid)
            st.delete_node(lid)
            while parent is not None and parent != st.root and not st.nodes[parent].children:
                gp = st.nodes[parent].parent
                st.detach(parent)
                st.delete_node(parent)
                parent = gp
            if parent is not None and parent != st.root and len(st.nodes[parent].children) == 1:
                only = st.nodes[parent].children[0]
                gp = st.nodes[parent].parent
                assert gp is not None
                pos = st.nodes[gp].children.index(parent)
                st.detach(only)
                st.detach(parent)
                st.delete_node(parent)
                st.add_child(gp, only, index=pos)
                for node in list(st.iter_subtree(only)):
                    st.set_level(node.id, node.level - 1)
                parent = gp
            if parent is not None:
                touched.add(parent)
        root = st.root
        if root is not None and not st.nodes[root].children:
            st.delete_node(root)
            touched.clear()
        self._forget_anchors([i for i in list(self._anchors) if i not in st.nodes])
        live = {t for t in touched if t in st.nodes}
        order: dict[int, int] = {}
        for t in live:
            for a in [t, *st.ancestors(t)]:
                order.setdefault(a, st.depth(a))
        for nid in sorted(order, key=lambda i: -order[i]):
            st.refresh_span(nid)
            if nid != st.root:
                self._reaggregate(nid, usage)
        self._height = max(st.depths().values(), default=0)

    def _reaggregate(self, nid: int, usage: Usage) -> None:
        st = self._store
        texts = [st.nodes[c].text for c in st.nodes[nid].children if st.nodes[c].text]
        if not texts:
            return
        text, u = self.summarizer.summarize(texts, entries=self._entries(nid), rebuild=True)
        if not isinstance(text, str) or not text.strip():
            raise ModelError("The summariser returned an empty summary while repairing the tree.")
        usage += u
        st.set_text(nid, text)
        if nid in self._anchors:  # its vector was moved from a text that may hold deleted words:
            self._forget_anchors([nid])  # embed its text at the commit, changed or not
            st.changed.add(nid)

    def _reannotate(self, nid: int, usage: Usage) -> None:
        self._reaggregate(nid, usage)

    # ------------------------------------------------------------------ retrieval (Sec. 3.2, A.3.5)
    def _retrieve(
        self, query: str, policy: str, k: int, **params: Any
    ) -> list[tuple[int, float, dict[str, Any]]]:
        unknown = sorted(set(params) - _RETRIEVE_PARAMS)
        if unknown:
            raise InvalidInputError(
                f"Unknown MemTree retrieval parameters: {', '.join(unknown)}; accepted: k, policy, "
                f"max_tokens, {', '.join(sorted(_RETRIEVE_PARAMS))}."
            )
        threshold = (
            self.threshold if params.get("threshold") is None else _check_threshold(params["threshold"])
        )
        max_context = (
            self.max_context
            if params.get("max_context") is None
            else _positive_int(params["max_context"], "max_context (characters)")
        )
        alpha = self.alpha if params.get("alpha") is None else check_alpha(params["alpha"])
        horizon = self.horizon if params.get("horizon") is None else check_horizon(params["horizon"])
        relevance = params.get("relevance")
        relevance = self.relevance_kind if relevance is None else relevance
        admissible = params.get("admissible")
        admissible = (
            self.admissible if admissible is None else check_choice(admissible, ADMISSIBLE, "admissible")
        )
        if self._index is None or len(self._index) == 0:
            return []
        qvec = self._embed_query(query)
        if policy == "traversal":
            ids, scores = self._traverse(qvec, k)
            chosen = self._select(ids, scores, k, threshold, max_context)
        elif policy == "collapsed" and relevance == "dense" and admissible == "all":
            chosen = self._collapsed(qvec, k, threshold, max_context)
        elif (
            found := self._select_over_candidates(
                query,
                policy,
                k,
                relevance,
                params.get("hybrid_weight"),
                alpha,
                horizon,
                admissible,
                max_context,
                qvec,
            )
        ) is not None:
            chosen = found
        else:
            ids, r = self.relevance(query, relevance, params.get("hybrid_weight"), qvec=qvec)
            if policy == "top_down":
                scores = self._propagated_scores(ids, r, "top_down", alpha, horizon)
            else:
                scores = np.asarray(r, dtype=np.float64)
            keep = self._leaf_mask(ids) if admissible == "leaves" else np.ones(len(ids), dtype=bool)
            if policy == "collapsed" and relevance == "dense":  # the paper's cosine cut-off
                keep &= r >= threshold
            chosen = self._select(ids[keep], scores[keep], k, -np.inf, max_context)
        return [(nid, score, {"policy": policy, "path": self._path(nid)}) for nid, score in chosen]

    def _select_over_candidates(
        self,
        query: str,
        policy: str,
        k: int,
        relevance: str,
        hybrid_weight: float | None,
        alpha: float,
        horizon: int,
        admissible: str,
        max_context: int,
        qvec: np.ndarray,
    ) -> list[tuple[int, float]] | None:
        """``top_down`` (and ``collapsed`` without the dense cut-off: ``H = 0``) over candidates past
        :attr:`exact_search_max` nodes (:meth:`~shared_core.search.ranking.Ranking._top_down_parents`),
        or ``None`` (every node)."""
        if policy == "collapsed" and relevance != "dense":  # collapsed = top_down with H = 0
            horizon = 0
        elif policy != "top_down":
            return None
        w = self.hybrid_weight if hybrid_weight is None else check_weight(hybrid_weight)
        leaves = admissible == "leaves"
        sc = self._top_down_parents(query, relevance, w, alpha, horizon, k, qvec, leaves_only=leaves)
        if sc is None:
            return None
        keep = sc.ranked & sc.leaf if leaves else sc.ranked
        chosen = self._select(sc.ids[keep], sc.scores[keep], k, -np.inf, max_context)
        if len(chosen) < k or not chosen[-1][1] > sc.floor:
            return None
        self.last_candidates = len(sc.ids)
        return chosen

    def _collapsed(
        self, qvec: np.ndarray, k: int, threshold: float, max_context: int
    ) -> list[tuple[int, float]]:
        """Collapsed-tree selection over every node, from FAISS top-``kk`` lists grown until complete.

        The candidate list is enlarged (x4) only while it may hide a qualifying node: fewer than ``k``
        hits were selected (repeated texts or the character budget skipped some), its last score still
        passes ``threshold``, and it does not hold every node; or the k-th hit ties with its last score.
        """
        assert self._index is not None
        n = len(self._index)
        kk = min(n, max(8 * k + 32, 64))
        while True:
            ids, scores = self._index.search(qvec, kk)
            out = self._select(ids, scores, k, threshold, max_context)
            if kk >= n or len(scores) == 0 or float(scores[-1]) < threshold:
                return out
            if len(out) >= k and out[-1][1] > float(scores[-1]):
                return out
            kk = min(n, kk * 4)

    def _traverse(self, qvec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` children per level from the root down; the visited nodes and their cosines.

        Exact ties between children go to the earlier child (their order under the parent).
        """
        st = self._store
        assert self._index is not None and st.root is not None
        frontier = [st.root]
        out_ids: list[int] = []
        out_scores: list[float] = []
        while frontier:
            children = [c for f in frontier for c in st.nodes[f].children]
            if not children:
                break
            s = self._index.scores_at(self._index.rows(children), qvec)  # the exhaustive scan's values
            keep = np.lexsort((np.arange(len(children)), -s))[:k]
            picked = [children[j] for j in keep]
            out_ids.extend(picked)
            out_scores.extend(float(s[j]) for j in keep)
            frontier = [c for c in picked if not st.nodes[c].is_leaf]
        return np.asarray(out_ids, dtype=np.int64), np.asarray(out_scores, dtype=np.float32)

    def _select(
        self, ids: np.ndarray, scores: np.ndarray, k: int, threshold: float, max_context: int
    ) -> list[tuple[int, float]]:
        """Best first above ``threshold``, distinct texts, at most ``k``, ``max_context`` characters and
        the ``max_tokens`` budget of the retrieve under way."""
        st = self._store
        out: list[tuple[int, float]] = []
        seen: set[str] = set()
        used = 0
        budget = TokenBudget(self._max_tokens)
        keep = np.nonzero(scores >= threshold)[0]
        for j in best_first(ids, scores, keep):
            nid = int(ids[j])
            text = st.nodes[nid].text
            if not text or text in seen or used + len(text) > max_context:
                continue
            if (self._allowed is not None and nid not in self._allowed) or not budget.take(text):
                continue
            seen.add(text)
            used += len(text)
            out.append((nid, float(scores[j])))
            if len(out) >= k:
                break
        return out

    # ------------------------------------------------------------------ statistics
    def _extra_stats(self) -> dict[str, Any]:
        st = self._store
        depths = st.depths()
        root = st.root
        branching = [n for n in st.nodes.values() if not n.is_leaf and n.id != root]
        per_depth: dict[int, int] = {}
        for nid, dep in depths.items():
            if nid != root:
                per_depth[dep] = per_depth.get(dep, 0) + 1
        height = max(per_depth, default=0)
        width = max(per_depth.values(), default=0)
        content_depths = [dep for nid, dep in depths.items() if nid != root]
        n = self._n_inserts
        mean = self._calls_sum / n if n else 0.0
        var = max(self._calls_sumsq / n - mean * mean, 0.0) if n else 0.0
        h = self._h()
        return {
            "content_nodes": len(content_depths),
            "branching_nodes": len(branching),
            "root_children": len(st.nodes[root].children) if root is not None else 0,
            "mean_node_depth": float(np.mean(content_depths)) if content_depths else 0.0,
            "mean_branching_factor": (
                float(np.mean([len(b.children) for b in branching])) if branching else 0.0
            ),
            "height": height,
            "width": width,
            "height_to_width": (height / width) if width else 0.0,
            "nodes_per_depth": [per_depth.get(i, 0) for i in range(1, height + 1)],
            "threshold_height": h,
            "thresholds": [self.threshold_at(i, h) for i in range(max(height, 1))],
            "inserts": n,
            "llm_calls_per_insert_mean": mean,
            "llm_calls_per_insert_std": math.sqrt(var),
        }
