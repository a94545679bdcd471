"""A LangGraph ``BaseStore`` whose semantic search is a hiermem memory per namespace."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    validate_op_namespace,
)

from shared_core.memories.base import HierarchicalMemory
from shared_core.search.filters import message_filter
from shared_core.types import HierMemError, Hit, InvalidInputError, Message, NodeNotFoundError

from .models import as_core_embedder, as_langchain_embeddings
from .retrievers import HierMemRetriever
from .store_marks import search_item
from .store_semantics import (
    SEARCH_OPTIONS,
    SearchOptions,
    check_filter,
    embedder_and_fields,
    item_matches,
    similarity_scores,
    split_text,
)
from .store_ttl import Expiry, TTLMixin, check_ttl

if TYPE_CHECKING:
    from .store_durable import DurableHierMemStore

__all__ = ["HierMemStore", "embedder_and_fields"]

Namespace = tuple[str, ...]
MemoryFactory = Callable[..., HierarchicalMemory]

#: The durable store class (:class:`~langchain_hiermem.store_durable.DurableHierMemStore`), registered by
#: its module (which subclasses :class:`HierMemStore`) with :func:`register_durable_store`.
_DURABLE: type[DurableHierMemStore] | None = None


def register_durable_store(cls: type[DurableHierMemStore]) -> type[DurableHierMemStore]:
    """Class decorator: the class :meth:`HierMemStore.from_conn_string` opens."""
    global _DURABLE
    _DURABLE = cls
    return cls


# Fields used as an item's text when neither the store nor the put names any (in this order).
DEFAULT_TEXT_FIELDS = ("text", "content")
# What SearchItem.score holds: LangGraph's query-text cosine, or the memory's relevance of the best hit.
SCORES = ("similarity", "relevance")
# At most this many rounds of widening the retrieval when hits collapse onto fewer keys than asked for
# (a key indexed by several texts, a summary standing for keys already found; a filter is applied by the
# memory before its top-k, so it collapses nothing).
_MAX_WIDEN = 8


@dataclass
class _Space:
    """One namespace: its items (insertion order), its memory and the memory leaves of each key."""

    items: dict[str, Item] = field(default_factory=dict)
    memory: HierarchicalMemory | None = None
    leaves: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    expiry: dict[str, Expiry] = field(default_factory=dict)


@dataclass
class _Added:
    """The texts one run of puts added to a namespace's memory, by key (leaf ids and texts in order), and
    how the run moves the namespace's items: ``removed`` keys leave their place (deleted at some point of
    the run), ``appended`` keys are new at the end, in the order the puts one by one would give."""

    ns: Namespace
    space: _Space
    ops: list[PutOp]
    leaves: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    appended: list[str] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)


def _as_namespace(namespace: Any, what: str = "namespace", allow_empty: bool = False) -> Namespace:
    """A namespace as a tuple of labels; a plain string is refused (``tuple("ab")`` would be ``("a", "b")``).

    Raises:
        InvalidNamespaceError: a string, not a tuple / list, an empty namespace (unless allowed) or a bad
            label (see LangGraph's namespace rules).
    """
    if isinstance(namespace, str) or not isinstance(namespace, (tuple, list)):
        raise InvalidNamespaceError(
            f"A {what} is a tuple of strings such as ('users', 'alice'); got {namespace!r}. Wrap a single "
            f"label in a tuple: ({namespace!r},)."
        )
    ns = tuple(namespace)
    if not ns and not allow_empty:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    validate_op_namespace(GetOp(ns, ""))
    return ns


def _ns_matches(cond: MatchCondition, ns: Namespace) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    part = ns[: len(path)] if cond.match_type == "prefix" else ns[len(ns) - len(path) :]
    if cond.match_type not in ("prefix", "suffix"):
        raise InvalidInputError(f"match_type must be 'prefix' or 'suffix', got {cond.match_type!r}.")
    return all(p == "*" or p == n for p, n in zip(path, part))


class HierMemStore(TTLMixin, SearchOptions, BaseStore):
    """A LangGraph long-term memory store backed by hiermem memories, one per namespace.

    Items are kept as key -> value dicts per namespace (``get``, listing, filters) and the text of each
    item is added to that namespace's memory as a message whose source id is the key, so
    ``search(namespace, query=...)`` is a hierarchical-memory retrieval with the memory's policy (e.g.
    SegTreeMem's ``collapsed``, or ``policy="top_down"``: relevance propagated through the tree).
    Namespaces never share a memory.

    Text of an item: the ``index`` fields of the put (LangGraph path syntax: ``"memory"``,
    ``"a.b"``, ``"list[*].text"``, ``"$"`` = the whole value as JSON), else the store's ``fields``, else
    the value's ``"text"`` field, else its ``"content"`` field (non-empty strings), else the whole value as
    JSON. Every extracted text becomes one leaf; ``index=False`` stores the item without indexing it.
    Updating a key adds the new text(s) first and then deletes the key's old leaves; deleting a key
    (``value=None``) deletes its leaves (core ``delete``).

    Search with ``query``: the memory's hits, best first; an internal node's hit stands for the items
    under it (its ``source_ids``), a leaf's hit for its key and any other key that indexed the same text
    (a memory never returns one text twice); each item is kept once, where its best hit ranks. Its
    ``score`` is, as in LangGraph's stores, the cosine similarity of the query and the item's embedded
    text (the best of its texts), read from the memory's node vectors (``score="relevance"``: the
    memory's score of the best hit instead). Over several namespaces the per-namespace rankings are
    interleaved by rank. Non-indexed items matching the filter follow, without a score. Ranked items are
    :class:`~langchain_hiermem.store_marks.MarkedSearchItem`: ``superseded_by`` (keys of newer items that
    replaced the text), ``valid_from`` and ``valid_to`` (the core's supersession marks).
    ``filter`` matches item values as LangGraph's ``InMemoryStore`` does (see
    :mod:`langchain_hiermem.store_semantics`: nested dicts, lists and tuples element by element,
    ``$eq $ne $gt $gte $lt $lte``, dotted paths such as ``"user.level"``); a query search hands it to the
    memory (``retrieve(where=...)``), which applies it before its top-k, so ``limit`` matching items
    come back whenever that many exist (a summary's hit then counts only when every item under it
    matches). A text over the memory's ``max_message_chars`` (100,000) is indexed as consecutive parts
    within the limit, all under the item's key (found once, deleted together); the item keeps its value
    whole.
    Search without ``query`` lists items in namespace then insertion order. ``limit`` / ``offset``
    paginate both.

    Args:
        memory_factory: builds the memory of a new namespace: a callable taking the namespace tuple, or
            no argument; it must return a new, empty memory on every call (a memory already used by
            another namespace, or holding messages, is refused). Default ``None`` =
            ``SegTreeMem(embedder=<the store's embedder>, **memory_kwargs)``.
        embedder: a core embedder or a LangChain ``Embeddings`` shared by the default memories; default
            the local MiniLM (``LocalEmbedder``).
        fields: default text fields (LangGraph path syntax) for puts without ``index``; default ``None``
            (``"text"``, then ``"content"``, then the whole value).
        memory_kwargs: keyword arguments of the default ``SegTreeMem`` (e.g. ``{"relevance": "dense"}``).
        policy: retrieval policy of query searches, default ``None`` (each memory's default).
        search_kwargs: the policy's parameters for query searches (e.g. ``{"alpha": 0.1}``), default ``{}``.
        index: LangGraph's ``IndexConfig`` instead of ``embedder`` / ``fields``:
            ``{"dims": 384, "embed": embeddings, "fields": ["text"]}`` (see :func:`embedder_and_fields`);
            kept (a copy) as :attr:`index_config`, ``None`` without it; its ``embed`` as a LangChain
            ``Embeddings`` in :attr:`embeddings` (``None`` without ``index``), as LangGraph's stores.
        score: what ``SearchItem.score`` of a query search holds: ``"similarity"`` (default; the cosine
            of the query and the item's text, in ``[-1, 1]``, as LangGraph's stores) or ``"relevance"``
            (the memory's ranking figure of the item's best hit, ``Hit.components["rank"]``, e.g.
            SegTreeMem's hybrid relevance).
        ttl: LangGraph's ``TTLConfig`` (``default_ttl`` minutes, ``refresh_on_read``, ``omit_expired``,
            ``sweep_interval_minutes``), default ``None``: items expire only when a put gives ``ttl=``;
            see :mod:`langchain_hiermem.store_ttl` (kept, a copy, as :attr:`ttl_config`).

    Raises:
        InvalidInputError: ``score`` not ``"similarity"`` or ``"relevance"``; both ``memory_factory``
            and ``embedder`` / ``memory_kwargs`` (or an ``index`` with ``embed``) given; ``index``
            together with ``embedder`` or ``fields``; a ``fields`` entry that is not a string; a
            malformed ``index`` or ``ttl``.

    A store that survives restarts: :meth:`from_conn_string` (SQLite file or PostgreSQL URL).

    References:
        LangGraph ``BaseStore`` (``langgraph.store.base``); core ``HierarchicalMemory.add`` /
        ``retrieve`` / ``delete``.
    """

    def __init__(
        self,
        *,
        memory_factory: MemoryFactory | None = None,
        embedder: Any = None,
        fields: list[str] | None = None,
        memory_kwargs: dict[str, Any] | None = None,
        policy: str | None = None,
        search_kwargs: dict[str, Any] | None = None,
        index: IndexConfig | None = None,
        score: str = "similarity",
        ttl: TTLConfig | None = None,
    ) -> None:
        self._init_ttl(ttl)
        if score not in SCORES:
            raise InvalidInputError(f"score must be 'similarity' or 'relevance', got {score!r}.")
        #: LangGraph's ``IndexConfig`` given to the constructor (a copy), else ``None``.
        self.index_config: IndexConfig | None = index.copy() if isinstance(index, dict) else index
        self.score = score
        if index is not None:
            if embedder is not None or fields is not None:
                raise InvalidInputError(
                    "Give either index (LangGraph's IndexConfig) or embedder / fields, not both."
                )
            embedder, fields = embedder_and_fields(index)
        if memory_factory is not None and (embedder is not None or memory_kwargs):
            raise InvalidInputError(
                "Give either memory_factory or embedder / memory_kwargs (which configure the default "
                "SegTreeMem factory), not both."
            )
        if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
            raise InvalidInputError("fields must be a list of field paths (strings), e.g. ['text'].")
        self._factory = memory_factory
        self._factory_takes_ns = memory_factory is not None and self._takes_argument(memory_factory)
        self._embedder = as_core_embedder(embedder)
        #: LangChain ``Embeddings`` of ``index["embed"]`` (as LangGraph's stores), else ``None``.
        self.embeddings = as_langchain_embeddings(self._embedder) if self.index_config else None
        self.fields = list(fields) if fields is not None else None
        self.memory_kwargs = dict(memory_kwargs or {})
        self.policy = policy
        self.search_kwargs = dict(search_kwargs or {})
        self._spaces: dict[Namespace, _Space] = {}
        self._lock = threading.RLock()

    @staticmethod
    def _takes_argument(fn: Callable[..., Any]) -> bool:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return True
        return any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) and p.default is p.empty
            for p in params
        )

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn: str | os.PathLike[str],
        *,
        index: IndexConfig | None = None,
        **kwargs: Any,
    ) -> Iterator[DurableHierMemStore]:
        """A store kept in a database, open for the ``with`` block (closed when it ends).

        Items and each namespace's memory are committed before every put returns, so a new process that
        opens the same ``conn`` gets the same ``get`` / ``search`` / ``list_namespaces`` results. On
        PostgreSQL several processes may use the store at once, each seeing the others' writes; an SQLite
        store serves one process at a time. See
        :class:`~langchain_hiermem.store_durable.DurableHierMemStore`.

        Args:
            conn: the path of an SQLite file (the memories go to the directory ``<file>.memories`` next
                to it) or a ``postgresql://user:password@host:5432/dbname`` URL (items and memories in
                that database).
            index: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``), see
                :func:`embedder_and_fields`.
            **kwargs: the other arguments of :class:`HierMemStore` (``memory_factory``, ``embedder``,
                ``fields``, ``memory_kwargs``, ``policy``, ``search_kwargs``, ``ttl``) and of the durable
                store (``max_resident``: most namespace memories open at once, default 256;
                ``synchronous`` for SQLite, ``pool_size`` for PostgreSQL).

        Returns:
            A context manager giving the open store.

        Raises:
            InvalidInputError: a malformed path or URL, or a bad argument.
            PersistenceError: the database is not a hiermem LangGraph store, the SQLite file is in use
                by another process, or the server cannot be reached.
            VersionMismatchError: the store was written by another layout version.

        Example:
            >>> with HierMemStore.from_conn_string("agent.sqlite", index={"embed": emb}) as store:
            ...     store.put(("users", "ann"), "dog", {"text": "My dog is called Luna."})
        """
        if _DURABLE is None:  # registered by langchain_hiermem.store_durable, imported with the package
            raise RuntimeError(
                "langchain_hiermem.store_durable is not loaded; import langchain_hiermem first."
            )
        store = _DURABLE(conn, index=index, **kwargs)
        try:
            yield store
        finally:
            store.close()

    # ------------------------------------------------------------------ memories
    def _memory(self, namespace: Namespace, space: _Space) -> HierarchicalMemory | None:
        """The memory of a namespace's space (``None`` while it has none); a durable store loads it here."""
        return space.memory

    def _new_memory(self, namespace: Namespace, pending: Iterable[_Added] = ()) -> HierarchicalMemory:
        """A new, empty memory for ``namespace`` (never one another namespace uses, ``pending`` included)."""
        return self._build_memory(namespace, pending)

    def _build_memory(self, namespace: Namespace, pending: Iterable[_Added] = ()) -> HierarchicalMemory:
        """Build the memory of ``namespace`` with the factory and check it is new, empty and not shared.

        Raises:
            InvalidInputError: the factory returned something else than a new, empty, unshared memory.
        """
        if self._factory is not None:
            mem = self._factory(namespace) if self._factory_takes_ns else self._factory()
        else:
            from shared_core.memories.segtree import SegTreeMem

            if self._embedder is None:
                from shared_core.models.local import LocalEmbedder

                self._embedder = LocalEmbedder()
            mem = SegTreeMem(embedder=self._embedder, **self.memory_kwargs)
        if not isinstance(mem, HierarchicalMemory):
            raise InvalidInputError(
                f"memory_factory must return a hiermem memory (e.g. SegTreeMem()), got {type(mem).__name__}."
            )
        spaces = [*self._spaces.items(), *((a.ns, a.space) for a in pending)]
        owner = next((ns for ns, sp in spaces if sp.memory is mem), None)
        if owner is not None:
            raise InvalidInputError(
                f"memory_factory returned the memory of namespace {owner!r} again for {namespace!r}; "
                "namespaces never share a memory: build a new one on every call (e.g. "
                "lambda: SegTreeMem(embedder=emb))."
            )
        if len(mem) or mem.stats()["nodes"]:
            raise InvalidInputError(
                f"memory_factory returned a memory that already holds {len(mem)} message(s) for the new "
                f"namespace {namespace!r}; it must return a new, empty memory on every call."
            )
        return mem

    def get_memory(self, namespace: tuple[str, ...]) -> HierarchicalMemory | None:
        """The core memory of a namespace (``None`` until something was indexed in it).

        Raises:
            InvalidNamespaceError: a string or otherwise invalid namespace.
        """
        ns = _as_namespace(namespace)
        with self._lock:
            space = self._spaces.get(ns)
            return self._memory(ns, space) if space is not None else None

    def as_retriever(self, namespace: tuple[str, ...], **kwargs: Any) -> HierMemRetriever:
        """A :class:`~langchain_hiermem.retrievers.HierMemRetriever` over one namespace's memory.

        Args:
            namespace: the namespace (its memory is created when it does not exist yet).
            **kwargs: ``HierMemRetriever`` fields (``k``, ``policy``, ``max_tokens``, ``search_kwargs``).

        Returns:
            The retriever; it sees this namespace's memory only (not its sub-namespaces).

        Raises:
            InvalidNamespaceError: a string or otherwise invalid namespace.
        """
        ns = _as_namespace(namespace)
        with self._lock:
            space = self._spaces.setdefault(ns, _Space())
            if self._memory(ns, space) is None:
                space.memory = self._new_memory(ns)
            assert space.memory is not None
            return HierMemRetriever(memory=space.memory, **kwargs)

    # ------------------------------------------------------------------ batch
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run operations in order; consecutive puts are applied together (one ``add`` per namespace).

        Returns:
            One result per op: ``Item | None`` (get), ``list[SearchItem]`` (search), ``None`` (put),
            ``list[tuple[str, ...]]`` (list namespaces).

        Raises:
            InvalidNamespaceError: a bad namespace label, a namespace given as a plain string (wrap it:
                ``("alice",)``), or an empty namespace in a put.
            InvalidInputError: a put value that is not a mapping, negative ``limit`` / ``offset``, an
                unsupported filter operator; a ``memory_factory`` that returned a memory another namespace
                uses or one that is not empty.
            HierMemError: a memory failed; a run of consecutive puts whose ``add`` fails leaves the
                store's items and indexed texts as before (ops earlier in the batch stay applied).
        """
        ops = list(ops)
        for op in ops:
            if not isinstance(op, (GetOp, SearchOp, PutOp, ListNamespacesOp)):
                raise InvalidInputError(f"Unknown store operation {type(op).__name__}.")
            if isinstance(op, SearchOp):
                _as_namespace(op.namespace_prefix, "namespace prefix", allow_empty=True)
            elif isinstance(op, (GetOp, PutOp)):
                _as_namespace(op.namespace, allow_empty=True)
            else:
                for cond in op.match_conditions or ():
                    _as_namespace(cond.path, "match condition path", allow_empty=True)
            validate_op_namespace(op)
            if isinstance(op, PutOp):
                check_ttl(op.ttl)
                if not op.namespace:
                    raise InvalidNamespaceError("Namespace cannot be empty.")
                if op.value is not None and not isinstance(op.value, Mapping):
                    raise InvalidInputError(
                        f"A put value must be a mapping (dict) or None, got {type(op.value).__name__}."
                    )
        ops = [self._check_put(op) if isinstance(op, PutOp) else op for op in ops]
        results: list[Result] = [None] * len(ops)
        with self._lock:
            i = 0
            while i < len(ops):
                op = ops[i]
                if isinstance(op, PutOp):
                    j = i
                    while j < len(ops) and isinstance(ops[j], PutOp):
                        j += 1
                    self._apply_puts(ops[i:j])  # type: ignore[arg-type]
                    i = j
                    continue
                if isinstance(op, GetOp):
                    now = self._clock()
                    space = self._spaces.get(tuple(op.namespace))
                    item = space.items.get(op.key) if space is not None else None
                    results[i] = None if item is None or op.key in self._hidden(space, now) else item
                    if results[i] is not None and op.refresh_ttl:
                        self._refresh({tuple(op.namespace): [op.key]}, now)
                elif isinstance(op, SearchOp):
                    now = self._clock()
                    found = results[i] = self._search(op, now)
                    if found and op.refresh_ttl:
                        touched: dict[Namespace, list[str]] = {}
                        for it in found:
                            touched.setdefault(tuple(it.namespace), []).append(it.key)
                        self._refresh(touched, now)
                else:
                    results[i] = self._list_namespaces(op)
                i += 1
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`, run in a worker thread so the event loop is not blocked."""
        return await asyncio.to_thread(self.batch, list(ops))

    def _check_put(self, op: PutOp) -> PutOp:
        """A valid put as it is to be applied (a durable store checks and normalises it here)."""
        return op

    # ------------------------------------------------------------------ puts
    def _texts(self, value: Mapping[str, Any], index: Any) -> list[tuple[str, str]]:
        """``(path, text)`` pairs to index for a value (see the class docstring)."""
        if index is False:
            return []
        paths = index if index is not None else self.fields
        out: list[tuple[str, str]] = []
        if paths is None:
            for name in DEFAULT_TEXT_FIELDS:
                v = value.get(name)
                if isinstance(v, str) and v.strip():
                    return [(name, v)]
            return [("$", json.dumps(dict(value), ensure_ascii=False, sort_keys=True, default=str))]
        for path in paths:
            texts = [t for t in get_text_at_path(dict(value), path) if t.strip()]
            for n, t in enumerate(texts):
                out.append((path if len(texts) == 1 else f"{path}.{n}", t))
        return out

    def _apply_puts(self, ops: list[PutOp]) -> None:
        """Apply a run of puts: first every namespace's new texts (one ``add`` each), then the removals.

        If an ``add`` fails, the texts already added to other namespaces in this run are deleted again
        and nothing else changes, so the store holds the same items and texts as before. A put of a key
        whose item expired (and is left out of reads) makes a new item, as after the item was swept.
        """
        now = self._clock()
        gone = {
            (tuple(op.namespace), op.key)
            for op in ops
            if (space := self._spaces.get(tuple(op.namespace))) is not None
            and op.key in self._hidden(space, now)
        }
        ops = [*(PutOp(ns, key, None) for ns, key in sorted(gone)), *ops]
        last: dict[tuple[Namespace, str], PutOp] = {}
        for op in ops:  # the last put of a key wins
            last.pop((tuple(op.namespace), op.key), None)
            last[(tuple(op.namespace), op.key)] = op
        by_ns: dict[Namespace, list[PutOp]] = {tuple(op.namespace): [] for op in ops}
        for (ns, _), op in last.items():
            by_ns[ns].append(op)
        moves = self._moves(ops)
        added: list[_Added] = []
        try:
            for ns, group in by_ns.items():
                added.append(self._add_texts(ns, group, added))
                added[-1].appended, added[-1].removed = moves[ns]
            self._commit_puts(added, now)
        except BaseException:
            for a in added:
                for lids in a.leaves.values():
                    self._forget(a.space, "", lids, warn=False)
            self._undo_puts(added)
            raise
        for a in added:
            self._finish_puts(a, now)

    def _moves(self, ops: list[PutOp]) -> dict[Namespace, tuple[list[str], set[str]]]:
        """Per namespace, the keys a run of puts appends (in order) and removes from their place, as the
        puts one by one would: an update keeps an item's place, a delete and a new put move it last."""
        moves: dict[Namespace, tuple[list[str], set[str], set[str]]] = {}
        for op in ops:
            ns = tuple(op.namespace)
            if ns not in moves:
                space = self._spaces.get(ns)
                moves[ns] = ([], set(), set(space.items) if space is not None else set())
            appended, removed, present = moves[ns]
            if op.value is None:
                if op.key in present:
                    present.discard(op.key)
                    if op.key in appended:
                        appended.remove(op.key)
                    else:
                        removed.add(op.key)
            elif op.key not in present:
                present.add(op.key)
                appended.append(op.key)
        return {ns: (appended, removed) for ns, (appended, removed, _) in moves.items()}

    def _commit_puts(self, added: list[_Added], now: datetime) -> None:
        """Every namespace's new texts are in; make the run's items durable (nothing to do in RAM).

        Raises:
            HierMemError: the run cannot be committed; the new texts are deleted again and nothing changes.
        """

    def _undo_puts(self, added: list[_Added]) -> None:
        """A run of puts failed and its new texts were deleted again (a durable store cleans up here)."""

    def _add_texts(self, ns: Namespace, ops: list[PutOp], pending: list[_Added]) -> _Added:
        space = self._spaces.get(ns) or _Space()
        self._memory(ns, space)
        texts = [
            (op.key, path, text)
            for op in ops
            if op.value is not None
            for path, text in self._texts(op.value, op.index)
        ]
        if texts and space.memory is None:
            space.memory = self._new_memory(ns, pending)
        limit = int(getattr(space.memory, "max_message_chars", 0) or 0)
        put_at = self._clock().replace(tzinfo=None).isoformat()  # UTC wall clock: what as_of compares
        messages: list[Message] = []
        for key, path, text in texts:
            parts = split_text(text, limit) if limit and len(text) > limit else [text]
            for n, part in enumerate(parts):  # a text over the memory's limit is indexed in parts
                md: dict[str, Any] = {"namespace": list(ns), "key": key, "field": path}
                if len(parts) > 1:
                    md.update(part=n, parts=len(parts))
                messages.append(Message(part, id=key, timestamp=put_at, metadata=md))
        added = _Added(ns, space, ops)
        if messages:
            assert space.memory is not None
            # atomic: on error this memory is unchanged; a key's fields and parts share its id
            report = space.memory.add(messages, allow_duplicate_ids=True)
            for m, lid in zip(messages, report.leaf_ids):
                added.leaves.setdefault(m.id or "", []).append(lid)
                added.texts.setdefault(m.id or "", []).append(m.text)
        return added

    def _finish_puts(self, a: _Added, now: datetime) -> None:
        """The new texts are in: forget the old texts of updated / deleted keys, then update the items."""
        space = a.space
        for op in a.ops:
            old = space.leaves.pop(op.key, [])
            old_texts = space.texts.pop(op.key, [])
            stale = self._forget(space, op.key, old)
            left = [*a.leaves.get(op.key, []), *stale]
            if left:
                space.leaves[op.key] = left
                space.texts[op.key] = [*a.texts.get(op.key, []), *old_texts[len(old) - len(stale) :]]
        final = {op.key: op for op in a.ops}
        for key, op in final.items():
            expiry = self._expiry_of(op, now) if op.value is not None else None
            if expiry is None:
                space.expiry.pop(key, None)
            else:
                space.expiry[key] = expiry
        for key in a.removed:
            space.items.pop(key, None)
        kept = [k for k, op in final.items() if op.value is not None and k in space.items]
        for key in [*kept, *a.appended]:
            prev = space.items.get(key)
            space.items[key] = Item(
                value=dict(final[key].value or {}),
                key=key,
                namespace=a.ns,
                created_at=prev.created_at if prev is not None else now,
                updated_at=now,
            )
        self._spaces[a.ns] = space

    @staticmethod
    def _forget(space: _Space, key: str, leaves: list[int], warn: bool = True) -> list[int]:
        """Delete a key's old leaves from the memory; return those that could not be deleted.

        A leaf whose deletion fails (e.g. the LLM re-annotating its ancestors failed) stays attached to
        the key, so search still maps it to the key's current value and the next put of the key retries.
        """
        for n, lid in enumerate(leaves):
            try:
                assert space.memory is not None
                space.memory.delete(lid)
            except NodeNotFoundError:
                continue
            except HierMemError as e:
                if not warn:
                    continue
                warnings.warn(
                    f"Could not remove the previous text of key {key!r} from its memory ({e}); it stays "
                    "indexed under that key and is removed on the key's next put or delete.",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return leaves[n:]
        return []

    # ------------------------------------------------------------------ search
    def _search(self, op: SearchOp, now: datetime) -> list[SearchItem]:
        if op.limit < 0 or op.offset < 0:
            raise InvalidInputError(f"limit and offset must be >= 0, got {op.limit} and {op.offset}.")
        check_filter(op.filter)
        prefix = tuple(op.namespace_prefix)
        spaces = [(ns, s) for ns, s in self._spaces.items() if ns[: len(prefix)] == prefix and s.items]
        want = op.offset + op.limit
        if want == 0:
            return []

        flt = self._filter_form(op.filter) if op.filter else None
        hidden = {ns: h for ns, s in spaces if (h := self._hidden(s, now))}
        spaces = [(ns, s) for ns, s in spaces if len(hidden.get(ns, ())) < len(s.items)]

        def keep(item: Item) -> bool:
            return item.key not in hidden.get(tuple(item.namespace), ()) and item_matches(item.value, flt)

        if not op.query:
            out = [search_item(it) for _, s in spaces for it in s.items.values() if keep(it)]
            return out[op.offset : want]
        rankings = [
            self._ranked(ns, s, op.query, want, keep if op.filter or ns in hidden else None)
            for ns, s in spaces
        ]
        ranked: list[SearchItem] = []
        for r in range(max((len(x) for x in rankings), default=0)):
            ranked.extend(sorted((x[r] for x in rankings if r < len(x)), key=lambda it: -(it.score or 0.0)))
        if len(ranked) < want:  # items that are not indexed come last, without a score
            ranked.extend(
                search_item(it)
                for _, s in spaces
                for key, it in s.items.items()
                if key not in s.leaves and keep(it)
            )
        return ranked[op.offset : want]

    @staticmethod
    def _filter_form(flt: Mapping[str, Any]) -> Mapping[str, Any]:
        """The filter as it is compared with the stored values (a durable store: in JSON form)."""
        return flt

    def _ranked(
        self, ns: Namespace, space: _Space, query: str, want: int, keep: Callable[[Item], bool] | None
    ) -> list[SearchItem]:
        """Items of one namespace for a query, best first (at most ``want``).

        ``keep`` is the search's filter on items (``None``: every item). It is handed to the memory as
        ``retrieve(where=...)``, so the memory ranks only the texts of matching items before its top-k
        (see :meth:`_where`): ``want`` matching items come back whenever the namespace has them, however
        far below other items they rank.
        """
        mem = self._memory(ns, space)
        if mem is None or len(mem) == 0:
            return []
        # hits never repeat a text: a leaf hit also stands for the other keys that indexed the same text
        twins: dict[str, list[str]] = {}
        for key, texts in space.texts.items():
            for text in texts:
                twins.setdefault(text, []).append(key)
        params = {**self.search_kwargs, **(SEARCH_OPTIONS.get() or {})}
        if keep is not None:
            params["where"] = self._where(space, twins, keep, params.get("where"))
        k = want
        for _ in range(_MAX_WIDEN):
            hits = mem.retrieve(query, k=k, policy=self.policy, **params)
            out: list[tuple[Item, float, Hit]] = []
            seen: set[str] = set()
            for h in hits:
                keys = [*h.source_ids, *twins.get(h.text, ())] if h.is_leaf else h.source_ids
                for key in keys:
                    item = space.items.get(key)
                    if key in seen or item is None or (keep is not None and not keep(item)):
                        continue
                    seen.add(key)
                    out.append((item, h.components.get("rank", h.score), h))
            if len(out) >= want or len(hits) < k:
                break
            k *= 2
        out = out[:want]
        if self.score == "similarity" and out:
            leaves = {it.key: space.leaves.get(it.key, []) for it, _, _ in out}
            sims = similarity_scores(mem, query, leaves)
            return [search_item(it, sims.get(it.key), h) for it, _, h in out]
        return [search_item(it, score, h) for it, score, h in out]

    @staticmethod
    def _where(
        space: _Space, twins: Mapping[str, list[str]], keep: Callable[[Item], bool], extra: Any = None
    ) -> Callable[[Message], bool]:
        """The ``where=`` predicate of a filtered query search over one namespace's memory.

        A message (a leaf) passes when an item it stands for passes ``keep``: the item of its key (the
        message id) or of another key that indexed the same text, as :meth:`_ranked` maps hits to items.
        Leaves sharing a text thus pass or fail together, and a passing leaf ranks where it ranked without
        the filter. A summary passes only when every leaf under it does (the core's rule).

        Args:
            space: the namespace (its items; they do not change while the search holds the lock).
            twins: the keys that indexed each text.
            keep: the filter on items.
            extra: a ``where`` the store's ``search_kwargs`` give, which must hold as well (``None``:
                none).

        Raises:
            InvalidInputError: an invalid ``extra`` condition.
        """
        also = message_filter(where=extra) if extra is not None else None
        verdict: dict[str, bool] = {}

        def passes(key: str) -> bool:
            if key not in verdict:
                item = space.items.get(key)
                verdict[key] = item is not None and keep(item)
            return verdict[key]

        def where(message: Message) -> bool:
            keys = [message.id] if message.id is not None else []
            if not any(passes(key) for key in [*keys, *twins.get(message.text, ())]):
                return False
            return also is None or also.matches(message)

        return where

    # ------------------------------------------------------------------ namespaces
    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if op.limit < 0 or op.offset < 0:
            raise InvalidInputError(f"limit and offset must be >= 0, got {op.limit} and {op.offset}.")
        now = self._clock()
        names = [ns for ns, s in self._spaces.items() if len(s.items) > len(self._hidden(s, now))]
        if op.match_conditions:
            names = [ns for ns in names if all(_ns_matches(c, ns) for c in op.match_conditions)]
        if op.max_depth is not None:
            names = sorted({ns[: op.max_depth] for ns in names})
        else:
            names = sorted(names)
        return names[op.offset : op.offset + op.limit]
