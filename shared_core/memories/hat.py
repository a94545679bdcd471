"""HAT: the hierarchical aggregate tree with a memory agent.

Structure (paper Sec. 3.1): layers of nodes; node ``i`` of a layer has parent ``⌊i/M⌋`` in the layer
above (memory length ``M``); a new leaf is appended at the right of the bottom layer, parents and a new
root layer are created as needed, and every ancestor's text is re-aggregated from its children, with a
cache from a hash of the children to the aggregated text (the paper's ``previous_complete_state``).
Retrieval (Sec. 3.2, Sec. 4.3): a memory agent walks the tree with the actions up / down / left / right /
reset / sufficient / insufficient; BFS and DFS ask at every visited node whether it suffices. Without an
LLM, ``collapsed`` (the default) returns the message leaves best ranked by their own relevance,
``top_down`` the ones best supported by their own relevance and by the summaries above them, and
``greedy`` descends the tree with a beam. See :class:`HAT` for the departures from the paper and their
reasons.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..models.base import LLM, Embedder, Summarizer
from ..prompts import hat as P
from ..tree.nodes import TreeInvariantError
from ..tree.propagation import check_alpha, check_horizon
from ..types import Hit, InvalidInputError, Message, ModelError, UnknownPolicyError, Usage
from .base import ADMISSIBLE, HierarchicalMemory, check_choice
from .hat_agent import (
    ACTIONS,
    LLM_FREE,
    TRAVERSALS,
    MemoryAgent,
    Traversal,
    _positive_int,
    layer_sizes,
    parse_action,
)
from .hat_search import GREEDY_HITS, HATSearch, _check_bool
from .registry import register_memory

__all__ = ["ACTIONS", "GREEDY_HITS", "HAT", "Traversal", "layer_sizes", "parse_action"]

UNITS = ("turn", "session")

_COUNTERS = ("aggregation_calls", "cache_hits", "cache_misses", "single_child_copies")


@register_memory
class HAT(HATSearch, MemoryAgent, HierarchicalMemory):
    """Hierarchical Aggregate Tree memory (HAT).

    **Structure** (Sec. 3.1). Leaves are the bottom layer, in arrival order; node ``i`` of a layer is a
    child of node ``⌊i/M⌋`` of the layer above; all leaves are at one depth and the tree has
    ``ceil(log_M n) + 1`` layers over ``n`` leaves. Inserting appends a leaf at the right of the bottom
    layer, creates the parents (and a new root layer) it needs, and re-aggregates every ancestor of the
    new leaf from its current children. Only ancestors whose ordered children (ids and texts) changed
    are aggregated: each internal node remembers the hash of the children its text was computed from
    (``data["agg_key"]``), and a bounded cache maps such hashes to texts (the paper's
    ``previous_complete_state``), so an unchanged child set never costs a second aggregation call. A
    node with a single child takes the child's text (the aggregate of one text is that text) without a
    call. One ``add`` of many messages aggregates each touched ancestor once, from its final children,
    before committing: the result is the one of inserting the messages one by one, with fewer calls.
    The node keys are saved and rolled back with the tree; the cache lives in memory only, and entries
    made during an ``add`` that fails are kept: a value is the summariser's answer for exactly the
    ordered child texts in its key, so it stays a correct aggregate whenever the key comes up again (a
    retried ``add`` reuses it), while :meth:`to_dict` is unchanged by the failure. Deleting leaves
    re-layers the remaining ones (O(n)).

    ``M = 4`` by default. The paper illustrates HAT with ``M = 2`` (Figure 2) and does not state the
    value of its experiments; ``M`` trades depth for breadth: a leaf costs about ``log_M n``
    aggregations (the number of layers above it) and the agent needs about as many ``down`` moves, so
    a larger ``M`` means fewer calls and shorter walks, while each aggregation and each agent step reads
    ``M`` children and a summary covers ``M`` times more text than its children. ``M = 4`` halves the
    layers of ``M = 2`` (6 instead of 11 at 1,000 leaves) and keeps an aggregation prompt at four child
    notes (about 2,400 characters with the default 600-character extractive notes).

    Node ``level`` is the layer counted from the leaves (0 = leaves, the root has the highest level), so
    that adding a root layer relabels nothing; the paper counts layers from the root (``l_0``), which is
    :attr:`Hit.depth`.

    **Retrieval.** Every node is scored with the memory's ``relevance`` (the base class's relevance
    layer: ``"dense"`` = ``max(cos, 0)``, ``"bm25"``, or ``"hybrid"`` = each of the two divided by its
    maximum over the nodes, mixed with ``hybrid_weight``). Policies:

    * ``collapsed`` (default without an LLM): every node ranked by its own relevance (the ``admissible``
      ones: message leaves by default); with ``relevance="dense"`` and ``admissible="all"`` it is cosine
      over all nodes, top-k.
    * ``top_down``: each summary passes its relevance down to the nodes below
      it (the shared relevance propagation, SegTreeMem's Algorithm 2 with every child inheriting its
      parent's whole score: ``s = sum_{h<=H} alpha^h W^h s0 / sum alpha^h`` with ``s0 = r / sum(r)``,
      ``alpha`` and ``horizon`` ``H``), and the best ``admissible`` nodes are returned: message leaves
      by default, so a message ranks higher when the summaries of the stretch of conversation around
      it match the query too.
    * ``greedy``: a beam descent from the root by relevance, ``beam`` nodes kept per layer (default ``4 * k``
      of the call; ``k`` for the peaks), down to the leaves. With ``greedy_hits="leaves"`` (default) the hits
      are the leaves the beam reaches (with ``admissible="all"``, every node it visited), best first; with
      ``greedy_hits="peaks"`` they are the nodes where "descend to the most similar child while the similarity
      improves" stops: a node more similar than its parent on the path and than each of its children. The
      peaks rule by default follows the beam below a peak down to the leaves (``patience=None``), because a
      summary can be a little more similar than its children while a grandchild is much more similar (on an
      8-message test conversation with M=2 and MiniLM, "What is the name of my dog?" scores 0.278 at the root,
      0.276 and 0.451 on the way down and 0.600 at the answer leaf); ``retrieve(..., patience=p)`` drops a
      path after ``p`` layers in a row without improvement, ``patience=0`` is the literal rule. A one-child
      node is passed through to its child (same text). Without ``relevance="dense"`` the similarity is the
      memory's relevance.
    * ``agent`` (default with an LLM; Sec. 3.2): the LLM walks the tree from the root with the actions
      up / down N / left / right / reset / sufficient / insufficient, at most ``max_steps`` decisions.
    * ``bfs`` / ``dfs`` (Sec. 4.3): visit the nodes in breadth-first (layer by layer) or depth-first
      (pre-order) order, left (older) to right, and ask the LLM at each whether it suffices; the first
      yes is the context. As in the paper there is no step budget by default (``search_steps=None``:
      the walk ends at a yes or after every node).

    With ``fill=True`` (default) a policy that finds fewer than ``k`` hits (the LLM traversals return the
    one node judged sufficient, or nothing; the peaks may be few) is topped up with the ``top_down``
    ranking, so every policy returns exactly ``k`` hits when the memory holds at least ``k`` distinct
    texts (when the admissible nodes run out of distinct texts, the best other nodes come after them).
    Every hit carries ``policy`` and ``path`` in its metadata: for ``top_down``, ``collapsed``,
    ``greedy`` leaves and fill hits (marked ``fill: True``), the ids of the summaries above the node, top
    first; for the traversals and the peaks, the visited path as before (``actions`` too).
    ``retrieve(query, k=..., policy=..., relevance=..., hybrid_weight=..., admissible=..., alpha=...,
    horizon=..., beam=..., patience=..., greedy_hits=..., fill=..., max_steps=...)`` overrides the
    memory's settings for one call.

    **Departures from the paper.** The default LLM-free policy is ``collapsed`` over ``hybrid`` relevance
    returning message leaves (the first version's ``greedy`` peaks by cosine were mostly summaries;
    ``top_down``, the default before, is not measurably better on the dev or the validate split);
    ``greedy`` returns leaves with a beam of ``4 * k`` of the call; ``fill`` tops every policy up to ``k``
    hits; ``bfs`` / ``dfs`` have no step budget, as in the paper. Their measurements are in
    docs/evaluation.md, "HAT: departures from the paper, measured".

    The paper's algorithms stay exact under options: ``HAT(relevance="dense", admissible="all",
    greedy_hits="peaks", fill=False, policy="greedy")`` retrieves as the first version did (``greedy``
    peaks by cosine with the beam ``beam`` or the call's ``k``, ``collapsed`` cosine over every node,
    the traversals' single node), and saves made before these options existed load with exactly those
    settings, their ``beam`` and, for BFS/DFS, their ``max_steps`` as step budget
    (:attr:`legacy_config`, :meth:`stored_config`).

    Args:
        embedder: the embedder (default: the embedded all-MiniLM-L6-v2).
        llm: an LLM for aggregation and the ``agent`` / ``bfs`` / ``dfs`` policies, or ``None``
            (extractive aggregation and the LLM-free policies).
        M: memory length (children per node), an int >= 2, default 4.
        unit: ``"turn"`` (default): one leaf per message; ``"session"``: one leaf per session, i.e. per
            run of consecutive messages with the same ``Message.metadata["session"]`` (or, without it,
            the same ``Message.timestamp``). While a session continues its leaf grows (texts joined by a
            newline) and the leaf's ancestors are re-aggregated; the leaf keeps the first message's
            role, speaker and metadata and reports every message's id in ``Hit.source_ids``.
        max_steps: LLM decisions of the ``agent`` per traversal, default 10.
        search_steps: nodes asked by ``bfs`` / ``dfs`` per traversal, default ``None`` (no budget, as
            in the paper).
        beam: beam width of ``greedy`` in nodes per layer, default ``None``: ``4 * k`` of the call with
            ``greedy_hits="leaves"``, ``k`` with ``"peaks"``.
        k: default number of hits, default 10.
        summarizer: the aggregate function A (default: an LLM with :data:`prompts.hat.AGGREGATE_USER`,
            or the extractive summariser without an LLM).
        summary_chars: extractive summary budget in characters, default 600.
        cache_size: entries of the aggregation cache (least recently used evicted), default 10,000;
            0 keeps only each node's own last aggregation.
        store: path of a durable SQLite store, or ``None`` (default).
        relevance: ``"hybrid"`` (default), ``"dense"`` (the cosine of the first version) or ``"bm25"``.
        hybrid_weight: weight of the dense part of ``"hybrid"``, in ``[0, 1]``, default 0.5.
        annotation_vectors: ``"composed"`` or ``"embedded"``: how a summary's vector is made (see
            :class:`~shared_core.memories.base.HierarchicalMemory`); default ``None`` = ``"composed"`` (see
            docs/evaluation.md, "HAT: departures from the paper, measured").
        alpha: ``top_down`` propagation decay in ``[0, 1)``, default 0.1 (the SegTreeMem paper's
            default for Algorithm 2).
        horizon: ``top_down`` propagation horizon ``H >= 0``, default 2 (the SegTreeMem paper's default).
        admissible: what ``top_down``, ``collapsed`` and ``greedy`` leaves may return: ``"leaves"``
            (messages, default) or ``"all"`` nodes (summaries too).
        greedy_hits: what ``greedy`` returns: ``"leaves"`` (default) or ``"peaks"``.
        fill: top every policy's hits up to ``k`` from ``top_down``, default ``True``.
        policy: default policy of the memory without an LLM: ``"collapsed"`` (default), ``"top_down"`` or
            ``"greedy"``; saves made while ``"top_down"`` was the default keep it.
        llm_policy: default policy when the memory has an LLM, default ``"agent"``.
        exact_search_max: the most indexed nodes ``top_down`` and ``collapsed`` score exhaustively, default
            8192; past it (and past ``48 x 32 (3k + 8)`` nodes, 58,368 for ``k = 10``) they score candidates,
            their ancestors and the descendants that could rank (as SegTreeMem; docs/performance.md,
            "Retrieval past a size"). ``None``: every node at any size (and saves made before the option).

    Raises:
        InvalidInputError: a parameter out of range.
        UnknownPolicyError: an unknown ``unit``, ``relevance``, ``admissible``, ``greedy_hits``,
            ``policy`` or ``llm_policy`` (the message names the choices).

    References:
        "Enhancing Long-Term Memory using Hierarchical Aggregate Tree for Retrieval Augmented Generation"
        (shared/seeds/hat-paper.txt): Sec. 3.1 (HAT, aggregate function, node, layer invariant), Figure 2,
        Sec. 3.2 (memory agent, action set), Sec. 4.3 (BFS / DFS traversals); SegTreeMem paper Sec. 4.3.1
        and Algorithm 2 (relevance propagation).
    """

    kind = "hat"
    policies = ("collapsed", "top_down", "greedy", "agent", "bfs", "dfs")
    llm_policies = frozenset(TRAVERSALS)
    default_policy: ClassVar[str] = "collapsed"
    tree_policy: ClassVar[str | None] = "top_down"
    default_relevance: ClassVar[str] = "hybrid"
    #: saves made before these options existed retrieve as they did (``search_steps``: their
    #: ``max_steps``, see :meth:`stored_config`)
    default_annotation_vectors: ClassVar[str] = "composed"
    default_sentence_vectors: ClassVar[str] = "pooled"
    legacy_config: ClassVar[dict[str, Any]] = {
        "relevance": "dense",
        "hybrid_weight": 0.5,
        "alpha": 0.1,
        "horizon": 2,
        "admissible": "all",
        "greedy_hits": "peaks",
        "fill": False,
        "policy": "greedy",
        "llm_policy": "agent",
        "exact_search_max": None,
    }

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        M: int = 4,
        unit: str = "turn",
        max_steps: int = 10,
        search_steps: int | None = None,
        beam: int | None = None,
        k: int = 10,
        summarizer: Summarizer | None = None,
        summary_chars: int = 600,
        cache_size: int = 10_000,
        store: str | Path | None = None,
        relevance: str = "hybrid",
        hybrid_weight: float = 0.5,
        annotation_vectors: str | None = None,
        alpha: float = 0.1,
        horizon: int = 2,
        admissible: str = "leaves",
        greedy_hits: str = "leaves",
        fill: bool = True,
        policy: str = "collapsed",
        llm_policy: str = "agent",
        exact_search_max: int | None = 8192,
    ) -> None:
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 2:
            raise InvalidInputError(f"M (memory length) must be an integer >= 2, got {M!r}.")
        if unit not in UNITS:
            raise UnknownPolicyError(f"unit must be one of {UNITS}, got {unit!r}.")
        self.M = int(M)
        self.unit = unit
        self.max_steps = _positive_int(max_steps, "max_steps")
        self.search_steps = None if search_steps is None else _positive_int(search_steps, "search_steps")
        self.k = _positive_int(k, "k")
        self.beam = None if beam is None else _positive_int(beam, "beam")
        if isinstance(cache_size, bool) or not isinstance(cache_size, (int, np.integer)) or cache_size < 0:
            raise InvalidInputError(f"cache_size must be an integer >= 0, got {cache_size!r}.")
        self.cache_size = int(cache_size)
        self.alpha = check_alpha(alpha)
        self.horizon = check_horizon(horizon)
        self.admissible = check_choice(admissible, ADMISSIBLE, "admissible")
        self.greedy_hits = check_choice(greedy_hits, GREEDY_HITS, "greedy_hits")
        self.fill = _check_bool(fill, "fill")
        self.policy = check_choice(policy, LLM_FREE, "policy")
        self.llm_policy = check_choice(llm_policy, self.policies, "llm_policy")
        self.exact_search_max = self._check_search_max(exact_search_max)
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._dirty: set[int] = set()
        self._counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
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
        self.default_policy = self.policy if llm is None else self.llm_policy  # type: ignore[misc]

    @classmethod
    def stored_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """A saved configuration completed for keys saves did not have yet.

        Keys of :attr:`legacy_config` take their old values; a save without ``search_steps`` (made when
        BFS and DFS shared the agent's budget) gets its ``max_steps`` (10 when absent).

        Args:
            config: the saved configuration.

        Returns:
            The configuration to build the memory with.
        """
        out = super().stored_config(config)
        if "search_steps" not in config:
            out["search_steps"] = config.get("max_steps", 10)
        return out

    # ------------------------------------------------------------------ hooks
    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            from ..models.llm_summarizer import LLMSummarizer

            return LLMSummarizer(self.llm, template=P.AGGREGATE_USER, system=P.AGGREGATE_SYSTEM)
        return super()._default_summarizer()

    def _config(self) -> dict[str, Any]:
        return {
            "M": self.M,
            "unit": self.unit,
            "max_steps": self.max_steps,
            "search_steps": self.search_steps,
            "beam": self.beam,
            "k": self.k,
            "summary_chars": self.summary_chars,
            "cache_size": self.cache_size,
            **self._shared_config(),
            "alpha": self.alpha,
            "horizon": self.horizon,
            "admissible": self.admissible,
            "greedy_hits": self.greedy_hits,
            "fill": self.fill,
            "policy": self.policy,
            "llm_policy": self.llm_policy,
            "exact_search_max": self.exact_search_max,
        }

    def _get_state(self) -> dict[str, Any]:
        return {"counters": dict(self._counters)}

    def _set_state(self, state: dict[str, Any]) -> None:
        saved = state.get("counters") or {}
        self._counters = {c: int(saved.get(c, 0)) for c in _COUNTERS}
        self._dirty = set()

    def _restore(self, data: dict[str, Any], index: Any) -> None:
        super()._restore(data, index)
        self.check_invariants()

    def clear(self) -> None:
        """Forget everything, the aggregation cache included (configuration and models are kept)."""
        with self._lock:
            super().clear()
            self._cache.clear()

    def _extra_stats(self) -> dict[str, Any]:
        st = self._store
        sizes = layer_sizes(st.n_leaves, self.M)[::-1]
        return {
            "M": self.M,
            "unit": self.unit,
            "layers": len(sizes),
            "layer_sizes": sizes,
            **self._counters,
            "cache_entries": len(self._cache),
        }

    # ------------------------------------------------------------------ structure
    def layers(self) -> list[list[int]]:
        """Node ids per layer, root layer first (the paper's ``l_0``), each left (oldest) to right.

        Returns:
            A list of lists of node ids; ``[]`` for an empty memory.
        """
        with self._lock:
            st = self._store
            if st.root is None:
                return []
            out: list[list[int]] = []
            layer = [st.root]
            while layer:
                out.append(layer)
                layer = [c for nid in layer for c in st.nodes[nid].children]
            return out

    def check_invariants(self) -> None:
        """Check the HAT shape: links, layer sizes, the ``⌊i/M⌋`` parent rule, levels, leaf order.

        Raises:
            TreeInvariantError: the tree is not a valid HAT (a bug or a corrupt save).
        """
        with self._lock:
            st = self._store
            st.check_links()
            layers = self.layers()
            want = layer_sizes(st.n_leaves, self.M)[::-1]
            if [len(layer) for layer in layers] != want:
                raise TreeInvariantError(
                    f"layer sizes {[len(layer) for layer in layers]} differ from {want} for "
                    f"{st.n_leaves} leaves and M={self.M}"
                )
            H = len(layers) - 1
            for k, layer in enumerate(layers):
                for i, nid in enumerate(layer):
                    node = st.nodes[nid]
                    if node.level != H - k or node.is_leaf != (k == H):
                        raise TreeInvariantError(f"node {nid} has level {node.level} in layer {k} of {H + 1}")
                    if k and node.parent != layers[k - 1][i // self.M]:
                        raise TreeInvariantError(f"node {nid} (position {i}) breaks the floor(i/M) rule")
                    if not node.is_leaf and not node.text:
                        raise TreeInvariantError(f"internal node {nid} has no text")
            if layers:
                firsts = [st.nodes[i].span[0] for i in layers[-1]]
                if firsts != sorted(firsts):
                    raise TreeInvariantError("leaves are not in insertion order")

    def _right_spine(self) -> list[int]:
        """The rightmost node of every layer, bottom (the last leaf) first."""
        st = self._store
        if st.root is None:
            return []
        path = [st.root]
        while st.nodes[path[-1]].children:
            path.append(st.nodes[path[-1]].children[-1])
        return path[::-1]

    def _session_key(self, message: Message) -> str:
        key = message.metadata.get("session")
        if key is None:
            key = message.timestamp
        if key is None:
            raise InvalidInputError(
                "unit='session' groups messages by Message.metadata['session'] (or Message.timestamp); "
                "give every message one of them, or build the memory with unit='turn'."
            )
        return str(key)

    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        st = self._store
        spine = self._right_spine()
        if self.unit == "session":
            key = self._session_key(message)
            last = st.leaf_at.get(st.n_inserted - 1)
            if spine and spine[0] == last and st.nodes[last].data.get("session") == key:
                leaf = st.nodes[spine[0]]
                st.set_text(leaf.id, f"{leaf.text}\n{message.render()}")
                ids = list(leaf.data.get("source_ids", []))
                if message.id is not None:
                    ids.append(message.id)
                st.set_data(leaf.id, "source_ids", ids)
                st.set_data(leaf.id, "n_messages", int(leaf.data.get("n_messages", 1)) + 1)
                self._dirty.update(spine[1:])
                return {"leaf": leaf.id, "new_leaf": False, "session": key}
            data: dict[str, Any] = {
                "session": key,
                "source_ids": [message.id] if message.id is not None else [],
                "n_messages": 1,
            }
        else:
            data = {}
        n = st.n_leaves
        leaf = st.new_node(text=message.render(), is_leaf=True, message=message, level=0, data=data)
        details: dict[str, Any] = {"leaf": leaf.id, "new_leaf": True, "position": n}
        if not spine:
            st.set_root(leaf.id)
            return details
        sizes = layer_sizes(n, self.M)
        assert len(sizes) == len(spine), "layer sizes and the right spine disagree"
        cur, pos, lvl = leaf.id, n, 0
        while True:
            if lvl == len(spine) - 1:  # cur is a second node in the root layer: new root layer
                root = st.new_node(level=lvl + 1)
                st.add_child(root.id, spine[lvl])
                st.add_child(root.id, cur)
                st.set_root(root.id)
                self._dirty.add(root.id)
                break
            parent_pos = pos // self.M
            if parent_pos < sizes[lvl + 1]:  # the rightmost node of the layer above has room
                st.add_child(spine[lvl + 1], cur)
                self._dirty.update(spine[lvl + 1 :])
                break
            parent = st.new_node(level=lvl + 1)
            st.add_child(parent.id, cur)
            self._dirty.add(parent.id)
            cur, pos, lvl = parent.id, parent_pos, lvl + 1
        details["layers"] = len(layer_sizes(n + 1, self.M))
        return details

    def _forget_texts(self, texts: Sequence[str], changed: set[int], gone: set[int]) -> None:
        """After a deletion, here or in another process: the shared cleanup and the aggregation cache
        (``previous_complete_state``), whose texts may quote the deleted messages."""
        super()._forget_texts(texts, changed, gone)
        self._cache.clear()

    def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None:
        """Remove leaves and re-layer the rest so the ``⌊i/M⌋`` rule holds again.

        Internal nodes are reused by (level, position); nodes whose children keep their ids and texts
        are not aggregated again, so the cost is the aggregation of the groups right of the first
        deleted leaf (O(n / M) at worst) plus O(n) structural work.
        """
        self._cache.clear()  # forget cached aggregates that may quote the deleted text
        st = self._store
        gone = set(leaves)
        old = self.layers()
        if not old:
            return
        keep = [nid for nid in old[-1] if nid not in gone]
        internal_by_level = {len(old) - 1 - k: layer for k, layer in enumerate(old[:-1])}
        for layer in old[1:]:
            for nid in layer:
                st.detach(nid)
        for nid in gone:
            st.delete_node(nid)
        used: set[int] = set()
        layer, lvl = keep, 0
        while len(layer) > 1:
            lvl += 1
            olds = internal_by_level.get(lvl, [])
            nxt = []
            for j in range(0, len(layer), self.M):
                pid = olds[j // self.M] if j // self.M < len(olds) else st.new_node(level=lvl).id
                for c in layer[j : j + self.M]:
                    st.add_child(pid, c)
                used.add(pid)
                self._dirty.add(pid)
                nxt.append(pid)
            layer = nxt
        for olds in internal_by_level.values():
            for nid in olds:
                if nid not in used:
                    st.delete_node(nid)
        st.set_root(layer[0] if layer else None)

    def _before_commit(self, usage: Usage) -> None:
        # Once per transaction, before vectors and commit: aggregate every ancestor it touched, once.
        self._flush(usage)

    @staticmethod
    def _children_key(ids: Sequence[int], texts: Sequence[str]) -> str:
        payload = json.dumps([list(ids), list(texts)], ensure_ascii=False, separators=(",", ":"))
        return hashlib.blake2b(payload.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    def _flush(self, usage: Usage) -> None:
        """Re-aggregate the touched internal nodes bottom-up, each at most once, through the cache."""
        st = self._store
        dirty = sorted((i for i in self._dirty if i in st.nodes), key=lambda i: st.nodes[i].level)
        cnt = self._counters
        for nid in dirty:
            node = st.nodes[nid]
            st.refresh_span(nid)
            kids = node.children
            texts = [st.nodes[c].text for c in kids]
            key = self._children_key(kids, texts)
            if len(kids) == 1:
                st.set_text(nid, texts[0])
                cnt["single_child_copies"] += 1
            elif node.data.get("agg_key") == key and node.text:
                cnt["cache_hits"] += 1
                continue
            else:
                text = self._cache.get(key)
                if text is not None:
                    self._cache.move_to_end(key)
                    cnt["cache_hits"] += 1
                else:
                    text, u = self.summarizer.summarize(texts)
                    usage += u
                    if not isinstance(text, str) or not text.strip():
                        raise ModelError(
                            "The summariser returned an empty or non-string aggregate; check the model "
                            "or the summariser."
                        )
                    cnt["cache_misses"] += 1
                    cnt["aggregation_calls"] += 1
                    if self.cache_size:
                        self._cache[key] = text
                        while len(self._cache) > self.cache_size:
                            self._cache.popitem(last=False)
                st.set_text(nid, text)
            st.set_data(nid, "agg_key", key)
        self._dirty = set()
        # Cache entries made by a transaction that later fails stay: a value is the summariser's output
        # for exactly the ordered child texts in its key, whatever happens to the nodes, so it is a
        # correct aggregate whenever that key comes up again (e.g. when the same add is retried).

    def hit(self, nid: int, score: float = 0.0, meta: dict[str, Any] | None = None) -> Hit:
        """Build the :class:`Hit` of node ``nid`` (session leaves report every message id)."""
        h = super().hit(nid, score, meta)
        if self.unit != "session":
            return h
        st = self._store
        ids: dict[str, None] = {}
        for lid in st.leaves_under(nid):
            for s in st.nodes[lid].data.get("source_ids", []):
                ids.setdefault(s, None)
        return dataclasses.replace(h, source_ids=list(ids))
