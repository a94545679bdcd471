"""The storage-context entry of a hiermem index: :class:`HierMemVectorStore`."""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    VectorStoreQuery,
    VectorStoreQueryResult,
)

from shared_core.memories.base import HierarchicalMemory
from shared_core.types import (
    InvalidInputError,
)

from .persistence import _fs_path, _save_memory

if TYPE_CHECKING:
    from .base import HierMemIndex

__all__ = ["HierMemVectorStore"]


class HierMemVectorStore(BasePydanticVectorStore):
    """An index's memory seen as a LlamaIndex vector store (text queries); its storage-context entry.

    Every :class:`HierMemIndex` registers one under ``"hiermem-<index_id>"`` in its storage context, so
    that ``StorageContext.persist(persist_dir)`` saves the memory (to ``persist_dir/hiermem/<index_id>``).
    It can also be used as a store: ``add`` / ``delete`` / ``delete_nodes`` go through the index (docstore
    and tree stay in step) and ``query`` runs the memory's default policy on ``query.query_str``.

    Args:
        index: the owning index.

    References:
        LlamaIndex ``BasePydanticVectorStore`` protocol; core persistence (``shared_core/stores/files.py``).
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    _index: Any = PrivateAttr()

    def __init__(self, index: HierMemIndex) -> None:
        super().__init__()
        self._index = index

    @classmethod
    def class_name(cls) -> str:
        return "HierMemVectorStore"

    @property
    def client(self) -> HierarchicalMemory:
        """The core memory."""
        return self._index.memory

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Insert ``nodes`` through the index (see :meth:`HierMemIndex.insert_nodes`); returns their ids."""
        self._index.insert_nodes(list(nodes))
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete a document's nodes through the index (see :meth:`HierMemIndex.delete_ref_doc`)."""
        self._index.delete_ref_doc(ref_doc_id)

    def delete_nodes(
        self, node_ids: list[str] | None = None, filters: Any = None, **delete_kwargs: Any
    ) -> None:
        """Delete nodes by id through the index. Metadata ``filters`` are not supported.

        Raises:
            InvalidInputError: ``filters`` given.
            NodeNotFoundError: an id not in the index (nothing is deleted).
        """
        if filters is not None:
            raise InvalidInputError("HierMemVectorStore deletes by node id only; pass node_ids, not filters.")
        self._index.delete_nodes(list(node_ids or []))

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Retrieve ``query.similarity_top_k`` nodes for ``query.query_str`` with the default policy.

        ``query.filters``, ``query.node_ids`` and ``query.doc_ids`` scope the result as in
        :class:`~llamaindex_hiermem.retrievers.HierMemRetriever`: no node outside them is returned, and no
        summary of a span that holds one.

        Raises:
            InvalidInputError: no ``query_str`` (this store answers text queries); bad filters or ids.
        """
        if not query.query_str:
            raise InvalidInputError(
                "HierMemVectorStore answers text queries: set VectorStoreQuery.query_str."
            )
        found = self._index.as_retriever(
            similarity_top_k=query.similarity_top_k,
            filters=query.filters,
            node_ids=query.node_ids,
            doc_ids=query.doc_ids,
        ).retrieve(query.query_str)
        return VectorStoreQueryResult(
            nodes=[n.node for n in found],
            similarities=[float(n.score or 0.0) for n in found],
            ids=[n.node.node_id for n in found],
        )

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Async :meth:`query` (in a worker thread)."""
        return await asyncio.to_thread(self.query, query, **kwargs)

    def persist(self, persist_path: str, fs: Any = None) -> None:
        """Save the memory beside ``persist_path``: to ``dirname(persist_path)/hiermem/<index_id>``.

        Called by ``StorageContext.persist(persist_dir, fs=fs)`` (``persist_path`` is then
        ``persist_dir/hiermem-<index_id>__vector_store.json``; no file is written under that name).

        Args:
            persist_path: the store's file path inside the persist directory.
            fs: an fsspec filesystem to write through (e.g. ``fsspec.filesystem("memory")`` or S3);
                default ``None`` = the local disk. The local filesystem is written directly; any other is
                given a copy of a save written to a local temporary directory (snapshot files first, the
                pointer file last, so an interrupted upload leaves the previous save readable).

        Raises:
            PersistenceError: the save could not be written (e.g. the target is a file, a non-empty
                directory that is not a save, or ``fs`` failed).
        """
        if fs is None:
            directory: str = os.path.dirname(str(persist_path))
        else:
            directory = posixpath.dirname(_fs_path(fs, persist_path))
        _save_memory(self._index.memory, directory, self._index.index_id, fs)
