"""LlamaIndex indices over hiermem memories: SegTreeIndex, MemTreeIndex, HATIndex and XMemoryIndex.

Each index is a ``BaseIndex[IndexGraph]`` holding one core memory. Parsed nodes (after the usual node
parsing / transformations) become the memory's leaves, in order: one core
:class:`~shared_core.types.Message` per node with ``id = node.node_id``, ``text = node content without
metadata`` (``MetadataMode.NONE``) and ``metadata = node.metadata``. The memory builds its internal
nodes (summaries / annotations) itself; the docstore holds the leaves' nodes, and the ``IndexGraph``
mirrors the whole tree (leaves under their node ids, internal nodes as ``"{index_id}/{core id}"``).

Persistence: the index registers a :class:`HierMemVectorStore` in its storage context, so
``index.storage_context.persist(persist_dir)`` also saves the memory to
``persist_dir/hiermem/<index_id>`` (the core's JSON + FAISS format; never pickle). Reload with
``SegTreeIndex.from_persist_dir(persist_dir)`` or
:func:`load_index_from_storage(StorageContext.from_defaults(persist_dir=d), persist_dir=d)
<load_index_from_storage>`. Like LlamaIndex's own stores, all of these take an fsspec filesystem ``fs=``
(e.g. ``fsspec.filesystem("memory")``, S3, GCS): the memory is written to a local temporary directory
by the core and its files are copied through ``fs`` (and back on load).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.data_structs.data_structs import IndexGraph
from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent
from llama_index.core.storage.docstore.types import RefDocInfo
from llama_index.core.storage.storage_context import StorageContext

from shared_core.memories.base import HierarchicalMemory
from shared_core.stores.files import read_save
from shared_core.types import (
    InvalidInputError,
    Message,
    NodeNotFoundError,
    PersistenceError,
    VersionMismatchError,
)

from .models import resolve_embedder, resolve_llm
from .persistence import (
    _local_dir,
    _memory_path,
    _readable_save,
    _store_key,
)
from .retrievers import HierMemRetriever, policy_param_names
from .vector_store import HierMemVectorStore

__all__ = [
    "HATIndex",
    "HierMemIndex",
    "HierMemVectorStore",
    "MemTreeIndex",
    "SegTreeIndex",
    "XMemoryIndex",
    "load_index_from_storage",
]

logger = logging.getLogger(__name__)


# =========================================================================== indices
class HierMemIndex(BaseIndex[IndexGraph]):
    """A LlamaIndex index holding a hiermem memory (base of the four algorithm indices).

    Build it ``from_documents(docs)`` (documents are parsed into nodes by ``transformations`` /
    ``Settings.transformations`` first) or from parsed nodes (``nodes=``); every node becomes a leaf in
    order. ``HierMemIndex`` itself wraps a given ``memory=`` of any kind; the subclasses build theirs.

    Args:
        nodes: parsed nodes to store, in order; default ``None`` (an empty index to insert into).
        memory: a ready core memory to use (with its own models and options); default ``None`` = build
            one of the subclass's kind from ``embed_model``, ``llm`` and ``**memory_kwargs``.
        embed_model: a LlamaIndex ``BaseEmbedding`` or core embedder; default ``None`` =
            ``Settings.embed_model`` when set, else the embedded local model (all-MiniLM-L6-v2, offline).
        llm: a LlamaIndex ``LLM`` or core LLM for summaries and LLM decisions; default ``None`` =
            ``Settings.llm`` when set, else no LLM (extractive summaries).
        persist_dir: with ``index_struct``: the directory given to ``storage_context.persist`` whose
            memory to load; default ``None``.
        fs: with ``index_struct``: the fsspec filesystem ``persist_dir`` is in; default ``None`` = the
            local disk.
        index_struct: a stored ``IndexGraph`` (reload path, used by :func:`load_index_from_storage`).
        storage_context: LlamaIndex storage (docstore, index store, ...); default a new in-memory one.
        callback_manager: LlamaIndex callbacks; default ``Settings.callback_manager``.
        transformations: node parsers / transformations used by :meth:`insert`; default
            ``Settings.transformations``.
        show_progress: LlamaIndex progress bars, default ``False``.
        **memory_kwargs: options of the memory's constructor (e.g. SegTreeMem ``threshold=0.3``,
            ``relevance="dense"``).

    Raises:
        InvalidInputError: a node without text, with non-JSON metadata or already stored; an option the
            memory does not take; ``memory`` together with models or options; a reload without
            ``persist_dir``; ``fs`` without ``index_struct``.
        PersistenceError, VersionMismatchError: the saved memory cannot be loaded.

    References:
        LlamaIndex ``BaseIndex`` / ``IndexGraph``; the memories' papers (see each subclass).
    """

    index_struct_cls = IndexGraph
    #: Module and class name of the core memory this index builds (imported on first use).
    memory_module: ClassVar[str | None] = None
    memory_class_name: ClassVar[str | None] = None

    def __init__(
        self,
        nodes: Sequence[BaseNode] | None = None,
        *,
        memory: HierarchicalMemory | None = None,
        embed_model: Any = None,
        llm: Any = None,
        persist_dir: str | os.PathLike[str] | None = None,
        fs: Any = None,
        index_struct: IndexGraph | None = None,
        storage_context: StorageContext | None = None,
        callback_manager: CallbackManager | None = None,
        transformations: list[TransformComponent] | None = None,
        show_progress: bool = False,
        **memory_kwargs: Any,
    ) -> None:
        if fs is not None and index_struct is None:
            raise InvalidInputError(
                "fs= is for reloading a persisted index (with index_struct and persist_dir); to save "
                "through a filesystem call index.storage_context.persist(persist_dir, fs=fs)."
            )
        if memory is not None:
            if embed_model is not None or llm is not None or memory_kwargs:
                raise InvalidInputError(
                    "memory= already carries its models and options; do not also pass embed_model, llm "
                    f"or options ({', '.join(sorted(memory_kwargs)) or 'models'})."
                )
            expected = self.memory_class() if self.memory_module else HierarchicalMemory
            if not isinstance(memory, expected):
                raise InvalidInputError(
                    f"{type(self).__name__} needs a {expected.__name__} memory, got {type(memory).__name__}; "
                    "use the matching index class or HierMemIndex(memory=...)."
                )
        elif index_struct is not None:
            if memory_kwargs:
                raise InvalidInputError(
                    "A reloaded index takes its memory options from the save; do not pass "
                    f"{', '.join(sorted(memory_kwargs))}."
                )
            if persist_dir is None:
                raise InvalidInputError(
                    f"Rebuilding {type(self).__name__} from a stored index needs its memory: pass "
                    "persist_dir=<the directory given to storage_context.persist()> (or memory=...)."
                )
            memory = self._load_memory(index_struct.index_id, persist_dir, embed_model, llm, fs)
        else:
            memory = self._new_memory(embed_model, llm, memory_kwargs)
        self._memory: HierarchicalMemory = memory
        self._leaf_ids: set[str] = set()
        if index_struct is None and nodes is None:
            nodes = []
        super().__init__(
            nodes=list(nodes) if nodes is not None else None,
            index_struct=index_struct,
            storage_context=storage_context,
            callback_manager=callback_manager,
            transformations=transformations,
            show_progress=show_progress,
        )
        if index_struct is not None:
            self._sync_struct()
            self._storage_context.index_store.add_index_struct(self._index_struct)
        self._storage_context.add_vector_store(HierMemVectorStore(self), _store_key(self.index_id))

    # ------------------------------------------------------------------ memory
    @classmethod
    def memory_class(cls) -> type[HierarchicalMemory]:
        """The core memory class of this index (imported on first use).

        Raises:
            InvalidInputError: called on ``HierMemIndex`` itself (which wraps a given ``memory=``).
            ImportError: the memory's module is not available in this installation.
        """
        if cls.memory_module is None or cls.memory_class_name is None:
            raise InvalidInputError(
                "HierMemIndex wraps a given memory: pass memory=..., or use SegTreeIndex, MemTreeIndex, "
                "HATIndex or XMemoryIndex."
            )
        try:
            module = importlib.import_module(cls.memory_module)
        except ImportError as e:
            raise ImportError(
                f"{cls.__name__} needs {cls.memory_module}.{cls.memory_class_name}, which this installation "
                f"lacks ({e}); upgrade hiermem."
            ) from e
        return getattr(module, cls.memory_class_name)

    def _new_memory(self, embed_model: Any, llm: Any, options: dict[str, Any]) -> HierarchicalMemory:
        mem_cls = self.memory_class()
        embedder, core_llm = resolve_embedder(embed_model), resolve_llm(llm)
        try:
            return mem_cls(embedder=embedder, llm=core_llm, **options)
        except TypeError as e:
            raise InvalidInputError(f"{mem_cls.__name__} does not take these options: {e}.") from None

    def _load_memory(
        self, index_id: str, persist_dir: str | os.PathLike[str], embed_model: Any, llm: Any, fs: Any = None
    ) -> HierarchicalMemory:
        mem_cls = self.memory_class() if self.memory_module else HierarchicalMemory
        embedder, core_llm = resolve_embedder(embed_model), resolve_llm(llm)
        local = _local_dir(persist_dir, fs)
        if local is not None:  # read in place (the core's own error for a missing save)
            return mem_cls.load(_memory_path(local, index_id), embedder=embedder, llm=core_llm)
        with _readable_save(persist_dir, index_id, fs) as path:
            if path is None:
                raise PersistenceError(
                    f"No hiermem memory saved for index {index_id!r} in {persist_dir}; save one with "
                    "index.storage_context.persist(persist_dir, fs=fs)."
                )
            return mem_cls.load(path, embedder=embedder, llm=core_llm)

    @property
    def memory(self) -> HierarchicalMemory:
        """The core memory (e.g. for ``stats()``, ``to_dict()`` or direct ``retrieve``)."""
        return self._memory

    @property
    def id_prefix(self) -> str:
        """Prefix of the node ids of internal nodes: ``"{index_id}/"``."""
        return f"{self.index_id}/"

    def _messages(self, nodes: Sequence[BaseNode]) -> list[Message]:
        """Validate ``nodes`` (all before any is stored) and turn them into core messages."""
        out: list[Message] = []
        seen = set(self._leaf_ids)
        for node in nodes:
            if not isinstance(node, BaseNode):
                raise InvalidInputError(
                    f"Expected LlamaIndex nodes, got {type(node).__name__}; use from_documents() / insert() "
                    "for Documents, or parse them into nodes first."
                )
            nid = node.node_id
            if nid in seen:
                raise InvalidInputError(
                    f"Node {nid!r} is already in this index (or twice in the batch); delete it first "
                    "(delete_nodes / update_ref_doc)."
                )
            seen.add(nid)
            text = node.get_content(metadata_mode=MetadataMode.NONE)
            if not isinstance(text, str) or not text.strip():
                raise InvalidInputError(f"Node {nid!r} has no text; drop it or give it text content.")
            meta = dict(node.metadata)
            try:
                json.dumps(meta)
            except (TypeError, ValueError):
                raise InvalidInputError(
                    f"Node {nid!r} has metadata that is not JSON-serialisable; convert its values to "
                    "str / int / float / bool / lists / dicts."
                ) from None
            out.append(Message(text=text, id=nid, metadata=meta))
        return out

    def _sync_struct(self, struct: IndexGraph | None = None) -> None:
        """Mirror the memory's tree into the ``IndexGraph`` (keys: core node ids)."""
        g = struct if struct is not None else self._index_struct
        prefix = f"{g.index_id}/"
        ids: dict[int, str] = {}
        leaves: set[str] = set()
        view = self._memory.tree_view()  # a consistent, copied read of the tree
        root = view.root
        for nid, node in view.nodes.items():
            sid = node.source_id if node.is_leaf else None
            if sid:
                ids[nid] = sid
                leaves.add(sid)
            else:
                ids[nid] = f"{prefix}{nid}"
        children = {ids[nid]: [ids[c] for c in node.children] for nid, node in view.nodes.items()}
        g.all_nodes = ids
        g.root_nodes = {} if root is None else {root: ids[root]}
        g.node_id_to_children_ids = children
        self._leaf_ids = leaves

    # ------------------------------------------------------------------ BaseIndex: building and inserting
    def _build_index_from_nodes(self, nodes: Sequence[BaseNode], **build_kwargs: Any) -> IndexGraph:
        struct = IndexGraph()
        self._sync_struct(struct)  # a given memory may hold leaves already
        messages = self._messages(nodes)
        if messages:
            self._memory.add(messages)
        self._sync_struct(struct)
        return struct

    def build_index_from_nodes(self, nodes: Sequence[BaseNode], **build_kwargs: Any) -> IndexGraph:
        """Store ``nodes`` in the memory (atomically), then in the docstore."""
        struct = self._build_index_from_nodes(nodes)
        self._docstore.add_documents(nodes, allow_update=True)
        return struct

    def _insert(self, nodes: Sequence[BaseNode], **insert_kwargs: Any) -> None:
        messages = self._messages(nodes)
        if messages:
            self._memory.add(messages)
        self._sync_struct()

    def insert_nodes(self, nodes: Sequence[BaseNode], **insert_kwargs: Any) -> None:
        """Append nodes as new leaves, in order.

        The memory is updated first and atomically: when it fails (bad node, model error) neither the
        memory nor the docstore changes.

        Raises:
            InvalidInputError: a node without text, with non-JSON metadata, or already in the index.
            ModelError: a model failed.
        """
        nodes = list(nodes)
        if not nodes:
            return
        with self._callback_manager.as_trace("insert_nodes"):
            self._insert(nodes)
            self.docstore.add_documents(nodes, allow_update=True)
            self._storage_context.index_store.add_index_struct(self._index_struct)

    async def ainsert_nodes(self, nodes: Sequence[BaseNode], **insert_kwargs: Any) -> None:
        """Async :meth:`insert_nodes` (the memory's ``aadd``)."""
        nodes = list(nodes)
        if not nodes:
            return
        with self._callback_manager.as_trace("ainsert_nodes"):
            messages = self._messages(nodes)
            await self._memory.aadd(messages)
            self._sync_struct()
            await self.docstore.async_add_documents(nodes, allow_update=True)
            await self._storage_context.index_store.async_add_index_struct(self._index_struct)

    # ------------------------------------------------------------------ BaseIndex: deleting
    def _delete_node(self, node_id: str, **delete_kwargs: Any) -> None:
        if node_id not in self._leaf_ids:
            raise NodeNotFoundError(f"No node {node_id!r} in this index.")
        self._memory.delete(node_id)
        self._sync_struct()

    def delete_nodes(
        self, node_ids: list[str], delete_from_docstore: bool = False, **delete_kwargs: Any
    ) -> None:
        """Forget nodes: the memory's ``delete(node_id)`` per node (tree repaired, summaries recomputed).

        Args:
            node_ids: ids of stored nodes.
            delete_from_docstore: also remove them from the docstore, default ``False``.

        Raises:
            NodeNotFoundError: an id not in the index (checked first: then nothing is deleted).
        """
        ids = list(dict.fromkeys(node_ids))
        missing = [i for i in ids if i not in self._leaf_ids]
        if missing:
            raise NodeNotFoundError(
                f"No node {', '.join(map(repr, missing))} in this index; nothing was deleted. "
                "ref_doc_info and index_struct.all_nodes list the stored ids."
            )
        try:
            for i in ids:
                self._memory.delete(i)
                if delete_from_docstore:
                    self.docstore.delete_document(i, raise_error=False)
        finally:
            self._sync_struct()
            self._storage_context.index_store.add_index_struct(self._index_struct)

    async def adelete_nodes(
        self, node_ids: list[str], delete_from_docstore: bool = False, **delete_kwargs: Any
    ) -> None:
        """Async :meth:`delete_nodes` (in a worker thread)."""
        await asyncio.to_thread(self.delete_nodes, node_ids, delete_from_docstore)

    def delete_ref_doc(
        self, ref_doc_id: str, delete_from_docstore: bool = False, **delete_kwargs: Any
    ) -> None:
        """Forget every stored node parsed from document ``ref_doc_id`` (a warning when it is unknown)."""
        info = self.docstore.get_ref_doc_info(ref_doc_id)
        if info is None:
            logger.warning(f"ref_doc_id {ref_doc_id} not found, nothing deleted.")
            return
        ids = [i for i in info.node_ids if i in self._leaf_ids]
        if ids:
            self.delete_nodes(ids, delete_from_docstore=delete_from_docstore)
        if delete_from_docstore:
            self.docstore.delete_ref_doc(ref_doc_id, raise_error=False)

    async def adelete_ref_doc(
        self, ref_doc_id: str, delete_from_docstore: bool = False, **delete_kwargs: Any
    ) -> None:
        """Async :meth:`delete_ref_doc` (in a worker thread)."""
        await asyncio.to_thread(self.delete_ref_doc, ref_doc_id, delete_from_docstore)

    @property
    def ref_doc_info(self) -> dict[str, RefDocInfo]:
        """Source documents of the stored nodes: ``{ref_doc_id: RefDocInfo(node_ids in order, metadata)}``.

        Only nodes still in the memory are listed; nodes without a source document are left out.
        """
        g = self._index_struct
        ordered = [g.all_nodes[k] for k in sorted(g.all_nodes) if g.all_nodes[k] in self._leaf_ids]
        out: dict[str, RefDocInfo] = {}
        for node in self.docstore.get_nodes(ordered, raise_error=False):
            if node is None or node.source_node is None:
                continue
            ref = node.source_node.node_id
            if ref not in out:
                doc = self.docstore.get_ref_doc_info(ref)
                out[ref] = RefDocInfo(node_ids=[], metadata=dict(doc.metadata) if doc else {})
            out[ref].node_ids.append(node.node_id)
        return out

    # ------------------------------------------------------------------ retrieval
    def as_retriever(
        self,
        policy: str | None = None,
        similarity_top_k: int | None = None,
        max_tokens: int | None = None,
        **kwargs: Any,
    ) -> HierMemRetriever:
        """A :class:`~llamaindex_hiermem.retrievers.HierMemRetriever` over this index.

        ``as_query_engine(policy=..., ...)`` and ``as_chat_engine(policy=..., ...)`` pass their keyword
        arguments here, so the policy and its parameters flow through them.

        Args:
            policy: retrieval policy (default: the memory's default).
            similarity_top_k: at most this many nodes (default: the memory's default, usually 10).
            max_tokens: optional budget of returned text in tokens.
            **kwargs: ``filters`` (``MetadataFilters`` over the nodes' metadata), ``node_ids`` and
                ``doc_ids`` (``ref_doc_id`` values) scope what may be returned, as for LlamaIndex's
                vector retrievers (see :class:`HierMemRetriever`); the other names are the policy's
                parameters (e.g. SegTreeMem ``alpha``, ``horizon``, ``admissible``). Names the memory's
                retrieval does not take are ignored here, because query and chat engines forward their
                own options too (build a ``HierMemRetriever`` directly to have unknown names rejected).

        Returns:
            The retriever (leaves as this docstore's nodes).

        Raises:
            UnknownPolicyError: a policy the memory does not have.
            InvalidInputError: ``similarity_top_k`` / ``max_tokens`` not a positive integer; bad
                ``filters``, ``node_ids`` or ``doc_ids``.
        """
        scope = {name: kwargs.pop(name, None) for name in ("filters", "node_ids", "doc_ids")}
        accepted = policy_param_names(self._memory)
        params = dict(kwargs) if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}
        return HierMemRetriever(
            self._memory,
            policy=policy,
            similarity_top_k=similarity_top_k,
            max_tokens=max_tokens,
            docstore=self.docstore,
            id_prefix=self.id_prefix,
            callback_manager=self._callback_manager,
            object_map=self._object_map,
            **scope,
            **params,
        )

    # ------------------------------------------------------------------ persistence
    def persist(self, persist_dir: str | os.PathLike[str], fs: Any = None, **kwargs: Any) -> None:
        """``self.storage_context.persist(persist_dir, fs=fs)``: LlamaIndex stores plus the memory.

        Args:
            persist_dir: the directory to save into.
            fs: an fsspec filesystem to write through; default ``None`` = the local disk.
            **kwargs: other ``StorageContext.persist`` arguments (file names).

        Raises:
            PersistenceError: the memory could not be saved.
        """
        self._storage_context.persist(persist_dir, fs=fs, **kwargs)

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str | os.PathLike[str],
        index_id: str | None = None,
        *,
        embed_model: Any = None,
        llm: Any = None,
        fs: Any = None,
        **kwargs: Any,
    ) -> HierMemIndex:
        """Reload an index saved with ``index.storage_context.persist(persist_dir, fs=fs)``.

        Args:
            persist_dir: the directory given to ``persist``.
            index_id: which index, when the directory holds several of this class; default ``None``.
            embed_model: the embedding model to use from now on (must give the saved dimension); default
                resolved as at construction (``Settings.embed_model`` when set, else the local model).
            llm: the LLM to use from now on; default resolved as at construction.
            fs: the fsspec filesystem ``persist_dir`` is in; default ``None`` = the local disk.
            **kwargs: other index arguments (``callback_manager``, ``transformations``, ...).

        Returns:
            The index, with the same tree, docstore and ids.

        Raises:
            PersistenceError: ``persist_dir`` does not exist or holds no index of this class, or a corrupt
                save.
            InvalidInputError: several indices of this class and no ``index_id``.
            VersionMismatchError: ``index_id`` names an index of another class.
        """
        try:
            sc = StorageContext.from_defaults(persist_dir=str(persist_dir), fs=fs)
        except FileNotFoundError as e:
            raise PersistenceError(
                f"No saved index in {persist_dir} ({e}); save one with index.storage_context.persist(dir)."
            ) from e
        want = None if cls.memory_module is None else cls.memory_class().kind
        found = _saved_indices(sc, persist_dir, index_id, fs)
        if index_id is None and want is not None:
            found = [(s, k) for s, k in found if k == want]
        if not found:
            raise PersistenceError(
                f"No {cls.__name__} in {persist_dir}; save one with index.storage_context.persist(dir)."
            )
        if len(found) > 1:
            ids = ", ".join(s.index_id for s, _ in found)
            raise InvalidInputError(
                f"{persist_dir} holds several {cls.__name__} indices ({ids}); pass index_id=."
            )
        struct, kind = found[0]
        if want is not None and kind != want:
            raise VersionMismatchError(
                f"Index {struct.index_id} in {persist_dir} holds a {kind!r} memory; load it with "
                f"{_index_class_for_kind(kind).__name__}.from_persist_dir or load_index_from_storage."
            )
        return cls(
            index_struct=struct,
            storage_context=sc,
            persist_dir=persist_dir,
            fs=fs,
            embed_model=embed_model,
            llm=llm,
            **kwargs,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(index_id={self.index_id!r}, memory={self._memory!r})"


class SegTreeIndex(HierMemIndex):
    """A LlamaIndex index over a :class:`~shared_core.memories.segtree.SegTreeMem` (segment-tree memory).

    Nodes are utterances in arrival order; internal nodes annotate contiguous spans. Policies:
    ``collapsed`` (default), ``top_down``, ``bottom_up``; policy parameters ``alpha``, ``horizon``,
    ``relevance``, ``hybrid_weight``, ``admissible``. Arguments: see :class:`HierMemIndex`;
    ``**memory_kwargs`` are :class:`~shared_core.memories.segtree.SegTreeMem` options (``compat``,
    ``threshold``, ``alpha``, ``horizon``, ``k``, ``relevance``, ...).

    References:
        SegTreeMem paper (shared/seeds/segtreemem-paper.txt), Sec. 4; Appendix A, Algorithms 1-2.
    """

    memory_module = "shared_core.memories.segtree"
    memory_class_name = "SegTreeMem"


class MemTreeIndex(HierMemIndex):
    """A LlamaIndex index over a ``shared_core.memories.memtree.MemTree`` (semantic tree with online
    insertion).

    Policies: ``collapsed`` (default: message leaves ranked by their own hybrid relevance; with
    ``relevance="dense", admissible="all"`` the paper's), ``top_down`` (relevance propagated from the
    summaries), ``traversal``. Arguments: see :class:`HierMemIndex`;
    ``**memory_kwargs`` are ``MemTree`` options.

    References:
        MemTree paper (shared/seeds/memtree-paper.txt), Sec. 3.1 (insertion) and 3.2 (retrieval).
    """

    memory_module = "shared_core.memories.memtree"
    memory_class_name = "MemTree"


class HATIndex(HierMemIndex):
    """A LlamaIndex index over a ``shared_core.memories.hat.HAT`` (hierarchical aggregate tree).

    Policies: ``collapsed`` (default without an LLM), ``agent`` (default with one), ``bfs``, ``dfs`` (need
    an LLM), ``top_down``, ``greedy``. Arguments: see :class:`HierMemIndex`; ``**memory_kwargs`` are
    ``HAT`` options (e.g. the memory length ``M``).

    References:
        HAT paper (shared/seeds/hat-paper.txt), Sec. 3.1 (the tree) and 3.2 (memory agent).
    """

    memory_module = "shared_core.memories.hat"
    memory_class_name = "HAT"


class XMemoryIndex(HierMemIndex):
    """A LlamaIndex index over a ``shared_core.memories.xmemory.XMemory`` (messages, episodes, semantics,
    themes).

    Policies: ``top_down`` (default: message leaves ranked by their own and their facts' relevance),
    ``adaptive`` (the paper's two-stage retrieval), ``representative``, ``collapsed``. Arguments: see
    :class:`HierMemIndex`; ``**memory_kwargs`` are ``XMemory`` options.

    References:
        xMemory paper (shared/seeds/xmemory-paper.txt), Sec. 3.2 (structure) and 3.3 (adaptive retrieval).
    """

    memory_module = "shared_core.memories.xmemory"
    memory_class_name = "XMemory"


INDEX_CLASSES: tuple[type[HierMemIndex], ...] = (SegTreeIndex, MemTreeIndex, HATIndex, XMemoryIndex)


def _index_class_for_kind(kind: str) -> type[HierMemIndex]:
    for cls in INDEX_CLASSES:
        try:
            if cls.memory_class().kind == kind:
                return cls
        except ImportError:
            continue
    return HierMemIndex


def _saved_indices(
    storage_context: StorageContext,
    persist_dir: str | os.PathLike[str],
    index_id: str | None,
    fs: Any = None,
) -> list[tuple[IndexGraph, str]]:
    """``(index_struct, memory kind)`` of the hiermem indices saved in ``persist_dir`` (in ``fs``)."""
    if index_id is not None:
        struct = storage_context.index_store.get_index_struct(index_id)
        if struct is None:
            raise PersistenceError(f"No index {index_id!r} in {persist_dir}.")
        structs = [struct]
    else:
        structs = storage_context.index_store.index_structs()
    out = []
    for s in structs:
        if not isinstance(s, IndexGraph):
            continue
        with _readable_save(persist_dir, s.index_id, fs, manifest_only=True) as path:
            if path is not None:
                out.append((s, str(read_save(path)[0]["kind"])))
    if index_id is not None and not out:
        raise PersistenceError(f"Index {index_id!r} in {persist_dir} has no saved hiermem memory.")
    return out


def load_index_from_storage(
    storage_context: StorageContext,
    index_id: str | None = None,
    *,
    persist_dir: str | os.PathLike[str] | None = None,
    fs: Any = None,
    **kwargs: Any,
) -> HierMemIndex:
    """Reload a hiermem index: the counterpart of LlamaIndex's ``load_index_from_storage``.

    LlamaIndex's own loader maps every ``IndexGraph`` to its ``TreeIndex``; this one picks the hiermem
    index class from the saved memory's kind and loads the memory saved beside the stores.

    Args:
        storage_context: ``StorageContext.from_defaults(persist_dir=persist_dir, fs=fs)``.
        index_id: which index, when several hiermem indices were persisted together; default ``None``.
        persist_dir: the directory given to ``storage_context.persist`` (required: the memories are
            saved under ``persist_dir/hiermem``).
        fs: the fsspec filesystem ``persist_dir`` is in; default ``None`` = the local disk.
        **kwargs: index arguments (``embed_model``, ``llm``, ``callback_manager``, ...).

    Returns:
        The index (:class:`SegTreeIndex`, :class:`MemTreeIndex`, :class:`HATIndex`, :class:`XMemoryIndex`, or
        :class:`HierMemIndex` for another kind).

    Raises:
        InvalidInputError: no ``persist_dir``; several indices and no ``index_id``.
        PersistenceError: no hiermem index saved there, or a corrupt save.
    """
    if persist_dir is None:
        raise InvalidInputError(
            "load_index_from_storage needs persist_dir=<the directory given to storage_context.persist()>: "
            "the memories are saved under persist_dir/hiermem."
        )
    found = _saved_indices(storage_context, persist_dir, index_id, fs)
    if not found:
        raise PersistenceError(
            f"No hiermem index in {persist_dir}; save one with index.storage_context.persist(dir)."
        )
    if len(found) > 1:
        ids = ", ".join(s.index_id for s, _ in found)
        raise InvalidInputError(f"{persist_dir} holds several hiermem indices ({ids}); pass index_id=.")
    struct, kind = found[0]
    cls = _index_class_for_kind(kind)
    return cls(index_struct=struct, storage_context=storage_context, persist_dir=persist_dir, fs=fs, **kwargs)
