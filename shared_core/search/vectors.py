"""Node vectors during a transaction: embedding leaves, making summary vectors, reading indexed ones.

:class:`NodeVectors` is a mixin of :class:`~shared_core.memories.base.HierarchicalMemory`. Within a
transaction
every new or changed node gets the vector of its current text: a leaf's text is embedded; a summary's is
embedded or composed from its sentences' cached vectors (``annotation_vectors``). Vectors wait in
``_pending`` until the commit writes them to the node index.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models.base import call_embedder, unit_embeddings, validate_embeddings
from ..types import InvalidInputError, NodeNotFoundError
from .index import inner_products, normalize_rows, unit_row_norm

if TYPE_CHECKING:
    from ..models.base import Embedder, Summarizer
    from ..tree.nodes import NodeStore
    from ..types import Message, Usage
    from .index import NodeIndex

__all__ = ["NodeVectors"]


class NodeVectors:
    """Mixin: the vectors of a memory's nodes (see the module)."""

    # set by HierarchicalMemory.__init__
    embedder: Embedder
    summarizer: Summarizer
    annotation_vectors: str
    _store: NodeStore
    _index: NodeIndex | None
    _pending: dict[int, tuple[str, np.ndarray]]
    _tx_vecs: dict[str, np.ndarray]
    _tx_composed: dict[str, np.ndarray]
    _tx_usage: Usage
    _lock: threading.RLock

    if TYPE_CHECKING:

        def _sync_store(self) -> None: ...

        def _embed_query(self, query: str) -> np.ndarray: ...

    def embed_query(self, query: str) -> np.ndarray:
        """The memory's own embedding of a query, as retrieval compares it with node vectors.

        Args:
            query: the query text (non-empty).

        Returns:
            ``float32`` array of shape ``(dim,)``, unit L2 norm (a zero vector stays zero). One embedding
            call, counted with the queries' usage.

        Raises:
            InvalidInputError: ``query`` is not a non-empty string.
            EmbeddingError: the embedder returned a vector of the wrong shape or with NaN / inf.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError(f"query must be a non-empty string, got {query!r}.")
        with self._lock:
            return np.asarray(self._embed_query(query), dtype=np.float32)

    def similarities(self, query: str, node_ids: Sequence[int]) -> dict[int, float]:
        """The cosine similarity of a query and each given node's vector, as :attr:`Hit.score` reads it
        before clipping (``Hit.components["dense"]``), for the nodes the memory holds.

        The query is embedded once per query text: a call right after ``retrieve`` of the same query
        reuses that retrieval's embedding. Read after catching up with a shared store.

        Args:
            query: the query text (non-empty).
            node_ids: node ids (ints), e.g. the leaves of an item; ids not held are left out.

        Returns:
            ``{node_id: cosine}`` with cosines in ``[-1, 1]`` (float32 values as floats, the same on every
            CPU: :func:`~shared_core.scores.inner_products`), in the order of ``node_ids``.

        Raises:
            InvalidInputError: ``query`` is not a non-empty string, or an id is not an integer.
            EmbeddingError: the embedder returned a vector of the wrong shape or with NaN / inf.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError(f"query must be a non-empty string, got {query!r}.")
        ids = _node_ids(node_ids)
        with self._lock:
            self._sync_store()
            present = list(dict.fromkeys(i for i in ids if i in self._store.nodes))
            if not present:
                return {}
            qvec = self._embed_query(query)
            vecs = self._vectors(present)
            cos = inner_products(vecs, qvec, row_norm=unit_row_norm(vecs.shape[1]))
            return dict(zip(present, (float(c) for c in cos)))

    def node_vectors(self, node_ids: Sequence[int]) -> np.ndarray:
        """The vectors retrieval compares a query with, for the given nodes (e.g. :attr:`Hit.node_id` s).

        A leaf's vector is its message's embedding; a summary's is its text's (embedded or composed, see
        ``annotation_vectors``). Read after catching up with a shared store.

        Args:
            node_ids: node ids (ints), in the order wanted; repeats allowed.

        Returns:
            ``float32`` array of shape ``(len(node_ids), dim)``, rows of unit L2 norm, row ``i`` for
            ``node_ids[i]`` (shape ``(0, dim)`` for no ids).

        Raises:
            InvalidInputError: an id that is not an integer.
            NodeNotFoundError: an id the memory does not hold (e.g. deleted since it was retrieved),
                named in the message.
        """
        ids = _node_ids(node_ids)
        with self._lock:
            self._sync_store()
            missing = [i for i in ids if i not in self._store.nodes]
            if missing:
                raise NodeNotFoundError(f"No node with id {missing[0]} in this memory.")
            return np.asarray(self._vectors(ids), dtype=np.float32)

    @property
    def dim(self) -> int | None:
        """Vector dimension, once known."""
        if self._index is not None:
            return self._index.dim
        try:
            return int(self.embedder.dim)
        except Exception:
            return None

    def _embed(self, texts: Sequence[str], usage: Usage) -> np.ndarray:
        """Embed texts in one call (deduplicated, reusing this transaction's vectors); rows normalised."""
        texts = list(texts)
        todo = list(dict.fromkeys(t for t in texts if t not in self._tx_vecs))
        if todo:
            seed = self._summarizer_hook("seed")
            spans_of = self._summarizer_hook("spans")
            embed_spans = getattr(self.embedder, "embed_spans", None)
            spans = spans_of(todo) if spans_of is not None and callable(embed_spans) else None
            t0 = time.perf_counter()
            parts = None
            if spans is not None:  # sentence vectors from the same forward pass (see ExtractiveSummarizer)
                raw, parts = call_embedder(self.embedder, embed_spans, todo, spans)  # type: ignore[arg-type]
            else:
                raw = call_embedder(self.embedder, self.embedder.embed, todo)
            vecs = unit_embeddings(raw, len(todo), self._expected_dim())
            usage.embed_calls += 1
            usage.embedded_texts += len(todo)
            usage.seconds += time.perf_counter() - t0
            self._tx_vecs.update(zip(todo, vecs))
            if seed is not None:
                seed(todo, vecs, parts)  # the summariser's sentences are then not embedded again
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        return np.stack([self._tx_vecs[t] for t in texts])

    def _summarizer_hook(self, name: str) -> Any:
        """The summariser's method ``name`` (``seed``, ``compose``) when it has one and embeds with the
        memory's own embedder (vectors it makes or takes are then this memory's); else ``None``."""
        fn = getattr(self.summarizer, name, None)
        if callable(fn) and getattr(self.summarizer, "embedder", None) is self.embedder:
            return fn
        return None

    def _annotation_vecs(self, texts: Sequence[str], usage: Usage) -> np.ndarray:
        """Vectors of internal nodes' texts (see ``annotation_vectors``); rows normalised."""
        compose = self._summarizer_hook("compose")
        if self.annotation_vectors != "composed" or compose is None:
            return self._embed(texts, usage)
        texts = list(texts)
        todo = [t for t in dict.fromkeys(texts) if t not in self._tx_composed]
        if todo:
            t0 = time.perf_counter()
            vecs, u = compose(todo)
            vecs = normalize_rows(validate_embeddings(vecs, len(todo), self._expected_dim()))
            usage += u
            usage.seconds += time.perf_counter() - t0 - u.seconds
            self._tx_composed.update(zip(todo, vecs))
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        return np.stack([self._tx_composed[t] for t in texts])

    def _node_vecs(self, nids: Sequence[int], usage: Usage) -> np.ndarray:
        """Fresh vectors of nodes' current texts: leaves embedded, internal nodes as ``annotation_vectors``
        says (at most one embedding call each)."""
        st = self._store
        leaves = [j for j, i in enumerate(nids) if st.nodes[i].is_leaf]
        inner = [j for j, i in enumerate(nids) if not st.nodes[i].is_leaf]
        out: list[np.ndarray | None] = [None] * len(nids)
        for pos, fn in ((leaves, self._embed), (inner, self._annotation_vecs)):
            if pos:
                for j, v in zip(pos, fn([st.nodes[nids[j]].text for j in pos], usage)):
                    out[j] = v
        if not nids:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        return np.stack(out)  # type: ignore[arg-type]

    def _expected_dim(self) -> int | None:
        """Width every new vector must have: the index's, else this transaction's, else the embedder's."""
        if self._index is not None:
            return self._index.dim
        if self._tx_vecs:
            return int(next(iter(self._tx_vecs.values())).shape[0])
        try:
            return int(self.embedder.dim)
        except Exception:
            return None

    def _set_vector(self, nid: int, vec: np.ndarray) -> None:
        """Give node ``nid`` the vector of its current text (written to the index at commit)."""
        self._pending[nid] = (self._store.nodes[nid].text, np.asarray(vec, dtype=np.float32))

    def _vector(self, nid: int) -> np.ndarray:
        """Current vector of a node: its text's vector in this transaction, else the indexed one.

        A node whose text changed in the open transaction is embedded on demand (and counted).
        """
        text = self._store.nodes[nid].text
        p = self._pending.get(nid)
        if p is not None and p[0] == text:
            return p[1]
        if p is not None or nid in self._store.changed:
            v = self._node_vecs([nid], self._tx_usage)[0]
            self._pending[nid] = (text, v)
            return v
        assert self._index is not None
        return self._index.get([nid])[0]

    def _vectors(self, nids: Sequence[int]) -> np.ndarray:
        """Current vectors of several nodes; those that need embedding are embedded in one call."""
        if not nids:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        st = self._store
        indexed: list[int] = []  # positions whose vector is the indexed one: read in one index call
        stale: list[int] = []  # nodes whose text changed in this transaction and has no vector yet
        for j, i in enumerate(nids):
            p = self._pending.get(i)
            if p is None and i not in st.changed:
                indexed.append(j)
            elif p is None or p[0] != st.nodes[i].text:
                stale.append(i)
        if len(stale) > 1:
            vecs = self._node_vecs(stale, self._tx_usage)
            for i, v in zip(stale, vecs):
                self._pending[i] = (st.nodes[i].text, v)
        rows: list[np.ndarray | None] = [None] * len(nids)
        if indexed:
            assert self._index is not None
            for j, v in zip(indexed, self._index.get([nids[j] for j in indexed])):
                rows[j] = v
        return np.stack([self._vector(i) if v is None else v for i, v in zip(nids, rows)])

    def _prefetch(self, messages: Sequence[Message], usage: Usage) -> None:
        """Embed every message's rendered text in one call, and let the summariser prepare for them."""
        texts = [m.render() for m in messages]
        self._embed(texts, usage)
        warm = getattr(self.summarizer, "warm", None)
        if callable(warm):
            usage += warm(texts)

    def _embed_pending(self, usage: Usage, leaves_only: bool = False) -> None:
        """Embed, in one call, every node (every leaf with ``leaves_only``) whose text changed in this
        transaction and has no vector for it."""
        st = self._store
        need = []
        for i in st.changed:
            node = st.nodes.get(i)
            if node is None or not node.text or (leaves_only and not node.is_leaf):
                continue
            p = self._pending.get(i)
            if p is None or p[0] != node.text:
                need.append(i)
        if not need:
            return
        vecs = self._node_vecs(need, usage)
        for i, v in zip(need, vecs):
            self._pending[i] = (st.nodes[i].text, v)


def _node_ids(node_ids: Sequence[int]) -> list[int]:
    """Node ids as ints, in order.

    Raises:
        InvalidInputError: an id that is not an integer (bools are not ids).
    """
    ids = list(node_ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, (int, np.integer))]
    if bad:
        raise InvalidInputError(f"node ids are integers, got {bad[0]!r}.")
    return [int(i) for i in ids]
