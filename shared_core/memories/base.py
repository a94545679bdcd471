"""HierarchicalMemory: the public surface shared by MemTree, SegTreeMem, HAT and xMemory.

A subclass supplies its insertion rule (:meth:`_insert`) and its retrieval policies (:meth:`_retrieve`);
this class supplies input validation, atomic adds (compute first, commit last: a failed add leaves the
memory exactly as before), the node index, relevance scoring, hits, budgets, deletion, statistics,
plain-data export and persistence.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..arrays import one_blas_thread
from ..models.base import LLM, Embedder, Summarizer
from ..progress import ProgressLike, check_progress, progress_reporter
from ..search.ann import NeighbourSearch
from ..search.filters import message_filter
from ..search.index import NodeIndex
from ..search.ranking import ADMISSIBLE, RELEVANCE_KINDS, Ranking, TokenBudget, check_choice, count_tokens
from ..search.relevance import check_weight
from ..search.vectors import NodeVectors
from ..search.walk import check_limits
from ..stores import WriteConflictError
from ..stores.encoding import MEMORY_FORMAT
from ..tree.nodes import NodeStore
from ..tree.structure import NodeArrays
from ..types import (
    AddReport,
    Hit,
    InvalidInputError,
    LLMRequiredError,
    Message,
    MessageLike,
    NodeNotFoundError,
    UnknownPolicyError,
    Usage,
    as_messages,
)
from .checks import check_message, check_unicode
from .forgetting import Forgetting
from .management import Management
from .reading import Reading
from .store_binding import StoreBinding
from .supersession import Supersession

__all__ = [
    "ADMISSIBLE",
    "ANNOTATION_VECTORS",
    "RELEVANCE_KINDS",
    "HierarchicalMemory",
    "TokenBudget",
    "check_choice",
    "check_message",
    "count_tokens",
]

#: how an internal node's vector is made: composed from its sentences' cached vectors, or by embedding it
ANNOTATION_VECTORS = ("composed", "embedded")


M = TypeVar("M", bound="HierarchicalMemory")


class HierarchicalMemory(
    Ranking, NodeVectors, StoreBinding, Forgetting, Management, Reading, Supersession, abc.ABC
):
    """Base class of the hierarchical memories.

    Args:
        embedder: an :class:`~shared_core.models.base.Embedder`; default the embedded
            :class:`~shared_core.models.local.LocalEmbedder` (all-MiniLM-L6-v2, 384-d, offline).
        llm: an :class:`~shared_core.models.base.LLM`, or ``None`` (default) for the LLM-free mode.
        summarizer: the aggregate function for internal nodes; default an LLM summariser with the
            algorithm's prompt when ``llm`` is given, else :class:`ExtractiveSummarizer`. A summariser
            that keeps texts (as the extractive one's sentence cache does) may offer ``forget(texts)``
            and ``clear()``: :meth:`delete` and :meth:`clear` call them when present (see there).
        summary_chars: length budget of extractive summaries in characters, default 600.
        store: a durable store for subclasses that forward it: the path of an SQLite file or a
            ``postgresql://`` URL (namespace ``("default",)``; see :mod:`shared_core.stores`); every memory
            also has :meth:`open` and :meth:`attach_store`. Default ``None`` (in memory).
        relevance: the local relevance ``R(q, text(v))`` the memory ranks nodes with (see
            :meth:`relevance`): ``"dense"``, ``"bm25"`` or ``"hybrid"``; default ``None`` = the class's
            :attr:`default_relevance`.
        hybrid_weight: weight ``w`` of the dense part of ``"hybrid"``, in ``[0, 1]``, default 0.5.
        annotation_vectors: how an internal node's (summary's) vector is made; default ``None`` = the
            class's :attr:`default_annotation_vectors`. ``"composed"`` = the normalised mean of its
            sentences' vectors, which an extractive summariser has already
            embedded (the children's sentences), so an add embeds its message and its new sentences
            only; ``"embedded"`` = the embedder run on the summary text (the papers' construction, and
            what a memory saved before this option uses). Composition needs a summariser with
            ``compose`` sharing the memory's embedder (the default extractive one); otherwise summaries
            are embedded.

    Raises:
        InvalidInputError: a model without the needed method, a ``hybrid_weight`` outside ``[0, 1]``.
        UnknownPolicyError: an unknown ``relevance`` (the message names the choices).

    Thread safety: one writer at a time; readers wait for a write to finish and see a consistent tree.
    One re-entrant lock serialises adds, deletes and retrievals (retrieval updates caches such as the
    lexical index, so readers do not run concurrently with each other either).

    Input limits: a message text has at most :attr:`max_message_chars` characters (default 100,000;
    split longer documents before adding them, or raise the attribute on the instance); its other
    stored fields at most ``MAX_SPEAKER_CHARS`` (1,000) characters of ``speaker``,
    ``MAX_ROLE_CHARS`` (256) of ``role``, ``MAX_TIMESTAMP_CHARS`` (256) of ``timestamp`` and
    ``MAX_ID_CHARS`` (1,000) of ``id``, and ``metadata`` of at most ``MAX_METADATA_BYTES`` (100,000)
    bytes as JSON nested at most ``MAX_METADATA_DEPTH`` (32) levels (constants of
    :mod:`shared_core.types`); ``speaker`` and ``role`` are strings or ``None`` and metadata keys are
    strings at every level; a message (text, fields and metadata) must be valid Unicode (no lone
    surrogates such as ``"\\ud800"``) and JSON-serialisable. Control characters are kept as data. Every
    message of an ``add`` is checked before anything changes: a rejected call (an
    :class:`~shared_core.types.InvalidInputError` naming the field and the limit) leaves the memory
    as it was.
    """

    kind: ClassVar[str] = "memory"
    policies: ClassVar[tuple[str, ...]] = ("collapsed",)
    default_policy: ClassVar[str] = "collapsed"
    #: the policy that ranks through the tree's structure (propagation or descent), reported against
    #: ``collapsed`` as the tree's share by ``hiermem eval``; ``None`` = :attr:`default_policy`
    tree_policy: ClassVar[str | None] = None
    llm_policies: ClassVar[frozenset[str]] = frozenset()
    FORMAT_VERSION: ClassVar[int] = MEMORY_FORMAT
    #: the leaves under any node are exactly those whose insertion index lies in its span
    contiguous_spans: ClassVar[bool] = False
    #: the insertion rule embeds ``Message.render()`` of each message: a multi-message add embeds them
    #: all (and warms the summariser with them) in one batch first
    prefetch_messages: ClassVar[bool] = False
    #: longest accepted message text in characters (instance attribute may override)
    max_message_chars: int = 100_000
    #: relevance used when the constructor gets ``relevance=None``
    default_relevance: ClassVar[str] = "dense"
    #: configuration values of saves made before a configuration key existed (key -> value they had)
    legacy_config: ClassVar[dict[str, Any]] = {}
    #: ``annotation_vectors`` when the constructor is not given one (each memory sets its own)
    default_annotation_vectors: ClassVar[str] = "embedded"
    #: ``sentence_vectors`` of the default extractive summariser (see
    #: :class:`~shared_core.models.extractive.ExtractiveSummarizer`)
    default_sentence_vectors: ClassVar[str] = "embedded"

    def __init__(
        self,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        *,
        summarizer: Summarizer | None = None,
        summary_chars: int = 600,
        store: str | Path | None = None,
        relevance: str | None = None,
        hybrid_weight: float = 0.5,
        annotation_vectors: str | None = None,
    ) -> None:
        self.annotation_vectors = check_choice(
            self.default_annotation_vectors if annotation_vectors is None else annotation_vectors,
            ANNOTATION_VECTORS,
            "annotation_vectors",
        )
        self.relevance_kind = check_choice(
            self.default_relevance if relevance is None else relevance, RELEVANCE_KINDS, "relevance"
        )
        self.hybrid_weight = check_weight(hybrid_weight)
        if embedder is None:
            from ..models.local import LocalEmbedder

            embedder = LocalEmbedder()
        if not hasattr(embedder, "embed"):
            raise InvalidInputError(
                f"embedder must have an embed(texts) method, got {type(embedder).__name__}."
            )
        if llm is not None and not hasattr(llm, "complete"):
            raise InvalidInputError(f"llm must have a complete(prompt) method, got {type(llm).__name__}.")
        if summarizer is not None and not callable(getattr(summarizer, "summarize", None)):
            raise InvalidInputError(
                f"summarizer must have a summarize(texts) method, got {type(summarizer).__name__}."
            )
        self.embedder = embedder
        self.llm = llm
        self.summary_chars = int(summary_chars)
        self.summarizer: Summarizer = summarizer or self._default_summarizer()
        self._store = NodeStore(self.contiguous_spans)
        self._index: NodeIndex | None = None
        self._lexical: Any = None
        self._lex_dirty: set[int] = set()
        self._lex_removed: set[int] = set()
        self._lock = threading.RLock()
        self._usage = Usage()
        self._query_usage = Usage()
        self._pending: dict[int, tuple[str, np.ndarray]] = {}
        self._tx_usage = Usage()
        self._tx_vecs: dict[str, np.ndarray] = {}
        self._tx_composed: dict[str, np.ndarray] = {}  # this transaction's composed annotation vectors
        self._state_snapshot: Any = None
        self._index_created = False  # the open transaction created the index
        self._arrays = NodeArrays()  # parent / level / leaf per node id, for vectorised ranking
        self._structure_cache: tuple[tuple[int, int], Any] | None = None
        self._max_tokens: int | None = None  # the budget of the retrieve under way
        self._allowed: set[int] | None = None  # nodes the filter of the retrieve under way lets through
        self._version = 0  # bumped on every commit; caches key on it
        self._ns: NeighbourSearch | None = None  # IVF over every indexed node (Ranking._node_search)
        self._ns_of: NodeIndex | None = None  # the node index it mirrors
        self._ns_dirty: set[int] = set()  # ids written since it was last brought up to date
        #: nodes the last retrieval scored over candidates (``None``: it scored every node)
        self.last_candidates: int | None = None
        self._durable: Any = None  # a shared_core.stores.Store when a store is attached
        if store is not None:
            self.attach_store(store)

    # ------------------------------------------------------------------ hooks for subclasses
    def _default_summarizer(self) -> Summarizer:
        if self.llm is not None:
            from ..models.llm_summarizer import LLMSummarizer

            return LLMSummarizer(self.llm)
        from ..models.extractive import ExtractiveSummarizer

        return ExtractiveSummarizer(
            self.embedder, max_chars=self.summary_chars, sentence_vectors=self.default_sentence_vectors
        )

    @abc.abstractmethod
    def _insert(self, message: Message, usage: Usage) -> dict[str, Any]:
        """Insert one message inside an open transaction; return per-message details."""

    @abc.abstractmethod
    def _retrieve(
        self, query: str, policy: str, k: int, **params: Any
    ) -> list[tuple[int, float, dict[str, Any]]]:
        """Return ``(node_id, score, metadata)`` candidates, best first (more than ``k`` allowed)."""

    def _config(self) -> dict[str, Any]:
        """Constructor keyword arguments (JSON-serialisable, models excluded) to rebuild this memory."""
        return {"summary_chars": self.summary_chars, **self._shared_config()}

    def _shared_config(self) -> dict[str, Any]:
        """The options every memory has (relevance, annotation vectors), for the subclasses' ``_config``."""
        return {
            "relevance": self.relevance_kind,
            "hybrid_weight": self.hybrid_weight,
            "annotation_vectors": self.annotation_vectors,
        }

    @classmethod
    def stored_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """A saved configuration completed with :attr:`legacy_config` for keys saves did not have yet
        (and ``annotation_vectors="embedded"``, how every memory made summary vectors before the option)."""
        return {"annotation_vectors": "embedded", **cls.legacy_config, **config}

    def _get_state(self) -> dict[str, Any]:
        """Algorithm state outside the node store (JSON-serialisable)."""
        return {}

    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_get_state` returned."""

    def _extra_stats(self) -> dict[str, Any]:
        return {}

    def _before_commit(self, usage: Usage) -> None:
        """Runs once per transaction (add or delete), after the last change and before vectors are
        embedded and the commit; e.g. to aggregate every touched ancestor once."""

    def _reannotate(self, nid: int, usage: Usage) -> None:
        """Recompute an internal node's text from its children (used after deletions)."""
        node = self._store.get(nid)
        texts = [self._store.nodes[c].text for c in node.children if self._store.nodes[c].text]
        if not node.text or not texts:
            return
        text, u = self.summarizer.summarize(texts)
        usage += u
        self._store.set_text(nid, text)

    # ------------------------------------------------------------------ public: writing
    def add(
        self,
        items: MessageLike | Iterable[MessageLike],
        *,
        upsert: bool = False,
        allow_duplicate_ids: bool = False,
        progress: ProgressLike = None,
    ) -> AddReport:
        """Add messages in order.

        Args:
            items: a string, a :class:`Message`, or an iterable of them (inserted in order).
            upsert: replace the stored message of an id the memory already holds (deleted and the new
                one added, at the end, in the same transaction), default ``False``: refuse it.
            allow_duplicate_ids: keep several messages under one id (a caller that stores one record as
                several messages, as the LangGraph store does), default ``False``; not with ``upsert``.
            progress: ``None`` (default): no output; ``True``: a progress bar on standard error (messages
                inserted, rate, time left) when it is a terminal; a callable ``progress(done, total)``:
                called with the messages inserted so far (never decreasing, up to ``total``) and the
                number in the call (:mod:`shared_core.progress`).

        Returns:
            :class:`AddReport` with the new leaf ids, per-message details and the model usage of this
            call (embedding calls, LLM calls, tokens, seconds).

        Raises:
            InvalidInputError: ``None``, empty or whitespace-only text, a non-string item (bytes too), a
                text longer than :attr:`max_message_chars`, a field or metadata over its limit or of
                the wrong type (see the class), a lone surrogate, metadata that is not JSON, or a
                ``progress`` that is not ``None``, a bool or a callable.
            DuplicateIdError: an id twice in the call, or (without ``upsert``) one already stored.
            MemoryClosedError: the memory was closed.
            EmbeddingError: the embedder returned the wrong shape, NaN, or a zero or overflowing vector.
            ModelError: a model failed after its retries or the embedder raised (its ``__cause__``).
            PersistenceError: the durable store could not commit the change.

        Any error leaves the memory exactly as it was before the call (all messages or none).
        """
        if upsert and allow_duplicate_ids:
            raise InvalidInputError(
                "upsert=True replaces the message of an id; not with allow_duplicate_ids."
            )
        progress = check_progress(progress)
        messages = as_messages(items)
        for i, m in enumerate(messages):
            check_message(m, self.max_message_chars, i)
        t0 = time.perf_counter()
        report = AddReport()

        def insert() -> None:
            report.details.clear()  # a recomputed attempt starts over
            report.leaf_ids.clear()
            if not allow_duplicate_ids:
                self._make_room(messages, upsert, report.usage)
            if self.prefetch_messages and len(messages) > 1:
                self._prefetch(messages, report.usage)
            for m in messages:
                report.details.append(self._insert(m, report.usage))
                report.leaf_ids.append(self._store.leaf_at[self._store.n_inserted - 1])
                tick(len(report.leaf_ids))
            # new leaves first: their sentences' vectors come with them, before any summary is made
            self._embed_pending(report.usage, leaves_only=True)
            self._mark_supersession(report.leaf_ids, report.usage)
            self._before_commit(report.usage)
            self._embed_pending(report.usage)

        with self._lock, one_blas_thread(), progress_reporter(progress, len(messages)) as tick:
            self._transaction(report.usage, insert)
            self._record_seconds(report.usage, time.perf_counter() - t0)
        return report

    async def aadd(
        self,
        items: MessageLike | Iterable[MessageLike],
        *,
        upsert: bool = False,
        progress: ProgressLike = None,
    ) -> AddReport:
        """Async :meth:`add`: runs in a worker thread so the event loop is never blocked."""
        return await asyncio.to_thread(self.add, items, upsert=upsert, progress=progress)

    def delete(self, key: int | str) -> int:
        """Forget a leaf (by node id or by the caller's source id) or a whole subtree (internal node id).

        The structure is repaired (emptied internal nodes removed, ancestors' spans and annotations
        recomputed from their remaining children) and the vectors removed, in one atomic step. Once it
        is committed, the caches of the process forget the deleted messages: the summariser's
        ``forget(texts)`` (when it has one, as :class:`ExtractiveSummarizer
        <shared_core.models.extractive.ExtractiveSummarizer>` has) gets every sentence of them that no
        live node's text still holds, and the lexical index drops the removed and rewritten texts at
        once (see :meth:`_forget_texts`).

        Args:
            key: a node id (int) or a source id (``Message.id``, str; every leaf with that id).

        Returns:
            The number of leaves deleted.

        Raises:
            NodeNotFoundError: no such node or source id.
            PersistenceError: the durable store could not commit the deletion (nothing is deleted).
        """
        if isinstance(key, bool):
            raise InvalidInputError("delete takes a node id (int) or a source id (str).")
        usage = Usage()
        leaves: list[int] = []

        def find() -> None:
            if isinstance(key, (int, np.integer)) and int(key) in self._store:
                leaves[:] = self._store.leaves_under(int(key))
            elif isinstance(key, str) and key in self._store.by_source:
                leaves[:] = self._store.by_source[key]
            else:
                raise NodeNotFoundError(f"No node or source id {key!r} in this memory.")

        def remove() -> None:
            find()  # again: the transaction caught up with the other processes first
            self._delete_leaves(leaves, usage)
            self._before_commit(usage)
            self._embed_pending(usage)

        with self._lock, one_blas_thread():
            self._sync_store()
            find()
            self._transaction(usage, remove)
            return len(leaves)

    def _delete_leaves(self, leaves: Sequence[int], usage: Usage) -> None:
        """Generic repair: detach leaves, drop emptied ancestors, recompute spans and annotations."""
        st = self._store
        touched: set[int] = set()
        for lid in leaves:
            if lid not in st:
                continue
            parent = st.nodes[lid].parent
            st.detach(lid)
            st.delete_node(lid)
            while parent is not None and not st.nodes[parent].children and parent != st.root:
                gp = st.nodes[parent].parent
                st.detach(parent)
                st.delete_node(parent)
                touched.discard(parent)
                parent = gp
            if parent is not None:
                touched.add(parent)
        if (
            st.root is not None
            and st.root in st.nodes
            and not st.nodes[st.root].children
            and not st.nodes[st.root].is_leaf
        ):
            st.delete_node(st.root)
            touched.clear()
        # bottom-up: deepest first
        depth = st.depths()
        order: dict[int, None] = {}
        for nid in sorted(touched, key=lambda i: -depth.get(i, 0)):
            for a in [nid, *st.ancestors(nid)]:
                order.setdefault(a, None)
        for nid in sorted(order, key=lambda i: -depth.get(i, 0)):
            st.refresh_span(nid)
            self._reannotate(nid, usage)

    def clear(self) -> None:
        """Forget everything (configuration and models are kept); the summariser's cache is emptied too
        (its ``clear()``, else its ``forget(texts)`` with every text, when it has either)."""
        with self._lock:
            self._check_open()
            if self._durable is not None:
                seq = self._durable.seq + 1
                try:
                    self._durable.clear(self)
                except BaseException as e:
                    if not self._durable.landed(seq):
                        raise
                    self._reset()  # cleared in the database (its reply was lost): cleared here too
                    if not isinstance(e, Exception):
                        raise
                    return
            self._reset()

    def _reset(self) -> None:
        old = self._store
        self._store = NodeStore(self.contiguous_spans)
        self._index = None
        self._lexical = None
        self._arrays = NodeArrays()  # it holds the previous store until its next use otherwise
        self._structure_cache = None
        self._ns, self._ns_of, self._ns_dirty = None, None, set()
        self._set_state(self._initial_state())
        self._version += 1
        self._query_memo = None
        self._forget_all(old)

    def _initial_state(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ transactions
    # An add or delete is one transaction: the node store journals every change, the algorithm state is
    # snapshotted, and nothing outside them changes until _commit. _commit then applies the change to the
    # FAISS index (journaled too) and writes it to the durable store, whose COMMIT is the last step that
    # can fail; only then are the journals closed. An exception at any point before that (a model error,
    # a failed index update or SQLite write, KeyboardInterrupt, MemoryError) reaches _rollback, which
    # undoes the store, the state and the index. If the durable COMMIT landed although the write raised
    # (its reply was lost, or an interrupt came right after it), the change is kept in memory too (memory
    # and disk agree): the call succeeds, or an interrupt (not an Exception) propagates. If the store
    # cannot tell (CommitUnknownError), the memory rolls back and the store reloads it before its next
    # operation. A shared store computes a transaction with no lock held; when another process committed
    # meanwhile, its commit raises WriteConflictError and _transaction runs the transaction again from
    # _begin (which catches up, and this time holds the store's writer lock until the write ends), at most
    # the store's write_attempts times in all.
    def _transaction(self, usage: Usage, body: Callable[[], None]) -> None:
        """Run ``body`` (the changes of one add / delete / flush, models called) as one transaction:
        :meth:`_begin`, ``body()``, :meth:`_commit`; anything raised rolls it back. Call with the lock held.

        Raises:
            NamespaceBusyError: every attempt was overtaken by another process's commit.
            Whatever ``body`` or the store raised (the memory is as before).
        """
        attempts = max(1, int(getattr(self._durable, "write_attempts", 1)))
        for attempt in range(1, attempts + 1):
            self._begin(usage, exclusive=attempt > 1)
            try:
                body()
                self._commit()
            except WriteConflictError as e:
                self._rollback()
                if attempt < attempts:
                    continue  # computed from a stale state: catch up and compute again
                raise WriteConflictError(
                    f"{e} Gave up after {attempts} attempts: the namespace is busy; nothing was changed, "
                    "try again later.",
                    namespace=e.namespace,
                ) from None
            except BaseException:
                self._rollback()
                raise
            return

    def _begin(self, usage: Usage, exclusive: bool = False) -> None:
        self._check_open()
        if self._durable is not None:  # a shared store catches up with the other processes first
            if exclusive:
                self._durable.begin(self, exclusive=True)
            else:  # (a store of one process may define begin(mem) alone)
                self._durable.begin(self)
        self._store.begin()
        self._tx_usage = usage
        self._pending = {}
        self._tx_vecs = {}
        self._tx_composed = {}
        self._index_created = False
        self._state_snapshot = copy.deepcopy(self._get_state())

    def _commit(self) -> None:
        st = self._store
        changed, removed = st.pending()
        live = [i for i in changed if st.nodes[i].text]
        gone = removed | {i for i in changed if not st.nodes[i].text}
        vecs = np.stack([self._pending[i][1] for i in live]) if live else None
        if self._index is None and vecs is not None:
            self._index = NodeIndex(vecs.shape[1])
            self._index_created = True
        if self._index is not None:
            self._index.begin()
            self._index.remove(gone)
            if vecs is not None:
                self._index.upsert(live, vecs)
        interrupted: BaseException | None = None
        if self._durable is not None:
            seq = self._durable.seq + 1
            try:
                self._durable.commit(self)
            except BaseException as e:
                if not self._durable.landed(seq):  # CommitUnknownError when the store cannot tell
                    raise
                # the change is in the database: keep it in memory as well; an error (its reply was
                # lost) is then no failure, an interrupt still propagates
                interrupted = None if isinstance(e, Exception) else e
        # nothing below depends on the data: the change is now acknowledged
        if self._index is not None:
            self._index.commit()
        self._index_created = False
        forgotten = self._forgotten_texts(changed, removed)
        st.commit()
        if self._lexical is not None:
            self._lex_dirty |= set(live)
            self._lex_removed |= gone
        self._vectors_written(set(live) | gone)
        self._pending = {}
        self._tx_vecs = {}
        self._tx_composed = {}
        self._state_snapshot = None
        self._usage += self._tx_usage
        self._version += 1
        self._query_memo = None  # the last query's vector: its text may quote what was deleted
        if forgotten:  # a deletion: the caches of the process forget its texts too
            self._forget_texts(forgotten, set(live), gone)
        if interrupted is not None:
            raise interrupted

    def _vectors_written(self, ids: set[int]) -> None:
        """Hook: the indexed vectors of ``ids`` were just written or removed (a commit landed, or another
        process's commits were applied). Caches of index vectors refresh those rows (subclasses extend
        it and call this one); here: the IVF index over every node, when in use, will take them."""
        if self._ns is not None and not self._ns.exhaustive:
            self._ns_dirty |= ids

    def _rollback(self) -> None:
        """Undo the open transaction (no-op once it is committed)."""
        if self._durable is not None:
            self._durable.abort()
        if self._index is not None:
            self._index.rollback()
        if self._index_created:
            self._index = None
            self._index_created = False
        self._store.rollback()
        if self._state_snapshot is not None:
            self._set_state(self._state_snapshot)
        self._pending = {}
        self._tx_vecs = {}
        self._tx_composed = {}
        self._state_snapshot = None
        self._version += 1  # caches built during the transaction are stale
        self._query_memo = None

    def _record_seconds(self, usage: Usage, seconds: float) -> None:
        """Set the wall-clock ``seconds`` of a committed call (its other counters are already counted)."""
        self._usage.seconds += seconds - usage.seconds
        usage.seconds = seconds

    # ------------------------------------------------------------------ public: reading
    def retrieve(
        self,
        query: str,
        k: int | None = None,
        policy: str | None = None,
        *,
        max_tokens: int | None = None,
        time_range: Any = None,
        where: Any = None,
        min_score: float | None = None,
        as_of: Any = None,
        time_weight: float | None = None,
        **params: Any,
    ) -> list[Hit]:
        """Retrieve nodes for a query.

        Args:
            query: the query text (non-empty).
            k: at most this many hits (default: the memory's default, usually 10).
            policy: one of :attr:`policies` (default :attr:`default_policy`).
            max_tokens: optional budget of returned text in tokens (as :func:`count_tokens` counts);
                hits that would exceed it are skipped.
            time_range: optional ``(start, end)`` on ``Message.timestamp``: each a ``datetime``, ``date``,
                ISO-8601 string or ``None`` (open); a date-only end includes its whole day.
            where: optional condition on ``Message.metadata`` (equality, ``$eq``, ``$ne``, ``$in``,
                ``$nin``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$and``, ``$or``; see
                :mod:`shared_core.search.filters`) or a callable ``Message -> bool``. With a filter, a leaf is
                returned only when its message matches and any other node only when every message its
                text draws on does. Ranking policies apply it before top-k (propagation still runs over
                the whole tree); the search policies (HAT's greedy and LLM searches, xMemory's
                adaptive and representative, MemTree's traversal) search the whole tree and return only
                what passes.
            as_of: the time the question is asked at (``datetime``, ``date`` or ISO-8601; a date means the
                end of that day): no message timestamped after it comes back (one without a readable
                timestamp may), and the query's time expressions ("last Friday", "four weeks ago", "in
                June") resolve against it; default ``None``: nothing filtered, expressions resolve against
                the current time.
            time_weight: the bonus, in ``[0, 1]``, of a message inside a period the query names, added to
                its ranking figure divided by the best candidate's (a soft prior over the best
                ``max(4k, 40)`` candidates, never a filter; :mod:`shared_core.search.temporal`); default
                ``None`` = the memory's :attr:`time_weight`; 0 ignores time expressions.
            min_score: optional threshold in ``[0, 1]`` on :attr:`Hit.score` (the query's cosine
                similarity to the hit's text): of the top ``k`` in the policy's order, only the hits
                scoring at least this come back (so fewer than ``k``, maybe none).
            **params: the policy's parameters (see the subclass).

        Returns:
            Hits in the policy's order (best first), with distinct texts, except that a statement a newer
            message supersedes (as of ``as_of``) comes right after its successors when the retrieval found
            them (:mod:`~shared_core.memories.supersession`); each with a readable :attr:`Hit.score`, the
            policy's own figures in :attr:`Hit.components`, :meth:`Hit.explain` and the supersession marks
            (:attr:`Hit.superseded_by`, :attr:`Hit.valid_from`, :attr:`Hit.valid_to`).

        Raises:
            InvalidInputError: empty query, ``k < 1``, ``max_tokens < 1``, ``min_score`` or
                ``time_weight`` not a number in ``[0, 1]``, an unreadable ``as_of``, an invalid ``time_range``
                (not a pair, an unreadable bound, start after end) or ``where`` (unknown operator, wrong
                type, nested deeper than ``MAX_FILTER_DEPTH``, 32).
            EmbeddingError, ModelError: embedding the query failed (as :meth:`add`).
            UnknownPolicyError: a policy this memory does not have.
            LLMRequiredError: an LLM-only policy on a memory built without an LLM.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty string.")
        check_unicode(query, "query")
        policy = policy or self.default_policy
        if policy not in self.policies:
            raise UnknownPolicyError(
                f"{type(self).__name__} has no policy {policy!r}; choose one of {', '.join(self.policies)}."
            )
        if policy in self.llm_policies and self.llm is None:
            raise LLMRequiredError(
                f"policy {policy!r} needs an LLM; build the memory with llm=... or use another policy "
                f"({', '.join(p for p in self.policies if p not in self.llm_policies)})."
            )
        k, max_tokens, min_score = check_limits(self.default_k if k is None else k, max_tokens, min_score)
        flt = message_filter(time_range, where, as_of)
        accepted = inspect.signature(self._retrieve).parameters
        unknown = sorted(set(params) - set(accepted) - {"query", "policy", "k"})
        if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            names = ", ".join(n for n in accepted if n not in ("query", "policy", "k"))
            raise InvalidInputError(
                f"Unknown retrieval parameter(s) {', '.join(unknown)} for {type(self).__name__}; "
                f"use k=... for the number of hits; other parameters: {names}."
            )
        with self._lock, one_blas_thread():
            self._sync_store()
            if self._store.root is None:
                return []
            self._max_tokens = max_tokens
            self._allowed = None if flt is None else self._allowed_nodes(flt)
            self.last_candidates = None
            as_of = None if flt is None else flt.as_of
            cue = self._time_cue(query, as_of, time_weight)
            deep = max(4 * k, 40)
            fetch = k if cue is None else deep
            try:
                cands = self._shaped(self._retrieve(query, policy, fetch, **params), fetch)
                pool = cands
                if cue is not None:
                    cands = self._time_ranked(cands, cue)
                elif self._superseded_among(cands[:k], as_of):  # its successors may rank lower
                    pool = self._shaped(self._retrieve(query, policy, deep, **params), deep)
                cands = self._current_first(cands, as_of, pool)
                hits = self._readable(query, self._to_hits(cands, k, max_tokens), policy)
                hits = self._with_marks(hits, as_of)
            finally:
                self._max_tokens = None
                self._allowed = None
        if min_score is not None:
            hits = [h for h in hits if h.score >= min_score]
        return hits

    async def aretrieve(
        self, query: str, k: int | None = None, policy: str | None = None, **kw: Any
    ) -> list[Hit]:
        """Async :meth:`retrieve` (in a worker thread)."""
        return await asyncio.to_thread(self.retrieve, query, k, policy, **kw)

    default_k: ClassVar[int] = 10

    def to_dict(self) -> dict[str, Any]:
        """The whole memory as plain data (JSON-serialisable): format, kind, config, state, tree, usage.

        The in-process state as it is (no catch-up with a shared store: call :meth:`refresh` first for
        that), so it also works while the store is unreachable."""
        with self._lock:
            return {
                "format": self.FORMAT_VERSION,
                "kind": self.kind,
                "config": self._config(),
                "state": copy.deepcopy(self._get_state()),
                "tree": self._store.to_dict(),
                "usage": self._usage.to_dict(),
            }

    def __repr__(self) -> str:
        if self._closed:
            return f"{type(self).__name__}(closed)"
        return f"{type(self).__name__}(leaves={len(self)}, nodes={len(self._store)})"


def _require_llm(mem: HierarchicalMemory, what: str) -> LLM:
    if mem.llm is None:
        raise LLMRequiredError(f"{what} needs an LLM; build the memory with llm=... (e.g. OpenAIChat(...)).")
    return mem.llm
